//! [`DomainId`]: the identity of one [`super::DmaDomain`], carried by every region mapped in it.

use std::sync::atomic::{AtomicU64, Ordering};

/// Which [`super::DmaDomain`] a mapping lives in. Unique for the life of the process: two
/// domains never share an id, even after one is dropped. An IOVA means something only in its
/// own domain, so a driver compares the id of a buffer's region with its device's before the
/// IOVA reaches the device ([`crate::UbRegion::check_dma`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DomainId(u64);

impl DomainId {
    /// A new id, never returned before.
    pub(crate) fn next() -> DomainId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        DomainId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl std::fmt::Display for DomainId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DMA domain #{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_new_id_differs_from_the_ones_before() {
        let ids: Vec<DomainId> = (0..64).map(|_| DomainId::next()).collect();
        let mut uniq = ids.clone();
        uniq.sort_by_key(|d| d.0);
        uniq.dedup();
        assert_eq!(uniq.len(), ids.len());
    }
}
