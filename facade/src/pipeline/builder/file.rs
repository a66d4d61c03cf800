//! A file as the source: its page cache mapped for the GPU when asked for (or, with
//! `FileIo::Auto`, when it is resident enough), otherwise read into the pool through io_uring
//! (O_DIRECT or buffered), or read() and copied (`Mode::Copy`).

use std::path::Path;

use super::super::config::Mode;
#[cfg(feature = "cuda")]
use super::super::config::PipelineConfig;
use super::super::error::PipelineError;
use super::error::{PipelineRunError, SetupError};
use super::run::Run;
use super::{FileIo, Note, SinkSpec};

/// Stream the file at `path`.
pub(super) fn run(run: &mut Run<'_>, path: &Path) -> Result<(), PipelineRunError> {
    let s = run.s;
    let is_cuda = matches!(s.sink, SinkSpec::Cuda(_));
    if s.repeat == 0 {
        return Err(SetupError::RepeatZero.into());
    }
    if s.repeat > 1 && s.verify {
        return Err(SetupError::VerifyRepeat.into());
    }
    if s.file_io == FileIo::Mapped && !(is_cuda && s.mode == Mode::Direct) {
        return Err(SetupError::MappedNeedsCuda.into());
    }
    let file = std::fs::File::open(path).map_err(|e| open_error(path, e))?;
    let size = file.metadata().map_err(PipelineRunError::open)?.len();
    #[cfg(feature = "cuda")]
    {
        let resident = match s.file_io {
            FileIo::Mapped => Some(super::mapped_run::resident(&file, s, size)),
            FileIo::Auto if is_cuda && s.mode == Mode::Direct => {
                let r = super::mapped_run::resident(&file, s, size);
                (r >= super::AUTO_MAPPED_RESIDENT).then_some(r)
            }
            _ => None,
        };
        if let Some(resident) = resident {
            drop(file);
            let cfg = PipelineConfig {
                limit: run.limit(size),
                ..run.config()
            };
            return super::mapped_run::run(run, path, resident, cfg);
        }
    }
    #[cfg(not(feature = "cuda"))]
    let _ = (file, size);
    if s.mapped.any_given() {
        run.note(Note::MappedSettingsUnused);
    }
    let pool = run.dev.pool(s.block_size)?;
    #[cfg(feature = "uring")]
    use super::file_uring::uring;
    uring(run, path, &pool)
}

/// The error of a file that would not open.
pub(super) fn open_error(path: &Path, e: std::io::Error) -> PipelineRunError {
    PipelineError::Io {
        what: format!("cannot open {}", path.display()),
        source: e,
    }
    .into()
}

/// Without io_uring, a file is not read into the pool.
#[cfg(not(feature = "uring"))]
fn uring(
    _: &mut Run<'_>,
    _: &Path,
    _: &std::sync::Arc<ubdirect_core::UbPool>,
) -> Result<(), PipelineRunError> {
    Err(SetupError::NotBuilt { feature: "uring" }.into())
}
