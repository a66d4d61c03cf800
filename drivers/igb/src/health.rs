//! Noticing a dead device or a lost link from the poll loop.
//!
//! The burst calls read only descriptor memory, so on their own a NIC that stopped working looks
//! like a quiet link. Each queue pair keeps an [`IdleClock`]: a poll that moves nothing counts
//! as idle, every [`IDLE_POLLS_PER_CLOCK_READ`] idle polls the clock is read once, and once the
//! pair made no progress for the health interval the burst call probes the device: STATUS
//! (all-ones: gone; LU clear: link down), RCTL (receiver enable cleared: reset behind the
//! driver's back) and the pair's head pointers (beyond the ring: malformed device). A busy pair
//! reads no register and no clock.

use std::time::{Duration, Instant};

/// Default health interval.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_millis(100);

/// Idle polls between two clock reads (a power of two: the check is a mask).
pub const IDLE_POLLS_PER_CLOCK_READ: u32 = 256;

/// When a queue pair last made progress, read cheaply.
#[derive(Debug)]
pub struct IdleClock {
    interval: Duration,
    idle_polls: u32,
    since: Option<Instant>,
}

impl IdleClock {
    /// A clock that fires after `interval` without progress.
    pub fn new(interval: Duration) -> IdleClock {
        IdleClock {
            interval,
            idle_polls: 0,
            since: None,
        }
    }

    /// Something moved.
    #[inline(always)]
    pub fn progress(&mut self) {
        self.idle_polls = 0;
        self.since = None;
    }

    /// A poll that moved nothing; true when the device should be probed now.
    #[inline(always)]
    pub fn idle_poll(&mut self) -> bool {
        self.idle_polls = self.idle_polls.wrapping_add(1);
        if self.idle_polls & (IDLE_POLLS_PER_CLOCK_READ - 1) != 1 {
            return false;
        }
        self.clock_check()
    }

    #[cold]
    fn clock_check(&mut self) -> bool {
        let now = Instant::now();
        match self.since {
            None => {
                self.since = Some(now);
                false
            }
            Some(t) if now.duration_since(t) >= self.interval => {
                self.since = Some(now);
                true
            }
            Some(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_only_after_the_interval_without_progress() {
        let mut c = IdleClock::new(Duration::from_millis(5));
        assert!(!c.idle_poll(), "the first read starts the clock");
        std::thread::sleep(Duration::from_millis(6));
        let fired = (0..IDLE_POLLS_PER_CLOCK_READ).any(|_| c.idle_poll());
        assert!(fired);
        c.progress();
        assert!(!c.idle_poll());
    }
}
