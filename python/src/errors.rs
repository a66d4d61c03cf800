//! Errors in the Python package's terms: a kind (which `ubdirect` exception class) and the
//! library's message. The classes live in `ubdirect/_errors.py` so that they can inherit from
//! the matching built-in (ValueError, OSError) as well as from `ubdirect.Error`.

use pyo3::prelude::*;
use pyo3::types::PyType;

/// Which Python exception class an error becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A bad argument (`ubdirect.InvalidArgument`, also a ValueError).
    InvalidArgument,
    /// Opening or reading a file failed (`ubdirect.FileError`, also an OSError).
    File,
    /// A device (NVMe controller, VFIO, DMA domain, hugepages) failed (`ubdirect.DeviceError`).
    Device,
    /// No CUDA driver or no such GPU (`ubdirect.CudaUnavailable`).
    CudaUnavailable,
    /// A CUDA call failed or timed out (`ubdirect.CudaError`).
    Cuda,
}

impl Kind {
    fn class_name(self) -> &'static str {
        match self {
            Kind::InvalidArgument => "InvalidArgument",
            Kind::File => "FileError",
            Kind::Device => "DeviceError",
            Kind::CudaUnavailable => "CudaUnavailable",
            Kind::Cuda => "CudaError",
        }
    }
}

/// An error on its way to Python.
#[derive(Debug)]
pub struct Error {
    /// The exception class.
    pub kind: Kind,
    /// The message, in the library's words.
    pub msg: String,
}

/// Results of the package's Rust side.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error of `kind` saying `msg`.
    pub fn new(kind: Kind, msg: impl Into<String>) -> Error {
        Error {
            kind,
            msg: msg.into(),
        }
    }

    /// A bad argument.
    pub fn invalid(msg: impl Into<String>) -> Error {
        Error::new(Kind::InvalidArgument, msg)
    }

    /// A file operation `what` failed with `e`.
    pub fn file(what: impl std::fmt::Display, e: std::io::Error) -> Error {
        Error::new(Kind::File, format!("{what}: {e}"))
    }
}

impl From<ubdirect::cuda::CudaError> for Error {
    fn from(e: ubdirect::cuda::CudaError) -> Error {
        use ubdirect::cuda::CudaError as C;
        let kind = match e {
            C::NoDriver | C::NoNvrtc | C::NoDevice { .. } => Kind::CudaUnavailable,
            C::Invalid(_) => Kind::InvalidArgument,
            _ => Kind::Cuda,
        };
        Error::new(kind, e.to_string())
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        Python::attach(|py| {
            let class = py
                .import("ubdirect._errors")
                .and_then(|m| m.getattr(e.kind.class_name()))
                .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
            match class {
                Ok(c) => PyErr::from_type(c, e.msg),
                Err(import_err) => import_err,
            }
        })
    }
}
