//! Unit tests of the receive state machine against hand-built byte images.

use super::digest::crc;
use super::error::TcpError;
use super::rx::{Dir, Event, Negotiated, RxMachine, Want};

const NEG: Negotiated = Negotiated {
    hdgst: false,
    ddgst: false,
    cpda: 0,
    maxh2cdata: 4096,
};

/// Feed `bytes` one at a time (the worst split), data into `buf`; collect events.
fn feed(m: &mut RxMachine, bytes: &[u8], buf: &mut [u8]) -> Result<Vec<Event>, TcpError> {
    let mut evs = Vec::new();
    for &b in bytes {
        let ev = match m.want() {
            Want::Internal(dst) => {
                dst[0] = b;
                m.advance_internal(1)?
            }
            Want::Data { off, .. } => {
                buf[off as usize] = b;
                m.advance_data(&buf[off as usize..off as usize + 1])?
            }
        };
        if ev != Event::None {
            evs.push(ev);
        }
    }
    Ok(evs)
}

fn c2h(cid: u16, fl: u8, pdo: u8, off: u32, data: &[u8], hd: bool, dd: bool) -> Vec<u8> {
    let plen = pdo as u32 + data.len() as u32 + if dd { 4 } else { 0 };
    let mut v = vec![7, fl, 24, pdo];
    v.extend_from_slice(&plen.to_le_bytes());
    v.extend_from_slice(&cid.to_le_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(&off.to_le_bytes());
    v.extend_from_slice(&(data.len() as u32).to_le_bytes());
    v.extend_from_slice(&[0; 4]);
    if hd {
        let d = crc(&v);
        v.extend_from_slice(&d.to_le_bytes());
    }
    v.resize(pdo as usize, 0);
    v.extend_from_slice(data);
    if dd {
        v.extend_from_slice(&crc(data).to_le_bytes());
    }
    v
}

fn resp(cid: u16, status: u16) -> Vec<u8> {
    let mut v = vec![5, 0, 24, 0, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    v.extend_from_slice(&cid.to_le_bytes());
    v.extend_from_slice(&(status << 1).to_le_bytes());
    v
}

#[test]
fn read_in_two_c2h_then_response_lands_in_buffer() {
    let mut m = RxMachine::new(NEG, 4);
    assert!(m.begin(2, Dir::Read, 8));
    let mut buf = [0u8; 8];
    let mut s = c2h(2, 0, 24, 0, &[1, 2, 3, 4], false, false);
    s.extend(c2h(2, 4, 24, 4, &[5, 6, 7, 8], false, false));
    s.extend(resp(2, 0));
    let evs = feed(&mut m, &s, &mut buf).unwrap();
    assert_eq!(buf, [1, 2, 3, 4, 5, 6, 7, 8]);
    assert!(matches!(evs[..], [Event::Response { cid: 2, .. }]));
    assert!(!m.is_active(2));
}

#[test]
fn success_flag_completes_without_response_with_digests_and_padding() {
    let neg = Negotiated {
        hdgst: true,
        ddgst: true,
        cpda: 7, // 32-byte alignment: 4 bytes of padding after the 28-byte header
        maxh2cdata: 4096,
    };
    let mut m = RxMachine::new(neg, 4);
    assert!(m.begin(1, Dir::Read, 4));
    let mut buf = [0u8; 4];
    let s = c2h(1, 0x0f, 32, 0, &[9, 8, 7, 6], true, true);
    let evs = feed(&mut m, &s, &mut buf).unwrap();
    assert_eq!(evs, vec![Event::DataSuccess { cid: 1 }]);
    assert_eq!(buf, [9, 8, 7, 6]);
}

#[test]
fn data_digest_mismatch_is_an_error() {
    let neg = Negotiated { ddgst: true, ..NEG };
    let mut m = RxMachine::new(neg, 4);
    assert!(m.begin(0, Dir::Read, 4));
    let mut s = c2h(0, 0x06, 24, 0, &[1, 2, 3, 4], false, true);
    let n = s.len();
    s[n - 1] ^= 1;
    let e = feed(&mut m, &s, &mut [0; 4]).unwrap_err();
    assert!(matches!(e, TcpError::DataDigest { cid: 0, .. }), "{e}");
}

#[test]
fn header_digest_mismatch_is_an_error() {
    let neg = Negotiated { hdgst: true, ..NEG };
    let mut m = RxMachine::new(neg, 4);
    assert!(m.begin(0, Dir::None, 0));
    let mut s = vec![5, 1, 24, 0, 28, 0, 0, 0];
    s.extend_from_slice(&[0; 16]);
    s.extend_from_slice(&0xdead_beefu32.to_le_bytes());
    let e = feed(&mut m, &s, &mut []).unwrap_err();
    assert!(
        matches!(
            e,
            TcpError::HeaderDigest {
                pdu: "CapsuleResp",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn bad_fields_are_refused_by_name() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (resp(3, 0), "CCCID"),                                     // not in flight
        (c2h(0, 0, 24, 0, &[0; 16], false, false), "DATAO/DATAL"), // past the 8-byte buffer
        (c2h(0, 0, 24, 4, &[0; 4], false, false), "DATAO/DATAL"),  // out of order
        (c2h(0, 0, 20, 0, &[0; 4], false, false), "PDO"),          // inside the header
        (c2h(0, 0x08, 24, 0, &[0; 8], false, false), "FLAGS"),     // SUCCESS w/o LAST
        (c2h(1, 0, 24, 0, &[0; 4], false, false), "CCCID"),        // a write
        (vec![0x42, 0, 24, 0, 24, 0, 0, 0], "PDU-TYPE"),
        (vec![4, 0, 72, 0, 72, 0, 0, 0], "PDU-TYPE"),
        (vec![5, 0, 25, 0, 24, 0, 0, 0], "HLEN"),
        (vec![3, 0, 24, 0, 0, 1, 0, 0], "PLEN"),
    ];
    for (s, field) in cases {
        let mut m = RxMachine::new(NEG, 2);
        assert!(m.begin(0, Dir::Read, 8));
        assert!(m.begin(1, Dir::Write, 8));
        match feed(&mut m, &s, &mut [0; 8]) {
            Err(TcpError::Protocol { field: f, .. }) => assert_eq!(f, field, "{s:?}"),
            other => panic!("{s:?}: {other:?}"),
        }
    }
}

#[test]
fn r2t_rules() {
    let r2t = |cid: u16, off: u32, len: u32| {
        let mut v = vec![9, 0, 24, 0, 24, 0, 0, 0];
        v.extend_from_slice(&cid.to_le_bytes());
        v.extend_from_slice(&5u16.to_le_bytes());
        v.extend_from_slice(&off.to_le_bytes());
        v.extend_from_slice(&len.to_le_bytes());
        v.extend_from_slice(&[0; 4]);
        v
    };
    let mut m = RxMachine::new(NEG, 2);
    assert!(m.begin(1, Dir::Write, 8192));
    let evs = feed(&mut m, &r2t(1, 0, 4096), &mut []).unwrap();
    assert_eq!(
        evs,
        vec![Event::R2t {
            cid: 1,
            ttag: 5,
            off: 0,
            len: 4096
        }]
    );
    // A second R2T while the first is open: refused.
    assert!(feed(&mut m, &r2t(1, 4096, 4096), &mut []).is_err());
    let mut m = RxMachine::new(NEG, 2);
    assert!(m.begin(1, Dir::Write, 8192));
    feed(&mut m, &r2t(1, 0, 4096), &mut []).unwrap();
    m.r2t_answered(1);
    // Success before all the data was asked for: refused.
    assert!(feed(&mut m, &resp(1, 0), &mut []).is_err());
    let mut m = RxMachine::new(NEG, 2);
    assert!(m.begin(1, Dir::Write, 8192));
    assert!(feed(&mut m, &r2t(1, 4096, 8192), &mut []).is_err());
    let mut m = RxMachine::new(NEG, 2);
    assert!(m.begin(0, Dir::WriteInCapsule, 512));
    assert!(feed(&mut m, &r2t(0, 0, 512), &mut []).is_err());
    // The target may fail a command without moving its data.
    let mut m = RxMachine::new(NEG, 2);
    assert!(m.begin(0, Dir::Read, 512));
    let evs = feed(&mut m, &resp(0, 0x281), &mut []).unwrap();
    assert!(matches!(evs[..], [Event::Response { cid: 0, cqe }] if cqe.status >> 1 == 0x281));
}

#[test]
fn term_req_reports_fes() {
    let mut m = RxMachine::new(NEG, 2);
    let mut s = vec![3, 0, 24, 0, 32, 0, 0, 0, 3, 0, 9, 0, 0, 0];
    s.resize(32, 0);
    let e = feed(&mut m, &s, &mut []).unwrap_err();
    assert!(matches!(e, TcpError::Terminated { fes: 3, fei: 9 }), "{e}");
}
