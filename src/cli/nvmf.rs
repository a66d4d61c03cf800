//! NVMe/TCP in the CLI: `ubdirect discover ADDR[:PORT]` and `identify nvmf-tcp://...`.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use serde::Serialize;
use ubdirect::nvme::transport::tcp::addr::{discovery_address, is_tcp_address, TcpTarget};
use ubdirect::nvme::transport::tcp::auth::{AuthConfig, ENV_CTRL_SECRET, ENV_SECRET};
use ubdirect::nvme::transport::tcp::ctrl::{discover, TcpController, TcpOptions};
use ubdirect::nvme::transport::tcp::fabrics::DiscoveryRecord;
use ubdirect::nvme::transport::tcp::host::HostIdentity;
use ubdirect::nvme::{ControllerInfo, NamespaceInfo};

use super::{print_table, CliResult, Outcome};

/// List the subsystems an NVMe/TCP discovery controller offers (like `nvme discover -t tcp`).
#[derive(Debug, clap::Args)]
pub struct DiscoverArgs {
    /// The discovery controller: HOST[:PORT] (port 8009 by default; nvmf-tcp://HOST:PORT too).
    #[arg(value_name = "ADDR[:PORT]")]
    addr: String,

    /// Deadline of the connection and of each command, seconds.
    #[arg(long, default_value_t = 5)]
    timeout: u64,

    /// Ask for header and data digests (CRC32C).
    #[arg(long)]
    digests: bool,

    /// JSON on stdout instead of text.
    #[arg(long)]
    json: bool,
}

/// clap value parser of a controller address: a PCI address or an `nvmf-tcp://` address.
pub fn parse_ctrl_addr(s: &str) -> Result<String, String> {
    if is_tcp_address(s) {
        s.parse::<TcpTarget>().map_err(|e| e.to_string())?;
        return Ok(s.to_string());
    }
    super::parse_bdf(s)
}

/// The host identity, saying on stderr when it was generated.
pub fn host_identity() -> HostIdentity {
    let h = HostIdentity::system();
    if h.source == "generated" {
        eprintln!(
            "ubdirect: no /etc/nvme/hostnqn: using the generated host NQN {} (write one there to keep it)",
            h.nqn
        );
    }
    h
}

/// Where the DH-HMAC-CHAP secrets are read from (`--dhchap-secret-file`,
/// `--dhchap-ctrl-secret-file`; without them the environment).
#[derive(Debug, Default)]
pub struct SecretFiles {
    /// The host secret's file.
    pub host: Option<PathBuf>,
    /// The controller secret's file.
    pub ctrl: Option<PathBuf>,
}

static SECRET_FILES: OnceLock<SecretFiles> = OnceLock::new();

/// Record the secret files of this run (once, from `main`).
pub fn set_secret_files(f: SecretFiles) {
    let _ = SECRET_FILES.set(f);
}

/// `base` with the DH-HMAC-CHAP secrets of this run.
pub fn with_auth(base: TcpOptions) -> Result<TcpOptions, Box<dyn std::error::Error + Send + Sync>> {
    let f = SECRET_FILES.get_or_init(SecretFiles::default);
    let auth = AuthConfig::from_sources(f.host.as_deref(), f.ctrl.as_deref()).map_err(|e| {
        format!("{e} (the secret comes from --dhchap-secret-file / --dhchap-ctrl-secret-file, else ${ENV_SECRET} / ${ENV_CTRL_SECRET})")
    })?;
    Ok(TcpOptions { auth, ..base })
}

fn options(timeout: u64, digests: bool) -> TcpOptions {
    TcpOptions {
        connect_timeout: Duration::from_secs(timeout),
        admin_timeout: Duration::from_secs(timeout),
        hdgst: digests,
        ddgst: digests,
        ..TcpOptions::default()
    }
}

#[derive(Serialize)]
struct DiscoverJson<'a> {
    address: &'a str,
    host_nqn: &'a str,
    records: &'a [DiscoveryRecord],
}

/// Run `discover`.
pub fn run_discover(args: &DiscoverArgs) -> CliResult {
    let addr = discovery_address(&args.addr)?;
    let host = host_identity();
    let recs = discover(
        &addr,
        &host,
        &with_auth(options(args.timeout, args.digests))?,
    )?;
    if args.json {
        super::json::print(
            "discover",
            DiscoverJson {
                address: &addr,
                host_nqn: &host.nqn,
                records: &recs,
            },
        )?;
        return Ok(Outcome::Success);
    }
    println!("Discovery log of {addr}: {} record(s)", recs.len());
    let rows: Vec<Vec<String>> = recs
        .iter()
        .map(|r| {
            vec![
                r.transport.clone(),
                r.family.clone(),
                r.subtype.clone(),
                r.portid.to_string(),
                r.traddr.clone(),
                r.trsvcid.clone(),
                r.subnqn.clone(),
            ]
        })
        .collect();
    print_table(
        &[
            "TRTYPE", "ADRFAM", "SUBTYPE", "PORTID", "TRADDR", "TRSVCID", "SUBNQN",
        ],
        &rows,
    );
    Ok(Outcome::Success)
}

#[derive(Serialize)]
struct IdentifyJson<'a> {
    address: &'a str,
    transport: &'static str,
    controller: &'a ControllerInfo,
    cap: String,
    in_capsule_bytes: u32,
    namespaces: &'a [NamespaceInfo],
}

/// `identify nvmf-tcp://ADDR:PORT/SUBNQN[/NSID]`: the controller and the namespace(s).
pub fn run_identify(addr: &str, json: bool) -> CliResult {
    let target: TcpTarget = addr.parse()?;
    let host = host_identity();
    let ctrl = TcpController::connect(&target, &host, &with_auth(TcpOptions::default())?)?;
    let ids: Vec<u32> = match target.nsid {
        Some(n) => vec![n],
        None => (1..=ctrl.info().nn.min(16)).collect(),
    };
    let mut nss = Vec::new();
    for id in ids {
        match ctrl.namespace(id) {
            Ok(ns) => nss.push(ns),
            Err(e) if target.nsid.is_some() => return Err(e.into()),
            Err(_) => {}
        }
    }
    let c = ctrl.info();
    if json {
        super::json::print(
            "identify",
            IdentifyJson {
                address: addr,
                transport: "tcp",
                controller: c,
                cap: format!("{:#018x}", ctrl.cap().0),
                in_capsule_bytes: ctrl.in_capsule(),
                namespaces: &nss,
            },
        )?;
        return Ok(Outcome::Success);
    }
    println!("NVME Identify Controller {addr}:");
    let kv = |k: &str, v: String| println!("{k:<9} : {v}");
    kv("transport", "tcp".into());
    kv("cntlid", format!("{:#x}", ctrl.cntlid()));
    kv("sn", c.sn.clone());
    kv("mn", c.mn.clone());
    kv("fr", c.fr.clone());
    kv("mdts", c.mdts.to_string());
    kv("ver", format!("{:#x}", c.ver));
    kv("nn", c.nn.to_string());
    kv("sgls", format!("{:#x}", c.sgls));
    kv("subnqn", c.subnqn.clone());
    kv("ioccsz", format!("{} bytes in capsule", ctrl.in_capsule()));
    kv("cap", format!("{:#018x}", ctrl.cap().0));
    kv("hostnqn", format!("{} ({})", host.nqn, host.source));
    for ns in &nss {
        println!("NVME Identify Namespace {}:", ns.nsid);
        println!("nsze    : {:#x}", ns.nsze);
        println!("lba     : {} bytes", ns.lba_size);
        println!("size    : {} bytes", ns.size_bytes());
    }
    Ok(Outcome::Success)
}
