//! `ubdirect log smart|error <addr>`: an NVMe controller's SMART / Health and Error Information
//! log pages, like nvme-cli's `smart-log` and `error-log`, through vfio.

use serde::Serialize;
use ubdirect::nvme::{ControllerOptions, NvmeStatus};
use ubdirect::nvme::{ErrorLogEntry, SmartLog};

use super::{parse_bdf, CliResult, Outcome};

/// Read an NVMe controller's log pages (like nvme-cli's smart-log and error-log).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The log page.
    #[command(subcommand)]
    page: Page,
}

/// The pages.
#[derive(Debug, clap::Subcommand)]
enum Page {
    /// SMART / Health Information: warnings, temperature, spare, wear, data units, errors.
    Smart(PageArgs),
    /// Error Information entries: the controller's most recent command errors.
    Error(PageArgs),
}

/// What both pages take.
#[derive(Debug, clap::Args)]
struct PageArgs {
    /// PCI address of the controller (0000:00:04.0 or 00:04.0), bound to vfio-pci.
    #[arg(value_name = "PCI-ADDR", value_parser = parse_bdf)]
    addr: String,

    /// JSON on stdout instead of text.
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    noiommu: super::noiommu_arg::NoIommuArg,
}

#[derive(Serialize)]
struct SmartJson<'a> {
    address: &'a str,
    smart: &'a SmartLog,
}

/// One error entry with its status decoded.
#[derive(Serialize)]
struct ErrorEntryJson<'a> {
    #[serde(flatten)]
    entry: &'a ErrorLogEntry,
    status_text: String,
}

#[derive(Serialize)]
struct ErrorJson<'a> {
    address: &'a str,
    entries: Vec<ErrorEntryJson<'a>>,
}

impl Args {
    /// The no-IOMMU opt-in of the page asked for.
    #[cfg(test)]
    pub(super) fn noiommu(&self) -> super::noiommu_arg::NoIommuArg {
        match &self.page {
            Page::Smart(p) | Page::Error(p) => p.noiommu,
        }
    }
}

/// Run it.
pub fn run(args: &Args) -> CliResult {
    let (p, smart) = match &args.page {
        Page::Smart(p) => (p, true),
        Page::Error(p) => (p, false),
    };
    let env = super::open::nvme_controller(p.noiommu, &p.addr, ControllerOptions::default())?;
    let ctrl = env.controller(0);
    if smart {
        let s = ctrl.smart_log()?;
        if p.json {
            super::json::print(
                "log smart",
                SmartJson {
                    address: &p.addr,
                    smart: &s,
                },
            )?;
        } else {
            print!("{}", smart_text(&p.addr, &s));
        }
    } else {
        let entries = ctrl.error_log()?;
        if p.json {
            super::json::print("log error", error_json(&p.addr, &entries))?;
        } else {
            print!("{}", error_text(&p.addr, &entries));
        }
    }
    Ok(Outcome::Success)
}

fn error_json<'a>(addr: &'a str, entries: &'a [ErrorLogEntry]) -> ErrorJson<'a> {
    ErrorJson {
        address: addr,
        entries: entries
            .iter()
            .map(|e| ErrorEntryJson {
                entry: e,
                status_text: status_text(e.status),
            })
            .collect(),
    }
}

/// The status field of an entry (without the phase bit) in words.
fn status_text(status: u16) -> String {
    NvmeStatus::from_cqe_status(status << 1).to_string()
}

/// nvme-cli's smart-log layout: one `name : value` line per field.
fn smart_text(addr: &str, s: &SmartLog) -> String {
    let celsius = s.temperature_k as i32 - 273;
    let units = |u: u128| {
        // A data unit is 1000 512-byte blocks.
        format!("{u} ({:.2} GB)", u as f64 * 512_000.0 / 1e9)
    };
    let rows = [
        ("critical_warning", format!("{:#x}", s.critical_warning)),
        (
            "temperature",
            format!("{celsius} °C ({} K)", s.temperature_k),
        ),
        ("available_spare", format!("{}%", s.available_spare)),
        ("percentage_used", format!("{}%", s.percentage_used)),
        ("data_units_read", units(s.data_units_read)),
        ("data_units_written", units(s.data_units_written)),
        ("host_read_commands", s.host_read_commands.to_string()),
        ("host_write_commands", s.host_write_commands.to_string()),
        ("power_on_hours", s.power_on_hours.to_string()),
        ("media_errors", s.media_errors.to_string()),
        ("num_err_log_entries", s.num_err_log_entries.to_string()),
    ];
    let mut out = format!("SMART / Health Information log of NVMe controller {addr}:\n");
    for (k, v) in rows {
        out += &format!("{k:<22}: {v}\n");
    }
    out
}

/// nvme-cli's error-log layout, one block per entry in use.
fn error_text(addr: &str, entries: &[ErrorLogEntry]) -> String {
    let mut out = format!(
        "Error Information log of NVMe controller {addr}: {} entr{} in use\n",
        entries.len(),
        if entries.len() == 1 { "y" } else { "ies" }
    );
    for (i, e) in entries.iter().enumerate() {
        out += &format!(
            " Entry[{i:2}]\n  error_count : {}\n  sqid        : {}\n  cmdid       : {:#x}\n  status_field: {:#x} ({})\n  lba         : {:#x}\n  nsid        : {:#x}\n",
            e.error_count,
            e.sqid,
            e.cid,
            e.status,
            status_text(e.status),
            e.lba,
            e.nsid
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smart() -> SmartLog {
        let mut p = vec![0u8; 512];
        p[1..3].copy_from_slice(&323u16.to_le_bytes());
        p[3] = 100;
        p[32] = 10;
        p[176] = 2;
        SmartLog::parse(&p).unwrap()
    }

    fn entries() -> Vec<ErrorLogEntry> {
        let mut p = vec![0u8; 128];
        p[0] = 3;
        p[8] = 1;
        p[10] = 7;
        // Status field 0x0080 (SCT 0, SC 0x80: LBA out of range) with the phase bit below it.
        p[12..14].copy_from_slice(&(0x80u16 << 1).to_le_bytes());
        p[24] = 1;
        ErrorLogEntry::parse_all(&p)
    }

    #[test]
    fn smart_text_has_nvme_cli_fields() {
        let t = smart_text("0000:00:04.0", &smart());
        assert!(t.contains("temperature           : 50 °C (323 K)"), "{t}");
        assert!(t.contains("available_spare       : 100%"), "{t}");
        assert!(t.contains("data_units_read       : 10 (0.01 GB)"), "{t}");
        assert!(t.contains("num_err_log_entries   : 2"), "{t}");
    }

    #[test]
    fn error_text_decodes_the_status() {
        let e = entries();
        assert_eq!(e.len(), 1);
        let t = error_text("0000:00:04.0", &e);
        assert!(t.contains("1 entry in use"), "{t}");
        assert!(t.contains("error_count : 3"), "{t}");
        assert!(t.contains("status_field: 0x80"), "{t}");
        assert!(t.to_lowercase().contains("range"), "{t}");
    }

    #[test]
    fn log_json_validates() {
        let s = smart();
        let v = crate::cli::json::document(
            "log smart",
            SmartJson {
                address: "0000:00:04.0",
                smart: &s,
            },
        )
        .unwrap();
        crate::cli::json::validate(&v).unwrap();
        assert_eq!(v["smart"]["temperature_k"], 323);
        let e = entries();
        let v = crate::cli::json::document("log error", error_json("0000:00:04.0", &e)).unwrap();
        crate::cli::json::validate(&v).unwrap();
        assert_eq!(v["entries"][0]["error_count"], 3);
        assert_eq!(v["entries"][0]["status"], 0x80);
    }
}
