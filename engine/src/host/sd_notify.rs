//! The service manager's notify protocol (systemd's `sd_notify`): a server
//! run as a `Type=notify` unit tells systemd when it is ready (`READY=1`),
//! when it begins to stop (`STOPPING=1`), what it is doing (`STATUS=...`),
//! and, when the unit has a `WatchdogSec=`, that it still works
//! (`WATCHDOG=1`, at least every `WATCHDOG_USEC` microseconds, else systemd
//! kills and restarts it).
//!
//! The protocol is one datagram of `KEY=VALUE` lines to the unix socket
//! named by `$NOTIFY_SOCKET`: a path, or, starting with `@`, a name in the
//! abstract namespace. Without the variable every call does nothing, so the
//! same binary runs under systemd, in a container or by hand.
//!
//! Written here (some thirty lines) rather than taken from the `sd-notify`
//! crate, whose 0.5 connects to the variable as a path and so misses the
//! abstract `@` form. Each message opens a fresh non-blocking socket: a
//! service manager that re-executed has a new socket behind the same name,
//! and a full queue drops one message instead of blocking the caller (the
//! control loop sends the watchdog's).
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// Sends `state` (`KEY=VALUE` lines) to the service manager. Ok(false)
/// when there is none (`NOTIFY_SOCKET` unset or empty).
pub fn notify(state: &str) -> io::Result<bool> {
    match std::env::var_os("NOTIFY_SOCKET") {
        Some(to) if !to.is_empty() => notify_to(&to.to_string_lossy(), state).map(|_| true),
        _ => Ok(false),
    }
}

/// Sends `state` to the notify socket named `to` (a path or `@name`).
pub fn notify_to(to: &str, state: &str) -> io::Result<()> {
    let addr = match to.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
        None if to.starts_with('/') => SocketAddr::from_pathname(to)?,
        None => {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("NOTIFY_SOCKET={to}: neither an absolute path nor @abstract")))
        }
    };
    let sock = UnixDatagram::unbound()?;
    sock.set_nonblocking(true)?;
    let sent = sock.send_to_addr(state.as_bytes(), &addr)?;
    if sent != state.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "notify datagram cut short"));
    }
    Ok(())
}

/// The watchdog period the service manager asks for (`WATCHDOG_USEC`), when
/// it asks this process (`WATCHDOG_PID` unset or ours). Send `WATCHDOG=1`
/// at least every half of it.
pub fn watchdog_period() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.trim().parse().ok().filter(|&u| u > 0)?;
    match std::env::var("WATCHDOG_PID") {
        Ok(pid) if pid.trim().parse::<u32>().ok() != Some(std::process::id()) => None,
        _ => Some(Duration::from_micros(usec)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recv(sock: &UnixDatagram) -> String {
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn sends_to_a_path_and_to_an_abstract_name() {
        let path = std::env::temp_dir().join(format!("tally-sd-notify-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let at_path = UnixDatagram::bind(&path).unwrap();
        notify_to(path.to_str().unwrap(), "READY=1\nSTATUS=serving\n").unwrap();
        assert_eq!(recv(&at_path), "READY=1\nSTATUS=serving\n");
        let _ = std::fs::remove_file(&path);

        let name = format!("tally-sd-notify-test-{}", std::process::id());
        let abstract_sock = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
        notify_to(&format!("@{name}"), "WATCHDOG=1\n").unwrap();
        assert_eq!(recv(&abstract_sock), "WATCHDOG=1\n");
    }

    #[test]
    fn bad_targets_are_errors() {
        let e = notify_to("relative/notify", "READY=1\n").unwrap_err();
        assert!(e.to_string().contains("neither an absolute path nor @abstract"), "{e}");
        // Nobody listens there.
        assert!(notify_to("/nonexistent/tally/notify", "READY=1\n").is_err());
    }
}
