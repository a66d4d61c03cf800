//! Controller-level admin operations an embedder sends itself: Abort, and the passthrough of
//! admin commands that carry no memory address.

use crate::error::{NvmeError, Result};
use crate::spec::command::admin_opcode;
use crate::spec::{Cqe, Sqe};

use super::Controller;

impl Controller {
    /// Send one admin command that carries no memory address (passthrough: the caller builds
    /// the entry, the driver sets its command id) and wait up to `admin_timeout`; returns its
    /// completion. Only Abort, Asynchronous Event Request and Keep Alive are accepted, with
    /// PRP1, PRP2 and MPTR 0: other admin commands can make the controller DMA to an address
    /// of the entry (a queue, a host memory buffer, a data page), which safe code must not aim.
    /// Like every admin path it fails at once with [`NvmeError::Wedged`] after an admin
    /// command timed out, until [`Controller::reset`].
    pub fn admin_command(&self, sqe: Sqe, name: &'static str) -> Result<Cqe> {
        const KEEP_ALIVE: u8 = 0x18;
        let op = sqe.opcode();
        if !matches!(
            op,
            admin_opcode::ABORT | admin_opcode::ASYNC_EVENT_REQUEST | KEEP_ALIVE
        ) {
            return Err(NvmeError::InvalidArgument(
                "admin_command takes Abort, Asynchronous Event Request or Keep Alive only: other admin commands may carry DMA addresses; use the driver's own calls (identify, log pages, features)",
            ));
        }
        if sqe.prp1 != 0 || sqe.prp2 != 0 || sqe.mptr != 0 {
            return Err(NvmeError::InvalidArgument(
                "admin_command takes commands without data: PRP1, PRP2 and MPTR must be 0",
            ));
        }
        self.admin_exec(sqe, name)
    }

    /// Abort command `cid` on submission queue `sqid`. Returns true when the controller says
    /// it aborted it (CQE DW0 bit 0 clear).
    pub fn abort(&self, sqid: u16, cid: u16) -> Result<bool> {
        let mut sqe = Sqe::new(admin_opcode::ABORT);
        sqe.cdw10 = (cid as u32) << 16 | sqid as u32;
        Ok(self.admin_exec(sqe, "Abort")?.result & 1 == 0)
    }
}
