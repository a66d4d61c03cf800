//! [`TcpCommand`]: one command as [`super::TcpQueue::submit`] and [`super::TcpQueue::run`]
//! take it, built like the unified API's `IoCommand` (`TcpCommand::new(sqe, name)`, then
//! the data transfer, the buffer and the tag).

use crate::spec::Sqe;

/// One command for a [`super::TcpQueue`]: the SQE (its CID is set at submit), the command's
/// spec name (for errors and timeouts), which way its data moves, the buffer it carries and
/// the caller's tag. Built with [`TcpCommand::new`], then [`TcpCommand::read`] or
/// [`TcpCommand::write`] for a data transfer, [`TcpCommand::buf`] and [`TcpCommand::tag`].
#[derive(Debug)]
#[must_use = "a command does nothing until it is submitted"]
pub struct TcpCommand<B> {
    pub(super) sqe: Sqe,
    pub(super) name: &'static str,
    /// `None`: no data; `Some(false)`: the target sends data (a read); `Some(true)`: the host
    /// sends it (a write).
    pub(super) write: Option<bool>,
    pub(super) buf: Option<B>,
    pub(super) offset: usize,
    pub(super) len: u32,
    pub(super) tag: u64,
}

impl<B> TcpCommand<B> {
    /// Command `sqe`, named `name` (the spec name, e.g. "Read"): no data transfer, no buffer,
    /// tag 0.
    pub fn new(sqe: Sqe, name: &'static str) -> TcpCommand<B> {
        TcpCommand {
            sqe,
            name,
            write: None,
            buf: None,
            offset: 0,
            len: 0,
            tag: 0,
        }
    }

    /// The target sends `len` bytes, received into the buffer's bytes `offset..offset + len`.
    pub fn read(mut self, offset: usize, len: u32) -> Self {
        self.write = Some(false);
        self.offset = offset;
        self.len = len;
        self
    }

    /// The host sends the buffer's bytes `offset..offset + len` (in the capsule when they fit
    /// the in-capsule limit, else as the target asks for them).
    pub fn write(mut self, offset: usize, len: u32) -> Self {
        self.write = Some(true);
        self.offset = offset;
        self.len = len;
        self
    }

    /// The buffer the command carries (moved into the queue, back in the completion or the
    /// refusal). A command without a data transfer may carry one too, as a caller context.
    pub fn buf(mut self, buf: B) -> Self {
        self.buf = Some(buf);
        self
    }

    /// The caller's tag, handed back in the completion (default 0).
    pub fn tag(mut self, tag: u64) -> Self {
        self.tag = tag;
        self
    }

    /// The command's spec name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Its buffer, taken back (the command is not submitted).
    pub fn into_buf(self) -> Option<B> {
        self.buf
    }
}
