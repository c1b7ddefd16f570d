//! Failover's messages: a rank's `Lost` report, the leader's `Failover`
//! (report too) and `Recover` (every report and the switch operation).
use super::*;

/// The largest report a rank may attach to a [`Lost`] (the server keeps
/// one per rank until every rank reported).
pub const MAX_REPORT: u32 = 64 << 10;

/// Rank to the surviving server it takes as the recovery's leader (the
/// first in its server list that it has not lost): it lost the servers in
/// `dead` (bit i: the i-th server of the job's list, the same list on every
/// rank). `boundary` is its first all-reduce not yet cut, as in
/// [`Boundary`]. `report_len` bytes follow: the rank's view of the lost
/// servers' work, opaque to the server, which hands every rank's report to
/// every rank in the [`Recover`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct Lost {
    pub header: Header,
    pub dead: u64,
    pub boundary: u64,
    pub report_len: u32,
    pub _pad: u32,
}

/// Server to every rank of a job: a rank reported losing the servers in
/// `dead` (the union of what ranks reported so far). A rank that has not
/// reported this set reports it (after dropping those servers itself).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct Failover {
    pub header: Header,
    pub dead: u64,
}

/// Server to every rank, once every rank reported the same `dead` set:
/// operations from `switch_op` (the largest boundary) on run without those
/// servers; `nranks` reports of `report_len` bytes follow, in rank order.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct Recover {
    pub header: Header,
    pub dead: u64,
    pub switch_op: u64,
    pub nranks: u32,
    pub report_len: u32,
}

impl Lost {
    pub fn new(dead: u64, boundary: u64, report_len: u32) -> Lost {
        Lost { header: Header::new(Kind::Lost), dead, boundary, report_len, _pad: 0 }
    }

    /// Checks the header, the padding, a non-empty dead set and the report's bound.
    pub fn check(&self) -> Result<(), WireError> {
        expect_kind(&self.header, Kind::Lost)?;
        if self._pad != 0 {
            return Err(WireError::BadPadding);
        }
        if self.dead == 0 || self.report_len > MAX_REPORT {
            return Err(WireError::BadField("lost"));
        }
        Ok(())
    }
}

impl Failover {
    pub fn new(dead: u64) -> Failover {
        Failover { header: Header::new(Kind::Failover), dead }
    }

    pub fn check(&self) -> Result<u64, WireError> {
        expect_kind(&self.header, Kind::Failover)?;
        Ok(self.dead)
    }
}

impl Recover {
    pub fn new(dead: u64, switch_op: u64, nranks: u32, report_len: u32) -> Recover {
        Recover { header: Header::new(Kind::Recover), dead, switch_op, nranks, report_len }
    }

    pub fn check(&self) -> Result<(), WireError> {
        expect_kind(&self.header, Kind::Recover)?;
        if self.dead == 0 || self.report_len > MAX_REPORT || self.nranks == 0 || self.nranks > MAX_RANKS {
            return Err(WireError::BadField("recover"));
        }
        Ok(())
    }
}
