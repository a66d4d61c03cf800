//! Event-index notification suppression arithmetic (VIRTIO_F_EVENT_IDX).

/// True when moving a ring index from `old` to `new` passes `event_idx`, i.e. the other side
/// asked to be notified at `event_idx` and it lies in `[old, new)` (modulo 2^16). This is the
/// spec's and Linux's `vring_need_event`.
#[inline]
pub fn vring_need_event(event_idx: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event_idx).wrapping_sub(1) < new.wrapping_sub(old)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn simple_cases() {
        assert!(vring_need_event(0, 1, 0));
        assert!(!vring_need_event(1, 1, 0));
        assert!(vring_need_event(5, 10, 0));
        assert!(!vring_need_event(10, 10, 0));
        assert!(!vring_need_event(3, 3, 3)); // nothing moved
                                             // Wrap-around: old 65534 -> new 2 passes 65535, 0, 1.
        assert!(vring_need_event(65535, 2, 65534));
        assert!(vring_need_event(0, 2, 65534));
        assert!(vring_need_event(1, 2, 65534));
        assert!(!vring_need_event(2, 2, 65534));
        assert!(!vring_need_event(65533, 2, 65534));
    }

    proptest! {
        /// Same answer as the obvious check on unwrapped 32-bit counters.
        #[test]
        fn matches_unwrapped_reference(old in 0u32..200_000, step in 0u32..65_536, ev_off in 0u32..65_536) {
            let new = old + step;
            // Any event value, expressed as an offset from old modulo 2^16.
            let event = old + ev_off;
            let expected = event < new; // event in [old, new)
            prop_assert_eq!(vring_need_event(event as u16, new as u16, old as u16), expected);
        }
    }
}
