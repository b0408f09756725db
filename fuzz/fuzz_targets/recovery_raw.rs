//! Opening a data directory whose files hold arbitrary bytes (see `idemlog::testkit::fuzzing::recover_files`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idemlog::testkit::fuzzing::recover_files(data));
