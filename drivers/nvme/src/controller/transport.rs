//! The transport seam of the controller logic (SPDK's transport table): reading CAP, enabling
//! the controller and waiting for CSTS.RDY (bounded), and Identify are written once here, over
//! [`ControllerTransport`]. PCIe provides register access by MMIO and admin commands on its
//! admin rings ([`super::Controller`]); NVMe/TCP by Property Get / Set and capsules on its
//! admin connection (`transport::tcp::ctrl::TcpController`, with the `nvmf` feature).
//!
//! Creating an I/O queue pair is shared the same way: how many queues (Set Features, Number of
//! Queues), which queue id ([`QueueIds`]) and how many entries (CAP.MQES and the transport's
//! own bound) are decided here once ([`negotiate_queues`], [`create_io_queue`]); the transport
//! only builds the queue it was told to ([`IoQueueTransport`]: Create I/O CQ/SQ over rings on
//! PCIe, a connection and Fabrics Connect on NVMe/TCP).

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use zerocopy::FromBytes;

use crate::error::NvmeError;
use crate::spec::command::{cns, feature};
use crate::spec::identify::{IdentifyController, IdentifyNamespace, IDENTIFY_LEN};
use crate::spec::regs::{Cap, Cc, Csts, REG_CAP, REG_CC, REG_CSTS};

/// How long [`wait_ready`] sleeps between two CSTS reads.
const READY_POLL: Duration = Duration::from_micros(100);

/// Register access: MMIO on PCIe, Property Get / Set on fabrics.
pub trait Registers {
    /// The transport's error; the shared code's own faults are [`NvmeError`]s
    /// (`DeviceGone`, `ControllerFatal`, `ReadyTimeout`), the same on every transport.
    type Error: From<NvmeError>;
    /// Read CAP (8 bytes).
    fn read_cap(&mut self) -> Result<u64, Self::Error>;
    /// Read CSTS (4 bytes), as the controller reports it.
    fn read_csts(&mut self) -> Result<u32, Self::Error>;
    /// Write CC (4 bytes).
    fn write_cc(&mut self, cc: u32) -> Result<(), Self::Error>;
}

/// What a transport gives the shared controller logic: registers and admin commands.
pub trait ControllerTransport: Registers {
    /// Run Identify `cns` for `nsid` (an admin command named `what`), its 4 KiB into `page`.
    fn identify(
        &mut self,
        cns: u8,
        nsid: u32,
        what: &'static str,
        page: &mut [u8; IDENTIFY_LEN],
    ) -> Result<(), Self::Error>;
    /// Set Features `fid` (not saved) with `cdw11`: CQE dword 0.
    fn set_features(&mut self, fid: u8, cdw11: u32) -> Result<u32, Self::Error>;
}

/// A transport's part of creating one I/O queue pair: PCIe allocates the rings and sends
/// Create I/O CQ and SQ; NVMe/TCP opens a connection and sends Fabrics Connect. The id, the
/// number of entries and the limits are decided by [`create_io_queue`], the same on both.
pub trait IoQueueTransport {
    /// The transport's error (the shared code's own are [`NvmeError`]s).
    type Error: From<NvmeError>;
    /// What the transport built for the queue.
    type Queue;
    /// The largest queue in entries the transport builds (CAP.MQES + 1 bounds it too).
    fn max_entries(&self) -> u32;
    /// Create queue `qid` of `entries` entries (already within every limit) on the controller.
    fn create(&mut self, qid: u16, entries: u16) -> Result<Self::Queue, Self::Error>;
}

/// What an I/O queue id is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QidUse {
    /// Free to allocate.
    Free,
    /// Held by a live queue pair.
    Live,
    /// Its queue pair is gone but the device-side queues could not be deleted (their memory was
    /// leaked); free again once the controller is reset.
    Leaked,
}

/// The I/O queue ids 1..=granted of one controller (granted by Set Features, Number of
/// Queues): taken by [`create_io_queue`], given back when the queue pair goes.
#[derive(Debug, Default)]
pub(crate) struct QueueIds {
    /// Index = queue id; index 0 (the admin queue) is never handed out.
    slots: Mutex<Vec<QidUse>>,
}

impl QueueIds {
    /// Ids 1..=`granted`, all free.
    pub(crate) fn new(granted: u16) -> QueueIds {
        QueueIds {
            slots: Mutex::new(vec![QidUse::Free; granted as usize + 1]),
        }
    }

    /// The table, locked (poisoning ignored: every update leaves it consistent).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Vec<QidUse>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue pairs granted (the NVMe/TCP controller reports it; PCIe keeps its own count).
    #[cfg(feature = "nvmf")]
    pub(crate) fn granted(&self) -> u16 {
        self.lock().len().saturating_sub(1) as u16
    }

    /// Take the lowest free id: [`NvmeError::NoQueuesLeft`] when every granted one is held.
    pub(crate) fn alloc(&self) -> Result<u16, NvmeError> {
        let mut q = self.lock();
        let granted = q.len().saturating_sub(1) as u16;
        let i = (1..q.len())
            .find(|&i| q[i] == QidUse::Free)
            .ok_or(NvmeError::NoQueuesLeft { granted })?;
        q[i] = QidUse::Live;
        Ok(i as u16)
    }

    /// Mark `qid` (ids outside the table are ignored).
    pub(crate) fn set(&self, qid: u16, to: QidUse) {
        if qid == 0 {
            return;
        }
        if let Some(s) = self.lock().get_mut(qid as usize) {
            *s = to;
        }
    }

    /// Ids (the admin queue's excepted) in state `what`.
    pub(crate) fn count(&self, what: QidUse) -> usize {
        self.lock().iter().skip(1).filter(|&&u| u == what).count()
    }
}

/// Set Features, Number of Queues, asking for `want` I/O queue pairs (1 to 1024): the pairs
/// granted, the smaller of the submission and completion queue counts and `want`.
pub fn negotiate_queues<T: ControllerTransport>(t: &mut T, want: u16) -> Result<u16, T::Error> {
    let want = want.clamp(1, 1024);
    let ask = want as u32 - 1;
    let got = t.set_features(feature::NUMBER_OF_QUEUES, ask << 16 | ask)?;
    let nsq = (got & 0xffff) + 1;
    let ncq = (got >> 16) + 1;
    Ok(nsq.min(ncq).min(want as u32) as u16)
}

/// Entries of an I/O queue holding `depth` commands: one more (a full queue keeps one entry
/// free), at most CAP.MQES + 1 and `max_entries` (so the depth given is an upper bound).
pub fn io_queue_entries(depth: usize, cap: Cap, max_entries: u32) -> Result<u16, NvmeError> {
    if depth == 0 {
        return Err(NvmeError::InvalidArgument("queue depth must be at least 1"));
    }
    let most = cap.max_queue_entries().min(max_entries).clamp(2, 65535) as usize;
    Ok(depth.saturating_add(1).min(most) as u16)
}

/// A new I/O queue pair: its id, its entries (it holds one command fewer) and what the
/// transport built.
#[derive(Debug)]
pub struct NewIoQueue<Q> {
    /// The queue id, taken from the controller's [`QueueIds`].
    pub qid: u16,
    /// Entries of the queue.
    pub entries: u16,
    /// The transport's queue.
    pub queue: Q,
}

/// Create an I/O queue pair holding up to `depth` commands: size it ([`io_queue_entries`]),
/// take a free id of `ids` ([`NvmeError::NoQueuesLeft`] when none), have the transport create
/// it; the id goes back on failure. The caller gives the id back when the pair goes.
pub(crate) fn create_io_queue<T: IoQueueTransport>(
    t: &mut T,
    ids: &QueueIds,
    cap: Cap,
    depth: usize,
) -> Result<NewIoQueue<T::Queue>, T::Error> {
    let entries = io_queue_entries(depth, cap, t.max_entries())?;
    let qid = ids.alloc()?;
    match t.create(qid, entries) {
        Ok(queue) => Ok(NewIoQueue {
            qid,
            entries,
            queue,
        }),
        Err(e) => {
            ids.set(qid, QidUse::Free);
            Err(e)
        }
    }
}

/// Read CAP: all-ones is [`NvmeError::DeviceGone`].
pub fn read_cap<T: Registers>(t: &mut T) -> Result<Cap, T::Error> {
    let cap = t.read_cap()?;
    if cap == u64::MAX {
        return Err(NvmeError::DeviceGone { register: "CAP" }.into());
    }
    Ok(Cap(cap))
}

/// Read CSTS: all-ones is [`NvmeError::DeviceGone`]; with `during`, CFS is
/// [`NvmeError::ControllerFatal`] (without, a fatal controller may still be disabled).
pub fn read_csts<T: Registers>(t: &mut T, during: Option<&'static str>) -> Result<Csts, T::Error> {
    let csts = Csts(t.read_csts()?);
    if csts.is_all_ones() {
        return Err(NvmeError::DeviceGone { register: "CSTS" }.into());
    }
    match during {
        Some(during) if csts.cfs() => Err(NvmeError::ControllerFatal {
            csts: csts.0,
            during,
        }
        .into()),
        _ => Ok(csts),
    }
}

/// Poll CSTS until RDY equals `ready`, at most `timeout` ([`NvmeError::ReadyTimeout`] then).
/// `during` as in [`read_csts`].
pub fn wait_ready<T: Registers>(
    t: &mut T,
    ready: bool,
    timeout: Duration,
    during: Option<&'static str>,
) -> Result<(), T::Error> {
    let start = Instant::now();
    loop {
        let csts = read_csts(t, during)?;
        if csts.rdy() == ready {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(NvmeError::ReadyTimeout {
                ready,
                timeout,
                csts: csts.0,
            }
            .into());
        }
        std::thread::sleep(READY_POLL);
    }
}

/// Enable the controller (CC.EN with 4 KiB pages, 64-byte SQ and 16-byte CQ entries) and wait
/// for CSTS.RDY=1, at most `timeout`.
pub fn enable<T: Registers>(
    t: &mut T,
    timeout: Duration,
    during: &'static str,
) -> Result<(), T::Error> {
    t.write_cc(Cc::enabled(0, 6, 4).0)?;
    wait_ready(t, true, timeout, Some(during))
}

/// Identify Controller (CNS 01h).
pub fn identify_controller<T: ControllerTransport>(
    t: &mut T,
) -> Result<Box<IdentifyController>, T::Error> {
    let mut page = Box::new([0u8; IDENTIFY_LEN]);
    t.identify(cns::CONTROLLER, 0, "Identify Controller", &mut page)?;
    Ok(Box::new(
        IdentifyController::read_from_bytes(&page[..]).expect("size matches"),
    ))
}

/// Identify Namespace (CNS 00h) of `nsid`.
pub fn identify_namespace<T: ControllerTransport>(
    t: &mut T,
    nsid: u32,
) -> Result<Box<IdentifyNamespace>, T::Error> {
    let mut page = Box::new([0u8; IDENTIFY_LEN]);
    t.identify(cns::NAMESPACE, nsid, "Identify Namespace", &mut page)?;
    Ok(Box::new(
        IdentifyNamespace::read_from_bytes(&page[..]).expect("size matches"),
    ))
}

/// Namespace Identification Descriptor list (CNS 03h) of `nsid`, decoded to its command set
/// (`None`: the list names none). A controller before NVMe 1.3 has no such list: call it only
/// for VS 1.3 and later.
pub fn namespace_command_set<T: ControllerTransport>(
    t: &mut T,
    nsid: u32,
) -> Result<Option<crate::CommandSet>, T::Error> {
    let mut page = Box::new([0u8; IDENTIFY_LEN]);
    t.identify(
        cns::NS_ID_DESCRIPTORS,
        nsid,
        "Identify Namespace Identification Descriptor list",
        &mut page,
    )?;
    Ok(crate::command_set_from_descriptors(&page)?)
}

/// PCIe: the registers are BAR0 (MMIO never fails; a gone device reads all-ones).
impl Registers for &ubdirect_core::Mmio {
    type Error = NvmeError;
    fn read_cap(&mut self) -> Result<u64, NvmeError> {
        Ok(self.read64(REG_CAP))
    }
    fn read_csts(&mut self) -> Result<u32, NvmeError> {
        Ok(self.read32(REG_CSTS))
    }
    fn write_cc(&mut self, cc: u32) -> Result<(), NvmeError> {
        self.write32(REG_CC, cc);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transport whose CSTS follows a script (the last value repeats).
    struct Script {
        csts: Vec<u32>,
        reads: usize,
        cc: Vec<u32>,
    }

    impl Registers for Script {
        type Error = NvmeError;
        fn read_cap(&mut self) -> Result<u64, NvmeError> {
            Ok(u64::MAX)
        }
        fn read_csts(&mut self) -> Result<u32, NvmeError> {
            let v = self.csts[self.reads.min(self.csts.len() - 1)];
            self.reads += 1;
            Ok(v)
        }
        fn write_cc(&mut self, cc: u32) -> Result<(), NvmeError> {
            self.cc.push(cc);
            Ok(())
        }
    }

    impl ControllerTransport for Script {
        fn identify(
            &mut self,
            _: u8,
            _: u32,
            _: &'static str,
            _: &mut [u8; IDENTIFY_LEN],
        ) -> Result<(), NvmeError> {
            Ok(())
        }
        fn set_features(&mut self, fid: u8, cdw11: u32) -> Result<u32, NvmeError> {
            assert_eq!(fid, feature::NUMBER_OF_QUEUES);
            self.cc.push(cdw11);
            // 3 SQs, 5 CQs (0-based).
            Ok(4 << 16 | 2)
        }
    }

    fn script(csts: &[u32]) -> Script {
        Script {
            csts: csts.to_vec(),
            reads: 0,
            cc: Vec::new(),
        }
    }

    #[test]
    fn enable_writes_cc_and_waits_for_rdy() {
        let mut t = script(&[0, 0, 1]);
        enable(&mut t, Duration::from_secs(5), "enabling").unwrap();
        assert_eq!(t.cc, vec![Cc::enabled(0, 6, 4).0]);
        assert_eq!(t.reads, 3);
    }

    #[test]
    fn faults_are_the_same_errors_on_every_transport() {
        let e = enable(&mut script(&[0]), Duration::from_millis(5), "enabling").unwrap_err();
        assert!(
            matches!(
                e,
                NvmeError::ReadyTimeout {
                    ready: true,
                    csts: 0,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = enable(&mut script(&[0, 2]), Duration::from_secs(5), "enabling").unwrap_err();
        assert!(
            matches!(
                e,
                NvmeError::ControllerFatal {
                    csts: 2,
                    during: "enabling"
                }
            ),
            "{e:?}"
        );
        // Disabling a fatal controller is allowed: CFS does not stop the wait without `during`.
        wait_ready(&mut script(&[3, 2]), false, Duration::from_secs(5), None).unwrap();
        let e = read_csts(&mut script(&[u32::MAX]), None).unwrap_err();
        assert!(matches!(e, NvmeError::DeviceGone { register: "CSTS" }));
        let e = read_cap(&mut script(&[0])).unwrap_err();
        assert!(matches!(e, NvmeError::DeviceGone { register: "CAP" }));
    }

    #[test]
    fn the_granted_queue_count_is_the_smaller_of_both_and_of_the_request() {
        let mut t = script(&[0]);
        assert_eq!(negotiate_queues(&mut t, 16).unwrap(), 3);
        assert_eq!(t.cc, vec![15 << 16 | 15]);
        assert_eq!(negotiate_queues(&mut t, 2).unwrap(), 2);
        assert_eq!(negotiate_queues(&mut t, 0).unwrap(), 1);
        assert_eq!(t.cc[2], 0);
    }

    #[test]
    fn queue_entries_are_depth_plus_one_within_mqes_and_the_transport() {
        let cap = Cap(127); // MQES 127: 128 entries
        assert_eq!(io_queue_entries(32, cap, 65535).unwrap(), 33);
        assert_eq!(io_queue_entries(1000, cap, 65535).unwrap(), 128);
        assert_eq!(io_queue_entries(1000, cap, 64).unwrap(), 64);
        assert_eq!(
            io_queue_entries(usize::MAX, Cap(0xffff), 65535).unwrap(),
            65535
        );
        assert!(matches!(
            io_queue_entries(0, cap, 64),
            Err(NvmeError::InvalidArgument(_))
        ));
    }

    /// A transport that records what it was asked to create, failing on `fail_qid`.
    struct Maker {
        made: Vec<(u16, u16)>,
        fail_qid: u16,
    }

    impl IoQueueTransport for Maker {
        type Error = NvmeError;
        type Queue = u16;
        fn max_entries(&self) -> u32 {
            1024
        }
        fn create(&mut self, qid: u16, entries: u16) -> Result<u16, NvmeError> {
            if qid == self.fail_qid {
                return Err(NvmeError::InvalidArgument("refused"));
            }
            self.made.push((qid, entries));
            Ok(qid)
        }
    }

    #[test]
    fn queue_ids_are_taken_lowest_first_given_back_on_failure_and_limited() {
        let ids = QueueIds::new(2);
        let mut m = Maker {
            made: Vec::new(),
            fail_qid: 1,
        };
        let cap = Cap(0x7ff);
        let e = create_io_queue(&mut m, &ids, cap, 8).unwrap_err();
        assert!(matches!(e, NvmeError::InvalidArgument("refused")));
        assert_eq!(
            ids.count(QidUse::Live),
            0,
            "the failed queue's id is free again"
        );
        m.fail_qid = 0;
        assert_eq!(create_io_queue(&mut m, &ids, cap, 8).unwrap().qid, 1);
        assert_eq!(
            create_io_queue(&mut m, &ids, cap, 4096).unwrap().entries,
            1024
        );
        let e = create_io_queue(&mut m, &ids, cap, 8).unwrap_err();
        assert!(matches!(e, NvmeError::NoQueuesLeft { granted: 2 }), "{e:?}");
        ids.set(1, QidUse::Free);
        assert_eq!(create_io_queue(&mut m, &ids, cap, 8).unwrap().qid, 1);
        assert_eq!(m.made, vec![(1, 9), (2, 1024), (1, 9)]);
    }
}
