//! [`IoFlags`]: per-request options of Read and Write, instead of bare booleans.

use crate::spec::command::RW_FUA;

bitflags::bitflags! {
    /// Options of a Read or Write request; the bits are those of the command's CDW12.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct IoFlags: u32 {
        /// Force Unit Access: the data reaches non-volatile media before the completion.
        const FUA = RW_FUA;
        /// Limited Retry: the controller applies limited error recovery (fails faster).
        const LIMITED_RETRY = 1 << 31;
    }
}
