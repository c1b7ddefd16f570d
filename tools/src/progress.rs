//! A progress line for long runs (emulated cluster, many sizes).
//!
//! Drawn on standard error, and only when standard error is a terminal and
//! the caller is not producing JSON: a pipe, a log file or a script sees
//! nothing. Table rows go to standard output; `println` here clears the
//! progress line first and redraws it after, so the two never mix on screen.
use std::io::{IsTerminal, Write};
use std::time::Instant;

pub struct Progress {
    shown: bool,
    done: usize,
    total: usize,
    what: String,
    start: Instant,
}

impl Progress {
    /// A progress line over `total` steps; silent when `quiet` or when
    /// standard error is not a terminal.
    pub fn new(total: usize, quiet: bool) -> Progress {
        Progress { shown: !quiet && std::io::stderr().is_terminal(), done: 0, total, what: String::new(), start: Instant::now() }
    }

    /// Says what runs now (the step after the `done` finished ones).
    pub fn working_on(&mut self, what: impl Into<String>) {
        self.what = what.into();
        self.draw();
    }

    /// One more step finished.
    pub fn step(&mut self) {
        self.done = (self.done + 1).min(self.total);
        self.draw();
    }

    /// Prints a line on standard output without tearing the progress line.
    pub fn println(&self, line: &str) {
        self.clear();
        println!("{line}");
        self.draw();
    }

    pub fn finish(&self) {
        self.clear();
    }

    fn clear(&self) {
        if self.shown {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[2K");
            let _ = e.flush();
        }
    }

    fn draw(&self) {
        if !self.shown {
            return;
        }
        const WIDTH: usize = 24;
        let filled = (self.done * WIDTH).checked_div(self.total).unwrap_or(WIDTH);
        let bar: String = (0..WIDTH).map(|i| if i < filled { '#' } else { '.' }).collect();
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[2K[{bar}] {}/{} {:>5.0}s {}", self.done, self.total, self.start.elapsed().as_secs_f64(), self.what);
        let _ = e.flush();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}
