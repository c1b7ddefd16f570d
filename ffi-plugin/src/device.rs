//! Network devices: which NICs the plugin offers NCCL, and their properties.
//!
//! A device is one libfabric domain of the chosen provider: one per EFA NIC
//! (`rdmap16s27-rdm` ...), or a single one for `tcp;ofi_rxm` (the interface
//! the endpoint binds to) and for `shm`. The provider is `TALLY_PROVIDER`
//! when set (`efa`, `tcp`, `shm`), else what the engine chooses for peers that
//! may be on other hosts: `efa` where a device exists, else `tcp;ofi_rxm`.
//! For tcp, `TALLY_FABRIC_ADDR` names the local address to bind (e.g.
//! `127.0.0.1`); by default the provider picks its first interface.
//!
//! NCCL asks for devices and properties without a context, and keeps the
//! `name` and `pciPath` pointers it is given, so the table is process-wide:
//! built by the first `init`, dropped from use when the last context is
//! finalized (a later `init` reads the environment again), and never freed
//! (the strings must outlive anything NCCL may still hold).
use crate::abi;
use crate::error::{Error, Result};
use std::ffi::{c_char, CString};
use std::sync::{Arc, Mutex};
use tally_engine::dataplane::fabric::{defaults, select_provider, Hints, InfoList};

/// Largest message per operation offered to NCCL. NCCL reports sizes back
/// through `int`, and 1 GiB is the power of two below `INT_MAX`.
pub const MAX_P2P_BYTES: usize = 1 << 30;
/// Largest single all-reduce offered to NCCL's CollNet (NCCL's own default
/// for collective plugins; the client cuts any size into chunks anyway).
pub const MAX_COLL_BYTES: usize = 512 << 20;
/// Communicators per device: connections share one endpoint per NCCL
/// communicator and device, so the count is bounded only by memory; the
/// value caps NCCL's channels, so it must be large.
pub const MAX_COMMS: i32 = 65536;

#[derive(Debug)]
pub struct Device {
    pub index: usize,
    /// libfabric provider, as the engine spells it (`tcp;ofi_rxm`).
    pub provider: String,
    /// libfabric domain (NIC) name.
    pub domain: String,
    /// Local address to bind (tcp), from `TALLY_FABRIC_ADDR`.
    pub node: Option<String>,
    /// Name shown to NCCL: the NIC or interface.
    pub name: CString,
    pub pci_path: Option<CString>,
    pub guid: u64,
    pub speed_mbps: i32,
    pub latency_us: f32,
    pub port: i32,
    pub max_msg: usize,
}

impl Device {
    /// The hints that open an endpoint on this device.
    pub fn hints(&self) -> Hints {
        let mut h = Hints::new(&self.provider).with_node(self.node.as_deref());
        if self.provider == "efa" {
            h.domain = Some(self.domain.clone());
        }
        h
    }

    pub fn max_p2p_bytes(&self) -> usize {
        self.max_msg.clamp(1, MAX_P2P_BYTES)
    }

    pub fn max_coll_bytes(&self) -> usize {
        MAX_COLL_BYTES
    }

    fn name_ptr(&self) -> *mut c_char {
        self.name.as_ptr().cast_mut()
    }

    fn pci_ptr(&self) -> *mut c_char {
        self.pci_path.as_ref().map_or(std::ptr::null_mut(), |p| p.as_ptr().cast_mut())
    }

    /// Every field of the v11 properties, truthfully.
    pub fn properties_v11(&self, max_coll_bytes: usize) -> abi::NetPropertiesV11 {
        let mut devs = [0; 4];
        devs[0] = self.index as i32;
        abi::NetPropertiesV11 {
            name: self.name_ptr(),
            pci_path: self.pci_ptr(),
            guid: self.guid,
            ptr_support: abi::NCCL_PTR_HOST,
            // Registrations belong to the endpoint of the communicator they
            // were made on: not global.
            reg_is_global: 0,
            force_flush: 0,
            speed: self.speed_mbps,
            port: self.port,
            latency: self.latency_us,
            max_comms: MAX_COMMS,
            max_recvs: 1,
            net_device_type: abi::NCCL_NET_DEVICE_HOST,
            net_device_version: abi::NCCL_NET_DEVICE_INVALID_VERSION,
            v_props: abi::VDeviceProps { ndevs: 1, devs },
            max_p2p_bytes: self.max_p2p_bytes(),
            max_coll_bytes,
            max_multi_request_size: 1,
        }
    }

    /// The v12 properties: v11's plus no rail or plane.
    pub fn properties_v12(&self, max_coll_bytes: usize) -> abi::NetPropertiesV12 {
        let p = self.properties_v11(max_coll_bytes);
        let mut devs = [0; 8];
        devs[0] = self.index as i32;
        abi::NetPropertiesV12 {
            name: p.name,
            pci_path: p.pci_path,
            guid: p.guid,
            ptr_support: p.ptr_support,
            reg_is_global: p.reg_is_global,
            force_flush: p.force_flush,
            speed: p.speed,
            port: p.port,
            latency: p.latency,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
            net_device_type: p.net_device_type,
            net_device_version: p.net_device_version,
            v_props: abi::VDeviceProps { ndevs: 1, devs },
            max_p2p_bytes: p.max_p2p_bytes,
            max_coll_bytes: p.max_coll_bytes,
            max_multi_request_size: p.max_multi_request_size,
            rail_id: abi::NCCL_NET_ID_UNDEF,
            plane_id: abi::NCCL_NET_ID_UNDEF,
        }
    }
}

#[derive(Debug)]
pub struct Devices {
    pub provider: String,
    pub list: Vec<Device>,
}

/// The table in use, and how many contexts use it.
struct Registry {
    current: Option<Arc<Devices>>,
    users: usize,
    /// Tables no longer in use, kept because NCCL may hold their strings.
    retired: Vec<Arc<Devices>>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry { current: None, users: 0, retired: Vec::new() });

/// libfabric settings the plugin changes from their defaults, unless the
/// user set them, when no CollNet servers are configured: NCCL's ncclNet
/// messages are up to 512 KiB (a step of its 4 MiB buffer), and over tcp an
/// eager message is placed straight into the posted receive: about 3x the
/// bandwidth on loopback here, +10-20% from 1 to 16 MiB through real NCCL.
/// Every rank of a job has the same environment, so all agree.
const NET_ONLY_DEFAULTS: &[(&str, &str)] = &[("FI_OFI_RXM_EAGER_LIMIT", "4194304")];

/// Applies the provider settings and returns what this process set. With
/// `TALLY_SERVERS`, the engine's (`fabric::defaults`, the same as tally
/// servers use: rxm peers must agree on the eager limit); without, the
/// ncclNet ones above first. Runs at the start of every `init`, before the
/// plugin's first `fi_getinfo`; later calls change nothing. (At `init`,
/// NCCL's threads are not reading libfabric variables.)
pub fn tune_provider_env() -> Vec<String> {
    let mut set = if collnet_configured() { Vec::new() } else { defaults::set_where_unset(NET_ONLY_DEFAULTS) };
    set.extend(defaults::apply().iter().cloned());
    set
}

/// Whether CollNet servers are configured (`TALLY_SERVERS` non-empty).
fn collnet_configured() -> bool {
    std::env::var("TALLY_SERVERS").is_ok_and(|s| !s.trim().is_empty())
}

/// NCCL settings the plugin changes from NCCL's defaults, unless the user
/// set them, when CollNet servers are configured (`TALLY_SERVERS`).
///
/// NCCL gives one GPU per node without GPUDirect RDMA two channels (and,
/// a guess not shown, each CollNet channel moves its steps through host
/// memory with one thread block). On 4 GPUs (each its own node, nvidia-h200-x4, 32 Gbit/s links,
/// `scripts/device/linerate.sh nccl-knobs`, two calls) two channels held a
/// 16 MiB all-reduce to 0.44-0.64 of the link bound whatever tally's side
/// did (window, piece size, send pacing, reported link speed); four reached
/// 0.75-0.90 (eight 0.89), and 64 MiB 0.84-0.93 against 0.81-0.96. NCCL's
/// ring over Socket was no faster with four (0.49-0.61 against 0.54-0.65).
/// More than four did not help later (another host, one run each, 16 / 64
/// MiB): eight 0.87 / 0.82 and sixteen 0.29 / 0.39 against four's 0.88 /
/// 0.88; the plugin's pieces then just waited longer (docs/measurements.md,
/// "What failover costs the plugin").
/// NCCL reads the variable after the net plugin's `init`, which sets it.
const COLLNET_NCCL_DEFAULTS: &[(&str, &str)] = &[("NCCL_MIN_NCHANNELS", "4")];

/// Applies [`COLLNET_NCCL_DEFAULTS`] when CollNet servers are configured
/// and returns what this process set.
pub fn tune_nccl_env() -> Vec<String> {
    if collnet_configured() {
        defaults::set_where_unset(COLLNET_NCCL_DEFAULTS)
    } else {
        Vec::new()
    }
}

/// Called by each `init`: builds the table if none is in use.
pub fn acquire() -> Result<Arc<Devices>> {
    let mut r = REGISTRY.lock()?;
    let devs = match &r.current {
        Some(d) => d.clone(),
        None => {
            let d = Arc::new(discover()?);
            r.current = Some(d.clone());
            d
        }
    };
    r.users += 1;
    Ok(devs)
}

/// Called by each `finalize`.
pub fn release() {
    if let Ok(mut r) = REGISTRY.lock() {
        r.users = r.users.saturating_sub(1);
        if r.users == 0 {
            if let Some(d) = r.current.take() {
                r.retired.push(d);
            }
        }
    }
}

/// The table in use (for `devices` and `getProperties`, which have no context).
pub fn current() -> Option<Arc<Devices>> {
    REGISTRY.lock().ok()?.current.clone()
}

pub fn get(dev: i32) -> Result<(Arc<Devices>, usize)> {
    let devs = current().ok_or_else(|| Error::InvalidUsage("no device table: init was not called".into()))?;
    let i = usize::try_from(dev)
        .ok()
        .filter(|&i| i < devs.list.len())
        .ok_or_else(|| Error::arg(format!("device {dev} does not exist ({} devices)", devs.list.len())))?;
    Ok((devs, i))
}

fn discover() -> Result<Devices> {
    let provider = select_provider(None, false);
    let node = std::env::var("TALLY_FABRIC_ADDR").ok().filter(|s| !s.trim().is_empty()).map(|s| s.trim().to_string());
    let hints = Hints::new(&provider).with_node(node.as_deref());
    let info = InfoList::get(&hints).map_err(|e| {
        let fi = std::env::var("FI_PROVIDER").ok();
        let advice = match fi.as_deref().filter(|v| filter_excludes(v, &provider)) {
            Some(v) => format!("FI_PROVIDER={v} in the environment leaves it out: unset FI_PROVIDER, or make it name the provider"),
            None => "set TALLY_PROVIDER to efa, tcp or shm".to_string(),
        };
        Error::System(format!("libfabric provider {provider} is not available: {e} ({advice})"))
    })?;
    let max_msg = info.max_msg_size();
    let domains = if provider == "efa" { info.domains() } else { vec![info.domain_name()] };
    let list = domains.into_iter().enumerate().map(|(index, domain)| describe(index, &provider, domain, node.clone(), max_msg)).collect();
    Ok(Devices { provider, list })
}

/// Whether libfabric's own provider filter, `FI_PROVIDER` (a list of
/// names, or `^` and the names to exclude), leaves out the core provider of
/// `provider` (`tcp` of `tcp;ofi_rxm`): a worker's environment made for
/// another fabric (`FI_PROVIDER=efa` on a host without EFA) is then the
/// cause, not TALLY_PROVIDER.
pub fn filter_excludes(fi_provider: &str, provider: &str) -> bool {
    let v = fi_provider.trim();
    if v.is_empty() {
        return false;
    }
    let core = provider.split(';').next().unwrap_or(provider);
    let (exclude, list) = match v.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let named = list.split([',', ';']).any(|n| n.trim() == core);
    named == exclude
}

/// Typical one-way latency of each provider class, in microseconds. libfabric
/// does not report latency; NCCL only uses it in its tuning model.
fn nominal_latency_us(provider: &str) -> f32 {
    match provider {
        "efa" => 15.0,
        "shm" => 1.0,
        _ => 25.0,
    }
}

fn describe(index: usize, provider: &str, domain: String, node: Option<String>, max_msg: usize) -> Device {
    let (shown, pci, speed, guid, port) = match provider {
        "efa" => {
            // EFA domains are `<ibdev>-rdm` / `<ibdev>-dgrm`.
            let ibdev = domain.split('-').next().unwrap_or(&domain).to_string();
            let sys = format!("/sys/class/infiniband/{ibdev}");
            let speed = read_trim(&format!("{sys}/ports/1/rate")).and_then(|r| parse_ib_rate_mbps(&r)).unwrap_or(100_000);
            let guid = read_trim(&format!("{sys}/node_guid"))
                .and_then(|g| u64::from_str_radix(&g.replace(':', ""), 16).ok())
                .unwrap_or(index as u64);
            (ibdev, std::fs::canonicalize(format!("{sys}/device")).ok(), speed, guid, 1)
        }
        "shm" => ("shm".to_string(), None, 0, index as u64, 0),
        _ => {
            let sys = format!("/sys/class/net/{domain}");
            let speed = read_trim(&format!("{sys}/speed"))
                .and_then(|s| s.parse::<i64>().ok())
                .filter(|&s| s > 0)
                .map(|s| s.min(i32::MAX as i64) as i32)
                .unwrap_or(0);
            (domain.clone(), std::fs::canonicalize(format!("{sys}/device")).ok(), speed, index as u64, 0)
        }
    };
    // Where neither the provider nor the device says (loopback, shm), use
    // NCCL's own assumption for an interface of unknown speed, 10 Gbit/s, so
    // that NCCL plans channels as it would for its socket transport.
    // TALLY_NET_SPEED_MBPS overrides.
    let speed = std::env::var("TALLY_NET_SPEED_MBPS")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(if speed > 0 { speed } else { 10_000 });
    let pci_path = pci.and_then(|p| CString::new(p.to_string_lossy().into_owned()).ok());
    Device {
        index,
        provider: provider.to_string(),
        domain,
        node,
        name: CString::new(shown.replace('\0', "")).unwrap_or_default(),
        pci_path,
        guid,
        speed_mbps: speed,
        latency_us: nominal_latency_us(provider),
        port,
        max_msg,
    }
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// `100 Gb/sec (4X EDR)` -> 100000.
fn parse_ib_rate_mbps(rate: &str) -> Option<i32> {
    let gb: f64 = rate.split_whitespace().next()?.parse().ok()?;
    Some((gb * 1000.0) as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ib_rates_parse() {
        assert_eq!(parse_ib_rate_mbps("100 Gb/sec (4X EDR)"), Some(100_000));
        assert_eq!(parse_ib_rate_mbps("200 Gb/sec"), Some(200_000));
        assert_eq!(parse_ib_rate_mbps("garbage"), None);
    }

    #[test]
    fn fi_provider_is_named_when_it_leaves_the_provider_out() {
        assert!(filter_excludes("efa", "tcp;ofi_rxm"));
        assert!(filter_excludes("^tcp", "tcp;ofi_rxm"));
        assert!(filter_excludes("shm,efa", "tcp;ofi_rxm"));
        assert!(!filter_excludes("tcp", "tcp;ofi_rxm"));
        assert!(!filter_excludes("tcp;ofi_rxm", "tcp;ofi_rxm"));
        assert!(!filter_excludes("^efa", "tcp;ofi_rxm"));
        assert!(!filter_excludes("", "tcp;ofi_rxm"));
        assert!(!filter_excludes("efa", "efa"));
    }
}
