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
pub mod call_watch;
pub mod defaults;
pub mod endpoint;
pub mod error;
pub mod info;
pub mod names;
pub mod shm;
pub mod sys;

pub use endpoint::{Completion, Endpoint, EndpointConfig, EndpointName, MemoryHandle, PeerAddr, MAX_NAME_LEN};
pub use error::{CompletionError, FabricError, PollError, PostError};
pub use info::{canonical_provider, library_version, list_providers, provider_available, select_provider, Hints, InfoList};
pub use names::NameShape;
