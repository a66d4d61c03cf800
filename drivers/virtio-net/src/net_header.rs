//! The virtio-net packet header (`struct virtio_net_hdr_v1`, virtio 1.2 §5.1.6): 12 bytes in
//! front of every frame in both directions once VIRTIO_F_VERSION_1 is negotiated.

use zerocopy::little_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Length of [`VirtioNetHdr`] in bytes.
pub const NET_HDR_LEN: usize = 12;

/// `struct virtio_net_hdr_v1`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct VirtioNetHdr {
    /// VIRTIO_NET_HDR_F_* flags (0: no checksum offload).
    pub flags: u8,
    /// GSO type (0: none).
    pub gso_type: u8,
    /// Header length for GSO.
    pub hdr_len: U16,
    /// GSO segment size.
    pub gso_size: U16,
    /// Checksum start offset.
    pub csum_start: U16,
    /// Checksum field offset from `csum_start`.
    pub csum_offset: U16,
    /// Number of merged buffers (only with MRG_RXBUF; otherwise 0 / ignored).
    pub num_buffers: U16,
}

/// Header flag: the checksum needs completing (never set by this driver: no offloads).
pub const HDR_F_NEEDS_CSUM: u8 = 1;
/// GSO type: not a GSO frame.
pub const GSO_NONE: u8 = 0;

impl VirtioNetHdr {
    /// The header this driver sends: no checksum offload, no segmentation.
    pub const PLAIN: VirtioNetHdr = VirtioNetHdr {
        flags: 0,
        gso_type: GSO_NONE,
        hdr_len: U16::ZERO,
        gso_size: U16::ZERO,
        csum_start: U16::ZERO,
        csum_offset: U16::ZERO,
        num_buffers: U16::ZERO,
    };

    /// Writes the plain header into the first 12 bytes of `buf` (which must be that long).
    pub fn write_plain(buf: &mut [u8]) {
        buf[..NET_HDR_LEN].copy_from_slice(VirtioNetHdr::PLAIN.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_12_bytes_little_endian() {
        assert_eq!(core::mem::size_of::<VirtioNetHdr>(), NET_HDR_LEN);
        let mut h = VirtioNetHdr::PLAIN;
        h.num_buffers = U16::new(0x0102);
        h.gso_size = U16::new(0x0a0b);
        let b = h.as_bytes();
        assert_eq!(&b[4..6], &[0x0b, 0x0a]);
        assert_eq!(&b[10..12], &[0x02, 0x01]);
        let back = VirtioNetHdr::read_from_bytes(b).unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn write_plain_zeroes_header_only() {
        let mut buf = [0xaau8; 16];
        VirtioNetHdr::write_plain(&mut buf);
        assert_eq!(&buf[..12], &[0u8; 12]);
        assert_eq!(&buf[12..], &[0xaa; 4]);
    }
}
