//! `idemlog-proxy`: exactly-once `POST`/`PATCH` in front of any HTTP service, whatever its
//! language, built on the `idemlog-idempotency` layer (the same claim, fencing, fingerprint and
//! replay as the payments server).
//!
//! The binary (`main.rs`) parses the flags ([`cli`]) and the route rules ([`config`]), chooses the
//! scope source ([`scope`]), opens the store ([`store`]) and serves two listeners: the proxy
//! (connections spread over [`workers`], each serving them with [`serve`], requests through
//! [`app`] to [`forward`]) and the admin one ([`admin`], with [`metrics`]); [`routes`] and
//! [`normal_path`] decide which rule a request falls under. Module docs say what each owns;
//! `README.md` beside this crate says how to run it.

pub mod admin;
pub mod app;
pub mod cli;
pub mod config;
pub mod forward;
pub mod metrics;
pub mod normal_path;
pub mod routes;
pub mod scope;
pub mod serve;
pub mod store;
pub mod workers;
