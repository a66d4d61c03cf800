//! ubdirect-igb: a userspace poll-mode driver for the Intel 82576 (igb) physical function over
//! vfio-pci: advanced RX/TX descriptor rings, interrupts masked, buffers from UB pools.
//!
//! ```text
//! Igb::open(registry, addr, rx_pool, IgbConfig::default())
//!   pair(0).tx_burst(&mut Vec<NicFrame>) -> frames sent (removed from the front), the rest stay
//!   pair(0).rx_burst(&mut Vec<NicFrame>) -> frames appended up to the Vec's spare capacity
//! ```
//! Zero copy: each frame is one descriptor pointing into a `UbBuf` (a TX frame at any offset of
//! its buffer, an RX frame at offset 0). Frames are at most 1518 bytes (no jumbo frames); the
//! device strips the CRC on receive and adds it on send. RX buffers are the pool's blocks,
//! programmed in whole KiB (2 to 16 KiB). `Igb` implements the framework's NIC seam
//! ([`ubdirect_core::seams::Nic`]), as virtio-net does.
//!
//! Bring-up: CTRL.RST with a deadline, every interrupt masked (IMC/EIMC all ones), the MAC from
//! receive-address entry 0, CTRL.SLU and a PHY auto-negotiation restart, rings programmed and
//! read back, then a bounded wait for STATUS.LU. Every value the device writes is untrusted: a
//! descriptor is looked at only when the driver posted it, a received length beyond its buffer
//! is an error, head pointers are range-checked, and all-ones reads mean the device is gone.
//! A queue pair that moves nothing for the health interval probes the device once (see
//! [`health`]).
//!
//! [`IgbVf`] drives an SR-IOV virtual function of the 82576 (0x8086:0x10ca) while the PF stays
//! on the kernel igb driver: a VF reset, the mailbox handshake with the PF driver (which
//! assigns the MAC), MAC and VLAN requests, and the VF's own rings on the same ring code (see
//! [`vf`]). It implements the same NIC seam.

#![deny(missing_docs)]

mod bringup;
pub mod desc;
pub mod device;
pub mod error;
pub mod health;
pub mod hw_stats;
mod nic;
pub mod queue;
pub mod regs;
mod ring;
pub mod vf;

pub use device::{Igb, IgbConfig, IgbInfo, MAX_FRAME};
pub use error::{IgbError, Result};
pub use hw_stats::HwStats;
pub use queue::QueuePair;
pub use ubdirect_core::seams::NicFrame;
pub use vf::{IgbVf, IgbVfConfig, IgbVfInfo};
