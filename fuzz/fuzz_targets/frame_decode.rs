//! Frame and operation decoding: arbitrary bytes at every offset (see `idemlog::testkit::fuzzing::decode_frames`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idemlog::testkit::fuzzing::decode_frames(data));
