//! The value spellings every subcommand shares: sizes and offsets with binary suffixes
//! ("4K", "64M", "1G"), so that `perf --offset 64M` and `pipeline --offset 64M` mean the same.

/// A size with an optional K/M/G/T suffix (binary, "KiB"/"KB" accepted), e.g. "4M", "512KiB",
/// "1G", "4096"; zero is refused.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, shift) = match t.chars().last() {
        Some('K') | Some('k') => (&t[..t.len() - 1], 10),
        Some('M') | Some('m') => (&t[..t.len() - 1], 20),
        Some('G') | Some('g') => (&t[..t.len() - 1], 30),
        Some('T') | Some('t') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad size '{s}' (e.g. 4M, 512K, 1G)"))?;
    n.checked_mul(1u64 << shift)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("size '{s}' is zero or too large"))
}

/// An offset: 0 or a size ("64M").
pub fn parse_offset(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        Ok(0)
    } else {
        parse_size(s)
    }
}

/// A size in bytes that must fit a `usize` (an I/O or block size).
pub fn parse_usize_size(s: &str) -> Result<usize, String> {
    usize::try_from(parse_size(s)?).map_err(|_| format!("size '{s}' is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_offsets() {
        assert_eq!(parse_size("4M").unwrap(), 4 << 20);
        assert_eq!(parse_size("512KiB").unwrap(), 512 << 10);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("0").is_err());
        assert!(parse_size("4X").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(parse_offset("0").unwrap(), 0);
        assert_eq!(parse_offset("64M").unwrap(), 64 << 20);
        assert_eq!(parse_usize_size("4K").unwrap(), 4096);
    }
}
