//! ubdirect-hugepages: inspect and reserve hugepages (sysfs, per NUMA node), allocate
//! memfd-hugetlb mappings ([`HugeMem`]) and translate virtual to physical addresses (pagemap).
//!
//! Knows nothing of VFIO: `ubdirect-core` maps this memory into an IOMMU domain.

#![deny(missing_docs)]

mod error;
mod mem;
mod page_size;
mod pagemap;
mod sysfs;

pub use error::HugeError;
pub use mem::HugeMem;
pub use page_size::PageSize;
pub use pagemap::virt_to_phys;
pub use sysfs::{pools, pools_in, reserve, reserve_in, PoolInfo, SYSFS_ROOT};
