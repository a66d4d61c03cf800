//! Shared pieces of the fuzz targets (proptest on stable): the case count, page and hostile
//! controller generators.
//!
//! Each target runs `UBD_FUZZ_CASES` cases (default 10,000, what CI runs); by hand, e.g.
//! `UBD_FUZZ_CASES=1000000 cargo test --release -p ubdirect-nvme --test fuzz_parse`; the RNG
//! seed is `UBD_FUZZ_SEED` (else random) and printed ([`ubdirect_devmodel::fuzz`]).

#![allow(dead_code)]

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

use ubdirect_devmodel::nvme::{regs, CqeTweak, Hostile, NsConfig, NvmeConfig};

/// Count one case of `target`; with `UBD_FUZZ_PROGRESS` set, print the count every 10,000
/// cases and at the last one (so a by-hand run shows how many cases really ran; run one target
/// per process: the count is per test binary).
pub fn tick(target: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed) + 1;
    if (n % 10_000 == 0 || n == u64::from(cases()))
        && std::env::var_os("UBD_FUZZ_PROGRESS").is_some()
    {
        eprintln!("{target}: {n} cases");
    }
}

/// Cases per target: `UBD_FUZZ_CASES`, else 10,000.
pub fn cases() -> u32 {
    ubdirect_devmodel::fuzz::cases()
}

/// The proptest configuration of every target: the case count, no persisted regressions
/// files in the source tree (failures print the minimal input), little shrinking time, the
/// seed of [`ubdirect_devmodel::fuzz::seed`].
pub fn config() -> Config {
    Config {
        cases: cases(),
        rng_seed: RngSeed::Fixed(ubdirect_devmodel::fuzz::seed()),
        failure_persistence: None,
        max_shrink_iters: 2_000,
        ..Config::default()
    }
}

/// A 4 KiB page: a starting point (the valid template, random bytes, all-ones or zeros) with
/// byte patches, biased toward the first `hot` bytes where the fields live.
pub fn page(template: [u8; 4096], hot: usize) -> impl Strategy<Value = Vec<u8>> {
    let patch = (prop_oneof![3 => 0..hot, 1 => 0..4096usize], any::<u8>());
    (0u8..4, any::<u64>(), prop::collection::vec(patch, 0..24)).prop_map(
        move |(base, seed, patches)| {
            let mut p = match base {
                0 => template.to_vec(),
                1 => random_bytes(seed, 4096),
                2 => vec![0xff; 4096],
                _ => vec![0; 4096],
            };
            for (off, v) in patches {
                p[off] = v;
            }
            p
        },
    )
}

/// `n` bytes of a xorshift stream from `seed` (cheap, unlike 4096 proptest byte strategies).
pub fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A CAP value: the model's default, one with random MQES / DSTRD / TO, or any 64 bits.
pub fn cap() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => Just(NvmeConfig::default().cap),
        2 => (any::<u16>(), 0u8..16, any::<u8>()).prop_map(|(m, d, t)| regs::cap(m, d, t)),
        1 => any::<u64>(),
    ]
}

/// A controller configuration with random limits and namespaces.
pub fn nvme_config() -> impl Strategy<Value = NvmeConfig> {
    let ns = prop::collection::vec((1u32..6, 1u64..512, 9u8..13), 0..3);
    (
        cap(),
        prop_oneof![
            Just(0x4000u64),
            Just(0x20),
            Just(0x1000),
            Just(0x1008),
            Just(0x10_0000)
        ],
        1u16..40,
        any::<u8>(),
        ns,
        prop::option::of(any::<u32>()),
        any::<bool>(),
    )
        .prop_map(|(cap, bar0_len, max_io_queues, mdts, ns, nn, shadow)| {
            let mut namespaces: Vec<NsConfig> = Vec::new();
            for (nsid, blocks, lbads) in ns {
                if !namespaces.iter().any(|n| n.nsid == nsid) {
                    namespaces.push(NsConfig {
                        nsid,
                        blocks,
                        lbads,
                    });
                }
            }
            NvmeConfig {
                cap,
                bar0_len,
                max_io_queues,
                mdts,
                namespaces,
                nn,
                shadow_doorbells: shadow,
                ..NvmeConfig::default()
            }
        })
}

/// A completion entry change.
pub fn cqe_tweak() -> impl Strategy<Value = CqeTweak> {
    prop_oneof![
        4 => Just(CqeTweak::Keep),
        1 => any::<u16>().prop_map(CqeTweak::Cid),
        1 => (0u16..8).prop_map(CqeTweak::Cid),
        1 => Just(CqeTweak::FlipPhase),
        1 => any::<u16>().prop_map(CqeTweak::Status),
        1 => any::<u16>().prop_map(CqeTweak::SqHead),
        1 => any::<u16>().prop_map(CqeTweak::SqId),
        1 => any::<u32>().prop_map(CqeTweak::Result),
        1 => any::<[u8; 16]>().prop_map(CqeTweak::Bytes),
    ]
}

/// A misbehaviour plan: register overrides, all-ones from some read on, identify page
/// patches, a device that goes silent, completion changes.
pub fn hostile() -> impl Strategy<Value = Hostile> {
    let reg_off = prop_oneof![
        Just(0u64),
        Just(4),
        Just(8),
        Just(0x14),
        Just(0x1c),
        Just(0x24)
    ];
    let id_off = prop_oneof![3 => 0u16..600, 1 => 0u16..4096];
    (
        prop::collection::vec((reg_off, any::<u64>()), 0..3),
        prop::option::weighted(0.2, 0u64..300),
        prop::collection::vec((0u8..3, id_off, any::<u8>()), 0..16),
        prop::option::weighted(0.2, 0u64..60),
        prop::collection::vec(cqe_tweak(), 0..24),
        prop::collection::vec(0u64..24, 0..3),
    )
        .prop_map(
            |(registers, all_ones_after, identify_patches, silent_after, cqe_tweaks, lost)| {
                Hostile {
                    registers,
                    all_ones_after,
                    identify_patches,
                    silent_after,
                    cqe_tweaks,
                    lost_sq_doorbells: lost,
                }
            },
        )
}
