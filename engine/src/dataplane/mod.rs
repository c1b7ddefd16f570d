//! The dataplane: what touches gradient bytes. Each lcore ([`lcore`]) is a
//! pinned thread that owns one libfabric endpoint ([`fabric`]), one slab of
//! hugepage buffers ([`slab`]) and the shards of every job it serves
//! ([`shard`]); it busy-polls its completion queue and reduces with the
//! kernels of [`crate::reduce`]. Its counters ([`metrics`]) are written by
//! that lcore alone and read by anyone. The lcores of a split job
//! ([`split`]) share one small lock-free state per job, and nothing else.
//!
//! The control plane ([`crate::control`]) talks to an lcore only through the
//! two channels of [`shard::Command`] and [`shard::Event`].
pub mod fabric;
pub mod lcore;
pub mod metrics;
pub mod shard;
pub mod slab;
pub mod split;
