//! `--allow-noiommu`: the program's opt-in to the no-IOMMU back end, one clap argument shared
//! by every subcommand that opens devices (flattened into their `Args`).

use std::sync::Arc;

use ubdirect::dma::vfio::DomainOptions;
use ubdirect::dma::{CoreError, DmaDomain};

/// The no-IOMMU opt-in of one subcommand.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct NoIommuArg {
    /// Allow the no-IOMMU back end (vfio's unsafe no-IOMMU mode: the device DMAs to physical
    /// addresses with no isolation and can reach all of memory). Also needs the operator's
    /// opt-in: vfio's no-IOMMU mode turned on by scripts/setup.sh (see README).
    #[arg(long = "allow-noiommu")]
    pub allow_noiommu: bool,
}

impl NoIommuArg {
    /// A DMA domain with this opt-in (the back end itself is chosen when a device opens).
    pub fn domain(&self) -> Result<Arc<DmaDomain>, CoreError> {
        DmaDomain::with_options(self.domain_options())
    }

    /// The domain options with this opt-in, for an [`ubdirect::Env`] to open its domain with.
    pub fn domain_options(&self) -> DomainOptions {
        DomainOptions {
            allow_noiommu: self.allow_noiommu,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use crate::cli::Cli;

    /// Every subcommand (and log page) whose arguments offer `--allow-noiommu`.
    fn with_the_flag() -> Vec<String> {
        let mut out = Vec::new();
        for sub in Cli::command().get_subcommands() {
            let leaves: Vec<&clap::Command> = if sub.has_subcommands() {
                sub.get_subcommands().collect()
            } else {
                vec![sub]
            };
            for leaf in leaves {
                if leaf
                    .get_arguments()
                    .any(|a| a.get_long() == Some("allow-noiommu"))
                {
                    let name = if leaf.get_name() == sub.get_name() {
                        sub.get_name().to_string()
                    } else {
                        format!("{} {}", sub.get_name(), leaf.get_name())
                    };
                    out.push(name);
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn every_subcommand_that_opens_devices_takes_allow_noiommu() {
        assert_eq!(
            with_the_flag(),
            [
                "identify",
                "log error",
                "log smart",
                "loopback",
                "perf",
                "pipeline"
            ]
        );
        let argv: [&[&str]; 6] = [
            &["identify", "00:04.0"],
            &["perf", "00:04.0"],
            &["log", "smart", "00:04.0"],
            &["log", "error", "00:04.0"],
            &["pipeline", "--source", "nvme:00:04.0", "--sink", "null"],
            &["loopback", "--tx", "00:05.0", "--rx", "00:06.0"],
        ];
        for a in argv {
            let parse = |extra: &[&str]| {
                let all: Vec<&str> = ["ubdirect"].iter().chain(a).chain(extra).copied().collect();
                Cli::try_parse_from(&all)
                    .unwrap_or_else(|e| panic!("{all:?}: {e}"))
                    .command
                    .allow_noiommu()
            };
            assert_eq!(parse(&[]), Some(false), "{a:?}");
            assert_eq!(parse(&["--allow-noiommu"]), Some(true), "{a:?}");
        }
        let devices = Cli::try_parse_from(["ubdirect", "devices"]).unwrap();
        assert_eq!(devices.command.allow_noiommu(), None);
    }
}
