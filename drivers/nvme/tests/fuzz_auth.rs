//! Fuzz target of the DH-HMAC-CHAP messages a target sends: arbitrary bytes and mutated
//! Challenge / Success1 / Failure1 messages, fed to the parser and to the host's side of a
//! whole transaction. Each runs `UBD_FUZZ_CASES` cases (10,000 by default). Nothing may
//! panic; the parser borrows inside its input; the host sends at most four messages, each no
//! longer than the largest Reply (ffdhe8192, SHA-512).

mod fuzz_support;

use fuzz_support::config;
use proptest::prelude::*;
use ubdirect_nvme::transport::tcp::auth::dhchap::{AuthChannel, Transaction};
use ubdirect_nvme::transport::tcp::auth::messages::{self, Incoming, MAX_MESSAGE};
use ubdirect_nvme::transport::tcp::auth::{AuthConfig, DhGroup, DhchapSecret, HashFn};
use ubdirect_nvme::transport::tcp::TcpError;

/// The largest message the host sends: a Reply with two SHA-512 values and an ffdhe8192 value.
const LARGEST_SEND: usize = 16 + 2 * 64 + 1024;

/// A target that answers from a script and records what the host sent.
struct Scripted {
    answers: Vec<Vec<u8>>,
    sent: Vec<usize>,
}

impl AuthChannel for Scripted {
    fn send(&mut self, msg: &[u8]) -> Result<(), TcpError> {
        self.sent.push(msg.len());
        Ok(())
    }
    fn receive(&mut self) -> Result<Vec<u8>, TcpError> {
        if self.answers.is_empty() {
            return Err(TcpError::Closed { during: "fuzz" });
        }
        let mut a = self.answers.remove(0);
        a.truncate(MAX_MESSAGE);
        Ok(a)
    }
}

/// A Challenge of hash `hash_id`, group `group`, HL `hl`, DHVLEN `dhvlen` (the values follow
/// as far as `body` reaches).
fn challenge(t_id: u16, hash_id: u8, group: u8, hl: u8, dhvlen: u16, body: &[u8]) -> Vec<u8> {
    let mut m = vec![1, 1, 0, 0];
    m.extend_from_slice(&t_id.to_le_bytes());
    m.extend_from_slice(&[hl, 0, hash_id, group]);
    m.extend_from_slice(&dhvlen.to_le_bytes());
    m.extend_from_slice(&7u32.to_le_bytes());
    m.extend_from_slice(body);
    m
}

fn success1(t_id: u16, hl: u8, rvalid: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![1, 3, 0, 0];
    m.extend_from_slice(&t_id.to_le_bytes());
    m.extend_from_slice(&[hl, 0, rvalid, 0, 0, 0, 0, 0, 0, 0]);
    m.extend_from_slice(body);
    m
}

fn patch(mut m: Vec<u8>, patches: &[(usize, u8)], cut: Option<usize>) -> Vec<u8> {
    for &(at, b) in patches {
        if !m.is_empty() {
            let i = at % m.len();
            m[i] = b;
        }
    }
    if let Some(c) = cut {
        m.truncate(c);
    }
    m
}

fn cfg(bidirectional: bool) -> AuthConfig {
    AuthConfig {
        secret: Some(DhchapSecret::from_key(&[1; 32], Some(HashFn::Sha256))),
        ctrl_secret: bidirectional.then(|| DhchapSecret::from_key(&[2; 48], None)),
        hashes: HashFn::ALL.to_vec(),
        // ffdhe2048 at most: a larger group costs seconds per case in a debug build.
        groups: vec![DhGroup::Null, DhGroup::Ffdhe2048],
    }
}

fn group_id() -> impl Strategy<Value = u8> {
    prop_oneof![6 => Just(0u8), 1 => Just(1u8), 3 => any::<u8>()]
}

fn hash_id() -> impl Strategy<Value = u8> {
    prop_oneof![8 => 1u8..=3, 2 => any::<u8>()]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_parse_without_panic(b in proptest::collection::vec(any::<u8>(), 0..600)) {
        fuzz_support::tick("fuzz_auth");
        if let Ok(Incoming::Challenge(c)) = messages::parse(&b) {
            prop_assert!(16 + c.challenge.len() + c.dh_value.len() <= b.len());
        }
    }

    #[test]
    fn hostile_answers_end_in_an_error_or_success_never_a_panic(
        hash in hash_id(),
        group in group_id(),
        hl in prop_oneof![Just(32u8), Just(48u8), Just(64u8), any::<u8>()],
        dhvlen in prop_oneof![Just(0u16), Just(256u16), any::<u16>()],
        body in proptest::collection::vec(any::<u8>(), 0..1400),
        s1_hl in prop_oneof![Just(32u8), any::<u8>()],
        rvalid in 0u8..3,
        s1_body in proptest::collection::vec(any::<u8>(), 0..96),
        patches in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
        cut in proptest::option::of(0usize..1500),
        failure in any::<bool>(),
        bidirectional in any::<bool>(),
    ) {
        fuzz_support::tick("fuzz_auth");
        let t_id = 5;
        let first = patch(challenge(t_id, hash, group, hl, dhvlen, &body), &patches, cut);
        let second = if failure {
            vec![0, 0xf1, 0, 0, 5, 0, 1, rvalid]
        } else {
            success1(t_id, s1_hl, rvalid, &s1_body)
        };
        let cfg = cfg(bidirectional);
        let t = Transaction {
            cfg: &cfg,
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:fuzz",
            subnqn: "nqn.2026-11.io.ubdirect:fuzz",
            t_id,
        };
        let mut ch = Scripted { answers: vec![first, second], sent: Vec::new() };
        let _ = t.run(&mut ch);
        prop_assert!(ch.sent.len() <= 4, "{:?}", ch.sent);
        prop_assert!(ch.sent.iter().all(|&n| n <= LARGEST_SEND), "{:?}", ch.sent);
    }
}
