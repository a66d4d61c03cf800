//! Guest tests: a file range registered as a read-only UB region ([`UbRegistry::register_file`],
//! mapped in the IOMMU with READ permission only) is a DMA source for the NVMe controller: an
//! NVMe WRITE straight from the file's page cache (tmpfs, /dev/shm) lands on the namespace
//! byte for byte; an NVMe READ into the file region is blocked by the IOMMU (a DMAR write
//! fault in the kernel log) and the file's bytes stay as they were; a write from a file
//! truncated while registered is refused before anything is queued.
//!
//! nvme0 LBAs 100000..104096 are these tests' scratch.

mod common;

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::{fill_random, T};
use ubdirect_core::{CoreError, PoolConfig, RegionKind, UbBuf, UbPool, UbRegion, UbRegistry};
use ubdirect_diag::kmsg::Kmsg;
use ubdirect_nvme::{IoBuf, IoBufs, IoFlags, IoQueuePair, Lba, NvmeError};
use ubdirect_testbed::{self as testbed, NVME0_NS1};

const LEN: usize = 1 << 20;
const SCRATCH_LBA: u64 = 100_000;

/// A file of `LEN` random bytes in the guest's tmpfs, removed on drop.
struct ShmFile {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl ShmFile {
    fn new(name: &str, seed: u64) -> ShmFile {
        let path = PathBuf::from(format!(
            "/dev/shm/ubd-filemap-{}-{name}",
            std::process::id()
        ));
        let mut bytes = vec![0u8; LEN];
        fill_random(seed, &mut bytes);
        File::create(&path)
            .and_then(|mut f| f.write_all(&bytes))
            .expect("write the file in /dev/shm");
        ShmFile { path, bytes }
    }

    fn open(&self) -> File {
        File::open(&self.path).expect("open the file read-only")
    }
}

impl Drop for ShmFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Register the whole file and carve it into one pool block of `LEN` bytes.
fn file_pool(reg: &Arc<UbRegistry>, f: &ShmFile) -> (Arc<UbRegion>, Arc<UbPool>) {
    let region = reg
        .register_file(&f.open(), 0, LEN as u64)
        .expect("register the file");
    assert!(region.is_read_only());
    assert!(matches!(region.kind, RegionKind::File { offset: 0, .. }));
    let again = reg
        .register_file(&f.open(), 0, LEN as u64)
        .expect("register again");
    assert!(
        Arc::ptr_eq(&region, &again),
        "the same range registers once"
    );
    let pool = UbPool::new(
        reg,
        region.clone(),
        PoolConfig {
            block_size: LEN,
            block_count: 1,
        },
    )
    .expect("pool over the file region");
    (region, pool)
}

/// Every test's set-up: nvme0 with a queue pair of depth 64 and a pool of two `LEN` blocks, and
/// a file of `LEN` random bytes registered as a one-block pool ([`file_pool`]). The fields drop
/// in the order they are declared: the file's pool first, the controller last.
struct FileBed {
    pool: Arc<UbPool>,
    region: Arc<UbRegion>,
    f: ShmFile,
    qp: IoQueuePair,
    bed: common::Bed,
}

impl FileBed {
    fn new(name: &str, seed: u64) -> FileBed {
        let bed = common::open(0, LEN, 2);
        let qp = bed.qp(64, 1);
        let f = ShmFile::new(name, seed);
        let (region, pool) = file_pool(&bed.registry, &f);
        FileBed {
            pool,
            region,
            f,
            qp,
            bed,
        }
    }

    /// An NVMe WRITE (FUA) of `src` (the file region's block, `what` in messages) to `lba`,
    /// then a READ of it back into a pool block. Returns `src` and the first byte at which the
    /// namespace differs from the file (`None`: it holds the file's bytes).
    fn write_and_read_back(&mut self, src: UbBuf, lba: u64, what: &str) -> (UbBuf, Option<usize>) {
        let qp = &mut self.qp;
        let src = qp
            .write_blocking(
                &qp.namespace(1).unwrap(),
                Lba(lba),
                IoBuf::prefix(src, LEN).unwrap(),
                IoFlags::FUA,
                T,
            )
            .unwrap_or_else(|r| panic!("NVMe WRITE from {what}: {}", r.error))
            .into_buf();
        let dst = self.bed.pool.get().unwrap();
        let dst = qp
            .read_blocking(
                &qp.namespace(1).unwrap(),
                Lba(lba),
                IoBuf::prefix(dst, LEN).unwrap(),
                T,
            )
            .unwrap_or_else(|r| panic!("read back: {}", r.error))
            .into_buf();
        let first_diff = dst.as_slice()[..LEN]
            .iter()
            .zip(&self.f.bytes)
            .position(|(a, b)| a != b);
        (src, first_diff)
    }
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn nvme_writes_straight_from_a_registered_file_mapping() {
    let mut fb = FileBed::new("write", 0x5eed);
    let region = fb.region.clone();
    let src = fb.pool.get().unwrap();
    assert_eq!(src.iova(), region.iova);
    fb.bed
        .registry
        .check_file_region(&region)
        .expect("file unchanged");
    let (src, first_diff) = fb.write_and_read_back(src, SCRATCH_LBA, "the file region");
    assert_eq!(first_diff, None, "the namespace holds the file's bytes");
    let mut seen = vec![0u8; LEN];
    src.read_into(0, &mut seen)
        .expect("read the file region's block");
    assert!(seen == fb.f.bytes[..], "the file region reads the file");
    // A second pass reuses the registration: same region, same IOVA.
    drop(src);
    let again = fb
        .bed
        .registry
        .register_file(&fb.f.open(), 0, LEN as u64)
        .unwrap();
    assert_eq!(again.id, region.id);
    println!(
        "file region {} at IOVA {:#x}: 1 MiB NVMe WRITE from the page cache verified",
        region.id, region.iova
    );
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn the_device_cannot_write_into_a_registered_file_mapping() {
    let FileBed {
        bed,
        mut qp,
        f,
        region,
        pool,
    } = FileBed::new("ro", 0xbad);
    let target = pool.get().unwrap();
    let iova = target.iova();
    let mut kmsg = Kmsg::from_now().expect("open /dev/kmsg");
    // An NVMe READ makes the device WRITE into the buffer: here, into the read-only file region.
    let r = qp.read_blocking(
        &qp.namespace(1).unwrap(),
        Lba(0),
        IoBuf::prefix(target, 8192).unwrap(),
        T,
    );
    // QEMU's VT-d blocks the write and the controller still completes the READ with success
    // (as for an unmapped buffer, RELIABILITY "lost direct path"): the kernel log shows it.
    let target = r
        .unwrap_or_else(|r| panic!("READ into the file region: {}", r.error))
        .into_buf();
    std::thread::sleep(Duration::from_millis(200));
    let faults = kmsg
        .faults_for(&[bed.ctrl.device().address()])
        .expect("read /dev/kmsg");
    let inside = faults
        .iter()
        .filter(|x| x.access.as_deref() == Some("Write") && (iova..iova + 8192).contains(&x.addr))
        .count();
    println!(
        "{} DMAR fault(s); first: {:?}",
        faults.len(),
        faults.first().map(|x| &x.line)
    );
    assert!(
        inside > 0,
        "no DMAR write fault inside the file region: {faults:?}"
    );
    // read_into reads the file: the page cache pages the region pinned.
    let mut seen = vec![0u8; LEN];
    target
        .read_into(0, &mut seen)
        .expect("read the file region's block");
    assert!(seen == f.bytes[..], "the file region's bytes are unchanged");
    let on_disk = std::fs::read(&f.path).expect("read the file back");
    assert!(on_disk == f.bytes, "the file is unchanged");
    // The pattern the READ carried did not land anywhere in the file.
    assert!(testbed::check_pattern(NVME0_NS1.id, 0, &on_disk[..8192]).is_err());
    bed.registry
        .check_file_region(&region)
        .expect("file unchanged");
    drop(target);
    // The controller still works: the same READ into a pool buffer lands.
    let buf = bed.pool.get().unwrap();
    let buf = qp
        .read_blocking(
            &qp.namespace(1).unwrap(),
            Lba(0),
            IoBuf::prefix(buf, 8192).unwrap(),
            T,
        )
        .expect("read into the pool")
        .into_buf();
    testbed::check_pattern(NVME0_NS1.id, 0, &buf.as_slice()[..8192]).expect("pattern");
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn a_write_from_a_truncated_registered_file_is_refused_before_the_device_sees_it() {
    let mut fb = FileBed::new("trunc", 0x7a11);
    let region = fb.region.clone();
    let src = fb.pool.get().unwrap();
    let iova = src.iova();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&fb.f.path)
        .and_then(|w| w.set_len(LEN as u64 / 4))
        .expect("truncate the registered file to 256 KiB");
    let e = fb.bed.registry.check_file_region(&region).unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("size {LEN} -> {} bytes", LEN / 4)),
        "{e}"
    );
    // The pinned pages are the file as it was: the write is refused, nothing is queued, and
    // the buffer comes back.
    let ns = fb.qp.namespace(1).unwrap();
    let lba = SCRATCH_LBA + (LEN / 512) as u64;
    let rej = fb
        .qp
        .submit_write(
            &ns,
            Lba(lba),
            IoBuf::prefix(src, LEN).unwrap(),
            IoFlags::FUA,
            1,
        )
        .expect_err("a write from the truncated file's stale pages was accepted");
    assert!(
        matches!(
            rej.error,
            NvmeError::Core(CoreError::FileChanged { id, .. }) if id == region.id
        ),
        "{}",
        rej.error
    );
    assert_eq!(fb.qp.in_flight(), 0, "nothing was queued");
    match rej.bufs {
        IoBufs::One(b) => assert_eq!(b.buf().iova(), iova),
        other => panic!("the buffer did not come back: {other:?}"),
    }
    // Registering the truncated file anew maps its new contents as another region.
    let n = fb
        .bed
        .registry
        .register_file(&fb.f.open(), 0, LEN as u64 / 4)
        .expect("register the new contents");
    assert_ne!(n.id, region.id);
    fb.bed.registry.check_file_region(&n).expect("current");
}
