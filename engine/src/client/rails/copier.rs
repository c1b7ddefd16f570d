//! The copier: one thread per client that copies failover's staged results
//! out of their slots into the caller's buffers, for every rail.
//!
//! With failover on, most results of small all-reduces land in a staging
//! slot (see `failover`), and someone copies each into the caller's buffer
//! before its completion is handed back. On a rail's own thread that copy
//! (2.5-2.9 µs per 32 KiB piece on the device) is on every piece's path: at
//! 32 Gbit/s a plugin's rails are busy in 82-91% of their turns, so the
//! copy showed as the plugin's whole failover cost (docs/measurements.md,
//! "What failover costs the plugin"). The copier takes it off the rails:
//! a rail hands each completed [`Cmd::RecvCopy`](super::Cmd) to it as a
//! [`CopyJob`](super::queue::CopyJob) and goes on polling; the copier copies and hands the
//! completion back to that rail, which queues it to the client as it would
//! its own. Only the rail talks to the client, so the order of its events
//! and the answers to cancels stay the rail's alone.
//!
//! Each rail has a pair of bounded rings with the copier ([`CopyLane`](super::queue::CopyLane)):
//! jobs out, completions back, each of [`LANE`](super::queue::LANE) slots. A rail keeps at
//! most [`LANE`](super::queue::LANE) jobs out, so the ring back never fills and the copier
//! never waits on a rail; a rail whose ring out is full copies itself.
//!
//! Cancels: a rail answers `Cancel` and `CancelAll` only once every job it
//! handed out came back ([`RailLoop`](super::rail_loop) `wait_copier`), so
//! that nothing is written into a buffer the caller is about to take back.
//! That wait is a few copies long: the copier never blocks but to sleep,
//! and a rail's job rings it awake.
//!
//! Idle, the copier spins the client's `spin_polls` empty turns, then
//! sleeps on its eventfd (or `sleep_ms`), as a rail does.
//!
//! Off by default (`TALLY_COPIER=1` turns it on): on the device, real NCCL
//! at 32 Gbit/s did about 10% better with it on one host and 9-13% worse
//! at 16 MiB on another (docs/measurements.md, "The copier"). What it adds
//! to each staged piece (a hop back through the rail, a copy from another
//! core's cache, one more busy thread) outweighs the rail time it saves
//! there; which of those, is not known.
use super::idle::{EmptyTurns, QUIET_SLEEP_MS};
use super::queue::{CopierShared, Shared};
use super::stream_copy;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// The copier thread's state: the rails it serves.
pub(super) struct Copier {
    rails: Vec<Arc<Shared>>,
    sh: Arc<CopierShared>,
    spin_polls: u32,
    sleep_ms: u32,
    stream: bool,
    timed: bool,
    copied: u64,
    copied_ns: u64,
}

impl Copier {
    pub(super) fn new(rails: Vec<Arc<Shared>>, sh: Arc<CopierShared>, spin_polls: u32, sleep_ms: u32, timed: bool) -> Copier {
        Copier { rails, sh, spin_polls, sleep_ms, stream: stream_copy::wanted(), timed, copied: 0, copied_ns: 0 }
    }

    /// The steady state; ends when the client stops it (after its rails).
    pub(super) fn run(mut self) {
        let mut idle = EmptyTurns::new(self.spin_polls);
        while !self.sh.stop.load(Ordering::Relaxed) {
            let worked = self.turn();
            if idle.sleep_after(worked) {
                self.sleep(idle.quiet());
            }
        }
    }

    /// One pass over the rails: every job waiting, copied and handed back.
    fn turn(&mut self) -> bool {
        let mut any = false;
        for i in 0..self.rails.len() {
            let rail = &self.rails[i];
            let Some(lane) = &rail.copy else { continue };
            let mut moved = false;
            while let Some(job) = lane.jobs.pop() {
                let began = self.timed.then(Instant::now);
                // SAFETY: CopyJob's contract: both buffers are valid for
                // `len` bytes, distinct, and written by no one else until
                // `done` reaches the client, which it does only through
                // this rail, after this copy. (A rail that got stuck in a
                // provider call hands out nothing more, and the client
                // abandons it only seconds later: its jobs are long done.)
                unsafe { stream_copy::copy(job.from, job.to, job.len, self.stream) };
                if let Some(t) = began {
                    self.copied += 1;
                    self.copied_ns += t.elapsed().as_nanos() as u64;
                }
                // Never full: the rail keeps at most LANE jobs out.
                let _ = lane.done.push(job.done);
                moved = true;
            }
            if moved {
                rail.bell.ring();
                any = true;
            }
        }
        if any && self.timed {
            // Plain stores of this thread's own totals: the client only reads them.
            self.sh.copies.store(self.copied, Ordering::Relaxed);
            self.sh.copy_ns.store(self.copied_ns, Ordering::Relaxed);
        }
        any
    }

    /// Sleeps on the bell; a quiet copier (see `EmptyTurns`) longer, as
    /// every job it gets rings it.
    fn sleep(&self, quiet: bool) {
        let bell = &self.sh.bell;
        bell.sleeping.store(true, Ordering::SeqCst);
        // Checked after the flag is up: a rail that handed a job before it
        // saw the flag down, one that hands one after it rings.
        let idle = self.rails.iter().all(|r| r.copy.as_ref().is_none_or(|l| l.jobs.is_empty()));
        if idle && !self.sh.stop.load(Ordering::SeqCst) {
            bell.wait(if quiet { QUIET_SLEEP_MS.max(self.sleep_ms) } else { self.sleep_ms });
        }
        bell.sleeping.store(false, Ordering::SeqCst);
        bell.drain();
    }
}
