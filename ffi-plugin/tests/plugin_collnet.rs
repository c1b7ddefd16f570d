//! ncclCollNet against real tally servers: the plugin library is loaded the
//! way NCCL loads it (tests/support) and N ranks, each a thread with its own
//! CollNet context and comm, replay NCCL's sequence:
//! init, devices, getProperties, listen, a collective connect, regMr, many
//! iallreduce/test rounds (several in flight, every element checked), bad
//! arguments, close, finalize. Over tcp;ofi_rxm and shm, with 2 and 4 ranks
//! (4 ranks striped over two servers), and through the v7-v10 tables of
//! NCCL 2.19-2.27 (collnet_legacy) over tcp. The sequence is the library's
//! (`tally_cli::collnet_driver::CollNet`, which `bench allreduce --mode
//! agg-plugin` drives too); the checks between its steps are this test's.
//!
//! The servers are separate processes: shm endpoints of one process map
//! each other's memory, and a server in the test process would tear that
//! down under its clients. The plugin library and the `tally` binary must
//! have been built in the same profile (`cargo build -p tally-nccl-plugin
//! -p tally-cli`, or the workspace).
mod collnet_legacy;
mod collnet_threads;
mod support;

use collnet_threads::{until_accepted, HandleBoard};
use std::ffi::{c_int, c_void, CStr};
use std::time::{Duration, Instant};
use support::abi::*;
use support::*;
use tally_cli::collnet_driver::{self, abi::CollNetV11 as CollNetV11Lib, CollNet};
use tally_e2e::ServerProcess;

const TIMEOUT: Duration = Duration::from_secs(60);

/// One all-reduce case: NCCL type and op codes, elements.
#[derive(Clone, Copy, Debug)]
struct Case {
    dtype: c_int,
    op: c_int,
    count: usize,
}

const F32: c_int = 7;
const SUM: c_int = 0;

fn cases() -> Vec<Case> {
    let mut v: Vec<Case> = [0usize, 1, 1000, 65536 + 3, 4 << 20].iter().map(|&count| Case { dtype: F32, op: SUM, count }).collect();
    v.extend([
        Case { dtype: 2, op: 2, count: 100_003 }, // i32 max
        Case { dtype: 8, op: 1, count: 50_001 },  // f64 prod
        Case { dtype: 9, op: 0, count: 300_007 }, // bf16 sum
        Case { dtype: 0, op: 3, count: 77_777 },  // i8 min
        Case { dtype: 7, op: 4, count: 200_000 }, // f32 avg
        Case { dtype: 5, op: 0, count: 10_000 },  // u64 sum
    ]);
    v
}

fn elem_size(dtype: c_int) -> usize {
    match dtype {
        0 | 1 => 1,
        6 | 9 => 2,
        2 | 3 | 7 => 4,
        _ => 8,
    }
}

/// Rank r's input element i: small integers, so every result is exact.
fn input(case: Case, r: usize, i: usize) -> i64 {
    match case.op {
        1 => 1 + ((i + r) % 2) as i64,          // prod: 1 or 2
        3 => (i % 50) as i64 - (r as i64) * 3,  // min: may go negative
        _ => ((i * 7 + r * 3) % 13) as i64 + 1, // sum, max, avg
    }
}

fn expected(case: Case, n: usize, i: usize) -> f64 {
    let vals = (0..n).map(|r| input(case, r, i));
    match case.op {
        0 => vals.sum::<i64>() as f64,
        1 => vals.product::<i64>() as f64,
        2 => vals.max().unwrap() as f64,
        3 => vals.min().unwrap() as f64,
        _ => vals.sum::<i64>() as f64 / n as f64,
    }
}

fn encode(dtype: c_int, v: f64, out: &mut [u8]) {
    match dtype {
        0 => out[0] = (v as i8) as u8,
        1 => out[0] = v as u8,
        2 => out.copy_from_slice(&(v as i32).to_le_bytes()),
        3 => out.copy_from_slice(&(v as u32).to_le_bytes()),
        4 => out.copy_from_slice(&(v as i64).to_le_bytes()),
        5 => out.copy_from_slice(&(v as u64).to_le_bytes()),
        7 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        8 => out.copy_from_slice(&v.to_le_bytes()),
        // bf16: the top half of an f32 (exact for these small integers).
        9 => out.copy_from_slice(&(((v as f32).to_bits() >> 16) as u16).to_le_bytes()),
        _ => unreachable!("fp16 is not used here"),
    }
}

fn buffer(case: Case, r: usize) -> Vec<u8> {
    let es = elem_size(case.dtype);
    let mut b = vec![0u8; case.count * es];
    for i in 0..case.count {
        encode(case.dtype, input(case, r, i) as f64, &mut b[i * es..(i + 1) * es]);
    }
    b
}

fn check_result(case: Case, n: usize, got: &[u8], what: &str) {
    let es = elem_size(case.dtype);
    let mut want = vec![0u8; es];
    for i in 0..case.count {
        encode(case.dtype, expected(case, n, i), &mut want);
        assert_eq!(&got[i * es..(i + 1) * es], &want[..], "{what}: element {i} of {case:?}");
    }
}

fn rank_main(p: &Plugin, coll: &'static CollNetV11Lib, r: usize, n: usize, board: &HandleBoard, net_name: &str) {
    let t = p.coll11;
    let mut c = CollNet::init(coll, 0xc011_0000 + r as u64, logger()).unwrap();
    assert_eq!(c.devices().unwrap(), 1, "one CollNet device when TALLY_SERVERS is set");
    // SAFETY: valid out-pointers to plain C structs, for which all zeroes is valid.
    unsafe {
        let mut props: NetPropertiesV11 = std::mem::zeroed();
        assert_eq!((t.get_properties)(0, &mut props), NCCL_SUCCESS);
        assert_eq!(CStr::from_ptr(props.name).to_str().unwrap(), net_name, "CollNet rides on the net device");
        assert!(props.max_coll_bytes > 0 && props.max_coll_bytes <= NCCL_MAX_NET_SIZE_BYTES);
        let mut v12: NetPropertiesV12 = std::mem::zeroed();
        assert_eq!((p.coll12.get_properties)(0, &mut v12), NCCL_SUCCESS);
        assert_eq!((v12.name, v12.pci_path, v12.rail_id), (props.name, props.pci_path, NCCL_NET_ID_UNDEF));
    }
    // listen, exchange every rank's handle, connect (collective, blocking)
    c.connect(r, n, |h| Ok(board.allgather(r, h))).unwrap_or_else(|e| panic!("rank {r}: {e}"));
    assert!(!c.comm().is_null());
    let comm = c.comm();

    // Every case in flight at once (all ranks issue them in the same order).
    let cases = cases();
    let sends: Vec<Vec<u8>> = cases.iter().map(|&c| buffer(c, r)).collect();
    let mut recvs: Vec<Vec<u8>> = cases.iter().map(|c| vec![0xeeu8; c.count * elem_size(c.dtype)]).collect();
    let mhs: Vec<_> = sends
        .iter()
        .zip(recvs.iter_mut())
        .map(|(s, rv)| (c.reg_mr(s.as_ptr(), s.len()).unwrap(), c.reg_mr(rv.as_ptr(), rv.len()).unwrap()))
        .collect();
    // SAFETY: a CUDA registration is refused.
    assert_eq!(unsafe { (t.reg_mr)(comm, recvs[0].as_mut_ptr().cast(), 4, NCCL_PTR_CUDA, &mut null(),) }, NCCL_INVALID_ARGUMENT);
    // The live comm and a memory handle where another kind belongs
    // (ffi-plugin/src/handed.rs): refused, and nothing freed or changed, as
    // the rounds below and the close show.
    // SAFETY: every call is refused by the kind check before anything is used.
    unsafe {
        let (mut req, mut done, mut size) = (null(), 0 as c_int, 0 as c_int);
        let s = sends[0].as_ptr() as *mut c_void;
        assert_eq!((p.net11.isend)(comm, s, 4, 0, null(), null(), &mut req), NCCL_INVALID_ARGUMENT, "ncclNet isend on a CollNet comm");
        assert_eq!((p.net11.close_send)(comm), NCCL_INVALID_ARGUMENT, "ncclNet closeSend of a CollNet comm");
        assert_eq!((t.test)(comm, &mut done, &mut size), NCCL_INVALID_ARGUMENT, "test of a comm");
        assert_eq!((t.close_listen)(comm), NCCL_INVALID_ARGUMENT, "closeListen of a comm");
        assert_eq!(
            (t.iallreduce)(mhs[0].0, s, s, 1, F32, SUM, null(), null(), &mut req),
            NCCL_INVALID_ARGUMENT,
            "iallreduce on a memory handle"
        );
    }
    assert!(logged("sendComm is a CollNet comm, not a ncclNet send or receive comm"), "the refusal names both kinds");
    let t0 = Instant::now();
    // test() with a size pointer for even requests, NULL for odd ones (NCCL passes either).
    let expect: Vec<Option<usize>> = cases.iter().enumerate().map(|(k, c)| (k % 2 == 0).then_some(c.count * elem_size(c.dtype))).collect();
    for round in 0..2 {
        let mut reqs = vec![None; cases.len()];
        for (k, case) in cases.iter().enumerate() {
            // SAFETY: both buffers hold count elements and stay valid until the request completes.
            reqs[k] = Some(
                until_accepted(t0 + TIMEOUT, || unsafe {
                    c.post(sends[k].as_ptr(), recvs[k].as_mut_ptr(), case.count, case.dtype, case.op, mhs[k].0, mhs[k].1)
                })
                .unwrap_or_else(|e| panic!("iallreduce {case:?}: {e}")),
            );
        }
        c.wait_all(&mut reqs, &expect, t0 + TIMEOUT).unwrap_or_else(|e| panic!("rank {r}: {e}"));
        for (k, &case) in cases.iter().enumerate() {
            check_result(case, n, &recvs[k], &format!("rank {r} round {round}"));
            recvs[k].fill(0xee);
        }
    }
    // Bad arguments on a live comm.
    let mut req = null();
    // SAFETY: every call is refused before any buffer is touched.
    unsafe {
        let (s, d) = (sends[2].as_ptr() as *mut c_void, recvs[2].as_mut_ptr().cast::<c_void>());
        assert_eq!((t.iallreduce)(comm, s, d, 4, 10, SUM, null(), null(), &mut req), NCCL_INVALID_ARGUMENT, "fp8 e4m3");
        assert_eq!((t.iallreduce)(comm, s, d, 4, -1, SUM, null(), null(), &mut req), NCCL_INVALID_ARGUMENT, "unknown type");
        assert_eq!((t.iallreduce)(comm, s, d, 4, F32, 5, null(), null(), &mut req), NCCL_INVALID_ARGUMENT, "unknown op");
        assert_eq!((t.iallreduce)(comm, s, d, usize::MAX / 2, F32, SUM, null(), null(), &mut req), NCCL_INVALID_ARGUMENT, "oversize");
        assert_eq!((t.iallreduce)(comm, null(), d, 4, F32, SUM, null(), null(), &mut req), NCCL_INVALID_ARGUMENT, "NULL send buffer");
        assert_eq!((t.iallreduce)(comm, s, d, 4, F32, SUM, null(), null(), std::ptr::null_mut()), NCCL_INVALID_ARGUMENT, "NULL request");
        assert_eq!((t.iflush)(comm, d, 16, mhs[2].1, &mut req), NCCL_SUCCESS);
        assert!(req.is_null(), "host memory needs no flush");
    }
    eprintln!("rank {r}/{n}: {} all-reduces x 2 rounds in {:?}", cases.len(), t0.elapsed());
    board.barrier.wait();
    // deregMr of every buffer, closeColl, finalize: each must succeed.
    c.close().unwrap();
    board.barrier.wait();
}

fn run_job(p: &Plugin, n: usize, net_name: &str) {
    let coll = collnet_driver::load(&p.path).unwrap().coll;
    let board = HandleBoard::new(n);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let board = &board;
                s.spawn(move || rank_main(p, coll, r, n, board, net_name))
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
}

fn suite(p: &Plugin, provider: &str) {
    // The plugin's CollNet clients use TALLY_PROVIDER, like the servers' --provider.
    std::env::set_var("TALLY_PROVIDER", provider);
    let common = ["--provider", provider, "--poll", "adaptive", "--slab-size", "64M", "--hugepages", "off"];
    let one = ServerProcess::start(&[&["--lcores", "0-1"][..], &common].concat());
    let two = ServerProcess::start(&[&["--lcores", "1"][..], &common].concat());

    // As in a real job, TALLY_SERVERS is set before the plugin's first init
    // (which then leaves libfabric's rxm settings alone, as the servers have them).
    std::env::set_var("TALLY_SERVERS", &one.addr);
    // The net side provides the device CollNet reports on.
    let mut net_ctx = null();
    let mut cfg = NetCommConfig { traffic_class: -1 };
    // SAFETY: valid out-pointers.
    assert_eq!(unsafe { (p.net11.init)(&mut net_ctx, 1, &mut cfg, logger(), null()) }, NCCL_SUCCESS);
    // SAFETY: a plain C struct of integers and pointers, for which all zeroes is valid.
    let mut props: NetPropertiesV11 = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { (p.net11.get_properties)(0, &mut props) }, NCCL_SUCCESS);
    // SAFETY: a static C string of the plugin.
    let net_name = unsafe { CStr::from_ptr(props.name) }.to_str().unwrap().to_string();

    std::env::set_var("TALLY_SERVERS", &one.addr);
    let t0 = Instant::now();
    run_job(p, 2, &net_name);
    eprintln!("{provider}: 2 ranks, 1 server x 2 lcores: {:?}", t0.elapsed());
    std::env::set_var("TALLY_SERVERS", format!("{},{}", one.addr, two.addr));
    let t0 = Instant::now();
    run_job(p, 4, &net_name);
    eprintln!("{provider}: 4 ranks, 2 servers: {:?}", t0.elapsed());
    if provider == "tcp" {
        // NCCL 2.19-2.27's tables, 2 ranks over the same two servers.
        collnet_legacy::jobs(p, 2, &net_name);
        // The plugin's clients with four rails over two servers of two
        // lcores, as the default is on a many-core worker: each server on
        // two lanes, each lcore a rail of its own; rail 0 driven by the
        // caller's thread (the plugin's default, TALLY_CALLER_RAIL), the
        // others by a thread each. On 2 cores the default is one rail.
        // TALLY_PIECE_TIMES: each rank's client times its pieces and the
        // rails' copies of staged results, and the plugin logs them at close.
        std::env::set_var("TALLY_RAILS", "4");
        std::env::set_var("TALLY_PIECE_TIMES", "1");
        let t0 = Instant::now();
        run_job(p, 4, &net_name);
        eprintln!("{provider}: 4 ranks, 2 servers, 4 rails (lanes): {:?}", t0.elapsed());
        std::env::remove_var("TALLY_PIECE_TIMES");
        std::env::remove_var("TALLY_RAILS");
        assert!(logged("piece round trips (1 in 16 timed, "), "the plugin logs its clients' piece times at close");
        assert!(!logged("timed, 0 pieces"), "every client timed some pieces");
        assert!(!logged("; 0 staged results copied out"), "failover staged and the rails copied out");
        assert!(logged(" by the caller's thread)"), "the caller's thread copied what rail 0 received");
        // Every rail a thread (TALLY_CALLER_RAIL=0), and the copier
        // (TALLY_COPIER=1): it makes every copy.
        std::env::set_var("TALLY_RAILS", "4");
        std::env::set_var("TALLY_PIECE_TIMES", "1");
        std::env::set_var("TALLY_COPIER", "1");
        std::env::set_var("TALLY_CALLER_RAIL", "0");
        let t0 = Instant::now();
        run_job(p, 4, &net_name);
        eprintln!("{provider}: 4 ranks, 2 servers, 4 rails and the copier: {:?}", t0.elapsed());
        for v in ["TALLY_COPIER", "TALLY_PIECE_TIMES", "TALLY_RAILS", "TALLY_CALLER_RAIL"] {
            std::env::remove_var(v);
        }
        assert!(logged(" by the copier), "), "the plugin's clients ran the copier");
        assert!(!logged("(0 by the copier)"), "the copier made copies in every client");
    }
    std::env::remove_var("TALLY_SERVERS");
    // SAFETY: the net context from above.
    assert_eq!(unsafe { (p.net11.finalize)(net_ctx) }, NCCL_SUCCESS);
    one.stop();
    two.stop();
}

#[test]
fn collnet_allreduce_through_tally_servers() {
    let p = load();
    // No servers, no CollNet device: NCCL carries on without CollNet.
    std::env::remove_var("TALLY_SERVERS");
    let mut ndev: c_int = -1;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { (p.coll11.devices)(&mut ndev) }, NCCL_SUCCESS);
    assert_eq!(ndev, 0);
    suite(&p, "tcp");
    // Over tcp the plugin's own pacing (ffi-plugin tcp_defaults), as its
    // join line says: pieces of the eager limit tally sets (128 KiB on
    // libfabric 1.17, 32 KiB from 1.18), at most 32 KiB on a host of fewer
    // than 8 cores (FEW_CORES), a window of 16 (no TALLY_LINK_GBITS here to
    // make it fewer: collnet::tcp_window), sends unpaced.
    let eager = if tally_engine::dataplane::fabric::library_version() >= (1, 18) { 32768 } else { 131072 };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let piece = if cores >= 8 { eager } else { eager.min(32768) };
    assert!(
        logged(&format!("pieces of at most {piece} bytes, window 16, sends as the window allows")),
        "the tcp defaults are what the plugin's clients run"
    );
    suite(&p, "shm");
    assert!(logged("joined job"), "connect logs the job it joined");
}

/// `tally bench allreduce --mode agg-plugin`: rank processes that load the
/// shipped library and drive its ncclCollNet as NCCL does, against the
/// in-process server the launcher starts; every element checked by the ranks.
#[test]
fn bench_allreduce_drives_the_plugin_like_nccl() {
    let lib = support::shipped_library();
    for provider in ["tcp", "shm"] {
        let out = std::process::Command::new(tally_e2e::tally_bin())
            .args(["bench", "allreduce", "--mode", "agg-plugin,agg", "--ranks", "3", "--provider", provider])
            .args(["--sizes", "4K,100K,3M", "--iters", "4", "--warmup", "1", "--plugin-piece", "1M", "--window", "8", "--json"])
            .arg("--plugin")
            .arg(&lib)
            .env("TALLY_LOG", "warn")
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{provider}: {stdout}\n{stderr}");
        let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("JSON");
        let rows = v["results"].as_array().unwrap();
        assert_eq!(rows.len(), 6, "{v}");
        for r in rows {
            assert_eq!(r["wrong"], 0, "{provider}: {r}");
        }
        assert!(rows.iter().any(|r| r["mode"] == "agg-plugin"), "{v}");
    }
}
