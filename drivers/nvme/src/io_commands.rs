//! The NVM I/O commands of [`IoQueuePair`]: validation before anything is queued, then
//! Read / Write (FUA) / Flush / Write Zeroes / Dataset Management (deallocate).

use crate::controller::PAGE_SIZE;
use crate::error::NvmeError;
use crate::io_flags::IoFlags;
use crate::io_queue::{IoQueuePair, NsLimits, Request};
use crate::io_types::{IoBuf, IoData, IoPayload, Rejected, SgList};
use crate::namespace::{Lba, Namespace};
use crate::spec::command::{io_opcode, DSM_ATTR_DEALLOCATE};
use crate::spec::Sqe;
use ubdirect_core::{DomainId, UbRegion};

/// Most blocks in one command's 16-bit zero-based NLB field.
const MAX_NLB: u64 = 1 << 16;

/// Check the LBA range and length of a data transfer; returns the number of blocks.
#[inline]
pub(crate) fn check_range(ns: &NsLimits, slba: u64, len: usize) -> Result<u64, NvmeError> {
    if len == 0 || len & (ns.lba_size as usize - 1) != 0 {
        return Err(NvmeError::LengthNotBlockMultiple {
            nsid: ns.nsid,
            len,
            lba_size: ns.lba_size,
        });
    }
    let nlb = (len >> ns.lba_shift) as u64;
    check_lbas(ns, slba, nlb)?;
    Ok(nlb)
}

#[inline]
pub(crate) fn check_lbas(ns: &NsLimits, slba: u64, nlb: u64) -> Result<(), NvmeError> {
    match slba.checked_add(nlb) {
        Some(end) if end <= ns.nsze && nlb > 0 => Ok(()),
        _ => Err(NvmeError::LbaOutOfRange {
            nsid: ns.nsid,
            slba,
            nlb,
            nsze: ns.nsze,
        }),
    }
}

/// The buffer's region must be mapped in the device's domain and reachable and, when the
/// device reads the buffer (`device_reads`: a Write), hold a file region's file as it is now
/// ([`ubdirect_core::UbRegion::check_file`]: an fstat for file regions only).
#[inline]
fn check_region(region: &UbRegion, domain: DomainId, device_reads: bool) -> Result<(), NvmeError> {
    region.check_dma(domain)?;
    if device_reads {
        region.check_file()?;
    }
    Ok(())
}

/// The buffer must pass [`check_region`], and the window's IOVA be dword aligned (PRP entry
/// rule).
#[inline]
fn check_one(buf: &IoBuf, domain: DomainId, device_reads: bool) -> Result<(), NvmeError> {
    check_region(buf.buf().region(), domain, device_reads)?;
    let iova = buf.iova();
    if iova & 3 != 0 {
        return Err(crate::prp::PrpError::Misaligned { iova }.into());
    }
    Ok(())
}

fn check_sg(
    sg: &SgList,
    len: usize,
    domain: DomainId,
    device_reads: bool,
) -> Result<(), NvmeError> {
    let ps = PAGE_SIZE as u64;
    let n = sg.len();
    for (i, s) in sg.iter().enumerate() {
        check_region(s.buf.region(), domain, device_reads)?;
        if s.offset.checked_add(s.len).is_none_or(|e| e > s.buf.len()) || s.len == 0 {
            return Err(NvmeError::BufferTooSmall {
                need: s.offset.saturating_add(s.len),
                have: s.buf.len(),
                offset: s.offset,
            });
        }
        let start = s.buf.iova() + s.offset as u64;
        let end = start + s.len as u64;
        let bad_start = if i == 0 {
            start & 3 != 0
        } else {
            start % ps != 0
        };
        if i == 0 && bad_start {
            return Err(crate::prp::PrpError::Misaligned { iova: start }.into());
        }
        if bad_start || (i + 1 < n && end % ps != 0) {
            return Err(crate::prp::PrpError::SegmentNotPageAligned {
                index: i,
                iova: start,
                len: s.len,
                page_size: PAGE_SIZE,
            }
            .into());
        }
    }
    let total = sg.total_len();
    if total < len {
        return Err(NvmeError::BufferTooSmall {
            need: len,
            have: total,
            offset: 0,
        });
    }
    Ok(())
}

impl<P: IoPayload> IoQueuePair<P> {
    #[inline]
    fn data_cmd(
        &mut self,
        opcode: u8,
        ns: &Namespace,
        slba: Lba,
        bufs: P,
        flags: IoFlags,
        tag: u64,
    ) -> Result<(), Rejected<P>> {
        let device_reads = opcode == io_opcode::WRITE;
        let checked = (|| {
            let ns = self.ns_limits(ns.nsid())?;
            let len = match bufs.data() {
                IoData::One(b) => {
                    check_one(b, self.domain, device_reads)?;
                    b.len()
                }
                IoData::Sg(sg) => {
                    let len = sg.total_len();
                    check_sg(sg, len, self.domain, device_reads)?;
                    len
                }
                IoData::None => {
                    return Err(NvmeError::InvalidArgument("a data transfer needs a buffer"))
                }
            };
            let nlb = check_range(&ns, slba.0, len)?;
            Ok((ns, nlb))
        })();
        match checked {
            Ok((ns, nlb)) => {
                let max_blocks = (ns.max_cmd >> ns.lba_shift) as u64;
                let req = Request {
                    opcode,
                    ns,
                    slba: slba.0,
                    nblocks: nlb,
                    max_blocks,
                    cdw12_flags: flags.bits(),
                    data_offset: 0,
                    tag,
                };
                self.queue_request(req, bufs)
            }
            Err(error) => Err(Rejected { bufs, error }),
        }
    }

    /// Queue a read from `slba` of `ns` into `buf`'s window (its length, a multiple of the LBA
    /// size, is the transfer). Requests above the per-command limit become several commands
    /// completed as one. Checked against the namespace before anything is queued: when refused
    /// the buffer comes back with the reason (a validation error, or [`NvmeError::QueueFull`]:
    /// poll, then resubmit). The request reaches the device at the next [`Self::ring`].
    #[inline]
    pub fn submit_read(
        &mut self,
        ns: &Namespace,
        slba: Lba,
        buf: impl Into<P>,
        flags: IoFlags,
        tag: u64,
    ) -> Result<(), Rejected<P>> {
        self.data_cmd(io_opcode::READ, ns, slba, buf.into(), flags, tag)
    }

    /// Queue a write of `buf`'s window to `slba` of `ns` ([`IoFlags::FUA`]: on media before it
    /// completes). Same rules as [`IoQueuePair::submit_read`].
    #[inline]
    pub fn submit_write(
        &mut self,
        ns: &Namespace,
        slba: Lba,
        buf: impl Into<P>,
        flags: IoFlags,
        tag: u64,
    ) -> Result<(), Rejected<P>> {
        self.data_cmd(io_opcode::WRITE, ns, slba, buf.into(), flags, tag)
    }

    /// Queue a read of the whole scatter list (its total length) from `slba`. The first
    /// segment may start at any dword; later ones must start, and earlier ones end, on 4 KiB.
    pub fn submit_readv(
        &mut self,
        ns: &Namespace,
        slba: Lba,
        sg: impl Into<P>,
        flags: IoFlags,
        tag: u64,
    ) -> Result<(), Rejected<P>> {
        self.data_cmd(io_opcode::READ, ns, slba, sg.into(), flags, tag)
    }

    /// Queue a write of the whole scatter list to `slba`. Same rules as
    /// [`IoQueuePair::submit_readv`].
    pub fn submit_writev(
        &mut self,
        ns: &Namespace,
        slba: Lba,
        sg: impl Into<P>,
        flags: IoFlags,
        tag: u64,
    ) -> Result<(), Rejected<P>> {
        self.data_cmd(io_opcode::WRITE, ns, slba, sg.into(), flags, tag)
    }

    /// Queue an NVMe Flush of `ns` (its volatile write cache to media). Its completion hands
    /// back `P::default()` (`IoBufs::None`); [`IoQueuePair::submit_flush_with`] for a payload
    /// type without a default.
    pub fn submit_flush(&mut self, ns: &Namespace, tag: u64) -> Result<(), Rejected<P>>
    where
        P: Default,
    {
        self.submit_flush_with(ns, P::default(), tag)
    }

    /// Queue an NVMe Flush of `ns` carrying `ctx`, which its completion hands back; `ctx`'s
    /// data, if any, is not transferred.
    pub fn submit_flush_with(
        &mut self,
        ns: &Namespace,
        ctx: P,
        tag: u64,
    ) -> Result<(), Rejected<P>> {
        let ns = match self.ns_limits(ns.nsid()) {
            Ok(ns) => ns,
            Err(error) => return Err(Rejected { bufs: ctx, error }),
        };
        let req = Request {
            opcode: io_opcode::FLUSH,
            ns,
            slba: 0,
            nblocks: 1,
            max_blocks: 1,
            cdw12_flags: 0,
            data_offset: 0,
            tag,
        };
        self.queue_request(req, ctx)
    }

    /// Queue Write Zeroes of `nlb` blocks at `slba` (split at 65536 blocks per command).
    pub fn submit_write_zeroes(
        &mut self,
        ns: &Namespace,
        slba: Lba,
        nlb: u64,
        tag: u64,
    ) -> Result<(), Rejected<P>>
    where
        P: Default,
    {
        let ns = self
            .ns_limits(ns.nsid())
            .and_then(|ns| check_lbas(&ns, slba.0, nlb).map(|_| ns))
            .map_err(|error| Rejected {
                bufs: P::default(),
                error,
            })?;
        let req = Request {
            opcode: io_opcode::WRITE_ZEROES,
            ns,
            slba: slba.0,
            nblocks: nlb,
            max_blocks: MAX_NLB,
            cdw12_flags: 0,
            data_offset: 0,
            tag,
        };
        self.queue_request(req, P::default())
    }

    /// Queue Dataset Management with the Deallocate attribute for `nlb` blocks at `slba`.
    pub fn submit_deallocate(
        &mut self,
        ns: &Namespace,
        slba: Lba,
        nlb: u32,
        tag: u64,
    ) -> Result<(), Rejected<P>>
    where
        P: Default,
    {
        let slba = slba.0;
        let ns = self
            .ns_limits(ns.nsid())
            .and_then(|ns| check_lbas(&ns, slba, nlb as u64).map(|_| ns))
            .map_err(|error| Rejected {
                bufs: P::default(),
                error,
            })?;
        let mut sqe = Sqe::new(io_opcode::DATASET_MANAGEMENT);
        sqe.nsid = ns.nsid;
        sqe.cdw10 = 0; // one range (NR is 0-based)
        sqe.cdw11 = DSM_ATTR_DEALLOCATE;
        // Range descriptor: context attributes (u32), length in blocks (u32), starting LBA (u64).
        self.queue_with_slot_page(sqe, 16, P::default(), tag, |page| {
            page[0] = (nlb as u64) << 32;
            page[1] = slba;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns512() -> NsLimits {
        NsLimits {
            nsid: 1,
            lba_size: 512,
            lba_shift: 9,
            nsze: 1000,
            max_cmd: 16384,
            has_metadata: false,
        }
    }

    #[test]
    fn range_checks() {
        let ns = ns512();
        assert_eq!(check_range(&ns, 0, 4096).unwrap(), 8);
        assert!(matches!(
            check_range(&ns, 0, 0),
            Err(NvmeError::LengthNotBlockMultiple { len: 0, .. })
        ));
        assert!(matches!(
            check_range(&ns, 0, 700),
            Err(NvmeError::LengthNotBlockMultiple { len: 700, .. })
        ));
        assert!(matches!(
            check_range(&ns, 999, 1024),
            Err(NvmeError::LbaOutOfRange {
                slba: 999,
                nlb: 2,
                nsze: 1000,
                ..
            })
        ));
        assert!(check_range(&ns, 998, 1024).is_ok());
        assert!(matches!(
            check_range(&ns, u64::MAX, 512),
            Err(NvmeError::LbaOutOfRange { .. })
        ));
        let e = check_range(&ns, 0, 700).unwrap_err().to_string();
        assert!(e.contains("700") && e.contains("512-byte LBA size"), "{e}");
    }
}
