//! [`DataBuf`]: what a command's data lives in. UB pool blocks on the I/O path (C2HData lands
//! in them straight from the socket, H2CData and in-capsule data leave from them), `Vec<u8>`
//! for admin pages and tests.

use ubdirect_core::UbBuf;

/// Memory a command's data is read into or written from, owned by the command while in flight.
///
/// # Safety
/// The queue writes received data through [`DataBuf::data_ptr`] and sends bytes read through
/// it, trusting [`DataBuf::data_len`] as the bound. An implementation must return a pointer to
/// `data_len()` bytes of memory the value owns exclusively (nothing else reads or writes it
/// while the buffer is in a queue), valid for reads and writes, and return the same pointer and
/// length on every call for as long as the value is not mutated outside the queue.
pub unsafe trait DataBuf: Send {
    /// The CPU address of the first byte.
    fn data_ptr(&mut self) -> *mut u8;
    /// Length in bytes.
    fn data_len(&self) -> usize;
    /// Why the queue may not read and write the bytes through [`DataBuf::data_ptr`] (the
    /// submission is refused then), or None when it may.
    fn cpu_refusal(&self) -> Option<&'static str> {
        None
    }
}

// SAFETY: a UbBuf is the only handle to its pool block (the pool hands each block to one
// UbBuf until it is dropped); as_ptr() is the block's mapped CPU address, valid for len()
// bytes of reads and writes (a block of a read-only file region is refused by cpu_refusal
// before the queue touches it), and neither changes while the UbBuf lives.
unsafe impl DataBuf for UbBuf {
    fn data_ptr(&mut self) -> *mut u8 {
        self.as_ptr()
    }
    fn data_len(&self) -> usize {
        self.len()
    }
    fn cpu_refusal(&self) -> Option<&'static str> {
        self.region().is_read_only().then_some(
            "the buffer is a block of a read-only UB file region: NVMe/TCP moves data through the CPU, which neither writes a file region nor reads its mapping (the file may be truncated under it); copy the bytes into a host pool buffer (UbBuf::read_into)",
        )
    }
}

// SAFETY: a Vec owns its heap allocation; as_mut_ptr() is valid for len() bytes of reads and
// writes (len() bytes are initialized), and neither changes while the queue holds the Vec (it
// is not resized there).
unsafe impl DataBuf for Vec<u8> {
    fn data_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn data_len(&self) -> usize {
        self.len()
    }
}
