//! [`Env`]: one entry point that checks the hugepages, opens the DMA domain, the NVMe
//! controllers and the virtio-net NICs, and the buffer pool, in the order they must come
//! (SPDK's env init + probe/attach in one call), and hands back typed handles.
//!
//! The order it enforces: every setting is checked and the hugepages verified (or reserved)
//! before anything opens; then the domain; then the NVMe controllers and the NICs' PCI devices
//! (the pool's memory is mapped for device DMA only once a device is open in the domain: a pool
//! first fails with `CoreError::NoDevice`); then the pool; then the NICs come up (each fills its
//! RX ring from the pool). On a failure everything opened so far closes again.
//!
//! ```no_run
//! use std::time::Duration;
//! use ubdirect::dma::PoolConfig;
//! use ubdirect::nvme::{IoBuf, IoQueuePair, Lba, QueueOptions};
//! use ubdirect::{Env, Hugepages};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut env = Env::builder()
//!     .hugepages(Hugepages::reserve(64))
//!     .nvme("0000:00:04.0")
//!     .nic("0000:00:07.0")
//!     .pool(PoolConfig { block_size: 2 << 20, block_count: 64 })
//!     .open()?;
//! let ctrl = env.controller(0).clone();
//! let ns = ctrl.first_namespace()?;
//! let mut qp = IoQueuePair::new(&ctrl, QueueOptions::default())?;
//! let buf = IoBuf::prefix(env.pool().get()?, 4096)?;
//! let buf = qp.read_blocking(&ns, Lba(0), buf, Duration::from_secs(5))?;
//! let nic = env.nic_mut(0);
//! println!("NIC MAC {:02x?}", nic.mac());
//! # Ok(()) }
//! ```

mod error;
mod hugepage_step;

use std::sync::Arc;

use ubdirect_core::vfio::DomainOptions;
use ubdirect_core::{DmaDomain, PciAddress, PciDevice, PoolConfig, UbPool, UbRegistry};

pub use error::EnvError;
pub use hugepage_step::Hugepages;

#[cfg(feature = "nvme")]
use ubdirect_nvme::{Controller, ControllerOptions};
#[cfg(feature = "net")]
use ubdirect_virtio_net::{NetConfig, VirtioNet};

/// Where the pool's memory comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PoolMemory {
    /// Hugepages (2 MiB, or 1 GiB when the pool is a whole number of free 1 GiB pages): what
    /// devices DMA into.
    #[default]
    Hugepages,
    /// Ordinary anonymous memory: only for a host-only domain (no IOMMU, no device DMA), e.g.
    /// with the device models or the kernel (io_uring) path. The hugepage step is skipped.
    Anonymous,
}

/// A device to open: an address, or one already open in the builder's registry.
enum Source {
    Address(String),
    Device(Arc<PciDevice>),
}

/// A device source checked: its address as text, and the parsed address or the open device.
struct Checked {
    addr: String,
    pci: Option<PciAddress>,
    dev: Option<Arc<PciDevice>>,
}

/// Builds an [`Env`]: name the devices and the pool, then [`EnvBuilder::open`].
#[must_use]
pub struct EnvBuilder {
    registry: Option<Arc<UbRegistry>>,
    domain_opts: DomainOptions,
    #[cfg(feature = "nvme")]
    nvme: Vec<Source>,
    #[cfg(feature = "nvme")]
    ctrl_opts: ControllerOptions,
    #[cfg(feature = "net")]
    nics: Vec<Source>,
    #[cfg(feature = "net")]
    net_cfg: NetConfig,
    pool: Option<PoolConfig>,
    without_pool: bool,
    memory: PoolMemory,
    hugepages: Hugepages,
    numa: Option<u32>,
}

impl EnvBuilder {
    /// Open the NVMe controller at PCI address `addr` (bound to vfio-pci), e.g.
    /// `"0000:00:04.0"`. Call once per controller; every device shares one DMA domain and the
    /// pool.
    #[cfg(feature = "nvme")]
    pub fn nvme(mut self, addr: impl Into<String>) -> Self {
        self.nvme.push(Source::Address(addr.into()));
        self
    }
    /// Use an NVMe device that is already open in the registry given to
    /// [`EnvBuilder::registry`] (a device model, or a device shared with another driver).
    #[cfg(feature = "nvme")]
    pub fn nvme_device(mut self, dev: Arc<PciDevice>) -> Self {
        self.nvme.push(Source::Device(dev));
        self
    }
    /// Options of every NVMe controller (deadlines, queue limits).
    #[cfg(feature = "nvme")]
    pub fn controller_options(mut self, opts: ControllerOptions) -> Self {
        self.ctrl_opts = opts;
        self
    }
    /// Open the virtio-net NIC at PCI address `addr` (bound to vfio-pci). Call once per NIC.
    #[cfg(feature = "net")]
    pub fn nic(mut self, addr: impl Into<String>) -> Self {
        self.nics.push(Source::Address(addr.into()));
        self
    }
    /// Use a virtio-net device that is already open in the registry given to
    /// [`EnvBuilder::registry`] (a device model in tests).
    #[cfg(feature = "net")]
    pub fn nic_device(mut self, dev: Arc<PciDevice>) -> Self {
        self.nics.push(Source::Device(dev));
        self
    }
    /// Settings of every NIC (queue pairs, ring sizes, health interval).
    #[cfg(feature = "net")]
    pub fn net_config(mut self, cfg: NetConfig) -> Self {
        self.net_cfg = cfg;
        self
    }
    /// The buffer pool: `block_count` blocks of `block_size` bytes.
    pub fn pool(mut self, cfg: PoolConfig) -> Self {
        self.pool = Some(cfg);
        self.without_pool = false;
        self
    }
    /// Open the devices and no pool: for work that needs no buffers (identify, log pages), or
    /// whose pool's size depends on what a controller granted (create it afterwards in
    /// [`Env::registry`]). The hugepage step is skipped; NICs need a pool, so naming one fails
    /// with [`EnvError::NoPool`]. [`Env::pool`] panics on such an environment.
    pub fn without_pool(mut self) -> Self {
        self.pool = None;
        self.without_pool = true;
        self
    }
    /// Where the pool's memory comes from (default: hugepages).
    pub fn pool_memory(mut self, memory: PoolMemory) -> Self {
        self.memory = memory;
        self
    }
    /// The hugepage step before anything opens (default: [`Hugepages::verify`]): verify that
    /// the pool fits in the free hugepages, or reserve them first ([`Hugepages::reserve`]).
    /// Too few fails with [`EnvError::Hugepages`], which says how to reserve more.
    pub fn hugepages(mut self, step: Hugepages) -> Self {
        self.hugepages = step;
        self
    }
    /// Put the pool's memory on NUMA node `node` (default: the kernel's choice).
    pub fn numa(mut self, node: u32) -> Self {
        self.numa = Some(node);
        self
    }
    /// How the domain that [`EnvBuilder::open`] opens picks its back end (default:
    /// [`DomainOptions::default`], as [`DmaDomain::new`]), e.g. the program's no-IOMMU opt-in.
    /// Unused with [`EnvBuilder::registry`], whose domain is already open.
    pub fn domain_options(mut self, opts: DomainOptions) -> Self {
        self.domain_opts = opts;
        self
    }
    /// Use `registry` (and its domain) instead of opening a new VFIO domain: to share it with
    /// other drivers, or with a host-only domain and device models in tests.
    pub fn registry(mut self, registry: Arc<UbRegistry>) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Check the settings and the hugepages, then open the domain, the NVMe controllers and
    /// the NICs' devices, the pool, and bring the NICs up, in that order (no hugepages and no
    /// pool [`without_pool`](EnvBuilder::without_pool)). Nothing opens before every setting is
    /// checked; on a failure what was opened closes.
    pub fn open(self) -> Result<Env, EnvError> {
        #[cfg(feature = "nvme")]
        let nvme = check_sources(self.nvme)?;
        #[cfg(feature = "net")]
        let nics = check_sources(self.nics)?;
        let mut seen: Vec<&Checked> = Vec::new();
        #[cfg(feature = "nvme")]
        seen.extend(nvme.iter());
        #[cfg(feature = "net")]
        seen.extend(nics.iter());
        check_distinct(&seen)?;
        #[cfg(feature = "net")]
        if self.without_pool && !nics.is_empty() {
            return Err(EnvError::NoPool);
        }
        let cfg = match self.pool {
            Some(cfg) => Some(check_pool(cfg, self.memory, &self.hugepages, self.numa)?),
            None if self.without_pool => None,
            None => return Err(EnvError::NoPool),
        };
        let registry = match self.registry {
            Some(r) => r,
            None => UbRegistry::new(
                DmaDomain::with_options(self.domain_opts).map_err(EnvError::Domain)?,
            ),
        };
        #[cfg(feature = "nvme")]
        let controllers = open_controllers(&registry, nvme, &self.ctrl_opts)?;
        #[cfg(feature = "net")]
        let nic_devs = open_nic_devices(&registry, nics)?;
        let pool = match cfg {
            Some(cfg) => Some(open_pool(&registry, cfg, self.memory, self.numa)?),
            None => None,
        };
        Ok(Env {
            #[cfg(feature = "net")]
            nics: match &pool {
                Some(pool) => start_nics(&registry, nic_devs, pool, &self.net_cfg)?,
                None => Vec::new(),
            },
            #[cfg(feature = "nvme")]
            controllers,
            pool,
            registry,
        })
    }
}

/// Check the pool's settings and run the hugepage step for it (a hugepage pool only).
fn check_pool(
    cfg: PoolConfig,
    memory: PoolMemory,
    hugepages: &Hugepages,
    numa: Option<u32>,
) -> Result<PoolConfig, EnvError> {
    let total = cfg.validate().map_err(EnvError::PoolConfig)?;
    if memory == PoolMemory::Hugepages {
        hugepages.run(total, numa).map_err(EnvError::Hugepages)?;
    }
    Ok(cfg)
}

/// Create the pool in `registry`'s domain, of hugepages or anonymous memory.
fn open_pool(
    registry: &Arc<UbRegistry>,
    cfg: PoolConfig,
    memory: PoolMemory,
    numa: Option<u32>,
) -> Result<Arc<UbPool>, EnvError> {
    match memory {
        PoolMemory::Hugepages => UbPool::with_hugepages(registry, cfg, numa),
        PoolMemory::Anonymous => UbPool::with_anonymous(registry, cfg, numa),
    }
    .map_err(EnvError::Pool)
}

/// At least one device, and no PCI address named twice (devices given open are distinct
/// objects).
fn check_distinct(seen: &[&Checked]) -> Result<(), EnvError> {
    for (i, c) in seen.iter().enumerate() {
        if c.pci.is_some() && seen[..i].iter().any(|o| o.pci == c.pci) {
            return Err(EnvError::Duplicate {
                addr: c.addr.clone(),
            });
        }
    }
    if seen.is_empty() {
        return Err(EnvError::NoDevice);
    }
    Ok(())
}

/// Open (or take over) every NVMe controller, in order.
#[cfg(feature = "nvme")]
fn open_controllers(
    registry: &Arc<UbRegistry>,
    nvme: Vec<Checked>,
    opts: &ControllerOptions,
) -> Result<Vec<Arc<Controller>>, EnvError> {
    let mut controllers = Vec::with_capacity(nvme.len());
    for c in nvme {
        let opened = match (c.pci, c.dev) {
            (_, Some(dev)) => Controller::open_device(registry, dev, opts.clone()),
            (Some(a), None) => Controller::open(registry, a, opts.clone()),
            (None, None) => unreachable!("every source has an address or a device"),
        };
        let addr = c.addr;
        controllers.push(opened.map_err(|source| EnvError::Controller { addr, source })?);
    }
    Ok(controllers)
}

/// Open every NIC's PCI device (the NICs come up once the pool exists).
#[cfg(feature = "net")]
fn open_nic_devices(
    registry: &Arc<UbRegistry>,
    nics: Vec<Checked>,
) -> Result<Vec<(String, Arc<PciDevice>)>, EnvError> {
    let mut nic_devs = Vec::with_capacity(nics.len());
    for c in nics {
        let dev = match (c.pci, c.dev) {
            (_, Some(dev)) => dev,
            (Some(a), None) => {
                PciDevice::open(registry.domain(), a).map_err(|source| EnvError::Device {
                    addr: c.addr.clone(),
                    source,
                })?
            }
            (None, None) => unreachable!("every source has an address or a device"),
        };
        nic_devs.push((c.addr, dev));
    }
    Ok(nic_devs)
}

/// Bring every NIC up on `pool` (each fills its RX ring from it).
#[cfg(feature = "net")]
fn start_nics(
    registry: &Arc<UbRegistry>,
    nic_devs: Vec<(String, Arc<PciDevice>)>,
    pool: &Arc<UbPool>,
    cfg: &NetConfig,
) -> Result<Vec<VirtioNet>, EnvError> {
    let mut nics = Vec::with_capacity(nic_devs.len());
    for (addr, dev) in nic_devs {
        let nic = VirtioNet::from_device(registry, dev, pool.clone(), cfg.clone())
            .map_err(|source| EnvError::Nic { addr, source })?;
        nics.push(nic);
    }
    Ok(nics)
}

/// Parse every address before anything opens.
fn check_sources(sources: Vec<Source>) -> Result<Vec<Checked>, EnvError> {
    let mut out = Vec::with_capacity(sources.len());
    for s in sources {
        out.push(match s {
            Source::Address(addr) => match addr.parse::<PciAddress>() {
                Ok(a) => Checked {
                    addr: a.to_string(),
                    pci: Some(a),
                    dev: None,
                },
                Err(source) => return Err(EnvError::Address { addr, source }),
            },
            Source::Device(dev) => Checked {
                addr: dev.address().to_string(),
                pci: None,
                dev: Some(dev),
            },
        });
    }
    Ok(out)
}

/// An open environment: the DMA domain's registry, the NVMe controllers and the NICs in the
/// order they were named, and the buffer pool (unless opened [`EnvBuilder::without_pool`]).
/// Dropping it brings the NICs down, then closes the controllers; the pool's memory goes once
/// the last buffer is back.
pub struct Env {
    #[cfg(feature = "net")]
    nics: Vec<VirtioNet>,
    #[cfg(feature = "nvme")]
    controllers: Vec<Arc<Controller>>,
    pool: Option<Arc<UbPool>>,
    registry: Arc<UbRegistry>,
}

impl Env {
    /// Start naming what to open.
    pub fn builder() -> EnvBuilder {
        EnvBuilder {
            registry: None,
            domain_opts: DomainOptions::default(),
            #[cfg(feature = "nvme")]
            nvme: Vec::new(),
            #[cfg(feature = "nvme")]
            ctrl_opts: ControllerOptions::default(),
            #[cfg(feature = "net")]
            nics: Vec::new(),
            #[cfg(feature = "net")]
            net_cfg: NetConfig::default(),
            pool: None,
            without_pool: false,
            memory: PoolMemory::default(),
            hugepages: Hugepages::default(),
            numa: None,
        }
    }
    /// The buffer pool. Panics when the environment was opened
    /// [`EnvBuilder::without_pool`].
    pub fn pool(&self) -> &Arc<UbPool> {
        self.pool
            .as_ref()
            .expect("the Env was opened without_pool: it has no buffer pool")
    }
    /// Every NVMe controller, in the order given to the builder.
    #[cfg(feature = "nvme")]
    pub fn controllers(&self) -> &[Arc<Controller>] {
        &self.controllers
    }
    /// NVMe controller `i` (in the order given to the builder). Panics when there are not that
    /// many.
    #[cfg(feature = "nvme")]
    pub fn controller(&self, i: usize) -> &Arc<Controller> {
        &self.controllers[i]
    }
    /// Every NIC, in the order given to the builder (each is driven through `&mut`: one
    /// polling thread per NIC, see [`Env::take_nics`]).
    #[cfg(feature = "net")]
    pub fn nics_mut(&mut self) -> &mut [VirtioNet] {
        &mut self.nics
    }
    /// NIC `i` (in the order given to the builder). Panics when there are not that many.
    #[cfg(feature = "net")]
    pub fn nic_mut(&mut self, i: usize) -> &mut VirtioNet {
        &mut self.nics[i]
    }
    /// Move the NICs out (to hand each to its own polling thread); the environment keeps the
    /// controllers, the pool and the registry.
    #[cfg(feature = "net")]
    pub fn take_nics(&mut self) -> Vec<VirtioNet> {
        std::mem::take(&mut self.nics)
    }
    /// The registry of the DMA domain (to register more memory, or open other drivers in it).
    pub fn registry(&self) -> &Arc<UbRegistry> {
        &self.registry
    }
}
