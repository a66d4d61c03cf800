//! Guest test: `ubdirect perf -c 0,1` runs one queue pair per core on the test bed's
//! 2 vCPUs and reports each core apart and the total: one per-core line per core in the table,
//! and in the JSON two `cores` entries (cores 0 and 1, each on its own I/O queue, each with
//! I/O done) whose I/Os and IOPS add up to the total's. Read-only, on nvme1 ns2 40M..48M.

#[path = "support/schema.rs"]
mod schema;

use ubdirect_testbed as testbed;

const BIN: &str = "ubdirect";

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn two_cores_get_a_queue_pair_each_and_lines_that_sum_to_the_total() {
    let tb = testbed::require();
    let nvme1 = tb.nvme[1].as_str();
    let base = [
        "perf", nvme1, "--ns", "2", "-c", "0,1", "-q", "8", "-o", "4k", "-w", "randread", "-t",
        "1", "--offset", "40M", "--span", "8M",
    ];
    let mut json_args = base.to_vec();
    json_args.push("--json");
    let v = schema::json_of(BIN, &json_args, &[], 0);
    let cores = v["cores"].as_array().expect("cores array");
    assert_eq!(cores.len(), 2, "{v}");
    let ids: Vec<u64> = cores.iter().map(|c| c["core"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![0, 1], "{v}");
    let qids: Vec<u64> = cores.iter().map(|c| c["qid"].as_u64().unwrap()).collect();
    assert_ne!(qids[0], qids[1], "one I/O queue per core: {v}");
    let ios: Vec<u64> = cores.iter().map(|c| c["ios"].as_u64().unwrap()).collect();
    assert!(ios.iter().all(|&n| n > 0), "every core did I/O: {v}");
    let t = &v["total"];
    assert_eq!(t["ios"].as_u64().unwrap(), ios.iter().sum::<u64>(), "{v}");
    assert_eq!(t["errors"], 0, "{v}");
    let iops: f64 = cores.iter().map(|c| c["iops"].as_f64().unwrap()).sum();
    let total = t["iops"].as_f64().unwrap();
    assert!(
        (total - iops).abs() <= total * 1e-9,
        "total IOPS {total} is the cores' sum {iops}"
    );
    let (rc, out, err) = schema::run(BIN, &base, &[]);
    assert_eq!(rc, 0, "stderr: {err}\nstdout: {out}");
    for core in [0, 1] {
        let tag = format!("NSID 2 from core {core:>2}");
        assert_eq!(
            out.lines().filter(|l| l.contains(&tag)).count(),
            1,
            "one line for core {core}: {out}"
        );
    }
    assert_eq!(
        out.lines().filter(|l| l.starts_with("Total ")).count(),
        1,
        "{out}"
    );
}
