//! [`Namespace`]: the handle I/O requests are made against (nsid, LBA size, capacity and the
//! per-command limit from MDTS), and [`Lba`], a logical block address that a byte count can
//! not be passed as.

use crate::error::NvmeError;
use crate::info::NamespaceInfo;
use crate::io_queue::NsLimits;

/// A logical block address (in blocks of the namespace's LBA size, never bytes).
///
/// Requests take an `Lba`, so a byte offset does not compile where a block address is meant:
///
/// ```compile_fail
/// # fn f(qp: &mut ubdirect_nvme::IoQueuePair, ns: &ubdirect_nvme::Namespace, buf: ubdirect_nvme::IoBuf) {
/// let byte_offset: u64 = 1 << 20;
/// qp.submit_read(ns, byte_offset, buf, ubdirect_nvme::IoFlags::empty(), 0); // u64 is not an Lba
/// # }
/// ```
///
/// Convert a byte offset explicitly with [`Namespace::lba_at`], which checks its alignment:
///
/// ```no_run
/// # fn f(qp: &mut ubdirect_nvme::IoQueuePair, ns: &ubdirect_nvme::Namespace, buf: ubdirect_nvme::IoBuf) -> Result<(), Box<dyn std::error::Error>> {
/// let byte_offset: u64 = 1 << 20;
/// qp.submit_read(ns, ns.lba_at(byte_offset)?, buf, ubdirect_nvme::IoFlags::empty(), 0)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lba(pub u64);

impl std::fmt::Display for Lba {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LBA {}", self.0)
    }
}

/// An active namespace of a controller, as I/O sees it: obtained from
/// [`crate::Controller::namespace`] (or [`crate::Controller::first_namespace`]) and passed to
/// every request. It is `Copy`: give each thread its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Namespace {
    nsid: u32,
    lba_size: u32,
    blocks: u64,
    max_cmd_blocks: u64,
}

impl Namespace {
    /// The handle of `info` on a controller that builds at most `max_cmd_ctrl` bytes per
    /// command; refused for a format with metadata (this driver does not transfer it).
    pub(crate) fn new(info: &NamespaceInfo, max_cmd_ctrl: usize) -> Result<Namespace, NvmeError> {
        Namespace::from_limits(&limits(info, max_cmd_ctrl))
    }

    /// The handle of an I/O queue's copy of a namespace's limits.
    #[inline]
    pub(crate) fn from_limits(l: &NsLimits) -> Result<Namespace, NvmeError> {
        if l.has_metadata {
            return Err(NvmeError::MetadataNotSupported { nsid: l.nsid });
        }
        Ok(Namespace {
            nsid: l.nsid,
            lba_size: l.lba_size,
            blocks: l.nsze,
            max_cmd_blocks: (l.max_cmd >> l.lba_shift) as u64,
        })
    }

    /// Namespace ID.
    pub fn nsid(&self) -> u32 {
        self.nsid
    }
    /// Bytes per logical block.
    pub fn lba_size(&self) -> u32 {
        self.lba_size
    }
    /// Size in logical blocks (NSZE): valid LBAs are `0..blocks()`.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }
    /// Size in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.blocks * self.lba_size as u64
    }
    /// Blocks one NVMe command carries (MDTS, the driver's cap, the 16-bit NLB field). Larger
    /// requests are split into several commands that complete as one.
    pub fn max_blocks_per_command(&self) -> u64 {
        self.max_cmd_blocks
    }
    /// The LBA at byte offset `bytes`; [`NvmeError::OffsetNotBlockAligned`] when it is not a
    /// multiple of the LBA size.
    pub fn lba_at(&self, bytes: u64) -> Result<Lba, NvmeError> {
        if bytes % self.lba_size as u64 != 0 {
            return Err(NvmeError::OffsetNotBlockAligned {
                offset: bytes,
                lba_size: self.lba_size,
            });
        }
        Ok(Lba(bytes / self.lba_size as u64))
    }
    /// The last `n` blocks' first LBA (`blocks() - n`), or `None` when the namespace is smaller.
    pub fn last_blocks(&self, n: u64) -> Option<Lba> {
        self.blocks.checked_sub(n).map(Lba)
    }
}

/// The limits an I/O queue copies for namespace `info` (bytes per command rounded down to
/// whole blocks, at most 65536 blocks).
pub(crate) fn limits(info: &NamespaceInfo, max_cmd_ctrl: usize) -> NsLimits {
    let by_nlb = (info.lba_size as usize) << 16;
    let max_cmd = max_cmd_ctrl.min(by_nlb) / info.lba_size as usize * info.lba_size as usize;
    NsLimits {
        nsid: info.nsid,
        lba_size: info.lba_size,
        lba_shift: info.lba_size.trailing_zeros(),
        nsze: info.nsze,
        max_cmd,
        has_metadata: info.metadata_size != 0,
    }
}

impl<P: crate::IoPayload> crate::IoQueuePair<P> {
    /// The handle of namespace `nsid` as this queue pair knows it (the same limits as
    /// [`crate::Controller::namespace`]): [`NvmeError::NamespaceMissing`] when it is not active.
    pub fn namespace(&self, nsid: u32) -> Result<Namespace, NvmeError> {
        Namespace::from_limits(&self.ns_limits(nsid)?)
    }
}
