//! Frame and operation decoding: arbitrary bytes at every offset (see `idemlog::fuzzing::decode_frames`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idemlog::fuzzing::decode_frames(data));
