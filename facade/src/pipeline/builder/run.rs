//! The run's order: the settings checked, the polling thread pinned, the devices opened, then
//! the source's own path (NVMe, NVMe/TCP, or a file).

use std::sync::Arc;
use std::time::Duration;

use ubdirect_core::PciDevice;

use super::super::config::{Limit, Mode, PipelineConfig};
use super::super::mapped_options::{MappedOptions, DEFAULT_REGISTER_THREADS};
use super::super::report::PipelineReport;
use super::devices::Devices;
use super::error::{PipelineRunError, SetupError};
use super::{FileIo, Note, PipelineBuilder, RunHook, Settings, SinkSpec, SourceSpec};

/// One run in progress: its settings, its open devices, its reports so far.
pub(super) struct Run<'a> {
    pub(super) s: &'a Settings,
    pub(super) dev: Devices,
    notes: Box<dyn FnMut(Note)>,
    hook: Option<RunHook>,
    pub(super) reports: Vec<PipelineReport>,
}

impl Run<'_> {
    /// Tell the caller `note`.
    pub(super) fn note(&mut self, note: Note) {
        (self.notes)(note);
    }
    /// Call the caller's hook with the controller's device (once), keeping what it returns
    /// until the caller drops it.
    pub(super) fn before_run(&mut self, dev: &Arc<PciDevice>) -> Option<Box<dyn std::any::Any>> {
        self.hook.take().and_then(|h| h(dev))
    }
    /// The settings of one run before the source's size is known.
    pub(super) fn config(&self) -> PipelineConfig {
        let s = self.s;
        PipelineConfig {
            block_size: s.block_size,
            qd: s.qd,
            limit: Limit::Bytes(0), // set once the source's size is known
            verify: s.verify,
            progress: s.progress,
            stall_timeout: Duration::from_secs(30),
            start: s.start,
            mapped: MappedOptions {
                copy_size: s.mapped.copy_size,
                window: s.mapped.window,
                register_threads: s
                    .mapped
                    .register_threads
                    .unwrap_or(DEFAULT_REGISTER_THREADS),
            },
        }
    }
    /// The run's limit over a source of `cap` bytes: the one given, or the source once from
    /// the start offset.
    pub(super) fn limit(&self, cap: u64) -> Limit {
        self.s
            .limit
            .unwrap_or(Limit::Bytes(cap.saturating_sub(self.s.start).max(1)))
    }
    /// Label of run `i` of the repeated runs.
    #[cfg(any(feature = "cuda", feature = "uring"))]
    pub(super) fn label(&self, i: usize) -> String {
        if self.s.repeat > 1 {
            format!("pipeline (run {}/{})", i + 1, self.s.repeat)
        } else {
            "pipeline".to_string()
        }
    }
}

/// Run what `b` describes.
pub(super) fn run(b: PipelineBuilder) -> Result<Vec<PipelineReport>, PipelineRunError> {
    let PipelineBuilder { s, notes, hook } = b;
    let source = s.source.clone().ok_or(SetupError::NoSource)?;
    check(&s, &source)?;
    if let Some(core) = s.core {
        ubdirect_core::util::pin_to_core(core).map_err(PipelineRunError::open)?;
    }
    let dev = Devices::open(&s, &source)?;
    let mut run = Run {
        s: &s,
        dev,
        notes: notes.unwrap_or_else(|| Box::new(log_note)),
        hook,
        reports: Vec::new(),
    };
    match &source {
        #[cfg(feature = "nvmf")]
        SourceSpec::Tcp { addr, nsid } => super::tcp::run(&mut run, addr, *nsid)?,
        // Refused by `check` before anything opened.
        #[cfg(not(feature = "nvmf"))]
        SourceSpec::Tcp { .. } => return Err(SetupError::NotBuilt { feature: "nvmf" }.into()),
        SourceSpec::File(path) => super::file::run(&mut run, path)?,
        SourceSpec::Nvme { addr, nsid } => super::nvme::run(&mut run, *addr, *nsid)?,
    }
    Ok(run.reports)
}

/// Refuse settings that cannot work together, before anything opens.
fn check(s: &Settings, source: &SourceSpec) -> Result<(), SetupError> {
    if s.qd == 0 {
        return Err(SetupError::QueueDepthZero);
    }
    if s.pool_blocks.unwrap_or(s.qd * 2) == 0 {
        return Err(SetupError::PoolEmpty {
            block_size: s.block_size,
        });
    }
    if cfg!(not(feature = "nvmf")) && matches!(source, SourceSpec::Tcp { .. }) {
        return Err(SetupError::NotBuilt { feature: "nvmf" });
    }
    let file = matches!(source, SourceSpec::File(_));
    if s.mode == Mode::Copy && !file {
        return Err(SetupError::CopyNeedsFile);
    }
    if s.mode == Mode::Copy && matches!(s.sink, SinkSpec::Bar { .. }) {
        return Err(SetupError::CopyToBar);
    }
    if s.mapped.any_given() && (!file || matches!(s.file_io, FileIo::Direct | FileIo::Buffered)) {
        return Err(SetupError::MappedSettingsUnused);
    }
    Ok(())
}

/// Without a caller's note handler: notes go to the log.
fn log_note(note: Note) {
    match note {
        Note::MappedSettingsUnused => tracing::warn!(
            "the file is read into the pool (less than {:.0}% of it is in the page cache): the mapped settings do not apply",
            super::AUTO_MAPPED_RESIDENT * 100.0
        ),
        Note::ControllerReset {
            addr,
            resets,
            requeued,
        } => tracing::warn!(
            "NVMe controller {addr} was reset {resets} time(s) during the run; the reads in flight were submitted again (requeued commands: {requeued})"
        ),
        Note::HostCheck(line) => tracing::info!("{line}"),
    }
}

#[cfg(all(test, not(feature = "nvmf")))]
mod tests {
    use super::super::error::{PipelineRunError, SetupError};
    use super::super::{Pipeline, SourceSpec};

    #[test]
    fn an_nvme_tcp_source_without_the_nvmf_feature_is_refused_before_anything_opens() {
        let r = Pipeline::builder()
            .source(SourceSpec::Tcp {
                addr: "nvmf-tcp://127.0.0.1:4420/nqn.x".into(),
                nsid: None,
            })
            .run();
        assert!(
            matches!(
                r,
                Err(PipelineRunError::Setup(SetupError::NotBuilt {
                    feature: "nvmf"
                }))
            ),
            "{r:?}"
        );
    }
}
