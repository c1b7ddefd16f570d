//! libfabric settings tally changes from libfabric's defaults, the same in
//! every tally process (servers, clients, the ring, the NCCL plugin's
//! CollNet).
//!
//! `tcp;ofi_rxm` sends a message above its eager limit (16 KiB by default)
//! by rendezvous: a protocol round trip per message before its data moves.
//! Over shaped links, where those small protocol messages queue behind bulk
//! data, that stalled the agg pipeline: 4 + 4 emulated hosts at 0.25
//! Gbit/s reached 0.72-0.76 of the link bound with 64-512 KiB pieces and
//! 0.97 with 16 KiB ones (eager). tally therefore sets the limit to 32 KiB,
//! and the emulated cluster cuts agg and ring into 32 KiB pieces up to
//! 8 Gbit/s: 0.95-0.99 of the bound here and on 16 cores.
//!
//! Not higher: with the limit at 4 MiB, pieces of 64-128 KiB that reach a
//! server before it reposted their slot's receive (the client may send the
//! next chunk of a slot as soon as it has that slot's result) arrive
//! unexpected, and over shaped links such runs collapsed to 0.03-0.6 of the
//! bound (the NCCL plugin's CollNet, whose pieces are 64 KiB, every time).
//! Reposting a slot's receives before its results are sent would remove
//! that; until then, 32 KiB.
//!
//! rxm peers must agree on the limit (a client at 4 MiB against a server at
//! the default stalled, libfabric 1.17), which is why it is set here, for
//! every tally process alike, and not per command. A variable the user set
//! is left alone; set it to the same value everywhere.
//!
//! From libfabric 1.18 on, rxm has no `FI_OFI_RXM_EAGER_LIMIT`: its bounce
//! buffer size is the eager limit, so there tally sets
//! `FI_OFI_RXM_BUFFER_SIZE` to the same 32 KiB instead (with 1.22's default
//! of 16 KiB, 8 ranks with 32 KiB pieces ran at half the speed of 1.17 on the
//! device: every piece a rendezvous). The cost is memory: rxm 1.22 keeps two
//! pools of 1024 such buffers per endpoint (about 85 MB per rank thread,
//! against 52 at 16 KiB). 1.18+ also sends messages between the eager limit
//! and `FI_OFI_RXM_SAR_LIMIT` (8 buffers' worth by default) by segmentation
//! through those bounce buffers, a user-space copy on each side: 1024 ranks
//! with 128 KiB pieces on 4 lcores (device, 1.22) spent 15.6% of the lcores'
//! time in libc's copy and ran at 0.57-0.61 GB/s per lcore, against 0.93-0.96
//! with the limit at the eager limit (which turns segmentation off: larger
//! messages go by rendezvous, as on 1.17, whose profile shows no such copy).
//! 8 ranks with 256 KiB pieces gained as much (1.21-1.35 against 0.89-1.07).
//! So tally sets it to the eager limit too.
//!
//! libfabric reads its parameters when it first initializes, in the
//! process's first `fi_getinfo`. [`apply`] runs once, before any tally code
//! calls into libfabric (every `fi_getinfo` of the engine goes through it),
//! so no thread of ours reads the environment in C while it is written.
use std::sync::OnceLock;

/// (variable, value) pairs, libfabric 1.17.
pub const PROVIDER_DEFAULTS: &[(&str, &str)] = &[("FI_OFI_RXM_EAGER_LIMIT", "32768")];

/// The same for libfabric 1.18 and later.
pub const PROVIDER_DEFAULTS_1_18: &[(&str, &str)] = &[("FI_OFI_RXM_BUFFER_SIZE", "32768"), ("FI_OFI_RXM_SAR_LIMIT", "32768")];

/// The defaults for the libfabric this process loaded.
pub fn provider_defaults() -> &'static [(&'static str, &'static str)] {
    if super::library_version() >= (1, 18) {
        PROVIDER_DEFAULTS_1_18
    } else {
        PROVIDER_DEFAULTS
    }
}

static APPLIED: OnceLock<Vec<String>> = OnceLock::new();

/// Sets every [`PROVIDER_DEFAULTS`] variable the environment lacks, once per
/// process; returns the `VAR=value` pairs it set.
pub fn apply() -> &'static [String] {
    APPLIED.get_or_init(|| set_where_unset(provider_defaults()))
}

/// Sets each `(variable, value)` the environment lacks (a user's own value
/// always stands); returns the `VAR=value` pairs it set, for a log line.
pub fn set_where_unset(pairs: &[(&str, &str)]) -> Vec<String> {
    let mut set = Vec::new();
    for (var, value) in pairs {
        if std::env::var_os(var).is_none() {
            std::env::set_var(var, value);
            set.push(format!("{var}={value}"));
        }
    }
    set
}
