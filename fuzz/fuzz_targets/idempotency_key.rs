//! Idempotency-Key header parsing (see `idemlog_idempotency::testkit::fuzzing::idempotency_key`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idemlog_idempotency::testkit::fuzzing::idempotency_key(data));
