//! The `--io mapped` flags: what they ask of the builder's mapped-file run.

use ubdirect::pipeline::MappedSettings;

use super::Args;

/// The mapped-run settings the flags ask for.
pub(super) fn settings(args: &Args) -> MappedSettings {
    MappedSettings {
        copy_size: args
            .copy_size
            .map(|c| usize::try_from(c).unwrap_or(usize::MAX)),
        window: args.map_window,
        register_threads: args.register_threads,
        populate: args.map_populate,
        cap: args.map_cap,
    }
}

/// Check the mapped settings for a file of `size` bytes, in the command line's terms.
#[cfg(test)]
pub(super) fn plan(
    args: &Args,
    size: u64,
) -> Result<ubdirect::pipeline::MappedPlan, Box<dyn std::error::Error + Send + Sync>> {
    ubdirect::pipeline::mapped_plan(&settings(args), args.start, size)
        .map_err(|e| crate::cli::errors::setup_message(&e).into())
}
