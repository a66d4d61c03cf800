//! The pipeline's progress bar on stderr: indicatif with the `progress` feature (on by default,
//! what the CLI uses); without it, [`make_progress`] always returns `None` and an embedder
//! compiles no terminal crate.

use super::config::PipelineConfig;

#[cfg(feature = "progress")]
pub(crate) use indicatif::ProgressBar;

/// Stands in for indicatif's bar when the `progress` feature is off (never constructed).
#[cfg(not(feature = "progress"))]
pub(crate) enum ProgressBar {}

#[cfg(not(feature = "progress"))]
impl ProgressBar {
    pub(crate) fn set_position(&self, _pos: u64) {
        match *self {}
    }
    pub(crate) fn finish_and_clear(&self) {
        match *self {}
    }
}

/// A progress bar on stderr when asked for and stderr is a terminal.
#[cfg(feature = "progress")]
pub(crate) fn make_progress(cfg: &PipelineConfig) -> Option<ProgressBar> {
    use super::config::Limit;
    use std::io::IsTerminal;
    if !cfg.progress || !std::io::stderr().is_terminal() {
        return None;
    }
    let (len, unit) = match cfg.limit {
        Limit::Bytes(b) => (b, "{bytes}/{total_bytes} {bytes_per_sec}"),
        Limit::Duration(d) => (d.as_millis() as u64, "{pos}/{len} ms"),
    };
    let pb = indicatif::ProgressBar::new(len);
    let style =
        indicatif::ProgressStyle::with_template(&format!("{{bar:40}} {unit} {{elapsed}}")).ok()?;
    pb.set_style(style);
    Some(pb)
}

/// Without the `progress` feature there is no bar (`cfg.progress` is ignored).
#[cfg(not(feature = "progress"))]
pub(crate) fn make_progress(_cfg: &PipelineConfig) -> Option<ProgressBar> {
    None
}
