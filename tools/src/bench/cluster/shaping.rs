//! The links' rate and shape: the default rate this machine's cores carry,
//! tbf on both ends of every link, and the chunk and bucket sizes that
//! follow from the rate.
use super::args::ClusterArgs;
use super::netns::Iproute;

/// The rate (Gbit/s) used when none is given: the highest that this
/// machine's cores carry with both agg and ring link-bound (tcp;ofi_rxm
/// copies, adaptive pollers and the bridge all on them), 2 Gbit/s per core
/// per host, rounded down to a power of two. Measured, 4 + 4 hosts, 16 and
/// 64 MiB: 2 cores: agg 0.98-0.99 and ring 0.99 of their bounds at
/// 1 Gbit/s, agg 0.93 at 2, agg 0.47-0.53 at 4 (the ring still 0.99: the
/// servers' lcores ran out of CPU); 16 cores: both 0.99 at 8 Gbit/s with
/// 4 + 4 hosts and at 4 with 8 + 8, both CPU-bound at 16.
///
/// At most [`MAX_DEFAULT_RATE`], the highest rate measured with both at the
/// link: on 64 cores (device, 4 + 4 hosts, rails) agg reached 0.97-1.00 at
/// 16 Gbit/s, while at 32 it reached 0.6-0.96 with failover's staging and the
/// ring 0.3-0.5 (why is not shown).
pub fn default_rate(hosts: u32, cores: usize) -> f64 {
    let r = 2.0 * cores as f64 / hosts as f64;
    2f64.powi(r.log2().floor() as i32).clamp(0.0625, MAX_DEFAULT_RATE)
}

/// The highest rate [`default_rate`] picks (Gbit/s).
pub const MAX_DEFAULT_RATE: f64 = 16.0;

/// tbf at `rate` on both ends of every host's link.
pub(super) fn shape(
    tools: &Iproute,
    hosts: &[(char, u32)],
    ns: &dyn Fn(char, u32) -> String,
    sw: &str,
    rate: f64,
    args: &ClusterArgs,
) -> Result<(), String> {
    let mbit = format!("{}mbit", (rate * 1000.0).round() as u64);
    let burst = if args.tbf_burst == "auto" { format!("{}b", tbf_auto_burst(rate)) } else { args.tbf_burst.clone() };
    let tbf = ["root", "tbf", "rate", &mbit, "burst", &burst, "latency", &args.tbf_latency];
    for &(k, i) in hosts {
        let mut a = vec!["qdisc", "replace", "dev", "eth0"];
        a.extend_from_slice(&tbf);
        tools.tc_in(&ns(k, i), &a)?;
        let port = format!("{k}{i}p{}", std::process::id() % 100_000);
        let mut a = vec!["qdisc", "replace", "dev", &port];
        a.extend_from_slice(&tbf);
        tools.tc_in(sw, &a)?;
    }
    Ok(())
}

/// `--chunk auto`: 32 KiB up to 4 Gbit/s, 128 KiB (rxm's eager limit
/// on libfabric 1.17, fabric::defaults) up to 16, then 16 KiB per Gbit/s
/// (512 KiB at 32), at most 1 MiB.
///
/// Each piece costs the sender and the receiver system calls and wake-ups
/// whatever its size, so up to the eager limit larger ones cost less CPU
/// per byte: on 16 cores (nvidia-h200, 4 + 4 hosts, 64 MiB, adaptive) the
/// servers spent 1.05 CPU s/GB of input with 32 KiB at 8 Gbit/s, 0.85 with
/// 64 KiB, 0.78 with 128 KiB and 0.87 with 256 KiB (a rendezvous each), all
/// at 0.98-0.99 of the bound (the kernel's TCP alone: 0.60); at 16 Gbit/s,
/// two runs, 128 KiB reached 0.74-0.81 at 0.60-0.70 s/GB, 256 KiB 0.65-0.76
/// at 0.78-0.83 (earlier, 32 KiB 0.50). At 2 and 4 Gbit/s (busy polling
/// there) 32 KiB gave 0.99, 128 KiB 0.96-0.98: the links' tbf bucket (2 ms
/// of the rate, at least 64 KiB) holds few 128 KiB messages; and on the
/// 2-core machine 128 KiB pieces at 0.25 Gbit/s cost twice the CPU per
/// byte of 32 KiB ones (the plugin's, `collnet::FEW_CORES`).
pub fn auto_chunk(rate_gbit: f64) -> u64 {
    if rate_gbit <= 4.0 {
        return 32 << 10;
    }
    if rate_gbit <= 16.0 {
        return 128 << 10;
    }
    let want = rate_gbit * 16.0 * 1024.0;
    (2f64.powi(want.log2().round() as i32) as u64).clamp(128 << 10, 1 << 20)
}

pub(super) fn chunk_for(args: &ClusterArgs, rate: f64) -> String {
    if args.chunk == "auto" {
        auto_chunk(rate).to_string()
    } else {
        args.chunk.clone()
    }
}

/// tbf's bucket in bytes for `--tbf-burst auto`: 2 ms at the link rate, at least 64 KiB.
pub fn tbf_auto_burst(rate_gbit: f64) -> u64 {
    ((rate_gbit * 1e9 / 8.0 * 0.002) as u64).max(64 << 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_rate_scales_with_cores_per_host_pair() {
        assert_eq!(default_rate(4, 2), 1.0);
        assert_eq!(default_rate(4, 16), 8.0);
        assert_eq!(default_rate(8, 16), 4.0);
        assert_eq!(default_rate(4, 3), 1.0);
        assert_eq!(default_rate(64, 1), 0.0625);
        // 64 cores would say 32: capped at the highest rate measured link-bound.
        assert_eq!(default_rate(4, 64), MAX_DEFAULT_RATE);
    }

    #[test]
    fn auto_chunk_follows_the_link_rate() {
        assert_eq!(auto_chunk(0.25), 32 << 10);
        assert_eq!(auto_chunk(2.0), 32 << 10);
        assert_eq!(auto_chunk(4.0), 32 << 10);
        assert_eq!(auto_chunk(8.0), 128 << 10);
        assert_eq!(auto_chunk(16.0), 128 << 10);
        assert_eq!(auto_chunk(32.0), 512 << 10);
        assert_eq!(auto_chunk(200.0), 1 << 20);
    }
}
