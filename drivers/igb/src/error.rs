//! [`IgbError`]: every failure of the driver, each naming its cause and what to do.

use std::time::Duration;

use ubdirect_core::pci::PciAddress;
use ubdirect_core::seams::{NicError, NicErrorKind};
use ubdirect_core::CoreError;

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, IgbError>;

/// Why an igb operation failed. Bad caller input changes nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IgbError {
    /// An error from the core crate (VFIO, PCI, pools, DMA memory).
    #[error(transparent)]
    Core(#[from] CoreError),
    /// The device is not an 82576 physical function.
    #[error("{addr} is not an Intel 82576 physical function (vendor {vendor:#06x}, device {device:#06x}; expected 0x8086:0x10c9 or another 82576 PF id)")]
    NotIgb {
        /// The device.
        addr: PciAddress,
        /// PCI vendor id read.
        vendor: u16,
        /// PCI device id read.
        device: u16,
    },
    /// The device is an 82576 virtual function: it is driven through its PF's mailbox, not by
    /// this physical-function driver.
    #[error("{addr} is an 82576 virtual function (0x8086:0x10ca); this driver drives the physical function only")]
    VirtualFunction {
        /// The device.
        addr: PciAddress,
    },
    /// The device is not an 82576 virtual function (the VF driver's open).
    #[error("{addr} is not an Intel 82576 virtual function (vendor {vendor:#06x}, device {device:#06x}; expected 0x8086:0x10ca{}): create VFs with `echo N > /sys/bus/pci/devices/<PF>/sriov_numvfs` and open one of them", if *vendor == 0x8086 && crate::regs::PF_DEVICE_IDS.contains(device) { "; this is the physical function: open it with Igb::open" } else { "" })]
    NotIgbVf {
        /// The device.
        addr: PciAddress,
        /// PCI vendor id read.
        vendor: u16,
        /// PCI device id read.
        device: u16,
    },
    /// The PF stays in reset (V2PMAILBOX.RSTI): no PF driver finished bringing it up.
    #[error("{addr}: the PF of this VF stayed in reset for {waited:?} (V2PMAILBOX.RSTI set: no driver finished the PF's reset): bind the kernel igb driver to the PF and bring its interface up (`ip link set <pf-netdev> up`; keep both while the VF is used), then open the VF again")]
    PfNotReady {
        /// The VF.
        addr: PciAddress,
        /// How long it waited.
        waited: Duration,
    },
    /// The PF driver did not take part in a mailbox exchange in time.
    #[error("{addr}: the PF driver did not answer the VF mailbox within {waited:?} ({request}: {stage}; V2PMAILBOX last read {v2p:#x}): is the igb kernel driver bound to the PF, with its interface up?")]
    MailboxTimeout {
        /// The VF.
        addr: PciAddress,
        /// The request (RESET, SET_MAC_ADDR, SET_VLAN).
        request: &'static str,
        /// What did not come: the buffer lock, the acknowledgement, or the answer.
        stage: &'static str,
        /// How long it waited.
        waited: Duration,
        /// The last V2PMAILBOX value read.
        v2p: u32,
    },
    /// The PF driver refused a request (NACK).
    #[error("{addr}: the PF driver refused {request} (NACK){}", nack_hint(request))]
    MailboxNack {
        /// The VF.
        addr: PciAddress,
        /// The request refused.
        request: &'static str,
    },
    /// The PF driver's answer makes no sense for the request.
    #[error("{addr}: the PF driver answered {request} with {word:#010x}: {what}; the PF driver or the device is malformed: close the VF")]
    MailboxGarbage {
        /// The VF.
        addr: PciAddress,
        /// The request.
        request: &'static str,
        /// The offending word of the answer.
        word: u32,
        /// What is wrong with it.
        what: &'static str,
    },
    /// BAR 0 is smaller than the 82576 register file.
    #[error("{addr}: BAR 0 is {len:#x} bytes, smaller than the 82576's {need:#x}-byte register file: not an 82576, or a broken emulation")]
    BarTooSmall {
        /// The device.
        addr: PciAddress,
        /// BAR 0 length.
        len: u64,
        /// Length needed.
        need: u64,
    },
    /// The device did not finish a reset (CTRL.RST still set) in time.
    #[error("{addr} did not complete a reset within {waited:?} (CTRL still {ctrl:#010x}): the device is hung; rebind it (scripts/setup.sh) or reset the machine")]
    ResetTimeout {
        /// The device.
        addr: PciAddress,
        /// How long it waited.
        waited: Duration,
        /// Last CTRL value read.
        ctrl: u32,
    },
    /// The device is gone: its registers read all-ones, or it was reset behind the driver.
    #[error("{addr} is gone: {cause}. Close the device (its buffers return to the pool only if a reset is confirmed, since the device may still DMA), rebind it to vfio-pci (scripts/setup.sh) and open it again")]
    DeviceGone {
        /// The device.
        addr: PciAddress,
        /// What was read.
        cause: &'static str,
    },
    /// The link is down (STATUS.LU clear).
    #[error("{addr}: the link is down{}: check the cable / the peer (QEMU: the netdev's other end and `set_link`); frames neither leave nor arrive until it is up", waited.map(|w| format!(" (waited {w:?} for it at bring-up)")).unwrap_or_default())]
    LinkDown {
        /// The device.
        addr: PciAddress,
        /// How long bring-up waited for the link, when it did.
        waited: Option<Duration>,
    },
    /// A PHY register access through MDIC failed or did not finish.
    #[error("{addr}: PHY register access through MDIC failed (MDIC reads {mdic:#010x}): the PHY does not answer")]
    PhyAccess {
        /// The device.
        addr: PciAddress,
        /// Last MDIC value.
        mdic: u32,
    },
    /// A ring register did not take the value written (ring length, queue enable).
    #[error("{addr} queue {queue}: {what} wrote {wrote:#x} but reads back {read:#x}: the device does not accept this ring; use another ring size (a multiple of 8 descriptors, 8 to 4096)")]
    RingRejected {
        /// The device.
        addr: PciAddress,
        /// Queue index.
        queue: usize,
        /// Which register.
        what: &'static str,
        /// Value written.
        wrote: u32,
        /// Value read back.
        read: u32,
    },
    /// The device reported a received length beyond the buffer it was given.
    #[error("{addr} RX queue {queue}: descriptor {index} reports a {len}-byte frame in a {buf}-byte buffer: malformed device; close it and open it again")]
    BadRxLength {
        /// The device.
        addr: PciAddress,
        /// Queue index.
        queue: usize,
        /// Descriptor index.
        index: u16,
        /// Length reported.
        len: u16,
        /// Buffer size.
        buf: usize,
    },
    /// A head pointer reads beyond its ring.
    #[error("{addr} queue {queue}: {reg} reads {head}, beyond the {size}-entry ring: malformed device; close it and open it again")]
    HeadOutOfRange {
        /// The device.
        addr: PciAddress,
        /// Queue index.
        queue: usize,
        /// RDH or TDH.
        reg: &'static str,
        /// Value read.
        head: u32,
        /// Ring size.
        size: u16,
    },
    /// A TX frame is longer than the device sends.
    #[error("frame {index} of the burst is {len} bytes, longer than the maximum frame of {max} bytes; nothing of this burst was sent")]
    FrameTooLarge {
        /// Position in the burst.
        index: usize,
        /// Frame length.
        len: usize,
        /// Maximum frame length.
        max: usize,
    },
    /// A TX frame is shorter than an Ethernet header.
    #[error("frame {index} of the burst is {len} bytes, shorter than an Ethernet header ({min} bytes); nothing of this burst was sent")]
    FrameTooShort {
        /// Position in the burst.
        index: usize,
        /// Frame length.
        len: usize,
        /// Minimum frame length.
        min: usize,
    },
    /// The RX pool's blocks cannot hold a full frame.
    #[error("RX pool blocks are {block_size} bytes but the device needs at least {need} bytes per receive buffer (a whole frame in one buffer): create the pool with block_size >= {need}")]
    RxBlocksTooSmall {
        /// The pool's block size.
        block_size: usize,
        /// Bytes needed.
        need: usize,
    },
    /// The RX pool's region is read-only (a registered file): the device cannot write
    /// received frames into it.
    #[error("the RX pool is carved from UB region {region}, which is read-only (a registered file region: its IOMMU mapping lets devices read it only), so the device could not write received frames into it: give an RX pool of writable memory (UbPool::with_hugepages, UbPool::with_anonymous)")]
    RxPoolReadOnly {
        /// The pool's region.
        region: u32,
    },
    /// The RX pool has fewer blocks than the RX rings hold.
    #[error("RX pool has {blocks} blocks but the RX ring(s) hold {need}: create the pool with block_count >= {need} or ask for a smaller rx_ring_size")]
    RxPoolTooSmall {
        /// Blocks in the pool.
        blocks: usize,
        /// Blocks needed.
        need: usize,
    },
    /// An empty TX burst, or an RX burst with no room to put frames.
    #[error("empty burst: {0}")]
    EmptyBurst(&'static str),
    /// A configuration value is invalid; nothing was changed.
    #[error("invalid igb configuration: {0}")]
    InvalidConfig(String),
}

/// What usually makes the PF driver refuse `request`.
fn nack_hint(request: &str) -> &'static str {
    match request {
        "SET_MAC_ADDR" => ": the address is multicast or zero, or the administrator set this VF's MAC (`ip link set <pf> vf N mac ...`) and the VF may not change it",
        "SET_VLAN" => ": the administrator set a port VLAN for this VF (`ip link set <pf> vf N vlan ...`), or the PF's VLAN filter is full",
        "SET_LPE" => ": the PF driver does not accept 1518-byte frames for this VF",
        _ => ": the VF has not completed a RESET handshake, or the PF driver does not support the request",
    }
}

impl IgbError {
    /// The NIC seam's kind of this error.
    pub fn nic_kind(&self) -> NicErrorKind {
        match self {
            IgbError::FrameTooLarge { .. }
            | IgbError::FrameTooShort { .. }
            | IgbError::EmptyBurst(_)
            | IgbError::InvalidConfig(_) => NicErrorKind::InvalidRequest,
            IgbError::DeviceGone { .. }
            | IgbError::PfNotReady { .. }
            | IgbError::MailboxTimeout { .. } => NicErrorKind::DeviceGone,
            IgbError::LinkDown { .. } => NicErrorKind::LinkDown,
            IgbError::BadRxLength { .. }
            | IgbError::HeadOutOfRange { .. }
            | IgbError::MailboxGarbage { .. } => NicErrorKind::Protocol,
            _ => NicErrorKind::Other,
        }
    }
}

impl From<IgbError> for NicError {
    fn from(e: IgbError) -> NicError {
        NicError::new(e.nic_kind(), e.to_string())
    }
}
