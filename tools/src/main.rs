//! `tally`: run reduction servers, benchmark them, prepare hosts.
use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod bench_allreduce;
mod bench_p2p;
mod bench_p2p_fan;
mod bench_reduce;
mod cluster;
mod collnet_driver;
mod demo;
mod host;
mod logfile;
mod plot;
mod progress;
mod server_check;
mod server_cmd;
mod settings_cmd;
mod stats_cmd;

#[derive(Parser)]
#[command(name = "tally", version, about = "Gradient reduction-server dataplane over libfabric")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a reduction server; SIGTERM/SIGINT drains it (jobs move to other servers), a second one stops it.
    Server(server_cmd::ServerArgs),
    /// Live per-lcore view of a server's /metrics (like top); --once --json for scripts.
    Stats(stats_cmd::StatsArgs),
    /// The main job: a server and 4 ranks on this machine, agg vs ring, verified.
    Demo(demo::DemoArgs),
    /// Hugepage pools and hugetlbfs mounts (what dpdk-hugepages does).
    Hugepages(host::HugepagesArgs),
    /// FI_EFA_FORK_SAFE and friends: check this host, print the settings a role needs.
    EfaEnv(host::EfaEnvArgs),
    /// Is this host ready to run a reduction server?
    Doctor(host::DoctorArgs),
    /// Every TALLY_* variable and server configuration key: default, who reads it, what it does.
    Settings(settings_cmd::SettingsArgs),
    /// Microbenchmarks: reduce kernels, point-to-point transport.
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(Subcommand)]
enum Bench {
    /// Reduction kernels: GB/s and roofline fraction against memcpy.
    Reduce(bench_reduce::ReduceArgs),
    /// Tagged ping-pong latency and streaming bandwidth over tally's fabric layer;
    /// --hubs/--leaves: many streams each way, the ceiling for server core scaling.
    P2p(bench_p2p::P2pArgs),
    /// All-reduce through reduction servers (agg) and ring, ranks as processes on this machine.
    Allreduce(bench_allreduce::AllreduceArgs),
    /// Emulated cluster: N servers + N workers in network namespaces with shaped links (root).
    Cluster(cluster::ClusterArgs),
}

fn main() -> ExitCode {
    logfile::init();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Server(args) => server_cmd::run(args),
        Command::Stats(args) => stats_cmd::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Bench(Bench::Reduce(args)) => bench_reduce::run(args),
        Command::Bench(Bench::P2p(args)) => bench_p2p::run(args),
        Command::Bench(Bench::Allreduce(args)) => bench_allreduce::run(args),
        Command::Bench(Bench::Cluster(args)) => cluster::run(args),
        Command::Hugepages(args) => host::run_hugepages(args),
        Command::EfaEnv(args) => host::run_efa_env(args),
        Command::Settings(args) => settings_cmd::run(args),
        Command::Doctor(args) => match host::run_doctor(args) {
            Ok(0) => Ok(()),
            Ok(code) => return ExitCode::from(code),
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tally: error: {e}");
            ExitCode::FAILURE
        }
    }
}
