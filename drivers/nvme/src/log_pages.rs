//! Log pages: Get Log Page, and the SMART / health and Error Information logs parsed.

use serde::Serialize;

use crate::admin_queue::ADMIN_DATA_LEN;
use crate::controller::Controller;
use crate::error::{NvmeError, Result};
use crate::spec::command::{admin_opcode, log_page};
use crate::spec::Sqe;

/// SMART / Health Information log (the fields tools show).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SmartLog {
    /// Critical warning bits.
    pub critical_warning: u8,
    /// Composite temperature in kelvin.
    pub temperature_k: u16,
    /// Available spare (percent).
    pub available_spare: u8,
    /// Percentage used.
    pub percentage_used: u8,
    /// Data units read (1000 x 512 bytes).
    pub data_units_read: u128,
    /// Data units written.
    pub data_units_written: u128,
    /// Host read commands.
    pub host_read_commands: u128,
    /// Host write commands.
    pub host_write_commands: u128,
    /// Power-on hours.
    pub power_on_hours: u128,
    /// Media and data integrity errors.
    pub media_errors: u128,
    /// Error information log entries.
    pub num_err_log_entries: u128,
}

impl SmartLog {
    /// Decode a 512-byte SMART / Health log page.
    pub fn parse(p: &[u8]) -> Option<SmartLog> {
        if p.len() < 512 {
            return None;
        }
        let u128_at = |o: usize| u128::from_le_bytes(p[o..o + 16].try_into().expect("16 bytes"));
        Some(SmartLog {
            critical_warning: p[0],
            temperature_k: u16::from_le_bytes([p[1], p[2]]),
            available_spare: p[3],
            percentage_used: p[5],
            data_units_read: u128_at(32),
            data_units_written: u128_at(48),
            host_read_commands: u128_at(64),
            host_write_commands: u128_at(80),
            power_on_hours: u128_at(128),
            media_errors: u128_at(160),
            num_err_log_entries: u128_at(176),
        })
    }
}

/// One Error Information log entry.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ErrorLogEntry {
    /// Error count (0 = unused entry).
    pub error_count: u64,
    /// Submission queue id.
    pub sqid: u16,
    /// Command id.
    pub cid: u16,
    /// Status field.
    pub status: u16,
    /// LBA.
    pub lba: u64,
    /// Namespace.
    pub nsid: u32,
}

impl ErrorLogEntry {
    /// Decode the 64-byte entries of an Error Information page, skipping unused ones.
    pub fn parse_all(p: &[u8]) -> Vec<ErrorLogEntry> {
        p.chunks_exact(64)
            .filter_map(|e| {
                let error_count = u64::from_le_bytes(e[0..8].try_into().ok()?);
                (error_count != 0).then(|| ErrorLogEntry {
                    error_count,
                    sqid: u16::from_le_bytes([e[8], e[9]]),
                    cid: u16::from_le_bytes([e[10], e[11]]),
                    status: u16::from_le_bytes([e[12], e[13]]) >> 1,
                    lba: u64::from_le_bytes(e[16..24].try_into().expect("8 bytes")),
                    nsid: u32::from_le_bytes(e[24..28].try_into().expect("4 bytes")),
                })
            })
            .collect()
    }
}

impl Controller {
    /// Get Log Page `lid` for `nsid` (0xffffffff = controller), `len` bytes (a multiple of 4, at
    /// most 8 KiB).
    pub fn get_log_page(&self, lid: u8, nsid: u32, len: usize) -> Result<Vec<u8>> {
        if len == 0 || len % 4 != 0 || len > ADMIN_DATA_LEN {
            return Err(NvmeError::InvalidArgument(
                "log page length must be a positive multiple of 4 of at most 8192 bytes",
            ));
        }
        let mut a = self.admin();
        let numd = (len / 4 - 1) as u32;
        let mut sqe = Sqe::new(admin_opcode::GET_LOG_PAGE);
        sqe.nsid = nsid;
        sqe.prp1 = a.data.iova();
        if len > 4096 {
            sqe.prp2 = a.data.iova() + 4096;
        }
        sqe.cdw10 = (numd & 0xffff) << 16 | lid as u32;
        sqe.cdw11 = numd >> 16;
        a.execute(sqe, "Get Log Page", self.options().admin_timeout)?;
        // SAFETY: the admin data buffer holds ADMIN_DATA_LEN >= len bytes, the command completed,
        // and the admin lock is held.
        let bytes = unsafe { std::slice::from_raw_parts(a.data.as_ptr(), len) };
        Ok(bytes.to_vec())
    }

    /// SMART / Health Information log (controller-wide).
    pub fn smart_log(&self) -> Result<SmartLog> {
        let p = self.get_log_page(log_page::SMART_HEALTH, 0xffff_ffff, 512)?;
        SmartLog::parse(&p).ok_or(NvmeError::InvalidArgument("short SMART log page"))
    }

    /// Error Information log entries in use (up to ELPE + 1, at most 128).
    pub fn error_log(&self) -> Result<Vec<ErrorLogEntry>> {
        let n = (self.info().elpe as usize + 1).min(ADMIN_DATA_LEN / 64);
        let p = self.get_log_page(log_page::ERROR_INFORMATION, 0xffff_ffff, n * 64)?;
        Ok(ErrorLogEntry::parse_all(&p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_log_parses() {
        let mut p = vec![0u8; 512];
        p[0] = 0x4;
        p[1..3].copy_from_slice(&323u16.to_le_bytes());
        p[3] = 100;
        p[5] = 3;
        p[32] = 7;
        p[128] = 9;
        let s = SmartLog::parse(&p).unwrap();
        assert_eq!(
            (
                s.critical_warning,
                s.temperature_k,
                s.available_spare,
                s.percentage_used
            ),
            (4, 323, 100, 3)
        );
        assert_eq!(s.data_units_read, 7);
        assert_eq!(s.power_on_hours, 9);
        assert!(SmartLog::parse(&p[..100]).is_none());
    }

    #[test]
    fn error_log_skips_unused_entries() {
        let mut p = vec![0u8; 128];
        p[64..72].copy_from_slice(&5u64.to_le_bytes());
        p[72..74].copy_from_slice(&1u16.to_le_bytes());
        p[74..76].copy_from_slice(&9u16.to_le_bytes());
        p[76..78].copy_from_slice(&((0x80u16) << 1).to_le_bytes());
        let v = ErrorLogEntry::parse_all(&p);
        assert_eq!(v.len(), 1);
        assert_eq!(
            (v[0].error_count, v[0].sqid, v[0].cid, v[0].status),
            (5, 1, 9, 0x80)
        );
    }
}
