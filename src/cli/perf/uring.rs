//! `ubdirect perf --engine uring-iopoll | uring-cmd`: the kernel's polled paths as baselines, on
//! the controller bound to the kernel nvme driver (loaded with `nvme.poll_queues=1` or more).
//! `uring-iopoll`: `IORING_SETUP_IOPOLL`, registered buffers, `ReadFixed` with O_DIRECT on the
//! namespace's block device. `uring-cmd`: NVMe passthrough (`IORING_OP_URING_CMD`, SQE128 and
//! CQE32, polled, registered buffers) on its char device. Each wait is a polled
//! `io_uring_enter`; the kernel's nvme I/O timeout bounds it, and the run also stops when
//! nothing completes for [`WAIT`].

use std::alloc::Layout;
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use ubdirect::dma::util::pin_to_core;
use ubdirect::dma::util::{rdtsc, LatencyHistogram, Tsc};

use super::{finish, plain_core, single_core_randread, Args, Engine, PlainRun, RunEnd, ShadowInfo};
use crate::cli::CliResult;

/// Nothing completing for this long fails the run.
const WAIT: Duration = Duration::from_secs(5);

/// Reads in flight at most.
const MAX_DEPTH: usize = 1024;

/// NVME_URING_CMD_IO: _IOWR('N', 0x80, struct nvme_uring_cmd) (72 bytes).
const NVME_URING_CMD_IO: u32 = 0xC048_4E80;

/// The namespace's block device name (`nvme0n1`) under the controller at `addr`.
fn block_device(addr: &str, nsid: Option<u32>) -> Result<String, String> {
    let dir = Path::new("/sys/bus/pci/devices").join(addr).join("nvme");
    let ctrl = std::fs::read_dir(&dir)
        .ok()
        .and_then(|d| d.flatten().map(|e| e.file_name()).next())
        .ok_or_else(|| {
            format!(
                "{addr} is not bound to the kernel nvme driver ({} is missing): run `ubdirect bind-kernel {addr}` (or bind-kernel in the guest) first",
                dir.display()
            )
        })?;
    let cdir = dir.join(&ctrl);
    let mut names: Vec<String> = std::fs::read_dir(&cdir)
        .map_err(|e| format!("{}: {e}", cdir.display()))?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("nvme") && n.contains('n') && n[4..].contains('n'))
        .collect();
    names.sort();
    let want = nsid.map(|n| format!("n{n}"));
    names
        .into_iter()
        .find(|n| want.as_ref().is_none_or(|w| n.ends_with(w.as_str())))
        .ok_or_else(|| {
            format!(
                "{addr}: no namespace block device{} under {}",
                nsid.map(|n| format!(" for nsid {n}")).unwrap_or_default(),
                cdir.display()
            )
        })
}

/// The block and generic char device names of a namespace's sysfs entry under its controller:
/// `nvme0n1` gives (`nvme0n1`, `ng0n1`); with native multipath the entry is the path device
/// `nvme<subsys>c<ctrl>n<ns>`, whose block device is the head `nvme<subsys>n<ns>` and whose char
/// device is `ng<ctrl>n<ns>`.
fn device_names(entry: &str) -> (String, String) {
    let rest = entry.strip_prefix("nvme").unwrap_or(entry);
    match rest
        .split_once('c')
        .and_then(|(s, t)| Some((s, t.split_once('n')?)))
    {
        Some((subsys, (ctrl, ns))) => (format!("nvme{subsys}n{ns}"), format!("ng{ctrl}n{ns}")),
        None => (entry.to_string(), format!("ng{rest}")),
    }
}

fn sys_u64(path: PathBuf) -> Result<u64, String> {
    std::fs::read_to_string(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .trim()
        .parse()
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Aligned, zeroed buffer memory for the registered buffers.
struct Bufs {
    ptr: *mut u8,
    layout: Layout,
}

impl Bufs {
    fn new(len: usize) -> Result<Bufs, String> {
        let layout = Layout::from_size_align(len.max(4096), 4096).map_err(|e| e.to_string())?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(format!("cannot allocate {len} bytes of I/O buffers"));
        }
        Ok(Bufs { ptr, layout })
    }
}

impl Drop for Bufs {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the ring that used it is gone by now
        // (declared after the buffers, so dropped first).
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Run a kernel engine.
pub(super) fn run(args: &Args) -> CliResult {
    let core = single_core_randread(args)?;
    let ns = KernelNs::find(args)?;
    pin_to_core(core)?;
    let depth = args.queue_depth;
    let bufs = Bufs::new(depth * args.io_size)?;
    let tsc = Tsc::calibrate(Duration::from_millis(100));
    let mut hist = LatencyHistogram::new();
    let job = Job {
        depth,
        io_size: args.io_size,
        offset: ns.offset,
        slots: ns.slots,
        run_ticks: tsc.ticks(Duration::from_secs_f64(args.time.max(0.01))),
        wait_ticks: tsc.ticks(WAIT),
        ok: if args.engine == Engine::UringCmd {
            0
        } else {
            args.io_size as i32
        },
    };
    let t0 = Instant::now();
    let (ios, errors) = if args.engine == Engine::UringCmd {
        run_passthrough(&ns, &bufs, &job, &mut hist)?
    } else {
        run_direct(&ns, &bufs, &job, &mut hist)?
    };
    let secs = t0.elapsed().as_secs_f64();
    let mut cores = [plain_core(
        PlainRun {
            core,
            qid: 0,
            ios,
            errors,
            secs,
            io_size: args.io_size,
            doorbells: (0, 0),
        },
        hist,
        &tsc,
    )];
    cores[0].queue_depth = depth;
    finish(
        args,
        ns.nsid,
        ShadowInfo::not_used("the kernel's nvme driver rings the doorbells"),
        &tsc,
        &mut cores,
        RunEnd::without_pool(0),
    )
}

/// The namespace under the kernel's nvme driver and the range the run reads.
struct KernelNs {
    /// Its block device name (`nvme0n1`).
    name: String,
    /// Its generic char device name (`ng0n1`).
    generic: String,
    lba: u64,
    nsid: u32,
    offset: u64,
    /// `-o`-sized reads that fit in the span.
    slots: u64,
}

impl KernelNs {
    /// The namespace `-n` names under the controller at the address, from sysfs; its range
    /// from `--offset` and `--span`.
    fn find(args: &Args) -> Result<KernelNs, String> {
        let (name, generic) = device_names(&block_device(&args.addr, args.nsid)?);
        let sys = Path::new("/sys/block").join(&name);
        let lba = sys_u64(sys.join("queue/logical_block_size"))?;
        let nsid = sys_u64(sys.join("nsid")).unwrap_or(1) as u32;
        if args.io_size as u64 % lba != 0 {
            return Err(format!(
                "-o {} is not a multiple of {name}'s {lba}-byte logical block",
                args.io_size
            ));
        }
        let size = sys_u64(sys.join("size"))? * 512;
        let offset = args.offset.unwrap_or(0);
        let span = args
            .span
            .unwrap_or(u64::MAX)
            .min(size.saturating_sub(offset));
        let slots = span / args.io_size as u64;
        if slots == 0 {
            return Err(format!(
                "the span of {name} is smaller than one -o {} read",
                args.io_size
            ));
        }
        Ok(KernelNs {
            name,
            generic,
            lba,
            nsid,
            offset,
            slots,
        })
    }
}

/// `--engine uring-cmd`: NVMe Read commands passed through on the namespace's char device.
fn run_passthrough(
    ns: &KernelNs,
    bufs: &Bufs,
    job: &Job,
    hist: &mut LatencyHistogram,
) -> Result<(u64, u64), String> {
    let path = format!("/dev/{}", ns.generic);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{path}: {e} (the NVMe generic char device; kernel 5.19 or later)"))?;
    let ring: IoUring<squeue::Entry128, cqueue::Entry32> = IoUring::builder()
        .setup_iopoll()
        .build(entries(job))
        .map_err(|e| format!("io_uring with IOPOLL, SQE128 and CQE32: {e}"))?;
    let lba_shift = ns.lba.trailing_zeros();
    let nsid = ns.nsid;
    drive(ring, bufs, job, hist, |slot, off, buf| {
        let mut c = [0u8; 80];
        c[0] = 0x02; // Read
        c[4..8].copy_from_slice(&nsid.to_le_bytes());
        c[24..32].copy_from_slice(&(buf as u64).to_le_bytes()); // addr
        c[36..40].copy_from_slice(&(job.io_size as u32).to_le_bytes()); // data_len
        let slba = off >> lba_shift;
        c[40..44].copy_from_slice(&(slba as u32).to_le_bytes()); // cdw10
        c[44..48].copy_from_slice(&((slba >> 32) as u32).to_le_bytes()); // cdw11
        let nlb = (job.io_size as u64 >> lba_shift) as u32 - 1;
        c[48..52].copy_from_slice(&nlb.to_le_bytes()); // cdw12
        opcode::UringCmd80::new(types::Fd(file.as_raw_fd()), NVME_URING_CMD_IO)
            .cmd(c)
            .buf_index(Some(slot as u16))
            .build()
            .user_data(slot as u64)
    })
}

/// `--engine uring-iopoll`: fixed-buffer reads with O_DIRECT on the namespace's block device.
fn run_direct(
    ns: &KernelNs,
    bufs: &Bufs,
    job: &Job,
    hist: &mut LatencyHistogram,
) -> Result<(u64, u64), String> {
    let path = format!("/dev/{}", ns.name);
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .map_err(|e| format!("{path}: {e}"))?;
    let ring: IoUring = IoUring::builder()
        .setup_iopoll()
        .build(entries(job))
        .map_err(|e| format!("io_uring with IOPOLL: {e}"))?;
    drive(ring, bufs, job, hist, |slot, off, buf| {
        opcode::ReadFixed::new(
            types::Fd(file.as_raw_fd()),
            buf,
            job.io_size as u32,
            slot as u16,
        )
        .offset(off)
        .build()
        .user_data(slot as u64)
    })
}

/// The ring's size for a job.
fn entries(job: &Job) -> u32 {
    (job.depth as u32).next_power_of_two()
}

/// The shape of a kernel run.
struct Job {
    depth: usize,
    io_size: usize,
    offset: u64,
    slots: u64,
    run_ticks: u64,
    wait_ticks: u64,
    /// A completion's result when its read succeeded.
    ok: i32,
}

/// Keep `job.depth` reads in flight on `ring` (built by `sqe(slot, offset, buffer)`) for the
/// run time, then drain; (completed, failed).
fn drive<S, C>(
    ring: IoUring<S, C>,
    bufs: &Bufs,
    job: &Job,
    hist: &mut LatencyHistogram,
    sqe: impl Fn(usize, u64, *mut u8) -> S,
) -> Result<(u64, u64), String>
where
    S: squeue::EntryMarker,
    C: cqueue::EntryMarker,
{
    if job.depth > MAX_DEPTH {
        return Err(format!("the kernel engines keep at most {MAX_DEPTH} reads in flight: give -q {MAX_DEPTH} or less"));
    }
    let iovs: Vec<libc::iovec> = (0..job.depth)
        .map(|i| libc::iovec {
            // SAFETY: i * io_size < depth * io_size, the allocation's length.
            iov_base: unsafe { bufs.ptr.add(i * job.io_size) }.cast(),
            iov_len: job.io_size,
        })
        .collect();
    // SAFETY: the buffers outlive the ring (`bufs` is borrowed for this whole function, and the
    // ring is dropped at its end).
    unsafe { ring.submitter().register_buffers(&iovs) }
        .map_err(|e| format!("registering {} I/O buffers: {e}", job.depth))?;
    let mut d = Drive {
        ring,
        job,
        hist,
        sqe,
        iovs,
        rng: 0x9e37_79b9_7f4a_7c15,
        stamps: vec![0u64; job.depth],
        end: 0,
        ios: 0,
        errors: 0,
        in_flight: job.depth,
    };
    d.end = rdtsc() + job.run_ticks;
    for slot in 0..job.depth {
        d.submit(slot)?;
    }
    let mut last = rdtsc();
    while d.in_flight > 0 {
        d.ring
            .submit_and_wait(1)
            .map_err(|e| format!("io_uring_enter: {e}"))?;
        let reaped = d.reap_and_resubmit()?;
        let now = rdtsc();
        if reaped > 0 {
            last = now;
        } else if now.wrapping_sub(last) > job.wait_ticks {
            return Err(format!(
                "{} io_uring read(s) did not complete within {WAIT:?}",
                d.in_flight
            ));
        }
    }
    Ok((d.ios, d.errors))
}

/// A kernel run in progress: the ring, its registered buffers and the reads' timestamps.
struct Drive<'a, S: squeue::EntryMarker, C: cqueue::EntryMarker, F> {
    ring: IoUring<S, C>,
    job: &'a Job,
    hist: &'a mut LatencyHistogram,
    /// Builds a read's entry from (slot, offset, buffer).
    sqe: F,
    iovs: Vec<libc::iovec>,
    rng: u64,
    /// When each slot's read went out.
    stamps: Vec<u64>,
    /// When to stop sending reads.
    end: u64,
    ios: u64,
    errors: u64,
    in_flight: usize,
}

impl<S, C, F> Drive<'_, S, C, F>
where
    S: squeue::EntryMarker,
    C: cqueue::EntryMarker,
    F: Fn(usize, u64, *mut u8) -> S,
{
    /// A random `-o`-aligned offset within the span.
    fn next_off(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.job.offset + (self.rng % self.job.slots) * self.job.io_size as u64
    }

    /// Queue a read into `slot`'s buffer at a random offset.
    fn submit(&mut self, slot: usize) -> Result<(), String> {
        let off = self.next_off();
        let e = (self.sqe)(slot, off, self.iovs[slot].iov_base.cast());
        self.stamps[slot] = rdtsc();
        // SAFETY: the entry's buffer is registered and lives as long as the ring.
        unsafe { self.ring.submission().push(&e) }.map_err(|_| "io_uring submission queue full")?;
        Ok(())
    }

    /// Count the completions; before the end, send their slots out again. How many completed.
    fn reap_and_resubmit(&mut self) -> Result<usize, String> {
        let mut reaped = 0;
        let mut again: usize = 0;
        let mut slots_again = [0u16; MAX_DEPTH];
        for c in &mut self.ring.completion() {
            let now = rdtsc();
            let slot = c.user_data() as usize;
            self.hist.record(now.saturating_sub(self.stamps[slot]));
            self.ios += 1;
            reaped += 1;
            let c: cqueue::Entry = c.into();
            if c.result() != self.job.ok {
                self.errors += 1;
            }
            if now < self.end && again < slots_again.len() {
                slots_again[again] = slot as u16;
                again += 1;
            } else {
                self.in_flight -= 1;
            }
        }
        for &slot in &slots_again[..again] {
            self.submit(slot as usize)?;
        }
        Ok(reaped)
    }
}

#[cfg(test)]
mod tests {
    use super::device_names;

    #[test]
    fn namespace_device_names_with_and_without_multipath() {
        assert_eq!(device_names("nvme0n1"), ("nvme0n1".into(), "ng0n1".into()));
        assert_eq!(
            device_names("nvme1c1n1"),
            ("nvme1n1".into(), "ng1n1".into())
        );
        assert_eq!(
            device_names("nvme2c3n4"),
            ("nvme2n4".into(), "ng3n4".into())
        );
    }
}
