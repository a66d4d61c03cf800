//! NVMe/TCP host (NVMe/TCP transport specification 1.0): PDUs ([`pdu`]), digests
//! ([`digest`]), fabrics commands ([`fabrics`]), the validating receive state machine ([`rx`]).
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
pub mod digest;
pub mod error;
pub mod fabrics;
pub mod host;
pub mod ic;
pub mod pdu;
pub mod queue;
#[cfg(test)]
mod queue_tests;
pub mod rx;
#[cfg(test)]
mod rx_tests;
mod send;
#[cfg(test)]
mod send_tests;
pub mod sock;
#[cfg(test)]
mod test_pdus;

pub use error::{TcpError, TcpResult};
