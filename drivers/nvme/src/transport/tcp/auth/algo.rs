//! The primitives DH-HMAC-CHAP names by identifier: the hash functions (HMAC-SHA-256/384/512)
//! and the Diffie-Hellman groups (null, RFC 7919 ffdhe2048 to ffdhe8192).

use hmac::{Hmac, Mac};
use num_bigint::BigUint;
use sha2::{Digest, Sha256, Sha384, Sha512};
use zeroize::Zeroizing;

use super::primes;

/// A hash function of DH-HMAC-CHAP (its HashID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashFn {
    /// SHA-256 (HashID 01h).
    Sha256,
    /// SHA-384 (HashID 02h).
    Sha384,
    /// SHA-512 (HashID 03h).
    Sha512,
}

impl HashFn {
    /// Every hash function, in the order the host offers them.
    pub const ALL: [HashFn; 3] = [HashFn::Sha256, HashFn::Sha384, HashFn::Sha512];

    /// The HashID.
    pub fn id(self) -> u8 {
        match self {
            HashFn::Sha256 => 1,
            HashFn::Sha384 => 2,
            HashFn::Sha512 => 3,
        }
    }

    /// The hash function of HashID `id`.
    pub fn from_id(id: u8) -> Option<HashFn> {
        HashFn::ALL.into_iter().find(|h| h.id() == id)
    }

    /// Digest length, bytes.
    pub fn digest_len(self) -> usize {
        match self {
            HashFn::Sha256 => 32,
            HashFn::Sha384 => 48,
            HashFn::Sha512 => 64,
        }
    }

    /// The name nvme-cli and Linux use.
    pub fn name(self) -> &'static str {
        match self {
            HashFn::Sha256 => "hmac(sha256)",
            HashFn::Sha384 => "hmac(sha384)",
            HashFn::Sha512 => "hmac(sha512)",
        }
    }

    /// HMAC of the concatenation of `parts`, keyed with `key`.
    pub fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            // HMAC takes keys of any length.
            let mut m = <M as hmac::digest::KeyInit>::new_from_slice(key).expect("any key length");
            for p in parts {
                m.update(p);
            }
            m.finalize().into_bytes().to_vec()
        }
        Zeroizing::new(match self {
            HashFn::Sha256 => run::<Hmac<Sha256>>(key, parts),
            HashFn::Sha384 => run::<Hmac<Sha384>>(key, parts),
            HashFn::Sha512 => run::<Hmac<Sha512>>(key, parts),
        })
    }

    /// The plain hash of `data`.
    pub fn hash(self, data: &[u8]) -> Zeroizing<Vec<u8>> {
        Zeroizing::new(match self {
            HashFn::Sha256 => Sha256::digest(data).to_vec(),
            HashFn::Sha384 => Sha384::digest(data).to_vec(),
            HashFn::Sha512 => Sha512::digest(data).to_vec(),
        })
    }
}

/// A Diffie-Hellman group of DH-HMAC-CHAP (its DH group identifier).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DhGroup {
    /// No Diffie-Hellman exchange (00h): the challenge is used as sent.
    Null,
    /// ffdhe2048 (01h).
    Ffdhe2048,
    /// ffdhe3072 (02h).
    Ffdhe3072,
    /// ffdhe4096 (03h).
    Ffdhe4096,
    /// ffdhe6144 (04h).
    Ffdhe6144,
    /// ffdhe8192 (05h).
    Ffdhe8192,
}

impl DhGroup {
    /// Every group, in the order the host offers them.
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    /// The DH group identifier.
    pub fn id(self) -> u8 {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 1,
            DhGroup::Ffdhe3072 => 2,
            DhGroup::Ffdhe4096 => 3,
            DhGroup::Ffdhe6144 => 4,
            DhGroup::Ffdhe8192 => 5,
        }
    }

    /// The group of identifier `id`.
    pub fn from_id(id: u8) -> Option<DhGroup> {
        DhGroup::ALL.into_iter().find(|g| g.id() == id)
    }

    /// The name nvme-cli and Linux use.
    pub fn name(self) -> &'static str {
        match self {
            DhGroup::Null => "null",
            DhGroup::Ffdhe2048 => "ffdhe2048",
            DhGroup::Ffdhe3072 => "ffdhe3072",
            DhGroup::Ffdhe4096 => "ffdhe4096",
            DhGroup::Ffdhe6144 => "ffdhe6144",
            DhGroup::Ffdhe8192 => "ffdhe8192",
        }
    }

    /// The group's name as nvme-cli writes it (`ffdhe2048`, `null`), case-insensitive.
    pub fn from_name(name: &str) -> Option<DhGroup> {
        DhGroup::ALL
            .into_iter()
            .find(|g| g.name().eq_ignore_ascii_case(name))
    }

    /// Size of the group's values (public values, shared secret), bytes; 0 for null.
    pub fn value_len(self) -> usize {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 256,
            DhGroup::Ffdhe3072 => 384,
            DhGroup::Ffdhe4096 => 512,
            DhGroup::Ffdhe6144 => 768,
            DhGroup::Ffdhe8192 => 1024,
        }
    }

    /// The group's prime modulus (generator 2); `None` for null.
    pub fn prime(self) -> Option<BigUint> {
        let hex = match self {
            DhGroup::Null => return None,
            DhGroup::Ffdhe2048 => primes::FFDHE2048,
            DhGroup::Ffdhe3072 => primes::FFDHE3072,
            DhGroup::Ffdhe4096 => primes::FFDHE4096,
            DhGroup::Ffdhe6144 => primes::FFDHE6144,
            DhGroup::Ffdhe8192 => primes::FFDHE8192,
        };
        BigUint::parse_bytes(hex.as_bytes(), 16)
    }
}

/// One side's ephemeral Diffie-Hellman key pair in a group.
pub struct DhKey {
    group: DhGroup,
    p: BigUint,
    x: Zeroizing<Vec<u8>>,
    public: Vec<u8>,
}

impl std::fmt::Debug for DhKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DhKey")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

/// Bytes of the private exponent (512 bits: more than twice the strength of ffdhe8192).
const PRIVATE_LEN: usize = 64;

/// Why a Diffie-Hellman value is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DhValueError {
    /// Not as long as the group's values.
    Length,
    /// 0, 1, p - 1 or not below p.
    Range,
}

impl DhKey {
    /// A fresh key pair in `group` (not null) from the system's random source.
    pub fn generate(group: DhGroup) -> Option<DhKey> {
        let mut x = Zeroizing::new(vec![0u8; PRIVATE_LEN]);
        getrandom::fill(&mut x).ok()?;
        DhKey::from_private(group, &x)
    }

    /// The key pair of private exponent `x` (big-endian) in `group` (not null).
    pub fn from_private(group: DhGroup, x: &[u8]) -> Option<DhKey> {
        let p = group.prime()?;
        let xi = BigUint::from_bytes_be(x);
        let public = pad(&BigUint::from(2u8).modpow(&xi, &p), group.value_len());
        Some(DhKey {
            group,
            p,
            x: Zeroizing::new(x.to_vec()),
            public,
        })
    }

    /// The public value g^x mod p, big-endian, as long as the group's values.
    pub fn public(&self) -> &[u8] {
        &self.public
    }

    /// The shared secret peer^x mod p, big-endian, as long as the group's values; the peer's
    /// value must be as long and lie in 2 ..= p - 2.
    pub fn shared(&self, peer: &[u8]) -> Result<Zeroizing<Vec<u8>>, DhValueError> {
        if peer.len() != self.group.value_len() {
            return Err(DhValueError::Length);
        }
        let y = BigUint::from_bytes_be(peer);
        let one = BigUint::from(1u8);
        if y <= one || y >= &self.p - &one {
            return Err(DhValueError::Range);
        }
        let x = BigUint::from_bytes_be(&self.x);
        Ok(Zeroizing::new(pad(
            &y.modpow(&x, &self.p),
            self.group.value_len(),
        )))
    }
}

/// `v` big-endian, left-padded with zeros to `len` bytes.
fn pad(v: &BigUint, len: usize) -> Vec<u8> {
    let b = v.to_bytes_be();
    let mut out = vec![0u8; len.saturating_sub(b.len())];
    out.extend_from_slice(&b);
    out
}
