//! PCI topology from sysfs: devices, drivers, IOMMU groups, NUMA nodes, links and BARs.
