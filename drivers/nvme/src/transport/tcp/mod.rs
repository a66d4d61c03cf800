//! NVMe/TCP host (NVMe/TCP transport specification 1.0): the controller ([`ctrl`]), its I/O
//! queues ([`queue`]), fabrics commands ([`fabrics`]). The wire format (PDUs, digests, the
//! validating receive state machine, the socket calls) is private to this crate; the feature
//! `internals` (off by default, for the project's fuzz targets) makes it public.
//!
//! In-band authentication (DH-HMAC-CHAP) is [`auth`]; TLS (NVMe/TCP secure channels) is out of
//! scope.

pub mod addr;
mod assoc;
pub mod auth;
pub mod block;
#[cfg(test)]
mod block_tests;
pub mod buf;
pub mod ctrl;
#[cfg(test)]
mod ctrl_tests;
#[cfg(feature = "internals")]
pub mod digest;
#[cfg(not(feature = "internals"))]
pub(crate) mod digest;
pub mod error;
pub mod fabrics;
pub mod host;
#[cfg(feature = "internals")]
pub mod ic;
#[cfg(not(feature = "internals"))]
pub(crate) mod ic;
#[cfg(feature = "internals")]
pub mod pdu;
#[cfg(not(feature = "internals"))]
pub(crate) mod pdu;
pub mod queue;
#[cfg(test)]
mod queue_tests;
#[cfg(feature = "internals")]
pub mod rx;
#[cfg(not(feature = "internals"))]
pub(crate) mod rx;
#[cfg(test)]
mod rx_tests;
mod send;
#[cfg(test)]
mod send_tests;
#[cfg(feature = "internals")]
pub mod sock;
#[cfg(not(feature = "internals"))]
pub(crate) mod sock;
#[cfg(test)]
mod test_pdus;

pub use error::{TcpError, TcpResult};
pub use rx::Negotiated;
