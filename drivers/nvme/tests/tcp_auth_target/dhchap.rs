//! The controller's side of DH-HMAC-CHAP, built from the library's primitives, with knobs a
//! hostile or misconfigured target turns.

use ubdirect_nvme::transport::tcp::auth::algo::{DhGroup, DhKey, HashFn};
use ubdirect_nvme::transport::tcp::auth::dhchap::{augmented, ResponseInput, Role};
use ubdirect_nvme::transport::tcp::auth::messages::{auth_type, failure, msg};
use ubdirect_nvme::transport::tcp::auth::DhchapSecret;

/// What the target holds and does.
#[derive(Debug, Clone)]
pub struct TargetAuth {
    /// The host secret the target holds for the host (`dhchap_key`).
    pub host_secret: DhchapSecret,
    /// The controller secret (`dhchap_ctrl_key`).
    pub ctrl_secret: Option<DhchapSecret>,
    /// The hash the target picks (even one the host did not offer).
    pub hash: HashFn,
    /// The group the target picks (even one the host did not offer).
    pub group: DhGroup,
    /// Whether the Connect response asks for authentication (ATR).
    pub require: bool,
    /// I/O queues take no in-capsule data: the authentication messages come by R2T.
    pub no_incapsule: bool,
    /// I/O queue Connect responses do not set ATR, though the queues need authenticating.
    pub no_io_atr: bool,
    /// No DH-HMAC-CHAP at all: Authentication Send / Receive fail with Invalid Field.
    pub no_auth: bool,
    /// Ask for secure channel concatenation too (ASCR).
    pub ascr: bool,
    /// Answer a host challenge with a Success1 that carries no response.
    pub silent: bool,
    /// Close the connection instead of returning an AUTH_Failure1 (as Linux nvmet can: it
    /// fails the controller as it refuses the host).
    pub close_on_failure: bool,
    /// Host NQN.
    pub hostnqn: String,
    /// Subsystem NQN.
    pub subnqn: String,
}

/// One queue's transaction state.
pub struct Side {
    pub cfg: TargetAuth,
    t_id: u16,
    c1: Vec<u8>,
    s1: u32,
    key: Option<DhKey>,
    outbox: Vec<u8>,
    /// The queue passed authentication.
    pub authenticated: bool,
    /// Transactions the host passed on this queue.
    pub passes: u32,
    /// Failure2 explanations the host sent.
    pub host_failures: Vec<u8>,
}

fn header(auth_type: u8, id: u8, t_id: u16, len: usize) -> Vec<u8> {
    let mut m = vec![0u8; len];
    m[0] = auth_type;
    m[1] = id;
    m[4..6].copy_from_slice(&t_id.to_le_bytes());
    m
}

impl Side {
    /// A queue of a target configured with `cfg`.
    pub fn new(cfg: TargetAuth) -> Side {
        Side {
            cfg,
            t_id: 0,
            c1: Vec::new(),
            s1: 0,
            key: None,
            outbox: Vec::new(),
            authenticated: false,
            passes: 0,
            host_failures: Vec::new(),
        }
    }

    /// The message an Authentication Receive returns.
    pub fn receive(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.outbox)
    }

    /// Whether the next Authentication Receive would return an AUTH_Failure1.
    pub fn failing(&self) -> bool {
        self.outbox.get(..2) == Some(&[auth_type::COMMON, msg::FAILURE1][..])
    }

    /// An Authentication Send from the host.
    pub fn send(&mut self, m: &[u8]) {
        self.t_id = u16::from_le_bytes([m[4], m[5]]);
        match (m[0], m[1]) {
            (auth_type::COMMON, msg::NEGOTIATE) => self.challenge(),
            (auth_type::DHCHAP, msg::REPLY) => self.reply(m),
            (auth_type::DHCHAP, msg::SUCCESS2) => self.pass(),
            (auth_type::COMMON, msg::FAILURE2) => self.host_failures.push(m[7]),
            other => panic!("unexpected host message {other:?}"),
        }
    }

    fn pass(&mut self) {
        self.authenticated = true;
        self.passes += 1;
    }

    fn failure1(&mut self, why: u8) {
        let mut m = header(auth_type::COMMON, msg::FAILURE1, self.t_id, 8);
        m[6] = 1;
        m[7] = why;
        self.outbox = m;
    }

    fn challenge(&mut self) {
        let hl = self.cfg.hash.digest_len();
        self.c1 = (0..hl)
            .map(|i| (i * 7 + self.t_id as usize) as u8)
            .collect();
        self.s1 = 0x1000 + self.t_id as u32;
        self.key =
            (self.cfg.group != DhGroup::Null).then(|| DhKey::generate(self.cfg.group).unwrap());
        let dh = self.key.as_ref().map_or(&[][..], |k| k.public()).to_vec();
        let mut m = header(auth_type::DHCHAP, msg::CHALLENGE, self.t_id, 16 + hl);
        m[6] = hl as u8;
        m[8] = self.cfg.hash.id();
        m[9] = self.cfg.group.id();
        m[10..12].copy_from_slice(&(dh.len() as u16).to_le_bytes());
        m[12..16].copy_from_slice(&self.s1.to_le_bytes());
        m[16..].copy_from_slice(&self.c1);
        m.extend_from_slice(&dh);
        self.outbox = m;
    }

    fn response(&self, role: Role, key: &[u8], c: &[u8], seq: u32, ks: Option<&[u8]>) -> Vec<u8> {
        ResponseInput {
            hash: self.cfg.hash,
            key,
            challenge: &augmented(self.cfg.hash, ks, c),
            seqnum: seq,
            t_id: self.t_id,
            role,
            hostnqn: &self.cfg.hostnqn,
            subnqn: &self.cfg.subnqn,
        }
        .response()
        .to_vec()
    }

    fn reply(&mut self, m: &[u8]) {
        let hl = m[6] as usize;
        let cvalid = m[8] & 1 != 0;
        let dhvlen = u16::from_le_bytes([m[10], m[11]]) as usize;
        let s2 = u32::from_le_bytes(m[12..16].try_into().unwrap());
        let (r1, c2, dh) = (
            &m[16..16 + hl],
            &m[16 + hl..16 + 2 * hl],
            &m[16 + 2 * hl..16 + 2 * hl + dhvlen],
        );
        let ks = self.key.as_ref().map(|k| k.shared(dh).unwrap().to_vec());
        let hk = self.cfg.host_secret.transformed(&self.cfg.hostnqn);
        if self.response(Role::Host, &hk, &self.c1, self.s1, ks.as_deref()) != r1 {
            return self.failure1(failure::FAILED);
        }
        let mut out = header(auth_type::DHCHAP, msg::SUCCESS1, self.t_id, 16);
        out[6] = hl as u8;
        match (&self.cfg.ctrl_secret, cvalid && !self.cfg.silent) {
            (Some(cs), true) => {
                let ck = cs.transformed(&self.cfg.subnqn);
                out[8] = 1;
                out.extend_from_slice(&self.response(Role::Controller, &ck, c2, s2, ks.as_deref()));
            }
            _ if !cvalid => self.pass(),
            _ => {}
        }
        self.outbox = out;
    }
}
