//! Known-answer tests of the DH-HMAC-CHAP primitives and messages. The expected values were
//! computed from the specification's definitions with Python's hmac, hashlib, zlib and
//! base64 modules and its own modular exponentiation (an implementation independent of the
//! crates used here), over the RFC 7919 primes as OpenSSL prints them.

use super::algo::{DhGroup, DhKey, HashFn};
use super::dhchap::{augmented, ResponseInput, Role};
use super::messages::{self, Incoming, MessageError};
use super::secret::{DhchapSecret, SecretError};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
const SUBNQN: &str = "nqn.2026-11.io.ubdirect:fake";
const S32_00: &str = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
const S32_01: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
const S48_02: &str =
    "DHHC-1:02:ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoOEhYaHiImKi4yNjo+QkZKTvGwQfg==:";

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn dhhc1_secrets_parse_and_transform_with_the_nqn() {
    let s = DhchapSecret::parse(S32_00).unwrap();
    assert_eq!(s.len(), 32);
    assert_eq!(
        &s.transformed(HOSTNQN)[..],
        &(0..32).collect::<Vec<u8>>()[..]
    );
    let s = DhchapSecret::parse(S32_01).unwrap();
    assert_eq!(
        &s.transformed(HOSTNQN)[..],
        &unhex("6c7b81cb2a746f74454b1d7140f3153b51ca99459fcef7a86a17f27695b87cd8")[..]
    );
    let s = DhchapSecret::parse(S48_02).unwrap();
    assert_eq!(s.len(), 48);
    assert_eq!(
        &s.transformed(SUBNQN)[..],
        &unhex("8a0c5f65d3c0521b0abf5fb3f0bb4c90dd62e45c1c7e7e1e359f07179b086878842324ff96d830ea698f1c7da0478375")[..]
    );
    // Round trip through the text nvme-cli takes; no trailing colon is accepted too.
    assert_eq!(&s.to_text()[..], S48_02);
    assert!(DhchapSecret::parse(S32_01.trim_end_matches(':')).is_ok());
}

/// Keys nvme-cli 2.3 printed: `nvme gen-dhchap-key --secret=000102..1f --hmac=1 --nqn=HOSTNQN`
/// (it stores the key already transformed with the NQN) and a random SHA-512 one.
const NVME_CLI_01: &str = "DHHC-1:01:bHuByyp0b3RFSx1xQPMVO1HKmUWfzveoahfydpW4fNgSLMVm:";
const NVME_CLI_03: &str = "DHHC-1:03:+/THltuWuylY59fga+ZHdN1GswqmxLqh1oX6uqW54TsimWsIe7NLmEGqVQ+1PAwyr3BKgJWvvuY0EG4lhlKyp5APkzg=:";

#[test]
fn nvme_cli_keys_parse_and_its_transform_is_ours() {
    let ours = DhchapSecret::parse(S32_01).unwrap().transformed(HOSTNQN);
    let s = DhchapSecret::from_key(&ours, Some(HashFn::Sha256));
    assert_eq!(&s.to_text()[..], NVME_CLI_01);
    assert!(DhchapSecret::parse(NVME_CLI_01).is_ok());
    assert_eq!(DhchapSecret::parse(NVME_CLI_03).unwrap().len(), 64);
    // nvme gen-dhchap-key --hmac=0 of the same secret is S32_00.
    assert_eq!(
        &DhchapSecret::from_key(&(0..32).collect::<Vec<u8>>(), None).to_text()[..],
        S32_00
    );
}

#[test]
fn dhhc1_parser_refuses_bad_input() {
    assert_eq!(
        DhchapSecret::parse("DHHC-2:00:AAAA:").err(),
        Some(SecretError::Prefix)
    );
    assert_eq!(DhchapSecret::parse("").err(), Some(SecretError::Prefix));
    assert_eq!(
        DhchapSecret::parse(&S32_00.replace(":00:", ":04:")).err(),
        Some(SecretError::Hash("04".into()))
    );
    assert_eq!(
        DhchapSecret::parse(&S32_00.replace(":00:", ":1:")).err(),
        Some(SecretError::Hash("1".into()))
    );
    assert_eq!(
        DhchapSecret::parse("DHHC-1:00:not*base64!:").err(),
        Some(SecretError::Base64)
    );
    // 24 bytes decoded: not 36, 52 or 68.
    assert_eq!(
        DhchapSecret::parse("DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYX:").err(),
        Some(SecretError::Length(24))
    );
    // One key bit flipped: the CRC no longer matches.
    assert_eq!(
        DhchapSecret::parse(&S32_00.replace("AAEC", "AQEC")).err(),
        Some(SecretError::Crc)
    );
}

#[test]
fn secrets_never_print() {
    let s = DhchapSecret::parse(S32_01).unwrap();
    let shown = format!("{s:?}");
    assert!(
        !shown.contains("AAEC") && shown.contains("redacted"),
        "{shown}"
    );
}

#[test]
fn options_with_secrets_never_print_them() {
    let o = crate::transport::tcp::ctrl::TcpOptions {
        auth: super::AuthConfig {
            secret: Some(DhchapSecret::parse(S32_01).unwrap()),
            ctrl_secret: Some(DhchapSecret::parse(S48_02).unwrap()),
            ..Default::default()
        },
        ..Default::default()
    };
    let shown = format!("{o:?}");
    assert!(
        !shown.contains("AAEC") && !shown.contains("ZGVm"),
        "{shown}"
    );
    assert_eq!(shown.matches("redacted").count(), 2, "{shown}");
}

#[test]
fn responses_match_the_spec_definition() {
    let host = DhchapSecret::parse(S32_01).unwrap().transformed(HOSTNQN);
    let r1 = ResponseInput {
        hash: HashFn::Sha256,
        key: &host,
        challenge: &[0xa5; 32],
        seqnum: 0x0102_0304,
        t_id: 7,
        role: Role::Host,
        hostnqn: HOSTNQN,
        subnqn: SUBNQN,
    }
    .response();
    assert_eq!(
        &r1[..],
        &unhex("be90164b0498c2fc989e9b2c9255193d6d17c7c0d64c2a242ba47e93229b35d7")[..]
    );
    let ctrl = DhchapSecret::parse(S48_02).unwrap().transformed(SUBNQN);
    let c2: Vec<u8> = (0..48).collect();
    let r2 = ResponseInput {
        hash: HashFn::Sha384,
        key: &ctrl,
        challenge: &c2,
        seqnum: 99,
        t_id: 7,
        role: Role::Controller,
        hostnqn: HOSTNQN,
        subnqn: SUBNQN,
    }
    .response();
    assert_eq!(
        &r2[..],
        &unhex("80766714b87f0cd4fc2b976e0d97363e8275bca48bbb8a6574cbecf9196104d26139bbbbbbbb4c4db70b70f550490644")[..]
    );
}

#[test]
fn ffdhe2048_exchange_and_augmented_challenge_match() {
    let a = DhKey::from_private(DhGroup::Ffdhe2048, &[0x11; 64]).unwrap();
    let b = DhKey::from_private(DhGroup::Ffdhe2048, &[0x22; 64]).unwrap();
    assert_eq!(a.public().len(), 256);
    assert_eq!(
        &a.public()[..16],
        &unhex("699b90a819eaf85b06b321894e520dae")[..]
    );
    let ks = a.shared(b.public()).unwrap();
    assert_eq!(&ks[..], &b.shared(a.public()).unwrap()[..]);
    assert_eq!(
        &HashFn::Sha256.hash(&ks)[..],
        &unhex("cd1e876da2686813dd5ed662229427fcc05862469b0c73532f79872ba486bd74")[..]
    );
    assert_eq!(
        &augmented(HashFn::Sha256, Some(&ks), &[0xa5; 32])[..],
        &unhex("951745ce162b68eeaaa377bd42550344b5c211ba9ff67a29dbaaed3396469762")[..]
    );
    // Peer values outside 2..=p-2 or of the wrong length are refused.
    assert!(a.shared(&[0; 256]).is_err());
    let mut one = [0u8; 256];
    one[255] = 1;
    assert!(a.shared(&one).is_err());
    assert!(a.shared(&[0xff; 256]).is_err());
    assert!(a.shared(&b.public()[1..]).is_err());
}

#[test]
fn ffdhe_primes_have_the_rfc7919_shape() {
    for g in &DhGroup::ALL[1..] {
        let p = g.prime().unwrap();
        let b = p.to_bytes_be();
        assert_eq!(b.len(), g.value_len(), "{g:?}");
        assert_eq!(&b[..8], &[0xff; 8], "{g:?}");
        assert_eq!(&b[b.len() - 8..], &[0xff; 8], "{g:?}");
        // Every group shares the first digits of e after the leading ones.
        assert_eq!(&b[8..12], &[0xad, 0xf8, 0x54, 0x58], "{g:?}");
    }
    assert!(DhGroup::Null.prime().is_none());
}

#[test]
fn negotiate_and_reply_layouts() {
    let m = messages::negotiate(0x1234, &HashFn::ALL, &DhGroup::ALL);
    assert_eq!(m.len(), 72);
    assert_eq!(&m[..8], &[0, 0, 0, 0, 0x34, 0x12, 0, 1]);
    assert_eq!(&m[8..15], &[1, 0, 3, 6, 1, 2, 3]);
    assert_eq!(&m[8 + 34..8 + 40], &[0, 1, 2, 3, 4, 5]);
    let r = messages::reply(&messages::Reply {
        t_id: 2,
        response: &[7; 32],
        challenge: Some(&[8; 32]),
        seqnum: 5,
        dh_value: &[9; 3],
    });
    assert_eq!(&r[..16], &[1, 2, 0, 0, 2, 0, 32, 0, 1, 0, 3, 0, 5, 0, 0, 0]);
    assert_eq!((r[16], r[48], r[80], r.len()), (7, 8, 9, 83));
    assert_eq!(&messages::success2(3)[..6], &[1, 4, 0, 0, 3, 0]);
    assert_eq!(messages::failure2(3, 4), vec![0, 0xf0, 0, 0, 3, 0, 1, 4]);
}

#[test]
fn controller_messages_parse_within_their_bytes() {
    let mut c = vec![1, 1, 0, 0, 9, 0, 32, 0, 1, 0, 0, 0, 4, 0, 0, 0];
    c.extend_from_slice(&[0xa5; 32]);
    c.extend_from_slice(&[0; 100]); // padding
    match messages::parse(&c).unwrap() {
        Incoming::Challenge(ch) => {
            assert_eq!((ch.t_id, ch.hash_id, ch.dh_group, ch.seqnum), (9, 1, 0, 4));
            assert_eq!(ch.challenge, &[0xa5; 32]);
            assert!(ch.dh_value.is_empty());
        }
        other => panic!("{other:?}"),
    }
    // DHVLEN past the end.
    c[10] = 0xff;
    c[11] = 0xff;
    assert_eq!(
        messages::parse(&c).err(),
        Some(MessageError::Short {
            need: 16 + 32 + 0xffff,
            have: c.len()
        })
    );
    assert_eq!(
        messages::parse(&[0, 0xf1, 0, 0, 9, 0, 1, 6]).unwrap(),
        Incoming::Failure1 {
            t_id: 9,
            code: 1,
            explanation: 6
        }
    );
    assert!(matches!(
        messages::parse(&[1, 9, 0, 0, 0, 0, 0, 0]),
        Err(MessageError::Unexpected { auth_id: 9, .. })
    ));
    assert!(matches!(
        messages::parse(&[1, 3]),
        Err(MessageError::Short { need: 8, have: 2 })
    ));
}

#[test]
fn auth_commands_carry_secp_and_lengths() {
    use zerocopy::IntoBytes;
    let s = super::auth_command(false, 72);
    let b = s.as_bytes();
    assert_eq!((b[0], b[4]), (0x7f, 0x05));
    assert_eq!(&b[40..48], &[0, 1, 1, 0xe9, 72, 0, 0, 0]);
    let s = super::auth_command(true, 4096);
    assert_eq!(s.as_bytes()[4], 0x06);
    assert_eq!(&s.as_bytes()[44..48], &4096u32.to_le_bytes());
}

#[test]
fn secrets_come_from_files() {
    let dir = std::env::temp_dir().join(format!("ubd-dhchap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("host.key");
    std::fs::write(&good, format!("{S32_01}\n")).unwrap();
    let bad = dir.join("bad.key");
    std::fs::write(&bad, "DHHC-1:00:AAAA:\n").unwrap();
    let c = super::AuthConfig::from_sources(Some(&good), Some(&good)).unwrap();
    assert_eq!(c.secret.unwrap().len(), 32);
    assert!(c.ctrl_secret.is_some());
    assert!(matches!(
        super::AuthConfig::from_sources(Some(&bad), None),
        Err(SecretError::Length(3))
    ));
    let e = super::AuthConfig::from_sources(Some(&dir.join("absent")), None).unwrap_err();
    assert!(e.to_string().contains("absent"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Linux's own vectors (drivers/nvme/common/tests/auth_kunit.c): the generated PSK
/// HMAC(KS, C1 || C2) with KS[i] = 'A' + i, C1[i] = i, C2[i] = 0xff - i, hash-length long, for
/// each hash function: the HMAC the responses use, checked against the kernel's.
#[test]
fn hmac_matches_linux_kunit_vectors() {
    let cases = [
        (
            HashFn::Sha256,
            "1733c59fa7f48fcf37f5f26fc4ff0268ad4f78e030f4f3b0bfd1d47e7bb1447a",
        ),
        (
            HashFn::Sha384,
            "f14b2dd3234c459694d3bc63f8968bd6b37c2c6de849e22e118749001ce4bbe8640b9e3a748cb11ce4b1d71d359cce39",
        ),
        (
            HashFn::Sha512,
            "9c9f089a618b47d2d75f4b6c28070424487b445dd96e70c4c09b55e8b6000152a3363c3454043f38f0b85036ded40655350aa87b8b6a282b5c1acae16233dd5b",
        ),
    ];
    for (h, want) in cases {
        let n = h.digest_len();
        let ks: Vec<u8> = (0..n).map(|i| b'A' + i as u8).collect();
        let c1: Vec<u8> = (0..n).map(|i| i as u8).collect();
        let c2: Vec<u8> = (0..n).map(|i| 0xff - i as u8).collect();
        assert_eq!(&h.hmac(&ks, &[&c1, &c2])[..], &unhex(want)[..], "{h:?}");
    }
}
