//! The host's identity on fabrics: host NQN and host ID.

use std::path::Path;

/// Host NQN and host ID sent in every Connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIdentity {
    /// Host NQN.
    pub nqn: String,
    /// Host ID (a UUID).
    pub id: [u8; 16],
    /// Where it came from, for the user ("/etc/nvme/hostnqn" or "generated").
    pub source: &'static str,
}

/// Parse the UUID of a "nqn.2014-08.org.nvmexpress:uuid:XXXXXXXX-XXXX-..." NQN.
pub fn uuid_of_nqn(nqn: &str) -> Option<[u8; 16]> {
    let u = nqn.rsplit_once(":uuid:")?.1;
    let hex: String = u.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

fn format_uuid(id: &[u8; 16]) -> String {
    let h: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

impl HostIdentity {
    /// /etc/nvme/hostnqn (and /etc/nvme/hostid) if present, else a generated UUID NQN.
    pub fn system() -> HostIdentity {
        Self::from_dir(Path::new("/etc/nvme"))
    }

    /// As [`HostIdentity::system`], reading `dir`/hostnqn and `dir`/hostid.
    pub fn from_dir(dir: &Path) -> HostIdentity {
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(f))
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        };
        if let Some(nqn) = read("hostnqn") {
            if super::fabrics::check_nqn(&nqn).is_ok() {
                let id = read("hostid")
                    .and_then(|h| uuid_of_nqn(&format!(":uuid:{h}")))
                    .or_else(|| uuid_of_nqn(&nqn))
                    .unwrap_or_else(random_uuid);
                return HostIdentity {
                    nqn,
                    id,
                    source: "/etc/nvme/hostnqn",
                };
            }
        }
        Self::generated()
    }

    /// A fresh random UUID host NQN.
    pub fn generated() -> HostIdentity {
        let id = random_uuid();
        HostIdentity {
            nqn: format!("nqn.2014-08.org.nvmexpress:uuid:{}", format_uuid(&id)),
            id,
            source: "generated",
        }
    }
}

/// A version 4 UUID from the kernel's random source (falls back to time and pid).
fn random_uuid() -> [u8; 16] {
    let mut id = [0u8; 16];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut id))
        .is_ok();
    if !ok {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        id[..16].copy_from_slice(&(t ^ ((std::process::id() as u128) << 64)).to_le_bytes());
    }
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnqn_file_wins_else_generated() {
        let d = std::env::temp_dir().join(format!("ubd-hostnqn-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let g = HostIdentity::from_dir(&d);
        assert_eq!(g.source, "generated");
        assert_eq!(uuid_of_nqn(&g.nqn), Some(g.id));
        std::fs::write(
            d.join("hostnqn"),
            "nqn.2014-08.org.nvmexpress:uuid:0011aabb-2233-4455-6677-8899aabbccdd\n",
        )
        .unwrap();
        let h = HostIdentity::from_dir(&d);
        assert_eq!(h.source, "/etc/nvme/hostnqn");
        assert_eq!(h.id[..4], [0x00, 0x11, 0xaa, 0xbb]);
        assert_eq!(h.id[15], 0xdd);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
