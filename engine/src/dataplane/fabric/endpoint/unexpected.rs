//! The provider's queue of unexpected messages: what arrived for no posted
//! receive, held by the provider until a receive matches it. Anyone who can
//! reach an endpoint can fill that queue (tcp;ofi_rxm 1.17 keeps each such
//! message in a buffer of its own, malloc'ed past its 16 KiB bounce
//! buffers, and never gives one up), so its owner looks at the oldest entry
//! now and then and discards what no receive of its will ever take.
//!
//! Both calls are `fi_trecvmsg` with `FI_PEEK` (the oldest message's tag
//! and length, in a completion of the given context; an error completion
//! with `FI_ENOMSG` when there is none) and with `FI_PEEK | FI_DISCARD`
//! (the oldest message of exactly that tag dropped; a completion of length
//! 0). Neither receives anything into memory of ours. ofi_rxm implements
//! both on its own queue (`rxm_peek_recv`, prov/rxm/src/rxm_tagged.c) and
//! writes their completions before it returns; shm and efa are not
//! asked (see [`Endpoint::can_sweep`]).
use super::Endpoint;
use crate::dataplane::fabric::call_watch::Call;
use crate::dataplane::fabric::error::PostError;
use crate::dataplane::fabric::sys;
use std::ptr;

/// Whether endpoints of `provider` can look at and discard their
/// unexpected messages ([`Endpoint::can_sweep`]).
pub fn provider_can_sweep(provider: &str) -> bool {
    provider.contains("ofi_rxm")
}

impl Endpoint {
    /// Whether this endpoint's unexpected messages can be looked at and
    /// discarded. tcp;ofi_rxm: yes. shm serves one host (its peers are
    /// local processes) and 1.17 keeps one tag mask per endpoint (module
    /// doc), which a peek's mask would disturb; efa's peek is untried here.
    pub fn can_sweep(&self) -> bool {
        provider_can_sweep(self.provider())
    }

    /// Asks for the tag and length of the oldest unexpected message, as a
    /// completion of `context`; or a failed completion that
    /// [`CompletionError::is_no_message`] when there is none.
    pub fn peek_unexpected(&mut self, context: u32) -> Result<(), PostError> {
        self.peek(sys::FI_PEEK as u64, 0, u64::MAX, context)
    }

    /// Discards the oldest unexpected message whose tag is exactly `tag`;
    /// its completion (of `context`) has length 0.
    pub fn discard_unexpected(&mut self, tag: u64, context: u32) -> Result<(), PostError> {
        self.peek(sys::FI_PEEK as u64 | sys::FI_DISCARD, tag, 0, context)
    }

    fn peek(&mut self, flags: u64, tag: u64, ignore: u64, context: u32) -> Result<(), PostError> {
        let ctx = self.take_context(context)?;
        let msg = sys::fi_msg_tagged {
            msg_iov: ptr::null(),
            desc: ptr::null_mut(),
            iov_count: 0,
            addr: sys::FI_ADDR_UNSPEC,
            tag,
            ignore,
            context: ctx,
            data: 0,
        };
        self.watch.enter(Call::Recv);
        // SAFETY: ep is open; a peek names no buffer (iov_count 0), and its
        // context points into the context table, which outlives it.
        let ret = unsafe { sys::fi_trecvmsg(self.ep, &msg, flags) };
        self.watch.leave();
        self.posted(context, ret, "fi_trecvmsg (FI_PEEK)", false)
    }
}
