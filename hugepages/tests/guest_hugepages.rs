//! Guest tests of the hugepage crate against the guest kernel's real sysfs and hugetlb (the
//! guest boots with 2 MiB and 1 GiB pages reserved; see scripts/vm/README.md). On the host they
//! are listed as ignored.

use ubdirect_hugepages::{pools, reserve, virt_to_phys, HugeError, HugeMem, PageSize};

fn pool(node: Option<u32>, size: PageSize) -> ubdirect_hugepages::PoolInfo {
    pools()
        .unwrap()
        .into_iter()
        .find(|p| p.node == node && p.size == size)
        .expect("pool listed")
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn reserve_grows_and_shrinks_the_pool() {
    let before = pool(None, PageSize::Size2M);
    // Put the reservation back even when an assertion fails: later tests count on it.
    struct Restore(u64);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = reserve(None, PageSize::Size2M, self.0);
        }
    }
    let _restore = Restore(before.total);
    assert_eq!(
        reserve(None, PageSize::Size2M, before.total + 2).unwrap(),
        before.total + 2
    );
    let grown = pool(None, PageSize::Size2M);
    assert_eq!(grown.free, before.free + 2);
    // Per node: node 0 holds every page of this single-node guest.
    let n0 = pool(Some(0), PageSize::Size2M);
    assert_eq!(n0.total, grown.total);
    assert_eq!(
        reserve(Some(0), PageSize::Size2M, n0.total - 2).unwrap(),
        n0.total - 2
    );
    assert_eq!(pool(None, PageSize::Size2M), before);
    let e = reserve(Some(5), PageSize::Size2M, 1).unwrap_err();
    assert!(matches!(e, HugeError::NoSuchNode { node: 5, .. }), "{e}");
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn hugemem_takes_and_returns_pages_and_has_physical_pages() {
    let before = pool(None, PageSize::Size2M).free;
    let m = HugeMem::alloc(5 << 20, PageSize::Size2M, Some(0)).unwrap();
    assert_eq!(m.len(), 6 << 20);
    assert_eq!(m.numa_node(), Some(0));
    assert_eq!(
        pool(None, PageSize::Size2M).free,
        before - 3,
        "populated at once"
    );
    // Each 2 MiB page is physically contiguous and 2 MiB aligned.
    for page in 0..3 {
        let p = m.as_ptr().wrapping_add(page << 21);
        let pa = virt_to_phys(p).unwrap();
        assert_eq!(pa % (2 << 20), 0, "page {page} at {pa:#x}");
        assert_eq!(virt_to_phys(p.wrapping_add(12345)).unwrap(), pa + 12345);
    }
    drop(m);
    assert_eq!(pool(None, PageSize::Size2M).free, before);
    // More than is free: refused with the numbers, nothing taken.
    let e = HugeMem::alloc((before as usize + 1) << 21, PageSize::Size2M, None).unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("(need {}, free {before})", before + 1)),
        "{e}"
    );
    assert_eq!(pool(None, PageSize::Size2M).free, before);
}

#[test]
#[ignore = "guest: needs hugepages, run by scripts/test.sh"]
fn alloc_maps_writable_pages_rounded_up_to_whole_pages() {
    let before = pool(None, PageSize::Size2M).free;
    assert!(
        before >= 2,
        "the test bed reserves 2 MiB hugepages: {before} free"
    );
    let m = HugeMem::alloc(3 << 20, PageSize::Size2M, None).unwrap();
    assert_eq!(m.len(), 4 << 20);
    assert_eq!(m.as_ptr() as usize % (2 << 20), 0);
    // SAFETY: the mapping is ours and len bytes long.
    let s = unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), m.len()) };
    s[0] = 1;
    s[m.len() - 1] = 2;
    assert_eq!(s[0] + s[m.len() - 1], 3);
    assert_eq!(pool(None, PageSize::Size2M).free, before - 2);
    drop(m);
    assert_eq!(pool(None, PageSize::Size2M).free, before);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn gigabyte_pages_map() {
    // The test bed reserves exactly one 1 GiB page at boot (scripts/vm/run.sh: hugepagesz=1G
    // hugepages=1 with --mem 3584M): it maps, and with it taken the next is refused by name.
    let p = pool(None, PageSize::Size1G);
    assert_eq!(
        p.free, 1,
        "the test bed reserves one 1 GiB hugepage (UBD_VM_HUGEPAGES, --mem 3584M): {p:?}"
    );
    let m = HugeMem::alloc(1, PageSize::Size1G, None).unwrap();
    assert_eq!(m.len(), 1 << 30);
    assert_eq!(virt_to_phys(m.as_ptr()).unwrap() % (1 << 30), 0);
    assert_eq!(pool(None, PageSize::Size1G).free, 0);
    let e = HugeMem::alloc(1 << 30, PageSize::Size1G, None).unwrap_err();
    assert!(e.to_string().contains("no free 1 GiB hugepages"), "{e}");
    drop(m);
    assert_eq!(pool(None, PageSize::Size1G).free, 1);
}
