//! A switch of network namespaces for link cuts under a multi-server job.
//!
//! A namespace `<prefix>sw` holds a bridge; each host added gets a namespace
//! of its own, linked to the bridge by a veth pair (`eth0` in the host, a
//! port named after the host on the switch). The test process itself (its
//! rank threads) is attached from the root namespace by one more veth pair,
//! so that clients run in the test and servers in their namespaces. Setting
//! a host's switch port down is the cable pulled at the switch: the host
//! keeps its carrier, nothing is delivered either way, no FIN, no RST.
//! Everything is deleted on drop, panics included (deleting a namespace
//! deletes its veth ends, and with them their peers).
use std::process::Command;

pub struct Switch {
    prefix: String,
    namespaces: Vec<String>,
}

/// Runs an `ip` command; panics with its stderr if it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|e| panic!("ip {}: {e}", args.join(" ")));
    assert!(out.status.success(), "ip {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
}

/// Whether this process may make namespaces (root, with iproute2); says
/// why not on stderr, prefixed by `what`.
pub fn available(what: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let tool = Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success());
    if !root || !tool {
        eprintln!("{what}: SKIPPED: needs root and iproute2 for network namespaces (root: {root}, ip: {tool})");
    }
    root && tool
}

/// A /24 of 198.18.0.0/15 (`198.18.N.0`, N from 100 to 199) that no other
/// process of this host holds, and the lock that holds it for this one
/// (kept until the returned file is dropped or the process ends): tests
/// that put an address on the root namespace, each copy in its own
/// subnet (two copies with one subnet route each other's traffic).
pub fn claim_subnet() -> (u32, std::fs::File) {
    use std::os::fd::AsRawFd;
    let start = std::process::id() % 100;
    for i in 0..100 {
        let n = 100 + (start + i) % 100;
        let path = format!("/tmp/tally-test-subnet-198.18.{n}.lock");
        let f = std::fs::OpenOptions::new().create(true).write(true).truncate(false).open(&path);
        let f = f.unwrap_or_else(|e| panic!("{path}: {e}"));
        // SAFETY: flock on a descriptor this File owns; released when it closes.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return (n, f);
        }
    }
    panic!("no free subnet among 198.18.100-199.0/24: 100 tests hold them");
}

impl Switch {
    /// `tag`: up to 4 characters naming the test (interface names are at most 15).
    pub fn new(tag: &str) -> Switch {
        let mut s = Switch { prefix: format!("{tag}{}", std::process::id() % 100_000), namespaces: Vec::new() };
        let sw = s.add_namespace("sw");
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &sw, "link", "set", "br0", "up"]);
        s
    }

    fn add_namespace(&mut self, host: &str) -> String {
        let ns = self.namespace(host);
        ip(&["netns", "add", &ns]);
        self.namespaces.push(ns.clone());
        ns
    }

    pub fn namespace(&self, host: &str) -> String {
        format!("{}{host}", self.prefix)
    }

    /// The switch end of `host`'s link.
    fn port(&self, host: &str) -> String {
        format!("{}{host}", self.prefix)
    }

    fn plug(&self, port: &str) {
        let sw = self.namespace("sw");
        ip(&["-n", &sw, "link", "set", port, "master", "br0", "up"]);
    }

    /// A host namespace with `addr` (/24) on its `eth0`; its name.
    pub fn add_host(&mut self, host: &str, addr: &str) -> String {
        let ns = self.add_namespace(host);
        let (sw, port) = (self.namespace("sw"), self.port(host));
        ip(&["-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns]);
        self.plug(&port);
        ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
        ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        ns
    }

    /// Links the root namespace (this process) to the switch, with `addr` (/24).
    pub fn attach_root(&mut self, addr: &str) {
        let (sw, port, local) = (self.namespace("sw"), self.port("rt"), format!("{}r", self.prefix));
        ip(&["link", "add", &local, "type", "veth", "peer", "name", &port, "netns", &sw]);
        self.plug(&port);
        ip(&["addr", "add", &format!("{addr}/24"), "dev", &local]);
        ip(&["link", "set", &local, "up"]);
    }

    /// Shapes `host`'s link to `mbit` Mbit/s both ways (tc tbf on both of
    /// its ends): a slow link keeps data in flight, as a loaded one does.
    pub fn shape(&self, host: &str, mbit: u32) {
        let rate = format!("{mbit}mbit");
        let tbf = ["root", "tbf", "rate", &rate, "burst", "64kb", "latency", "50ms"];
        for (ns, dev) in [(self.namespace("sw"), self.port(host)), (self.namespace(host), "eth0".to_string())] {
            let out = Command::new("ip").args(["netns", "exec", &ns, "tc", "qdisc", "replace", "dev", &dev]).args(tbf).output();
            let out = out.unwrap_or_else(|e| panic!("tc in {ns}: {e}"));
            assert!(out.status.success(), "tc qdisc replace dev {dev} in {ns}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
    }

    /// Sets `host`'s switch port up or down.
    pub fn set_port(&self, host: &str, up: bool) {
        ip(&["-n", &self.namespace("sw"), "link", "set", &self.port(host), if up { "up" } else { "down" }]);
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}
