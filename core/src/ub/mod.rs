//! The unified buffer (UB): DMA-able regions registered once in a [`UbRegistry`] (hugepages,
//! device BAR windows, external memory), fixed-block pools over them ([`UbPool`] handing out
//! [`UbBuf`]), and driver-internal DMA memory ([`DmaMem`]).
//!
//! # Drop order
//! - A [`UbRegion`] holds an `Arc<DmaDomain>` and unmaps itself from the IOMMU when its last
//!   `Arc` goes (or at [`UbRegistry::unregister`]), before its memory is unmapped from the
//!   process. Pools hold their region; buffers hold their pool; so memory is never freed under
//!   a live buffer.
//! - Drivers hold `Arc<UbRegistry>` / `Arc<DmaDomain>`, so the domain outlives them. A driver
//!   must quiesce its device (disable/reset the controller, stop its queues) before dropping
//!   the `DmaMem` and buffers the device could still write: the IOMMU then faults late DMA
//!   instead of letting it land in reused memory.

mod buf;
mod dma_mem;
mod file_map;
mod file_region;
mod free_stack;
#[cfg(test)]
mod free_stack_tests;
mod magazine;
mod pool;
mod region;
mod registry;
mod sync;
mod thread_cache;

pub use buf::UbBuf;
pub use dma_mem::DmaMem;
pub use file_map::{cpu_page_size, stat_file, FileStamp, ReadOnlyFileMap};
pub use pool::{PoolConfig, PoolStats, UbPool};
pub use region::{RegionId, RegionKind, RegionOwner, UbRegion};
pub use registry::UbRegistry;
