//! Opening an NVMe controller for a subcommand through the facade's [`Env`]: the DMA domain
//! with the subcommand's no-IOMMU opt-in, then the controller, and no pool (a subcommand that
//! needs one sizes it from what the controller granted and creates it in [`Env::registry`]).
//! Errors come back as the library error under the [`EnvError`], so that
//! [`super::errors::user_message`] words them as for a controller opened directly.

use std::error::Error;

use ubdirect::nvme::ControllerOptions;
use ubdirect::{Env, EnvError};

use super::noiommu_arg::NoIommuArg;

/// An environment holding the NVMe controller at `addr` (its [`Env::controller`] 0), opened
/// with `opts` in a new domain with the `noiommu` opt-in.
pub fn nvme_controller(
    noiommu: NoIommuArg,
    addr: &str,
    opts: ControllerOptions,
) -> Result<Env, Box<dyn Error + Send + Sync>> {
    Env::builder()
        .domain_options(noiommu.domain_options())
        .nvme(addr)
        .controller_options(opts)
        .without_pool()
        .open()
        .map_err(source_of)
}

/// The library error an [`EnvError`] wraps (the address's, the domain's, the controller's, the
/// pool's), or the [`EnvError`] itself where it wraps none.
fn source_of(e: EnvError) -> Box<dyn Error + Send + Sync> {
    match e {
        EnvError::Address { source, .. }
        | EnvError::Device { source, .. }
        | EnvError::Domain(source)
        | EnvError::PoolConfig(source)
        | EnvError::Pool(source) => source.into(),
        EnvError::Controller { source, .. } => source.into(),
        EnvError::Nic { source, .. } => source.into(),
        EnvError::Hugepages(source) => source.into(),
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use ubdirect::dma::CoreError;

    use super::*;

    #[test]
    fn a_bad_address_is_the_address_error_itself() {
        let e = nvme_controller(NoIommuArg::default(), "00:04", ControllerOptions::default())
            .err()
            .unwrap();
        let want = "00:04".parse::<ubdirect::dma::PciAddress>().unwrap_err();
        assert!(e.downcast_ref::<CoreError>().is_some(), "{e}");
        assert_eq!(e.to_string(), want.to_string());
    }
}
