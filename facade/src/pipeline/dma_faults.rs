//! The post-run IOMMU fault check of `ubdirect pipeline` and `ubdirect perf`: a device DMA into
//! an IOVA its domain does not map may complete with success (QEMU's VT-d does so) and leave
//! only a kernel log record; a run that saw one has lost its direct path and must say so.

use std::fmt;
use std::time::Duration;

use ubdirect_core::PciAddress;
use ubdirect_diag::kmsg::{IommuFault, Kmsg, FAULT_MEANING};

/// At most this many fault records are quoted in an error; the rest are counted.
const QUOTED: usize = 8;

/// Watches the kernel log for IOMMU faults of some devices from [`DmaFaultWatch::start`] to
/// [`DmaFaultWatch::finish`]. Slow path only: one open at the start, a few reads at the end.
#[derive(Debug)]
pub struct DmaFaultWatch {
    kmsg: Option<Kmsg>,
    devices: Vec<PciAddress>,
}

impl DmaFaultWatch {
    /// Remember where the kernel log ends now. When /dev/kmsg cannot be read (not root,
    /// kernel.dmesg_restrict) the run goes on with a warning that faults cannot be detected.
    pub fn start(devices: &[PciAddress]) -> DmaFaultWatch {
        let kmsg = if devices.is_empty() {
            None
        } else {
            Kmsg::from_now().inspect_err(|e| tracing::warn!("{e}")).ok()
        };
        DmaFaultWatch {
            kmsg,
            devices: devices.to_vec(),
        }
    }

    /// The faults of the watched devices logged since [`DmaFaultWatch::start`], as an error
    /// naming them; `Ok` when there were none or the log could not be read (warned then).
    pub fn finish(self) -> Result<(), DmaFaults> {
        let Some(mut kmsg) = self.kmsg else {
            return Ok(());
        };
        // The fault interrupt may log a moment after the last completion.
        std::thread::sleep(Duration::from_millis(100));
        match kmsg.faults_for(&self.devices) {
            Ok(f) if f.is_empty() => Ok(()),
            Ok(faults) => Err(DmaFaults { faults }),
            Err(e) => {
                tracing::warn!("{e}");
                Ok(())
            }
        }
    }
}

/// IOMMU fault records logged for the run's devices: the direct path is broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmaFaults {
    /// The records, oldest first.
    pub faults: Vec<IommuFault>,
}

impl fmt::Display for DmaFaults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut devs: Vec<String> = self.faults.iter().map(|x| x.device.to_string()).collect();
        devs.dedup();
        write!(
            f,
            "the kernel logged {} IOMMU DMA fault(s) for {} during the run: {FAULT_MEANING}",
            self.faults.len(),
            devs.join(", ")
        )?;
        for x in self.faults.iter().take(QUOTED) {
            write!(f, "\n  kernel: {}", x.line)?;
        }
        if self.faults.len() > QUOTED {
            write!(f, "\n  ... and {} more", self.faults.len() - QUOTED)?;
        }
        Ok(())
    }
}

impl std::error::Error for DmaFaults {}

#[cfg(test)]
mod tests {
    use super::*;
    use ubdirect_diag::kmsg::parse_iommu_fault;

    #[test]
    fn the_error_quotes_the_records_and_says_what_they_mean() {
        let line = |a: u64| {
            format!("DMAR: [DMA Write NO_PASID] Request device [00:04.0] fault addr {a:#x} [fault reason 0x05] PTE Write access is not set")
        };
        let faults: Vec<_> = (0..10)
            .map(|i| parse_iommu_fault(&line(0x1000 * i)).unwrap())
            .collect();
        let s = DmaFaults { faults }.to_string();
        assert!(
            s.contains("10 IOMMU DMA fault(s) for 0000:00:04.0 during the run"),
            "{s}"
        );
        assert!(s.contains("the direct path is broken"), "{s}");
        assert!(s.contains("fault addr 0x7000"), "{s}");
        assert!(!s.contains("fault addr 0x8000"), "only 8 quoted: {s}");
        assert!(s.ends_with("... and 2 more"), "{s}");
    }

    #[test]
    fn no_devices_means_nothing_to_watch() {
        assert!(DmaFaultWatch::start(&[]).finish().is_ok());
    }
}
