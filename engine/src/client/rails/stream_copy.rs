//! Copying a staged result into the caller's buffer with streaming stores.
//!
//! With failover on, results land in a staging slot and the copier, a rail
//! thread or (with one endpoint, on the caller's thread) `Stage::land`
//! copies them into the caller's buffer (`failover` says why).
//! The slot was just written by the kernel's receive, so it is in a cache;
//! the caller's buffer is not, and will not be read before the operation
//! completes. Ordinary stores first read each destination line (a read for
//! ownership) and then evict other lines, the staging slots and socket
//! buffers among them, to make room. Streaming (non-temporal) stores write
//! whole lines to memory without either. x86-64 only (SSE2, the baseline);
//! elsewhere an ordinary copy. `TALLY_STAGE_COPY=plain` turns it off.
//!
//! Streaming stores are weakly ordered: [`copy`] ends with a store fence, so
//! the bytes are visible before the completion that hands them over.

/// Below this the head/tail handling outweighs the gain (x86-64 only: the
/// only streaming copy there is).
#[cfg(target_arch = "x86_64")]
const MIN_STREAM: usize = 4096;

/// Whether rails stream their copies (`TALLY_STAGE_COPY`: `stream`, the
/// default, or `plain`).
pub fn wanted() -> bool {
    !std::env::var("TALLY_STAGE_COPY").is_ok_and(|v| v.trim().eq_ignore_ascii_case("plain"))
}

/// Copies `len` bytes from `from` to `to`, streaming when `stream` and the
/// copy is large enough.
///
/// # Safety
/// `from` is valid for `len` bytes of reads, `to` for `len` bytes of writes,
/// and the two do not overlap.
#[inline]
pub unsafe fn copy(from: *const u8, to: *mut u8, len: usize, stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if stream && len >= MIN_STREAM {
        // SAFETY: the caller's contract, passed on.
        unsafe { copy_streaming(from, to, len) };
        return;
    }
    let _ = stream;
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(from, to, len) };
}

#[cfg(target_arch = "x86_64")]
unsafe fn copy_streaming(from: *const u8, to: *mut u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // Ordinary copy up to the destination's first 64-byte boundary.
    let head = to.align_offset(64).min(len);
    // SAFETY: head <= len, inside both buffers.
    unsafe { std::ptr::copy_nonoverlapping(from, to, head) };
    let body = (len - head) / 64 * 64;
    let mut off = head;
    while off < head + body {
        // SAFETY: [off, off + 64) lies inside both buffers (off + 64 <= head
        // + body <= len); `to + off` is 64-byte aligned (head aligned it and
        // off advances by 64), as _mm_stream_si128 wants 16; the loads are
        // unaligned ones. SSE2 is part of x86-64.
        unsafe {
            let s = from.add(off).cast::<__m128i>();
            let d = to.add(off).cast::<__m128i>();
            let (a, b, c, e) = (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)), _mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
        }
        off += 64;
    }
    // SAFETY: the rest, [off, len), inside both buffers; then the fence that
    // orders the streaming stores before whatever this thread stores next
    // (the completion handed to the client).
    unsafe {
        std::ptr::copy_nonoverlapping(from.add(off), to.add(off), len - off);
        _mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::copy;

    #[test]
    fn every_byte_lands_whatever_the_alignment_and_length() {
        let src: Vec<u8> = (0..70_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for &len in &[0usize, 1, 63, 64, 4095, 4096, 4097, 65_536, 65_536 + 17, 69_000] {
            for &(s_off, d_off) in &[(0usize, 0usize), (1, 0), (0, 1), (3, 61), (17, 64), (64, 7)] {
                if s_off + len > src.len() {
                    continue;
                }
                for stream in [false, true] {
                    let mut dst = vec![0xA5u8; len + d_off + 64];
                    // SAFETY: both ranges lie inside their vectors, which do not overlap.
                    unsafe { copy(src.as_ptr().add(s_off), dst.as_mut_ptr().add(d_off), len, stream) };
                    assert_eq!(&dst[d_off..d_off + len], &src[s_off..s_off + len], "len {len} src+{s_off} dst+{d_off} stream {stream}");
                    assert!(dst[..d_off].iter().all(|&b| b == 0xA5), "wrote before the destination");
                    assert!(dst[d_off + len..].iter().all(|&b| b == 0xA5), "wrote past the destination");
                }
            }
        }
    }
}
