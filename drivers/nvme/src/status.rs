//! Completion status decoding: SCT/SC with their spec names, CRD, More and DNR.

use std::fmt;

/// Status Code Type values.
pub mod sct {
    /// Generic Command Status.
    pub const GENERIC: u8 = 0;
    /// Command Specific Status.
    pub const COMMAND_SPECIFIC: u8 = 1;
    /// Media and Data Integrity Errors.
    pub const MEDIA: u8 = 2;
    /// Path Related Status.
    pub const PATH: u8 = 3;
    /// Vendor Specific.
    pub const VENDOR: u8 = 7;
}

/// A decoded completion status (the CQE status field without the phase tag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmeStatus {
    /// Status Code Type.
    pub sct: u8,
    /// Status Code.
    pub sc: u8,
    /// Command Retry Delay index.
    pub crd: u8,
    /// More information in the Error Information log page.
    pub more: bool,
    /// Do Not Retry.
    pub dnr: bool,
}

impl NvmeStatus {
    /// Decode the 16-bit CQE status word (bit 0 is the phase tag and is ignored).
    pub fn from_cqe_status(status: u16) -> NvmeStatus {
        let f = status >> 1;
        NvmeStatus {
            sc: (f & 0xff) as u8,
            sct: ((f >> 8) & 0x7) as u8,
            crd: ((f >> 11) & 0x3) as u8,
            more: f & (1 << 13) != 0,
            dnr: f & (1 << 14) != 0,
        }
    }

    /// Encode back into a CQE status word with the given phase (used by tests and mocks).
    pub fn to_cqe_status(self, phase: bool) -> u16 {
        let f = self.sc as u16
            | (self.sct as u16 & 7) << 8
            | (self.crd as u16 & 3) << 11
            | (self.more as u16) << 13
            | (self.dnr as u16) << 14;
        f << 1 | phase as u16
    }

    /// A status from SCT and SC with CRD/More/DNR clear.
    pub const fn new(sct: u8, sc: u8) -> NvmeStatus {
        NvmeStatus {
            sct,
            sc,
            crd: 0,
            more: false,
            dnr: false,
        }
    }

    /// Successful Completion.
    pub fn is_success(self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    /// Name of the status code type.
    pub fn sct_name(self) -> &'static str {
        match self.sct {
            sct::GENERIC => "generic command status",
            sct::COMMAND_SPECIFIC => "command specific status",
            sct::MEDIA => "media and data integrity error",
            sct::PATH => "path related status",
            sct::VENDOR => "vendor specific",
            _ => "reserved status code type",
        }
    }

    /// The spec name of the status code.
    pub fn name(self) -> &'static str {
        match self.sct {
            sct::GENERIC => generic_name(self.sc),
            sct::COMMAND_SPECIFIC => command_specific_name(self.sc),
            sct::MEDIA => media_name(self.sc),
            sct::PATH => path_name(self.sc),
            sct::VENDOR => "Vendor Specific",
            _ => "Reserved",
        }
    }
}

impl fmt::Display for NvmeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (SCT {:#x} {}, SC {:#04x})",
            self.name(),
            self.sct,
            self.sct_name(),
            self.sc
        )?;
        if self.dnr {
            f.write_str(", do not retry")?;
        }
        if self.more {
            f.write_str(", more in the error log page")?;
        }
        Ok(())
    }
}

fn generic_name(sc: u8) -> &'static str {
    match sc {
        0x00 => "Successful Completion",
        0x01 => "Invalid Command Opcode",
        0x02 => "Invalid Field in Command",
        0x03 => "Command ID Conflict",
        0x04 => "Data Transfer Error",
        0x05 => "Commands Aborted due to Power Loss Notification",
        0x06 => "Internal Error",
        0x07 => "Command Abort Requested",
        0x08 => "Command Aborted due to SQ Deletion",
        0x09 => "Command Aborted due to Failed Fused Command",
        0x0a => "Command Aborted due to Missing Fused Command",
        0x0b => "Invalid Namespace or Format",
        0x0c => "Command Sequence Error",
        0x0d => "Invalid SGL Segment Descriptor",
        0x0e => "Invalid Number of SGL Descriptors",
        0x0f => "Data SGL Length Invalid",
        0x10 => "Metadata SGL Length Invalid",
        0x11 => "SGL Descriptor Type Invalid",
        0x12 => "Invalid Use of Controller Memory Buffer",
        0x13 => "PRP Offset Invalid",
        0x14 => "Atomic Write Unit Exceeded",
        0x15 => "Operation Denied",
        0x16 => "SGL Offset Invalid",
        0x18 => "Host Identifier Inconsistent Format",
        0x19 => "Keep Alive Timer Expired",
        0x1a => "Keep Alive Timeout Invalid",
        0x1b => "Command Aborted due to Preempt and Abort",
        0x1c => "Sanitize Failed",
        0x1d => "Sanitize In Progress",
        0x1e => "SGL Data Block Granularity Invalid",
        0x1f => "Command Not Supported for Queue in CMB",
        0x20 => "Namespace is Write Protected",
        0x21 => "Command Interrupted",
        0x22 => "Transient Transport Error",
        0x23 => "Command Prohibited by Command and Feature Lockdown",
        0x24 => "Admin Command Media Not Ready",
        0x80 => "LBA Out of Range",
        0x81 => "Capacity Exceeded",
        0x82 => "Namespace Not Ready",
        0x83 => "Reservation Conflict",
        0x84 => "Format In Progress",
        0x85 => "Invalid Value Size",
        0x86 => "Invalid Key Size",
        0x87 => "KV Key Does Not Exist",
        0x88 => "Unrecovered Error",
        0x89 => "Key Exists",
        0xc0..=0xff => "Vendor Specific",
        _ => "Reserved",
    }
}

fn command_specific_name(sc: u8) -> &'static str {
    match sc {
        0x00 => "Completion Queue Invalid",
        0x01 => "Invalid Queue Identifier",
        0x02 => "Invalid Queue Size",
        0x03 => "Abort Command Limit Exceeded",
        0x05 => "Asynchronous Event Request Limit Exceeded",
        0x06 => "Invalid Firmware Slot",
        0x07 => "Invalid Firmware Image",
        0x08 => "Invalid Interrupt Vector",
        0x09 => "Invalid Log Page",
        0x0a => "Invalid Format",
        0x0b => "Firmware Activation Requires Conventional Reset",
        0x0c => "Invalid Queue Deletion",
        0x0d => "Feature Identifier Not Saveable",
        0x0e => "Feature Not Changeable",
        0x0f => "Feature Not Namespace Specific",
        0x10 => "Firmware Activation Requires NVM Subsystem Reset",
        0x11 => "Firmware Activation Requires Controller Level Reset",
        0x12 => "Firmware Activation Requires Maximum Time Violation",
        0x13 => "Firmware Activation Prohibited",
        0x14 => "Overlapping Range",
        0x15 => "Namespace Insufficient Capacity",
        0x16 => "Namespace Identifier Unavailable",
        0x18 => "Namespace Already Attached",
        0x19 => "Namespace Is Private",
        0x1a => "Namespace Not Attached",
        0x1b => "Thin Provisioning Not Supported",
        0x1c => "Controller List Invalid",
        0x1d => "Device Self-test In Progress",
        0x1e => "Boot Partition Write Prohibited",
        0x1f => "Invalid Controller Identifier",
        0x20 => "Invalid Secondary Controller State",
        0x21 => "Invalid Number of Controller Resources",
        0x22 => "Invalid Resource Identifier",
        0x23 => "Sanitize Prohibited While Persistent Memory Region is Enabled",
        0x24 => "ANA Group Identifier Invalid",
        0x25 => "ANA Attach Failed",
        0x80 => "Conflicting Attributes",
        0x81 => "Invalid Protection Information",
        0x82 => "Attempted Write to Read Only Range",
        // The Zoned Namespace command set's I/O statuses (NVMe ZNS Command Set 1.1, 4.1.1.3):
        // reserved in the NVM command set, so a controller only returns them for a zoned
        // namespace.
        0xb8 => "Zone Boundary Error",
        0xb9 => "Zone Is Full",
        0xba => "Zone Is Read Only",
        0xbb => "Zone Is Offline",
        0xbc => "Zone Invalid Write",
        0xbd => "Too Many Active Zones",
        0xbe => "Too Many Open Zones",
        0xbf => "Invalid Zone State Transition",
        0xc0..=0xff => "Vendor Specific",
        _ => "Reserved",
    }
}

fn media_name(sc: u8) -> &'static str {
    match sc {
        0x80 => "Write Fault",
        0x81 => "Unrecovered Read Error",
        0x82 => "End-to-end Guard Check Error",
        0x83 => "End-to-end Application Tag Check Error",
        0x84 => "End-to-end Reference Tag Check Error",
        0x85 => "Compare Failure",
        0x86 => "Access Denied",
        0x87 => "Deallocated or Unwritten Logical Block",
        0xc0..=0xff => "Vendor Specific",
        _ => "Reserved",
    }
}

fn path_name(sc: u8) -> &'static str {
    match sc {
        0x00 => "Internal Path Error",
        0x01 => "Asymmetric Access Persistent Loss",
        0x02 => "Asymmetric Access Inaccessible",
        0x03 => "Asymmetric Access Transition",
        0x60 => "Controller Pathing Error",
        0x70 => "Host Pathing Error",
        0x71 => "Command Aborted By Host",
        0xc0..=0xff => "Vendor Specific",
        _ => "Reserved",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn decodes_lba_out_of_range_with_dnr() {
        // SC 0x80, SCT 0, DNR, phase 1.
        let st = NvmeStatus::from_cqe_status((0x80 | 1 << 14) << 1 | 1);
        assert_eq!(st.sc, 0x80);
        assert_eq!(st.sct, 0);
        assert!(st.dnr);
        assert!(!st.more);
        assert!(!st.is_success());
        assert_eq!(st.name(), "LBA Out of Range");
        assert_eq!(
            st.to_string(),
            "LBA Out of Range (SCT 0x0 generic command status, SC 0x80), do not retry"
        );
    }

    #[test]
    fn names_every_status_code_type() {
        assert_eq!(NvmeStatus::new(1, 0x01).name(), "Invalid Queue Identifier");
        assert_eq!(NvmeStatus::new(2, 0x81).name(), "Unrecovered Read Error");
        assert_eq!(NvmeStatus::new(3, 0x71).name(), "Command Aborted By Host");
        assert_eq!(NvmeStatus::new(7, 0x12).name(), "Vendor Specific");
        assert_eq!(NvmeStatus::new(5, 0x12).name(), "Reserved");
        // Zoned namespaces: a random write into a full zone, or not at its write pointer.
        assert_eq!(NvmeStatus::new(1, 0xb9).name(), "Zone Is Full");
        assert_eq!(NvmeStatus::new(1, 0xbc).name(), "Zone Invalid Write");
        assert_eq!(NvmeStatus::new(0, 0x17).name(), "Reserved");
        assert!(NvmeStatus::from_cqe_status(1).is_success());
        assert!(NvmeStatus::from_cqe_status(0).is_success());
        let more = NvmeStatus::from_cqe_status(((1 << 13) | 0x06) << 1);
        assert!(more.more);
        assert!(more.to_string().contains("error log page"));
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(sc in any::<u8>(), sct in 0u8..8, crd in 0u8..4, more: bool, dnr: bool, phase: bool) {
            let st = NvmeStatus { sct, sc, crd, more, dnr };
            let raw = st.to_cqe_status(phase);
            prop_assert_eq!(raw & 1 == 1, phase);
            prop_assert_eq!(NvmeStatus::from_cqe_status(raw), st);
        }
    }
}
