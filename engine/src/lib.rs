//! tally-engine: the dataplane of a gradient reduction server.
//!
//! The crate has three layers, chosen by features:
//! - the `no_std` core (`reduce`, `wire`): pure computation over byte slices,
//!   builds for any target without an operating system;
//! - `std`: run-time CPU detection and host parsing helpers (`cpuset`, `units`);
//! - `fabric` (default): what talks to the machine: libfabric (`fabric`),
//!   hugepage buffers (`slab`, `hugepages`) and pinned worker threads (`lcore`).
//!
//! See ARCHITECTURE.md at the repository root for how the pieces fit together.
#![cfg_attr(not(feature = "std"), no_std)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod reduce;
pub mod wire;

#[cfg(feature = "std")]
pub mod config;
#[cfg(feature = "std")]
pub mod cpuset;
#[cfg(feature = "std")]
pub mod units;

#[cfg(feature = "fabric")]
pub mod bootstrap;
#[cfg(feature = "fabric")]
pub mod client;
#[cfg(feature = "fabric")]
pub mod fabric;
#[cfg(feature = "fabric")]
pub mod hugepages;
#[cfg(feature = "fabric")]
pub mod lcore;
#[cfg(feature = "fabric")]
pub mod metrics;
#[cfg(feature = "fabric")]
pub mod ring;
#[cfg(feature = "fabric")]
pub mod server;
#[cfg(feature = "fabric")]
pub mod slab;
