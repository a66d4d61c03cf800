//! The per-command clock: submission stamps come from the cycle counter (`rdtsc` on x86-64: no
//! system call, no allocation), and `io_timeout` is converted to counter ticks once per queue
//! with a frequency measured once per process.

use std::sync::OnceLock;
use std::time::Duration;

use ubdirect_core::util::Tsc;

/// The cycle counter's frequency, measured once (10 ms) on the first queue creation, rounded up
/// so that no deadline expires early.
pub(crate) fn tsc() -> Tsc {
    static TSC: OnceLock<Tsc> = OnceLock::new();
    *TSC.get_or_init(|| Tsc::calibrate_no_early(Duration::from_millis(10)))
}

/// A queue's deadlines in counter ticks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticks {
    /// `io_timeout`: a command this old is aborted (and, aborted, escalated).
    pub(crate) timeout: u64,
    /// `io_timeout / 4`: from this age on, the controller's health (CSTS) is read.
    pub(crate) quarter: u64,
    /// Least time between two deadline checks (`io_timeout / 16`, at most 50 ms).
    pub(crate) check_every: u64,
}

impl Ticks {
    /// The ticks of `io_timeout`.
    pub(crate) fn new(io_timeout: Duration) -> Ticks {
        let t = tsc();
        Ticks {
            timeout: t.ticks(io_timeout),
            quarter: t.ticks(io_timeout / 4),
            check_every: t.ticks((io_timeout / 16).min(Duration::from_millis(50))),
        }
    }

    /// Ticks as a duration (error paths only).
    #[cold]
    pub(crate) fn duration(ticks: u64) -> Duration {
        Duration::from_nanos(tsc().to_ns(ticks as f64) as u64)
    }
}

/// The deadline state of the commands in flight, found by one scan of the slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Ages {
    /// Age in ticks of the oldest command in flight (0 when none).
    pub(crate) oldest: u64,
    /// Commands in flight older than the timeout and not aborted yet.
    pub(crate) expired: usize,
    /// Commands older than the timeout although an Abort was sent for them.
    pub(crate) expired_after_abort: usize,
}

impl Ages {
    /// Scan `(active, aborted, stamp)` of every slot at counter value `now`.
    pub(crate) fn scan(
        slots: impl Iterator<Item = (bool, bool, u64)>,
        now: u64,
        timeout: u64,
    ) -> Ages {
        let mut a = Ages::default();
        for (active, aborted, stamp) in slots {
            if !active {
                continue;
            }
            let age = now.saturating_sub(stamp);
            a.oldest = a.oldest.max(age);
            if age >= timeout {
                if aborted {
                    a.expired_after_abort += 1;
                } else {
                    a.expired += 1;
                }
            }
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_old_command_among_young_ones_is_found() {
        // A busy queue: three commands just submitted, one submitted long ago. The old one
        // is expired whatever the others do.
        let now = 1_000_000;
        let slots = [
            (true, false, now - 10),
            (true, false, 5),
            (false, false, 0),
            (true, false, now - 1),
        ];
        let a = Ages::scan(slots.into_iter(), now, 1000);
        assert_eq!(
            a,
            Ages {
                oldest: now - 5,
                expired: 1,
                expired_after_abort: 0
            }
        );
    }

    #[test]
    fn aborted_commands_are_counted_apart_and_free_slots_ignored() {
        let slots = [(true, true, 0), (true, false, 0), (false, true, 0)];
        let a = Ages::scan(slots.into_iter(), 100, 50);
        assert_eq!((a.expired, a.expired_after_abort), (1, 1));
        let none = Ages::scan([(false, false, 0)].into_iter(), 100, 50);
        assert_eq!(none, Ages::default());
    }

    #[test]
    fn ticks_scale_with_the_timeout() {
        let t = Ticks::new(Duration::from_secs(1));
        assert!(t.timeout > 1_000_000, "{t:?}");
        assert!((t.quarter as f64 - t.timeout as f64 / 4.0).abs() < t.timeout as f64 * 0.01);
        let back = Ticks::duration(t.timeout);
        assert!(
            back > Duration::from_millis(990) && back < Duration::from_millis(1010),
            "{back:?}"
        );
    }
}
