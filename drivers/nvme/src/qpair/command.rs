//! Typed NVM I/O commands shared by every transport: built with `Read::new(&ns, lba, buf)`
//! and friends, adjusted with [`IoCommand::flags`] and [`IoCommand::tag`], submitted with
//! [`super::QueuePair::submit`].

use crate::io_flags::IoFlags;
use crate::namespace::{Lba, Namespace};

/// What an [`IoCommand`] asks of the namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    /// Read the payload's length from the LBA into the payload.
    Read,
    /// Write the payload to the LBA.
    Write,
    /// Commit the volatile write cache to media.
    Flush,
    /// Zero `blocks` blocks from the LBA, with no data transfer.
    WriteZeroes {
        /// Blocks to zero.
        blocks: u64,
    },
    /// Tell the device `blocks` blocks from the LBA hold nothing (Dataset Management,
    /// deallocate).
    Deallocate {
        /// Blocks to deallocate.
        blocks: u32,
    },
}

impl IoOp {
    /// The spec name of the command.
    pub fn name(&self) -> &'static str {
        match self {
            IoOp::Read => "Read",
            IoOp::Write => "Write",
            IoOp::Flush => "Flush",
            IoOp::WriteZeroes { .. } => "Write Zeroes",
            IoOp::Deallocate { .. } => "Dataset Management",
        }
    }
}

/// One I/O command for a namespace, carrying its payload `P` (moved into the queue at submit,
/// back in the completion or the refusal).
#[derive(Debug)]
#[must_use = "a command does nothing until it is submitted"]
pub struct IoCommand<P> {
    pub(crate) op: IoOp,
    pub(crate) ns: Namespace,
    pub(crate) lba: Lba,
    pub(crate) payload: P,
    pub(crate) flags: IoFlags,
    pub(crate) tag: u64,
}

impl<P> IoCommand<P> {
    fn new(op: IoOp, ns: &Namespace, lba: Lba, payload: P) -> IoCommand<P> {
        IoCommand {
            op,
            ns: *ns,
            lba,
            payload,
            flags: IoFlags::empty(),
            tag: 0,
        }
    }

    /// Command flags (e.g. [`IoFlags::FUA`] on a write).
    pub fn flags(mut self, flags: IoFlags) -> Self {
        self.flags = flags;
        self
    }

    /// The caller's tag, handed back in the completion (default 0).
    pub fn tag(mut self, tag: u64) -> Self {
        self.tag = tag;
        self
    }

    /// What the command does.
    pub fn op(&self) -> IoOp {
        self.op
    }

    /// The namespace it addresses.
    pub fn namespace(&self) -> &Namespace {
        &self.ns
    }

    /// Its first LBA.
    pub fn lba(&self) -> Lba {
        self.lba
    }

    /// Its payload.
    pub fn payload(&self) -> &P {
        &self.payload
    }

    /// Its payload, taken back (the command is not submitted).
    pub fn into_payload(self) -> P {
        self.payload
    }
}

/// Read: `Read::new(&ns, lba, buf)`; the payload's length is the transfer.
#[derive(Debug)]
pub struct Read;

// The builder names the command and makes the one command type every queue pair takes.
#[allow(clippy::new_ret_no_self)]
impl Read {
    /// Read from `lba` of `ns` into `buf` (its window's length, a multiple of the LBA size).
    pub fn new<P>(ns: &Namespace, lba: Lba, buf: impl Into<P>) -> IoCommand<P> {
        IoCommand::new(IoOp::Read, ns, lba, buf.into())
    }
}

/// Write: `Write::new(&ns, lba, buf)`; the payload's length is the transfer.
#[derive(Debug)]
pub struct Write;

// The builder names the command and makes the one command type every queue pair takes.
#[allow(clippy::new_ret_no_self)]
impl Write {
    /// Write `buf` (its window, a multiple of the LBA size) to `lba` of `ns`.
    pub fn new<P>(ns: &Namespace, lba: Lba, buf: impl Into<P>) -> IoCommand<P> {
        IoCommand::new(IoOp::Write, ns, lba, buf.into())
    }
}

/// Flush: `Flush::new(&ns)`.
#[derive(Debug)]
pub struct Flush;

// The builder names the command and makes the one command type every queue pair takes.
#[allow(clippy::new_ret_no_self)]
impl Flush {
    /// Commit `ns`'s volatile write cache to media; the completion hands back an empty payload.
    pub fn new<P: Default>(ns: &Namespace) -> IoCommand<P> {
        IoCommand::new(IoOp::Flush, ns, Lba(0), P::default())
    }
}

/// Write Zeroes: `WriteZeroes::new(&ns, lba, blocks)`.
#[derive(Debug)]
pub struct WriteZeroes;

// The builder names the command and makes the one command type every queue pair takes.
#[allow(clippy::new_ret_no_self)]
impl WriteZeroes {
    /// Zero `blocks` blocks of `ns` from `lba` (no data transfer).
    pub fn new<P: Default>(ns: &Namespace, lba: Lba, blocks: u64) -> IoCommand<P> {
        IoCommand::new(IoOp::WriteZeroes { blocks }, ns, lba, P::default())
    }
}

/// Deallocate: `Deallocate::new(&ns, lba, blocks)`.
#[derive(Debug)]
pub struct Deallocate;

// The builder names the command and makes the one command type every queue pair takes.
#[allow(clippy::new_ret_no_self)]
impl Deallocate {
    /// Deallocate `blocks` blocks of `ns` from `lba` (Dataset Management with the deallocate
    /// attribute: later reads return what the namespace's DLFEAT says).
    pub fn new<P: Default>(ns: &Namespace, lba: Lba, blocks: u32) -> IoCommand<P> {
        IoCommand::new(IoOp::Deallocate { blocks }, ns, lba, P::default())
    }
}
