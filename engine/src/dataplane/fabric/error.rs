//! Errors from libfabric, as values.
//!
//! libfabric reports failures as negative `FI_E*` codes; completion queues
//! report per-operation failures as error entries with a provider-specific
//! code and text. Both become small typed values here. A [`CompletionError`]
//! keeps its text in a fixed buffer so that even the error path of the
//! per-chunk loop does not allocate.
use super::sys;
use core::fmt;
use std::ffi::CStr;

/// A failed libfabric call: which call, the (positive) `FI_E*` code, and
/// `fi_strerror`'s text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricError {
    pub call: &'static str,
    pub code: i32,
}

impl FabricError {
    /// From a libfabric return value (negative code).
    pub fn from_ret(call: &'static str, ret: isize) -> Self {
        FabricError { call, code: (-ret) as i32 }
    }

    pub fn is_again(&self) -> bool {
        self.code == sys::FI_EAGAIN as i32
    }

    /// `fi_strerror`'s text for this code.
    pub fn text(&self) -> String {
        strerror(self.code)
    }
}

pub fn strerror(code: i32) -> String {
    // SAFETY: fi_strerror returns a pointer to a static NUL-terminated string for any code.
    unsafe { CStr::from_ptr(sys::fi_strerror(code)) }.to_string_lossy().into_owned()
}

impl fmt::Display for FabricError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {} (-{})", self.call, self.text(), self.code)
    }
}

impl std::error::Error for FabricError {}

/// Why posting an operation did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostError {
    /// The provider's queues are full: poll the completion queue (which also
    /// drives progress) and post again.
    Again,
    /// The context id is outside the endpoint's context table.
    BadContext(u32),
    /// The context id already names an operation in flight.
    ContextBusy(u32),
    /// The memory handle does not belong to this endpoint.
    BadMemory,
    Fabric(FabricError),
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PostError::Again => write!(f, "transmit/receive queue full (try again)"),
            PostError::BadContext(c) => write!(f, "context id {c} out of range"),
            PostError::ContextBusy(c) => write!(f, "context id {c} already in flight"),
            PostError::BadMemory => write!(f, "memory region is not registered on this endpoint"),
            PostError::Fabric(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for PostError {}

const TEXT_LEN: usize = 160;

/// `text` cut to [`TEXT_LEN`] bytes, in place: an error carries its text
/// without allocating.
fn text_buf(text: &[u8]) -> ([u8; TEXT_LEN], usize) {
    let mut buf = [0u8; TEXT_LEN];
    let n = text.len().min(TEXT_LEN);
    buf[..n].copy_from_slice(&text[..n]);
    (buf, n)
}

/// An error completion: the operation named by `context` failed.
#[derive(Clone)]
pub struct CompletionError {
    /// The context id of the failed operation, when the provider reported it.
    pub context: Option<u32>,
    /// Whether it was a send or a receive (`FI_SEND` / `FI_RECV` flags).
    pub flags: u64,
    /// Positive `FI_E*` code (e.g. `FI_ETRUNC`, `FI_ECANCELED`).
    pub code: i32,
    pub prov_errno: i32,
    pub tag: u64,
    pub len: usize,
    /// Bytes that did not fit, for truncation errors.
    pub overflow: usize,
    text: [u8; TEXT_LEN],
    text_len: u8,
}

impl CompletionError {
    pub(super) fn new(e: &sys::fi_cq_err_entry, context: Option<u32>, text: &[u8]) -> Self {
        let (buf, n) = text_buf(text);
        CompletionError {
            context,
            flags: e.flags,
            code: e.err.abs(),
            prov_errno: e.prov_errno,
            tag: e.tag,
            len: e.len,
            overflow: e.olen,
            text: buf,
            text_len: n as u8,
        }
    }

    /// An operation the provider refused when it was posted, reported as
    /// its failure (a rail thread posts for the client and hands back
    /// completions, not post results).
    pub fn refused(context: u32, code: i32, text: &str) -> Self {
        let (buf, n) = text_buf(text.as_bytes());
        CompletionError { context: Some(context), flags: 0, code, prov_errno: 0, tag: 0, len: 0, overflow: 0, text: buf, text_len: n as u8 }
    }

    /// `fi_cq_strerror`'s text for the provider error.
    pub fn text(&self) -> &str {
        core::str::from_utf8(&self.text[..self.text_len as usize]).unwrap_or("?")
    }

    pub fn is_truncation(&self) -> bool {
        self.code == sys::FI_ETRUNC as i32
    }

    pub fn is_canceled(&self) -> bool {
        self.code == sys::FI_ECANCELED as i32
    }

    /// A peek that found no unexpected message (`Endpoint::peek_unexpected`).
    pub fn is_no_message(&self) -> bool {
        self.code == sys::FI_ENOMSG as i32
    }
}

impl fmt::Debug for CompletionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for CompletionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dir = if self.flags & sys::FI_RECV as u64 != 0 {
            "receive"
        } else if self.flags & sys::FI_SEND as u64 != 0 {
            "send"
        } else {
            "operation"
        };
        write!(
            f,
            "{dir} completed with error: {} (-{}), provider error {}: {} (context {:?}, tag {:#x}, len {}, overflow {})",
            strerror(self.code),
            self.code,
            self.prov_errno,
            self.text(),
            self.context,
            self.tag,
            self.len,
            self.overflow
        )
    }
}

impl std::error::Error for CompletionError {}

/// Why polling failed.
#[derive(Debug, Clone)]
pub enum PollError {
    /// One operation failed; the endpoint is still usable.
    Completion(CompletionError),
    /// The completion queue itself failed.
    Fabric(FabricError),
}

impl fmt::Display for PollError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PollError::Completion(e) => e.fmt(f),
            PollError::Fabric(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for PollError {}
