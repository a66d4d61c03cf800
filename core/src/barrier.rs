//! Memory barriers for device access. Call [`wmb`] after filling a descriptor in DMA memory and
//! before the doorbell write that tells the device about it; [`rmb`] after seeing a completion's
//! phase/valid bit and before reading the rest of it.
//!
//! Per architecture (the same choices as SPDK's `spdk_wmb`/`spdk_rmb`/`spdk_mb` and Linux's
//! `wmb`/`rmb`/`mb` for device memory):
//! - x86-64: stores to write-back memory are seen in order, and before a later uncached (MMIO)
//!   store; loads are not reordered with older loads. A compiler barrier is all `wmb`/`rmb`
//!   need; `mb` is `mfence`.
//! - aarch64: the device is outside the inner-shareable domain that Rust's `fence` orders, so
//!   each barrier is a `dsb` (store, load, full) that completes earlier accesses system-wide.
//!
//! Any other architecture is a compile error: a poll-mode driver with a wrong store barrier
//! hands the device half-written descriptors, which no test here could catch.

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!(
    "ubdirect's device barriers are written for x86_64 and aarch64 only: add this \
     architecture's store/load barriers to core/src/barrier.rs"
);

/// Order earlier stores before later stores (descriptor writes before a doorbell).
#[inline(always)]
pub fn wmb() {
    #[cfg(target_arch = "x86_64")]
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a data synchronization barrier has no memory operands and no side effect other
    // than ordering.
    unsafe {
        std::arch::asm!("dsb st", options(nostack, preserves_flags))
    };
}

/// Order earlier loads before later loads (a completion's valid bit before its payload).
#[inline(always)]
pub fn rmb() {
    #[cfg(target_arch = "x86_64")]
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as in wmb.
    unsafe {
        std::arch::asm!("dsb ld", options(nostack, preserves_flags))
    };
}

/// Full barrier: order every earlier access before every later one.
#[inline(always)]
pub fn mb() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: mfence has no operands and only orders memory accesses.
    unsafe {
        std::arch::asm!("mfence", options(nostack, preserves_flags))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as in wmb.
    unsafe {
        std::arch::asm!("dsb sy", options(nostack, preserves_flags))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn barriers_run_on_this_architecture() {
        // The compile-time half (an unsupported architecture does not build) is the point;
        // this only shows each barrier executes.
        wmb();
        rmb();
        mb();
    }
}
