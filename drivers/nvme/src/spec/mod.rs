//! NVMe wire formats: registers, queue entries, identify structures, opcodes.

pub mod command;
pub mod identify;
pub mod regs;

pub use command::{Cqe, Sqe};
pub use identify::{IdentifyController, IdentifyNamespace, LbaFormat};
