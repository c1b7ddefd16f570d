//! libfabric settings tally changes from libfabric's defaults, the same in
//! every tally process (servers, clients, the ring, the NCCL plugin's
//! CollNet).
//!
//! `tcp;ofi_rxm` sends a message above its eager limit (16 KiB by default)
//! by rendezvous: a protocol round trip per message before its data moves.
//! Over shaped links, where those small protocol messages queue behind bulk
//! data, that stalled the agg pipeline: 4 + 4 emulated hosts at 0.25
//! Gbit/s reached 0.72-0.76 of the link bound with 64-512 KiB pieces and
//! 0.97 with 16 KiB ones (eager). At 32 Gbit/s the other cost shows: every
//! message costs its rail thread the kernel's and the provider's work per
//! message, and the NCCL plugin, whose all-reduces are NCCL's 512 KiB-1 MiB
//! steps, sent them as 32 KiB pieces, as many as the limit allowed. tally
//! therefore sets the limit to 128 KiB on libfabric 1.17, and the plugin
//! sends whole 128 KiB pieces: on the device (4 + 4 hosts, 32 Gbit/s,
//! `tally bench cluster --mode agg-plugin`) 0.81-0.97 of the bound against
//! 0.70-0.85 with 32 KiB, 0.94-0.98 against 0.78-0.81 with failover off;
//! real NCCL won 11 of 16 pairs alternated on three hosts (docs/measurements.md,
//! "Pieces of 128 KiB").
//!
//! On 1.17 the limit costs no memory: rxm's bounce buffers stay at its
//! `FI_OFI_RXM_BUFFER_SIZE` (16 KiB), a message is received straight into
//! the posted buffer (`enable_dyn_rbuf`, on by default), and only one that
//! arrives before its receive is posted takes a buffer of its own size
//! (allocated, then copied once the receive is posted).
//!
//! 64 KiB pieces once ran at 0.03-0.05 of the bound on the device (piece
//! round trips p99 262 ms, rails idle): that was the emulated links' TCP
//! autocorking, which held each message's last segment until a tail loss
//! probe; with it off (`bench cluster --tcp-autocork`, now the default)
//! they gave 0.98 / 0.86 against 128 KiB's 0.97 / 0.91 on the same host
//! (docs/measurements.md, "Tails of 200 ms"). Not 256 KiB: 0.80-0.81
//! against 128 KiB's 0.92-0.97 on one host (with autocorking on).
//!
//! rxm peers must agree on the limit: rxm refuses a connection whose peer
//! runs another (1.17's `rxm_conn.c`, "eager_limit mismatch"), and the sends
//! queued to it never complete (a client at 4 MiB against a server at the
//! default stalled). That is why it is set here, for
//! every tally process alike, and not per command. A variable the user set
//! is left alone; set it to the same value everywhere.
//!
//! From libfabric 1.18 on, rxm has no `FI_OFI_RXM_EAGER_LIMIT`: its bounce
//! buffer size is the eager limit, so there tally sets
//! `FI_OFI_RXM_BUFFER_SIZE` to 32 KiB instead (with 1.22's default
//! of 16 KiB, 8 ranks with 32 KiB pieces ran at half the speed of 1.17 on the
//! device: every piece a rendezvous). Not 128 KiB there: rxm 1.22 keeps two
//! pools of 1024 such buffers per endpoint (about 85 MB per rank thread at
//! 32 KiB, 52 at 16 KiB; four times 85 at 128 KiB). [`eager_limit`] says which
//! limit a process runs with, and the plugin cuts its pieces to it. 1.18+
//! also sends messages between the eager limit and `FI_OFI_RXM_SAR_LIMIT`
//! (8 buffers' worth by default) by segmentation
//! through those bounce buffers, a user-space copy on each side: 1024 ranks
//! with 128 KiB pieces on 4 lcores (device, 1.22) spent 15.6% of the lcores'
//! time in libc's copy and ran at 0.57-0.61 GB/s per lcore, against 0.93-0.96
//! with the limit at the eager limit (which turns segmentation off: larger
//! messages go by rendezvous, as on 1.17, whose profile shows no such copy).
//! 8 ranks with 256 KiB pieces gained as much (1.21-1.35 against 0.89-1.07).
//! So tally sets it to the eager limit too.
//!
//! rxm posts `FI_OFI_RXM_MSG_RX_SIZE` receive buffers (128 by default, of
//! its buffer size) on each connection it opens, from a pool that grows
//! 1024 buffers at a time and never shrinks; a buffer stays taken by a
//! message that came for no posted receive until it is matched or
//! discarded. A server frozen or cut off sends its fenced job's results in
//! a burst when it runs again, and with 128 posted per connection that
//! burst grew each rank's pool by one 16.4 MB chunk (the device's soak: a
//! rank +13% start to end). tally posts 32: the first stop grew a rank by
//! 3.3 MB instead of 20.2 on the 2-core machine, every process started
//! smaller (ranks 84 MB against 135, servers 347 against 483), and on the
//! device (4 + 4 hosts, 16 and 32 Gbit/s, 16 and 64 MiB, agg and
//! agg-plugin, each alternated twice with the default) no row was slower:
//! 0.51-0.99 of the bound against 0.28-0.98 (docs/measurements.md, "Posted
//! receives per connection"). Only local memory: peers need not agree.
//!
//! libfabric reads its parameters when it first initializes, in the
//! process's first `fi_getinfo`. [`apply`] runs once, before any tally code
//! calls into libfabric (every `fi_getinfo` of the engine goes through it),
//! so no thread of ours reads the environment in C while it is written.
use std::sync::OnceLock;

/// (variable, value) pairs, libfabric 1.17.
pub const PROVIDER_DEFAULTS: &[(&str, &str)] = &[("FI_OFI_RXM_EAGER_LIMIT", "131072"), RX_PER_CONNECTION];

/// The same for libfabric 1.18 and later.
pub const PROVIDER_DEFAULTS_1_18: &[(&str, &str)] =
    &[("FI_OFI_RXM_BUFFER_SIZE", "32768"), ("FI_OFI_RXM_SAR_LIMIT", "32768"), RX_PER_CONNECTION];

/// Receive buffers rxm posts per connection (the module doc says why).
const RX_PER_CONNECTION: (&str, &str) = ("FI_OFI_RXM_MSG_RX_SIZE", "32");

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

/// Whether `var` holds the value [`apply`] gave it (the user set nothing):
/// a caller with a better value for its own case may replace it.
pub fn set_by_tally(var: &str) -> bool {
    APPLIED.get().is_some_and(|set| set.iter().any(|pair| pair.split_once('=').is_some_and(|(v, _)| v == var)))
}

/// rxm's eager limit where nothing sets one (its buffer size, 16 KiB).
const RXM_DEFAULT_EAGER: usize = 16 << 10;

/// The rxm eager limit this process runs with, once [`apply`] ran (it runs
/// it): on 1.17 the larger of `FI_OFI_RXM_EAGER_LIMIT` and
/// `FI_OFI_RXM_BUFFER_SIZE` (rxm takes the larger), from 1.18 on
/// `FI_OFI_RXM_BUFFER_SIZE`; rxm's 16 KiB where neither is set.
pub fn eager_limit() -> usize {
    apply();
    let get = |var: &str| std::env::var(var).ok().and_then(|v| v.trim().parse::<usize>().ok());
    let buffer = get("FI_OFI_RXM_BUFFER_SIZE").unwrap_or(RXM_DEFAULT_EAGER);
    if super::library_version() >= (1, 18) {
        buffer
    } else {
        get("FI_OFI_RXM_EAGER_LIMIT").unwrap_or(0).max(buffer)
    }
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
