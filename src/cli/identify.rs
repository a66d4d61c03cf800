//! `ubdirect identify`: Identify Controller and Identify Namespace through vfio, with nvme-cli's
//! field names.

use std::sync::Arc;

use serde::Serialize;
use ubdirect::nvme::{CmbLayout, Controller, ControllerInfo, ControllerOptions, NamespaceInfo};

use super::{CliResult, Outcome};

/// Identify an NVMe controller bound to vfio-pci: controller fields and every active namespace.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// PCI address of the controller (0000:00:04.0 or 00:04.0), bound to vfio-pci, or an
    /// NVMe/TCP target nvmf-tcp://ADDR[:PORT]/SUBNQN[/NSID].
    #[arg(value_name = "PCI-ADDR", value_parser = super::nvmf::parse_ctrl_addr)]
    addr: String,

    /// JSON on stdout instead of text.
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    pub(super) noiommu: super::noiommu_arg::NoIommuArg,
}

/// Register-level facts the driver read, beside the identify data.
#[derive(Serialize)]
struct Registers {
    cap: String,
    mqes: u16,
    dstrd: u8,
    to_ms: u128,
    mpsmin: usize,
    mpsmax: usize,
    version: String,
    io_queues_granted: u16,
    shadow_doorbells: bool,
    max_command_bytes: usize,
    /// The Controller Memory Buffer (null: none).
    cmb: Option<CmbLayout>,
}

#[derive(Serialize)]
struct IdentifyJson<'a> {
    address: &'a str,
    controller: &'a ControllerInfo,
    registers: Registers,
    namespaces: &'a [NamespaceInfo],
}

/// Run it.
pub fn run(args: &Args) -> CliResult {
    if args.addr.starts_with("nvmf-tcp://") {
        return super::nvmf::run_identify(&args.addr, args.json);
    }
    let env = super::open::nvme_controller(args.noiommu, &args.addr, ControllerOptions::default())?;
    let ctrl: &Arc<Controller> = env.controller(0);
    let cap = ctrl.cap();
    let regs = Registers {
        cap: format!("{:#018x}", cap.0),
        mqes: cap.mqes(),
        dstrd: cap.dstrd(),
        to_ms: cap.timeout().as_millis(),
        mpsmin: cap.min_page_size(),
        mpsmax: cap.max_page_size(),
        version: ctrl.version().to_string(),
        io_queues_granted: ctrl.io_queues_granted(),
        shadow_doorbells: ctrl.shadow_doorbells(),
        max_command_bytes: ctrl.max_command_bytes(),
        cmb: ctrl.cmb_layout()?,
    };
    if args.json {
        let doc = IdentifyJson {
            address: &args.addr,
            controller: ctrl.info(),
            registers: regs,
            namespaces: ctrl.namespaces(),
        };
        super::json::print("identify", doc)?;
        return Ok(Outcome::Success);
    }
    print_controller(&args.addr, ctrl.info(), &regs);
    for ns in ctrl.namespaces() {
        print_namespace(ns);
    }
    Ok(Outcome::Success)
}

fn print_controller(addr: &str, c: &ControllerInfo, r: &Registers) {
    println!("NVME Identify Controller {addr}:");
    let kv = |k: &str, v: String| println!("{k:<9} : {v}");
    kv("vid", format!("{:#06x}", c.vid));
    kv("ssvid", format!("{:#06x}", c.ssvid));
    kv("sn", c.sn.clone());
    kv("mn", c.mn.clone());
    kv("fr", c.fr.clone());
    kv(
        "mdts",
        if c.mdts == 0 {
            "0 (unlimited)".to_string()
        } else {
            format!("{} ({} KiB)", c.mdts, (r.mpsmin << c.mdts) / 1024)
        },
    );
    kv("cntlid", format!("{:#x}", c.cntlid));
    kv("ver", format!("{:#x} ({})", c.ver, r.version));
    kv("rtd3e", c.rtd3e.to_string());
    kv("oacs", format!("{:#x}", c.oacs));
    kv("acl", c.acl.to_string());
    kv("elpe", c.elpe.to_string());
    kv("sqes", format!("{:#x}", c.sqes));
    kv("cqes", format!("{:#x}", c.cqes));
    kv("maxcmd", c.maxcmd.to_string());
    kv("nn", c.nn.to_string());
    kv("oncs", format!("{:#x}", c.oncs));
    kv("vwc", format!("{:#x}", c.vwc));
    kv("sgls", format!("{:#x}", c.sgls));
    kv("subnqn", c.subnqn.clone());
    println!(
        "registers : cap {} mqes {} dstrd {} to {} ms mps {}..{} B",
        r.cap, r.mqes, r.dstrd, r.to_ms, r.mpsmin, r.mpsmax
    );
    println!(
        "driver    : {} I/O queue pairs granted, shadow doorbells {}, max {} bytes per command",
        r.io_queues_granted,
        if r.shadow_doorbells { "on" } else { "off" },
        r.max_command_bytes
    );
    println!("cmb       : {}", cmb_line(r.cmb.as_ref()));
}

/// The CMB as one line: where it lies, its size and what may be placed in it.
fn cmb_line(cmb: Option<&CmbLayout>) -> String {
    let Some(c) = cmb else {
        return "none".to_string();
    };
    let uses: Vec<&str> = [
        (c.sqs, "sqs"),
        (c.cqs, "cqs"),
        (c.lists, "lists"),
        (c.rds, "rds"),
        (c.wds, "wds"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|&(_, name)| name)
    .collect();
    format!(
        "BAR{} offset {:#x}, {} bytes, holds: {}",
        c.bir,
        c.offset,
        c.size,
        if uses.is_empty() {
            "nothing".to_string()
        } else {
            uses.join(" ")
        }
    )
}

/// DPS's protection type in words.
fn protection_line(pi_type: u8) -> String {
    match pi_type {
        0 => "0 (none)".to_string(),
        1..=3 => format!("{pi_type} (Type {pi_type} protection information)"),
        t => format!("{t} (reserved)"),
    }
}

fn print_namespace(ns: &NamespaceInfo) {
    println!("NVME Identify Namespace {}:", ns.nsid);
    println!("nsze    : {:#x}", ns.nsze);
    println!("ncap    : {:#x}", ns.ncap);
    println!("nuse    : {:#x}", ns.nuse);
    println!("csi     : {}", ns.command_set);
    println!("flbas   : {:#x}", ns.flbas);
    println!(
        "ms      : {} (metadata bytes per block in use)",
        ns.metadata_size
    );
    println!("dps     : {}", protection_line(ns.protection_type));
    println!("nlbaf   : {}", ns.lbaf.len().saturating_sub(1));
    for (i, f) in ns.lbaf.iter().enumerate() {
        println!(
            "lbaf {i:>2} : ms:{:<3} lbads:{:<2} rp:{:#x}{}",
            f.ms,
            f.lbads,
            f.rp,
            if f.in_use { " (in use)" } else { "" }
        );
    }
    println!(
        "size    : {} bytes ({} blocks of {} bytes)",
        ns.size_bytes(),
        ns.nsze,
        ns.lba_size
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cmb_and_protection_lines_say_what_the_registers_hold() {
        assert_eq!(cmb_line(None), "none");
        let c = CmbLayout {
            bir: 2,
            offset: 0x1000,
            size: 16 << 20,
            sqs: true,
            cqs: false,
            lists: true,
            rds: false,
            wds: true,
        };
        assert_eq!(
            cmb_line(Some(&c)),
            "BAR2 offset 0x1000, 16777216 bytes, holds: sqs lists wds"
        );
        assert_eq!(protection_line(0), "0 (none)");
        assert_eq!(protection_line(2), "2 (Type 2 protection information)");
        assert_eq!(protection_line(5), "5 (reserved)");
    }
}
