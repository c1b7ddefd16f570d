//! The rings between the client and a rail thread: the commands it
//! queues ([`Cmd`]), what the rail hands back ([`Event`], [`Reply`]), the
//! eventfd bells that wake a sleeping side ([`Bell`]), the state both share
//! ([`Shared`]), and queueing with and without waiting for room; and a
//! rail's pair of rings with the copier ([`CopyLane`]: jobs out as
//! [`CopyJob`], completions back), whose bell is in [`CopierShared`].
use crate::dataplane::fabric::{Completion, CompletionError, EndpointName, FabricError, PeerAddr, PendingSends, PostError};
use crossbeam_queue::ArrayQueue;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sweep completions a rail holds for the client at most: a peek and a
/// discard out at a time, and room to spare.
pub(super) const SWEEP_RING: usize = 8;

/// Operations queued to one rail at most; a client finding the ring full
/// sees `EAGAIN` and posts again later, as from a full provider queue.
pub(super) const RING: usize = 4096;

/// An operation queued to a rail thread.
pub(super) enum Cmd {
    Send {
        buf: *const u8,
        len: usize,
        dest: PeerAddr,
        tag: u64,
        ctx: u32,
    },
    Recv {
        buf: *mut u8,
        len: usize,
        src: Option<PeerAddr>,
        tag: u64,
        ignore: u64,
        ctx: u32,
    },
    /// A receive whose bytes are copied to `to` once it completes, before
    /// the rail hands the completion back (failover's staged results: the
    /// copy out of the staging slot runs on the copier, or on the rail's
    /// thread without one, instead of on the caller's).
    RecvCopy {
        buf: *mut u8,
        len: usize,
        src: Option<PeerAddr>,
        tag: u64,
        ctx: u32,
        to: *mut u8,
    },
    /// Look at the oldest unexpected message (`Endpoint::peek_unexpected`):
    /// its completion (or a failed one: none, or refused) comes back as
    /// any other, under `ctx`. In order with the data operations.
    Peek {
        ctx: u32,
    },
    /// Discard the oldest unexpected message of `tag`
    /// (`Endpoint::discard_unexpected`), likewise.
    Discard {
        tag: u64,
        ctx: u32,
    },
    /// Cancel one operation (or drop it, if still queued on the rail),
    /// answer [`Reply::Done`]. A canceled [`Cmd::RecvCopy`] copies nothing
    /// from then on, even if its receive still completes.
    Cancel(u32),
    /// Cancel everything, drain, answer [`Reply::Done`].
    CancelAll,
    /// Add a peer to the rail's address vector, answer [`Reply::Peer`]
    /// (boxed: a name is large, and this is rare).
    InsertPeer(Box<EndpointName>),
    /// `Endpoint::settle` these contexts (their sends as it says),
    /// answer [`Reply::Count`]: the operations still in flight, plus one
    /// while events are still on their way to the client (one of them may
    /// name these contexts).
    Settle(std::ops::Range<u32>, PendingSends),
}

// SAFETY: the buffer pointers belong to the client's caller, who keeps them
// valid until their operation completes (the contract of `Client::start`);
// the rail thread only hands them to libfabric, as the caller's thread would.
unsafe impl Send for Cmd {}

/// What a rail thread hands back.
pub(super) enum Event {
    Done(Completion),
    /// An error completion (boxed: rare, and keeps the ring's slots small).
    Failed(Box<CompletionError>),
    /// Posting or polling failed outright.
    Broken(FabricError),
}

pub(super) enum Reply {
    Peer(Result<PeerAddr, FabricError>),
    Done,
    Count(u32),
}

/// A sleeper's flag and the eventfd that wakes it.
pub(super) struct Bell {
    pub(super) sleeping: AtomicBool,
    pub(super) fd: i32,
}

impl Bell {
    pub(super) fn new() -> std::io::Result<Bell> {
        // SAFETY: plain eventfd creation; the descriptor is owned by the Bell.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Bell { sleeping: AtomicBool::new(false), fd })
    }

    /// Wakes the sleeper if it sleeps (a system call only then).
    pub(super) fn ring(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd.
            unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
        }
    }

    /// Sleeps until rung, or `ms` passes.
    pub(super) fn wait(&self, ms: u32) {
        let mut pfd = libc::pollfd { fd: self.fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd on our eventfd.
        unsafe { libc::poll(&mut pfd, 1, ms.min(i32::MAX as u32) as i32) };
    }

    pub(super) fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd.
        unsafe { libc::read(self.fd, (&mut v as *mut u64).cast(), 8) };
    }
}

impl Drop for Bell {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe { libc::close(self.fd) };
    }
}

/// What a rail thread and the client share.
pub(super) struct Shared {
    pub(super) cmds: ArrayQueue<Cmd>,
    pub(super) events: ArrayQueue<Event>,
    /// The completions of the client's sweep (`client::sweep`), kept out
    /// of `events`: a look every 50 ms must not read as a data completion
    /// on its way (`Cmd::Settle`) to a rail whose server was lost (ranks
    /// then put off taking a restarted server back). The client takes them
    /// in a poll that found nothing else, and at its control checks.
    pub(super) sweep: ArrayQueue<Event>,
    pub(super) replies: ArrayQueue<Reply>,
    /// Rung by the client after queueing to a sleeping rail.
    pub(super) bell: Bell,
    /// Rung by the rail after queueing events while the client sleeps.
    pub(super) owner: Arc<Bell>,
    pub(super) stop: AtomicBool,
    /// Set by [`Rails::abandon`]: the rail is stuck in a provider call; if
    /// that call returns, the rail makes no other and ends.
    pub(super) abandoned: AtomicBool,
    /// Staged results this rail copied out, and the ns those copies took
    /// (timed only with `TALLY_PIECE_TIMES`; written by the rail alone).
    pub(super) copies: AtomicU64,
    pub(super) copy_ns: AtomicU64,
    /// The ns of the rail's turns, and of those that moved something
    /// (timed only with `TALLY_PIECE_TIMES`; written by the rail alone).
    pub(super) turn_ns: AtomicU64,
    pub(super) busy_ns: AtomicU64,
    /// The rings to and from the copier, where the client runs one.
    pub(super) copy: Option<CopyLane>,
}

/// Queues a data operation; a full ring is `EAGAIN` (the client retries).
#[inline]
pub(super) fn queue(sh: &Shared, c: Cmd) -> Result<(), PostError> {
    if sh.abandoned.load(Ordering::Relaxed) {
        return Err(PostError::Fabric(FabricError { call: "rail abandoned (stuck in a provider call)", code: libc::EIO }));
    }
    match sh.cmds.push(c) {
        Ok(()) => {
            sh.bell.ring();
            Ok(())
        }
        Err(_) => Err(PostError::Again),
    }
}

/// Queues a command, waiting (bounded) for room.
pub(super) fn force(sh: &Shared, mut c: Cmd) -> Result<(), FabricError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match sh.cmds.push(c) {
            Ok(()) => {
                sh.bell.ring();
                return Ok(());
            }
            Err(back) if Instant::now() < deadline => {
                c = back;
                std::thread::yield_now();
            }
            Err(_) => return Err(FabricError { call: "rail: command ring full for 5 s", code: libc::ETIMEDOUT }),
        }
    }
}

/// Queues a command and waits (bounded) for the rail's answer.
pub(super) fn ask(sh: &Shared, c: Cmd) -> Result<Reply, FabricError> {
    force(sh, c)?;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(r) = sh.replies.pop() {
            return Ok(r);
        }
        if Instant::now() > deadline {
            return Err(FabricError { call: "rail: no answer in 5 s", code: libc::ETIMEDOUT });
        }
        std::thread::yield_now();
    }
}

/// Jobs a rail keeps out with the copier at most (and each ring's slots).
pub(super) const LANE: usize = 1024;

/// A staged result to copy: `len` bytes from its slot to the caller's
/// buffer, then `done` goes back to the rail.
pub(super) struct CopyJob {
    pub from: *const u8,
    pub to: *mut u8,
    pub len: usize,
    pub done: Completion,
}

// SAFETY: `from` is a staging slot and `to` the caller's buffer, both kept
// valid and untouched by anyone else until `done` is handed back to the
// client (Rails::recv's contract); the copier only copies between them.
unsafe impl Send for CopyJob {}

/// One rail's rings with the copier.
pub(super) struct CopyLane {
    pub jobs: ArrayQueue<CopyJob>,
    pub done: ArrayQueue<Completion>,
    /// The copier's bell, rung by the rail after handing it a job.
    pub copier: Arc<CopierShared>,
}

impl CopyLane {
    pub(super) fn new(copier: Arc<CopierShared>) -> CopyLane {
        CopyLane { jobs: ArrayQueue::new(LANE), done: ArrayQueue::new(LANE), copier }
    }
}

/// What the copier shares with the rails and the client.
pub(super) struct CopierShared {
    pub bell: Bell,
    pub stop: AtomicBool,
    /// Copies made and the ns they took (timed only with
    /// `TALLY_PIECE_TIMES`; written by the copier alone).
    pub copies: AtomicU64,
    pub copy_ns: AtomicU64,
}

impl CopierShared {
    pub(super) fn new() -> std::io::Result<CopierShared> {
        Ok(CopierShared { bell: Bell::new()?, stop: AtomicBool::new(false), copies: AtomicU64::new(0), copy_ns: AtomicU64::new(0) })
    }
}
