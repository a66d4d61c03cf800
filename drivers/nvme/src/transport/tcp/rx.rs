//! The receive state machine of one NVMe/TCP connection: it says where the next bytes from the
//! socket go (its own header buffer, or straight into a command's data buffer at an offset) and
//! validates every PDU header field the target sends before acting on it.
//!
//! It never allocates after [`RxMachine::new`] and never panics on any byte stream: the fuzz
//! target `fuzz_tcp_rx` feeds it random streams.

use zerocopy::FromBytes;

use super::digest;
use super::error::TcpError;
use super::pdu::{
    self, flags, pdu_type, CapsuleResp, CommonHeader, DataHeader, R2t, TermReq, DIGEST_LEN,
    SHORT_HLEN, TERM_MAX_PLEN,
};
use crate::spec::Cqe;

/// What the connection negotiated in ICReq / ICResp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// Header digests on every PDU but ICReq / ICResp / Terminate.
    pub hdgst: bool,
    /// Data digests on every PDU that carries data.
    pub ddgst: bool,
    /// Controller PDU data alignment, dwords, 0's based.
    pub cpda: u8,
    /// Largest H2CData payload the controller accepts.
    pub maxh2cdata: u32,
}

/// Direction of a command's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// No data.
    None,
    /// Controller to host (C2HData).
    Read,
    /// Host to controller, sent in the capsule (no R2T allowed).
    WriteInCapsule,
    /// Host to controller, requested by R2Ts.
    Write,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    active: bool,
    dir: Dir,
    len: u32,
    /// Read: bytes received so far. Write: bytes the target has asked for so far.
    done: u32,
    /// Write: an R2T is being answered.
    r2t_open: bool,
}

const IDLE: Slot = Slot {
    active: false,
    dir: Dir::None,
    len: 0,
    done: 0,
    r2t_open: false,
};

/// Where the connection is in the byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Reading a PDU header into `hdr` until `need` bytes are there.
    Header { need: usize },
    /// Discarding padding between the header and the data (PDO alignment).
    Pad { left: usize },
    /// Payload of a C2HData PDU going into command `cid`'s buffer.
    Payload { cid: u16, left: u32 },
    /// The 4-byte data digest after a C2HData payload.
    DataDigest { cid: u16, fill: usize },
}

/// Where the next received bytes go.
#[derive(Debug)]
pub enum Want<'a> {
    /// Into the machine's own buffer (header, padding, digest): fill some prefix of it, then
    /// call [`RxMachine::advance_internal`].
    Internal(&'a mut [u8]),
    /// Into command `cid`'s data buffer at byte `off`, at most `len` bytes; then call
    /// [`RxMachine::advance_data`] with the bytes that landed.
    Data {
        /// Command identifier.
        cid: u16,
        /// Offset in the command's data.
        off: u32,
        /// Bytes wanted at most.
        len: u32,
    },
}

/// What a completed stage means for the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Nothing to act on yet.
    None,
    /// Command `cid` completed with this CQE (its slot is free again).
    Response {
        /// Command identifier.
        cid: u16,
        /// The completion.
        cqe: Cqe,
    },
    /// Command `cid` completed successfully with its last C2HData (SUCCESS flag, no
    /// Response Capsule follows; its slot is free again).
    DataSuccess {
        /// Command identifier.
        cid: u16,
    },
    /// The target asks for `len` bytes of command `cid` from `off`.
    R2t {
        /// Command identifier.
        cid: u16,
        /// Transfer tag to echo.
        ttag: u16,
        /// Offset.
        off: u32,
        /// Length.
        len: u32,
    },
}

/// The receive state machine (see the module doc).
#[derive(Debug)]
pub struct RxMachine {
    neg: Negotiated,
    slots: Vec<Slot>,
    /// Header buffer: the longest header the host accepts is a C2HTermReq (152 bytes).
    hdr: [u8; 160],
    fill: usize,
    stage: Stage,
    /// Flags of the C2HData being received.
    cur_flags: u8,
    data_crc: u32,
    dgst: [u8; DIGEST_LEN],
    scratch: [u8; 256],
    /// The C2HData payload that follows the padding being discarded.
    pending_payload: Option<(u16, u32)>,
}

fn proto(pdu: &'static str, field: &'static str, value: u64, reason: &'static str) -> TcpError {
    TcpError::Protocol {
        pdu,
        field,
        value,
        reason,
    }
}

impl RxMachine {
    /// A machine for a connection with `depth` command identifiers (0..depth).
    pub fn new(neg: Negotiated, depth: u16) -> RxMachine {
        RxMachine {
            neg,
            slots: vec![IDLE; depth as usize],
            hdr: [0; 160],
            fill: 0,
            stage: Stage::Header { need: 8 },
            cur_flags: 0,
            data_crc: 0,
            dgst: [0; DIGEST_LEN],
            scratch: [0; 256],
            pending_payload: None,
        }
    }

    /// The negotiated parameters.
    #[cfg(any(test, feature = "internals"))]
    pub fn negotiated(&self) -> Negotiated {
        self.neg
    }

    /// Command `cid` was sent: expect its data and response. False if `cid` is out of range or
    /// busy (a host bug: refused, nothing changes).
    pub fn begin(&mut self, cid: u16, dir: Dir, len: u32) -> bool {
        match self.slots.get_mut(cid as usize) {
            Some(s) if !s.active => {
                *s = Slot {
                    active: true,
                    dir,
                    len,
                    done: if dir == Dir::WriteInCapsule { len } else { 0 },
                    r2t_open: false,
                };
                true
            }
            _ => false,
        }
    }

    /// The data of the last R2T of `cid` is on its way: another R2T may come.
    pub fn r2t_answered(&mut self, cid: u16) {
        if let Some(s) = self.slots.get_mut(cid as usize) {
            s.r2t_open = false;
        }
    }

    /// Forget every command (the connection is being torn down).
    pub fn reset_all(&mut self) {
        self.slots.fill(IDLE);
        self.fill = 0;
        self.stage = Stage::Header { need: 8 };
        self.pending_payload = None;
    }

    /// Whether command `cid` is outstanding.
    pub fn is_active(&self, cid: u16) -> bool {
        self.slots.get(cid as usize).is_some_and(|s| s.active)
    }

    /// Where the next bytes go.
    pub fn want(&mut self) -> Want<'_> {
        match self.stage {
            Stage::Header { need } => Want::Internal(&mut self.hdr[self.fill..need]),
            Stage::Pad { left } => Want::Internal(&mut self.scratch[..left]),
            Stage::Payload { cid, left } => Want::Data {
                cid,
                off: self.slots[cid as usize].done,
                len: left,
            },
            Stage::DataDigest { fill, .. } => Want::Internal(&mut self.dgst[fill..]),
        }
    }

    /// `n` bytes landed in the buffer [`RxMachine::want`] gave as `Internal`.
    pub fn advance_internal(&mut self, n: usize) -> Result<Event, TcpError> {
        match self.stage {
            Stage::Header { need } => {
                self.fill = (self.fill + n).min(need);
                if self.fill < need {
                    return Ok(Event::None);
                }
                if need == 8 {
                    let need = self.header_len()?;
                    if need > 8 {
                        self.stage = Stage::Header { need };
                        return Ok(Event::None);
                    }
                }
                let ev = self.header_done();
                self.fill = 0;
                ev
            }
            Stage::Pad { left } => {
                let left = left.saturating_sub(n);
                self.stage = if left == 0 {
                    self.payload_stage()
                } else {
                    Stage::Pad { left }
                };
                Ok(Event::None)
            }
            Stage::DataDigest { cid, fill } => {
                let fill = (fill + n).min(DIGEST_LEN);
                if fill < DIGEST_LEN {
                    self.stage = Stage::DataDigest { cid, fill };
                    return Ok(Event::None);
                }
                let got = u32::from_le_bytes(self.dgst);
                if got != self.data_crc {
                    return Err(TcpError::DataDigest {
                        cid,
                        got,
                        want: self.data_crc,
                    });
                }
                Ok(self.data_done(cid))
            }
            Stage::Payload { .. } => Err(TcpError::Request {
                reason: "advance_internal during a payload (host bug)",
            }),
        }
    }

    /// These bytes landed in command `cid`'s buffer where [`RxMachine::want`] said.
    pub fn advance_data(&mut self, landed: &[u8]) -> Result<Event, TcpError> {
        let Stage::Payload { cid, left } = self.stage else {
            return Err(TcpError::Request {
                reason: "advance_data outside a payload (host bug)",
            });
        };
        let n = (landed.len() as u32).min(left);
        if self.neg.ddgst {
            self.data_crc = digest::crc_append(self.data_crc, &landed[..n as usize]);
        }
        self.slots[cid as usize].done += n;
        let left = left - n;
        if left > 0 {
            self.stage = Stage::Payload { cid, left };
            return Ok(Event::None);
        }
        if self.neg.ddgst {
            self.stage = Stage::DataDigest { cid, fill: 0 };
            return Ok(Event::None);
        }
        Ok(self.data_done(cid))
    }

    fn hd(&self) -> usize {
        if self.neg.hdgst {
            DIGEST_LEN
        } else {
            0
        }
    }

    /// Validate the common header; the header's full length (digest included).
    fn header_len(&mut self) -> Result<usize, TcpError> {
        let ch = CommonHeader::read_from_bytes(&self.hdr[..8]).unwrap();
        let name = pdu::type_name(ch.pdu_type);
        let hd = self.hd();
        match ch.pdu_type {
            pdu_type::CAPSULE_RESP | pdu_type::C2H_DATA | pdu_type::R2T => {
                if ch.hlen as usize != SHORT_HLEN {
                    return Err(proto(name, "HLEN", ch.hlen as u64, "must be 24"));
                }
                let hdgstf = ch.flags & flags::HDGSTF != 0;
                if hdgstf != self.neg.hdgst {
                    return Err(proto(
                        name,
                        "FLAGS.HDGSTF",
                        ch.flags as u64,
                        "does not match the header digest negotiated in ICResp",
                    ));
                }
                Ok(SHORT_HLEN + hd)
            }
            pdu_type::C2H_TERM_REQ => {
                if ch.hlen as usize != SHORT_HLEN {
                    return Err(proto(name, "HLEN", ch.hlen as u64, "must be 24"));
                }
                if (ch.plen as usize) < SHORT_HLEN || ch.plen as usize > TERM_MAX_PLEN {
                    return Err(proto(name, "PLEN", ch.plen as u64, "must be 24 to 152"));
                }
                Ok(ch.plen as usize)
            }
            pdu_type::IC_REQ
            | pdu_type::IC_RESP
            | pdu_type::H2C_TERM_REQ
            | pdu_type::CAPSULE_CMD
            | pdu_type::H2C_DATA => Err(proto(
                name,
                "PDU-TYPE",
                ch.pdu_type as u64,
                "not a PDU a controller sends on an established connection",
            )),
            t => Err(proto(name, "PDU-TYPE", t as u64, "unknown PDU type")),
        }
    }

    fn check_hdgst(&self, name: &'static str) -> Result<(), TcpError> {
        if !self.neg.hdgst {
            return Ok(());
        }
        let want = digest::crc(&self.hdr[..SHORT_HLEN]);
        let got = u32::from_le_bytes(self.hdr[SHORT_HLEN..SHORT_HLEN + 4].try_into().unwrap());
        if got != want {
            return Err(TcpError::HeaderDigest {
                pdu: name,
                got,
                want,
            });
        }
        Ok(())
    }

    /// A whole header is in `hdr`: validate it against the command it names and act.
    fn header_done(&mut self) -> Result<Event, TcpError> {
        let ch = CommonHeader::read_from_bytes(&self.hdr[..8]).unwrap();
        let name = pdu::type_name(ch.pdu_type);
        self.stage = Stage::Header { need: 8 };
        match ch.pdu_type {
            pdu_type::C2H_TERM_REQ => {
                let t = TermReq::read_from_bytes(&self.hdr[..SHORT_HLEN]).unwrap();
                Err(TcpError::Terminated {
                    fes: t.fes,
                    fei: u32::from_le_bytes(t.fei),
                })
            }
            pdu_type::CAPSULE_RESP => self.capsule_resp(&ch, name),
            pdu_type::R2T => self.r2t(&ch, name),
            pdu_type::C2H_DATA => self.c2h_data(&ch, name),
            _ => Err(proto(
                name,
                "PDU-TYPE",
                ch.pdu_type as u64,
                "unknown PDU type",
            )),
        }
    }

    /// A Response Capsule: the command it names completes (success only once all its data
    /// moved).
    fn capsule_resp(&mut self, ch: &CommonHeader, name: &'static str) -> Result<Event, TcpError> {
        self.check_hdgst(name)?;
        if ch.pdo != 0 || ch.plen as usize != SHORT_HLEN + self.hd() {
            return Err(proto(
                name,
                "PDO/PLEN",
                ch.plen as u64,
                "a Response Capsule carries no data: PDO 0, PLEN 24 (+4 with header digest)",
            ));
        }
        let r = CapsuleResp::read_from_bytes(&self.hdr[..SHORT_HLEN]).unwrap();
        let cid = r.cqe.cid;
        let s = self.slot(name, "CCCID", cid)?;
        if r.cqe.status >> 1 == 0 {
            match s.dir {
                Dir::Read if s.done != s.len => {
                    return Err(proto(
                        name,
                        "CQE.STATUS",
                        0,
                        "success before all the read's data arrived",
                    ))
                }
                Dir::Write if s.done != s.len || s.r2t_open => {
                    return Err(proto(
                        name,
                        "CQE.STATUS",
                        0,
                        "success before the target asked for all the write's data",
                    ))
                }
                _ => {}
            }
        }
        self.slots[cid as usize] = IDLE;
        Ok(Event::Response { cid, cqe: r.cqe })
    }

    /// An R2T: the target asks for the next part of a write's data.
    fn r2t(&mut self, ch: &CommonHeader, name: &'static str) -> Result<Event, TcpError> {
        self.check_hdgst(name)?;
        if ch.pdo != 0 || ch.plen as usize != SHORT_HLEN + self.hd() {
            return Err(proto(
                name,
                "PDO/PLEN",
                ch.plen as u64,
                "an R2T carries no data: PDO 0, PLEN 24 (+4 with header digest)",
            ));
        }
        let r = R2t::read_from_bytes(&self.hdr[..SHORT_HLEN]).unwrap();
        let s = self.slot(name, "CCCID", r.cccid)?;
        if s.dir != Dir::Write {
            return Err(proto(
                name,
                "CCCID",
                r.cccid as u64,
                "names a command that has no data for an R2T",
            ));
        }
        if s.r2t_open {
            return Err(proto(
                name,
                "CCCID",
                r.cccid as u64,
                "a second R2T while one is open (MAXR2T is 1)",
            ));
        }
        if r.r2to != s.done {
            return Err(proto(
                name,
                "R2TO",
                r.r2to as u64,
                "not where the previous transfer ended",
            ));
        }
        if r.r2tl == 0 || r.r2tl > s.len - s.done {
            return Err(proto(
                name,
                "R2TL",
                r.r2tl as u64,
                "zero, or past the end of the command's data",
            ));
        }
        let slot = &mut self.slots[r.cccid as usize];
        slot.done += r.r2tl;
        slot.r2t_open = true;
        Ok(Event::R2t {
            cid: r.cccid,
            ttag: r.ttag,
            off: r.r2to,
            len: r.r2tl,
        })
    }

    /// A C2HData header: checked, its payload (after any padding) goes to the read it names.
    fn c2h_data(&mut self, ch: &CommonHeader, name: &'static str) -> Result<Event, TcpError> {
        self.check_hdgst(name)?;
        let d = DataHeader::read_from_bytes(&self.hdr[..SHORT_HLEN]).unwrap();
        let s = self.slot(name, "CCCID", d.cccid)?;
        if s.dir != Dir::Read {
            return Err(proto(
                name,
                "CCCID",
                d.cccid as u64,
                "names a command that reads no data",
            ));
        }
        self.check_c2h_flags(ch, name)?;
        let pdo = self.check_c2h_layout(ch, name, &d, &s)?;
        self.cur_flags = ch.flags;
        self.data_crc = 0;
        self.stage = Stage::Payload {
            cid: d.cccid,
            left: d.datal,
        };
        let pad = pdo - SHORT_HLEN - self.hd();
        if pad > 0 {
            self.pending_payload = Some((d.cccid, d.datal));
            self.stage = Stage::Pad { left: pad };
        }
        Ok(Event::None)
    }

    /// A C2HData's digest flag matches the negotiation; SUCCESS comes only with LAST_PDU.
    fn check_c2h_flags(&self, ch: &CommonHeader, name: &'static str) -> Result<(), TcpError> {
        let ddgstf = ch.flags & flags::DDGSTF != 0;
        if ddgstf != self.neg.ddgst {
            return Err(proto(
                name,
                "FLAGS.DDGSTF",
                ch.flags as u64,
                "does not match the data digest negotiated in ICResp",
            ));
        }
        if ch.flags & flags::SUCCESS != 0 && ch.flags & flags::LAST_PDU == 0 {
            return Err(proto(
                name,
                "FLAGS",
                ch.flags as u64,
                "SUCCESS without LAST_PDU",
            ));
        }
        Ok(())
    }

    /// A C2HData's data offset, range and length fit the header and the read `s`; its PDO.
    fn check_c2h_layout(
        &self,
        ch: &CommonHeader,
        name: &'static str,
        d: &DataHeader,
        s: &Slot,
    ) -> Result<usize, TcpError> {
        let align = (self.neg.cpda as usize + 1) * 4;
        let pdo = ch.pdo as usize;
        if pdo < SHORT_HLEN + self.hd() || pdo % align != 0 {
            return Err(proto(
                name,
                "PDO",
                pdo as u64,
                "before the end of the header or not aligned to CPDA",
            ));
        }
        if d.datal == 0 || d.datao != s.done || d.datal > s.len - s.done {
            return Err(proto(
                name,
                "DATAO/DATAL",
                ((d.datao as u64) << 32) | d.datal as u64,
                "empty, out of order or past the end of the command's buffer",
            ));
        }
        let dd = if self.neg.ddgst { DIGEST_LEN as u64 } else { 0 };
        if ch.plen as u64 != pdo as u64 + d.datal as u64 + dd {
            return Err(proto(
                name,
                "PLEN",
                ch.plen as u64,
                "not PDO + DATAL (+4 with data digest)",
            ));
        }
        if ch.flags & flags::LAST_PDU != 0 && d.datao + d.datal != s.len {
            return Err(proto(
                name,
                "FLAGS.LAST_PDU",
                ch.flags as u64,
                "set before the end of the command's data",
            ));
        }
        Ok(pdo)
    }

    fn payload_stage(&mut self) -> Stage {
        match self.pending_payload.take() {
            Some((cid, left)) => Stage::Payload { cid, left },
            None => Stage::Header { need: 8 },
        }
    }

    fn slot(&self, name: &'static str, field: &'static str, cid: u16) -> Result<Slot, TcpError> {
        match self.slots.get(cid as usize) {
            Some(s) if s.active => Ok(*s),
            _ => Err(proto(name, field, cid as u64, "names no command in flight")),
        }
    }

    fn data_done(&mut self, cid: u16) -> Event {
        self.stage = Stage::Header { need: 8 };
        if self.cur_flags & flags::SUCCESS != 0 {
            self.slots[cid as usize] = IDLE;
            return Event::DataSuccess { cid };
        }
        Event::None
    }
}
