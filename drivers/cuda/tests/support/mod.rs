//! The recording CUDA pinner both file-window test files use (host tests: no GPU, no libcuda).

#![allow(dead_code)] // not every test binary reads every counter

use std::sync::Mutex;

use ubdirect_cuda::HostPinner;

/// Records every pin/unpin and what the pinned memory held at pin time; a range pinned twice
/// at once, or not page aligned, fails the test.
#[derive(Default)]
pub struct FakePinner {
    pinned: Mutex<Vec<(usize, usize)>>,
    pins: Mutex<u64>,
    unpins: Mutex<u64>,
    first_bytes: Mutex<Vec<u8>>,
}

impl HostPinner for FakePinner {
    fn pin(&self, ptr: *const u8, len: usize) -> Result<(), String> {
        assert_eq!(ptr as usize % 4096, 0, "pinned ranges are page aligned");
        assert_eq!(len % 4096, 0);
        // SAFETY: the registry hands over a live read-only mapping of `len` bytes.
        let first = unsafe { *ptr };
        let mut p = self.pinned.lock().unwrap();
        assert!(
            !p.iter()
                .any(|&(a, l)| (ptr as usize) < a + l && a < ptr as usize + len),
            "a range pinned twice"
        );
        p.push((ptr as usize, len));
        self.first_bytes.lock().unwrap().push(first);
        *self.pins.lock().unwrap() += 1;
        Ok(())
    }
    fn unpin(&self, ptr: *const u8, len: usize) {
        let mut p = self.pinned.lock().unwrap();
        let i = p
            .iter()
            .position(|&r| r == (ptr as usize, len))
            .expect("unpin of a range that was pinned");
        p.remove(i);
        *self.unpins.lock().unwrap() += 1;
    }
}

impl FakePinner {
    /// Ranges pinned now.
    pub fn live(&self) -> usize {
        self.pinned.lock().unwrap().len()
    }
    /// The ranges pinned now (address, length), in pin order.
    pub fn ranges(&self) -> Vec<(usize, usize)> {
        self.pinned.lock().unwrap().clone()
    }
    /// Pins so far.
    pub fn pins(&self) -> u64 {
        *self.pins.lock().unwrap()
    }
    /// Unpins so far.
    pub fn unpins(&self) -> u64 {
        *self.unpins.lock().unwrap()
    }
    /// The first byte of every range at the time it was pinned, in pin order.
    pub fn first_bytes(&self) -> Vec<u8> {
        self.first_bytes.lock().unwrap().clone()
    }
}
