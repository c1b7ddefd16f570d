//! The launcher: what a user's `tally bench allreduce` does. It hosts a
//! reduction server in-process when none is given, starts every rank (or
//! process of rank threads) as a child process of this binary, and prints
//! rank 0's `RESULT` rows as they come.
use super::plan::{check_busy, plan, pollers_per_rank, ranks_per_process, resolve_poll, AllreduceArgs, Plan};
use super::rank::ensure_fds;
use super::rank_watch::{self, RankWatch};
use crate::bench::report::{self, format_row, method_line, Row};
use crate::logfile;
use crate::progress::Progress;
use crate::self_exec;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use tally_engine::host::config::ServerFile;
use tally_engine::host::units::format_size;
use tally_engine::server::Server;

/// libfabric settings for a process of many rank threads over tcp;ofi_rxm,
/// unless the environment sets them. rxm gives every endpoint two pools of
/// 512 bounce buffers of the eager limit (32 KiB here) and, per connection,
/// 128 posted receives: about 70 MB resident per endpoint, 4.5 GB for 64
/// rank threads. With 1 KiB bounce buffers (tcp places eager messages
/// straight into posted receives, and a client posts its receive before its
/// send) and 16 per connection a rank thread holds about 5 MB (measured:
/// 337 MB for 64, all-reduces of 64 KiB; with 4 KiB buffers 12 MB each, same
/// speed). Only local memory: the eager limit, which peers must agree on,
/// is left alone. From libfabric 1.18 on, rxm's buffer size *is* its eager
/// limit (rank threads at 1 KiB against a server at 16 KiB hung at the first
/// all-reduce, 1.22 here), so there only the queue sizes are lowered
/// ([`thread_rxm_env`]).
const THREAD_RXM_ENV: &[(&str, &str)] =
    &[("FI_OFI_RXM_BUFFER_SIZE", "1024"), ("FI_OFI_RXM_MSG_RX_SIZE", "16"), ("FI_OFI_RXM_MSG_TX_SIZE", "16")];

/// [`THREAD_RXM_ENV`] as this process's libfabric takes it.
fn thread_rxm_env() -> &'static [(&'static str, &'static str)] {
    if tally_engine::dataplane::fabric::library_version() >= (1, 18) {
        &THREAD_RXM_ENV[1..]
    } else {
        THREAD_RXM_ENV
    }
}

/// What the launcher hands back to callers such as `tally demo`.
pub struct Outcome {
    pub provider: String,
    pub rows: Vec<Row>,
    pub lcore_stats: Vec<tally_engine::dataplane::lcore::Snapshot>,
}

/// A port for rank 0's bootstrap listener, which a rank process binds later.
/// Not one the kernel hands out itself (`bind(0)`): between this check and
/// rank 0's bind, that port may become the source port of any outgoing
/// connection on the host (the ranks' own connections to the servers, a
/// test beside this run), and rank 0's bind then fails with "address already
/// in use". So a port below the ephemeral range (`ip_local_port_range`),
/// picked at random and checked to be free, which only another listener
/// could take in the meantime.
fn free_port() -> Result<u16, String> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|w| w.parse::<u32>().ok()))
        .unwrap_or(32768);
    let (from, to) = (10_000u32, low.clamp(10_001, 65_535));
    let mut seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
        ^ (std::process::id() as u64) << 32;
    for _ in 0..64 {
        // xorshift64: spreads concurrent launchers over the range.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let port = (from + (seed % u64::from(to - from)) as u32) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    // Every try taken: fall back to one the kernel picks.
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

pub fn print_header(p: &Plan, args: &AllreduceArgs) {
    let per = ranks_per_process(args);
    let threads = if per > 1 { format!(" (threads: {per} per process, {} processes)", args.ranks.div_ceil(per)) } else { String::new() };
    println!(
        "# tally bench allreduce: {} ranks{threads}, provider {}, {} {}, chunk {}, window {}, {} polling",
        args.ranks,
        p.provider,
        p.dtype,
        p.op,
        format_size(p.chunk as u64),
        args.window.text(p.chunk),
        args.poll.poll
    );
    println!("# {}{}", method_line(&args.loops, args.sync), report::in_flight_note(args.agg_in_flight));
    println!("{}", report::table_header());
}

/// Runs the whole benchmark from this process; prints the table unless --json.
pub fn launch(args: &AllreduceArgs) -> Result<Outcome, String> {
    let p = plan(args)?;
    let mut server = None;
    let mut servers = args.servers.clone();
    let hosting = servers.is_empty() && args.mode.mode.iter().any(|m| m.starts_with("agg"));
    let lcores = if hosting { tally_engine::host::cpuset::CoreList::parse(&args.lcores).map_or(0, |l| l.len()) } else { 0 };
    // `--poll auto` becomes busy or adaptive here, for the hosted server and every rank.
    let mut resolved = args.clone();
    resolved.poll.poll = resolve_poll(args, args.ranks as usize * pollers_per_rank(args, &p.provider) + lcores)?;
    let args = &resolved;
    check_busy(args, args.ranks as usize + lcores, &format!("{} ranks and {lcores} server lcores", args.ranks))?;
    // A hosted server has a control connection and a connection per lcore to every rank.
    ensure_fds(args.ranks as u64 * (lcores as u64 + 1) + 256)?;
    if hosting {
        let text = format!(
            "listen = \"127.0.0.1:0\"\nlcores = \"{}\"\nhugepages = \"{}\"\nprovider = \"{}\"\npoll = \"{}\"\nmax_chunk = \"{}\"\n",
            args.lcores,
            args.hugepages.hugepages,
            p.provider,
            args.poll.poll.as_str(),
            format_size_toml(p.chunk.max(4096))
        );
        let cfg = ServerFile::parse(&text).and_then(|f| f.resolve()).map_err(|e| e.to_string())?;
        let s = Server::start(&cfg).map_err(|e| e.to_string())?;
        servers.push(s.local_addr().to_string());
        server = Some(s);
    }
    if !args.json.json {
        print_header(&p, args);
    }
    let boot = format!("127.0.0.1:{}", free_port()?);
    // Unique among concurrent launches: wall-clock nanoseconds mixed with the pid.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let job_id = (nanos ^ (std::process::id() as u64).rotate_left(40)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    // Drawn here, given to every rank: only this job's ranks hold it.
    let secret = tally_engine::client::ClientConfig::draw_job_secret().map_err(|e| e.to_string())?;
    let secret: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let mut children = Vec::new();
    let per = ranks_per_process(args);
    for rank in (0..args.ranks).step_by(per as usize) {
        let mut c = self_exec::command()?;
        c.args(["bench", "allreduce", "--rank", &rank.to_string(), "--bootstrap", &boot, "--job-id", &job_id.to_string()]);
        c.args(["--job-secret", &secret]);
        c.args(["--ranks-per-process", &per.to_string()]);
        if let Some(ms) = args.sleep_ms {
            c.args(["--sleep-ms", &ms.to_string()]);
        }
        if per > 1 && p.provider.starts_with("tcp") {
            for (var, value) in thread_rxm_env() {
                if std::env::var_os(var).is_none() || tally_engine::dataplane::fabric::defaults::set_by_tally(var) {
                    c.env(var, value);
                }
            }
        }
        c.args(["--ranks", &args.ranks.to_string(), "--provider", &p.provider, "--dtype", &args.dtype.dtype, "--op", &args.op]);
        c.args(["--iters", &args.loops.iters.to_string(), "--warmup", &args.loops.warmup.to_string(), "--chunk", &args.chunk]);
        c.args(["--min-bytes", &args.loops.min_bytes.to_string()]);
        c.args(["--window", &args.window.window.to_string(), "--poll", args.poll.poll.as_str(), "--mode", &args.mode.mode.join(",")]);
        c.args(["--send-credits", &args.send_credits.to_string(), "--timeout", &args.timeout.to_string()]);
        if args.sync {
            c.arg("--sync");
        }
        if let Some(pl) = &args.plugin {
            c.arg("--plugin").arg(pl);
        }
        c.args(["--plugin-piece", &args.plugin_piece, "--plugin-in-flight", &args.plugin_in_flight.to_string()]);
        c.args(["--plugin-chunk", &args.plugin_chunk, "--agg-in-flight", &args.agg_in_flight.to_string()]);
        if let Some(rc) = &args.cores.cores {
            c.args(["--cores", rc]);
        }
        c.args(["--sizes", &p.sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",")]);
        if !servers.is_empty() {
            c.args(["--servers", &servers.join(",")]);
        }
        if let Some(a) = &args.fabric_addr {
            c.args(["--fabric-addr", a]);
        }
        c.stdout(if rank == 0 { Stdio::piped() } else { Stdio::null() });
        let redirected = logfile::redirected();
        if redirected {
            c.stderr(Stdio::piped());
        }
        let mut child = c.spawn().map_err(|e| format!("cannot start rank {rank}: {e}"))?;
        if let Some(err) = child.stderr.take() {
            logfile::forward(err, ranks_label(rank, per, args.ranks));
        }
        children.push(child);
    }
    let steps: Vec<String> =
        args.mode.mode.iter().flat_map(|m| p.sizes.iter().map(move |&b| format!("{m} {}", format_size(b as u64)))).collect();
    let mut progress = Progress::new(steps.len(), args.json.json);
    progress.working_on(steps.first().cloned().unwrap_or_default());
    let mut rows = Vec::new();
    let rank0_out = children[0].stdout.take();
    let labels = (0..children.len()).map(|k| ranks_label(k as u32 * per, per, args.ranks).trim_matches(['[', ']']).to_string());
    let watch = RankWatch::start(children, labels.collect(), rank_watch::GRACE).map_err(|e| format!("cannot watch the ranks: {e}"))?;
    if let Some(out) = rank0_out {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(j) = line.strip_prefix("RESULT ") {
                let r: Row = serde_json::from_str(j).map_err(|e| e.to_string())?;
                if !args.json.json {
                    progress.println(&format_row(&r));
                }
                rows.push(r);
                progress.step();
                if let Some(next) = steps.get(rows.len()) {
                    progress.working_on(next.clone());
                }
            }
        }
    }
    progress.finish();
    let ended = watch.finish();
    let mut failed: Vec<String> = ended.stopped.into_iter().collect();
    for (k, st) in ended.statuses.into_iter().enumerate() {
        let st = st.map_err(|e| e.to_string())?;
        if !st.success() {
            let label = ranks_label(k as u32 * per, per, args.ranks);
            failed.push(format!("{} exited with {st}", label.trim_matches(['[', ']'])));
        }
    }
    let lcore_stats = server.as_ref().map(|s| s.stats()).unwrap_or_default();
    if let Some(s) = server {
        s.stop();
    }
    if !failed.is_empty() {
        return Err(failed.join("; "));
    }
    let expected = p.sizes.len() * args.mode.mode.len();
    if rows.len() != expected {
        return Err(format!("rank 0 reported {} of {expected} results", rows.len()));
    }
    Ok(Outcome { provider: p.provider, rows, lcore_stats })
}

fn format_size_toml(b: usize) -> String {
    format!("{b}")
}

/// "[rank 3]", or "[ranks 64-127]" for a process of rank threads.
fn ranks_label(first: u32, per: u32, nranks: u32) -> String {
    let last = (first + per).min(nranks) - 1;
    if last == first {
        format!("[rank {first}]")
    } else {
        format!("[ranks {first}-{last}]")
    }
}
