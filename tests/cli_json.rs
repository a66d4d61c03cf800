//! Host tests of the built `ubdirect` binary: `--json` of devices, doctor (on a fake sysfs tree)
//! and pipeline (a file source through io_uring) validates against docs/json.md, and error paths
//! print no Rust type names.

#[path = "support/schema.rs"]
mod schema;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

const BIN: &str = env!("CARGO_BIN_EXE_ubdirect");

/// A fake sysfs tree: one NVMe controller on vfio-pci in IOMMU group 5, one ivshmem device.
struct Tree(PathBuf);

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn write(p: &Path, s: &str) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, s).unwrap();
}

fn fake_tree(name: &str) -> Tree {
    let root = std::env::temp_dir().join(format!("ubd-cli-json-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    let bar = "0x00000000fe000000 0x00000000fe003fff 0x0000000000140204\n";
    let none = "0x0000000000000000 0x0000000000000000 0x0000000000000000\n";
    for (addr, class, vendor, device, driver, group) in [
        (
            "0000:00:04.0",
            "0x010802",
            "0x1b36",
            "0x0010",
            "vfio-pci",
            5,
        ),
        (
            "0000:00:06.0",
            "0x050000",
            "0x1af4",
            "0x1110",
            "vfio-pci",
            6,
        ),
    ] {
        let rel = format!("sys/devices/pci0000:00/{addr}");
        let dir = root.join(&rel);
        write(&dir.join("vendor"), &format!("{vendor}\n"));
        write(&dir.join("device"), &format!("{device}\n"));
        write(&dir.join("class"), &format!("{class}\n"));
        write(&dir.join("numa_node"), "-1\n");
        write(&dir.join("resource"), &format!("{bar}{}", none.repeat(5)));
        fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
        symlink(
            Path::new("../../..").join(rel.trim_start_matches("sys/")),
            root.join(format!("sys/bus/pci/devices/{addr}")),
        )
        .unwrap();
        fs::create_dir_all(root.join(format!("sys/bus/pci/drivers/{driver}"))).unwrap();
        symlink(
            root.join(format!("sys/bus/pci/drivers/{driver}")),
            dir.join("driver"),
        )
        .unwrap();
        let g = root.join(format!("sys/kernel/iommu_groups/{group}"));
        fs::create_dir_all(g.join("devices")).unwrap();
        symlink(&g, dir.join("iommu_group")).unwrap();
        symlink(&dir, g.join(format!("devices/{addr}"))).unwrap();
    }
    write(&root.join("proc/cmdline"), "intel_iommu=on iommu=pt\n");
    Tree(root)
}

#[test]
fn devices_json_validates() {
    let t = fake_tree("devices");
    let env = [("UBD_SYSFS_ROOT", t.0.to_str().unwrap())];
    let v = schema::json_of(BIN, &["devices", "--json"], &env, 0);
    assert_eq!(v["command"], "devices");
    let devs = v["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 2, "{v}");
    assert_eq!(devs[0]["address"], "0000:00:04.0");
    assert_eq!(devs[0]["driver"], "vfio-pci");
}

#[test]
fn doctor_json_validates() {
    let t = fake_tree("doctor");
    let env = [("UBD_SYSFS_ROOT", t.0.to_str().unwrap())];
    // The fake machine lacks vfio modules and hugepages: findings, exit 1, still a document.
    let v = schema::json_of(BIN, &["doctor", "--json"], &env, 1);
    assert_eq!(v["command"], "doctor");
    assert!(v["errors"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["devices"][0], "0000:00:04.0");
}

#[test]
fn pipeline_json_from_a_file_validates() {
    let path = std::env::temp_dir().join(format!("ubd-cli-json-{}.bin", std::process::id()));
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7 + 3) as u8).collect();
    fs::write(&path, &data).unwrap();
    let src = format!("file:{}", path.display());
    let v = schema::json_of(BIN, &schema::pipeline_json_args(&src, &[]), &[], 0);
    let _ = fs::remove_file(&path);
    let runs = v["runs"].as_array().unwrap();
    let last = runs.last().unwrap();
    assert_eq!(last["label"], "pipeline");
    assert_eq!(last["bytes"], 1 << 20);
    assert_eq!(last["queue_depth"], 4);
    assert_eq!(last["verify"]["ok"], true, "{v}");
    assert!(runs.len() >= 2, "segments come first: {v}");
}

#[test]
fn error_paths_print_no_rust_type_names() {
    let t = fake_tree("errors");
    let root = t.0.to_str().unwrap();
    let cases: &[(&[&str], i32)] = &[
        (&["identify", "00:1f.7"], 1),
        (&["log", "smart", "00:1f.7"], 1),
        (&["perf", "00:1f.7", "-t", "0.1"], 1),
        (&["pipeline", "--source", "nvme:00:1f.7"], 1),
        (&["pipeline", "--source", "file:/nonexistent/x"], 1),
        (&["pipeline", "--source", "file:/dev/null", "--ns", "2"], 1),
        (&["pipeline", "--source", "disk:/x"], 2),
        (
            &["perf", "00:04.0", "--offset", "1M", "--offset-mib", "1"],
            2,
        ),
        (&["devices", "00:1f.7"], 1),
        (&["doctor", "00:1f.7"], 1),
        (
            &["loopback", "--tx", "0000:00:1f.6", "--rx", "0000:00:1f.6"],
            1,
        ),
    ];
    for (args, want) in cases {
        let (rc, out, err) = schema::run(BIN, args, &[("UBD_SYSFS_ROOT", root)]);
        assert_eq!(rc, *want, "ubdirect {args:?}:\n{out}\n{err}");
        assert!(err.contains("error"), "ubdirect {args:?} says why:\n{err}");
        if let Some(why) = schema::type_name_in(&err) {
            panic!("ubdirect {args:?} prints {why}:\n{err}");
        }
    }
}
