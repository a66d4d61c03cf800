//! Every interleaving (loom) of the pool's lock-free free stack and of per-thread magazines
//! over it: no index is ever handed to two owners at once, none is lost, and the generation
//! tag defeats ABA.
//!
//! Runs in plain `cargo test`: loom is an ordinary dev-dependency, and this file compiles the
//! shipped `src/ub/free_stack.rs` and `src/ub/magazine.rs` themselves against loom's atomics
//! (they take theirs from `super::sync`), so the code checked is the code the pool runs.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU32 as StdAtomicU32;
use std::sync::atomic::Ordering::SeqCst;

use loom::sync::Arc;
use loom::thread;

/// What `free_stack.rs` imports as `super::sync`.
mod sync {
    pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
}

#[allow(dead_code)]
#[path = "../src/ub/free_stack.rs"]
mod free_stack;

#[allow(dead_code)]
#[path = "../src/ub/magazine.rs"]
mod magazine;

use free_stack::FreeStack;
use magazine::Magazine;

/// Who holds each index, for one execution: `claim` fails the test when an index is handed
/// out twice. Plain std atomics: loom runs one thread at a time, so this bookkeeping adds no
/// interleavings of its own.
struct Owners(Vec<StdAtomicU32>);

impl Owners {
    fn new(n: usize) -> Arc<Owners> {
        Arc::new(Owners((0..n).map(|_| StdAtomicU32::new(0)).collect()))
    }
    fn claim(&self, i: u32) {
        let was = self.0[i as usize].fetch_add(1, SeqCst);
        assert_eq!(was, 0, "index {i} handed to two owners at once");
    }
    fn release(&self, i: u32) {
        self.0[i as usize].fetch_sub(1, SeqCst);
    }
}

/// Explore every interleaving with at most `PREEMPTIONS` forced thread switches (loom's
/// bound; the known bugs of lock-free stacks, ABA included, need two), so the file runs in
/// seconds.
fn model(f: impl Fn() + Sync + Send + 'static) {
    model_bounded(PREEMPTIONS, f);
}

fn model_bounded(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut m = loom::model::Builder::new();
    m.preemption_bound = Some(preemptions);
    m.check(f);
}

const PREEMPTIONS: usize = 2;

/// Pop every index left and check that together with `held` they are `0..n`, each once.
fn assert_all_back(s: &FreeStack, held: impl IntoIterator<Item = u32>, n: u32) {
    let mut seen = BTreeSet::new();
    for i in std::iter::from_fn(|| s.pop()).chain(held) {
        assert!(seen.insert(i), "index {i} twice in the stack");
    }
    assert_eq!(seen, (0..n).collect(), "an index was lost");
}

/// Run `body` on `n` loom threads sharing the stack and the owner table; join them all.
fn on_threads(n: usize, s: &Arc<FreeStack>, own: &Arc<Owners>, body: fn(&FreeStack, &Owners)) {
    let hs: Vec<_> = (0..n)
        .map(|_| {
            let (s, own) = (s.clone(), own.clone());
            thread::spawn(move || body(&s, &own))
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

/// Pop an index (when one is left), own it for a moment, push it back.
fn pop_use_push(s: &FreeStack, own: &Owners) {
    if let Some(i) = s.pop() {
        own.claim(i);
        own.release(i);
        s.push(i);
    }
}

#[test]
fn two_threads_pop_and_push_never_share_or_lose_an_index() {
    model(|| {
        let s = Arc::new(FreeStack::full(2));
        let own = Owners::new(2);
        on_threads(2, &s, &own, |s, own| {
            for _ in 0..2 {
                pop_use_push(s, own);
            }
        });
        assert_all_back(&s, [], 2);
    });
}

/// The ABA shape: one thread's pop reads head A and next B, then stalls; meanwhile another
/// pops A, pops B and pushes A back (head is A again, but B is out). An untagged compare-
/// exchange would succeed and make B, still owned, the head. The tag makes it fail.
#[test]
fn the_generation_tag_defeats_aba() {
    model(|| {
        let s = Arc::new(FreeStack::full(3));
        let own = Owners::new(3);
        let t1 = {
            let (s, own) = (s.clone(), own.clone());
            thread::spawn(move || {
                let i = s
                    .pop()
                    .expect("3 indices, at most 2 held by the other thread");
                own.claim(i);
                own.release(i);
                s.push(i);
            })
        };
        let t2 = {
            let (s, own) = (s.clone(), own.clone());
            thread::spawn(move || {
                let a = s.pop().expect("a");
                own.claim(a);
                let b = s.pop().expect("b");
                own.claim(b);
                own.release(a);
                s.push(a);
                // b stays out until the other thread is done with whatever it popped.
                b
            })
        };
        t1.join().unwrap();
        let b = t2.join().unwrap();
        own.release(b);
        assert_all_back(&s, [b], 3);
    });
}

#[test]
fn three_threads_contend_for_the_last_index() {
    // Three threads multiply the interleavings: one forced switch keeps it to seconds.
    model_bounded(1, || {
        let s = Arc::new(FreeStack::full(1));
        let own = Owners::new(1);
        on_threads(3, &s, &own, pop_use_push);
        assert_all_back(&s, [], 1);
    });
}

/// Two threads, each with its own magazine (2 indices) over a shared stack of 3: gets and
/// puts that refill from and spill to the stack never hand an index to two owners, and after
/// both magazines are drained every index is back exactly once.
#[test]
fn magazines_over_the_stack_never_share_or_lose_an_index() {
    model(|| {
        const CAP: usize = 2;
        let s = Arc::new(FreeStack::full(3));
        let own = Owners::new(3);
        on_threads(2, &s, &own, |s, own| {
            let mut mag = Magazine::with_capacity(CAP);
            let mut held = Vec::new();
            // Take two (the first refills), give both back (the second spills when the
            // magazine is full), take one again, then drain the magazine.
            for _ in 0..2 {
                if let Some((i, _)) = mag.take(CAP, || s.pop()) {
                    own.claim(i);
                    held.push(i);
                }
            }
            for i in held.drain(..) {
                own.release(i);
                mag.give(CAP, i, |x| s.push(x));
            }
            if let Some((i, _)) = mag.take(CAP, || s.pop()) {
                own.claim(i);
                own.release(i);
                mag.give(CAP, i, |x| s.push(x));
            }
            mag.drain(|x| s.push(x));
        });
        assert_all_back(&s, [], 3);
    });
}
