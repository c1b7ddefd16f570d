//! The kernel's random source (getrandom(2)), for what must not be guessed:
//! a challenge's nonce, a job's secret, a CollNet job id. Not for anything
//! on a data path.

/// `N` bytes from the kernel's CSPRNG.
pub fn bytes<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| std::io::Error::other(format!("the kernel's random source: {e}")))?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_draws_differ() {
        let (a, b) = (super::bytes::<32>().unwrap(), super::bytes::<32>().unwrap());
        assert_ne!(a, b);
        assert_ne!(a, [0; 32]);
    }
}
