//! tally-engine: the dataplane of a gradient reduction server.
//!
//! Its folders are its layers, and callers use their paths (the crate root
//! re-exports nothing):
//! - `reduce`, `wire`: the `no_std` core, pure computation over byte slices
//!   (the kernels, the wire format); builds for any target without an
//!   operating system;
//! - `host` (feature `std`): the machine and its configuration (`config`,
//!   `cpuset`, `units`; `hugepages`, `limits` with `fabric`); `settings`: the
//!   table of every setting;
//! - `dataplane` (feature `fabric`, the default): what touches gradient
//!   bytes: libfabric (`dataplane::fabric`), hugepage slabs, the pinned
//!   lcores and their shards, the metrics they publish;
//! - `control`: admits, runs and ends jobs, never touching those bytes;
//! - the roles: `server` (assembles the two), `client`, `ring` (with
//!   `ring::bootstrap`, the ranks' TCP rendezvous).
//!
//! See ARCHITECTURE.md at the repository root for how the pieces fit together.
#![cfg_attr(not(feature = "std"), no_std)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod reduce;
pub mod wire;

#[cfg(feature = "std")]
pub mod host;
#[cfg(feature = "std")]
pub mod settings;

#[cfg(feature = "fabric")]
pub mod client;
#[cfg(feature = "fabric")]
pub mod control;
#[cfg(feature = "fabric")]
pub mod dataplane;
#[cfg(feature = "fabric")]
pub mod ring;
#[cfg(feature = "fabric")]
pub mod server;
