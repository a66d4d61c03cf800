//! PCIe link speed and width, as sysfs reports them (`current_link_speed`, `max_link_width`, ...).

use std::path::Path;

use serde::Serialize;

use super::sysfs::read_opt;
use super::TopologyError;

/// A PCIe link: what it runs at now and what it could run at. Each field is `None` when the
/// device has no such attribute (not PCIe, or an emulated root-bus device) or reports "Unknown".
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LinkInfo {
    /// Current speed in GT/s.
    pub current_speed_gts: Option<f32>,
    /// Maximum speed in GT/s.
    pub max_speed_gts: Option<f32>,
    /// Current width (lanes).
    pub current_width: Option<u32>,
    /// Maximum width (lanes).
    pub max_width: Option<u32>,
}

/// Parse a sysfs link speed: `"8.0 GT/s PCIe"`, `"2.5 GT/s"`, `"5 GT/s"`; `None` for
/// `"Unknown"`, an empty string or anything without a positive number of GT/s.
pub fn parse_link_speed(s: &str) -> Option<f32> {
    let s = s.trim();
    let num = s.split_whitespace().next()?;
    let rest = s[num.len()..].trim_start();
    if !rest.starts_with("GT/s") {
        return None;
    }
    let v: f32 = num.parse().ok()?;
    (v.is_finite() && v > 0.0).then_some(v)
}

/// Parse a sysfs link width: `"16"`, `"x16"`; `None` for 0, 255 (the kernel's "unknown", seen
/// on emulated root-bus devices), anything above x32, "Unknown" or junk.
pub fn parse_link_width(s: &str) -> Option<u32> {
    let s = s.trim();
    let s = s.strip_prefix('x').unwrap_or(s);
    s.parse::<u32>().ok().filter(|w| (1..=32).contains(w))
}

/// The PCIe generation of a speed in GT/s (2.5 -> 1, 5 -> 2, 8 -> 3, 16 -> 4, 32 -> 5, 64 -> 6).
pub fn pcie_generation(gts: f32) -> Option<u32> {
    const GENS: [(f32, u32); 6] = [
        (2.5, 1),
        (5.0, 2),
        (8.0, 3),
        (16.0, 4),
        (32.0, 5),
        (64.0, 6),
    ];
    GENS.iter()
        .find(|(s, _)| (gts - s).abs() < 0.05)
        .map(|(_, g)| *g)
}

impl LinkInfo {
    /// Read the four link attributes of the device directory `dir`.
    pub fn read(dir: &Path) -> Result<LinkInfo, TopologyError> {
        let speed = |name: &str| -> Result<Option<f32>, TopologyError> {
            Ok(read_opt(&dir.join(name))?.and_then(|s| parse_link_speed(&s)))
        };
        let width = |name: &str| -> Result<Option<u32>, TopologyError> {
            Ok(read_opt(&dir.join(name))?.and_then(|s| parse_link_width(&s)))
        };
        Ok(LinkInfo {
            current_speed_gts: speed("current_link_speed")?,
            max_speed_gts: speed("max_link_speed")?,
            current_width: width("current_link_width")?,
            max_width: width("max_link_width")?,
        })
    }

    /// True when nothing is known about the link.
    pub fn is_unknown(&self) -> bool {
        *self == LinkInfo::default()
    }

    /// Width below the maximum, e.g. `Some((8, 16))`.
    pub fn width_degraded(&self) -> Option<(u32, u32)> {
        match (self.current_width, self.max_width) {
            (Some(c), Some(m)) if c < m => Some((c, m)),
            _ => None,
        }
    }

    /// Speed below the maximum, e.g. `Some((8.0, 16.0))`.
    pub fn speed_degraded(&self) -> Option<(f32, f32)> {
        match (self.current_speed_gts, self.max_speed_gts) {
            (Some(c), Some(m)) if c + 0.05 < m => Some((c, m)),
            _ => None,
        }
    }

    /// A short form for tables: `8GT/s x4 (max 16GT/s x16)`, `8GT/s x4`, or `-`.
    pub fn summary(&self) -> String {
        fn one(speed: Option<f32>, width: Option<u32>) -> String {
            let s = speed.map_or("?".to_string(), |v| format!("{v}GT/s"));
            let w = width.map_or("x?".to_string(), |w| format!("x{w}"));
            format!("{s} {w}")
        }
        if self.is_unknown() {
            return "-".to_string();
        }
        let cur = one(self.current_speed_gts, self.current_width);
        let max = one(self.max_speed_gts, self.max_width);
        if cur == max {
            cur
        } else {
            format!("{cur} (max {max})")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn speeds_as_kernels_print_them() {
        assert_eq!(parse_link_speed("8.0 GT/s PCIe"), Some(8.0));
        assert_eq!(parse_link_speed("2.5 GT/s PCIe\n"), Some(2.5));
        assert_eq!(parse_link_speed("5 GT/s"), Some(5.0));
        assert_eq!(parse_link_speed("16.0 GT/s PCIe"), Some(16.0));
        assert_eq!(parse_link_speed("Unknown"), None);
        assert_eq!(parse_link_speed("Unknown speed"), None);
        assert_eq!(parse_link_speed(""), None);
        assert_eq!(parse_link_speed("0 GT/s"), None);
        assert_eq!(parse_link_speed("8.0 Gb/s"), None);
        assert_eq!(parse_link_speed("NaN GT/s"), None);
    }

    #[test]
    fn widths() {
        assert_eq!(parse_link_width("16"), Some(16));
        assert_eq!(parse_link_width("x8"), Some(8));
        assert_eq!(parse_link_width("0"), None);
        assert_eq!(parse_link_width("Unknown"), None);
        assert_eq!(parse_link_width("-1"), None);
        assert_eq!(
            parse_link_width("255"),
            None,
            "QEMU root-bus NVMe reports 255"
        );
        assert_eq!(parse_link_width("32"), Some(32));
    }

    #[test]
    fn generations() {
        assert_eq!(pcie_generation(2.5), Some(1));
        assert_eq!(pcie_generation(16.0), Some(4));
        assert_eq!(pcie_generation(3.0), None);
    }

    #[test]
    fn degraded_links() {
        let l = LinkInfo {
            current_speed_gts: Some(8.0),
            max_speed_gts: Some(16.0),
            current_width: Some(8),
            max_width: Some(16),
        };
        assert_eq!(l.width_degraded(), Some((8, 16)));
        assert_eq!(l.speed_degraded(), Some((8.0, 16.0)));
        assert_eq!(l.summary(), "8GT/s x8 (max 16GT/s x16)");
        let full = LinkInfo {
            current_width: Some(16),
            current_speed_gts: Some(16.0),
            ..l
        };
        assert_eq!(full.width_degraded(), None);
        assert_eq!(full.speed_degraded(), None);
        assert_eq!(full.summary(), "16GT/s x16");
        assert_eq!(LinkInfo::default().summary(), "-");
        let half = LinkInfo {
            max_width: None,
            ..l
        };
        assert_eq!(half.width_degraded(), None);
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in ".{0,40}") {
            let _ = parse_link_speed(&s);
            let _ = parse_link_width(&s);
        }

        #[test]
        fn printed_speeds_round_trip(tenths in 1u32..1000) {
            let v = tenths as f32 / 10.0;
            let s = format!("{v:.1} GT/s PCIe");
            let got = parse_link_speed(&s).unwrap();
            prop_assert!((got - v).abs() < 1e-4);
        }
    }
}
