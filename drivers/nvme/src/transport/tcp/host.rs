//! The host's identity on fabrics: host NQN and host ID.

use std::path::Path;

use uuid::Uuid;

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

/// Parse the UUID of a "nqn.2014-08.org.nvmexpress:uuid:XXXXXXXX-XXXX-..." NQN (the `uuid`
/// crate's parser: hyphens only where a UUID has them, hex digits only).
pub fn uuid_of_nqn(nqn: &str) -> Option<[u8; 16]> {
    let u = nqn.rsplit_once(":uuid:")?.1;
    Uuid::try_parse(u).ok().map(|u| u.into_bytes())
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
            nqn: format!(
                "nqn.2014-08.org.nvmexpress:uuid:{}",
                Uuid::from_bytes(id).hyphenated()
            ),
            id,
            source: "generated",
        }
    }
}

/// A random (version 4) UUID.
fn random_uuid() -> [u8; 16] {
    Uuid::new_v4().into_bytes()
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

    #[test]
    fn a_malformed_uuid_is_no_host_id() {
        let nqn = |u: &str| format!("nqn.2014-08.org.nvmexpress:uuid:{u}");
        assert_eq!(
            uuid_of_nqn(&nqn("0011aabb-2233-4455-6677-8899aabbccdd")).map(|i| i[15]),
            Some(0xdd)
        );
        // Hyphens out of place, signs, a missing digit, a stray character: not a UUID.
        for bad in [
            "0011-aabb2233-4455-6677-8899aabbccdd",
            "+0+1aabb-2233-4455-6677-8899aabbccdd",
            "0011aabb-2233-4455-6677-8899aabbccd",
            "0011aabb-2233-4455-6677-8899aabbccdg",
            "0011aabb-2233-4455-6677-8899aabb-ccdd",
        ] {
            assert_eq!(uuid_of_nqn(&nqn(bad)), None, "{bad}");
        }
        let g = HostIdentity::generated();
        let u = Uuid::from_bytes(g.id);
        assert_eq!(u.get_version_num(), 4);
        assert!(g.nqn.ends_with(&u.hyphenated().to_string()));
    }
}
