//! Test scaffolding, behind the `testkit` feature: not part of the stable API, and not compiled
//! into an application that does not ask for it.
//!
//! - [`model`]: a reference model of the store and a simulation that checks the real store
//!   against it through crashes and injected I/O failures;
//! - [`FaultyStorage`] ([`faulty`]): an in-memory file system that keeps durable and unsynced data
//!   apart, to crash at any step, tear appends, drop unsynced writes and fail fsyncs;
//! - [`fuzzing`]: the entry points of the fuzz targets and the replay of their corpus;
//! - `Store::check_running_counts`: the store's running counts checked against a walk of its
//!   index.
//!
//! A feature of this crate rather than a crate of its own: the model and the fuzz entry points
//! reach into the engine's private modules (the index, the frame codec, the injectable clock), which
//! a separate crate could only use if they were public.

pub mod faulty;
pub mod fuzzing;
pub mod model;

pub use faulty::{CrashMode, FaultOp, FaultyStorage};
