//! The perf loop ([`worker`]) on the host, against the NVMe device model: a test that it runs
//! and accounts for its time, and the harness `scripts/bench/perf-insn.sh` runs under
//! callgrind (instructions per I/O of the loop's own bookkeeping beside the driver's).

use std::sync::Barrier;
use std::time::Duration;

use ubdirect::dma::util::Tsc;
use ubdirect::dma::{DmaDomain, PoolConfig, UbRegistry};
use ubdirect::nvme::{ControllerOptions, ShadowDoorbells};
use ubdirect::{Env, PoolMemory};
use ubdirect_devmodel::nvme::{NsConfig, NvmeConfig, NvmeModel};

use super::{fill_windows, worker, CoreResult, Counter, Job, Workload};

/// What to run on the model.
struct ModelRun {
    depth: usize,
    seconds: f64,
    workload: Workload,
    verify: bool,
}

/// One worker on core 0 against a fresh model (64 MiB namespace of 512-byte blocks, 4 KiB
/// I/O), its windows filled in as `finish` does.
fn run_on_model(r: &ModelRun) -> CoreResult {
    let reg = UbRegistry::new(DmaDomain::host_only());
    let cfg = NvmeConfig {
        namespaces: vec![NsConfig {
            nsid: 1,
            blocks: 1 << 17,
            lbads: 9,
        }],
        ..NvmeConfig::default()
    };
    let model = NvmeModel::new(&reg, cfg);
    let opts = ControllerOptions {
        io_queues: 1,
        shadow_doorbells: ShadowDoorbells::Off,
        ..Default::default()
    };
    let env = Env::builder()
        .registry(reg.clone())
        .nvme_device(model.attach(&reg))
        .controller_options(opts)
        .pool(PoolConfig {
            block_size: 4096,
            block_count: r.depth,
        })
        .pool_memory(PoolMemory::Anonymous)
        .open()
        .expect("open the model and the pool");
    let (ctrl, pool) = (env.controller(0), env.pool());
    let tsc = Tsc::calibrate(Duration::from_millis(20));
    let job = Job {
        nsid: 1,
        io_size: 4096,
        depth: r.depth,
        cmd_depth: r.depth,
        workload: r.workload,
        rwmixread: 50,
        lba_size: 512,
        first_block: 0,
        span_blocks: 1 << 17,
        duration: Duration::from_secs_f64(r.seconds),
        warmup: Duration::ZERO,
        done: vec![Counter::default()],
        verify: r.verify,
        shadow: false,
        sq_in_cmb: false,
        tsc,
        cores: 1,
    };
    let mut c = [worker(ctrl, pool, &job, 0, 0, &Barrier::new(1)).expect("worker")];
    fill_windows(&mut c, &tsc);
    let [c] = c;
    c
}

/// Each core's figures say where its time went: IOPS x mean latency / depth lies in (0, 1],
/// some time per I/O lies outside the window, and the directions' shares add up to the
/// core's.
#[test]
fn the_perf_loop_on_the_model_accounts_for_its_time() {
    for (depth, workload, verify) in [
        (1, Workload::Randread, false),
        (8, Workload::Rw, true),
        (32, Workload::Randread, false),
    ] {
        let c = run_on_model(&ModelRun {
            depth,
            seconds: 0.2,
            workload,
            verify,
        });
        let what = format!("QD{depth} {workload:?}");
        assert!(c.ios > 100, "{what}: {} I/Os", c.ios);
        assert_eq!((c.errors, c.verify_errors), (0, 0), "{what}");
        assert!(
            c.window_fraction > 0.0 && c.window_fraction <= 1.0 + 1e-6,
            "{what}: {}",
            c.window_fraction
        );
        assert!(c.outside_window_cycles_per_io > 0.0, "{what}");
        let shares = c.read.window_fraction + c.write.window_fraction;
        assert!(
            (shares - c.window_fraction).abs() < 0.01 * c.window_fraction,
            "{what}: {shares} vs {}",
            c.window_fraction
        );
    }
}

/// The harness of `scripts/bench/perf-insn.sh`: `UBD_PERF_QD` reads in flight (default 1) for
/// `UBD_PERF_SECONDS` (default 2); prints the I/Os completed and the doorbell writes.
#[test]
#[ignore = "a harness for callgrind (scripts/bench/perf-insn.sh)"]
fn perf_loop_on_the_model() {
    let env = |k: &str, d: f64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let depth = env("UBD_PERF_QD", 1.0) as usize;
    let c = run_on_model(&ModelRun {
        depth,
        seconds: env("UBD_PERF_SECONDS", 2.0),
        workload: Workload::Randread,
        verify: false,
    });
    let per = |x: f64| x * c.ios as f64;
    println!(
        "perf-model: depth {depth} completed {} sq_doorbells {:.0} cq_doorbells {:.0} window {:.3}",
        c.ios,
        per(c.sq_doorbell_writes_per_io),
        per(c.cq_doorbell_writes_per_io),
        c.window_fraction
    );
}
