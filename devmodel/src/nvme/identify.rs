//! Identify pages the model answers with (NVMe base spec 5.17.2).

use super::{NsConfig, NvmeConfig, State};

/// ONCS the model reports: Dataset Management, Write Zeroes, Compare.
pub const ONCS: u16 = 1 << 2 | 1 << 3 | 1;

fn put(p: &mut [u8], off: usize, b: &[u8]) {
    p[off..off + b.len()].copy_from_slice(b);
}

fn ascii(p: &mut [u8], off: usize, len: usize, s: &str) {
    let f = &mut p[off..off + len];
    f.fill(b' ');
    f[..s.len()].copy_from_slice(s.as_bytes());
}

impl NvmeConfig {
    /// Identify NN: as configured, else the largest NSID.
    pub fn nn(&self) -> u32 {
        self.nn
            .unwrap_or_else(|| self.namespaces.iter().map(|n| n.nsid).max().unwrap_or(0))
    }

    /// The Identify Controller page (CNS 01h) this configuration answers with.
    pub fn identify_controller(&self) -> [u8; 4096] {
        let mut p = [0u8; 4096];
        put(&mut p, 0, &0x1b36u16.to_le_bytes());
        put(&mut p, 2, &0x1af4u16.to_le_bytes());
        ascii(&mut p, 4, 20, "UBDMODEL0001");
        ascii(&mut p, 24, 40, "ubdirect devmodel NVMe");
        ascii(&mut p, 64, 8, "1.0");
        p[77] = self.mdts;
        put(&mut p, 78, &1u16.to_le_bytes());
        put(&mut p, 80, &self.vs.to_le_bytes());
        put(&mut p, 88, &100_000u32.to_le_bytes());
        let oacs: u16 = if self.shadow_doorbells { 1 << 8 } else { 0 };
        put(&mut p, 256, &oacs.to_le_bytes());
        p[258] = 3; // ACL
        p[262] = 3; // ELPE
        p[512] = 0x66; // SQES
        p[513] = 0x44; // CQES
        put(&mut p, 516, &self.nn().to_le_bytes());
        put(&mut p, 520, &ONCS.to_le_bytes());
        p[525] = 1; // VWC
        ascii(&mut p, 768, 256, "nqn.2026-11.invalid.ubdirect:devmodel");
        p
    }
}

impl NsConfig {
    /// The Identify Namespace page (CNS 00h) of this namespace: one LBA format, in use.
    pub fn identify(&self) -> [u8; 4096] {
        let mut p = [0u8; 4096];
        for off in [0, 8, 16] {
            put(&mut p, off, &self.blocks.to_le_bytes());
        }
        p[25] = 0; // NLBAF: one format
        p[26] = 0; // FLBAS: format 0
        put(&mut p, 128, &[0, 0, self.lbads, 0]);
        p
    }
}

impl State {
    /// Identify Controller (CNS 01h).
    pub(crate) fn identify_controller(&self) -> [u8; 4096] {
        self.cfg.identify_controller()
    }

    /// Identify Namespace (CNS 00h): zeros for an inactive NSID.
    pub(crate) fn identify_namespace(&self, nsid: u32) -> [u8; 4096] {
        match self.cfg.namespaces.iter().find(|n| n.nsid == nsid) {
            Some(n) => n.identify(),
            None => [0u8; 4096],
        }
    }

    /// Namespace Identification Descriptor list (CNS 03h): one Command Set Identifier
    /// descriptor naming the NVM command set; zeros for an inactive NSID.
    pub(crate) fn ns_descriptors(&self, nsid: u32) -> [u8; 4096] {
        let mut p = [0u8; 4096];
        if self.cfg.namespaces.iter().any(|n| n.nsid == nsid) {
            p[0] = 0x04; // NIDT: Command Set Identifier
            p[1] = 1; // NIDL
            p[4] = 0x00; // CSI: NVM
        }
        p
    }

    /// Active Namespace ID list (CNS 02h): active NSIDs above `after`, ascending, at most 1024.
    pub(crate) fn active_list(&self, after: u32) -> [u8; 4096] {
        let mut p = [0u8; 4096];
        let mut ids: Vec<u32> = self
            .cfg
            .namespaces
            .iter()
            .map(|n| n.nsid)
            .filter(|&n| n > after)
            .collect();
        ids.sort_unstable();
        for (i, id) in ids.iter().take(1024).enumerate() {
            put(&mut p, i * 4, &id.to_le_bytes());
        }
        p
    }
}
