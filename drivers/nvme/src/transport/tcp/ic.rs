//! ICResp validation: what the controller answered to the host's ICReq becomes the
//! connection's [`Negotiated`] parameters, or a clear error.

use zerocopy::FromBytes;

use super::error::TcpError;
use super::pdu::{digest_bits, pdu_type, IcResp, IC_LEN, MIN_MAXH2CDATA, PFV_1_0};
use super::rx::Negotiated;

fn bad(field: &'static str, value: u64, reason: &'static str) -> TcpError {
    TcpError::Negotiation {
        field,
        value,
        reason,
    }
}

/// Validate a 128-byte ICResp against the digests the host asked for.
pub fn parse_icresp(b: &[u8; IC_LEN], hdgst: bool, ddgst: bool) -> Result<Negotiated, TcpError> {
    let r = IcResp::read_from_bytes(b).unwrap();
    if r.hdr.pdu_type == pdu_type::C2H_TERM_REQ {
        let fes = u16::from_le_bytes([b[8], b[9]]);
        let fei = u32::from_le_bytes([b[10], b[11], b[12], b[13]]);
        return Err(TcpError::Terminated { fes, fei });
    }
    if r.hdr.pdu_type != pdu_type::IC_RESP {
        return Err(bad("PDU-TYPE", r.hdr.pdu_type as u64, "expected ICResp (1): is this an NVMe/TCP port? (iSCSI and others listen on other ports)"));
    }
    if r.hdr.hlen as usize != IC_LEN || r.hdr.plen as usize != IC_LEN || r.hdr.pdo != 0 {
        return Err(bad(
            "HLEN/PLEN",
            r.hdr.plen as u64,
            "an ICResp is 128 bytes with PDO 0",
        ));
    }
    if r.pfv != PFV_1_0 {
        return Err(bad(
            "PFV",
            r.pfv as u64,
            "only PDU format version 1.0 (0) is supported",
        ));
    }
    if r.cpda > 31 {
        return Err(bad(
            "CPDA",
            r.cpda as u64,
            "data alignment above 128 bytes is out of range (0..31)",
        ));
    }
    let asked = (hdgst as u8 * digest_bits::HDGST) | (ddgst as u8 * digest_bits::DDGST);
    if r.digest & !asked != 0 {
        return Err(bad(
            "DGST",
            r.digest as u64,
            "the target enabled a digest the host did not ask for",
        ));
    }
    if r.maxh2cdata < MIN_MAXH2CDATA || r.maxh2cdata % 4 != 0 {
        return Err(bad(
            "MAXH2CDATA",
            r.maxh2cdata as u64,
            "below 4096 or not a multiple of 4",
        ));
    }
    Ok(Negotiated {
        hdgst: r.digest & digest_bits::HDGST != 0,
        ddgst: r.digest & digest_bits::DDGST != 0,
        cpda: r.cpda,
        maxh2cdata: r.maxh2cdata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn icresp(cpda: u8, dgst: u8, maxh2c: u32) -> [u8; 128] {
        let mut b = [0u8; 128];
        b[0] = 1;
        b[2] = 128;
        b[4] = 128;
        b[10] = cpda;
        b[11] = dgst;
        b[12..16].copy_from_slice(&maxh2c.to_le_bytes());
        b
    }

    #[test]
    fn icresp_accepts_and_refuses() {
        let n = parse_icresp(&icresp(0, 3, 131072), true, true).unwrap();
        assert_eq!(
            (n.hdgst, n.ddgst, n.cpda, n.maxh2cdata),
            (true, true, 0, 131072)
        );
        // The target may decline digests.
        let n = parse_icresp(&icresp(0, 0, 4096), true, true).unwrap();
        assert!(!n.hdgst && !n.ddgst);
        let field = |b: [u8; 128], h, d| match parse_icresp(&b, h, d) {
            Err(TcpError::Negotiation { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(icresp(0, 1, 4096), false, false), "DGST");
        assert_eq!(field(icresp(0, 0, 4092), false, false), "MAXH2CDATA");
        assert_eq!(field(icresp(0, 0, 4098), false, false), "MAXH2CDATA");
        assert_eq!(field(icresp(32, 0, 4096), false, false), "CPDA");
        let mut b = icresp(0, 0, 4096);
        b[8] = 1;
        assert_eq!(field(b, false, false), "PFV");
        b = icresp(0, 0, 4096);
        b[4] = 129;
        assert_eq!(field(b, false, false), "HLEN/PLEN");
        b[0] = 0x47; // 'G' of an HTTP answer
        assert_eq!(field(b, false, false), "PDU-TYPE");
    }
}
