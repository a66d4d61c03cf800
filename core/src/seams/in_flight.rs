//! [`InFlight`]: the completion bookkeeping every [`crate::seams::BlockQueue`] over a
//! kernel or wire queue needs: a fixed-capacity table of requests in flight, indexed by the
//! id the request travels under (io_uring `user_data`, an NVMe/TCP command ID). Allocated once
//! at queue creation; insert, take and lookups never allocate.

/// The in-flight table of one queue: at most `capacity` entries, each under a distinct index
/// in `0..capacity`. An index is reused only after its entry was taken.
#[derive(Debug)]
pub struct InFlight<T> {
    slots: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> InFlight<T> {
    /// A table with room for `depth` requests (indexes `0..depth`, lowest handed out first).
    pub fn new(depth: usize) -> InFlight<T> {
        let mut slots = Vec::with_capacity(depth);
        slots.resize_with(depth, || None);
        let free = (0..depth as u32).rev().collect();
        InFlight { slots, free }
    }

    /// Store a request; returns its index, or gives it back when the table is full.
    pub fn insert(&mut self, entry: T) -> Result<u32, T> {
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(entry);
                Ok(i)
            }
            None => Err(entry),
        }
    }

    /// Remove the request at `index`; `None` for an index never issued or already taken (a
    /// duplicate or unknown completion never yields a buffer twice).
    pub fn take(&mut self, index: u64) -> Option<T> {
        let i = usize::try_from(index).ok()?;
        let s = self.slots.get_mut(i)?.take()?;
        self.free.push(i as u32);
        Some(s)
    }

    /// The request at `index`, if in flight.
    pub fn get(&self, index: u64) -> Option<&T> {
        self.slots.get(usize::try_from(index).ok()?)?.as_ref()
    }

    /// The request at `index`, if in flight, to update.
    pub fn get_mut(&mut self, index: u64) -> Option<&mut T> {
        self.slots.get_mut(usize::try_from(index).ok()?)?.as_mut()
    }

    /// Requests in flight.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when no index is free.
    pub fn is_full(&self) -> bool {
        self.free.is_empty()
    }

    /// Capacity.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Free indexes.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// The requests in flight, in index order.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.slots.iter().flatten()
    }

    /// Remove every request, in index order (a queue that failed or is torn down hands the
    /// buffers back); every index is free afterwards.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.free.clear();
        self.free.extend((0..self.slots.len() as u32).rev());
        self.slots.iter_mut().filter_map(|s| s.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn full_and_unknown() {
        let mut t = InFlight::new(2);
        let a = t.insert(1u64).unwrap();
        let b = t.insert(2).unwrap();
        assert_ne!(a, b);
        assert!(t.is_full());
        assert_eq!(t.insert(3), Err(3));
        assert_eq!(t.get(b as u64), Some(&2));
        *t.get_mut(b as u64).unwrap() = 4;
        assert_eq!(t.take(a as u64), Some(1));
        assert!(
            t.take(a as u64).is_none(),
            "double completion must not yield a buffer twice"
        );
        assert!(t.take(99).is_none());
        assert!(t.take(u64::MAX).is_none());
        assert!(t.get(u64::MAX).is_none());
        assert_eq!(t.len(), 1);
        assert_eq!(t.drain().collect::<Vec<_>>(), vec![4]);
        assert_eq!((t.len(), t.free()), (0, 2));
    }

    proptest! {
        #[test]
        fn never_loses_or_duplicates(ops in proptest::collection::vec(any::<bool>(), 1..200)) {
            let mut t = InFlight::new(8);
            let mut live: Vec<(u32, u64)> = Vec::new();
            let mut next = 0u64;
            for op in ops {
                if op {
                    match t.insert(next) {
                        Ok(i) => {
                            prop_assert!(i < 8);
                            prop_assert!(live.iter().all(|&(j, _)| j != i));
                            live.push((i, next));
                        }
                        Err(_) => prop_assert_eq!(live.len(), 8),
                    }
                    next += 1;
                } else if let Some((i, tag)) = live.pop() {
                    prop_assert_eq!(t.take(i as u64), Some(tag));
                }
                prop_assert_eq!(t.len(), live.len());
                prop_assert_eq!(t.iter().count(), live.len());
            }
        }
    }
}
