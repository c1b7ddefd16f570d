//! Objects handed to NCCL as `void*`, each tagged with its kind, and the one
//! way back from `void*` to a Rust value.
//!
//! NCCL's plugin ABI carries every object the plugin makes (contexts, listen
//! comms, comms, memory handles, requests) as `void*` and passes it back in
//! later calls. Casting that pointer to whatever type the call expects would
//! trust NCCL to pass the right kind: a CollNet comm where a ncclNet send
//! comm belongs (an NCCL bug, or the functions of one table version mixed
//! with another's) would be read as the wrong type, which is undefined
//! behaviour. So, after rustls-ffi's `Castable`, adapted to an ABI whose
//! pointers are all `void*`:
//!
//! - **at compile time**, each kind of object handed out implements
//!   [`HandedOut`], which names its [`Kind`]. [`borrow`], [`borrow_mut`] and
//!   [`take`] are the only ways from `void*` back to a Rust value, and they
//!   accept only such types: an entry point cannot name an arbitrary one.
//!   Only [`Boxed`] kinds (those made by [`hand_out`]) can be taken back and
//!   freed; requests, which are slots inside their comm, cannot.
//! - **at run time**, each object lives in a [`Tagged`]: `#[repr(C)]`, its
//!   kind's magic number first. The tag is written when the object is made,
//!   checked before every use, and overwritten with [`CLOSED`] when NCCL
//!   closes the object (the tags of the request slots inside a comm too). A
//!   pointer to a live object of another kind, or to one already closed
//!   whose memory is still mapped and not yet reused, is refused with
//!   `ncclInvalidArgument`, naming the kind expected and the kind found.
//!
//! What the tag cannot do: it is read before it is checked, so a pointer
//! that never came from this plugin (garbage, freed and unmapped memory) is
//! still read as 8 bytes, undefined behaviour wherever nothing readable is
//! there. The memory of a closed object goes back to the allocator, which
//! may write over the tag (the pointer is refused as carrying an unknown
//! tag) or give the memory to a new object of the same kind (then the stale
//! pointer reaches the new object: only never freeing could tell the two
//! apart). The tag turns NCCL's mistakes with live objects into errors, and
//! most uses after close too; it does not make a dangling pointer safe.
use crate::collnet::{CollComm, CollCtx, CollListen, CollMr, CollRequest};
use crate::error::{Error, Result};
use crate::net::conn::{Conn, Mr, Request};
use crate::net::{ListenComm, NetCtx};
use std::ffi::c_void;
use std::ops::{Deref, DerefMut};

/// A kind of object handed to NCCL: what error messages call it, and the
/// magic number its [`Tagged`] carries while it is open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind {
    pub name: &'static str,
    pub magic: u64,
}

/// Eight ASCII bytes as a tag: readable in a memory dump, and far from the
/// small integers and pointers an object of another type starts with.
const fn magic(text: &[u8; 8]) -> u64 {
    u64::from_le_bytes(*text)
}

pub const NET_CONTEXT: Kind = Kind { name: "a ncclNet context", magic: magic(b"TLYnctx\x01") };
pub const NET_LISTEN_COMM: Kind = Kind { name: "a ncclNet listen comm", magic: magic(b"TLYnlst\x01") };
pub const NET_COMM: Kind = Kind { name: "a ncclNet send or receive comm", magic: magic(b"TLYncom\x01") };
pub const NET_MEMORY_HANDLE: Kind = Kind { name: "a ncclNet memory handle", magic: magic(b"TLYnmr\x00\x01") };
pub const NET_REQUEST: Kind = Kind { name: "a ncclNet request", magic: magic(b"TLYnreq\x01") };
pub const COLL_CONTEXT: Kind = Kind { name: "a CollNet context", magic: magic(b"TLYcctx\x01") };
pub const COLL_LISTEN_COMM: Kind = Kind { name: "a CollNet listen comm", magic: magic(b"TLYclst\x01") };
pub const COLL_COMM: Kind = Kind { name: "a CollNet comm", magic: magic(b"TLYccom\x01") };
pub const COLL_MEMORY_HANDLE: Kind = Kind { name: "a CollNet memory handle", magic: magic(b"TLYcmr\x00\x01") };
pub const COLL_REQUEST: Kind = Kind { name: "a CollNet request", magic: magic(b"TLYcreq\x01") };

/// Every kind, to name the one a wrong pointer carries.
pub const KINDS: [Kind; 10] = [
    NET_CONTEXT,
    NET_LISTEN_COMM,
    NET_COMM,
    NET_MEMORY_HANDLE,
    NET_REQUEST,
    COLL_CONTEXT,
    COLL_LISTEN_COMM,
    COLL_COMM,
    COLL_MEMORY_HANDLE,
    COLL_REQUEST,
];

/// The tag of an object NCCL has closed.
pub const CLOSED: u64 = magic(b"TLYclosd");

/// A type whose values the plugin hands to NCCL as `void*`.
pub trait HandedOut: Sized {
    const KIND: Kind;

    /// Called once the object sits where NCCL's pointer points (`at`, that
    /// pointer as a number): a comm gives its request slots their owner.
    fn placed(&mut self, _at: usize) {}

    /// Called as NCCL closes the object: the tags of what it holds and NCCL
    /// also has pointers to (request slots) are closed with it.
    fn closing(&mut self) {}
}

/// A kind that lives in a `Box` of its own, made by [`hand_out`] and freed
/// by [`take`] (every kind but requests).
pub trait Boxed: HandedOut {}

/// An object as NCCL's pointer sees it: its kind's tag, then the object.
#[repr(C)]
pub struct Tagged<T: HandedOut> {
    tag: u64,
    value: T,
}

impl<T: HandedOut> Tagged<T> {
    /// `value`, tagged as open. For slots inside another object (requests);
    /// a [`Boxed`] kind is made by [`hand_out`].
    pub fn new(value: T) -> Tagged<T> {
        Tagged { tag: T::KIND.magic, value }
    }

    /// The pointer NCCL is given for this object.
    pub fn as_handed(&self) -> *mut c_void {
        self as *const Tagged<T> as *mut c_void
    }

    /// Marks the object closed. A volatile write: the memory is freed right
    /// after, and a plain store to memory about to be freed may be dropped
    /// by the optimiser.
    pub fn close(&mut self) {
        // SAFETY: a pointer made from a live `&mut`: valid and aligned.
        unsafe { std::ptr::write_volatile(&mut self.tag, CLOSED) };
    }
}

impl<T: HandedOut> Deref for Tagged<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: HandedOut> DerefMut for Tagged<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

/// Boxes `value` with its tag and returns the pointer to give NCCL; NCCL
/// gives it back to [`take`] when it closes the object.
pub fn hand_out<T: Boxed>(value: T) -> *mut c_void {
    let mut boxed = Box::new(Tagged::new(value));
    // A Box's contents do not move: this address is the one NCCL gets.
    let at = &*boxed as *const Tagged<T> as usize;
    boxed.value.placed(at);
    Box::into_raw(boxed).cast::<c_void>()
}

/// What a tag says, for an error message.
fn found(tag: u64) -> String {
    match KINDS.iter().find(|k| k.magic == tag) {
        Some(k) => k.name.to_string(),
        None if tag == CLOSED => "an object already closed".to_string(),
        None => format!("not an object of this plugin (its first 8 bytes are {tag:#018x})"),
    }
}

/// `p` as a `Tagged<T>`, once its tag says it is an open object of `T`'s kind.
///
/// # Safety
/// `p` must be NULL or readable for 8 bytes at an 8-aligned address (misaligned
/// ones are refused): true of every pointer this plugin hands out, closed
/// ones whose memory is still mapped included; see the module doc for what
/// is not caught.
unsafe fn check<T: HandedOut>(p: *mut c_void, what: &str) -> Result<*mut Tagged<T>> {
    if p.is_null() {
        return Err(Error::arg(format!("{what} is NULL")));
    }
    if !(p as usize).is_multiple_of(align_of::<u64>()) {
        return Err(Error::arg(format!("{what} ({p:p}) is misaligned: not {}", T::KIND.name)));
    }
    // SAFETY: readable and aligned (the caller's contract, the check above).
    // Read as a bare u64, not through `Tagged<T>`: until the tag matches,
    // nothing says the memory holds a `T`.
    let tag = unsafe { p.cast::<u64>().read() };
    if tag != T::KIND.magic {
        return Err(Error::arg(format!("{what} is {}, not {}", found(tag), T::KIND.name)));
    }
    Ok(p.cast::<Tagged<T>>())
}

/// The object behind `p`, checked to be an open one of `T`'s kind.
///
/// # Safety
/// As [`check`]; and the object is not closed while the reference lives
/// (NCCL's contract: no call on an object races with its close).
pub unsafe fn borrow<'a, T: HandedOut>(p: *mut c_void, what: &str) -> Result<&'a T> {
    // SAFETY: the caller's contract.
    let t = unsafe { check::<T>(p, what)? };
    // SAFETY: the tag matched: `t` points to an open `Tagged<T>` made by
    // this plugin, unless NCCL passed memory that merely holds this kind's
    // magic (a pointer the plugin never made: the module doc's limits).
    Ok(unsafe { &(*t).value })
}

/// As [`borrow`], mutable.
///
/// # Safety
/// As [`borrow`], and no other reference to the object lives meanwhile
/// (NCCL does not call on one object from two threads at once).
pub unsafe fn borrow_mut<'a, T: HandedOut>(p: *mut c_void, what: &str) -> Result<&'a mut T> {
    // SAFETY: the caller's contract.
    let t = unsafe { check::<T>(p, what)? };
    // SAFETY: as in `borrow`; exclusive by the caller's contract.
    Ok(unsafe { &mut (*t).value })
}

/// Takes back an object NCCL closes: its tag (and those of the slots inside
/// it) marked closed, its memory freed, the value returned.
///
/// # Safety
/// As [`borrow`], and nothing else uses the object afterwards (NCCL closes
/// each object once; a second close of memory not yet reused is refused).
pub unsafe fn take<T: Boxed>(p: *mut c_void, what: &str) -> Result<T> {
    // SAFETY: the caller's contract.
    let t = unsafe { check::<T>(p, what)? };
    // SAFETY: an open `Tagged<T>` of a Boxed kind was made by `hand_out`'s
    // `Box::into_raw`, and is taken back once (its tag is closed below).
    let mut boxed = unsafe { Box::from_raw(t) };
    boxed.value.closing();
    boxed.close();
    Ok(boxed.value)
}

/// The kinds made by [`hand_out`] that hold nothing NCCL points into.
macro_rules! boxed_kinds {
    ($($ty:ty => $kind:expr),* $(,)?) => {
        $(
            impl HandedOut for $ty {
                const KIND: Kind = $kind;
            }
            impl Boxed for $ty {}
        )*
    };
}

boxed_kinds! {
    NetCtx => NET_CONTEXT,
    ListenComm => NET_LISTEN_COMM,
    Mr => NET_MEMORY_HANDLE,
    CollCtx => COLL_CONTEXT,
    CollListen => COLL_LISTEN_COMM,
    CollMr => COLL_MEMORY_HANDLE,
}

/// The comms: made by [`hand_out`], with request slots NCCL points into,
/// which learn their owner when the comm is placed and close with it.
macro_rules! comm_kinds {
    ($($ty:ty => $kind:expr),* $(,)?) => {
        $(
            impl HandedOut for $ty {
                const KIND: Kind = $kind;
                fn placed(&mut self, at: usize) {
                    self.set_requests_owner(at);
                }
                fn closing(&mut self) {
                    self.close_requests();
                }
            }
            impl Boxed for $ty {}
        )*
    };
}

comm_kinds! {
    Conn => NET_COMM,
    CollComm => COLL_COMM,
}

impl HandedOut for Request {
    const KIND: Kind = NET_REQUEST;
}

impl HandedOut for CollRequest {
    const KIND: Kind = COLL_REQUEST;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_tag() {
        for (i, a) in KINDS.iter().enumerate() {
            assert_ne!(a.magic, CLOSED, "{}", a.name);
            for b in &KINDS[i + 1..] {
                assert_ne!(a.magic, b.magic, "{} and {}", a.name, b.name);
                assert_ne!(a.name, b.name);
            }
        }
    }

    #[test]
    fn a_pointer_of_another_kind_or_closed_is_refused_by_name() {
        let p = hand_out(CollMr { addr: 0, len: 0 });
        // SAFETY: p is a live object handed out above.
        let e = unsafe { borrow::<Mr>(p, "mhandle") }.err().unwrap();
        assert_eq!(e, Error::arg("mhandle is a CollNet memory handle, not a ncclNet memory handle"));
        // SAFETY: as above.
        assert_eq!(unsafe { borrow::<CollMr>(p, "mhandle") }.unwrap().len, 0);
        // SAFETY: as above; taken once.
        let mr = unsafe { take::<CollMr>(p, "mhandle") }.unwrap();
        assert_eq!(mr.addr, 0);
        let mut slot = Tagged::new(CollRequest { owner: 0, index: 3 });
        slot.close();
        // SAFETY: a live slot, closed.
        let e = unsafe { borrow::<CollRequest>(slot.as_handed(), "request") }.err().unwrap();
        assert_eq!(e, Error::arg("request is an object already closed, not a CollNet request"));
        let word = [0x1234u64];
        // SAFETY: 8 readable, aligned bytes.
        let e = unsafe { borrow::<CollRequest>(word.as_ptr() as *mut c_void, "request") }.err().unwrap();
        assert!(e.to_string().contains("not an object of this plugin (its first 8 bytes are 0x0000000000001234)"), "{e}");
        // SAFETY: misaligned: refused before any read.
        let e = unsafe { borrow::<CollRequest>((word.as_ptr() as *mut u8).wrapping_add(1).cast(), "request") }.err().unwrap();
        assert!(e.to_string().contains("misaligned"), "{e}");
    }
}
