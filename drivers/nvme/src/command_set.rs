//! The I/O command set of a namespace: the Command Set Identifier (CSI) from the Namespace
//! Identification Descriptor list (Identify CNS 03h, NVMe Base 2.0 5.17.2.3).

use serde::Serialize;

use crate::error::NvmeError;
use crate::spec::identify::IDENTIFY_LEN;

/// Namespace Identification Descriptor type of the Command Set Identifier.
const NIDT_CSI: u8 = 0x04;

/// The I/O command set a namespace is formatted for.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum CommandSet {
    /// The NVM command set (CSI 00h): random reads and writes of logical blocks. A controller
    /// that reports no identifier (before NVMe 1.3, or no CSI descriptor) means this one.
    #[default]
    Nvm,
    /// The Key Value command set (CSI 01h): no logical blocks to read or write.
    KeyValue,
    /// The Zoned Namespace command set (CSI 02h): reads anywhere, writes only sequentially at
    /// each zone's write pointer.
    Zoned,
    /// A command set identifier this driver does not know.
    Other(u8),
}

impl CommandSet {
    /// The command set of a Command Set Identifier.
    pub fn from_csi(csi: u8) -> CommandSet {
        match csi {
            0x00 => CommandSet::Nvm,
            0x01 => CommandSet::KeyValue,
            0x02 => CommandSet::Zoned,
            other => CommandSet::Other(other),
        }
    }

    /// True when any logical block may be written in any order (only the NVM command set).
    pub fn takes_random_writes(self) -> bool {
        self == CommandSet::Nvm
    }
}

impl std::fmt::Display for CommandSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommandSet::Nvm => f.write_str("NVM"),
            CommandSet::KeyValue => f.write_str("Key Value"),
            CommandSet::Zoned => f.write_str("Zoned Namespace"),
            CommandSet::Other(csi) => write!(f, "unknown (CSI {csi:#04x})"),
        }
    }
}

/// The command set named by a Namespace Identification Descriptor list; `None` when the list
/// holds no CSI descriptor. [`NvmeError::DeviceInput`] when a descriptor runs past the page or
/// the CSI descriptor's length is not 1.
pub fn command_set_from_descriptors(
    page: &[u8; IDENTIFY_LEN],
) -> Result<Option<CommandSet>, NvmeError> {
    let mut off = 0usize;
    while off + 4 <= page.len() {
        let (nidt, nidl) = (page[off], page[off + 1] as usize);
        if nidt == 0 {
            return Ok(None);
        }
        let end = off + 4 + nidl;
        if end > page.len() {
            return Err(NvmeError::DeviceInput {
                field: "Namespace Identification Descriptor NIDL",
                value: nidl as u64,
                reason: "runs past the end of the 4096-byte descriptor list",
            });
        }
        if nidt == NIDT_CSI {
            if nidl != 1 {
                return Err(NvmeError::DeviceInput {
                    field: "Command Set Identifier descriptor NIDL",
                    value: nidl as u64,
                    reason: "is not 1 (the identifier is one byte)",
                });
            }
            return Ok(Some(CommandSet::from_csi(page[off + 4])));
        }
        off = end;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(descs: &[(u8, &[u8])]) -> Box<[u8; IDENTIFY_LEN]> {
        let mut p = Box::new([0u8; IDENTIFY_LEN]);
        let mut off = 0;
        for (t, body) in descs {
            p[off] = *t;
            p[off + 1] = body.len() as u8;
            p[off + 4..off + 4 + body.len()].copy_from_slice(body);
            off += 4 + body.len();
        }
        p
    }

    #[test]
    fn the_csi_descriptor_is_found_after_the_others() {
        let p = page(&[(0x01, &[7; 8]), (0x03, &[9; 16]), (0x04, &[0x02])]);
        assert_eq!(
            command_set_from_descriptors(&p).unwrap(),
            Some(CommandSet::Zoned)
        );
        let p = page(&[(0x04, &[0x00])]);
        assert_eq!(
            command_set_from_descriptors(&p).unwrap(),
            Some(CommandSet::Nvm)
        );
        let p = page(&[(0x04, &[0x07])]);
        assert_eq!(
            command_set_from_descriptors(&p).unwrap(),
            Some(CommandSet::Other(7))
        );
    }

    #[test]
    fn a_list_without_a_csi_descriptor_names_no_command_set() {
        assert_eq!(command_set_from_descriptors(&page(&[])).unwrap(), None);
        let p = page(&[(0x03, &[1; 16])]);
        assert_eq!(command_set_from_descriptors(&p).unwrap(), None);
    }

    #[test]
    fn a_descriptor_past_the_page_or_a_long_csi_is_refused() {
        let mut p = Box::new([0u8; IDENTIFY_LEN]);
        // Descriptors of 4 + 252 bytes fill the page up to 4080; the next one overruns it.
        let mut off = 0;
        while off + 256 <= IDENTIFY_LEN - 16 {
            p[off] = 0x05;
            p[off + 1] = 252;
            off += 256;
        }
        p[off] = 0x05;
        p[off + 1] = 255;
        assert!(matches!(
            command_set_from_descriptors(&p),
            Err(NvmeError::DeviceInput { value: 255, .. })
        ));
        let p = page(&[(0x04, &[2, 0])]);
        assert!(matches!(
            command_set_from_descriptors(&p),
            Err(NvmeError::DeviceInput { value: 2, .. })
        ));
    }

    #[test]
    fn only_the_nvm_command_set_takes_random_writes() {
        assert!(CommandSet::Nvm.takes_random_writes());
        for c in [
            CommandSet::Zoned,
            CommandSet::KeyValue,
            CommandSet::Other(9),
        ] {
            assert!(!c.takes_random_writes(), "{c}");
        }
        assert_eq!(CommandSet::Zoned.to_string(), "Zoned Namespace");
    }
}
