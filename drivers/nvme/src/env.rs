//! [`Env`]: one entry point that opens the DMA domain, the NVMe controllers and the buffer pool
//! in the order they must come (SPDK's env init + probe/attach in one call), and hands back
//! typed handles. The pool's memory is mapped for device DMA only once a device is open in the
//! domain, so opening the pool first fails with `CoreError::NoDevice`; `Env` makes that order
//! impossible to get wrong.
//!
//! ```no_run
//! use ubdirect_core::PoolConfig;
//! use ubdirect_nvme::{Env, IoBuf, IoQueuePair, Lba, QueueOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let env = Env::builder()
//!     .nvme("0000:00:04.0")
//!     .pool(PoolConfig { block_size: 2 << 20, block_count: 64 })
//!     .open()?;
//! let ctrl = env.controller(0);
//! let ns = ctrl.first_namespace()?;
//! let mut qp = IoQueuePair::new(ctrl, QueueOptions::default())?;
//! let buf = IoBuf::prefix(env.pool().get()?, 4096)?;
//! let buf = qp.read_blocking(&ns, Lba(0), buf, std::time::Duration::from_secs(5))?;
//! # Ok(()) }
//! ```

use std::sync::Arc;

use ubdirect_core::{CoreError, DmaDomain, PciAddress, PciDevice, PoolConfig, UbPool, UbRegistry};

use crate::controller::{Controller, ControllerOptions};
use crate::error::NvmeError;

/// Where the pool's memory comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PoolMemory {
    /// Hugepages (2 MiB, or 1 GiB when the pool is a whole number of free 1 GiB pages): what
    /// devices DMA into.
    #[default]
    Hugepages,
    /// Ordinary anonymous memory: only for a host-only domain (no IOMMU, no device DMA), e.g.
    /// with the device models or the kernel (io_uring) path.
    Anonymous,
}

/// A device to open: an address, or one already open in the builder's registry.
enum Source {
    Address(String),
    Device(Arc<PciDevice>),
}

/// Why [`EnvBuilder::open`] failed; nothing it opened stays open.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// A device address that does not parse.
    #[error("NVMe address {addr:?}: {source}")]
    Address {
        /// The address as given.
        addr: String,
        /// Why it does not parse.
        source: CoreError,
    },
    /// No device was asked for, so the pool's memory could not be mapped for DMA.
    #[error("no NVMe controller to open: add one with .nvme(\"DDDD:BB:DD.F\") (the pool's memory is mapped for the devices' DMA, so at least one device opens first)")]
    NoDevice,
    /// No pool was asked for.
    #[error("no buffer pool: add one with .pool(PoolConfig {{ block_size, block_count }})")]
    NoPool,
    /// The DMA domain (the VFIO container) did not open.
    #[error("opening the DMA domain: {0}")]
    Domain(CoreError),
    /// A controller did not open.
    #[error("opening NVMe controller {addr}: {source}")]
    Controller {
        /// Its address.
        addr: String,
        /// Why.
        source: NvmeError,
    },
    /// The pool did not open.
    #[error("creating the buffer pool: {0}")]
    Pool(CoreError),
}

/// Builds an [`Env`]: name the controllers and the pool, then [`EnvBuilder::open`].
#[must_use]
pub struct EnvBuilder {
    registry: Option<Arc<UbRegistry>>,
    nvme: Vec<Source>,
    ctrl_opts: ControllerOptions,
    pool: Option<PoolConfig>,
    memory: PoolMemory,
    numa: Option<u32>,
}

impl EnvBuilder {
    /// Open the NVMe controller at PCI address `addr` (bound to vfio-pci), e.g.
    /// `"0000:00:04.0"`. Call once per controller; they share one DMA domain and the pool.
    pub fn nvme(mut self, addr: impl Into<String>) -> Self {
        self.nvme.push(Source::Address(addr.into()));
        self
    }
    /// Use a device that is already open in the registry given to [`EnvBuilder::registry`]
    /// (a device model, or a device shared with another driver).
    pub fn nvme_device(mut self, dev: Arc<PciDevice>) -> Self {
        self.nvme.push(Source::Device(dev));
        self
    }
    /// Options of every controller (deadlines, queue limits).
    pub fn controller_options(mut self, opts: ControllerOptions) -> Self {
        self.ctrl_opts = opts;
        self
    }
    /// The buffer pool: `block_count` blocks of `block_size` bytes.
    pub fn pool(mut self, cfg: PoolConfig) -> Self {
        self.pool = Some(cfg);
        self
    }
    /// Where the pool's memory comes from (default: hugepages).
    pub fn pool_memory(mut self, memory: PoolMemory) -> Self {
        self.memory = memory;
        self
    }
    /// Put the pool's memory on NUMA node `node` (default: the kernel's choice).
    pub fn numa(mut self, node: u32) -> Self {
        self.numa = Some(node);
        self
    }
    /// Use `registry` (and its domain) instead of opening a new VFIO domain: to share it with
    /// other drivers, or with a host-only domain and device models in tests.
    pub fn registry(mut self, registry: Arc<UbRegistry>) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Check the settings, then open the domain, every controller, and the pool, in that
    /// order. Settings are checked before anything opens; on a failure what was opened closes.
    pub fn open(self) -> Result<Env, EnvError> {
        if self.nvme.is_empty() {
            return Err(EnvError::NoDevice);
        }
        let cfg = self.pool.ok_or(EnvError::NoPool)?;
        cfg.validate().map_err(EnvError::Pool)?;
        let mut sources = Vec::with_capacity(self.nvme.len());
        for s in self.nvme {
            sources.push(match s {
                Source::Address(addr) => match addr.parse::<PciAddress>() {
                    Ok(a) => (addr, Some(a), None),
                    Err(source) => return Err(EnvError::Address { addr, source }),
                },
                Source::Device(dev) => (dev.address().to_string(), None, Some(dev)),
            });
        }
        let registry = match self.registry {
            Some(r) => r,
            None => UbRegistry::new(DmaDomain::new().map_err(EnvError::Domain)?),
        };
        let mut controllers = Vec::with_capacity(sources.len());
        for (addr, pci, dev) in sources {
            let opened = match (pci, dev) {
                (_, Some(dev)) => Controller::open_device(&registry, dev, self.ctrl_opts.clone()),
                (Some(a), None) => Controller::open(&registry, a, self.ctrl_opts.clone()),
                (None, None) => unreachable!("every source has an address or a device"),
            };
            controllers.push(opened.map_err(|source| EnvError::Controller { addr, source })?);
        }
        let pool = match self.memory {
            PoolMemory::Hugepages => UbPool::with_hugepages(&registry, cfg, self.numa),
            PoolMemory::Anonymous => UbPool::with_anonymous(&registry, cfg, self.numa),
        }
        .map_err(EnvError::Pool)?;
        Ok(Env {
            pool,
            controllers,
            registry,
        })
    }
}

/// An open environment: the DMA domain's registry, the NVMe controllers in the order they were
/// named, and the buffer pool. Dropping it closes the pool, then the controllers.
pub struct Env {
    pool: Arc<UbPool>,
    controllers: Vec<Arc<Controller>>,
    registry: Arc<UbRegistry>,
}

impl Env {
    /// Start naming what to open.
    pub fn builder() -> EnvBuilder {
        EnvBuilder {
            registry: None,
            nvme: Vec::new(),
            ctrl_opts: ControllerOptions::default(),
            pool: None,
            memory: PoolMemory::default(),
            numa: None,
        }
    }
    /// The buffer pool.
    pub fn pool(&self) -> &Arc<UbPool> {
        &self.pool
    }
    /// Every controller, in the order given to the builder.
    pub fn controllers(&self) -> &[Arc<Controller>] {
        &self.controllers
    }
    /// Controller `i` (in the order given to the builder). Panics when there are not that many.
    pub fn controller(&self, i: usize) -> &Arc<Controller> {
        &self.controllers[i]
    }
    /// The registry of the DMA domain (to register more memory, or open other drivers in it).
    pub fn registry(&self) -> &Arc<UbRegistry> {
        &self.registry
    }
}
