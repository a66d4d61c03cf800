//! Case counts of the host fuzz targets (proptest on stable): 10,000 cases each by default
//! (CI), `UBD_FUZZ_CASES=1000000` by hand; seed `UBD_FUZZ_SEED` (else random, printed).

use proptest::test_runner::{Config, RngSeed};

/// Cases per fuzz target: `UBD_FUZZ_CASES` or 10,000.
pub(crate) fn cases() -> u32 {
    ubdirect_devmodel::fuzz::cases()
}

/// A proptest configuration running [`cases`] cases, no persisted failures outside the
/// crate's proptest-regressions directory, and no shrinking time limit surprises.
pub(crate) fn config() -> Config {
    Config {
        cases: cases(),
        rng_seed: RngSeed::Fixed(ubdirect_devmodel::fuzz::seed()),
        max_shrink_iters: 10_000,
        ..Config::default()
    }
}
