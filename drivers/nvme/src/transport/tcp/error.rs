//! [`TcpError`]: every failure of the NVMe/TCP host, naming the cause and what to do.

use std::time::Duration;

use thiserror::Error;

use super::fabrics::NqnError;
use crate::status::NvmeStatus;

/// Result alias of the NVMe/TCP host.
pub type TcpResult<T> = std::result::Result<T, TcpError>;

/// Why an NVMe/TCP operation failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TcpError {
    /// The address is not `nvmf-tcp://HOST[:PORT]/SUBNQN[/NSID]` (or `HOST[:PORT]`).
    #[error("bad NVMe/TCP address {input:?}: {reason}; write nvmf-tcp://ADDR[:PORT]/SUBNQN[/NSID], e.g. nvmf-tcp://10.0.0.2:4420/nqn.2024-01.io.example:disk1/1")]
    Address {
        /// What was given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An NQN that no target would accept.
    #[error("{which} {nqn:?} is not a valid NQN: {reason}; NQNs are 1 to 223 printable ASCII bytes, e.g. nqn.2014-08.org.nvmexpress:uuid:...")]
    Nqn {
        /// "subsystem NQN" or "host NQN".
        which: &'static str,
        /// The NQN.
        nqn: String,
        /// Why.
        reason: NqnError,
    },
    /// The TCP connection was refused (nothing listens there).
    #[error("NVMe/TCP target {addr} refused the connection: no nvmet port listens there; check the address and port (4420 for I/O, 8009 for discovery) and that the target's port is enabled")]
    Refused {
        /// The address.
        addr: String,
    },
    /// No TCP connection within the connect deadline.
    #[error("NVMe/TCP target {addr} did not accept a connection within {waited:?}: check the address, the route and any firewall")]
    ConnectTimeout {
        /// The address.
        addr: String,
        /// The deadline.
        waited: Duration,
    },
    /// A socket call failed.
    #[error("NVMe/TCP socket error while {during}: {source}; the connection is unusable: drop the queue pair / controller and connect again")]
    Io {
        /// What the host was doing.
        during: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The target closed or reset the connection.
    #[error("NVMe/TCP target closed the connection while {during} (port removed, target stopped or connection reset); commands in flight failed and their buffers are back: connect again")]
    Closed {
        /// What the host was doing.
        during: &'static str,
    },
    /// Something did not happen within its deadline.
    #[error("NVMe/TCP {what} did not complete within {waited:?}: the target is unresponsive; commands in flight failed and their buffers are back: drop the connection and connect again")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// The deadline.
        waited: Duration,
    },
    /// The target sent a PDU the protocol does not allow; the connection is torn down.
    #[error("NVMe/TCP target sent an invalid {pdu} PDU: {field} = {value:#x}: {reason}; the connection was closed: check the target (a protocol bug or data corruption on the path) and connect again")]
    Protocol {
        /// PDU type name.
        pdu: &'static str,
        /// The field, as the spec names it.
        field: &'static str,
        /// The value received.
        value: u64,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A header digest did not match.
    #[error("NVMe/TCP header digest mismatch on a {pdu} PDU (received {got:#010x}, computed {want:#010x}): the data was corrupted on the path; the connection was closed: connect again")]
    HeaderDigest {
        /// PDU type name.
        pdu: &'static str,
        /// Digest received.
        got: u32,
        /// Digest computed.
        want: u32,
    },
    /// A data digest did not match.
    #[error("NVMe/TCP data digest mismatch on command {cid} (received {got:#010x}, computed {want:#010x}): the data was corrupted on the path; the command failed and the connection was closed: connect again")]
    DataDigest {
        /// Command identifier.
        cid: u16,
        /// Digest received.
        got: u32,
        /// Digest computed.
        want: u32,
    },
    /// The target terminated the connection (C2HTermReq).
    #[error("NVMe/TCP target terminated the connection: {} (FES {fes:#x}, FEI {fei:#x}); connect again", super::pdu::fes::name(*.fes))]
    Terminated {
        /// Fatal error status.
        fes: u16,
        /// Fatal error information.
        fei: u32,
    },
    /// ICResp refused.
    #[error("NVMe/TCP target's ICResp has {field} = {value:#x}: {reason}")]
    Negotiation {
        /// Field.
        field: &'static str,
        /// Value.
        value: u64,
        /// Why, with what to do.
        reason: &'static str,
    },
    /// Fabrics Connect failed.
    #[error("NVMe/TCP Connect to {subnqn:?} (queue {qid}) refused: {} (SCT {:#x} SC {:#x}): {hint}", super::fabrics::connect_status_name(.status.sct, .status.sc), .status.sct, .status.sc)]
    Connect {
        /// Subsystem NQN.
        subnqn: String,
        /// Queue ID.
        qid: u16,
        /// Status.
        status: NvmeStatus,
        /// What to do.
        hint: &'static str,
    },
    /// The connection failed while this command was in flight.
    #[error("NVMe/TCP command did not complete: the connection failed ({cause}); its buffer is back with the caller: connect again")]
    ConnectionLost {
        /// The connection's error.
        cause: String,
    },
    /// A command completed with an error status.
    #[error("NVMe/TCP {command} failed: {status}")]
    Command {
        /// Command name.
        command: &'static str,
        /// Status.
        status: NvmeStatus,
    },
    /// A request the host cannot send.
    #[error("NVMe/TCP request refused before sending: {reason}")]
    Request {
        /// Why, with what to do.
        reason: &'static str,
    },
    /// The host caught itself about to send bytes outside a command's data (a bug in the host,
    /// not the target): nothing was sent, and the connection is closed.
    #[error("NVMe/TCP host stopped a send: {reason}; nothing outside the command's data was sent, the connection was closed: this is a bug in ubdirect, please report it; connect again")]
    Internal {
        /// What was caught.
        reason: &'static str,
    },
    /// The controller reported something out of range.
    #[error("NVMe/TCP controller reported {field} = {value:#x}: {reason}")]
    DeviceInput {
        /// Field.
        field: &'static str,
        /// Value.
        value: u64,
        /// Why.
        reason: &'static str,
    },
    /// The target closed the admin connection after its keep-alive timeout passed without a
    /// Keep Alive (the admin queue was not polled).
    #[error("NVMe/TCP target dropped the controller: no Keep Alive answered for {idle:?}, past its keep-alive timeout (KATO) of {kato:?}; commands in flight failed and their buffers are back: connect again, and poll the admin queue (TcpController::poll_admin) at least every KATO/2 (or connect with KATO 0)")]
    KeepAliveExpired {
        /// Time since the last Keep Alive was answered.
        idle: std::time::Duration,
        /// The keep-alive timeout given in the admin Connect.
        kato: std::time::Duration,
    },
    /// DH-HMAC-CHAP authentication of a queue failed; nothing else was sent on it.
    #[error("NVMe/TCP authentication of queue {qid} failed: {source}")]
    Auth {
        /// Queue ID.
        qid: u16,
        /// Why.
        #[source]
        source: super::auth::AuthError,
    },
    /// A fault of the controller logic shared with PCIe (CSTS.RDY not reached within CAP.TO,
    /// CSTS.CFS, CSTS all-ones): the same error as on a local controller.
    #[error(transparent)]
    Controller(#[from] crate::error::NvmeError),
}

impl From<super::auth::AuthError> for TcpError {
    fn from(source: super::auth::AuthError) -> TcpError {
        TcpError::Auth { qid: 0, source }
    }
}

impl TcpError {
    /// An I/O error, with a reset / EOF turned into [`TcpError::Closed`].
    pub fn io(during: &'static str, e: std::io::Error) -> TcpError {
        use std::io::ErrorKind::*;
        match e.kind() {
            ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | NotConnected => {
                TcpError::Closed { during }
            }
            _ => TcpError::Io { during, source: e },
        }
    }

    /// Whether the connection is unusable after this error (everything but a command status
    /// or a refused request).
    pub fn is_fatal(&self) -> bool {
        !matches!(
            self,
            TcpError::Command { .. } | TcpError::Request { .. } | TcpError::DeviceInput { .. }
        )
    }
}
