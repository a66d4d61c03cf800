//! Test-pattern frames for loop-back checks: an Ethernet header, a sequence number and bytes
//! that depend on (sequence, offset), so a byte landing in the wrong frame or at the wrong
//! offset is caught and located.

use crate::net_config::ETH_HLEN;

/// EtherType used for pattern frames (IEEE 802 local experimental 1).
pub const PATTERN_ETHERTYPE: u16 = 0x88b5;
/// Smallest pattern frame: Ethernet header + 8-byte sequence number.
pub const MIN_PATTERN_FRAME: usize = ETH_HLEN + 8;
/// Offset of the first pattern byte (after the header and the sequence number).
const PAYLOAD: usize = MIN_PATTERN_FRAME;
/// Longest frame the shared pattern table covers.
pub const MAX_PATTERN_FRAME: usize = 64 << 10;

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The offset-dependent words, computed once; a frame's payload word `j` is
/// `base[j] ^ splitmix64(seq)`, so both the frame and the offset change every byte, at the
/// cost of one XOR per 8 bytes (the pattern must not be what a benchmark measures).
fn table() -> &'static [u64] {
    static TABLE: std::sync::OnceLock<Box<[u64]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..MAX_PATTERN_FRAME.div_ceil(8) as u64)
            .map(|j| splitmix64(j ^ 0x5555_aaaa_0f0f_f0f0))
            .collect()
    })
}

/// The pattern byte at frame offset `off` (>= 22) of frame `seq`.
#[inline]
pub fn pattern_byte(seq: u64, off: usize) -> u8 {
    let p = off - PAYLOAD;
    let w = table()[p / 8] ^ splitmix64(seq);
    w.to_le_bytes()[p % 8]
}

/// Writes pattern frame `seq` into `frame` (its whole length): dst, src, ethertype, seq (LE),
/// then pattern bytes. `frame` must be 22..=65536 bytes long.
pub fn fill(frame: &mut [u8], dst: [u8; 6], src: [u8; 6], seq: u64) {
    assert!(
        (MIN_PATTERN_FRAME..=MAX_PATTERN_FRAME).contains(&frame.len()),
        "pattern frame must be {MIN_PATTERN_FRAME}..={MAX_PATTERN_FRAME} bytes"
    );
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
    frame[12..14].copy_from_slice(&PATTERN_ETHERTYPE.to_be_bytes());
    frame[14..22].copy_from_slice(&seq.to_le_bytes());
    let mix = splitmix64(seq);
    let t = table();
    let mut chunks = frame[PAYLOAD..].chunks_exact_mut(8);
    let mut j = 0;
    for c in &mut chunks {
        c.copy_from_slice(&(t[j] ^ mix).to_le_bytes());
        j += 1;
    }
    let rest = chunks.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&(t[j] ^ mix).to_le_bytes()[..n]);
}

/// What a received frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// A pattern frame, byte-exact: its sequence number.
    Good(u64),
    /// Not a pattern frame (other EtherType or too short): someone else's traffic.
    Foreign,
    /// A pattern frame with a wrong length or a wrong byte.
    Mismatch(Mismatch),
}

/// Where a pattern frame differs from what was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Mismatch {
    /// The frame's sequence number (as received).
    pub seq: u64,
    /// First differing byte offset within the frame (or the length when lengths differ).
    pub offset: usize,
    /// Expected byte (or expected length).
    pub expected: u64,
    /// Received byte (or received length).
    pub got: u64,
}

/// Checks `frame` against pattern frame `seq'` (seq read from the frame), addresses `dst`,
/// `src` and the expected length `len`.
pub fn verify(frame: &[u8], dst: [u8; 6], src: [u8; 6], len: usize) -> Check {
    if frame.len() < MIN_PATTERN_FRAME || frame[12..14] != PATTERN_ETHERTYPE.to_be_bytes() {
        return Check::Foreign;
    }
    let seq = u64::from_le_bytes(frame[14..22].try_into().expect("8 bytes"));
    if frame.len() != len {
        return Check::Mismatch(Mismatch {
            seq,
            offset: frame.len().min(len),
            expected: len as u64,
            got: frame.len() as u64,
        });
    }
    for (i, (&g, &e)) in frame[0..12]
        .iter()
        .zip(dst.iter().chain(src.iter()))
        .enumerate()
    {
        if g != e {
            return Check::Mismatch(Mismatch {
                seq,
                offset: i,
                expected: e as u64,
                got: g as u64,
            });
        }
    }
    if frame.len() > MAX_PATTERN_FRAME {
        return Check::Mismatch(Mismatch {
            seq,
            offset: MAX_PATTERN_FRAME,
            expected: len as u64,
            got: frame.len() as u64,
        });
    }
    let mix = splitmix64(seq);
    let t = table();
    let payload = &frame[PAYLOAD..];
    let words = payload.len() / 8;
    // Fast path: whole words compared as u64; the slow path below only locates a difference.
    let mut bad = words;
    for (j, c) in payload.chunks_exact(8).enumerate() {
        if u64::from_le_bytes(c.try_into().expect("8-byte chunk")) != t[j] ^ mix {
            bad = j;
            break;
        }
    }
    for (j, c) in payload.chunks(8).enumerate().skip(bad) {
        let want = (t[j] ^ mix).to_le_bytes();
        if let Some(k) = c.iter().zip(want.iter()).position(|(g, e)| g != e) {
            return Check::Mismatch(Mismatch {
                seq,
                offset: PAYLOAD + 8 * j + k,
                expected: want[k] as u64,
                got: c[k] as u64,
            });
        }
    }
    Check::Good(seq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
    const B: [u8; 6] = [0x52, 0x54, 0, 0, 0, 2];

    #[test]
    fn roundtrip_and_foreign() {
        let mut f = vec![0u8; 60];
        fill(&mut f, B, A, 7);
        assert_eq!(verify(&f, B, A, 60), Check::Good(7));
        for (i, &b) in f.iter().enumerate().skip(MIN_PATTERN_FRAME) {
            assert_eq!(b, pattern_byte(7, i));
        }
        let mut g = vec![0u8; 60];
        fill(&mut g, B, A, 8);
        assert_ne!(f[22..], g[22..], "another frame has other bytes");
        f[12] = 0x08;
        f[13] = 0x00;
        assert_eq!(verify(&f, B, A, 60), Check::Foreign);
        assert_eq!(verify(&f[..10], B, A, 60), Check::Foreign);
    }

    proptest! {
        /// Any single corrupted byte is found at its offset; a wrong length is reported.
        #[test]
        fn finds_corruption(len in MIN_PATTERN_FRAME..2000usize, seq in any::<u64>(), pos in any::<usize>(), flip in 1u8..=255) {
            let mut f = vec![0u8; len];
            fill(&mut f, B, A, seq);
            prop_assert_eq!(verify(&f, B, A, len), Check::Good(seq));
            let wrong_len = matches!(verify(&f, B, A, len + 1), Check::Mismatch(Mismatch { offset, .. }) if offset == len);
            prop_assert!(wrong_len);
            let p = pos % len;
            if (12..22).contains(&p) {
                return Ok(()); // ethertype / seq bytes change the frame's identity instead
            }
            f[p] ^= flip;
            match verify(&f, B, A, len) {
                Check::Mismatch(m) => { prop_assert_eq!(m.offset, p); prop_assert_eq!(m.seq, seq); }
                other => prop_assert!(false, "corruption at {} not found: {:?}", p, other),
            }
        }
    }
}
