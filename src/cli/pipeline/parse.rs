//! The `--source`, `--sink` and `--mode` values of `ubdirect pipeline`.

use std::path::PathBuf;

use ubdirect::dma::PciAddress;
use ubdirect::pipeline::{Mode, SinkSpec, SourceSpec};

pub(super) fn parse_source(s: &str) -> Result<SourceSpec, String> {
    if s.starts_with("nvmf-tcp://") {
        return crate::cli::nvmf::parse_ctrl_addr(s)
            .map(|addr| SourceSpec::Tcp { addr, nsid: None });
    }
    if let Some(rest) = s.strip_prefix("nvme:") {
        let (addr, nsid) = match rest.rsplit_once('/') {
            Some((a, n)) => (
                a,
                Some(n.parse::<u32>().map_err(|_| {
                    format!("bad namespace id '{n}' in '{s}': name the namespace with --ns <nsid>")
                })?),
            ),
            None => (rest, None),
        };
        if nsid == Some(0) {
            return Err("namespace ids start at 1".into());
        }
        let addr = addr
            .parse::<PciAddress>()
            .map_err(|e| format!("bad PCI address in '{s}': {e} (e.g. nvme:0000:00:04.0)"))?;
        return Ok(SourceSpec::Nvme { addr, nsid });
    }
    if let Some(p) = s.strip_prefix("file:") {
        if p.is_empty() {
            return Err("file: needs a path (file:/dev/shm/data)".into());
        }
        return Ok(SourceSpec::File(PathBuf::from(p)));
    }
    Err(format!(
        "unknown source '{s}': use nvme:<pci-addr> (with --ns <nsid>), file:<path> or nvmf-tcp://ADDR:PORT/SUBNQN[/NSID]"
    ))
}

pub(super) fn parse_sink(s: &str) -> Result<SinkSpec, String> {
    match s {
        "null" => return Ok(SinkSpec::Null),
        "cuda" => return Ok(SinkSpec::Cuda(vec![0])),
        "cuda:all" => return Ok(SinkSpec::Cuda(Vec::new())),
        _ => {}
    }
    if let Some(n) = s.strip_prefix("cuda:") {
        let mut v = Vec::new();
        for part in n.split(',') {
            let o: usize = part.trim().parse().map_err(|_| {
                format!("bad GPU ordinal '{part}' in '{s}' (cuda:0, cuda:0,1 or cuda:all)")
            })?;
            if v.contains(&o) {
                return Err(format!("GPU {o} is listed twice in '{s}'"));
            }
            v.push(o);
        }
        return Ok(SinkSpec::Cuda(v));
    }
    if let Some(rest) = s.strip_prefix("bar:") {
        let (a, b) = rest
            .rsplit_once('/')
            .ok_or_else(|| format!("'{s}' needs a BAR number: bar:<pci-addr>/<bar>"))?;
        let bar: u8 = b
            .parse()
            .ok()
            .filter(|&b| b < 6)
            .ok_or_else(|| format!("BAR '{b}' must be 0..5"))?;
        let addr = a
            .parse::<PciAddress>()
            .map_err(|e| format!("bad PCI address in '{s}': {e}"))?;
        return Ok(SinkSpec::Bar { addr, bar });
    }
    Err(format!(
        "unknown sink '{s}': use cuda[:gpu[,gpu...]], cuda:all, bar:<pci-addr>/<bar> or null"
    ))
}

pub(super) fn parse_mode(s: &str) -> Result<Mode, String> {
    match s {
        "direct" => Ok(Mode::Direct),
        "copy" => Ok(Mode::Copy),
        _ => Err(format!("unknown mode '{s}': direct or copy")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvmf_tcp_sources_parse_or_say_what_is_wrong() {
        match parse_source("nvmf-tcp://10.0.0.2:4420/nqn.2026-11.io.ubdirect:test/1").unwrap() {
            SourceSpec::Tcp { addr, nsid: None } => {
                assert_eq!(
                    addr,
                    "nvmf-tcp://10.0.0.2:4420/nqn.2026-11.io.ubdirect:test/1"
                )
            }
            other => panic!("{other:?}"),
        }
        let e = parse_source("nvmf-tcp://10.0.0.2:99999/nqn.x").unwrap_err();
        assert!(e.contains("port"), "{e}");
        let e = parse_source("nvmf-tcp://10.0.0.2").unwrap_err();
        assert!(e.contains("NQN is missing"), "{e}");
    }
}
