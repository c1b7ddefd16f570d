//! `tally bench`: what the kernels, the transport and all-reduce do on this
//! machine, each held against a bound measured in the same run.
//!
//! - [`reduce`]: the reduction kernels against `memcpy`;
//! - [`p2p`]: the transport alone, two ends (ping-pong, streaming) or a fan
//!   of hubs and leaves;
//! - [`allreduce`]: agg (reduction servers) against ring, ranks on this machine;
//! - [`cluster`]: the same over an emulated cluster of network namespaces
//!   and shaped links.
//!
//! [`report`] is the all-reduce row every one of them prints and reads
//! back, [`plot`] draws those rows.
pub mod allreduce;
pub mod cluster;
pub mod p2p;
pub mod plot;
pub mod reduce;
pub mod report;
