//! What the CollNet tests need beside `tally_cli::collnet_driver::CollNet`
//! when ranks are threads of one test: the handle exchange (NCCL's
//! bootstrap allgather) over a shared board, and an iallreduce retried
//! until the plugin takes it.
use std::sync::{Barrier, Mutex};
use std::time::Instant;
use tally_cli::collnet_driver::{Handle, Request};

/// Every rank's listen handle, and a barrier the ranks also use between steps.
pub struct HandleBoard {
    handles: Mutex<Vec<Handle>>,
    pub barrier: Barrier,
}

impl HandleBoard {
    pub fn new(nranks: usize) -> HandleBoard {
        HandleBoard { handles: Mutex::new(vec![[0; std::mem::size_of::<Handle>()]; nranks]), barrier: Barrier::new(nranks) }
    }

    /// Posts rank `r`'s handle and returns every rank's once all have posted.
    pub fn allgather(&self, r: usize, h: &Handle) -> Vec<Handle> {
        self.handles.lock().unwrap()[r] = *h;
        self.barrier.wait();
        self.handles.lock().unwrap().clone()
    }
}

/// Calls `post` (one iallreduce) until the plugin takes it, or fails at `deadline`.
pub fn until_accepted(deadline: Instant, mut post: impl FnMut() -> Result<Option<Request>, String>) -> Result<Request, String> {
    loop {
        if let Some(req) = post()? {
            return Ok(req);
        }
        if Instant::now() > deadline {
            return Err("the plugin took no iallreduce before the deadline".into());
        }
    }
}
