//! Byte sizes with binary suffixes.
//!
//! Everything the operator types as a size (slot sizes, chunk sizes, how much
//! hugepage memory to reserve) goes through [`parse_size`], and every size a
//! table or a log line shows goes through [`format_size`], so the two agree.
//!
//! Suffixes are always binary: `K` is 1024, `M` is 1024², and so on, whether
//! written `4K`, `4k`, `4KB` or `4KiB`. Hugepage sizes, slot sizes and
//! registration lengths are all powers of two, and a decimal kilobyte would
//! silently give a size that is not a multiple of any page.
//!
//! A fractional number is accepted when it names a whole number of bytes
//! (`1.5G`, `0.5K`), so what [`format_size`] prints can be pasted back in.

// `u64::is_multiple_of` needs Rust 1.87; the workspace's rust-version is 1.80.
#![allow(clippy::manual_is_multiple_of)]

use core::fmt;

/// The multipliers, in order, with the letter that names each.
const UNITS: [(char, u64); 6] = [('K', 1 << 10), ('M', 1 << 20), ('G', 1 << 30), ('T', 1 << 40), ('P', 1 << 50), ('E', 1 << 60)];

/// Why a size string was refused. Each variant names the input as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitsError {
    /// Nothing but whitespace.
    Empty,
    /// Not a number followed by an optional suffix.
    Invalid { input: String, reason: &'static str },
    /// The size does not fit in 64 bits.
    Overflow { input: String },
}

impl fmt::Display for UnitsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnitsError::Empty => write!(f, "empty size (expected e.g. 4096, 64K, 2M, 1G)"),
            UnitsError::Invalid { input, reason } => {
                write!(f, "invalid size {input:?}: {reason} (expected e.g. 4096, 64K, 2M, 1G)")
            }
            UnitsError::Overflow { input } => {
                write!(f, "size {input:?} is too large (more than 2^64 - 1 bytes)")
            }
        }
    }
}

impl std::error::Error for UnitsError {}

/// Parse a size such as `4096`, `4K`, `64M`, `2MiB`, `1G`, `1.5 GiB`.
///
/// The number may be followed by whitespace and a suffix `K`, `M`, `G`, `T`,
/// `P` or `E` (any case), optionally followed by `B` or `iB`; a bare `B` means bytes.
/// All suffixes are binary (K = 1024).
pub fn parse_size(s: &str) -> Result<u64, UnitsError> {
    let input = s.trim();
    if input.is_empty() {
        return Err(UnitsError::Empty);
    }
    let invalid = |reason| UnitsError::Invalid { input: s.to_string(), reason };
    let overflow = || UnitsError::Overflow { input: s.to_string() };

    let num_end = input.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(input.len());
    let (number, suffix) = input.split_at(num_end);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (number, None),
    };
    if int_part.is_empty() && frac_part.unwrap_or("").is_empty() {
        return Err(invalid("no number"));
    }
    if frac_part.is_some_and(|f| f.contains('.')) {
        return Err(invalid("more than one decimal point"));
    }
    let multiplier = parse_suffix(suffix.trim_start()).ok_or_else(|| invalid("unknown suffix"))?;

    // The integer part, digit by digit, so that overflow is an error rather
    // than a wrap and so that "+4K" or "-4K" cannot sneak through `str::parse`.
    let mut whole: u64 = 0;
    for d in int_part.bytes() {
        whole = whole.checked_mul(10).and_then(|w| w.checked_add(u64::from(d - b'0'))).ok_or_else(overflow)?;
    }
    let mut bytes = whole.checked_mul(multiplier).ok_or_else(overflow)?;

    if let Some(frac) = frac_part.filter(|f| !f.is_empty()) {
        // Exact arithmetic: numerator / 10^digits of the multiplier must be
        // a whole number of bytes. 18 digits keep 10^18 * 2^60 inside u128;
        // more than that is not a size anyone means.
        if frac.len() > 18 {
            return Err(invalid("too many decimal places"));
        }
        let numerator: u128 = frac.parse::<u128>().map_err(|_| invalid("bad fraction"))?;
        let denominator: u128 = 10u128.pow(frac.len() as u32);
        let scaled = numerator * u128::from(multiplier);
        if scaled % denominator != 0 {
            return Err(invalid("not a whole number of bytes"));
        }
        let extra = u64::try_from(scaled / denominator).map_err(|_| overflow())?;
        bytes = bytes.checked_add(extra).ok_or_else(overflow)?;
    }
    Ok(bytes)
}

/// The multiplier a suffix stands for, or `None` if it is not one.
fn parse_suffix(suffix: &str) -> Option<u64> {
    let mut chars = suffix.chars();
    let Some(first) = chars.next() else {
        return Some(1);
    };
    if first.eq_ignore_ascii_case(&'b') {
        return chars.next().is_none().then_some(1);
    }
    let multiplier = UNITS.iter().find(|(letter, _)| first.eq_ignore_ascii_case(letter))?.1;
    match chars.as_str() {
        "" | "b" | "B" | "ib" | "iB" | "IB" | "Ib" => Some(multiplier),
        _ => None,
    }
}

/// Format a size for people: `4 KiB`, `64 MiB`, `1.5 GiB`, `1000 B`.
///
/// The largest unit that the size reaches is used; the number is exact when
/// the size is a whole number of that unit (every power of two is), and is
/// otherwise rounded to at most two decimals.
pub fn format_size(bytes: u64) -> String {
    let Some(&(letter, unit)) = UNITS.iter().rev().find(|(_, unit)| bytes >= *unit) else {
        return format!("{bytes} B");
    };
    if bytes % unit == 0 {
        return format!("{} {letter}iB", bytes / unit);
    }
    // Hundredths, rounded half up, in integers so the result is exact.
    let hundredths = (u128::from(bytes) * 100 + u128::from(unit) / 2) / u128::from(unit);
    let (whole, frac) = (hundredths / 100, hundredths % 100);
    // Rounding can carry into the next unit (1023.999 KiB): say "1 MiB" then.
    if whole >= 1024 {
        if let Some(&(next, _)) = UNITS.iter().find(|(_, u)| *u == unit << 10) {
            return format!("1 {next}iB");
        }
    }
    match frac {
        0 => format!("{whole} {letter}iB"),
        f if f % 10 == 0 => format!("{whole}.{} {letter}iB", f / 10),
        f => format!("{whole}.{f:02} {letter}iB"),
    }
}

/// Format a size the way [`parse_size`] and the command line take it, with no
/// space and the largest exact suffix: `16M`, `1G`, `4K`, `1000`.
///
/// Used where a message suggests a command to run.
pub fn format_size_arg(bytes: u64) -> String {
    match UNITS.iter().rev().find(|(_, unit)| bytes != 0 && bytes % unit == 0) {
        Some(&(letter, unit)) => format!("{}{letter}", bytes / unit),
        None => bytes.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_suffixed() {
        let table: &[(&str, u64)] = &[
            ("0", 0),
            ("4096", 4096),
            ("4K", 4096),
            ("4k", 4096),
            ("4KB", 4096),
            ("4KiB", 4096),
            ("4kib", 4096),
            ("64M", 64 << 20),
            ("2MiB", 2 << 20),
            ("2 MiB", 2 << 20),
            ("  1G  ", 1 << 30),
            ("1g", 1 << 30),
            ("3T", 3 << 40),
            ("1P", 1 << 50),
            ("512B", 512),
            ("512b", 512),
            ("1.5G", 3 << 29),
            ("1.5 GiB", 3 << 29),
            ("0.5K", 512),
            (".5K", 512),
            ("2.", 2),
            ("2.0M", 2 << 20),
            ("16383P", 16383 << 50),
            ("15E", 15 << 60),
            ("18446744073709551615", u64::MAX),
        ];
        for &(input, want) in table {
            assert_eq!(parse_size(input), Ok(want), "input {input:?}");
        }
    }

    #[test]
    fn refuses_garbage_and_overflow() {
        assert_eq!(parse_size(""), Err(UnitsError::Empty));
        assert_eq!(parse_size("   "), Err(UnitsError::Empty));
        for bad in ["K", "abc", "4X", "4KK", "4 K B", "-4K", "+4K", "4.5.1M", ".", "1.3B", "0.1K", "4 Ki", "4MiBs", "1e6"] {
            let err = parse_size(bad).unwrap_err();
            assert!(matches!(err, UnitsError::Invalid { .. }), "{bad:?} gave {err:?}");
            assert!(err.to_string().contains(&format!("{bad:?}")), "message names the input: {err}");
        }
        for big in ["18446744073709551616", "16E", "16384P", "17179869184G", "99999999999999999999K"] {
            let err = parse_size(big).unwrap_err();
            assert_eq!(err, UnitsError::Overflow { input: big.to_string() });
            assert!(err.to_string().contains(big));
        }
    }

    #[test]
    fn formats_for_tables() {
        let table: &[(u64, &str)] = &[
            (0, "0 B"),
            (1, "1 B"),
            (1000, "1000 B"),
            (1023, "1023 B"),
            (1024, "1 KiB"),
            (4096, "4 KiB"),
            (256 << 10, "256 KiB"),
            (1536, "1.5 KiB"),
            (64 << 20, "64 MiB"),
            (2 << 20, "2 MiB"),
            (3 << 29, "1.5 GiB"),
            (1 << 30, "1 GiB"),
            (1_000_000, "976.56 KiB"),
            ((1 << 20) - 1, "1 MiB"),
            (u64::MAX, "16 EiB"),
        ];
        for &(bytes, want) in table {
            assert_eq!(format_size(bytes), want, "bytes {bytes}");
        }
    }

    #[test]
    fn formats_for_command_lines() {
        assert_eq!(format_size_arg(16 << 20), "16M");
        assert_eq!(format_size_arg(1 << 30), "1G");
        assert_eq!(format_size_arg(3 << 29), "1536M");
        assert_eq!(format_size_arg(4096), "4K");
        assert_eq!(format_size_arg(1000), "1000");
        assert_eq!(format_size_arg(0), "0");
    }

    #[test]
    fn round_trips_through_parse() {
        for bytes in [1u64, 512, 4096, 1536, 2 << 20, 3 << 29, 1 << 40, 5 << 50] {
            assert_eq!(parse_size(&format_size_arg(bytes)), Ok(bytes));
            assert_eq!(parse_size(&format_size(bytes)), Ok(bytes));
        }
    }
}
