//! ncclNet over libfabric's tcp;ofi_rxm provider on loopback: two ranks in one process.
#[path = "support/net_suite.rs"]
mod net_suite;
mod support;

#[test]
fn ncclnet_over_tcp() {
    // Set before the first init, which reads them; this binary has one test.
    std::env::set_var("TALLY_PROVIDER", "tcp");
    std::env::set_var("TALLY_FABRIC_ADDR", "127.0.0.1");
    net_suite::run("tcp;ofi_rxm");
    // The tables of older NCCLs over the same provider (the other two run over shm).
    let p = support::load();
    net_suite::run_legacy("tcp", p.net8, p.net10);
}
