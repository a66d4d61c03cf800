//! The control virtqueue (virtio 1.2 §5.1.6.5): synchronous commands such as receive-filter
//! modes and the number of active queue pairs. Not an I/O path: one command at a time, the
//! doorbell always rung, the answer awaited with a deadline.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ubdirect_core::ub::{DmaMem, UbRegistry};

use crate::ring::layout::{Descriptor, UsedElem, AVAIL_F_NO_INTERRUPT, DESC_F_NEXT, DESC_F_WRITE};
use crate::ring::RingLayout;
use crate::transport::{Doorbell, Transport};

/// Control class: receive-filter modes.
pub const CTRL_RX: u8 = 0;
/// `CTRL_RX` command: promiscuous mode on (1) / off (0).
pub const CTRL_RX_PROMISC: u8 = 0;
/// `CTRL_RX` command: receive all multicast on / off.
pub const CTRL_RX_ALLMULTI: u8 = 1;
/// Control class: multiqueue.
pub const CTRL_MQ: u8 = 4;
/// `CTRL_MQ` command: set the number of active queue pairs (le16).
pub const CTRL_MQ_VQ_PAIRS_SET: u8 = 0;
/// The device's answer: success.
pub const CTRL_OK: u8 = 0;

/// How long the device may take to answer a control command (default of
/// [`crate::NetConfig::ctrl_timeout`]).
pub const CTRL_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a control command failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CtrlError {
    /// The device answered VIRTIO_NET_ERR (or any value but VIRTIO_NET_OK).
    Refused(String),
    /// No answer within the deadline: the queue is wedged from now on.
    Timeout(Duration),
    /// A malformed answer: the queue is wedged from now on.
    Malformed(String),
    /// An earlier command timed out or was answered malformed: nothing was sent.
    Wedged(&'static str),
}

/// Offset of the device-writable ack byte in the command page.
const ACK_OFF: usize = 64;
/// Longest command payload.
const MAX_DATA: usize = 60;

/// A control virtqueue with its ring and one command page.
pub(crate) struct CtrlQueue {
    /// Set once a command timed out or was answered malformed: the device may still own the
    /// command page and descriptors 0/1, so no later command may reuse them.
    wedged: Option<&'static str>,
    timeout: Duration,
    layout: RingLayout,
    doorbell: Doorbell,
    avail: u16,
    used: u16,
    ring: DmaMem,
    page: DmaMem,
}

impl CtrlQueue {
    /// The NUMA nodes of the ring and the command page.
    pub(crate) fn numa_nodes(&self) -> [Option<u32>; 2] {
        [self.ring.region().numa, self.page.region().numa]
    }
    /// Allocates and registers control queue `q` (up to 64 entries; only 2 are ever used).
    pub(crate) fn new(
        t: &Transport,
        registry: &Arc<UbRegistry>,
        q: u16,
        timeout: Duration,
    ) -> crate::Result<CtrlQueue> {
        let max = t.queue_max_size(q);
        if max == 0 {
            return Err(crate::VirtioNetError::QueueUnavailable {
                addr: t.address(),
                queue: q,
                num_queues: t.num_queues(),
            });
        }
        let size = 1u16 << (15 - max.min(64).leading_zeros().min(15));
        let layout = RingLayout::new(size).expect("power of two <= 64");
        // On the device's NUMA node.
        let numa = t.device().numa_node();
        let ring = DmaMem::alloc_on(registry, layout.total, numa)?;
        let page = DmaMem::alloc_on(registry, 4096, numa)?;
        // SAFETY: the ring block is zeroed, at least layout.total bytes, owned by this queue.
        unsafe {
            core::ptr::write_volatile(
                ring.as_ptr().add(layout.avail).cast::<u16>(),
                AVAIL_F_NO_INTERRUPT,
            )
        };
        let base = ring.iova();
        let doorbell = t.setup_queue_at(
            q,
            size,
            base + layout.desc as u64,
            base + layout.avail as u64,
            base + layout.used as u64,
        )?;
        Ok(CtrlQueue {
            wedged: None,
            timeout,
            layout,
            doorbell,
            avail: 0,
            used: 0,
            ring,
            page,
        })
    }

    fn idx(&self, off: usize) -> &AtomicU16 {
        // SAFETY: `off` is a 2-byte aligned index field of the ring block, which lives as long
        // as self; the device accesses it concurrently, as an atomic models.
        unsafe { AtomicU16::from_ptr(self.ring.as_ptr().add(off).cast::<u16>()) }
    }

    /// Sends `class`/`cmd` with `data` and waits (bounded by the queue's timeout, counted from
    /// this command's doorbell) for the device's ack. A timeout or a malformed answer wedges
    /// the queue: every later command fails with [`CtrlError::Wedged`] without touching the
    /// ring or the command page, which the device may still own.
    pub(crate) fn command(&mut self, class: u8, cmd: u8, data: &[u8]) -> Result<(), CtrlError> {
        if let Some(why) = self.wedged {
            return Err(CtrlError::Wedged(why));
        }
        if data.len() > MAX_DATA {
            return Err(CtrlError::Refused(format!(
                "{} bytes of command data (at most {MAX_DATA}): nothing sent",
                data.len()
            )));
        }
        self.post(class, cmd, data);
        self.wait_used()?;
        self.take_answer(class, cmd)
    }

    /// Write the command into the page, chain its two descriptors (command, ack), publish
    /// them and ring the doorbell.
    fn post(&mut self, class: u8, cmd: u8, data: &[u8]) {
        let p = self.page.as_ptr();
        let mask = self.layout.size - 1;
        // The device reads/writes the page only between the avail publish below and the used
        // entry we wait for (the queue is wedged, and the page never written again, if that
        // entry never comes); commands are synchronous, so descriptor and avail slots 0/1 are free.
        // SAFETY: the 4 KiB page is ours and the device is not using it now (above).
        unsafe {
            *p = class;
            *p.add(1) = cmd;
            core::ptr::copy_nonoverlapping(data.as_ptr(), p.add(2), data.len());
            core::ptr::write_volatile(p.add(ACK_OFF), 0xff);
            let d = self
                .ring
                .as_ptr()
                .add(self.layout.desc)
                .cast::<Descriptor>();
            let iova = self.page.iova();
            core::ptr::write_volatile(
                d,
                Descriptor {
                    addr: iova,
                    len: 2 + data.len() as u32,
                    flags: DESC_F_NEXT,
                    next: 1,
                },
            );
            core::ptr::write_volatile(
                d.add(1),
                Descriptor {
                    addr: iova + ACK_OFF as u64,
                    len: 1,
                    flags: DESC_F_WRITE,
                    next: 0,
                },
            );
            core::ptr::write_volatile(
                self.ring
                    .as_ptr()
                    .add(self.layout.avail_entry(self.avail & mask))
                    .cast::<u16>(),
                0,
            );
        }
        self.avail = self.avail.wrapping_add(1);
        self.idx(self.layout.avail_idx())
            .store(self.avail, Ordering::Release);
        self.doorbell.ring();
    }

    /// Wait (bounded by the queue's timeout) for the device to publish one used entry.
    fn wait_used(&mut self) -> Result<(), CtrlError> {
        let start = Instant::now();
        loop {
            let u = self.idx(self.layout.used_idx()).load(Ordering::Acquire);
            if u != self.used {
                if u != self.used.wrapping_add(1) {
                    return Err(self.wedge(CtrlError::Malformed(format!(
                        "used index jumped from {} to {u} for one command (malformed ring)",
                        self.used
                    ))));
                }
                return Ok(());
            }
            if start.elapsed() > self.timeout {
                self.wedged = Some("an earlier control command timed out");
                return Err(CtrlError::Timeout(start.elapsed()));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Consume the used entry [`CtrlQueue::wait_used`] saw and read the device's answer.
    fn take_answer(&mut self, class: u8, cmd: u8) -> Result<(), CtrlError> {
        let mask = self.layout.size - 1;
        // SAFETY: the used element at our slot was published by the Acquire load in
        // `wait_used`.
        let e: UsedElem = unsafe {
            core::ptr::read_volatile(
                self.ring
                    .as_ptr()
                    .add(self.layout.used_entry(self.used & mask))
                    .cast::<UsedElem>(),
            )
        };
        self.used = self.used.wrapping_add(1);
        if e.id != 0 {
            return Err(self.wedge(CtrlError::Malformed(format!(
                "device completed descriptor {} instead of 0 (malformed completion)",
                e.id
            ))));
        }
        // SAFETY: the device wrote the ack before publishing the used entry.
        let ack = unsafe { core::ptr::read_volatile(self.page.as_ptr().add(ACK_OFF)) };
        match ack {
            CTRL_OK => Ok(()),
            a => Err(CtrlError::Refused(format!(
                "device answered {a:#04x} (VIRTIO_NET_ERR): command class {class} cmd {cmd} refused"
            ))),
        }
    }

    fn wedge(&mut self, e: CtrlError) -> CtrlError {
        self.wedged = Some("an earlier control command was answered malformed");
        e
    }
}
