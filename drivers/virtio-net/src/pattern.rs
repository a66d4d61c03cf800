//! Test-pattern frames for loop-back checks: an Ethernet header, a sequence number and bytes
//! that depend on (sequence, offset), so a byte landing in the wrong frame or at the wrong
//! offset is caught and located.

use crate::net_config::ETH_HLEN;

/// EtherType used for pattern frames (IEEE 802 local experimental 1).
pub const PATTERN_ETHERTYPE: u16 = 0x88b5;
/// Smallest pattern frame: Ethernet header + 8-byte sequence number.
pub const MIN_PATTERN_FRAME: usize = ETH_HLEN + 8;

/// The pattern byte at frame offset `off` of frame `seq` (for offsets past the sequence).
#[inline]
pub fn pattern_byte(seq: u64, off: usize) -> u8 {
    let x = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (off as u64).wrapping_mul(0x2545_f491);
    (x ^ (x >> 29) ^ (x >> 47)) as u8
}

/// Writes pattern frame `seq` into `frame` (its whole length): dst, src, ethertype, seq (LE),
/// then pattern bytes. `frame` must be at least [`MIN_PATTERN_FRAME`] long.
pub fn fill(frame: &mut [u8], dst: [u8; 6], src: [u8; 6], seq: u64) {
    assert!(
        frame.len() >= MIN_PATTERN_FRAME,
        "pattern frame shorter than {MIN_PATTERN_FRAME}"
    );
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
    frame[12..14].copy_from_slice(&PATTERN_ETHERTYPE.to_be_bytes());
    frame[14..22].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in frame[22..].iter_mut().enumerate() {
        *b = pattern_byte(seq, 22 + i);
    }
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
    for (i, &g) in frame.iter().enumerate().skip(22) {
        let e = pattern_byte(seq, i);
        if g != e {
            return Check::Mismatch(Mismatch {
                seq,
                offset: i,
                expected: e as u64,
                got: g as u64,
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
