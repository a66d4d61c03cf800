//! The AF_XDP baseline of `ubdirect loopback --kernel af-xdp`: the same pattern frames between
//! the same two NICs through XDP sockets in copy mode (XDP_COPY). NIC A's socket sends from its
//! UMEM through its TX ring (completions come back on its completion ring); NIC B's receives
//! into its UMEM: an XDP program on B (see `xdp_prog`) redirects each frame of RX queue 0 to
//! the socket through an XSKMAP, and buffers go back through the fill ring. Written directly
//! over libc (socket, setsockopt XDP_UMEM_REG / XDP_*_RING, getsockopt XDP_MMAP_OFFSETS, mmap,
//! bind, poll); indices and descriptors the kernel writes are checked by `xsk_ring`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use ubdirect::virtio_net::pattern;

use super::kernel::{open_link, Link, SLOT};
use super::report::{CpuClock, LoopbackReport, RunInfo, Tally};
use super::sysfs_bar::SysfsBar;
use super::tpacket::{Mapping, Run};
use super::xdp_prog::Redirect;
use super::xsk_ring::{self as xr, XskRingError};
use super::LoopbackError;

/// UMEM chunk size (one frame per chunk).
const CHUNK: usize = 2048;
/// Chunks per UMEM, and entries per ring.
const ENTRIES: u32 = 2048;
/// Headroom the kernel leaves before a received frame in copy mode (XDP_PACKET_HEADROOM).
const KERNEL_HEADROOM: usize = 256;
const XDP_PGOFF_RX_RING: i64 = 0;
const XDP_PGOFF_TX_RING: i64 = 0x8000_0000;
const XDP_UMEM_PGOFF_FILL_RING: i64 = 0x1_0000_0000;
const XDP_UMEM_PGOFF_COMPLETION_RING: i64 = 0x1_8000_0000;

fn xsk_err(what: &str, e: io::Error) -> LoopbackError {
    let why = match e.raw_os_error() {
        Some(libc::EAFNOSUPPORT) => {
            " (this kernel has no AF_XDP sockets: it was built without CONFIG_XDP_SOCKETS)"
        }
        Some(libc::EPERM) => " (needs root / CAP_NET_RAW)",
        _ => "",
    };
    LoopbackError::Setup(format!("{what}: {e}{why}"))
}

fn ring_err(side: &str, e: XskRingError) -> LoopbackError {
    LoopbackError::Failed(format!(
        "the kernel's AF_XDP {side} ring is inconsistent: {e}"
    ))
}

fn set_opt<T>(fd: &OwnedFd, opt: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` is a live, initialised value of the size passed; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            opt,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One mapped AF_XDP ring: producer and consumer words, then `ENTRIES` entries.
struct Ring {
    map: Mapping,
    prod: usize,
    cons: usize,
    desc: usize,
    entry: usize,
    /// This process's index: the producer for fill / TX, the consumer for RX / completion.
    local: u32,
}

impl Ring {
    fn open(
        fd: &OwnedFd,
        off: &libc::xdp_ring_offset,
        pgoff: i64,
        entry: usize,
    ) -> Result<Ring, LoopbackError> {
        let field = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        let (prod, cons, desc) = (field(off.producer), field(off.consumer), field(off.desc));
        let len = desc.saturating_add(ENTRIES as usize * entry);
        if prod.max(cons).saturating_add(4) > len || prod % 4 != 0 || cons % 4 != 0 {
            return Err(LoopbackError::Setup(format!(
                "XDP_MMAP_OFFSETS gave a ring layout that does not fit its mapping (producer {prod}, consumer {cons}, descriptors {desc})"
            )));
        }
        let map = Mapping::map(Some(fd), len, pgoff)?;
        let local = map
            .status(
                if pgoff == XDP_UMEM_PGOFF_FILL_RING || pgoff == XDP_PGOFF_TX_RING {
                    prod
                } else {
                    cons
                },
            )
            .load(Ordering::Acquire);
        Ok(Ring {
            map,
            prod,
            cons,
            desc,
            entry,
            local,
        })
    }

    fn slot(&mut self, i: u32) -> &mut [u8] {
        let off = self.desc + (i % ENTRIES) as usize * self.entry;
        self.map.bytes(off, self.entry)
    }

    /// Entries the kernel has produced and this process not consumed yet.
    fn ready(&self) -> Result<u32, XskRingError> {
        xr::ready(
            self.map.status(self.prod).load(Ordering::Acquire),
            self.local,
            ENTRIES,
        )
    }

    /// Entries free for this process to produce into.
    fn room(&self) -> Result<u32, XskRingError> {
        xr::room(
            self.local,
            self.map.status(self.cons).load(Ordering::Acquire),
            ENTRIES,
        )
    }

    /// Publishes this process's producer index.
    fn produce(&self) {
        self.map
            .status(self.prod)
            .store(self.local, Ordering::Release);
    }

    /// Publishes this process's consumer index.
    fn consume(&self) {
        self.map
            .status(self.cons)
            .store(self.local, Ordering::Release);
    }

    fn put_addr(&mut self, addr: u64) {
        let i = self.local;
        self.slot(i).copy_from_slice(&addr.to_ne_bytes());
        self.local = i.wrapping_add(1);
    }

    fn get_addr(&mut self) -> u64 {
        let i = self.local;
        let s = self.slot(i);
        let a = u64::from_ne_bytes(s[..8].try_into().unwrap_or([0xff; 8]));
        self.local = i.wrapping_add(1);
        a
    }

    fn put_desc(&mut self, addr: u64, len: u32) {
        let i = self.local;
        let s = self.slot(i);
        s[..8].copy_from_slice(&addr.to_ne_bytes());
        s[8..12].copy_from_slice(&len.to_ne_bytes());
        s[12..16].fill(0);
        self.local = i.wrapping_add(1);
    }

    fn get_desc(&mut self) -> (u64, u64) {
        let i = self.local;
        let s = self.slot(i);
        let a = u64::from_ne_bytes(s[..8].try_into().unwrap_or([0xff; 8]));
        let l = u32::from_ne_bytes(s[8..12].try_into().unwrap_or([0xff; 4]));
        self.local = i.wrapping_add(1);
        (a, l as u64)
    }
}

/// An AF_XDP socket bound to queue 0 of one interface in copy mode, with its own UMEM.
struct Xsk {
    fd: OwnedFd,
    umem: Mapping,
    fill: Ring,
    comp: Ring,
    /// The RX ring (receiving socket) or the TX ring (sending socket).
    data: Ring,
}

impl Xsk {
    fn open(ifindex: i32, receive: bool) -> Result<Xsk, LoopbackError> {
        // SAFETY: plain socket creation; the descriptor is owned right after.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(xsk_err("socket(AF_XDP)", io::Error::last_os_error()));
        }
        // SAFETY: `raw` was just returned by socket() and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem = Mapping::map(None, CHUNK * ENTRIES as usize, 0)?;
        let reg = libc::xdp_umem_reg_v1 {
            addr: umem.addr(),
            len: umem.len() as u64,
            chunk_size: CHUNK as u32,
            headroom: 0,
        };
        set_opt(&fd, libc::XDP_UMEM_REG, &reg).map_err(|e| xsk_err("XDP_UMEM_REG", e))?;
        let data_opt = if receive {
            libc::XDP_RX_RING
        } else {
            libc::XDP_TX_RING
        };
        for opt in [
            libc::XDP_UMEM_FILL_RING,
            libc::XDP_UMEM_COMPLETION_RING,
            data_opt,
        ] {
            set_opt(&fd, opt, &ENTRIES).map_err(|e| xsk_err("setsockopt(XDP ring size)", e))?;
        }
        // SAFETY: xdp_mmap_offsets is plain old data; the kernel fills it.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `off`, which we own.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut len,
            )
        };
        if r != 0 || len as usize != std::mem::size_of::<libc::xdp_mmap_offsets>() {
            return Err(xsk_err(
                "getsockopt(XDP_MMAP_OFFSETS)",
                io::Error::last_os_error(),
            ));
        }
        let fill = Ring::open(&fd, &off.fr, XDP_UMEM_PGOFF_FILL_RING, 8)?;
        let comp = Ring::open(&fd, &off.cr, XDP_UMEM_PGOFF_COMPLETION_RING, 8)?;
        let data = if receive {
            Ring::open(&fd, &off.rx, XDP_PGOFF_RX_RING, 16)?
        } else {
            Ring::open(&fd, &off.tx, XDP_PGOFF_TX_RING, 16)?
        };
        let mut x = Xsk {
            fd,
            umem,
            fill,
            comp,
            data,
        };
        if receive {
            for c in 0..ENTRIES as u64 {
                x.fill.put_addr(c * CHUNK as u64);
            }
            x.fill.produce();
        }
        x.bind(ifindex)?;
        Ok(x)
    }

    fn bind(&self, ifindex: i32) -> Result<(), LoopbackError> {
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: libc::XDP_COPY,
            sxdp_ifindex: ifindex as u32,
            sxdp_queue_id: 0,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: binds to a complete sockaddr_xdp we own, of the size passed.
        let r = unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_xdp).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(xsk_err(
                "bind(AF_XDP, queue 0, XDP_COPY)",
                io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    /// Asks the kernel to send what the TX ring holds, without waiting.
    fn kick(&self) -> Result<(), LoopbackError> {
        // SAFETY: a zero-length sendto on an AF_XDP socket only reads its TX ring.
        let r = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            let busy = [libc::EAGAIN, libc::EBUSY, libc::ENOBUFS, libc::ENETDOWN];
            if !e.raw_os_error().is_some_and(|c| busy.contains(&c)) {
                return Err(LoopbackError::Setup(format!(
                    "sendto (AF_XDP TX kick): {e}"
                )));
            }
        }
        Ok(())
    }
}

/// The number of RX queues of interface `name` (from sysfs).
fn rx_queues(name: &str) -> usize {
    std::fs::read_dir(Path::new("/sys/class/net").join(name).join("queues"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                .count()
        })
        .unwrap_or(1)
}

/// Runs the AF_XDP loop-back and returns its report.
pub fn run(r: &Run) -> Result<LoopbackReport, LoopbackError> {
    let mut bar = r.gpu_bar.map(|(d, b)| SysfsBar::open(d, b)).transpose()?;
    let link = open_link(r.tx, r.rx, r.frame_size)?;
    if link.fs + KERNEL_HEADROOM > CHUNK {
        return Err(LoopbackError::Setup(format!(
            "--frame-size {} does not fit an AF_XDP copy-mode buffer ({} bytes after the kernel's {KERNEL_HEADROOM}-byte headroom)",
            link.fs,
            CHUNK - KERNEL_HEADROOM
        )));
    }
    let queues = rx_queues(&link.b.name);
    if queues != 1 {
        return Err(LoopbackError::Setup(format!(
            "{} has {queues} RX queues; the AF_XDP path listens on queue 0 only: `ethtool -L {} combined 1` first",
            link.b.name, link.b.name
        )));
    }
    let redirect = Redirect::load()?;
    let mut rx = Xsk::open(link.b.ifindex, true)?;
    redirect.insert(0, &rx.fd)?;
    let attached = redirect.attach(link.b.ifindex, &link.b.name)?;
    let mut tx = Xsk::open(link.a.ifindex, false)?;
    let cpu = CpuClock::start();
    let start = Instant::now();
    let t = exchange(r, &link, &mut tx, &mut rx, bar.as_mut(), start)?;
    let elapsed = start.elapsed();
    let cpu_s = cpu.seconds();
    let xdp = if attached.native() {
        "native (driver) XDP"
    } else {
        "generic (skb) XDP"
    };
    drop(attached);
    let buffers = Some(match r.gpu_bar {
        Some((d, b)) => {
            format!("AF_XDP copy mode, {xdp}, UMEM + CPU copies to/from gpu-bar {d}/{b}")
        }
        None => format!("AF_XDP copy mode, {xdp}, UMEM"),
    });
    Ok(t.report(RunInfo {
        mode: "kernel-af-xdp",
        tx: r.tx,
        rx: r.rx,
        max_frame: link.max_frame,
        batch: r.batch,
        elapsed,
        buffers,
    })
    .with_cpu(cpu_s))
}

/// Sends up to `n` pattern frames from free TX chunks; returns how many went into the ring.
fn send_burst(
    tx: &mut Xsk,
    free: &mut Vec<u64>,
    n: usize,
    link: &Link,
    seq: u64,
    mut bar: Option<&mut SysfsBar>,
) -> Result<usize, LoopbackError> {
    let room = tx.data.room().map_err(|e| ring_err("TX", e))? as usize;
    let fs = link.fs;
    let mut sent = 0;
    while sent < n.min(room) {
        let Some(addr) = free.pop() else { break };
        let buf = tx.umem.bytes(addr as usize, fs);
        match bar.as_deref_mut() {
            Some(g) => {
                let gs = g.slot(sent, SLOT);
                pattern::fill(&mut gs[..fs], link.b.mac, link.a.mac, seq + sent as u64);
                buf.copy_from_slice(&gs[..fs]);
            }
            None => pattern::fill(buf, link.b.mac, link.a.mac, seq + sent as u64),
        }
        tx.data.put_desc(addr, fs as u32);
        sent += 1;
    }
    if sent > 0 {
        tx.data.produce();
        tx.kick()?;
    }
    Ok(sent)
}

/// Returns completed TX chunks to the free list.
fn reclaim(tx: &mut Xsk, free: &mut Vec<u64>) -> Result<(), LoopbackError> {
    let n = tx.comp.ready().map_err(|e| ring_err("completion", e))?;
    for _ in 0..n {
        let a = tx.comp.get_addr();
        let c = xr::chunk_of(a, CHUNK, ENTRIES as usize).map_err(|e| ring_err("completion", e))?;
        free.push((c * CHUNK) as u64);
    }
    if n > 0 {
        tx.comp.consume();
    }
    Ok(())
}

/// Verifies every received frame and gives its chunk back through the fill ring.
fn receive(
    rx: &mut Xsk,
    t: &mut Tally,
    link: &Link,
    mut bar: Option<&mut SysfsBar>,
) -> Result<u32, LoopbackError> {
    let n = rx.data.ready().map_err(|e| ring_err("RX", e))?;
    for _ in 0..n {
        let (addr, len) = rx.data.get_desc();
        let range = xr::umem_range(addr, len, rx.umem.len()).map_err(|e| ring_err("RX", e))?;
        let got = rx.umem.bytes(range.start, range.len());
        let (bm, am, fs) = (link.b.mac, link.a.mac, link.fs);
        let check = match bar.as_deref_mut() {
            Some(g) => {
                let half = g.slots(SLOT) / 2;
                let gs = g.slot(half + (t.received as usize % half), SLOT);
                let k = got.len().min(gs.len());
                gs[..k].copy_from_slice(&got[..k]);
                pattern::verify(&gs[..k], bm, am, fs)
            }
            None => pattern::verify(got, bm, am, fs),
        };
        t.account(check);
        let c = xr::chunk_of(addr, CHUNK, ENTRIES as usize).map_err(|e| ring_err("RX", e))?;
        rx.fill.put_addr((c * CHUNK) as u64);
    }
    if n > 0 {
        rx.data.consume();
        rx.fill.produce();
    }
    Ok(n)
}

fn wait(rx: &Xsk) {
    let mut fds = [libc::pollfd {
        fd: rx.fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: one initialised pollfd we own for the call; a bounded timeout.
    unsafe { libc::poll(fds.as_mut_ptr(), 1, 1) };
}

/// The send/receive loop, as for the other kernel paths.
fn exchange(
    r: &Run,
    link: &Link,
    tx: &mut Xsk,
    rx: &mut Xsk,
    mut bar: Option<&mut SysfsBar>,
    start: Instant,
) -> Result<Tally, LoopbackError> {
    let mut free: Vec<u64> = (0..ENTRIES as u64)
        .rev()
        .map(|c| c * CHUNK as u64)
        .collect();
    let mut t = Tally::new(link.fs);
    let mut last_progress = Instant::now();
    loop {
        let sending = r.limit.more(t.sent, start);
        let in_flight = t.in_flight() as usize;
        if !sending && in_flight == 0 {
            break;
        }
        reclaim(tx, &mut free)?;
        let want = if sending {
            r.window
                .saturating_sub(in_flight)
                .min(r.batch)
                .min(r.limit.remaining(t.sent))
        } else {
            0
        };
        let sent = send_burst(tx, &mut free, want, link, t.sent, bar.as_deref_mut())?;
        if sent < want {
            t.tx_full += 1;
        }
        t.sent += sent as u64;
        let got = receive(rx, &mut t, link, bar.as_deref_mut())?;
        if sent > 0 || got > 0 {
            last_progress = Instant::now();
        } else if last_progress.elapsed() > super::STALL_DEADLINE {
            t.stalled = true;
            t.lost = t.sent - t.received;
            break;
        } else {
            if in_flight > 0 {
                tx.kick()?;
            }
            wait(rx);
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_af_xdp_support_is_named() {
        let e = xsk_err(
            "socket(AF_XDP)",
            io::Error::from_raw_os_error(libc::EAFNOSUPPORT),
        );
        assert!(e.to_string().contains("CONFIG_XDP_SOCKETS"), "{e}");
        let e = xsk_err("socket(AF_XDP)", io::Error::from_raw_os_error(libc::EPERM));
        assert!(e.to_string().contains("CAP_NET_RAW"), "{e}");
    }
}
