//! Where log lines go.
//!
//! By default every log line goes to standard error (env_logger, `TALLY_LOG`).
//! A command that prints a table (`tally demo`, `tally bench cluster`) can
//! send them to a log file instead with [`redirect_to`]: then info and debug
//! lines of this process, of the servers and ranks it starts ([`forward`])
//! go to the file only, and warnings, errors and anything that is not a
//! log line (a panic, a provider's own message) go to the file and to the
//! terminal. Nothing here is on a data path: lines are rare and a mutex is fine.
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::sync::mpsc::Sender;
use std::sync::Mutex;
use std::thread::JoinHandle;

static FILE: Mutex<Option<File>> = Mutex::new(None);

struct Logger {
    inner: env_logger::Logger,
}

impl log::Log for Logger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &log::Record) {
        if !self.inner.matches(record) {
            return;
        }
        let to_file = {
            let mut f = FILE.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(f) = f.as_mut() {
                let _ = writeln!(f, "[{} {:<5} {}] {}", timestamp(), record.level(), record.target(), record.args());
                true
            } else {
                false
            }
        };
        if !to_file || record.level() <= log::Level::Warn {
            self.inner.log(record);
        }
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

/// Installs the logger: `TALLY_LOG` sets the level (default info).
pub fn init() {
    let inner = env_logger::Builder::from_env(env_logger::Env::new().filter_or("TALLY_LOG", "info").write_style("TALLY_LOG_STYLE"))
        .format_timestamp_millis()
        .build();
    let level = inner.filter();
    if log::set_boxed_logger(Box::new(Logger { inner })).is_ok() {
        log::set_max_level(level);
    }
}

/// From now on, log lines go to `path` (created or truncated); warnings and
/// errors still reach standard error.
pub fn redirect_to(path: &Path) -> Result<(), String> {
    let f = File::create(path).map_err(|e| format!("cannot create log file {}: {e}", path.display()))?;
    *FILE.lock().unwrap_or_else(|p| p.into_inner()) = Some(f);
    Ok(())
}

/// Whether log lines currently go to a file.
pub fn redirected() -> bool {
    FILE.lock().unwrap_or_else(|p| p.into_inner()).is_some()
}

/// Copies a child's standard error line by line into the log file, each
/// line prefixed with `tag`; lines that are not info/debug/trace log lines
/// also go to standard error. Ends when the stream closes.
pub fn forward<R: Read + Send + 'static>(stream: R, tag: String) -> JoinHandle<()> {
    forward_lines(stream, tag, None, true)
}

/// Copies a child's standard output (status lines such as a server's ready
/// line) into the log file only, and sends every line to `lines`.
pub fn forward_stdout<R: Read + Send + 'static>(stream: R, tag: String, lines: Sender<String>) -> JoinHandle<()> {
    forward_lines(stream, tag, Some(lines), false)
}

fn forward_lines<R: Read + Send + 'static>(stream: R, tag: String, lines: Option<Sender<String>>, alerts: bool) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            // Without a log file every standard-error line goes to the
            // terminal, as before; standard output lines are dropped.
            let mut to_terminal = alerts && !is_quiet_log_line(&line);
            match FILE.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                Some(f) => {
                    let _ = writeln!(f, "{tag} {line}");
                }
                None => to_terminal = alerts,
            }
            if to_terminal {
                eprintln!("{tag} {line}");
            }
            if let Some(tx) = &lines {
                let _ = tx.send(line);
            }
        }
    })
}

/// An env_logger line below warning: `[<time> INFO  target] ...`.
fn is_quiet_log_line(line: &str) -> bool {
    let Some(head) = line.strip_prefix('[').and_then(|l| l.split(']').next()) else {
        return false;
    };
    head.split_whitespace().nth(1).is_some_and(|lvl| matches!(lvl, "INFO" | "DEBUG" | "TRACE"))
}

fn timestamp() -> String {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:03}", d.as_secs(), d.subsec_millis())
}

#[cfg(test)]
mod tests {
    use super::is_quiet_log_line;

    #[test]
    fn quiet_lines_are_env_logger_info_and_below() {
        assert!(is_quiet_log_line("[2026-11-24T05:16:14.123Z INFO  tally_engine::server] job 3 ready"));
        assert!(is_quiet_log_line("[2026-11-24T05:16:14.123Z DEBUG tally_engine::dataplane::lcore] nap"));
        assert!(!is_quiet_log_line("[2026-11-24T05:16:14.123Z WARN  tally_engine::server] slow"));
        assert!(!is_quiet_log_line("[2026-11-24T05:16:14.123Z ERROR tally] failed"));
        assert!(!is_quiet_log_line("thread 'main' panicked at src/x.rs:1:1"));
        assert!(!is_quiet_log_line("tally: error: rank 1 exited"));
        assert!(!is_quiet_log_line("libfabric:123:1700000000::tcp:core:warn: ..."));
    }
}
