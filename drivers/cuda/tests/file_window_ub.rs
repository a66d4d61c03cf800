//! Host tests (no GPU, no vfio) of file windows registered in a UB registry as well: each
//! window is one mapping, a read-only UB file region of the registry's DMA domain (a host-only
//! domain here: IOVAs are bookkeeping) and pinned by the (recording) CUDA pinner over the same
//! memory; eviction, reuse and a changed file keep both registrations in step.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use ubdirect_core::{DmaDomain, RegionKind, UbRegistry};
use ubdirect_cuda::{FileWindowRegistry, HostPinner, WindowError};

mod support;
use support::FakePinner;

/// A file of `len` bytes, byte i = (i / 4096) as u8; removed on drop.
struct DataFile(PathBuf);

impl DataFile {
    fn new(name: &str, len: usize) -> DataFile {
        let p = std::env::temp_dir().join(format!("ubd-fwub-{}-{name}", std::process::id()));
        let bytes: Vec<u8> = (0..len).map(|i| (i / 4096) as u8).collect();
        File::create(&p).unwrap().write_all(&bytes).unwrap();
        DataFile(p)
    }
    fn open(&self) -> File {
        File::open(&self.0).unwrap()
    }
}

impl Drop for DataFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn setup(
    cap: u64,
) -> (
    Arc<FakePinner>,
    Arc<DmaDomain>,
    Arc<UbRegistry>,
    FileWindowRegistry,
) {
    let pinner = Arc::new(FakePinner::default());
    let d = DmaDomain::host_only();
    let ub = UbRegistry::new(d.clone());
    let reg = FileWindowRegistry::with_ub_registry(pinner.clone(), cap, ub.clone());
    (pinner, d, ub, reg)
}

#[test]
fn a_window_is_one_mapping_pinned_for_cuda_and_mapped_read_only_in_the_domain() {
    let f = DataFile::new("one", 64 * 4096);
    let (pinner, d, ub, reg) = setup(1 << 30);
    let w = reg.acquire(&f.open(), 5 * 4096 + 100, 8 * 4096).unwrap();
    let r = w.region().expect("a UB file region").clone();
    assert!(r.is_read_only());
    assert!(matches!(r.kind, RegionKind::File { offset: 20480, .. }));
    assert_eq!(
        (ub.regions().len(), d.mapping_count(), pinner.live()),
        (1, 1, 1)
    );
    assert_eq!(
        pinner.ranges()[0],
        (r.vaddr as usize, r.len),
        "CUDA pins the region's own mapping"
    );
    assert_eq!(w.iova(), Some(r.iova + 100));
    assert_eq!(
        ub.iova_of(w.as_ptr()),
        w.iova(),
        "the window's bytes are the region's"
    );
    // SAFETY: the window maps len() readable bytes.
    let first = unsafe { *w.as_ptr() };
    assert_eq!(first, 5);
    // A second pass reuses both registrations.
    let again = reg.acquire(&f.open(), 5 * 4096 + 100, 8 * 4096).unwrap();
    assert!(Arc::ptr_eq(&w, &again));
    assert_eq!((ub.regions().len(), pinner.live()), (1, 1));
    assert_eq!(reg.stats().reused, 1);
}

#[test]
fn eviction_unregisters_the_region_once_the_last_holder_goes() {
    let f = DataFile::new("evict", 64 * 4096);
    let (pinner, d, ub, reg) = setup(16 * 4096);
    let a = reg.acquire(&f.open(), 0, 16 * 4096).unwrap();
    let a_region = a.region().unwrap().id;
    let b = reg.acquire(&f.open(), 16 * 4096, 16 * 4096).unwrap();
    assert_eq!(reg.stats().evicted, 1);
    assert_eq!(ub.regions().len(), 2, "a is evicted but still held");
    // Acquiring a again while it is held takes the held window back: no second registration.
    let a2 = reg.acquire(&f.open(), 0, 16 * 4096).unwrap();
    assert!(Arc::ptr_eq(&a, &a2));
    assert_eq!((ub.regions().len(), pinner.live()), (2, 2));
    drop((a, a2));
    drop(b); // b was evicted by a's return and is no longer held: both registrations go
    assert_eq!(ub.regions().len(), 1);
    assert_eq!(ub.regions()[0].id, a_region);
    assert_eq!((d.mapping_count(), pinner.live()), (1, 1));
    reg.clear();
    assert_eq!(
        (ub.regions().len(), d.mapping_count(), pinner.live()),
        (0, 0, 0)
    );
}

#[test]
fn a_changed_file_drops_its_windows_and_maps_the_new_contents_as_a_new_region() {
    let f = DataFile::new("trunc", 32 * 4096);
    let (pinner, d, ub, reg) = setup(1 << 30);
    let w = reg.acquire(&f.open(), 0, 32 * 4096).unwrap();
    let old = w.region().unwrap().clone();
    OpenOptions::new()
        .write(true)
        .open(&f.0)
        .unwrap()
        .set_len(8 * 4096)
        .unwrap();
    let e = ub.check_file_region(&old).unwrap_err();
    assert!(e.to_string().contains("size 131072 -> 32768 bytes"), "{e}");
    let e = reg.acquire(&f.open(), 0, 8 * 4096).unwrap_err();
    assert!(
        matches!(e, WindowError::FileChanged { dropped: 1, .. }),
        "{e}"
    );
    let n = reg.acquire(&f.open(), 0, 8 * 4096).unwrap();
    assert_ne!(n.region().unwrap().id, old.id);
    assert_eq!(
        (ub.regions().len(), pinner.live()),
        (2, 2),
        "w is still held"
    );
    drop(w);
    assert_eq!(
        (ub.regions().len(), d.mapping_count(), pinner.live()),
        (1, 1, 1)
    );
}

#[test]
fn a_range_registered_by_another_ub_user_is_refused_clearly() {
    let f = DataFile::new("other", 8 * 4096);
    let (pinner, _d, ub, reg) = setup(1 << 30);
    let theirs = ub.register_file(&f.open(), 0, 8 * 4096).unwrap();
    let e = reg.acquire(&f.open(), 0, 8 * 4096).unwrap_err();
    assert!(
        matches!(e, WindowError::RegisteredElsewhere { region, .. } if region == theirs.id),
        "{e}"
    );
    assert!(
        e.to_string().contains("another user of the UB registry"),
        "{e}"
    );
    assert_eq!(
        (ub.regions().len(), pinner.live(), reg.len()),
        (1, 0, 0),
        "nothing changed"
    );
}

#[test]
fn a_refused_pin_leaves_no_region_behind() {
    struct Refuse;
    impl HostPinner for Refuse {
        fn pin(&self, _: *const u8, _: usize) -> Result<(), String> {
            Err("no".into())
        }
        fn unpin(&self, _: *const u8, _: usize) {
            unreachable!("nothing was pinned")
        }
    }
    let f = DataFile::new("refuse", 8 * 4096);
    let d = DmaDomain::host_only();
    let ub = UbRegistry::new(d.clone());
    let reg = FileWindowRegistry::with_ub_registry(Arc::new(Refuse), 1 << 30, ub.clone());
    assert!(matches!(
        reg.acquire(&f.open(), 0, 4096),
        Err(WindowError::Pin(_))
    ));
    assert_eq!((ub.regions().len(), d.mapping_count()), (0, 0));
}
