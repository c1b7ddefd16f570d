//! libfabric, behind a small safe layer.
//!
//! tally reaches the network through libfabric: provider `efa` on AWS, `shm`
//! between processes on one host and `tcp;ofi_rxm` anywhere else. The
//! bindings in [`sys`] are generated at build time against the installed
//! headers (libfabric versions its symbols, so the layouts must be the ones of
//! the library we link). On top of them:
//!
//! - [`info`]: which provider, and asking it for an RDM tagged interface;
//! - [`Endpoint`]: fabric + domain + address vector + completion queue +
//!   endpoint + registrations + operation contexts, owned by one thread;
//! - [`error`]: failures as values, including decoded error completions;
//! - [`call_watch`]: which provider call an endpoint's owner is inside, for a
//!   watchdog on another thread;
//! - [`shm`]: removing the region files SIGKILLed shm processes leave in /dev/shm.
//!
//! The data-path calls (`send`, `recv`, `poll`) neither allocate nor lock.
//!
//! # Provider facts the code depends on (libfabric 1.17)
//!
//! - shm: sends return EAGAIN until the peer has been progressed once (connection set-up): every post
//!   site retries while polling.
//! - shm: two endpoints of one process that talk to each other must not be closed while the other
//!   still runs (the region is unmapped under it): tests run servers and workers as separate
//!   processes. shm crashes in progress after `fi_av_remove` of a peer it talked to, so shm servers
//!   keep AV entries (256 peers over a server's life); other providers remove them.
//! - shm 1.17/1.18 matches an unexpected message with a stale tag mask (jobs stalled under load about
//!   1 run in 10), so `Endpoint` primes its receive pool (`prime_shm_receive_pool`) and an shm
//!   endpoint uses a single tag mask: the module doc of
//!   `engine/src/dataplane/fabric/endpoint/mod.rs`.
//! - shm completes an endpoint's sends strictly in order (same module doc): a result sent to a rank
//!   that died without taking it blocks every later send of that lcore for good; the lcore's drain
//!   deadline then marks the endpoint `sends_blocked` and fails its jobs saying so (restart the
//!   server). A rank that dies holding its own region's spinlock can leave an lcore spinning inside
//!   `fi_tsend`: the control plane's watchdog (`LCORE_STUCK_AFTER`, 5 s without a poll) then fails
//!   that lcore's jobs and refuses new ones that need it.
//! - shm region files a SIGKILLed process leaves make a later process with the same PID fail
//!   `fi_enable` with EBUSY: `fabric::shm` sweeps stale ones (`engine/src/dataplane/fabric/shm.rs`).
//! - tcp;ofi_rxm sends above its eager limit (16 KiB by default) by rendezvous. Every tally process
//!   sets the limit to 128 KiB (`FI_OFI_RXM_EAGER_LIMIT`; on 1.18 and later, which lack it and whose
//!   bounce buffers are that size, 32 KiB by `FI_OFI_RXM_BUFFER_SIZE`, and `FI_OFI_RXM_SAR_LIMIT` to
//!   the same) unless the user set it, once, before the engine's first `fi_getinfo`
//!   (`fabric::defaults::apply`); rxm refuses a connection from a peer with another limit. The
//!   emulated cluster cuts agg and ring into 32 KiB pieces up to 8 Gbit/s, and the plugin over tcp
//!   sends whole pieces of the limit (`fabric::defaults::eager_limit`): NCCL's steps as 128 KiB pieces,
//!   not 32 KiB ones, took 4 + 4 hosts at 32 Gbit/s from 0.70-0.85 of the bound to 0.81-0.97.
//!   Pieces of 64 KiB collapsed in that pattern (0.03-0.05) while the emulated hosts' TCP autocorked
//!   (see the emulated cluster below); without it they match 128 KiB. Why these sizes, why
//!   every process alike, what 1.18+'s defaults cost: the module doc of
//!   `engine/src/dataplane/fabric/defaults.rs` and
//!   [measurements](docs/measurements.md#pieces-of-128-kib). The
//!   NCCL plugin without `TALLY_SERVERS` (ncclNet only) uses 4 MiB. A 1.17-built tally runs on 1.22
//!   unchanged (`scripts/build/libfabric.sh`).
//! - tcp;ofi_rxm: after a truncated receive the connection's stream is out of step; tally never posts
//!   a receive smaller than the message its peer sends.
//! - tcp;ofi_rxm: closing an endpoint with sends still queued to an unreachable peer crashes in
//!   `fi_close`; an `Endpoint` with operations the provider never returned is left open (logged)
//!   instead.
//! - tcp;ofi_rxm never completes sends queued to a peer whose connection failed (it drops them when
//!   it closes the connection), and `fi_av_remove` of such a peer crashes a later call, so a job
//!   ended by a dead rank drains with those sends still out. A rank counts as gone when its side
//!   closed its control connection or the provider reported ENOTCONN, ECONNRESET, EPIPE or
//!   ECONNREFUSED on it (shared between lcores through the control plane); sends only to gone ranks
//!   are forgotten (`Endpoint::forget`) and the region and job slot reused. Anything else stuck past
//!   the drain deadline (a rank alive but unreachable) keeps its region and job slot quarantined
//!   until the provider returns the operations.
//! - tcp;ofi_rxm streaming bandwidth drops with very deep windows (2 GB/s at 64 x 512 KiB vs 9-10 at
//!   4-16 here). Left unset, a client's window keeps at most 1 MiB in flight per server lcore (4
//!   chunks up to 256 KiB, 2 from 512 KiB: `client::auto_window`); at 32 Gbit/s with 512 KiB chunks
//!   2 beat 4 in every alternated pair on the device ([measurements,
//!   "Failover"](docs/measurements.md#failover)).
//! - tcp;ofi_rxm queues 2048 receives per endpoint: a server lcore posts `window x nranks` per job,
//!   and past 2048 (1024 ranks at window 4) the rest are retried on later turns until some complete
//!   (after the first refusal in a pass, the pass's other receives wait for the next turn rather than
//!   fail one call each), which works but slowly. shm reaches at most 256 peers per endpoint, so jobs
//!   above that need tcp or efa.
pub mod call_watch;
pub mod defaults;
pub mod endpoint;
pub mod error;
pub mod info;
pub mod names;
pub mod shm;
pub mod sys;

pub use endpoint::{
    provider_can_sweep, Completion, Endpoint, EndpointConfig, EndpointName, MemoryHandle, PeerAddr, PendingSends, MAX_NAME_LEN,
};
pub use error::{CompletionError, FabricError, PollError, PostError};
pub use info::{canonical_provider, library_version, list_providers, provider_available, select_provider, Hints, InfoList};
pub use names::NameShape;
