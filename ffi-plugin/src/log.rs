//! Logging through the logger NCCL hands to `init`.
//!
//! NCCL filters its logger's output by `NCCL_DEBUG` (level) and
//! `NCCL_DEBUG_SUBSYS` (subsystem flags), and prefixes host, pid and rank, so
//! plugin lines sit in NCCL's log where a user looks for them. The logger is
//! a variadic C function; the plugin formats its message in Rust and always
//! passes the format `"%s"` with one NUL-terminated argument, so no text of
//! ours is ever interpreted as a format string.
//!
//! Before the first `init` (or in a harness that passes no logger), lines go
//! to stderr when `TALLY_PLUGIN_DEBUG` is set, and nowhere otherwise.
//!
//! The engine logs through the `log` crate; [`install_bridge`] forwards those
//! records to the same logger, unless the host process set its own.
use crate::abi::{NcclLogger, NCCL_INIT, NCCL_LOG_INFO, NCCL_LOG_TRACE, NCCL_LOG_WARN, NCCL_NET};
use std::ffi::{c_ulong, CString};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The most recent non-null logger from `init` (0: none yet).
static LOGGER: AtomicUsize = AtomicUsize::new(0);

/// Remembers NCCL's logger. NCCL passes the same one to every `init`.
pub fn set_logger(logger: Option<NcclLogger>) {
    if let Some(f) = logger {
        LOGGER.store(f as usize, Ordering::Release);
    }
}

fn logger() -> Option<NcclLogger> {
    let p = LOGGER.load(Ordering::Acquire);
    if p == 0 {
        return None;
    }
    // SAFETY: the only non-zero value ever stored is an `NcclLogger` function
    // pointer (set_logger), and function pointers round-trip through usize.
    Some(unsafe { std::mem::transmute::<usize, NcclLogger>(p) })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Warn,
    Info,
    Trace,
}

/// Subsystem flags for a line: NET always, INIT too for set-up messages.
pub const NET: c_ulong = NCCL_NET;
pub const INIT_NET: c_ulong = NCCL_INIT | NCCL_NET;

pub fn log(level: Level, flags: c_ulong, msg: &str) {
    let text = format!("NET/Tally: {msg}");
    match logger() {
        Some(f) => {
            // Interior NULs would cut the message short; replace them.
            let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
            let lvl = match level {
                Level::Warn => NCCL_LOG_WARN,
                Level::Info => NCCL_LOG_INFO,
                Level::Trace => NCCL_LOG_TRACE,
            };
            // SAFETY: f is NCCL's logger (see `logger`); the format is a
            // static "%s" consuming exactly one argument, a NUL-terminated
            // string that outlives the call, as does the file name.
            unsafe { f(lvl, flags, c"tally".as_ptr(), 0, c"%s".as_ptr(), c.as_ptr()) };
        }
        None => {
            if std::env::var_os("TALLY_PLUGIN_DEBUG").is_some() {
                eprintln!("[{level:?}] {text}");
            }
        }
    }
}

pub fn warn(msg: &str) {
    log(Level::Warn, NET, msg)
}

pub fn info(msg: &str) {
    log(Level::Info, NET, msg)
}

pub fn info_init(msg: &str) {
    log(Level::Info, INIT_NET, msg)
}

/// Forwards the engine's `log` records to NCCL's logger (warn and error as
/// WARN, info as INFO, debug and trace as TRACE).
struct Bridge;

impl log::Log for Bridge {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }

    fn log(&self, record: &log::Record) {
        let level = match record.level() {
            log::Level::Error | log::Level::Warn => Level::Warn,
            log::Level::Info => Level::Info,
            log::Level::Debug | log::Level::Trace => Level::Trace,
        };
        log(level, NET, &format!("{}: {}", record.target(), record.args()));
    }

    fn flush(&self) {}
}

static BRIDGE: Bridge = Bridge;

/// Installs the bridge once, if no other `log` logger exists in the process.
/// The level follows `NCCL_DEBUG` so that filtered-out records are not even
/// formatted: INFO gives info, TRACE gives everything, else warnings only.
pub fn install_bridge() {
    let max = match std::env::var("NCCL_DEBUG").map(|s| s.to_ascii_uppercase()) {
        Ok(s) if s == "TRACE" => log::LevelFilter::Trace,
        Ok(s) if s == "INFO" => log::LevelFilter::Info,
        _ => log::LevelFilter::Warn,
    };
    if log::set_logger(&BRIDGE).is_ok() {
        log::set_max_level(max);
    }
}
