//! Instructions per I/O of the driver's own code, for `valgrind --tool=callgrind`:
//! the real queue pair against the NVMe device model on the host, keeping `DEPTH` 4 KiB reads
//! in flight as `ubdirect perf` does (submit every free buffer, one `ring`, then `poll`). The
//! three steps are functions of their own ([`submit_batch`], [`ring`], [`reap`]) so that
//! callgrind's inclusive counts give instructions per I/O of each; the model completes
//! commands inside the doorbell write (in `ring`), so `ring`'s count includes the model: its
//! own share is what `callgrind_annotate` attributes to `drivers/nvme/src`.
//!
//! ```text
//! cargo build --release -p ubdirect-nvme --example insn_per_io
//! valgrind --tool=callgrind --callgrind-out-file=cg.out \
//!     target/release/examples/insn_per_io DEPTH IOS
//! callgrind_annotate --inclusive=yes cg.out | grep insn_per_io::
//! ```
//! `scripts/bench/nvme-insn.sh` does this for QD 1, 32 and 128 and prints the table.

use std::time::Duration;

use ubdirect_core::{DmaDomain, PoolConfig, UbPool, UbRegistry};
use ubdirect_devmodel::nvme::{NvmeConfig, NvmeModel};
use ubdirect_nvme::{
    Controller, ControllerOptions, IoBuf, IoBufs, IoFlags, IoQueuePair, Lba, Namespace,
    QueueOptions,
};

/// Submit a read for every free buffer (no doorbell). Returns how many.
#[inline(never)]
fn submit_batch(
    qp: &mut IoQueuePair,
    ns: &Namespace,
    free: &mut Vec<(usize, IoBuf)>,
    rng: &mut u64,
    span: u64,
) -> usize {
    let mut n = 0;
    while let Some((slot, buf)) = free.pop() {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        let lba = (*rng % span) * 8;
        if let Err(r) = qp.submit_read(ns, Lba(lba), buf, IoFlags::empty(), slot as u64) {
            panic!("submit: {}", r.error);
        }
        n += 1;
    }
    n
}

/// The SQ tail doorbell for the batch (the model fetches and completes the reads here).
#[inline(never)]
fn ring(qp: &mut IoQueuePair) {
    qp.ring();
}

/// One poll; every completed read's buffer goes back to `free`.
#[inline(never)]
fn reap(qp: &mut IoQueuePair, free: &mut Vec<(usize, IoBuf)>, depth: usize) -> usize {
    qp.poll(depth, |c| {
        let IoBufs::One(b) = c.bufs else {
            unreachable!("a single-buffer read")
        };
        c.result.expect("read failed");
        free.push((c.tag as usize, b));
    })
    .expect("poll")
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut arg = |what: &str, default: u64| -> u64 {
        args.next()
            .map(|s| s.parse().unwrap_or_else(|_| panic!("{what}: a number")))
            .unwrap_or(default)
    };
    let depth = arg("DEPTH", 32) as usize;
    let ios = arg("IOS", 20_000);
    let reg = UbRegistry::new(DmaDomain::host_only());
    let model = NvmeModel::new(&reg, NvmeConfig::default());
    let dev = model.attach(&reg);
    let ctrl = Controller::open_device(&reg, dev, ControllerOptions::default()).unwrap();
    let pool = UbPool::with_anonymous(
        &reg,
        PoolConfig {
            block_size: 4096,
            block_count: depth,
        },
        None,
    )
    .unwrap();
    let mut qp = IoQueuePair::new(
        &ctrl,
        QueueOptions {
            depth,
            shadow_doorbells: false,
            ..QueueOptions::default()
        },
    )
    .unwrap();
    let ns = qp.namespace(1).unwrap();
    let span = ns.blocks() / 8;
    let mut free: Vec<(usize, IoBuf)> = (0..depth)
        .map(|i| (i, IoBuf::prefix(pool.get().unwrap(), 4096).unwrap()))
        .collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let (mut submitted, mut done, mut polls, mut empty) = (0u64, 0u64, 0u64, 0u64);
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    while done < ios {
        if submitted < ios {
            submitted += submit_batch(&mut qp, &ns, &mut free, &mut rng, span) as u64;
            ring(&mut qp);
        }
        let n = reap(&mut qp, &mut free, depth) as u64;
        polls += 1;
        if n == 0 {
            empty += 1;
            assert!(std::time::Instant::now() < deadline, "no progress");
        }
        done += n;
    }
    let st = qp.stats();
    println!(
        "depth {depth} submitted {submitted} completed {done} polls {polls} empty_polls {empty} sq_doorbells {} cq_doorbells {}",
        st.sq_doorbell_writes, st.cq_doorbell_writes
    );
}
