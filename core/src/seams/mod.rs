//! The seams the pipeline and embedders are generic over: a block queue (storage) and a sink
//! (GPU copy, BAR, null), and a NIC's queue pairs. Buffers move in on submit and come back in
//! the completion.

mod block;
mod in_flight;
mod nic;
mod sink;

pub use block::{BlockCompletion, BlockError, BlockErrorKind, BlockQueue};
pub use in_flight::InFlight;
pub use nic::{Nic, NicError, NicErrorKind, NicFrame, NicQueue, NicStats, MIN_FRAME};
pub use sink::{Sink, SinkError, SinkErrorKind};
