//! Advanced descriptors of the 82576 (datasheet 7.1.5 and 7.2.2.3), read and written in place in
//! ring memory with volatile accesses. 16 bytes each.
//!
//! RX, as posted (read format): packet buffer address (u64), header buffer address (u64, 0).
//! RX, as written back: packet info (u32), RSS hash (u32), status/error (u32: DD bit 0, EOP
//! bit 1), length (u16), VLAN (u16). TX data descriptor: buffer address (u64), command/type/
//! length (u32: length 15:0, DTYP 23:20 = 0011, EOP 24, IFCS 25, RS 27, DEXT 29), offload
//! info/status (u32: PAYLEN 31:14; written back with DD in bit 0).

use std::ptr::NonNull;

/// Bytes per descriptor.
pub const DESC_LEN: usize = 16;
/// RX write-back status: descriptor done.
pub const RX_DD: u32 = 1 << 0;
/// RX write-back status: end of packet.
pub const RX_EOP: u32 = 1 << 1;
/// TX write-back status: descriptor done.
pub const TX_DD: u32 = 1 << 0;
/// TX command: end of packet, insert FCS, report status, extended descriptor, data type.
pub const TX_CMD_DATA: u32 = (1 << 24) | (1 << 25) | (1 << 27) | (1 << 29) | (0x3 << 20);
/// TX PAYLEN shift in the offload word.
pub const TX_PAYLEN_SHIFT: u32 = 14;

/// A ring of `size` descriptors at `base` (DMA memory owned by the ring's owner).
#[derive(Debug, Clone, Copy)]
pub struct DescRing {
    base: NonNull<u8>,
    size: u16,
}

// SAFETY: the ring is plain DMA memory owned by the queue that holds this view; a queue is
// moved between threads as a whole.
unsafe impl Send for DescRing {}

impl DescRing {
    /// A view of `size` descriptors at `base`.
    ///
    /// # Safety
    /// `base` must point to at least `size * 16` bytes of memory, 8-byte aligned, that stays
    /// mapped while the view is used.
    pub unsafe fn new(base: NonNull<u8>, size: u16) -> DescRing {
        DescRing { base, size }
    }

    /// Number of descriptors.
    pub fn size(&self) -> u16 {
        self.size
    }

    fn at(&self, i: u16, off: usize) -> *mut u8 {
        assert!(
            i < self.size,
            "descriptor {i} of a {}-entry ring",
            self.size
        );
        // SAFETY: i < size, so i * 16 + off (off < 16) lies inside the ring (see `new`).
        unsafe { self.base.as_ptr().add(i as usize * DESC_LEN + off) }
    }

    fn write64(&self, i: u16, off: usize, v: u64) {
        // SAFETY: inside the ring (at), 8-byte aligned (base aligned, off in {0, 8}).
        unsafe { std::ptr::write_volatile(self.at(i, off).cast::<u64>(), v.to_le()) }
    }

    fn write32(&self, i: u16, off: usize, v: u32) {
        // SAFETY: inside the ring (at), 4-byte aligned (off a multiple of 4).
        unsafe { std::ptr::write_volatile(self.at(i, off).cast::<u32>(), v.to_le()) }
    }

    fn read32(&self, i: u16, off: usize) -> u32 {
        // SAFETY: as write32.
        u32::from_le(unsafe { std::ptr::read_volatile(self.at(i, off).cast::<u32>()) })
    }

    /// Posts an RX buffer at IOVA `iova` in descriptor `i` (status cleared: DD shares the
    /// header-address word, which is written 0).
    pub fn post_rx(&self, i: u16, iova: u64) {
        self.write64(i, 0, iova);
        self.write64(i, 8, 0);
    }

    /// The RX write-back status word of descriptor `i` (device-written: untrusted).
    pub fn rx_status(&self, i: u16) -> u32 {
        self.read32(i, 8)
    }

    /// The RX write-back length of descriptor `i` (device-written: untrusted).
    pub fn rx_len(&self, i: u16) -> u16 {
        self.read32(i, 12) as u16
    }

    /// Fills TX descriptor `i` with one whole frame of `len` bytes at IOVA `iova`.
    pub fn post_tx(&self, i: u16, iova: u64, len: u16) {
        self.write64(i, 0, iova);
        self.write32(i, 8, TX_CMD_DATA | u32::from(len));
        self.write32(i, 12, u32::from(len) << TX_PAYLEN_SHIFT);
    }

    /// True once the device wrote DD back into TX descriptor `i`.
    pub fn tx_done(&self, i: u16) -> bool {
        self.read32(i, 12) & TX_DD != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_have_the_datasheet_layout() {
        let mut mem = vec![0u64; 8];
        let base = NonNull::new(mem.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: 64 bytes, 8-byte aligned, alive for the test.
        let r = unsafe { DescRing::new(base, 4) };
        r.post_tx(1, 0x1000, 60);
        assert_eq!(mem[2], 0x1000);
        assert_eq!(
            mem[3] as u32, 0x2b30_003c,
            "EOP|IFCS|RS|DEXT|DTYP=3, len 60"
        );
        assert_eq!((mem[3] >> 32) as u32, 60 << 14, "PAYLEN");
        assert!(!r.tx_done(1));
        mem[3] |= 1 << 32;
        assert!(r.tx_done(1));
        r.post_rx(2, 0x2000);
        assert_eq!((mem[4], mem[5]), (0x2000, 0));
        mem[5] = (1500u64 << 32) | 0x3;
        assert_eq!((r.rx_status(2), r.rx_len(2)), (RX_DD | RX_EOP, 1500));
    }

    #[test]
    #[should_panic(expected = "descriptor 4 of a 4-entry ring")]
    fn an_index_beyond_the_ring_panics_before_touching_memory() {
        let mut mem = vec![0u64; 8];
        let base = NonNull::new(mem.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: as above.
        let r = unsafe { DescRing::new(base, 4) };
        r.rx_status(4);
    }
}
