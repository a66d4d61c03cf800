//! [`NvmeError`]: every failure of the NVMe driver, naming the cause and what to do.
//!
//! Variants carry numbers and static strings only, so building one on the I/O path allocates
//! nothing.

use std::time::Duration;

use thiserror::Error;
use ubdirect_core::CoreError;

use crate::prp::PrpError;
use crate::status::NvmeStatus;

/// Result alias of the NVMe driver.
pub type Result<T> = std::result::Result<T, NvmeError>;

/// [`NvmeError::Timeout`] of an I/O command: an Abort was sent.
pub const TIMEOUT_ABORTED: &str =
    "an Abort was sent for it; if it does not come back within io_timeout either, the queue's Recovery decides (Report: Wedged; Requeue / FailBack: controller reset)";
/// [`NvmeError::Timeout`] of an admin command: the admin queue is wedged.
pub const TIMEOUT_ADMIN: &str =
    "the admin queue is wedged: every admin command fails at once until Controller::reset (the command may still complete or write its data page until then)";
/// [`NvmeError::Timeout`] of a blocking wait: the request is still in flight.
pub const TIMEOUT_WAIT: &str =
    "the request is still in flight: keep polling for its buffers, or drop the queue pair";

/// Why an NVMe operation failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NvmeError {
    /// A core (VFIO, PCI, DMA memory) operation failed.
    #[error(transparent)]
    Core(#[from] CoreError),
    /// The PCI function is not an NVMe controller.
    #[error("PCI device {addr} has class code {class:#08x}, not an NVMe controller (0x010802)")]
    NotNvme {
        /// The device address.
        addr: String,
        /// The class code read.
        class: u32,
    },
    /// A register read returned all-ones: the controller is gone.
    #[error("NVMe controller register {register} read all-ones: the device was removed or reset; rebind it to vfio-pci and reopen")]
    DeviceGone {
        /// The register name.
        register: &'static str,
    },
    /// CSTS.CFS is set.
    #[error("NVMe controller fatal status (CSTS.CFS=1, CSTS={csts:#x}) while {during}: the controller needs a reset: drop its queue pairs and call Controller::reset (or reopen it)")]
    ControllerFatal {
        /// The CSTS value.
        csts: u32,
        /// What the driver was doing.
        during: &'static str,
    },
    /// CSTS.RDY reads 0 while the driver has the controller enabled: it was reset, disabled or
    /// removed under the driver (QEMU reads a BAR that stopped decoding as 0; real hardware
    /// gives all-ones, which is [`NvmeError::DeviceGone`]).
    #[error("NVMe controller is not ready (CSTS.RDY=0, CSTS={csts:#x}) while {during}, although the driver enabled it: it was reset, disabled or removed under the driver and will complete nothing; drop its queue pairs, then call Controller::reset (or drop and reopen the controller)")]
    ControllerNotReady {
        /// The CSTS value.
        csts: u32,
        /// What the driver was doing.
        during: &'static str,
    },
    /// CSTS.RDY did not reach the expected value within CAP.TO.
    #[error("NVMe controller did not become {} within CAP.TO = {timeout:?} (CSTS={csts:#x}): the controller is wedged; reset or power-cycle it", if *.ready { "ready (CSTS.RDY=1)" } else { "disabled (CSTS.RDY=0)" })]
    ReadyTimeout {
        /// The value waited for.
        ready: bool,
        /// The bound used.
        timeout: Duration,
        /// The last CSTS read.
        csts: u32,
    },
    /// The controller does not support something the driver needs.
    #[error("NVMe controller does not support {what}")]
    Unsupported {
        /// What is missing.
        what: &'static str,
    },
    /// A value the controller reported is out of range; refused before the driver used it.
    #[error("NVMe controller reported {field} = {value:#x}: {reason}; the device or its firmware is faulty: update the firmware or use another controller")]
    DeviceInput {
        /// The register or identify field, as the spec names it.
        field: &'static str,
        /// The value read.
        value: u64,
        /// Why it cannot be used.
        reason: &'static str,
    },
    /// A command completed with an error status.
    #[error("NVMe {command} failed: {status}")]
    Command {
        /// The command name.
        command: &'static str,
        /// The decoded status.
        status: NvmeStatus,
    },
    /// A command did not complete within its deadline.
    #[error("NVMe {command} (cid {cid}, queue {qid}) did not complete within {waited:?}: {then}")]
    Timeout {
        /// The command name.
        command: &'static str,
        /// Command identifier.
        cid: u16,
        /// Submission queue id.
        qid: u16,
        /// How long the driver waited.
        waited: Duration,
        /// What happened to it and what to do ([`TIMEOUT_ABORTED`], [`TIMEOUT_ADMIN`],
        /// [`TIMEOUT_WAIT`]).
        then: &'static str,
    },
    /// Commands timed out and Abort did not bring them back either.
    #[error("NVMe controller is wedged: {outstanding} command(s) on queue {qid} neither completed nor aborted within {waited:?}; drop the queue pair, then call Controller::reset (or drop and reopen the controller)")]
    Wedged {
        /// Submission queue id.
        qid: u16,
        /// Commands still outstanding.
        outstanding: usize,
        /// Total wait.
        waited: Duration,
    },
    /// A request was in flight when the controller was reset to recover (queue option
    /// [`crate::Recovery::FailBack`]): it came back with its buffers, unfinished.
    #[error("NVMe {command} on queue {qid} was in flight when the controller was reset to recover from a timeout or fault: it may or may not have reached the media; its buffers are back: submit it again")]
    FailedByReset {
        /// The command name.
        command: &'static str,
        /// Submission queue id.
        qid: u16,
    },
    /// The controller was reset (another queue pair's recovery, or a reset under the driver)
    /// and this queue pair reports instead of recovering ([`crate::Recovery::Report`]).
    #[error("NVMe controller was reset under queue {qid} ({outstanding} request(s) in flight): the queue no longer exists on the device; drop the queue pair and create a new one, or open queues with Recovery::Requeue / FailBack")]
    ResetUnderQueue {
        /// Submission queue id.
        qid: u16,
        /// Requests in flight (their buffers stay with the queue).
        outstanding: usize,
    },
    /// A namespace read again after a controller reset is not what it was.
    #[error("namespace {nsid} changed across a controller reset (size, LBA size or metadata): requests cannot be replayed on it; drop the queue pairs and reopen the controller")]
    NamespaceChanged {
        /// The namespace.
        nsid: u32,
    },
    /// The submission queue has no free slot.
    #[error("NVMe queue {qid} is full ({depth} commands in flight, this request needs {needed}): poll completions, then resubmit the returned buffer")]
    QueueFull {
        /// Submission queue id.
        qid: u16,
        /// Queue depth.
        depth: usize,
        /// Command slots this request needs.
        needed: usize,
    },
    /// No such active namespace.
    #[error("namespace {nsid} is not an active namespace of this controller (active: {active}): use one listed by `ubdirect identify`")]
    NamespaceMissing {
        /// The namespace id asked for.
        nsid: u32,
        /// How many namespaces are active.
        active: usize,
    },
    /// The LBA range does not fit the namespace.
    #[error("LBA range {slba}+{nlb} is past the end of namespace {nsid} ({nsze} blocks): stay below the namespace size")]
    LbaOutOfRange {
        /// Namespace.
        nsid: u32,
        /// Starting LBA.
        slba: u64,
        /// Number of blocks.
        nlb: u64,
        /// Namespace size in blocks.
        nsze: u64,
    },
    /// The transfer length is not a whole number of logical blocks.
    #[error("transfer length {len} is not a positive multiple of namespace {nsid}'s {lba_size}-byte LBA size")]
    LengthNotBlockMultiple {
        /// Namespace.
        nsid: u32,
        /// Length asked for.
        len: usize,
        /// The LBA size.
        lba_size: u32,
    },
    /// A byte offset is not on a logical block boundary.
    #[error(
        "byte offset {offset} is not a multiple of the {lba_size}-byte LBA size: align the offset"
    )]
    OffsetNotBlockAligned {
        /// Offset asked for.
        offset: u64,
        /// The LBA size.
        lba_size: u32,
    },
    /// The buffer is too small for the transfer.
    #[error("buffer of {have} bytes is too small for a {need}-byte transfer at buffer offset {offset}: use a larger pool block or a shorter transfer")]
    BufferTooSmall {
        /// Bytes needed (offset + length).
        need: usize,
        /// Bytes available in the buffer.
        have: usize,
        /// Offset within the buffer.
        offset: usize,
    },
    /// The buffer IOVA cannot be described by PRPs.
    #[error(transparent)]
    Prp(#[from] PrpError),
    /// The request is larger than the queue can carry even when empty.
    #[error("request of {len} bytes needs {commands} commands of at most {max_cmd} bytes, more than the queue depth {depth}: split it or use a deeper queue")]
    RequestTooLarge {
        /// Bytes requested.
        len: u64,
        /// Commands it would need.
        commands: usize,
        /// Per-command limit (MDTS).
        max_cmd: usize,
        /// Queue depth.
        depth: usize,
    },
    /// The namespace's format carries metadata, which this driver does not transfer.
    #[error("namespace {nsid} is formatted with metadata (an LBA format with MS > 0): ubdirect does not transfer metadata (its requests carry no metadata buffer), so it refuses I/O to it; reformat the namespace with an LBA format without metadata (e.g. `nvme format --lbaf=N`)")]
    MetadataNotSupported {
        /// The namespace.
        nsid: u32,
    },
    /// The kernel asked for the device back (unbind, hot-unplug, sysfs `remove`): the queue
    /// stopped; dropping the controller releases the device and lets the removal finish.
    #[error("the kernel asked for {addr} back (unbind, hot-unplug or sysfs remove): I/O on it stopped; close the controller (drop it) so the removal can finish")]
    RemovalRequested {
        /// The device.
        addr: String,
    },
    /// A transfer larger than one command carries on a transport that does not split requests.
    #[error("a {len}-byte transfer is larger than the {max} bytes one NVMe/TCP command carries (the controller's MDTS, at most 2 MiB): split it into several commands")]
    TransferTooLarge {
        /// Bytes asked for.
        len: u64,
        /// Bytes one command carries.
        max: u64,
    },
    /// The NVMe/TCP transport failed (connection, protocol, or the target's answer).
    #[cfg(feature = "nvmf")]
    #[error(transparent)]
    Tcp(Box<crate::transport::tcp::TcpError>),
    /// An argument outside what the device reports it supports.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// A completion the driver cannot make sense of.
    #[error("malformed NVMe completion on queue {qid}: {reason} (cid {cid}, sq id {sq_id}); the entry was skipped")]
    MalformedCompletion {
        /// The queue.
        qid: u16,
        /// The command id in the entry.
        cid: u16,
        /// The SQ id in the entry.
        sq_id: u16,
        /// What is wrong.
        reason: &'static str,
    },
    /// [`crate::ControllerOptions::cmb`] on a controller without a Controller Memory Buffer.
    #[error("NVMe controller {addr} has no Controller Memory Buffer (CMBSZ reads 0 with CMBMSC.CRE set): open it without ControllerOptions::cmb, or use a controller with one (QEMU: -device nvme,...,cmb_size_mb=16)")]
    NoCmb {
        /// The controller's PCI address.
        addr: String,
    },
    /// [`crate::QueueOptions::sq_in_cmb`] on a CMB that cannot hold submission queues.
    #[error("the Controller Memory Buffer of NVMe controller {addr} cannot hold submission queues (CMBSZ.SQS=0): leave the queues in host memory (drop QueueOptions::sq_in_cmb)")]
    CmbNoSqs {
        /// The controller's PCI address.
        addr: String,
    },
    /// The CMB has no free run large enough for a submission queue.
    #[error("a submission queue needs {need} bytes of the Controller Memory Buffer of NVMe controller {addr}, but its largest free run is {free} of {size} bytes: use a smaller queue depth, fewer queue pairs, or a larger CMB")]
    CmbTooSmall {
        /// The controller's PCI address.
        addr: String,
        /// Bytes the queue needs (entries * 64, in 4 KiB pages).
        need: u64,
        /// Largest free run of the CMB in bytes.
        free: u64,
        /// CMB size in bytes.
        size: u64,
    },
    /// The controller granted no more I/O queues.
    #[error("all {granted} I/O queue pairs the controller granted are in use: drop one first")]
    NoQueuesLeft {
        /// Queues granted by Set Features (Number of Queues).
        granted: u16,
    },
}

impl NvmeError {
    /// True for errors of the request itself, detected before anything reached the device.
    pub fn is_invalid_request(&self) -> bool {
        matches!(
            self,
            NvmeError::NamespaceMissing { .. }
                | NvmeError::LbaOutOfRange { .. }
                | NvmeError::LengthNotBlockMultiple { .. }
                | NvmeError::OffsetNotBlockAligned { .. }
                | NvmeError::BufferTooSmall { .. }
                | NvmeError::Prp(_)
                | NvmeError::RequestTooLarge { .. }
                | NvmeError::InvalidArgument(_)
        )
    }
}

#[cfg(feature = "nvmf")]
impl From<crate::transport::tcp::TcpError> for NvmeError {
    fn from(e: crate::transport::tcp::TcpError) -> NvmeError {
        NvmeError::Tcp(Box::new(e))
    }
}
