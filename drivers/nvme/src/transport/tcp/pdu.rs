//! NVMe/TCP PDU headers (NVMe/TCP transport specification 1.0, section 3.6) as zerocopy
//! structures, little-endian on the wire like the rest of NVMe.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::spec::{Cqe, Sqe};

/// PDU types (common header byte 0).
pub mod pdu_type {
    /// Initialize Connection Request (host to controller).
    pub const IC_REQ: u8 = 0x00;
    /// Initialize Connection Response (controller to host).
    pub const IC_RESP: u8 = 0x01;
    /// Host to Controller Terminate Connection Request.
    pub const H2C_TERM_REQ: u8 = 0x02;
    /// Controller to Host Terminate Connection Request.
    pub const C2H_TERM_REQ: u8 = 0x03;
    /// Command Capsule.
    pub const CAPSULE_CMD: u8 = 0x04;
    /// Response Capsule.
    pub const CAPSULE_RESP: u8 = 0x05;
    /// Host to Controller Data.
    pub const H2C_DATA: u8 = 0x06;
    /// Controller to Host Data.
    pub const C2H_DATA: u8 = 0x07;
    /// Ready to Transfer.
    pub const R2T: u8 = 0x09;
}

/// Common header flags (byte 1).
pub mod flags {
    /// A header digest follows the PDU header.
    pub const HDGSTF: u8 = 1 << 0;
    /// A data digest follows the PDU data.
    pub const DDGSTF: u8 = 1 << 1;
    /// Last data PDU of the command (C2HData, H2CData).
    pub const LAST_PDU: u8 = 1 << 2;
    /// C2HData only: the command completed successfully, no Response Capsule follows.
    pub const SUCCESS: u8 = 1 << 3;
}

/// ICReq / ICResp DGST field bits.
pub mod digest_bits {
    /// Header digest enabled.
    pub const HDGST: u8 = 1 << 0;
    /// Data digest enabled.
    pub const DDGST: u8 = 1 << 1;
}

/// Length of a header or data digest.
pub const DIGEST_LEN: usize = 4;
/// ICReq and ICResp length (HLEN = PLEN = 128).
pub const IC_LEN: usize = 128;
/// Capsule Command header length: common header + 64-byte SQE.
pub const CMD_HLEN: usize = 72;
/// Header length of Response Capsule, C2HData, H2CData, R2T and the Terminate requests.
pub const SHORT_HLEN: usize = 24;
/// Largest Terminate Connection request: its header plus up to 128 bytes of the PDU header in
/// error.
pub const TERM_MAX_PLEN: usize = SHORT_HLEN + 128;
/// The smallest MAXH2CDATA a controller may report (spec: 4,096).
pub const MIN_MAXH2CDATA: u32 = 4096;
/// The well-known NVMe/TCP port of I/O controllers.
pub const DEFAULT_PORT: u16 = 4420;
/// The well-known NVMe/TCP port of discovery controllers.
pub const DISCOVERY_PORT: u16 = 8009;
/// PDU format version 1.0 (PFV).
pub const PFV_1_0: u16 = 0;

/// The 8-byte common header every PDU starts with.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct CommonHeader {
    /// PDU type ([`pdu_type`]).
    pub pdu_type: u8,
    /// Type-specific flags ([`flags`]).
    pub flags: u8,
    /// Header length (without the header digest).
    pub hlen: u8,
    /// PDU data offset from the start of the PDU (0: no data).
    pub pdo: u8,
    /// Total PDU length in bytes, digests and padding included.
    pub plen: u32,
}

/// Initialize Connection Request (128 bytes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct IcReq {
    /// Common header: type 0, hlen 128, pdo 0, plen 128.
    pub hdr: CommonHeader,
    /// PDU format version ([`PFV_1_0`]).
    pub pfv: u16,
    /// Host PDU data alignment, in dwords, 0's based.
    pub hpda: u8,
    /// Digests the host asks for ([`digest_bits`]).
    pub digest: u8,
    /// Maximum outstanding R2Ts per command, 0's based.
    pub maxr2t: u32,
    /// Reserved.
    pub rsvd: [u8; 112],
}

/// Initialize Connection Response (128 bytes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct IcResp {
    /// Common header: type 1, hlen 128, pdo 0, plen 128.
    pub hdr: CommonHeader,
    /// PDU format version.
    pub pfv: u16,
    /// Controller PDU data alignment, in dwords, 0's based.
    pub cpda: u8,
    /// Digests the controller enabled.
    pub digest: u8,
    /// MAXH2CDATA: the largest H2CData payload the controller accepts.
    pub maxh2cdata: u32,
    /// Reserved.
    pub rsvd: [u8; 112],
}

/// Terminate Connection Request header (either direction).
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct TermReq {
    /// Common header: type 2 or 3, hlen 24.
    pub hdr: CommonHeader,
    /// Fatal error status ([`fes`]).
    pub fes: u16,
    /// Fatal error information (e.g. the offset of the bad header field).
    pub fei: [u8; 4],
    /// Reserved.
    pub rsvd: [u8; 10],
}

/// Fatal error status values of a Terminate Connection request.
pub mod fes {
    /// Invalid PDU header field.
    pub const INVALID_HEADER: u16 = 0x01;
    /// PDU sequence error.
    pub const SEQUENCE: u16 = 0x02;
    /// Header digest error.
    pub const HEADER_DIGEST: u16 = 0x03;
    /// Data transfer out of range.
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    /// R2T limit exceeded / data transfer limit exceeded.
    pub const LIMIT_EXCEEDED: u16 = 0x05;
    /// Unsupported parameter.
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;

    /// The spec's name of a fatal error status.
    pub fn name(v: u16) -> &'static str {
        match v {
            INVALID_HEADER => "invalid PDU header field",
            SEQUENCE => "PDU sequence error",
            HEADER_DIGEST => "header digest error",
            DATA_OUT_OF_RANGE => "data transfer out of range",
            LIMIT_EXCEEDED => "R2T or data transfer limit exceeded",
            UNSUPPORTED_PARAMETER => "unsupported parameter",
            _ => "unknown fatal error status",
        }
    }
}

/// Command Capsule header: the SQE follows the common header (72 bytes).
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct CapsuleCmd {
    /// Common header: type 4, hlen 72.
    pub hdr: CommonHeader,
    /// The submission queue entry (SGL data pointer).
    pub sqe: Sqe,
}

/// Response Capsule (24 bytes): the CQE follows the common header.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct CapsuleResp {
    /// Common header: type 5, hlen 24.
    pub hdr: CommonHeader,
    /// The completion queue entry.
    pub cqe: Cqe,
}

/// The header of C2HData and H2CData PDUs (24 bytes).
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct DataHeader {
    /// Common header: type 6 or 7, hlen 24.
    pub hdr: CommonHeader,
    /// Command capsule CID the data belongs to.
    pub cccid: u16,
    /// Transfer tag (H2CData: the R2T's; C2HData: reserved).
    pub ttag: u16,
    /// Offset of this PDU's data from the start of the command's data.
    pub datao: u32,
    /// Length of this PDU's data.
    pub datal: u32,
    /// Reserved.
    pub rsvd: u32,
}

/// Ready to Transfer (24 bytes).
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct R2t {
    /// Common header: type 9, hlen 24.
    pub hdr: CommonHeader,
    /// Command capsule CID the transfer is for.
    pub cccid: u16,
    /// Transfer tag, echoed in the H2CData PDUs.
    pub ttag: u16,
    /// Offset of the requested data from the start of the command's data.
    pub r2to: u32,
    /// Length of the requested data.
    pub r2tl: u32,
    /// Reserved.
    pub rsvd: u32,
}

const _: () = assert!(std::mem::size_of::<CommonHeader>() == 8);
const _: () = assert!(std::mem::size_of::<IcReq>() == IC_LEN);
const _: () = assert!(std::mem::size_of::<IcResp>() == IC_LEN);
const _: () = assert!(std::mem::size_of::<TermReq>() == SHORT_HLEN);
const _: () = assert!(std::mem::size_of::<CapsuleCmd>() == CMD_HLEN);
const _: () = assert!(std::mem::size_of::<CapsuleResp>() == SHORT_HLEN);
const _: () = assert!(std::mem::size_of::<DataHeader>() == SHORT_HLEN);
const _: () = assert!(std::mem::size_of::<R2t>() == SHORT_HLEN);

impl IcReq {
    /// An ICReq asking for the given digests, HPDA 0 (no padding) and one R2T per command.
    pub fn new(hdgst: bool, ddgst: bool) -> IcReq {
        let mut digest = 0;
        if hdgst {
            digest |= digest_bits::HDGST;
        }
        if ddgst {
            digest |= digest_bits::DDGST;
        }
        IcReq {
            hdr: CommonHeader {
                pdu_type: pdu_type::IC_REQ,
                flags: 0,
                hlen: IC_LEN as u8,
                pdo: 0,
                plen: IC_LEN as u32,
            },
            pfv: PFV_1_0,
            hpda: 0,
            digest,
            maxr2t: 0,
            rsvd: [0; 112],
        }
    }
}

/// The name of a PDU type, for errors.
pub fn type_name(t: u8) -> &'static str {
    match t {
        pdu_type::IC_REQ => "ICReq",
        pdu_type::IC_RESP => "ICResp",
        pdu_type::H2C_TERM_REQ => "H2CTermReq",
        pdu_type::C2H_TERM_REQ => "C2HTermReq",
        pdu_type::CAPSULE_CMD => "CapsuleCmd",
        pdu_type::CAPSULE_RESP => "CapsuleResp",
        pdu_type::H2C_DATA => "H2CData",
        pdu_type::C2H_DATA => "C2HData",
        pdu_type::R2T => "R2T",
        _ => "unknown PDU type",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ICReq as the spec lays it out (figure "ICReq PDU"): type 0, HLEN 0x80, PLEN 128,
    /// PFV at byte 8, HPDA 10, DGST 11, MAXR2T 12..16.
    #[test]
    fn icreq_bytes_match_spec_image() {
        let r = IcReq::new(true, true);
        let b = r.as_bytes();
        let mut want = [0u8; 128];
        want[2] = 0x80;
        want[4] = 0x80;
        want[11] = 0x03;
        assert_eq!(b, &want[..]);
    }

    #[test]
    fn data_header_field_offsets() {
        let h = DataHeader {
            hdr: CommonHeader {
                pdu_type: pdu_type::C2H_DATA,
                flags: flags::LAST_PDU,
                hlen: 24,
                pdo: 24,
                plen: 24 + 512,
            },
            cccid: 0x0102,
            ttag: 0x0304,
            datao: 0x0506_0708,
            datal: 0x200,
            rsvd: 0,
        };
        let b = h.as_bytes();
        assert_eq!(
            &b[..20],
            &[7, 4, 24, 24, 0x18, 2, 0, 0, 2, 1, 4, 3, 8, 7, 6, 5, 0, 2, 0, 0]
        );
    }
}
