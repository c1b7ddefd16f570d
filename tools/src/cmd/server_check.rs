//! `tally server --check`: what a start would refuse, found without starting.
//!
//! Prints the resolved configuration, then checks what the start itself
//! would meet: the lcores exist and are inside this process's affinity mask,
//! the fabric provider is known and present (fi_getinfo), the hugepage pool
//! can hold the slabs (when hugepages are required), the control and metrics
//! ports are free, the token (`token_file`, else `TALLY_TOKEN`) reads. Each
//! failure names what a start would fail on.
use crate::host::doctor::checks::{self, Target};
use crate::host::doctor::facts;
use tally_engine::host::config::ServerConfig;

/// Checks `cfg` against this host; Ok prints what was checked, Err names
/// every reason a start would fail (exit status 1).
pub fn run(cfg: &ServerConfig) -> Result<(), String> {
    let mut refusals: Vec<String> = Vec::new();
    let target = Target { config: cfg.clone() };
    let facts = facts::gather(&cfg.lcores);
    for c in checks::start_blockers(&target, &facts) {
        refusals.push(match c.fix {
            Some(fix) => format!("{}: {} (fix: {fix})", c.name, c.detail),
            None => format!("{}: {}", c.name, c.detail),
        });
    }
    // The start's own reader, so that the two cannot disagree on a token.
    let has_token = match tally_engine::control::token::load(cfg) {
        Ok(t) => t.is_some(),
        Err(e) => {
            refusals.push(format!("token: {e}"));
            false
        }
    };
    refusals.extend(port_in_use("listen", &cfg.listen));
    if let Some(m) = &cfg.metrics {
        refusals.extend(port_in_use("metrics", m));
    }
    if !refusals.is_empty() {
        return Err(format!("a start would fail:\n  {}", refusals.join("\n  ")));
    }
    println!(
        "configuration ok: listen {}, lcores {} ({}), provider {}, {} polling, hugepages {}, slab {} per lcore, up to {} jobs x {} ranks",
        cfg.listen,
        cfg.lcores,
        cfg.lcores.len(),
        cfg.provider.as_deref().unwrap_or("auto"),
        cfg.poll,
        cfg.hugepages,
        tally_engine::host::units::format_size(cfg.slab_size),
        cfg.max_jobs,
        cfg.max_ranks
    );
    match cfg.stage_buffers {
        0 => println!("staged receives: off (a job whose pieces do not fit its slab share gets smaller pieces)"),
        b => {
            println!("staged receives: a job whose pieces do not fit its slab share is received {b} ranks a slot at a time (not over shm)")
        }
    }
    if cfg.latency_lcores > 0 {
        println!(
            "latency lcores: the first {} take operations of at most {}, the other {} the larger ones",
            cfg.latency_lcores,
            tally_engine::host::units::format_size(cfg.latency_max),
            cfg.lcores.len() - cfg.latency_lcores as usize
        );
    }
    println!(
        "checked on this host: lcores inside the affinity mask, provider {} present, hugepages {}, ports free, {}",
        cfg.provider.as_deref().map_or("(auto: one at least)".to_string(), tally_engine::dataplane::fabric::canonical_provider),
        if cfg.hugepages == "require" { "enough for the slabs" } else { "not required" },
        match (has_token, &cfg.token_file) {
            (true, Some(path)) => format!("token read from {path}"),
            (true, None) => "token read from TALLY_TOKEN".to_string(),
            (false, _) => "no token (the server will admit any client that reaches it, and warn)".to_string(),
        }
    );
    Ok(())
}

/// Why `addr` (`what`: listen or metrics) cannot be bound, if it cannot.
/// Port 0 (any free port) always can.
fn port_in_use(what: &str, addr: &str) -> Option<String> {
    let sa: std::net::SocketAddr = match std::net::ToSocketAddrs::to_socket_addrs(addr).map(|mut a| a.next()) {
        Ok(Some(sa)) => sa,
        Ok(None) => return Some(format!("{what}: {addr} resolves to no address")),
        Err(e) => return Some(format!("{what}: {addr}: {e}")),
    };
    if sa.port() == 0 {
        return None;
    }
    match std::net::TcpListener::bind(sa) {
        Ok(_) => None,
        Err(e) => Some(format!("{what}: cannot bind {addr}: {e}")),
    }
}
