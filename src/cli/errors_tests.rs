//! Every library error the CLI can meet, as the user reads it: no Rust type names, no `::`,
//! no `Arc<`, no Debug dumps of library structs.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ubdirect::cuda::{CudaError, WindowError};
use ubdirect::diag::topology::TopologyError;
use ubdirect::dma::seams::{BlockError, BlockErrorKind, SinkError, SinkErrorKind};
use ubdirect::dma::{CoreError, PciAddress};
use ubdirect::hugepages::{HugeError, PageSize};
use ubdirect::nvme::prp::PrpError;
use ubdirect::nvme::{NvmeError, NvmeStatus};
use ubdirect::pipeline::{PipelineError, SetupError};
use ubdirect::uring::UringError;
use ubdirect::virtio_net::Features;
use ubdirect::virtio_net::VirtioNetError;

use super::*;
use crate::cli::loopback::LoopbackError;

fn addr() -> PciAddress {
    "0000:00:04.0".parse().unwrap()
}

fn ioe() -> io::Error {
    io::Error::from_raw_os_error(libc::EBUSY)
}

/// Words allowed although they look like CamelCase (units, a systemd directive).
const ALLOWED: &[&str] = &["KiB", "MiB", "GiB", "TiB", "LimitMEMLOCK"];

/// Library type names that are single words (CamelCase detection cannot catch them), as they
/// would appear in a Debug dump or a call.
const TYPE_WORDS: &[&str] = &[
    "Controller",
    "Features(",
    "Duration",
    "Some(",
    "None",
    "PciAddress",
];

/// Why `msg` would show the user a Rust type name, if it does.
fn type_name_in(msg: &str) -> Option<String> {
    if msg.contains("::") {
        return Some("`::`".into());
    }
    if msg.contains("Arc<") {
        return Some("`Arc<`".into());
    }
    for w in msg.split(|c: char| !c.is_ascii_alphanumeric() && c != '_') {
        let mut chars = w.chars();
        let Some(first) = chars.next() else { continue };
        if !first.is_ascii_uppercase() || ALLOWED.contains(&w) {
            continue;
        }
        // CamelCase: a lower-case letter followed later by an upper-case one.
        let b = w.as_bytes();
        if b.windows(2)
            .any(|p| p[0].is_ascii_lowercase() && p[1].is_ascii_uppercase())
        {
            return Some(format!("CamelCase word `{w}`"));
        }
    }
    for t in TYPE_WORDS {
        if msg.contains(t) && !(t == &"Controller" && msg.contains("Controller ")) {
            return Some(format!("`{t}`"));
        }
    }
    None
}

/// The no-IOMMU back end's refusals, as the library makes them.
fn noiommu_errors() -> Vec<CoreError> {
    use ubdirect::dma::vfio::{noiommu, BackendKind, DomainOptions};
    let smaps = "7f0000000000-7f0000100000 rw-p 00000000 00:00 0 \nKernelPageSize:        4 kB\n";
    vec![
        ubdirect::dma::DmaDomain::with_options(DomainOptions {
            backend: Some(BackendKind::NoIommu),
            allow_noiommu: false,
        })
        .unwrap_err(),
        noiommu::dma_address_in(smaps, 0x7f00_0000_0000, 4096, |_| Ok(0)).unwrap_err(),
        noiommu::dma_address_in(smaps, 0x1000, 4096, |_| Ok(0)).unwrap_err(),
        noiommu::device_memory_refusal("BAR 2 of 0000:00:05.0"),
    ]
}

#[test]
fn noiommu_refusals_speak_the_cli_s_terms() {
    let m: Vec<String> = noiommu_errors().iter().map(|e| user_message(e).0).collect();
    assert!(m[0].contains("ubdirect perf --allow-noiommu"), "{}", m[0]);
    assert!(
        m[0].contains("UBD_ALLOW_NOIOMMU=1 scripts/setup.sh config"),
        "{}",
        m[0]
    );
    assert!(
        m[1].contains("hugepage memory only (a hugepage pool"),
        "{}",
        m[1]
    );
    for t in &m {
        assert!(type_name_in(t).is_none(), "{t}");
    }
}

fn core_errors() -> Vec<CoreError> {
    let mut v = noiommu_errors();
    v.extend(core_errors_other());
    v
}

fn core_errors_other() -> Vec<CoreError> {
    vec![
        CoreError::VfioUnavailable {
            reason: "no /dev/vfio/vfio".into(),
        },
        CoreError::NoSuchDevice {
            addr: addr(),
            path: PathBuf::from("/sys/bus/pci/devices/0000:00:04.0"),
        },
        CoreError::NoIommuGroup { addr: addr() },
        CoreError::NotBoundToVfio {
            addr: addr(),
            driver: Some("nvme".into()),
        },
        CoreError::NotBoundToVfio {
            addr: addr(),
            driver: None,
        },
        CoreError::GroupNotViable {
            addr: addr(),
            group: 3,
            others: "0000:00:1f.0 (lpc_ich)".into(),
        },
        CoreError::PermissionDenied {
            path: "/dev/vfio/3".into(),
            user: "alice".into(),
        },
        CoreError::MemlockTooLow {
            needed: 1 << 30,
            limit: 8 << 20,
        },
        CoreError::IovaExhausted {
            len: 1 << 30,
            align: 1 << 21,
            largest_free: 1 << 20,
        },
        CoreError::AlreadyMapped {
            vaddr: 0x1000,
            len: 4096,
        },
        CoreError::NotMapped {
            iova: 0x1000,
            len: 4096,
        },
        CoreError::GroupBusy {
            addr: addr(),
            group: 3,
        },
        CoreError::AlreadyOpen { addr: addr() },
        CoreError::DeviceResetting {
            addr: addr(),
            waited: std::time::Duration::from_secs(2),
        },
        CoreError::NoDevice,
        CoreError::Vfio {
            op: "open container",
            source: vfio_ioctls::VfioError::OpenContainer(ioe()),
        },
        CoreError::Io {
            op: "mmap BAR 2".into(),
            source: ioe(),
        },
        CoreError::ConfigAccess {
            addr: addr(),
            what: "read",
            off: 0x10,
            len: 4,
            reason: "short read".into(),
        },
        CoreError::BadBar {
            addr: addr(),
            bar: 2,
            reason: "not a memory BAR".into(),
        },
        CoreError::DeviceGone { offset: 0x1c },
        CoreError::Unsupported {
            addr: addr(),
            what: "removal notice",
        },
        CoreError::InvalidArgument("block size must be a power of two".into()),
        CoreError::PoolExhausted {
            block_count: 8,
            block_size: 4096,
            waited: Some(Duration::from_millis(5)),
        },
        CoreError::NoSuchRegion { id: 3 },
        CoreError::MmioOutOfRange {
            offset: 0x2000,
            size: 4,
            window: 0x1000,
            reason: "outside",
        },
        CoreError::RegionTaken {
            id: 3,
            owner: ubdirect::dma::RegionOwner::Pool,
        },
        CoreError::RegionBusy { id: 3, users: 2 },
        CoreError::HugePages(HugeError::NoFreePages {
            size: PageSize::Size2M,
            node: Some(0),
            need: 4,
            free: 0,
        }),
    ]
}

fn huge_errors() -> Vec<HugeError> {
    let p = || PathBuf::from("/sys/kernel/mm/hugepages");
    vec![
        HugeError::NoFreePages {
            size: PageSize::Size1G,
            node: None,
            need: 2,
            free: 1,
        },
        HugeError::ReserveShort {
            size: PageSize::Size2M,
            node: Some(1),
            wanted: 512,
            got: 100,
        },
        HugeError::SizeUnsupported {
            size: PageSize::Size1G,
            path: p(),
        },
        HugeError::NoSuchNode { node: 7, path: p() },
        HugeError::Io {
            op: "read",
            path: p(),
            source: ioe(),
        },
        HugeError::Parse {
            path: p(),
            content: "x".into(),
        },
        HugeError::InvalidLength { len: 0 },
        HugeError::Memfd {
            size: PageSize::Size2M,
            source: ioe(),
        },
        HugeError::Map {
            op: "mmap",
            len: 1 << 21,
            size: PageSize::Size2M,
            source: ioe(),
        },
        HugeError::Mbind {
            node: 1,
            source: ioe(),
        },
        HugeError::NoPhysAddr {
            addr: 0x1000,
            reason: "pagemap unreadable",
        },
    ]
}

fn nvme_errors() -> Vec<NvmeError> {
    let mut v: Vec<NvmeError> = core_errors().into_iter().map(NvmeError::Core).collect();
    v.extend([
        NvmeError::NotNvme {
            addr: "0000:00:04.0".into(),
            class: 0x020000,
        },
        NvmeError::DeviceGone { register: "CSTS" },
        NvmeError::ControllerFatal {
            csts: 3,
            during: "polling queue 1",
        },
        NvmeError::ControllerNotReady {
            csts: 0,
            during: "polling queue 1",
        },
        NvmeError::ReadyTimeout {
            ready: true,
            timeout: Duration::from_secs(2),
            csts: 0,
        },
        NvmeError::Unsupported {
            what: "4 KiB memory pages",
        },
        NvmeError::Command {
            command: "Read",
            status: NvmeStatus::new(0, 0x80),
        },
        NvmeError::Timeout {
            command: "Read",
            cid: 3,
            qid: 1,
            waited: Duration::from_secs(5),
            then: ubdirect::nvme::TIMEOUT_ABORTED,
        },
        NvmeError::Wedged {
            qid: 1,
            outstanding: 2,
            waited: Duration::from_secs(10),
        },
        NvmeError::QueueFull {
            qid: 1,
            depth: 32,
            needed: 2,
        },
        NvmeError::NamespaceMissing { nsid: 9, active: 1 },
        NvmeError::LbaOutOfRange {
            nsid: 1,
            slba: 100,
            nlb: 8,
            nsze: 64,
        },
        NvmeError::LengthNotBlockMultiple {
            nsid: 1,
            len: 100,
            lba_size: 512,
        },
        NvmeError::OffsetNotBlockAligned {
            offset: 100,
            lba_size: 512,
        },
        NvmeError::BufferTooSmall {
            need: 8192,
            have: 4096,
            offset: 0,
        },
        NvmeError::Prp(PrpError::Empty),
        NvmeError::Prp(PrpError::Misaligned { iova: 0x1001 }),
        NvmeError::Prp(PrpError::SegmentNotPageAligned {
            index: 1,
            iova: 0x1200,
            len: 512,
            page_size: 4096,
        }),
        NvmeError::Prp(PrpError::ListTooSmall { capacity: 512 }),
        NvmeError::RequestTooLarge {
            len: 1 << 30,
            commands: 2048,
            max_cmd: 1 << 20,
            depth: 64,
        },
        NvmeError::InvalidArgument("log page length must be a multiple of 4"),
        NvmeError::MalformedCompletion {
            qid: 1,
            cid: 9,
            sq_id: 1,
            reason: "unknown command id",
        },
        NvmeError::NoQueuesLeft { granted: 2 },
        NvmeError::NoCmb {
            addr: "0000:00:04.0".into(),
        },
        NvmeError::CmbNoSqs {
            addr: "0000:00:04.0".into(),
        },
        NvmeError::CmbTooSmall {
            addr: "0000:00:04.0".into(),
            need: 8192,
            free: 4096,
            size: 16 << 20,
        },
        NvmeError::DeviceInput {
            field: "CAP.DSTRD",
            value: 0xf,
            reason: "the doorbells would lie outside BAR 0",
        },
        NvmeError::FailedByReset {
            command: "Read",
            qid: 1,
        },
        NvmeError::ResetUnderQueue {
            qid: 1,
            outstanding: 3,
        },
        NvmeError::NamespaceChanged { nsid: 1 },
        NvmeError::Timeout {
            command: "Identify",
            cid: 1,
            qid: 0,
            waited: Duration::from_secs(5),
            then: ubdirect::nvme::TIMEOUT_ADMIN,
        },
        NvmeError::Timeout {
            command: "Read",
            cid: 1,
            qid: 1,
            waited: Duration::from_secs(5),
            then: ubdirect::nvme::TIMEOUT_WAIT,
        },
    ]);
    v
}

fn igb_errors() -> Vec<ubdirect::igb::IgbError> {
    use ubdirect::igb::IgbError as E;
    let a = addr();
    let mut v: Vec<E> = core_errors().into_iter().map(E::Core).collect();
    v.extend([
        E::NotIgb {
            addr: a,
            vendor: 0x1af4,
            device: 0x1041,
        },
        E::VirtualFunction { addr: a },
        E::BarTooSmall {
            addr: a,
            len: 0x4000,
            need: 0x20000,
        },
        E::ResetTimeout {
            addr: a,
            waited: Duration::from_secs(1),
            ctrl: 1 << 26,
        },
        E::DeviceGone {
            addr: a,
            cause: "STATUS reads all-ones (0xffffffff)",
        },
        E::LinkDown {
            addr: a,
            waited: Some(Duration::from_secs(3)),
        },
        E::LinkDown {
            addr: a,
            waited: None,
        },
        E::PhyAccess {
            addr: a,
            mdic: 1 << 30,
        },
        E::RingRejected {
            addr: a,
            queue: 0,
            what: "RDLEN",
            wrote: 0x10000,
            read: 0,
        },
        E::BadRxLength {
            addr: a,
            queue: 0,
            index: 3,
            len: 5000,
            buf: 4096,
        },
        E::HeadOutOfRange {
            addr: a,
            queue: 0,
            reg: "RDH",
            head: 999,
            size: 256,
        },
        E::FrameTooLarge {
            index: 1,
            len: 1519,
            max: 1518,
        },
        E::FrameTooShort {
            index: 0,
            len: 10,
            min: 14,
        },
        E::RxBlocksTooSmall {
            block_size: 1024,
            need: 2048,
        },
        E::RxPoolTooSmall {
            blocks: 10,
            need: 255,
        },
        E::EmptyBurst("tx_burst got no frames"),
        E::InvalidConfig("rx_ring_size 12 is not a multiple of 8".into()),
    ]);
    v
}

fn net_errors() -> Vec<VirtioNetError> {
    let mut v: Vec<VirtioNetError> = core_errors()
        .into_iter()
        .map(VirtioNetError::Core)
        .collect();
    v.extend([
        VirtioNetError::NotVirtioNet {
            addr: addr(),
            vendor: 0x8086,
            device: 0x100e,
        },
        VirtioNetError::CapOutsideBar {
            addr: addr(),
            what: "common",
            bar: 4,
            offset: 0x1000,
            length: 0x1000,
            bar_len: 0x1000,
        },
        VirtioNetError::MissingFeatures {
            addr: addr(),
            missing: Features::VERSION_1 | Features::ACCESS_PLATFORM,
        },
        VirtioNetError::FeaturesRejected {
            addr: addr(),
            accepted: Features::VERSION_1,
        },
        VirtioNetError::ResetTimeout {
            addr: addr(),
            waited: Duration::from_secs(1),
            status: 0x40,
        },
        VirtioNetError::DeviceNeedsReset {
            addr: addr(),
            status: 0x40,
        },
        VirtioNetError::DeviceGone {
            addr: addr(),
            cause: "config space reads all-ones",
        },
        VirtioNetError::QueueUnavailable {
            addr: addr(),
            queue: 4,
            num_queues: 2,
        },
        VirtioNetError::MsixVector {
            addr: addr(),
            queue: 0,
            read: 1,
        },
        VirtioNetError::NotifyOutOfRange {
            addr: addr(),
            queue: 0,
            offset: 0x1000,
            len: 0x100,
        },
        VirtioNetError::FrameTooLarge {
            index: 0,
            len: 9000,
            max: 1514,
        },
        VirtioNetError::FrameTooShort {
            index: 0,
            len: 10,
            min: 14,
        },
        VirtioNetError::BufferTooSmall {
            need: 1526,
            frame: 1514,
            have: 1024,
        },
        VirtioNetError::RxBlocksTooSmall {
            block_size: 1024,
            need: 1526,
            max_frame: 1514,
        },
        VirtioNetError::RxPoolTooSmall {
            blocks: 8,
            need: 256,
            pairs: 1,
            ring: 256,
        },
        VirtioNetError::EmptyBurst("no frames"),
        VirtioNetError::DeviceConfig {
            addr: addr(),
            source: ubdirect::virtio_net::net_config::NetConfigError::Short {
                field: "mtu",
                off: 10,
                end: 12,
                len: 8,
            },
        },
        VirtioNetError::ControlTimeout {
            addr: addr(),
            what: "MQ pairs",
            waited: Duration::from_secs(1),
        },
        VirtioNetError::ControlQueueWedged {
            addr: addr(),
            what: "MQ pairs",
            cause: "an earlier command timed out",
        },
        VirtioNetError::InvalidConfig("rx_queue_size must be a power of two".into()),
        VirtioNetError::ControlCommand {
            addr: addr(),
            what: "promiscuous mode",
            reason: "device said no".into(),
        },
    ]);
    v
}

fn uring_errors() -> Vec<UringError> {
    let p = || PathBuf::from("/dev/nvme0n1");
    vec![
        UringError::Open {
            path: p(),
            source: ioe(),
        },
        UringError::DirectRefused {
            path: p(),
            source: ioe(),
        },
        UringError::NotBlockSource { path: p() },
        UringError::Setup(ioe()),
        UringError::RegisterBuffers {
            count: 1,
            source: ioe(),
        },
        UringError::OutOfRange {
            offset: 1 << 30,
            len: 4096,
            capacity: 1 << 20,
        },
        UringError::Unaligned {
            offset: 100,
            len: 4096,
            align: 512,
        },
        UringError::BufferTooSmall {
            len: 8192,
            buf_len: 4096,
        },
        UringError::TooLarge {
            len: 4 << 30,
            max: 1 << 30,
        },
        UringError::ZeroLength,
        UringError::QueueFull { depth: 32 },
        UringError::ReadOnly,
        UringError::Enter(ioe()),
        UringError::Io {
            op: "read",
            offset: 0,
            source: ioe(),
        },
        UringError::UnknownCompletion(7),
        UringError::Timeout(Duration::from_secs(30)),
    ]
}

fn pipeline_errors() -> Vec<PipelineError> {
    let mut v = vec![
        PipelineError::Pool("exhausted".into()),
        PipelineError::Stalled {
            secs: 30,
            in_flight: 4,
        },
        PipelineError::RemovalRequested { device: addr() },
        PipelineError::Verify("this sink cannot verify".into()),
        PipelineError::ShortRead {
            offset: 1 << 20,
            got: 512,
            want: 4096,
        },
        PipelineError::Io {
            what: "read the reference".into(),
            source: ioe(),
        },
        PipelineError::Sink(SinkError::new(SinkErrorKind::Device, "BAR write failed")),
    ];
    v.extend(config_errors().into_iter().map(PipelineError::Config));
    // A source error carries the driver's message as text: every NVMe and io_uring error.
    for e in nvme_errors() {
        v.push(PipelineError::Source(BlockError::new(
            BlockErrorKind::DeviceGone,
            e.to_string(),
        )));
    }
    for e in uring_errors() {
        v.push(PipelineError::Source(BlockError::new(
            BlockErrorKind::Other,
            e.to_string(),
        )));
    }
    v
}

/// Every refusal of the pipeline builder.
fn setup_errors() -> Vec<SetupError> {
    use ubdirect::pipeline::MappedOptionError;
    vec![
        SetupError::NoSource,
        SetupError::QueueDepthZero,
        SetupError::PoolEmpty { block_size: 4096 },
        SetupError::CopyNeedsFile,
        SetupError::CopyToBar,
        SetupError::MappedSettingsUnused,
        SetupError::RepeatZero,
        SetupError::VerifyRepeat,
        SetupError::MappedNeedsCuda,
        SetupError::StartPastEnd {
            start: 1 << 20,
            size: 4096,
        },
        SetupError::Mapped(MappedOptionError::CopySizeZero),
        SetupError::WindowOverCap {
            window: 1 << 30,
            cap: 1 << 20,
        },
        SetupError::BarTooSmall {
            len: 4096,
            block_size: 1 << 20,
        },
        SetupError::NamespaceNotActive {
            addr: addr(),
            nsid: Some(3),
            active: vec![1, 2],
        },
        SetupError::NoGpu,
        SetupError::NotBuilt { feature: "cuda" },
        SetupError::SinkCannotVerify,
    ]
}

#[test]
fn the_cli_names_its_flags_for_pipeline_settings() {
    let m = |e: SetupError| user_message(&e).0;
    assert_eq!(
        m(SetupError::VerifyRepeat),
        "--verify checks one run: drop --repeat"
    );
    assert!(m(SetupError::MappedNeedsCuda).contains("--sink cuda[...] and --mode direct"));
    let m = m(SetupError::NamespaceNotActive {
        addr: addr(),
        nsid: Some(3),
        active: vec![1, 2],
    });
    assert!(m.contains("--ns 1"), "{m}");
}

/// What `PipelineConfig::validate` says about each kind of bad setting.
fn config_errors() -> Vec<String> {
    use ubdirect::pipeline::{Limit, PipelineConfig};
    let d = PipelineConfig::default;
    let bad = [
        PipelineConfig {
            block_size: 1000,
            ..d()
        },
        PipelineConfig { qd: 0, ..d() },
        PipelineConfig {
            limit: Limit::Bytes(0),
            ..d()
        },
        PipelineConfig {
            limit: Limit::Duration(Duration::ZERO),
            ..d()
        },
        PipelineConfig {
            verify: true,
            limit: Limit::Bytes(2 << 30),
            ..d()
        },
        PipelineConfig {
            verify: true,
            limit: Limit::Duration(Duration::from_secs(1)),
            ..d()
        },
        PipelineConfig { start: 7, ..d() },
    ];
    bad.iter()
        .map(|c| c.validate(1 << 30, 512).unwrap_err())
        .collect()
}

fn cuda_errors() -> Vec<CudaError> {
    vec![
        CudaError::NoDriver,
        CudaError::NoNvrtc,
        CudaError::NoDevice {
            ordinal: 3,
            count: 1,
        },
        CudaError::Driver {
            call: "cuMemcpyHtoDAsync",
            err: cudarc::driver::DriverError(
                cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE,
            ),
        },
        CudaError::Compile("syntax error".into()),
        CudaError::Invalid("streams must be at least 1".into()),
        CudaError::Unsupported("dma-buf export".into()),
    ]
}

fn topology_errors() -> Vec<TopologyError> {
    vec![
        TopologyError::BadAddress("04.0".into()),
        TopologyError::NoSuchDevice("0000:00:09.0".into()),
        TopologyError::Io {
            path: "/sys/bus/pci/devices".into(),
            source: ioe(),
        },
        TopologyError::Hugepages(HugeError::InvalidLength { len: 0 }),
        TopologyError::Parse {
            path: "/sys/bus/pci/devices/0000:00:04.0/class".into(),
            what: "not hex".into(),
        },
    ]
}

fn window_errors() -> Vec<WindowError> {
    vec![
        WindowError::Io {
            what: "mmap",
            source: ioe(),
        },
        WindowError::OutOfRange {
            offset: 0,
            end: 8192,
            size: 4096,
        },
        WindowError::TooLarge {
            len: 1 << 30,
            cap: 1 << 20,
        },
        WindowError::FileChanged {
            old_size: 4096,
            new_size: 8192,
            mtime_changed: true,
            dropped: 1,
        },
        WindowError::Pin("refused".into()),
        WindowError::Ub(CoreError::NoDevice),
    ]
}

/// Every library error of the lists above, as the library makes it.
fn library_errors() -> Vec<Box<dyn Error + Send + Sync>> {
    let mut errs: Vec<Box<dyn Error + Send + Sync>> = Vec::new();
    errs.extend(core_errors().into_iter().map(|e| e.into()));
    errs.extend(huge_errors().into_iter().map(|e| e.into()));
    errs.extend(nvme_errors().into_iter().map(|e| e.into()));
    errs.extend(net_errors().into_iter().map(|e| e.into()));
    errs.extend(uring_errors().into_iter().map(|e| e.into()));
    errs.extend(pipeline_errors().into_iter().map(|e| e.into()));
    errs.extend(setup_errors().into_iter().map(|e| e.into()));
    errs.extend(cuda_errors().into_iter().map(|e| e.into()));
    errs.extend(topology_errors().into_iter().map(|e| e.into()));
    errs
}

/// Every error as `main` would print it: the message and its `caused by` lines.
fn all_printed() -> Vec<(String, String)> {
    let mut errs = library_errors();
    errs.extend(
        net_errors()
            .into_iter()
            .map(|e| LoopbackError::Driver(e).into()),
    );
    errs.extend(
        core_errors()
            .into_iter()
            .map(|e| LoopbackError::Core(e).into()),
    );
    errs.extend(
        igb_errors()
            .into_iter()
            .map(|e| LoopbackError::Igb(e).into()),
    );
    errs.push(LoopbackError::Setup("--batch 0 is out of range (1..=4096)".into()).into());
    errs.push(LoopbackError::Failed("2 of 3 frames came back".into()).into());
    // Not Debug: a CUDA driver error's Debug asks libcuda for its text (absent here).
    errs.into_iter()
        .enumerate()
        .map(|(i, e)| {
            let (msg, causes) = user_message(e.as_ref());
            (format!("error #{i}"), [msg, causes.join("\n")].join("\n"))
        })
        .collect()
}

#[test]
fn no_error_the_cli_prints_names_a_rust_type() {
    let printed = all_printed();
    assert!(printed.len() > 200, "{} errors", printed.len());
    let bad: Vec<String> = printed
        .iter()
        .filter_map(|(debug, text)| {
            type_name_in(text).map(|why| format!("{why} in {text:?}\n  (from {debug})"))
        })
        .collect();
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_checker_catches_type_names() {
    for s in [
        "share the Arc<PciDevice> instead",
        "open the device in the same DmaDomain",
        "call Controller::reset",
        "does not offer Features(VERSION_1)",
        "source: DeviceGone: gone",
    ] {
        assert!(type_name_in(s).is_some(), "{s}");
    }
    assert!(type_name_in("the NVMe controller has 64 MiB; raise LimitMEMLOCK").is_none());
}

#[test]
fn fixes_name_what_a_user_can_do() {
    let (m, _) = user_message(&CoreError::NotBoundToVfio {
        addr: addr(),
        driver: Some("nvme".into()),
    });
    assert!(
        m.contains("PCI_ALLOWED=0000:00:04.0 scripts/setup.sh") && !m.contains("setup bind"),
        "{m}"
    );
    let (m, _) = user_message(&CoreError::AlreadyOpen { addr: addr() });
    assert!(m.contains("named twice"), "{m}");
    let (m, _) = user_message(&CoreError::GroupBusy {
        addr: addr(),
        group: 3,
    });
    assert!(
        m.contains("another program") && !m.contains("Domain"),
        "{m}"
    );
    let (m, _) = user_message(&NvmeError::Wedged {
        qid: 1,
        outstanding: 1,
        waited: Duration::from_secs(1),
    });
    assert!(m.contains("run the command again"), "{m}");
    // Wrapped errors are rewritten too.
    let e: Box<dyn Error + Send + Sync> = NvmeError::Core(CoreError::NoDevice).into();
    let (m, _) = user_message(e.as_ref());
    assert!(m.starts_with("internal error"), "{m}");
}

#[test]
fn plain_errors_keep_their_causes_once() {
    let e = CoreError::Io {
        op: "mmap".into(),
        source: ioe(),
    };
    let (m, causes) = user_message(&e);
    assert!(m.starts_with("mmap failed"), "{m}");
    assert!(causes.is_empty(), "{causes:?}");
    let s: Box<dyn Error + Send + Sync> = "plain message".into();
    assert_eq!(user_message(s.as_ref()), ("plain message".into(), vec![]));
}

#[test]
fn a_wrong_address_gets_the_cli_s_advice_the_library_leaves_out() {
    // The libraries state the fact; the CLI adds where to look (`ubdirect devices`).
    let core = CoreError::NoSuchDevice {
        addr: addr(),
        path: "/sys/bus/pci/devices/0000:00:04.0".into(),
    };
    let nvme = NvmeError::NotNvme {
        addr: "0000:00:06.0".into(),
        class: 0x050000,
    };
    let net = VirtioNetError::NotVirtioNet {
        addr: addr(),
        vendor: 0x1b36,
        device: 0x0010,
    };
    for e in [&core as &(dyn Error + 'static), &nvme, &net] {
        assert!(!e.to_string().contains("ubdirect"), "{e}");
        let (m, _) = user_message(e);
        assert!(
            m.ends_with("check the address with `ubdirect devices`")
                || m.ends_with("check the address with `ubdirect devices` (or `lspci -D`)"),
            "{m}"
        );
    }
}

/// The first command-line flag of `ubdirect` that `text` names: `--name`, or a one-letter `-q`
/// standing alone, outside a `backticked` command of another tool (`ulimit -l`).
fn flag_in(text: &str) -> Option<String> {
    let text: String = text
        .split('`')
        .enumerate()
        .filter(|(i, part)| i % 2 == 0 || part.starts_with("ubdirect"))
        .map(|(_, part)| part)
        .collect::<Vec<_>>()
        .join(" ");
    let text = text.as_str();
    let b = text.as_bytes();
    for i in 0..b.len() {
        if b[i] != b'-' || (i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'-')) {
            continue;
        }
        let rest = &text[i..];
        let word: String = rest
            .chars()
            .skip_while(|&c| c == '-')
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        let dashes = rest.len() - rest.trim_start_matches('-').len();
        let starts_alpha = word.starts_with(|c: char| c.is_ascii_alphabetic());
        if (dashes == 2 && starts_alpha) || (dashes == 1 && starts_alpha && word.len() == 1) {
            return Some(format!("{}{word}", "-".repeat(dashes)));
        }
    }
    None
}

#[test]
fn the_flag_checker_catches_flags() {
    for s in [
        "raise --map-cap",
        "--qd must be at least 1",
        "use a smaller queue depth (-q)",
        "run with -q 8",
        "(`ubdirect perf --allow-noiommu`)",
    ] {
        assert!(flag_in(s).is_some(), "{s}");
    }
    for s in [
        "QEMU: -device nvme,cmb_size_mb=16",
        "a read-only namespace",
        "offset -1",
        "x - y",
        "bytes 0..4096",
        "raise it (`ulimit -l unlimited`)",
    ] {
        assert_eq!(flag_in(s), None, "{s}");
    }
}

/// Library errors speak the library's terms (options by their field or method name); only
/// the CLI names its flags.
#[test]
fn no_library_error_names_a_cli_flag() {
    let mut errs = library_errors();
    errs.extend(window_errors().into_iter().map(|e| e.into()));
    let mut bad = Vec::new();
    // A CUDA driver error's Display asks libcuda for its text (absent here).
    errs.retain(|e| !matches!(e.downcast_ref(), Some(CudaError::Driver { .. })));
    for e in &errs {
        let mut src: Option<&(dyn Error + 'static)> = Some(e.as_ref());
        while let Some(s) = src {
            let text = s.to_string();
            if let Some(flag) = flag_in(&text) {
                bad.push(format!("{flag} in {text:?}"));
            }
            src = s.source();
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_cli_names_its_flags_for_library_options() {
    let printed = |e: PipelineError| user_message(&e).0;
    let config = config_errors();
    let m = printed(PipelineError::Config(config[0].clone()));
    assert!(
        m.starts_with("--block-size 1000 must be a positive multiple"),
        "{m}"
    );
    let m = printed(PipelineError::Config(config[1].clone()));
    assert_eq!(m, "--queue-depth must be at least 1");
    let m = printed(PipelineError::Config(config[4].clone()));
    assert!(
        m.starts_with("--verify checks one pass over the source: --bytes 2147483648"),
        "{m}"
    );
    let m = printed(PipelineError::Config(config[5].clone()));
    assert_eq!(
        m,
        "--verify needs --bytes (one pass over the source), not --seconds"
    );
    let (m, _) = user_message(&NvmeError::NoCmb {
        addr: "0000:00:04.0".into(),
    });
    assert!(m.contains("drop --sq-in-cmb"), "{m}");
    let (m, _) = user_message(&CudaError::NoDriver);
    assert!(m.contains("--sink null"), "{m}");
    let too_large = WindowError::TooLarge {
        len: 1 << 30,
        cap: 1 << 20,
    };
    let m = printed(PipelineError::Sink(SinkError::new(
        SinkErrorKind::Device,
        too_large.to_string(),
    )));
    assert!(m.contains("raise --map-cap"), "{m}");
    let (m, _) = user_message(&TopologyError::NoSuchDevice("0000:00:09.0".into()));
    assert!(m.contains("`ubdirect devices --all`"), "{m}");
    assert!(scrub("no GPU selected (PreflightInput::gpu): x").contains("(pass --gpu BDF)"));
}

/// The string literals of Rust source `src` (escapes left as written), outside comments and
/// outside an inline `#[cfg(test)]` module (from its attribute to the end of the file).
fn string_literals(src: &str) -> Vec<String> {
    let src = match src.find("#[cfg(test)]\nmod ") {
        Some(i) => &src[..i],
        None => src,
    };
    let b = src.as_bytes();
    let (mut out, mut i) = (Vec::new(), 0);
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                i = src[i..].find('\n').map_or(b.len(), |n| i + n);
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i = src[i..].find("*/").map_or(b.len(), |n| i + n + 2);
            }
            b'\'' if b.get(i + 2) == Some(&b'\'') || b.get(i + 1) == Some(&b'\\') => {
                // A char literal ('"', '\'', '\n'): skip to its closing quote.
                let n = src[i + 2..].find('\'').map_or(b.len(), |n| i + 2 + n);
                i = n + 1;
            }
            b'r' if b.get(i + 1) == Some(&b'#') || b.get(i + 1) == Some(&b'"') => {
                let hashes = src[i + 1..].bytes().take_while(|&c| c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"')
                    || (i > 0 && b[i - 1].is_ascii_alphanumeric())
                {
                    i += 1;
                    continue;
                }
                let close = format!("\"{}", "#".repeat(hashes));
                let start = i + 2 + hashes;
                let end = src[start..].find(&close).map_or(b.len(), |n| start + n);
                out.push(src[start..end].to_string());
                i = end + close.len();
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                out.push(src[i + 1..j.min(b.len())].to_string());
                i = j + 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// Every `.rs` file under `dir`, test files (`tests.rs`, `*_tests.rs`, `tests/`) left out.
fn library_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_dir() && name != "tests" {
            library_sources(&p, out);
        } else if name.ends_with(".rs") && !name.ends_with("tests.rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_literal_reader_finds_strings_outside_comments() {
    let src = "let a = \"one --x\"; // \"two --y\"\n/* \"three\" */ let c = '\"'; let r = r#\"four \"q\" --z\"#;\nlet s = \"a \\\"b\\\" c\";\n#[cfg(test)]\nmod tests { \"five\" }";
    assert_eq!(
        string_literals(src),
        ["one --x", "four \"q\" --z", "a \\\"b\\\" c"]
    );
}

/// Every string literal in the library crates' sources (errors built with `format!`, plain
/// strings handed to `Config(..)` or `InvalidArgument(..)`, `#[error]` texts) is free of CLI
/// flags: the variant lists above cannot reach every message a function builds.
#[test]
fn no_string_in_a_library_crate_names_a_cli_flag() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["core", "hugepages", "diag", "facade", "devmodel", "drivers"] {
        library_sources(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "{} library sources", files.len());
    let mut bad = Vec::new();
    for f in &files {
        let src = std::fs::read_to_string(f).unwrap();
        for lit in string_literals(&src) {
            if let Some(flag) = flag_in(&lit) {
                bad.push(format!("{}: {flag} in {lit:?}", f.display()));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
