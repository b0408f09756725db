//! JSON canonicalisation and request fingerprints (see `idemlog_idempotency::testkit::fuzzing::json_fingerprint`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idemlog_idempotency::testkit::fuzzing::json_fingerprint(data));
