//! A rank between all-reduces costs next to no CPU: its rail threads and
//! copier sleep once they are quiet (`client::rails::idle`), on the client's
//! bell alone when nothing is in flight, over tcp;ofi_rxm and over shm
//! (which, as efa, gives a rail no descriptor to sleep on); with rail 0 on
//! the caller's thread (the default) and with a thread for every rail. The
//! only test of its binary: it reads the whole process's CPU time.
use std::time::{Duration, Instant};
use tally_e2e::{client, join_all, ServerProcess};
use tally_engine::client::Client;
use tally_engine::reduce::{DataType, ReduceOp};

/// CPU seconds this process has used, every thread's.
fn cpu_seconds() -> f64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the live, zeroed value.
    let u = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr());
        u.assume_init()
    };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

#[test]
fn ranks_between_all_reduces_use_next_to_no_cpu() {
    for (provider, caller_rail) in [("tcp", true), ("tcp", false), ("shm", true)] {
        let args = |core| ["--lcores", core, "--provider", provider, "--poll", "adaptive", "--slab-size", "16M"];
        let servers = [ServerProcess::start(&args("0")), ServerProcess::start(&args("1"))];
        let n = 2;
        let (idle_for, ranks) = (Duration::from_secs(2), std::sync::Arc::new(std::sync::Barrier::new(n as usize + 1)));
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let mut cfg = client(provider, &servers[0].addr, 0x1d1e, rank, n);
                cfg.servers.push(servers[1].addr.clone());
                // Two rails per rank (rail 0 the caller's thread's, or a
                // thread each), spinning as long as by default before a sleep.
                cfg.rails = 2;
                cfg.caller_rail = caller_rail;
                cfg.spin_polls = 2048;
                cfg.rail_spin_polls = 2048;
                let ranks = ranks.clone();
                std::thread::spawn(move || -> Result<(), String> {
                    let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                    let send = vec![1f32; 1 << 16];
                    let mut out = vec![0f32; 1 << 16];
                    for step in 0..2 {
                        for _ in 0..5 {
                            c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum)
                                .map_err(|e| e.to_string())?;
                            if out.iter().any(|&v| v != n as f32) {
                                return Err(format!("rank {rank}: a wrong sum"));
                            }
                        }
                        // Between two steps: the main thread waits here while the rails idle.
                        if step == 0 {
                            ranks.wait();
                            ranks.wait();
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        ranks.wait();
        // Past the spin and the first sleeps.
        std::thread::sleep(Duration::from_millis(300));
        let (t0, c0) = (Instant::now(), cpu_seconds());
        std::thread::sleep(idle_for);
        let share = (cpu_seconds() - c0) / t0.elapsed().as_secs_f64() / n as f64;
        ranks.wait();
        join_all(hs);
        eprintln!(
            "IDLE {provider}: a rank (2 rails, caller's rail {caller_rail}) between all-reduces used {:.2}% of a core over {idle_for:?}",
            share * 100.0
        );
        assert!(share < 0.05, "{provider} (caller's rail {caller_rail}): {:.1}% of a core per idle rank", share * 100.0);
    }
}
