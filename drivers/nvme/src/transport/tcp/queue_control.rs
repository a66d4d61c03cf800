//! Control-path commands of a [`TcpQueue`] whose data live in the queue's own control buffer
//! rather than a caller's [`DataBuf`]: what Authentication Send / Receive carry, on a queue
//! of any buffer type.

use std::time::Duration;

use super::{DataBuf, TcpError, TcpQueue};
use crate::spec::{Cqe, Sqe};

/// The most control data one command moves.
pub const MAX_CONTROL: usize = 8192;

impl<B: DataBuf> TcpQueue<B> {
    /// Run `sqe` sending `data` (1 byte to [`MAX_CONTROL`]): in the capsule when it fits the
    /// queue's in-capsule size, else on the target's R2T.
    pub fn send_control(
        &mut self,
        sqe: Sqe,
        name: &'static str,
        data: &[u8],
        timeout: Duration,
    ) -> Result<Cqe, TcpError> {
        if data.is_empty() || data.len() > MAX_CONTROL {
            return Err(TcpError::Request {
                reason: "control data must be 1 to 8,192 bytes",
            });
        }
        self.ctl.clear();
        self.ctl.extend_from_slice(data);
        let len = data.len() as u32;
        self.submit_inner(sqe, name, Some(true), None, 0, len, u64::MAX, true)
            .map_err(|(e, _)| e)?;
        self.wait_tag(u64::MAX, name, timeout).map(|(c, _)| c)
    }

    /// Run `sqe` receiving up to `len` bytes (1 to [`MAX_CONTROL`]); returns the completion
    /// and the `len` bytes (zero where the target sent less).
    pub fn receive_control(
        &mut self,
        sqe: Sqe,
        name: &'static str,
        len: usize,
        timeout: Duration,
    ) -> Result<(Cqe, Vec<u8>), TcpError> {
        if len == 0 || len > MAX_CONTROL {
            return Err(TcpError::Request {
                reason: "control data must be 1 to 8,192 bytes",
            });
        }
        self.ctl.clear();
        self.ctl.resize(len, 0);
        self.submit_inner(sqe, name, Some(false), None, 0, len as u32, u64::MAX, true)
            .map_err(|(e, _)| e)?;
        let (c, _) = self.wait_tag(u64::MAX, name, timeout)?;
        Ok((c, self.ctl[..len].to_vec()))
    }
}
