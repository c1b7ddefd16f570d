//! Settling a lost server's contexts before a server taken back reuses
//! them: nothing the provider still holds, and no completion on its way to
//! the client, may name them (see `failover::rejoin`).
use super::queue::{ask, Cmd, Reply};
use super::{Mode, Rails};
use std::sync::atomic::Ordering;

impl Rails {
    /// `Endpoint::settle` on rail `r`: how many of the operations `ctxs`
    /// last named may still complete (on a rail thread, plus one while
    /// completions are still on their way here; an abandoned rail never
    /// settles). Rare: when a server is taken back, never per chunk.
    pub fn settle(&mut self, r: usize, ctxs: std::ops::Range<u32>, forget_sends: bool) -> u32 {
        match &mut self.mode {
            Mode::Direct(ep) => ep.settle(ctxs, forget_sends),
            Mode::Threaded { rails, .. } if rails[r].shared.abandoned.load(Ordering::Relaxed) => u32::MAX,
            Mode::Threaded { rails, held, .. } => match ask(&rails[r].shared, Cmd::Settle(ctxs, forget_sends)) {
                Ok(Reply::Count(n)) => n + u32::from(held.is_some()),
                Ok(_) => u32::MAX,
                Err(e) => {
                    log::warn!("rail {r}: {e}");
                    u32::MAX
                }
            },
        }
    }
}
