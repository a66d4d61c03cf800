//! [`TcpQueue`]: one NVMe/TCP connection = one queue pair (admin or I/O). Commands go out as
//! Command Capsules (writes up to the in-capsule limit carry their data); C2HData lands straight
//! in the command's buffer; R2Ts are answered with H2CData from the command's buffer (split at
//! MAXH2CDATA). Everything is driven from [`TcpQueue::poll`]: no thread per connection.
//!
//! Receiving: one `recv` into a 64 KiB receive buffer takes every PDU that arrived (headers,
//! responses and payloads under 16 KiB are parsed and copied out of it: no system call per
//! PDU); a payload of 16 KiB or more is received straight into the command's buffer.
//!
//! After setup the queue allocates nothing: slots, the send ring, the receive buffer and the
//! receive machine are sized at creation. It makes `sendmsg` / `recv` syscalls (a socket
//! transport cannot avoid them).
//!
//! Every byte sent or received is checked against the live command it belongs to: an H2CData
//! PDU only for a write the target asks data of, inside its data; a C2HData payload only into a
//! read's buffer, inside its data. Sends queued for a command go when it ends (queued sends
//! carry the command's sequence number, so none matches a later command under the same ID).
//! The fuzz target `fuzz_tcp_queue` drives the queue against a scripted, partly hostile target.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zerocopy::IntoBytes;

use super::assoc::{Association, Member};
use super::buf::DataBuf;
use super::digest;
use super::error::TcpError;
use super::fabrics::{self, SGL_INCAPSULE, SGL_TRANSPORT};
#[path = "queue_command.rs"]
mod command;
#[path = "queue_control.rs"]
mod control;

pub use command::TcpCommand;

use super::pdu::{
    flags, pdu_type, CapsuleCmd, CommonHeader, DataHeader, CMD_HLEN, DIGEST_LEN, SHORT_HLEN,
};
use super::rx::{Dir, Event, Negotiated, RxMachine, Want};
use super::send::{self, LiveCmd, TxItem, TxPdu};
use super::sock;
use crate::spec::{Cqe, Sqe};
use crate::status::NvmeStatus;
use ubdirect_core::seams::InFlight;

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
    /// The command's sequence number: queued sends carry it, so a send of an ended command
    /// never matches the command that took its ID.
    seq: u64,
}

/// PDUs gathered into one `sendmsg`.
const TX_BATCH: usize = 16;

/// The receive buffer: one `recv` takes every PDU that arrived, up to this many bytes; headers
/// and short payloads are parsed and copied out of it (no system call per PDU).
const RX_BUF: usize = 64 * 1024;

/// A payload at least this long, wanted while the receive buffer is empty, is received straight
/// into the command's buffer (no copy for large reads).
const RX_DIRECT_MIN: u32 = 16 * 1024;

/// `recv` calls at most per poll, so one busy connection cannot starve the caller.
const RX_CALLS_PER_POLL: usize = 64;

/// The tag of the queue's own Keep Alive commands (never handed to the caller).
pub const KEEP_ALIVE_TAG: u64 = u64::MAX - 1;

/// Keep Alive sent from [`TcpQueue::poll`] when due: no timer thread.
#[derive(Debug, Clone, Copy)]
struct KeepAlive {
    every: Duration,
    next: Instant,
    in_flight: bool,
    /// When the last Keep Alive was answered (or keep-alive started).
    answered: Instant,
}

/// A closed or reset connection after more than KATO without a Keep Alive is the target
/// giving up on this host: say so (the fix is to poll the admin queue).
fn keep_alive_expired(e: TcpError, idle: Option<(Duration, Duration)>) -> TcpError {
    match idle {
        Some((idle, kato))
            if idle > kato && matches!(e, TcpError::Closed { .. } | TcpError::Io { .. }) =>
        {
            TcpError::KeepAliveExpired { idle, kato }
        }
        _ => e,
    }
}

/// CPU address of bytes `off..off + len` of read `cid`'s data, where its C2HData payload
/// lands. The receive machine checked the range against the command it tracks; this checks it
/// again against the live command (a read, the range inside its data and its buffer), so a
/// payload never lands outside the buffer whatever the peer sent.
fn read_dst<B: DataBuf>(
    reqs: &mut InFlight<Req<B>>,
    cid: u16,
    off: u32,
    len: u32,
) -> Result<*mut u8, TcpError> {
    let bad = || TcpError::Protocol {
        pdu: "C2HData",
        field: "DATAO/DATAL",
        value: ((off as u64) << 32) | len as u64,
        reason: "names no read in flight, or bytes outside its data",
    };
    let r = reqs.get_mut(cid as u64).ok_or_else(bad)?;
    let end = off as u64 + len as u64;
    if r.dir != Dir::Read || end > r.len as u64 {
        return Err(bad());
    }
    let b = r.buf.as_mut().ok_or_else(bad)?;
    if r.off as u64 + end > b.data_len() as u64 {
        return Err(bad());
    }
    // SAFETY: r.off + off + len <= data_len() (checked above): inside the command's buffer.
    Ok(unsafe { b.data_ptr().add(r.off + off as usize) })
}

/// One NVMe/TCP queue pair over its own connection.
pub struct TcpQueue<B: DataBuf> {
    sock: TcpStream,
    qid: u16,
    rx: RxMachine,
    neg: Negotiated,
    /// Commands in flight, indexed by command ID (the bookkeeping the io_uring queue shares).
    reqs: InFlight<Req<B>>,
    tx: VecDeque<TxItem>,
    /// The sequence number of the next command submitted.
    next_seq: u64,
    /// PDUs being sent, in order, in one `sendmsg` (only the first may be partly sent).
    batch: Vec<TxPdu>,
    incapsule: u32,
    timeout: Duration,
    next_check: Instant,
    dead: Option<&'static str>,
    /// Control-path data sent in the capsule (the 1 KiB of Connect data).
    ctl: Vec<u8>,
    ka: Option<KeepAlive>,
    /// Bytes received, `rbuf[rpos..rlen]` not yet handed to the receive machine.
    rbuf: Box<[u8]>,
    rpos: usize,
    rlen: usize,
    /// `recv` system calls made (for tests and tuning).
    recv_calls: u64,
    /// The controller this queue belongs to (its id goes back on drop; keep-alive state).
    member: Option<Member>,
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
            reqs: InFlight::new(depth as usize),
            tx: VecDeque::with_capacity(2 * depth as usize),
            next_seq: 0,
            batch: Vec::with_capacity(TX_BATCH),
            incapsule,
            timeout,
            next_check: Instant::now(),
            dead: None,
            ctl: Vec::with_capacity(1024),
            ka: None,
            rbuf: vec![0u8; RX_BUF].into_boxed_slice(),
            rpos: 0,
            rlen: 0,
            recv_calls: 0,
            member: None,
        }
    }

    /// Make this queue one of `assoc`'s controller: its id (taken from `assoc`, or 0 for the
    /// admin queue) goes back when the queue is dropped, the admin queue's answered Keep Alives
    /// are recorded there, and a connection an I/O queue loses after the controller's KATO
    /// passed without one is reported as [`TcpError::KeepAliveExpired`].
    pub(crate) fn join(&mut self, assoc: Arc<Association>) {
        self.member = Some(Member::new(assoc, self.qid));
    }

    /// The queue ID.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Commands in flight.
    pub fn in_flight(&self) -> usize {
        self.reqs.len()
    }

    /// Free command slots.
    pub fn free_slots(&self) -> usize {
        self.reqs.free()
    }

    /// What was negotiated at connect.
    pub fn negotiated(&self) -> Negotiated {
        self.neg
    }

    /// Set the in-capsule data limit (from the controller's IOCCSZ).
    pub fn set_incapsule(&mut self, bytes: u32) {
        self.incapsule = bytes;
    }

    /// Send a Keep Alive from [`TcpQueue::poll`] every `every` (half the KATO given in the
    /// admin Connect, as Linux does), one at a time; `None` stops them. Admin queue only.
    /// Its completions are the queue's own: never handed to the caller
    /// ([`KEEP_ALIVE_TAG`] is reserved).
    pub fn set_keep_alive(&mut self, every: Option<Duration>) {
        let now = Instant::now();
        self.ka = every.map(|every| KeepAlive {
            every,
            next: now + every,
            in_flight: false,
            answered: now,
        });
    }

    /// Submit a Keep Alive if one is due, none is in flight, and a slot is free.
    fn keep_alive_due(&mut self) {
        let Some(ka) = self.ka else { return };
        if ka.in_flight || self.reqs.is_full() {
            return;
        }
        let now = Instant::now();
        if now < ka.next {
            return;
        }
        let cmd = TcpCommand::new(fabrics::keep_alive(), "Keep Alive").tag(KEEP_ALIVE_TAG);
        let sent = self.submit_inner(cmd, false).is_ok();
        self.ka = Some(KeepAlive {
            next: now + ka.every,
            in_flight: sent,
            ..ka
        });
    }

    /// `recv` system calls made so far: a poll reads every PDU that arrived with one (up to
    /// 64 KiB), and only payloads of 16 KiB and more get a `recv` of their own.
    pub fn recv_calls(&self) -> u64 {
        self.recv_calls
    }

    /// Time since the last Keep Alive was answered (or keep-alive started), and the KATO.
    fn keep_alive_idle(&self) -> Option<(Duration, Duration)> {
        let ka = self.ka?;
        Some((ka.answered.elapsed(), ka.every * 2))
    }

    /// Whether the connection failed (every later submit is refused: connect again).
    pub fn is_dead(&self) -> bool {
        self.dead.is_some()
    }

    /// Block in poll(2) until the socket has something to read (or room to send what is
    /// queued) or `timeout` passes. For callers that found nothing to do: instead of spinning,
    /// they give the CPU to the kernel's network and target work (on a 1-vCPU machine a
    /// spinning initiator starves them). Returns whether the socket is ready.
    pub fn wait_ready(&self, timeout: Duration) -> Result<bool, TcpError> {
        if self.rpos < self.rlen {
            // Received bytes wait in the receive buffer: work to do now.
            return Ok(true);
        }
        let mut events = libc::POLLIN;
        if !self.batch.is_empty() || !self.tx.is_empty() {
            events |= libc::POLLOUT;
        }
        let mut fd = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events,
            revents: 0,
        };
        let ms = timeout.as_millis().clamp(0, i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd, for the duration of the call; the fd is our open socket.
        let r = unsafe { libc::poll(&mut fd, 1, ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(TcpError::io("waiting on the socket", e));
        }
        Ok(r > 0)
    }

    /// Submit `cmd` (its SQE's CID is set here). Its data, the buffer's bytes
    /// `offset..offset + len`, move in or out as [`TcpCommand::read`] / [`TcpCommand::write`]
    /// said; the buffer comes back in the completion. On refusal the buffer comes back in the
    /// error tuple and nothing was sent.
    #[allow(clippy::result_large_err)]
    pub fn submit(&mut self, cmd: TcpCommand<B>) -> Result<(), (TcpError, Option<B>)> {
        self.submit_inner(cmd, false)
    }

    /// [`TcpQueue::submit`]; `own`: the data are the queue's control buffer, not the command's.
    #[allow(clippy::result_large_err)]
    fn submit_inner(&mut self, cmd: TcpCommand<B>, own: bool) -> Result<(), (TcpError, Option<B>)> {
        let TcpCommand {
            mut sqe,
            name,
            write,
            buf,
            offset: off,
            len,
            tag,
        } = cmd;
        if let Some(during) = self.dead {
            return Err((TcpError::Closed { during }, buf));
        }
        if let Some(reason) = buf.as_ref().and_then(|b| b.cpu_refusal()) {
            return Err((TcpError::Request { reason }, buf));
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
        if self.reqs.is_full() {
            return Err((
                TcpError::Request {
                    reason: "the queue is full: poll for completions first",
                },
                buf,
            ));
        }
        let dir = self.data_dir(&mut sqe, write, len);
        let seq = self.next_seq;
        let req = Req {
            buf,
            own,
            off,
            len,
            dir,
            tag,
            name,
            sqe,
            started: Instant::now(),
            seq,
        };
        let cid = match self.reqs.insert(req) {
            // The table has at most `depth` (a u16) entries.
            Ok(i) => i as u16,
            Err(r) => {
                return Err((
                    TcpError::Request {
                        reason: "the queue is full: poll for completions first",
                    },
                    r.buf,
                ))
            }
        };
        if let Some(r) = self.reqs.get_mut(cid as u64) {
            r.sqe.set_cid(cid);
        }
        let ok = self
            .rx
            .begin(cid, dir, if dir == Dir::None { 0 } else { len });
        debug_assert!(ok);
        self.next_seq += 1;
        self.tx.push_back(TxItem::Cmd { cid, seq });
        Ok(())
    }

    /// How command data of `len` bytes moves (`write`: None for no data), with `sqe`'s SGL
    /// set to match.
    fn data_dir(&self, sqe: &mut Sqe, write: Option<bool>, len: u32) -> Dir {
        let dir = match write {
            None => Dir::None,
            Some(false) => Dir::Read,
            Some(true) if len <= self.incapsule => Dir::WriteInCapsule,
            Some(true) => Dir::Write,
        };
        match dir {
            Dir::None => fabrics::set_sgl(sqe, SGL_TRANSPORT, 0, 0),
            Dir::WriteInCapsule => fabrics::set_sgl(sqe, SGL_INCAPSULE, 0, len),
            _ => fabrics::set_sgl(sqe, SGL_TRANSPORT, 0, len),
        }
        dir
    }

    /// Send what can be sent, receive what arrived, hand each finished command to `done`.
    /// Returns how many finished. A connection failure fails every command in flight (their
    /// buffers come back through `done`) and is returned.
    pub fn poll(&mut self, done: &mut impl FnMut(TcpCompletion<B>)) -> Result<usize, TcpError> {
        self.poll_max(usize::MAX, done)
    }

    /// [`TcpQueue::poll`], handing at most `max` finished commands to `done`: receiving stops
    /// after the `max`-th; what else arrived stays in the socket for the next poll. A
    /// connection failure still fails (and hands back) every command in flight.
    pub fn poll_max(
        &mut self,
        max: usize,
        done: &mut impl FnMut(TcpCompletion<B>),
    ) -> Result<usize, TcpError> {
        if let Some(during) = self.dead {
            return Err(TcpError::Closed { during });
        }
        let mut n = 0;
        let ka_idle = self.keep_alive_idle();
        self.keep_alive_due();
        let r = self
            .flush()
            .and_then(|_| self.receive(done, &mut n, max))
            .and_then(|_| self.flush())
            .and_then(|_| self.check_deadlines());
        if let Err(e) = r {
            // An I/O queue has no Keep Alive of its own: its controller's (admin queue's)
            // tells whether the target dropped the whole controller.
            let ka_idle =
                ka_idle.or_else(|| self.member.as_ref().and_then(|m| m.assoc.keep_alive_idle()));
            let e = keep_alive_expired(e, ka_idle);
            self.fail_all(&e, done);
            return Err(e);
        }
        Ok(n)
    }

    /// Submit `cmd` and poll until it finishes or `timeout` passes (control path): the
    /// CQE and the buffer back. The command's tag is replaced by one reserved for this wait.
    pub fn run(
        &mut self,
        cmd: TcpCommand<B>,
        timeout: Duration,
    ) -> Result<(Cqe, Option<B>), TcpError> {
        const TAG: u64 = u64::MAX;
        let name = cmd.name;
        self.submit(cmd.tag(TAG)).map_err(|(e, _)| e)?;
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

    /// CPU address of bytes `off..off + len` of the data of command `cid`, sequence number
    /// `seq`: refused unless that command is still in flight under `cid` and the range lies
    /// inside its data and its buffer.
    fn data_range(
        &mut self,
        cid: u16,
        seq: u64,
        off: usize,
        len: usize,
    ) -> Result<*const u8, TcpError> {
        const GONE: TcpError = TcpError::Internal {
            reason: "a queued send names a command no longer in flight or bytes outside its data",
        };
        let r = self.reqs.get_mut(cid as u64).ok_or(GONE)?;
        let end = off.checked_add(len).ok_or(GONE)?;
        if r.seq != seq || end > r.len as usize {
            return Err(GONE);
        }
        if r.own {
            if end > self.ctl.len() {
                return Err(GONE);
            }
            // SAFETY: off + len <= ctl.len() (checked above).
            return Ok(unsafe { self.ctl.as_ptr().add(off) });
        }
        let b = r.buf.as_mut().ok_or(GONE)?;
        if r.off.checked_add(end).is_none_or(|e| e > b.data_len()) {
            return Err(GONE);
        }
        // SAFETY: r.off + off + len <= data_len() (checked above): inside the buffer.
        Ok(unsafe { b.data_ptr().add(r.off + off).cast_const() })
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
        let cmd = TcpCommand::new(sqe, name)
            .write(0, data.len() as u32)
            .tag(u64::MAX);
        self.submit_inner(cmd, true).map_err(|(e, _)| e)?;
        self.wait_tag(u64::MAX, name, timeout).map(|(c, _)| c)
    }

    fn hd(&self) -> usize {
        if self.neg.hdgst {
            DIGEST_LEN
        } else {
            0
        }
    }

    /// Send what is queued now, as far as the socket takes it (the rest goes in the next
    /// poll). Nothing is received.
    pub fn send_queued(&mut self) -> Result<(), TcpError> {
        if let Some(during) = self.dead {
            return Err(TcpError::Closed { during });
        }
        self.flush()
    }

    /// Send what is queued: up to [`TX_BATCH`] PDUs per `sendmsg` (one system call and, with
    /// TCP_NODELAY, as few segments as the bytes need, rather than one per command).
    fn flush(&mut self) -> Result<(), TcpError> {
        loop {
            while self.batch.len() < TX_BATCH {
                let Some(item) = self.tx.pop_front() else {
                    break;
                };
                if let Some(p) = self.build(item)? {
                    self.batch.push(p);
                }
            }
            if self.batch.is_empty() {
                return Ok(());
            }
            let mut dptr = [std::ptr::null::<u8>(); TX_BATCH];
            for (i, d) in dptr.iter_mut().enumerate().take(self.batch.len()) {
                let (cid, seq, off, len) = {
                    let p = &self.batch[i];
                    (p.cid, p.seq, p.data_off, p.data_len)
                };
                if len > 0 {
                    *d = self.data_range(cid, seq, off, len)?;
                }
            }
            let mut iov = [IoSlice::new(&[]); 3 * TX_BATCH];
            let mut k = 0;
            for (i, p) in self.batch.iter().enumerate() {
                let data: &[u8] = if p.data_len == 0 {
                    &[]
                } else {
                    // SAFETY: data_off..+data_len lies inside the live command's data and
                    // buffer (data_range); the command owns it while in flight and it is only
                    // read here.
                    unsafe { std::slice::from_raw_parts(dptr[i], p.data_len) }
                };
                let mut skip = p.sent;
                for part in [&p.hdr[..p.hlen], data, &p.ddgst[..p.dlen]] {
                    let c = skip.min(part.len());
                    skip -= c;
                    if c < part.len() {
                        iov[k] = IoSlice::new(&part[c..]);
                        k += 1;
                    }
                }
            }
            let mut n =
                sock::send_iov(&self.sock, &iov[..k]).map_err(|e| TcpError::io("sending", e))?;
            if n == 0 {
                return Ok(());
            }
            let mut finished = 0;
            for p in self.batch.iter_mut() {
                let rest = p.hlen + p.data_len + p.dlen - p.sent;
                if n < rest {
                    p.sent += n;
                    break;
                }
                n -= rest;
                p.sent += rest;
                finished += 1;
            }
            for p in self.batch.drain(..finished) {
                if let Some((ttag, off, left)) = p.h2c_rest {
                    if left > 0 {
                        // The next chunk of this R2T goes out next.
                        self.tx.push_front(TxItem::H2c {
                            cid: p.cid,
                            seq: p.seq,
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
    }

    /// The next PDU of `item`; None if its command already ended (its sends are purged when
    /// it ends; the sequence number catches any left). An H2CData PDU is checked against the
    /// live command: a write whose data the target asks for, the range inside its data.
    fn build(&mut self, item: TxItem) -> Result<Option<TxPdu>, TcpError> {
        let (cid, seq) = match item {
            TxItem::Cmd { cid, seq } | TxItem::H2c { cid, seq, .. } => (cid, seq),
        };
        let Some(r) = self.reqs.get(cid as u64) else {
            return Ok(None);
        };
        if r.seq != seq || !self.rx.is_active(cid) {
            return Ok(None);
        }
        let mut p = TxPdu::new(cid, seq);
        let hlen = match item {
            TxItem::Cmd { .. } => self.capsule_header(r, &mut p),
            TxItem::H2c { ttag, off, len, .. } => self.h2c_header(&mut p, ttag, off, len)?,
        };
        let hd = self.hd();
        if hd > 0 {
            let c = digest::crc(&p.hdr[..hlen]);
            p.hdr[hlen..hlen + DIGEST_LEN].copy_from_slice(&c.to_le_bytes());
        }
        p.hlen = hlen + hd;
        if self.neg.ddgst && p.data_len > 0 {
            let ptr = self.data_range(cid, seq, p.data_off, p.data_len)?;
            // SAFETY: the range lies inside the live command's data and buffer (data_range).
            let s = unsafe { std::slice::from_raw_parts(ptr, p.data_len) };
            p.ddgst = digest::crc(s).to_le_bytes();
            p.dlen = DIGEST_LEN;
        }
        Ok(Some(p))
    }

    /// The Command Capsule header of command `r` into `p`, with its in-capsule data range;
    /// returns the header length.
    fn capsule_header(&self, r: &Req<B>, p: &mut TxPdu) -> usize {
        let hd = self.hd();
        let dd = if self.neg.ddgst { DIGEST_LEN } else { 0 };
        let hf = if self.neg.hdgst { flags::HDGSTF } else { 0 };
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
        CMD_HLEN
    }

    /// The live command at `cid`, as an R2T and its H2CData PDUs see it.
    fn live(&self, cid: u16) -> Result<LiveCmd, TcpError> {
        let r = self.reqs.get(cid as u64).ok_or(TcpError::Protocol {
            pdu: "R2T",
            field: "CCCID",
            value: cid as u64,
            reason: "names no command in flight",
        })?;
        Ok(LiveCmd {
            cid,
            seq: r.seq,
            dir: r.dir,
            len: r.len,
        })
    }

    /// The H2CData header of the next chunk of an R2T (`len` bytes left from `off`) of
    /// `p`'s command into `p`, with its data range; returns the header length. Refused unless
    /// the command is a write whose data the target asks for and the range lies inside it.
    fn h2c_header(&self, p: &mut TxPdu, ttag: u16, off: u32, len: u32) -> Result<usize, TcpError> {
        let cmd = self.live(p.cid)?;
        let chunk = send::h2c_chunk(cmd, off, len, self.neg.maxh2cdata)?;
        let hd = self.hd();
        let dd = if self.neg.ddgst { DIGEST_LEN } else { 0 };
        let hf = if self.neg.hdgst { flags::HDGSTF } else { 0 };
        // off + chunk <= off + len <= cmd.len (h2c_chunk): no overflow.
        let last = off + chunk == cmd.len;
        let d = DataHeader {
            hdr: CommonHeader {
                pdu_type: pdu_type::H2C_DATA,
                flags: hf
                    | if dd > 0 { flags::DDGSTF } else { 0 }
                    | if last { flags::LAST_PDU } else { 0 },
                hlen: SHORT_HLEN as u8,
                pdo: (SHORT_HLEN + hd) as u8,
                plen: (SHORT_HLEN + hd + dd) as u32 + chunk,
            },
            cccid: p.cid,
            ttag,
            datao: off,
            datal: chunk,
            rsvd: 0,
        };
        p.hdr[..SHORT_HLEN].copy_from_slice(d.as_bytes());
        p.data_off = off as usize;
        p.data_len = chunk as usize;
        p.h2c_rest = Some((ttag, off + chunk, len - chunk));
        Ok(SHORT_HLEN)
    }

    fn receive(
        &mut self,
        done: &mut impl FnMut(TcpCompletion<B>),
        n: &mut usize,
        max: usize,
    ) -> Result<(), TcpError> {
        let mut calls = 0;
        loop {
            if *n >= max {
                return Ok(());
            }
            if self.rpos == self.rlen {
                if calls == RX_CALLS_PER_POLL {
                    return Ok(());
                }
                calls += 1;
                if let Want::Data { cid, off, len } = self.rx.want() {
                    if len >= RX_DIRECT_MIN {
                        let Some(ev) = self.recv_direct(cid, off, len)? else {
                            return Ok(());
                        };
                        self.on_event(ev, done, n)?;
                        continue;
                    }
                }
                self.recv_calls += 1;
                // SAFETY: the receive buffer is the queue's own, borrowed for this call.
                match unsafe { sock::recv_raw(&self.sock, self.rbuf.as_mut_ptr(), RX_BUF) }
                    .map_err(|e| TcpError::io("receiving", e))?
                {
                    None => return Ok(()),
                    Some(k) => {
                        self.rpos = 0;
                        self.rlen = k;
                    }
                }
            }
            let avail = &self.rbuf[self.rpos..self.rlen];
            let ev = match self.rx.want() {
                Want::Internal(dst) => {
                    let k = dst.len().min(avail.len());
                    dst[..k].copy_from_slice(&avail[..k]);
                    self.rpos += k;
                    self.rx.advance_internal(k)?
                }
                Want::Data { cid, off, len } => {
                    let k = (len as usize).min(avail.len());
                    let dst = read_dst(&mut self.reqs, cid, off, k as u32)?;
                    // SAFETY: k bytes from dst are inside the command's buffer (read_dst);
                    // the source is the receive buffer, which does not overlap it.
                    let landed = unsafe {
                        std::ptr::copy_nonoverlapping(avail.as_ptr(), dst, k);
                        std::slice::from_raw_parts(dst, k)
                    };
                    self.rpos += k;
                    self.rx.advance_data(landed)?
                }
            };
            self.on_event(ev, done, n)?;
        }
    }

    /// `recv` a large payload straight into command `cid`'s buffer at `off` (at most `len`
    /// bytes); None when nothing arrived.
    fn recv_direct(&mut self, cid: u16, off: u32, len: u32) -> Result<Option<Event>, TcpError> {
        let dst = read_dst(&mut self.reqs, cid, off, len)?;
        self.recv_calls += 1;
        // SAFETY: len bytes from dst are inside the command's buffer (read_dst).
        match unsafe { sock::recv_raw(&self.sock, dst, len as usize) }
            .map_err(|e| TcpError::io("receiving", e))?
        {
            None => Ok(None),
            Some(k) => {
                // SAFETY: those k bytes were just written by recv.
                let landed = unsafe { std::slice::from_raw_parts(dst, k) };
                self.rx.advance_data(landed).map(Some)
            }
        }
    }

    /// Act on what the receive machine reported.
    fn on_event(
        &mut self,
        ev: Event,
        done: &mut impl FnMut(TcpCompletion<B>),
        n: &mut usize,
    ) -> Result<(), TcpError> {
        match ev {
            Event::None => {}
            Event::Response { cid, cqe } => {
                self.end_sends(cid, "CapsuleResp")?;
                if self.complete(cid, Some(cqe), done) {
                    *n += 1;
                }
            }
            Event::DataSuccess { cid } => {
                self.end_sends(cid, "C2HData")?;
                if self.complete(cid, None, done) {
                    *n += 1;
                }
            }
            Event::R2t {
                cid,
                ttag,
                off,
                len,
            } => {
                let cmd = self.live(cid)?;
                send::h2c_chunk(cmd, off, len, self.neg.maxh2cdata)?;
                self.tx.push_back(TxItem::H2c {
                    cid,
                    seq: cmd.seq,
                    ttag,
                    off,
                    len,
                });
            }
        }
        Ok(())
    }

    /// Command `cid` is ending (the target answered it, `pdu` says how): drop every send of
    /// it that has not started (queued H2CData of an R2T, PDUs in the batch not yet on the
    /// wire), so none is built from its buffer once it is back with the caller or from the
    /// command that takes its ID next. A PDU of it already partly on the wire cannot be
    /// taken back: that answer breaks the protocol and fails the connection.
    fn end_sends(&mut self, cid: u16, pdu: &'static str) -> Result<(), TcpError> {
        let Some(seq) = self.reqs.get(cid as u64).map(|r| r.seq) else {
            return Ok(());
        };
        if self.batch.iter().any(|p| p.seq == seq && p.sent > 0) {
            return Err(TcpError::Protocol {
                pdu,
                field: "CCCID",
                value: cid as u64,
                reason: "completes a command whose PDU the host is still sending",
            });
        }
        self.batch.retain(|p| p.seq != seq);
        self.tx.retain(|i| i.seq() != seq);
        Ok(())
    }

    /// Finish command `cid`; false when it was the queue's own Keep Alive (not handed on).
    fn complete(
        &mut self,
        cid: u16,
        cqe: Option<Cqe>,
        done: &mut impl FnMut(TcpCompletion<B>),
    ) -> bool {
        let Some(r) = self.reqs.take(cid as u64) else {
            return false;
        };
        if r.tag == KEEP_ALIVE_TAG {
            // A failed Keep Alive needs no action here: a controller that gave up on this
            // host closes the connection, and the next poll reports that.
            if let Some(ka) = self.ka.as_mut() {
                ka.in_flight = false;
                ka.answered = Instant::now();
            }
            if let Some(m) = &self.member {
                m.assoc.keep_alive_answered();
            }
            return false;
        }
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
        true
    }

    fn check_deadlines(&mut self) -> Result<(), TcpError> {
        let now = Instant::now();
        if now < self.next_check {
            return Ok(());
        }
        self.next_check = now + Duration::from_millis(10);
        for r in self.reqs.iter() {
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
        self.batch.clear();
        self.rpos = 0;
        self.rlen = 0;
        let mut n = 0;
        for r in self.reqs.drain() {
            if r.tag == KEEP_ALIVE_TAG {
                continue;
            }
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
        n
    }
}
