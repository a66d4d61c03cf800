//! The NUMA node a PCI device reports in sysfs (the one topology fact the drivers need; the
//! full sysfs topology lives in the `ubdirect-diag` crate).

use std::path::Path;

use super::PciAddress;

/// The NUMA node of `addr` from `/sys/bus/pci/devices/<addr>/numa_node`; `None` when the file
/// is absent, unreadable or holds -1 (no NUMA information).
pub fn numa_node(addr: PciAddress) -> Option<u32> {
    numa_node_below(Path::new("/"), addr)
}

/// Like [`numa_node`], with `root` standing for `/` (host tests use a fake tree).
pub fn numa_node_below(root: &Path, addr: PciAddress) -> Option<u32> {
    let file = root
        .join("sys/bus/pci/devices")
        .join(addr.to_string())
        .join("numa_node");
    let text = std::fs::read_to_string(file).ok()?;
    u32::try_from(text.trim().parse::<i64>().ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_node_reads_the_device_file_and_minus_one_is_none() {
        let root = std::env::temp_dir().join(format!("ubd-numa-{}", std::process::id()));
        let a: PciAddress = "0000:01:00.0".parse().unwrap();
        let b: PciAddress = "0000:00:02.0".parse().unwrap();
        let c: PciAddress = "0000:00:1e.7".parse().unwrap();
        for (addr, text) in [(a, "1\n"), (b, "-1\n")] {
            let dir = root.join("sys/bus/pci/devices").join(addr.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("numa_node"), text).unwrap();
        }
        assert_eq!(numa_node_below(&root, a), Some(1));
        assert_eq!(
            numa_node_below(&root, b),
            None,
            "-1 means no NUMA information"
        );
        assert_eq!(numa_node_below(&root, c), None, "no such device");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
