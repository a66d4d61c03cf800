//! Guest test: `ubdirect perf -w rw -a 1 -L --json` reports reads and writes apart,
//! both non-zero, and a latency histogram whose counts sum to the I/Os measured; the warm-up
//! is reported and, with `--progress always`, the once-a-second status line marks it. Runs on
//! nvme1 ns2 at 32M..40M (used by no other guest test of this guest; nvme0 holds the pattern
//! image other tests read, which -w rw would overwrite).

#[path = "support/schema.rs"]
mod schema;

use ubdirect_testbed as testbed;

const BIN: &str = "ubdirect";

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn rw_with_warmup_and_histogram_reports_directions_and_sums() {
    let tb = testbed::require();
    let nvme1 = tb.nvme[1].as_str();
    for (flag, detail) in [("-L", "buckets"), ("-LL", "full")] {
        let args = [
            "perf",
            nvme1,
            "--ns",
            "2",
            "-w",
            "rw",
            "-M",
            "50",
            "-q",
            "8",
            "-a",
            "1",
            "-t",
            "1",
            flag,
            "--offset",
            "32M",
            "--span",
            "8M",
            "--progress",
            "always",
            "--json",
        ];
        let (rc, out, err) = schema::run(BIN, &args, &[]);
        assert_eq!(rc, 0, "stderr: {err}\nstdout: {out}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        schema::validate(&v).unwrap();
        let leaks = &v["leaks"];
        assert_eq!(
            (
                leaks["pool_blocks_in_use"].as_u64(),
                leaks["mappings_beyond_expected"].as_u64()
            ),
            (Some(0), Some(0)),
            "{flag}: leaks at exit: {leaks}"
        );
        assert!(leaks["mappings_expected"].as_u64().unwrap() > 0, "{leaks}");
        assert_eq!(v["warmup_seconds"], 1.0, "{v}");
        let t = &v["total"];
        let ios = t["ios"].as_u64().unwrap();
        let (r, w) = (
            t["read"]["ios"].as_u64().unwrap(),
            t["write"]["ios"].as_u64().unwrap(),
        );
        assert!(r > 0 && w > 0, "{flag}: reads {r} writes {w}: {t}");
        assert_eq!(r + w, ios, "{flag}: {t}");
        assert!(t["read"]["iops"].as_f64().unwrap() > 0.0, "{t}");
        assert!(
            t["write"]["latency_ns"]["p50"].as_f64().unwrap() > 0.0,
            "{t}"
        );
        let h = &v["latency_histogram"];
        assert_eq!(h["detail"], detail, "{h}");
        let sum: u64 = h["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["count"].as_u64().unwrap())
            .sum();
        assert_eq!(sum, ios, "{flag}: histogram {h}");
        assert!(
            err.lines()
                .any(|l| l.contains("s warm-up]") && l.contains("IOPS")),
            "{flag}: no warm-up status line: {err}"
        );
    }
}
