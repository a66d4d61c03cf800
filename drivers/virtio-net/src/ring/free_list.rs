//! The free-descriptor list: which descriptor ids the driver may hand out. Allocated once at
//! queue set-up; `take` and `give` never allocate.

/// A stack of free descriptor ids with an in-use flag per id, so that a double return (a
/// device completing the same id twice) is detected instead of corrupting the list.
#[derive(Debug)]
pub struct FreeList {
    stack: Box<[u16]>,
    top: usize,
    in_use: Box<[bool]>,
}

impl FreeList {
    /// All ids `0..size` free.
    pub fn new(size: u16) -> FreeList {
        let n = size as usize;
        // Lowest id on top, so the first descriptors handed out are 0, 1, 2, ...
        let stack: Box<[u16]> = (0..size).rev().collect();
        FreeList {
            stack,
            top: n,
            in_use: vec![false; n].into_boxed_slice(),
        }
    }

    /// Number of ids in total.
    pub fn size(&self) -> usize {
        self.in_use.len()
    }

    /// Number of free ids.
    pub fn free(&self) -> usize {
        self.top
    }

    /// Number of ids handed out.
    pub fn in_use(&self) -> usize {
        self.size() - self.top
    }

    /// True when `id` is currently handed out.
    pub fn is_in_use(&self, id: u16) -> bool {
        self.in_use.get(id as usize).copied().unwrap_or(false)
    }

    /// Hands out a free id, or `None` when all are in use.
    #[inline]
    pub fn take(&mut self) -> Option<u16> {
        if self.top == 0 {
            return None;
        }
        self.top -= 1;
        let id = self.stack[self.top];
        self.in_use[id as usize] = true;
        Some(id)
    }

    /// Returns `id`; false (and nothing changed) when it is out of range or not in use.
    #[inline]
    pub fn give(&mut self, id: u16) -> bool {
        match self.in_use.get_mut(id as usize) {
            Some(used) if *used => {
                *used = false;
                self.stack[self.top] = id;
                self.top += 1;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[test]
    fn hands_out_each_once_then_none() {
        let mut f = FreeList::new(4);
        let got: Vec<u16> = (0..4).map(|_| f.take().unwrap()).collect();
        assert_eq!(got, vec![0, 1, 2, 3]);
        assert_eq!(f.take(), None);
        assert!(f.give(2));
        assert!(!f.give(2), "double return must be refused");
        assert!(!f.give(9), "out of range must be refused");
        assert_eq!(f.take(), Some(2));
    }

    proptest! {
        /// Whatever the order of takes and gives, no id is handed out twice while in use and
        /// the counts always add up.
        #[test]
        fn never_double_hands(size in 1u16..64, ops in proptest::collection::vec((any::<bool>(), any::<u16>()), 1..500)) {
            let mut f = FreeList::new(size);
            let mut out: HashSet<u16> = HashSet::new();
            for (take, pick) in ops {
                if take {
                    match f.take() {
                        Some(id) => {
                            prop_assert!(id < size);
                            prop_assert!(out.insert(id), "id {} handed out twice", id);
                        }
                        None => prop_assert_eq!(out.len(), size as usize),
                    }
                } else {
                    let id = pick % (size + 2); // sometimes out of range
                    let expect = out.remove(&id);
                    prop_assert_eq!(f.give(id), expect);
                }
                prop_assert_eq!(f.in_use(), out.len());
                prop_assert_eq!(f.free() + f.in_use(), size as usize);
            }
        }
    }
}
