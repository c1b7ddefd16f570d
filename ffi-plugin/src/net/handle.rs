//! Handles and connect messages: what a listener gives NCCL to pass to the
//! connecting side (provider, listen id, nonce, the endpoint's name), and
//! the first message a connecting side sends, both checked on arrival.
use super::*;

pub(super) struct HandleInfo {
    pub(super) provider: u8,
    pub(super) listen_id: u32,
    pub(super) nonce: u32,
    pub(super) token: u64,
    pub(super) name: EndpointName,
}

pub(super) fn encode_handle(provider: u8, listen_id: u32, nonce: u32, name: &EndpointName) -> Result<Handle> {
    let n = name.as_bytes();
    if n.len() > HANDLE_NAME_MAX {
        return Err(Error::System(format!("endpoint name of {} bytes does not fit a {HANDLE_BYTES}-byte handle", n.len())));
    }
    let mut h = [0u8; HANDLE_BYTES];
    h[0..4].copy_from_slice(&HANDLE_MAGIC);
    h[4] = PROTO_VERSION;
    h[5] = provider;
    h[6] = n.len() as u8;
    h[8..12].copy_from_slice(&listen_id.to_le_bytes());
    h[12..16].copy_from_slice(&nonce.to_le_bytes());
    h[HANDLE_NAME_AT..HANDLE_NAME_AT + n.len()].copy_from_slice(n);
    Ok(h)
}

pub(super) fn decode_handle(h: &Handle) -> Result<HandleInfo> {
    if h[0..4] != HANDLE_MAGIC {
        return Err(Error::InvalidUsage("the handle is not a tally ncclNet listen handle".into()));
    }
    if h[4] != PROTO_VERSION {
        return Err(Error::InvalidUsage(format!("handle protocol version {} (this plugin speaks {PROTO_VERSION})", h[4])));
    }
    let len = h[6] as usize;
    let name = (len <= HANDLE_NAME_MAX)
        .then(|| EndpointName::from_bytes(&h[HANDLE_NAME_AT..HANDLE_NAME_AT + len]))
        .flatten()
        .ok_or_else(|| Error::arg(format!("handle names an endpoint of {len} bytes")))?;
    let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
    Ok(HandleInfo {
        provider: h[5],
        listen_id: u32_at(8),
        nonce: u32_at(12),
        token: u64::from_le_bytes(h[TOKEN_AT..TOKEN_AT + 8].try_into().expect("8 bytes")),
        name,
    })
}

pub(super) fn encode_connect(provider: u8, listen_id: u32, nonce: u32, name: &EndpointName) -> Vec<u8> {
    let n = name.as_bytes();
    let mut m = vec![0u8; CONNECT_HEADER + n.len()];
    m[0..4].copy_from_slice(&CONNECT_MAGIC);
    m[4] = PROTO_VERSION;
    m[5] = provider;
    m[6..8].copy_from_slice(&(n.len() as u16).to_le_bytes());
    m[8..12].copy_from_slice(&listen_id.to_le_bytes());
    m[12..16].copy_from_slice(&nonce.to_le_bytes());
    m[CONNECT_HEADER..].copy_from_slice(n);
    m
}

/// Checks a connect message against the listen comm it arrived for; returns
/// the connecting endpoint's name (for the log).
pub(super) fn check_connect(m: &[u8], provider: u8, listen_id: u32, nonce: u32) -> Result<Vec<u8>> {
    if m.len() < CONNECT_HEADER || m[0..4] != CONNECT_MAGIC || m[4] != PROTO_VERSION {
        return Err(Error::Remote(format!("malformed connect message of {} bytes", m.len())));
    }
    if m[5] != provider {
        return Err(Error::InvalidUsage(format!(
            "peer uses provider code {}, this endpoint {provider}: set the same TALLY_PROVIDER on every rank",
            m[5]
        )));
    }
    let len = u16::from_le_bytes([m[6], m[7]]) as usize;
    let id = u32::from_le_bytes(m[8..12].try_into().expect("4 bytes"));
    let n = u32::from_le_bytes(m[12..16].try_into().expect("4 bytes"));
    if id != listen_id || n != nonce || CONNECT_HEADER + len != m.len() {
        return Err(Error::Remote(format!(
            "connect message for listen id {id} nonce {n:#x} arrived at listen id {listen_id} nonce {nonce:#x}"
        )));
    }
    Ok(m[CONNECT_HEADER..].to_vec())
}
