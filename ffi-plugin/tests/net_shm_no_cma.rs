//! ncclNet over shm without cross-memory attach: what shm does under
//! qemu-user, in a container without CAP_SYS_PTRACE, or where Yama forbids
//! it. Sends above shm's inject size then copy through the peer's buffers,
//! one such send per peer at a time, and two ranks that each retried their
//! sends without driving their receives once waited for each other forever
//! (`Conn::post` in ffi-plugin/src/net/conn.rs says how that ended).
#[path = "support/net_suite.rs"]
mod net_suite;
mod support;

#[test]
fn ncclnet_over_shm_without_cross_memory_attach() {
    // Set before the first init, which reads them; this binary has one test.
    std::env::set_var("TALLY_PROVIDER", "shm");
    std::env::set_var("FI_SHM_DISABLE_CMA", "1");
    net_suite::run("shm");
    let p = support::load();
    net_suite::run_legacy("shm", p.net7, p.net9);
}
