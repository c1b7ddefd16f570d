//! Which provider call an endpoint's owner is inside, for a watchdog that
//! runs on another thread.
//!
//! A provider call that never returns (shm spinning on the lock of a peer
//! process that died holding it; a provider waiting on a NIC that stopped
//! completing) would otherwise be a silent spin: the owner thread cannot
//! report anything while it is inside. So the owner counts its calls in and
//! out (two plain stores of a word it alone writes: no atomic read-modify-
//! write, no fence on the data path) and names the call going in; another
//! thread samples the count, and an odd count that stands still means the
//! owner has been inside that call since. The server's lcores are watched by
//! their poll counters instead (`control::LCORE_STUCK_AFTER`); this is for
//! clients, whose progress is driven by the caller's thread or rail threads.
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

/// The watched calls.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    CqRead = 0,
    Send = 1,
    Recv = 2,
    Inject = 3,
    Cancel = 4,
}

impl Call {
    pub fn name(self) -> &'static str {
        match self {
            Call::CqRead => "fi_cq_read",
            Call::Send => "fi_tsend",
            Call::Recv => "fi_trecv",
            Call::Inject => "fi_tinject",
            Call::Cancel => "fi_cancel",
        }
    }

    fn from_u8(v: u8) -> Call {
        match v {
            1 => Call::Send,
            2 => Call::Recv,
            3 => Call::Inject,
            4 => Call::Cancel,
            _ => Call::CqRead,
        }
    }
}

/// Written by the endpoint's owner only; read by anyone.
#[derive(Default)]
pub struct CallWatch {
    /// Calls entered plus calls left: odd while inside one.
    seq: AtomicU32,
    call: AtomicU8,
}

impl CallWatch {
    /// The owner enters `call`.
    #[inline(always)]
    pub fn enter(&self, call: Call) {
        self.call.store(call as u8, Ordering::Relaxed);
        self.seq.store(self.seq.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
    }

    /// The owner is back from the call it entered.
    #[inline(always)]
    pub fn leave(&self) {
        self.seq.store(self.seq.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
    }

    /// The count, and the call the owner is inside when it is odd.
    pub fn sample(&self) -> (u32, Option<Call>) {
        let seq = self.seq.load(Ordering::Acquire);
        (seq, (seq & 1 == 1).then(|| Call::from_u8(self.call.load(Ordering::Relaxed))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inside_a_call_the_count_is_odd_and_names_it() {
        let w = CallWatch::default();
        assert_eq!(w.sample(), (0, None));
        w.enter(Call::Send);
        assert_eq!(w.sample(), (1, Some(Call::Send)));
        w.leave();
        assert_eq!(w.sample(), (2, None));
        w.enter(Call::CqRead);
        assert_eq!(w.sample().1.map(Call::name), Some("fi_cq_read"));
    }
}
