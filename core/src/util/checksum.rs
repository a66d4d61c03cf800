//! The position-aware checksum that proves data arrived intact on the GPU: the sum (mod 2^64)
//! over every 64-bit little-endian word `w` at global word index `i` of `mix(w, i)`. Order
//! independent (blocks may land in any order, on any stream) yet sensitive to a block landing
//! at the wrong offset. This is the CPU reference; `ubdirect-cuda`'s kernel computes the same value
//! on the GPU (it lives here so the pipeline's CPU sinks need no CUDA crate).

use crate::error::{CoreError, Result};
use crate::ub::UbBuf;

/// splitmix64 finaliser of the word xor its index.
#[inline]
pub fn mix(w: u64, index: u64) -> u64 {
    let mut x = w ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Checksum of `data` that starts at byte `offset` of the stream (`offset` multiple of 8).
/// A trailing partial word is zero-padded.
pub fn checksum_at(data: &[u8], offset: u64) -> u64 {
    debug_assert_eq!(offset % 8, 0, "checksum offsets are 8-byte aligned");
    let base = offset / 8;
    let mut sum = 0u64;
    let mut chunks = data.chunks_exact(8);
    for (i, c) in (&mut chunks).enumerate() {
        let w = u64::from_le_bytes(c.try_into().expect("8-byte chunk"));
        sum = sum.wrapping_add(mix(w, base + i as u64));
    }
    let rem = chunks.remainder();
    if !rem.is_empty() {
        let mut last = [0u8; 8];
        last[..rem.len()].copy_from_slice(rem);
        sum = sum.wrapping_add(mix(
            u64::from_le_bytes(last),
            base + (data.len() / 8) as u64,
        ));
    }
    sum
}

/// [`checksum_at`] of the first `len` bytes of a pool buffer of any region: over its slice for
/// host memory (no copy), else copied out up to 1 MiB at a time into one allocation with
/// [`UbBuf::read_into`] (volatile loads from a BAR, a read of the file for a file region).
/// Errors are read_into's (a range outside the block, a changed file).
pub fn checksum_buf(buf: &UbBuf, len: usize, offset: u64) -> Result<u64> {
    if buf.region().is_cpu_sliceable() {
        let data = buf.as_slice().get(..len).ok_or_else(|| {
            CoreError::InvalidArgument(format!(
                "checksum of {len} bytes of a {}-byte buffer",
                buf.len()
            ))
        })?;
        return Ok(checksum_at(data, offset));
    }
    let mut chunk = vec![0u8; len.min(1 << 20)];
    let (mut done, mut sum) = (0usize, 0u64);
    while done < len {
        let n = (len - done).min(chunk.len());
        buf.read_into(done, &mut chunk[..n])?;
        sum = sum.wrapping_add(checksum_at(&chunk[..n], offset + done as u64));
        done += n;
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn position_matters() {
        let a = [1u8; 16];
        let mut b = [1u8; 16];
        assert_eq!(checksum_at(&a, 0), checksum_at(&b, 0));
        assert_ne!(
            checksum_at(&a, 0),
            checksum_at(&a, 8),
            "same data at another offset differs"
        );
        b[15] = 2;
        assert_ne!(checksum_at(&a, 0), checksum_at(&b, 0));
        assert_eq!(checksum_at(&[], 0), 0);
    }

    proptest! {
        /// Splitting a stream at any 8-byte boundary and adding the parts gives the whole.
        #[test]
        fn additive_over_blocks(data in proptest::collection::vec(any::<u8>(), 0..2048), cut in 0usize..256) {
            let cut = (cut * 8).min(data.len() / 8 * 8);
            let whole = checksum_at(&data, 64);
            let parts = checksum_at(&data[..cut], 64).wrapping_add(checksum_at(&data[cut..], 64 + cut as u64));
            prop_assert_eq!(whole, parts);
        }
    }
}
