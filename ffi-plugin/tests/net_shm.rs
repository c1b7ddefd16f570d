//! ncclNet over libfabric's shm provider: two ranks in one process.
#[path = "support/net_suite.rs"]
mod net_suite;
mod support;

#[test]
fn ncclnet_over_shm() {
    // Set before the first init, which reads it; this binary has one test.
    std::env::set_var("TALLY_PROVIDER", "shm");
    net_suite::run("shm");
    // The tables of older NCCLs over the same provider (the other two run over tcp).
    let p = support::load();
    net_suite::run_legacy("shm", p.net7, p.net9);
}
