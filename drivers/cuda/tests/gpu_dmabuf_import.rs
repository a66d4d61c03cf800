//! GPU memory exported as a dma-buf (CUDA) offered to `UbRegistry::register_dmabuf`.
//! A GPU machine without vfio/iommufd (the H200 machine) can run this only up to the import:
//! the export must work, and the import must be refused with the requirement named and nothing
//! registered.

use ubdirect_core::{DmaDomain, UbRegistry};
use ubdirect_cuda::{CudaGpu, GpuDmaBuf};

#[test]
#[ignore = "gpu: needs an NVIDIA GPU and driver (run with --ignored on a GPU machine)"]
fn a_gpu_dmabuf_import_without_iommufd_is_refused_naming_the_requirement() {
    let gpu = CudaGpu::open(0).expect("GPU");
    let d = GpuDmaBuf::export(&gpu, 4 << 20).expect("CUDA exports device memory as a dma-buf");
    println!("{}: exported {} bytes as dma-buf", gpu.name(), d.len());
    let fd = d.fd().try_clone().expect("dup the dma-buf fd");
    let reg = UbRegistry::new(DmaDomain::host_only());
    let e = reg
        .register_dmabuf(fd, d.len(), None)
        .expect_err("no iommufd here");
    let m = e.to_string();
    println!("refused: {m}");
    assert!(m.contains("needs the iommufd back end"), "{m}");
    assert!(m.contains("CONFIG_IOMMUFD"), "{m}");
    assert!(reg.regions().is_empty());
    assert_eq!(reg.domain().mapping_count(), 0);
}
