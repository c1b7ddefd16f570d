//! `tally bench tcp-stream` (hidden): one end of the kernel baseline's
//! plain TCP stream (`tcp_baseline`), started by `tally bench cluster` in
//! a host's namespace.
//!
//! Why a process of its own: its CPU time, read from /proc as the ranks'
//! and servers' are, is then the kernel's cost of the bytes and nothing
//! else (blocking std::net calls, one thread sending and one receiving per
//! connection, no polling). One end listens and takes `--streams`
//! connections (one by default), the other makes them (`--streams` to each
//! address it is given: a worker's end with `--tcp-peers all` connects to
//! every server's); both then send and receive `--bytes` per iteration at
//! once, split evenly over their connections: the bytes agg moves each way
//! through a host's link per all-reduce.
//!
//! Its caller paces it over stdin and stdout, so that every stream of the
//! run is timed over one interval: after the warm-up it prints `READY` and
//! waits for a `GO` line; after the timed iterations it prints `DONE` and
//! stays until its stdin closes, so that its CPU time can still be read.
use clap::Args;
use std::io::{BufRead, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Bytes per send and receive call.
const CALL_BYTES: usize = 1 << 20;

#[derive(Args, Debug, Clone)]
pub struct TcpStreamArgs {
    /// Listen on ADDR:PORT and take `--streams` connections.
    #[arg(long, value_name = "ADDR:PORT", required_unless_present = "connect", conflicts_with = "connect")]
    pub listen: Option<String>,
    /// Connect to ADDR:PORT, or to each of a comma-separated list (retried
    /// until --timeout while refused).
    #[arg(long, value_name = "ADDR:PORT[,...]")]
    pub connect: Option<String>,
    /// Bytes each way per iteration.
    #[arg(long)]
    pub bytes: u64,
    /// Timed iterations.
    #[arg(long)]
    pub iters: u64,
    /// Connections (to each address connected to), the bytes split evenly
    /// over all (a listening server end with `--tcp-peers all` takes
    /// `--tcp-streams` from each of up to 64 workers).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub streams: u32,
    /// Untimed iterations before them (TCP's window opens).
    #[arg(long, default_value_t = 0)]
    pub warmup: u64,
    /// Seconds the connection, and each send or receive call, may take.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
}

/// Runs one end, paced by its caller (the module doc).
pub fn run(args: &TcpStreamArgs) -> Result<(), String> {
    let timeout = Duration::from_secs(args.timeout.max(1));
    let n = args.streams.max(1) as usize;
    let streams = match (&args.listen, &args.connect) {
        (Some(at), _) => accept(at, n)?,
        (None, Some(to)) => to.split(',').flat_map(|a| (0..n).map(move |_| connect(a, timeout))).collect::<Result<Vec<_>, _>>()?,
        (None, None) => return Err("--listen or --connect".into()),
    };
    for s in &streams {
        s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
        s.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    }
    exchange_all(&streams, args.bytes * args.warmup).map_err(|e| format!("warm-up: {e}"))?;
    let mut control = std::io::stdin().lock();
    say("READY")?;
    let mut line = String::new();
    control.read_line(&mut line).map_err(|e| e.to_string())?;
    if line.trim() != "GO" {
        return Err(format!("expected GO on stdin, got {:?}", line.trim()));
    }
    exchange_all(&streams, args.bytes * args.iters)?;
    say("DONE")?;
    std::io::copy(&mut control, &mut std::io::sink()).map_err(|e| e.to_string())?;
    Ok(())
}

fn say(what: &str) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{what}").and_then(|()| out.flush()).map_err(|e| e.to_string())
}

fn accept(at: &str, n: usize) -> Result<Vec<TcpStream>, String> {
    let listener = TcpListener::bind(at).map_err(|e| format!("cannot listen on {at}: {e}"))?;
    (0..n).map(|_| listener.accept().map(|(s, _)| s).map_err(|e| format!("accept on {at}: {e}"))).collect()
}

/// [`exchange`] on every stream at once, `total` split evenly over them
/// (the remainder on the first).
fn exchange_all(streams: &[TcpStream], total: u64) -> Result<(), String> {
    let n = streams.len().max(1) as u64;
    std::thread::scope(|scope| {
        let each: Vec<_> = streams
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let share = total / n + if i == 0 { total % n } else { 0 };
                scope.spawn(move || exchange(s, share))
            })
            .collect();
        each.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| Err("a stream's thread panicked".into())))
    })
}

/// Connects to `to`, again while it is refused (the listener may not be up
/// yet), for up to `timeout`.
fn connect(to: &str, timeout: Duration) -> Result<TcpStream, String> {
    let addr = to.to_socket_addrs().map_err(|e| format!("{to}: {e}"))?.next().ok_or_else(|| format!("{to}: no address"))?;
    let deadline = Instant::now() + timeout;
    loop {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(format!("cannot connect to {to}: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Sends `total` bytes on `stream` and receives as many, both at once (a
/// thread sends).
fn exchange(stream: &TcpStream, total: u64) -> Result<(), String> {
    if total == 0 {
        return Ok(());
    }
    let mut sending = stream.try_clone().map_err(|e| e.to_string())?;
    std::thread::scope(|scope| {
        let sender = scope.spawn(move || send(&mut sending, total));
        let received = receive(&mut &*stream, total);
        let sent = sender.join().unwrap_or_else(|_| Err("the sending thread panicked".into()));
        sent.and(received)
    })
}

fn send(to: &mut impl Write, total: u64) -> Result<(), String> {
    let buf = vec![0x5au8; CALL_BYTES];
    let mut left = total;
    while left > 0 {
        let n = left.min(CALL_BYTES as u64) as usize;
        to.write_all(&buf[..n]).map_err(|e| format!("send, {} of {total} bytes sent: {e}", total - left))?;
        left -= n as u64;
    }
    Ok(())
}

fn receive(from: &mut impl Read, total: u64) -> Result<(), String> {
    let mut buf = vec![0u8; CALL_BYTES];
    let mut left = total;
    while left > 0 {
        let want = left.min(CALL_BYTES as u64) as usize;
        match from.read(&mut buf[..want]) {
            Ok(0) => return Err(format!("the peer closed after {} of {total} bytes", total - left)),
            Ok(n) => left -= n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("receive, {} of {total} bytes received: {e}", total - left)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ends_send_and_receive_every_byte() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap().to_string();
        let total = 3 * CALL_BYTES as u64 + 12345;
        let far = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            exchange(&s, total)
        });
        let near = connect(&at, Duration::from_secs(5)).unwrap();
        assert_eq!(exchange(&near, total), Ok(()));
        assert_eq!(far.join().unwrap(), Ok(()));
        assert_eq!(exchange(&near, 0), Ok(()), "nothing to move");
        // Several connections share the bytes, every one of them moved.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap().to_string();
        let far = std::thread::spawn(move || {
            let streams: Vec<TcpStream> = (0..3).map(|_| listener.accept().unwrap().0).collect();
            exchange_all(&streams, total)
        });
        let near: Vec<TcpStream> = (0..3).map(|_| connect(&at, Duration::from_secs(5)).unwrap()).collect();
        assert_eq!(exchange_all(&near, total), Ok(()));
        assert_eq!(far.join().unwrap(), Ok(()));
        // One end connected to two listeners (a worker's end to every
        // server's), the bytes split over both.
        let (a, b) = (TcpListener::bind("127.0.0.1:0").unwrap(), TcpListener::bind("127.0.0.1:0").unwrap());
        let to = format!("{},{}", a.local_addr().unwrap(), b.local_addr().unwrap());
        let fars: Vec<_> = [a, b].into_iter().map(|l| std::thread::spawn(move || exchange(&l.accept().unwrap().0, total / 2))).collect();
        let near: Vec<TcpStream> = to.split(',').map(|at| connect(at, Duration::from_secs(5)).unwrap()).collect();
        assert_eq!(exchange_all(&near, total / 2 * 2), Ok(()));
        assert!(fars.into_iter().all(|f| f.join().unwrap() == Ok(())));
        // A peer that closes early is named as such.
        let mut short: &[u8] = &[1, 2, 3];
        assert_eq!(receive(&mut short, 10), Err("the peer closed after 3 of 10 bytes".into()));
    }
}
