//! BARs from a device's sysfs `resource` file (one `start end flags` line per resource).

use serde::Serialize;

/// `IORESOURCE_IO`: an I/O-port BAR.
const IORESOURCE_IO: u64 = 0x100;
/// `IORESOURCE_MEM`: a memory BAR.
const IORESOURCE_MEM: u64 = 0x200;
/// `IORESOURCE_PREFETCH`: prefetchable memory.
const IORESOURCE_PREFETCH: u64 = 0x2000;
/// `IORESOURCE_MEM_64`: a 64-bit memory BAR.
const IORESOURCE_MEM_64: u64 = 0x0010_0000;

/// One populated BAR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BarInfo {
    /// BAR number, 0..=5.
    pub index: u8,
    /// Bus address of the start (as the kernel assigned it).
    pub start: u64,
    /// Size in bytes.
    pub size: u64,
    /// Memory (true) or I/O port (false) space.
    pub memory: bool,
    /// Prefetchable memory.
    pub prefetchable: bool,
    /// A 64-bit BAR (can sit above 4 GiB).
    pub is_64bit: bool,
}

/// Why a `resource` line could not be understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BarParseError {
    /// 0-based line number.
    pub line: usize,
    /// What was wrong.
    pub what: String,
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.strip_prefix("0x").unwrap_or(s), 16).ok()
}

/// Parse the text of a `resource` file: lines 0..=5 are the BARs (later lines, the ROM and
/// bridge windows, are ignored); unused BARs (all zero) are skipped.
pub fn parse_resource(text: &str) -> Result<Vec<BarInfo>, BarParseError> {
    let mut bars = Vec::new();
    for (i, line) in text.lines().enumerate().take(6) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [s, e, f] = fields[..] else {
            return Err(BarParseError {
                line: i,
                what: format!("expected 3 hex fields, found {line:?}"),
            });
        };
        let (Some(start), Some(end), Some(flags)) = (hex(s), hex(e), hex(f)) else {
            return Err(BarParseError {
                line: i,
                what: format!("not hex: {line:?}"),
            });
        };
        if start == 0 && end == 0 {
            continue;
        }
        if end < start {
            return Err(BarParseError {
                line: i,
                what: format!("end below start: {line:?}"),
            });
        }
        if flags & (IORESOURCE_IO | IORESOURCE_MEM) == 0 {
            continue;
        }
        bars.push(BarInfo {
            index: i as u8,
            start,
            size: (end - start).saturating_add(1),
            memory: flags & IORESOURCE_MEM != 0,
            prefetchable: flags & IORESOURCE_PREFETCH != 0,
            is_64bit: flags & IORESOURCE_MEM_64 != 0,
        });
    }
    Ok(bars)
}

/// A size for people: `64M`, `16K`, `256G`, `4096` (bytes when not a whole KiB).
pub fn human_size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "T"),
        (1 << 30, "G"),
        (1 << 20, "M"),
        (1 << 10, "K"),
    ];
    for (unit, name) in UNITS {
        if bytes >= unit && bytes % unit == 0 {
            return format!("{}{name}", bytes / unit);
        }
    }
    for (unit, name) in UNITS {
        if bytes >= unit {
            return format!("{:.1}{name}", bytes as f64 / unit as f64);
        }
    }
    bytes.to_string()
}

impl BarInfo {
    /// Table form: `2:64M(p64)` (p = prefetchable, 64 = 64-bit, io = I/O ports).
    pub fn summary(&self) -> String {
        let mut flags = String::new();
        if !self.memory {
            flags.push_str("io");
        }
        if self.prefetchable {
            flags.push('p');
        }
        if self.is_64bit {
            flags.push_str("64");
        }
        if flags.is_empty() {
            format!("{}:{}", self.index, human_size(self.size))
        } else {
            format!("{}:{}({flags})", self.index, human_size(self.size))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NVME: &str = "\
0x00000000febf0000 0x00000000febf3fff 0x0000000000140204
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x000000000000c000 0x000000000000c03f 0x0000000000040101
0x00000000febf4000 0x00000000febf4fff 0x0000000000040200
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x00000000a0000000 0x00000000afffffff 0x0000000000000200
";

    #[test]
    fn nvme_like_resource() {
        let bars = parse_resource(NVME).unwrap();
        assert_eq!(bars.len(), 3);
        assert_eq!(bars[0].index, 0);
        assert_eq!(bars[0].size, 16 * 1024);
        assert!(bars[0].memory && bars[0].is_64bit && !bars[0].prefetchable);
        assert_eq!(bars[1].index, 4);
        assert!(!bars[1].memory);
        assert_eq!(bars[1].size, 64);
        assert_eq!(bars[2].index, 5);
        assert_eq!(bars[2].summary(), "5:4K");
        assert_eq!(bars[0].summary(), "0:16K(64)");
        assert_eq!(bars[1].summary(), "4:64(io)");
    }

    #[test]
    fn prefetchable_64bit_bar_above_4g() {
        let text = "0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                    0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                    0x0000008000000000 0x0000008003ffffff 0x000000000014220c\n";
        let bars = parse_resource(text).unwrap();
        assert_eq!(bars.len(), 1);
        assert_eq!(bars[0].index, 2);
        assert_eq!(bars[0].size, 64 << 20);
        assert!(bars[0].prefetchable && bars[0].is_64bit);
        assert_eq!(bars[0].summary(), "2:64M(p64)");
    }

    #[test]
    fn malformed_lines_are_errors() {
        assert_eq!(parse_resource("0x1 0x2\n").unwrap_err().line, 0);
        let e = parse_resource("0x0 0x0 0x0\n0xzz 0x1 0x200\n").unwrap_err();
        assert_eq!(e.line, 1);
        assert!(parse_resource("0x2000 0x1000 0x200\n").is_err());
        assert_eq!(parse_resource("").unwrap(), vec![]);
    }

    #[test]
    fn sizes_for_people() {
        assert_eq!(human_size(64 << 20), "64M");
        assert_eq!(human_size(16 << 30), "16G");
        assert_eq!(human_size(4096), "4K");
        assert_eq!(human_size(100), "100");
        assert_eq!(human_size(1536), "1.5K");
    }

    proptest! {
        #[test]
        fn resource_parse_never_panics(s in "[0-9a-fx \n]{0,200}") {
            let _ = parse_resource(&s);
        }

        #[test]
        fn sizes_round_trip(start in 0u64..(1u64 << 48), size_log in 4u32..40) {
            let size = 1u64 << size_log;
            let line = format!("{:#018x} {:#018x} {:#018x}\n", start, start + size - 1, IORESOURCE_MEM);
            let bars = parse_resource(&line).unwrap();
            prop_assume!(start != 0 || size != 1);
            prop_assert_eq!(bars[0].size, size);
            prop_assert_eq!(bars[0].start, start);
        }
    }
}
