//! Host tests (no GPU, no libcuda) of the file-window registry: registration, reuse across
//! passes, eviction under the cap, and a file truncated or rewritten while registered. The
//! CUDA registration step is replaced by a recording pinner.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::Arc;

use ubdirect_cuda::{resident_fraction, FileWindowRegistry, WindowError};
use ubdirect_testbed::proc_maps::file_is_mapped;

mod support;
use support::FakePinner;

/// A file of `len` bytes where byte i is (i / 4096) as u8 (each page names itself).
fn data_file(len: usize) -> (tempdir::Dir, File) {
    let dir = tempdir::Dir::new();
    let path = dir.path.join("data.bin");
    let mut f = File::create(&path).unwrap();
    let bytes: Vec<u8> = (0..len).map(|i| (i / 4096) as u8).collect();
    f.write_all(&bytes).unwrap();
    f.sync_all().unwrap();
    (dir, File::open(&path).unwrap())
}

mod tempdir {
    /// A temporary directory removed on drop.
    pub struct Dir {
        pub path: std::path::PathBuf,
    }
    impl Dir {
        pub fn new() -> Dir {
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let path = std::env::temp_dir().join(format!(
                "ubd-fw-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&path).unwrap();
            Dir { path }
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

const PAGE: u64 = 4096;

#[test]
fn a_window_is_registered_once_and_reused_across_passes() {
    let (_d, f) = data_file(64 * PAGE as usize);
    let pinner = Arc::new(FakePinner::default());
    let reg = FileWindowRegistry::new(pinner.clone(), 1 << 30);
    for pass in 0..3 {
        for w in 0..4u64 {
            let win = reg.acquire(&f, w * 16 * PAGE, 16 * PAGE).unwrap();
            assert_eq!(win.len(), 16 * PAGE as usize);
            // SAFETY: the window maps 16 pages of the file; page 16*w holds the byte 16*w.
            let b = unsafe { *win.as_ptr().add(PAGE as usize) };
            assert_eq!(
                b,
                (w * 16 + 1) as u8,
                "pass {pass} window {w} maps the file"
            );
        }
    }
    let s = reg.stats();
    assert_eq!(s.registered, 4, "each window pinned once");
    assert_eq!(s.reused, 8, "passes 2 and 3 reuse all four");
    assert_eq!(pinner.pins(), 4);
    assert_eq!(pinner.live(), 4);
    assert_eq!(reg.held_bytes(), 64 * PAGE);
    reg.clear();
    assert_eq!(
        pinner.live(),
        0,
        "clearing the registry unpins what nobody holds"
    );
}

#[test]
fn an_unaligned_range_maps_the_right_bytes() {
    let (_d, f) = data_file(8 * PAGE as usize);
    let pinner = Arc::new(FakePinner::default());
    let reg = FileWindowRegistry::new(pinner.clone(), 1 << 30);
    let win = reg.acquire(&f, 3 * PAGE + 100, 2 * PAGE).unwrap();
    // SAFETY: inside the 2-page window.
    let (a, b) = unsafe { (*win.as_ptr(), *win.as_ptr().add(PAGE as usize)) };
    assert_eq!((a, b), (3, 4));
    assert_eq!(
        win.pinned_len(),
        3 * PAGE as usize,
        "rounded out to whole pages"
    );
}

#[test]
fn the_cap_evicts_the_least_recently_used_window() {
    let (_d, f) = data_file(64 * PAGE as usize);
    let pinner = Arc::new(FakePinner::default());
    let reg = FileWindowRegistry::new(pinner.clone(), 32 * PAGE);
    let w = |i: u64| reg.acquire(&f, i * 16 * PAGE, 16 * PAGE).unwrap();
    drop(w(0));
    drop(w(1));
    drop(w(0)); // window 0 is now the most recently used
    assert_eq!(pinner.live(), 2);
    drop(w(2)); // over the cap: window 1 (LRU) goes
    let s = reg.stats();
    assert_eq!((s.registered, s.evicted, s.reused), (3, 1, 1));
    assert_eq!(pinner.live(), 2);
    assert!(reg.held_bytes() <= 32 * PAGE);
    drop(w(0));
    assert_eq!(reg.stats().reused, 2, "window 0 survived the eviction");
    drop(w(1));
    assert_eq!(reg.stats().registered, 4, "window 1 had to be pinned again");
    // A window in use stays pinned after eviction until its holder drops it.
    let held = w(3);
    drop(w(2));
    drop(w(1));
    assert_eq!(reg.len(), 2);
    assert_eq!(pinner.live(), 3, "evicted but still held: still pinned");
    drop(held);
    assert_eq!(pinner.live(), 2);
    // One window larger than the cap is refused with the fix.
    let e = reg.acquire(&f, 0, 48 * PAGE).unwrap_err();
    assert!(matches!(e, WindowError::TooLarge { .. }), "{e}");
    assert!(e.to_string().contains("FileWindowRegistry::new"), "{e}");
}

#[test]
fn a_file_truncated_while_registered_is_detected_and_its_windows_dropped() {
    let (d, f) = data_file(64 * PAGE as usize);
    let pinner = Arc::new(FakePinner::default());
    let reg = FileWindowRegistry::new(pinner.clone(), 1 << 30);
    let held = reg.acquire(&f, 32 * PAGE, 32 * PAGE).unwrap();
    drop(reg.acquire(&f, 0, 16 * PAGE).unwrap());
    assert!(reg.check(&f).is_ok(), "unchanged file passes the check");
    let w = OpenOptions::new()
        .write(true)
        .open(d.path.join("data.bin"))
        .unwrap();
    w.set_len(40 * PAGE).unwrap();
    let e = reg.check(&f).unwrap_err();
    match e {
        WindowError::FileChanged {
            old_size,
            new_size,
            dropped,
            ..
        } => {
            assert_eq!((old_size, new_size, dropped), (64 * PAGE, 40 * PAGE, 2));
        }
        other => panic!("{other}"),
    }
    assert_eq!(reg.len(), 0);
    assert_eq!(reg.stats().invalidated, 2);
    assert_eq!(
        pinner.live(),
        1,
        "the held window stays pinned until released"
    );
    // The held window's memory is still mapped: reading inside the old size past the new end of
    // file from the CPU would SIGBUS, so only the part below the new size is touched here.
    // SAFETY: page 32 (file offset 128 KiB) is below the new 40-page size.
    assert_eq!(unsafe { *held.as_ptr() }, 32);
    drop(held);
    assert_eq!(pinner.live(), 0);
    // A range past the new end is refused; one within it maps the current file.
    let e = reg.acquire(&f, 32 * PAGE, 32 * PAGE).unwrap_err();
    assert!(matches!(e, WindowError::OutOfRange { .. }), "{e}");
    assert!(reg.acquire(&f, 0, 40 * PAGE).is_ok());
}

#[test]
fn a_file_rewritten_in_place_is_detected_on_acquire() {
    let (d, f) = data_file(16 * PAGE as usize);
    let pinner = Arc::new(FakePinner::default());
    let reg = FileWindowRegistry::new(pinner.clone(), 1 << 30);
    drop(reg.acquire(&f, 0, 16 * PAGE).unwrap());
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut w = OpenOptions::new()
        .write(true)
        .open(d.path.join("data.bin"))
        .unwrap();
    w.write_all(&[0xAB; 4096]).unwrap();
    w.sync_all().unwrap();
    let e = reg.acquire(&f, 0, 16 * PAGE).unwrap_err();
    assert!(
        matches!(
            e,
            WindowError::FileChanged {
                mtime_changed: true,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("run again"), "{e}");
    let again = reg.acquire(&f, 0, 16 * PAGE).unwrap();
    // SAFETY: the first byte is inside the live read-only window.
    let first = unsafe { *again.as_ptr() };
    assert_eq!(first, 0xAB, "the new contents are mapped");
    assert_eq!(reg.stats().registered, 2);
}

#[test]
fn residency_is_measured_without_touching_pages() {
    let (_d, f) = data_file(16 * PAGE as usize);
    // Just written: the pages are in the page cache.
    let r = resident_fraction(&f, 0, 16 * PAGE).unwrap();
    assert!(r > 0.99, "freshly written file resident: {r}");
    assert_eq!(resident_fraction(&f, 0, 0).unwrap(), 1.0);
    // Dropped from the cache (clean pages, a disk file system): not resident. tmpfs keeps them.
    use std::os::unix::io::AsRawFd;
    // SAFETY: plain advice on an open fd.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    // SAFETY: statfs fills the struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out pointer.
    unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) };
    if st.f_type != libc::TMPFS_MAGIC {
        let r = resident_fraction(&f, 0, 16 * PAGE).unwrap();
        assert!(r < 0.5, "after POSIX_FADV_DONTNEED: {r}");
    }
}

/// True while `[p, p+len)` is mapped in this process (mincore answers ENOMEM otherwise).
fn is_mapped(p: usize, len: usize) -> bool {
    let mut v = vec![0u8; len.div_ceil(4096)];
    // SAFETY: mincore only reports on the range; `v` has one byte per page.
    unsafe { libc::mincore(p as *mut libc::c_void, len, v.as_mut_ptr()) == 0 }
}

/// A pinner that refuses every pin (`fail`) or accepts it, recording each range pinned and
/// whether a range was still mapped when it was unpinned.
#[derive(Default)]
struct MapWatchingPinner {
    fail: bool,
    pinned: std::sync::Mutex<Vec<(usize, usize)>>,
    mapped_at_unpin: std::sync::Mutex<Vec<bool>>,
}

impl ubdirect_cuda::HostPinner for MapWatchingPinner {
    fn pin(&self, ptr: *const u8, len: usize) -> Result<(), String> {
        self.pinned.lock().unwrap().push((ptr as usize, len));
        if self.fail {
            return Err("refused by the test".into());
        }
        Ok(())
    }
    fn unpin(&self, ptr: *const u8, len: usize) {
        let mapped = is_mapped(ptr as usize, len);
        self.mapped_at_unpin.lock().unwrap().push(mapped);
    }
}

#[test]
fn a_window_is_unpinned_then_unmapped_and_a_refused_pin_leaves_no_mapping() {
    let (d, f) = data_file(8 * PAGE as usize);
    let path = d.path.join("data.bin");
    let pinner = Arc::new(MapWatchingPinner::default());
    let reg = FileWindowRegistry::new(pinner.clone(), 1 << 30);
    assert!(!file_is_mapped(&path));
    let win = reg.acquire(&f, PAGE + 10, 2 * PAGE).unwrap();
    let (p, len) = pinner.pinned.lock().unwrap()[0];
    assert_eq!(len, 3 * PAGE as usize);
    assert!(is_mapped(p, len) && file_is_mapped(&path));
    reg.clear();
    assert!(file_is_mapped(&path), "a held window stays mapped");
    drop(win);
    assert_eq!(
        *pinner.mapped_at_unpin.lock().unwrap(),
        [true],
        "unpinned once, while still mapped"
    );
    assert!(!file_is_mapped(&path), "the window's mapping outlived it");

    let refusing = Arc::new(MapWatchingPinner {
        fail: true,
        ..Default::default()
    });
    let reg = FileWindowRegistry::new(refusing.clone(), 1 << 30);
    let e = reg.acquire(&f, 0, 4 * PAGE).unwrap_err();
    assert!(matches!(e, WindowError::Pin(_)), "{e}");
    assert_eq!(refusing.pinned.lock().unwrap().len(), 1);
    assert!(
        !file_is_mapped(&path),
        "a window whose pin failed stayed mapped"
    );
    assert!(refusing.mapped_at_unpin.lock().unwrap().is_empty());
    assert_eq!(reg.len(), 0);
}

/// A pinner that takes `delay` per pin and records how many pins ran at once at most.
#[derive(Default)]
struct SlowPinner {
    delay: std::time::Duration,
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    live: std::sync::atomic::AtomicIsize,
}

impl ubdirect_cuda::HostPinner for SlowPinner {
    fn pin(&self, _ptr: *const u8, _len: usize) -> Result<(), String> {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(n, SeqCst);
        std::thread::sleep(self.delay);
        self.now.fetch_sub(1, SeqCst);
        self.live.fetch_add(1, SeqCst);
        Ok(())
    }
    fn unpin(&self, _ptr: *const u8, _len: usize) {
        self.live.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn windows_register_in_parallel_and_release_unpins_them() {
    use std::sync::atomic::Ordering::SeqCst;
    let (_d, f) = data_file(16 * PAGE as usize);
    let pinner = Arc::new(SlowPinner {
        delay: std::time::Duration::from_millis(150),
        ..Default::default()
    });
    let reg = FileWindowRegistry::new(pinner.clone(), 1 << 30);
    std::thread::scope(|s| {
        for i in 0..4u64 {
            let (reg, f) = (&reg, &f);
            s.spawn(move || {
                let a = reg.acquire_counted(f, i * 4 * PAGE, 4 * PAGE).unwrap();
                assert!(a.registered);
            });
        }
    });
    assert!(
        pinner.most.load(SeqCst) >= 2,
        "registrations of different windows ran one at a time (the registry's lock is held while pinning)"
    );
    assert_eq!((reg.len(), reg.held_bytes()), (4, 16 * PAGE));
    // A second acquire finds it registered; release drops it and unpins it (nobody holds it).
    let a = reg.acquire_counted(&f, 0, 4 * PAGE).unwrap();
    assert!(!a.registered);
    let key = a.window.key();
    drop(a);
    assert!(reg.release(key));
    assert!(!reg.release(key), "released twice");
    assert_eq!((reg.len(), reg.held_bytes()), (3, 12 * PAGE));
    assert_eq!(pinner.live.load(SeqCst), 3);
    reg.clear();
    assert_eq!((reg.len(), reg.held_bytes()), (0, 0));
    assert_eq!(pinner.live.load(SeqCst), 0);
}
