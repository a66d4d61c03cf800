//! DH-HMAC-CHAP on the NVMe/TCP host against a fake target on loopback that runs the
//! controller's side of the exchange: the right key connects (admin and I/O queues, every
//! hash and group, unidirectional and bidirectional) and moves data; a wrong key, a missing
//! key, a wrong controller key and downgrade attempts are refused with errors that name
//! them, and nothing but Connect and the authentication commands reaches the target.

mod tcp_auth_target;

use std::sync::atomic::Ordering;
use std::time::Duration;

use tcp_auth_target::{config, connect, start, LBA};
use ubdirect_nvme::transport::tcp::auth::{messages::failure, AuthConfig, AuthError};
use ubdirect_nvme::transport::tcp::auth::{DhGroup, DhchapSecret, HashFn};
use ubdirect_nvme::transport::tcp::ctrl::TcpOptions;
use ubdirect_nvme::transport::tcp::fabrics;
use ubdirect_nvme::transport::tcp::queue::TcpCommand;
use ubdirect_nvme::transport::tcp::TcpError;

const KEY: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
const CTRL_KEY: &str =
    "DHHC-1:02:ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoOEhYaHiImKi4yNjo+QkZKTvGwQfg==:";
/// Another 32-byte key (all 0x42), hash 00.
fn other_key() -> DhchapSecret {
    DhchapSecret::from_key(&[0x42; 32], None)
}

fn opts(secret: Option<DhchapSecret>, ctrl: Option<DhchapSecret>) -> TcpOptions {
    TcpOptions {
        auth: AuthConfig {
            secret,
            ctrl_secret: ctrl,
            ..AuthConfig::default()
        },
        connect_timeout: Duration::from_secs(10),
        admin_timeout: Duration::from_secs(10),
        ..TcpOptions::default()
    }
}

fn key(s: &str) -> Option<DhchapSecret> {
    Some(DhchapSecret::parse(s).unwrap())
}

fn auth_error(r: Result<impl std::fmt::Debug, TcpError>) -> (u16, AuthError) {
    match r.unwrap_err() {
        TcpError::Auth { qid, source } => (qid, source),
        e => panic!("not an authentication error: {e:?}"),
    }
}

/// Only Connect (fctype 01h) and Authentication Send / Receive (05h / 06h) reached it.
fn only_auth_commands(t: &tcp_auth_target::Target) {
    let s = t.seen.lock().unwrap();
    assert_eq!(s.unauthenticated, 0, "{:?}", s.commands);
    assert!(
        s.commands
            .iter()
            .all(|&(_, op, fc)| op == 0x7f && matches!(fc, 0x01 | 0x05 | 0x06)),
        "{:?}",
        s.commands
    );
}

#[test]
fn right_key_connects_authenticates_every_queue_and_moves_data() {
    let t = start(config(KEY));
    let c = connect(&t, &opts(key(KEY), None)).unwrap();
    let mut q = c.io_queue::<Vec<u8>>(8).unwrap();
    let data: Vec<u8> = (0..2 * LBA).map(|i| (i * 13) as u8).collect();
    let to = Duration::from_secs(10);
    let n = data.len() as u32;
    q.run(
        TcpCommand::new(fabrics::rw(true, 1, 4, 2), "Write")
            .write(0, n)
            .buf(data.clone()),
        to,
    )
    .unwrap();
    let (_, back) = q
        .run(
            TcpCommand::new(fabrics::rw(false, 1, 4, 2), "Read")
                .read(0, n)
                .buf(vec![0; 2 * LBA]),
            to,
        )
        .unwrap();
    assert_eq!(back.unwrap(), data);
    let s = t.seen.lock().unwrap();
    assert_eq!(
        (s.authenticated, s.unauthenticated),
        (2, 0),
        "{:?}",
        s.commands
    );
}

#[test]
fn every_hash_and_group_bidirectional() {
    let cases = [
        (HashFn::Sha256, DhGroup::Ffdhe2048),
        (HashFn::Sha384, DhGroup::Ffdhe3072),
        (HashFn::Sha512, DhGroup::Ffdhe4096),
        (HashFn::Sha256, DhGroup::Ffdhe6144),
        (HashFn::Sha512, DhGroup::Ffdhe8192),
        (HashFn::Sha384, DhGroup::Null),
    ];
    for (hash, group) in cases {
        let mut cfg = config(KEY);
        cfg.ctrl_secret = key(CTRL_KEY);
        cfg.hash = hash;
        cfg.group = group;
        let t = start(cfg);
        let c = connect(&t, &opts(key(KEY), key(CTRL_KEY))).unwrap();
        let a = c.reauthenticate().unwrap();
        assert_eq!((a.hash, a.group, a.bidirectional), (hash, group, true));
        drop(c.io_queue::<Vec<u8>>(4).unwrap());
        let s = t.seen.lock().unwrap();
        assert_eq!(
            (s.authenticated, s.unauthenticated),
            (3, 0),
            "{hash:?} {group:?}"
        );
    }
}

#[test]
fn wrong_key_is_refused_before_any_other_command() {
    let t = start(config(KEY));
    let (qid, e) = auth_error(connect(&t, &opts(Some(other_key()), None)));
    assert_eq!(qid, 0);
    assert_eq!(
        e,
        AuthError::Refused {
            step: "DH-HMAC-CHAP_Reply",
            explanation: failure::FAILED
        }
    );
    assert!(e.to_string().contains("host secret is not the one"), "{e}");
    only_auth_commands(&t);
}

#[test]
fn a_target_closing_instead_of_refusing_a_wrong_key_is_named() {
    let mut cfg = config(KEY);
    cfg.close_on_failure = true;
    let t = start(cfg);
    let (qid, e) = auth_error(connect(&t, &opts(Some(other_key()), None)));
    assert_eq!(qid, 0);
    assert_eq!(
        e,
        AuthError::ClosedAfter {
            step: "DH-HMAC-CHAP_Reply"
        }
    );
    assert!(e.to_string().contains("check that the host secret"), "{e}");
    only_auth_commands(&t);
}

#[test]
fn missing_key_is_refused_and_nothing_is_sent() {
    let t = start(config(KEY));
    let e = connect(&t, &opts(None, None)).unwrap_err();
    assert!(e.to_string().contains("give a host secret"), "{e}");
    assert!(
        matches!(
            e,
            TcpError::Auth {
                source: AuthError::NoSecret { .. },
                ..
            }
        ),
        "{e:?}"
    );
    let s = t.seen.lock().unwrap();
    assert_eq!(s.commands, vec![(0, 0x7f, 0x01)]);
}

#[test]
fn wrong_controller_key_is_refused() {
    for group in [DhGroup::Null, DhGroup::Ffdhe2048] {
        let mut cfg = config(KEY);
        cfg.ctrl_secret = Some(other_key());
        cfg.group = group;
        let t = start(cfg);
        let (_, e) = auth_error(connect(&t, &opts(key(KEY), key(CTRL_KEY))));
        assert_eq!(e, AuthError::ControllerMismatch);
        std::thread::sleep(Duration::from_millis(100));
        only_auth_commands(&t);
        assert_eq!(t.seen.lock().unwrap().host_failures, vec![failure::FAILED]);
    }
}

#[test]
fn a_controller_that_does_not_answer_the_hosts_challenge_is_refused() {
    let mut cfg = config(KEY);
    cfg.ctrl_secret = key(CTRL_KEY);
    cfg.silent = true;
    let t = start(cfg);
    let (_, e) = auth_error(connect(&t, &opts(key(KEY), key(CTRL_KEY))));
    assert_eq!(e, AuthError::ControllerSilent);
    only_auth_commands(&t);
}

#[test]
fn downgrades_to_a_group_or_hash_not_offered_are_refused() {
    let t = start(config(KEY));
    let mut o = opts(key(KEY), None);
    o.auth.groups = vec![DhGroup::Ffdhe3072, DhGroup::Ffdhe4096];
    let (_, e) = auth_error(connect(&t, &o));
    assert!(
        matches!(e, AuthError::GroupNotOffered { id: 0, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("ffdhe3072, ffdhe4096"), "{e}");
    only_auth_commands(&t);

    let t = start(config(KEY));
    let mut o = opts(key(KEY), None);
    o.auth.hashes = vec![HashFn::Sha512];
    let (_, e) = auth_error(connect(&t, &o));
    assert!(
        matches!(e, AuthError::HashNotOffered { id: 1, .. }),
        "{e:?}"
    );
    std::thread::sleep(Duration::from_millis(100));
    only_auth_commands(&t);
    assert_eq!(
        t.seen.lock().unwrap().host_failures,
        vec![failure::HASH_UNUSABLE]
    );
}

#[test]
fn a_controller_secret_makes_the_host_authenticate_a_target_that_does_not_ask() {
    let mut cfg = config(KEY);
    cfg.require = false;
    cfg.ctrl_secret = Some(other_key());
    let t = start(cfg);
    let (_, e) = auth_error(connect(&t, &opts(key(KEY), key(CTRL_KEY))));
    assert_eq!(e, AuthError::ControllerMismatch);
}

#[test]
fn authentication_required_later_is_answered_by_authenticating_again() {
    let t = start(config(KEY));
    let c = connect(&t, &opts(key(KEY), None)).unwrap();
    assert_eq!(t.seen.lock().unwrap().authenticated, 1);
    t.revoke.store(true, Ordering::Relaxed);
    let ns = c.namespace(1).unwrap();
    assert_eq!(ns.lba_size, LBA as u32);
    let s = t.seen.lock().unwrap();
    assert_eq!(s.authenticated, 2, "{:?}", s.commands);
}

#[test]
fn a_target_demanding_secure_channel_concatenation_is_refused() {
    let mut cfg = config(KEY);
    cfg.ascr = true;
    let t = start(cfg);
    let (_, e) = auth_error(connect(&t, &opts(key(KEY), None)));
    assert_eq!(e, AuthError::ConcatenationRequired);
    let s = t.seen.lock().unwrap();
    assert_eq!(s.commands, vec![(0, 0x7f, 0x01)]);
}

#[test]
fn io_queues_without_in_capsule_data_authenticate_through_r2t() {
    let mut cfg = config(KEY);
    cfg.no_incapsule = true;
    cfg.group = DhGroup::Ffdhe3072;
    cfg.ctrl_secret = key(CTRL_KEY);
    let t = start(cfg);
    let c = connect(&t, &opts(key(KEY), key(CTRL_KEY))).unwrap();
    drop(c.io_queue::<Vec<u8>>(4).unwrap());
    let s = t.seen.lock().unwrap();
    assert_eq!(
        (s.authenticated, s.unauthenticated),
        (2, 0),
        "{:?}",
        s.commands
    );
}

#[test]
fn io_queues_authenticate_when_the_admin_queue_did_even_without_atr() {
    let mut cfg = config(KEY);
    cfg.no_io_atr = true;
    let t = start(cfg);
    let c = connect(&t, &opts(key(KEY), None)).unwrap();
    drop(c.io_queue::<Vec<u8>>(4).unwrap());
    let s = t.seen.lock().unwrap();
    assert_eq!(
        (s.authenticated, s.unauthenticated),
        (2, 0),
        "{:?}",
        s.commands
    );
}

#[test]
fn a_controller_secret_refuses_a_target_that_does_not_authenticate() {
    let mut cfg = config(KEY);
    cfg.require = false;
    cfg.no_auth = true;
    let t = start(cfg);
    let (_, e) = auth_error(connect(&t, &opts(key(KEY), key(CTRL_KEY))));
    assert!(matches!(e, AuthError::Unsupported { .. }), "{e:?}");
    assert!(e.to_string().contains("controller secret is set"), "{e}");
    let s = t.seen.lock().unwrap();
    assert_eq!(s.commands, vec![(0, 0x7f, 0x01), (0, 0x7f, 0x05)]);
}
