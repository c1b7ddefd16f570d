//! The list of servers a rank reaches (`ClientConfig::servers`; the
//! plugin's `TALLY_SERVERS`), checked before anything is joined.
//!
//! Every rank of a job joins it on every server of its list, and stream `s`
//! of every rank must be the same (server, lcore) pair: the list's order is
//! part of the job. A server named twice would be joined twice by each rank
//! (a thousand copies of one address made a thousand joins of one job on
//! it), so a duplicate is refused, naming it, rather than dropped: dropping
//! it would change the order, and a rank whose copy of the list differs
//! (another spelling of the same server) would cut its work differently
//! from the others. Two entries are the same server when their text is the
//! same after trimming, or when they resolve to the same socket address
//! (the first one, which is what a join connects to).
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

/// The most servers one client joins. Each costs a rank a thread during a
/// join (one Hello per server, in parallel), a control connection for the
/// job's life and `64 x window x 2` completion contexts per sub-job
/// (`Client::connect`'s `per_sub`, a u32); failover covers at most 64
/// (`join.rs`). The largest deployment measured used 4: 256 leaves room and
/// keeps a mistaken list from costing thousands of connections per rank.
pub const MAX_SERVERS: usize = 256;

/// Why a server list was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerListError {
    /// More than [`MAX_SERVERS`] entries.
    TooMany { count: usize },
    /// Entry `at` (counted from 0) repeats entry `first`'s text.
    Repeated { server: String, first: usize, at: usize },
    /// Entries `first` and `at` are different texts for one address.
    SameAddress { first: String, second: String, addr: SocketAddr },
}

impl fmt::Display for ServerListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerListError::TooMany { count } => {
                write!(f, "{count} servers given, at most {MAX_SERVERS}")
            }
            ServerListError::Repeated { server, first, at } => {
                write!(f, "server {server} is listed twice (entries {first} and {at}): each server once, in the same order on every rank")
            }
            ServerListError::SameAddress { first, second, addr } => {
                write!(f, "servers {first} and {second} are the same server ({addr}): each server once, in the same order on every rank")
            }
        }
    }
}

impl std::error::Error for ServerListError {}

/// The servers of a list as `TALLY_SERVERS` writes it (comma- or
/// space-separated), in its order, checked by [`check`]. An empty list is
/// no error here: the plugin then offers no CollNet device.
pub fn parse(list: &str) -> Result<Vec<String>, ServerListError> {
    let servers: Vec<String> = list.split([',', ' ']).map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect();
    check(&servers)?;
    Ok(servers)
}

/// Refuses a list longer than [`MAX_SERVERS`] or with an entry twice
/// (the same text after trimming). Resolves nothing: see [`check_resolved`].
pub fn check(servers: &[String]) -> Result<(), ServerListError> {
    if servers.len() > MAX_SERVERS {
        return Err(ServerListError::TooMany { count: servers.len() });
    }
    for (at, s) in servers.iter().enumerate() {
        if let Some(first) = servers[..at].iter().position(|t| t.trim() == s.trim()) {
            return Err(ServerListError::Repeated { server: s.trim().to_string(), first, at });
        }
    }
    Ok(())
}

/// Refuses two entries that resolve to the same first socket address (the
/// one a join connects to). An entry that does not resolve is left to the
/// join, which names it with its error.
pub fn check_resolved(servers: &[String]) -> Result<(), ServerListError> {
    let addrs: Vec<Option<SocketAddr>> = servers.iter().map(|s| s.trim().to_socket_addrs().ok().and_then(|mut a| a.next())).collect();
    for (at, a) in addrs.iter().enumerate() {
        let Some(addr) = a else { continue };
        if let Some(first) = addrs[..at].iter().position(|b| b.as_ref() == Some(addr)) {
            return Err(ServerListError::SameAddress {
                first: servers[first].trim().to_string(),
                second: servers[at].trim().to_string(),
                addr: *addr,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_list_parses_in_its_order() {
        assert_eq!(
            parse(" 10.0.0.2:7400, 10.0.0.1:7400  10.0.0.3:7400,").unwrap(),
            list(&["10.0.0.2:7400", "10.0.0.1:7400", "10.0.0.3:7400"])
        );
        assert_eq!(parse("").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn a_server_twice_is_refused_naming_it() {
        let e = parse("10.0.0.1:7400,10.0.0.2:7400, 10.0.0.1:7400 ").unwrap_err();
        assert_eq!(e, ServerListError::Repeated { server: "10.0.0.1:7400".into(), first: 0, at: 2 });
        assert!(e.to_string().starts_with("server 10.0.0.1:7400 is listed twice (entries 0 and 2)"), "{e}");
        // Untrimmed entries given in a ClientConfig count alike.
        assert!(matches!(check(&list(&["a:1", " a:1"])), Err(ServerListError::Repeated { .. })));
        // A thousand copies of one server: refused at the first repeat.
        let many = vec!["127.0.0.1:7400".to_string(); 1000];
        assert!(matches!(check(&many[..MAX_SERVERS]), Err(ServerListError::Repeated { at: 1, .. })));
    }

    #[test]
    fn too_many_servers_are_refused() {
        let at_most: Vec<String> = (0..MAX_SERVERS).map(|i| format!("10.0.{}.{}:7400", i / 256, i % 256)).collect();
        assert_eq!(check(&at_most), Ok(()));
        let over: Vec<String> = (0..=MAX_SERVERS).map(|i| format!("10.0.{}.{}:7400", i / 256, i % 256)).collect();
        let e = check(&over).unwrap_err();
        assert_eq!(e, ServerListError::TooMany { count: MAX_SERVERS + 1 });
        assert!(e.to_string().contains(&format!("at most {MAX_SERVERS}")), "{e}");
    }

    #[test]
    fn two_spellings_of_one_address_are_refused() {
        let e = check_resolved(&list(&["[::1]:7400", "127.0.0.1:7400", "[0:0:0:0:0:0:0:1]:7400"])).unwrap_err();
        assert_eq!(
            e,
            ServerListError::SameAddress {
                first: "[::1]:7400".into(),
                second: "[0:0:0:0:0:0:0:1]:7400".into(),
                addr: "[::1]:7400".parse().unwrap()
            }
        );
        assert!(e.to_string().contains("are the same server ([::1]:7400)"), "{e}");
        // Different ports on one host are different servers; what does not
        // resolve is left to the join.
        assert_eq!(check_resolved(&list(&["127.0.0.1:7400", "127.0.0.1:7401", "no-such-host.invalid:7400"])), Ok(()));
    }
}
