//! The host side of one DH-HMAC-CHAP transaction on a queue: AUTH_Negotiate, the
//! controller's Challenge, the host's Reply, the controller's Success1 and (bidirectional)
//! the host's Success2; any failure on the host's side ends it with AUTH_Failure2.

use zeroize::Zeroizing;

use super::algo::{DhGroup, DhKey, DhValueError, HashFn};
use super::error::{AuthError, STEP_NEGOTIATE, STEP_REPLY};
use super::messages::{self, Challenge, Incoming, Reply};
use super::AuthConfig;
use crate::transport::tcp::error::TcpError;

/// Which side a response proves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The host's response R1 (key: host secret transformed with the host NQN).
    Host,
    /// The controller's response R2 (key: controller secret transformed with the subsystem NQN).
    Controller,
}

/// What a DH-HMAC-CHAP response is computed over.
#[derive(Debug)]
pub struct ResponseInput<'a> {
    /// The hash function the controller chose.
    pub hash: HashFn,
    /// The transformed secret of the proving side.
    pub key: &'a [u8],
    /// The challenge (augmented with the session key when a DH group is in use).
    pub challenge: &'a [u8],
    /// Sequence number (S1 for the host, S2 for the controller).
    pub seqnum: u32,
    /// Transaction identifier.
    pub t_id: u16,
    /// Which side proves.
    pub role: Role,
    /// Host NQN.
    pub hostnqn: &'a str,
    /// Subsystem NQN.
    pub subnqn: &'a str,
}

impl ResponseInput<'_> {
    /// HMAC(key, C || S || T_ID || 00h || "HostHost" || NQNh || 00h || NQNc) for the host;
    /// "Controller" and the NQNs swapped for the controller.
    pub fn response(&self) -> Zeroizing<Vec<u8>> {
        let (label, first, second): (&[u8], &str, &str) = match self.role {
            Role::Host => (b"HostHost", self.hostnqn, self.subnqn),
            Role::Controller => (b"Controller", self.subnqn, self.hostnqn),
        };
        self.hash.hmac(
            self.key,
            &[
                self.challenge,
                &self.seqnum.to_le_bytes(),
                &self.t_id.to_le_bytes(),
                &[0],
                label,
                first.as_bytes(),
                &[0],
                second.as_bytes(),
            ],
        )
    }
}

/// The challenge as the response uses it: `c` itself without a session key, else
/// HMAC(H(session key), c).
pub fn augmented(hash: HashFn, session: Option<&[u8]>, c: &[u8]) -> Zeroizing<Vec<u8>> {
    match session {
        None => Zeroizing::new(c.to_vec()),
        Some(ks) => hash.hmac(&hash.hash(ks), &[c]),
    }
}

/// How the host exchanges authentication messages on a queue (Authentication Send /
/// Receive).
pub trait AuthChannel {
    /// Send one message (Authentication Send).
    fn send(&mut self, msg: &[u8]) -> Result<(), TcpError>;
    /// Receive one message (Authentication Receive of [`messages::MAX_MESSAGE`] bytes).
    fn receive(&mut self) -> Result<Vec<u8>, TcpError>;
}

/// One transaction's parameters.
#[derive(Debug)]
pub struct Transaction<'a> {
    /// Secrets and what the host offers.
    pub cfg: &'a AuthConfig,
    /// Host NQN.
    pub hostnqn: &'a str,
    /// Subsystem NQN.
    pub subnqn: &'a str,
    /// Transaction identifier.
    pub t_id: u16,
}

/// What the host keeps between its Reply and the controller's Success1.
struct Pending {
    hash: HashFn,
    /// The response the controller must give (bidirectional).
    expect: Option<Zeroizing<Vec<u8>>>,
}

/// What a finished transaction agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Authenticated {
    /// Hash function.
    pub hash: HashFn,
    /// Diffie-Hellman group.
    pub group: DhGroup,
    /// Whether the controller proved its secret too.
    pub bidirectional: bool,
}

fn names<T: Copy>(v: &[T], name: impl Fn(T) -> &'static str) -> String {
    v.iter().map(|&x| name(x)).collect::<Vec<_>>().join(", ")
}

impl Transaction<'_> {
    /// Run the transaction over `ch`. An error the host finds after the Challenge is sent
    /// to the controller as AUTH_Failure2 (best effort) before it is returned.
    pub fn run(&self, ch: &mut impl AuthChannel) -> Result<Authenticated, TcpError> {
        if self.cfg.secret.is_none() {
            return Err(AuthError::NoSecret {
                subnqn: self.subnqn.to_string(),
            }
            .into());
        }
        ch.send(&messages::negotiate(
            self.t_id,
            &self.cfg.hashes,
            &self.cfg.groups,
        ))
        .map_err(|e| match e {
            TcpError::Command { status, .. } => AuthError::Unsupported {
                status: status.to_string(),
            }
            .into(),
            e => e,
        })?;
        let buf = ch
            .receive()
            .map_err(|e| AuthError::closed_after(STEP_NEGOTIATE, e))?;
        let (reply, pending, agreed) = match self.on_challenge(&buf) {
            Ok(r) => r,
            Err(e) => return Err(self.fail(ch, e)),
        };
        ch.send(&reply)?;
        let buf = ch
            .receive()
            .map_err(|e| AuthError::closed_after(STEP_REPLY, e))?;
        if let Err(e) = self.on_success1(&buf, &pending) {
            return Err(self.fail(ch, e));
        }
        if pending.expect.is_some() {
            ch.send(&messages::success2(self.t_id))?;
        }
        Ok(agreed)
    }

    /// Send AUTH_Failure2 for `e` (best effort: its own failure is not reported) unless the
    /// controller already ended the transaction.
    fn fail(&self, ch: &mut impl AuthChannel, e: AuthError) -> TcpError {
        if !matches!(e, AuthError::Refused { .. }) {
            let _ = ch.send(&messages::failure2(self.t_id, e.explanation()));
        }
        e.into()
    }

    /// Parse a message answering `step` that must carry this transaction's identifier.
    fn incoming<'b>(&self, buf: &'b [u8], step: &'static str) -> Result<Incoming<'b>, AuthError> {
        let m = messages::parse(buf).map_err(|e| AuthError::message(step, e))?;
        if let Incoming::Failure1 { explanation, .. } = m {
            return Err(AuthError::Refused { step, explanation });
        }
        if m.t_id() != self.t_id {
            return Err(AuthError::BadMessage {
                step,
                reason: format!(
                    "transaction identifier {} where the host's is {}",
                    m.t_id(),
                    self.t_id
                ),
            });
        }
        Ok(m)
    }

    /// Check the Challenge against what the host offered and build the Reply.
    fn on_challenge(&self, buf: &[u8]) -> Result<(Vec<u8>, Pending, Authenticated), AuthError> {
        const STEP: &str = STEP_NEGOTIATE;
        let c = match self.incoming(buf, STEP)? {
            Incoming::Challenge(c) => c,
            other => {
                return Err(AuthError::BadMessage {
                    step: STEP,
                    reason: format!("expected DH-HMAC-CHAP_Challenge, got {other:?}"),
                })
            }
        };
        let (hash, group) = self.chosen(&c)?;
        let dh = self.exchange(group, c.dh_value)?;
        let session = dh.as_ref().map(|(_, ks)| ks.as_slice());
        let secret = self.cfg.secret.as_ref().expect("checked in run");
        let key = secret.transformed(self.hostnqn);
        let r1 = ResponseInput {
            hash,
            key: &key,
            challenge: &augmented(hash, session, c.challenge),
            seqnum: c.seqnum,
            t_id: self.t_id,
            role: Role::Host,
            hostnqn: self.hostnqn,
            subnqn: self.subnqn,
        }
        .response();
        let (c2, s2, expect) = match &self.cfg.ctrl_secret {
            None => (None, 0, None),
            Some(cs) => {
                let (c2, s2) = random_challenge(hash.digest_len())?;
                let ckey = cs.transformed(self.subnqn);
                let r2 = ResponseInput {
                    hash,
                    key: &ckey,
                    challenge: &augmented(hash, session, &c2),
                    seqnum: s2,
                    t_id: self.t_id,
                    role: Role::Controller,
                    hostnqn: self.hostnqn,
                    subnqn: self.subnqn,
                }
                .response();
                (Some(c2), s2, Some(r2))
            }
        };
        let reply = messages::reply(&Reply {
            t_id: self.t_id,
            response: &r1,
            challenge: c2.as_deref().map(|c| c.as_slice()),
            seqnum: s2,
            dh_value: dh.as_ref().map_or(&[][..], |(k, _)| k.public()),
        });
        let agreed = Authenticated {
            hash,
            group,
            bidirectional: expect.is_some(),
        };
        Ok((reply, Pending { hash, expect }, agreed))
    }

    /// The hash and group the Challenge names, refused unless the host offered them.
    fn chosen(&self, c: &Challenge<'_>) -> Result<(HashFn, DhGroup), AuthError> {
        let hash = HashFn::from_id(c.hash_id)
            .filter(|h| self.cfg.hashes.contains(h))
            .ok_or_else(|| AuthError::HashNotOffered {
                id: c.hash_id,
                offered: names(&self.cfg.hashes, HashFn::name),
            })?;
        let group = DhGroup::from_id(c.dh_group)
            .filter(|g| self.cfg.groups.contains(g))
            .ok_or_else(|| AuthError::GroupNotOffered {
                id: c.dh_group,
                offered: names(&self.cfg.groups, DhGroup::name),
            })?;
        if c.challenge.len() != hash.digest_len() {
            return Err(AuthError::BadMessage {
                step: STEP_NEGOTIATE,
                reason: format!(
                    "HL is {} but {} is {} bytes long",
                    c.challenge.len(),
                    hash.name(),
                    hash.digest_len()
                ),
            });
        }
        Ok((hash, group))
    }

    /// The host's key pair and the session key for `group` (none for the null group).
    #[allow(clippy::type_complexity)]
    fn exchange(
        &self,
        group: DhGroup,
        peer: &[u8],
    ) -> Result<Option<(DhKey, Zeroizing<Vec<u8>>)>, AuthError> {
        if group == DhGroup::Null {
            if !peer.is_empty() {
                return Err(AuthError::DhValue {
                    reason: "the null group carries no value",
                });
            }
            return Ok(None);
        }
        if peer.len() != group.value_len() {
            return Err(AuthError::DhValue {
                reason: "its length is not the group's",
            });
        }
        let key = DhKey::generate(group).ok_or(AuthError::Random)?;
        let ks = key.shared(peer).map_err(|e| AuthError::DhValue {
            reason: match e {
                DhValueError::Length => "its length is not the group's",
                DhValueError::Range => "it is 0, 1, p - 1 or not below p",
            },
        })?;
        Ok(Some((key, ks)))
    }

    /// Check Success1: its hash length and, bidirectional, the controller's response.
    fn on_success1(&self, buf: &[u8], p: &Pending) -> Result<(), AuthError> {
        const STEP: &str = STEP_REPLY;
        let s = match self.incoming(buf, STEP)? {
            Incoming::Success1(s) => s,
            other => {
                return Err(AuthError::BadMessage {
                    step: STEP,
                    reason: format!("expected DH-HMAC-CHAP_Success1, got {other:?}"),
                })
            }
        };
        if s.hl as usize != p.hash.digest_len() {
            return Err(AuthError::BadMessage {
                step: STEP,
                reason: format!(
                    "HL is {} where {} has {}",
                    s.hl,
                    p.hash.name(),
                    p.hash.digest_len()
                ),
            });
        }
        let Some(want) = &p.expect else {
            return Ok(());
        };
        let got = s.response.ok_or(AuthError::ControllerSilent)?;
        if !constant_time_eq(got, want) {
            return Err(AuthError::ControllerMismatch);
        }
        Ok(())
    }
}

/// A random challenge of `len` bytes and a random non-zero sequence number.
#[allow(clippy::type_complexity)]
fn random_challenge(len: usize) -> Result<(Zeroizing<Vec<u8>>, u32), AuthError> {
    let mut c = Zeroizing::new(vec![0u8; len]);
    let mut s = [0u8; 4];
    getrandom::fill(&mut c).map_err(|_| AuthError::Random)?;
    getrandom::fill(&mut s).map_err(|_| AuthError::Random)?;
    Ok((c, u32::from_le_bytes(s).max(1)))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}
