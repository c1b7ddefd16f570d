//! `tally stats ADDR:PORT`: a live per-lcore view of a server, like top.
//!
//! It scrapes the server's `/metrics` (the Prometheus text format that
//! `tally server --metrics` serves), keeps the previous sample, and turns
//! counter differences into rates: polls/s, the empty-poll ratio (how much
//! of a poll-mode core's time finds nothing to do), completions/s, GB/s in
//! and out, plus the in-flight gauge and the error count. Rates need two
//! samples, so `--once` takes two, 500 ms apart.
use clap::Args;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

#[derive(Args, Debug, Clone)]
pub struct StatsArgs {
    /// The server's metrics address (its --metrics ADDR:PORT).
    pub addr: String,
    /// Print one snapshot and exit (two samples 500 ms apart).
    #[arg(long)]
    pub once: bool,
    /// Machine-readable output (one JSON object per snapshot).
    #[arg(long)]
    pub json: bool,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
}

/// One lcore's counters from one scrape, by metric name.
type Sample = BTreeMap<usize, BTreeMap<String, f64>>;

/// One lcore's rates between two samples.
#[derive(Debug, Serialize)]
pub struct LcoreRow {
    pub lcore: usize,
    pub polls_per_s: f64,
    pub empty_pct: f64,
    pub completions_per_s: f64,
    pub gb_per_s_in: f64,
    pub gb_per_s_out: f64,
    pub in_flight: f64,
    pub errors: f64,
    /// Share of the lcore's slab held by job regions, in percent.
    pub slab_used_pct: f64,
}

#[derive(Debug, Serialize)]
struct Snapshot {
    interval_s: f64,
    jobs_running: f64,
    lcores: Vec<LcoreRow>,
}

/// GETs /metrics from `addr`, bounded in time.
fn fetch(addr: &str) -> Result<String, String> {
    let sa = addr.to_socket_addrs().map_err(|e| format!("{addr}: {e}"))?.next().ok_or_else(|| format!("{addr}: no address"))?;
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(2)).map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .map_err(|e| format!("{addr}: {e}"))?;
    // A server's control port (--listen) does not speak HTTP: it answers
    // with something else, or nothing until the read times out.
    const HINT: &str = "is this the server's control port (--listen)? `tally stats` reads the port the server \
                        serves with --metrics ADDR:PORT (config key `metrics`)";
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("{addr}: {e}: {HINT}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("{addr}: not an HTTP response: {HINT}"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(format!("{addr}: {}", head.lines().next().unwrap_or("")));
    }
    Ok(body.to_string())
}

/// One parsed sample: metric name, labels in order, value.
pub type Line<'a> = (&'a str, Vec<(&'a str, &'a str)>, f64);

/// Parses one exposition line: `name{k="v",...} value` or `name value`.
/// Comments and malformed lines give None.
pub fn parse_line(line: &str) -> Option<Line<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        None => (series, Vec::new()),
        Some((n, rest)) => {
            let rest = rest.strip_suffix('}')?;
            let labels = rest
                .split(',')
                .filter(|kv| !kv.is_empty())
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k, v.trim_matches('"')))
                .collect();
            (n, labels)
        }
    };
    Some((name, labels, value))
}

/// The per-lcore series (labelled only by lcore) and the running-jobs gauge.
fn sample(text: &str) -> (Sample, f64) {
    let mut out = Sample::new();
    let mut running = 0.0;
    for (name, labels, v) in text.lines().filter_map(parse_line) {
        if name == "tally_jobs" && labels == [("state", "running")] {
            running = v;
        }
        if let [("lcore", l)] = labels.as_slice() {
            if let (Some(n), Ok(l)) = (name.strip_prefix("tally_lcore_"), l.parse::<usize>()) {
                out.entry(l).or_default().insert(n.to_string(), v);
            }
        }
    }
    (out, running)
}

fn rows(a: &Sample, b: &Sample, dt: f64) -> Vec<LcoreRow> {
    b.iter()
        .map(|(&l, now)| {
            let get = |m: &BTreeMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(0.0);
            let before = a.get(&l);
            let d = |k: &str| (get(now, k) - before.map_or(0.0, |m| get(m, k))).max(0.0);
            let polls = d("polls_total");
            LcoreRow {
                lcore: l,
                polls_per_s: polls / dt,
                empty_pct: if polls > 0.0 { 100.0 * d("empty_polls_total") / polls } else { 0.0 },
                completions_per_s: d("completions_total") / dt,
                gb_per_s_in: d("bytes_in_total") / dt / 1e9,
                gb_per_s_out: d("bytes_out_total") / dt / 1e9,
                in_flight: get(now, "in_flight"),
                errors: get(now, "cq_errors_total"),
                slab_used_pct: match get(now, "slab_bytes") {
                    0.0 => 0.0,
                    total => 100.0 * get(now, "slab_used_bytes") / total,
                },
            }
        })
        .collect()
}

fn table(addr: &str, s: &Snapshot) -> String {
    let mut o = format!("tally stats {addr}: {} jobs running, {:.2} s interval\n", s.jobs_running, s.interval_s);
    o += &format!(
        "{:>5} {:>12} {:>7} {:>12} {:>9} {:>9} {:>9} {:>7} {:>6}\n",
        "lcore", "polls/s", "empty%", "compl/s", "GB/s in", "GB/s out", "inflight", "errors", "slab%"
    );
    for r in &s.lcores {
        o += &format!(
            "{:>5} {:>12.0} {:>7.1} {:>12.0} {:>9.3} {:>9.3} {:>9.0} {:>7.0} {:>6.1}\n",
            r.lcore, r.polls_per_s, r.empty_pct, r.completions_per_s, r.gb_per_s_in, r.gb_per_s_out, r.in_flight, r.errors, r.slab_used_pct
        );
    }
    o
}

pub fn run(args: &StatsArgs) -> Result<(), String> {
    let interval = if args.once { Duration::from_millis(500) } else { Duration::from_secs_f64(args.interval.max(0.1)) };
    let (mut prev, _) = sample(&fetch(&args.addr)?);
    let mut t_prev = Instant::now();
    loop {
        std::thread::sleep(interval);
        let (now, running) = sample(&fetch(&args.addr)?);
        let t_now = Instant::now();
        let dt = (t_now - t_prev).as_secs_f64();
        let snap = Snapshot { interval_s: dt, jobs_running: running, lcores: rows(&prev, &now, dt) };
        if args.json {
            println!("{}", serde_json::to_string(&snap).map_err(|e| e.to_string())?);
        } else if args.once || !std::io::stdout().is_terminal() {
            // Into a pipe or a file: one table after another, no screen codes.
            print!("{}", table(&args.addr, &snap));
            let _ = std::io::stdout().flush();
        } else {
            // Clear the screen and go home: the view refreshes in place.
            print!("\x1b[2J\x1b[H{}", table(&args.addr, &snap));
            let _ = std::io::stdout().flush();
        }
        if args.once {
            return Ok(());
        }
        (prev, t_prev) = (now, t_now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_exposition_lines() {
        assert_eq!(parse_line("# HELP x y"), None);
        assert_eq!(parse_line("tally_x 3"), Some(("tally_x", vec![], 3.0)));
        let (n, l, v) = parse_line("tally_lcore_polls_total{lcore=\"1\"} 42").unwrap();
        assert_eq!((n, l, v), ("tally_lcore_polls_total", vec![("lcore", "1")], 42.0));
        let (_, l, _) = parse_line("h_bucket{job=\"0x1\",lcore=\"0\",le=\"+Inf\"} 7").unwrap();
        assert_eq!(l, vec![("job", "0x1"), ("lcore", "0"), ("le", "+Inf")]);
    }

    #[test]
    fn rates_from_two_samples() {
        let a = sample("tally_lcore_polls_total{lcore=\"0\"} 100\ntally_lcore_empty_polls_total{lcore=\"0\"} 50\ntally_lcore_bytes_in_total{lcore=\"0\"} 0\n").0;
        let b = sample("tally_lcore_polls_total{lcore=\"0\"} 300\ntally_lcore_empty_polls_total{lcore=\"0\"} 100\ntally_lcore_bytes_in_total{lcore=\"0\"} 2000000000\ntally_lcore_in_flight{lcore=\"0\"} 8\ntally_lcore_slab_used_bytes{lcore=\"0\"} 1024\ntally_lcore_slab_bytes{lcore=\"0\"} 4096\n").0;
        let r = &rows(&a, &b, 2.0)[0];
        assert_eq!((r.polls_per_s, r.empty_pct, r.gb_per_s_in, r.in_flight, r.slab_used_pct), (100.0, 25.0, 1.0, 8.0, 25.0));
        // A server without the slab gauges (older) reads as 0%, not NaN.
        assert_eq!(rows(&a, &a, 2.0)[0].slab_used_pct, 0.0);
    }
}
