//! The check of bytes a device wrote into the GPU-BAR stand-in (the ivshmem device's BAR2, whose
//! backing file in the run directory is [`GPUBAR_FILE`]).

use crate::{check_pattern, hostcheck_file_eq, BackingImage, PatternMismatch, GPUBAR_FILE};

/// Checks a copy of `image`'s bytes from `image_off` on that landed at offset `bar_off` of the
/// GPU-BAR stand-in: `seen` (what the CPU reads through the BAR mapping) must hold the image's
/// pattern. Returns the `UBD-HOSTCHECK` line named `name` (print it) that has the host compare
/// the BAR's backing file with the image after the guest exits.
pub fn check_bar_copy(
    name: &str,
    seen: &[u8],
    bar_off: u64,
    image: BackingImage,
    image_off: u64,
) -> Result<String, PatternMismatch> {
    check_pattern(image.id, image_off, seen)?;
    Ok(hostcheck_file_eq(
        name,
        GPUBAR_FILE,
        bar_off,
        image.file,
        image_off,
        seen.len() as u64,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{fill_pattern, NVME0_NS1};

    fn image_bytes(image: BackingImage, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        fill_pattern(image.id, off, &mut v);
        v
    }

    #[test]
    fn a_correct_copy_gives_the_host_check_of_the_bar_file_against_the_image() {
        let seen = image_bytes(NVME0_NS1, 5000 * 512, 4096);
        assert_eq!(
            check_bar_copy("p2p 1", &seen, 2 << 20, NVME0_NS1, 5000 * 512).unwrap(),
            format!(
                "UBD-HOSTCHECK p2p_1 file-eq gpubar:{} nvme0.img:{} 4096",
                2 << 20,
                5000 * 512
            )
        );
    }

    #[test]
    fn a_wrong_byte_is_reported_at_its_image_offset_and_gives_no_host_check() {
        let mut seen = image_bytes(NVME0_NS1, 512, 1024);
        seen[100] ^= 0xff;
        let e = check_bar_copy("p2p", &seen, 0, NVME0_NS1, 512).unwrap_err();
        assert_eq!(e.offset, 612);
        assert_eq!(e.id, NVME0_NS1.id);
        // Bytes from the wrong place of the image are no copy either.
        let shifted = image_bytes(NVME0_NS1, 1024, 1024);
        assert!(check_bar_copy("p2p", &shifted, 0, NVME0_NS1, 512).is_err());
    }
}
