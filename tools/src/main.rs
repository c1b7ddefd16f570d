//! `tally`: run reduction servers, benchmark them, prepare hosts.
//!
//! This file is the command line only: the `Cli` tree, and one call into the
//! library (`tally_cli`) per command. What each command does lives there.
use clap::{Parser, Subcommand};
use std::process::ExitCode;
use tally_cli::bench::{allreduce, cluster, p2p, reduce};
use tally_cli::cmd::{demo, server, settings, stats};
use tally_cli::{host, logfile};

/// What `tally --help` ends with: the exit statuses every command keeps to.
const EXIT_STATUS: &str = "\
Exit status:
  0  success
  1  an error tally reports on stderr (\"tally: error: ...\"): a refused
     configuration, a failed run or check, wrong results, failed doctor checks
  2  a usage error: an unknown command or flag, a missing or malformed value";

#[derive(Parser)]
#[command(name = "tally", version, about = "Gradient reduction-server dataplane over libfabric", after_help = EXIT_STATUS)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a reduction server; SIGTERM/SIGINT drains it (jobs move to other servers), a second one stops it.
    Server(server::ServerArgs),
    /// Live per-lcore view of a server's /metrics (like top); --once --json for scripts.
    Stats(stats::StatsArgs),
    /// The main job: a server and 4 ranks on this machine, agg vs ring, verified.
    Demo(demo::DemoArgs),
    /// Hugepage pools and hugetlbfs mounts (what dpdk-hugepages does).
    Hugepages(host::HugepagesArgs),
    /// FI_EFA_FORK_SAFE and friends: check this host, print the settings a role needs.
    EfaEnv(host::EfaEnvArgs),
    /// Is this host ready to run a reduction server?
    Doctor(host::DoctorArgs),
    /// Every TALLY_* variable and server configuration key: default, who reads it, what it does.
    Settings(settings::SettingsArgs),
    /// Benchmarks: reduce kernels, the transport, all-reduce on this machine, an emulated cluster.
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(Subcommand)]
enum Bench {
    /// Reduction kernels: GB/s and roofline fraction against memcpy.
    Reduce(reduce::ReduceArgs),
    /// The transport alone: ping-pong latency and streaming bandwidth (--hubs/--leaves: many streams each way).
    #[command(long_about = "Tagged ping-pong latency and streaming bandwidth over tally's fabric layer; \
        --hubs/--leaves: many streams each way, the ceiling for server core scaling.")]
    P2p(p2p::args::P2pArgs),
    /// All-reduce through reduction servers (agg) against ring, ranks on this machine.
    Allreduce(allreduce::plan::AllreduceArgs),
    /// Emulated cluster: N servers + N workers in network namespaces with shaped links (root).
    Cluster(cluster::args::ClusterArgs),
    /// One end of bench cluster's kernel baseline (--mode tcp): a plain TCP stream, paced over stdin.
    #[command(hide = true)]
    TcpStream(cluster::tcp_stream::TcpStreamArgs),
}

fn main() -> ExitCode {
    logfile::init();
    // A usage error exits 2 (clap's own status), before any command runs.
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Server(args) => server::run(args),
        Command::Stats(args) => stats::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Bench(Bench::Reduce(args)) => reduce::run(args),
        Command::Bench(Bench::P2p(args)) => p2p::run(args),
        Command::Bench(Bench::Allreduce(args)) => allreduce::run(args),
        Command::Bench(Bench::Cluster(args)) => cluster::run(args),
        Command::Bench(Bench::TcpStream(args)) => cluster::tcp_stream::run(args),
        Command::Hugepages(args) => host::run_hugepages(args),
        Command::EfaEnv(args) => host::run_efa_env(args),
        Command::Settings(args) => settings::run(args),
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every flag and argument of every subcommand, as `(command path, name)`,
    /// that `--help` would show without a line of help.
    fn undocumented(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let builtin = matches!(arg.get_id().as_str(), "help" | "version");
            if !arg.is_hide_set() && !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                out.push(format!("{path} --{}", arg.get_long().unwrap_or(arg.get_id().as_str())));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_about().is_none() && sub.get_name() != "help" {
                out.push(format!("{path} {} (no about line)", sub.get_name()));
            }
            undocumented(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_flag_of_every_command_has_help() {
        let cmd = Cli::command();
        cmd.clone().debug_assert();
        let mut missing = Vec::new();
        undocumented(&cmd, "tally", &mut missing);
        assert!(missing.is_empty(), "flags without help text: {missing:#?}");
    }

    #[test]
    fn bench_lists_all_four_subcommands() {
        let cmd = Cli::command();
        let bench = cmd.find_subcommand("bench").expect("tally bench");
        let names: Vec<&str> = bench.get_subcommands().filter(|c| !c.is_hide_set()).map(|c| c.get_name()).collect();
        assert_eq!(names, ["reduce", "p2p", "allreduce", "cluster"]);
        let about = bench.get_about().expect("an about line").to_string();
        for what in ["reduce kernels", "transport", "all-reduce", "emulated cluster"] {
            assert!(about.contains(what), "{what}: {about}");
        }
    }
}
