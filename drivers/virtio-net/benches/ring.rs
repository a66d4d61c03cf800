//! Driver-side cost of the split ring per frame: push + publish + kick decision + reap, with a
//! minimal simulated device completing every buffer in order. This is the software path
//! length the burst API adds per frame (no device, no MMIO).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ubdirect_virtio_net::ring::{Descriptor, RingLayout, SplitRing, UsedElem};

struct Sim {
    l: RingLayout,
    base: *mut u8,
    last_avail: u16,
    used: u16,
}

impl Sim {
    /// Completes everything made available, in order, and asks for a kick at its next index.
    fn run(&mut self) {
        // SAFETY: bench memory laid out by RingLayout; offsets from the layout.
        unsafe {
            let avail = std::ptr::read_volatile(self.base.add(self.l.avail_idx()).cast::<u16>());
            while self.last_avail != avail {
                let slot = self.last_avail & (self.l.size - 1);
                let id =
                    std::ptr::read_volatile(self.base.add(self.l.avail_entry(slot)).cast::<u16>());
                let d = std::ptr::read_volatile(
                    self.base
                        .add(self.l.desc + 16 * id as usize)
                        .cast::<Descriptor>(),
                );
                let uslot = self.used & (self.l.size - 1);
                std::ptr::write_volatile(
                    self.base.add(self.l.used_entry(uslot)).cast::<UsedElem>(),
                    UsedElem {
                        id: id as u32,
                        len: d.len,
                    },
                );
                self.used = self.used.wrapping_add(1);
                self.last_avail = self.last_avail.wrapping_add(1);
            }
            std::ptr::write_volatile(self.base.add(self.l.used_idx()).cast::<u16>(), self.used);
            std::ptr::write_volatile(
                self.base.add(self.l.avail_event()).cast::<u16>(),
                self.last_avail,
            );
        }
    }
}

fn ring_cycle(c: &mut Criterion) {
    let mut g = c.benchmark_group("split_ring_cycle");
    for batch in [1usize, 8, 32, 128] {
        let size = 256u16;
        let l = RingLayout::new(size).unwrap();
        let mut mem = vec![0u64; l.total.div_ceil(8) + 8];
        let base = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: mem outlives the ring and the simulation in this closure.
        let mut ring = unsafe { SplitRing::new(base, 0x1000_0000, size, true) }.unwrap();
        let mut sim = Sim {
            l,
            base,
            last_avail: 0,
            used: 0,
        };
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_with_input(BenchmarkId::from_parameter(batch), &batch, |bch, &batch| {
            bch.iter(|| {
                for i in 0..batch {
                    ring.push(0x2000_0000 + (i as u64) * 4096, 1526, false)
                        .unwrap();
                }
                ring.publish();
                let kick = ring.kick_needed();
                sim.run();
                let mut n = 0;
                while let Some((_id, len)) = ring.pop_used().unwrap() {
                    n += len as usize;
                }
                ring.suppress_interrupts();
                std::hint::black_box((kick, n))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, ring_cycle);
criterion_main!(benches);
