//! Host tests of file regions (host-only domain: IOVAs are bookkeeping, the mapping is real).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use super::*;
use crate::ub::{PoolConfig, UbPool};
use crate::vfio::DmaDomain;

/// A temporary file of `len` pattern bytes, removed on drop.
struct TmpFile(PathBuf);

impl TmpFile {
    fn new(name: &str, len: usize) -> TmpFile {
        let p = std::env::temp_dir().join(format!("ubd-fileregion-{}-{name}", std::process::id()));
        let mut f = File::create(&p).unwrap();
        f.write_all(&pattern(0, len)).unwrap();
        TmpFile(p)
    }
    fn open(&self) -> File {
        File::open(&self.0).unwrap()
    }
}

impl Drop for TmpFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn pattern(off: usize, len: usize) -> Vec<u8> {
    (off..off + len).map(|i| (i * 7 + i / 4096) as u8).collect()
}

/// True while `[p, p+len)` is mapped in this process (mincore answers ENOMEM otherwise).
fn is_mapped(p: *mut u8, len: usize) -> bool {
    let mut v = vec![0u8; len.div_ceil(4096)];
    // SAFETY: mincore only reports on the range; `v` has one byte per page.
    unsafe { libc::mincore(p.cast(), len, v.as_mut_ptr()) == 0 }
}

#[test]
fn a_file_range_registers_read_only_and_maps_the_file() {
    let t = TmpFile::new("basic", 5 * 4096 + 100);
    let d = DmaDomain::host_only();
    let reg = UbRegistry::new(d.clone());
    let r = reg.register_file(&t.open(), 4096, 3 * 4096 + 10).unwrap();
    assert!(r.is_read_only());
    assert_eq!(r.len, 4 * 4096, "rounded up to pages");
    assert!(matches!(
        r.kind,
        RegionKind::File {
            offset: 4096,
            len: 12298,
            ..
        }
    ));
    assert_eq!(d.mapping_count(), 1);
    // SAFETY: the region maps r.len readable bytes; the file is longer than the range.
    let seen = unsafe { std::slice::from_raw_parts(r.vaddr, 3 * 4096 + 10) };
    assert!(
        seen == pattern(4096, 3 * 4096 + 10).as_slice(),
        "the mapping shows the file"
    );
    assert_eq!(reg.iova_of(r.vaddr.wrapping_add(100)), Some(r.iova + 100));
    reg.check_file_region(&r).unwrap();
    assert_eq!(reg.file_stamp(&r).unwrap().size, 5 * 4096 + 100);
}

#[test]
fn the_same_range_twice_is_the_same_region_and_another_range_is_not() {
    let t = TmpFile::new("twice", 8 * 4096);
    let d = DmaDomain::host_only();
    let reg = UbRegistry::new(d.clone());
    let a = reg.register_file(&t.open(), 0, 4 * 4096).unwrap();
    let b = reg.register_file(&t.open(), 0, 4 * 4096).unwrap();
    assert!(
        Arc::ptr_eq(&a, &b),
        "same file, same range: the registered region"
    );
    assert_eq!(d.mapping_count(), 1);
    let c = reg.register_file(&t.open(), 4096, 4 * 4096).unwrap();
    assert_ne!(c.id, a.id);
    assert_eq!(d.mapping_count(), 2);
    let found = reg.file_region(&t.open(), 4096, 4 * 4096).unwrap().unwrap();
    assert_eq!(found.id, c.id);
    assert!(reg.file_region(&t.open(), 0, 4096).unwrap().is_none());
}

#[test]
fn threads_registering_one_range_get_one_region() {
    let t = TmpFile::new("race", 64 * 4096);
    let d = DmaDomain::host_only();
    let reg = UbRegistry::new(d.clone());
    let ids: Vec<u32> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|_| s.spawn(|| reg.register_file(&t.open(), 0, 64 * 4096).unwrap().id))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(ids.iter().all(|&i| i == ids[0]), "{ids:?}");
    assert_eq!(d.mapping_count(), 1);
    assert_eq!(reg.regions().len(), 1);
}

#[test]
fn bad_ranges_are_refused_and_change_nothing() {
    let t = TmpFile::new("bad", 4 * 4096);
    let d = DmaDomain::host_only();
    let reg = UbRegistry::new(d.clone());
    for (off, len, what) in [
        (100, 4096, "not a multiple of the page size"),
        (0, 0, "not inside the file"),
        (4096, 4 * 4096, "not inside the file"),
        (u64::MAX - 4095, 8192, "not inside the file"),
    ] {
        let e = reg.register_file(&t.open(), off, len).unwrap_err();
        assert!(e.to_string().contains(what), "{off}+{len}: {e}");
    }
    assert_eq!(d.mapping_count(), 0);
    assert!(reg.regions().is_empty());
}

#[test]
fn the_region_owns_the_mapping_and_unmaps_it_when_it_goes() {
    let t = TmpFile::new("owns", 4 * 4096);
    let d = DmaDomain::host_only();
    let reg = UbRegistry::new(d.clone());
    let f = t.open();
    let r = reg.register_file(&f, 0, 4 * 4096).unwrap();
    drop(f); // the region keeps its own descriptor
    let (p, len) = (r.vaddr, r.len);
    assert!(is_mapped(p, len));
    reg.check_file_region(&r).unwrap();
    reg.unregister(r.id).unwrap();
    assert_eq!(d.mapping_count(), 0, "the IOMMU mapping goes at unregister");
    assert!(
        is_mapped(p, len),
        "the memory stays while an Arc holds the region"
    );
    drop(r);
    assert!(
        !is_mapped(p, len),
        "the file mapping went with the last Arc"
    );
}

#[test]
fn a_file_truncated_while_registered_is_detected_and_reregistered_anew() {
    let t = TmpFile::new("trunc", 8 * 4096);
    let d = DmaDomain::host_only();
    let reg = UbRegistry::new(d.clone());
    let r = reg.register_file(&t.open(), 0, 8 * 4096).unwrap();
    OpenOptions::new()
        .write(true)
        .open(&t.0)
        .unwrap()
        .set_len(2 * 4096)
        .unwrap();
    let e = reg.check_file_region(&r).unwrap_err();
    assert!(
        matches!(
            e,
            CoreError::FileChanged {
                old_size: 32768,
                new_size: 8192,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("register the file again"), "{e}");
    // The old range no longer fits; a range of the new file maps a new region.
    assert!(reg.register_file(&t.open(), 0, 8 * 4096).is_err());
    let n = reg.register_file(&t.open(), 0, 2 * 4096).unwrap();
    assert_ne!(n.id, r.id);
    reg.check_file_region(&n).unwrap();
    assert_eq!(
        d.mapping_count(),
        2,
        "the stale region stays until unregistered"
    );
    reg.unregister(r.id).unwrap();
    assert_eq!(d.mapping_count(), 1);
}

#[test]
fn a_rewritten_file_of_the_same_size_is_detected_by_mtime() {
    let t = TmpFile::new("mtime", 2 * 4096);
    let reg = UbRegistry::new(DmaDomain::host_only());
    let r = reg.register_file(&t.open(), 0, 2 * 4096).unwrap();
    let f = OpenOptions::new().write(true).open(&t.0).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    f.set_modified(later).unwrap();
    let e = reg.check_file_region(&r).unwrap_err();
    assert!(
        matches!(
            e,
            CoreError::FileChanged {
                mtime_changed: true,
                old_size: 8192,
                new_size: 8192,
                ..
            }
        ),
        "{e}"
    );
    let n = reg.register_file(&t.open(), 0, 2 * 4096).unwrap();
    assert_ne!(
        n.id, r.id,
        "a changed file is not served by the stale region"
    );
}

#[test]
fn a_non_file_region_is_not_checked_as_one() {
    let reg = UbRegistry::new(DmaDomain::host_only());
    let a = reg.register_anonymous(4096, None).unwrap();
    assert!(!a.is_read_only());
    let e = reg.check_file_region(&a).unwrap_err();
    assert!(e.to_string().contains("not a file region"), "{e}");
}

#[test]
fn a_pool_over_a_file_region_hands_out_file_bytes_as_dma_sources() {
    let t = TmpFile::new("pool", 16 * 4096);
    let reg = UbRegistry::new(DmaDomain::host_only());
    let r = reg.register_file(&t.open(), 0, 16 * 4096).unwrap();
    let pool = UbPool::new(
        &reg,
        r.clone(),
        PoolConfig {
            block_size: 4 * 4096,
            block_count: 4,
        },
    )
    .unwrap();
    let a = pool.get().unwrap();
    let b = pool.get().unwrap();
    assert_eq!(b.iova() - a.iova(), 4 * 4096);
    let mut seen = vec![0u8; 4 * 4096];
    a.read_into(0, &mut seen).unwrap();
    assert!(seen == pattern(0, 4 * 4096));
    b.read_into(0, &mut seen).unwrap();
    assert!(seen == pattern(4 * 4096, 4 * 4096));
}

#[test]
#[should_panic(expected = "read-only UB region")]
fn a_block_of_a_file_region_is_never_writable_from_the_cpu() {
    let t = TmpFile::new("ro", 4 * 4096);
    let reg = UbRegistry::new(DmaDomain::host_only());
    let r = reg.register_file(&t.open(), 0, 4 * 4096).unwrap();
    let pool = UbPool::new(
        &reg,
        r,
        PoolConfig {
            block_size: 4 * 4096,
            block_count: 1,
        },
    )
    .unwrap();
    let mut a = pool.get().unwrap();
    a.as_mut_slice()[0] = 1;
}

/// A pool of `count` blocks of `block` bytes over the whole of `t` registered as a file region.
fn file_pool(t: &TmpFile, len: u64, block: usize, count: usize) -> (Arc<UbRegistry>, Arc<UbPool>) {
    let reg = UbRegistry::new(DmaDomain::host_only());
    let r = reg.register_file(&t.open(), 0, len).unwrap();
    let cfg = PoolConfig {
        block_size: block,
        block_count: count,
    };
    let pool = UbPool::new(&reg, r, cfg).unwrap();
    (reg, pool)
}

#[test]
fn read_into_a_block_of_an_unchanged_file_gives_the_files_bytes() {
    let len = 2 * 4096 + 100;
    let t = TmpFile::new("readinto", len);
    let (_reg, pool) = file_pool(&t, len as u64, 4096, 3);
    let blocks: Vec<_> = (0..3).map(|_| pool.get().unwrap()).collect();
    let mut whole = Vec::new();
    for b in &blocks {
        let mut s = vec![0xffu8; 4096];
        b.read_into(0, &mut s).unwrap();
        whole.extend_from_slice(&s);
    }
    let mut want = pattern(0, len);
    want.resize(3 * 4096, 0);
    assert!(whole == want, "the file's bytes, zeros past its end");
    let mut mid = [0u8; 300];
    blocks[1].read_into(1000, &mut mid).unwrap();
    assert!(mid[..] == pattern(4096 + 1000, 300)[..]);
    let e = blocks[2].read_into(4000, &mut mid).unwrap_err();
    assert!(e.to_string().contains("outside the 4096-byte block"), "{e}");
    blocks[0].region().check_file().unwrap();
}

#[test]
fn write_from_into_a_block_of_a_file_region_is_refused() {
    let t = TmpFile::new("writefrom", 4096);
    let (_reg, pool) = file_pool(&t, 4096, 4096, 1);
    let mut b = pool.get().unwrap();
    let e = b.write_from(0, &[1, 2, 3]).unwrap_err();
    assert!(e.to_string().contains("write the file instead"), "{e}");
    let mut s = [0u8; 3];
    b.read_into(0, &mut s).unwrap();
    assert!(s[..] == pattern(0, 3)[..], "the file is unchanged");
}

#[test]
fn as_slice_on_a_block_of_a_file_region_panics_naming_read_into() {
    let t = TmpFile::new("asslice", 4096);
    let (_reg, pool) = file_pool(&t, 4096, 4096, 1);
    let b = pool.get().unwrap();
    let id = b.region().id;
    let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| b.as_slice()[0]))
        .expect_err("as_slice on a file block panics");
    let msg = e.downcast_ref::<String>().expect("a formatted message");
    assert!(
        msg.contains(&format!(
            "UbBuf::as_slice on a block of read-only UB region {id}"
        )) && msg.contains("UbBuf::read_into"),
        "{msg}"
    );
}

/// Fork a child that truncates `path` to `len` bytes and exits; wait for it.
fn truncate_in_a_forked_child(path: &std::path::Path, len: i64) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: the child calls only truncate(2) and _exit(2), both async-signal-safe, on memory
    // prepared before the fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: see above; `c` is a NUL-terminated path.
        unsafe {
            let rc = libc::truncate(c.as_ptr(), len);
            libc::_exit(if rc == 0 { 0 } else { 1 });
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above; `status` is a valid out pointer.
    let w = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(w, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child truncated the file (status {status:#x})"
    );
}

#[test]
fn a_file_truncated_by_another_process_reads_as_an_error_not_a_sigbus() {
    let t = TmpFile::new("forktrunc", 8 * 4096);
    let (_reg, pool) = file_pool(&t, 8 * 4096, 4 * 4096, 2);
    let (a, b) = (pool.get().unwrap(), pool.get().unwrap());
    let mut s = vec![0u8; 4 * 4096];
    b.read_into(0, &mut s).unwrap();
    truncate_in_a_forked_child(&t.0, 4096);
    // The second block lies wholly past the new end: its mapping would SIGBUS on a load.
    let e = b.read_into(0, &mut s).unwrap_err();
    assert!(
        matches!(
            e,
            CoreError::FileChanged {
                old_size: 32768,
                new_size: 4096,
                ..
            }
        ),
        "{e}"
    );
    // The first one reads short.
    let e = a.read_into(0, &mut s).unwrap_err();
    assert!(matches!(e, CoreError::FileChanged { .. }), "{e}");
    let e = a.region().check_file().unwrap_err();
    assert!(
        matches!(e, CoreError::FileChanged { new_size: 4096, .. }),
        "{e}"
    );
}

#[test]
fn the_checksum_of_a_file_block_is_the_checksum_of_the_files_bytes() {
    use crate::util::checksum::{checksum_at, checksum_buf};
    let t = TmpFile::new("checksum", 4 * 4096);
    let (_reg, pool) = file_pool(&t, 4 * 4096, 4 * 4096, 1);
    let b = pool.get().unwrap();
    let len = 4 * 4096 - 3;
    assert_eq!(
        checksum_buf(&b, len, 64).unwrap(),
        checksum_at(&pattern(0, len), 64)
    );
}
