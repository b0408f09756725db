//! Opening a valid log after truncation, flipped bytes or appended garbage (see `idemlog::testkit::fuzzing::recover_damaged`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idemlog::testkit::fuzzing::recover_damaged(data));
