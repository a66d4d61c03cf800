//! Modern virtio-pci transport (virtio 1.2 §4.1) over a vfio-pci device: capability walk, BAR
//! windows, status handshake, feature negotiation and queue registration.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ubdirect_core::mmio::Mmio;
use ubdirect_core::pci::{DeviceAccess, DeviceClaim, PciAddress, PciDevice};

use crate::common_cfg::{self as cc, status, NO_VECTOR};
use crate::error::{Result, VirtioNetError};
use crate::features::Features;
use crate::health::{status_result, StatusProbe};
use crate::pci_cap::{parse_layout, CapLocation, VirtioPciLayout, COMMON_CFG_MIN_LEN};
use crate::ring::SplitRing;

/// How long a device reset may take before [`VirtioNetError::ResetTimeout`].
pub const RESET_TIMEOUT: Duration = Duration::from_secs(2);

/// The BARs this device's structures live in, each mapped once.
struct MappedBars {
    maps: Vec<(u8, Mmio)>,
}

/// A window (sub-range) of a mapped BAR; keeps the BAR mapping alive.
pub struct Window {
    mmio: Mmio,
    _bars: Arc<MappedBars>,
}

impl Window {
    /// The window's MMIO accessors (offsets relative to the structure's start).
    #[inline(always)]
    pub fn mmio(&self) -> &Mmio {
        &self.mmio
    }
}

/// A queue's doorbell: the address in the notify structure and the value to write.
pub struct Doorbell {
    notify: Arc<Window>,
    offset: usize,
    queue: u16,
}

impl Doorbell {
    /// Tells the device that queue `queue` has new buffers. Callers publish the ring (a
    /// release store) first, which orders the descriptor writes before this MMIO write.
    #[inline]
    pub fn ring(&self) {
        ubdirect_core::barrier::wmb();
        self.notify.mmio().write16(self.offset, self.queue);
    }
}

/// An opened modern virtio-pci device.
pub struct Transport {
    common: Arc<Window>,
    /// `num_queues` as read at open.
    num_queues_at_open: u16,
    /// `num_queues` as read after FEATURES_OK: QEMU adds the queues of VIRTIO_NET_F_MQ only
    /// once the feature is negotiated (1 pair + control before it, N pairs + control after).
    num_queues: AtomicU16,
    notify: Arc<Window>,
    notify_off_multiplier: u32,
    device_cfg: Option<Window>,
    _isr: Window,
    /// This driver's claim on the device; released after the BAR windows are unmapped.
    claim: DeviceClaim,
}

fn read_config(dev: &PciDevice, off: u16, buf: &mut [u8]) -> ubdirect_core::Result<()> {
    let mut i = 0;
    while i < buf.len() {
        let o = u16::try_from(off as usize + i).map_err(|_| {
            ubdirect_core::CoreError::InvalidArgument(format!(
                "config-space read of {} bytes at {off:#x} runs past 0xffff",
                buf.len()
            ))
        })?;
        if o % 4 == 0 && buf.len() - i >= 4 {
            buf[i..i + 4].copy_from_slice(&dev.config_read_u32(o)?.to_le_bytes());
            i += 4;
        } else {
            buf[i] = dev.config_read_u8(o)?;
            i += 1;
        }
    }
    Ok(())
}

/// The device's virtio capabilities, read from config space and checked.
fn read_layout(dev: &Arc<PciDevice>) -> Result<VirtioPciLayout> {
    let addr = dev.address();
    let caps: Vec<(u8, u16)> = dev
        .capabilities()?
        .iter()
        .map(|c| (c.id, c.offset))
        .collect();
    let layout: VirtioPciLayout = parse_layout(caps, |off, buf| read_config(dev, off, buf))?
        .map_err(|source| VirtioNetError::Capabilities { addr, source })?;
    if layout.common.length < COMMON_CFG_MIN_LEN {
        return Err(outside_bar(
            addr,
            "common (too short)",
            layout.common,
            COMMON_CFG_MIN_LEN as u64,
        ));
    }
    Ok(layout)
}

/// The error for a capability window that does not fit its BAR.
fn outside_bar(
    addr: PciAddress,
    what: &'static str,
    loc: CapLocation,
    bar_len: u64,
) -> VirtioNetError {
    VirtioNetError::CapOutsideBar {
        addr,
        what,
        bar: loc.bar,
        offset: loc.offset as u64,
        length: loc.length as u64,
        bar_len,
    }
}

impl MappedBars {
    /// Map each BAR the layout's windows lie in, once, and check that every window fits.
    fn map(claim: &DeviceClaim, layout: &VirtioPciLayout) -> Result<MappedBars> {
        let addr = claim.device().address();
        let mut maps: Vec<(u8, Mmio)> = Vec::new();
        let mut locs = vec![
            ("common", layout.common),
            ("notify", layout.notify),
            ("isr", layout.isr),
        ];
        if let Some(d) = layout.device {
            locs.push(("device", d));
        }
        for (what, loc) in locs {
            if !maps.iter().any(|(b, _)| *b == loc.bar) {
                maps.push((loc.bar, claim.access().map_bar(loc.bar)?));
            }
            let bar_len = maps
                .iter()
                .find(|(b, _)| *b == loc.bar)
                .map(|(_, m)| m.len())
                .unwrap_or(0) as u64;
            let end = loc.offset as u64 + loc.length as u64;
            if loc.length == 0 || end > bar_len {
                return Err(outside_bar(addr, what, loc, bar_len));
            }
        }
        Ok(MappedBars { maps })
    }

    /// The window `loc` of a mapped BAR, keeping the mappings alive.
    fn window(
        self: &Arc<Self>,
        addr: PciAddress,
        what: &'static str,
        loc: CapLocation,
    ) -> Result<Window> {
        let m = &self
            .maps
            .iter()
            .find(|(b, _)| *b == loc.bar)
            .expect("mapped in MappedBars::map")
            .1;
        // SAFETY: the parent BAR mapping lives in `self`, which the window keeps alive (and
        // drops after its sub-window: field order of Window).
        let mmio = unsafe { m.sub_window(loc.offset as usize, loc.length as usize) }
            .map_err(|_| outside_bar(addr, what, loc, m.len() as u64))?;
        Ok(Window {
            mmio,
            _bars: self.clone(),
        })
    }
}

impl Transport {
    /// Walks the device's virtio capabilities and maps the BAR windows they name, through the
    /// driver's claim on the device (kept for as long as the transport lives).
    pub fn open(claim: DeviceClaim) -> Result<Transport> {
        let addr = claim.device().address();
        let layout = read_layout(claim.device())?;
        let bars = Arc::new(MappedBars::map(&claim, &layout)?);
        let common = Arc::new(bars.window(addr, "common", layout.common)?);
        // Read-only and fixed by the device: the witness that the BAR still decodes.
        let num_queues = common.mmio().read16(cc::NUM_QUEUES);
        Ok(Transport {
            common,
            num_queues_at_open: num_queues,
            num_queues: AtomicU16::new(num_queues),
            notify: Arc::new(bars.window(addr, "notify", layout.notify)?),
            notify_off_multiplier: layout.notify_off_multiplier,
            device_cfg: layout
                .device
                .map(|d| bars.window(addr, "device", d))
                .transpose()?,
            _isr: bars.window(addr, "isr", layout.isr)?,
            claim,
        })
    }

    /// The PCI device (held by this driver).
    pub fn device(&self) -> &Arc<PciDevice> {
        self.claim.device()
    }

    /// The operations that program the device, through this driver's claim.
    pub(crate) fn access(&self) -> DeviceAccess<'_> {
        self.claim.access()
    }

    /// The device's PCI address.
    pub fn address(&self) -> PciAddress {
        self.claim.device().address()
    }

    fn c(&self) -> &Mmio {
        self.common.mmio()
    }

    /// Reads device_status; all-ones means the device is gone.
    pub fn status(&self) -> Result<u8> {
        let s = self.c().read8(cc::DEVICE_STATUS);
        if s == 0xff {
            return Err(VirtioNetError::DeviceGone {
                addr: self.address(),
                cause: "device_status reads all-ones (0xff)",
            });
        }
        Ok(s)
    }

    /// A [`StatusProbe`] for queue pairs (shares the common configuration mapping).
    pub fn probe(&self) -> StatusProbe {
        StatusProbe::new(self.common.clone(), self.address())
    }

    /// Errors unless the common configuration still decodes: `num_queues` (read-only, set
    /// by the device) must read what it read at open or after feature negotiation. QEMU reads 0 from a BAR whose memory
    /// decoding is off, which makes a reset look complete (device_status 0) although the
    /// reset write was lost and the device may still DMA; this check tells the two apart.
    pub fn confirm_decoding(&self) -> Result<()> {
        let n = self.c().read16(cc::NUM_QUEUES);
        if n == self.num_queues_at_open || n == self.num_queues.load(Ordering::Relaxed) {
            return Ok(());
        }
        Err(VirtioNetError::DeviceGone {
            addr: self.address(),
            cause: if n == 0xffff {
                "num_queues reads all-ones"
            } else {
                "num_queues no longer reads what it read at open (the BAR stopped decoding), so a reset cannot be confirmed"
            },
        })
    }

    /// Sets status bits (read-modify-write, as the spec's handshake does).
    pub fn add_status(&self, bits: u8) -> Result<()> {
        let s = self.status()?;
        self.c().write8(cc::DEVICE_STATUS, s | bits);
        Ok(())
    }

    /// For a device that was set DRIVER_OK: errors when it is gone (all-ones, status 0 or
    /// without DRIVER_OK, see [`classify_status`](crate::health::classify_status)) or asks for a
    /// reset (DEVICE_NEEDS_RESET, FAILED).
    pub fn check_health(&self) -> Result<()> {
        let s = self.c().read8(cc::DEVICE_STATUS);
        status_result(self.address(), s)
    }

    /// Resets the device and waits (bounded by `deadline`) until device_status reads 0, then
    /// confirms the BAR still decodes ([`Transport::confirm_decoding`]): a 0 read from a BAR
    /// that stopped decoding proves nothing. `Ok` means the device no longer touches any queue
    /// memory; on an error the caller must assume it still may.
    pub fn reset(&self, deadline: Duration) -> Result<()> {
        self.c().write8(cc::DEVICE_STATUS, 0);
        let start = Instant::now();
        loop {
            let s = self.status()?;
            if s == 0 {
                return self.confirm_decoding();
            }
            if start.elapsed() > deadline {
                return Err(VirtioNetError::ResetTimeout {
                    addr: self.address(),
                    waited: start.elapsed(),
                    status: s,
                });
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// The 64-bit device feature word.
    pub fn device_features(&self) -> Features {
        let c = self.c();
        c.write32(cc::DEVICE_FEATURE_SELECT, 0);
        let lo = c.read32(cc::DEVICE_FEATURE) as u64;
        c.write32(cc::DEVICE_FEATURE_SELECT, 1);
        let hi = c.read32(cc::DEVICE_FEATURE) as u64;
        Features::from_bits_retain(lo | (hi << 32))
    }

    /// Writes the accepted features, sets FEATURES_OK and verifies the device kept it.
    pub fn set_features(&self, accepted: Features) -> Result<()> {
        let c = self.c();
        let bits = accepted.bits();
        c.write32(cc::DRIVER_FEATURE_SELECT, 0);
        c.write32(cc::DRIVER_FEATURE, bits as u32);
        c.write32(cc::DRIVER_FEATURE_SELECT, 1);
        c.write32(cc::DRIVER_FEATURE, (bits >> 32) as u32);
        self.add_status(status::FEATURES_OK)?;
        if self.status()? & status::FEATURES_OK == 0 {
            return Err(VirtioNetError::FeaturesRejected {
                addr: self.address(),
                accepted,
            });
        }
        // The queue count may grow with the negotiated features (QEMU: MQ adds the pairs now).
        let n = c.read16(cc::NUM_QUEUES);
        if n != 0xffff {
            self.num_queues.store(n, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Turns off the configuration-change interrupt (polling driver) and checks it stuck.
    pub fn disable_config_vector(&self) -> Result<()> {
        self.c().write16(cc::CONFIG_MSIX_VECTOR, NO_VECTOR);
        let read = self.c().read16(cc::CONFIG_MSIX_VECTOR);
        if read != NO_VECTOR {
            return Err(VirtioNetError::MsixVector {
                addr: self.address(),
                queue: u16::MAX,
                read,
            });
        }
        Ok(())
    }

    /// Number of virtqueues the device has: as read at open, then as read after FEATURES_OK
    /// (the device may add queues for negotiated features; [`Transport::confirm_decoding`]
    /// re-reads it).
    pub fn num_queues(&self) -> u16 {
        self.num_queues.load(Ordering::Relaxed)
    }

    /// The maximum size of queue `q` (0: the queue does not exist).
    pub fn queue_max_size(&self, q: u16) -> u16 {
        self.c().write16(cc::QUEUE_SELECT, q);
        self.c().read16(cc::QUEUE_SIZE)
    }

    /// Registers `ring` as queue `q` with no MSI-X vector, enables it and returns its doorbell.
    pub fn setup_queue(&self, q: u16, ring: &SplitRing) -> Result<Doorbell> {
        self.setup_queue_at(
            q,
            ring.size(),
            ring.desc_iova(),
            ring.avail_iova(),
            ring.used_iova(),
        )
    }

    /// Registers a queue of `size` entries whose three areas are at the given IOVAs.
    pub fn setup_queue_at(
        &self,
        q: u16,
        size: u16,
        desc: u64,
        avail: u64,
        used: u64,
    ) -> Result<Doorbell> {
        let addr = self.address();
        let c = self.c();
        c.write16(cc::QUEUE_SELECT, q);
        c.write16(cc::QUEUE_SIZE, size);
        c.write16(cc::QUEUE_MSIX_VECTOR, NO_VECTOR);
        let read = c.read16(cc::QUEUE_MSIX_VECTOR);
        if read != NO_VECTOR {
            return Err(VirtioNetError::MsixVector {
                addr,
                queue: q,
                read,
            });
        }
        let w64 = |off: usize, v: u64| {
            c.write32(off, v as u32);
            c.write32(off + 4, (v >> 32) as u32);
        };
        w64(cc::QUEUE_DESC, desc);
        w64(cc::QUEUE_DRIVER, avail);
        w64(cc::QUEUE_DEVICE, used);
        let notify_off = c.read16(cc::QUEUE_NOTIFY_OFF) as u64;
        let offset = notify_off * self.notify_off_multiplier as u64;
        let len = self.notify.mmio().len() as u64;
        // In range and 2-byte aligned in the BAR (the capability checks make the latter hold;
        // checked again here because a doorbell write must never be unaligned).
        if offset + 2 > len || self.notify.mmio().check_access(offset as usize, 2).is_err() {
            return Err(VirtioNetError::NotifyOutOfRange {
                addr,
                queue: q,
                offset,
                len,
            });
        }
        c.write16(cc::QUEUE_ENABLE, 1);
        Ok(Doorbell {
            notify: self.notify.clone(),
            offset: offset as usize,
            queue: q,
        })
    }

    /// Reads device-specific configuration through `f`, retrying until config_generation is
    /// stable (bounded: 100 tries). `None` when the device has no device configuration.
    pub fn read_device_config<T>(&self, f: impl Fn(&Mmio) -> T) -> Result<Option<T>> {
        let Some(d) = &self.device_cfg else {
            return Ok(None);
        };
        for _ in 0..100 {
            let g0 = self.c().read8(cc::CONFIG_GENERATION);
            let v = f(d.mmio());
            let g1 = self.c().read8(cc::CONFIG_GENERATION);
            if g0 == g1 {
                return Ok(Some(v));
            }
        }
        Err(VirtioNetError::DeviceGone {
            addr: self.address(),
            cause: "config_generation changed on each of 100 reads of the device configuration",
        })
    }

    /// Length of the device-specific configuration structure (0 when absent).
    pub fn device_config_len(&self) -> usize {
        self.device_cfg
            .as_ref()
            .map(|d| d.mmio().len())
            .unwrap_or(0)
    }
}
