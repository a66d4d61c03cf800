//! Split virtqueues (virtio 1.2 §2.7): memory layout, event-index arithmetic, the
//! free-descriptor list and the driver side of one ring.

pub mod event_idx;
pub mod free_list;
pub mod layout;
pub mod split;

pub use event_idx::vring_need_event;
pub use free_list::FreeList;
pub use layout::{Descriptor, RingLayout, UsedElem};
pub use split::{RingError, SplitRing};
