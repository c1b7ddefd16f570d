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
pub mod host;
#[cfg(feature = "std")]
pub mod settings;

#[cfg(feature = "fabric")]
pub mod bootstrap;
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

// The paths the tools, the plugin and the tests have always used.
#[cfg(feature = "fabric")]
pub use dataplane::{fabric, lcore, metrics, slab};
#[cfg(feature = "fabric")]
pub use host::hugepages;
#[cfg(feature = "std")]
pub use host::{config, cpuset, units};
