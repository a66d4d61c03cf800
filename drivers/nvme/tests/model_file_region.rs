//! A pool over a registered file is a DMA source for NVMe writes only while the file is as it
//! was registered: a file rewritten since (size or mtime moved) has its write refused before
//! anything is queued, the buffer comes back, and the device sees no command; an unchanged
//! file's write lands byte for byte.
mod model_support;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use model_support::{fast_opts, model, one};
use ubdirect_core::{CoreError, PoolConfig, UbPool, UbRegion, UbRegistry};
use ubdirect_devmodel::nvme::NvmeConfig;
use ubdirect_nvme::spec::command::io_opcode;
use ubdirect_nvme::{Controller, IoBuf, IoFlags, Lba, NvmeError};

const T: Duration = Duration::from_secs(5);
const LEN: usize = 4 * 4096;

/// A temporary file of `LEN` pattern bytes, removed on drop.
struct TmpFile {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl TmpFile {
    fn new(name: &str) -> TmpFile {
        let path = std::env::temp_dir().join(format!(
            "ubd-model-file-region-{}-{name}",
            std::process::id()
        ));
        let bytes: Vec<u8> = (0..LEN).map(|i| (i * 13 + i / 512) as u8).collect();
        File::create(&path)
            .and_then(|mut f| f.write_all(&bytes))
            .expect("write the temporary file");
        TmpFile { path, bytes }
    }

    fn writer(&self) -> File {
        OpenOptions::new().write(true).open(&self.path).unwrap()
    }

    /// The file's path as the kernel names it (temp_dir may hold a symbolic link).
    fn canonical(&self) -> String {
        std::fs::canonicalize(&self.path)
            .unwrap()
            .display()
            .to_string()
    }
}

impl Drop for TmpFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The whole file registered in `reg` and carved into one pool block of `LEN` bytes.
fn file_pool(reg: &Arc<UbRegistry>, f: &TmpFile) -> (Arc<UbRegion>, Arc<UbPool>) {
    let file = File::open(&f.path).unwrap();
    let region = reg.register_file(&file, 0, LEN as u64).unwrap();
    let pool = UbPool::new(
        reg,
        region.clone(),
        PoolConfig {
            block_size: LEN,
            block_count: 1,
        },
    )
    .unwrap();
    (region, pool)
}

/// Open a controller on a fresh model, register `f` as a one-block pool, apply `change` to the
/// file, then submit a write of the block. Asserts the write is refused with `FileChanged`
/// naming the region and the file, that the block came back and that the device saw no
/// command; returns the error.
fn refused_write(f: &TmpFile, change: impl FnOnce(&TmpFile)) -> CoreError {
    let (reg, m, dev) = model(NvmeConfig::default());
    let (region, pool) = file_pool(&reg, f);
    let name = f.canonical();
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    let ns = ctrl.namespace(1).unwrap();
    let mut q = model_support::queue(&ctrl, 8);
    let b = pool.get().unwrap();
    let iova = b.iova();
    change(f);
    let r = q.submit_write(
        &ns,
        Lba(0),
        IoBuf::prefix(b, LEN).unwrap(),
        IoFlags::empty(),
        1,
    );
    let rej = r.expect_err("a write from a changed file's stale pages was accepted");
    assert_eq!(q.in_flight(), 0, "nothing was queued");
    assert_eq!(one(rej.bufs).buf().iova(), iova, "the buffer came back");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(q.poll(8, |_| {}).unwrap(), 0, "nothing completes");
    assert_eq!(
        m.stats().io_count(io_opcode::WRITE),
        0,
        "the device saw a write"
    );
    let NvmeError::Core(e) = rej.error else {
        panic!("refused for the wrong reason: {}", rej.error);
    };
    match &e {
        CoreError::FileChanged { id, file, .. } => {
            assert_eq!(*id, region.id);
            assert_eq!(*file, name);
        }
        e => panic!("refused for the wrong reason: {e}"),
    }
    assert!(e.to_string().contains(&name), "{e}");
    e
}

#[test]
fn a_write_from_a_file_truncated_since_registration_is_refused() {
    let f = TmpFile::new("truncated");
    let e = refused_write(&f, |f| f.writer().set_len(LEN as u64 / 2).unwrap());
    assert!(
        matches!(
            e,
            CoreError::FileChanged {
                old_size: 16384,
                new_size: 8192,
                removed: false,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("size 16384 -> 8192 bytes"), "{e}");
}

#[test]
fn a_write_from_a_file_rewritten_in_place_since_registration_is_refused() {
    let f = TmpFile::new("rewritten");
    let e = refused_write(&f, |f| {
        let mut w = f.writer();
        w.write_all(&[0xaa; 512]).unwrap();
        w.set_modified(SystemTime::now() + Duration::from_secs(5))
            .unwrap();
    });
    assert!(
        matches!(
            e,
            CoreError::FileChanged {
                old_size: 16384,
                new_size: 16384,
                mtime_changed: true,
                removed: false,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("modified"), "{e}");
}

#[test]
fn a_write_from_a_file_replaced_since_registration_is_refused() {
    let f = TmpFile::new("replaced");
    let e = refused_write(&f, |f| {
        let next = f.path.with_extension("next");
        std::fs::write(&next, &f.bytes).unwrap();
        std::fs::rename(&next, &f.path).unwrap();
    });
    assert!(
        matches!(
            e,
            CoreError::FileChanged {
                old_size: 16384,
                new_size: 16384,
                removed: true,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("removed or replaced"), "{e}");
}

#[test]
fn a_write_from_an_unchanged_file_lands_byte_for_byte() {
    let f = TmpFile::new("unchanged");
    let (reg, m, dev) = model(NvmeConfig::default());
    let (region, pool) = file_pool(&reg, &f);
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    let ns = ctrl.namespace(1).unwrap();
    let mut q = model_support::queue(&ctrl, 8);
    let b = pool.get().unwrap();
    assert_eq!(b.iova(), region.iova);
    let b = q
        .write_blocking(
            &ns,
            Lba(8),
            IoBuf::prefix(b, LEN).unwrap(),
            IoFlags::empty(),
            T,
        )
        .unwrap_or_else(|r| panic!("the write from the unchanged file: {}", r.error));
    drop(b);
    assert_eq!(m.stats().io_count(io_opcode::WRITE), 1);
    let mut medium = vec![0u8; LEN];
    m.read_medium(1, 8 * 512, &mut medium);
    assert!(medium == f.bytes, "the namespace holds the file's bytes");
    region.check_file().expect("the file is as registered");
    // Memory regions are never checked as files.
    let anon = model_support::anon_pool(&reg, 4096, 1);
    anon.region().check_file().expect("an anonymous region");
}
