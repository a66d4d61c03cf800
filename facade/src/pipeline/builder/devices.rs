//! The devices of a run and its pool. Devices join the DMA domain before any memory is mapped
//! into it (VFIO sets the IOMMU up when the first group is attached): the NVMe controller
//! first, then the BAR's device, then the pool.

use std::sync::Arc;

use ubdirect_core::{DmaDomain, PciDevice, PoolConfig, UbPool, UbRegion, UbRegistry};
use ubdirect_nvme::{Controller, ControllerOptions};

use super::error::{PipelineRunError, SetupError};
use super::{Settings, SinkSpec, SourceSpec};

/// What a run opened before its source path starts.
pub(super) struct Devices {
    /// The DMA domain's registry: a VFIO domain when a device is involved, host-only otherwise.
    pub(super) registry: Arc<UbRegistry>,
    /// The NVMe controller of an NVMe source.
    pub(super) ctrl: Option<Arc<Controller>>,
    /// The device of a BAR sink.
    pub(super) bar_dev: Option<Arc<PciDevice>>,
    /// The BAR window of a BAR sink (the pool is carved from it).
    pub(super) bar: Option<Arc<UbRegion>>,
    /// The NUMA node of the source's or sink's device, when known.
    pub(super) numa: Option<u32>,
    /// True when a device DMAs into the pool (so it must be hugepages).
    needs_vfio: bool,
    /// Pool blocks asked for.
    blocks: usize,
}

impl Devices {
    /// Open the domain, the NVMe controller (NVMe source) and the BAR (BAR sink).
    pub(super) fn open(s: &Settings, source: &SourceSpec) -> Result<Devices, PipelineRunError> {
        let bar_sink = matches!(s.sink, SinkSpec::Bar { .. });
        let needs_vfio = matches!(source, SourceSpec::Nvme { .. }) || bar_sink;
        let domain = if needs_vfio {
            DmaDomain::with_options(s.domain.clone())?
        } else {
            DmaDomain::host_only()
        };
        let registry = UbRegistry::new(domain);
        let mut numa = None;
        let ctrl = match source {
            SourceSpec::Nvme { addr, .. } => {
                let opts = ControllerOptions {
                    io_queues: 1,
                    ..Default::default()
                };
                let c = Controller::open(&registry, *addr, opts)?;
                numa = c.device().numa_node();
                Some(c)
            }
            SourceSpec::File(_) | SourceSpec::Tcp { .. } => None,
        };
        let (mut bar_dev, mut bar) = (None, None);
        if let SinkSpec::Bar { addr, bar: n } = &s.sink {
            let dev = PciDevice::open(registry.domain(), *addr)?;
            numa = numa.or(dev.numa_node());
            bar = Some(registry.register_bar(&dev, *n)?);
            bar_dev = Some(dev);
        }
        Ok(Devices {
            registry,
            ctrl,
            bar_dev,
            bar,
            numa,
            needs_vfio,
            blocks: s.pool_blocks.unwrap_or(s.qd * 2),
        })
    }

    /// The run's pool of `bs`-byte blocks: carved from the BAR for a BAR sink (the source DMAs
    /// straight into it), hugepages otherwise (ordinary memory when there are none and no
    /// device DMAs).
    pub(super) fn pool(&self, bs: usize) -> Result<Arc<UbPool>, PipelineRunError> {
        let Some(r) = &self.bar else {
            return self.host_pool(bs, self.blocks, self.needs_vfio);
        };
        let fit = r.len / bs;
        if fit == 0 {
            return Err(SetupError::BarTooSmall {
                len: r.len,
                block_size: bs,
            }
            .into());
        }
        let cfg = PoolConfig {
            block_size: bs,
            block_count: self.blocks.min(fit),
        };
        Ok(UbPool::new(&self.registry, r.clone(), cfg)?)
    }

    /// A pool over hugepages, or ordinary memory when no hugepages are free and no device DMAs
    /// into it (`for_device` false).
    pub(super) fn host_pool(
        &self,
        bs: usize,
        blocks: usize,
        for_device: bool,
    ) -> Result<Arc<UbPool>, PipelineRunError> {
        let cfg = PoolConfig {
            block_size: bs,
            block_count: blocks,
        };
        match UbPool::with_hugepages(&self.registry, cfg, None) {
            Ok(p) => Ok(p),
            Err(e) if !for_device => {
                tracing::info!("no hugepage pool ({e}); using ordinary memory for the kernel path");
                Ok(UbPool::with_anonymous(&self.registry, cfg, None)?)
            }
            Err(e) => Err(e.into()),
        }
    }
}
