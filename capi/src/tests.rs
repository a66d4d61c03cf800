//! The C entry points called as C calls them, against the NVMe device model.

use std::ffi::{c_int, c_void, CStr};
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

use crate::buf::*;
use crate::cmd::*;
use crate::ctrlr::*;
use crate::env::*;
use crate::error::*;
use crate::model::ubd_env_open_model_for_tests;
use crate::pipeline::*;
use crate::qpair::*;

fn last() -> String {
    // SAFETY: the message is a NUL-terminated string owned by this thread.
    unsafe { CStr::from_ptr(ubd_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// An environment over the model (4 buffers of 8 KiB), its controller, namespace 1 and a
/// queue pair of depth 4.
struct Fixture {
    env: *mut ubd_env,
    ctrlr: *mut ubd_ctrlr,
    ns: *const ubd_ns,
    qp: *mut ubd_qpair,
}

impl Fixture {
    fn new() -> Fixture {
        let mut o = std::mem::MaybeUninit::<ubd_env_opts>::uninit();
        assert_eq!(ubd_env_opts_init(o.as_mut_ptr()), 0);
        // SAFETY: initialised by ubd_env_opts_init.
        let mut o = unsafe { o.assume_init() };
        o.block_size = 8192;
        o.block_count = 4;
        let mut env = null_mut();
        assert_eq!(ubd_env_open_model_for_tests(&o, &mut env), 0, "{}", last());
        let mut ctrlr = null_mut();
        assert_eq!(
            ubd_ctrlr_open(env, c"0000:7f:00.0".as_ptr(), &mut ctrlr),
            0,
            "{}",
            last()
        );
        let mut ns = null();
        assert_eq!(ubd_ctrlr_get_ns(ctrlr, 1, &mut ns), 0, "{}", last());
        let qo = ubd_qpair_opts {
            depth: 4,
            delay_doorbell: 0,
        };
        let mut qp = null_mut();
        assert_eq!(ubd_qpair_alloc(ctrlr, &qo, &mut qp), 0, "{}", last());
        Fixture { env, ctrlr, ns, qp }
    }

    fn buf(&self) -> *mut ubd_buf {
        let mut b = null_mut();
        assert_eq!(ubd_buf_get(self.env, &mut b), 0, "{}", last());
        b
    }

    /// Process completions until `done` holds `n` of them, within 5 s.
    fn wait(&self, done: &Done, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while done.0.len() < n {
            assert!(Instant::now() < deadline, "no completion within 5 s");
            assert!(ubd_qpair_process_completions(self.qp, 0) >= 0, "{}", last());
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        ubd_qpair_free(&mut self.qp);
        ubd_ctrlr_close(&mut self.ctrlr);
        ubd_env_close(&mut self.env);
    }
}

/// What the callbacks saw: (cb_arg as a number, status, bytes, buf).
#[derive(Default)]
struct Done(Vec<(usize, c_int, u64, *mut ubd_buf)>);

extern "C" fn record(arg: *mut c_void, cpl: *const ubd_completion) {
    // SAFETY: the tests pass a `Done` as the argument; `cpl` is valid during the callback.
    let (done, c) = unsafe { (&mut *(arg as *mut Done), &*cpl) };
    done.0.push((done.0.len(), c.status, c.bytes, c.buf));
}

fn bytes<'a>(b: *mut ubd_buf) -> &'a mut [u8] {
    // SAFETY: the caller holds the buffer; data/size describe its memory.
    unsafe { std::slice::from_raw_parts_mut(ubd_buf_data(b).cast::<u8>(), ubd_buf_size(b)) }
}

#[test]
fn a_write_reads_back_byte_exact_through_callbacks() {
    let f = Fixture::new();
    assert_eq!(ubd_ns_get_sector_size(f.ns), 512);
    assert_eq!(ubd_ns_get_num_sectors(f.ns), 8192);
    let b = f.buf();
    assert_eq!(ubd_buf_size(b), 8192);
    for (i, x) in bytes(b).iter_mut().enumerate() {
        *x = (i % 251) as u8 ^ 0x5a;
    }
    let want = bytes(b)[..4096].to_vec();
    let mut done = Done::default();
    let arg = &mut done as *mut Done as *mut c_void;
    let r = ubd_ns_cmd_write(f.ns, f.qp, b, 8, 8, Some(record), arg, UBD_IO_FLAGS_FUA);
    assert_eq!(r, 0, "{}", last());
    assert_eq!(ubd_buf_put(b), -libc::EBUSY, "a lent buffer was put back");
    assert_eq!(ubd_qpair_get_num_outstanding(f.qp), 1);
    f.wait(&done, 1);
    assert_eq!(done.0[0], (0, 0, 4096, b));
    bytes(b).fill(0);
    let r = ubd_ns_cmd_read(f.ns, f.qp, b, 8, 8, Some(record), arg, 0);
    assert_eq!(r, 0, "{}", last());
    f.wait(&done, 2);
    assert_eq!(done.0[1], (1, 0, 4096, b));
    assert!(bytes(b)[..4096] == want[..], "read back differs");

    // Write zeroes on the first block, flush, deallocate: each called back without a buffer.
    assert_eq!(
        ubd_ns_cmd_write_zeroes(f.ns, f.qp, 8, 1, Some(record), arg, 0),
        0
    );
    assert_eq!(ubd_ns_cmd_flush(f.ns, f.qp, Some(record), arg), 0);
    assert_eq!(
        ubd_ns_cmd_deallocate(f.ns, f.qp, 100, 4, Some(record), arg),
        0
    );
    f.wait(&done, 5);
    for (i, &(_, status, _, buf)) in done.0[2..].iter().enumerate() {
        assert_eq!((status, buf), (0, null_mut()), "command {i}: {}", last());
    }
    assert_eq!(
        ubd_ns_cmd_read(f.ns, f.qp, b, 8, 8, Some(record), arg, 0),
        0
    );
    f.wait(&done, 6);
    assert!(bytes(b)[..512].iter().all(|&x| x == 0), "zeroed block");
    assert!(
        bytes(b)[512..4096] == want[512..],
        "the next blocks kept their data"
    );
    assert_eq!(ubd_buf_put(b), 0);
}

#[test]
fn a_refused_submit_leaves_the_buffer_with_the_caller() {
    let f = Fixture::new();
    let b = f.buf();
    bytes(b).fill(0x77);
    let mut done = Done::default();
    let arg = &mut done as *mut Done as *mut c_void;
    // Past the namespace's end.
    let r = ubd_ns_cmd_read(f.ns, f.qp, b, 8191, 2, Some(record), arg, 0);
    assert_eq!(r, -libc::ERANGE);
    assert!(last().contains("8191"), "{}", last());
    // More blocks than the buffer holds.
    let r = ubd_ns_cmd_read(f.ns, f.qp, b, 0, 17, Some(record), arg, 0);
    assert_eq!(r, -libc::EINVAL);
    assert!(last().contains("17 blocks"), "{}", last());
    // Unknown flags.
    assert_eq!(
        ubd_ns_cmd_write(f.ns, f.qp, b, 0, 1, None, null_mut(), 1),
        -libc::EINVAL
    );
    assert!(last().contains("flags"), "{}", last());
    assert_eq!(ubd_qpair_get_num_outstanding(f.qp), 0);
    assert_eq!(ubd_qpair_process_completions(f.qp, 0), 0);
    assert!(done.0.is_empty(), "a refused submit was called back");
    // The buffer is the caller's: untouched, submittable, and put back.
    assert!(bytes(b).iter().all(|&x| x == 0x77));
    assert_eq!(
        ubd_ns_cmd_write(f.ns, f.qp, b, 0, 1, Some(record), arg, 0),
        0
    );
    f.wait(&done, 1);
    assert_eq!(done.0[0].1, 0);
    assert_eq!(ubd_buf_put(b), 0);
}

#[test]
fn a_full_queue_pair_refuses_with_eagain_and_a_callback_may_submit_again() {
    let f = Fixture::new();
    let depth = {
        let mut n = 0;
        while ubd_ns_cmd_flush(f.ns, f.qp, None, null_mut()) == 0 {
            n += 1;
            assert!(n < 1000, "the queue pair never filled");
        }
        n
    };
    assert!(depth >= 1);
    assert_eq!(
        ubd_ns_cmd_flush(f.ns, f.qp, None, null_mut()),
        -libc::EAGAIN
    );
    assert!(last().contains("in flight"), "{}", last());
    let deadline = Instant::now() + Duration::from_secs(5);
    while ubd_qpair_get_num_outstanding(f.qp) > 0 {
        assert!(Instant::now() < deadline);
        ubd_qpair_process_completions(f.qp, 0);
    }

    /// Resubmits a flush from its own callback until `left` reaches 0.
    struct Chain {
        f: *const Fixture,
        left: u32,
        nested: c_int,
    }
    extern "C" fn again(arg: *mut c_void, _cpl: *const ubd_completion) {
        // SAFETY: the test passes a `Chain` whose fixture outlives the queue pair's use.
        let c = unsafe { &mut *(arg as *mut Chain) };
        // SAFETY: the fixture lives on the test's stack until the chain ends.
        let f = unsafe { &*c.f };
        c.nested = ubd_qpair_process_completions(f.qp, 0);
        if c.left > 0 {
            c.left -= 1;
            assert_eq!(ubd_ns_cmd_flush(f.ns, f.qp, Some(again), arg), 0);
        }
    }
    let mut chain = Chain {
        f: &f,
        left: 3,
        nested: 0,
    };
    let arg = &mut chain as *mut Chain as *mut c_void;
    assert_eq!(ubd_ns_cmd_flush(f.ns, f.qp, Some(again), arg), 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while chain.left > 0 || ubd_qpair_get_num_outstanding(f.qp) > 0 {
        assert!(Instant::now() < deadline, "the chain stopped");
        assert!(ubd_qpair_process_completions(f.qp, 0) >= 0, "{}", last());
    }
    assert_eq!(
        chain.nested,
        -libc::EBUSY,
        "a nested process call was not refused"
    );
}

#[test]
fn a_missing_device_gives_enodev_and_a_malformed_address_einval() {
    let f = Fixture::new();
    let mut c = null_mut();
    assert_eq!(
        ubd_ctrlr_open(f.env, c"0000:ff:1f.7".as_ptr(), &mut c),
        -libc::ENODEV
    );
    let m = last();
    assert!(m.contains("no PCI device 0000:ff:1f.7"), "{m}");
    assert!(c.is_null());
    assert_eq!(
        ubd_ctrlr_open(f.env, c"not-an-address".as_ptr(), &mut c),
        -libc::EINVAL
    );
    assert!(last().contains("not-an-address"), "{}", last());
    // ubd_env_open with an address that does not parse fails before anything opens.
    let addrs = [c"0000:zz:00.0".as_ptr()];
    let o = ubd_env_opts {
        nvme_addrs: addrs.as_ptr(),
        nvme_count: 1,
        block_size: 4096,
        block_count: 1,
        memory: UBD_POOL_ANONYMOUS,
        reserve_hugepages: 0,
        numa_node: -1,
    };
    let mut env = null_mut();
    assert_eq!(ubd_env_open(&o, &mut env), -libc::EINVAL);
    assert!(last().contains("0000:zz:00.0"), "{}", last());
    assert!(env.is_null());
    let mut ns = null();
    assert_eq!(ubd_ctrlr_get_ns(f.ctrlr, 9, &mut ns), -libc::ENOENT);
    assert!(last().contains("namespace 9"), "{}", last());
}

#[test]
fn null_arguments_give_einval_with_a_message_and_close_is_idempotent() {
    let f = Fixture::new();
    let mut out = null_mut();
    assert_eq!(ubd_env_open(null(), &mut out), -libc::EINVAL);
    assert_eq!(last(), "opts is NULL");
    assert_eq!(ubd_env_opts_init(null_mut()), -libc::EINVAL);
    assert_eq!(
        ubd_ctrlr_open(null(), c"0000:7f:00.0".as_ptr(), &mut null_mut()),
        -libc::EINVAL
    );
    assert_eq!(last(), "env is NULL");
    assert_eq!(
        ubd_ctrlr_open(f.env, null(), &mut null_mut()),
        -libc::EINVAL
    );
    assert_eq!(
        ubd_ctrlr_open(f.env, c"0000:7f:00.0".as_ptr(), null_mut()),
        -libc::EINVAL
    );
    assert_eq!(ubd_buf_get(null(), &mut null_mut()), -libc::EINVAL);
    assert_eq!(ubd_buf_get(f.env, null_mut()), -libc::EINVAL);
    assert_eq!(
        ubd_qpair_alloc(null(), null(), &mut null_mut()),
        -libc::EINVAL
    );
    let b = f.buf();
    for r in [
        ubd_ns_cmd_read(null(), f.qp, b, 0, 1, None, null_mut(), 0),
        ubd_ns_cmd_read(f.ns, null_mut(), b, 0, 1, None, null_mut(), 0),
        ubd_ns_cmd_read(f.ns, f.qp, null_mut(), 0, 1, None, null_mut(), 0),
        ubd_ns_cmd_write(f.ns, f.qp, null_mut(), 0, 1, None, null_mut(), 0),
        ubd_ns_cmd_flush(null(), f.qp, None, null_mut()),
        ubd_ns_cmd_write_zeroes(f.ns, null_mut(), 0, 1, None, null_mut(), 0),
        ubd_ns_cmd_deallocate(null(), f.qp, 0, 1, None, null_mut()),
        ubd_qpair_process_completions(null_mut(), 0),
    ] {
        assert_eq!(r, -libc::EINVAL, "{}", last());
        assert!(last().ends_with("is NULL"), "{}", last());
    }
    assert!(ubd_buf_data(null()).is_null());
    assert_eq!(ubd_buf_size(null()), 0);
    assert_eq!(ubd_ns_get_sector_size(null()), 0);
    assert_eq!(ubd_buf_put(null_mut()), 0);
    assert_eq!(ubd_buf_put(b), 0);
    // Close twice, and close NULL: nothing happens.
    let mut c = null_mut();
    assert_eq!(ubd_ctrlr_open(f.env, c"0000:7f:00.0".as_ptr(), &mut c), 0);
    ubd_ctrlr_close(&mut c);
    assert!(c.is_null());
    ubd_ctrlr_close(&mut c);
    ubd_ctrlr_close(null_mut());
    ubd_qpair_free(null_mut());
    ubd_env_close(null_mut());
}

#[test]
fn strerror_names_every_errno_the_api_returns() {
    for e in [
        libc::EINVAL,
        libc::ENODEV,
        libc::ENOENT,
        libc::ENOMEM,
        libc::EBUSY,
        libc::EAGAIN,
        libc::ERANGE,
        libc::EIO,
        libc::ETIMEDOUT,
    ] {
        // SAFETY: a static NUL-terminated string.
        let s = unsafe { CStr::from_ptr(ubd_strerror(-e)) }
            .to_str()
            .unwrap();
        assert_ne!(s, "unknown error", "errno {e}");
    }
    // SAFETY: as above.
    let s = unsafe { CStr::from_ptr(ubd_strerror(-9999)) };
    assert_eq!(s.to_str().unwrap(), "unknown error");
}

#[test]
fn a_panic_becomes_eio_with_its_message() {
    let r = guard(|| panic!("boom inside"));
    assert_eq!(r, -libc::EIO);
    assert!(last().contains("boom inside"), "{}", last());
}

#[test]
fn the_flag_constants_are_the_drivers_bits() {
    use ubdirect::nvme::IoFlags;
    assert_eq!(UBD_IO_FLAGS_FUA, IoFlags::FUA.bits());
    assert_eq!(UBD_IO_FLAGS_LIMITED_RETRY, IoFlags::LIMITED_RETRY.bits());
}

#[test]
fn the_pipeline_streams_and_verifies_in_one_call() {
    let f = Fixture::new();
    let mut o = std::mem::MaybeUninit::<ubd_pipeline_opts>::uninit();
    assert_eq!(ubd_pipeline_opts_init(o.as_mut_ptr()), 0);
    // SAFETY: initialised by ubd_pipeline_opts_init.
    let mut o = unsafe { o.assume_init() };
    o.block_size = 8192;
    o.qd = 2;
    o.bytes = 1 << 20;
    o.verify = 1;
    let mut r = std::mem::MaybeUninit::<ubd_pipeline_report>::zeroed();
    // SAFETY: all-zero bytes are a valid report (integers and floats).
    let mut r = unsafe { r.assume_init_mut() as *mut ubd_pipeline_report };
    assert_eq!(ubd_pipeline_run(f.env, f.ctrlr, &o, r), 0, "{}", last());
    // SAFETY: filled by the call.
    let rep = unsafe { &*r };
    assert_eq!((rep.bytes, rep.verified), (1 << 20, 1));
    assert!(rep.seconds > 0.0 && rep.gb_per_s > 0.0);

    // Settings out of range fail with a message, before anything runs.
    o.block_size = 3 * 8192;
    assert_eq!(
        ubd_pipeline_run(f.env, f.ctrlr, &o, r),
        -libc::EINVAL,
        "{}",
        last()
    );
    assert!(last().starts_with("pipeline: "), "{}", last());
    o.qd = 0;
    assert_eq!(ubd_pipeline_run(f.env, f.ctrlr, &o, r), -libc::EINVAL);
    assert!(last().contains("qd 0"), "{}", last());
    r = null_mut();
    assert_eq!(ubd_pipeline_run(f.env, f.ctrlr, null(), r), -libc::EINVAL);
    assert_eq!(last(), "opts is NULL");
}
