//! The VFIO device request channel: how the kernel asks a userspace driver to let go of a
//! device it wants to remove (sysfs `remove`, hot-unplug, driver unbind).
//!
//! Without it the kernel logs "No device request channel registered, blocked until released by
//! user" and the removal waits, silently, until the process closes the device. With it, vfio-pci
//! signals an eventfd (VFIO_PCI_REQ_IRQ_INDEX, the same channel QEMU's vfio uses to turn a host
//! unplug into a guest unplug request) when the removal starts, and again every 10 s while it
//! waits; the driver checks the eventfd on its slow paths, stops, and closes the device.

use std::sync::atomic::{AtomicBool, Ordering};

use vfio_bindings::bindings::vfio::VFIO_PCI_REQ_IRQ_INDEX;
use vfio_ioctls::VfioDevice;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::PciAddress;
use crate::error::{CoreError, Result};

/// The eventfd vfio-pci signals when the kernel wants the device back.
#[derive(Debug)]
pub(crate) struct RemovalNotice {
    fd: EventFd,
    /// Set once a request was read: reading the eventfd clears its count, the answer must not.
    seen: AtomicBool,
}

impl RemovalNotice {
    /// Register a fresh eventfd as `dev`'s request trigger (VFIO_DEVICE_SET_IRQS,
    /// DATA_EVENTFD | ACTION_TRIGGER on VFIO_PCI_REQ_IRQ_INDEX, through vfio-ioctls).
    pub(crate) fn register(dev: &VfioDevice, addr: PciAddress) -> Result<RemovalNotice> {
        let count = dev
            .get_irq_info(VFIO_PCI_REQ_IRQ_INDEX)
            .map_or(0, |irq| irq.count);
        RemovalNotice::register_with(addr, count, |fd| {
            if dev.enable_irq(VFIO_PCI_REQ_IRQ_INDEX, vec![fd]).is_err() {
                // vfio-ioctls drops the ioctl's error; errno still holds it.
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }

    /// [`RemovalNotice::register`] for a device opened through its no-IOMMU group.
    pub(crate) fn register_noiommu(
        dev: &crate::vfio::noiommu_group::NoIommuDevice,
        addr: PciAddress,
    ) -> Result<RemovalNotice> {
        let count = dev.irq_count(VFIO_PCI_REQ_IRQ_INDEX);
        RemovalNotice::register_with(addr, count, |fd| {
            dev.set_irq_eventfd(VFIO_PCI_REQ_IRQ_INDEX, std::os::fd::AsRawFd::as_raw_fd(fd))
        })
    }

    /// The one set-up of both kinds of device: the device must offer the request IRQ
    /// (`count` > 0); a fresh eventfd is made and `trigger` registers it.
    fn register_with(
        addr: PciAddress,
        count: u32,
        trigger: impl FnOnce(&EventFd) -> std::io::Result<()>,
    ) -> Result<RemovalNotice> {
        if count == 0 {
            return Err(CoreError::Unsupported {
                addr,
                what: "the VFIO device request IRQ (VFIO_PCI_REQ_IRQ_INDEX; vfio-pci offers it since Linux 4.0)",
            });
        }
        let fd = EventFd::new(EFD_NONBLOCK).map_err(|source| CoreError::Io {
            op: format!("eventfd for the removal notice of {addr}"),
            source,
        })?;
        trigger(&fd).map_err(|source| CoreError::Io {
            op: format!("VFIO_DEVICE_SET_IRQS (request IRQ eventfd) on {addr}"),
            source,
        })?;
        Ok(RemovalNotice {
            fd,
            seen: AtomicBool::new(false),
        })
    }

    /// True once the kernel has asked for the device. One non-blocking read(2) until then.
    pub(crate) fn requested(&self) -> bool {
        if self.seen.load(Ordering::Relaxed) {
            return true;
        }
        // EAGAIN (no request yet) and any other error read as "not requested".
        if self.fd.read().is_ok_and(|n| n > 0) {
            self.seen.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> PciAddress {
        "0000:00:04.0".parse().unwrap()
    }

    #[test]
    fn the_shared_set_up_refuses_a_device_without_the_irq_and_names_a_failed_trigger() {
        let e = RemovalNotice::register_with(addr(), 0, |_| panic!("not registered")).unwrap_err();
        assert!(matches!(e, CoreError::Unsupported { .. }), "{e}");
        let e = RemovalNotice::register_with(addr(), 1, |_| {
            Err(std::io::Error::from_raw_os_error(libc::EINVAL))
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("VFIO_DEVICE_SET_IRQS (request IRQ eventfd) on 0000:00:04.0"),
            "{e}"
        );
    }

    #[test]
    fn a_registered_notice_reports_the_kernels_request_and_keeps_it() {
        let mut fd = None;
        let n = RemovalNotice::register_with(addr(), 1, |f| {
            fd = Some(f.try_clone().unwrap());
            Ok(())
        })
        .unwrap();
        assert!(!n.requested());
        fd.unwrap().write(1).unwrap();
        assert!(n.requested());
        assert!(n.requested(), "the answer stays after the count was read");
    }
}
