//! Operation sequences against the reference model (see `idemlog::testkit::fuzzing::run_steps`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idemlog::testkit::fuzzing::run_steps(data));
