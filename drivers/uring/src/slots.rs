//! A fixed-capacity table of in-flight requests indexed by io_uring user_data.
//! Allocated once at queue creation; insert and take never allocate.

/// One in-flight request.
#[derive(Debug)]
pub struct Slot<B> {
    /// The buffer the kernel is reading into / writing from.
    pub buf: B,
    /// The caller's tag.
    pub tag: u64,
    /// Byte offset of the request (for error messages).
    pub offset: u64,
    /// True for writes.
    pub write: bool,
}

/// The in-flight table.
#[derive(Debug)]
pub struct Slots<B> {
    slots: Vec<Option<Slot<B>>>,
    free: Vec<u32>,
}

impl<B> Slots<B> {
    /// A table with room for `depth` requests.
    pub fn new(depth: usize) -> Slots<B> {
        let mut slots = Vec::with_capacity(depth);
        slots.resize_with(depth, || None);
        let free = (0..depth as u32).rev().collect();
        Slots { slots, free }
    }

    /// Store a request; returns its index, or gives the slot back when the table is full.
    pub fn insert(&mut self, slot: Slot<B>) -> Result<u32, Slot<B>> {
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(slot);
                Ok(i)
            }
            None => Err(slot),
        }
    }

    /// Remove the request at `index`; `None` for an index never issued or already taken.
    pub fn take(&mut self, index: u64) -> Option<Slot<B>> {
        let i = usize::try_from(index).ok()?;
        let s = self.slots.get_mut(i)?.take()?;
        self.free.push(i as u32);
        Some(s)
    }

    /// Requests in the table.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Capacity.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Remove every request (used on drop after the ring is quiesced).
    pub fn drain(&mut self) -> impl Iterator<Item = Slot<B>> + '_ {
        self.free.clear();
        self.free.extend((0..self.slots.len() as u32).rev());
        self.slots.iter_mut().filter_map(|s| s.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn s(tag: u64) -> Slot<u64> {
        Slot {
            buf: tag,
            tag,
            offset: 0,
            write: false,
        }
    }

    #[test]
    fn full_and_unknown() {
        let mut t = Slots::new(2);
        let a = t.insert(s(1)).unwrap();
        let b = t.insert(s(2)).unwrap();
        assert_ne!(a, b);
        assert!(t.insert(s(3)).is_err());
        assert_eq!(t.take(a as u64).unwrap().tag, 1);
        assert!(
            t.take(a as u64).is_none(),
            "double completion must not yield a buffer twice"
        );
        assert!(t.take(99).is_none());
        assert!(t.take(u64::MAX).is_none());
        assert_eq!(t.len(), 1);
    }

    proptest! {
        #[test]
        fn never_loses_or_duplicates(ops in proptest::collection::vec(any::<bool>(), 1..200)) {
            let mut t = Slots::new(8);
            let mut live: Vec<(u32, u64)> = Vec::new();
            let mut next = 0u64;
            for op in ops {
                if op {
                    match t.insert(s(next)) {
                        Ok(i) => { prop_assert!(live.iter().all(|&(j, _)| j != i)); live.push((i, next)); }
                        Err(_) => prop_assert_eq!(live.len(), 8),
                    }
                    next += 1;
                } else if let Some((i, tag)) = live.pop() {
                    prop_assert_eq!(t.take(i as u64).map(|s| s.tag), Some(tag));
                }
                prop_assert_eq!(t.len(), live.len());
            }
        }
    }
}
