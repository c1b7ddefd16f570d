//! The engine's lock-free structures that threads share, compiled here
//! against loom's atomics so that its tests can run every interleaving of
//! them, including the outcomes Arm's weaker memory order allows and x86's
//! (and so qemu-user on x86) never shows.
//!
//! Only what is self-contained is modelled: `dataplane/split.rs`'s
//! [`SplitShared`](split::SplitShared), where the lcores of a split job
//! publish their areas, count completed groups and publish results. The
//! file is the engine's own, included by path; `--cfg loom` swaps its
//! atomics. Run with `make test-loom`.
#![cfg(loom)]

/// What split.rs imports as `crate::wire`.
pub mod wire {
    pub use tally_engine::wire::{split_ranks, SPLIT_MAX};
}

#[path = "../../src/dataplane/split.rs"]
pub mod split;
