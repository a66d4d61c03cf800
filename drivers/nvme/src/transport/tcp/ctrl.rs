//! [`TcpController`]: an NVMe-oF controller reached over NVMe/TCP. The admin queue is a
//! connection of its own; registers are properties (Property Get / Set); each I/O queue is a
//! further connection joined by Fabrics Connect with the admin queue's controller ID.
//!
//! The controller data it reads back (Identify Controller / Namespace, CAP, CSTS) are decoded
//! by the same code as the PCIe transport's ([`ControllerInfo`], [`NamespaceInfo`], [`Cap`]).

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zerocopy::IntoBytes;

use super::addr::TcpTarget;
use super::assoc::Association;
use super::auth::{
    authenticate_queue, AuthConfig, AuthError, Authenticated, Parties, CONNECT_AUTHREQ_ASCR,
};
use super::buf::DataBuf;
use super::error::{TcpError, TcpResult};
use super::fabrics::{self, property, ConnectData, CNTLID_DYNAMIC, DISCOVERY_NQN};
use super::host::HostIdentity;
use super::queue::{TcpCommand, TcpQueue};
use super::sock;
use crate::controller::transport::{self, ControllerTransport, IoQueueTransport, Registers};
use crate::info::{ControllerInfo, NamespaceInfo};
use crate::spec::command::admin_opcode;
use crate::spec::identify::IDENTIFY_LEN;
use crate::spec::regs::Cap;
use crate::spec::Sqe;
use crate::status::{sct, NvmeStatus};

/// Connection options.
#[derive(Debug, Clone)]
pub struct TcpOptions {
    /// Bound of TCP connect + ICReq exchange.
    pub connect_timeout: Duration,
    /// Bound of every admin command.
    pub admin_timeout: Duration,
    /// Bound of every I/O command (then the connection is failed).
    pub io_timeout: Duration,
    /// Ask for header digests.
    pub hdgst: bool,
    /// Ask for data digests.
    pub ddgst: bool,
    /// Keep-alive timeout sent in the admin Connect, milliseconds (0: none).
    pub kato_ms: u32,
    /// I/O queues to ask for (Set Features, Number of Queues); the controller may grant fewer.
    pub io_queues: u16,
    /// In-band authentication (DH-HMAC-CHAP): secrets and what the host accepts.
    pub auth: AuthConfig,
}

impl Default for TcpOptions {
    fn default() -> TcpOptions {
        TcpOptions {
            connect_timeout: Duration::from_secs(5),
            admin_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(10),
            hdgst: false,
            ddgst: false,
            kato_ms: 0,
            io_queues: 16,
            auth: AuthConfig::default(),
        }
    }
}

/// A connected, enabled NVMe/TCP controller.
#[derive(Debug)]
pub struct TcpController {
    admin: Mutex<TcpQueue<Vec<u8>>>,
    target: TcpTarget,
    host: HostIdentity,
    opts: TcpOptions,
    cntlid: u16,
    cap: Cap,
    info: ControllerInfo,
    ioccsz: u32,
    last_keep_alive: Mutex<Instant>,
    /// Queue ids and keep-alive state shared with the I/O queues.
    assoc: Arc<Association>,
    /// The admin queue authenticated (DH-HMAC-CHAP): every I/O queue does too.
    authenticated: bool,
}

fn connect_hint(st: NvmeStatus) -> &'static str {
    match (st.sct, st.sc) {
        (sct::COMMAND_SPECIFIC, 0x82) => "the target does not know this subsystem NQN or does not allow this host NQN: list its subsystems with `ubdirect discover ADDR` and check the target's allowed hosts",
        (sct::COMMAND_SPECIFIC, 0x84) => "this host NQN is not allowed on the subsystem: add it to the target's allowed hosts",
        (sct::COMMAND_SPECIFIC, 0x81) => "the controller is busy: retry later",
        (sct::COMMAND_SPECIFIC, 0x80) => "the target does not support this Connect format",
        _ => "check the subsystem NQN and the target's configuration",
    }
}

/// Status Authentication Required (SCT 1h, SC 91h): the controller wants the queue
/// authenticated (again) before it runs commands.
const AUTH_REQUIRED: (u8, u8) = (sct::COMMAND_SPECIFIC, 0x91);

/// The largest queue (entries) this host connects: nvmet's own limit (NVMET_QUEUE_SIZE).
const MAX_ENTRIES: u32 = 1024;

/// Open one connection and join queue `qid` (of `entries` entries: it holds one command fewer)
/// of controller `cntlid`; returns the queue and the controller ID the target gave.
fn open_queue<B: DataBuf>(
    target: &TcpTarget,
    host: &HostIdentity,
    opts: &TcpOptions,
    spec: QueueSpec,
) -> TcpResult<(TcpQueue<B>, u16, bool)> {
    let QueueSpec {
        qid,
        entries,
        cntlid,
        incap,
        auth,
    } = spec;
    let s = sock::connect(&target.addr, opts.connect_timeout)?;
    let neg = sock::initialize(&s, opts.hdgst, opts.ddgst, opts.connect_timeout)?;
    // The Connect itself carries 1 KiB in the capsule on every queue.
    // Connect and authentication run on a Vec-backed queue; the connection then goes to a
    // queue of B.
    let mut q = TcpQueue::<Vec<u8>>::new(
        s,
        neg,
        qid,
        entries.saturating_sub(1),
        1024,
        opts.io_timeout.max(opts.admin_timeout),
    );
    let data = ConnectData::new(host.id, cntlid, &target.subnqn, &host.nqn).map_err(|reason| {
        let which = if fabrics::check_nqn(&target.subnqn).is_err() {
            ("subsystem NQN", &target.subnqn)
        } else {
            ("host NQN", &host.nqn)
        };
        TcpError::Nqn {
            which: which.0,
            nqn: which.1.clone(),
            reason,
        }
    })?;
    let kato = if qid == 0 { opts.kato_ms } else { 0 };
    // The connection's own queue is typed over B; the Connect data travels in a B-free way:
    // submit it through a Vec-backed queue view would need a second type, so build the
    // capsule from a B made of the data when B is Vec<u8>, else through raw bytes.
    let cqe = connect_run(
        &mut q,
        fabrics::connect(qid, entries, kato),
        data.as_bytes(),
        opts.connect_timeout,
    )
    .map_err(|e| match e {
        TcpError::Command { status, .. } => TcpError::Connect {
            subnqn: target.subnqn.clone(),
            qid,
            status,
            hint: connect_hint(status),
        },
        e => e,
    })?;
    q.set_incapsule(incap);
    if cqe.result & CONNECT_AUTHREQ_ASCR != 0 {
        return Err(TcpError::Auth {
            qid,
            source: AuthError::ConcatenationRequired,
        });
    }
    let authenticate = auth || opts.auth.wanted(cqe.result);
    if authenticate {
        let who = Parties {
            hostnqn: &host.nqn,
            subnqn: &target.subnqn,
        };
        authenticate_queue(&mut q, &opts.auth, who, opts.admin_timeout)?;
    }
    let q = q.into_typed(entries.saturating_sub(1))?;
    Ok((q, cqe.result as u16, authenticate))
}

/// Which queue [`open_queue`] joins.
#[derive(Debug, Clone, Copy)]
struct QueueSpec {
    /// Queue ID.
    qid: u16,
    /// Entries (the queue holds one command fewer).
    entries: u16,
    /// Controller ID: [`CNTLID_DYNAMIC`] for the admin queue.
    cntlid: u16,
    /// In-capsule data the queue accepts once connected, bytes.
    incap: u32,
    /// Authenticate even when the Connect response does not ask (an I/O queue of a controller
    /// whose admin queue authenticated).
    auth: bool,
}

/// Run the Connect command, its 1 KiB data in the capsule.
fn connect_run<B: DataBuf>(
    q: &mut TcpQueue<B>,
    sqe: Sqe,
    data: &[u8],
    timeout: Duration,
) -> TcpResult<crate::spec::Cqe> {
    q.run_with_bytes(sqe, "Connect", data, timeout)
}

impl TcpController {
    /// Connect to `target`, enable the controller (CC.EN through Property Set, CSTS.RDY
    /// through Property Get, bounded by CAP.TO) and identify it.
    pub fn connect(
        target: &TcpTarget,
        host: &HostIdentity,
        opts: &TcpOptions,
    ) -> TcpResult<TcpController> {
        let (mut q, cntlid, authenticated) = open_queue::<Vec<u8>>(
            target,
            host,
            opts,
            QueueSpec {
                qid: 0,
                entries: 32,
                cntlid: CNTLID_DYNAMIC,
                incap: fabrics::ADMIN_ICDATA as u32,
                auth: false,
            },
        )?;
        let mut f = Fabrics {
            q: &mut q,
            timeout: opts.admin_timeout,
        };
        let cap = transport::read_cap(&mut f)?;
        // CAP.TO, at least 500 ms (a round trip per CSTS read), at most a minute.
        let bound = cap
            .timeout()
            .clamp(Duration::from_millis(500), Duration::from_secs(60));
        transport::enable(&mut f, bound, "enabling the controller")?;
        let id = transport::identify_controller(&mut f)?;
        let info = ControllerInfo::from_identify(&id);
        let page = id.as_bytes();
        let ioccsz = u32::from_le_bytes(page[1792..1796].try_into().unwrap());
        let ioccsz = ioccsz.saturating_mul(16).saturating_sub(64).min(1 << 20);
        // A discovery controller has no I/O queues (and no Number of Queues feature).
        let granted = if target.subnqn == DISCOVERY_NQN {
            0
        } else {
            transport::negotiate_queues(&mut f, opts.io_queues)?
        };
        let assoc = Association::new(granted, Duration::from_millis(opts.kato_ms as u64));
        q.join(assoc.clone());
        if opts.kato_ms > 0 {
            q.set_keep_alive(Some(Duration::from_millis(opts.kato_ms as u64 / 2)));
        }
        Ok(TcpController {
            admin: Mutex::new(q),
            target: target.clone(),
            host: host.clone(),
            opts: opts.clone(),
            cntlid,
            cap,
            info,
            ioccsz,
            last_keep_alive: Mutex::new(Instant::now()),
            assoc,
            authenticated,
        })
    }

    /// The target address this controller was reached at.
    pub fn target(&self) -> &TcpTarget {
        &self.target
    }

    /// The controller ID the target assigned.
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    /// CAP as read through Property Get.
    pub fn cap(&self) -> Cap {
        self.cap
    }

    /// Identify Controller, decoded.
    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }

    /// In-capsule data the I/O queues accept (IOCCSZ minus the SQE), bytes.
    pub fn in_capsule(&self) -> u32 {
        self.ioccsz
    }

    /// The host identity used.
    pub fn host(&self) -> &HostIdentity {
        &self.host
    }

    /// I/O queues granted by the controller (Set Features, Number of Queues).
    pub fn io_queues_granted(&self) -> u16 {
        self.assoc.ids.granted()
    }

    /// I/O queue ids held by live queues.
    pub fn io_queues_in_use(&self) -> usize {
        self.assoc.ids.count(crate::controller::QidUse::Live)
    }

    fn admin(&self) -> std::sync::MutexGuard<'_, TcpQueue<Vec<u8>>> {
        self.admin.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run DH-HMAC-CHAP again on the admin queue (a controller may ask for it at any time,
    /// e.g. after its keys changed; admin commands answered Authentication Required do it by
    /// themselves). I/O queues authenticate when created.
    pub fn reauthenticate(&self) -> TcpResult<Authenticated> {
        self.reauthenticate_queue(&mut self.admin())
    }

    /// Run DH-HMAC-CHAP on the admin queue `q`.
    fn reauthenticate_queue(&self, q: &mut TcpQueue<Vec<u8>>) -> TcpResult<Authenticated> {
        let who = Parties {
            hostnqn: &self.host.nqn,
            subnqn: &self.target.subnqn,
        };
        authenticate_queue(q, &self.opts.auth, who, self.opts.admin_timeout)
    }

    /// Run `f` on the admin queue; when the controller answers Authentication Required,
    /// authenticate again and run it once more.
    fn admin_authenticated<T>(
        &self,
        mut f: impl FnMut(&mut TcpQueue<Vec<u8>>) -> TcpResult<T>,
    ) -> TcpResult<T> {
        let mut q = self.admin();
        match f(&mut q) {
            Err(TcpError::Command { status, .. })
                if (status.sct, status.sc) == AUTH_REQUIRED && self.opts.auth.secret.is_some() =>
            {
                self.reauthenticate_queue(&mut q)?;
                f(&mut q)
            }
            r => r,
        }
    }

    /// Identify Namespace `nsid`.
    pub fn namespace(&self, nsid: u32) -> TcpResult<NamespaceInfo> {
        let timeout = self.opts.admin_timeout;
        let id = self.admin_authenticated(|q| {
            transport::identify_namespace(&mut Fabrics { q, timeout }, nsid)
        })?;
        let mut ns = NamespaceInfo::from_identify(nsid, &id).map_err(|_| TcpError::DeviceInput {
            field: "Identify Namespace",
            value: nsid as u64,
            reason: "the namespace's format is unusable (no LBA format in use, or zero size): check the NSID",
        })?;
        let set = self.admin_authenticated(|q| {
            transport::namespace_command_set(&mut Fabrics { q, timeout }, nsid)
        });
        match set {
            Ok(set) => ns.command_set = set.unwrap_or_default(),
            Err(TcpError::Command { status, .. }) => tracing::debug!(
                nsid,
                %status,
                "no Namespace Identification Descriptor list: NVM command set assumed"
            ),
            Err(e) => return Err(e),
        }
        Ok(ns)
    }

    /// Service the admin queue without blocking: sends the Keep Alive when due (every half
    /// of `kato_ms`) and reaps its completion. Call it from the I/O loop now and then (at
    /// least every quarter KATO); it does nothing when `kato_ms` is 0 or another thread holds
    /// the admin queue.
    pub fn poll_admin(&self) -> TcpResult<()> {
        if self.opts.kato_ms == 0 {
            return Ok(());
        }
        let Ok(mut q) = self.admin.try_lock() else {
            return Ok(());
        };
        q.poll(&mut |_| {}).map(|_| ())
    }

    /// Send a Keep Alive if half the keep-alive timeout passed since the last one (blocking).
    pub fn keep_alive(&self) -> TcpResult<()> {
        if self.opts.kato_ms == 0 {
            return Ok(());
        }
        let mut last = self
            .last_keep_alive
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if last.elapsed() < Duration::from_millis(self.opts.kato_ms as u64 / 2) {
            return Ok(());
        }
        self.admin_authenticated(|q| {
            q.run(
                TcpCommand::new(fabrics::keep_alive(), "Keep Alive"),
                self.opts.admin_timeout,
            )
        })?;
        *last = Instant::now();
        self.assoc.keep_alive_answered();
        Ok(())
    }

    /// A new I/O queue (its own connection, joined by Fabrics Connect) holding up to `depth`
    /// commands: fewer when CAP.MQES, MAXCMD or 1,024 entries bound it (see
    /// [`TcpQueue::free_slots`]). It takes the lowest free queue id of those the controller
    /// granted ([`crate::NvmeError::NoQueuesLeft`] inside [`TcpError::Controller`] when all are
    /// in use) and gives it back when dropped: the same logic as a PCIe
    /// [`crate::IoQueuePair`]'s.
    pub fn io_queue<B: DataBuf>(&self, depth: usize) -> TcpResult<TcpQueue<B>> {
        let made = transport::create_io_queue(
            &mut TcpIoQueue::<B> {
                ctrl: self,
                buf: PhantomData,
            },
            &self.assoc.ids,
            self.cap,
            depth,
        )?;
        let mut q = made.queue;
        q.join(self.assoc.clone());
        Ok(q)
    }
}

/// The NVMe/TCP part of creating an I/O queue: a connection, ICReq, Fabrics Connect.
struct TcpIoQueue<'a, B> {
    ctrl: &'a TcpController,
    buf: PhantomData<B>,
}

impl<B: DataBuf> IoQueueTransport for TcpIoQueue<'_, B> {
    type Error = TcpError;
    type Queue = TcpQueue<B>;
    /// 1,024 entries, and MAXCMD + 1 when the controller reports MAXCMD (the commands it
    /// takes outstanding on a queue).
    fn max_entries(&self) -> u32 {
        match self.ctrl.info.maxcmd as u32 {
            0 => MAX_ENTRIES,
            m => MAX_ENTRIES.min(m + 1),
        }
    }
    fn create(&mut self, qid: u16, entries: u16) -> TcpResult<TcpQueue<B>> {
        let c = self.ctrl;
        let spec = QueueSpec {
            qid,
            entries,
            cntlid: c.cntlid,
            incap: c.ioccsz,
            auth: c.authenticated,
        };
        let (q, _, _) = open_queue::<B>(&c.target, &c.host, &c.opts, spec)?;
        Ok(q)
    }
}

/// The NVMe/TCP transport of the shared controller logic: registers are properties
/// (Property Get / Set), admin commands are capsules on the admin connection.
struct Fabrics<'a> {
    q: &'a mut TcpQueue<Vec<u8>>,
    timeout: Duration,
}

impl Fabrics<'_> {
    fn get(&mut self, off: u32) -> TcpResult<u64> {
        let cmd = TcpCommand::new(fabrics::property_get(off), "Property Get");
        let (c, _) = self.q.run(cmd, self.timeout)?;
        Ok(c.result as u64 | ((c.dw1 as u64) << 32))
    }
}

impl Registers for Fabrics<'_> {
    type Error = TcpError;
    fn read_cap(&mut self) -> TcpResult<u64> {
        self.get(property::CAP)
    }
    fn read_csts(&mut self) -> TcpResult<u32> {
        Ok(self.get(property::CSTS)? as u32)
    }
    fn write_cc(&mut self, cc: u32) -> TcpResult<()> {
        let cmd = TcpCommand::new(fabrics::property_set(property::CC, cc), "Property Set CC");
        self.q.run(cmd, self.timeout)?;
        Ok(())
    }
}

impl ControllerTransport for Fabrics<'_> {
    fn identify(
        &mut self,
        cns: u8,
        nsid: u32,
        what: &'static str,
        page: &mut [u8; IDENTIFY_LEN],
    ) -> TcpResult<()> {
        let mut s = Sqe::new(admin_opcode::IDENTIFY);
        s.nsid = nsid;
        s.cdw10 = cns as u32;
        let cmd = TcpCommand::new(s, what)
            .read(0, IDENTIFY_LEN as u32)
            .buf(vec![0u8; IDENTIFY_LEN]);
        let (_, buf) = self.q.run(cmd, self.timeout)?;
        if let Some(b) = buf {
            page.copy_from_slice(&b[..IDENTIFY_LEN]);
        }
        Ok(())
    }
    fn set_features(&mut self, fid: u8, cdw11: u32) -> TcpResult<u32> {
        let mut s = Sqe::new(admin_opcode::SET_FEATURES);
        s.cdw10 = fid as u32;
        s.cdw11 = cdw11;
        let (c, _) = self
            .q
            .run(TcpCommand::new(s, "Set Features"), self.timeout)?;
        Ok(c.result)
    }
}

/// List the subsystems a discovery controller at `addr` ("HOST:PORT") offers.
pub fn discover(
    addr: &str,
    host: &HostIdentity,
    opts: &TcpOptions,
) -> TcpResult<Vec<fabrics::DiscoveryRecord>> {
    let target = TcpTarget {
        addr: addr.to_string(),
        subnqn: DISCOVERY_NQN.to_string(),
        nsid: None,
    };
    let ctrl = TcpController::connect(&target, host, opts)?;
    let t = opts.admin_timeout;
    let mut q = ctrl.admin();
    let read = |q: &mut TcpQueue<Vec<u8>>, len: u32| -> TcpResult<Vec<u8>> {
        let cmd = TcpCommand::new(fabrics::discovery_log(len, 0), "Get Log Page (discovery)")
            .read(0, len)
            .buf(vec![0u8; len as usize]);
        let (_, b) = q.run(cmd, t)?;
        Ok(b.unwrap_or_default())
    };
    let head = read(&mut q, 1024)?;
    let numrec = u64::from_le_bytes(head[8..16].try_into().unwrap());
    // Bounded: at most 1,024 records (1 MiB) are read, whatever NUMREC says.
    let n = numrec.min(1024) as u32;
    let page = if n == 0 {
        head
    } else {
        read(&mut q, 1024 * (n + 1))?
    };
    let (_, _, recs) = fabrics::parse_discovery_log(&page).map_err(|e| TcpError::DeviceInput {
        field: "discovery log",
        value: match e {
            fabrics::DiscoveryLogError::RecordFormat(f) => f as u64,
            _ => 0,
        },
        reason: "short or of an unknown record format",
    })?;
    Ok(recs)
}
