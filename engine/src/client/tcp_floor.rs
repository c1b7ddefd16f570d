//! A rank's side of the TCP timer floor (`host::tcp_rto_min` says why it
//! exists): which connections get it, and when.
//!
//! The provider opens a rank's connections to a server at the rank's first
//! sends to it, after a join or a rejoin. Until a walk of the process's
//! sockets finds them, a lost tail on one of them waits the kernel's
//! 200 ms: on the device (4 + 4 hosts at 8 Gbit/s, 0.1% loss, the floor
//! found by a walk once a second), rows of 300 all-reduces began with one
//! such wait in three runs of five, each the row's slowest operation
//! (225-230 ms against a p99 of 40-50).
//!
//! So the client's failover state, which learns each server's endpoint
//! names, gives their addresses to [`TcpPeers`]; a change pokes the
//! watchdog's thread, whose chore ([`rto_floor_chore`]) then walks every
//! [`SETTLE_EVERY`] for [`SETTLE`], and once a second after that. The walk
//! itself is the process's, shared by all its ranks
//! (`tcp_rto_min::sweep_for_ranks`).
use super::watchdog::{Chore, Poke, CHORE_EVERY};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crate::host::tcp_rto_min::{RANK_SWEEP_SOON as SETTLE_EVERY, SETTLE};

/// The servers' IP addresses (over tcp), as the client learns them.
#[derive(Default)]
pub struct TcpPeers {
    ips: Mutex<Vec<IpAddr>>,
    /// The watchdog's thread, poked when the addresses change.
    poke: OnceLock<Poke>,
}

impl TcpPeers {
    /// Every server's addresses now; a change pokes the chore.
    pub fn set(&self, ips: Vec<IpAddr>) {
        let changed = match self.ips.lock() {
            Ok(mut now) if *now != ips => {
                *now = ips;
                true
            }
            _ => false,
        };
        if let Some(p) = self.poke.get().filter(|_| changed) {
            p.now();
        }
    }

    pub fn get(&self) -> Vec<IpAddr> {
        self.ips.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// The watchdog's thread to poke from now on (the first one given).
    pub fn poke_with(&self, poke: Option<Poke>) {
        if let Some(p) = poke {
            let _ = self.poke.set(p);
        }
    }
}

/// Over tcp with a floor of `floor_ms` (none for 0), the chore that sets
/// the floor of the TCP timers on this process's new connections to
/// `peers`, soon after they change (see the module's doc).
pub fn rto_floor_chore(provider: &str, floor_ms: u32, peers: &Arc<TcpPeers>) -> Option<Chore> {
    if !provider.starts_with("tcp") || floor_ms == 0 {
        return None;
    }
    let peers = peers.clone();
    let (mut last, mut settling_until) = (Vec::new(), Instant::now());
    Some(Box::new(move || {
        let now = peers.get();
        if now != last {
            settling_until = Instant::now() + SETTLE;
            last.clone_from(&now);
        }
        let settling = Instant::now() < settling_until;
        // The control connections too: tally's own, and a heartbeat's tail
        // is as much a tail.
        crate::host::tcp_rto_min::sweep_for_ranks(floor_ms, &now, settling);
        if settling {
            SETTLE_EVERY
        } else {
            CHORE_EVERY
        }
    }))
}
