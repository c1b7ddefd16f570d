//! `tally bench cluster`: an emulated cluster on one machine.
//!
//! N server hosts and N worker hosts, each a network namespace with one veth
//! link to a bridge, shaped with tc tbf to rate R in both directions (egress
//! on both ends of each veth). Addresses from 198.18.0.0/15 (the range set
//! aside for benchmarking), provider tcp;ofi_rxm, polling as `--poll`
//! says (`auto`: adaptive, since every emulated host shares this machine's
//! cores with every link's kernel TCP: `placement::auto_poll`). Workers
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
//!
//! # The demo and the emulated cluster
//!
//! `tally demo` runs two parts. Part 1 is `cluster::launch` (also `tally bench cluster`,
//! `scripts/bench/cluster.sh`): N server and N worker namespaces on a bridge, each veth shaped with
//! tbf at both ends, servers placed on cores of their own where the host has them (4 per server
//! with 16 cores per host pair, 2 with 4, else 1 with 2, else all on cores 0-1: the table header says which),
//! workers pinned to the rest; each host is a `tally server` or `tally bench allreduce --rank i`
//! process started through `ip netns exec`. Namespaces are named `tly<pid>x...` and removed on
//! exit; a later run removes those whose process is gone. The rate defaults to 2 Gbit/s per core per
//! host (`cluster::default_rate`), what was measured to keep both agg and ring link-bound, at most
//! 16 Gbit/s; at least 20 timed all-reduces after 3 warm-up, more where that takes less than
//! `--min-time` (500 ms) at the agg bound (`LoopArgs::iters_for`, `cluster::args::loops_at`: each
//! row says its iterations);
//! the chunk to 32 KiB up to 8 Gbit/s (`cluster::auto_chunk`: small pieces keep each operation's
//! fill, drain and worker skew short); tbf's bucket to 2 ms of the rate (a bucket of several MiB
//! lets traffic that waited pass at veth speed afterwards, which flattered agg); TCP autocorking off
//! in every host's namespace (`--tcp-autocork`, `net.ipv4.tcp_autocorking`): over these veths it
//! held the last segment of a message larger than one GSO packet (62636 bytes at MTU 9000) until
//! TCP's tail loss probe about 200 ms later, which cut 64 KiB plugin pieces to 0.03-0.05 of the
//! link on the device (0.86-0.98 with it off; how the probe comes to be needed is not shown, and a
//! host with a real NIC was not tried); `--rps on` (every CPU) or `--rps workers` (the workers'
//! cores, off the busy pollers') steers each veth's received packets by flow hash, which ends the
//! reordering that veths cause (a packet is queued on the sending CPU's backlog) and with it TCP's
//! spurious retransmissions; off by default: nothing else moved on 32 cores, on 64 `on` cut CollNet
//! to 0.15-0.37 of the link and `workers` did not make it faster (a steered flow waits whole while
//! the hypervisor holds its CPU). The hosts' congestion control is cubic, Linux's own default,
//! whatever the machine's (`--tcp-cc`, set as each host's route's `congctl`, since a namespace
//! other than the first may only pick what `tcp_allowed_congestion_control` lists): the device and
//! this machine run BBR, which paces each socket itself without fq, and under it real NCCL's sockets
//! were caught holding a megabyte unsent for 100-240 ms with the window open, and CollNet's slowest
//! all-reduces at 256M took 2.0-4.0 times its median in 7 of 8 rows where cubic's took 1.05-1.21 (the
//! ring was slower too).
//! `--tcp-rto-min` (the routes' RTO floor) and `--tcp-rcvbuf` (the
//! initial TCP receive buffer; 8M closes no receive window where the kernel's 128 KiB closed
//! hundreds; a sender that may not send with nothing in flight waits up to 200 ms for TCP's probe 0) set the hosts' TCP for
//! such questions; both default to the kernel's. The loss line after each rate counts, besides
//! retransmissions, timeouts, probes and drops, the reorderings, the retransmissions found spurious
//! and the receive windows closed (`cluster::tcp_loss`); `scripts/device/links.py` times them.
//! The figures:
//! [measurements, "BBR's pacing held the sockets"](docs/measurements.md#bbrs-pacing-held-the-sockets-the-emulated-hosts-run-cubic-now),
//! [measurements, "What CollNet's tails at 16 Gbit/s wait for"](docs/measurements.md#what-collnets-tails-at-16-gbits-wait-for-steal-reordering-closed-windows),
//! [measurements, "The demo and the emulated cluster"](docs/measurements.md#the-demo-and-the-emulated-cluster).
//! `--agg-in-flight K` keeps K agg all-reduces in flight, each into a result buffer of its own
//! (`bench/allreduce/overlap.rs`), as a training step overlaps its buckets' all-reduces and as a
//! rank that finishes one early would start the next: what one at a time cannot show (such as
//! whether failover's end-of-operation wait costs the overlap). `--mode agg-plugin` runs the workers through
//! `libnccl-net-tally.so`'s ncclCollNet as NCCL drives it (`tools/src/collnet_driver.rs`: NCCL's
//! CollNet chain steps for each size over the channels NCCL would run, `NCCL_MIN_NCHANNELS` or the
//! plugin's 4: 512 KiB at 16 MiB and 1 MiB from 64 MiB over 4, 8 in flight as NCCL's `NCCL_STEPS`
//! for each group of up to 8 channels; the plugin's own client settings unless
//! `--send-credits` or `--plugin-chunk` are given). `--workers-run CMD` runs a command of the caller's in
//! each worker namespace instead, with `TALLY_CLUSTER_RANK/_WORLD/_MASTER/_IFNAME`, `TALLY_SERVERS`
//! and `TALLY_FABRIC_ADDR` set: `tests/nccl/cluster_proof.sh` runs PyTorch ranks that way, each its
//! own NCCL node. Where the placement gives the workers cores of their own, the commands run on
//! them, as tally's own workers do (`workers.rs` `run_command`: started from a thread restricted to
//! those cores, `cpuset::restrict_current_thread`, whose mask they inherit): floating, NCCL's
//! processes took the servers' pinned lcores' CPUs, which waited for them up to 60 ms at a time
//! (docs/measurements.md, "Late ranks and the workers' cores"). Namespaced processes keep the caller's `LD_LIBRARY_PATH` (the carried libfabric on
//! the device, which also has a libfabric 1.20 of its own that they used to pick up).
//! `--loss 0,0.1,1` (`cluster/loss.rs`) makes loss levels a sweep like the rates: for each rate,
//! each level's rules replace the last one's and every mode and size runs under them. A level is a
//! percent dropped on every link or on one host's (`s1:1`); tc's netem and gact are not in these
//! kernels, so the packets are dropped at random by nftables (`numgen random`, else iptables'
//! `statistic` match) at the receiving host's input hook: dropped at a sender's output hook they would
//! give the socket a local error and a retry on a timer, not wire loss. Every link at p is two
//! independent draws at each receiver (the sender's uplink, the receiver's downlink); one host's link
//! is one draw at that host and one on packets from its address at every other. With `--loss` every
//! veth's `gso_max_size` is the MTU (`netns.rs`), in every row, loss 0 too: a veth otherwise passes
//! GSO packets of up to 64 KiB, seven jumbo frames dropped as one. Each row says its level
//! (`loss_pct`, `loss_link`), and the level's line what the rules dropped (their counters) beside
//! what TCP did. `scripts/device/soak-rate.sh` puts the same rules into a running testbed for its
//! loss fault.
//! Every rate's table ends with the loss on its links (`cluster/tcp_loss.rs`): TCP's retransmitted
//! segments, retransmission timeouts and tail loss probes (each up to about 200 ms where one
//! segment alone is in flight, the hosts' floor; tally's own connections set theirs lower,
//! `host::tcp_rto_min`; each row's `tcp_loss_probes`) in the hosts' namespaces (read through
//! `/proc/<pid>/net/` of a server or worker, per timed loop: each row's `tcp_retrans` and
//! `tcp_timeouts`), the tbf qdiscs' drops, and the drops of every interface (`/proc/net/dev`, each
//! row's `dev_drops`: TCP also retransmits where no tbf dropped anything, as on the device, thousands
//! of segments per loop), the receiving sockets' drops (`TcpExt` backlog, receive, out-of-order and
//! pruning counters: each row's `sock_drops`), and the timeouts the kernel later found spurious and
//! the retransmissions of segments still queued in their own host (a timeout with nothing lost, a
//! segment held longer than the timeout in a deep tbf queue); a timeout is a wait of 200 ms or more,
//! which one loop of 4 ms all-reduces cannot hide. `--workers-run` gets the same line per rate
//! (`cluster_proof.sh` adds it to each run's verdict). Each row and each rate also give the
//! machine's CPU (`cluster/host_cpu.rs`): cores busy, and the share of the time some task waited
//! for a CPU (`/proc/pressure/cpu`), since every emulated host shares the machine; a figure held by
//! the machine shows there, not only in a guess (`tests/nccl/timing.py` gives the same over each
//! timed NCCL loop, and each rank process's own CPU over it and over a second idle after it).
//! The CPU columns (`cluster/loop_cpu.rs`, the note under each table says the same): worker 0 prints
//! `LOOP <mode> <bytes>` before each timed loop (`TALLY_BENCH_LOOP_LINES`) and its `RESULT` row after
//! it, and `tally bench cluster` reads every server's and every rank process's CPU (user + system,
//! every thread, `/proc/<pid>/stat`: `cluster/proc_cpu.rs`) at both. `wkr cpu s/GB` is the median
//! over the ranks, each per GB of its buffer (size x iters); each row's JSON has every rank's
//! (`rank_cpu_s`), the median and the largest per GB (`rank_cpu_s_per_gb_median`, `_max`) and the
//! loop's wall time as read (`loop_wall_s`: the result's check is in it, so worker 0's own
//! getrusage over the loop alone, `worker_cpu_s`, may be a clock tick or two lower). `srv cpu s/GB`
//! is every server together per GB of their input. Between loops, from one result to the next
//! loop's start, each rank's share of a core (`between_loops_core_share`, its mean, and the gap's
//! `between_loops_s`): not idle time (the check, the next mode's set-up, its warm-up and the
//! barriers are in it), an upper bound on what a rank costs when it is not timing all-reduces
//! (`tests/suites/idle.rs` measures the idle cost). A line per row under the table gives min/median/max
//! over ranks, over the loop and between loops. `--mode tcp` (after the all-reduce modes) is the
//! kernel's own cost beside them, in the same run (`cluster/tcp_baseline.rs`): worker i and server i
//! each run a hidden `tally bench tcp-stream` process (`cluster/tcp_stream.rs`: blocking
//! `std::net`, a thread sending and one receiving, no polling) with one connection between them;
//! per iteration each end sends the buffer's bytes and receives as many, the bytes agg moves
//! through every host's link, so its fraction is of agg's bound and its `wkr`/`srv` figures are
//! receive plus send, per GB as agg's. Each end warms up, says `READY`, and this process times them
//! all from one `GO` on their stdin to the last `DONE`, reading their CPU at both; they run on the
//! workers' cores where the placement gives them. The kernel's softirq work (a veth's receive,
//! tbf's timers) is charged to whatever task its CPU was running at the tick (tick accounting,
//! without IRQ time accounting, as here): another host's process, ksoftirqd or the idle task. So a
//! process's figure may hold another's receive, and only the host column holds it all.
//! Part 2 is the loopback `bench::allreduce::launch`. While the demo runs, `logfile` sends every log
//! line of this process and of the processes it starts to `demo.log` and only warnings, errors and
//! non-log output to the terminal.
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
use host_cpu::{CoreSets, HostCpu, HostLoad, RateLoad};
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
    let top_rate = rates.iter().copied().fold(0.0, f64::max);
    let (server_lcores, worker_cores, placement) = place(args.hosts, cores, args.server_lcores, top_rate);
    let worker_list = worker_cores.as_ref().and_then(|w| tally_engine::host::cpuset::CoreList::parse(w).ok());
    // Where the workers are pinned the servers have cores of their own: each
    // set's softirq time is read over every loop.
    let sets = worker_list.as_ref().map(|w| CoreSets {
        workers: w.as_slice().to_vec(),
        servers: server_lcores
            .iter()
            .filter_map(|l| tally_engine::host::cpuset::CoreList::parse(l).ok())
            .flat_map(|l| l.as_slice().to_vec())
            .collect(),
    });
    let rps_mask = match (args.rps.resolved(!args.loss.is_empty() && worker_list.is_some()), &worker_list) {
        (Rps::Off | Rps::Auto, _) => None,
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

    // `auto`: adaptive (`placement::auto_poll` says why); the pollers are
    // counted for the placement line.
    // The caller's rail: on for both modes unless TALLY_CALLER_RAIL=0.
    let threads = worker_rails(args.hosts, worker_cores.as_deref(), top_rate, args.busy_polling())
        .most_threads(tally_engine::client::caller_rail_from_env());
    let pollers = placement::pollers(args.hosts, &server_lcores, threads);
    let poll = match args.poll.poll {
        crate::cli_args::PollMode::Auto => placement::auto_poll(),
        other => other,
    }
    .as_str();
    let placement = if args.poll.poll == crate::cli_args::PollMode::Auto {
        format!("{placement}; {poll} polling (auto: every emulated host shares these {cores} cores with the links' TCP; {pollers} pollers)")
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
            tally_floor_ms: tally_engine::host::tcp_rto_min::env_floor_ms(),
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
        let host = HostLoad::over(host_before, None);
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
                        args.rps.resolved(!args.loss.is_empty() && worker_cores.is_some()).text(),
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
            let running = Servers { addrs: &servers, pids: &server_pids, sets: sets.as_ref() };
            let host_before = HostCpu::now();
            run_rate(&mut bed, args, rate, &running, worker_cores.as_deref(), poll, &exe, &ns, &mut progress, &mut out)?;
            let streams =
                Streams { args, rate, exe: &exe, ns: &ns, cores: worker_list.as_ref(), server_cores: &server_lcores, sets: sets.as_ref() };
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
