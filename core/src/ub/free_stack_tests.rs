//! Unit tests of [`super::free_stack::FreeStack`] with std threads (the exhaustive
//! interleavings are in `core/tests/loom_free_stack.rs`).

use super::free_stack::FreeStack;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

#[test]
fn pops_every_index_once() {
    let s = FreeStack::full(5);
    let got: Vec<u32> = std::iter::from_fn(|| s.pop()).collect();
    assert_eq!(got, vec![0, 1, 2, 3, 4]);
    s.push(3);
    s.push(1);
    assert_eq!(s.pop(), Some(1));
    assert_eq!(s.pop(), Some(3));
    assert_eq!(s.pop(), None);
    assert_eq!(FreeStack::full(0).pop(), None);
}

#[test]
fn threads_never_share_an_index() {
    let s = Arc::new(FreeStack::full(8));
    let owned: Arc<Vec<AtomicU32>> = Arc::new((0..8).map(|_| AtomicU32::new(0)).collect());
    let hs: Vec<_> = (0..4)
        .map(|_| {
            let (s, owned) = (s.clone(), owned.clone());
            std::thread::spawn(move || {
                for _ in 0..20_000 {
                    if let Some(i) = s.pop() {
                        assert_eq!(owned[i as usize].fetch_add(1, Ordering::SeqCst), 0);
                        owned[i as usize].fetch_sub(1, Ordering::SeqCst);
                        s.push(i);
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let all: HashSet<u32> = std::iter::from_fn(|| s.pop()).collect();
    assert_eq!(all.len(), 8);
}
