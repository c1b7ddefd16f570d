//! Choosing a provider and asking libfabric for a matching interface.
//!
//! tally asks for reliable datagram endpoints (`FI_EP_RDM`) with tagged
//! messages and directed receive, manual progress (the poll loop drives the
//! provider; no hidden progress threads) and the memory-registration modes EFA
//! insists on (`FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
//! FI_MR_PROV_KEY`). Providers that need less clear those bits in their answer.
use super::error::FabricError;
use super::sys;
use std::ffi::{CStr, CString};
use std::ptr;

/// What a provider name on the command line means to libfabric.
/// `tcp` alone is expanded to `tcp;ofi_rxm`: the plain tcp RDM endpoint has
/// hung under other NCCL plugins (see platform.md). `tcp-rdm` asks for that
/// plain endpoint (libfabric 1.18 and later; an experiment, see
/// docs/measurements.md "Rails").
pub fn canonical_provider(name: &str) -> String {
    match name.trim() {
        "tcp" | "rxm" | "tcp;ofi_rxm" | "ofi_rxm;tcp" => "tcp;ofi_rxm".to_string(),
        "tcp-rdm" => "tcp".to_string(),
        other => other.to_string(),
    }
}

/// The provider to use: the explicit request, else `TALLY_PROVIDER`, else
/// `efa` where a device exists, else `shm` when every peer is on this host,
/// else `tcp;ofi_rxm`.
pub fn select_provider(requested: Option<&str>, peers_on_this_host: bool) -> String {
    if let Some(p) = requested.filter(|p| !p.is_empty()) {
        return canonical_provider(p);
    }
    if let Ok(p) = std::env::var("TALLY_PROVIDER") {
        if !p.is_empty() {
            return canonical_provider(&p);
        }
    }
    if provider_available("efa") {
        "efa".into()
    } else if peers_on_this_host && provider_available("shm") {
        "shm".into()
    } else {
        "tcp;ofi_rxm".into()
    }
}

/// Whether `fi_getinfo` finds an RDM tagged interface for `provider`.
pub fn provider_available(provider: &str) -> bool {
    InfoList::get(&Hints::new(provider)).is_ok()
}

/// The libfabric library's version, as (major, minor).
pub fn library_version() -> (u32, u32) {
    // SAFETY: fi_version takes no arguments and only returns a constant.
    let v = unsafe { sys::fi_version() };
    (v >> 16, v & 0xffff)
}

/// The headers' version this crate was built against.
pub const HEADER_VERSION: (u32, u32) = (sys::FI_MAJOR_VERSION, sys::FI_MINOR_VERSION);

/// What tally asks of a provider.
#[derive(Debug, Clone)]
pub struct Hints {
    /// libfabric provider name, e.g. `efa`, `shm`, `tcp;ofi_rxm`.
    pub provider: String,
    /// Local address to bind (with `FI_SOURCE`), e.g. `127.0.0.1` for tcp on
    /// loopback. `None` lets the provider choose.
    pub node: Option<String>,
    /// Ask for manual progress. Providers that only offer auto progress are
    /// retried without it.
    pub manual_progress: bool,
    /// A specific domain (NIC), e.g. `rdmap16s27-rdm` on a multi-rail host.
    pub domain: Option<String>,
}

impl Hints {
    pub fn new(provider: &str) -> Self {
        Hints { provider: canonical_provider(provider), node: None, manual_progress: true, domain: None }
    }

    pub fn with_node(mut self, node: Option<&str>) -> Self {
        self.node = node.map(str::to_string);
        self
    }
}

/// An owned `fi_info` list from `fi_getinfo`; the first entry is used.
pub struct InfoList {
    pub(super) head: *mut sys::fi_info,
}

// SAFETY: the list is plain heap data owned by this value; libfabric keeps no
// reference to it and it is only read through &self.
unsafe impl Send for InfoList {}

/// The MR modes EFA needs; a provider that needs fewer clears bits in its answer.
pub const MR_MODE_WANTED: u32 = sys::FI_MR_LOCAL | sys::FI_MR_VIRT_ADDR | sys::FI_MR_ALLOCATED | sys::FI_MR_PROV_KEY;

impl InfoList {
    pub fn get(h: &Hints) -> Result<InfoList, FabricError> {
        let list = match Self::get_once(h, h.manual_progress) {
            Err(e) if h.manual_progress && e.code == sys::FI_ENODATA as i32 => Self::get_once(h, false),
            r => r,
        };
        // efa answers "no data" where the host has no EFA device, the usual
        // case of `--provider efa` on a developer's machine: say so, in the
        // words `tally doctor` and `--check` use, rather than only errno's.
        let list = match list {
            Err(e) if h.provider == "efa" && e.code == sys::FI_ENODATA as i32 => {
                return Err(FabricError { call: "fi_getinfo (no EFA device on this host: see `tally doctor`)", code: e.code });
            }
            r => r,
        }?;
        // Asked for tcp's own RDM endpoint (`tcp-rdm`), libfabric before 1.18
        // answers with rxm layered over tcp's MSG endpoint: not what was asked.
        if h.provider == "tcp" && list.provider_name() != "tcp" {
            return Err(FabricError {
                call: "fi_getinfo (tcp-rdm: this libfabric offers tcp's RDM endpoint only through ofi_rxm; it needs 1.18 or later)",
                code: sys::FI_ENODATA as i32,
            });
        }
        Ok(list)
    }

    fn get_once(h: &Hints, manual: bool) -> Result<InfoList, FabricError> {
        super::defaults::apply();
        let prov = CString::new(h.provider.as_str()).map_err(|_| FabricError { call: "fi_getinfo", code: sys::FI_EINVAL as i32 })?;
        let node = h.node.as_deref().map(|n| CString::new(n).unwrap_or_default());
        let domain = h.domain.as_deref().map(|n| CString::new(n).unwrap_or_default());
        // SAFETY: fi_allocinfo returns a zeroed fi_info with all attribute
        // structs allocated (or NULL on ENOMEM, checked). Every string stored
        // into it is strdup'ed, because fi_freeinfo frees it with free().
        unsafe {
            let hints = sys::fi_allocinfo();
            if hints.is_null() {
                return Err(FabricError { call: "fi_allocinfo", code: sys::FI_ENOMEM as i32 });
            }
            (*hints).caps = sys::FI_TAGGED as u64 | sys::FI_MSG as u64 | sys::FI_DIRECTED_RECV;
            (*hints).mode = sys::FI_CONTEXT | sys::FI_CONTEXT2;
            (*(*hints).ep_attr).type_ = sys::fi_ep_type_FI_EP_RDM;
            let d = &mut *(*hints).domain_attr;
            d.mr_mode = MR_MODE_WANTED as i32;
            d.threading = sys::fi_threading_FI_THREAD_DOMAIN;
            if manual {
                d.data_progress = sys::fi_progress_FI_PROGRESS_MANUAL;
                d.control_progress = sys::fi_progress_FI_PROGRESS_MANUAL;
            }
            (*(*hints).fabric_attr).prov_name = libc::strdup(prov.as_ptr());
            if let Some(d) = &domain {
                (*(*hints).domain_attr).name = libc::strdup(d.as_ptr());
            }
            let mut info: *mut sys::fi_info = ptr::null_mut();
            let (node_ptr, flags) = match &node {
                Some(n) => (n.as_ptr(), sys::FI_SOURCE),
                None => (ptr::null(), 0),
            };
            let ret = sys::fi_getinfo(
                sys::make_version(sys::FI_MAJOR_VERSION, sys::FI_MINOR_VERSION),
                node_ptr,
                ptr::null(),
                flags,
                hints,
                &mut info,
            );
            sys::fi_freeinfo(hints);
            if ret != 0 {
                return Err(FabricError::from_ret("fi_getinfo", ret as isize));
            }
            if info.is_null() {
                return Err(FabricError { call: "fi_getinfo", code: sys::FI_ENODATA as i32 });
            }
            Ok(InfoList { head: info })
        }
    }

    fn first(&self) -> &sys::fi_info {
        // SAFETY: head is non-null (checked in get) and owned by self.
        unsafe { &*self.head }
    }

    /// The provider's name as it reports it (e.g. `tcp;ofi_rxm`).
    pub fn provider_name(&self) -> String {
        // SAFETY: fabric_attr and prov_name are set by fi_getinfo for every entry.
        unsafe { cstr_or_empty((*self.first().fabric_attr).prov_name) }
    }

    /// The domain (device) name, e.g. `rdmap0s6-rdm` for EFA, `shm` for shm.
    pub fn domain_name(&self) -> String {
        // SAFETY: domain_attr is set by fi_getinfo for every entry.
        unsafe { cstr_or_empty((*self.first().domain_attr).name) }
    }

    pub fn mr_mode(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.first().domain_attr).mr_mode as u32 }
    }

    /// Largest message the endpoint accepts.
    pub fn max_msg_size(&self) -> usize {
        // SAFETY: as above.
        unsafe { (*self.first().ep_attr).max_msg_size }
    }

    /// Largest message `fi_tinject` takes (`tx_attr->inject_size`): sent
    /// from a copy at once, with no completion to wait for.
    pub fn inject_size(&self) -> usize {
        // SAFETY: tx_attr is set by fi_getinfo for every entry.
        unsafe { (*self.first().tx_attr).inject_size }
    }

    /// Receive queue depth the provider offers (`rx_attr->size`).
    pub fn rx_size(&self) -> usize {
        // SAFETY: as above; rx_attr is set by fi_getinfo for every entry.
        unsafe { (*self.first().rx_attr).size }
    }

    /// Every distinct domain (NIC) offered, in order: one NCCL device each.
    pub fn domains(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut p = self.head;
        while !p.is_null() {
            // SAFETY: walking the list fi_getinfo returned; each node is valid.
            let name = unsafe { cstr_or_empty((*(*p).domain_attr).name) };
            if !out.contains(&name) {
                out.push(name);
            }
            // SAFETY: a node of that list; its `next` is the list's next node or null.
            // SAFETY: a node of that list; its `next` is the list's next node or null.
            p = unsafe { (*p).next };
        }
        out
    }
}

impl Drop for InfoList {
    fn drop(&mut self) {
        // SAFETY: head came from fi_getinfo and is freed exactly once.
        unsafe { sys::fi_freeinfo(self.head) }
    }
}

/// Every provider libfabric lists (`fi_info -l`), whatever its endpoint types.
pub fn list_providers() -> Vec<String> {
    super::defaults::apply();
    let mut out = Vec::new();
    let mut info: *mut sys::fi_info = ptr::null_mut();
    // SAFETY: NULL hints asks for everything; the result list is freed below.
    let ret = unsafe {
        sys::fi_getinfo(
            sys::make_version(sys::FI_MAJOR_VERSION, sys::FI_MINOR_VERSION),
            ptr::null(),
            ptr::null(),
            0,
            ptr::null_mut(),
            &mut info,
        )
    };
    if ret != 0 {
        return out;
    }
    let mut p = info;
    while !p.is_null() {
        // SAFETY: walking the list fi_getinfo returned.
        let name = unsafe { cstr_or_empty((*(*p).fabric_attr).prov_name) };
        if !out.contains(&name) {
            out.push(name);
        }
        // SAFETY: a node of that list; its `next` is the list's next node or null.
        p = unsafe { (*p).next };
    }
    // SAFETY: info came from fi_getinfo.
    unsafe { sys::fi_freeinfo(info) };
    out
}

unsafe fn cstr_or_empty(p: *const libc::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: libfabric strings are NUL-terminated (caller passes one).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}
