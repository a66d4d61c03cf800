//! [`DataBuf`]: what a command's data lives in. UB pool blocks on the I/O path (C2HData lands
//! in them straight from the socket, H2CData and in-capsule data leave from them), `Vec<u8>`
//! for admin pages and tests.

use ubdirect_core::UbBuf;

/// Memory a command's data is read into or written from, owned by the command while in flight.
pub trait DataBuf: Send {
    /// The CPU address of the first byte.
    fn data_ptr(&mut self) -> *mut u8;
    /// Length in bytes.
    fn data_len(&self) -> usize;
}

impl DataBuf for UbBuf {
    fn data_ptr(&mut self) -> *mut u8 {
        self.as_ptr()
    }
    fn data_len(&self) -> usize {
        self.len()
    }
}

impl DataBuf for Vec<u8> {
    fn data_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn data_len(&self) -> usize {
        self.len()
    }
}
