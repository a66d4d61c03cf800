//! Copies between a [`UbBuf`] block and CPU memory for every kind of region: a plain copy for
//! host memory, volatile accesses for a BAR, and for a file region a read of the file itself
//! (never of its mapping, so a file truncated under the region gives an error, not a SIGBUS).

use super::UbBuf;
use crate::error::{CoreError, Result};
use crate::ub::region::{Backing, RegionKind};

impl UbBuf {
    /// Copy bytes `[offset, offset + dst.len())` of the block into `dst`, for a block of any
    /// region: a plain copy of host memory; volatile loads from a BAR (8 bytes at a time where
    /// aligned); for a file region, a read of the file at the block's file offset through the
    /// region's own descriptor (bytes past the file's size at registration are zeros, as the
    /// mapping's last page shows them), then one fstat compared with the registration.
    ///
    /// Errors: [`CoreError::InvalidArgument`] for a range outside the block;
    /// [`CoreError::FileChanged`] for a file region whose file changed since registration (a
    /// file truncated under the block reads short: this error, never a SIGBUS);
    /// [`CoreError::Io`] when reading the file fails.
    pub fn read_into(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range("read_into", offset, dst.len())?;
        if self.pool.cpu_slices() {
            dst.copy_from_slice(&self.as_slice()[offset..offset + dst.len()]);
            return Ok(());
        }
        let r = self.region();
        match (r.backing(), r.kind) {
            (Backing::File(m), _) => m.read_at(r.id, self.region_offset() + offset, dst),
            (_, RegionKind::DeviceBar { .. } | RegionKind::BarWindow { .. }) => {
                // SAFETY: the range is inside the block (checked above), which is mapped BAR
                // memory of the region this buffer's pool keeps alive.
                unsafe { volatile_read(self.ptr.add(offset), dst) };
                Ok(())
            }
            _ => Err(self.no_cpu_access("read_into")),
        }
    }

    /// Copy `src` into bytes `[offset, offset + src.len())` of the block: a plain copy into host
    /// memory, volatile stores into a BAR (8 bytes at a time where aligned).
    ///
    /// Errors: [`CoreError::InvalidArgument`] for a range outside the block, and for a block of
    /// a file region (read-only: a DMA source only; write the file instead).
    pub fn write_from(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.check_range("write_from", offset, src.len())?;
        if self.pool.cpu_slices() {
            self.as_mut_slice()[offset..offset + src.len()].copy_from_slice(src);
            return Ok(());
        }
        let r = self.region();
        match r.kind {
            RegionKind::DeviceBar { .. } | RegionKind::BarWindow { .. } => {
                // SAFETY: the range is inside the block (checked above), which is mapped BAR
                // memory of the region this buffer's pool keeps alive; &mut self makes this
                // buffer the only CPU writer.
                unsafe { volatile_write(self.ptr.add(offset), src) };
                Ok(())
            }
            RegionKind::File { .. } => Err(CoreError::InvalidArgument(format!(
                "UbBuf::write_from into a block of read-only UB region {} (a registered file mapping): such blocks are DMA sources only; write the file instead",
                r.id
            ))),
            _ => Err(self.no_cpu_access("write_from")),
        }
    }

    /// The block's offset in its region.
    fn region_offset(&self) -> usize {
        self.ptr as usize - self.region().vaddr as usize
    }

    /// InvalidArgument unless `[offset, offset + len)` lies inside the block.
    fn check_range(&self, method: &str, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(CoreError::InvalidArgument(format!(
                "UbBuf::{method} of bytes [{offset}, +{len}) outside the {}-byte block",
                self.len()
            ))),
        }
    }

    /// The error for a region the CPU cannot reach (none such is ever carved into a pool).
    fn no_cpu_access(&self, method: &str) -> CoreError {
        let r = self.region();
        CoreError::InvalidArgument(format!(
            "UbBuf::{method} on a block of UB region {} ({:?}): the CPU has no access to it",
            r.id, r.kind
        ))
    }
}

/// Volatile loads of `dst.len()` bytes from `src`: 8 bytes at a time where `src + i` is 8-byte
/// aligned, single bytes elsewhere.
///
/// # Safety
/// `[src, src + dst.len())` must be mapped memory readable with volatile loads of 1 and 8 bytes.
unsafe fn volatile_read(src: *const u8, dst: &mut [u8]) {
    let mut i = 0;
    while i < dst.len() {
        let p = src.wrapping_add(i);
        if p as usize % 8 == 0 && dst.len() - i >= 8 {
            // SAFETY: p is 8-byte aligned and [p, p + 8) lies inside the caller's range.
            let v = unsafe { std::ptr::read_volatile(p.cast::<u64>()) };
            dst[i..i + 8].copy_from_slice(&v.to_ne_bytes());
            i += 8;
        } else {
            // SAFETY: p lies inside the caller's range.
            dst[i] = unsafe { std::ptr::read_volatile(p) };
            i += 1;
        }
    }
}

/// Volatile stores of `src` to `dst`: 8 bytes at a time where `dst + i` is 8-byte aligned,
/// single bytes elsewhere.
///
/// # Safety
/// `[dst, dst + src.len())` must be mapped memory writable with volatile stores of 1 and 8
/// bytes, and not be read or written through a Rust reference meanwhile.
unsafe fn volatile_write(dst: *mut u8, src: &[u8]) {
    let mut i = 0;
    while i < src.len() {
        let p = dst.wrapping_add(i);
        if p as usize % 8 == 0 && src.len() - i >= 8 {
            let v = u64::from_ne_bytes(src[i..i + 8].try_into().expect("8 bytes"));
            // SAFETY: p is 8-byte aligned and [p, p + 8) lies inside the caller's range.
            unsafe { std::ptr::write_volatile(p.cast::<u64>(), v) };
            i += 8;
        } else {
            // SAFETY: p lies inside the caller's range.
            unsafe { std::ptr::write_volatile(p, src[i]) };
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{volatile_read, volatile_write};
    use crate::ub::{PoolConfig, UbPool, UbRegistry};
    use crate::vfio::DmaDomain;

    #[test]
    fn host_blocks_copy_in_and_out_and_refuse_ranges_outside_the_block() {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let cfg = PoolConfig {
            block_size: 4096,
            block_count: 1,
        };
        let pool = UbPool::with_anonymous(&reg, cfg, None).unwrap();
        let mut b = pool.get().unwrap();
        b.write_from(100, b"bytes in").unwrap();
        let mut s = [0u8; 8];
        b.read_into(100, &mut s).unwrap();
        assert_eq!(&s, b"bytes in");
        assert_eq!(&b.as_slice()[100..108], b"bytes in");
        let e = b.write_from(4090, &[0; 7]).unwrap_err();
        assert!(e.to_string().contains("outside the 4096-byte block"), "{e}");
        assert!(b.read_into(usize::MAX, &mut s).is_err());
    }

    #[test]
    fn volatile_copies_move_every_byte_at_any_alignment() {
        let mut mem = vec![0u64; 8];
        let base = mem.as_mut_ptr().cast::<u8>();
        for (off, len) in [(0, 64), (1, 30), (3, 8), (7, 17), (8, 9), (5, 0)] {
            let src: Vec<u8> = (0..len).map(|i| (i * 13 + off + 1) as u8).collect();
            // SAFETY: [off, off + len) lies inside the 64 bytes of `mem`, used only here.
            unsafe { volatile_write(base.add(off), &src) };
            let mut back = vec![0u8; len];
            // SAFETY: as above.
            unsafe { volatile_read(base.add(off), &mut back) };
            assert_eq!(back, src, "offset {off}, {len} bytes");
        }
    }
}
