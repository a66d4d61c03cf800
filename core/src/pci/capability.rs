//! The standard PCI capability list walk.

/// One entry of the standard capability list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciCapability {
    /// Capability id (0x05 MSI, 0x09 vendor specific, 0x10 PCIe, 0x11 MSI-X, ...).
    pub id: u8,
    /// Offset of the capability in config space.
    pub offset: u16,
}

/// Config-space status register offset and its "capability list" bit.
const STATUS: u16 = 0x06;
const STATUS_CAP_LIST: u16 = 1 << 4;
/// Capabilities pointer offset.
const CAP_PTR: u16 = 0x34;
/// A loop guard: the 192 bytes after the header hold at most 48 four-byte capabilities.
const MAX_CAPS: usize = 48;

/// Walk the list with `read8`/`read16` config accessors. Stops at a null pointer, a pointer
/// into the header, or a loop; a malformed list ends the walk instead of spinning.
pub(crate) fn walk<E>(
    mut read8: impl FnMut(u16) -> Result<u8, E>,
    mut read16: impl FnMut(u16) -> Result<u16, E>,
) -> Result<Vec<PciCapability>, E> {
    let mut out = Vec::new();
    if read16(STATUS)? & STATUS_CAP_LIST == 0 {
        return Ok(out);
    }
    let mut ptr = u16::from(read8(CAP_PTR)? & 0xfc);
    while ptr >= 0x40 && out.len() < MAX_CAPS {
        if out.iter().any(|c: &PciCapability| c.offset == ptr) {
            break;
        }
        let id = read8(ptr)?;
        out.push(PciCapability { id, offset: ptr });
        ptr = u16::from(read8(ptr + 1)? & 0xfc);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg_with(caps: &[(u8, u8, u8)]) -> [u8; 256] {
        let mut c = [0u8; 256];
        c[STATUS as usize] = STATUS_CAP_LIST as u8;
        if let Some(first) = caps.first() {
            c[CAP_PTR as usize] = first.0;
        }
        for &(at, id, next) in caps {
            c[at as usize] = id;
            c[at as usize + 1] = next;
        }
        c
    }

    fn run(c: &[u8; 256]) -> Vec<PciCapability> {
        walk::<()>(
            |o| Ok(c[o as usize]),
            |o| Ok(u16::from_le_bytes([c[o as usize], c[o as usize + 1]])),
        )
        .unwrap()
    }

    #[test]
    fn walks_the_list() {
        let c = cfg_with(&[(0x40, 0x11, 0x50), (0x50, 0x10, 0x80), (0x80, 0x01, 0)]);
        let v = run(&c);
        assert_eq!(
            v,
            vec![
                PciCapability {
                    id: 0x11,
                    offset: 0x40
                },
                PciCapability {
                    id: 0x10,
                    offset: 0x50
                },
                PciCapability {
                    id: 0x01,
                    offset: 0x80
                },
            ]
        );
    }

    #[test]
    fn loops_and_header_pointers_end_the_walk() {
        let c = cfg_with(&[(0x40, 0x11, 0x50), (0x50, 0x10, 0x40)]);
        assert_eq!(run(&c).len(), 2);
        let c = cfg_with(&[(0x40, 0x11, 0x10)]);
        assert_eq!(run(&c).len(), 1);
        let mut c = cfg_with(&[(0x40, 0x11, 0)]);
        c[STATUS as usize] = 0;
        assert!(run(&c).is_empty());
    }
}
