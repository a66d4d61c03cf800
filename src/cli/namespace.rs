//! `--ns N`: the one spelling of an NVMe namespace across the subcommands, and the error that
//! lists the namespace ids a controller has when the one asked for is not among them.

use ubdirect::nvme::{Controller, NamespaceInfo};

/// The namespace `nsid` of `ctrl` at `addr` (`None`: the first active one), or an error naming
/// the active namespace ids.
pub fn pick<'a>(
    ctrl: &'a Controller,
    addr: &str,
    nsid: Option<u32>,
) -> Result<&'a NamespaceInfo, String> {
    let active: Vec<u32> = ctrl.namespaces().iter().map(|n| n.nsid).collect();
    let found = match nsid {
        Some(n) => ctrl.namespace_info(n),
        None => ctrl.namespaces().first(),
    };
    found.ok_or_else(|| not_active(addr, nsid, &active))
}

/// The message for a namespace that is not active: the ids that are, and how to pick one.
pub fn not_active(addr: &str, nsid: Option<u32>, active: &[u32]) -> String {
    let Some(first) = active.first() else {
        return format!(
            "{addr} has no active namespace: create and attach one first (nvme-cli: nvme create-ns, nvme attach-ns, with the controller on its kernel driver)"
        );
    };
    let ids: Vec<String> = active.iter().map(u32::to_string).collect();
    format!(
        "namespace {} is not active on {addr}; its active namespace ids are {}: pick one with --ns (e.g. --ns {first})",
        nsid.map(|n| n.to_string()).unwrap_or_default(),
        ids.join(", "),
    )
}

/// The namespace both spellings name: `--ns N` and the hidden `nvme:<addr>/N` form must agree.
pub fn merge(flag: Option<u32>, in_source: Option<u32>) -> Result<Option<u32>, String> {
    match (flag, in_source) {
        (Some(a), Some(b)) if a != b => Err(format!(
            "--ns {a} and the namespace {b} in the source name differ: give it once, with --ns"
        )),
        (a, b) => Ok(a.or(b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_lists_namespace_ids_not_a_count() {
        let m = not_active("0000:00:04.0", Some(9), &[1, 2]);
        assert!(m.contains("namespace 9 is not active"), "{m}");
        assert!(m.contains("active namespace ids are 1, 2"), "{m}");
        assert!(m.contains("--ns 1"), "{m}");
        let m = not_active("0000:00:04.0", Some(1), &[]);
        assert!(m.contains("no active namespace"), "{m}");
    }

    #[test]
    fn both_spellings_must_agree() {
        assert_eq!(merge(Some(2), None), Ok(Some(2)));
        assert_eq!(merge(None, Some(2)), Ok(Some(2)));
        assert_eq!(merge(Some(2), Some(2)), Ok(Some(2)));
        assert!(merge(Some(1), Some(2)).is_err());
        assert_eq!(merge(None, None), Ok(None));
    }
}
