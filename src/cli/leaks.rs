//! The leak check a subcommand runs at exit: pool blocks still handed out and IOVA mappings
//! (registry regions) beyond those the run set up, counted once its queues are dropped.

use serde::Serialize;
use ubdirect::dma::{UbPool, UbRegistry};

/// What a run left behind; all zero when it returned everything.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Leaks {
    /// Pool blocks handed out and not returned.
    pub pool_blocks_in_use: usize,
    /// Regions registered now beyond `mappings_expected`.
    pub mappings_beyond_expected: usize,
    /// Regions registered when the run started (the pool's and the controller's own).
    pub mappings_expected: usize,
}

impl Leaks {
    /// Count `pool`'s blocks out and `registry`'s regions against `expected` regions.
    pub fn count(pool: &UbPool, registry: &UbRegistry, expected: usize) -> Leaks {
        Leaks {
            pool_blocks_in_use: pool.stats().in_use,
            mappings_beyond_expected: registry.region_count().saturating_sub(expected),
            mappings_expected: expected,
        }
    }

    /// Whether nothing was left behind.
    pub fn is_clean(&self) -> bool {
        self.pool_blocks_in_use == 0 && self.mappings_beyond_expected == 0
    }

    /// Say on stderr what `command` left behind, when it left anything.
    pub fn warn(&self, command: &str) {
        if !self.is_clean() {
            eprintln!(
                "ubdirect {command}: warning: at exit {} pool block(s) were still in use and {} DMA mapping(s) beyond the run's own {} were still registered (a leak)",
                self.pool_blocks_in_use, self.mappings_beyond_expected, self.mappings_expected
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ubdirect::dma::{DmaDomain, PoolConfig};

    #[test]
    fn a_block_kept_and_a_region_added_are_counted_and_returned_ones_are_not() {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let pool = UbPool::with_anonymous(
            &reg,
            PoolConfig {
                block_size: 4096,
                block_count: 4,
            },
            None,
        )
        .unwrap();
        let base = reg.region_count();
        drop(pool.get().unwrap());
        assert!(Leaks::count(&pool, &reg, base).is_clean());
        let kept = pool.get().unwrap();
        let extra = reg.register_anonymous(1 << 16, None).unwrap();
        let l = Leaks::count(&pool, &reg, base);
        assert_eq!((l.pool_blocks_in_use, l.mappings_beyond_expected), (1, 1));
        drop(kept);
        reg.unregister(extra.id).unwrap();
        assert!(Leaks::count(&pool, &reg, base).is_clean());
    }
}
