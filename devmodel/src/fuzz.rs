//! Case count and seed of the host fuzz targets (proptest on stable, in `ubdirect-nvme` and
//! `ubdirect-virtio-net`): one place for the environment both drivers' harnesses read.
//!
//! - `UBD_FUZZ_CASES=N`: cases per target (default 10,000, what CI runs).
//! - `UBD_FUZZ_SEED=N`: the seed of proptest's RNG (`RngSeed::Fixed`); unset, a random seed.
//!   Either way the seed is printed once per process (`fuzz seed N ...` on stderr, shown by
//!   libtest for a failing test or with `--nocapture`), so a failure can be run again, and
//!   by-hand runs can be sharded over processes with one seed each.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

/// Cases per fuzz target: `UBD_FUZZ_CASES`, else 10,000. A value that is not a number panics
/// (a by-hand run must not quietly fall back to the CI count).
pub fn cases() -> u32 {
    parse_env("UBD_FUZZ_CASES", std::env::var("UBD_FUZZ_CASES").ok()).unwrap_or(10_000)
}

/// The RNG seed of this process's fuzz targets: `UBD_FUZZ_SEED`, else a random one; printed
/// on stderr the first time it is asked for.
pub fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let (seed, from) = match parse_env("UBD_FUZZ_SEED", std::env::var("UBD_FUZZ_SEED").ok()) {
            Some(s) => (s, "UBD_FUZZ_SEED"),
            None => (random_seed(), "random"),
        };
        eprintln!("fuzz seed {seed} ({from}; run again with UBD_FUZZ_SEED={seed})");
        seed
    })
}

/// `value` of the variable `name` as a number, `None` when unset or empty; anything else
/// panics with the variable's name.
fn parse_env<T: std::str::FromStr>(name: &str, value: Option<String>) -> Option<T> {
    let v = value?;
    let v = v.trim();
    if v.is_empty() {
        return None;
    }
    match v.replace('_', "").parse() {
        Ok(n) => Some(n),
        Err(_) => panic!("{name}='{v}' is not a number (e.g. {name}=1000000)"),
    }
}

/// 64 random bits from the standard library's per-process hash keys (no RNG crate needed).
fn random_seed() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_read_with_separators_and_unset_is_none() {
        assert_eq!(
            parse_env::<u64>("X", Some("1_000_000".into())),
            Some(1_000_000)
        );
        assert_eq!(parse_env::<u64>("X", Some(" 42 ".into())), Some(42));
        assert_eq!(parse_env::<u64>("X", None), None);
        assert_eq!(parse_env::<u64>("X", Some(String::new())), None);
    }

    #[test]
    #[should_panic(expected = "UBD_FUZZ_SEED='abc' is not a number")]
    fn a_seed_that_is_not_a_number_is_refused_by_name() {
        let _ = parse_env::<u64>("UBD_FUZZ_SEED", Some("abc".into()));
    }

    #[test]
    fn random_seeds_differ() {
        assert_ne!(random_seed(), random_seed());
    }
}
