//! A fake sysfs tree in a temporary directory, for host unit tests.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use super::SysfsRoot;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A temporary root holding `sys/` and `proc/`; removed on drop.
pub(crate) struct FakeSysfs {
    dir: PathBuf,
}

/// One device to place in the fake tree.
pub(crate) struct FakeDev<'a> {
    pub addr: &'a str,
    /// Path components between the host bridge and the device (root ports, switches).
    pub parents: &'a [&'a str],
    pub vendor: &'a str,
    pub device: &'a str,
    pub class: &'a str,
    pub driver: Option<&'a str>,
    pub group: Option<u32>,
    pub numa: &'a str,
    pub resource: &'a str,
    /// (current speed, max speed, current width, max width); `None` leaves the files out.
    pub link: Option<(&'a str, &'a str, &'a str, &'a str)>,
}

impl FakeSysfs {
    pub(crate) fn new() -> Self {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ubd-topo-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("sys/bus/pci/devices")).unwrap();
        fs::create_dir_all(dir.join("sys/kernel/iommu_groups")).unwrap();
        fs::create_dir_all(dir.join("proc")).unwrap();
        FakeSysfs { dir }
    }

    pub(crate) fn root(&self) -> SysfsRoot {
        SysfsRoot::new(&self.dir)
    }

    pub(crate) fn write(&self, rel: &str, contents: &str) {
        let p = self.dir.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, contents).unwrap();
    }

    pub(crate) fn mkdir(&self, rel: &str) {
        fs::create_dir_all(self.dir.join(rel)).unwrap();
    }

    fn link(&self, target: &Path, at: &str) {
        let p = self.dir.join(at);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        symlink(target, p).unwrap();
    }

    pub(crate) fn add(&self, d: &FakeDev) {
        let mut rel = String::from("sys/devices/pci0000:00");
        for p in d.parents {
            rel.push('/');
            rel.push_str(p);
        }
        rel.push('/');
        rel.push_str(d.addr);
        self.write(&format!("{rel}/vendor"), &format!("{}\n", d.vendor));
        self.write(&format!("{rel}/device"), &format!("{}\n", d.device));
        self.write(&format!("{rel}/class"), &format!("{}\n", d.class));
        self.write(&format!("{rel}/numa_node"), &format!("{}\n", d.numa));
        self.write(&format!("{rel}/resource"), d.resource);
        if let Some((cs, ms, cw, mw)) = d.link {
            self.write(&format!("{rel}/current_link_speed"), &format!("{cs}\n"));
            self.write(&format!("{rel}/max_link_speed"), &format!("{ms}\n"));
            self.write(&format!("{rel}/current_link_width"), &format!("{cw}\n"));
            self.write(&format!("{rel}/max_link_width"), &format!("{mw}\n"));
        }
        // Relative, like the kernel's: ../../../devices/pci0000:00/...
        let target = PathBuf::from("../../..").join(rel.trim_start_matches("sys/"));
        self.link(&target, &format!("sys/bus/pci/devices/{}", d.addr));
        if let Some(drv) = d.driver {
            self.mkdir(&format!("sys/bus/pci/drivers/{drv}"));
            let t = self.dir.join(format!("sys/bus/pci/drivers/{drv}"));
            self.link(&t, &format!("{rel}/driver"));
        }
        if let Some(g) = d.group {
            let gdir = format!("sys/kernel/iommu_groups/{g}");
            self.mkdir(&format!("{gdir}/devices"));
            self.link(&self.dir.join(&gdir), &format!("{rel}/iommu_group"));
            self.link(&self.dir.join(&rel), &format!("{gdir}/devices/{}", d.addr));
        }
    }
}

impl Drop for FakeSysfs {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}
