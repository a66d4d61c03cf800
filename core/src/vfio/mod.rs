//! The VFIO DMA domain: one IOMMU address space (a type1v2 container today; an iommufd IOAS
//! can be added as another back end behind the same [`DmaDomain`]).

mod backend;
mod domain;
mod iommu_info;
mod mapping;
mod preflight;
mod readonly_map;

pub use domain::DmaDomain;
pub use iommu_info::IommuInfo;
pub use mapping::DmaMapping;
