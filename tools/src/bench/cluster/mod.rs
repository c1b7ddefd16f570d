//! `tally bench cluster`: an emulated cluster on one machine.
//!
//! N server hosts and N worker hosts, each a network namespace with one veth
//! link to a bridge, shaped with tc tbf to rate R in both directions (egress
//! on both ends of each veth). Addresses from 198.18.0.0/15 (the range set
//! aside for benchmarking), provider tcp;ofi_rxm, polling as `--poll`
//! says (`auto`: busy only where every poller, lcores, workers and their
//! rails, has a core beside the kernel's TCP work: `placement::auto_poll`;
//! nearly always adaptive, since every host shares this machine). Workers
//! run agg (through the servers) and ring all-reduce; the table gives
//! algbw, busbw, the link-rate bound, the fraction of it reached and
//! agg/ring. This is where reduction servers win: each worker sends and
//! receives its buffer once, where a ring moves 2(n-1)/n of it each way.
//!
//! Each row also gives the CPU time that the timed loop cost, per GB
//! all-reduced, workers and servers apart (what sizes reduction servers in
//! cores per 100 Gbit/s): worker 0 announces each loop (`LOOP <mode>
//! <bytes>`) so that this process reads every server's and every rank
//! process's CPU from /proc over the same interval, and each rank's between
//! loops (from a result to the next loop: what a rank costs when it is not
//! timing all-reduces, set-up and warm-up included); worker 0 also reports
//! its own over the loop alone (`cpu_s`).
//!
//! `--mode tcp` adds the kernel's own cost beside them: plain TCP streams
//! between the same namespaces over the same links, worker i to server i,
//! moving the bytes agg moves per link, timed as a loop and reported in
//! the same row (`tcp_baseline`, its ends `tcp_stream`): what any
//! transport over TCP pays per byte before tally's own work.
//!
//! Everything it makes (namespaces, links, processes) is removed when it
//! ends, and namespaces left by a run that was killed are swept at the next
//! start. Every step is bounded in time.
//!
//! With `--workers-run CMD` the same testbed runs a command of the caller's
//! in every worker namespace instead of tally's own benchmark (one process
//! per worker, `sh -c CMD`, on the workers' cores where they have their own), with the environment a multi-node job there
//! needs: `TALLY_CLUSTER_RANK`, `TALLY_CLUSTER_WORLD`, `TALLY_CLUSTER_MASTER`
//! (worker 0's address), `TALLY_CLUSTER_IFNAME` (the link's interface),
//! `TALLY_SERVERS`, `TALLY_PROVIDER=tcp` and `TALLY_FABRIC_ADDR` (the worker's
//! address), so that, e.g., PyTorch + NCCL ranks reach each other and the
//! servers only through shaped links (tests/nccl/cluster_proof.sh).
//!
//! `--loss 0,0.1,1` (or `s1:1`, one host's link) adds loss levels as a
//! sweep like the rates': for each rate, each level's rules are put in
//! place (`loss`) and every mode and size runs under them; each row says
//! its level, and the level's line what TCP did and how many packets the
//! rules dropped.
//!
//! `ip` and `tc` come from PATH, or from a folder holding Debian's iproute2
//! unpacked with `dpkg -x` (`--iproute DIR`, `TALLY_IPROUTE`): hosts without
//! iproute2 (the GPU device image) run it that way, with the folder's
//! libraries on LD_LIBRARY_PATH for `ip` and `tc` only (and `nft` for
//! `--loss`, from the same folder or PATH).
//!
//! [`args`]: the flags; [`netns`]: namespaces and links; [`shaping`]: rates
//! and tbf; [`placement`]: cores; [`workers`]: one rate's run;
//! [`loop_cpu`]: what each loop cost, read at its start and end;
//! [`proc_cpu`]: processes' CPU time; [`tcp_baseline`] and [`tcp_stream`]:
//! the kernel baseline; [`tcp_loss`]: loss on the links, what TCP did;
//! [`loss`]: `--loss`, packets dropped at random; [`host_cpu`]: the
//! machine's CPU, busy and waited for; [`table`]: what is reported.
pub mod args;
pub mod host_cpu;
pub mod loop_cpu;
pub mod loss;
pub mod netns;
pub mod placement;
pub mod proc_cpu;
pub mod shaping;
pub mod table;
pub mod tcp_baseline;
pub mod tcp_loss;
pub mod tcp_stream;
pub mod workers;

use crate::logfile;
use crate::progress::Progress;
use args::{cores_mask, cpu_mask, ClusterArgs, Rps};
use host_cpu::{HostCpu, HostLoad, RateLoad};
use loss::{apply_level, level_drops, Dropper, LossLevel};
use netns::{addr, build_network, sweep_stale, unavailable, HostNet, Iproute, Testbed};
use placement::{place, worker_rails};
use shaping::{default_rate, shape};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use table::{cpu_note, format_cluster_header, format_cluster_row, print_header, rank_cpu_lines, write_plot, ClusterOutcome};
use tcp_baseline::{run_tcp, Streams};
use tcp_loss::{tbf_drops, LinkLoss, NetLoss, RuleDrops};
use workers::{run_command, run_rate, Servers};

/// Runs the emulated cluster and prints its table (unless `--json`).
pub fn run(args: &ClusterArgs) -> Result<(), String> {
    if let Some(path) = &args.log {
        logfile::redirect_to(path)?;
    }
    let out = launch(args)?;
    if let Some(path) = &args.plot.plot {
        write_plot(&out, path)?;
        if !args.json.json {
            println!("# plot: {}", path.display());
        }
    }
    if args.json.json {
        println!("{}", serde_json::to_string(&out).map_err(|e| e.to_string())?);
    }
    if let Some(path) = &args.log {
        if !args.json.json {
            println!("# server and worker logs: {}", path.display());
        }
    }
    match out.wrong() {
        0 => Ok(()),
        w => Err(format!("{w} wrong elements")),
    }
}

/// Gives the servers and ranks this process starts a shared fresh token
/// (TALLY_TOKEN, which they inherit) unless one is set, as a deployment
/// would have. Call before any thread starts. A blank one is replaced too:
/// the servers would refuse to start with it.
pub fn ensure_job_token() {
    if std::env::var("TALLY_TOKEN").map_or(true, |t| t.trim().is_empty()) {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let token = format!("{:x}", (nanos ^ u128::from(std::process::id()) << 64) as u64);
        // Order matters: set_var races with threads that read the
        // environment, and none run yet (see the callers).
        std::env::set_var("TALLY_TOKEN", token);
    }
}

pub fn launch(args: &ClusterArgs) -> Result<ClusterOutcome, String> {
    if args.hosts < 2 || args.hosts > 64 {
        return Err("--hosts: between 2 and 64".into());
    }
    if !(1..=crate::bench::allreduce::overlap::MAX_IN_FLIGHT).contains(&args.agg_in_flight) {
        return Err(format!("--agg-in-flight: between 1 and {}", crate::bench::allreduce::overlap::MAX_IN_FLIGHT));
    }
    if let Some(m) = args.mode.mode.iter().find(|m| !matches!(m.as_str(), "agg" | "agg-plugin" | "ring" | "tcp")) {
        return Err(format!("--mode: expected agg, agg-plugin, ring or tcp, got {m:?}"));
    }
    if let Some(why) = unavailable(args.iproute.iproute.as_deref()) {
        return Err(format!("the emulated cluster cannot run here: {why}"));
    }
    let tools = Iproute::find(args.iproute.iproute.as_deref())?;
    // Loss levels: checked, and what drops their packets found, before anything is made.
    args.loss.iter().try_for_each(|l| l.check_hosts(args.hosts))?;
    let dropper = if args.loss.is_empty() { None } else { Some(Dropper::find(args.iproute.iproute.as_deref())?) };
    let levels: Vec<Option<&LossLevel>> = if args.loss.is_empty() { vec![None] } else { args.loss.iter().map(Some).collect() };
    ensure_job_token();
    sweep_stale(&tools);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rates = if args.rates.is_empty() { vec![default_rate(args.hosts, cores)] } else { args.rates.clone() };
    if let Some(r) = rates.iter().find(|r| !(**r > 0.0 && **r <= 400.0)) {
        return Err(format!("--rates: {r} Gbit/s is not a link rate"));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let prefix = format!("tly{}x", std::process::id());
    let mut bed = Testbed { tools, prefix: prefix.clone(), children: Vec::new() };
    let hosts: Vec<(char, u32)> = (0..args.hosts).flat_map(|i| [('s', i), ('w', i)]).collect();
    let ns = |k: char, i: u32| format!("{prefix}{k}{i}");
    let sw = format!("{prefix}sw");
    let (server_lcores, worker_cores, placement) = place(args.hosts, cores, args.server_lcores);
    let worker_list = worker_cores.as_ref().and_then(|w| tally_engine::host::cpuset::CoreList::parse(w).ok());
    let rps_mask = match (args.rps, &worker_list) {
        (Rps::Off, _) => None,
        (Rps::Workers, Some(list)) => Some(cores_mask(list.as_slice())),
        (Rps::On | Rps::Workers, _) => Some(cpu_mask(cores)),
    };
    let net = HostNet {
        mtu: args.mtu,
        autocork: args.tcp_autocork,
        rto_min: args.tcp_rto_min,
        tcp_rmem: args.tcp_rcvbuf.tcp_rmem(),
        congestion: args.tcp_cc.name(),
        rps: rps_mask.as_deref(),
        gso_max: (!args.loss.is_empty()).then_some(args.mtu),
    };
    build_network(&bed.tools, &sw, &hosts, &ns, &net)?;

    // `auto`: busy only where every poller (lcores, workers, their rails)
    // has a core beside what the kernel's TCP of every link needs.
    let top_rate = rates.iter().copied().fold(0.0, f64::max);
    let pollers = placement::pollers(args.hosts, &server_lcores, worker_rails(args.hosts, worker_cores.as_deref()).0);
    let poll = match args.poll.poll {
        crate::cli_args::PollMode::Auto => placement::auto_poll(pollers, args.hosts, top_rate, cores),
        other => other,
    }
    .as_str();
    let placement = if args.poll.poll == crate::cli_args::PollMode::Auto {
        format!("{placement}; {poll} polling (auto: {pollers} pollers and the kernel's TCP at {top_rate} Gbit/s on {cores} cores)")
    } else {
        format!("{placement}; {poll} polling")
    };
    let log_level = if logfile::redirected() { "info" } else { "warn" };
    let mut servers = Vec::new();
    // The servers' own pids: `ip netns exec` (and `env`) exec the command, keeping the pid.
    let mut server_pids = Vec::new();
    let mut ready = Vec::new();
    for i in 0..args.hosts {
        let a = format!("{}:7400", addr('s', i));
        let mut c = bed.tools.exec_in(&ns('s', i), &exe);
        c.args(["server", "--listen", &a, "--lcores", &server_lcores[i as usize], "--provider", &args.provider, "--poll", poll]);
        // Its jobs have one rank per worker host: saying so keeps the
        // server's open-files check (sized for 16 jobs of 1024 ranks by
        // default) from warning on every run.
        c.args(["--slab-size", "128M", "--max-ranks", &args.hosts.to_string()])
            .env("TALLY_LOG", log_level)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().map_err(|e| format!("cannot start server {i}: {e}"))?;
        let (tx, rx) = mpsc::channel();
        logfile::forward_stdout(child.stdout.take().expect("piped"), format!("[server {i}]"), tx);
        logfile::forward(child.stderr.take().expect("piped"), format!("[server {i}]"));
        server_pids.push(child.id());
        bed.children.push(child);
        ready.push(rx);
        servers.push(a);
    }
    for (i, rx) in ready.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) if line.starts_with("tally server ready") => break,
                Ok(_) => continue,
                Err(_) => return Err(format!("server {i} did not start within 15 s (see its log lines above or in the log file)")),
            }
        }
    }

    let steps = rates.len() * levels.len() * args.mode.mode.len() * args.sizes.len();
    let mut progress = Progress::new(steps, args.json.json);
    let mut out =
        ClusterOutcome { hosts: args.hosts, placement: placement.clone(), rows: Vec::new(), links: Vec::new(), host_cpu: Vec::new() };
    // Loss is counted in the hosts' namespaces and the switch's (both ends of
    // each link are shaped; the switch holds the bridge), where TCP's
    // counters stay 0.
    let host_names: Vec<String> = hosts.iter().map(|&(k, i)| ns(k, i)).collect();
    let all_names: Vec<String> = host_names.iter().cloned().chain([sw.clone()]).collect();
    let loss_before = |bed: &Testbed| (NetLoss::of_namespaces(&bed.tools, &all_names), tbf_drops(&bed.tools, &all_names));
    let loss_over = |bed: &Testbed, rate: f64, (net, tbf): (Option<NetLoss>, Option<u64>)| {
        let net = NetLoss::of_namespaces(&bed.tools, &all_names).zip(net).map(|(now, then)| now.since(then));
        let tbf = tbf_drops(&bed.tools, &all_names).zip(tbf).map(|(now, then)| now.saturating_sub(then));
        LinkLoss {
            link_gbit: rate,
            loss: None,
            tcp_retrans: net.map(|l| l.retrans),
            tcp_timeouts: net.map(|l| l.timeouts),
            tbf_drops: tbf,
            dev_drops: net.map(|l| l.dev_drops),
            sock_drops: net.map(|l| l.sock_drops),
            spurious_rtos: net.map(|l| l.spurious_rtos),
            rtx_host_queued: net.map(|l| l.rtx_host_queued),
            loss_probes: net.map(|l| l.loss_probes),
            reordered: net.map(|l| l.reordered),
            dsacks: net.map(|l| l.dsacks),
            zero_windows: net.map(|l| l.zero_windows),
            rto_floor_ms: args.tcp_rto_min.ms(),
        }
    };
    // Each level's rules replace the last one's, and what they dropped is
    // read before the next replaces them.
    let set_level = |bed: &Testbed, level: Option<&LossLevel>| match (&dropper, level) {
        (Some(d), Some(l)) => apply_level(&bed.tools, d, l, &hosts, &ns, &addr),
        _ => Ok(()),
    };
    // A level's end: what its links lost and the machine's CPU over it,
    // kept in `out`; the lines that say them.
    let close_level = |bed: &Testbed,
                       out: &mut ClusterOutcome,
                       (rate, level): (f64, Option<&LossLevel>),
                       before,
                       host_before: Option<HostCpu>,
                       what: &str| {
        let host = HostLoad::over(host_before);
        let mut links = loss_over(bed, rate, before);
        if let (Some(d), Some(l)) = (&dropper, level) {
            links.loss = Some(RuleDrops {
                loss_pct: l.percent,
                loss_link: l.link(),
                loss_by: d.name(),
                loss_drops: level_drops(&bed.tools, d, &hosts, &ns),
            });
        }
        let mut lines = vec![links.note()];
        lines.extend(host.map(|h| h.note(rate, what)));
        out.links.push(links);
        out.host_cpu.extend(host.map(|load| RateLoad { link_gbit: rate, load }));
        lines
    };
    let loss_line = |level: Option<&LossLevel>| {
        let (l, d) = (level?, dropper.as_ref()?);
        Some(format!(
            "# loss {}: {}, dropped at random at each receiving host's input ({}); every veth's gso_max_size is the MTU, {} bytes, in every row of this run, loss 0 too: a packet dropped is one frame, as on a wire",
            l.label(),
            l.text(),
            d.name(),
            args.mtu
        ))
    };
    if let Some(cmd) = &args.workers_run {
        for &rate in &rates {
            shape(&bed.tools, &hosts, &ns, &sw, rate, args)?;
            for &level in &levels {
                set_level(&bed, level)?;
                let before = loss_before(&bed);
                if !args.json.json {
                    println!(
                        "# emulated cluster, links {rate} Gbit/s: {} servers + {} workers (RPS {}, RTO floor {}, receive buffers {}, congestion control {}); placement: {placement}; running in each worker: {cmd}",
                        args.hosts,
                        args.hosts,
                        args.rps.text(),
                        args.tcp_rto_min.text(),
                        args.tcp_rcvbuf.text(),
                        args.tcp_cc.text()
                    );
                    loss_line(level).iter().for_each(|l| println!("{l}"));
                }
                let host_before = HostCpu::now();
                run_command(&mut bed, args, rate, cmd, &servers, &ns, worker_list.as_ref())?;
                let lines = close_level(&bed, &mut out, (rate, level), before, host_before, "over the whole command, its start included");
                if !args.json.json {
                    lines.iter().for_each(|l| println!("{l}"));
                }
            }
        }
        drop(bed);
        return Ok(out);
    }
    for &rate in &rates {
        shape(&bed.tools, &hosts, &ns, &sw, rate, args)?;
        for &level in &levels {
            set_level(&bed, level)?;
            let before = loss_before(&bed);
            let first = out.rows.len();
            let running = Servers { addrs: &servers, pids: &server_pids };
            let host_before = HostCpu::now();
            run_rate(&mut bed, args, rate, &running, worker_cores.as_deref(), poll, &exe, &ns, &mut progress, &mut out)?;
            let streams = Streams { args, rate, exe: &exe, ns: &ns, cores: worker_list.as_ref() };
            run_tcp(&mut bed, &streams, &mut progress, &mut out)?;
            progress.finish();
            let lines = close_level(&bed, &mut out, (rate, level), before, host_before, "over all its loops and set-ups");
            out.rows[first..].iter_mut().for_each(|r| r.set_loss(level));
            if !args.json.json {
                print_header(args, rate, &placement, worker_cores.as_deref(), loss_line(level).as_deref());
                println!("{}", format_cluster_header(level.is_some()));
                for r in &out.rows[first..] {
                    println!("{}", format_cluster_row(&out, r));
                }
                println!("{}", cpu_note());
                rank_cpu_lines(&out.rows[first..]).iter().chain(&lines).for_each(|l| println!("{l}"));
            }
        }
    }
    drop(bed);
    Ok(out)
}
