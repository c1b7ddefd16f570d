//! The testbed's network: a namespace per host and one for the switch (a
//! bridge), a veth link from each host to it, each host's TCP autocorking,
//! retransmission timeout floor, receive buffers and congestion control
//! and, where asked, receive packet steering on every veth
//! (`--tcp-autocork`, `--tcp-rto-min`, `--tcp-rcvbuf`, `--tcp-cc`, `--rps`),
//! every veth's largest GSO packet where `--loss` asks (`loss`),
//! and the `ip` and `tc` that make them. `Testbed` removes what a
//! run made when it is dropped; `sweep_stale` what a killed run left.
use super::args::{OnOff, RtoMin};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Why the emulated cluster cannot run here, if it cannot.
pub fn unavailable(iproute: Option<&Path>) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("it needs root (network namespaces, tc)".into());
    }
    let tools = match Iproute::find(iproute) {
        Ok(t) => t,
        Err(e) => return Some(e),
    };
    let probe = format!("tlyprobe{}", std::process::id());
    match tools.ip(&["netns", "add", &probe]) {
        Ok(()) => {
            let _ = tools.ip(&["netns", "del", &probe]);
            None
        }
        Err(e) => Some(format!("network namespaces are not available: {e}")),
    }
}

/// `ip` and `tc`, from PATH or an unpacked iproute2 folder.
pub(super) struct Iproute {
    ip: PathBuf,
    tc: PathBuf,
    lib: Option<String>,
    /// `--iproute`'s folder, whose tools get `lib`.
    dir: Option<PathBuf>,
}

/// Tool `name` in an unpacked package folder (`--iproute DIR`).
fn in_dir(d: &Path, name: &str) -> Option<PathBuf> {
    ["sbin", "bin", "usr/sbin", "usr/bin"].iter().map(|s| d.join(s).join(name)).find(|p| p.is_file())
}

/// Tool `name` on PATH or in /usr/sbin, /sbin.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(["/usr/sbin", "/sbin"].iter().map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Tool `name` in `--iproute`'s folder, else on PATH.
pub(super) fn find_tool(dir: Option<&Path>, name: &str) -> Option<PathBuf> {
    dir.and_then(|d| in_dir(d, name)).or_else(|| on_path(name))
}

impl Iproute {
    pub(super) fn find(dir: Option<&Path>) -> Result<Iproute, String> {
        if let Some(d) = dir {
            let (Some(ip), Some(tc)) = (in_dir(d, "ip"), in_dir(d, "tc")) else {
                return Err(format!("{} holds no ip and tc (unpack Debian's iproute2 there with dpkg -x)", d.display()));
            };
            let lib = [
                "lib/x86_64-linux-gnu",
                "usr/lib/x86_64-linux-gnu",
                "lib/aarch64-linux-gnu",
                "usr/lib/aarch64-linux-gnu",
                "lib",
                "usr/lib",
            ]
            .iter()
            .map(|s| d.join(s))
            .filter(|p| p.is_dir())
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":");
            return Ok(Iproute { ip, tc, lib: Some(lib), dir: Some(d.to_path_buf()) });
        }
        match (on_path("ip"), on_path("tc")) {
            (Some(ip), Some(tc)) => Ok(Iproute { ip, tc, lib: None, dir: None }),
            _ => Err("iproute2 (ip, tc) is not installed (make deps installs it; or --iproute DIR with Debian's iproute2 unpacked)".into()),
        }
    }

    fn command(&self, prog: &Path) -> Command {
        let mut c = Command::new(prog);
        if let Some(lib) = &self.lib {
            c.env("LD_LIBRARY_PATH", lib);
        }
        c
    }

    fn run(&self, prog: &Path, args: &[&str]) -> Result<(), String> {
        let out = self.command(prog).args(args).stdin(Stdio::null()).output().map_err(|e| format!("{}: {e}", prog.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{} {}: {}", prog.display(), args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
        }
    }

    fn ip(&self, args: &[&str]) -> Result<(), String> {
        self.run(&self.ip, args)
    }

    pub(super) fn tc_in(&self, ns: &str, args: &[&str]) -> Result<(), String> {
        let tc = self.tc.display().to_string();
        let mut all = vec!["netns", "exec", ns, &tc];
        all.extend_from_slice(args);
        self.ip(&all)
    }

    /// What `tc args` prints inside namespace `ns`.
    pub(super) fn tc_out_in(&self, ns: &str, args: &[&str]) -> Result<String, String> {
        let tc = self.tc.display().to_string();
        let mut all = vec!["netns", "exec", ns, &tc];
        all.extend_from_slice(args);
        self.output(&self.ip, &all)
    }

    /// What `prog args` (nft, iptables) prints inside namespace `ns`, fed
    /// `stdin`. A tool from PATH does not get `--iproute`'s libraries.
    pub(super) fn tool_in(&self, ns: &str, prog: &Path, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        use std::io::Write;
        let mut c = self.command(&self.ip);
        c.args(["netns", "exec", ns]);
        if self.lib.is_some() && !self.dir.as_ref().is_some_and(|d| prog.starts_with(d)) {
            c.args(["env", "-u", "LD_LIBRARY_PATH"]);
        }
        c.arg(prog).args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        c.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let what = || format!("{} {}", prog.display(), args.join(" "));
        let mut child = c.spawn().map_err(|e| format!("{}: {e}", what()))?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // Small (a few rules): the pipe holds it whole before the tool reads.
            pipe.write_all(text.as_bytes()).map_err(|e| format!("{}: {e}", what()))?;
        }
        let out = child.wait_with_output().map_err(|e| format!("{}: {e}", what()))?;
        match out.status.success() {
            true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
            false => Err(format!("{}: {}", what(), String::from_utf8_lossy(&out.stderr).trim())),
        }
    }

    /// File `path` as a process inside namespace `ns` reads it (/proc/net/...).
    pub(super) fn read_in(&self, ns: &str, path: &str) -> Result<String, String> {
        self.output(&self.ip, &["netns", "exec", ns, "cat", path])
    }

    /// Writes `value` to `path` as a process inside namespace `ns` sees it
    /// (a sysctl under /proc/sys/net, which is the namespace's own).
    pub(super) fn write_in(&self, ns: &str, path: &str, value: &str) -> Result<(), String> {
        let script = format!("printf '%s' '{value}' > '{path}'");
        self.ip(&["netns", "exec", ns, "sh", "-c", &script])
    }

    fn output(&self, prog: &Path, args: &[&str]) -> Result<String, String> {
        let out = self.command(prog).args(args).stdin(Stdio::null()).output().map_err(|e| format!("{}: {e}", prog.display()))?;
        match out.status.success() {
            true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
            false => Err(format!("{} {}: {}", prog.display(), args.join(" "), String::from_utf8_lossy(&out.stderr).trim())),
        }
    }

    /// A command run inside namespace `ns` with the caller's LD_LIBRARY_PATH
    /// (not the one `ip` got for iproute2's libraries). Dropping it, as
    /// this once did, made servers and workers on the device load the host's
    /// own libfabric (1.20) instead of the one carried for them.
    pub(super) fn exec_in(&self, ns: &str, prog: &Path) -> Command {
        let mut c = self.command(&self.ip);
        c.args(["netns", "exec", ns]);
        if self.lib.is_some() {
            match std::env::var_os("LD_LIBRARY_PATH") {
                Some(orig) => {
                    let mut kv = std::ffi::OsString::from("LD_LIBRARY_PATH=");
                    kv.push(orig);
                    c.arg("env").arg(kv);
                }
                None => {
                    c.args(["env", "-u", "LD_LIBRARY_PATH"]);
                }
            }
        }
        c.arg(prog);
        c
    }

    fn namespaces(&self) -> Vec<String> {
        let out = self.command(&self.ip).args(["netns", "list"]).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).lines().filter_map(|l| l.split_whitespace().next().map(str::to_string)).collect())
            .unwrap_or_default()
    }
}

/// The namespaces and processes of one run; removed on drop.
pub(super) struct Testbed {
    pub(super) tools: Iproute,
    pub(super) prefix: String,
    pub(super) children: Vec<Child>,
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
        for ns in self.tools.namespaces() {
            if ns.starts_with(&self.prefix) {
                let _ = self.tools.ip(&["netns", "del", &ns]);
            }
        }
    }
}

/// Removes namespaces of earlier runs whose process is gone (`tly<pid>x...`).
pub(super) fn sweep_stale(tools: &Iproute) {
    for ns in tools.namespaces() {
        let Some(pid) = ns.strip_prefix("tly").and_then(|r| r.split('x').next()).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            log::info!("removing network namespace {ns} of a run that is gone");
            let _ = tools.ip(&["netns", "del", &ns]);
        }
    }
}

/// The emulated network: every host's address is in it.
const SUBNET: &str = "198.18.0.0/16";

/// Server i at 198.18.0.(10+i), worker i at 198.18.1.(10+i), all in one /16.
pub(super) fn addr(kind: char, i: u32) -> String {
    format!("198.18.{}.{}", if kind == 's' { 0 } else { 1 }, 10 + i)
}

/// How each emulated host's link and TCP are set up.
pub(super) struct HostNet<'a> {
    pub mtu: u32,
    pub autocork: OnOff,
    pub rto_min: RtoMin,
    /// net.ipv4.tcp_rmem of every host, where it is not the kernel's.
    pub tcp_rmem: Option<String>,
    /// The congestion control of every host's route, where it is not the
    /// machine's (which a new namespace inherits).
    pub congestion: Option<&'a str>,
    /// The rps_cpus mask of every veth, where steering is on.
    pub rps: Option<&'a str>,
    /// Every veth's (both ends) gso_max_size, where set (`--loss`: the
    /// MTU, so that a packet dropped is one frame: `loss`).
    pub gso_max: Option<u32>,
}

pub(super) fn build_network(
    tools: &Iproute,
    sw: &str,
    hosts: &[(char, u32)],
    ns: &dyn Fn(char, u32) -> String,
    net: &HostNet,
) -> Result<(), String> {
    let mtu = net.mtu.to_string();
    tools.ip(&["netns", "add", sw])?;
    tools.ip(&["-n", sw, "link", "add", "br0", "type", "bridge"])?;
    tools.ip(&["-n", sw, "link", "set", "br0", "mtu", &mtu, "up"])?;
    tools.ip(&["-n", sw, "link", "set", "lo", "up"])?;
    for &(k, i) in hosts {
        let name = ns(k, i);
        // The switch-side end carries the host's namespace name (<= 15 chars).
        let port = format!("{k}{i}p{}", std::process::id() % 100_000);
        tools.ip(&["netns", "add", &name])?;
        tools.ip(&["link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &name])?;
        tools.ip(&["link", "set", &port, "netns", sw])?;
        tools.ip(&["-n", sw, "link", "set", &port, "master", "br0", "mtu", &mtu, "up"])?;
        tools.ip(&["-n", &name, "link", "set", "eth0", "mtu", &mtu])?;
        if let Some(gso) = net.gso_max.map(|g| g.to_string()) {
            tools.ip(&["-n", &name, "link", "set", "eth0", "gso_max_size", &gso])?;
            tools.ip(&["-n", sw, "link", "set", &port, "gso_max_size", &gso])?;
        }
        tools.ip(&["-n", &name, "addr", "add", &format!("{}/16", addr(k, i)), "dev", "eth0"])?;
        tools.ip(&["-n", &name, "link", "set", "eth0", "up"])?;
        tools.ip(&["-n", &name, "link", "set", "lo", "up"])?;
        let rto = net.rto_min.route_arg();
        if rto.is_some() || net.congestion.is_some() {
            // The connected route, as `addr add` made it, with the floor and
            // the congestion control. The route's, not the namespace's
            // net.ipv4.tcp_congestion_control: outside the first namespace
            // that takes only what tcp_allowed_congestion_control lists (on
            // a machine set to bbr: reno and bbr).
            let src = addr(k, i);
            let mut args = vec!["-n", &name, "route", "replace", SUBNET, "dev", "eth0", "proto", "kernel", "scope", "link", "src", &src];
            if let Some(rto) = &rto {
                args.extend(["rto_min", rto]);
            }
            if let Some(cc) = net.congestion {
                args.extend(["congctl", cc]);
            }
            tools.ip(&args).map_err(|e| match net.congestion {
                Some(cc) => {
                    let offered = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control").unwrap_or_default();
                    format!("--tcp-cc {cc}: this kernel would not set it ({e}); it offers: {}", offered.trim())
                }
                None => e,
            })?;
        }
        tools.write_in(&name, "/proc/sys/net/ipv4/tcp_autocorking", net.autocork.sysctl())?;
        if let Some(rmem) = &net.tcp_rmem {
            tools.write_in(&name, "/proc/sys/net/ipv4/tcp_rmem", rmem)?;
        }
        if let Some(mask) = net.rps {
            // `ip netns exec` mounts the namespace's own /sys.
            tools.write_in(&name, "/sys/class/net/eth0/queues/rx-0/rps_cpus", mask)?;
            tools.write_in(sw, &format!("/sys/class/net/{port}/queues/rx-0/rps_cpus"), mask)?;
        }
    }
    Ok(())
}
