//! The layouts of the PACKET_MMAP rings (linux/if_packet.h) and the parsing of what the kernel
//! writes into them. Everything read from a ring (block status, packet counts, offsets,
//! lengths, frame status) is untrusted: every offset is bounds-checked against the block or
//! frame it claims to lie in, and a bad value is an error, never a panic or an out-of-bounds
//! read.

/// `TPACKET_V2` of `enum tpacket_versions`.
pub const TPACKET_V2: libc::c_int = 1;
/// `TPACKET_V3` of `enum tpacket_versions`.
pub const TPACKET_V3: libc::c_int = 2;

/// Offset of `block_status` in `struct tpacket_block_desc` (after `version`, `offset_to_priv`).
pub const BLOCK_STATUS: usize = 8;
const NUM_PKTS: usize = 12;
const OFFSET_TO_FIRST_PKT: usize = 16;
const BLK_LEN: usize = 20;
/// Size of `struct tpacket_block_desc` with its `tpacket_hdr_v1`.
pub const BLOCK_HDR_LEN: usize = 48;

/// Size of `struct tpacket3_hdr`.
pub const HDR3_LEN: usize = 48;
const HDR3_NEXT: usize = 0;
const HDR3_SNAPLEN: usize = 12;
const HDR3_LEN_FIELD: usize = 16;
const HDR3_MAC: usize = 24;

/// A block the kernel has handed to user space (`TP_STATUS_USER` in `block_status`).
pub const TP_STATUS_USER: u32 = 1;
/// The value user space writes to `block_status` to give a block back.
pub const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_SEND_REQUEST: u32 = 1;
const TP_STATUS_SENDING: u32 = 2;
const TP_STATUS_WRONG_FORMAT: u32 = 4;

/// A malformed RX block: what the kernel wrote does not describe packets inside the block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The block is shorter than its own header.
    #[error("the block ({0} bytes) is shorter than its {BLOCK_HDR_LEN}-byte header")]
    ShortBlock(usize),
    /// `blk_len` claims more bytes than the block has.
    #[error("the block header claims {claimed} bytes used of a {size}-byte block")]
    BlockLength {
        /// `blk_len` as read.
        claimed: u32,
        /// The block size.
        size: usize,
    },
    /// `num_pkts` is more than the block could hold.
    #[error("the block header claims {0} packets, more than fit in the block")]
    TooManyPackets(u32),
    /// A packet header lies (partly) outside the block or over the block header.
    #[error(
        "packet {index}: its header at offset {offset} lies outside the block's {used} used bytes"
    )]
    HeaderOutside {
        /// Packet index in the block.
        index: u32,
        /// Offset of its header.
        offset: usize,
        /// Bytes of the block in use.
        used: usize,
    },
    /// A packet's data (`tp_mac`, `tp_snaplen`) lies outside the block or over its header.
    #[error("packet {index}: its data (offset {mac} from its header, {snaplen} bytes) lies outside the block")]
    DataOutside {
        /// Packet index in the block.
        index: u32,
        /// `tp_mac` as read.
        mac: u16,
        /// `tp_snaplen` as read.
        snaplen: u32,
    },
    /// `tp_next_offset` does not point past the packet's own data.
    #[error("packet {index}: next-packet offset {next} does not move past its data")]
    BadNext {
        /// Packet index in the block.
        index: u32,
        /// `tp_next_offset` as read.
        next: u32,
    },
}

fn rd32(b: &[u8], off: usize) -> Option<u32> {
    let s = b.get(off..off.checked_add(4)?)?;
    Some(u32::from_ne_bytes(s.try_into().ok()?))
}

fn rd16(b: &[u8], off: usize) -> Option<u16> {
    let s = b.get(off..off.checked_add(2)?)?;
    Some(u16::from_ne_bytes(s.try_into().ok()?))
}

/// One received packet of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxPacket<'a> {
    /// The captured bytes (`tp_snaplen` of them, from the MAC header on).
    pub data: &'a [u8],
    /// The length on the wire (`tp_len`); more than `data.len()` when the frame was cut.
    pub wire_len: u32,
}

/// The packets of one retired TPACKET_V3 RX block, parsed lazily; the first malformed packet
/// yields an error and ends the iteration.
#[derive(Debug)]
pub struct RxBlock<'a> {
    block: &'a [u8],
    left: u32,
    offset: usize,
    index: u32,
}

/// Parses the header of `block` (one whole block of the RX ring, header included).
pub fn rx_block(block: &[u8]) -> Result<RxBlock<'_>, RingError> {
    if block.len() < BLOCK_HDR_LEN {
        return Err(RingError::ShortBlock(block.len()));
    }
    let short = || RingError::ShortBlock(block.len());
    let used = rd32(block, BLK_LEN).ok_or_else(short)?;
    if used as usize > block.len() {
        return Err(RingError::BlockLength {
            claimed: used,
            size: block.len(),
        });
    }
    let block = &block[..used as usize];
    let num = rd32(block, NUM_PKTS).ok_or_else(short)?;
    if num as usize > block.len() / HDR3_LEN {
        return Err(RingError::TooManyPackets(num));
    }
    let first = rd32(block, OFFSET_TO_FIRST_PKT).ok_or_else(short)? as usize;
    Ok(RxBlock {
        block,
        left: num,
        offset: first,
        index: 0,
    })
}

impl<'a> RxBlock<'a> {
    fn parse_one(&mut self) -> Result<RxPacket<'a>, RingError> {
        let (b, off, index) = (self.block, self.offset, self.index);
        let outside = RingError::HeaderOutside {
            index,
            offset: off,
            used: b.len(),
        };
        if off < BLOCK_HDR_LEN || off.checked_add(HDR3_LEN).is_none_or(|e| e > b.len()) {
            return Err(outside);
        }
        let (Some(next), Some(snaplen), Some(wire_len), Some(mac)) = (
            rd32(b, off + HDR3_NEXT),
            rd32(b, off + HDR3_SNAPLEN),
            rd32(b, off + HDR3_LEN_FIELD),
            rd16(b, off + HDR3_MAC),
        ) else {
            return Err(outside);
        };
        let data_outside = RingError::DataOutside {
            index,
            mac,
            snaplen,
        };
        let end_rel = (mac as usize).checked_add(snaplen as usize);
        let data = match end_rel.and_then(|e| off.checked_add(e)) {
            Some(end) if (mac as usize) >= HDR3_LEN && end <= b.len() => {
                &b[off + mac as usize..end]
            }
            _ => return Err(data_outside),
        };
        self.left -= 1;
        self.index += 1;
        if self.left > 0 {
            // The next header follows this packet's data; anything else would overlap it.
            if end_rel.is_none_or(|e| (next as usize) < e) {
                return Err(RingError::BadNext { index, next });
            }
            self.offset = off.saturating_add(next as usize);
        }
        Ok(RxPacket { data, wire_len })
    }
}

impl<'a> Iterator for RxBlock<'a> {
    type Item = Result<RxPacket<'a>, RingError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let r = self.parse_one();
        if r.is_err() {
            self.left = 0;
        }
        Some(r)
    }
}

/// The state of a TX ring frame, from its `tp_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxSlot {
    /// Free for user space to fill (`TP_STATUS_AVAILABLE`).
    Free,
    /// Requested or being sent: still the kernel's.
    Busy,
    /// The kernel refused the frame (`TP_STATUS_WRONG_FORMAT`).
    Rejected,
}

/// Classifies a TX frame's `tp_status` (unknown bits, such as timestamp flags, are ignored).
pub fn tx_slot(status: u32) -> TxSlot {
    if status & TP_STATUS_WRONG_FORMAT != 0 {
        TxSlot::Rejected
    } else if status & (TP_STATUS_SEND_REQUEST | TP_STATUS_SENDING) != 0 {
        TxSlot::Busy
    } else {
        TxSlot::Free
    }
}

/// The status word that hands a filled TX frame to the kernel.
pub const TX_SEND_REQUEST: u32 = TP_STATUS_SEND_REQUEST;

/// Where the fields of a TX ring frame header lie, for the ring's TPACKET version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxLayout {
    /// The TPACKET version (`TPACKET_V3` or `TPACKET_V2`).
    pub version: libc::c_int,
    /// Offset of `tp_status`.
    pub status: usize,
    /// Offset of `tp_len`.
    pub len: usize,
    /// Offset of the frame data (`TPACKET_ALIGN(sizeof(header))`: the kernel's default
    /// without PACKET_TX_HAS_OFF).
    pub data: usize,
}

/// `struct tpacket3_hdr` frames (kernels 4.11 on); `tp_next_offset` (offset 0) must be 0.
pub const TX_V3: TxLayout = TxLayout {
    version: TPACKET_V3,
    status: 20,
    len: 16,
    data: HDR3_LEN,
};

/// `struct tpacket2_hdr` frames.
pub const TX_V2: TxLayout = TxLayout {
    version: TPACKET_V2,
    status: 0,
    len: 4,
    data: 32,
};

#[cfg(test)]
mod tests {
    use super::*;

    const _: () = assert!(HDR3_LEN == std::mem::size_of::<libc::tpacket3_hdr>());
    const _: () = assert!(TX_V2.data == std::mem::size_of::<libc::tpacket2_hdr>());
    const _: () = assert!(BLOCK_HDR_LEN == std::mem::size_of::<libc::tpacket_block_desc>());

    fn put32(b: &mut [u8], off: usize, v: u32) {
        b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    }

    /// A block as the kernel writes it: `frames` packed one after another, 16-byte aligned.
    fn block(size: usize, frames: &[&[u8]]) -> Vec<u8> {
        let mut b = vec![0u8; size];
        let mut off = BLOCK_HDR_LEN;
        put32(&mut b, OFFSET_TO_FIRST_PKT, off as u32);
        put32(&mut b, NUM_PKTS, frames.len() as u32);
        put32(&mut b, BLOCK_STATUS, TP_STATUS_USER);
        for (i, f) in frames.iter().enumerate() {
            let mac = 64usize;
            let next = (mac + f.len()).next_multiple_of(16);
            let last = i + 1 == frames.len();
            put32(&mut b, off + HDR3_NEXT, if last { 0 } else { next as u32 });
            put32(&mut b, off + HDR3_SNAPLEN, f.len() as u32);
            put32(&mut b, off + HDR3_LEN_FIELD, f.len() as u32);
            b[off + HDR3_MAC..off + HDR3_MAC + 2].copy_from_slice(&(mac as u16).to_ne_bytes());
            b[off + mac..off + mac + f.len()].copy_from_slice(f);
            off += next;
        }
        put32(&mut b, BLK_LEN, off as u32);
        b
    }

    fn packets(b: &[u8]) -> Result<Vec<Vec<u8>>, RingError> {
        rx_block(b)?.map(|p| p.map(|p| p.data.to_vec())).collect()
    }

    #[test]
    fn well_formed_block_yields_its_packets() {
        let b = block(4096, &[b"first frame", &[7u8; 100], b"x"]);
        let p = packets(&b).unwrap();
        assert_eq!(
            p,
            vec![b"first frame".to_vec(), vec![7u8; 100], b"x".to_vec()]
        );
        assert_eq!(packets(&block(4096, &[])).unwrap(), Vec::<Vec<u8>>::new());
    }

    #[test]
    fn hostile_block_headers_are_errors() {
        assert_eq!(packets(&[0u8; 20]), Err(RingError::ShortBlock(20)));
        let mut b = block(4096, &[b"abc"]);
        put32(&mut b, BLK_LEN, 8192);
        assert!(matches!(
            packets(&b),
            Err(RingError::BlockLength { claimed: 8192, .. })
        ));
        let mut b = block(4096, &[b"abc"]);
        put32(&mut b, NUM_PKTS, u32::MAX);
        assert_eq!(packets(&b), Err(RingError::TooManyPackets(u32::MAX)));
        for first in [0u32, 4090, u32::MAX] {
            let mut b = block(4096, &[b"abc"]);
            put32(&mut b, OFFSET_TO_FIRST_PKT, first);
            assert!(matches!(
                packets(&b),
                Err(RingError::HeaderOutside { index: 0, .. })
            ));
        }
    }

    #[test]
    fn hostile_packet_lengths_and_offsets_are_errors() {
        let off = BLOCK_HDR_LEN;
        for snaplen in [5000u32, u32::MAX, u32::MAX - 63] {
            let mut b = block(4096, &[b"abc"]);
            put32(&mut b, off + HDR3_SNAPLEN, snaplen);
            assert!(
                matches!(packets(&b), Err(RingError::DataOutside { .. })),
                "{snaplen}"
            );
        }
        // Data overlapping its own header.
        let mut b = block(4096, &[b"abc"]);
        b[off + HDR3_MAC..off + HDR3_MAC + 2].copy_from_slice(&8u16.to_ne_bytes());
        assert!(matches!(
            packets(&b),
            Err(RingError::DataOutside { mac: 8, .. })
        ));
        // A next offset of 0 (a loop) or into the packet's own data; one past the block.
        for next in [0u32, 10] {
            let mut b = block(4096, &[b"abc", b"def"]);
            put32(&mut b, off + HDR3_NEXT, next);
            let mut it = rx_block(&b).unwrap();
            assert_eq!(it.next(), Some(Err(RingError::BadNext { index: 0, next })));
            assert_eq!(it.next(), None, "iteration ends at the first error");
        }
        let mut b = block(4096, &[b"abc", b"def"]);
        put32(&mut b, off + HDR3_NEXT, u32::MAX);
        let r: Vec<_> = rx_block(&b).unwrap().collect();
        assert!(r[0].is_ok());
        assert!(matches!(
            r[1],
            Err(RingError::HeaderOutside { index: 1, .. })
        ));
    }

    #[test]
    fn truncated_frames_report_their_wire_length() {
        let off = BLOCK_HDR_LEN;
        let mut b = block(4096, &[b"abcdef"]);
        put32(&mut b, off + HDR3_LEN_FIELD, 1514);
        let p = rx_block(&b).unwrap().next().unwrap().unwrap();
        assert_eq!((p.data, p.wire_len), (&b"abcdef"[..], 1514));
    }

    #[test]
    fn tx_status_words_classify() {
        assert_eq!(tx_slot(0), TxSlot::Free);
        assert_eq!(
            tx_slot(1 << 31),
            TxSlot::Free,
            "timestamp flags are not ownership"
        );
        assert_eq!(tx_slot(TP_STATUS_SEND_REQUEST), TxSlot::Busy);
        assert_eq!(tx_slot(TP_STATUS_SENDING), TxSlot::Busy);
        assert_eq!(tx_slot(TP_STATUS_WRONG_FORMAT | 1), TxSlot::Rejected);
        assert_eq!(tx_slot(u32::MAX), TxSlot::Rejected);
    }
}
