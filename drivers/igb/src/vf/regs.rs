//! 82576 virtual function registers (its own BAR 0; Linux `igbvf/regs.h`, `igbvf/mbx.h`) and
//! the mailbox message words (`e1000_mbx.h`). The queue registers are [`QueueRegs::VF`].
//!
//! [`QueueRegs::VF`]: crate::regs::QueueRegs::VF

/// VF control (VTCTRL): RST (bit 26) resets the VF's queues.
pub const VTCTRL: usize = 0x0000;
/// VF status (VTSTATUS): LU in bit 1, as the PF's STATUS.
pub const VTSTATUS: usize = 0x0008;
/// Extended interrupt mask clear.
pub const VTEIMC: usize = 0x1528;
/// Extended interrupt auto clear.
pub const VTEIAC: usize = 0x152c;
/// Mailbox memory: 16 words shared with the PF.
pub const VMBMEM: usize = 0x0800;
/// Words of the mailbox memory.
pub const VMBMEM_WORDS: usize = 16;
/// VF-to-PF mailbox control.
pub const V2PMAILBOX: usize = 0x0c40;
/// Length of a VF's BAR 0.
pub const VF_BAR0_LEN: u64 = 16 * 1024;

/// V2PMAILBOX: post the message in VMBMEM to the PF.
pub const MBX_REQ: u32 = 1 << 0;
/// V2PMAILBOX: the PF's message was read.
pub const MBX_ACK: u32 = 1 << 1;
/// V2PMAILBOX: the VF holds VMBMEM.
pub const MBX_VFU: u32 = 1 << 2;
/// V2PMAILBOX: the PF holds VMBMEM.
pub const MBX_PFU: u32 = 1 << 3;
/// V2PMAILBOX: the PF wrote a message (clear on read).
pub const MBX_PFSTS: u32 = 1 << 4;
/// V2PMAILBOX: the PF acknowledged the VF's message (clear on read).
pub const MBX_PFACK: u32 = 1 << 5;
/// V2PMAILBOX: the PF is in reset (set by a PF reset, cleared once its driver is up).
pub const MBX_RSTI: u32 = 1 << 6;
/// V2PMAILBOX: the PF's reset is done (clear on read).
pub const MBX_RSTD: u32 = 1 << 7;
/// V2PMAILBOX bits cleared by a read.
pub const MBX_R2C: u32 = MBX_PFSTS | MBX_PFACK | MBX_RSTD;

/// Message word 0: the request was done.
pub const MSG_ACK: u32 = 0x8000_0000;
/// Message word 0: the request was refused.
pub const MSG_NACK: u32 = 0x4000_0000;
/// Message word 0: the VF may send (it completed a RESET).
pub const MSG_CTS: u32 = 0x2000_0000;
/// Message word 0: the request's extra information (bits 23:16).
pub const MSG_INFO_SHIFT: u32 = 16;
/// Message type: the VF reset; the answer carries its MAC.
pub const VF_RESET: u32 = 0x01;
/// Message type: set the VF's MAC.
pub const VF_SET_MAC_ADDR: u32 = 0x02;
/// Message type: add (info 1) or remove (info 0) a VLAN id.
pub const VF_SET_VLAN: u32 = 0x04;
/// Message type of the PF's own messages (e.g. its link or reset news), not an answer.
pub const PF_CONTROL_MSG: u32 = 0x0100;
/// Message type: the largest frame the VF receives (bytes, FCS included).
pub const VF_SET_LPE: u32 = 0x05;
