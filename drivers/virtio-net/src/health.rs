//! Noticing a dead device from the poll loop.
//!
//! The burst calls read only ring memory, so on their own a NIC that stopped working looks like
//! a quiet link. Each queue pair therefore keeps an [`IdleClock`]: a poll that moves nothing
//! (an RX burst that found no frame, a reclaim that found no finished TX buffer) counts as idle,
//! every [`IDLE_POLLS_PER_CLOCK_READ`] idle polls the clock is read once, and when the pair has
//! made no progress for the configured interval ([`crate::NetConfig::health_interval`]) the
//! burst call reads `device_status` once ([`StatusProbe`]) and returns
//! [`VirtioNetError::DeviceGone`] or [`VirtioNetError::DeviceNeedsReset`] itself. A busy pair
//! never reads a register or the clock; an idle one costs one clock read per
//! `IDLE_POLLS_PER_CLOCK_READ` polls and one MMIO read per interval.
//!
//! [`classify_status`] says what a `device_status` value means once the driver set DRIVER_OK:
//! all-ones is a device that is gone (real hardware behind a dead link), 0 or any value without
//! DRIVER_OK is a device that was reset behind the driver's back or whose BAR no longer decodes
//! (QEMU reads 0 there), DEVICE_NEEDS_RESET or FAILED is a device asking for a reset.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ubdirect_core::pci::PciAddress;

use crate::common_cfg::{self as cc, status};
use crate::error::{Result, VirtioNetError};
use crate::transport::Window;

/// Default for [`crate::NetConfig::health_interval`]: how long a queue pair may make no
/// progress before a burst call reads `device_status` once.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_millis(100);

/// Idle polls between two clock reads (a power of two: the check is a mask).
pub const IDLE_POLLS_PER_CLOCK_READ: u32 = 256;

/// What a `device_status` value read after DRIVER_OK means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// DRIVER_OK is set and nothing is wrong.
    Running,
    /// The device is gone: all-ones, or DRIVER_OK no longer set (reset behind the driver's
    /// back, or the BAR stopped decoding and reads 0). The text says which.
    Gone(&'static str),
    /// The device set DEVICE_NEEDS_RESET or FAILED.
    NeedsReset,
}

/// Classifies a `device_status` value read while the driver believes the device is running
/// (DRIVER_OK was set). Pure: host-tested.
pub fn classify_status(s: u8) -> Health {
    if s == 0xff {
        Health::Gone("device_status reads all-ones (0xff)")
    } else if s & (status::DEVICE_NEEDS_RESET | status::FAILED) != 0 {
        Health::NeedsReset
    } else if s == 0 {
        Health::Gone("device_status reads 0 after DRIVER_OK was set (a reset behind the driver's back, or a BAR that no longer decodes)")
    } else if s & status::DRIVER_OK == 0 {
        Health::Gone(
            "device_status lost DRIVER_OK (the device was reset and set up again by someone else)",
        )
    } else {
        Health::Running
    }
}

/// The typed error for a status value, `Ok` when the device is running.
pub fn status_result(addr: PciAddress, s: u8) -> Result<()> {
    match classify_status(s) {
        Health::Running => Ok(()),
        Health::Gone(cause) => Err(VirtioNetError::DeviceGone { addr, cause }),
        Health::NeedsReset => Err(VirtioNetError::DeviceNeedsReset { addr, status: s }),
    }
}

/// Reads `device_status` of a running device from any queue pair's thread (a read of a
/// register outside the queue-select window: safe next to other threads' MMIO).
pub struct StatusProbe {
    common: Arc<Window>,
    addr: PciAddress,
}

impl StatusProbe {
    /// A probe on the common configuration window of the device at `addr`.
    pub(crate) fn new(common: Arc<Window>, addr: PciAddress) -> StatusProbe {
        StatusProbe { common, addr }
    }

    /// Reads `device_status` once.
    #[cold]
    pub fn read(&self) -> u8 {
        self.common.mmio().read8(cc::DEVICE_STATUS)
    }

    /// The device at this probe.
    pub fn address(&self) -> PciAddress {
        self.addr
    }
}

/// Counts idle polls and says when a queue pair has made no progress for `interval`. Reads the
/// clock only every [`IDLE_POLLS_PER_CLOCK_READ`] idle polls.
#[derive(Debug, Clone)]
pub struct IdleClock {
    interval: Duration,
    idle_polls: u32,
    idle_since: Option<Instant>,
}

impl IdleClock {
    /// A clock that reports after `interval` without progress.
    pub fn new(interval: Duration) -> IdleClock {
        IdleClock {
            interval,
            idle_polls: 0,
            idle_since: None,
        }
    }

    /// Something moved: start over.
    #[inline(always)]
    pub fn progress(&mut self) {
        self.idle_polls = 0;
        self.idle_since = None;
    }

    /// A poll that moved nothing; true when the device should be checked now.
    #[inline(always)]
    pub fn idle_poll(&mut self) -> bool {
        self.idle_polls = self.idle_polls.wrapping_add(1);
        self.idle_polls & (IDLE_POLLS_PER_CLOCK_READ - 1) == 0 && self.due(Instant::now())
    }

    /// At `now`: true (and the interval starts again) when no progress was seen for the
    /// interval since the first idle clock read.
    #[cold]
    pub fn due(&mut self, now: Instant) -> bool {
        let since = *self.idle_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= self.interval {
            self.idle_since = Some(now);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_values_are_classified() {
        let ok = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK;
        assert_eq!(classify_status(ok), Health::Running);
        assert!(matches!(classify_status(0xff), Health::Gone(c) if c.contains("all-ones")));
        assert!(matches!(classify_status(0), Health::Gone(c) if c.contains("reads 0")));
        assert!(matches!(
            classify_status(status::ACKNOWLEDGE | status::DRIVER),
            Health::Gone(c) if c.contains("lost DRIVER_OK")
        ));
        assert_eq!(
            classify_status(ok | status::DEVICE_NEEDS_RESET),
            Health::NeedsReset
        );
        assert_eq!(classify_status(ok | status::FAILED), Health::NeedsReset);
        // Every value: all-ones and 0 are never "running"; running needs DRIVER_OK and neither
        // NEEDS_RESET nor FAILED.
        for s in 0..=255u8 {
            let running = classify_status(s) == Health::Running;
            let want = s != 0xff
                && s & status::DRIVER_OK != 0
                && s & (status::DEVICE_NEEDS_RESET | status::FAILED) == 0;
            assert_eq!(running, want, "status {s:#04x}");
        }
    }

    #[test]
    fn errors_name_the_cause() {
        let addr: PciAddress = "0000:00:07.0".parse().unwrap();
        let e = status_result(addr, 0).unwrap_err();
        assert!(matches!(e, VirtioNetError::DeviceGone { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("0000:00:07.0") && text.contains("reads 0") && text.contains("reopen"),
            "{text}"
        );
        let e = status_result(addr, 0x4f).unwrap_err();
        assert!(
            matches!(e, VirtioNetError::DeviceNeedsReset { status: 0x4f, .. }),
            "{e:?}"
        );
        assert!(status_result(addr, 0x0f).is_ok());
    }

    #[test]
    fn the_clock_is_read_only_every_n_idle_polls() {
        // Interval zero: due on every clock read, so idle_poll is true exactly every N polls.
        let mut c = IdleClock::new(Duration::ZERO);
        let n = IDLE_POLLS_PER_CLOCK_READ as usize;
        let hits: Vec<usize> = (1..=3 * n).filter(|_| c.idle_poll()).collect();
        assert_eq!(hits, vec![n, 2 * n, 3 * n]);
        // Progress starts the count over.
        for _ in 0..n - 1 {
            assert!(!c.idle_poll());
        }
        c.progress();
        assert!(!c.idle_poll());
    }

    #[test]
    fn due_only_after_the_interval_without_progress() {
        let mut c = IdleClock::new(Duration::from_millis(100));
        let t0 = Instant::now();
        assert!(!c.due(t0), "the first clock read starts the interval");
        assert!(!c.due(t0 + Duration::from_millis(99)));
        assert!(c.due(t0 + Duration::from_millis(100)));
        // The interval starts again after a check.
        assert!(!c.due(t0 + Duration::from_millis(150)));
        assert!(c.due(t0 + Duration::from_millis(200)));
        // Progress forgets the idle start.
        c.progress();
        assert!(!c.due(t0 + Duration::from_millis(500)));
        assert!(!c.due(t0 + Duration::from_millis(599)));
        assert!(c.due(t0 + Duration::from_millis(600)));
    }
}
