//! Host tests of the split ring against a simulated device that reads the avail ring and
//! writes the used ring exactly as the spec lays them out.

use super::*;
use crate::ring::layout;
use proptest::prelude::*;
use std::collections::HashMap;

/// Ring memory: u64-backed so it is 8-byte aligned; 64-byte alignment is not needed by the
/// simulation.
struct Mem(Vec<u64>);
impl Mem {
    fn new(size: u16) -> Mem {
        let l = RingLayout::new(size).unwrap();
        Mem(vec![0u64; l.total.div_ceil(8) + 8])
    }
    fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr().cast()
    }
}

/// The device side.
struct SimDev {
    l: RingLayout,
    base: *mut u8,
    last_avail: u16,
    used_idx: u16,
}
impl SimDev {
    fn new(ring: &SplitRing, base: *mut u8, start: u16) -> SimDev {
        SimDev {
            l: *ring.layout(),
            base,
            last_avail: start,
            used_idx: start,
        }
    }
    fn r16(&self, off: usize) -> u16 {
        // SAFETY: test memory, offsets from the layout.
        unsafe { core::ptr::read_volatile(self.base.add(off).cast::<u16>()) }
    }
    fn w16(&self, off: usize, v: u16) {
        // SAFETY: test memory, offsets from the layout.
        unsafe { core::ptr::write_volatile(self.base.add(off).cast::<u16>(), v) }
    }
    /// Takes up to `n` newly available buffers: (id, descriptor).
    fn take(&mut self, n: usize) -> Vec<(u16, Descriptor)> {
        let avail = self.r16(self.l.avail_idx());
        let mut out = vec![];
        while self.last_avail != avail && out.len() < n {
            let id = self.r16(self.l.avail_entry(self.last_avail & (self.l.size - 1)));
            // SAFETY: id is checked by the caller's assertions; test memory.
            let d = unsafe {
                core::ptr::read_volatile(
                    self.base
                        .add(self.l.desc + 16 * id as usize)
                        .cast::<Descriptor>(),
                )
            };
            out.push((id, d));
            self.last_avail = self.last_avail.wrapping_add(1);
        }
        out
    }
    fn set_avail_event(&self, v: u16) {
        self.w16(self.l.avail_event(), v);
    }
    fn complete(&mut self, id: u32, len: u32) {
        let slot = self.used_idx & (self.l.size - 1);
        // SAFETY: test memory, slot < size.
        unsafe {
            core::ptr::write_volatile(
                self.base.add(self.l.used_entry(slot)).cast::<UsedElem>(),
                UsedElem { id, len },
            )
        };
        self.used_idx = self.used_idx.wrapping_add(1);
        self.w16(self.l.used_idx(), self.used_idx);
    }
    fn used_event(&self) -> u16 {
        self.r16(self.l.used_event())
    }
}

fn setup(size: u16, event_idx: bool, start: u16) -> (Mem, SplitRing, SimDev) {
    let mut m = Mem::new(size);
    let p = m.ptr();
    // SAFETY: m outlives ring and sim in every test (returned together, dropped last).
    let ring =
        unsafe { SplitRing::with_start_index(p, 0x10_0000, size, event_idx, start) }.unwrap();
    let sim = SimDev::new(&ring, p, start);
    (m, ring, sim)
}

#[test]
fn push_publish_pop_roundtrip() {
    let (_m, mut r, mut d) = setup(8, true, 0);
    assert_eq!(r.desc_iova(), 0x10_0000);
    assert_eq!(r.avail_iova(), 0x10_0000 + 128);
    let a = r.push(0xdead_0000, 100, true).unwrap();
    let b = r.push(0xbeef_0000, 200, false).unwrap();
    assert!(d.take(8).is_empty(), "nothing visible before publish");
    r.publish();
    let got = d.take(8);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].0, a);
    assert_eq!(got[0].1.addr, 0xdead_0000);
    assert_eq!(got[0].1.flags, layout::DESC_F_WRITE);
    assert_eq!(got[1].1.len, 200);
    assert_eq!(got[1].1.flags, 0);
    d.complete(b as u32, 0);
    d.complete(a as u32, 64);
    assert_eq!(r.pop_used().unwrap(), Some((b, 0)));
    assert_eq!(r.pop_used().unwrap(), Some((a, 64)));
    assert_eq!(r.pop_used().unwrap(), None);
    assert_eq!(r.in_flight(), 0);
}

#[test]
fn full_ring_refuses_push() {
    let (_m, mut r, _d) = setup(4, false, 0);
    for _ in 0..4 {
        assert!(r.push(0x1000, 1, false).is_some());
    }
    assert_eq!(r.push(0x1000, 1, false), None);
    assert_eq!(r.free_count(), 0);
}

#[test]
fn bad_id_and_duplicate_are_errors_and_change_nothing() {
    let (_m, mut r, mut d) = setup(4, false, 0);
    let a = r.push(0x1000, 1, false).unwrap();
    r.publish();
    d.take(4);
    d.complete(99, 0);
    assert_eq!(r.pop_used(), Err(RingError::BadId { id: 99, size: 4 }));
    assert_eq!(r.in_flight(), 1, "nothing changed");
    // A fresh ring: complete the same id twice.
    let (_m2, mut r2, mut d2) = setup(4, false, 0);
    let x = r2.push(0x1000, 1, false).unwrap();
    r2.publish();
    d2.take(4);
    d2.complete(x as u32, 0);
    d2.complete(x as u32, 0);
    // The index says two were used but only one was in flight: overrun.
    assert!(matches!(
        r2.pop_used(),
        Err(RingError::Overrun { in_flight: 1, .. })
    ));
    let _ = a;
}

#[test]
fn a_two_descriptor_chain_is_one_buffer_and_its_tail_is_never_a_completion() {
    let (_m, mut r, mut d) = setup(4, false, 0);
    let h = r.push_chain2((0x1000, 12), (0x2000, 100)).unwrap();
    let single = r.push(0x3000, 60, false).unwrap();
    assert_eq!(r.in_flight(), 2, "buffers, not descriptors");
    assert_eq!(r.free_count(), 1);
    assert_eq!(
        r.push_chain2((0x1000, 12), (0x4000, 100)),
        None,
        "one free descriptor holds no chain"
    );
    assert_eq!(r.free_count(), 1, "the refused chain took nothing");
    r.publish();
    let got = d.take(4);
    assert_eq!(got.len(), 2, "one avail entry per buffer");
    let (head, hd) = got[0];
    assert_eq!(head, h);
    assert_eq!(
        (hd.addr, hd.len, hd.flags),
        (0x1000, 12, layout::DESC_F_NEXT)
    );
    let tail = hd.next;
    assert!(tail != h && tail != single);
    // SAFETY: tail < 4 (checked by the ring's free list), test memory.
    let td = unsafe {
        core::ptr::read_volatile(
            d.base
                .add(d.l.desc + 16 * tail as usize)
                .cast::<Descriptor>(),
        )
    };
    assert_eq!((td.addr, td.len, td.flags), (0x2000, 100, 0));
    // The chain's second descriptor is no buffer: a completion naming it is refused.
    d.complete(u32::from(tail), 0);
    assert_eq!(r.pop_used(), Err(RingError::NotInFlight { id: tail }));
    assert_eq!(r.in_flight(), 2, "nothing changed");
}

#[test]
fn a_completed_chain_gives_both_descriptors_back() {
    let (_m, mut r, mut d) = setup(4, false, 0);
    for round in 0..10u64 {
        let a = r.push_chain2((0x1000, 12), (0x2000 + round, 100)).unwrap();
        let b = r.push_chain2((0x1000, 12), (0x3000 + round, 100)).unwrap();
        assert_eq!(r.free_count(), 0, "round {round}");
        r.publish();
        assert_eq!(d.take(4).len(), 2);
        d.complete(u32::from(b), 0);
        d.complete(u32::from(a), 0);
        assert_eq!(r.pop_used().unwrap(), Some((b, 0)));
        assert_eq!(r.pop_used().unwrap(), Some((a, 0)));
        assert_eq!((r.in_flight(), r.free_count()), (0, 4), "round {round}");
    }
    let _ = r.push_chain2((0x1000, 12), (0x2000, 100)).unwrap();
    let mut drained = 0;
    r.drain_after_reset(|_| drained += 1);
    assert_eq!(drained, 2, "both descriptors of the chain");
    assert_eq!((r.in_flight(), r.free_count()), (0, 4));
}

#[test]
fn not_in_flight_id_is_refused() {
    let (_m, mut r, mut d) = setup(4, false, 0);
    let a = r.push(0x1000, 1, false).unwrap();
    let _b = r.push(0x2000, 1, false).unwrap();
    r.publish();
    d.take(4);
    d.complete(a as u32, 0);
    d.complete(a as u32, 0);
    assert_eq!(r.pop_used().unwrap(), Some((a, 0)));
    assert_eq!(r.pop_used(), Err(RingError::NotInFlight { id: a }));
}

#[test]
fn all_ones_used_index_is_overrun() {
    // A device that fell off the bus reads back as all ones.
    let (_m, mut r, d) = setup(8, false, 0);
    r.push(0x1000, 1, false).unwrap();
    r.publish();
    d.w16(d.l.used_idx(), 0xffff);
    assert!(matches!(
        r.pop_used(),
        Err(RingError::Overrun {
            used_idx: 0xffff,
            ..
        })
    ));
}

#[test]
fn event_idx_kicks_only_when_asked() {
    let (_m, mut r, d) = setup(16, true, 0);
    // Device asks to be told at index 0 (it has seen nothing yet).
    d.set_avail_event(0);
    r.push(1, 1, false);
    r.publish();
    assert!(r.kick_needed(), "first buffer passes event 0");
    assert!(!r.kick_needed(), "nothing new");
    // The device has not moved its event: more buffers need no doorbell.
    r.push(2, 1, false);
    r.push(3, 1, false);
    r.publish();
    assert!(!r.kick_needed());
    // The device now wants to hear about index 5.
    d.set_avail_event(5);
    r.push(4, 1, false);
    r.publish(); // idx 4
    assert!(!r.kick_needed());
    r.push(5, 1, false);
    r.push(6, 1, false);
    r.publish(); // idx 6: passes 5
    assert!(r.kick_needed());
}

#[test]
fn no_event_idx_uses_no_notify_flag() {
    let (_m, mut r, d) = setup(8, false, 0);
    r.push(1, 1, false);
    r.publish();
    assert!(r.kick_needed());
    d.w16(d.l.used, layout::USED_F_NO_NOTIFY);
    r.push(1, 1, false);
    r.publish();
    assert!(!r.kick_needed());
}

#[test]
fn suppress_interrupts_keeps_used_event_behind() {
    let (_m, mut r, mut d) = setup(8, true, 0);
    for _ in 0..3 {
        r.push(1, 1, false);
    }
    r.publish();
    for (id, _) in d.take(8) {
        d.complete(id as u32, 0);
    }
    while r.pop_used().unwrap().is_some() {}
    r.suppress_interrupts();
    let ev = d.used_event();
    // The next completion moves used from 3 to 4: must not pass the event.
    assert!(!vring_need_event(ev, 4, 3));
    assert!(
        !vring_need_event(ev, 3 + 8, 3),
        "not even a full ring later"
    );
}

#[test]
fn wraps_16_bit_indices_many_times() {
    // 2^16 + change operations on a ring of 8 starting near the wrap point.
    let (_m, mut r, mut d) = setup(8, true, 65530);
    let mut sent = 0u64;
    let mut got = 0u64;
    let mut kicks = 0u64;
    while got < 200_000 {
        while let Some(_id) = r.push(sent, (sent % 1500) as u32, false) {
            sent += 1;
        }
        r.publish();
        if r.kick_needed() {
            kicks += 1;
        }
        // Device completes in reverse order, and asks for a kick at its next index.
        let mut batch = d.take(8);
        d.set_avail_event(d.last_avail);
        batch.reverse();
        let mut expect: HashMap<u16, u64> = HashMap::new();
        for (id, desc) in &batch {
            expect.insert(*id, desc.addr);
            d.complete(*id as u32, desc.len);
        }
        while let Some((id, len)) = r.pop_used().unwrap() {
            let addr = expect.remove(&id).expect("completed id was queued");
            assert_eq!(len as u64, addr % 1500);
            got += 1;
        }
        assert!(expect.is_empty());
    }
    assert_eq!(r.in_flight(), 0);
    assert!(kicks > 0 && kicks <= got);
}

#[derive(Debug, Clone)]
enum Op {
    Push(u8),
    Device { take: u8, complete: u8, shuffle: u8 },
    Pop(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u8..20).prop_map(Op::Push),
        (0u8..20, 0u8..20, any::<u8>()).prop_map(|(take, complete, shuffle)| Op::Device {
            take,
            complete,
            shuffle
        }),
        (1u8..20).prop_map(Op::Pop),
    ]
}

proptest! {
    /// Random interleavings of driver pushes, device completions (in any order) and driver
    /// reaps never lose, duplicate or invent a buffer, across 16-bit index wrap-around.
    #[test]
    fn ring_model(size_pow in 0u32..6, start in any::<u16>(), ops in proptest::collection::vec(op(), 1..300)) {
        let size = 1u16 << size_pow;
        let (_m, mut r, mut d) = setup(size, true, start);
        let mut next_tag = 1u64;
        let mut queued: HashMap<u16, u64> = HashMap::new();   // id -> tag (given to device)
        let mut at_device: Vec<(u16, u64)> = vec![];          // taken, not completed
        let mut completed: HashMap<u16, u64> = HashMap::new(); // completed, not popped
        for o in ops {
            match o {
                Op::Push(n) => {
                    for _ in 0..n {
                        match r.push(next_tag, 0, true) {
                            Some(id) => {
                                prop_assert!(!queued.contains_key(&id));
                                prop_assert!(!completed.contains_key(&id));
                                prop_assert!(!at_device.iter().any(|(i, _)| *i == id));
                                queued.insert(id, next_tag);
                                next_tag += 1;
                            }
                            None => prop_assert_eq!(r.free_count(), 0),
                        }
                    }
                    r.publish();
                    let _ = r.kick_needed();
                }
                Op::Device { take, complete, shuffle } => {
                    for (id, desc) in d.take(take as usize) {
                        prop_assert_eq!(queued.remove(&id), Some(desc.addr));
                        at_device.push((id, desc.addr));
                    }
                    if !at_device.is_empty() {
                        let k = shuffle as usize % at_device.len();
                        at_device.rotate_left(k);
                    }
                    for _ in 0..complete.min(at_device.len() as u8) {
                        let (id, tag) = at_device.pop().unwrap();
                        d.complete(id as u32, tag as u32);
                        completed.insert(id, tag);
                    }
                }
                Op::Pop(n) => {
                    for _ in 0..n {
                        match r.pop_used().unwrap() {
                            Some((id, len)) => {
                                let tag = completed.remove(&id);
                                prop_assert_eq!(tag.map(|t| t as u32), Some(len));
                            }
                            None => { prop_assert!(completed.is_empty()); break; }
                        }
                    }
                }
            }
            prop_assert_eq!(r.in_flight(), queued.len() + at_device.len() + completed.len());
        }
    }
}

#[test]
fn used_len_beyond_the_buffer_is_an_error_and_changes_nothing() {
    let (_m, mut r, mut d) = setup(4, false, 0);
    let a = r.push(0x1000, 1526, true).unwrap();
    r.publish();
    d.take(4);
    d.complete(a as u32, 1527);
    let e = Err(RingError::BadLen {
        id: a,
        len: 1527,
        max: 1526,
    });
    assert_eq!(r.pop_used_within(1526), e);
    assert_eq!(
        r.pop_used_within(1526),
        e,
        "reported again: nothing consumed"
    );
    assert_eq!(r.in_flight(), 1, "the buffer is still the device's");
    assert!(r
        .pop_used_within(1526)
        .unwrap_err()
        .to_string()
        .contains("1527 bytes"));
}

/// What a hostile device does to the used ring between two driver calls.
#[derive(Debug, Clone)]
enum Hostile {
    /// The driver posts `n` buffers of `len` bytes.
    Push(u8),
    /// The device writes one used element at `slot` (any id, any len).
    Elem { slot: u16, id: u32, len: u32 },
    /// The device sets used->idx to any value.
    Idx(u16),
    /// The device moves used->idx forward by `n` (possibly more than the ring).
    Bump(u16),
    /// The driver reaps up to `n`.
    Pop(u8),
}

fn hostile() -> impl Strategy<Value = Hostile> {
    prop_oneof![
        (1u8..20).prop_map(Hostile::Push),
        (any::<u16>(), any::<u32>(), any::<u32>()).prop_map(|(slot, id, len)| Hostile::Elem {
            slot,
            id,
            len
        }),
        any::<u16>().prop_map(Hostile::Idx),
        (0u16..80).prop_map(Hostile::Bump),
        (1u8..20).prop_map(Hostile::Pop),
    ]
}

proptest! {
    #![proptest_config(crate::fuzz_cases::config())]

    /// Fuzz target `fuzz_used_ring`: a device writing anything into the used ring (any id,
    /// any len, any used->idx, jumps past the ring size) never makes the driver panic, hand
    /// back an id that was not in flight, a length beyond the buffer, or lose count.
    #[test]
    fn fuzz_used_ring(size_pow in 0u32..6, start in any::<u16>(), ops in proptest::collection::vec(hostile(), 1..24)) {
        const BUF: u32 = 1526;
        let size = 1u16 << size_pow;
        let (_m, mut r, d) = setup(size, true, start);
        let mut in_flight = std::collections::HashSet::new();
        for o in ops {
            match o {
                Hostile::Push(n) => {
                    for _ in 0..n {
                        let Some(id) = r.push(0x1000, BUF, true) else { break };
                        prop_assert!(in_flight.insert(id), "id {} handed out twice", id);
                    }
                    r.publish();
                }
                Hostile::Elem { slot, id, len } => {
                    let slot = slot & (size - 1);
                    // SAFETY: test memory, slot < size.
                    unsafe {
                        core::ptr::write_volatile(
                            d.base.add(d.l.used_entry(slot)).cast::<UsedElem>(),
                            UsedElem { id, len },
                        )
                    };
                }
                Hostile::Idx(v) => d.w16(d.l.used_idx(), v),
                Hostile::Bump(n) => {
                    let v = d.r16(d.l.used_idx()).wrapping_add(n);
                    d.w16(d.l.used_idx(), v);
                }
                Hostile::Pop(n) => {
                    for _ in 0..n {
                        let before = r.in_flight();
                        match r.pop_used_within(BUF) {
                            Ok(Some((id, len))) => {
                                prop_assert!(in_flight.remove(&id), "id {} was not in flight", id);
                                prop_assert!(len <= BUF);
                            }
                            Ok(None) => break,
                            Err(e) => {
                                prop_assert_eq!(r.in_flight(), before, "an error changed the ring: {}", e);
                                break;
                            }
                        }
                    }
                }
            }
            prop_assert_eq!(r.in_flight(), in_flight.len());
        }
    }
}
