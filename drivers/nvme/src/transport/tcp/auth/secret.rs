//! [`DhchapSecret`]: a DH-HMAC-CHAP secret in the `DHHC-1:XX:BASE64:` representation nvme-cli
//! writes (`nvme gen-dhchap-key`): BASE64 is the key (32, 48 or 64 bytes) followed by its
//! CRC-32 (little-endian); XX names the hash that transforms the key with an NQN before use
//! (00: none, 01: SHA-256, 02: SHA-384, 03: SHA-512).

use std::path::Path;

use base64::Engine;
use thiserror::Error;
use zeroize::{Zeroize, Zeroizing};

use super::algo::HashFn;

/// A DH-HMAC-CHAP secret: zeroed when dropped, never printed.
#[derive(Clone)]
pub struct DhchapSecret {
    key: Zeroizing<Vec<u8>>,
    transform: Option<HashFn>,
}

impl std::fmt::Debug for DhchapSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DhchapSecret({} bytes, redacted)", self.key.len())
    }
}

/// Why a secret is refused.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum SecretError {
    /// It does not start with `DHHC-1:`.
    #[error("a DH-HMAC-CHAP secret starts with \"DHHC-1:\" (as nvme gen-dhchap-key writes it)")]
    Prefix,
    /// The hash field is not 00, 01, 02 or 03.
    #[error("the hash field of a DHHC-1 secret is 00, 01, 02 or 03 (none, SHA-256, SHA-384, SHA-512), not {0:?}")]
    Hash(String),
    /// The key field is not base64.
    #[error("the key field of the DHHC-1 secret is not base64")]
    Base64,
    /// The decoded key is not 32, 48 or 64 bytes plus a CRC.
    #[error(
        "the DHHC-1 secret holds {0} bytes; it holds a 32, 48 or 64-byte key and a 4-byte CRC-32"
    )]
    Length(usize),
    /// The CRC-32 does not match the key.
    #[error("the CRC-32 of the DHHC-1 secret does not match its key: the secret was mistyped or truncated")]
    Crc,
    /// The file or variable could not be read.
    #[error("cannot read the DH-HMAC-CHAP secret from {from}: {reason}")]
    Read {
        /// Where from.
        from: String,
        /// Why.
        reason: String,
    },
}

impl DhchapSecret {
    /// Parse `DHHC-1:XX:BASE64:` (the trailing colon is optional; surrounding white space is
    /// ignored).
    pub fn parse(text: &str) -> Result<DhchapSecret, SecretError> {
        let rest = text
            .trim()
            .strip_prefix("DHHC-1:")
            .ok_or(SecretError::Prefix)?;
        let (hash, b64) = rest.split_once(':').ok_or(SecretError::Prefix)?;
        let transform = match hash {
            "00" => None,
            "01" | "02" | "03" => HashFn::from_id(hash.as_bytes()[1] - b'0'),
            // A longer field may be key material pasted in the wrong place: never echo it.
            other if other.len() <= 2 => return Err(SecretError::Hash(other.into())),
            other => {
                return Err(SecretError::Hash(format!(
                    "a field of {} bytes",
                    other.len()
                )))
            }
        };
        let b64 = b64.strip_suffix(':').unwrap_or(b64);
        let mut raw = Zeroizing::new(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| SecretError::Base64)?,
        );
        if !matches!(raw.len(), 36 | 52 | 68) {
            return Err(SecretError::Length(raw.len()));
        }
        let n = raw.len() - 4;
        let crc = u32::from_le_bytes(raw[n..].try_into().expect("4 bytes"));
        if crc32fast::hash(&raw[..n]) != crc {
            return Err(SecretError::Crc);
        }
        raw[n..].zeroize();
        raw.truncate(n);
        Ok(DhchapSecret {
            key: raw,
            transform,
        })
    }

    /// Read a secret from the file at `path` (its first line).
    pub fn from_file(path: &Path) -> Result<DhchapSecret, SecretError> {
        let text =
            Zeroizing::new(
                std::fs::read_to_string(path).map_err(|e| SecretError::Read {
                    from: path.display().to_string(),
                    reason: e.to_string(),
                })?,
            );
        DhchapSecret::parse(text.lines().next().unwrap_or(""))
    }

    /// Read a secret from environment variable `var`: `Ok(None)` when it is not set.
    pub fn from_env(var: &str) -> Result<Option<DhchapSecret>, SecretError> {
        match std::env::var(var) {
            Ok(v) => DhchapSecret::parse(&Zeroizing::new(v)).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(e) => Err(SecretError::Read {
                from: format!("${var}"),
                reason: e.to_string(),
            }),
        }
    }

    /// A secret of `key` (32, 48 or 64 bytes) and transform hash `transform`.
    pub fn from_key(key: &[u8], transform: Option<HashFn>) -> DhchapSecret {
        DhchapSecret {
            key: Zeroizing::new(key.to_vec()),
            transform,
        }
    }

    /// The `DHHC-1:XX:BASE64:` text of this secret (what nvme-cli takes).
    pub fn to_text(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new(self.key.to_vec());
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        let id = self.transform.map_or(0, |h| h.id());
        Zeroizing::new(format!(
            "DHHC-1:{id:02}:{}:",
            base64::engine::general_purpose::STANDARD.encode(&raw[..])
        ))
    }

    /// Length of the key, bytes.
    pub fn len(&self) -> usize {
        self.key.len()
    }

    /// Whether the key is empty (never, for a parsed secret).
    pub fn is_empty(&self) -> bool {
        self.key.is_empty()
    }

    /// The key used in the HMAC: the key itself (hash 00) or HMAC(key, NQN || "NVMe-over-Fabrics")
    /// with the secret's hash, where `nqn` is the host NQN for a host secret and the subsystem
    /// NQN for a controller secret.
    pub fn transformed(&self, nqn: &str) -> Zeroizing<Vec<u8>> {
        match self.transform {
            None => Zeroizing::new(self.key.to_vec()),
            Some(h) => h.hmac(&self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}
