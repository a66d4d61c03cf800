//! The index arithmetic of the AF_XDP rings (fill, completion, RX, TX) and the checks on what
//! the kernel writes into them. Producer and consumer indices and RX / completion descriptors
//! come from the kernel: a count larger than the ring or an address outside the UMEM is an
//! error, never an out-of-bounds access.

use std::ops::Range;

/// What the kernel wrote into an AF_XDP ring does not make sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XskRingError {
    /// The producer is further ahead of the consumer than the ring has entries.
    #[error("producer {prod} is {ahead} entries ahead of consumer {cons} in a {size}-entry ring")]
    RunAhead {
        /// Producer index as read.
        prod: u32,
        /// Consumer index.
        cons: u32,
        /// `prod - cons` (wrapping).
        ahead: u32,
        /// Ring entries.
        size: u32,
    },
    /// A descriptor names bytes outside the UMEM.
    #[error("descriptor address {addr:#x} + {len} bytes lies outside the {umem}-byte UMEM")]
    OutsideUmem {
        /// Address as read.
        addr: u64,
        /// Length as read.
        len: u64,
        /// UMEM size.
        umem: usize,
    },
}

/// Entries ready to consume in a ring the kernel produces into (RX, completion): `prod - cons`,
/// refused when more than the ring holds.
pub fn ready(prod: u32, cons: u32, size: u32) -> Result<u32, XskRingError> {
    let ahead = prod.wrapping_sub(cons);
    if ahead > size {
        return Err(XskRingError::RunAhead {
            prod,
            cons,
            ahead,
            size,
        });
    }
    Ok(ahead)
}

/// Free entries in a ring this process produces into (fill, TX), given the kernel's consumer
/// index: refused when the kernel claims to have consumed more than was produced.
pub fn room(prod: u32, kernel_cons: u32, size: u32) -> Result<u32, XskRingError> {
    let used = prod.wrapping_sub(kernel_cons);
    if used > size {
        return Err(XskRingError::RunAhead {
            prod,
            cons: kernel_cons,
            ahead: used,
            size,
        });
    }
    Ok(size - used)
}

/// The UMEM bytes an RX descriptor names (`addr`, `len`), bounds-checked.
pub fn umem_range(addr: u64, len: u64, umem: usize) -> Result<Range<usize>, XskRingError> {
    let bad = XskRingError::OutsideUmem { addr, len, umem };
    let start = usize::try_from(addr).map_err(|_| bad.clone())?;
    let len = usize::try_from(len).map_err(|_| bad.clone())?;
    match start.checked_add(len) {
        Some(end) if end <= umem => Ok(start..end),
        _ => Err(bad),
    }
}

/// The chunk index of a UMEM address (completion or RX), bounds-checked against `chunks`.
pub fn chunk_of(addr: u64, chunk: usize, chunks: usize) -> Result<usize, XskRingError> {
    let umem = chunk * chunks;
    let i = usize::try_from(addr)
        .map(|a| a / chunk)
        .unwrap_or(usize::MAX);
    if i >= chunks {
        return Err(XskRingError::OutsideUmem { addr, len: 0, umem });
    }
    Ok(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_counts_wrap_and_refuse_run_ahead() {
        assert_eq!(ready(5, 5, 8), Ok(0));
        assert_eq!(ready(3, u32::MAX - 2, 8), Ok(6), "indices wrap");
        assert!(matches!(
            ready(100, 5, 8),
            Err(XskRingError::RunAhead { ahead: 95, .. })
        ));
        assert!(ready(4, 5, 8).is_err(), "producer behind the consumer");
        assert_eq!(room(8, 0, 8), Ok(0));
        assert_eq!(room(10, 4, 8), Ok(2));
        assert!(
            room(4, 10, 8).is_err(),
            "the kernel consumed more than was produced"
        );
    }

    #[test]
    fn descriptors_outside_the_umem_are_errors() {
        assert_eq!(umem_range(4096, 1514, 8192), Ok(4096..5610));
        assert!(umem_range(8000, 1514, 8192).is_err());
        assert!(umem_range(u64::MAX, 2, 8192).is_err());
        assert!(umem_range(0, u64::MAX, 8192).is_err());
        assert_eq!(chunk_of(2048 + 256, 2048, 4), Ok(1));
        assert!(chunk_of(8192, 2048, 4).is_err());
        assert!(chunk_of(u64::MAX, 2048, 4).is_err());
    }
}
