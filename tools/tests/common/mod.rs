//! Shared by the integration tests: a real `tally server` process.
#![allow(dead_code)]
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct ServerProcess {
    pub child: Child,
    pub addr: String,
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl ServerProcess {
    /// Starts `tally server` on a free loopback port with `args` and waits
    /// until it says it is ready. Its log lines are collected.
    pub fn start(args: &[&str]) -> ServerProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tally"))
            .arg("server")
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env("TALLY_LOG", std::env::var("TALLY_LOG").unwrap_or_else(|_| "info".into()))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tally server");
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var("TALLY_TEST_VERBOSE").is_ok() {
                    eprintln!("server: {line}");
                }
                log2.lock().unwrap().push(line);
            }
        });
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            line.clear();
            if out.read_line(&mut line).unwrap_or(0) == 0 || Instant::now() > deadline {
                let _ = child.kill();
                panic!("tally server did not start: {:?}", log.lock().unwrap());
            }
            if let Some(rest) = line.strip_prefix("tally server ready on ") {
                let addr = rest.split_whitespace().next().unwrap().to_string();
                std::thread::spawn(move || for _ in out.lines() {});
                return ServerProcess { child, addr, log };
            }
        }
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// Waits (bounded) until a log line contains `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.log_contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// SIGTERM, and wait for a clean exit.
    pub fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("tally server did not stop on SIGTERM: {:?}", self.log.lock().unwrap());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
