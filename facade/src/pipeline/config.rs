//! Pipeline settings (what `ubdirect pipeline` parses its flags into).

use std::time::Duration;

use super::mapped_options::MappedOptions;

/// Direct (UB pool, zero CPU copies) or the classic copy path (for A/B).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Source DMA into pool buffers, sink straight from them.
    #[default]
    Direct,
    /// read() into pageable memory, then a pageable copy into the sink.
    Copy,
}

/// When to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Limit {
    /// Move this many bytes (wrapping around the source when larger).
    Bytes(u64),
    /// Run this long.
    Duration(Duration),
}

/// Settings of one run.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Bytes per block (per source request and per sink copy).
    pub block_size: usize,
    /// Source requests kept in flight.
    pub qd: usize,
    /// When to stop.
    pub limit: Limit,
    /// Verify that what arrived equals the source bytes.
    pub verify: bool,
    /// Show a progress bar (only honoured on a terminal).
    pub progress: bool,
    /// Abort when nothing completes for this long.
    pub stall_timeout: Duration,
    /// Source byte offset the stream starts at (logical-block aligned); the stream wraps
    /// within [start, capacity).
    pub start: u64,
    /// Mapped-file runs: copy size, window length, registration threads.
    pub mapped: MappedOptions,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            block_size: 4 << 20,
            qd: 32,
            limit: Limit::Bytes(1 << 30),
            verify: false,
            progress: false,
            stall_timeout: Duration::from_secs(30),
            start: 0,
            mapped: MappedOptions::default(),
        }
    }
}

impl PipelineConfig {
    /// Check the settings against a source of `capacity` bytes with `lbs`-byte blocks.
    pub fn validate(&self, capacity: u64, lbs: u32) -> Result<(), String> {
        if self.block_size == 0 || self.block_size % lbs.max(1) as usize != 0 {
            return Err(format!(
                "PipelineConfig::block_size {} must be a positive multiple of the source's {lbs}-byte logical block",
                self.block_size
            ));
        }
        if self.qd == 0 {
            return Err("PipelineConfig::qd must be at least 1".into());
        }
        if capacity == 0 {
            return Err("the source is empty (0 bytes): nothing to stream".into());
        }
        if self.start >= capacity || self.start % u64::from(lbs.max(1)) != 0 {
            return Err(format!(
                "start offset {} must be a multiple of the {lbs}-byte logical block below the source's {capacity} bytes",
                self.start
            ));
        }
        let capacity = capacity - self.start;
        match self.limit {
            Limit::Bytes(0) => return Err("Limit::Bytes must be > 0".into()),
            Limit::Duration(d) if d.is_zero() => return Err("Limit::Duration must be > 0".into()),
            _ => {}
        }
        if self.verify {
            match self.limit {
                Limit::Bytes(b) if b <= capacity => {}
                Limit::Bytes(b) => {
                    return Err(format!(
                        "PipelineConfig::verify checks one pass over the source: Limit::Bytes {b} exceeds its {capacity} bytes"
                    ))
                }
                Limit::Duration(_) => return Err("PipelineConfig::verify needs Limit::Bytes (one pass over the source), not Limit::Duration".into()),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_settings() {
        let ok = PipelineConfig::default();
        assert!(ok.validate(1 << 30, 512).is_ok());
        let c = PipelineConfig {
            block_size: 1000,
            ..ok.clone()
        };
        assert!(c
            .validate(1 << 30, 512)
            .unwrap_err()
            .contains("PipelineConfig::block_size"));
        let c = PipelineConfig {
            qd: 0,
            ..ok.clone()
        };
        assert!(c.validate(1 << 30, 512).is_err());
        assert!(ok.validate(0, 512).unwrap_err().contains("empty"));
        let c = PipelineConfig {
            verify: true,
            limit: Limit::Bytes(2 << 30),
            ..ok.clone()
        };
        assert!(c.validate(1 << 30, 512).unwrap_err().contains("one pass"));
        let c = PipelineConfig {
            verify: true,
            limit: Limit::Duration(Duration::from_secs(1)),
            ..ok
        };
        assert!(c.validate(1 << 30, 512).is_err());
    }
}
