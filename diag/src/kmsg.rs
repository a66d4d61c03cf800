//! IOMMU DMA-fault records from the kernel log (`/dev/kmsg`).
//!
//! A device that DMAs to an IOVA not mapped in its IOMMU domain is blocked by the IOMMU, but on
//! some platforms (QEMU's emulated VT-d among them) the device still completes the command with
//! success: the only trace is a kernel log record such as
//! `DMAR: [DMA Write NO_PASID] Request device [00:04.0] fault addr 0x7fe00000 ...` (Intel) or
//! `AMD-Vi: Event logged [IO_PAGE_FAULT device=00:04.0 domain=0x0002 address=0x1000 flags=0x0]`
//! (AMD). [`Kmsg::from_now`] remembers the end of the log at the start of a run;
//! [`Kmsg::faults_for`] returns the fault records logged since for the given devices. Both are
//! slow paths (one open, a few reads), never for the I/O path.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

use ubdirect_core::PciAddress;

/// Which IOMMU logged a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IommuKind {
    /// Intel VT-d (`DMAR:` records).
    IntelDmar,
    /// AMD-Vi (`IO_PAGE_FAULT` events).
    AmdVi,
}

/// One IOMMU fault record of the kernel log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IommuFault {
    /// Which IOMMU logged it.
    pub iommu: IommuKind,
    /// "Read" or "Write" (from the device's side) for Intel records; `None` for AMD ones, which
    /// carry the direction in their flags only.
    pub access: Option<String>,
    /// The requester; the domain is 0 when the record leaves it out.
    pub device: PciAddress,
    /// The faulting IOVA.
    pub addr: u64,
    /// The record's message text, for people.
    pub line: String,
}

impl IommuFault {
    /// True when the record names `dev` (a record without a PCI domain matches any domain).
    pub fn is_for(&self, dev: PciAddress) -> bool {
        let a = self.device;
        (a.domain == dev.domain || a.domain == 0)
            && (a.bus, a.device, a.function) == (dev.bus, dev.device, dev.function)
    }
}

/// What every caller tells people about a fault (the source document's "lost direct path").
pub const FAULT_MEANING: &str = "a device DMAed to an address not mapped in its IOMMU domain: \
the direct path is broken (data did not land where the run thinks it did, even if the device \
reported success); check that every buffer the device is given is registered in the DMA domain";

/// Parse one kernel log message; `None` for anything that is not an IOMMU fault record.
pub fn parse_iommu_fault(line: &str) -> Option<IommuFault> {
    parse_dmar(line).or_else(|| parse_amd_vi(line))
}

/// Intel: `DMAR: [DMA Write NO_PASID] Request device [00:04.0] fault addr 0x7fe00000 ...`
/// (older kernels: `[DMA Read]`, address without `0x`).
fn parse_dmar(line: &str) -> Option<IommuFault> {
    let start = line.find("DMAR: [DMA ")?;
    let rest = &line[start + "DMAR: [DMA ".len()..];
    let access = rest.split_whitespace().next()?.trim_end_matches(']');
    let dev_at = rest.find("Request device [")? + "Request device [".len();
    let device = rest[dev_at..].split(']').next()?.parse().ok()?;
    let addr_at = rest.find("fault addr ")? + "fault addr ".len();
    let addr = parse_hex(rest[addr_at..].split_whitespace().next()?)?;
    Some(IommuFault {
        iommu: IommuKind::IntelDmar,
        access: Some(access.to_string()),
        device,
        addr,
        line: line[start..].to_string(),
    })
}

/// AMD: `AMD-Vi: Event logged [IO_PAGE_FAULT device=00:04.0 domain=0x0002 address=0x1000 ...]`
/// or, when the kernel knows the PCI device, the device in the record's prefix:
/// `vfio-pci 0000:04:00.0: Event logged [IO_PAGE_FAULT domain=0x000e address=0x1000 ...]`.
fn parse_amd_vi(line: &str) -> Option<IommuFault> {
    let at = line.find("[IO_PAGE_FAULT ")?;
    let fields = line[at + "[IO_PAGE_FAULT ".len()..].split(']').next()?;
    let field = |key: &str| {
        fields
            .split_whitespace()
            .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
    };
    let addr = parse_hex(field("address")?)?;
    let device = match field("device") {
        Some(d) => d.parse().ok()?,
        // The dev_printk prefix: "<driver> DDDD:BB:DD.F: Event logged ...".
        None => line[..at]
            .split_whitespace()
            .find_map(|w| w.strip_suffix(':')?.parse().ok())?,
    };
    Some(IommuFault {
        iommu: IommuKind::AmdVi,
        access: None,
        device,
        addr,
        line: line.trim().to_string(),
    })
}

fn parse_hex(s: &str) -> Option<u64> {
    let s = s.trim_end_matches(',');
    let digits = s.strip_prefix("0x").unwrap_or(s);
    u64::from_str_radix(digits, 16).ok()
}

/// Why the kernel log could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KmsgError {
    /// /dev/kmsg could not be opened or read.
    #[error("cannot read the kernel log /dev/kmsg ({what}: {source}): IOMMU DMA faults cannot be detected; run as root, or set kernel.dmesg_restrict=0 / grant CAP_SYSLOG")]
    Unreadable {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A reader of the kernel log records written after it was made.
#[derive(Debug)]
pub struct Kmsg {
    file: File,
    buf: Vec<u8>,
}

impl Kmsg {
    /// Start reading at the end of the kernel log (records already there are skipped).
    pub fn from_now() -> Result<Kmsg, KmsgError> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .map_err(|source| KmsgError::Unreadable {
                what: "open",
                source,
            })?;
        // SAFETY: lseek on a file descriptor we own; /dev/kmsg accepts SEEK_END (skip to the
        // newest record) and touches no memory of ours.
        let rc = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_END) };
        if rc < 0 {
            return Err(KmsgError::Unreadable {
                what: "seek to the end",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Kmsg {
            file,
            buf: vec![0; 8192],
        })
    }

    /// The message text (first line) of every record logged since the last call.
    pub fn new_lines(&mut self) -> Result<Vec<String>, KmsgError> {
        let mut out = Vec::new();
        loop {
            match self.file.read(&mut self.buf) {
                Ok(0) => break,
                // One record per read: "prio,seq,time,flags;message\n continuation...".
                Ok(n) => {
                    let rec = String::from_utf8_lossy(&self.buf[..n]);
                    let msg = rec.split_once(';').map_or(&*rec, |(_, m)| m);
                    out.push(msg.lines().next().unwrap_or("").to_string());
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                // EPIPE: records were overwritten before we read them; the next read goes on
                // with the oldest one left.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(KmsgError::Unreadable {
                        what: "read",
                        source,
                    })
                }
            }
        }
        Ok(out)
    }

    /// IOMMU fault records of any device logged since the last call.
    pub fn iommu_faults(&mut self) -> Result<Vec<IommuFault>, KmsgError> {
        Ok(self
            .new_lines()?
            .iter()
            .filter_map(|l| parse_iommu_fault(l))
            .collect())
    }

    /// IOMMU fault records naming one of `devices`, logged since the last call.
    pub fn faults_for(&mut self, devices: &[PciAddress]) -> Result<Vec<IommuFault>, KmsgError> {
        let mut f = self.iommu_faults()?;
        f.retain(|f| devices.iter().any(|d| f.is_for(*d)));
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> PciAddress {
        s.parse().unwrap()
    }

    #[test]
    fn intel_dmar_records_parse() {
        // As QEMU's VT-d under Linux 6.1 logs a read into an unmapped IOVA.
        let l = "DMAR: [DMA Write NO_PASID] Request device [00:04.0] fault addr 0x7fe00000 [fault reason 0x05] PTE Write access is not set";
        let f = parse_iommu_fault(l).unwrap();
        assert_eq!(f.iommu, IommuKind::IntelDmar);
        assert_eq!(f.access.as_deref(), Some("Write"));
        assert_eq!(f.device, addr("0000:00:04.0"));
        assert_eq!(f.addr, 0x7fe0_0000);
        assert_eq!(f.line, l);
        // Older kernels: no PASID word, address without 0x; a prefix before "DMAR:".
        let l = "dmar_fault: 2 callbacks suppressed DMAR: [DMA Read] Request device [00:05.0] fault addr 1000 [fault reason 06] PTE Read access is not set";
        let f = parse_iommu_fault(l).unwrap();
        assert_eq!(
            (f.access.as_deref(), f.device, f.addr),
            (Some("Read"), addr("00:05.0"), 0x1000)
        );
        assert!(f.line.starts_with("DMAR: [DMA Read]"));
        // With a PCI domain in the requester.
        let l = "DMAR: [DMA Read NO_PASID] Request device [0001:3b:00.0] fault addr 0xffffe000 [fault reason 0x06] PTE Read access is not set";
        assert_eq!(parse_iommu_fault(l).unwrap().device, addr("0001:3b:00.0"));
    }

    #[test]
    fn amd_vi_records_parse() {
        // The IOMMU's own prefix, requester in the event (no PCI device known to the kernel).
        let l = "AMD-Vi: Event logged [IO_PAGE_FAULT device=00:14.0 domain=0x0000 address=0x00000000fdf9103c flags=0x0020]";
        let f = parse_iommu_fault(l).unwrap();
        assert_eq!(f.iommu, IommuKind::AmdVi);
        assert_eq!(f.access, None);
        assert_eq!((f.device, f.addr), (addr("00:14.0"), 0xfdf9_103c));
        // Newer kernels: the IOMMU device prefix and a full address with the segment.
        let l = "iommu ivhd0: AMD-Vi: Event logged [IO_PAGE_FAULT device=0000:04:00.0 domain=0x000e address=0x1f2c4000 flags=0x0050]";
        let f = parse_iommu_fault(l).unwrap();
        assert_eq!((f.device, f.addr), (addr("0000:04:00.0"), 0x1f2c_4000));
        // The PCI device known: its dev_printk prefix names it.
        let l = "vfio-pci 0000:01:00.0: Event logged [IO_PAGE_FAULT domain=0x000c address=0xfff00000 flags=0x0000]";
        let f = parse_iommu_fault(l).unwrap();
        assert_eq!((f.device, f.addr), (addr("0000:01:00.0"), 0xfff0_0000));
    }

    #[test]
    fn other_lines_are_not_faults() {
        for l in [
            "DMAR: IOMMU enabled",
            "DMAR: DRHD: handling fault status reg 2",
            "DMAR: [DMA Write] Request device [00:04.0] fault addr zz",
            "DMAR: [INTR-REMAP] Request device [00:1f.0] fault index 0x0 [fault reason 0x25] Blocked a compatibility format interrupt request",
            "AMD-Vi: Event logged [IO_PAGE_FAULT device=zz domain=0x0000 address=0x1 flags=0x0]",
            "AMD-Vi: Event logged [ILLEGAL_DEV_TABLE_ENTRY device=00:14.0 pasid=0x00000 address=0x1 flags=0x0]",
            "nvme nvme0: pci function 0000:00:04.0",
            "",
        ] {
            assert_eq!(parse_iommu_fault(l), None, "{l}");
        }
    }

    #[test]
    fn faults_match_their_device_only() {
        let l = "DMAR: [DMA Write NO_PASID] Request device [00:04.0] fault addr 0x1000 [fault reason 0x05] PTE Write access is not set";
        let f = parse_iommu_fault(l).unwrap();
        assert!(f.is_for(addr("0000:00:04.0")));
        // The record has no domain: any domain's 00:04.0 matches.
        assert!(f.is_for(addr("0002:00:04.0")));
        assert!(!f.is_for(addr("0000:00:04.1")));
        assert!(!f.is_for(addr("0000:00:05.0")));
        assert!(!f.is_for(addr("0000:01:04.0")));
    }
}
