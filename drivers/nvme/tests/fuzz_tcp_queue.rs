//! Fuzz target of the NVMe/TCP queue ([`TcpQueue`]) against a scripted target over loopback:
//! random commands (reads, R2T writes, in-capsule writes, no-data commands), the target
//! answering them by a model (R2Ts in pieces, C2HData in pieces with or without SUCCESS,
//! success or error responses, an R2T with an error response right behind it), mixed with
//! random well-formed PDUs for any command ID and random byte patches. Each runs
//! `UBD_FUZZ_CASES` cases (10,000 by default).
//!
//! Oracles, every case: no panic; every buffer the queue took comes back exactly once; no
//! byte outside a command's data range changes (guards around it); a write's buffer is never
//! written; every PDU the host sends is a Command Capsule or an H2CData, with correct digests,
//! and an H2CData carries bytes of the write that last took its command ID (the latest
//! capsule with that ID is a write answered by R2T, the range inside its data and within
//! MAXH2CDATA, the bytes that write's own). When the target kept to the protocol (no random
//! PDU, no patch): the connection never fails, each command ends as the target said, and
//! every read that succeeded holds the target's bytes. Minimum reach is asserted at the end.

mod fuzz_support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fuzz_support::config;
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use ubdirect_nvme::transport::tcp::digest::crc;
use ubdirect_nvme::transport::tcp::fabrics;
use ubdirect_nvme::transport::tcp::pdu::{flags, pdu_type};
use ubdirect_nvme::transport::tcp::queue::{TcpCommand, TcpCompletion, TcpQueue};
use ubdirect_nvme::transport::tcp::rx::Negotiated;
use ubdirect_nvme::transport::tcp::TcpError;

/// More than the 16 PDUs of one send batch, so a full socket leaves sends queued behind it.
const DEPTH: u16 = 24;
/// Bytes around each command's data range that must never change.
const GUARD: usize = 32;
const GUARD_BYTE: u8 = 0xee;
const MAXH2C: u32 = 4096;

/// Byte `i` of the data of the command tagged `tag` (reads: the target's bytes use `tag | 1<<20`).
fn pat(tag: u64, i: usize) -> u8 {
    (tag as u8).wrapping_mul(37) ^ (i as u8).wrapping_mul(7) ^ (i >> 8) as u8 ^ (tag >> 20) as u8
}

const READ_DATA: u64 = 1 << 20;

/// What the fuzzer does next.
#[derive(Debug, Clone)]
enum Op {
    /// The host submits a read (0), a write (1) or a command without data (2) of `blocks`
    /// 512-byte blocks.
    Submit { kind: u8, blocks: u8 },
    /// The target advances one command it holds (by its model): `size` bytes of R2T or
    /// C2HData, or the response; `fail` fails it instead (`bundle`: an R2T, then the error
    /// response right behind it).
    Step {
        pick: u8,
        size: u16,
        fail: bool,
        bundle: bool,
        success_flag: bool,
    },
    /// A well-formed PDU with random fields.
    Raw {
        kind: u8,
        cid: u16,
        off: u32,
        len: u32,
        fl: u8,
        status: u16,
    },
    /// Patch byte `at` (modulo its length) of the next PDU the target sends.
    Patch { at: u16, v: u8 },
    /// The host submits `n` commands without data at once.
    Burst { n: u8 },
    /// The target stops reading for the next `ops` operations (with small socket buffers the
    /// host's sends back up behind it).
    Pause { ops: u8 },
    /// Nothing: the host polls.
    Idle,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3, 1u8..=24).prop_map(|(kind, blocks)| Op::Submit { kind, blocks }),
        8 => (any::<u8>(), 1u16..9000, prop::bool::weighted(0.15), any::<bool>(), any::<bool>())
            .prop_map(|(pick, size, fail, bundle, success_flag)| Op::Step {
                pick,
                size,
                fail,
                bundle,
                success_flag
            }),
        1 => (0u8..4, 0u16..DEPTH + 2, 0u32..16384, 0u32..16384, any::<u8>(), 0u16..3)
            .prop_map(|(kind, cid, off, len, fl, status)| Op::Raw {
                kind,
                cid,
                off,
                len,
                fl,
                status
            }),
        1 => (any::<u16>(), any::<u8>()).prop_map(|(at, v)| Op::Patch { at, v }),
        1 => (1u8..20).prop_map(|n| Op::Burst { n }),
        1 => (1u8..12).prop_map(|ops| Op::Pause { ops }),
        1 => Just(Op::Idle),
    ]
}

/// One case: what was negotiated, the in-capsule limit, the operations.
#[derive(Debug, Clone)]
struct Case {
    neg: Negotiated,
    incapsule: u32,
    /// Small socket buffers on both ends.
    tight: bool,
    /// Random PDUs and patches go out (else those operations do nothing).
    hostile: bool,
    ops: Vec<Op>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<bool>(),
        any::<bool>(),
        0u8..4,
        prop_oneof![Just(0u32), Just(4096)],
        prop::bool::weighted(0.4),
        any::<bool>(),
        prop::collection::vec(op(), 1..48),
    )
        .prop_map(
            |(hdgst, ddgst, cpda, incapsule, tight, hostile, ops)| Case {
                neg: Negotiated {
                    hdgst,
                    ddgst,
                    cpda,
                    maxh2cdata: MAXH2C,
                },
                incapsule,
                tight,
                hostile,
                ops,
            },
        )
}

/// A command as the target sees it (from its capsule).
#[derive(Debug, Clone, Copy)]
struct TCmd {
    tag: u64,
    /// Some(true) write, Some(false) read, None no data.
    write: Option<bool>,
    incap: bool,
    len: u32,
    /// Write: bytes asked for by R2T; read: bytes sent.
    done: u32,
    /// Write: H2CData bytes received for it.
    got: u32,
}

/// How the target said a command ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Ok,
    Failed,
}

#[derive(Default)]
struct Tally {
    cases: AtomicU64,
    clean: AtomicU64,
    r2t_writes_ok: AtomicU64,
    reads_ok: AtomicU64,
    failed_by_target: AtomicU64,
    refused_by_host: AtomicU64,
    h2c_pdus: AtomicU64,
}

static TALLY: Tally = Tally {
    cases: AtomicU64::new(0),
    clean: AtomicU64::new(0),
    r2t_writes_ok: AtomicU64::new(0),
    reads_ok: AtomicU64::new(0),
    failed_by_target: AtomicU64::new(0),
    refused_by_host: AtomicU64::new(0),
    h2c_pdus: AtomicU64::new(0),
};

/// The scripted target.
struct Target {
    sock: TcpStream,
    neg: Negotiated,
    inbuf: Vec<u8>,
    /// The latest capsule seen under each command ID.
    latest: HashMap<u16, TCmd>,
    /// Command IDs the target holds (its model), in arrival order.
    live: Vec<u16>,
    ends: HashMap<u64, End>,
    patch: Option<(u16, u8)>,
    /// A random PDU or a patch went out: the model may be wrong from here on.
    unsure: bool,
    /// Operations left before the target reads again.
    paused: u8,
}

fn fail(msg: String) -> TestCaseError {
    TestCaseError::fail(msg)
}

impl Target {
    fn hd(&self) -> usize {
        if self.neg.hdgst {
            4
        } else {
            0
        }
    }

    /// Send one PDU (applying a pending patch).
    fn send(&mut self, mut pdu: Vec<u8>) {
        if let Some((at, v)) = self.patch.take() {
            let i = at as usize % pdu.len();
            pdu[i] = v;
            self.unsure = true;
        }
        // The host may have closed the connection already.
        let _ = self.sock.write_all(&pdu);
    }

    fn header(&self, t: u8, fl: u8, pdo: u8, plen: u32, rest: &[u8]) -> Vec<u8> {
        let hf = if self.neg.hdgst { flags::HDGSTF } else { 0 };
        let mut v = vec![t, fl | hf, 24, pdo];
        v.extend_from_slice(&plen.to_le_bytes());
        v.extend_from_slice(rest);
        if self.neg.hdgst {
            let d = crc(&v);
            v.extend_from_slice(&d.to_le_bytes());
        }
        v
    }

    fn resp(&self, cid: u16, status: u16) -> Vec<u8> {
        let mut rest = vec![0u8; 12];
        rest.extend_from_slice(&cid.to_le_bytes());
        rest.extend_from_slice(&(status << 1).to_le_bytes());
        self.header(pdu_type::CAPSULE_RESP, 0, 0, (24 + self.hd()) as u32, &rest)
    }

    fn r2t(&self, cid: u16, off: u32, len: u32) -> Vec<u8> {
        let mut rest = Vec::new();
        rest.extend_from_slice(&cid.to_le_bytes());
        rest.extend_from_slice(&7u16.to_le_bytes());
        rest.extend_from_slice(&off.to_le_bytes());
        rest.extend_from_slice(&len.to_le_bytes());
        rest.extend_from_slice(&[0; 4]);
        self.header(pdu_type::R2T, 0, 0, (24 + self.hd()) as u32, &rest)
    }

    /// A C2HData PDU of `len` bytes at `off` of the read tagged `tag`.
    fn c2h(&self, cid: u16, tag: u64, off: u32, len: u32, fl: u8) -> Vec<u8> {
        let hd = self.hd() as u32;
        let dd = if self.neg.ddgst { 4 } else { 0 };
        let align = (self.neg.cpda as u32 + 1) * 4;
        let pdo = (24 + hd).div_ceil(align) * align;
        let df = if self.neg.ddgst { flags::DDGSTF } else { 0 };
        let mut rest = Vec::new();
        rest.extend_from_slice(&cid.to_le_bytes());
        rest.extend_from_slice(&[0, 0]);
        rest.extend_from_slice(&off.to_le_bytes());
        rest.extend_from_slice(&len.to_le_bytes());
        rest.extend_from_slice(&[0; 4]);
        let mut v = self.header(
            pdu_type::C2H_DATA,
            fl | df,
            pdo as u8,
            pdo + len + dd,
            &rest,
        );
        v.resize(pdo as usize, 0);
        let data: Vec<u8> = (off..off + len)
            .map(|i| pat(tag | READ_DATA, i as usize))
            .collect();
        v.extend_from_slice(&data);
        if self.neg.ddgst {
            v.extend_from_slice(&crc(&data).to_le_bytes());
        }
        v
    }

    fn end(&mut self, cid: u16, how: End) {
        self.live.retain(|&c| c != cid);
        if let Some(c) = self.latest.get(&cid) {
            self.ends.insert(c.tag, how);
        }
    }

    /// Advance the command `pick` names (see [`Op::Step`]).
    fn step(&mut self, pick: u8, size: u16, fail: bool, bundle: bool, success_flag: bool) {
        if self.live.is_empty() {
            return;
        }
        let cid = self.live[pick as usize % self.live.len()];
        let c = self.latest[&cid];
        let size = u32::from(size);
        if fail {
            let mut pdu = Vec::new();
            if bundle && c.write == Some(true) && !c.incap && c.done == c.got && c.done < c.len {
                pdu = self.r2t(cid, c.done, size.min(c.len - c.done));
            }
            pdu.extend(self.resp(cid, 0x02));
            self.send(pdu);
            self.end(cid, End::Failed);
            return;
        }
        match c.write {
            Some(true) if !c.incap && c.done < c.len => {
                if c.got == c.done {
                    let n = size.min(c.len - c.done);
                    self.send(self.r2t(cid, c.done, n));
                    self.latest.get_mut(&cid).unwrap().done += n;
                }
            }
            Some(true) if !c.incap && c.got < c.len => {}
            Some(false) if c.done < c.len => {
                let n = size.min(c.len - c.done);
                let last = c.done + n == c.len;
                let fl = if last {
                    flags::LAST_PDU | if success_flag { flags::SUCCESS } else { 0 }
                } else {
                    0
                };
                self.send(self.c2h(cid, c.tag, c.done, n, fl));
                self.latest.get_mut(&cid).unwrap().done += n;
                if last && success_flag {
                    self.end(cid, End::Ok);
                }
            }
            _ => {
                self.send(self.resp(cid, 0));
                self.end(cid, End::Ok);
            }
        }
    }

    fn raw(&mut self, kind: u8, cid: u16, off: u32, len: u32, fl: u8, status: u16) {
        self.unsure = true;
        let pdu = match kind {
            0 => self.resp(cid, status),
            1 => {
                let tag = self.latest.get(&cid).map_or(0, |c| c.tag);
                let keep = flags::LAST_PDU | flags::SUCCESS;
                self.c2h(cid, tag, off, len.max(1), fl & keep)
            }
            2 => self.r2t(cid, off, len),
            _ => {
                let mut rest = vec![1, 0];
                rest.extend_from_slice(&[0; 14]);
                self.header(pdu_type::C2H_TERM_REQ, 0, 0, 24, &rest)
            }
        };
        self.send(pdu);
    }

    /// Read and check everything the host sent so far (unless paused).
    fn drain(&mut self) -> Result<(), TestCaseError> {
        if self.paused > 0 {
            return Ok(());
        }
        let mut b = [0u8; 65536];
        loop {
            match self.sock.read(&mut b) {
                Ok(0) => break,
                Ok(k) => self.inbuf.extend_from_slice(&b[..k]),
                Err(_) => break,
            }
        }
        while self.inbuf.len() >= 8 {
            let plen = u32::from_le_bytes(self.inbuf[4..8].try_into().unwrap()) as usize;
            if !(24..=1 << 20).contains(&plen) {
                return Err(fail(format!("host sent PLEN {plen}")));
            }
            if self.inbuf.len() < plen {
                break;
            }
            let pdu: Vec<u8> = self.inbuf.drain(..plen).collect();
            match pdu[0] {
                t if t == pdu_type::CAPSULE_CMD => self.capsule(&pdu)?,
                t if t == pdu_type::H2C_DATA => self.h2c(&pdu)?,
                t => return Err(fail(format!("host sent PDU type {t}"))),
            }
        }
        Ok(())
    }

    fn check_hdgst(&self, pdu: &[u8], hlen: usize) -> Result<(), TestCaseError> {
        let has = pdu[1] & flags::HDGSTF != 0;
        if has != self.neg.hdgst {
            return Err(fail("HDGSTF does not match the negotiation".into()));
        }
        if has {
            let got = u32::from_le_bytes(pdu[hlen..hlen + 4].try_into().unwrap());
            if got != crc(&pdu[..hlen]) {
                return Err(fail("wrong header digest".into()));
            }
        }
        Ok(())
    }

    fn capsule(&mut self, pdu: &[u8]) -> Result<(), TestCaseError> {
        self.check_hdgst(pdu, 72)?;
        let cid = u16::from_le_bytes([pdu[10], pdu[11]]);
        let len = u32::from_le_bytes(pdu[40..44].try_into().unwrap());
        let tag = u64::from(u32::from_le_bytes(pdu[48..52].try_into().unwrap()));
        let write = match pdu[8] {
            0x01 => Some(true),
            0x02 => Some(false),
            _ => None,
        };
        let data_at = 72 + self.hd();
        let incap = pdu.len() > data_at;
        if incap {
            let dd = if self.neg.ddgst { 4 } else { 0 };
            let data = &pdu[data_at..pdu.len() - dd];
            if data.len() != len as usize || write != Some(true) {
                return Err(fail(format!(
                    "capsule of {cid} carries {} bytes",
                    data.len()
                )));
            }
            if data.iter().enumerate().any(|(i, &b)| b != pat(tag, i)) {
                return Err(fail(format!("in-capsule data of tag {tag} is not its own")));
            }
        }
        if !self.unsure && self.live.contains(&cid) {
            return Err(fail(format!("command ID {cid} reused while in flight")));
        }
        self.live.retain(|&c| c != cid);
        self.live.push(cid);
        let c = TCmd {
            tag,
            write,
            incap,
            len,
            done: 0,
            got: 0,
        };
        self.latest.insert(cid, c);
        Ok(())
    }

    fn h2c(&mut self, pdu: &[u8]) -> Result<(), TestCaseError> {
        TALLY.h2c_pdus.fetch_add(1, Ordering::Relaxed);
        self.check_hdgst(pdu, 24)?;
        let cid = u16::from_le_bytes([pdu[8], pdu[9]]);
        let off = u32::from_le_bytes(pdu[12..16].try_into().unwrap());
        let len = u32::from_le_bytes(pdu[16..20].try_into().unwrap());
        let Some(c) = self.latest.get(&cid).copied() else {
            return Err(fail(format!("H2CData for command ID {cid}, never sent")));
        };
        if c.write != Some(true) || c.incap {
            return Err(fail(format!("H2CData for {cid}, which is {c:?}")));
        }
        if len == 0 || len > MAXH2C || off as u64 + len as u64 > c.len as u64 {
            return Err(fail(format!("H2CData {off}+{len} for {c:?}")));
        }
        let last = pdu[1] & flags::LAST_PDU != 0;
        if last != (off + len == c.len) {
            return Err(fail("LAST_PDU wrong".into()));
        }
        let dd = if self.neg.ddgst { 4 } else { 0 };
        let at = 24 + self.hd();
        if pdu.len() != at + len as usize + dd {
            return Err(fail("H2CData PLEN is not PDO + DATAL".into()));
        }
        let data = &pdu[at..at + len as usize];
        if data
            .iter()
            .enumerate()
            .any(|(i, &b)| b != pat(c.tag, off as usize + i))
        {
            return Err(fail(format!(
                "H2CData for {cid} carries bytes not of tag {}",
                c.tag
            )));
        }
        if dd > 0 && pdu[at + len as usize..] != crc(data).to_le_bytes() {
            return Err(fail("wrong H2CData data digest".into()));
        }
        if self.live.contains(&cid) {
            self.latest.get_mut(&cid).unwrap().got += len;
        }
        Ok(())
    }
}

/// The host's side of one case.
struct Host {
    q: TcpQueue<Vec<u8>>,
    /// Tag -> (write, data length) of every command the queue took.
    taken: HashMap<u64, (Option<bool>, usize)>,
    back: Vec<TcpCompletion<Vec<u8>>>,
    error: Option<TcpError>,
    next_tag: u64,
}

impl Host {
    fn submit(&mut self, kind: u8, blocks: u8) {
        let tag = self.next_tag;
        self.next_tag += 1;
        let len = blocks as usize * 512;
        let (sqe, write) = match kind {
            0 => (fabrics::rw(false, 1, tag, blocks.into()), Some(false)),
            1 => (fabrics::rw(true, 1, tag, blocks.into()), Some(true)),
            _ => {
                let mut s = fabrics::keep_alive();
                s.cdw10 = tag as u32;
                (s, None)
            }
        };
        let buf = write.map(|w| {
            let mut b = vec![GUARD_BYTE; len + 2 * GUARD];
            for (i, x) in b[GUARD..GUARD + len].iter_mut().enumerate() {
                *x = if w { pat(tag, i) } else { 0 };
            }
            b
        });
        let cmd = match (write, buf) {
            (Some(false), Some(b)) => TcpCommand::new(sqe, "Cmd").read(GUARD, len as u32).buf(b),
            (Some(true), Some(b)) => TcpCommand::new(sqe, "Cmd").write(GUARD, len as u32).buf(b),
            _ => TcpCommand::new(sqe, "Cmd"),
        };
        if self.q.submit(cmd.tag(tag)).is_ok() {
            self.taken.insert(tag, (write, len));
        }
    }

    fn poll(&mut self) {
        if self.error.is_some() {
            return;
        }
        let back = &mut self.back;
        if let Err(e) = self.q.poll(&mut |c| back.push(c)) {
            self.error = Some(e);
        }
    }
}

/// Check what came back against what was taken and what the target said.
fn check_back(host: &Host, t: &Target, clean: bool) -> Result<(), TestCaseError> {
    let mut seen = HashMap::new();
    for c in &host.back {
        if seen.insert(c.tag, ()).is_some() {
            return Err(fail(format!("tag {} came back twice", c.tag)));
        }
        let Some(&(write, len)) = host.taken.get(&c.tag) else {
            return Err(fail(format!("tag {} was never taken", c.tag)));
        };
        let end = t.ends.get(&c.tag).copied();
        // A command failed with its connection may have been answered after the failure.
        let lost = matches!(c.result, Err(TcpError::ConnectionLost { .. }));
        let ended = if c.result.is_ok() {
            End::Ok
        } else {
            End::Failed
        };
        if clean && !lost && end.is_some() && end != Some(ended) {
            return Err(fail(format!(
                "tag {} ended {:?}, target said {end:?}",
                c.tag, c.result
            )));
        }
        match (write, &c.buf) {
            (None, None) => continue,
            (Some(w), Some(b)) => {
                if b.len() != len + 2 * GUARD
                    || b[..GUARD]
                        .iter()
                        .chain(&b[GUARD + len..])
                        .any(|&x| x != GUARD_BYTE)
                {
                    return Err(fail(format!(
                        "tag {}: bytes outside its data changed",
                        c.tag
                    )));
                }
                let data = &b[GUARD..GUARD + len];
                let want = |i| {
                    if w {
                        pat(c.tag, i)
                    } else {
                        pat(c.tag | READ_DATA, i)
                    }
                };
                let check = w || (clean && c.result.is_ok());
                if check && data.iter().enumerate().any(|(i, &x)| x != want(i)) {
                    return Err(fail(format!("tag {}: data wrong ({write:?})", c.tag)));
                }
                if c.result.is_ok() {
                    let n = if w {
                        &TALLY.r2t_writes_ok
                    } else {
                        &TALLY.reads_ok
                    };
                    n.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => return Err(fail(format!("tag {}: buffer lost or invented", c.tag))),
        }
    }
    if seen.len() != host.taken.len() {
        return Err(fail(format!(
            "{} taken, {} back",
            host.taken.len(),
            seen.len()
        )));
    }
    Ok(())
}

fn set_buf(fd: i32, opt: i32, v: i32) {
    // SAFETY: a valid int option on an open socket.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&v as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
}

/// The host's queue and the target over a fresh loopback connection.
fn connect(case: &Case) -> (Host, Target) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    if case.tight {
        set_buf(l.as_raw_fd(), libc::SO_RCVBUF, 4096);
    }
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    if case.tight {
        set_buf(c.as_raw_fd(), libc::SO_SNDBUF, 4096);
    }
    c.set_nonblocking(true).unwrap();
    c.set_nodelay(true).unwrap();
    let (sock, _) = l.accept().unwrap();
    sock.set_nonblocking(true).unwrap();
    sock.set_nodelay(true).unwrap();
    let q = TcpQueue::new(
        c,
        case.neg,
        1,
        DEPTH,
        case.incapsule,
        Duration::from_secs(60),
    );
    let host = Host {
        q,
        taken: HashMap::new(),
        back: Vec::new(),
        error: None,
        next_tag: 1,
    };
    let t = Target {
        sock,
        neg: case.neg,
        inbuf: Vec::new(),
        latest: HashMap::new(),
        live: Vec::new(),
        ends: HashMap::new(),
        patch: None,
        unsure: false,
        paused: 0,
    };
    (host, t)
}

/// Play the case's operations, the host and the target taking turns after each.
fn play(case: &Case, host: &mut Host, t: &mut Target) -> Result<(), TestCaseError> {
    for op in &case.ops {
        match *op {
            Op::Submit { kind, blocks } => host.submit(kind, blocks),
            Op::Step {
                pick,
                size,
                fail,
                bundle,
                success_flag,
            } => t.step(pick, size, fail, bundle, success_flag),
            Op::Raw {
                kind,
                cid,
                off,
                len,
                fl,
                status,
            } if case.hostile => t.raw(kind, cid, off, len, fl, status),
            Op::Patch { at, v } if case.hostile => t.patch = Some((at, v)),
            Op::Raw { .. } | Op::Patch { .. } => {}
            Op::Burst { n } => (0..n).for_each(|_| host.submit(2, 1)),
            Op::Pause { ops } => t.paused = ops,
            Op::Idle => {}
        }
        for _ in 0..2 {
            host.poll();
            t.drain()?;
        }
        t.paused = t.paused.saturating_sub(1);
    }
    t.paused = 0;
    // A patch the ops left pending would apply to the finishing PDUs: drop it.
    t.patch = None;
    Ok(())
}

/// A target that kept to the protocol finishes what it holds; the host must not have refused
/// any of it.
fn finish_clean(host: &mut Host, t: &mut Target) -> Result<(), TestCaseError> {
    // Finish what the target holds, by the protocol.
    for i in 0..64u8 {
        if t.live.is_empty() {
            break;
        }
        t.step(i, 4096, false, false, i % 2 == 0);
        for _ in 0..2 {
            host.poll();
            t.drain()?;
        }
    }
    // The one refusal a target keeping to the model may see: it failed a write while
    // the host was part-way through sending one of its PDUs (the target cannot tell).
    let still_sending = matches!(
        host.error,
        Some(TcpError::Protocol {
            reason: "completes a command whose PDU the host is still sending",
            ..
        })
    );
    if let Some(e) = host.error.as_ref().filter(|_| !still_sending) {
        return Err(fail(format!(
            "the host refused a target that kept to the protocol: {e}"
        )));
    }
    TALLY.clean.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

fn run_case(case: Case) -> Result<(), TestCaseError> {
    fuzz_support::tick("fuzz_tcp_queue");
    TALLY.cases.fetch_add(1, Ordering::Relaxed);
    let (mut host, mut t) = connect(&case);
    play(&case, &mut host, &mut t)?;
    let clean = !t.unsure;
    if clean {
        finish_clean(&mut host, &mut t)?;
    }
    if matches!(
        host.error,
        Some(
            TcpError::Protocol { .. }
                | TcpError::HeaderDigest { .. }
                | TcpError::DataDigest { .. }
                | TcpError::Terminated { .. }
        )
    ) {
        TALLY.refused_by_host.fetch_add(1, Ordering::Relaxed);
    }
    let failed = t.ends.values().filter(|&&e| e == End::Failed).count() as u64;
    TALLY.failed_by_target.fetch_add(failed, Ordering::Relaxed);
    // The target goes away: everything still in flight comes back.
    let _ = t.sock.shutdown(std::net::Shutdown::Both);
    let deadline = Instant::now() + Duration::from_secs(5);
    while host.error.is_none() && host.q.in_flight() > 0 && Instant::now() < deadline {
        host.poll();
        let _ = host.q.wait_ready(Duration::from_millis(10));
    }
    if host.q.in_flight() > 0 {
        return Err(fail(
            "commands still in flight 5 s after the target closed".into(),
        ));
    }
    check_back(&host, &t, clean)
}

#[test]
fn fuzz_tcp_queue() {
    let mut runner = TestRunner::new(config());
    if let Err(e) = runner.run(&case(), run_case) {
        panic!("{e}");
    }
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let n = get(&TALLY.cases);
    let tally = [
        ("clean cases", get(&TALLY.clean)),
        ("R2T writes ok", get(&TALLY.r2t_writes_ok)),
        ("reads ok", get(&TALLY.reads_ok)),
        ("failed by the target", get(&TALLY.failed_by_target)),
        ("refused by the host", get(&TALLY.refused_by_host)),
        ("H2CData PDUs", get(&TALLY.h2c_pdus)),
    ];
    eprintln!("fuzz_tcp_queue: {n} cases: {tally:?}");
    // Minimum reach (the tallies grow with the cases; a small run by hand is not held to it).
    if n >= 1000 {
        for (what, v) in tally {
            assert!(v * 20 >= n, "only {v} {what} in {n} cases");
        }
    }
}
