//! ubdirect-devmodel: in-process models of the devices ubdirect drives, behind
//! [`ubdirect_core::DeviceModel`], so the drivers' real code (bring-up, admin commands, queue
//! pairs, rings) runs on the host in milliseconds with no VFIO and no QEMU.
//!
//! A model is attached with [`attach`]: the [`ubdirect_core::PciDevice`] it returns is handed
//! to the driver's usual entry point (e.g. `Controller::open_device`). Driver memory is
//! reached through [`HostDma`], which translates IOVAs with the driver's
//! [`ubdirect_core::UbRegistry`] and refuses (and records) any address outside a registered
//! region: a stray DMA in the model is a [`DmaFault`], never undefined behaviour.
//!
//! Each model has a well-behaved mode (fast host tests) and a hostile mode in which a
//! [`nvme::Tamper`] (for fuzzing: [`nvme::Hostile`], built from generated input) rewrites what the device shows the driver.

#![deny(missing_docs)]

pub mod config;
pub mod dma;
pub mod fuzz;
pub mod igb;
pub mod nvme;
pub mod virtio_net;
mod within;
pub use within::within;

use std::sync::Arc;

use ubdirect_core::{DeviceModel, PciAddress, PciDevice, UbRegistry};

pub use config::ConfigSpace;
pub use dma::{DmaFault, HostDma};

/// The made-up PCI address models are attached at.
pub const MODEL_ADDRESS: &str = "0000:7f:00.0";

/// A [`PciDevice`] backed by `model`, in `registry`'s DMA domain (make the registry over
/// [`ubdirect_core::DmaDomain::host_only`]).
pub fn attach(registry: &Arc<UbRegistry>, model: Arc<dyn DeviceModel>) -> Arc<PciDevice> {
    let addr: PciAddress = MODEL_ADDRESS.parse().expect("a valid address");
    PciDevice::from_model(registry.domain(), addr, model)
        .expect("a model's config space has vendor/device ids")
}
