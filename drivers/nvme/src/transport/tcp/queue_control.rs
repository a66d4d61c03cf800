//! Handing a queue's connection over to a queue of another buffer type: the control path
//! (Connect, authentication) runs on a `TcpQueue<Vec<u8>>`, the I/O on a `TcpQueue<B>`.

use super::{DataBuf, TcpError, TcpQueue};

impl TcpQueue<Vec<u8>> {
    /// The same connection as a queue of buffer type `C`, holding up to `depth` commands.
    /// Refused unless the connection is idle: nothing in flight, nothing received and not
    /// handed on, no error seen.
    pub fn into_typed<C: DataBuf>(self, depth: u16) -> Result<TcpQueue<C>, TcpError> {
        if self.in_flight() != 0 || self.rpos != self.rlen || self.dead.is_some() {
            return Err(TcpError::Request {
                reason: "a connection is handed to another queue only when idle",
            });
        }
        let (qid, neg, incap, timeout) = (self.qid, self.neg, self.incapsule, self.timeout);
        let TcpQueue { sock, .. } = self;
        Ok(TcpQueue::new(sock, neg, qid, depth, incap, timeout))
    }
}
