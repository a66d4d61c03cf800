//! [`HostDma`]: a model's view of driver memory, through the IOVAs the driver programs.

use std::sync::{Arc, Mutex};

use ubdirect_core::UbRegistry;

/// A DMA the model's IOMMU refused: the IOVA range is not (wholly) inside one registered
/// region. What a real IOMMU reports as a fault; the model records it and answers the command
/// with an error status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaFault {
    /// The first IOVA of the access.
    pub iova: u64,
    /// Bytes of the access.
    pub len: usize,
    /// A device write (to host memory) rather than a read.
    pub write: bool,
}

impl std::fmt::Display for DmaFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IOMMU fault: device {} of {} bytes at IOVA {:#x} outside every registered region",
            if self.write { "write" } else { "read" },
            self.len,
            self.iova
        )
    }
}

impl std::error::Error for DmaFault {}

/// Driver memory as the modelled device sees it: IOVA -> host memory through the registry.
#[derive(Debug)]
pub struct HostDma {
    registry: Arc<UbRegistry>,
    faults: Mutex<Vec<DmaFault>>,
}

/// Whether the model's DMA reaches a region of `kind`: host memory both ways, a file region
/// for reads only (its IOMMU mapping has READ permission only).
fn readable_as(kind: &ubdirect_core::RegionKind, write: bool) -> bool {
    match kind {
        ubdirect_core::RegionKind::Host { .. } => true,
        ubdirect_core::RegionKind::File { .. } => !write,
        _ => false,
    }
}

impl HostDma {
    /// DMA into the regions of `registry`.
    pub fn new(registry: Arc<UbRegistry>) -> HostDma {
        HostDma {
            registry,
            faults: Mutex::new(Vec::new()),
        }
    }

    /// Host address of `[iova, iova+len)` if it lies in one mapped region; the region is
    /// returned too so it stays alive while the caller copies.
    fn translate(
        &self,
        iova: u64,
        len: usize,
        write: bool,
    ) -> Result<(Arc<ubdirect_core::UbRegion>, *mut u8), DmaFault> {
        let fault = DmaFault { iova, len, write };
        let found = self.registry.region_of_iova(iova);
        match found {
            Some((reg, off))
                if reg.contains_iova(iova, len)
                    && reg.is_mapped()
                    && readable_as(&reg.kind, write) =>
            {
                let p = reg.vaddr.wrapping_add(off);
                Ok((reg, p))
            }
            _ => {
                self.faults
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(fault);
                Err(fault)
            }
        }
    }

    /// Copy `buf.len()` bytes from IOVA `iova` (a device read of host memory).
    pub fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        let (_reg, p) = self.translate(iova, buf.len(), false)?;
        // SAFETY: [p, p+len) lies inside a live, mapped host region (checked by translate; the
        // Arc keeps it alive); buf is a distinct Rust slice. Like a real device's DMA, the copy
        // races only with driver accesses the driver's protocol orders.
        unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// Copy `data` to IOVA `iova` (a device write of host memory).
    pub fn write(&self, iova: u64, data: &[u8]) -> Result<(), DmaFault> {
        let (_reg, p) = self.translate(iova, data.len(), true)?;
        // SAFETY: as in `read`, with the copy in the other direction.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    /// A little-endian u32 at `iova`.
    pub fn read_u32(&self, iova: u64) -> Result<u32, DmaFault> {
        let mut b = [0u8; 4];
        self.read(iova, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// A little-endian u64 at `iova`.
    pub fn read_u64(&self, iova: u64) -> Result<u64, DmaFault> {
        let mut b = [0u8; 8];
        self.read(iova, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Write a little-endian u32 at `iova`.
    pub fn write_u32(&self, iova: u64, v: u32) -> Result<(), DmaFault> {
        self.write(iova, &v.to_le_bytes())
    }

    /// Every fault so far, oldest first.
    pub fn faults(&self) -> Vec<DmaFault> {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ubdirect_core::DmaDomain;

    #[test]
    fn translates_registered_memory_and_refuses_the_rest() {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let r = reg.register_anonymous(8192, None).unwrap();
        let dma = HostDma::new(reg.clone());
        dma.write(r.iova + 100, b"hello").unwrap();
        let mut b = [0u8; 5];
        dma.read(r.iova + 100, &mut b).unwrap();
        assert_eq!(&b, b"hello");
        // SAFETY: inside the region just written.
        assert_eq!(unsafe { *r.vaddr.add(104) }, b'o');
        // Straddling the end, below the first region, and at 0: faults, recorded.
        let e = dma.write(r.iova + 8190, b"xyz").unwrap_err();
        assert_eq!(
            e,
            DmaFault {
                iova: r.iova + 8190,
                len: 3,
                write: true
            }
        );
        assert!(dma.read(0, &mut b).is_err());
        assert!(dma.read_u64(r.iova + 8192).is_err());
        assert_eq!(dma.faults().len(), 3);
    }

    #[test]
    fn a_file_region_is_read_and_never_written() {
        let path = std::env::temp_dir().join(format!("ubd-devmodel-dma-{}", std::process::id()));
        std::fs::write(&path, [0x5au8; 4096]).unwrap();
        let reg = UbRegistry::new(DmaDomain::host_only());
        let r = reg
            .register_file(&std::fs::File::open(&path).unwrap(), 0, 4096)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        let dma = HostDma::new(reg.clone());
        let mut b = [0u8; 8];
        dma.read(r.iova + 8, &mut b).unwrap();
        assert_eq!(b, [0x5a; 8]);
        assert!(dma.write(r.iova + 8, b"x").is_err());
        assert_eq!(dma.faults().len(), 1);
    }
}
