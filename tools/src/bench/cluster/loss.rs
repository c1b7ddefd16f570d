//! `--loss`: packets dropped at random on the emulated links, as a lossy
//! wire drops them, and how many were.
//!
//! A level is a percent of packets dropped on every link (`1`) or on one
//! host's link (`s1:1`, `w0:0.5`: hosts are named as their namespaces are).
//! tc's netem and gact are not built into the kernels this runs on; nftables
//! is (`numgen`), else iptables' `statistic` match: a random draw per
//! packet, at the RECEIVING host's input hook. Dropping at a sender's output
//! hook is not wire loss: the sending socket gets a local error and retries
//! on a timer instead of waiting for the receiver's duplicate ACKs.
//!
//! Every link at p: two independent rules at each receiver, one for the
//! sender's uplink and one for the receiver's downlink, each p. One host H at
//! p: at H one rule p (its downlink); at every other host one rule on
//! packets from H's address (its uplink).
//!
//! A veth passes GSO packets of up to 64 KiB, so one dropped "packet" would
//! be up to seven jumbo frames: with `--loss` every veth's `gso_max_size` is
//! the MTU (`netns::build_network`), for every row of the run, loss 0 too.
//!
//! Each namespace gets the rules as one nftables table (`tally_loss`),
//! replaced atomically at each level; its counters, read before the next
//! level replaces it, are what the rules dropped.
use super::netns::{find_tool, Iproute};
use std::path::{Path, PathBuf};

/// The nftables table holding the rules, in each host's namespace.
const TABLE: &str = "tally_loss";

/// Draws are out of a million: the finest level is 0.0001%.
const MILLION: u32 = 1_000_000;

/// One `--loss` level.
#[derive(Debug, Clone, PartialEq)]
pub struct LossLevel {
    /// Percent of packets dropped, 0 to 100.
    pub percent: f64,
    /// The host whose link drops them (`('s', 1)` for s1); None: every link.
    pub host: Option<(char, u32)>,
}

/// Parses one `--loss` level: `P` or `HOST:P` (HOST is s<i> or w<i>).
pub fn parse_loss(s: &str) -> Result<LossLevel, String> {
    let (host, p) = match s.split_once(':') {
        Some((h, p)) => (Some(parse_host(h).map_err(|e| format!("{s:?}: {e}"))?), p),
        None => (None, s),
    };
    let percent: f64 = p
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("{s:?} is not a percent (e.g. 0.1) or a host's link and a percent (e.g. s1:1, w0:0.5)"))?;
    if !(0.0..=100.0).contains(&percent) {
        return Err(format!("{s:?}: a loss is a percent from 0 to 100"));
    }
    if percent > 0.0 && per_million(percent) == 0 {
        return Err(format!("{s:?}: the finest loss is 0.0001%"));
    }
    Ok(LossLevel { percent, host })
}

/// `s<i>` or `w<i>`.
fn parse_host(h: &str) -> Result<(char, u32), String> {
    let mut c = h.chars();
    match (c.next(), c.as_str().parse::<u32>()) {
        (Some(k @ ('s' | 'w')), Ok(i)) if !c.as_str().starts_with('+') => Ok((k, i)),
        _ => Err(format!("unknown host {h:?} (hosts are s<i>, the servers', and w<i>, the workers', from 0)")),
    }
}

/// Packets per million a rule drops at `percent`.
fn per_million(percent: f64) -> u32 {
    (percent / 100.0 * f64::from(MILLION)).round() as u32
}

impl LossLevel {
    /// Refuses a host that `--hosts` does not make.
    pub fn check_hosts(&self, hosts: u32) -> Result<(), String> {
        match self.host {
            Some((k, i)) if i >= hosts => {
                Err(format!("--loss {}: there is no host {k}{i} (--hosts {hosts}: s0-s{n} and w0-w{n})", self.label(), n = hosts - 1))
            }
            _ => Ok(()),
        }
    }

    /// As the table's column and `--loss` say it: `0.1`, `s1:1`.
    pub fn label(&self) -> String {
        match self.host {
            Some((k, i)) => format!("{k}{i}:{}", self.percent),
            None => self.percent.to_string(),
        }
    }

    /// Which link the JSON rows say: `every`, or the host's name.
    pub fn link(&self) -> String {
        self.host.map_or_else(|| "every".into(), |(k, i)| format!("{k}{i}"))
    }

    /// As the headers say it.
    pub fn text(&self) -> String {
        match self.host {
            _ if self.percent == 0.0 => "none".into(),
            Some((k, i)) => format!("{}% on {k}{i}'s link (both ways)", self.percent),
            None => format!("{}% on every link (each way)", self.percent),
        }
    }

    /// The drop rules at host `at`, whose peers' addresses `addr` gives.
    pub fn rules_at(&self, at: (char, u32), addr: &dyn Fn(char, u32) -> String) -> Vec<Rule> {
        let n = per_million(self.percent);
        if n == 0 {
            return Vec::new();
        }
        match self.host {
            // The sender's uplink and this host's downlink, drawn apart.
            None => vec![Rule { from: None, per_million: n }, Rule { from: None, per_million: n }],
            Some(h) if h == at => vec![Rule { from: None, per_million: n }],
            Some((k, i)) => vec![Rule { from: Some(addr(k, i)), per_million: n }],
        }
    }
}

/// One drop rule at a receiving host: packets arriving on its link (from
/// one address, where `from` says), `per_million` of them at random.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub from: Option<String>,
    pub per_million: u32,
}

/// The nftables script that replaces a host's table with `rules` (with
/// none, removes it): the `table` line first, so that deleting works
/// whether or not one is there.
pub fn nft_script(rules: &[Rule]) -> String {
    let mut s = format!("table inet {TABLE}\ndelete table inet {TABLE}\n");
    if rules.is_empty() {
        return s;
    }
    s.push_str(&format!("table inet {TABLE} {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n"));
    for r in rules {
        let from = r.from.as_ref().map_or_else(String::new, |a| format!("ip saddr {a} "));
        s.push_str(&format!("    iifname \"eth0\" {from}numgen random mod {MILLION} < {} counter drop\n", r.per_million));
    }
    s.push_str("  }\n}\n");
    s
}

/// iptables' arguments appending `rule` to INPUT.
pub fn iptables_args(rule: &Rule) -> Vec<String> {
    let mut a: Vec<String> = ["-w", "-A", "INPUT", "-i", "eth0"].map(String::from).to_vec();
    if let Some(from) = &rule.from {
        a.extend(["-s".into(), from.clone()]);
    }
    let p = f64::from(rule.per_million) / f64::from(MILLION);
    a.extend(["-m", "statistic", "--mode", "random", "--probability", &format!("{p:.6}"), "-j", "DROP"].map(String::from));
    a
}

/// Packets nftables' counters say were dropped (`counter packets N`).
pub fn nft_drops(listing: &str) -> u64 {
    listing.split("counter packets ").skip(1).filter_map(|r| r.split_whitespace().next()?.parse::<u64>().ok()).sum()
}

/// Packets the DROP rules of `iptables -L INPUT -v -n -x` dropped.
pub fn iptables_drops(listing: &str) -> u64 {
    listing
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"DROP")).then(|| f[0].parse::<u64>().ok()).flatten()
        })
        .sum()
}

/// What drops the packets: `nft`, else `iptables`.
pub(super) enum Dropper {
    Nft(PathBuf),
    Iptables(PathBuf),
}

impl Dropper {
    /// `nft`, else `iptables`, in `--iproute`'s folder or on PATH.
    pub(super) fn find(dir: Option<&Path>) -> Result<Dropper, String> {
        if let Some(p) = find_tool(dir, "nft") {
            return Ok(Dropper::Nft(p));
        }
        if let Some(p) = find_tool(dir, "iptables") {
            return Ok(Dropper::Iptables(p));
        }
        Err("--loss needs nft (Debian's nftables: make deps installs it; on the device scripts/device/pack.sh puts it in devlib/iproute) \
             or iptables with its statistic match; neither is here"
            .into())
    }

    pub(super) fn name(&self) -> &'static str {
        match self {
            Dropper::Nft(_) => "nftables",
            Dropper::Iptables(_) => "iptables",
        }
    }

    /// Replaces the rules in namespace `ns` with `rules`.
    pub(super) fn apply(&self, tools: &Iproute, ns: &str, rules: &[Rule]) -> Result<(), String> {
        match self {
            Dropper::Nft(nft) => tools.tool_in(ns, nft, &["-f", "-"], Some(&nft_script(rules))).map(drop),
            Dropper::Iptables(ipt) => {
                tools.tool_in(ns, ipt, &["-w", "-F", "INPUT"], None)?;
                rules.iter().try_for_each(|r| {
                    let a = iptables_args(r);
                    tools.tool_in(ns, ipt, &a.iter().map(String::as_str).collect::<Vec<_>>(), None).map(drop)
                })
            }
        }
    }

    /// Packets the rules in namespace `ns` dropped since they were applied
    /// (0 where there are none); None if they could not be read.
    pub(super) fn drops(&self, tools: &Iproute, ns: &str) -> Option<u64> {
        match self {
            Dropper::Nft(nft) => match tools.tool_in(ns, nft, &["list", "table", "inet", TABLE], None) {
                Ok(l) => Some(nft_drops(&l)),
                // No table: the level drops nothing.
                Err(e) if e.contains("No such file") => Some(0),
                Err(_) => None,
            },
            Dropper::Iptables(ipt) => {
                tools.tool_in(ns, ipt, &["-w", "-L", "INPUT", "-v", "-n", "-x"], None).ok().map(|l| iptables_drops(&l))
            }
        }
    }
}

/// Applies `level` at every host (namespaces `ns(k, i)` of `hosts`).
pub(super) fn apply_level(
    tools: &Iproute,
    dropper: &Dropper,
    level: &LossLevel,
    hosts: &[(char, u32)],
    ns: &dyn Fn(char, u32) -> String,
    addr: &dyn Fn(char, u32) -> String,
) -> Result<(), String> {
    for &(k, i) in hosts {
        dropper.apply(tools, &ns(k, i), &level.rules_at((k, i), addr)).map_err(|e| format!("--loss {}: {e}", level.label()))?;
    }
    Ok(())
}

/// Packets the rules of every host dropped; None if one could not be read.
pub(super) fn level_drops(tools: &Iproute, dropper: &Dropper, hosts: &[(char, u32)], ns: &dyn Fn(char, u32) -> String) -> Option<u64> {
    hosts.iter().map(|&(k, i)| dropper.drops(tools, &ns(k, i))).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(k: char, i: u32) -> String {
        format!("198.18.{}.{}", if k == 's' { 0 } else { 1 }, 10 + i)
    }

    #[test]
    fn levels_are_a_percent_or_a_hosts_link_and_a_percent() {
        assert_eq!(parse_loss("0"), Ok(LossLevel { percent: 0.0, host: None }));
        assert_eq!(parse_loss("0.1"), Ok(LossLevel { percent: 0.1, host: None }));
        assert_eq!(parse_loss("1%"), Ok(LossLevel { percent: 1.0, host: None }));
        assert_eq!(parse_loss("100"), Ok(LossLevel { percent: 100.0, host: None }));
        assert_eq!(parse_loss("s1:1"), Ok(LossLevel { percent: 1.0, host: Some(('s', 1)) }));
        assert_eq!(parse_loss("w0:0.5"), Ok(LossLevel { percent: 0.5, host: Some(('w', 0)) }));
        assert_eq!(parse_loss("w12:2").unwrap().label(), "w12:2");
        assert_eq!(parse_loss("0.1").unwrap().label(), "0.1");
        assert_eq!(parse_loss("s1:1").unwrap().link(), "s1");
        assert_eq!(parse_loss("1").unwrap().link(), "every");
        assert_eq!(parse_loss("s1:1").unwrap().text(), "1% on s1's link (both ways)");
        assert_eq!(parse_loss("0").unwrap().text(), "none");
    }

    #[test]
    fn bad_levels_say_what_is_wrong() {
        let err = |s: &str| parse_loss(s).unwrap_err();
        assert!(err("-1").contains("from 0 to 100"), "{}", err("-1"));
        assert!(err("100.5").contains("from 0 to 100"));
        assert!(err("s1:-0.1").contains("from 0 to 100"));
        for garbage in ["", "lots", "1x", "nan", "inf", "s1:", "0.1,2"] {
            assert!(parse_loss(garbage).is_err(), "{garbage:?}");
        }
        assert!(err("nan").contains("from 0 to 100") || err("nan").contains("not a percent"));
        assert!(err("lots").contains("is not a percent"), "{}", err("lots"));
        for host in ["x1:1", "s:1", "sw:1", "s-1:1", "s+1:1", "S1:1", "1:1"] {
            assert!(err(host).contains("unknown host"), "{host}: {}", err(host));
        }
        assert!(err("0.00001").contains("finest"));
        // A host --hosts does not make.
        let l = parse_loss("s4:1").unwrap();
        assert_eq!(l.check_hosts(4), Err("--loss s4:1: there is no host s4 (--hosts 4: s0-s3 and w0-w3)".into()));
        assert_eq!(l.check_hosts(5), Ok(()));
        assert_eq!(parse_loss("1").unwrap().check_hosts(2), Ok(()));
    }

    #[test]
    fn every_link_draws_twice_at_each_receiver_one_host_once_on_each_path() {
        let every = parse_loss("1").unwrap();
        let r = every.rules_at(('w', 0), &addr);
        assert_eq!(r, vec![Rule { from: None, per_million: 10_000 }; 2]);
        let one = parse_loss("s1:0.1").unwrap();
        // Its downlink: everything it receives.
        assert_eq!(one.rules_at(('s', 1), &addr), vec![Rule { from: None, per_million: 1000 }]);
        // Its uplink: what the others receive from it.
        assert_eq!(one.rules_at(('w', 3), &addr), vec![Rule { from: Some("198.18.0.11".into()), per_million: 1000 }]);
        assert!(parse_loss("0").unwrap().rules_at(('s', 0), &addr).is_empty());
        assert!(parse_loss("s0:0").unwrap().rules_at(('s', 0), &addr).is_empty());
    }

    #[test]
    fn rule_text_for_nftables_and_iptables() {
        let rules = parse_loss("w1:0.5").unwrap().rules_at(('s', 0), &addr);
        assert_eq!(
            nft_script(&rules),
            "table inet tally_loss\ndelete table inet tally_loss\ntable inet tally_loss {\n  chain input {\n    \
             type filter hook input priority 0; policy accept;\n    \
             iifname \"eth0\" ip saddr 198.18.1.11 numgen random mod 1000000 < 5000 counter drop\n  }\n}\n"
        );
        assert_eq!(nft_script(&[]), "table inet tally_loss\ndelete table inet tally_loss\n");
        assert_eq!(
            iptables_args(&rules[0]).join(" "),
            "-w -A INPUT -i eth0 -s 198.18.1.11 -m statistic --mode random --probability 0.005000 -j DROP"
        );
        assert_eq!(
            iptables_args(&Rule { from: None, per_million: 1000 }).join(" "),
            "-w -A INPUT -i eth0 -m statistic --mode random --probability 0.001000 -j DROP"
        );
    }

    #[test]
    fn counters_are_summed_over_every_rule() {
        let nft = "table inet tally_loss {\n\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\
                   \t\tiifname \"eth0\" numgen random mod 1000000 < 10000 counter packets 12 bytes 9000 drop\n\
                   \t\tiifname \"eth0\" numgen random mod 1000000 < 10000 counter packets 30 bytes 1 drop\n\t}\n}\n";
        assert_eq!(nft_drops(nft), 42);
        assert_eq!(nft_drops(""), 0);
        let ipt = "Chain INPUT (policy ACCEPT 100 packets, 5000 bytes)\n    pkts      bytes target     prot opt in     out     source               destination\n\
                   \x20     7     6300 DROP       0    --  eth0   *       0.0.0.0/0            0.0.0.0/0            statistic mode random probability 0.01000000000\n\
                   \x20     5     4500 DROP       0    --  eth0   *       198.18.0.11          0.0.0.0/0            statistic mode random probability 0.01000000000\n";
        assert_eq!(iptables_drops(ipt), 12);
    }
}
