//! What a fan run is, as every thread of it reads it.
use std::time::Duration;
use tally_engine::dataplane::slab::HugepagePolicy;

/// A peer that completes nothing for this long has failed.
pub(super) const STALL: Duration = Duration::from_secs(60);

/// Empty polls between looks at the clock and the failure flag.
pub(super) const CHECK_EVERY: u32 = 256;

#[derive(Clone)]
pub(super) struct FanPlan {
    pub(super) provider: String,
    pub(super) hubs: usize,
    pub(super) leaves: usize,
    pub(super) sizes: Vec<usize>,
    pub(super) chunk: usize,
    pub(super) window: usize,
    pub(super) iters: usize,
    pub(super) warmup: usize,
    pub(super) busy: bool,
    /// Empty polls before an adaptive poller sleeps (as an lcore does).
    pub(super) spin: u32,
    pub(super) policy: HugepagePolicy,
    /// Largest S: the leaves' buffers are sized for it.
    pub(super) max: usize,
    /// The client's smallest spreading piece (`ClientConfig::min_piece`).
    pub(super) min_piece: usize,
}
