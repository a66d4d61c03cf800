//! The model's data path: TX descriptors read and their frames put on the wire, frames from
//! the wire written into posted RX buffers, descriptors written back. Pure functions of the
//! register file and driver memory (through [`HostDma`]).

use std::collections::VecDeque;

use super::hostile::RxTweak;
use super::regs::*;
use crate::dma::HostDma;

/// The register file: 32-bit words of BAR 0.
pub(crate) struct Regs(pub(crate) Vec<u32>);

impl Regs {
    pub(crate) fn get(&self, off: usize) -> u32 {
        self.0.get(off / 4).copied().unwrap_or(0)
    }
    pub(crate) fn set(&mut self, off: usize, v: u32) {
        if let Some(w) = self.0.get_mut(off / 4) {
            *w = v;
        }
    }
    fn base(&self, lo: usize, hi: usize) -> u64 {
        u64::from(self.get(lo)) | (u64::from(self.get(hi)) << 32)
    }
}

/// A TX frame being gathered from its descriptors.
#[derive(Default)]
pub(crate) struct TxGather {
    pkt: Vec<u8>,
}

/// Processes TX queue `q` from TDH to TDT: returns the frames sent. `write_back` false: no DD.
pub(crate) fn transmit(
    r: &mut Regs,
    dma: &HostDma,
    q: usize,
    g: &mut TxGather,
    write_back: bool,
) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    if r.get(TCTL) & 2 == 0 || r.get(txdctl(q)) & QUEUE_ENABLE == 0 {
        return out;
    }
    let size = r.get(tdlen(q)) / 16;
    let base = r.base(tdbal(q), tdbah(q));
    // At most one pass over the ring per tail write.
    for _ in 0..size {
        let (head, tail) = (r.get(tdh(q)), r.get(tdt(q)));
        if head == tail || tail >= size || head >= size {
            break;
        }
        let d = base + 16 * u64::from(head);
        let mut desc = [0u8; 16];
        if dma.read(d, &mut desc).is_ok() {
            let addr = u64::from_le_bytes(desc[..8].try_into().expect("8 bytes"));
            let cmd = u32::from_le_bytes(desc[8..12].try_into().expect("4 bytes"));
            let olinfo = u32::from_le_bytes(desc[12..16].try_into().expect("4 bytes"));
            if cmd & (1 << 29) != 0 && (cmd >> 20) & 0xf == 3 {
                let mut b = vec![0u8; (cmd & 0xffff) as usize];
                if dma.read(addr, &mut b).is_ok() {
                    g.pkt.extend_from_slice(&b);
                }
                if cmd & (1 << 24) != 0 {
                    out.push(std::mem::take(&mut g.pkt));
                }
            }
            if cmd & (1 << 27) != 0 && write_back {
                let _ = dma.write(d + 12, &(olinfo | 1).to_le_bytes());
            }
        }
        r.set(tdh(q), if head + 1 >= size { 0 } else { head + 1 });
    }
    out
}

/// Descriptors the driver has posted on RX queue `q` (between RDH and RDT).
fn rx_free(r: &Regs, q: usize, size: u32) -> u32 {
    let (h, t) = (r.get(rdh(q)), r.get(rdt(q)));
    if h >= size || t >= size {
        0
    } else if h <= t {
        t - h
    } else {
        size - h + t
    }
}

/// Moves frames from `inbox` into RX queue `q`'s posted buffers while there is room; a frame
/// longer than one buffer spans several descriptors (EOP on the last). `tweak` rewrites each
/// descriptor's write-back. Returns (frames written, bytes).
pub(crate) fn receive(
    r: &mut Regs,
    dma: &HostDma,
    (q, oversized_ok): (usize, bool),
    inbox: &mut VecDeque<Vec<u8>>,
    tweak: &mut dyn FnMut() -> RxTweak,
) -> (u64, u64) {
    let (mut n, mut bytes) = (0, 0);
    if r.get(RCTL) & 2 == 0 || r.get(rxdctl(q)) & QUEUE_ENABLE == 0 {
        return (0, 0);
    }
    let size = r.get(rdlen(q)) / 16;
    let kb = r.get(srrctl(q)) & 0x7f;
    let bufsize = if kb == 0 { 2048 } else { kb as usize * 1024 };
    let base = r.base(rdbal(q), rdbah(q));
    // Untagged frames over 1514 bytes are oversized unless RCTL.LPE raises the limit to RLPML
    // (which counts the FCS).
    let max = if r.get(RCTL) & (1 << 5) != 0 {
        (r.get(RLPML) & 0x3fff).saturating_sub(4) as usize
    } else {
        1514
    };
    while let Some(frame) = inbox.front() {
        if frame.len() > max && !oversized_ok {
            inbox.pop_front();
            continue;
        }
        let mut frame = frame.clone();
        if frame.len() < 60 {
            frame.resize(60, 0);
        }
        let need = frame.len().div_ceil(bufsize) as u32;
        if rx_free(r, q, size) < need {
            break;
        }
        inbox.pop_front();
        for (i, chunk) in frame.chunks(bufsize).enumerate() {
            let head = r.get(rdh(q));
            let d = base + 16 * u64::from(head);
            let addr = dma.read_u64(d).unwrap_or(0);
            let _ = dma.write(addr, chunk);
            let eop = i as u32 + 1 == need;
            let t = tweak();
            let status = t.status.unwrap_or(1 | if eop { 2 } else { 0 });
            let len = t.len.unwrap_or(chunk.len() as u16);
            let mut wb = [0u8; 16];
            wb[8..12].copy_from_slice(&status.to_le_bytes());
            wb[12..14].copy_from_slice(&len.to_le_bytes());
            let _ = dma.write(d, &wb);
            r.set(rdh(q), if head + 1 >= size { 0 } else { head + 1 });
        }
        n += 1;
        bytes += frame.len() as u64 + 4;
    }
    (n, bytes)
}
