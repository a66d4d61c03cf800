//! Errors across the C boundary: negative errno values, `ubd_strerror`, the thread's last
//! error message, and the guard every entry point runs in (no panic crosses into C).

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use ubdirect::dma::CoreError;
use ubdirect::nvme::NvmeError;
use ubdirect::EnvError;

/// A failed call: the errno it returns (positive here, negated at the boundary) and the
/// library's message.
#[derive(Debug)]
pub(crate) struct Error {
    pub(crate) errno: c_int,
    pub(crate) message: String,
}

impl Error {
    /// An error with `errno` and `message`.
    pub(crate) fn new(errno: c_int, message: impl Into<String>) -> Error {
        Error {
            errno,
            message: message.into(),
        }
    }

    /// A NULL pointer where `what` was needed.
    pub(crate) fn null(what: &str) -> Error {
        Error::new(libc::EINVAL, format!("{what} is NULL"))
    }
}

impl From<NvmeError> for Error {
    fn from(e: NvmeError) -> Error {
        Error::new(nvme_errno(&e), e.to_string())
    }
}

impl From<CoreError> for Error {
    fn from(e: CoreError) -> Error {
        Error::new(core_errno(&e), e.to_string())
    }
}

impl From<EnvError> for Error {
    fn from(e: EnvError) -> Error {
        let errno = match &e {
            EnvError::Address { .. } | EnvError::Duplicate { .. } => libc::EINVAL,
            EnvError::NoDevice | EnvError::NoPool | EnvError::PoolConfig(_) => libc::EINVAL,
            EnvError::Hugepages(_) => libc::ENOMEM,
            EnvError::Domain(c) | EnvError::Device { source: c, .. } | EnvError::Pool(c) => {
                core_errno(c)
            }
            EnvError::Controller { source, .. } => nvme_errno(source),
            _ => libc::EIO,
        };
        Error::new(errno, e.to_string())
    }
}

/// The errno of a core error.
pub(crate) fn core_errno(e: &CoreError) -> c_int {
    match e {
        CoreError::NoSuchDevice { .. } => libc::ENODEV,
        CoreError::VfioUnavailable { .. } | CoreError::NoIommuGroup { .. } => libc::ENODEV,
        CoreError::NotBoundToVfio { .. } | CoreError::Unsupported { .. } => libc::ENODEV,
        CoreError::PermissionDenied { .. } => libc::EACCES,
        CoreError::MemlockTooLow { .. } | CoreError::IovaExhausted { .. } => libc::ENOMEM,
        CoreError::PoolExhausted { .. } | CoreError::HugePages(_) => libc::ENOMEM,
        CoreError::GroupBusy { .. } | CoreError::AlreadyOpen { .. } => libc::EBUSY,
        CoreError::DeviceClaimed { .. } | CoreError::DeviceMappedOutsideDriver { .. } => {
            libc::EBUSY
        }
        CoreError::DeviceResetting { .. } => libc::EAGAIN,
        CoreError::InvalidArgument(_) | CoreError::ForeignDomain { .. } => libc::EINVAL,
        CoreError::DeviceGone { .. } => libc::ENODEV,
        _ => libc::EIO,
    }
}

/// The errno of an NVMe driver error.
pub(crate) fn nvme_errno(e: &NvmeError) -> c_int {
    match e {
        NvmeError::Core(c) => core_errno(c),
        NvmeError::NotNvme { .. } | NvmeError::DeviceGone { .. } => libc::ENODEV,
        NvmeError::QueueFull { .. } => libc::EAGAIN,
        NvmeError::NamespaceMissing { .. } => libc::ENOENT,
        NvmeError::LbaOutOfRange { .. } => libc::ERANGE,
        NvmeError::LengthNotBlockMultiple { .. } | NvmeError::OffsetNotBlockAligned { .. } => {
            libc::EINVAL
        }
        NvmeError::BufferTooSmall { .. } | NvmeError::Prp(_) => libc::EINVAL,
        NvmeError::RequestTooLarge { .. } | NvmeError::TransferTooLarge { .. } => libc::E2BIG,
        NvmeError::InvalidArgument(_) => libc::EINVAL,
        NvmeError::Timeout { .. } | NvmeError::ReadyTimeout { .. } => libc::ETIMEDOUT,
        NvmeError::Unsupported { .. } => libc::ENOTSUP,
        NvmeError::NoQueuesLeft { .. } => libc::EBUSY,
        _ => libc::EIO,
    }
}

thread_local! {
    /// The message of this thread's last failed call.
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Keep `message` as this thread's last error message.
pub(crate) fn set_last(message: &str) {
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

/// The text of a panic payload.
fn panic_text(p: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = p.downcast_ref::<&str>() {
        s
    } else if let Some(s) = p.downcast_ref::<String>() {
        s
    } else {
        "a panic without a message"
    }
}

/// Run an entry point's body: its value, or on an error the negative errno (the message kept
/// for `ubd_last_error_message`); a panic becomes `-EIO` with its message.
pub(crate) fn guard(f: impl FnOnce() -> Result<c_int, Error>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_last(&e.message);
            -e.errno
        }
        Err(p) => {
            set_last(&format!(
                "internal error in libubdirect (a bug; please report it): {}",
                panic_text(p.as_ref())
            ));
            -libc::EIO
        }
    }
}

/// Run an entry point that returns a value and cannot fail: `fallback` on a panic (the
/// message kept as for [`guard`]).
pub(crate) fn guard_value<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            set_last(&format!(
                "internal error in libubdirect (a bug; please report it): {}",
                panic_text(p.as_ref())
            ));
            fallback
        }
    }
}

/// The name of a negative errno value returned by a `ubd_` call (`err` may also be given
/// positive). The string is static; an unknown value gives "unknown error".
#[no_mangle]
pub extern "C" fn ubd_strerror(err: c_int) -> *const c_char {
    let text: &'static CStr = match err.unsigned_abs() as c_int {
        0 => c"success",
        libc::EINVAL => c"invalid argument",
        libc::ENODEV => c"no such device",
        libc::ENOENT => c"no such namespace",
        libc::ENOMEM => c"out of memory (pool, hugepages or locked memory)",
        libc::EBUSY => c"busy",
        libc::EAGAIN => c"try again (queue full: process completions first)",
        libc::EACCES => c"permission denied",
        libc::ERANGE => c"LBA range out of the namespace",
        libc::E2BIG => c"request too large",
        libc::ETIMEDOUT => c"timed out",
        libc::ENOTSUP => c"not supported",
        libc::EIO => c"I/O error",
        _ => c"unknown error",
    };
    text.as_ptr()
}

/// The library's message for the last call that failed on the calling thread (what went wrong
/// and what to do), or "" when none has. Valid until the next failing call on this thread;
/// copy it to keep it.
#[no_mangle]
pub extern "C" fn ubd_last_error_message() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}
