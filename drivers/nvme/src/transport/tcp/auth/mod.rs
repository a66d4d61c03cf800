//! NVMe in-band authentication, DH-HMAC-CHAP (NVMe Base 2.0 section 8.13): secrets in the
//! `DHHC-1:` representation ([`secret`]), the hash functions and Diffie-Hellman groups
//! ([`algo`]), the messages ([`messages`]) and the host's side of a transaction
//! ([`dhchap`]), run on a queue through Authentication Send / Receive.

pub mod algo;
pub mod dhchap;
pub mod error;
pub mod messages;
mod primes;
pub mod secret;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

pub use algo::{DhGroup, HashFn};
pub use dhchap::Authenticated;
pub use error::AuthError;
pub use secret::{DhchapSecret, SecretError};

use super::error::TcpError;
use super::fabrics::FABRICS_OPCODE;
use super::queue::{TcpCommand, TcpQueue};
use crate::spec::Sqe;

/// Fabrics command type of Authentication Send.
pub const FCTYPE_AUTH_SEND: u8 = 0x05;
/// Fabrics command type of Authentication Receive.
pub const FCTYPE_AUTH_RECEIVE: u8 = 0x06;
/// Connect response DW0 bit: authentication required (ATR).
pub const CONNECT_AUTHREQ_ATR: u32 = 1 << 17;
/// Connect response DW0 bit: secure channel concatenation required (ASCR).
pub const CONNECT_AUTHREQ_ASCR: u32 = 1 << 18;

/// The host's authentication settings: its secrets and what it accepts.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// The host secret (what the target holds as this host's `dhchap_key`).
    pub secret: Option<DhchapSecret>,
    /// The controller secret (the target's `dhchap_ctrl_key`): when set, the host also
    /// authenticates the controller, and does so even when the target does not ask.
    pub ctrl_secret: Option<DhchapSecret>,
    /// Hash functions offered (a target choosing another is refused).
    pub hashes: Vec<HashFn>,
    /// Diffie-Hellman groups offered (leave out [`DhGroup::Null`] to require a DH exchange).
    pub groups: Vec<DhGroup>,
}

impl Default for AuthConfig {
    fn default() -> AuthConfig {
        AuthConfig {
            secret: None,
            ctrl_secret: None,
            hashes: HashFn::ALL.to_vec(),
            groups: DhGroup::ALL.to_vec(),
        }
    }
}

/// Environment variable holding the host secret (`DHHC-1:...`).
pub const ENV_SECRET: &str = "UBD_DHCHAP_SECRET";
/// Environment variable holding the controller secret (`DHHC-1:...`).
pub const ENV_CTRL_SECRET: &str = "UBD_DHCHAP_CTRL_SECRET";

impl AuthConfig {
    /// The secrets from files (`secret_file`, `ctrl_secret_file`), else from the environment
    /// ([`ENV_SECRET`], [`ENV_CTRL_SECRET`]); none of either is no secret. Secrets never come
    /// from arguments (they would show in `ps`).
    pub fn from_sources(
        secret_file: Option<&std::path::Path>,
        ctrl_secret_file: Option<&std::path::Path>,
    ) -> Result<AuthConfig, SecretError> {
        let read = |file: Option<&std::path::Path>, var: &str| match file {
            Some(f) => DhchapSecret::from_file(f).map(Some),
            None => DhchapSecret::from_env(var),
        };
        Ok(AuthConfig {
            secret: read(secret_file, ENV_SECRET)?,
            ctrl_secret: read(ctrl_secret_file, ENV_CTRL_SECRET)?,
            ..AuthConfig::default()
        })
    }

    /// Whether the host authenticates on a queue whose Connect response DW0 is `dw0`.
    pub fn wanted(&self, dw0: u32) -> bool {
        dw0 & CONNECT_AUTHREQ_ATR != 0 || self.ctrl_secret.is_some()
    }
}

/// An Authentication Send (`receive` false, transfer length `len`) or Receive (allocation
/// length `len`) of DH-HMAC-CHAP.
pub fn auth_command(receive: bool, len: u32) -> Sqe {
    let mut s = Sqe::new(FABRICS_OPCODE);
    s.nsid = if receive {
        FCTYPE_AUTH_RECEIVE
    } else {
        FCTYPE_AUTH_SEND
    } as u32;
    // SECP (byte 43), SPSP1 (42) and SPSP0 (41) as DH-HMAC-CHAP uses them.
    s.cdw10 = (messages::SECP_DHCHAP as u32) << 24 | 1 << 16 | 1 << 8;
    s.cdw11 = len;
    s
}

/// Transaction identifiers, one per transaction of this process.
static NEXT_TID: AtomicU16 = AtomicU16::new(1);

/// Authentication Send / Receive on one queue (its control path: a `Vec<u8>` queue).
struct QueueChannel<'a> {
    q: &'a mut TcpQueue<Vec<u8>>,
    timeout: Duration,
}

impl dhchap::AuthChannel for QueueChannel<'_> {
    fn send(&mut self, msg: &[u8]) -> Result<(), TcpError> {
        let n = msg.len() as u32;
        let sqe = auth_command(false, n);
        let cmd = TcpCommand::new(sqe, "Authentication Send")
            .write(0, n)
            .buf(msg.to_vec());
        self.q.run(cmd, self.timeout).map(|_| ())
    }
    fn receive(&mut self) -> Result<Vec<u8>, TcpError> {
        let n = messages::MAX_MESSAGE as u32;
        let sqe = auth_command(true, n);
        let buf = vec![0u8; messages::MAX_MESSAGE];
        let cmd = TcpCommand::new(sqe, "Authentication Receive")
            .read(0, n)
            .buf(buf);
        let (_, buf) = self.q.run(cmd, self.timeout)?;
        Ok(buf.unwrap_or_default())
    }
}

/// Who authenticates to which subsystem.
#[derive(Debug, Clone, Copy)]
pub struct Parties<'a> {
    /// Host NQN.
    pub hostnqn: &'a str,
    /// Subsystem NQN.
    pub subnqn: &'a str,
}

/// Run one DH-HMAC-CHAP transaction on queue `q`, every command bounded by `timeout`.
pub fn authenticate_queue(
    q: &mut TcpQueue<Vec<u8>>,
    cfg: &AuthConfig,
    who: Parties<'_>,
    timeout: Duration,
) -> Result<Authenticated, TcpError> {
    let qid = q.qid();
    let t = dhchap::Transaction {
        cfg,
        hostnqn: who.hostnqn,
        subnqn: who.subnqn,
        t_id: NEXT_TID.fetch_add(1, Ordering::Relaxed),
    };
    t.run(&mut QueueChannel { q, timeout })
        .map_err(|e| match e {
            TcpError::Auth { source, .. } => TcpError::Auth { qid, source },
            e => e,
        })
}
