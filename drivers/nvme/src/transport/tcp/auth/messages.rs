//! The authentication messages of DH-HMAC-CHAP (NVMe Base 2.0 section 8.13.5), carried in
//! Authentication Send / Receive: built for what the host sends, parsed (borrowing, never
//! allocating by a length the target names) for what the target sends.

use super::algo::{DhGroup, HashFn};

/// SECP of DH-HMAC-CHAP in Authentication Send / Receive.
pub const SECP_DHCHAP: u8 = 0xe9;
/// AUTH-ID of DH-HMAC-CHAP in the negotiate message's protocol descriptor.
pub const AUTHID_DHCHAP: u8 = 0x01;
/// The most a target's message may hold (an ffdhe8192 challenge is 16 + 64 + 1,024 bytes).
pub const MAX_MESSAGE: usize = 4096;

/// Message types (AUTH-Type).
pub mod auth_type {
    /// Common messages (negotiate, failures).
    pub const COMMON: u8 = 0x00;
    /// DH-HMAC-CHAP messages.
    pub const DHCHAP: u8 = 0x01;
}

/// Message identifiers (AUTH-Id).
pub mod msg {
    /// AUTH_Negotiate.
    pub const NEGOTIATE: u8 = 0x00;
    /// DH-HMAC-CHAP_Challenge.
    pub const CHALLENGE: u8 = 0x01;
    /// DH-HMAC-CHAP_Reply.
    pub const REPLY: u8 = 0x02;
    /// DH-HMAC-CHAP_Success1.
    pub const SUCCESS1: u8 = 0x03;
    /// DH-HMAC-CHAP_Success2.
    pub const SUCCESS2: u8 = 0x04;
    /// AUTH_Failure2 (host to controller).
    pub const FAILURE2: u8 = 0xf0;
    /// AUTH_Failure1 (controller to host).
    pub const FAILURE1: u8 = 0xf1;
}

/// Reason code explanations of AUTH_Failure1/2.
pub mod failure {
    /// Authentication failed.
    pub const FAILED: u8 = 0x01;
    /// Authentication protocol not usable.
    pub const NOT_USABLE: u8 = 0x02;
    /// Secure channel concatenation mismatch.
    pub const CONCAT_MISMATCH: u8 = 0x03;
    /// Hash function not usable.
    pub const HASH_UNUSABLE: u8 = 0x04;
    /// DH group not usable.
    pub const DHGROUP_UNUSABLE: u8 = 0x05;
    /// Incorrect payload.
    pub const INCORRECT_PAYLOAD: u8 = 0x06;
    /// Incorrect protocol message.
    pub const INCORRECT_MESSAGE: u8 = 0x07;

    /// What a reason code explanation means.
    pub fn name(code: u8) -> &'static str {
        match code {
            FAILED => "authentication failed (the response did not match the secret)",
            NOT_USABLE => "the authentication protocol is not usable",
            CONCAT_MISMATCH => "secure channel concatenation mismatch",
            HASH_UNUSABLE => "no hash function both sides accept",
            DHGROUP_UNUSABLE => "no Diffie-Hellman group both sides accept",
            INCORRECT_PAYLOAD => "incorrect payload",
            INCORRECT_MESSAGE => "incorrect protocol message",
            _ => "unknown reason",
        }
    }
}

/// The AUTH_Negotiate message offering DH-HMAC-CHAP with `hashes` and `groups`, transaction
/// `t_id` (no secure channel concatenation).
pub fn negotiate(t_id: u16, hashes: &[HashFn], groups: &[DhGroup]) -> Vec<u8> {
    let mut m = vec![0u8; 8 + 64];
    m[0] = auth_type::COMMON;
    m[1] = msg::NEGOTIATE;
    m[4..6].copy_from_slice(&t_id.to_le_bytes());
    m[6] = 0; // SC_C
    m[7] = 1; // NAPD
    let d = &mut m[8..];
    d[0] = AUTHID_DHCHAP;
    let hashes = &hashes[..hashes.len().min(30)];
    let groups = &groups[..groups.len().min(30)];
    d[2] = hashes.len() as u8;
    d[3] = groups.len() as u8;
    for (i, h) in hashes.iter().enumerate() {
        d[4 + i] = h.id();
    }
    for (i, g) in groups.iter().enumerate() {
        d[4 + 30 + i] = g.id();
    }
    m
}

/// What a DH-HMAC-CHAP_Reply carries.
#[derive(Debug)]
pub struct Reply<'a> {
    /// Transaction identifier.
    pub t_id: u16,
    /// The host's response R1 (hash length).
    pub response: &'a [u8],
    /// The host's challenge C2 to the controller (bidirectional), as long as the response.
    pub challenge: Option<&'a [u8]>,
    /// Sequence number S2 (0 when unidirectional).
    pub seqnum: u32,
    /// The host's Diffie-Hellman public value (empty for the null group).
    pub dh_value: &'a [u8],
}

/// The DH-HMAC-CHAP_Reply message.
pub fn reply(r: &Reply<'_>) -> Vec<u8> {
    let hl = r.response.len();
    let mut m = vec![0u8; 16 + 2 * hl + r.dh_value.len()];
    m[0] = auth_type::DHCHAP;
    m[1] = msg::REPLY;
    m[4..6].copy_from_slice(&r.t_id.to_le_bytes());
    m[6] = hl as u8;
    m[8] = r.challenge.is_some() as u8;
    m[10..12].copy_from_slice(&(r.dh_value.len() as u16).to_le_bytes());
    m[12..16].copy_from_slice(&r.seqnum.to_le_bytes());
    m[16..16 + hl].copy_from_slice(r.response);
    if let Some(c) = r.challenge {
        m[16 + hl..16 + hl + c.len().min(hl)].copy_from_slice(&c[..c.len().min(hl)]);
    }
    m[16 + 2 * hl..].copy_from_slice(r.dh_value);
    m
}

/// The DH-HMAC-CHAP_Success2 message.
pub fn success2(t_id: u16) -> Vec<u8> {
    let mut m = vec![0u8; 16];
    m[0] = auth_type::DHCHAP;
    m[1] = msg::SUCCESS2;
    m[4..6].copy_from_slice(&t_id.to_le_bytes());
    m
}

/// The AUTH_Failure2 message with reason code explanation `why` (see [`failure`]).
pub fn failure2(t_id: u16, why: u8) -> Vec<u8> {
    let mut m = vec![0u8; 8];
    m[0] = auth_type::COMMON;
    m[1] = msg::FAILURE2;
    m[4..6].copy_from_slice(&t_id.to_le_bytes());
    m[6] = 0x01; // Reason code: authentication failure.
    m[7] = why;
    m
}

/// A DH-HMAC-CHAP_Challenge, borrowed from the received bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct Challenge<'a> {
    /// Transaction identifier.
    pub t_id: u16,
    /// HashID the controller chose.
    pub hash_id: u8,
    /// DH group identifier the controller chose.
    pub dh_group: u8,
    /// Sequence number S1.
    pub seqnum: u32,
    /// Challenge C1 (HL bytes).
    pub challenge: &'a [u8],
    /// The controller's Diffie-Hellman public value (DHVLEN bytes).
    pub dh_value: &'a [u8],
}

/// A DH-HMAC-CHAP_Success1, borrowed from the received bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct Success1<'a> {
    /// Transaction identifier.
    pub t_id: u16,
    /// Hash length the controller names.
    pub hl: u8,
    /// The controller's response R2, when RVALID is set.
    pub response: Option<&'a [u8]>,
}

/// A message from the controller.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming<'a> {
    /// DH-HMAC-CHAP_Challenge.
    Challenge(Challenge<'a>),
    /// DH-HMAC-CHAP_Success1.
    Success1(Success1<'a>),
    /// AUTH_Failure1: the controller ended the transaction.
    Failure1 {
        /// Transaction identifier.
        t_id: u16,
        /// Reason code.
        code: u8,
        /// Reason code explanation (see [`failure`]).
        explanation: u8,
    },
}

impl Incoming<'_> {
    /// The transaction identifier.
    pub fn t_id(&self) -> u16 {
        match self {
            Incoming::Challenge(c) => c.t_id,
            Incoming::Success1(s) => s.t_id,
            Incoming::Failure1 { t_id, .. } => *t_id,
        }
    }
}

/// Why a controller's message is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageError {
    /// Shorter than its header or than the lengths it names.
    Short {
        /// Bytes the message needs.
        need: usize,
        /// Bytes received.
        have: usize,
    },
    /// An AUTH-Type / AUTH-Id a controller does not send.
    Unexpected {
        /// AUTH-Type.
        auth_type: u8,
        /// AUTH-Id.
        auth_id: u8,
    },
}

impl std::fmt::Display for MessageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MessageError::Short { need, have } => write!(
                f,
                "the message needs {need} bytes by its own lengths but {have} arrived"
            ),
            MessageError::Unexpected { auth_type, auth_id } => write!(
                f,
                "AUTH-Type {auth_type:#04x} / AUTH-Id {auth_id:#04x} is not a message a controller sends"
            ),
        }
    }
}

fn need(buf: &[u8], n: usize) -> Result<(), MessageError> {
    if buf.len() < n {
        return Err(MessageError::Short {
            need: n,
            have: buf.len(),
        });
    }
    Ok(())
}

/// Parse a message a controller sent (`buf` may carry trailing padding).
pub fn parse(buf: &[u8]) -> Result<Incoming<'_>, MessageError> {
    need(buf, 8)?;
    let t_id = u16::from_le_bytes([buf[4], buf[5]]);
    match (buf[0], buf[1]) {
        (auth_type::COMMON, msg::FAILURE1) => Ok(Incoming::Failure1 {
            t_id,
            code: buf[6],
            explanation: buf[7],
        }),
        (auth_type::DHCHAP, msg::CHALLENGE) => {
            need(buf, 16)?;
            let hl = buf[6] as usize;
            let dhvlen = u16::from_le_bytes([buf[10], buf[11]]) as usize;
            need(buf, 16 + hl + dhvlen)?;
            Ok(Incoming::Challenge(Challenge {
                t_id,
                hash_id: buf[8],
                dh_group: buf[9],
                seqnum: u32::from_le_bytes(buf[12..16].try_into().expect("4 bytes")),
                challenge: &buf[16..16 + hl],
                dh_value: &buf[16 + hl..16 + hl + dhvlen],
            }))
        }
        (auth_type::DHCHAP, msg::SUCCESS1) => {
            need(buf, 16)?;
            let hl = buf[6];
            let response = if buf[8] & 1 != 0 {
                need(buf, 16 + hl as usize)?;
                Some(&buf[16..16 + hl as usize])
            } else {
                None
            };
            Ok(Incoming::Success1(Success1 { t_id, hl, response }))
        }
        (auth_type, auth_id) => Err(MessageError::Unexpected { auth_type, auth_id }),
    }
}
