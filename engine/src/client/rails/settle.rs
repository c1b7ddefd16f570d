//! Settling a lost server's contexts before a server taken back reuses
//! them: nothing the provider still holds, and no completion on its way to
//! the client, may name them (see `failover::rejoin`).
use super::queue::{ask, Cmd, Reply};
use super::{Mode, Rails};
use crate::dataplane::fabric::PendingSends;
use std::sync::atomic::Ordering;

impl Rails {
    /// `Endpoint::settle` on rail `r`: how many of the operations `ctxs`
    /// last named may still complete (on a rail thread, plus one while
    /// completions are still on their way here, one of which may name them;
    /// an abandoned rail never settles). With [`PendingSends::Ignore`] only
    /// the receives the provider still holds count: the caller wants their
    /// buffers back, not the contexts, and a completion on its way writes
    /// nothing more (on a busy rail some always are: counting them, a lost
    /// stream's slots at 16 Gbit/s were never handed over). Rare: when a
    /// server is taken back, never per chunk.
    pub fn settle(&mut self, r: usize, ctxs: std::ops::Range<u32>, sends: PendingSends) -> u32 {
        let on_the_way = |held: bool| u32::from(held && sends != PendingSends::Ignore);
        match &mut self.mode {
            Mode::Direct(ep) => ep.settle(ctxs, sends),
            Mode::Threaded { rails, .. } if rails[r].shared.abandoned.load(Ordering::Relaxed) => u32::MAX,
            Mode::Threaded { rails, held, .. } => match ask(&rails[r].shared, Cmd::Settle(ctxs, sends)) {
                Ok(Reply::Count(n)) => n + on_the_way(held.is_some()),
                Ok(_) => u32::MAX,
                Err(e) => {
                    log::warn!("rail {r}: {e}");
                    u32::MAX
                }
            },
        }
    }
}
