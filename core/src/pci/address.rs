//! [`PciAddress`]: a PCI domain:bus:device.function address.

use std::fmt;
use std::str::FromStr;

use crate::error::CoreError;

/// A PCI address. Parses "0000:00:04.0" and "00:04.0" (domain 0); displays "0000:00:04.0".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciAddress {
    /// PCI domain (segment).
    pub domain: u16,
    /// Bus number.
    pub bus: u8,
    /// Device (slot) number, 0..=31.
    pub device: u8,
    /// Function number, 0..=7.
    pub function: u8,
}

impl PciAddress {
    /// The device's sysfs directory, `/sys/bus/pci/devices/<addr>`.
    pub fn sysfs_path(&self) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/sys/bus/pci/devices/{self}"))
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl FromStr for PciAddress {
    type Err = CoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| {
            CoreError::InvalidArgument(format!(
                "bad PCI address {s:?}: {why}; expected DDDD:BB:DD.F or BB:DD.F in hex, e.g. 0000:00:04.0"
            ))
        };
        let (head, function) = s.rsplit_once('.').ok_or_else(|| bad("no '.function'"))?;
        let parts: Vec<&str> = head.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, dev] => (*d, *b, *dev),
            [b, dev] => ("0", *b, *dev),
            _ => return Err(bad("wrong number of ':' fields")),
        };
        let hex = |f: &str, max_digits: usize, what: &str| -> Result<u32, CoreError> {
            if f.is_empty() || f.len() > max_digits {
                return Err(bad(&format!(
                    "{what} field {f:?} must have 1..={max_digits} hex digits"
                )));
            }
            u32::from_str_radix(f, 16).map_err(|_| bad(&format!("{what} field {f:?} is not hex")))
        };
        let domain = hex(domain, 4, "domain")? as u16;
        let bus = hex(bus, 2, "bus")? as u8;
        let device = hex(device, 2, "device")?;
        let function = hex(function, 1, "function")?;
        if device > 31 {
            return Err(bad("device must be 00..1f"));
        }
        if function > 7 {
            return Err(bad("function must be 0..7"));
        }
        Ok(PciAddress {
            domain,
            bus,
            device: device as u8,
            function: function as u8,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_both_forms() {
        let a: PciAddress = "0000:00:04.0".parse().unwrap();
        assert_eq!(
            a,
            PciAddress {
                domain: 0,
                bus: 0,
                device: 4,
                function: 0
            }
        );
        let b: PciAddress = "3a:1f.7".parse().unwrap();
        assert_eq!(
            b,
            PciAddress {
                domain: 0,
                bus: 0x3a,
                device: 0x1f,
                function: 7
            }
        );
        assert_eq!(b.to_string(), "0000:3a:1f.7");
    }

    #[test]
    fn rejects_garbage_with_reason() {
        for (s, why) in [
            ("", "no '.function'"),
            ("00:04", "no '.function'"),
            ("00:20.0", "device must be"),
            ("00:04.8", "function must be"),
            ("0:0:0:0.0", "number of ':'"),
            ("zz:04.0", "not hex"),
            ("00000:00:04.0", "1..=4 hex digits"),
        ] {
            let e = s.parse::<PciAddress>().unwrap_err().to_string();
            assert!(e.contains(why), "{s:?}: {e}");
            assert!(e.contains("0000:00:04.0"), "{e}");
        }
    }

    proptest! {
        #[test]
        fn display_parse_round_trip(d in any::<u16>(), b in any::<u8>(), dev in 0u8..32, f in 0u8..8) {
            let a = PciAddress { domain: d, bus: b, device: dev, function: f };
            prop_assert_eq!(a.to_string().parse::<PciAddress>().unwrap(), a);
        }
    }
}
