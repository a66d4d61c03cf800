//! The mapped-file run's plan: its copy size, window and registration threads checked against
//! the file and the registration cap (the run itself: `mapped_run.rs`).

use super::super::mapped_options::{MappedOptions, MappedPlan, COPY_ALIGN};
use super::error::SetupError;
use super::MappedSettings;

/// Page-cache residency above which `FileIo::Auto` maps the file instead of reading it.
pub const AUTO_MAPPED_RESIDENT: f64 = 0.9;

/// The registration cap: the one given, or half the RAM (MemTotal / 2), or 16 GiB when
/// /proc/meminfo says nothing.
pub fn map_cap(settings: &MappedSettings) -> u64 {
    settings.cap.unwrap_or_else(|| {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<u64>().ok())
            })
            .map(|kb| kb * 1024 / 2)
            .unwrap_or(16 << 30)
    })
}

/// Check the mapped settings for a file of `size` bytes streamed from `start`.
pub fn mapped_plan(
    settings: &MappedSettings,
    start: u64,
    size: u64,
) -> Result<MappedPlan, SetupError> {
    let span = size.saturating_sub(start);
    if span == 0 {
        return Err(SetupError::StartPastEnd { start, size });
    }
    let opts = MappedOptions {
        copy_size: settings.copy_size,
        window: settings.window,
        register_threads: settings
            .register_threads
            .unwrap_or(super::super::mapped_options::DEFAULT_REGISTER_THREADS),
    };
    let plan = opts.resolve(span, start)?;
    let cap = map_cap(settings);
    if plan.window + COPY_ALIGN as u64 > cap {
        return Err(SetupError::WindowOverCap {
            window: plan.window,
            cap,
        });
    }
    Ok(plan)
}
