//! Virtio PCI vendor capabilities (virtio 1.2 §4.1.4): where the common, notify, ISR and
//! device configuration structures live inside the device's BARs.

use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// PCI capability id of a vendor-specific capability (virtio uses it).
pub const PCI_CAP_ID_VNDR: u8 = 0x09;

/// `struct virtio_pci_cap` as it sits in PCI configuration space.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct VirtioPciCapRaw {
    /// Generic PCI field: 0x09.
    pub cap_vndr: u8,
    /// Generic PCI field: next capability pointer.
    pub cap_next: u8,
    /// Length of this capability structure.
    pub cap_len: u8,
    /// Which structure this is (see [`CfgType`]).
    pub cfg_type: u8,
    /// BAR index holding the structure.
    pub bar: u8,
    /// Multiple capabilities of one type are told apart by this.
    pub id: u8,
    /// Padding.
    pub padding: [u8; 2],
    /// Offset of the structure within the BAR.
    pub offset: U32,
    /// Length of the structure in bytes.
    pub length: U32,
}

/// Size of [`VirtioPciCapRaw`] in bytes.
pub const VIRTIO_PCI_CAP_LEN: usize = 16;
/// Offset of `notify_off_multiplier` inside a notify capability.
pub const NOTIFY_OFF_MULTIPLIER_OFFSET: u16 = 16;

/// The virtio-pci configuration structure types this driver uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CfgType {
    /// Common configuration (feature bits, status, queues).
    Common = 1,
    /// Notification area (queue doorbells).
    Notify = 2,
    /// ISR status byte.
    Isr = 3,
    /// Device-specific configuration (MAC, status, MTU for net).
    Device = 4,
}

impl CfgType {
    /// Maps the raw `cfg_type` byte; `None` for PCI-cfg access, shared memory and unknown types.
    pub fn from_raw(v: u8) -> Option<CfgType> {
        match v {
            1 => Some(CfgType::Common),
            2 => Some(CfgType::Notify),
            3 => Some(CfgType::Isr),
            4 => Some(CfgType::Device),
            _ => None,
        }
    }
}

/// One located structure: which BAR, where in it and how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapLocation {
    /// BAR index (0..=5).
    pub bar: u8,
    /// Byte offset of the structure in that BAR.
    pub offset: u32,
    /// Length of the structure in bytes.
    pub length: u32,
}

/// All four structures of a modern virtio-pci device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtioPciLayout {
    /// Common configuration.
    pub common: CapLocation,
    /// Notification area.
    pub notify: CapLocation,
    /// Queue doorbell stride multiplier from the notify capability.
    pub notify_off_multiplier: u32,
    /// ISR status.
    pub isr: CapLocation,
    /// Device-specific configuration (optional in the spec, required for net here).
    pub device: Option<CapLocation>,
}

/// Why the capability walk failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapError {
    /// A required structure is missing: not a modern (virtio 1.x) device.
    #[error("no virtio-pci {0:?} capability: the device is not a modern virtio 1.x device (use disable-legacy=on / a virtio 1.x device)")]
    Missing(CfgType),
    /// A capability is shorter than the structure it must hold.
    #[error("virtio-pci {kind:?} capability is {len} bytes, shorter than the {need} the spec requires: malformed device")]
    TooShort {
        /// The structure.
        kind: CfgType,
        /// `cap_len` read.
        len: u8,
        /// Minimum length.
        need: u8,
    },
    /// A structure's offset in its BAR is not aligned for the accesses the driver makes there.
    #[error("virtio-pci {kind:?} capability places its structure at BAR offset {offset:#x}, not {align}-byte aligned as the spec requires (unaligned register access is undefined): malformed device")]
    Unaligned {
        /// The structure.
        kind: CfgType,
        /// The offset read.
        offset: u32,
        /// The alignment required.
        align: u32,
    },
    /// The notify capability's `notify_off_multiplier` would put doorbells at odd offsets.
    #[error("virtio-pci Notify capability has notify_off_multiplier {0}, neither 0 nor an even power of two as the spec requires (doorbells would be unaligned): malformed device")]
    BadNotifyMultiplier(u32),
    /// A capability runs past the end of PCI configuration space.
    #[error("virtio-pci capability at config offset {0:#x} runs past the end of configuration space: malformed device")]
    OutsideConfigSpace(u16),
}

/// Alignment the spec requires of each structure's BAR offset: the common and device
/// configuration hold 32-bit fields (4), the notify area 16-bit doorbells (2), ISR a byte.
pub fn required_alignment(kind: CfgType) -> u32 {
    match kind {
        CfgType::Common | CfgType::Device => 4,
        CfgType::Notify => 2,
        CfgType::Isr => 1,
    }
}

/// Minimum length of the common configuration structure (up to `queue_device`).
pub const COMMON_CFG_MIN_LEN: u32 = 0x38;

/// Walks vendor capabilities. `caps` are (id, offset) pairs from the standard list; `read`
/// reads `buf.len()` bytes of config space at an offset. The first capability of each type
/// wins, as the spec asks.
pub fn parse_layout<E>(
    caps: impl IntoIterator<Item = (u8, u16)>,
    mut read: impl FnMut(u16, &mut [u8]) -> Result<(), E>,
) -> Result<Result<VirtioPciLayout, CapError>, E> {
    let mut found = Found::default();
    for (id, off) in caps {
        if id != PCI_CAP_ID_VNDR {
            continue;
        }
        if off.checked_add(VIRTIO_PCI_CAP_LEN as u16).is_none() {
            return Ok(Err(CapError::OutsideConfigSpace(off)));
        }
        let mut raw = [0u8; VIRTIO_PCI_CAP_LEN];
        read(off, &mut raw)?;
        let cap = VirtioPciCapRaw::read_from_bytes(&raw[..]).expect("16-byte buffer");
        let Some(kind) = CfgType::from_raw(cap.cfg_type) else {
            continue;
        };
        let slot = found.slot(kind);
        if slot.is_some() {
            continue;
        }
        if cap.bar > 5 {
            // Reserved BAR values: the spec says ignore the capability.
            continue;
        }
        let loc = match locate(kind, &cap) {
            Ok(loc) => loc,
            Err(e) => return Ok(Err(e)),
        };
        let mult = if kind == CfgType::Notify {
            match notify_multiplier(off, &mut read)? {
                Ok(m) => m,
                Err(e) => return Ok(Err(e)),
            }
        } else {
            0
        };
        *slot = Some((loc, mult));
    }
    Ok(found.layout())
}

/// The first capability of each type seen so far, with its notify multiplier (0 but for
/// Notify).
#[derive(Default)]
struct Found {
    common: Option<(CapLocation, u32)>,
    notify: Option<(CapLocation, u32)>,
    isr: Option<(CapLocation, u32)>,
    device: Option<(CapLocation, u32)>,
}

impl Found {
    /// The entry of a structure type.
    fn slot(&mut self, kind: CfgType) -> &mut Option<(CapLocation, u32)> {
        match kind {
            CfgType::Common => &mut self.common,
            CfgType::Notify => &mut self.notify,
            CfgType::Isr => &mut self.isr,
            CfgType::Device => &mut self.device,
        }
    }

    /// The layout, when the required structures were all found.
    fn layout(self) -> Result<VirtioPciLayout, CapError> {
        let Some((common, _)) = self.common else {
            return Err(CapError::Missing(CfgType::Common));
        };
        let Some((notify, notify_off_multiplier)) = self.notify else {
            return Err(CapError::Missing(CfgType::Notify));
        };
        let Some((isr, _)) = self.isr else {
            return Err(CapError::Missing(CfgType::Isr));
        };
        Ok(VirtioPciLayout {
            common,
            notify,
            notify_off_multiplier,
            isr,
            device: self.device.map(|d| d.0),
        })
    }
}

/// Where a capability places its structure, checked for the capability's length and the
/// structure's alignment.
fn locate(kind: CfgType, cap: &VirtioPciCapRaw) -> Result<CapLocation, CapError> {
    let need = if kind == CfgType::Notify { 20 } else { 16 };
    if cap.cap_len < need {
        return Err(CapError::TooShort {
            kind,
            len: cap.cap_len,
            need,
        });
    }
    let loc = CapLocation {
        bar: cap.bar,
        offset: cap.offset.get(),
        length: cap.length.get(),
    };
    let align = required_alignment(kind);
    if loc.offset % align != 0 {
        return Err(CapError::Unaligned {
            kind,
            offset: loc.offset,
            align,
        });
    }
    Ok(loc)
}

/// The `notify_off_multiplier` of the notify capability at config offset `off`: 0 or an
/// even power of two.
fn notify_multiplier<E>(
    off: u16,
    read: &mut impl FnMut(u16, &mut [u8]) -> Result<(), E>,
) -> Result<Result<u32, CapError>, E> {
    let Some(at) = off.checked_add(NOTIFY_OFF_MULTIPLIER_OFFSET) else {
        return Ok(Err(CapError::OutsideConfigSpace(off)));
    };
    let mut m = [0u8; 4];
    read(at, &mut m)?;
    let m = u32::from_le_bytes(m);
    if m != 0 && (m % 2 != 0 || !m.is_power_of_two()) {
        return Ok(Err(CapError::BadNotifyMultiplier(m)));
    }
    Ok(Ok(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a fake config space with caps at 0x40, 0x50, 0x64, 0x74, 0x84.
    fn fake_space() -> (Vec<u8>, Vec<(u8, u16)>) {
        let mut cs = vec![0u8; 256];
        let mut caps = vec![];
        let mut put = |off: usize, cfg_type: u8, bar: u8, offset: u32, len: u32, cap_len: u8| {
            cs[off] = PCI_CAP_ID_VNDR;
            cs[off + 2] = cap_len;
            cs[off + 3] = cfg_type;
            cs[off + 4] = bar;
            cs[off + 8..off + 12].copy_from_slice(&offset.to_le_bytes());
            cs[off + 12..off + 16].copy_from_slice(&len.to_le_bytes());
            caps.push((PCI_CAP_ID_VNDR, off as u16));
        };
        put(0x40, 1, 4, 0x0, 0x1000, 16);
        put(0x50, 3, 4, 0x1000, 0x1000, 16);
        put(0x60, 4, 4, 0x2000, 0x1000, 16);
        put(0x70, 2, 4, 0x3000, 0x1000, 20);
        put(0x84, 1, 2, 0x9000, 0x1000, 16); // second common cap: ignored
        cs[0x80..0x84].copy_from_slice(&4u32.to_le_bytes());
        caps.insert(0, (0x11, 0x98)); // MSI-X: not vendor, skipped
        (cs, caps)
    }

    fn reader(cs: &[u8]) -> impl FnMut(u16, &mut [u8]) -> Result<(), ()> + '_ {
        move |off, buf| {
            let o = off as usize;
            buf.copy_from_slice(cs.get(o..o + buf.len()).ok_or(())?);
            Ok(())
        }
    }

    #[test]
    fn finds_all_four_first_wins() {
        let (cs, caps) = fake_space();
        let l = parse_layout(caps, reader(&cs)).unwrap().unwrap();
        assert_eq!(
            l.common,
            CapLocation {
                bar: 4,
                offset: 0,
                length: 0x1000
            }
        );
        assert_eq!(l.isr.offset, 0x1000);
        assert_eq!(l.device.unwrap().offset, 0x2000);
        assert_eq!(l.notify.offset, 0x3000);
        assert_eq!(l.notify_off_multiplier, 4);
    }

    #[test]
    fn missing_notify_is_named() {
        let (mut cs, caps) = fake_space();
        cs[0x73] = 8; // shared-memory type: not a notify cap any more
        let e = parse_layout(caps, reader(&cs)).unwrap().unwrap_err();
        assert_eq!(e, CapError::Missing(CfgType::Notify));
        assert!(e.to_string().contains("modern virtio 1.x"));
    }

    #[test]
    fn short_notify_cap_is_refused() {
        let (mut cs, caps) = fake_space();
        cs[0x72] = 16;
        let e = parse_layout(caps, reader(&cs)).unwrap().unwrap_err();
        assert!(matches!(
            e,
            CapError::TooShort {
                kind: CfgType::Notify,
                len: 16,
                need: 20
            }
        ));
    }

    #[test]
    fn unaligned_structure_offsets_are_refused_naming_the_capability() {
        // (config offset of the cap's BAR-offset field, kind, bad offset, alignment)
        for (at, kind, bad, align) in [
            (0x48, CfgType::Common, 0x2u32, 4u32),
            (0x68, CfgType::Device, 0x2001, 4),
            (0x78, CfgType::Notify, 0x3001, 2),
        ] {
            let (mut cs, caps) = fake_space();
            cs[at..at + 4].copy_from_slice(&bad.to_le_bytes());
            let e = parse_layout(caps, reader(&cs)).unwrap().unwrap_err();
            assert_eq!(
                e,
                CapError::Unaligned {
                    kind,
                    offset: bad,
                    align
                }
            );
            assert!(
                e.to_string().contains(&format!("{kind:?} capability")),
                "{e}"
            );
        }
        // ISR is a byte: any offset will do.
        let (mut cs, caps) = fake_space();
        cs[0x58..0x5c].copy_from_slice(&0x1003u32.to_le_bytes());
        assert_eq!(
            parse_layout(caps, reader(&cs)).unwrap().unwrap().isr.offset,
            0x1003
        );
    }

    #[test]
    fn odd_notify_multiplier_is_refused() {
        for bad in [1u32, 3, 6, 0x8000_0001] {
            let (mut cs, caps) = fake_space();
            cs[0x80..0x84].copy_from_slice(&bad.to_le_bytes());
            let e = parse_layout(caps, reader(&cs)).unwrap().unwrap_err();
            assert_eq!(e, CapError::BadNotifyMultiplier(bad));
            assert!(e.to_string().contains("notify_off_multiplier"), "{e}");
        }
        for good in [0u32, 2, 4, 0x1000] {
            let (mut cs, caps) = fake_space();
            cs[0x80..0x84].copy_from_slice(&good.to_le_bytes());
            let l = parse_layout(caps, reader(&cs)).unwrap().unwrap();
            assert_eq!(l.notify_off_multiplier, good);
        }
    }

    #[test]
    fn capability_at_the_end_of_config_space_is_refused() {
        let e = parse_layout([(PCI_CAP_ID_VNDR, 0xfffc)], |_, _| Ok::<(), ()>(()))
            .unwrap()
            .unwrap_err();
        assert_eq!(e, CapError::OutsideConfigSpace(0xfffc));
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::fuzz_cases::config())]

        /// Fuzz target `fuzz_capability_list`: any configuration-space bytes (optionally
        /// seeded with a valid layout), any capability pointers: never a panic or a read
        /// outside config space; an accepted layout has every structure in BAR 0..=5, aligned
        /// as the spec requires, with a valid notify multiplier.
        #[test]
        fn fuzz_capability_list(
            seed_valid in any::<bool>(),
            pokes in proptest::collection::vec((0usize..256, any::<u8>()), 0..24),
            noise in proptest::collection::vec(any::<u8>(), 256),
            ptrs in proptest::collection::vec((any::<u8>(), 0u16..260), 0..8),
        ) {
            let (mut cs, mut caps) = if seed_valid { fake_space() } else { (noise, vec![]) };
            for (at, v) in pokes {
                cs[at] = v;
            }
            caps.extend(ptrs.iter().map(|&(id, off)| (id | (PCI_CAP_ID_VNDR * (id & 1)), off)));
            let r = parse_layout(caps, reader(&cs));
            if let Ok(Ok(l)) = r {
                let mut all = vec![(CfgType::Common, l.common), (CfgType::Notify, l.notify), (CfgType::Isr, l.isr)];
                all.extend(l.device.map(|d| (CfgType::Device, d)));
                for (kind, loc) in all {
                    prop_assert!(loc.bar <= 5);
                    prop_assert_eq!(loc.offset % required_alignment(kind), 0);
                }
                let m = l.notify_off_multiplier;
                prop_assert!(m == 0 || (m % 2 == 0 && m.is_power_of_two()));
            }
        }
    }

    #[test]
    fn read_errors_propagate() {
        let (_, caps) = fake_space();
        let r = parse_layout(caps, |_, _| Err::<(), _>("gone"));
        assert_eq!(r.unwrap_err(), "gone");
    }
}
