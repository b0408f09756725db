//! Test scaffolding, behind the `testkit` feature: not part of the stable API, and not compiled
//! into an application that does not ask for it.
//!
//! - [`conformance`]: the backend conformance suite. Whoever writes a store for another database
//!   proves it behaves as the built-in ones with one call ([`conformance::run`]);
//! - [`fuzzing`]: the entry points of the fuzz targets that attack what the layer reads from the
//!   wire (`Idempotency-Key` values, JSON bodies), and for the tests that replay their corpus.

pub mod conformance;
pub mod fuzzing;
