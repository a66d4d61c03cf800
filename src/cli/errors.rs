//! What `ubdirect` prints for an error: the one place where the libraries' errors become
//! messages in the user's terms (devices, options, scripts) with the fix, without the
//! libraries' type names or the calls an embedder would make.
//!
//! Library messages are written for embedders ("share the `Arc<PciDevice>`", "call
//! `Controller::reset`"); a command-line user has a command line, `scripts/setup.sh` and the
//! subcommands instead. [`user_message`] rewrites the variants whose fix only an embedder can
//! apply and passes the others through [`scrub`], which turns the embedder's fixes that survive
//! inside already-formatted text (a source error carried as a string) into the user's.

use std::error::Error;

use ubdirect::cuda::CudaError;
use ubdirect::diag::topology::TopologyError;
use ubdirect::dma::seams::{BlockError, SinkError};
use ubdirect::dma::CoreError;
use ubdirect::nvme::NvmeError;
use ubdirect::pipeline::{
    MappedOptionError, PipelineError, SetupError, COPY_ALIGN, MAX_REGISTER_THREADS,
};
use ubdirect::virtio_net::VirtioNetError;

use super::loopback::LoopbackError;

/// The fix for a controller that stopped working under the run.
const RERUN_CONTROLLER: &str = "run the command again (opening the controller resets it); if it keeps failing, check `dmesg` and rebind it with scripts/setup.sh";

/// Embedder phrases (left) that can reach the user inside formatted text, and what the user
/// reads instead (right). Longest first where one contains another.
const PHRASES: &[(&str, &str)] = &[
    // Library options named in the library's errors, and the flags that set them.
    ("PipelineConfig::block_size", "--block-size"),
    ("PipelineConfig::qd", "--queue-depth"),
    ("PipelineConfig::verify", "--verify"),
    ("Limit::Bytes", "--bytes"),
    ("Limit::Duration", "--seconds"),
    ("(use Mode::Direct)", "(use --mode direct)"),
    (
        "or use a sink that needs no GPU",
        "or use --sink null / bar:<pci>/<bar>",
    ),
    (
        "or run without GPU-side verification",
        "or run without --verify",
    ),
    (
        "raise the cap given to FileWindowRegistry::new, or use smaller windows",
        "raise --map-cap or use smaller windows",
    ),
    (
        "open it without ControllerOptions::cmb, or use a controller with one",
        "drop --sq-in-cmb, or use a controller with one",
    ),
    ("drop QueueOptions::sq_in_cmb", "drop --sq-in-cmb"),
    (
        "QueueOptions::sq_in_cmb needs a controller opened with ControllerOptions::cmb = true",
        "--sq-in-cmb needs the controller's Controller Memory Buffer turned on: this is a bug in ubdirect: please report it",
    ),
    (
        "use a smaller queue depth, fewer queue pairs",
        "use a smaller queue depth (-q), fewer queue pairs",
    ),
    ("(PreflightInput::gpu)", "(pass --gpu BDF)"),
    (
        "read the file into the pool instead (the io_uring source, DirectMode::Off or DirectMode::Require)",
        "use --io buffered or --io direct",
    ),
    (
        "(or check a smaller PreflightInput::pool_bytes)",
        "(or pass --pool-mib to check a smaller pool)",
    ),
    (
        "the program with DomainOptions::allow_noiommu",
        "the command with --allow-noiommu (e.g. `ubdirect perf --allow-noiommu`)",
    ),
    (
        ubdirect::nvme::transport::tcp::auth::error::GIVE_SECRET,
        "give the host secret in a file with --dhchap-secret-file PATH, or in $UBD_DHCHAP_SECRET (DHHC-1:..., as nvme gen-dhchap-key writes it, the one the target holds for this host NQN)",
    ),
    (
        "is already in use (by another process, or by another DMA domain of this process)",
        "is already in use by another program (another ubdirect, QEMU, DPDK or SPDK): stop it and run again",
    ),
    (
        "is already open in this DMA domain",
        "is named twice on the command line: name two different devices",
    ),
    (
        ubdirect::nvme::TIMEOUT_ABORTED,
        "the controller did not answer; run the command again (opening the controller resets it); if it keeps failing, check `dmesg` and rebind it with scripts/setup.sh",
    ),
    (
        ubdirect::nvme::TIMEOUT_ADMIN,
        RERUN_CONTROLLER,
    ),
    (
        ubdirect::nvme::TIMEOUT_WAIT,
        RERUN_CONTROLLER,
    ),
    (
        "the queue no longer exists on the device; drop the queue pair and create a new one, or open queues with Recovery::Requeue / FailBack",
        RERUN_CONTROLLER,
    ),
    (
        "requests cannot be replayed on it; drop the queue pairs and reopen the controller",
        "run the command again",
    ),
    (
        "drop the VirtioNet and open the device again",
        "run the command again (opening the device resets it); if it repeats, rebind it with scripts/setup.sh",
    ),
    (
        "a region backs one pool and driver DMA slabs are never pooled; register another region for this pool (UbRegistry::register_*, or UbPool::with_hugepages)",
        "this is a bug in ubdirect: please report it",
    ),
    ("carved as a UbPool", "carved as a pool"),
    (
        "carved as a driver's DMA slab (DmaMem)",
        "carved as a driver's DMA memory",
    ),
    (
        "drop them (and every UbBuf) before unregistering",
        "this is a bug in ubdirect: please report it",
    ),
    (
        "the queue's Recovery decides (Report: Wedged; Requeue / FailBack: controller reset)",
        "the controller is reset and the request submitted again (ubdirect's tools), or the run stops",
    ),
    (
        "every admin command fails at once until Controller::reset",
        "every admin command fails at once until the controller is reset",
    ),
    (
        "drop its queue pairs, then call Controller::reset (or drop and reopen the controller)",
        RERUN_CONTROLLER,
    ),
    (
        "drop the queue pair, then call Controller::reset (or drop and reopen the controller)",
        RERUN_CONTROLLER,
    ),
    (
        "drop its queue pairs and call Controller::reset (or reopen it)",
        RERUN_CONTROLLER,
    ),
    (
        "return buffers (drop UbBuf) sooner or create the pool with more blocks (PoolConfig::block_count)",
        "give the pool more blocks (--blocks or --pool-size) or keep fewer requests in flight",
    ),
    (
        "is already mapped in this DMA domain (each region is registered once)",
        "this is a bug in ubdirect: please report it",
    ),
    (
        "open a PciDevice in it (PciDevice::open) before mapping memory; VFIO sets up the IOMMU when the first group joins and drops it when the last device closes",
        "this is a bug in ubdirect (memory mapped before any device was opened): please report it",
    ),
];

/// The message `ubdirect` prints for `e` (without the `ubdirect: error: ` prefix), and the
/// causes worth a `caused by:` line of their own (those the message does not already say).
pub fn user_message(e: &(dyn Error + 'static)) -> (String, Vec<String>) {
    if let Some(m) = known(e) {
        return (scrub(&m), Vec::new());
    }
    let msg = scrub(&e.to_string());
    let mut causes = Vec::new();
    let mut src = e.source();
    while let Some(s) = src {
        let text = known(s).unwrap_or_else(|| s.to_string());
        let text = scrub(&text);
        if !msg.contains(&text) && !causes.contains(&text) {
            causes.push(text);
        }
        src = s.source();
    }
    (msg, causes)
}

/// Replace embedder phrases with the user's fix.
pub fn scrub(msg: &str) -> String {
    let mut s = msg.to_string();
    for (from, to) in PHRASES {
        if s.contains(from) {
            s = s.replace(from, to);
        }
    }
    s
}

/// The message of a library error this module knows, or `None`.
fn known(e: &(dyn Error + 'static)) -> Option<String> {
    if let Some(e) = e.downcast_ref::<CoreError>() {
        return Some(core_message(e));
    }
    if let Some(e) = e.downcast_ref::<NvmeError>() {
        return Some(nvme_message(e));
    }
    if let Some(e) = e.downcast_ref::<VirtioNetError>() {
        return Some(net_message(e));
    }
    if let Some(e) = e.downcast_ref::<PipelineError>() {
        return Some(pipeline_message(e));
    }
    if let Some(e) = e.downcast_ref::<CudaError>() {
        return Some(cuda_message(e));
    }
    if let Some(e) = e.downcast_ref::<SetupError>() {
        return Some(setup_message(e));
    }
    if let Some(e) = e.downcast_ref::<LoopbackError>() {
        return Some(match e {
            LoopbackError::Driver(d) => net_message(d),
            LoopbackError::Igb(d) => igb_message(d),
            LoopbackError::Core(c) => core_message(c),
            other => other.to_string(),
        });
    }
    if let Some(e) = e.downcast_ref::<BlockError>() {
        return Some(e.message.clone());
    }
    if let Some(e) = e.downcast_ref::<SinkError>() {
        return Some(e.message.clone());
    }
    if let Some(e) = e.downcast_ref::<TopologyError>() {
        return Some(topology_message(e));
    }
    None
}

/// PCI topology errors: the library states the fact, the CLI adds where to look.
fn topology_message(e: &TopologyError) -> String {
    match e {
        TopologyError::BadAddress(_) => format!("{e} (see `ubdirect devices --all`)"),
        TopologyError::NoSuchDevice(_) => {
            format!("{e}: list the devices with `ubdirect devices --all`")
        }
        other => scrub(&other.to_string()),
    }
}

/// VFIO, PCI and pool errors.
fn core_message(e: &CoreError) -> String {
    match e {
        CoreError::NoSuchDevice { .. } => {
            format!("{e}: check the address with `ubdirect devices` (or `lspci -D`)")
        }
        CoreError::NotBoundToVfio { addr, driver } => format!(
            "PCI device {addr} is bound to {}, not vfio-pci: bind it with `sudo PCI_ALLOWED={addr} scripts/setup.sh` (`scripts/setup.sh reset` gives it back to its kernel driver)",
            driver
                .as_deref()
                .map(|d| format!("driver {d}"))
                .unwrap_or_else(|| "no driver".into())
        ),
        CoreError::GroupBusy { addr, group } => format!(
            "IOMMU group {group} of {addr} is already in use by another program (another ubdirect, QEMU, DPDK or SPDK): stop it and run again"
        ),
        CoreError::DeviceResetting { addr, .. } => format!(
            "{e}: wait for the reset to finish (a `reset` written to /sys/bus/pci/devices/{addr}/reset, or another program resetting it) and run again"
        ),
        CoreError::AlreadyOpen { addr } => format!(
            "PCI device {addr} is named twice on the command line (e.g. as both source and sink): name two different devices"
        ),
        CoreError::NoDevice => internal("memory was mapped before any device was opened"),
        CoreError::AlreadyMapped { .. } => internal("memory was registered twice"),
        CoreError::NotMapped { .. } => internal("memory that is not mapped was unmapped"),
        CoreError::NoSuchRegion { .. } => internal("an unknown buffer region was used"),
        CoreError::RegionBusy { .. } => internal("a buffer region was released while in use"),
        CoreError::RegionTaken { .. } => internal("a buffer region was given to two owners"),
        CoreError::PoolExhausted {
            block_count,
            block_size,
            ..
        } => format!(
            "all {block_count} buffers of {block_size} bytes are in use: give the pool more blocks (--blocks or --pool-size) or keep fewer requests in flight"
        ),
        CoreError::Backend {
            backend: "noiommu",
            reason,
            ..
        } if reason.contains("did not opt in to the no-IOMMU back end") => {
            "DMA back end noiommu: refused: the device sits in a vfio no-IOMMU group, where it can read and write all of memory, and this command was not told to allow that; turn the IOMMU on (intel_iommu=on / amd_iommu=on), or opt in with --allow-noiommu on the command (identify, perf, log, pipeline, loopback; e.g. `ubdirect perf --allow-noiommu`) after `UBD_ALLOW_NOIOMMU=1 scripts/setup.sh config`".to_string()
        }
        CoreError::IovaExhausted { len, .. } => format!(
            "no room left in the device's DMA address space for {len} more bytes: use a smaller pool (--pool-size, --blocks)"
        ),
        other => scrub(&other.to_string()),
    }
}

/// A failure only a bug in ubdirect can cause.
fn internal(what: &str) -> String {
    format!(
        "internal error: {what}: this is a bug in ubdirect: please report it with the command line"
    )
}

/// NVMe driver errors.
fn nvme_message(e: &NvmeError) -> String {
    match e {
        NvmeError::Core(c) => core_message(c),
        NvmeError::NotNvme { .. } => {
            format!("{e}: check the address with `ubdirect devices`")
        }
        NvmeError::ControllerFatal { csts, during } => format!(
            "the NVMe controller reported a fatal error (CSTS.CFS=1, CSTS={csts:#x}) while {during}: {RERUN_CONTROLLER}"
        ),
        NvmeError::ControllerNotReady { csts, during } => format!(
            "the NVMe controller stopped (CSTS.RDY=0, CSTS={csts:#x}) while {during}: it was reset, disabled or removed under ubdirect: {RERUN_CONTROLLER}"
        ),
        NvmeError::Wedged {
            qid,
            outstanding,
            waited,
        } => format!(
            "the NVMe controller is stuck: {outstanding} command(s) on queue {qid} neither completed nor aborted within {waited:?}: {RERUN_CONTROLLER}"
        ),
        NvmeError::Timeout {
            command,
            cid,
            qid,
            waited,
            ..
        } => format!(
            "NVMe {command} (command {cid}, queue {qid}) did not complete within {waited:?}: the controller did not answer; {RERUN_CONTROLLER}"
        ),
        NvmeError::ResetUnderQueue { qid, outstanding } => format!(
            "the NVMe controller was reset under queue {qid} ({outstanding} request(s) in flight): {RERUN_CONTROLLER}"
        ),
        NvmeError::NamespaceChanged { nsid } => format!(
            "namespace {nsid} changed across a controller reset (size, block size or metadata): run the command again"
        ),
        NvmeError::NamespaceMissing { nsid, active } => format!(
            "namespace {nsid} is not active on this controller ({active} namespace(s) are): `ubdirect identify <pci-addr>` lists their ids"
        ),
        NvmeError::QueueFull { depth, .. } => format!(
            "the NVMe queue is full ({depth} commands in flight): lower the queue depth"
        ),
        NvmeError::RequestTooLarge { len, max_cmd, .. } => format!(
            "a request of {len} bytes needs more NVMe commands of at most {max_cmd} bytes than the queue holds: lower --block-size or raise the queue depth"
        ),
        NvmeError::BufferTooSmall { need, have, .. } => format!(
            "a {need}-byte transfer does not fit a {have}-byte buffer: lower the I/O size or raise the block size"
        ),
        NvmeError::NoQueuesLeft { granted } => format!(
            "the controller granted {granted} I/O queue pair(s) and all are in use: use fewer cores"
        ),
        other => scrub(&other.to_string()),
    }
}

/// virtio-net driver errors.
fn net_message(e: &VirtioNetError) -> String {
    match e {
        VirtioNetError::Core(c) => core_message(c),
        VirtioNetError::NotVirtioNet { .. } => {
            format!("{e}: check the address with `ubdirect devices`")
        }
        VirtioNetError::DeviceGone { addr, cause } => format!(
            "{addr} is gone: {cause}: rebind it to vfio-pci (scripts/setup.sh) and run again"
        ),
        VirtioNetError::DeviceNeedsReset { addr, status } => format!(
            "{addr} reports a device failure (device_status {status:#04x}): run again (opening the device resets it); if it repeats, rebind it with scripts/setup.sh"
        ),
        VirtioNetError::MissingFeatures { addr, missing } => format!(
            "{addr} does not offer {}: ubdirect needs VIRTIO_F_VERSION_1 (a modern device: QEMU `disable-legacy=on`) and VIRTIO_F_ACCESS_PLATFORM (DMA through the IOMMU: QEMU `iommu_platform=on`)",
            flag_names(missing.iter_names().map(|(n, _)| n))
        ),
        VirtioNetError::FeaturesRejected { addr, accepted } => format!(
            "{addr} refused the features {} (FEATURES_OK did not stick): this device cannot work with ubdirect",
            flag_names(accepted.iter_names().map(|(n, _)| n))
        ),
        VirtioNetError::RxBlocksTooSmall { need, .. } => format!(
            "receive buffers must hold {need} bytes (header and largest frame): lower --frame-size"
        ),
        VirtioNetError::RxPoolTooSmall { need, blocks, .. } => format!(
            "the receive rings need {need} buffers but the pool has {blocks}: this is a bug in ubdirect: please report it with the command line"
        ),
        other => scrub(&other.to_string()),
    }
}

/// igb driver errors.
fn igb_message(e: &ubdirect::igb::IgbError) -> String {
    use ubdirect::igb::IgbError;
    match e {
        IgbError::Core(c) => core_message(c),
        IgbError::NotIgb { .. } | IgbError::VirtualFunction { .. } => {
            format!("{e}: check the addresses with `ubdirect devices` (both NICs of a loop-back use one driver)")
        }
        IgbError::DeviceGone { addr, cause } => format!(
            "{addr} is gone: {cause}: rebind it to vfio-pci (scripts/setup.sh) and run again"
        ),
        other => scrub(&other.to_string()),
    }
}

/// Bit names joined with `|`, or "no features".
fn flag_names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<&str> = names.collect();
    if v.is_empty() {
        "no features".into()
    } else {
        v.join(" | ")
    }
}

/// Pipeline errors: the source's and sink's messages without their kind tags.
fn pipeline_message(e: &PipelineError) -> String {
    match e {
        PipelineError::Source(b) => format!("source: {}", scrub(&b.message)),
        PipelineError::Sink(s) => format!("sink: {}", scrub(&s.message)),
        PipelineError::MappedOption(m) => mapped_flag_message(m),
        PipelineError::RemovalRequested { device } => format!(
            "the kernel asked for device {device} back (hot-unplug, sysfs remove or unbind): the run stopped and released it; rescan and rebind it to vfio-pci (scripts/setup.sh) to use it again"
        ),
        other => scrub(&other.to_string()),
    }
}

/// A pipeline setting the builder refused, said with the flag that set it.
pub fn setup_message(e: &SetupError) -> String {
    match e {
        SetupError::QueueDepthZero => "--queue-depth must be at least 1".into(),
        SetupError::PoolEmpty { block_size } => format!(
            "the pool holds no block: --pool-size must be at least --block-size ({block_size})"
        ),
        SetupError::CopyNeedsFile => {
            "--mode copy is the classic read() path: it needs a file: source".into()
        }
        SetupError::CopyToBar => {
            "--mode copy has no BAR variant: a BAR is reached by DMA only".into()
        }
        SetupError::MappedSettingsUnused => "--copy-size, --map-window and --register-threads set up --io mapped (a file: source, --io mapped or auto); this run reads into the UB pool in --block-size blocks".into(),
        SetupError::RepeatZero => "--repeat must be at least 1".into(),
        SetupError::VerifyRepeat => "--verify checks one run: drop --repeat".into(),
        SetupError::MappedNeedsCuda => "--io mapped hands registered page cache to the GPU copy engines: it needs --sink cuda[...] and --mode direct (use --io buffered or direct otherwise)".into(),
        SetupError::StartPastEnd { start, size } => format!(
            "--offset {start} is not below the file's {size} bytes: nothing to stream"
        ),
        SetupError::Mapped(m) => mapped_flag_message(m),
        SetupError::WindowOverCap { window, cap } => format!(
            "a {window}-byte window cannot be registered under --map-cap {cap}: lower --map-window (or --copy-size), or raise --map-cap"
        ),
        SetupError::BarTooSmall { len, block_size } => format!(
            "BAR window of {len} bytes cannot hold one {block_size}-byte block: lower --block-size"
        ),
        SetupError::NamespaceNotActive { addr, nsid, active } => {
            super::namespace::not_active(&addr.to_string(), *nsid, active)
        }
        SetupError::NoGpu => "cuda:all: the driver sees no GPU".into(),
        SetupError::SinkCannotVerify => {
            "this sink cannot check what it received: run without --verify".into()
        }
        SetupError::NoSource => internal("the pipeline ran without a source"),
        SetupError::NotBuilt { feature } => format!(
            "this ubdirect was built without {feature} support: build it with the default features"
        ),
    }
}

/// A mapped-run setting the library refused, said with the flag that set it.
fn mapped_flag_message(e: &MappedOptionError) -> String {
    match *e {
        MappedOptionError::CopySizeZero => {
            format!("--copy-size must be at least {COPY_ALIGN} (4K), not 0")
        }
        MappedOptionError::CopySizeUnaligned { size } => format!(
            "--copy-size {size} is not a multiple of 4K: use {} or {}",
            size / COPY_ALIGN * COPY_ALIGN,
            size.next_multiple_of(COPY_ALIGN)
        ),
        MappedOptionError::CopySizeTooLarge { size, span, start } => format!(
            "--copy-size {size} exceeds the {span} bytes streamed from the file (its size less --offset {start}): use at most {}",
            span.next_multiple_of(COPY_ALIGN as u64)
        ),
        MappedOptionError::WindowNotMultiple { window, copy_size } => format!(
            "--map-window {window} must be a positive multiple of the copy size ({copy_size} bytes; --copy-size sets it)"
        ),
        MappedOptionError::RegisterThreads { threads } => {
            format!("--register-threads {threads}: use 1 to {MAX_REGISTER_THREADS}")
        }
    }
}

/// CUDA errors: the driver's error code by its CUDA name.
fn cuda_message(e: &CudaError) -> String {
    match e {
        CudaError::Driver { call, err } => {
            format!("CUDA call {call} failed with {:?}", err.0)
        }
        other => scrub(&other.to_string()),
    }
}

#[cfg(test)]
#[path = "errors_tests.rs"]
mod tests;
