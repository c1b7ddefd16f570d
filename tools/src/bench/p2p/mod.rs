//! `tally bench p2p`: what the transport alone can do, measured through
//! tally's own fabric layer (the same calls the dataplane makes), so that
//! all-reduce figures can be held against it.
//!
//! Two ends (in [`pingpong`]): latency by tagged ping-pong, bandwidth by
//! one end streaming to the other.
//!
//! Fan mode (`--hubs L --leaves R`, in [`fan`]): one stream is not
//! what a server's lcores face. L hub endpoints and R leaf endpoints, each
//! a thread on its own core, move an all-reduce's traffic (R x L streams,
//! each way, cut and windowed as the client cuts them) with the reduce left
//! out: the transport ceiling that the server's core scaling is measured
//! against, in the same run and on the same cores.
//!
//! [`args`] holds the flags of both modes.
pub mod args;
pub mod fan;
pub mod pingpong;

use args::P2pArgs;

/// `tally bench p2p`: the fan mode with `--hubs`/`--leaves`, else the two ends.
pub fn run(args: &P2pArgs) -> Result<(), String> {
    if args.hubs > 0 || args.leaves > 0 {
        return fan::run(args);
    }
    pingpong::run(args)
}
