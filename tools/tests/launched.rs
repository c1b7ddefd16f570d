//! `tally bench allreduce --launched`: one rank of a job another launcher
//! started, as srun and torchrun start them (tests/slurm/run.sh runs it as
//! the training command of config/slurm/tally-train.sbatch under a real
//! Slurm). Here the launcher is this test: N processes, each given only a
//! launcher's variables, against two real servers over tcp. Every rank must
//! print its line with every all-reduce checked and 0 wrong, and exit 0; a
//! launch missing a variable must fail at once, naming it.
use std::process::{Command, Output, Stdio};
use tally_e2e::{show_output, ServerProcess};

const TOKEN: &str = "launched-test-token";

/// A port no one listens on now, for rank 0's bootstrap.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `tally bench allreduce --launched` with `args`, the launcher's variables
/// `env`, and nothing of this process's environment that a launcher sets.
fn rank_command(args: &[&str], env: &[(&str, String)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tally"));
    c.args(["bench", "allreduce", "--launched"]).args(args);
    for var in ["RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT", "TALLY_SERVERS"] {
        c.env_remove(var);
    }
    c.env("TALLY_TOKEN", TOKEN);
    c.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

#[test]
fn ranks_a_launcher_started_all_reduce_through_the_servers_every_element_checked() {
    let env = [("TALLY_TOKEN", TOKEN)];
    let a = ServerProcess::start_with("127.0.0.1:0", &["--lcores", "0", "--provider", "tcp", "--poll", "adaptive"], &env);
    let b = ServerProcess::start_with("127.0.0.1:0", &["--lcores", "1", "--provider", "tcp", "--poll", "adaptive"], &env);
    let servers = format!("{},{}", a.addr, b.addr);
    let port = free_port().to_string();
    let n = 4u32;
    let args = ["--mode", "agg", "--provider", "tcp", "--sizes", "4K,96K", "--iters", "5", "--warmup", "1", "--poll", "adaptive"];
    let ranks: Vec<_> = (0..n)
        .map(|r| {
            let mut env = vec![("MASTER_ADDR", "127.0.0.1".to_string()), ("MASTER_PORT", port.clone())];
            // torchrun's variables for the first half, srun's for the rest.
            if r < n / 2 {
                env.extend([("RANK", r.to_string()), ("WORLD_SIZE", n.to_string())]);
            } else {
                env.extend([("SLURM_PROCID", r.to_string()), ("SLURM_NTASKS", n.to_string())]);
            }
            // Servers from TALLY_SERVERS, but for one rank from --servers.
            let mut c = if r == 1 {
                rank_command(&[&args[..], &["--servers", &servers]].concat(), &env)
            } else {
                env.push(("TALLY_SERVERS", servers.clone()));
                rank_command(&args, &env)
            };
            c.spawn().unwrap()
        })
        .collect();
    let outs: Vec<Output> = ranks.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    for (r, o) in outs.iter().enumerate() {
        let text = show_output(o);
        assert!(o.status.success(), "rank {r}:\n{text}");
        let stdout = String::from_utf8_lossy(&o.stdout);
        let line = stdout.lines().find(|l| l.starts_with("tally bench allreduce: rank ")).unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        assert!(line.starts_with(&format!("tally bench allreduce: rank {r} of {n} on ")), "{line}");
        // Per size: at least the warm-up and the 5 timed ones, each checked.
        let count: u64 = line.split(": ").nth(2).and_then(|s| s.split(' ').next()).and_then(|s| s.parse().ok()).unwrap();
        assert!(count >= 2 * 6, "{line}");
        assert!(line.contains(" through 2 servers, ") && line.ends_with(" 0 wrong (job: 0 wrong)"), "{line}");
        // Elements: every one of every all-reduce (f32: 4K is 1024, 96K 24576).
        assert!(line.contains(" elements checked, "), "{line}");
        if r == 0 {
            // Rank 0 prints the table: a row per size.
            assert_eq!(stdout.lines().filter(|l| l.trim_start().starts_with("agg ")).count(), 2, "{stdout}");
        } else {
            assert_eq!(stdout.lines().count(), 1, "rank {r} prints its line only:\n{stdout}");
        }
    }
    // Every rank ran the same all-reduces.
    let first = |o: &Output| String::from_utf8_lossy(&o.stdout).lines().last().unwrap().split(": ").nth(2).unwrap().to_string();
    assert!(outs.iter().all(|o| first(o) == first(&outs[0])), "{:?}", outs.iter().map(first).collect::<Vec<_>>());
    // Both servers served the job: their lcores' counts, logged as they stop
    // (read by a thread of the server's log: given a moment after the exit).
    for s in [a, b] {
        let log = s.log.clone();
        s.stop();
        let served = || {
            let log = log.lock().unwrap();
            log.iter().filter_map(|l| l.split("lcore 0: ").nth(1)).filter_map(|r| r.split(' ').next()?.parse::<u64>().ok()).next()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while served().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(served().is_some_and(|c| c > 0), "{:?}", log.lock().unwrap());
    }
}

/// Arguments, the launcher's variables, and what the error must say.
type Case<'a> = (&'a [&'a str], Vec<(&'a str, String)>, &'a str);

#[test]
fn a_launch_without_the_launchers_variables_fails_naming_them() {
    let base = [("MASTER_ADDR", "127.0.0.1".to_string()), ("TALLY_SERVERS", "127.0.0.1:1".to_string())];
    let cases: &[Case] = &[
        (&["--mode", "agg"], base.to_vec(), "no rank in the environment"),
        (&["--mode", "agg"], [&base[..], &[("RANK", "1".into())]].concat(), "RANK is set but WORLD_SIZE is not"),
        (
            &["--mode", "agg"],
            [&base[..], &[("SLURM_PROCID", "4".into()), ("SLURM_NTASKS", "4".into())]].concat(),
            "SLURM_PROCID=4 is not below SLURM_NTASKS=4",
        ),
        (&["--mode", "agg"], [&base[..], &[("RANK", "x".into()), ("WORLD_SIZE", "2".into())]].concat(), "RANK=\"x\" is not a number"),
        (
            &["--mode", "agg"],
            vec![("RANK", "0".into()), ("WORLD_SIZE", "2".into()), ("TALLY_SERVERS", "127.0.0.1:1".into())],
            "MASTER_ADDR is not set",
        ),
        (&["--mode", "agg"], vec![("RANK", "0".into()), ("WORLD_SIZE", "2".into()), ("MASTER_ADDR", "127.0.0.1".into())], "no servers"),
        (&[], [&base[..], &[("RANK", "0".into()), ("WORLD_SIZE", "2".into())]].concat(), "add --mode agg"),
        (&["--mode", "agg", "--rank", "0"], [&base[..], &[("RANK", "0".into()), ("WORLD_SIZE", "2".into())]].concat(), "not --rank"),
    ];
    for (args, env, want) in cases {
        let o = rank_command(args, env).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?} {env:?}:\n{}", show_output(&o));
        assert!(err.contains(want), "{args:?} {env:?}: wanted {want:?}:\n{}", show_output(&o));
    }
}
