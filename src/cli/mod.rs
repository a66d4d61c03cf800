//! The `ubdirect` subcommands.
//!
//! Adding a subcommand takes three lines here and one file:
//! 1. write `src/cli/<name>.rs` with `pub struct Args` (`#[derive(clap::Args)]`, its doc comment
//!    is the subcommand's help) and `pub fn run(args: &Args) -> CliResult`;
//! 2. add `mod <name>;` below;
//! 3. add one variant to [`Command`] (`Name(name::Args),`) and one arm to [`Command::run`]
//!    (`Command::Name(a) => name::run(a),`).
//!
//! Errors are returned, never printed: `main` prints them as `ubdirect: error: ...` and exits 1.
//! Return `Outcome::Findings` for "ran fine but found problems" (exit 1 without an error line).

mod devices;
mod dma_backend;
mod doctor;
pub mod errors;
mod fault_hook;
mod identify;
pub mod json;
mod leaks;
mod log;
mod loopback;
mod namespace;
mod noiommu_arg;
pub mod nvmf;
mod nvmf_perf;
mod open;
mod perf;
mod pipeline;
mod pipeline_json;
mod units;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Userspace NVMe / NIC drivers over vfio-pci with a unified DMA buffer pool (storage- and
/// network-to-GPU, zero copy). Run `scripts/setup.sh` first, then `ubdirect doctor`.
#[derive(Debug, Parser)]
#[command(name = "ubdirect", version, about, long_about = None)]
pub struct Cli {
    /// More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    /// NVMe/TCP: file holding the host's DH-HMAC-CHAP secret (DHHC-1:..., as `nvme gen-dhchap-key` writes it); else $UBD_DHCHAP_SECRET.
    #[arg(long, global = true, value_name = "PATH")]
    pub dhchap_secret_file: Option<std::path::PathBuf>,

    /// NVMe/TCP: file holding the controller's DH-HMAC-CHAP secret (the host then authenticates the target too); else $UBD_DHCHAP_CTRL_SECRET.
    #[arg(long, global = true, value_name = "PATH")]
    pub dhchap_ctrl_secret_file: Option<std::path::PathBuf>,

    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// One variant per subcommand.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the PCI devices ubdirect cares about: address, ids, driver, IOMMU group, NUMA, link, BARs.
    Devices(devices::Args),
    /// Pre-flight check: IOMMU, vfio, groups, hugepages, memlock, locality, links, BARs, lockdown.
    Doctor(doctor::Args),
    /// Identify an NVMe controller (vfio PCI address or nvmf-tcp://ADDR:PORT/SUBNQN[/NSID]): controller fields and namespaces.
    Identify(identify::Args),
    /// List the subsystems of an NVMe/TCP discovery controller: `discover ADDR[:PORT]` (port 8009).
    Discover(nvmf::DiscoverArgs),
    /// Measure NVMe I/O like spdk_nvme_perf: -q depth, -o size, -w pattern, -t seconds, -c cores.
    Perf(perf::Args),
    /// Loop-back demo: pattern in GPU-BAR buffers, NIC A -> NIC B, verified byte-exact (--kernel: the kernel's AF_PACKET, TPACKET_V3 or AF_XDP path).
    Loopback(loopback::Args),
    /// Stream a source (NVMe via vfio, file via io_uring) through the UB pool into a sink (CUDA, BAR, null).
    Pipeline(pipeline::Args),
    /// Read an NVMe controller's log pages: `log smart <addr>`, `log error <addr>` (like nvme-cli).
    Log(log::Args),
}

impl Command {
    /// The `--allow-noiommu` opt-in of a subcommand that opens devices (None: it opens none).
    #[cfg(test)]
    pub fn allow_noiommu(&self) -> Option<bool> {
        let arg = match self {
            Command::Identify(a) => a.noiommu,
            Command::Perf(a) => a.noiommu,
            Command::Loopback(a) => a.noiommu,
            Command::Pipeline(a) => a.noiommu,
            Command::Log(a) => a.noiommu(),
            Command::Devices(_) | Command::Doctor(_) | Command::Discover(_) => return None,
        };
        Some(arg.allow_noiommu)
    }

    /// Run the subcommand.
    pub fn run(&self) -> CliResult {
        match self {
            Command::Devices(a) => devices::run(a),
            Command::Doctor(a) => doctor::run(a),
            Command::Identify(a) => identify::run(a),
            Command::Discover(a) => nvmf::run_discover(a),
            Command::Perf(a) => perf::run(a),
            Command::Loopback(a) => loopback::run(a),
            Command::Pipeline(a) => pipeline::run(a),
            Command::Log(a) => log::run(a),
        }
    }
}

/// What a subcommand returns: an outcome, or an error `main` prints and exits 1 on.
pub type CliResult = Result<Outcome, Box<dyn std::error::Error + Send + Sync>>;

/// How a subcommand that ran to the end went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// All good: exit 0.
    Success,
    /// It ran but found problems (e.g. doctor errors): exit 1.
    Findings,
}

impl Outcome {
    /// The process exit code.
    pub fn exit_code(self) -> ExitCode {
        match self {
            Outcome::Success => ExitCode::SUCCESS,
            Outcome::Findings => ExitCode::from(1),
        }
    }
}

/// The sysfs root the subcommands read: `/`, or `UBD_SYSFS_ROOT` (a fake tree, for tests).
pub fn sysfs_root() -> ubdirect::diag::topology::SysfsRoot {
    match std::env::var_os("UBD_SYSFS_ROOT") {
        Some(p) if !p.is_empty() => ubdirect::diag::topology::SysfsRoot::new(p),
        _ => ubdirect::diag::topology::SysfsRoot::system(),
    }
}

/// clap value parser for PCI addresses: accepts `00:04.0` and `0000:00:04.0`, yields the
/// canonical form; a malformed one is a usage error (exit 2).
pub fn parse_bdf(s: &str) -> Result<String, String> {
    ubdirect::diag::topology::normalize_address(s).map_err(|e| e.to_string())
}

/// Print a table: a header row and rows, columns padded to the widest cell.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        println!("{}", s.trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

/// A device for the subcommands' unit tests.
#[cfg(test)]
pub(crate) fn fake_device(
    addr: &str,
    class: u32,
    driver: Option<&str>,
) -> ubdirect::diag::topology::PciDeviceInfo {
    use ubdirect::diag::topology::{class_name, BarInfo, DeviceRole, LinkInfo, PciDeviceInfo};
    PciDeviceInfo {
        address: addr.into(),
        vendor: 0x1af4,
        device: 0x1110,
        class,
        class_name: class_name(class),
        role: DeviceRole::of_class(class),
        driver: driver.map(str::to_string),
        driver_override: None,
        iommu_group: Some(3),
        group_peers: vec![],
        numa_node: None,
        link: LinkInfo::default(),
        bars: vec![BarInfo {
            index: 2,
            start: 1 << 40,
            size: 64 << 20,
            memory: true,
            prefetchable: true,
            is_64bit: true,
        }],
        root_complex: Some("pci0000:00".into()),
        root_port: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdf_values_are_canonical_or_usage_errors() {
        assert_eq!(parse_bdf("00:04.0").unwrap(), "0000:00:04.0");
        let e = parse_bdf("04.0").unwrap_err();
        assert!(e.contains("0000:00:04.0"), "{e}");
    }

    /// Every subcommand's --help text.
    fn all_help() -> Vec<(String, String)> {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        cmd.build();
        let mut out = vec![("ubdirect".to_string(), cmd.render_long_help().to_string())];
        let mut stack: Vec<(String, clap::Command)> = cmd
            .get_subcommands()
            .map(|c| (c.get_name().to_string(), c.clone()))
            .collect();
        while let Some((name, mut c)) = stack.pop() {
            out.push((name.clone(), c.render_long_help().to_string()));
            for sub in c.get_subcommands() {
                stack.push((format!("{name} {}", sub.get_name()), sub.clone()));
            }
        }
        out
    }

    #[test]
    fn help_hides_test_bed_hooks_and_old_spellings() {
        // A flag counts only as a whole flag: `--time` is not `--timeout`.
        fn shows(text: &str, word: &str) -> bool {
            text.match_indices(word).any(|(i, _)| {
                !word.starts_with("--")
                    || !text[i + word.len()..]
                        .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
            })
        }
        assert!(shows("  --time <S>", "--time") && !shows("  --timeout <S>", "--time"));
        let help = all_help();
        assert!(help.len() >= 7, "{} help texts", help.len());
        for (name, text) in &help {
            // The operator's no-IOMMU opt-in is a setting of setup.sh, not a test-bed hook.
            // Nor are the variables that hold the DH-HMAC-CHAP secrets (never flags: `ps`).
            let text = &text
                .replace("UBD_ALLOW_NOIOMMU=1 scripts/setup.sh", "")
                .replace("$UBD_DHCHAP_CTRL_SECRET", "")
                .replace("$UBD_DHCHAP_SECRET", "");
            for word in [
                "hostcheck",
                "HOSTCHECK",
                "UBD_",
                "test bed",
                "--offset-mib",
                "--span-mib",
                "--qd",
                "--start",
                "--time",
                "/nsid",
                "[/nsid]",
            ] {
                assert!(
                    !shows(text, word),
                    "`{name} --help` shows {word:?}:\n{text}"
                );
            }
        }
        let perf = &help.iter().find(|(n, _)| n == "perf").unwrap().1;
        let pipeline = &help.iter().find(|(n, _)| n == "pipeline").unwrap().1;
        for flag in [
            "--ns <NSID>",
            "--offset <",
            "--queue-depth <",
            "--seconds <",
        ] {
            assert!(perf.contains(flag), "perf --help lacks {flag}:\n{perf}");
            assert!(
                pipeline.contains(flag),
                "pipeline --help lacks {flag}:\n{pipeline}"
            );
        }
    }

    #[test]
    fn cli_parses_and_rejects() {
        use clap::Parser;
        let c = Cli::try_parse_from(["ubdirect", "-vv", "devices", "--json", "00:04.0"]).unwrap();
        assert_eq!(c.verbose, 2);
        assert!(matches!(c.command, Command::Devices(_)));
        let e = Cli::try_parse_from(["ubdirect", "devices", "zz"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let e = Cli::try_parse_from(["ubdirect", "doctor", "--pool-mib", "lots"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    /// The `.rs` files under `dir`, recursively.
    fn rust_sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                rust_sources(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// The command line is a user of the library: its manifest's `[dependencies]` name no
    /// driver crate, and its sources and tests reach the drivers through `ubdirect::` paths.
    #[test]
    fn the_cli_reaches_the_drivers_through_the_facade_only() {
        const DRIVERS: &[&str] = &[
            "ubdirect-core",
            "ubdirect-hugepages",
            "ubdirect-diag",
            "ubdirect-nvme",
            "ubdirect-virtio-net",
            "ubdirect-igb",
            "ubdirect-cuda",
            "ubdirect-uring",
        ];
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let deps = manifest
            .split("\n[dependencies]\n")
            .nth(1)
            .expect("a [dependencies] table")
            .split("\n[")
            .next()
            .unwrap();
        let mut bad = Vec::new();
        for d in DRIVERS {
            let named = |l: &str| l.split(['.', ' ', '=']).next() == Some(d);
            if deps.lines().any(named) {
                bad.push(format!("Cargo.toml [dependencies] names {d}"));
            }
        }
        let mut files = Vec::new();
        rust_sources(&root.join("src"), &mut files);
        rust_sources(&root.join("tests"), &mut files);
        for f in &files {
            let src = std::fs::read_to_string(f).unwrap();
            for d in DRIVERS {
                let path = format!("{}::", d.replace('-', "_"));
                let hit = src.match_indices(&path).any(|(i, _)| {
                    !src[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                });
                if hit {
                    bad.push(format!(
                        "{} uses {path} (use the facade's ubdirect:: path)",
                        f.display()
                    ));
                }
            }
        }
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
}
