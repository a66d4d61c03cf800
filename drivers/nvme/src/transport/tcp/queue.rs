//! [`TcpQueue`]: one NVMe/TCP connection = one queue pair (admin or I/O). Commands go out as
//! Command Capsules (writes up to the in-capsule limit carry their data); C2HData lands straight
//! in the command's buffer; R2Ts are answered with H2CData from the command's buffer (split at
//! MAXH2CDATA). Everything is driven from [`TcpQueue::poll`]: no thread per connection.
//!
//! After setup the queue allocates nothing: slots, the send ring and the receive machine are
//! sized at creation. It makes `sendmsg` / `recv` syscalls (a socket transport cannot avoid
//! them).

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use zerocopy::IntoBytes;

use super::buf::DataBuf;
use super::digest;
use super::error::TcpError;
use super::fabrics::{self, SGL_INCAPSULE, SGL_TRANSPORT};
use super::pdu::{
    flags, pdu_type, CapsuleCmd, CommonHeader, DataHeader, CMD_HLEN, DIGEST_LEN, SHORT_HLEN,
};
use super::rx::{Dir, Event, Negotiated, RxMachine, Want};
use super::sock;
use crate::spec::{Cqe, Sqe};
use crate::status::NvmeStatus;

/// A finished command: its tag, its buffer back, and how it ended.
#[derive(Debug)]
pub struct TcpCompletion<B> {
    /// The caller's tag.
    pub tag: u64,
    /// The buffer the command carried, back to the caller.
    pub buf: Option<B>,
    /// The command's data length in bytes (moved in full when `result` is Ok).
    pub len: u32,
    /// The CQE, or why the command failed.
    pub result: Result<Cqe, TcpError>,
}

struct Req<B> {
    buf: Option<B>,
    /// The data is the queue's own control buffer (Connect data), not `buf`.
    own: bool,
    off: usize,
    len: u32,
    dir: Dir,
    tag: u64,
    name: &'static str,
    sqe: Sqe,
    started: Instant,
}

#[derive(Debug, Clone, Copy)]
enum TxItem {
    Cmd {
        cid: u16,
    },
    H2c {
        cid: u16,
        ttag: u16,
        off: u32,
        len: u32,
    },
}

/// The PDU being sent: header bytes, a data range of a command's buffer, a data digest.
struct TxPdu {
    hdr: [u8; CMD_HLEN + DIGEST_LEN],
    hlen: usize,
    cid: u16,
    data_off: usize,
    data_len: usize,
    ddgst: [u8; DIGEST_LEN],
    dlen: usize,
    sent: usize,
    /// H2C: what is left of the R2T after this PDU (ttag, next offset, bytes left).
    h2c_rest: Option<(u16, u32, u32)>,
}

/// One NVMe/TCP queue pair over its own connection.
pub struct TcpQueue<B: DataBuf> {
    sock: TcpStream,
    qid: u16,
    rx: RxMachine,
    neg: Negotiated,
    reqs: Vec<Option<Req<B>>>,
    free: Vec<u16>,
    tx: VecDeque<TxItem>,
    cur: Option<TxPdu>,
    incapsule: u32,
    timeout: Duration,
    next_check: Instant,
    dead: Option<&'static str>,
    /// Control-path data sent in the capsule (the 1 KiB of Connect data).
    ctl: Vec<u8>,
}

impl<B: DataBuf> std::fmt::Debug for TcpQueue<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpQueue")
            .field("qid", &self.qid)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl<B: DataBuf> TcpQueue<B> {
    /// A queue over an initialized connection: `depth` commands in flight at most, writes up
    /// to `incapsule` bytes sent in the capsule, every command bounded by `timeout`.
    pub fn new(
        sock: TcpStream,
        neg: Negotiated,
        qid: u16,
        depth: u16,
        incapsule: u32,
        timeout: Duration,
    ) -> TcpQueue<B> {
        let depth = depth.max(1);
        TcpQueue {
            sock,
            qid,
            rx: RxMachine::new(neg, depth),
            neg,
            reqs: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            tx: VecDeque::with_capacity(2 * depth as usize),
            cur: None,
            incapsule,
            timeout,
            next_check: Instant::now(),
            dead: None,
            ctl: Vec::with_capacity(1024),
        }
    }

    /// The queue ID.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Commands in flight.
    pub fn in_flight(&self) -> usize {
        self.reqs.len() - self.free.len()
    }

    /// Free command slots.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// What was negotiated at connect.
    pub fn negotiated(&self) -> Negotiated {
        self.neg
    }

    /// Set the in-capsule data limit (from the controller's IOCCSZ).
    pub fn set_incapsule(&mut self, bytes: u32) {
        self.incapsule = bytes;
    }

    /// Whether the connection failed (every later submit is refused: connect again).
    pub fn is_dead(&self) -> bool {
        self.dead.is_some()
    }

    /// Submit `sqe` (its CID is set here). `data` is `buf[off..off+len]` moved in or out per
    /// `dir`; the buffer comes back in the completion. On refusal the buffer comes back in
    /// the error tuple and nothing was sent.
    #[allow(clippy::too_many_arguments, clippy::result_large_err)]
    pub fn submit(
        &mut self,
        sqe: Sqe,
        name: &'static str,
        write: Option<bool>,
        buf: Option<B>,
        off: usize,
        len: u32,
        tag: u64,
    ) -> Result<(), (TcpError, Option<B>)> {
        self.submit_inner(sqe, name, write, buf, off, len, tag, false)
    }

    #[allow(clippy::too_many_arguments, clippy::result_large_err)]
    fn submit_inner(
        &mut self,
        mut sqe: Sqe,
        name: &'static str,
        write: Option<bool>,
        buf: Option<B>,
        off: usize,
        len: u32,
        tag: u64,
        own: bool,
    ) -> Result<(), (TcpError, Option<B>)> {
        if let Some(during) = self.dead {
            return Err((TcpError::Closed { during }, buf));
        }
        let have = if own {
            self.ctl.len()
        } else {
            buf.as_ref().map_or(0, |b| b.data_len())
        };
        if write.is_some() && (len == 0 || off.checked_add(len as usize).is_none_or(|e| e > have)) {
            return Err((
                TcpError::Request {
                    reason: "the data range is empty or does not fit the buffer",
                },
                buf,
            ));
        }
        let Some(cid) = self.free.pop() else {
            return Err((
                TcpError::Request {
                    reason: "the queue is full: poll for completions first",
                },
                buf,
            ));
        };
        let dir = match write {
            None => Dir::None,
            Some(false) => Dir::Read,
            Some(true) if len <= self.incapsule => Dir::WriteInCapsule,
            Some(true) => Dir::Write,
        };
        sqe.set_cid(cid);
        match dir {
            Dir::None => fabrics::set_sgl(&mut sqe, SGL_TRANSPORT, 0, 0),
            Dir::WriteInCapsule => fabrics::set_sgl(&mut sqe, SGL_INCAPSULE, 0, len),
            _ => fabrics::set_sgl(&mut sqe, SGL_TRANSPORT, 0, len),
        }
        let ok = self
            .rx
            .begin(cid, dir, if dir == Dir::None { 0 } else { len });
        debug_assert!(ok);
        self.reqs[cid as usize] = Some(Req {
            buf,
            own,
            off,
            len,
            dir,
            tag,
            name,
            sqe,
            started: Instant::now(),
        });
        self.tx.push_back(TxItem::Cmd { cid });
        Ok(())
    }

    /// Send what can be sent, receive what arrived, hand each finished command to `done`.
    /// Returns how many finished. A connection failure fails every command in flight (their
    /// buffers come back through `done`) and is returned.
    pub fn poll(&mut self, done: &mut impl FnMut(TcpCompletion<B>)) -> Result<usize, TcpError> {
        if let Some(during) = self.dead {
            return Err(TcpError::Closed { during });
        }
        let mut n = 0;
        let r = self
            .flush()
            .and_then(|_| self.receive(done, &mut n))
            .and_then(|_| self.flush())
            .and_then(|_| self.check_deadlines());
        if let Err(e) = r {
            self.fail_all(&e, done);
            return Err(e);
        }
        Ok(n)
    }

    /// Submit one command and poll until it finishes or `timeout` passes (control path).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        sqe: Sqe,
        name: &'static str,
        write: Option<bool>,
        buf: Option<B>,
        len: u32,
        timeout: Duration,
    ) -> Result<(Cqe, Option<B>), TcpError> {
        const TAG: u64 = u64::MAX;
        self.submit(sqe, name, write, buf, 0, len, TAG)
            .map_err(|(e, _)| e)?;
        self.wait_tag(TAG, name, timeout)
    }

    /// Poll until the command tagged `tag` finishes or `timeout` passes; a timeout fails the
    /// connection (every command in flight comes back failed).
    pub fn wait_tag(
        &mut self,
        tag: u64,
        name: &'static str,
        timeout: Duration,
    ) -> Result<(Cqe, Option<B>), TcpError> {
        let deadline = Instant::now() + timeout;
        let mut got = None;
        loop {
            self.poll(&mut |c| {
                if c.tag == tag {
                    got = Some(c)
                }
            })?;
            if let Some(c) = got.take() {
                return c.result.map(|cqe| (cqe, c.buf));
            }
            if Instant::now() >= deadline {
                let e = TcpError::Timeout {
                    what: name,
                    waited: timeout,
                };
                self.fail_all(&e, &mut |_| {});
                return Err(e);
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// CPU address of byte `off` of command `cid`'s data.
    fn data_at(&mut self, cid: u16, off: usize) -> *mut u8 {
        let r = self.reqs[cid as usize].as_mut().expect("an active command");
        if r.own {
            // SAFETY: off is inside ctl (checked in run_with_bytes).
            return unsafe { self.ctl.as_mut_ptr().add(off) };
        }
        let b = r
            .buf
            .as_mut()
            .expect("a command with data carries a buffer");
        // SAFETY: r.off + off lies inside the buffer (checked at submit).
        unsafe { b.data_ptr().add(r.off + off) }
    }

    /// Run one command whose in-capsule data are `data` (at most 1 KiB; control path).
    pub fn run_with_bytes(
        &mut self,
        sqe: Sqe,
        name: &'static str,
        data: &[u8],
        timeout: Duration,
    ) -> Result<Cqe, TcpError> {
        if data.is_empty() || data.len() > 1024 || data.len() as u32 > self.incapsule {
            return Err(TcpError::Request {
                reason: "control data must be 1 to 1024 bytes and fit in the capsule",
            });
        }
        self.ctl.clear();
        self.ctl.extend_from_slice(data);
        self.submit_inner(
            sqe,
            name,
            Some(true),
            None,
            0,
            data.len() as u32,
            u64::MAX,
            true,
        )
        .map_err(|(e, _)| e)?;
        self.wait_tag(u64::MAX, name, timeout).map(|(c, _)| c)
    }

    fn hd(&self) -> usize {
        if self.neg.hdgst {
            DIGEST_LEN
        } else {
            0
        }
    }

    fn flush(&mut self) -> Result<(), TcpError> {
        loop {
            if self.cur.is_none() {
                let Some(item) = self.tx.pop_front() else {
                    return Ok(());
                };
                self.cur = self.build(item);
                if self.cur.is_none() {
                    continue;
                }
            }
            let (cid, doff, dlen) = {
                let p = self.cur.as_ref().unwrap();
                (p.cid, p.data_off, p.data_len)
            };
            let data: &[u8] = if dlen == 0 {
                &[]
            } else {
                let ptr = self.data_at(cid, doff);
                // SAFETY: doff..doff+dlen lies inside the command's data (checked at submit
                // and by the receive machine for R2Ts); the command owns it while in flight
                // and it is only read here.
                unsafe { std::slice::from_raw_parts(ptr, dlen) }
            };
            let p = self.cur.as_mut().unwrap();
            let total = p.hlen + p.data_len + p.dlen;
            let mut skip = p.sent;
            let mut parts: [&[u8]; 3] = [&p.hdr[..p.hlen], data, &p.ddgst[..p.dlen]];
            for part in parts.iter_mut() {
                let k = skip.min(part.len());
                *part = &part[k..];
                skip -= k;
            }
            let iov = [
                IoSlice::new(parts[0]),
                IoSlice::new(parts[1]),
                IoSlice::new(parts[2]),
            ];
            let n = sock::send_iov(&self.sock, &iov).map_err(|e| TcpError::io("sending", e))?;
            if n == 0 {
                return Ok(());
            }
            p.sent += n;
            if p.sent < total {
                continue;
            }
            let p = self.cur.take().unwrap();
            if let Some((ttag, off, left)) = p.h2c_rest {
                if left > 0 {
                    self.cur = self.build(TxItem::H2c {
                        cid: p.cid,
                        ttag,
                        off,
                        len: left,
                    });
                } else {
                    self.rx.r2t_answered(p.cid);
                }
            }
        }
    }

    /// The next PDU of `item`; None if its command already ended.
    fn build(&mut self, item: TxItem) -> Option<TxPdu> {
        let hd = self.hd();
        let dd = if self.neg.ddgst { DIGEST_LEN } else { 0 };
        let hf = if self.neg.hdgst { flags::HDGSTF } else { 0 };
        let mut p = TxPdu {
            hdr: [0; CMD_HLEN + DIGEST_LEN],
            hlen: 0,
            cid: 0,
            data_off: 0,
            data_len: 0,
            ddgst: [0; DIGEST_LEN],
            dlen: 0,
            sent: 0,
            h2c_rest: None,
        };
        let (cid, hlen) = match item {
            TxItem::Cmd { cid } => {
                let r = self.reqs[cid as usize].as_ref()?;
                let data = if r.dir == Dir::WriteInCapsule {
                    r.len as usize
                } else {
                    0
                };
                let pdo = if data > 0 { CMD_HLEN + hd } else { 0 };
                let c = CapsuleCmd {
                    hdr: CommonHeader {
                        pdu_type: pdu_type::CAPSULE_CMD,
                        flags: hf | if data > 0 && dd > 0 { flags::DDGSTF } else { 0 },
                        hlen: CMD_HLEN as u8,
                        pdo: pdo as u8,
                        plen: (CMD_HLEN + hd + data + if data > 0 { dd } else { 0 }) as u32,
                    },
                    sqe: r.sqe,
                };
                p.hdr[..CMD_HLEN].copy_from_slice(c.as_bytes());
                p.data_off = 0;
                p.data_len = data;
                (cid, CMD_HLEN)
            }
            TxItem::H2c {
                cid,
                ttag,
                off,
                len,
            } => {
                let r = self.reqs[cid as usize].as_ref()?;
                if !self.rx.is_active(cid) {
                    return None;
                }
                let chunk = len.min(self.neg.maxh2cdata);
                let last = off + chunk == r.len;
                let d = DataHeader {
                    hdr: CommonHeader {
                        pdu_type: pdu_type::H2C_DATA,
                        flags: hf
                            | if dd > 0 { flags::DDGSTF } else { 0 }
                            | if last { flags::LAST_PDU } else { 0 },
                        hlen: SHORT_HLEN as u8,
                        pdo: (SHORT_HLEN + hd) as u8,
                        plen: (SHORT_HLEN + hd) as u32 + chunk + dd as u32,
                    },
                    cccid: cid,
                    ttag,
                    datao: off,
                    datal: chunk,
                    rsvd: 0,
                };
                p.hdr[..SHORT_HLEN].copy_from_slice(d.as_bytes());
                p.data_off = off as usize;
                p.data_len = chunk as usize;
                p.h2c_rest = Some((ttag, off + chunk, len - chunk));
                (cid, SHORT_HLEN)
            }
        };
        p.cid = cid;
        if hd > 0 {
            let c = digest::crc(&p.hdr[..hlen]);
            p.hdr[hlen..hlen + DIGEST_LEN].copy_from_slice(&c.to_le_bytes());
        }
        p.hlen = hlen + hd;
        if dd > 0 && p.data_len > 0 {
            let ptr = self.data_at(cid, p.data_off);
            // SAFETY: the range lies inside the command's own data (checked at submit).
            let s = unsafe { std::slice::from_raw_parts(ptr, p.data_len) };
            p.ddgst = digest::crc(s).to_le_bytes();
            p.dlen = DIGEST_LEN;
        }
        Some(p)
    }

    fn receive(
        &mut self,
        done: &mut impl FnMut(TcpCompletion<B>),
        n: &mut usize,
    ) -> Result<(), TcpError> {
        // Bounded: at most this many reads per poll, so one busy connection cannot starve
        // the caller.
        for _ in 0..64 {
            let ev = match self.rx.want() {
                Want::Internal(dst) => {
                    let (p, l) = (dst.as_mut_ptr(), dst.len());
                    // SAFETY: dst is the machine's own buffer, borrowed for this call.
                    match unsafe { sock::recv_raw(&self.sock, p, l) }
                        .map_err(|e| TcpError::io("receiving", e))?
                    {
                        None => return Ok(()),
                        Some(k) => self.rx.advance_internal(k)?,
                    }
                }
                Want::Data { cid, off, len } => {
                    let r = self.reqs[cid as usize]
                        .as_mut()
                        .expect("rx names an active command");
                    let b = r.buf.as_mut().expect("a read carries a buffer");
                    // SAFETY: the machine checked off+len <= the command's length, which fits
                    // the buffer from r.off (checked at submit); the buffer is the command's.
                    let dst = unsafe { b.data_ptr().add(r.off + off as usize) };
                    // SAFETY: see above: len bytes from dst are inside the command's buffer.
                    match unsafe { sock::recv_raw(&self.sock, dst, len as usize) }
                        .map_err(|e| TcpError::io("receiving", e))?
                    {
                        None => return Ok(()),
                        Some(k) => {
                            // SAFETY: those k bytes were just written by recv.
                            let landed = unsafe { std::slice::from_raw_parts(dst, k) };
                            self.rx.advance_data(landed)?
                        }
                    }
                }
            };
            match ev {
                Event::None => {}
                Event::Response { cid, cqe } => {
                    if self.cur.as_ref().is_some_and(|p| p.cid == cid) {
                        return Err(TcpError::Protocol {
                            pdu: "CapsuleResp",
                            field: "CCCID",
                            value: cid as u64,
                            reason: "completes a command whose PDU the host is still sending",
                        });
                    }
                    self.complete(cid, Some(cqe), done);
                    *n += 1;
                }
                Event::DataSuccess { cid } => {
                    self.complete(cid, None, done);
                    *n += 1;
                }
                Event::R2t {
                    cid,
                    ttag,
                    off,
                    len,
                } => {
                    self.tx.push_back(TxItem::H2c {
                        cid,
                        ttag,
                        off,
                        len,
                    });
                }
            }
        }
        Ok(())
    }

    fn complete(&mut self, cid: u16, cqe: Option<Cqe>, done: &mut impl FnMut(TcpCompletion<B>)) {
        let Some(r) = self.reqs[cid as usize].take() else {
            return;
        };
        self.free.push(cid);
        let result = match cqe {
            None => Ok(Cqe {
                cid,
                ..Cqe::default()
            }),
            Some(c) if c.status >> 1 == 0 => Ok(c),
            Some(c) => Err(TcpError::Command {
                command: r.name,
                status: NvmeStatus::from_cqe_status(c.status),
            }),
        };
        done(TcpCompletion {
            tag: r.tag,
            buf: r.buf,
            len: r.len,
            result,
        });
    }

    fn check_deadlines(&mut self) -> Result<(), TcpError> {
        let now = Instant::now();
        if now < self.next_check {
            return Ok(());
        }
        self.next_check = now + Duration::from_millis(10);
        for r in self.reqs.iter().flatten() {
            if now.duration_since(r.started) > self.timeout {
                return Err(TcpError::Timeout {
                    what: r.name,
                    waited: self.timeout,
                });
            }
        }
        Ok(())
    }

    /// Fail every command in flight with a copy of `e`; the connection is dead.
    fn fail_all(&mut self, e: &TcpError, done: &mut impl FnMut(TcpCompletion<B>)) -> usize {
        self.dead = Some("a previous error on this connection");
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        self.rx.reset_all();
        self.tx.clear();
        self.cur = None;
        let mut n = 0;
        for cid in 0..self.reqs.len() {
            if let Some(r) = self.reqs[cid].take() {
                self.free.push(cid as u16);
                n += 1;
                done(TcpCompletion {
                    tag: r.tag,
                    buf: r.buf,
                    len: r.len,
                    result: Err(TcpError::ConnectionLost {
                        cause: e.to_string(),
                    }),
                });
            }
        }
        n
    }
}
