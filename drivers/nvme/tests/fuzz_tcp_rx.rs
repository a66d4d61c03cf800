//! Fuzz target of the NVMe/TCP receive state machine: byte streams built from valid
//! PDUs (Response Capsules, C2HData with padding and digests, R2Ts, C2HTermReqs) with random
//! byte patches and random cuts, fed to `RxMachine` in random-sized pieces. Each runs
//! `UBD_FUZZ_CASES` cases (10,000 by default). It must never panic, never ask for data outside
//! the command's buffer, and never report an event for a command that is not in flight.

mod fuzz_support;

use fuzz_support::config;
use proptest::prelude::*;
use ubdirect_nvme::transport::tcp::digest::crc;
use ubdirect_nvme::transport::tcp::pdu::{flags, pdu_type};
use ubdirect_nvme::transport::tcp::rx::{Dir, Event, Negotiated, RxMachine, Want};

const DEPTH: u16 = 8;
const LEN: u32 = 4096;

fn dirs(i: u16) -> Dir {
    match i % 4 {
        0 => Dir::Read,
        1 => Dir::Write,
        2 => Dir::WriteInCapsule,
        _ => Dir::None,
    }
}

fn header(t: u8, fl: u8, hlen: u8, pdo: u8, plen: u32) -> Vec<u8> {
    let mut v = vec![t, fl, hlen, pdo];
    v.extend_from_slice(&plen.to_le_bytes());
    v
}

/// One valid-looking PDU for command `cid` under `neg`.
fn pdu(kind: u8, cid: u16, neg: Negotiated, off: u32, len: u32, status: u16) -> Vec<u8> {
    let hd = if neg.hdgst { 4 } else { 0 };
    let dd = if neg.ddgst { 4 } else { 0 };
    let hf = if neg.hdgst { flags::HDGSTF } else { 0 };
    let mut v;
    let mut data = Vec::new();
    match kind % 4 {
        0 => {
            v = header(pdu_type::CAPSULE_RESP, hf, 24, 0, 24 + hd);
            v.extend_from_slice(&[0; 8]);
            v.extend_from_slice(&[0, 0, 1, 0]);
            v.extend_from_slice(&cid.to_le_bytes());
            v.extend_from_slice(&(status << 1).to_le_bytes());
        }
        1 => {
            let align = (neg.cpda as u32 + 1) * 4;
            let pdo = (24 + hd).div_ceil(align) * align;
            let mut fl = hf | if neg.ddgst { flags::DDGSTF } else { 0 };
            if off + len == LEN {
                fl |= flags::LAST_PDU | if status == 0 { flags::SUCCESS } else { 0 };
            }
            v = header(pdu_type::C2H_DATA, fl, 24, pdo as u8, pdo + len + dd);
            v.extend_from_slice(&cid.to_le_bytes());
            v.extend_from_slice(&[0, 0]);
            v.extend_from_slice(&off.to_le_bytes());
            v.extend_from_slice(&len.to_le_bytes());
            v.extend_from_slice(&[0; 4]);
            data = (0..len).map(|i| i as u8).collect();
            let pad = pdo - 24 - hd;
            if neg.hdgst {
                let d = crc(&v);
                v.extend_from_slice(&d.to_le_bytes());
            }
            v.extend(std::iter::repeat_n(0, pad as usize));
            v.extend_from_slice(&data);
            if neg.ddgst {
                v.extend_from_slice(&crc(&data).to_le_bytes());
            }
            return v;
        }
        2 => {
            v = header(pdu_type::R2T, hf, 24, 0, 24 + hd);
            v.extend_from_slice(&cid.to_le_bytes());
            v.extend_from_slice(&7u16.to_le_bytes());
            v.extend_from_slice(&off.to_le_bytes());
            v.extend_from_slice(&len.to_le_bytes());
            v.extend_from_slice(&[0; 4]);
        }
        _ => {
            v = header(pdu_type::C2H_TERM_REQ, 0, 24, 0, 24 + 8);
            v.extend_from_slice(&[1, 0, 0, 0, 0, 0]);
            v.extend_from_slice(&[0; 10]);
            v.extend_from_slice(&[0; 8]);
            return v;
        }
    }
    if neg.hdgst {
        let d = crc(&v);
        v.extend_from_slice(&d.to_le_bytes());
    }
    v.extend_from_slice(&data);
    v
}

fn stream() -> impl Strategy<Value = (Negotiated, Vec<u8>, Vec<usize>)> {
    let neg = (any::<bool>(), any::<bool>(), 0u8..4).prop_map(|(h, d, c)| Negotiated {
        hdgst: h,
        ddgst: d,
        cpda: c,
        maxh2cdata: 4096,
    });
    let item = (0u8..4, 0u16..DEPTH + 2, 0u32..2, 1u32..=LEN, 0u16..3);
    let patch = (any::<prop::sample::Index>(), any::<u8>());
    (
        neg,
        prop::collection::vec(item, 1..12),
        prop::collection::vec(patch, 0..6),
        prop::collection::vec(1usize..700, 1..40),
    )
        .prop_map(|(neg, items, patches, cuts)| {
            let mut bytes = Vec::new();
            for (kind, cid, half, len, status) in items {
                let off = if half == 1 { LEN - len } else { 0 };
                bytes.extend(pdu(kind, cid, neg, off, len, status));
            }
            for (i, v) in patches {
                if !bytes.is_empty() {
                    let at = i.index(bytes.len());
                    bytes[at] = v;
                }
            }
            (neg, bytes, cuts)
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fuzz_tcp_rx((neg, bytes, cuts) in stream()) {
        fuzz_support::tick("fuzz_tcp_rx");
        let mut m = RxMachine::new(neg, DEPTH);
        let mut bufs = vec![vec![0u8; LEN as usize]; DEPTH as usize];
        for cid in 0..DEPTH {
            prop_assert!(m.begin(cid, dirs(cid), LEN));
        }
        let mut pos = 0;
        let mut cut = 0;
        while pos < bytes.len() {
            let chunk = cuts[cut % cuts.len()].min(bytes.len() - pos);
            cut += 1;
            let step = match m.want() {
                Want::Internal(b) => {
                    prop_assert!(!b.is_empty() && b.len() <= 160);
                    let n = chunk.min(b.len());
                    b[..n].copy_from_slice(&bytes[pos..pos + n]);
                    pos += n;
                    m.advance_internal(n)
                }
                Want::Data { cid, off, len } => {
                    prop_assert!(cid < DEPTH && dirs(cid) == Dir::Read);
                    prop_assert!(len > 0 && off as u64 + len as u64 <= LEN as u64);
                    let n = chunk.min(len as usize);
                    let dst = &mut bufs[cid as usize][off as usize..off as usize + n];
                    dst.copy_from_slice(&bytes[pos..pos + n]);
                    pos += n;
                    m.advance_data(&bufs[cid as usize][off as usize..off as usize + n])
                }
            };
            match step {
                Ok(Event::Response { cid, .. }) | Ok(Event::DataSuccess { cid }) => {
                    prop_assert!(cid < DEPTH && !m.is_active(cid));
                    prop_assert!(m.begin(cid, dirs(cid), LEN));
                }
                Ok(Event::R2t { cid, off, len, .. }) => {
                    prop_assert!(dirs(cid) == Dir::Write);
                    prop_assert!(len > 0 && off as u64 + len as u64 <= LEN as u64);
                    m.r2t_answered(cid);
                }
                Ok(Event::None) => {}
                Err(_) => break,
            }
        }
    }
}
