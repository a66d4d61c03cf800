//! The VFIO DMA domain: one IOMMU address space behind interchangeable back ends (a type1v2
//! container, an iommufd IOAS with vfio cdevs), chosen at run time ([`choose_backend`]).

mod backend;
pub(crate) mod dmabuf;
mod domain;
mod domain_id;
mod iommu_info;
mod iommufd;
mod mapping;
pub mod noiommu;
pub(crate) mod noiommu_group;
mod preflight;
mod readonly_map;
mod segments;
mod select;

pub(crate) use backend::OpenedDevice;
pub use domain::DmaDomain;
pub use domain_id::DomainId;
pub use iommu_info::IommuInfo;
pub use mapping::DmaMapping;
pub use segments::DmaSegment;
pub(crate) use segments::{iova_at as segments_iova_at, offset_of as segments_offset_of};
pub use select::{
    choose as choose_backend, choose_in as choose_backend_in, device_cdev, BackendChoice,
    BackendKind, DomainOptions, BACKEND_ENV,
};
