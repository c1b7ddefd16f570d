//! The dataplane: what touches gradient bytes. Each lcore ([`lcore`]) is a
//! pinned thread that owns one libfabric endpoint ([`fabric`]), one slab of
//! hugepage buffers ([`slab`]) and the shards of every job it serves
//! ([`shard`]); it busy-polls its completion queue and reduces with the
//! kernels of [`crate::reduce`]. Its counters ([`metrics`]) are written by
//! that lcore alone and read by anyone.
//!
//! The control plane ([`crate::control`]) talks to an lcore only through the
//! two channels of [`shard::Command`] and [`shard::Event`].
pub mod fabric;
pub mod lcore;
pub mod metrics;
pub mod shard;
pub mod slab;
