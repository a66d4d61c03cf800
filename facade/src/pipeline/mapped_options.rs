//! Settings of a mapped-file run (the page cache registered with the GPU and copied in place):
//! the copy size, independent of the UB pool's block size; the window (registration unit) length;
//! how many threads register windows ahead of the copies. [`MappedOptions::resolve`] checks them
//! against the stretch of file a run streams and fills in the defaults.

/// Default bytes per GPU copy out of a registered window (chosen by measurement on an H200:
/// docs/benchmarks/gpu.md, "Mapped copies: copy size, and registration beside the copies").
pub const DEFAULT_COPY_SIZE: usize = 64 << 20;
/// Default window length target: windows are the largest multiple of the copy size up to this.
pub const DEFAULT_WINDOW_TARGET: u64 = 256 << 20;
/// Default number of threads registering windows ahead of the copies. The CUDA driver runs one
/// registration at a time and holds copy submission meanwhile (measured on an H200,
/// docs/benchmarks/gpu.md, "Mapped copies: copy size, and registration beside the copies"):
/// two threads let one fault a window's page tables in while the other registers; more only
/// queue on the driver.
pub const DEFAULT_REGISTER_THREADS: usize = 2;
/// Most registration threads a run may ask for.
pub const MAX_REGISTER_THREADS: usize = 64;
/// Copy sizes and windows are multiples of this, so every page of the file belongs to exactly
/// one window and is registered once.
pub const COPY_ALIGN: usize = 4096;

/// What a mapped-file run may be told (the defaults where `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappedOptions {
    /// Bytes per GPU copy (a multiple of [`COPY_ALIGN`]); `None`: [`DEFAULT_COPY_SIZE`], or the
    /// whole stretch when the file is smaller.
    pub copy_size: Option<usize>,
    /// Bytes per registered window (a multiple of the copy size); `None`: the largest multiple
    /// of the copy size up to [`DEFAULT_WINDOW_TARGET`] (no more than the stretch streamed).
    pub window: Option<u64>,
    /// Threads registering windows ahead of the copies (1..=[`MAX_REGISTER_THREADS`]).
    pub register_threads: usize,
}

impl Default for MappedOptions {
    fn default() -> Self {
        MappedOptions {
            copy_size: None,
            window: None,
            register_threads: DEFAULT_REGISTER_THREADS,
        }
    }
}

/// The settings a mapped run uses, defaults filled in and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappedPlan {
    /// Bytes per copy.
    pub copy_size: usize,
    /// Bytes per window (a multiple of `copy_size`).
    pub window: u64,
    /// Registration threads.
    pub register_threads: usize,
}

/// A mapped-run setting that cannot work, in the library's terms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MappedOptionError {
    /// Copy size 0.
    #[error("the copy size must be at least {COPY_ALIGN} bytes, not 0")]
    CopySizeZero,
    /// Copy size not a multiple of the page.
    #[error("the copy size {size} is not a multiple of {COPY_ALIGN} bytes (each page of the file must fall in one registered window): use {} or {}", size / COPY_ALIGN * COPY_ALIGN, size.next_multiple_of(COPY_ALIGN))]
    CopySizeUnaligned {
        /// The size asked for.
        size: usize,
    },
    /// Copy size beyond what the run streams.
    #[error("the copy size {size} exceeds the {span} bytes the run streams (the file from offset {start}): use at most {}", span.next_multiple_of(COPY_ALIGN as u64))]
    CopySizeTooLarge {
        /// The size asked for.
        size: usize,
        /// Bytes from the start offset to the end of the file.
        span: u64,
        /// The start offset.
        start: u64,
    },
    /// A window that is not a whole number of copies.
    #[error("the window length {window} is not a positive multiple of the {copy_size}-byte copy size (no copy may straddle two windows)")]
    WindowNotMultiple {
        /// The window asked for.
        window: u64,
        /// The copy size in force.
        copy_size: usize,
    },
    /// Registration threads out of range.
    #[error("{threads} registration threads: use 1 to {MAX_REGISTER_THREADS}")]
    RegisterThreads {
        /// The count asked for.
        threads: usize,
    },
}

impl MappedOptions {
    /// Check the settings for a run over `span` bytes of a file starting at offset `start`
    /// (`span` > 0) and fill in the defaults.
    pub fn resolve(&self, span: u64, start: u64) -> Result<MappedPlan, MappedOptionError> {
        let whole = span.next_multiple_of(COPY_ALIGN as u64);
        let copy_size = match self.copy_size {
            Some(0) => return Err(MappedOptionError::CopySizeZero),
            Some(size) if size % COPY_ALIGN != 0 => {
                return Err(MappedOptionError::CopySizeUnaligned { size })
            }
            Some(size) if size as u64 > whole => {
                return Err(MappedOptionError::CopySizeTooLarge { size, span, start })
            }
            Some(size) => size,
            None => (DEFAULT_COPY_SIZE as u64).min(whole) as usize,
        };
        let cs = copy_size as u64;
        let window = match self.window {
            Some(w) if w == 0 || w % cs != 0 => {
                return Err(MappedOptionError::WindowNotMultiple {
                    window: w,
                    copy_size,
                })
            }
            Some(w) => w,
            None => ((DEFAULT_WINDOW_TARGET / cs).max(1) * cs).min(span.next_multiple_of(cs)),
        };
        if !(1..=MAX_REGISTER_THREADS).contains(&self.register_threads) {
            return Err(MappedOptionError::RegisterThreads {
                threads: self.register_threads,
            });
        }
        Ok(MappedPlan {
            copy_size,
            window,
            register_threads: self.register_threads,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn with(copy: Option<usize>, window: Option<u64>, threads: usize) -> MappedOptions {
        MappedOptions {
            copy_size: copy,
            window,
            register_threads: threads,
        }
    }

    #[test]
    fn defaults_fill_in_and_shrink_to_a_small_file() {
        let p = MappedOptions::default().resolve(8 * GIB, 0).unwrap();
        assert_eq!(p.copy_size, DEFAULT_COPY_SIZE);
        assert_eq!(p.window % p.copy_size as u64, 0);
        assert!(p.window <= DEFAULT_WINDOW_TARGET.max(p.copy_size as u64));
        assert_eq!(p.register_threads, DEFAULT_REGISTER_THREADS);
        // A 1 MiB + 1 byte file: one copy of the whole stretch, page-rounded.
        let p = MappedOptions::default().resolve((1 << 20) + 1, 0).unwrap();
        assert_eq!(p.copy_size, (1 << 20) + 4096);
        assert_eq!(p.window, p.copy_size as u64);
        // The copy size decides the window: 48 MiB copies, 240 MiB windows.
        let p = with(Some(48 << 20), None, 2).resolve(8 * GIB, 0).unwrap();
        assert_eq!((p.window, p.register_threads), (240 << 20, 2));
        // Copies larger than the window target: one copy per window.
        let p = with(Some(512 << 20), None, 1).resolve(8 * GIB, 0).unwrap();
        assert_eq!(p.window, 512 << 20);
    }

    #[test]
    fn bad_copy_sizes_are_refused_in_library_terms() {
        let e = with(Some(0), None, 4).resolve(GIB, 0).unwrap_err();
        assert_eq!(e, MappedOptionError::CopySizeZero);
        let e = with(Some(5000), None, 4).resolve(GIB, 0).unwrap_err();
        assert_eq!(e, MappedOptionError::CopySizeUnaligned { size: 5000 });
        assert!(e.to_string().contains("use 4096 or 8192"), "{e}");
        let e = with(Some(64 << 20), None, 4)
            .resolve(16 << 20, 4096)
            .unwrap_err();
        assert_eq!(
            e,
            MappedOptionError::CopySizeTooLarge {
                size: 64 << 20,
                span: 16 << 20,
                start: 4096
            }
        );
        // The whole (page-rounded) stretch in one copy is fine.
        assert!(with(Some(16 << 20), None, 4).resolve(16 << 20, 0).is_ok());
        assert!(with(Some(8192), None, 4).resolve(5000, 0).is_ok());
        for e in [
            MappedOptionError::CopySizeZero,
            MappedOptionError::CopySizeUnaligned { size: 5000 },
            MappedOptionError::CopySizeTooLarge {
                size: 1,
                span: 1,
                start: 0,
            },
            MappedOptionError::WindowNotMultiple {
                window: 1,
                copy_size: 4096,
            },
            MappedOptionError::RegisterThreads { threads: 0 },
        ] {
            let s = e.to_string();
            assert!(!s.contains("--"), "a library error names a CLI flag: {s}");
        }
    }

    #[test]
    fn bad_windows_and_thread_counts_are_refused() {
        let e = with(Some(1 << 20), Some(0), 4).resolve(GIB, 0).unwrap_err();
        assert!(matches!(
            e,
            MappedOptionError::WindowNotMultiple { window: 0, .. }
        ));
        let e = with(Some(1 << 20), Some(3 << 19), 4)
            .resolve(GIB, 0)
            .unwrap_err();
        assert!(matches!(e, MappedOptionError::WindowNotMultiple { .. }));
        assert!(with(Some(1 << 20), Some(3 << 20), 4)
            .resolve(GIB, 0)
            .is_ok());
        for t in [0, MAX_REGISTER_THREADS + 1] {
            let e = with(None, None, t).resolve(GIB, 0).unwrap_err();
            assert_eq!(e, MappedOptionError::RegisterThreads { threads: t });
        }
    }
}
