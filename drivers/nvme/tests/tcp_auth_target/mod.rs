//! A fake NVMe/TCP target on loopback that authenticates hosts with DH-HMAC-CHAP (the
//! controller's side in [`dhchap`]) and serves one namespace from memory: enough for a
//! [`TcpController`] to connect, authenticate its admin and I/O queues and write and read
//! back. It records every command it ran so a test can check that nothing but the
//! authentication ran before the host was authenticated.

#![allow(dead_code)]

pub mod dhchap;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ubdirect_nvme::transport::tcp::addr::TcpTarget;
use ubdirect_nvme::transport::tcp::ctrl::{TcpController, TcpOptions};
use ubdirect_nvme::transport::tcp::host::HostIdentity;
use ubdirect_nvme::transport::tcp::TcpError;

pub use dhchap::TargetAuth;

/// CAP: MQES 127, TO 1 (500 ms), CSS bit 0 (NVM).
const CAP: u64 = 127 | (1 << 24) | (1 << 37);
/// Bytes per logical block.
pub const LBA: usize = 512;
/// Blocks of the namespace.
pub const BLOCKS: u64 = 64;
/// Host NQN of the tests.
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000a0a0";
/// Subsystem NQN of the target.
pub const SUBNQN: &str = "nqn.2026-11.io.ubdirect:auth";
/// Status Authentication Required (SCT 1, SC 91h) in the CQE status field (without phase).
const AUTH_REQUIRED: u16 = 1 << 8 | 0x91;

/// What the target saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// (qid, opcode, fctype) of every command, in order, across connections.
    pub commands: Vec<(u16, u8, u8)>,
    /// Commands other than Connect and authentication that arrived on a queue that had not
    /// passed authentication.
    pub unauthenticated: usize,
    /// Transactions hosts passed.
    pub authenticated: usize,
    /// Failure2 explanations hosts sent.
    pub host_failures: Vec<u8>,
}

/// A running target.
pub struct Target {
    /// Address to connect to.
    pub addr: String,
    /// What it saw.
    pub seen: Arc<Mutex<Seen>>,
    /// Set: the admin queue's next command finds the queue unauthenticated (as after the
    /// target's keys changed) and is answered Authentication Required.
    pub revoke: Arc<AtomicBool>,
}

/// Start a target that authenticates per `cfg`.
pub fn start(cfg: TargetAuth) -> Target {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let log = seen.clone();
    let revoke = Arc::new(AtomicBool::new(false));
    let rv = revoke.clone();
    let medium = Arc::new(Mutex::new(vec![0u8; LBA * BLOCKS as usize]));
    std::thread::spawn(move || {
        for t in l.incoming() {
            let Ok(t) = t else { return };
            let c = Conn {
                t,
                qid: 0,
                side: dhchap::Side::new(cfg.clone()),
                seen: log.clone(),
                medium: medium.clone(),
                revoke: rv.clone(),
            };
            std::thread::spawn(move || c.serve());
        }
    });
    Target { addr, seen, revoke }
}

/// The target's default configuration with host secret `host`.
pub fn config(host: &str) -> TargetAuth {
    use ubdirect_nvme::transport::tcp::auth::{DhGroup, DhchapSecret, HashFn};
    TargetAuth {
        host_secret: DhchapSecret::parse(host).unwrap(),
        ctrl_secret: None,
        hash: HashFn::Sha256,
        group: DhGroup::Null,
        require: true,
        silent: false,
        close_on_failure: false,
        ascr: false,
        no_io_atr: false,
        no_auth: false,
        no_incapsule: false,
        hostnqn: HOSTNQN.into(),
        subnqn: SUBNQN.into(),
    }
}

/// Connect to `t` with `opts`.
pub fn connect(t: &Target, opts: &TcpOptions) -> Result<TcpController, TcpError> {
    let target = TcpTarget {
        addr: t.addr.clone(),
        subnqn: SUBNQN.into(),
        nsid: None,
    };
    let host = HostIdentity {
        nqn: HOSTNQN.into(),
        id: [0xa0; 16],
        source: "test",
    };
    TcpController::connect(&target, &host, opts)
}

fn resp(cid: u16, result: u64, status: u16) -> Vec<u8> {
    let mut v = vec![5, 0, 24, 0, 24, 0, 0, 0];
    v.extend_from_slice(&result.to_le_bytes());
    v.extend_from_slice(&[0; 4]);
    v.extend_from_slice(&cid.to_le_bytes());
    v.extend_from_slice(&(status << 1).to_le_bytes());
    v
}

fn c2h(cid: u16, data: &[u8]) -> Vec<u8> {
    let plen = 24 + data.len() as u32;
    let mut v = vec![7, (1 << 2) | (1 << 3), 24, 24];
    v.extend_from_slice(&plen.to_le_bytes());
    v.extend_from_slice(&cid.to_le_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&(data.len() as u32).to_le_bytes());
    v.extend_from_slice(&[0; 4]);
    v.extend_from_slice(data);
    v
}

fn r2t(cid: u16, len: u32) -> Vec<u8> {
    let mut v = vec![9, 0, 24, 0, 24, 0, 0, 0];
    v.extend_from_slice(&cid.to_le_bytes());
    v.extend_from_slice(&1u16.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(&[0; 4]);
    v
}

struct Conn {
    t: TcpStream,
    qid: u16,
    side: dhchap::Side,
    seen: Arc<Mutex<Seen>>,
    medium: Arc<Mutex<Vec<u8>>>,
    revoke: Arc<AtomicBool>,
}

impl Conn {
    fn serve(mut self) {
        self.t
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut ic = [0u8; 128];
        if self.t.read_exact(&mut ic).is_err() {
            return;
        }
        let mut icresp = [0u8; 128];
        icresp[0] = 1;
        icresp[2] = 128;
        icresp[4] = 128;
        icresp[12..16].copy_from_slice(&8192u32.to_le_bytes());
        self.t.write_all(&icresp).unwrap();
        while let Some((ch, rest)) = self.read_pdu() {
            assert_eq!(ch[0], 4, "a command capsule");
            let mut sqe = [0u8; 64];
            sqe.copy_from_slice(&rest[..64]);
            let data = rest[64..].to_vec();
            let out = self.answer(&sqe, data);
            if self.t.write_all(&out).is_err() {
                return;
            }
        }
        let mut s = self.seen.lock().unwrap();
        s.host_failures.extend_from_slice(&self.side.host_failures);
    }

    fn read_pdu(&mut self) -> Option<([u8; 8], Vec<u8>)> {
        let mut ch = [0u8; 8];
        self.t.read_exact(&mut ch).ok()?;
        let plen = u32::from_le_bytes(ch[4..8].try_into().unwrap()) as usize;
        let mut rest = vec![0u8; plen - 8];
        self.t.read_exact(&mut rest).ok()?;
        Some((ch, rest))
    }

    /// The data of a write sent without in-capsule data: R2T, then H2CData PDUs.
    fn pull(&mut self, cid: u16, len: usize) -> Vec<u8> {
        self.t.write_all(&r2t(cid, len as u32)).unwrap();
        let mut data = vec![0u8; len];
        let mut got = 0;
        while got < len {
            let (ch, rest) = self.read_pdu().expect("H2CData");
            assert_eq!(ch[0], 6, "H2CData");
            let off = u32::from_le_bytes(rest[4..8].try_into().unwrap()) as usize;
            let n = u32::from_le_bytes(rest[8..12].try_into().unwrap()) as usize;
            let pdo = ch[3] as usize - 8;
            data[off..off + n].copy_from_slice(&rest[pdo..pdo + n]);
            got += n;
        }
        data
    }

    fn answer(&mut self, sqe: &[u8; 64], data: Vec<u8>) -> Vec<u8> {
        let cid = u16::from_le_bytes([sqe[2], sqe[3]]);
        let dw = |i: usize| u32::from_le_bytes(sqe[4 * i..4 * i + 4].try_into().unwrap());
        let fctype = if sqe[0] == 0x7f { sqe[4] } else { 0xff };
        if self.qid == 0 && self.side.authenticated && self.revoke.swap(false, Ordering::Relaxed) {
            self.side.authenticated = false;
        }
        let was = self.side.authenticated;
        let passes = self.side.passes;
        {
            let mut s = self.seen.lock().unwrap();
            s.commands.push((self.qid, sqe[0], fctype));
            let auth = sqe[0] == 0x7f && matches!(fctype, 0x01 | 0x05 | 0x06);
            if !auth && self.side.cfg.require && !was {
                s.unauthenticated += 1;
            }
        }
        let out = match (sqe[0], fctype) {
            (0x7f, 0x01) => {
                self.qid = (dw(10) >> 16) as u16;
                let cfg = &self.side.cfg;
                let atr = if cfg.require && !(cfg.no_io_atr && self.qid > 0) {
                    1 << 17
                } else {
                    0
                };
                let ascr = if self.side.cfg.ascr { 1 << 18 } else { 0 };
                resp(cid, 1 | atr | ascr, 0)
            }
            (0x7f, 0x05 | 0x06) if self.side.cfg.no_auth => resp(cid, 0, 0x02),
            (0x7f, 0x05) => {
                let len = dw(11) as usize;
                let m = if data.is_empty() {
                    self.pull(cid, len)
                } else {
                    data
                };
                assert_eq!(sqe[43], 0xe9, "SECP");
                self.side.send(&m[..len]);
                resp(cid, 0, 0)
            }
            (0x7f, 0x06) if self.side.cfg.close_on_failure && self.side.failing() => {
                let _ = self.t.shutdown(std::net::Shutdown::Both);
                Vec::new()
            }
            (0x7f, 0x06) => {
                let mut m = self.side.receive();
                m.resize(dw(11) as usize, 0);
                c2h(cid, &m)
            }
            _ if self.side.cfg.require && !self.side.authenticated => resp(cid, 0, AUTH_REQUIRED),
            _ => self.command(sqe, cid, data),
        };
        if self.side.passes > passes {
            self.seen.lock().unwrap().authenticated += 1;
        }
        out
    }

    fn command(&mut self, sqe: &[u8; 64], cid: u16, data: Vec<u8>) -> Vec<u8> {
        let dw = |i: usize| u32::from_le_bytes(sqe[4 * i..4 * i + 4].try_into().unwrap());
        let slba = dw(10) as usize;
        let nlb = (dw(12) & 0xffff) as usize + 1;
        let range = slba * LBA..(slba + nlb) * LBA;
        match (self.qid, sqe[0]) {
            (_, 0x7f) if sqe[4] == 0x04 && dw(11) == 0 => resp(cid, CAP, 0),
            (_, 0x7f) if sqe[4] == 0x04 => resp(cid, 1, 0),
            (_, 0x7f) => resp(cid, 0, 0),
            (0, 0x18) => resp(cid, 0, 0),
            (0, 0x09) => resp(cid, 1 << 16 | 1, 0),
            (0, 0x06) => {
                let mut page = vec![0u8; 4096];
                if dw(10) & 0xff == 1 {
                    page[24..33].copy_from_slice(b"fake-auth");
                    // IOCCSZ: 8 KiB (or none) of in-capsule data after the SQE.
                    let icd = if self.side.cfg.no_incapsule { 0 } else { 8192 };
                    page[1792..1796].copy_from_slice(&((icd + 64) / 16u32).to_le_bytes());
                } else {
                    page[0..8].copy_from_slice(&BLOCKS.to_le_bytes());
                    page[8..16].copy_from_slice(&BLOCKS.to_le_bytes());
                    page[16..24].copy_from_slice(&BLOCKS.to_le_bytes());
                    page[130] = 9; // LBAF0: 512-byte blocks.
                }
                c2h(cid, &page)
            }
            (q, 0x01) if q > 0 => {
                let d = if data.is_empty() {
                    self.pull(cid, range.len())
                } else {
                    data
                };
                self.medium.lock().unwrap()[range].copy_from_slice(&d);
                resp(cid, 0, 0)
            }
            (q, 0x02) if q > 0 => c2h(cid, &self.medium.lock().unwrap()[range]),
            _ => resp(cid, 0, 1),
        }
    }
}
