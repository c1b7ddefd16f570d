//! The rejoin watcher ([`Watcher`]): a thread that tries to reach a
//! sub-job's lost servers in the background (a blocking connect to a dead
//! host must not stall the data path) and hands over the connections it
//! made, each with the server's challenge read, for `rejoin.rs` to answer.
use crate::client::greet::{read_opening, Opening};
use crate::wire::Challenge;
use std::net::TcpStream;
use std::time::Duration;

/// A lost server reached again: (sub-job, server, the connection, its
/// challenge), read on the watcher's thread so that the client's never
/// waits for a server that accepts and then says nothing.
pub(super) type Reached = (usize, usize, TcpStream, Challenge);

/// A lost server the watcher tries to reach.
#[derive(Clone)]
pub(super) struct Wanted {
    pub(super) sub: usize,
    pub(super) server: usize,
    /// Its control address.
    pub(super) addr: std::net::SocketAddr,
    /// The addresses of its endpoints (tcp's names; empty for other
    /// providers): this process's connections to them are looked at
    /// (`host::tcp_backoff`) before it is taken back.
    pub(super) data_ips: Vec<std::net::IpAddr>,
}

/// A thread that tries to reach lost servers (a blocking connect to a dead
/// host must not stall the data path) and hands over the connections.
///
/// A server reached again is handed over only once none of this process's
/// connections to its endpoints waits out a retransmission backoff left by
/// the cut (`host::tcp_backoff`): whatever the job sent it would queue
/// behind that. While it is away the watcher caps those connections'
/// backoff (where the kernel can) so that they resend soon after it returns;
/// when it hands a server over, their congestion control starts afresh.
pub(super) struct Watcher {
    /// Lost servers still to reach.
    pub(super) wanted: std::sync::Arc<std::sync::Mutex<Vec<Wanted>>>,
    /// Connections made, each with the server's challenge read, not yet taken.
    pub(super) reached: std::sync::Arc<std::sync::Mutex<Vec<Reached>>>,
    pub(super) stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Watcher {
    pub(super) fn start() -> Watcher {
        use std::sync::{atomic::AtomicBool, atomic::Ordering, Arc, Mutex};
        let wanted: Arc<Mutex<Vec<Wanted>>> = Arc::default();
        let reached: Arc<Mutex<Vec<Reached>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (w, r, st) = (wanted.clone(), reached.clone(), stop.clone());
        let _ = std::thread::Builder::new().name("tally-rejoin".into()).spawn(move || {
            // Servers whose wait for a backoff was logged (once each time).
            let mut told: Vec<(usize, usize)> = Vec::new();
            while !st.load(Ordering::Relaxed) {
                let todo: Vec<Wanted> = w.lock().map(|v| v.clone()).unwrap_or_default();
                for want in todo {
                    let (sub, si) = (want.sub, want.server);
                    let backoff = crate::host::tcp_backoff::scan(&want.data_ips, want.addr.port(), true);
                    let Ok(mut c) = TcpStream::connect_timeout(&want.addr, Duration::from_secs(1)) else { continue };
                    if backoff.backed_off > 0 {
                        if !told.contains(&(sub, si)) {
                            told.push((sub, si));
                            log::info!(
                                "server {} answers again, but {} of this process's connections to it still wait out TCP's \
                                 retransmission backoff from the outage (resend in up to {} ms{}): taking it back once they resent",
                                want.addr,
                                backoff.backed_off,
                                backoff.rto_ms,
                                if backoff.capped > 0 { ", capped" } else { "" }
                            );
                        }
                        continue;
                    }
                    // A server that refuses at once (busy) is tried again on a later turn.
                    if let Ok(Opening::Challenge(challenge)) = read_opening(&mut c, Duration::from_secs(1)) {
                        // What the connections' congestion control made of
                        // the outage is wrong now (`tcp_backoff`'s module doc).
                        crate::host::tcp_renew::renew_congestion_control(&want.data_ips, want.addr.port());
                        if let (Ok(mut wv), Ok(mut rv)) = (w.lock(), r.lock()) {
                            wv.retain(|x| (x.sub, x.server) != (sub, si));
                            told.retain(|x| *x != (sub, si));
                            rv.push((sub, si, c, challenge));
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        Watcher { wanted, reached, stop }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
