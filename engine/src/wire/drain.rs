//! A drain's messages: the server's `Drain`, each rank's `Boundary` (its
//! first operation not yet cut), and the server's `SwitchAt`.
use super::{expect_kind, Header, Kind, WireError};
use bytemuck::{Pod, Zeroable};
use core::mem::size_of;
use static_assertions::const_assert_eq;

/// Server to every rank of a running job: this server is draining. It
/// admits no new jobs and exits when no job uses it (or after `timeout_s`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct Drain {
    pub header: Header,
    /// Seconds until the server ends whatever jobs are still on it.
    pub timeout_s: u32,
    pub _pad: u32,
}
const_assert_eq!(size_of::<Drain>(), 16);

/// A rank's answer to a [`Drain`]: the first operation it may still move.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct Boundary {
    pub header: Header,
    /// Index (per job, from 0) of the rank's first all-reduce not yet cut
    /// into chunks; [`Boundary::STAY`]: the rank has no other server.
    pub next_op: u64,
}
const_assert_eq!(size_of::<Boundary>(), 16);

/// The server's decision after every rank's [`Boundary`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct SwitchAt {
    pub header: Header,
    /// All-reduces from this index on go to the other servers only;
    /// [`Boundary::STAY`]: the job stays on this server until it ends.
    pub op: u64,
}
const_assert_eq!(size_of::<SwitchAt>(), 16);

impl Drain {
    pub fn new(timeout_s: u32) -> Drain {
        Drain { header: Header::new(Kind::Drain), timeout_s, _pad: 0 }
    }

    /// Checks the header and the padding.
    pub fn check(&self) -> Result<u32, WireError> {
        expect_kind(&self.header, Kind::Drain)?;
        if self._pad != 0 {
            return Err(WireError::BadPadding);
        }
        Ok(self.timeout_s)
    }
}

impl Boundary {
    /// "I cannot move off this server": the job stays there until it ends.
    pub const STAY: u64 = u64::MAX;

    pub fn new(next_op: u64) -> Boundary {
        Boundary { header: Header::new(Kind::Boundary), next_op }
    }

    pub fn check(&self) -> Result<u64, WireError> {
        expect_kind(&self.header, Kind::Boundary)?;
        Ok(self.next_op)
    }
}

impl SwitchAt {
    pub fn new(op: u64) -> SwitchAt {
        SwitchAt { header: Header::new(Kind::SwitchAt), op }
    }

    pub fn check(&self) -> Result<u64, WireError> {
        expect_kind(&self.header, Kind::SwitchAt)?;
        Ok(self.op)
    }
}
