//! What this process has mapped, from `/proc/self/maps`: for tests that check a file mapping
//! goes when its owner drops it (asking by file name stays right when another test thread maps
//! something new at the freed address, which asking by address does not).

use std::path::Path;

/// True while this process maps any part of the file at `path` (a link or a relative path is
/// resolved first, as the kernel names the file by its canonical path). Panics when `path` or
/// `/proc/self/maps` cannot be read.
pub fn file_is_mapped(path: &Path) -> bool {
    let path = path
        .canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let path = path.to_str().expect("a UTF-8 path");
    std::fs::read_to_string("/proc/self/maps")
        .expect("read /proc/self/maps")
        .lines()
        .any(|l| l.ends_with(path) && l[..l.len() - path.len()].ends_with(' '))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::io::AsRawFd;

    #[test]
    fn a_file_counts_as_mapped_from_its_mmap_to_its_munmap() {
        let dir = std::env::temp_dir().join(format!("ubd-maps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, [7u8; 4096]).unwrap();
        // A file whose name ends like the other's is not it.
        let longer = dir.join("xf");
        std::fs::write(&longer, [7u8; 4096]).unwrap();
        let f = std::fs::File::open(&longer).unwrap();
        assert!(!file_is_mapped(&path));
        // SAFETY: a fresh read-only mapping of an open file, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        assert!(file_is_mapped(&longer));
        assert!(!file_is_mapped(&path), "xf is not f");
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, 4096) };
        assert!(!file_is_mapped(&longer));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
