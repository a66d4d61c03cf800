//! [`DmaDomain`]: one IOMMU address space shared by every device opened in it.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use vfio_ioctls::{VfioContainer, VfioError};

use super::backend::{Backend, OpenedDevice};
use super::domain_id::DomainId;
use super::iommu_info::IommuInfo;
use super::mapping::DmaMapping;
use super::preflight::{group_members_in, DeviceSysfs};
use super::segments::DmaSegment;
use super::select::{self, BackendChoice, BackendKind, DomainOptions};
use crate::error::{CoreError, Result};
use crate::iova::{IovaAllocator, IovaError};
use crate::pci::PciAddress;

/// IOVAs below this are never handed out, so a zero or tiny bus address from a driver bug
/// faults in the IOMMU instead of landing in a buffer.
const IOVA_FLOOR: u64 = 1 << 20;

/// One IOMMU address space. Devices opened in it ([`crate::pci::PciDevice::open`]) share its
/// mappings; memory is mapped once ([`DmaDomain::map`]) at an IOVA the domain allocates within
/// the IOMMU's valid ranges. Each mapping is owned by the [`DmaMapping`] `map` returns (a
/// [`crate::UbRegion`] holds its own): nothing else can unmap it.
///
/// Drop order: drivers and registries hold `Arc<DmaDomain>`, so the domain (the container, and
/// with it every remaining mapping) outlives every device and region that uses it.
///
/// The IOMMU follows the devices: VFIO tears the IOMMU (and every mapping) down when the last
/// device of the container closes, and closing a device makes vfio-pci disable and reset it.
/// The domain keeps its mappings on record meanwhile and replays them, at the same IOVAs,
/// when a device opens in it again; `map` without any open device is
/// [`CoreError::NoDevice`].
///
/// The back end (type1 container, iommufd IOAS) is chosen when the first device opens
/// ([`select::choose`]: automatic, `UBD_IOMMU_BACKEND`, or [`DomainOptions::backend`]); every
/// later device must use the same one. An iommufd IOAS outlives its devices: its mappings stay
/// while no device is open (nothing is replayed); new mappings still wait for a device.
pub struct DmaDomain {
    id: DomainId,
    backend: OnceLock<Backend>,
    options: DomainOptions,
    state: Mutex<State>,
}

struct State {
    /// IOMMU facts; None until the first device joins a type1 container.
    info: Option<IommuInfo>,
    /// True while the IOMMU is set up (a device is open; always for host-only).
    live: bool,
    /// Devices open in the domain.
    devices: BTreeSet<PciAddress>,
    /// Restriction of IOVAs (a device's DMA width, or a test), intersected with `info`.
    limit: Option<Range<u64>>,
    iova: IovaAllocator,
    /// iova -> the mapping's record.
    maps: BTreeMap<u64, Entry>,
    /// vaddr -> len, to refuse double mappings of the same memory.
    by_vaddr: BTreeMap<usize, usize>,
    /// Bytes mapped (pinned by the IOMMU driver).
    mapped: u64,
    /// Why the back end was chosen (set with it).
    choice: Option<BackendChoice>,
}

/// One mapping on record.
#[derive(Clone)]
struct Entry {
    vaddr: usize,
    len: usize,
    /// The IOMMU translation was removed ([`DmaMapping::revoke`]); the IOVAs stay reserved.
    revoked: bool,
    /// Mapped with READ permission only ([`DmaDomain::map_readonly`]).
    readonly: bool,
    /// Mapped by file ([`DmaDomain::map_file`]); never replayed.
    file: bool,
    /// `vaddr` is the CPU address of the memory and on record in `by_vaddr` (false for a
    /// file mapping without a CPU mapping, whose `vaddr` is 0).
    indexed: bool,
    /// No-IOMMU memory whose physical pages are scattered: its pieces, each reserved in the
    /// allocator at its own bus address (empty: one range at the entry's IOVA).
    segments: Arc<[DmaSegment]>,
}

impl Entry {
    /// The IOVA ranges the entry holds in the allocator.
    fn ranges(&self, iova: u64) -> Vec<(u64, u64)> {
        if self.segments.is_empty() {
            vec![(iova, self.len as u64)]
        } else {
            self.segments
                .iter()
                .map(|g| (g.iova, g.len as u64))
                .collect()
        }
    }
}

/// Where a new mapping goes in the IOVA space.
enum Place {
    /// A fresh range aligned to this many bytes (the IOMMU back ends).
    Alloc(u64),
    /// The memory's own bus addresses (no-IOMMU: its physical pieces).
    Fixed(Vec<DmaSegment>),
}

impl State {
    fn rebuild_allocator(&mut self) {
        let floor = IOVA_FLOOR..u64::MAX;
        let ranges: Vec<Range<u64>> = self
            .info
            .iter()
            .flat_map(|i| i.iova_ranges.iter().cloned())
            .map(|r| intersect(&r, &floor))
            .map(|r| match &self.limit {
                Some(l) => intersect(&r, l),
                None => r,
            })
            .filter(|r| r.start < r.end)
            .collect();
        self.iova = IovaAllocator::new(&ranges);
        // Mappings that exist (an iommufd IOAS re-queried after another device attached)
        // keep their IOVAs.
        for (&iova, e) in &self.maps {
            for (a, n) in e.ranges(iova) {
                let _ = self.iova.reserve(a, n);
            }
        }
    }
}

/// [`CoreError::AlreadyMapped`] when `[va, va+len)` overlaps memory this domain has mapped:
/// memory is mapped once, on every back end (iommufd itself would map it again).
fn check_not_mapped(s: &State, va: usize, len: usize) -> Result<()> {
    if let Some((&pv, &pl)) = s.by_vaddr.range(..va.saturating_add(len)).next_back() {
        if pv + pl > va {
            return Err(CoreError::AlreadyMapped { vaddr: va, len });
        }
    }
    Ok(())
}

/// A fresh IOVA range of `len` bytes aligned to `align`, or why there is none.
fn alloc_iova(s: &mut State, len: usize, align: u64) -> Result<u64> {
    s.iova.alloc(len as u64, align).map_err(|e| match e {
        IovaError::Exhausted { largest_free } => CoreError::IovaExhausted {
            len: len as u64,
            align,
            largest_free,
        },
        other => CoreError::InvalidArgument(format!("IOVA allocation: {other:?}")),
    })
}

fn intersect(a: &Range<u64>, b: &Range<u64>) -> Range<u64> {
    a.start.max(b.start)..a.end.min(b.end)
}

impl std::fmt::Debug for DmaDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("DmaDomain")
            .field("id", &self.id)
            .field("host_only", &self.is_host_only())
            .field("info", &s.info)
            .field("mappings", &s.maps.len())
            .field("mapped_bytes", &s.mapped)
            .finish()
    }
}

impl DmaDomain {
    /// A new VFIO type1v2 container. The IOMMU is configured when the first device opens in
    /// it; until then [`DmaDomain::map`] answers [`CoreError::NoDevice`].
    ///
    /// The back end is chosen when the first device opens (see [`DmaDomain::with_options`]);
    /// when `/dev/iommu` is missing and nothing asks for another back end, the type1 container
    /// is opened here, so a machine without VFIO fails now.
    pub fn new() -> Result<Arc<DmaDomain>> {
        DmaDomain::with_options(DomainOptions::default())
    }

    /// A new domain whose back end follows `options` (which win over `UBD_IOMMU_BACKEND`). A
    /// forced back end that cannot work here, or no-IOMMU without `allow_noiommu`, is refused
    /// now with the fix.
    pub fn with_options(options: DomainOptions) -> Result<Arc<DmaDomain>> {
        let env = std::env::var(select::BACKEND_ENV).ok();
        let forced = match options.backend {
            Some(k) => Some(k),
            None => match env.as_deref().map(str::trim).filter(|v| !v.is_empty()) {
                Some(v) => Some(v.parse::<BackendKind>()?),
                None => None,
            },
        };
        let eager_type1 = match forced {
            Some(BackendKind::Type1) => true,
            Some(BackendKind::Iommufd) => {
                if !Path::new("/dev/iommu").exists() {
                    return Err(CoreError::Backend {
                        backend: "iommufd",
                        reason: "asked for (UBD_IOMMU_BACKEND or DomainOptions::backend) but /dev/iommu does not exist".into(),
                        fix: "boot a kernel with CONFIG_IOMMUFD and CONFIG_VFIO_DEVICE_CDEV (`modprobe iommufd`), or use UBD_IOMMU_BACKEND=type1".into(),
                    });
                }
                false
            }
            Some(BackendKind::NoIommu) => {
                noiommu_opt_ins(&options)?;
                false
            }
            // With vfio's no-IOMMU mode on, the first device's group decides (a type1
            // container opened now would refuse its no-IOMMU group).
            None => {
                !Path::new("/dev/iommu").exists()
                    && super::noiommu::operator_opt_in(Path::new("/")).is_err()
            }
        };
        let d = DmaDomain::with_backend(None, None, options);
        if eager_type1 {
            let b = open_type1()?;
            let _ = d.backend.set(b);
        }
        Ok(Arc::new(d))
    }
}

/// The no-IOMMU back end needs both opt-ins: the library's ([`DomainOptions::allow_noiommu`])
/// and the operator's (vfio's unsafe no-IOMMU mode); the error says which is missing.
fn noiommu_opt_ins(options: &DomainOptions) -> Result<()> {
    noiommu_opt_ins_in(Path::new("/"), options)
}

fn noiommu_opt_ins_in(root: &Path, options: &DomainOptions) -> Result<()> {
    if !options.allow_noiommu {
        return Err(CoreError::Backend {
            backend: "noiommu",
            reason: "refused: without an IOMMU a device can read and write all of memory, and the program did not opt in to the no-IOMMU back end".into(),
            fix: "turn the IOMMU on (intel_iommu=on / amd_iommu=on), or opt in twice: the operator with `UBD_ALLOW_NOIOMMU=1 scripts/setup.sh config`, the program with DomainOptions::allow_noiommu".into(),
        });
    }
    super::noiommu::operator_opt_in(root)
}

/// A VFIO type1v2 container back end, with today's error mapping.
fn open_type1() -> Result<Backend> {
    {
        let c = VfioContainer::new(None).map_err(|e| match e {
            VfioError::OpenContainer(io) => match io.kind() {
                std::io::ErrorKind::PermissionDenied => CoreError::PermissionDenied {
                    path: "/dev/vfio/vfio".into(),
                    user: current_user(),
                },
                std::io::ErrorKind::NotFound => CoreError::VfioUnavailable {
                    reason: "/dev/vfio/vfio does not exist".into(),
                },
                _ => CoreError::VfioUnavailable {
                    reason: format!("opening /dev/vfio/vfio: {io}"),
                },
            },
            other => CoreError::VfioUnavailable {
                reason: format!("the VFIO container refused type1v2 ({other})"),
            },
        })?;
        Ok(Backend::Type1(Arc::new(c)))
    }
}

impl DmaDomain {
    /// A domain without an IOMMU: [`DmaDomain::map`] only allocates IOVAs (in [1 MiB, 2^48))
    /// and no device can be opened. For the kernel (io_uring) path on machines without VFIO,
    /// host tests and benchmarks.
    pub fn host_only() -> Arc<DmaDomain> {
        let info = IommuInfo {
            page_sizes: (1 << 12) | (1 << 21) | (1 << 30),
            iova_ranges: std::iter::once(0..(1 << 48)).collect(),
        };
        Arc::new(DmaDomain::with_backend(
            Some(Backend::HostOnly),
            Some(info),
            DomainOptions::default(),
        ))
    }

    fn with_backend(
        backend: Option<Backend>,
        info: Option<IommuInfo>,
        options: DomainOptions,
    ) -> DmaDomain {
        let mut st = State {
            live: info.is_some(),
            devices: BTreeSet::new(),
            info,
            limit: None,
            iova: IovaAllocator::new(&[]),
            maps: BTreeMap::new(),
            by_vaddr: BTreeMap::new(),
            mapped: 0,
            choice: None,
        };
        st.rebuild_allocator();
        let cell = OnceLock::new();
        if let Some(b) = backend {
            let _ = cell.set(b);
        }
        DmaDomain {
            id: DomainId::next(),
            backend: cell,
            options,
            state: Mutex::new(st),
        }
    }

    /// The domain's identity, carried by every region mapped in it.
    pub fn id(&self) -> DomainId {
        self.id
    }

    /// The back end, once chosen.
    fn backend(&self) -> Option<&Backend> {
        self.backend.get()
    }

    /// The back end in use (None: host-only, or no device has opened yet).
    pub fn backend_kind(&self) -> Option<BackendKind> {
        self.backend().and_then(Backend::kind)
    }

    /// The back end chosen for the first device and why (None until a device opened).
    pub fn backend_choice(&self) -> Option<BackendChoice> {
        self.lock().choice.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every update is a single
        // insert/remove after the fallible step), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True for a [`DmaDomain::host_only`] domain.
    pub fn is_host_only(&self) -> bool {
        matches!(self.backend(), Some(Backend::HostOnly))
    }

    /// The IOMMU's valid IOVA ranges (half-open); empty until the first device joins.
    pub fn iova_ranges(&self) -> Vec<Range<u64>> {
        self.lock()
            .info
            .as_ref()
            .map(|i| i.iova_ranges.clone())
            .unwrap_or_default()
    }

    /// Bitmap of IOMMU page sizes (bit n: 2^n bytes); 0 until the first device joins.
    pub fn page_sizes(&self) -> u64 {
        self.lock().info.as_ref().map(|i| i.page_sizes).unwrap_or(0)
    }

    /// Restrict the IOVAs this domain hands out to `range` (a device that addresses only 32
    /// bits, or a test). Only while nothing is mapped.
    pub fn restrict_iova(&self, range: Range<u64>) -> Result<()> {
        let mut s = self.lock();
        if !s.maps.is_empty() {
            return Err(CoreError::InvalidArgument(format!(
                "restrict_iova with {} mappings live: restrict before mapping anything",
                s.maps.len()
            )));
        }
        s.limit = Some(range);
        s.rebuild_allocator();
        Ok(())
    }

    /// Map `[vaddr, vaddr+len)` at a fresh IOVA aligned to `align` (raised to the IOMMU's
    /// smallest page). `vaddr` and `len` must be page aligned. The returned [`DmaMapping`]
    /// owns the mapping: it is removed when that is unmapped or dropped, and by nothing else.
    ///
    /// # Safety
    /// The memory must stay mapped in this process until the returned mapping is unmapped
    /// ([`DmaMapping::unmap`] succeeds, or it is dropped), and devices may read and write it at
    /// any time in between: the caller must not rely on its contents without its own protocol.
    pub unsafe fn map(
        self: &Arc<Self>,
        vaddr: *mut u8,
        len: usize,
        align: usize,
    ) -> Result<DmaMapping> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.map_access(vaddr, len, align, false) }
    }

    /// [`DmaDomain::map`] with READ permission only: devices may read `[vaddr, vaddr+len)`,
    /// and a device write into its IOVAs faults in the IOMMU (the write never lands). The
    /// memory may be a read-only mapping of the process (a file mapped PROT_READ).
    ///
    /// # Safety
    /// The memory must stay mapped in this process until the returned mapping is unmapped.
    pub unsafe fn map_readonly(
        self: &Arc<Self>,
        vaddr: *mut u8,
        len: usize,
        align: usize,
    ) -> Result<DmaMapping> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.map_access(vaddr, len, align, true) }
    }

    /// # Safety
    /// As [`DmaDomain::map`].
    unsafe fn map_access(
        self: &Arc<Self>,
        vaddr: *mut u8,
        len: usize,
        align: usize,
        readonly: bool,
    ) -> Result<DmaMapping> {
        let mut s = self.lock();
        let info = self.live_info(&s)?;
        let page = info.min_page() as usize;
        let va = vaddr as usize;
        if len == 0 || va % page != 0 || len % page != 0 {
            return Err(CoreError::InvalidArgument(format!(
                "map of [{va:#x}, +{len:#x}): address and length must be non-zero multiples of the IOMMU page ({page:#x})"
            )));
        }
        if !align.is_power_of_two() {
            return Err(CoreError::InvalidArgument(format!(
                "map alignment {align:#x} is not a power of two"
            )));
        }
        check_not_mapped(&s, va, len)?;
        let align = (align as u64).max(page as u64);
        let place = if self.backend_kind() == Some(BackendKind::NoIommu) {
            // No translation: the bus addresses are the memory's physical ones.
            Place::Fixed(super::noiommu_group::dma_segments_for(
                va,
                len,
                align,
                s.limit.as_ref(),
                super::noiommu::dma_segments,
            )?)
        } else {
            Place::Alloc(align)
        };
        let needed = s.mapped + len as u64;
        let entry = Entry {
            vaddr: va,
            len,
            revoked: false,
            readonly,
            file: false,
            indexed: true,
            segments: Arc::new([]),
        };
        self.map_with(&mut s, place, entry, |iova| {
            // SAFETY: forwarded from this function's contract.
            unsafe { self.backend_map(iova, len, vaddr, readonly) }
                .map_err(|errno| map_errno(errno, needed, va, len, iova))
        })
    }

    /// Map `[vaddr, vaddr+len)` at the given bus-address pieces through the no-IOMMU placement
    /// (host tests of memory in pieces, on any back end).
    ///
    /// # Safety
    /// As [`DmaDomain::map`].
    #[cfg(test)]
    pub(crate) unsafe fn map_in_pieces(
        self: &Arc<Self>,
        vaddr: *mut u8,
        len: usize,
        pieces: Vec<DmaSegment>,
    ) -> Result<DmaMapping> {
        let mut s = self.lock();
        check_not_mapped(&s, vaddr as usize, len)?;
        let entry = Entry {
            vaddr: vaddr as usize,
            len,
            revoked: false,
            readonly: false,
            file: false,
            indexed: true,
            segments: Arc::new([]),
        };
        self.map_with(&mut s, Place::Fixed(pieces), entry, |_| Ok(()))
    }

    /// The IOMMU facts while mappings can be made. No device open: NoDevice on every back end
    /// (an iommufd IOAS keeps its mappings, but new ones wait for a device, whose attach may
    /// narrow the usable IOVA ranges).
    fn live_info(&self, s: &State) -> Result<IommuInfo> {
        s.info
            .clone()
            .filter(|_| s.live && (!s.devices.is_empty() || self.is_host_only()))
            .ok_or(CoreError::NoDevice)
    }

    /// The one "place, program the IOMMU, record it" sequence of every kind of mapping on
    /// every back end: takes the IOVA range (`place`: a fresh one, or the no-IOMMU memory's own
    /// bus addresses, refused as [`CoreError::AlreadyMapped`] when that physical memory is
    /// mapped under another virtual address), then `program` (the back-end call) at its start;
    /// when that fails, the range goes back and nothing is recorded.
    fn map_with(
        self: &Arc<Self>,
        s: &mut State,
        place: Place,
        mut entry: Entry,
        program: impl FnOnce(u64) -> Result<()>,
    ) -> Result<DmaMapping> {
        let len = entry.len;
        let iova = match place {
            Place::Alloc(align) => alloc_iova(s, len, align)?,
            Place::Fixed(segs) => {
                for (i, g) in segs.iter().enumerate() {
                    if s.iova.reserve(g.iova, g.len as u64).is_err() {
                        for h in &segs[..i] {
                            let _ = s.iova.free(h.iova, h.len as u64);
                        }
                        return Err(CoreError::AlreadyMapped {
                            vaddr: entry.vaddr,
                            len,
                        });
                    }
                }
                let first = segs.first().map_or(0, |g| g.iova);
                if segs.len() > 1 {
                    entry.segments = segs.into();
                }
                first
            }
        };
        if let Err(e) = program(iova) {
            for (a, n) in entry.ranges(iova) {
                let _ = s.iova.free(a, n);
            }
            return Err(e);
        }
        let segments = entry.segments.clone();
        if entry.indexed {
            s.by_vaddr.insert(entry.vaddr, len);
        }
        s.maps.insert(iova, entry);
        s.mapped += len as u64;
        Ok(DmaMapping::new(self.clone(), iova, len, segments))
    }

    /// # Safety
    /// As [`Backend::map`].
    unsafe fn backend_map(
        &self,
        iova: u64,
        len: usize,
        va: *mut u8,
        ro: bool,
    ) -> std::result::Result<(), i32> {
        let Some(b) = self.backend() else {
            return Err(libc::ENODEV);
        };
        // SAFETY: forwarded from this function's contract.
        unsafe {
            if ro {
                b.map_readonly(iova, len, va)
            } else {
                b.map(iova, len, va)
            }
        }
    }

    fn backend_unmap(&self, iova: u64, len: usize) -> std::result::Result<(), i32> {
        match self.backend() {
            Some(b) => b.unmap(iova, len),
            None => Ok(()),
        }
    }

    /// Map bytes `[offset, offset+len)` of the file `fd` (a memfd, or a dma-buf such as a
    /// device BAR exported by vfio-pci or GPU memory exported by its driver) at a fresh IOVA
    /// aligned to `align`, with `IOMMU_IOAS_MAP_FILE`. The IOAS keeps its own reference to
    /// the file: the caller may close `fd`. Only the iommufd back end can; elsewhere the error
    /// says what is needed. Nothing is changed on error.
    pub fn map_file(
        self: &Arc<Self>,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        align: usize,
        writeable: bool,
    ) -> Result<DmaMapping> {
        self.map_file_at(fd, offset, len, align, writeable, None)
    }

    /// [`DmaDomain::map_file`] of bytes the process also reaches at `cpu` (a hugepage memfd's
    /// or a BAR's mmap): those addresses are on record like [`DmaDomain::map`]'s, so the same
    /// memory is mapped once whatever the back end ([`CoreError::AlreadyMapped`]).
    pub(crate) fn map_file_at(
        self: &Arc<Self>,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        align: usize,
        writeable: bool,
        cpu: Option<*mut u8>,
    ) -> Result<DmaMapping> {
        let mut s = self.lock();
        let info = self.live_info(&s)?;
        let Some(b) = self.backend() else {
            return Err(CoreError::NoDevice);
        };
        if b.kind() == Some(BackendKind::NoIommu) {
            return Err(super::noiommu::device_memory_refusal(&format!(
                "file or dma-buf bytes [{offset:#x}, +{len:#x})"
            )));
        }
        let page = info.min_page();
        let va = cpu.map_or(0, |p| p as usize);
        if len == 0
            || offset % page != 0
            || len as u64 % page != 0
            || va as u64 % page != 0
            || !align.is_power_of_two()
        {
            return Err(CoreError::InvalidArgument(format!(
                "map_file of [{offset:#x}, +{len:#x}) aligned {align:#x}: offset and length must be non-zero multiples of the IOMMU page ({page:#x}), the alignment a power of two"
            )));
        }
        if cpu.is_some() {
            check_not_mapped(&s, va, len)?;
        }
        let align = (align as u64).max(page);
        let entry = Entry {
            vaddr: va,
            len,
            revoked: false,
            readonly: !writeable,
            file: true,
            indexed: cpu.is_some(),
            segments: Arc::new([]),
        };
        self.map_with(&mut s, Place::Alloc(align), entry, |iova| {
            match b.map_file(iova, len, fd, offset, writeable) {
                Some(done) => done.map_err(|errno| map_file_errno(errno, offset, len, iova)),
                None => {
                    let kind = b.kind().map(BackendKind::name).unwrap_or("host-only");
                    Err(CoreError::Backend {
                        backend: kind_static(kind),
                        reason: "mapping a file or dma-buf (IOMMU_IOAS_MAP_FILE) needs the iommufd back end".into(),
                        fix: "boot a kernel with CONFIG_IOMMUFD and CONFIG_VFIO_DEVICE_CDEV and leave UBD_IOMMU_BACKEND unset (or set it to iommufd)".into(),
                    })
                }
            }
        })
    }

    /// Remove the mapping at `iova` of `len` bytes and free its IOVAs. Not public: only the
    /// owning [`DmaMapping`] calls it, so no range is freed behind its owner's back.
    pub(super) fn unmap(&self, iova: u64, len: usize) -> Result<()> {
        let mut s = self.lock();
        let revoked = match s.maps.get(&iova) {
            Some(e) if e.len == len => e.revoked,
            _ => return Err(CoreError::NotMapped { iova, len }),
        };
        // Without a device the kernel has already dropped the IOMMU and its mappings.
        if s.live && !revoked {
            self.backend_unmap(iova, len)
                .map_err(|errno| CoreError::Io {
                    op: format!("VFIO_IOMMU_UNMAP_DMA of [{iova:#x}, +{len:#x})"),
                    source: std::io::Error::from_raw_os_error(errno),
                })?;
        }
        if let Some(e) = s.maps.remove(&iova) {
            if e.indexed {
                s.by_vaddr.remove(&e.vaddr);
            }
            for (a, n) in e.ranges(iova) {
                let _ = s.iova.free(a, n);
            }
        }
        if !revoked {
            s.mapped -= len as u64;
        }
        Ok(())
    }

    /// Remove the IOMMU translation of the mapping at `iova` but keep its IOVAs reserved and
    /// its record (for [`DmaMapping::revoke`]); it is not replayed when devices reopen.
    pub(super) fn revoke(&self, iova: u64, len: usize) -> Result<()> {
        let mut s = self.lock();
        match s.maps.get(&iova) {
            Some(e) if e.len == len && e.revoked => return Ok(()),
            Some(e) if e.len == len => {}
            _ => return Err(CoreError::NotMapped { iova, len }),
        }
        if s.live {
            self.backend_unmap(iova, len)
                .map_err(|errno| CoreError::Io {
                    op: format!("VFIO_IOMMU_UNMAP_DMA of [{iova:#x}, +{len:#x}) (revoke)"),
                    source: std::io::Error::from_raw_os_error(errno),
                })?;
        }
        if let Some(e) = s.maps.get_mut(&iova) {
            e.revoked = true;
        }
        s.mapped -= len as u64;
        Ok(())
    }

    /// Number of live mappings made by file ([`DmaDomain::map_file`]: memfd, dma-buf).
    pub fn file_mapping_count(&self) -> usize {
        self.lock().maps.values().filter(|e| e.file).count()
    }

    /// Number of live mappings.
    pub fn mapping_count(&self) -> usize {
        self.lock().maps.len()
    }

    /// Bytes currently mapped.
    pub fn mapped_bytes(&self) -> u64 {
        self.lock().mapped
    }

    /// Open `addr` through this domain's back end: sysfs preflight, group join, IOMMU setup on
    /// the first device (replaying recorded mappings after the devices had all gone).
    pub(crate) fn open_device(&self, addr: PciAddress) -> Result<(OpenedDevice, DeviceSysfs)> {
        let mut s = self.lock();
        if self.is_host_only() {
            return Err(CoreError::VfioUnavailable {
                reason: "this DmaDomain is host-only (DmaDomain::host_only); create it with DmaDomain::new() to open devices".into(),
            });
        }
        if s.devices.contains(&addr) {
            return Err(CoreError::AlreadyOpen { addr });
        }
        let sys = DeviceSysfs::check_in(Path::new("/"), addr)?;
        let choice = select::choose(addr, self.options.backend)?;
        let backend = self.backend_for(&mut s, addr, choice)?;
        let dev = match backend {
            Backend::NoIommu(c) => OpenedDevice::NoIommu(c.open_device(addr, sys.group)?),
            _ => match open_retrying_a_reset(backend, addr) {
                Some(Ok(d)) => OpenedDevice::Vfio(d),
                Some(Err(e)) if refused_by_a_reset(&e) => {
                    return Err(CoreError::DeviceResetting {
                        addr,
                        waited: RESET_RETRY,
                    });
                }
                Some(Err(e)) => {
                    // The cdev bind answers EINVAL (not EBUSY) when the device is already open
                    // through its cdev elsewhere: the group node tells (it is busy then).
                    if bind_refused_einval(&e) && group_node_busy(sys.group) {
                        return Err(CoreError::GroupBusy {
                            addr,
                            group: sys.group,
                        });
                    }
                    return Err(open_error(e, addr, sys.group));
                }
                None => return Err(CoreError::NoDevice),
            },
        };
        match backend {
            Backend::Type1(c) if s.info.is_none() => {
                s.info = Some(IommuInfo::query(c.as_raw_fd())?);
                s.rebuild_allocator();
            }
            // Each attach may narrow the IOAS's ranges: ask again.
            Backend::Iommufd(i) => {
                s.info = Some(super::iommufd::query_info(i)?);
                s.rebuild_allocator();
            }
            // No translation: any page-aligned physical address is a bus address.
            Backend::NoIommu(_) if s.info.is_none() => {
                s.info = Some(IommuInfo {
                    page_sizes: (1 << 12) | (1 << 21) | (1 << 30),
                    iova_ranges: std::iter::once(0..u64::MAX).collect(),
                });
                s.rebuild_allocator();
            }
            _ => {}
        }
        if !s.live {
            self.replay(&s)?;
            s.live = true;
        }
        s.devices.insert(addr);
        Ok((dev, sys))
    }

    /// The domain's back end for a device whose own choice is `choice`: the first device
    /// creates it; a later device must want the same one.
    fn backend_for(
        &self,
        s: &mut State,
        addr: PciAddress,
        choice: BackendChoice,
    ) -> Result<&Backend> {
        if let Some(b) = self.backend() {
            let have = b.kind();
            if have != Some(choice.kind) {
                let have = have.map(BackendKind::name).unwrap_or("host-only");
                let why = s
                    .choice
                    .as_ref()
                    .map(|c| c.reason.clone())
                    .unwrap_or_else(|| "chosen when the domain was created".into());
                return Err(CoreError::Backend {
                    backend: kind_static(have),
                    reason: format!(
                        "{addr} would use the {} back end ({}), but this domain already uses {have} ({why})",
                        choice.kind, choice.reason
                    ),
                    fix: format!("open every device of one domain through the same back end: set UBD_IOMMU_BACKEND={have} (or DomainOptions::backend), or use a separate DmaDomain"),
                });
            }
            if s.choice.is_none() {
                s.choice = Some(choice);
            }
            return Ok(b);
        }
        let b = match choice.kind {
            BackendKind::Type1 => open_type1()?,
            BackendKind::Iommufd => Backend::Iommufd(super::iommufd::open()?),
            BackendKind::NoIommu => {
                noiommu_opt_ins(&self.options)?;
                Backend::NoIommu(super::noiommu_group::NoIommuContainer::open()?)
            }
        };
        tracing::info!(backend = %choice.kind, reason = %choice.reason, "DMA back end chosen");
        if choice.kind == BackendKind::NoIommu {
            tracing::warn!("no-IOMMU mode: devices DMA to physical addresses with no isolation (they can read and write all of memory); only hugepage memory is given to them");
        }
        if choice.kind == BackendKind::Iommufd {
            tracing::info!("iommufd: memory regions map by address (IOMMU_IOAS_MAP); files and dma-bufs by file (IOMMU_IOAS_MAP_FILE)");
        }
        s.choice = Some(choice);
        let _ = self.backend.set(b);
        self.backend().ok_or(CoreError::NoDevice)
    }

    /// Map every recorded mapping again (the IOMMU was rebuilt); all or nothing.
    fn replay(&self, s: &State) -> Result<()> {
        let mut done = Vec::new();
        // File mappings exist only on iommufd, whose IOAS outlives its devices: never rebuilt.
        for (&iova, e) in s.maps.iter().filter(|(_, e)| !e.revoked && !e.file) {
            let (va, len) = (e.vaddr, e.len);
            // SAFETY: the memory was mapped before under map()'s contract and is still owned
            // by its region (which unmaps it through this domain before freeing it).
            if let Err(errno) = unsafe { self.backend_map(iova, len, va as *mut u8, e.readonly) } {
                for &(i, l) in &done {
                    let _ = self.backend_unmap(i, l);
                }
                return Err(map_errno(errno, s.mapped, va, len, iova));
            }
            done.push((iova, len));
        }
        Ok(())
    }

    /// A device of this domain closed (its VfioDevice is dropped). When it was the last one,
    /// VFIO has released the IOMMU and every mapping with it.
    pub(crate) fn device_closed(&self, addr: PciAddress) {
        let mut s = self.lock();
        s.devices.remove(&addr);
        // An iommufd IOAS (and its mappings) outlives its devices.
        if s.devices.is_empty() && matches!(self.backend(), Some(Backend::Type1(_))) {
            s.live = false;
        }
    }

    /// Addresses of the devices open in the domain.
    pub fn device_addresses(&self) -> Vec<PciAddress> {
        self.lock().devices.iter().copied().collect()
    }

    /// Devices open in the domain.
    pub fn device_count(&self) -> usize {
        self.lock().devices.len()
    }
}

/// The user-facing error for a device that failed to open (group `group`).
fn open_error(e: VfioError, addr: PciAddress, group: u32) -> CoreError {
    match e {
        VfioError::OpenGroup(..)
        | VfioError::GroupViable
        | VfioError::GroupSetContainer
        | VfioError::ContainerSetIOMMU(_) => group_open_error(e, addr, group),
        VfioError::OpenDeviceCdev(_)
        | VfioError::InvalidVfioDev
        | VfioError::VfioDeviceBindIommufd(_)
        | VfioError::VfioDeviceAttachIommufdPt(_) => cdev_open_error(e, addr, group),
        other => device_fd_error(other),
    }
}

/// The type1 path: the group file, its viability and the container.
fn group_open_error(e: VfioError, addr: PciAddress, group: u32) -> CoreError {
    match e {
        VfioError::OpenGroup(io, g) => match io.kind() {
            std::io::ErrorKind::PermissionDenied => CoreError::PermissionDenied {
                path: format!("/dev/vfio/{g}").into(),
                user: current_user(),
            },
            _ if io.raw_os_error() == Some(libc::EBUSY) => CoreError::GroupBusy { addr, group },
            _ => CoreError::VfioUnavailable {
                reason: format!("opening /dev/vfio/{g} for {addr}: {io}"),
            },
        },
        VfioError::GroupViable => CoreError::GroupNotViable {
            addr,
            group,
            others: group_members_in(Path::new("/"), group, addr),
        },
        VfioError::GroupSetContainer => CoreError::GroupBusy { addr, group },
        VfioError::ContainerSetIOMMU(err) => CoreError::VfioUnavailable {
            reason: format!("setting the type1v2 IOMMU on the container: {err}"),
        },
        other => device_fd_error(other),
    }
}

/// The iommufd path: the device's cdev, then bind and attach.
fn cdev_open_error(e: VfioError, addr: PciAddress, group: u32) -> CoreError {
    match e {
        VfioError::OpenDeviceCdev(io) => match io.kind() {
            std::io::ErrorKind::PermissionDenied => CoreError::PermissionDenied {
                path: super::select::device_cdev(Path::new("/"), addr)
                    .unwrap_or_else(|| "/dev/vfio/devices/vfioN".into()),
                user: current_user(),
            },
            _ => CoreError::Backend {
                backend: "iommufd",
                reason: format!("opening the vfio cdev of {addr}: {io}"),
                fix: "check that /dev/vfio/devices/ is populated (devtmpfs) and the device is bound to vfio-pci, or use UBD_IOMMU_BACKEND=type1".into(),
            },
        },
        VfioError::InvalidVfioDev => CoreError::Backend {
            backend: "iommufd",
            reason: format!("{addr} has no vfio cdev (sys/bus/pci/devices/{addr}/vfio-dev)"),
            fix: "boot a kernel with CONFIG_VFIO_DEVICE_CDEV and bind the device to vfio-pci, or use UBD_IOMMU_BACKEND=type1".into(),
        },
        VfioError::VfioDeviceBindIommufd(err) => bind_error(err, addr, group),
        VfioError::VfioDeviceAttachIommufdPt(err) => CoreError::Backend {
            backend: "iommufd",
            reason: format!("attaching {addr} to the domain's IOAS: {err}"),
            fix: "check the device's IOMMU group is viable (all members on vfio-pci or unbound) and its IOMMU is on, or use UBD_IOMMU_BACKEND=type1".into(),
        },
        other => device_fd_error(other),
    }
}

/// Binding the device's cdev to /dev/iommu failed with `err`.
fn bind_error(err: vmm_sys_util::errno::Error, addr: PciAddress, group: u32) -> CoreError {
    let others = || group_members_in(Path::new("/"), group, addr);
    match err.errno() {
        // A group member on a host driver: the kernel refuses the DMA ownership (EPERM); the
        // same error as type1's non-viable group, naming the members.
        libc::EPERM
            if others()
                .split(", ")
                .any(|m| !m.ends_with("(vfio-pci)") && !m.ends_with("(no driver)")) =>
        {
            CoreError::GroupNotViable {
                addr,
                group,
                others: others(),
            }
        }
        libc::EBUSY => CoreError::Backend {
            backend: "iommufd",
            reason: format!("binding {addr} to /dev/iommu: the device is already open (in this or another process, or through its group /dev/vfio/{group})"),
            fix: "close the other user of the device first".into(),
        },
        libc::EINVAL => CoreError::Backend {
            backend: "iommufd",
            reason: format!("binding {addr} to /dev/iommu was refused (EINVAL): vfio lets a device be opened once through its cdev, so it is probably open already (in another process, or another DMA domain of this one); otherwise its IOMMU cannot enforce cache coherency"),
            fix: "close the other user of the device first, or use UBD_IOMMU_BACKEND=type1".into(),
        },
        _ => CoreError::Backend {
            backend: "iommufd",
            reason: format!("binding {addr} to /dev/iommu: {err}"),
            fix: "check the device's IOMMU group is viable (all members on vfio-pci or unbound) and its IOMMU is on, or use UBD_IOMMU_BACKEND=type1".into(),
        },
    }
}

/// Getting the device's file descriptor, and anything else.
fn device_fd_error(e: VfioError) -> CoreError {
    match e {
        VfioError::GroupGetDeviceFD(err) if err.errno() == libc::EBUSY => CoreError::Vfio {
            op: "opening the device (it is already open in this or another process)",
            source: VfioError::GroupGetDeviceFD(err),
        },
        other => CoreError::Vfio {
            op: "opening the device",
            source: other,
        },
    }
}

/// How long opening a device is retried while the kernel refuses it because a reset of the
/// device is under way (a sysfs reset takes ~100 ms-1 s on real hardware).
const RESET_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// Open a device through `backend`, again every 10 ms for up to [`RESET_RETRY`] while the kernel
/// answers EAGAIN: vfio-pci resets a device on open with `pci_try_reset_function`, which fails
/// with EAGAIN while another reset (e.g. through sysfs) holds the device lock.
fn open_retrying_a_reset(
    backend: &Backend,
    addr: PciAddress,
) -> Option<std::result::Result<vfio_ioctls::VfioDevice, VfioError>> {
    let end = std::time::Instant::now() + RESET_RETRY;
    loop {
        let r = backend.open_device(&addr.sysfs_path());
        match &r {
            Some(Err(e)) if refused_by_a_reset(e) && std::time::Instant::now() < end => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            _ => return r,
        }
    }
}

/// True when opening the device failed with EAGAIN: the kernel's reset-on-open found the device
/// locked by another reset (type1: getting the device fd; iommufd: binding the cdev).
fn refused_by_a_reset(e: &VfioError) -> bool {
    matches!(e, VfioError::GroupGetDeviceFD(err) | VfioError::VfioDeviceBindIommufd(err) if err.errno() == libc::EAGAIN)
}

/// True for the cdev bind's EINVAL (drivers/vfio/vfio_main.c, vfio_df_open: "Only the group
/// path allows the device to be opened multiple times").
fn bind_refused_einval(e: &VfioError) -> bool {
    matches!(e, VfioError::VfioDeviceBindIommufd(err) if err.errno() == libc::EINVAL)
}

/// True when opening `/dev/vfio/<group>` answers EBUSY: a device of the group is bound through
/// its cdev (drivers/vfio/group.c: `cdev_device_open_cnt`) or the group is open. The probe's
/// fd is closed at once.
fn group_node_busy(group: u32) -> bool {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/dev/vfio/{group}"))
    {
        Ok(_) => false,
        Err(e) => e.raw_os_error() == Some(libc::EBUSY),
    }
}

/// The `&'static str` name of a back end for [`CoreError::Backend`].
fn kind_static(name: &str) -> &'static str {
    match name {
        "type1" => "type1",
        "iommufd" => "iommufd",
        "noiommu" => "noiommu",
        _ => "host-only",
    }
}

fn map_file_errno(errno: i32, offset: u64, len: usize, iova: u64) -> CoreError {
    let what =
        format!("IOMMU_IOAS_MAP_FILE of file bytes [{offset:#x}, +{len:#x}) at IOVA {iova:#x}");
    match errno {
        libc::ENODEV => CoreError::Backend {
            backend: "iommufd",
            reason: format!("{what} was refused: the exporter has revoked the dma-buf (its device was reset, unbound, or its memory decoding is off)"),
            fix: "re-enable the exporting device (rebind it to vfio-pci, reopen it) and export the dma-buf again".into(),
        },
        libc::EBADF | libc::EINVAL | libc::EOPNOTSUPP => CoreError::Backend {
            backend: "iommufd",
            reason: format!("{what} was refused ({}): the kernel cannot pin this file for DMA", std::io::Error::from_raw_os_error(errno)),
            fix: "iommufd imports a dma-buf only from an exporter that hands it physical ranges: in Linux 7.3 that is vfio-pci alone (CONFIG_VFIO_PCI_DMABUF, one range per dma-buf); GPU memory exported by CUDA or udmabuf is refused until the kernel and the GPU driver support iommufd import (use the type1 back end with the GPU BAR's mmap, or a GPU copy); a memfd must be page aligned and at least offset+length long".into(),
        },
        _ => CoreError::Io {
            op: what,
            source: std::io::Error::from_raw_os_error(errno),
        },
    }
}

fn map_errno(errno: i32, needed: u64, vaddr: usize, len: usize, iova: u64) -> CoreError {
    match errno {
        libc::ENOMEM => {
            let limit = memlock_limit();
            if limit == u64::MAX {
                CoreError::Io {
                    op: format!("VFIO_IOMMU_MAP_DMA of [{vaddr:#x}, +{len:#x}) (out of memory with RLIMIT_MEMLOCK unlimited)"),
                    source: std::io::Error::from_raw_os_error(errno),
                }
            } else {
                CoreError::MemlockTooLow { needed, limit }
            }
        }
        libc::EEXIST => CoreError::AlreadyMapped { vaddr, len },
        libc::ENOSPC => CoreError::Io {
            op: format!("VFIO_IOMMU_MAP_DMA at IOVA {iova:#x}: too many mappings (vfio_iommu_type1 dma_entry_limit); use fewer, larger regions"),
            source: std::io::Error::from_raw_os_error(errno),
        },
        _ => CoreError::Io {
            op: format!("VFIO_IOMMU_MAP_DMA of [{vaddr:#x}, +{len:#x}) at IOVA {iova:#x}"),
            source: std::io::Error::from_raw_os_error(errno),
        },
    }
}

/// The soft RLIMIT_MEMLOCK (u64::MAX when unlimited).
pub(crate) fn memlock_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0
        || r.rlim_cur == libc::RLIM_INFINITY
    {
        return u64::MAX;
    }
    r.rlim_cur
}

/// "name (uid N)" of this process's effective user.
pub(crate) fn current_user() -> String {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let name = std::fs::read_to_string("/etc/passwd").ok().and_then(|p| {
        p.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 2 && f[2] == uid.to_string()).then(|| f[0].to_string())
        })
    });
    match name {
        Some(n) => format!("{n} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page_mem(len: usize) -> crate::mmio::Mmio {
        crate::mmio::Mmio::anonymous(len).unwrap()
    }

    #[test]
    fn memory_in_pieces_reserves_each_piece_and_gives_them_all_back() {
        let d = DmaDomain::host_only();
        let (m, n) = (page_mem(3 << 21), page_mem(1 << 21));
        let piece = |offset, len, iova| DmaSegment { offset, len, iova };
        let two = vec![
            piece(0, 2 << 21, 0x4000_0000),
            piece(2 << 21, 1 << 21, 0x1000_0000),
        ];
        // SAFETY: m and n outlive their mappings (dropped below).
        let a = unsafe { d.map_in_pieces(m.as_ptr(), 3 << 21, two.clone()) }.unwrap();
        assert_eq!(a.iova(), 0x4000_0000);
        assert_eq!(&a.segments()[..], &two[..]);
        assert_eq!(a.iova_at((2 << 21) + 8), 0x1000_0008);
        // Other memory whose physical pieces overlap the second one: refused, nothing kept.
        let clash = vec![piece(0, 1 << 21, 0x1000_0000)];
        // SAFETY: as above.
        let e = unsafe { d.map_in_pieces(n.as_ptr(), 1 << 21, clash.clone()) }.unwrap_err();
        assert!(matches!(e, CoreError::AlreadyMapped { .. }), "{e}");
        assert_eq!(d.mapping_count(), 1);
        drop(a);
        assert_eq!((d.mapping_count(), d.mapped_bytes()), (0, 0));
        // Every piece is free again.
        // SAFETY: as above.
        let b = unsafe { d.map_in_pieces(n.as_ptr(), 1 << 21, clash) }.unwrap();
        // SAFETY: as above.
        let c =
            unsafe { d.map_in_pieces(m.as_ptr(), 1 << 21, vec![piece(0, 1 << 21, 0x4020_0000)]) }
                .unwrap();
        assert!(c.segments().is_empty(), "one piece is one range");
        drop((b, c));
    }

    #[test]
    fn host_only_maps_and_unmaps() {
        let d = DmaDomain::host_only();
        let m = page_mem(1 << 16);
        // SAFETY: m outlives the mapping (unmapped below).
        let mut map = unsafe { d.map(m.as_ptr(), 1 << 16, 1 << 21) }.unwrap();
        let iova = map.iova();
        assert_eq!(iova % (1 << 21), 0);
        assert!(iova >= IOVA_FLOOR);
        assert_eq!(d.mapping_count(), 1);
        assert_eq!(d.mapped_bytes(), 1 << 16);
        // SAFETY: as above.
        let again = unsafe { d.map(m.as_ptr().wrapping_add(4096), 4096, 4096) };
        assert!(
            matches!(again, Err(CoreError::AlreadyMapped { .. })),
            "{again:?}"
        );
        assert!(matches!(
            d.unmap(iova, 4096),
            Err(CoreError::NotMapped { .. })
        ));
        map.unmap().unwrap();
        assert!(!map.is_mapped());
        map.unmap().unwrap();
        drop(map);
        assert_eq!(d.mapping_count(), 0);
        assert_eq!(d.mapped_bytes(), 0);
    }

    #[test]
    fn misaligned_requests_are_refused_and_change_nothing() {
        let d = DmaDomain::host_only();
        let m = page_mem(1 << 16);
        // SAFETY: nothing gets mapped.
        unsafe {
            assert!(matches!(
                d.map(m.as_ptr().wrapping_add(1), 4096, 4096),
                Err(CoreError::InvalidArgument(_))
            ));
            assert!(matches!(
                d.map(m.as_ptr(), 100, 4096),
                Err(CoreError::InvalidArgument(_))
            ));
            assert!(matches!(
                d.map(m.as_ptr(), 0, 4096),
                Err(CoreError::InvalidArgument(_))
            ));
            assert!(matches!(
                d.map(m.as_ptr(), 4096, 3),
                Err(CoreError::InvalidArgument(_))
            ));
        }
        assert_eq!(d.mapping_count(), 0);
    }

    #[test]
    fn restricted_space_exhausts_with_a_clear_error() {
        let d = DmaDomain::host_only();
        d.restrict_iova(0x10_0000..0x10_4000).unwrap();
        let m = page_mem(1 << 16);
        // SAFETY: m outlives the mappings.
        let a = unsafe { d.map(m.as_ptr(), 0x3000, 4096) }.unwrap();
        assert_eq!(a.iova(), 0x10_0000);
        // SAFETY: as above.
        let e = unsafe { d.map(m.as_ptr().wrapping_add(0x4000), 0x2000, 4096) }.unwrap_err();
        assert!(e.to_string().contains("IOVA space exhausted"), "{e}");
        assert!(e.to_string().contains("largest free range 0x1000"), "{e}");
        assert!(
            d.restrict_iova(0..1 << 40).is_err(),
            "restrict with live mappings"
        );
        drop(a);
        assert_eq!(d.mapping_count(), 0, "dropping the mapping unmaps it");
    }

    #[test]
    fn a_revoked_mapping_keeps_its_iovas_until_its_owner_goes() {
        let d = DmaDomain::host_only();
        d.restrict_iova(0x10_0000..0x10_2000).unwrap();
        let m = page_mem(1 << 16);
        // SAFETY: m outlives the mappings.
        let a = unsafe { d.map(m.as_ptr(), 0x2000, 4096) }.unwrap();
        a.revoke().unwrap();
        a.revoke().unwrap();
        assert!(a.is_mapped(), "revoked, still owned");
        assert_eq!((d.mapping_count(), d.mapped_bytes()), (1, 0));
        // SAFETY: as above; refused.
        let e = unsafe { d.map(m.as_ptr().wrapping_add(0x4000), 0x2000, 4096) }.unwrap_err();
        assert!(matches!(e, CoreError::IovaExhausted { .. }), "{e}");
        drop(a);
        assert_eq!((d.mapping_count(), d.mapped_bytes()), (0, 0));
        // SAFETY: as above.
        let b = unsafe { d.map(m.as_ptr().wrapping_add(0x4000), 0x2000, 4096) }.unwrap();
        assert_eq!(b.iova(), 0x10_0000, "freed when its owner went");
    }

    #[test]
    fn host_only_cannot_open_devices() {
        let d = DmaDomain::host_only();
        let Err(e) = d.open_device("00:04.0".parse().unwrap()) else {
            panic!("a host-only domain opened a device");
        };
        assert!(e.to_string().contains("host-only"), "{e}");
    }

    #[test]
    fn memlock_error_names_both_numbers() {
        let e = map_errno(libc::ENOMEM, 1 << 30, 0, 1 << 30, 0);
        if memlock_limit() != u64::MAX {
            let m = e.to_string();
            assert!(
                m.contains(&format!("cannot pin {} bytes", 1u64 << 30)),
                "{m}"
            );
            assert!(m.contains("RLIMIT_MEMLOCK is"), "{m}");
        }
        assert!(matches!(
            map_errno(libc::EEXIST, 0, 0x1000, 4096, 0),
            CoreError::AlreadyMapped { .. }
        ));
    }

    #[test]
    fn vfio_open_failures_name_their_cause() {
        let addr: PciAddress = "0000:00:04.0".parse().unwrap();
        let io = |e| std::io::Error::from_raw_os_error(e);
        let e = open_error(VfioError::OpenGroup(io(libc::EACCES), "7".into()), addr, 7);
        assert!(
            e.to_string()
                .starts_with("permission denied opening /dev/vfio/7 as user "),
            "{e}"
        );
        let e = open_error(VfioError::OpenGroup(io(libc::EBUSY), "7".into()), addr, 7);
        assert!(matches!(e, CoreError::GroupBusy { group: 7, .. }), "{e}");
        let e = open_error(VfioError::OpenGroup(io(libc::ENOENT), "7".into()), addr, 7);
        assert!(
            e.to_string()
                .contains("opening /dev/vfio/7 for 0000:00:04.0"),
            "{e}"
        );
        let e = open_error(VfioError::GroupSetContainer, addr, 7);
        assert!(matches!(e, CoreError::GroupBusy { .. }), "{e}");
        let e = open_error(VfioError::GroupViable, addr, 999_999);
        assert!(
            e.to_string()
                .contains("IOMMU group 999999 of 0000:00:04.0 is not viable"),
            "{e}"
        );
        let busy = vmm_sys_util::errno::Error::new(libc::EBUSY);
        let e = open_error(VfioError::GroupGetDeviceFD(busy), addr, 7);
        assert!(
            e.to_string()
                .contains("already open in this or another process"),
            "{e}"
        );
    }

    #[test]
    fn noiommu_is_refused_without_the_library_opt_in() {
        let e = DmaDomain::with_options(DomainOptions {
            backend: Some(BackendKind::NoIommu),
            allow_noiommu: false,
        })
        .unwrap_err();
        let m = e.to_string();
        assert!(m.starts_with("DMA back end noiommu: refused"), "{m}");
        assert!(m.contains("allow_noiommu"), "{m}");
        assert!(m.contains("UBD_ALLOW_NOIOMMU=1 scripts/setup.sh"), "{m}");
    }

    #[test]
    fn noiommu_with_the_library_opt_in_needs_the_operator_opt_in() {
        let d = tempfile::tempdir().unwrap();
        let opts = DomainOptions {
            backend: Some(BackendKind::NoIommu),
            allow_noiommu: true,
        };
        let m = noiommu_opt_ins_in(d.path(), &opts).unwrap_err().to_string();
        assert!(m.contains("CONFIG_VFIO_NOIOMMU"), "{m}");
        let p = d.path().join(super::super::noiommu::UNSAFE_MODE_PARAM);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "N\n").unwrap();
        let m = noiommu_opt_ins_in(d.path(), &opts).unwrap_err().to_string();
        assert!(
            m.contains("UBD_ALLOW_NOIOMMU=1 scripts/setup.sh config"),
            "{m}"
        );
        std::fs::write(&p, "Y\n").unwrap();
        noiommu_opt_ins_in(d.path(), &opts).unwrap();
        let lib_off = DomainOptions {
            allow_noiommu: false,
            ..opts
        };
        let m = noiommu_opt_ins_in(d.path(), &lib_off)
            .unwrap_err()
            .to_string();
        assert!(m.contains("allow_noiommu"), "{m}");
    }

    #[test]
    fn forced_iommufd_without_dev_iommu_names_the_kernel_options() {
        if Path::new("/dev/iommu").exists() {
            return; // this host has iommufd: the refusal cannot happen here
        }
        let e = DmaDomain::with_options(DomainOptions {
            backend: Some(BackendKind::Iommufd),
            allow_noiommu: false,
        })
        .unwrap_err();
        let m = e.to_string();
        assert!(m.contains("/dev/iommu does not exist"), "{m}");
        assert!(m.contains("CONFIG_IOMMUFD"), "{m}");
    }

    #[test]
    fn map_file_outside_iommufd_is_refused_and_changes_nothing() {
        let d = DmaDomain::host_only();
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        let e = d
            .map_file(std::os::fd::AsFd::as_fd(&f), 0, 4096, 4096, true)
            .unwrap_err();
        let m = e.to_string();
        assert!(m.contains("needs the iommufd back end"), "{m}");
        assert!(m.contains("CONFIG_IOMMUFD"), "{m}");
        assert_eq!((d.mapping_count(), d.mapped_bytes()), (0, 0));
        let e = d
            .map_file(std::os::fd::AsFd::as_fd(&f), 1, 4096, 4096, true)
            .unwrap_err();
        assert!(matches!(e, CoreError::InvalidArgument(_)), "{e}");
    }

    #[test]
    fn memory_mapped_by_address_is_not_mapped_again_by_file() {
        let d = DmaDomain::host_only();
        let m = page_mem(1 << 16);
        // SAFETY: m outlives the mapping.
        let a = unsafe { d.map(m.as_ptr(), 0x4000, 4096) }.unwrap();
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        let fd = std::os::fd::AsFd::as_fd(&f);
        // The same CPU memory by file (a hugepage memfd, a BAR's dma-buf): refused by the
        // domain itself, before any back end is asked (iommufd would map it twice).
        let cpu = Some(m.as_ptr().wrapping_add(0x2000));
        let e = d.map_file_at(fd, 0, 0x4000, 4096, true, cpu).unwrap_err();
        assert!(matches!(e, CoreError::AlreadyMapped { .. }), "{e}");
        assert_eq!((d.mapping_count(), d.mapped_bytes()), (1, 0x4000));
        // Memory next to it passes the check (and meets the host-only refusal).
        let cpu = Some(m.as_ptr().wrapping_add(0x4000));
        let e = d.map_file_at(fd, 0, 0x4000, 4096, true, cpu).unwrap_err();
        assert!(e.to_string().contains("needs the iommufd back end"), "{e}");
        drop(a);
        assert_eq!(d.mapping_count(), 0);
    }

    #[test]
    fn map_file_errors_name_the_import_requirement() {
        let e = map_file_errno(libc::EINVAL, 0, 4096, 0x10_0000).to_string();
        assert!(e.contains("IOMMU_IOAS_MAP_FILE"), "{e}");
        assert!(e.contains("CONFIG_VFIO_PCI_DMABUF"), "{e}");
    }

    #[test]
    fn an_open_refused_by_a_reset_in_progress_is_told_apart() {
        // vfio-pci's reset on open answers EAGAIN while another reset holds the device: seen in
        // the soak as "failed to get vfio device fd: Resource temporarily unavailable".
        let again = || vmm_sys_util::errno::Error::new(libc::EAGAIN);
        assert!(refused_by_a_reset(&VfioError::GroupGetDeviceFD(again())));
        assert!(refused_by_a_reset(&VfioError::VfioDeviceBindIommufd(
            again()
        )));
        let busy = vmm_sys_util::errno::Error::new(libc::EBUSY);
        assert!(!refused_by_a_reset(&VfioError::GroupGetDeviceFD(busy)));
        let addr: PciAddress = "0000:00:04.0".parse().unwrap();
        let e = CoreError::DeviceResetting {
            addr,
            waited: RESET_RETRY,
        }
        .to_string();
        assert!(e.contains("being reset by the kernel"), "{e}");
        assert!(e.contains("EAGAIN"), "{e}");
    }

    #[test]
    fn iommufd_open_failures_name_their_cause() {
        let addr: PciAddress = "0000:00:04.0".parse().unwrap();
        let io = |e| std::io::Error::from_raw_os_error(e);
        let e = open_error(VfioError::OpenDeviceCdev(io(libc::EACCES)), addr, 7);
        assert!(
            e.to_string()
                .starts_with("permission denied opening /dev/vfio/devices/"),
            "{e}"
        );
        let e = open_error(VfioError::InvalidVfioDev, addr, 7).to_string();
        assert!(e.contains("CONFIG_VFIO_DEVICE_CDEV"), "{e}");
        let busy = vmm_sys_util::errno::Error::new(libc::EBUSY);
        let e = open_error(VfioError::VfioDeviceBindIommufd(busy), addr, 7).to_string();
        assert!(e.contains("already open"), "{e}");
        assert!(e.contains("/dev/vfio/7"), "{e}");
        // A second cdev open of a device is EINVAL: named as such, not as a viability problem.
        let inval = VfioError::VfioDeviceBindIommufd(vmm_sys_util::errno::Error::new(libc::EINVAL));
        assert!(bind_refused_einval(&inval));
        let e = open_error(inval, addr, 7).to_string();
        assert!(e.contains("opened once through its cdev"), "{e}");
        assert!(e.contains("close the other user"), "{e}");
        let attach =
            VfioError::VfioDeviceAttachIommufdPt(vmm_sys_util::errno::Error::new(libc::EINVAL));
        assert!(!bind_refused_einval(&attach));
        let e = open_error(attach, addr, 7).to_string();
        assert!(
            e.contains("attaching 0000:00:04.0 to the domain's IOAS"),
            "{e}"
        );
    }

    #[test]
    fn user_is_named() {
        assert!(current_user().contains("uid "));
    }
}
