//! Discovery of the QEMU guest test bed's devices (see scripts/vm/README.md,
//! "Writing a guest test").
//!
//! The guest's /init exports the PCI addresses of the test devices; guest tests read them here
//! instead of hard-coding addresses. The module also knows the backing images' data pattern and
//! formats the `UBD-HOSTCHECK` lines the host runs after the guest exits.

#![deny(missing_docs)]

pub mod alloc_count;
pub mod bar_check;
pub mod cli;
pub mod log_capture;
pub mod proc_maps;

pub use bar_check::check_bar_copy;

use std::fmt;

/// The test devices of the guest, as PCI address strings ("0000:00:04.0").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Testbed {
    /// NVMe controllers in QEMU order: `[0]` = nvme0 (1 namespace, 512 B LBA),
    /// `[1]` = nvme1 (nsid 1 512 B LBA, nsid 2 4 KiB LBA, MDTS 2).
    pub nvme: Vec<String>,
    /// The ivshmem device whose BAR2 stands in for a GPU BAR (backing file `gpubar`).
    pub ivshmem: Option<String>,
    /// The two virtio-net NICs (on one hub: what one sends, the other receives).
    pub nics: Vec<String>,
    /// The NVMe controller with MDTS 0 (no transfer limit; serial `ubdprp`, one 512 B namespace
    /// on the zero-filled `nvme-mdts0.img`), for commands above 2 MiB (chained PRP lists).
    pub nvme_mdts0: Option<String>,
    /// The virtio-net NIC with two queue pairs (`mq=on` on a 2-queue tap) and a control queue.
    pub nic_mq: Option<String>,
    /// The NVMe controller with a 1 MiB Controller Memory Buffer (serial `ubdcmb`).
    pub nvme_cmb: Option<String>,
    /// The two Intel 82576 (igb) physical functions, on their own QEMU hub (what one sends, the
    /// other receives).
    pub igb: Vec<String>,
    /// The host's run directory holding the backing files (for messages only).
    pub run_dir: Option<String>,
}

impl Testbed {
    /// Every test device, in the order NVMe, ivshmem, NICs, MDTS-0 NVMe, multiqueue NIC, CMB NVMe,
    /// igb NICs (the order of the guest's `UBD_TEST_DEVICES`).
    pub fn all(&self) -> Vec<String> {
        let mut v = self.nvme.clone();
        v.extend(self.ivshmem.iter().cloned());
        v.extend(self.nics.iter().cloned());
        v.extend(self.nvme_mdts0.iter().cloned());
        v.extend(self.nic_mq.iter().cloned());
        v.extend(self.nvme_cmb.iter().cloned());
        v.extend(self.igb.iter().cloned());
        v
    }
}

/// Whether this process runs inside the test-bed guest (`UBD_GUEST=1`).
pub fn in_guest() -> bool {
    std::env::var("UBD_GUEST").is_ok_and(|v| v == "1")
}

/// The guest's test devices, or `None` when not running in the test-bed guest.
pub fn devices() -> Option<Testbed> {
    from_lookup(|k| std::env::var(k).ok())
}

/// Like [`devices`], but for a guest test: panics with a message saying how to run it when
/// not in the guest (guest tests are `#[ignore]`d, so this only fires for a misrun test).
pub fn require() -> Testbed {
    devices().unwrap_or_else(|| {
        panic!("not in the ubdirect test-bed guest (UBD_GUEST unset): run guest tests with scripts/test.sh --guest-only or scripts/vm/suite.sh")
    })
}

/// The line a guest test prints when it cannot run its check here and returns early:
/// `UBD-SKIP <test>: <reason>`. The test plan counts it as a skip, not a pass, and the suite
/// fails on a skip that `scripts/vm/expected-skips` does not list.
pub fn skip_line(test: &str, reason: &str) -> String {
    format!("UBD-SKIP {}: {reason}", check_name(test))
}

/// Report that the calling test is skipped (see [`skip_line`]); it should return right after.
/// The test's name is libtest's name for the thread running it.
pub fn skip(reason: &str) {
    let t = std::thread::current();
    println!("{}", skip_line(t.name().unwrap_or("unnamed-test"), reason));
}

/// Build a [`Testbed`] from an environment lookup (the testable core of [`devices`]).
pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Option<Testbed> {
    if get("UBD_GUEST").as_deref() != Some("1") {
        return None;
    }
    let list = |k: &str| -> Vec<String> {
        get(k)
            .unwrap_or_default()
            .split([',', ' '])
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    Some(Testbed {
        nvme: list("UBD_NVME"),
        ivshmem: list("UBD_IVSHMEM").into_iter().next(),
        nics: list("UBD_NICS"),
        nvme_mdts0: list("UBD_NVME_MDTS0").into_iter().next(),
        nic_mq: list("UBD_NIC_MQ").into_iter().next(),
        nvme_cmb: list("UBD_NVME_CMB").into_iter().next(),
        igb: list("UBD_IGB"),
        run_dir: get("UBD_RUN_DIR").filter(|s| !s.is_empty()),
    })
}

/// A backing image of the test bed with its pattern id (see [`pattern_word`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackingImage {
    /// File name in the run directory (what `UBD-HOSTCHECK` lines name).
    pub file: &'static str,
    /// Pattern id: the top byte of every pattern word.
    pub id: u8,
    /// Logical block size of the namespace it backs.
    pub block_size: u32,
    /// Size in bytes.
    pub len: u64,
}

/// Size of every NVMe backing image and of the ivshmem `gpubar` file: 64 MiB.
pub const IMAGE_LEN: u64 = 64 << 20;
/// nvme0, namespace 1 (512 B LBA).
pub const NVME0_NS1: BackingImage = BackingImage {
    file: "nvme0.img",
    id: 1,
    block_size: 512,
    len: IMAGE_LEN,
};
/// nvme1, namespace 1 (512 B LBA).
pub const NVME1_NS1: BackingImage = BackingImage {
    file: "nvme1-ns1.img",
    id: 2,
    block_size: 512,
    len: IMAGE_LEN,
};
/// nvme1, namespace 2 (4 KiB LBA).
pub const NVME1_NS2: BackingImage = BackingImage {
    file: "nvme1-ns2.img",
    id: 3,
    block_size: 4096,
    len: IMAGE_LEN,
};
/// The ivshmem BAR's backing file (zeros at boot).
pub const GPUBAR_FILE: &str = "gpubar";

/// The backing image of namespace `nsid` of NVMe controller `ctrl` (0 = nvme0, 1 = nvme1), or
/// `None` when the test bed has no such namespace.
pub fn image_of(ctrl: usize, nsid: u32) -> Option<BackingImage> {
    match (ctrl, nsid) {
        (0, 1) => Some(NVME0_NS1),
        (1, 1) => Some(NVME1_NS1),
        (1, 2) => Some(NVME1_NS2),
        _ => None,
    }
}

/// The pattern word the host wrote at 8-byte-aligned byte `offset` of image `id`:
/// `(id << 56) | offset`, stored little-endian. Never zero for ids 1..=3.
pub fn pattern_word(id: u8, offset: u64) -> u64 {
    (u64::from(id) << 56) | (offset & !7 & 0x00ff_ffff_ffff_ffff)
}

/// The pattern byte at any byte `offset` of image `id`.
pub fn pattern_byte(id: u8, offset: u64) -> u8 {
    pattern_word(id, offset).to_le_bytes()[(offset & 7) as usize]
}

/// Fill `buf` with the pattern bytes of image `id` starting at byte `offset` (any alignment).
pub fn fill_pattern(id: u8, offset: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(id, offset + i as u64);
    }
}

/// The first byte where a buffer differs from an image's pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatternMismatch {
    /// Pattern id of the image the buffer was checked against.
    pub id: u8,
    /// Byte offset in the image.
    pub offset: u64,
    /// Pattern byte expected there.
    pub expected: u8,
    /// Byte found in the buffer.
    pub found: u8,
}

impl fmt::Display for PatternMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "data differs from image {}'s pattern at image byte {:#x}: expected {:#04x}, found {:#04x} (the little-endian word at {:#x} should be {:#018x}; wrong LBA or a short transfer?)",
            self.id,
            self.offset,
            self.expected,
            self.found,
            self.offset & !7,
            pattern_word(self.id, self.offset)
        )
    }
}

/// Check that `buf` holds image `id`'s pattern from byte `offset` on.
pub fn check_pattern(id: u8, offset: u64, buf: &[u8]) -> Result<(), PatternMismatch> {
    for (i, &found) in buf.iter().enumerate() {
        let at = offset + i as u64;
        let expected = pattern_byte(id, at);
        if found != expected {
            return Err(PatternMismatch {
                id,
                offset: at,
                expected,
                found,
            });
        }
    }
    Ok(())
}

fn check_name(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_whitespace() { '_' } else { c })
        .collect()
}

/// The `UBD-HOSTCHECK` line asking the host to compare `len` bytes of two run-directory files.
pub fn hostcheck_file_eq(
    name: &str,
    file_a: &str,
    off_a: u64,
    file_b: &str,
    off_b: u64,
    len: u64,
) -> String {
    format!(
        "UBD-HOSTCHECK {} file-eq {file_a}:{off_a} {file_b}:{off_b} {len}",
        check_name(name)
    )
}

/// The `UBD-HOSTCHECK` line asking the host to check that `file` holds `bytes` at `off`.
pub fn hostcheck_file_bytes(name: &str, file: &str, off: u64, bytes: &[u8]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "UBD-HOSTCHECK {} file-bytes {file}:{off} {hex}",
        check_name(name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn none_outside_the_guest() {
        assert_eq!(from_lookup(env(&[("UBD_NVME", "0000:00:04.0")])), None);
        assert_eq!(from_lookup(env(&[("UBD_GUEST", "0")])), None);
    }

    #[test]
    fn parses_the_guest_environment() {
        let tb = from_lookup(env(&[
            ("UBD_GUEST", "1"),
            ("UBD_NVME", "0000:00:04.0,0000:00:05.0"),
            ("UBD_IVSHMEM", "0000:00:06.0"),
            ("UBD_NICS", "0000:00:07.0, 0000:00:08.0"),
            ("UBD_NVME_MDTS0", "0000:00:0a.0"),
            ("UBD_NIC_MQ", "0000:00:09.0"),
            ("UBD_NVME_CMB", "0000:00:0b.0"),
            ("UBD_IGB", "0000:01:00.0,0000:02:00.0"),
            ("UBD_RUN_DIR", "/r"),
        ]))
        .expect("in guest");
        assert_eq!(tb.nvme, ["0000:00:04.0", "0000:00:05.0"]);
        assert_eq!(tb.ivshmem.as_deref(), Some("0000:00:06.0"));
        assert_eq!(tb.nics, ["0000:00:07.0", "0000:00:08.0"]);
        assert_eq!(tb.nvme_mdts0.as_deref(), Some("0000:00:0a.0"));
        assert_eq!(tb.nic_mq.as_deref(), Some("0000:00:09.0"));
        assert_eq!(tb.igb, ["0000:01:00.0", "0000:02:00.0"]);
        assert_eq!(tb.run_dir.as_deref(), Some("/r"));
        assert_eq!(
            tb.all(),
            [
                "0000:00:04.0",
                "0000:00:05.0",
                "0000:00:06.0",
                "0000:00:07.0",
                "0000:00:08.0",
                "0000:00:0a.0",
                "0000:00:09.0",
                "0000:00:0b.0",
                "0000:01:00.0",
                "0000:02:00.0"
            ]
        );
    }

    #[test]
    fn empty_lists_when_devices_are_missing() {
        let tb = from_lookup(env(&[("UBD_GUEST", "1"), ("UBD_IVSHMEM", "")])).expect("in guest");
        assert!(tb.nvme.is_empty() && tb.nics.is_empty());
        assert_eq!(tb.ivshmem, None);
        assert_eq!((tb.nvme_mdts0, tb.nic_mq, tb.nvme_cmb), (None, None, None));
        assert_eq!(tb.run_dir, None);
    }

    #[test]
    fn pattern_matches_the_image_generator() {
        // scripts/vm/images.sh: pack("Q<", (id << 56) | off) at every 8-byte offset.
        assert_eq!(pattern_word(1, 0), 0x0100_0000_0000_0000);
        assert_eq!(pattern_word(3, 4096), 0x0300_0000_0000_1000);
        assert_eq!(pattern_word(2, 4099), 0x0200_0000_0000_1000);
        assert_eq!(pattern_byte(2, 512), 0x00);
        assert_eq!(pattern_byte(2, 513), 0x02);
        assert_eq!(pattern_byte(2, 519), 0x02);
        let mut buf = [0u8; 16];
        fill_pattern(1, 8, &mut buf);
        assert_eq!(&buf[..8], &0x0100_0000_0000_0008u64.to_le_bytes());
        assert_eq!(&buf[8..], &0x0100_0000_0000_0010u64.to_le_bytes());
    }

    #[test]
    fn check_pattern_finds_the_first_bad_byte() {
        let mut buf = vec![0u8; 4096];
        fill_pattern(3, 4096 * 5 + 3, &mut buf);
        assert_eq!(check_pattern(3, 4096 * 5 + 3, &buf), Ok(()));
        assert!(check_pattern(2, 4096 * 5 + 3, &buf).is_err());
        buf[100] ^= 0xff;
        let e = check_pattern(3, 4096 * 5 + 3, &buf).unwrap_err();
        assert_eq!(e.offset, 4096 * 5 + 3 + 100);
        assert_eq!(e.found, e.expected ^ 0xff);
        assert!(e.to_string().contains("0x5067"), "{e}");
    }

    proptest::proptest! {
        #[test]
        fn fill_then_check_holds_and_a_flipped_byte_is_found(
            id in 1u8..=3,
            offset in 0u64..(IMAGE_LEN - 8192),
            len in 1usize..8192,
            flip in proptest::prelude::any::<proptest::sample::Index>(),
        ) {
            let mut buf = vec![0u8; len];
            fill_pattern(id, offset, &mut buf);
            proptest::prop_assert_eq!(check_pattern(id, offset, &buf), Ok(()));
            // Every byte agrees with the word it sits in.
            for (i, &b) in buf.iter().enumerate() {
                let at = offset + i as u64;
                proptest::prop_assert_eq!(b, pattern_word(id, at).to_le_bytes()[(at % 8) as usize]);
            }
            let i = flip.index(len);
            buf[i] = !buf[i];
            let e = check_pattern(id, offset, &buf).unwrap_err();
            proptest::prop_assert_eq!(e.offset, offset + i as u64);
            proptest::prop_assert_eq!(e.id, id);
        }
    }

    #[test]
    fn images_by_controller_and_namespace() {
        assert_eq!(image_of(0, 1), Some(NVME0_NS1));
        assert_eq!(
            image_of(1, 2).map(|i| (i.file, i.block_size)),
            Some(("nvme1-ns2.img", 4096))
        );
        assert_eq!(image_of(0, 2), None);
        assert_eq!(image_of(2, 1), None);
        let ids: Vec<u8> = [NVME0_NS1, NVME1_NS1, NVME1_NS2]
            .iter()
            .map(|i| i.id)
            .collect();
        assert_eq!(
            ids,
            [1, 2, 3],
            "ids follow scripts/vm/images.sh's file order"
        );
    }

    #[test]
    fn skip_lines_name_the_test_and_the_reason() {
        assert_eq!(
            skip_line("mq::two pairs", "no multiqueue NIC"),
            "UBD-SKIP mq::two_pairs: no multiqueue NIC"
        );
    }

    #[test]
    fn hostcheck_lines() {
        assert_eq!(
            hostcheck_file_eq("nvme to bar", "nvme0.img", 0, "gpubar", 4096, 512),
            "UBD-HOSTCHECK nvme_to_bar file-eq nvme0.img:0 gpubar:4096 512"
        );
        assert_eq!(
            hostcheck_file_bytes("w", "nvme1-ns2.img", 8192, &[0xde, 0xad, 0x01]),
            "UBD-HOSTCHECK w file-bytes nvme1-ns2.img:8192 dead01"
        );
    }
}
