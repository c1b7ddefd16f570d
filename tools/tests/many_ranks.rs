//! Jobs of hundreds of ranks against a real `tally server` process, over
//! tcp on loopback (shm 1.17 reaches at most 256 peers per endpoint): the
//! ranks join at once and every element of every all-reduce is right; a job
//! whose region would not fit the server's slab budget at the piece it asks
//! for gets smaller pieces (`server::budget`), and one that cannot fit even
//! at the smallest piece is refused with the rank count and window that
//! would fit.
//!
//! The ranks are `tally bench allreduce` processes of 64 rank threads each,
//! every thread with its own client and endpoint (the load generator the
//! issue asks for), which checks every element and reports wrong ones in
//! its JSON.
mod common;
use common::{bench, ServerProcess};
use std::time::Duration;
use tally_engine::client::{Client, ClientError};
use tally_engine::reduce::{DataType, ReduceOp};

fn server(slab: &str) -> ServerProcess {
    ServerProcess::start(&["--lcores", "0-1", "--provider", "tcp", "--poll", "adaptive", "--slab-size", slab])
}

#[test]
fn five_hundred_twelve_ranks_join_at_once_and_every_element_is_right() {
    // 512 ranks x window 4 x 4 KiB = 8 MiB: a quarter of the slab, as asked.
    let srv = server("32M");
    let rows = bench(&srv.addr, &["--ranks", "512", "--sizes", "4K,64K", "--chunk", "4K", "--iters", "5", "--warmup", "1"]);
    assert_eq!(rows.len(), 2);
    assert!(srv.log_contains("512 ranks, f32 sum, 1024 elements per piece, window 4"), "{:?}", srv.log.lock().unwrap());
    assert!(srv.stop().success());
}

#[test]
fn a_thousand_ranks_asking_for_large_pieces_get_pieces_that_fit() {
    // 1024 ranks x window 2 x 1 MiB = 2 GiB per lcore asked; a quarter of a
    // 64 MiB slab is 16 MiB: 8 KiB pieces, so a 64 KiB all-reduce is cut
    // into 8 chunks over both lcores. (Window 2: 2048 receives per lcore,
    // what tcp;ofi_rxm queues; more are retried until some complete, which
    // works but slowly.)
    let srv = server("64M");
    let rows =
        bench(&srv.addr, &["--ranks", "1024", "--sizes", "4K,64K", "--chunk", "1M", "--window", "2", "--iters", "3", "--warmup", "1"]);
    assert_eq!(rows.len(), 2);
    assert!(
        srv.log_contains("1024 ranks, f32 sum, 2048 elements per piece (asked 262144"),
        "the piece was not adapted: {:?}",
        srv.log.lock().unwrap().iter().filter(|l| l.contains("starting")).collect::<Vec<_>>()
    );
    assert!(srv.stop().success());
}

/// `n` rank threads of one job asking for `window` and 256 KiB pieces; each
/// returns its join's error, or checks one all-reduce of 64 KiB.
fn job(addr: &str, id: u64, n: u32, window: u32) -> Vec<Result<(), ClientError>> {
    let hs: Vec<_> = (0..n)
        .map(|rank| {
            let mut cfg = common::client("tcp", addr, id, rank, n);
            cfg.chunk_bytes = 256 << 10;
            cfg.window = window;
            std::thread::spawn(move || -> Result<(), ClientError> {
                let mut c = Client::connect(cfg)?;
                c.join(DataType::Float32, ReduceOp::Sum)?;
                let send: Vec<f32> = (0..16384).map(|i| (rank as usize + i % 13) as f32).collect();
                let mut out = vec![0f32; send.len()];
                c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum)?;
                for (i, v) in out.iter().enumerate() {
                    let want: f32 = (0..n).map(|r| (r as usize + i % 13) as f32).sum();
                    assert_eq!(*v, want, "rank {rank} element {i}");
                }
                Ok(())
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

#[test]
fn a_job_that_cannot_fit_even_at_the_smallest_piece_is_told_what_would() {
    // A quarter of 1 MiB: 256 KiB a job. 8 ranks x window 16 x 4 KiB = 512 KiB.
    let srv = server("1M");
    for r in job(&srv.addr, 0x1f17, 8, 16) {
        let e = r.expect_err("admitted a job that cannot fit");
        let text = e.to_string();
        assert!(
            text.contains("no capacity")
                && text.contains("window 16 x 8 ranks x 4 KiB piece = 512 KiB per lcore")
                && text.contains("at most 4 ranks fit at window 16, or window 8 at 8 ranks"),
            "{text}"
        );
    }
    // What it named fits: 4 ranks at window 16 run, with 4 KiB pieces instead of 256 KiB.
    for r in job(&srv.addr, 0x1f18, 4, 16) {
        r.expect("the job the refusal said would fit");
    }
    assert!(srv.wait_log("4 ranks, f32 sum, 1024 elements per piece (asked 65536", Duration::from_secs(5)));
    assert!(srv.stop().success());
}
