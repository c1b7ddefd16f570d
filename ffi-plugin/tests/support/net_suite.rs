//! NCCL's ncclNet call sequence, replayed on two threads (two "ranks", each
//! with its own `init` context, as two NCCL communicators would have) over
//! one provider: init, devices, getProperties, listen/connect/accept loops,
//! regMr, up to 32 requests in flight per comm, sizes from 0 B to 16 MiB,
//! receives larger than sends, test() with NULL sizes, bad arguments,
//! close with requests in flight, finalize. Every byte is checked.
use crate::support::abi::*;
use crate::support::net_api::NetApi;
use crate::support::*;
use std::ffi::{c_int, c_void, CStr};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

/// Connections per direction: like NCCL's channels, they share each
/// context's endpoint and must not cross.
const CHANNELS: usize = 2;
/// Extra room in every receive: receives are larger than sends.
const SLACK: usize = 64;
/// (message size, requests in flight per comm) rounds.
const ROUNDS: &[(usize, usize)] = &[(0, 32), (1, 32), (4097, 32), (65536, 32), ((1 << 20) + 3, 8), (16 << 20, 2)];
const BUF: usize = 2 * CHANNELS * ((16 << 20) + SLACK) + 4096;
const TIMEOUT: Duration = Duration::from_secs(30);

/// Checks that getProperties wrote every field, with sane values.
fn check_props_v11(p: &NetPropertiesV11, dev: c_int) {
    assert!(!p.name.is_null(), "name");
    // SAFETY: the plugin returns NUL-terminated strings that live on.
    let name = unsafe { CStr::from_ptr(p.name) }.to_string_lossy();
    assert!(!name.is_empty());
    if !p.pci_path.is_null() {
        // SAFETY: as above.
        let pci = unsafe { CStr::from_ptr(p.pci_path) }.to_string_lossy();
        assert!(pci.starts_with('/'), "pciPath {pci}");
    }
    assert_eq!(p.ptr_support, NCCL_PTR_HOST);
    assert_eq!(p.reg_is_global, 0);
    assert_eq!(p.force_flush, 0);
    assert!(p.speed > 0 && p.speed <= 1_600_000, "speed {}", p.speed);
    assert!((0..=64).contains(&p.port), "port {}", p.port);
    assert!(p.latency > 0.0 && p.latency < 1000.0, "latency {}", p.latency);
    assert!(p.max_comms >= 1024, "maxComms {}", p.max_comms);
    assert_eq!(p.max_recvs, 1);
    assert_eq!(p.net_device_type, NCCL_NET_DEVICE_HOST);
    assert_eq!(p.net_device_version, NCCL_NET_DEVICE_INVALID_VERSION);
    assert_eq!(p.v_props.ndevs, 1);
    assert_eq!(p.v_props.devs[0], dev);
    assert!(p.max_p2p_bytes > 0 && p.max_p2p_bytes <= NCCL_MAX_NET_SIZE_BYTES);
    assert!(p.max_coll_bytes > 0 && p.max_coll_bytes <= NCCL_MAX_NET_SIZE_BYTES);
    assert!(p.max_multi_request_size >= 1);
}

fn garbage<T>() -> T {
    // SAFETY: only used for the plain-data property structs, whose every
    // bit pattern is valid (pointers are compared, never dereferenced, until
    // the plugin overwrote them).
    unsafe { std::mem::transmute_copy(&[0xabu8; 256]) }
}

pub fn properties(p: &Plugin) -> (NetPropertiesV11, usize) {
    let mut n: c_int = -1;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { (p.net11.devices)(&mut n) }, NCCL_SUCCESS);
    assert!(n >= 1, "{n} devices");
    for dev in 0..n {
        let mut v11: NetPropertiesV11 = garbage();
        // SAFETY: valid out-pointer of the v11 type.
        assert_eq!(unsafe { (p.net11.get_properties)(dev, &mut v11) }, NCCL_SUCCESS);
        check_props_v11(&v11, dev);
        let mut v12: NetPropertiesV12 = garbage();
        // SAFETY: as above, v12.
        assert_eq!(unsafe { (p.net12.get_properties)(dev, &mut v12) }, NCCL_SUCCESS);
        assert_eq!((v12.name, v12.pci_path, v12.speed, v12.max_p2p_bytes), (v11.name, v11.pci_path, v11.speed, v11.max_p2p_bytes));
        assert_eq!((v12.v_props.ndevs, v12.v_props.devs[0]), (1, dev));
        assert_eq!((v12.rail_id, v12.plane_id), (NCCL_NET_ID_UNDEF, NCCL_NET_ID_UNDEF));
        assert_eq!(v12.max_multi_request_size, v11.max_multi_request_size);
    }
    let mut v11: NetPropertiesV11 = garbage();
    // SAFETY: as above.
    unsafe { (p.net11.get_properties)(0, &mut v11) };
    (v11, n as usize)
}

/// Pointers one rank's thread holds (plain numbers between threads).
#[derive(Default)]
struct Exchange {
    handles: [[Vec<u8>; CHANNELS]; 2],
}

/// A message's identity: round, sending rank, channel, index.
fn msg_id(round: usize, from: usize, ch: usize, i: usize) -> u64 {
    ((round as u64) << 32) | ((from as u64) << 24) | ((ch as u64) << 16) | i as u64
}

struct Comms {
    send: [*mut c_void; CHANNELS],
    recv: [*mut c_void; CHANNELS],
    send_mh: [*mut c_void; CHANNELS],
    recv_mh: [*mut c_void; CHANNELS],
}

fn rank_main(t: &dyn NetApi, ctx: *mut c_void, r: usize, ex: &Mutex<Exchange>, barrier: &Barrier, max_p2p: usize) -> (Vec<u8>, Vec<u8>) {
    // --- listen, exchange handles, connect/accept (non-blocking) ---
    let mut listens = [null(); CHANNELS];
    for (ch, l) in listens.iter_mut().enumerate() {
        let mut h = [0u8; HANDLE];
        // SAFETY: valid context, handle buffer and out-pointer.
        assert_eq!(unsafe { t.listen(ctx, 0, h.as_mut_ptr().cast(), l) }, NCCL_SUCCESS);
        assert!(!l.is_null());
        ex.lock().unwrap().handles[r][ch] = h.to_vec();
    }
    barrier.wait();
    let mut peer: Vec<[u8; HANDLE]> = (0..CHANNELS).map(|ch| ex.lock().unwrap().handles[1 - r][ch].clone().try_into().unwrap()).collect();
    let mut c = Comms { send: [null(); CHANNELS], recv: [null(); CHANNELS], send_mh: [null(); CHANNELS], recv_mh: [null(); CHANNELS] };
    let t0 = Instant::now();
    let mut calls = 0usize;
    while c.send.iter().chain(c.recv.iter()).any(|p| p.is_null()) {
        for ch in 0..CHANNELS {
            if c.send[ch].is_null() {
                // SAFETY: the same handle buffer on every retry, as NCCL does.
                assert_eq!(unsafe { t.connect(ctx, 0, peer[ch].as_mut_ptr().cast(), &mut c.send[ch], null().cast(),) }, NCCL_SUCCESS);
                calls += 1;
            }
            if c.recv[ch].is_null() {
                // SAFETY: a live listen comm.
                assert_eq!(unsafe { t.accept(listens[ch], &mut c.recv[ch], null().cast()) }, NCCL_SUCCESS);
                calls += 1;
            }
        }
        assert!(t0.elapsed() < TIMEOUT, "rank {r}: connections not established after {calls} calls");
        std::thread::yield_now();
    }
    // A listen handle takes one connection.
    let mut extra = null();
    // SAFETY: a live listen comm.
    assert_eq!(unsafe { t.accept(listens[0], &mut extra, null().cast()) }, NCCL_INVALID_USAGE);
    for l in listens {
        // SAFETY: a live listen comm, closed once.
        assert_eq!(unsafe { t.close_listen(l) }, NCCL_SUCCESS);
    }
    barrier.wait();

    // --- memory registration ---
    let mut sbuf = vec![0u8; BUF];
    let mut rbuf = vec![0u8; BUF];
    for ch in 0..CHANNELS {
        // SAFETY: live comms; the buffers outlive the registrations.
        unsafe {
            assert_eq!(t.reg_mr(c.send[ch], sbuf.as_mut_ptr().cast(), BUF, NCCL_PTR_HOST, &mut c.send_mh[ch]), NCCL_SUCCESS);
            assert_eq!(t.reg_mr(c.recv[ch], rbuf.as_mut_ptr().cast(), BUF, NCCL_PTR_HOST, &mut c.recv_mh[ch]), NCCL_SUCCESS);
            let mut mh = null();
            assert_eq!(
                t.reg_mr(c.send[ch], sbuf.as_mut_ptr().cast(), BUF, NCCL_PTR_CUDA, &mut mh),
                NCCL_INVALID_ARGUMENT,
                "CUDA memory must be refused"
            );
            assert_eq!(t.reg_mr(c.send[ch], sbuf.as_mut_ptr().cast(), BUF, NCCL_PTR_HOST, std::ptr::null_mut()), NCCL_INVALID_ARGUMENT);
        }
    }

    // --- data rounds ---
    for (round, &(size, inflight)) in ROUNDS.iter().enumerate() {
        let stride = size + SLACK;
        let slot = |ch: usize, i: usize| (ch * inflight + i) * stride;
        for ch in 0..CHANNELS {
            for i in 0..inflight {
                fill(&mut sbuf[slot(ch, i)..slot(ch, i) + size], msg_id(round, r, ch, i));
            }
        }
        rbuf[..CHANNELS * inflight * stride].fill(0xee);
        let mut rreq = vec![[null(); 32]; CHANNELS];
        let mut sreq = vec![[null(); 32]; CHANNELS];
        let t0 = Instant::now();
        // Receives first (any order would do), each larger than its message.
        for ch in 0..CHANNELS {
            for (i, req) in rreq[ch].iter_mut().enumerate().take(inflight) {
                let mut data = rbuf[slot(ch, i)..].as_mut_ptr().cast::<c_void>();
                let mut sz = stride;
                let mut tag: c_int = 7;
                let mut mh = c.recv_mh[ch];
                loop {
                    assert_eq!(
                        // SAFETY: live comm, one-element arrays, buffer valid until the test completes.
                        unsafe { t.irecv(c.recv[ch], 1, &mut data, &mut sz, &mut tag, &mut mh, null().cast(), req,) },
                        NCCL_SUCCESS
                    );
                    if !req.is_null() {
                        break;
                    }
                    assert!(
                        t0.elapsed() < TIMEOUT,
                        "rank {r}: irecv never accepted (round {round}: {inflight} x {size} B, channel {ch}, request {i})"
                    );
                }
            }
            if inflight == 32 {
                // A 33rd request on a comm with 32 in flight: "try again".
                let mut data = rbuf.as_mut_ptr().cast::<c_void>();
                let (mut sz, mut tag, mut mh, mut req) = (16usize, 7, c.recv_mh[ch], null());
                assert_eq!(
                    // SAFETY: as above.
                    unsafe { t.irecv(c.recv[ch], 1, &mut data, &mut sz, &mut tag, &mut mh, null().cast(), &mut req,) },
                    NCCL_SUCCESS
                );
                assert!(req.is_null(), "a 33rd request must not be accepted");
            }
        }
        for ch in 0..CHANNELS {
            for (i, req) in sreq[ch].iter_mut().enumerate().take(inflight) {
                // NCCL may leave a hint in *request before the call.
                *req = NCCL_NET_OPTIONAL_RECV_COMPLETION as *mut c_void;
                loop {
                    assert_eq!(
                        // SAFETY: live comm; the buffer stays valid until the test completes.
                        unsafe { t.isend(c.send[ch], sbuf[slot(ch, i)..].as_mut_ptr().cast(), size, 7, c.send_mh[ch], null(), req,) },
                        NCCL_SUCCESS
                    );
                    if !req.is_null() {
                        break;
                    }
                    assert!(
                        t0.elapsed() < TIMEOUT,
                        "rank {r}: isend never accepted (round {round}: {inflight} x {size} B, channel {ch}, request {i})"
                    );
                }
            }
        }
        // Test everything to completion, in any order.
        let mut left = 2 * CHANNELS * inflight;
        while left > 0 {
            for ch in 0..CHANNELS {
                for i in 0..inflight {
                    for (req, is_send) in [(&mut sreq[ch][i], true), (&mut rreq[ch][i], false)] {
                        if req.is_null() {
                            continue;
                        }
                        let (mut done, mut n): (c_int, c_int) = (0, -1);
                        // Half the tests pass NULL sizes, as NCCL may.
                        let sizes = if (i + ch) % 2 == 0 { &mut n as *mut c_int } else { std::ptr::null_mut() };
                        // SAFETY: a request of a live comm.
                        assert_eq!(unsafe { t.test(*req, &mut done, sizes) }, NCCL_SUCCESS, "test failed (size {size})");
                        if done == 1 {
                            if !sizes.is_null() {
                                assert_eq!(
                                    n as usize,
                                    size,
                                    "{} reported {n} bytes, {size} were sent",
                                    if is_send { "send" } else { "receive" }
                                );
                            }
                            *req = null();
                            left -= 1;
                        }
                    }
                }
            }
            assert!(t0.elapsed() < TIMEOUT, "rank {r}: round of {inflight} x {size} B not done in {TIMEOUT:?} ({left} left)");
        }
        for ch in 0..CHANNELS {
            for i in 0..inflight {
                let got = &rbuf[slot(ch, i)..slot(ch, i) + stride];
                check(&got[..size], msg_id(round, 1 - r, ch, i), &format!("rank {r} channel {ch} message {i} of {size} B"));
                assert!(got[size..].iter().all(|&b| b == 0xee), "bytes written past the message");
            }
        }
        barrier.wait();
    }

    // --- bad arguments on live comms ---
    let mut req = null();
    // SAFETY: the calls must fail cleanly without touching the buffers.
    unsafe {
        assert_eq!(
            t.isend(c.send[0], sbuf.as_mut_ptr().cast(), max_p2p + 1, 0, c.send_mh[0], null(), &mut req),
            NCCL_INVALID_ARGUMENT,
            "oversize send"
        );
        assert_eq!(t.isend(c.send[0], null(), 10, 0, c.send_mh[0], null(), &mut req), NCCL_INVALID_ARGUMENT, "NULL data");
        assert_eq!(
            t.isend(c.recv[0], sbuf.as_mut_ptr().cast(), 10, 0, c.recv_mh[0], null(), &mut req),
            NCCL_INVALID_USAGE,
            "isend on a receive comm"
        );
        assert_eq!(
            t.isend(c.send[0], sbuf.as_mut_ptr().cast(), 10, 0, c.send_mh[0], null(), std::ptr::null_mut()),
            NCCL_INVALID_ARGUMENT,
            "NULL request"
        );
        let mut d = [sbuf.as_mut_ptr().cast::<c_void>(); 2];
        let mut s = [8usize; 2];
        let mut tg = [0 as c_int; 2];
        let mut m = [c.recv_mh[0]; 2];
        assert_eq!(
            t.irecv(c.recv[0], 2, d.as_mut_ptr(), s.as_mut_ptr(), tg.as_mut_ptr(), m.as_mut_ptr(), null().cast(), &mut req),
            NCCL_INVALID_ARGUMENT,
            "grouped receive"
        );
        assert_eq!(
            t.irecv(c.recv[0], 1, std::ptr::null_mut(), s.as_mut_ptr(), tg.as_mut_ptr(), m.as_mut_ptr(), null().cast(), &mut req),
            NCCL_INVALID_ARGUMENT,
            "NULL data array"
        );
        assert_eq!(
            t.irecv(c.recv[0], 1, d.as_mut_ptr(), s.as_mut_ptr(), tg.as_mut_ptr(), m.as_mut_ptr(), null().cast(), std::ptr::null_mut()),
            NCCL_INVALID_ARGUMENT
        );
        let mut done = 0;
        assert_eq!(t.test(null(), &mut done, std::ptr::null_mut()), NCCL_INVALID_ARGUMENT, "NULL request");
        assert_eq!(t.iflush(c.recv[0], 1, d.as_mut_ptr(), tg.as_mut_ptr(), m.as_mut_ptr(), &mut req), NCCL_SUCCESS);
        assert!(req.is_null(), "host memory needs no flush");
        let mut nc = null();
        let mut bogus = [0x5au8; HANDLE];
        assert_eq!(t.connect(ctx, 0, bogus.as_mut_ptr().cast(), &mut nc, null().cast()), NCCL_INVALID_USAGE, "foreign handle");
        assert_eq!(t.connect(ctx, 7, bogus.as_mut_ptr().cast(), &mut nc, null().cast()), NCCL_INVALID_ARGUMENT, "bad device");
        let mut l = null();
        let mut h = [0u8; HANDLE];
        assert_eq!(t.listen(ctx, 99, h.as_mut_ptr().cast(), &mut l), NCCL_INVALID_ARGUMENT, "bad device");
        assert_eq!(t.listen(ctx, 0, null(), &mut l), NCCL_INVALID_ARGUMENT, "NULL handle");
    }
    barrier.wait();

    // --- close with requests in flight ---
    // Receives nobody will ever send to, and sends nobody will receive
    // (large enough not to be buffered eagerly by the provider).
    let mut pending = Vec::new();
    for i in 0..4 {
        let mut data = rbuf[i * 4096..].as_mut_ptr().cast::<c_void>();
        let (mut sz, mut tag, mut mh, mut req) = (4096usize, 0, c.recv_mh[0], null());
        // SAFETY: the buffers outlive the comms (dropped at the end).
        unsafe { assert_eq!(t.irecv(c.recv[0], 1, &mut data, &mut sz, &mut tag, &mut mh, null().cast(), &mut req), NCCL_SUCCESS) };
        pending.push(req);
    }
    for i in 0..2 {
        let mut req = null();
        // SAFETY: as above; the peer never posts the matching receives.
        unsafe {
            assert_eq!(t.isend(c.send[1], sbuf[i << 20..].as_mut_ptr().cast(), 1 << 20, 0, c.send_mh[1], null(), &mut req), NCCL_SUCCESS)
        };
        pending.push(req);
    }
    barrier.wait();
    for ch in 0..CHANNELS {
        // SAFETY: deregistration before close, as NCCL does.
        unsafe {
            assert_eq!(t.dereg_mr(c.send[ch], c.send_mh[ch]), NCCL_SUCCESS);
            assert_eq!(t.dereg_mr(c.recv[ch], c.recv_mh[ch]), NCCL_SUCCESS);
        }
    }
    for ch in 0..CHANNELS {
        // SAFETY: live comms, closed once (comm 0 with receives in flight).
        unsafe {
            assert_eq!(t.close_recv(c.recv[ch]), NCCL_SUCCESS);
            assert_eq!(t.close_send(c.send[ch]), NCCL_SUCCESS);
        }
    }
    barrier.wait();
    // The provider may hold abandoned operations on these until the
    // endpoint closes: the caller frees them after finalize.
    (sbuf, rbuf)
}

/// The whole sequence over the provider set in the environment.
pub fn run(expect_provider: &str) {
    let threads_before = thread_count();
    let p = load();
    // SAFETY: the table's name is a static C string of the plugin.
    assert_eq!(unsafe { CStr::from_ptr(p.net11.name) }.to_str().unwrap(), "Tally");
    let mut cfg = NetCommConfig { traffic_class: -1 };
    let mut ctx = [null(); 2];
    for (i, c) in ctx.iter_mut().enumerate() {
        // SAFETY: valid out-pointers; the logger matches NCCL's calling convention.
        assert_eq!(unsafe { (p.net11.init)(c, 0x7a11_0000 + i as u64, &mut cfg, logger(), null()) }, NCCL_SUCCESS);
        assert!(!c.is_null());
    }
    assert!(logged(&format!("provider {expect_provider}")), "init should log the provider: {:?}", LOG.lock().unwrap());
    let (props, ndev) = properties(&p);
    let max_p2p = props.max_p2p_bytes;
    // Bad device indices and NULL out-pointers.
    let mut v11: NetPropertiesV11 = garbage();
    // SAFETY: invalid arguments are refused without writing.
    unsafe {
        assert_eq!((p.net11.get_properties)(ndev as c_int, &mut v11), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.net11.get_properties)(-1, &mut v11), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.net11.get_properties)(0, std::ptr::null_mut()), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.net11.devices)(std::ptr::null_mut()), NCCL_INVALID_ARGUMENT);
    }

    let ex = Mutex::new(Exchange::default());
    let barrier = Barrier::new(2);
    let (c0, c1) = (ctx[0] as usize, ctx[1] as usize);
    let t0 = Instant::now();
    let buffers = std::thread::scope(|s| {
        let (ex, barrier, p) = (&ex, &barrier, &p);
        // Rank 0 calls through the v11 table, rank 1 through v12.
        let a = s.spawn(move || rank_main(p.net11 as &dyn NetApi, c0 as *mut c_void, 0, ex, barrier, max_p2p));
        let b = s.spawn(move || rank_main(p.net12 as &dyn NetApi, c1 as *mut c_void, 1, ex, barrier, max_p2p));
        (a.join().unwrap(), b.join().unwrap())
    });
    eprintln!("{expect_provider}: two ranks, {CHANNELS} connections each way, {} rounds in {:?}", ROUNDS.len(), t0.elapsed());
    for c in ctx {
        // SAFETY: contexts from init, finalized once.
        assert_eq!(unsafe { (p.net11.finalize)(c) }, NCCL_SUCCESS);
    }
    drop(buffers);
    // SAFETY: NULL is refused.
    assert_eq!(unsafe { (p.net11.finalize)(null()) }, NCCL_INVALID_ARGUMENT);
    assert!(thread_count() <= threads_before, "threads outlived finalize: {} before, {} after", threads_before, thread_count());
    let log = LOG.lock().unwrap();
    assert!(log.iter().any(|(lvl, flags, _)| *lvl == NCCL_LOG_INFO && flags & NCCL_NET != 0), "no INFO line under NCCL_NET");
    assert!(
        log.iter().any(|(lvl, flags, m)| *lvl == NCCL_LOG_WARN && flags & NCCL_NET != 0 && m.contains("invalid argument")),
        "refused arguments are logged as warnings"
    );
}

/// The same sequence through two of the tables NCCL 2.19-2.27 load: rank 0
/// calls through `a`, rank 1 through `b`, and both share the process's one
/// context (those versions have no other), as two GPUs of one NCCL process
/// would. Nothing finalizes it: those versions have no finalize.
pub fn run_legacy(expect_provider: &str, a: &'static dyn NetApi, b: &'static dyn NetApi) {
    let p = load();
    for t in [a, b] {
        assert_eq!(t.name(), "Tally");
        // SAFETY: init of a table without a context; the logger matches NCCL's convention.
        let (rc, ctx) = unsafe { t.init(0) };
        assert_eq!((rc, ctx), (NCCL_SUCCESS, null()), "v{} init", t.version());
    }
    assert!(
        logged(&format!("ncclNet v{} (an NCCL before 2.28): one context for the process", a.version())),
        "the first init says which table NCCL loaded: {:?}",
        LOG.lock().unwrap()
    );
    let (v11, _) = properties(&p);
    for t in [a, b] {
        // SAFETY: a valid device and out-pointers.
        unsafe { t.check_properties(0, &v11) };
    }
    let ex = Mutex::new(Exchange::default());
    let barrier = Barrier::new(2);
    let t0 = Instant::now();
    let buffers = std::thread::scope(|s| {
        let (ex, barrier, max_p2p) = (&ex, &barrier, v11.max_p2p_bytes);
        let ra = s.spawn(move || rank_main(a, null(), 0, ex, barrier, max_p2p));
        let rb = s.spawn(move || rank_main(b, null(), 1, ex, barrier, max_p2p));
        (ra.join().unwrap(), rb.join().unwrap())
    });
    eprintln!(
        "{expect_provider}: ncclNet v{} and v{}, {CHANNELS} connections each way, {} rounds in {:?}",
        a.version(),
        b.version(),
        ROUNDS.len(),
        t0.elapsed()
    );
    drop(buffers);
}
