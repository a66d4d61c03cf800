//! The send side of a [`super::queue::TcpQueue`]: the PDUs queued to go out and the checks an
//! H2CData PDU passes before it takes bytes from a command's buffer.
//!
//! Every queued send carries the sequence number of the command it belongs to (a command ID
//! is reused as soon as its command ends; the sequence number never is), so a send left from
//! an ended command never matches the command that took its ID.

use super::error::TcpError;
use super::pdu::{CMD_HLEN, DIGEST_LEN};
use super::rx::Dir;

/// A PDU waiting to be built and sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TxItem {
    /// The Command Capsule of command `cid` (with its in-capsule data).
    Cmd {
        /// Command ID.
        cid: u16,
        /// The command's sequence number.
        seq: u64,
    },
    /// What is left of an R2T of command `cid`: `len` bytes from `off`.
    H2c {
        /// Command ID.
        cid: u16,
        /// The command's sequence number.
        seq: u64,
        /// Transfer tag to echo.
        ttag: u16,
        /// Offset in the command's data.
        off: u32,
        /// Bytes left.
        len: u32,
    },
}

impl TxItem {
    /// The sequence number of the command the item belongs to.
    pub(super) fn seq(&self) -> u64 {
        match *self {
            TxItem::Cmd { seq, .. } | TxItem::H2c { seq, .. } => seq,
        }
    }
}

/// The PDU being sent: header bytes, a data range of a command's buffer, a data digest.
pub(super) struct TxPdu {
    pub(super) hdr: [u8; CMD_HLEN + DIGEST_LEN],
    pub(super) hlen: usize,
    pub(super) cid: u16,
    /// The sequence number of the command whose data the PDU carries.
    pub(super) seq: u64,
    pub(super) data_off: usize,
    pub(super) data_len: usize,
    pub(super) ddgst: [u8; DIGEST_LEN],
    pub(super) dlen: usize,
    pub(super) sent: usize,
    /// H2C: what is left of the R2T after this PDU (ttag, next offset, bytes left).
    pub(super) h2c_rest: Option<(u16, u32, u32)>,
}

impl TxPdu {
    /// An empty PDU of command `cid` (sequence number `seq`), filled in by the builder.
    pub(super) fn new(cid: u16, seq: u64) -> TxPdu {
        TxPdu {
            hdr: [0; CMD_HLEN + DIGEST_LEN],
            hlen: 0,
            cid,
            seq,
            data_off: 0,
            data_len: 0,
            ddgst: [0; DIGEST_LEN],
            dlen: 0,
            sent: 0,
            h2c_rest: None,
        }
    }
}

/// The live command an H2CData PDU would carry data of.
#[derive(Debug, Clone, Copy)]
pub(super) struct LiveCmd {
    /// Command ID.
    pub(super) cid: u16,
    /// Its sequence number.
    pub(super) seq: u64,
    /// Direction of its data.
    pub(super) dir: Dir,
    /// Its data length in bytes.
    pub(super) len: u32,
}

/// The payload length of the next H2CData PDU for an R2T (or what is left of it) of `len`
/// bytes from `off` of `cmd`: at most `maxh2cdata`. Refused unless `cmd` is a write whose data
/// the target asks for (not sent in the capsule) and `off..off + len` is a non-empty range
/// inside its data: no H2CData ever takes bytes outside the command's own data.
pub(super) fn h2c_chunk(
    cmd: LiveCmd,
    off: u32,
    len: u32,
    maxh2cdata: u32,
) -> Result<u32, TcpError> {
    if cmd.dir != Dir::Write {
        return Err(TcpError::Protocol {
            pdu: "R2T",
            field: "CCCID",
            value: cmd.cid as u64,
            reason: "names a command that has no data for an R2T",
        });
    }
    if len == 0 || off.checked_add(len).is_none_or(|end| end > cmd.len) {
        return Err(TcpError::Protocol {
            pdu: "R2T",
            field: "R2TO/R2TL",
            value: ((off as u64) << 32) | len as u64,
            reason: "empty, or past the end of the command's data",
        });
    }
    if maxh2cdata == 0 {
        return Err(TcpError::Negotiation {
            field: "MAXH2CDATA",
            value: 0,
            reason: "zero: no H2CData PDU can carry data (the spec's minimum is 4096)",
        });
    }
    Ok(len.min(maxh2cdata).min(MAX_CHUNK))
}

/// The largest H2CData payload the host sends in one PDU whatever MAXH2CDATA says: its PLEN
/// (payload plus header and digests) fits in 32 bits.
const MAX_CHUNK: u32 = u32::MAX - 4095;

#[cfg(test)]
mod tests {
    use super::*;

    const W: LiveCmd = LiveCmd {
        cid: 3,
        seq: 9,
        dir: Dir::Write,
        len: 8192,
    };

    fn field(r: Result<u32, TcpError>) -> &'static str {
        match r {
            Err(TcpError::Protocol {
                pdu: "R2T", field, ..
            }) => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn h2c_chunk_is_the_range_split_at_maxh2cdata() {
        assert_eq!(h2c_chunk(W, 0, 8192, 4096).unwrap(), 4096);
        assert_eq!(h2c_chunk(W, 4096, 4096, 4096).unwrap(), 4096);
        assert_eq!(h2c_chunk(W, 8000, 192, 4096).unwrap(), 192);
        assert_eq!(h2c_chunk(W, 0, 8192, 1 << 20).unwrap(), 8192);
        let huge = LiveCmd { len: u32::MAX, ..W };
        assert_eq!(h2c_chunk(huge, 0, u32::MAX, u32::MAX).unwrap(), MAX_CHUNK);
    }

    #[test]
    fn h2c_chunk_refuses_a_command_without_r2t_data() {
        for dir in [Dir::Read, Dir::None, Dir::WriteInCapsule] {
            let cmd = LiveCmd { dir, ..W };
            assert_eq!(field(h2c_chunk(cmd, 0, 512, 4096)), "CCCID", "{dir:?}");
        }
    }

    #[test]
    fn h2c_chunk_refuses_a_range_outside_the_command() {
        for (off, len) in [
            (0, 0),
            (0, 8193),
            (8192, 1),
            (4096, 8192),
            (u32::MAX, 2),
            (1, u32::MAX),
        ] {
            assert_eq!(
                field(h2c_chunk(W, off, len, 4096)),
                "R2TO/R2TL",
                "{off} {len}"
            );
        }
    }

    #[test]
    fn h2c_chunk_refuses_maxh2cdata_zero() {
        assert!(matches!(
            h2c_chunk(W, 0, 512, 0),
            Err(TcpError::Negotiation {
                field: "MAXH2CDATA",
                ..
            })
        ));
    }
}
