//! The device side of one split virtqueue, reached through [`HostDma`].

use super::hostile::UsedTweak;
use crate::dma::HostDma;

/// What the device expects of a queue's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum VqKind {
    /// Device-writable buffers.
    Rx,
    /// Device-readable buffers.
    Tx,
}

/// Descriptor flag NEXT.
const DESC_F_NEXT: u16 = 1;
/// Descriptor flag WRITE.
const DESC_F_WRITE: u16 = 2;
/// Longest control command read.
const MAX_CTRL: u32 = 64;

/// One queue's registers and device-side indices.
#[derive(Debug, Clone)]
pub(super) struct Vq {
    pub(super) size: Option<u16>,
    pub(super) vector: u16,
    pub(super) enable: u16,
    pub(super) desc: u64,
    pub(super) driver: u64,
    pub(super) device: u64,
    pub(super) event_idx_on: bool,
    /// Where the last control command wants its ack byte.
    pub(super) ctrl_ack_addr: Option<u64>,
    last_avail: u16,
    used_idx: u16,
}

impl Default for Vq {
    fn default() -> Self {
        Vq {
            size: None,
            vector: 0xffff,
            enable: 0,
            desc: 0,
            driver: 0,
            device: 0,
            event_idx_on: false,
            ctrl_ack_addr: None,
            last_avail: 0,
            used_idx: 0,
        }
    }
}

fn r16(dma: &HostDma, iova: u64) -> Option<u16> {
    let mut b = [0u8; 2];
    dma.read(iova, &mut b).ok()?;
    Some(u16::from_le_bytes(b))
}

fn w16(dma: &HostDma, iova: u64, v: u16) {
    let _ = dma.write(iova, &v.to_le_bytes());
}

impl Vq {
    /// Enabled with a usable (power-of-two) size.
    pub(super) fn enabled(&self) -> bool {
        self.enable == 1 && self.size.is_some_and(|s| s.is_power_of_two())
    }

    /// Called when the driver writes queue_enable (nothing to check in the model).
    pub(super) fn enable_check(&mut self) {}

    fn mask(&self) -> u16 {
        self.size.unwrap_or(1).wrapping_sub(1)
    }

    /// Buffers made available and not consumed.
    pub(super) fn pending(&self, dma: &HostDma) -> u16 {
        if !self.enabled() {
            return 0;
        }
        r16(dma, self.driver + 2)
            .map(|i| i.wrapping_sub(self.last_avail))
            .unwrap_or(0)
    }

    /// Reads descriptor `id`: (addr, len, flags, next).
    fn desc(&self, dma: &HostDma, id: u16) -> Option<(u64, u32, u16, u16)> {
        let base = self.desc + 16 * u64::from(id);
        let addr = dma.read_u64(base).ok()?;
        let len = dma.read_u32(base + 8).ok()?;
        let flags = r16(dma, base + 12)?;
        let next = r16(dma, base + 14)?;
        Some((addr, len, flags, next))
    }

    /// The next available head id, consumed.
    fn next_head(&mut self, dma: &HostDma) -> Option<u16> {
        if !self.enabled() {
            return None;
        }
        let idx = r16(dma, self.driver + 2)?;
        if idx == self.last_avail {
            return None;
        }
        let slot = self.last_avail & self.mask();
        let id = r16(dma, self.driver + 4 + 2 * u64::from(slot))?;
        self.last_avail = self.last_avail.wrapping_add(1);
        Some(id)
    }

    /// The next available single-descriptor buffer: (id, addr, len). A buffer of the wrong
    /// direction or an id beyond the ring is skipped (a driver bug: completed with length 0).
    pub(super) fn next_avail(&mut self, dma: &HostDma, kind: VqKind) -> Option<(u16, u64, u32)> {
        loop {
            let id = self.next_head(dma)?;
            let size = self.size.unwrap_or(0);
            let ok = id < size
                && self.desc(dma, id).is_some_and(|(_, _, flags, _)| {
                    (flags & DESC_F_WRITE != 0) == (kind == VqKind::Rx)
                });
            if ok {
                let (addr, len, _, _) = self.desc(dma, id)?;
                return Some((id, addr, len));
            }
        }
    }

    /// The next available device-readable buffer: (head id, the bytes of its chain in
    /// order). A head of the wrong direction or beyond the ring is skipped as in
    /// [`Vq::next_avail`]; a chain whose descriptors cannot be read, that names an id beyond
    /// the ring, holds a device-writable descriptor or is longer than the ring comes back with
    /// no bytes (completed with length 0, nothing sent).
    pub(super) fn next_tx(&mut self, dma: &HostDma) -> Option<(u16, Vec<u8>)> {
        let (id, _, _) = self.next_avail(dma, VqKind::Tx)?;
        let size = self.size.unwrap_or(0);
        let mut bytes = Vec::new();
        let mut at = id;
        for _ in 0..size {
            let Some((addr, len, flags, next)) = self.desc(dma, at) else {
                return Some((id, vec![]));
            };
            let start = bytes.len();
            bytes.resize(start + len as usize, 0);
            if flags & DESC_F_WRITE != 0 || dma.read(addr, &mut bytes[start..]).is_err() {
                return Some((id, vec![]));
            }
            if flags & DESC_F_NEXT == 0 {
                return Some((id, bytes));
            }
            if next >= size {
                return Some((id, vec![]));
            }
            at = next;
        }
        Some((id, vec![]))
    }

    /// The next control command (head id, command bytes); remembers where its ack goes.
    pub(super) fn next_ctrl(&mut self, dma: &HostDma) -> Option<(u16, Vec<u8>)> {
        let id = self.next_head(dma)?;
        let size = self.size.unwrap_or(0);
        self.ctrl_ack_addr = None;
        if id >= size {
            return Some((id, vec![]));
        }
        let (addr, len, flags, next) = self.desc(dma, id)?;
        let mut cmd = vec![0u8; len.min(MAX_CTRL) as usize];
        if dma.read(addr, &mut cmd).is_err() {
            cmd.clear();
        }
        if flags & DESC_F_NEXT != 0 && next < size {
            if let Some((ack, alen, aflags, _)) = self.desc(dma, next) {
                if aflags & DESC_F_WRITE != 0 && alen >= 1 {
                    self.ctrl_ack_addr = Some(ack);
                }
            }
        }
        Some((id, cmd))
    }

    /// Writes used element (id, len), tweaked, and publishes used->idx.
    pub(super) fn push_used(&mut self, dma: &HostDma, id: u16, len: u32, t: Option<UsedTweak>) {
        let t = t.unwrap_or_default();
        let slot = self.used_idx & self.mask();
        let at = self.device + 4 + 8 * u64::from(slot);
        let _ = dma.write_u32(at, t.id.unwrap_or(u32::from(id)));
        let _ = dma.write_u32(at + 4, t.len.unwrap_or(len));
        self.used_idx = self.used_idx.wrapping_add(1).wrapping_add(t.extra_idx);
        w16(dma, self.device + 2, self.used_idx);
    }

    /// With EVENT_IDX: asks for a doorbell on the next buffer made available.
    pub(super) fn publish_avail_event(&self, dma: &HostDma, on: bool) {
        if on && self.enabled() {
            let at = self.device + 4 + 8 * u64::from(self.size.unwrap_or(0));
            w16(dma, at, self.last_avail);
        }
    }
}
