//! An embedder that only drives NVMe: open a controller bound to vfio-pci and list its
//! namespaces. Built with `ubdirect = { default-features = false, features = ["nvme"] }`.
//!
//! ```sh
//! cargo run --manifest-path examples/embedder-nvme-only/Cargo.toml -- 0000:00:04.0
//! ```

use ubdirect::dma::{DmaDomain, UbRegistry};
use ubdirect::nvme::{Controller, ControllerOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .ok_or("usage: embedder-nvme-only <pci-address>")?;
    let registry = UbRegistry::new(DmaDomain::new()?);
    let ctrl = Controller::open(&registry, addr.parse()?, ControllerOptions::default())?;
    println!("{addr}: {} namespace(s)", ctrl.namespaces().len());
    Ok(())
}
