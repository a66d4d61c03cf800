//! `nvmf-tcp://HOST[:PORT]/SUBNQN[/NSID]` addresses, shared by every subcommand.
//!
//! Parsed by hand, not with the `url` crate: a WHATWG URL parser would take a `?` or `#` in
//! an NQN as the start of a query or fragment (silently cutting the NQN), resolve `.` / `..`
//! path segments and percent-encode other bytes, so the NQN sent would not be the one typed;
//! and it reports `fd00::2` as a bad port where this parser says to write `[fd00::2]`.

use super::error::TcpError;
use super::fabrics::check_nqn;
use super::pdu::{DEFAULT_PORT, DISCOVERY_PORT};

/// The URL scheme.
pub const SCHEME: &str = "nvmf-tcp://";

/// A parsed NVMe/TCP target address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpTarget {
    /// "HOST:PORT" (IPv6 hosts in brackets), ready for `ToSocketAddrs`.
    pub addr: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Namespace ID, if given.
    pub nsid: Option<u32>,
}

fn bad(input: &str, reason: &str) -> TcpError {
    TcpError::Address {
        input: input.to_string(),
        reason: reason.to_string(),
    }
}

/// `"HOST[:PORT]"` (or `"[V6][:PORT]"`) with `default_port` when none is given.
pub fn host_port(input: &str, hp: &str, default_port: u16) -> Result<String, TcpError> {
    if hp.is_empty() {
        return Err(bad(input, "the host is missing"));
    }
    let (host, port) = if let Some(rest) = hp.strip_prefix('[') {
        let (h, tail) = rest
            .split_once(']')
            .ok_or_else(|| bad(input, "an IPv6 address in [ ] is not closed"))?;
        (format!("[{h}]"), tail.strip_prefix(':'))
    } else if hp.matches(':').count() > 1 {
        return Err(bad(
            input,
            "write an IPv6 address in brackets: [fd00::2]:4420",
        ));
    } else {
        match hp.split_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (hp.to_string(), None),
        }
    };
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| bad(input, "the port is not a number from 1 to 65535"))?,
    };
    Ok(format!("{host}:{port}"))
}

/// Whether `s` is an NVMe/TCP address (starts with the scheme).
pub fn is_tcp_address(s: &str) -> bool {
    s.starts_with(SCHEME)
}

impl std::str::FromStr for TcpTarget {
    type Err = TcpError;

    fn from_str(input: &str) -> Result<TcpTarget, TcpError> {
        let rest = input
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad(input, "it does not start with nvmf-tcp://"))?;
        let (hp, path) = rest
            .split_once('/')
            .ok_or_else(|| bad(input, "the subsystem NQN is missing"))?;
        let addr = host_port(input, hp, DEFAULT_PORT)?;
        // An NQN may hold ':' and '.', not '/': the last '/'-part is the NSID when numeric.
        let (subnqn, nsid) = match path.rsplit_once('/') {
            Some((n, id)) => {
                let id = id
                    .parse::<u32>()
                    .ok()
                    .filter(|v| *v != 0 && *v != u32::MAX)
                    .ok_or_else(|| {
                        bad(
                            input,
                            "the namespace ID after the NQN is not a number from 1 to 0xfffffffe",
                        )
                    })?;
                (n, Some(id))
            }
            None => (path, None),
        };
        check_nqn(subnqn).map_err(|e| bad(input, &format!("the subsystem NQN {e}")))?;
        Ok(TcpTarget {
            addr,
            subnqn: subnqn.to_string(),
            nsid,
        })
    }
}

/// A discovery address `"HOST[:PORT]"` (port 8009 by default), with or without the scheme.
pub fn discovery_address(input: &str) -> Result<String, TcpError> {
    let hp = input
        .strip_prefix(SCHEME)
        .unwrap_or(input)
        .trim_end_matches('/');
    if hp.contains('/') {
        return Err(bad(input, "a discovery address is HOST[:PORT] only"));
    }
    host_port(input, hp, DISCOVERY_PORT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses() {
        let t: TcpTarget = "nvmf-tcp://10.0.0.2:4421/nqn.2026-11.io.ubdirect:test/3"
            .parse()
            .unwrap();
        assert_eq!(t.addr, "10.0.0.2:4421");
        assert_eq!(t.subnqn, "nqn.2026-11.io.ubdirect:test");
        assert_eq!(t.nsid, Some(3));
        let t: TcpTarget = "nvmf-tcp://host/nqn.x".parse().unwrap();
        assert_eq!((t.addr.as_str(), t.nsid), ("host:4420", None));
        let t: TcpTarget = "nvmf-tcp://[fd00::2]:9/nqn.x/1".parse().unwrap();
        assert_eq!(t.addr, "[fd00::2]:9");
        assert_eq!(discovery_address("127.0.0.1").unwrap(), "127.0.0.1:8009");
        assert_eq!(
            discovery_address("nvmf-tcp://127.0.0.1:4420").unwrap(),
            "127.0.0.1:4420"
        );
    }

    #[test]
    fn refuses_bad_addresses_with_the_reason() {
        for (a, why) in [
            ("tcp://h/nqn.x", "nvmf-tcp://"),
            ("nvmf-tcp://h", "NQN is missing"),
            ("nvmf-tcp://h:0/nqn.x", "port"),
            ("nvmf-tcp://h:70000/nqn.x", "port"),
            ("nvmf-tcp://fd00::2/nqn.x", "brackets"),
            ("nvmf-tcp:///nqn.x", "host is missing"),
            ("nvmf-tcp://h/nqn.x/0", "namespace ID"),
            ("nvmf-tcp://h/nqn.x/one", "namespace ID"),
            ("nvmf-tcp://h/", "NQN it is empty"),
        ] {
            match a.parse::<TcpTarget>() {
                Err(TcpError::Address { reason, .. }) => {
                    assert!(reason.contains(why), "{a}: {reason}")
                }
                other => panic!("{a}: {other:?}"),
            }
        }
    }
}
