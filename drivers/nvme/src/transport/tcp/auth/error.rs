//! [`AuthError`]: why DH-HMAC-CHAP authentication failed, naming the side and the step.

use thiserror::Error;

use super::messages::{failure, MessageError};
use crate::transport::tcp::error::TcpError;

/// The fix [`AuthError::NoSecret`] names.
pub const GIVE_SECRET: &str = "give a host secret (DHHC-1:..., as nvme gen-dhchap-key writes it, the one the target holds for this host NQN)";

/// Why DH-HMAC-CHAP authentication of a queue failed. Nothing but the authentication
/// messages was sent on the queue.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuthError {
    /// The target requires authentication and no host secret is configured.
    #[error("the target requires authentication (DH-HMAC-CHAP) for subsystem {subnqn}: {GIVE_SECRET}; nothing else was sent")]
    NoSecret {
        /// The subsystem NQN.
        subnqn: String,
    },
    /// The target ended the exchange with AUTH_Failure1.
    #[error("the target refused authentication after the host's {step}: {}{}", failure::name(*.explanation), if *.explanation == failure::FAILED { ": the host secret is not the one the target holds for this host NQN" } else { "" })]
    Refused {
        /// The host message the target answered with the failure.
        step: &'static str,
        /// Reason code explanation.
        explanation: u8,
    },
    /// The target closed the connection where it owed the host an answer to `step`.
    /// Linux's nvmet fails the controller as it refuses a host, and its connection can close
    /// before the AUTH_Failure1 reaches the host.
    #[error("the target closed the connection instead of answering the host's {step}: a target refusing the host does so at times (Linux nvmet); {}; nothing else was sent", closed_hint(.step))]
    ClosedAfter {
        /// The host message left unanswered.
        step: &'static str,
    },
    /// The controller's response R2 does not match the controller secret.
    #[error("the controller's DH-HMAC-CHAP response does not match the controller secret: this target does not hold that secret (wrong controller secret, or not the intended target); the connection was dropped")]
    ControllerMismatch,
    /// A controller secret is set but the controller gave no response to the host's challenge.
    #[error("a controller secret is set, so the host challenged the controller, but its Success1 carries no response: refused as a downgrade to unidirectional authentication")]
    ControllerSilent,
    /// The target chose a hash function the host did not offer.
    #[error("the target chose hash function {id:#04x}, which the host did not offer (it offered {offered}): refused as a downgrade or protocol error")]
    HashNotOffered {
        /// HashID chosen.
        id: u8,
        /// What the host offered.
        offered: String,
    },
    /// The target chose a Diffie-Hellman group the host did not offer.
    #[error("the target chose DH group {id:#04x}, which the host did not offer (it offered {offered}): refused as a downgrade or protocol error")]
    GroupNotOffered {
        /// DH group identifier chosen.
        id: u8,
        /// What the host offered.
        offered: String,
    },
    /// The target's message could not be parsed or is not the one expected.
    #[error("the target's answer to the host's {step} is malformed: {reason}")]
    BadMessage {
        /// The host message it answers.
        step: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The target's Diffie-Hellman public value is unusable.
    #[error("the target's Diffie-Hellman public value is unusable ({reason}): refused")]
    DhValue {
        /// What is wrong.
        reason: &'static str,
    },
    /// The target refused the host's AUTH_Negotiate with a command status: it does not
    /// authenticate this host.
    #[error("the target refused to authenticate (Authentication Send failed: {status}): it holds no DH-HMAC-CHAP key for this host NQN; the host requires authentication because a controller secret is set (or the target asked for it)")]
    Unsupported {
        /// The command status, as text.
        status: String,
    },
    /// The target requires secure channel concatenation (the Connect response's ASCR bit).
    #[error("the target requires secure channel concatenation (DH-HMAC-CHAP then TLS, the Connect response's ASCR bit), which this host does not implement: configure the target to accept this host without it; nothing else was sent")]
    ConcatenationRequired,
    /// The host could not draw random bytes.
    #[error("the system random source failed: cannot make a challenge or a Diffie-Hellman key")]
    Random,
}

/// What a target closing the connection after `step` most likely refused.
fn closed_hint(step: &str) -> &'static str {
    if step == STEP_REPLY {
        "check that the host secret is the one the target holds for this host NQN, and the target's log"
    } else {
        "check that the target holds a DH-HMAC-CHAP key for this host NQN and can use a hash and DH group the host offers, and the target's log"
    }
}

/// The host message answered by the controller's Success1 or Failure1.
pub const STEP_REPLY: &str = "DH-HMAC-CHAP_Reply";
/// The host message answered by the controller's Challenge or Failure1.
pub const STEP_NEGOTIATE: &str = "AUTH_Negotiate";

impl AuthError {
    /// A malformed-message error for `step` from a parse error.
    pub fn message(step: &'static str, e: MessageError) -> AuthError {
        AuthError::BadMessage {
            step,
            reason: e.to_string(),
        }
    }

    /// `e` as [`AuthError::ClosedAfter`] `step` when it says the connection closed; other
    /// errors unchanged.
    pub fn closed_after(step: &'static str, e: TcpError) -> TcpError {
        match e {
            TcpError::Closed { .. } => AuthError::ClosedAfter { step }.into(),
            e => e,
        }
    }

    /// The AUTH_Failure2 reason code explanation the host sends for this error.
    pub fn explanation(&self) -> u8 {
        match self {
            AuthError::HashNotOffered { .. } => failure::HASH_UNUSABLE,
            AuthError::GroupNotOffered { .. } => failure::DHGROUP_UNUSABLE,
            AuthError::BadMessage { .. } | AuthError::DhValue { .. } => failure::INCORRECT_PAYLOAD,
            _ => failure::FAILED,
        }
    }
}
