//! PDUs a hand-driven target sends in the NVMe/TCP unit tests.

/// A CapsuleResp PDU: success for command `cid`, CQE dwords 0-1 = `result`.
pub fn resp_with(cid: u16, result: u64) -> Vec<u8> {
    let mut v = vec![5, 0, 24, 0, 24, 0, 0, 0];
    v.extend_from_slice(&result.to_le_bytes());
    v.extend_from_slice(&[0; 4]);
    v.extend_from_slice(&cid.to_le_bytes());
    v.extend_from_slice(&0u16.to_le_bytes());
    v
}

/// A CapsuleResp PDU: success for command `cid`.
pub fn resp(cid: u16) -> Vec<u8> {
    resp_with(cid, 0)
}

/// A C2HData PDU (LAST_PDU, SUCCESS: no response follows) of `data` for command `cid`.
pub fn c2h_success(cid: u16, data: &[u8]) -> Vec<u8> {
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

/// An R2T PDU for command `cid`: `len` bytes from `off`.
pub fn r2t(cid: u16, ttag: u16, off: u32, len: u32) -> Vec<u8> {
    let mut v = vec![9, 0, 24, 0, 24, 0, 0, 0];
    v.extend_from_slice(&cid.to_le_bytes());
    v.extend_from_slice(&ttag.to_le_bytes());
    v.extend_from_slice(&off.to_le_bytes());
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(&[0; 4]);
    v
}

/// A CapsuleResp PDU failing command `cid` with status `status` (SCT << 8 | SC).
pub fn resp_failed(cid: u16, status: u16) -> Vec<u8> {
    let mut v = resp(cid);
    v[22..24].copy_from_slice(&(status << 1).to_le_bytes());
    v
}
