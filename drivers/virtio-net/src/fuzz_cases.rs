//! Case counts of the host fuzz targets (proptest on stable): 10,000 cases each by default
//! (CI), `UBD_FUZZ_CASES=1000000` by hand.

use proptest::test_runner::Config;

/// Cases per fuzz target: `UBD_FUZZ_CASES` or 10,000.
pub(crate) fn cases() -> u32 {
    std::env::var("UBD_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// A proptest configuration running [`cases`] cases, no persisted failures outside the
/// crate's proptest-regressions directory, and no shrinking time limit surprises.
pub(crate) fn config() -> Config {
    Config {
        cases: cases(),
        max_shrink_iters: 10_000,
        ..Config::default()
    }
}
