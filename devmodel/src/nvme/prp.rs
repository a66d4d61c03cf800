//! PRP walking: a command's data pointer (PRP1, PRP2, PRP lists) as a list of host segments.

use crate::dma::HostDma;

/// The model's memory page size (CC.MPS = 0).
pub const PAGE: u64 = 4096;

/// Why a PRP could not be walked (the command fails with a status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrpError {
    /// A list entry or PRP2 has a non-zero offset where the spec requires page alignment.
    Offset,
    /// A PRP list could not be read (IOMMU fault).
    Fault,
}

/// The `(iova, len)` segments of a `len`-byte transfer described by `prp1` / `prp2`.
pub fn segments(
    dma: &HostDma,
    prp1: u64,
    prp2: u64,
    len: usize,
) -> Result<Vec<(u64, usize)>, PrpError> {
    let mut out = Vec::new();
    if len == 0 {
        return Ok(out);
    }
    if prp1 % 4 != 0 {
        return Err(PrpError::Offset);
    }
    let first = (PAGE - prp1 % PAGE).min(len as u64) as usize;
    out.push((prp1, first));
    let mut rem = len - first;
    if rem == 0 {
        return Ok(out);
    }
    if rem as u64 <= PAGE {
        if prp2 % PAGE != 0 {
            return Err(PrpError::Offset);
        }
        out.push((prp2, rem));
        return Ok(out);
    }
    // PRP2 points at a list; its last entry chains to the next list while more remains.
    let mut entry = prp2;
    if entry % 8 != 0 {
        return Err(PrpError::Offset);
    }
    // Each step either consumes a page or follows a chain pointer (at most one per 511
    // entries): a list that chains to itself cannot loop the model.
    let mut budget = 2 * (len as u64 / PAGE) + 4;
    while rem > 0 {
        budget = budget.checked_sub(1).ok_or(PrpError::Offset)?;
        let last_in_page = (entry % PAGE) == PAGE - 8;
        let v = dma.read_u64(entry).map_err(|_| PrpError::Fault)?;
        if last_in_page && rem as u64 > PAGE {
            if v % 8 != 0 {
                return Err(PrpError::Offset);
            }
            entry = v;
            continue;
        }
        if v % PAGE != 0 {
            return Err(PrpError::Offset);
        }
        let n = (rem as u64).min(PAGE) as usize;
        out.push((v, n));
        rem -= n;
        entry += 8;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use ubdirect_core::{DmaDomain, UbRegistry};

    fn setup() -> (Arc<ubdirect_core::UbRegion>, HostDma) {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let r = reg.register_anonymous(16 * 4096, None).unwrap();
        (r, HostDma::new(reg))
    }

    fn put(dma: &HostDma, iova: u64, vals: &[u64]) {
        let b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        dma.write(iova, &b).unwrap();
    }

    #[test]
    fn one_two_and_listed_pages() {
        let (r, dma) = setup();
        let b = r.iova;
        assert_eq!(
            segments(&dma, b + 512, 0, 1024).unwrap(),
            vec![(b + 512, 1024)]
        );
        assert_eq!(
            segments(&dma, b + 512, b + 4096, 4096).unwrap(),
            vec![(b + 512, 3584), (b + 4096, 512)]
        );
        // Three pages after the first: PRP2 is a list.
        put(&dma, b + 8 * 4096, &[b + 4096, b + 2 * 4096, b + 3 * 4096]);
        assert_eq!(
            segments(&dma, b, b + 8 * 4096, 4 * 4096).unwrap(),
            vec![
                (b, 4096),
                (b + 4096, 4096),
                (b + 2 * 4096, 4096),
                (b + 3 * 4096, 4096)
            ]
        );
        // A list entry with an offset is refused.
        put(&dma, b + 8 * 4096, &[b + 4096 + 8]);
        assert_eq!(
            segments(&dma, b, b + 8 * 4096, 3 * 4096),
            Err(PrpError::Offset)
        );
        // A list outside every region is an IOMMU fault.
        assert_eq!(
            segments(&dma, b, 0x10_0000_0000, 3 * 4096),
            Err(PrpError::Fault)
        );
    }

    #[test]
    fn a_list_chaining_to_itself_ends() {
        let (r, dma) = setup();
        // PRP2 is the last slot of a list page, and that slot chains to itself: no progress.
        let slot = r.iova + 9 * 4096 - 8;
        put(&dma, slot, &[slot]);
        assert_eq!(segments(&dma, r.iova, slot, 2 << 20), Err(PrpError::Offset));
    }
}
