//! `tally`: run reduction servers, benchmark them, prepare hosts.
use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod bench_p2p;
mod bench_reduce;

#[derive(Parser)]
#[command(name = "tally", version, about = "Gradient reduction-server dataplane over libfabric")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The main job on an embedded default (for now: the point-to-point benchmark over shm).
    Demo(bench_p2p::P2pArgs),
    /// Microbenchmarks: reduce kernels, point-to-point transport.
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(Subcommand)]
enum Bench {
    /// Reduction kernels: GB/s and roofline fraction against memcpy.
    Reduce(bench_reduce::ReduceArgs),
    /// Tagged ping-pong latency and streaming bandwidth over tally's fabric layer.
    P2p(bench_p2p::P2pArgs),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("TALLY_LOG", "info").write_style("TALLY_LOG_STYLE"))
        .format_timestamp_millis()
        .init();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Demo(args) => bench_p2p::run(args),
        Command::Bench(Bench::Reduce(args)) => bench_reduce::run(args),
        Command::Bench(Bench::P2p(args)) => bench_p2p::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tally: error: {e}");
            ExitCode::FAILURE
        }
    }
}
