//! The NCCL settings the plugin's `init` changes (device::COLLNET_NCCL_DEFAULTS):
//! only with CollNet servers configured, only where the user set nothing,
//! and said in NCCL's log. The real library, as NCCL loads it; one test in
//! this binary, since it changes the process's environment.
mod support;

use support::abi::*;
use support::*;

fn init_and_finalize(p: &Plugin) {
    let mut cfg = NetCommConfig { traffic_class: -1 };
    let mut ctx = null();
    // SAFETY: a valid out-pointer; the logger matches NCCL's calling convention.
    assert_eq!(unsafe { (p.net11.init)(&mut ctx, 0x7a11_d0d0, &mut cfg, logger(), null()) }, NCCL_SUCCESS);
    // SAFETY: the context init returned, finalized once.
    assert_eq!(unsafe { (p.net11.finalize)(ctx) }, NCCL_SUCCESS);
}

#[test]
fn collnet_jobs_get_four_channels_unless_the_user_chose() {
    std::env::set_var("TALLY_PROVIDER", "tcp");
    std::env::set_var("TALLY_FABRIC_ADDR", "127.0.0.1");
    std::env::remove_var("NCCL_MIN_NCHANNELS");
    std::env::remove_var("TALLY_SERVERS");
    let p = load();
    let said = "NCCL defaults set (unset before): NCCL_MIN_NCHANNELS=4";

    // No CollNet servers: NCCL's own channel choice stands.
    init_and_finalize(&p);
    assert_eq!(std::env::var_os("NCCL_MIN_NCHANNELS"), None, "set without CollNet servers");
    assert!(!logged(said));

    // The user's own value is kept, whatever it is.
    std::env::set_var("TALLY_SERVERS", "127.0.0.1:7400");
    std::env::set_var("NCCL_MIN_NCHANNELS", "2");
    init_and_finalize(&p);
    assert_eq!(std::env::var("NCCL_MIN_NCHANNELS").as_deref(), Ok("2"), "the user's value was overwritten");
    assert!(!logged(said));

    // CollNet servers and nothing set: four, and the log says so.
    std::env::remove_var("NCCL_MIN_NCHANNELS");
    init_and_finalize(&p);
    assert_eq!(std::env::var("NCCL_MIN_NCHANNELS").as_deref(), Ok("4"));
    assert!(logged(said), "init should log what it set: {:?}", LOG.lock().unwrap());
}
