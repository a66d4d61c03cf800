//! The PACKET_MMAP baseline of `ubdirect loopback --kernel tpacket-v3`: the same pattern frames
//! between the same two NICs through the kernel's virtio-net driver, exchanged through rings
//! shared with the kernel instead of socket calls per frame. NIC B's packet socket has a
//! TPACKET_V3 RX ring (blocks of packets, retired when full or after 1 ms); NIC A's has a TX
//! ring of frames (TPACKET_V3, or TPACKET_V2 where the kernel has no V3 TX ring), filled in
//! place and handed over with one `send` per burst. Written directly over libc (setsockopt,
//! mmap, poll); what the kernel writes into the rings is parsed by `tpacket_ring`, which
//! trusts none of it.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use nix::sys::socket::{bind, socket, AddressFamily, SockFlag, SockType};
use ubdirect::dma::pci::PciAddress;
use ubdirect::virtio_net::pattern::{self, PATTERN_ETHERTYPE};

use super::kernel::{link_addr, open_link, os_err, Link, SLOT};
use super::report::{CpuClock, LoopbackReport, RunInfo, Tally};
use super::sysfs_bar::SysfsBar;
use super::tpacket_ring::{self as ring, RxPacket, TxLayout, TxSlot};
use super::{Limit, LoopbackError};

/// Retire an RX block this long (ms) after its first packet even when it is not full.
const RETIRE_MS: u32 = 1;
/// Room per received frame in an RX block beyond the frame: its header and alignment.
const RX_OVERHEAD: usize = 128;

/// What one `--kernel tpacket-v3` run does.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// Sending NIC.
    pub tx: PciAddress,
    /// Receiving NIC.
    pub rx: PciAddress,
    /// Frame size (default: the interfaces' maximum).
    pub frame_size: Option<usize>,
    /// Frames per burst.
    pub batch: usize,
    /// Most frames in flight.
    pub window: usize,
    /// When to stop sending.
    pub limit: Limit,
    /// Copy frames to and from this BAR (mapped through sysfs) as the "GPU memory".
    pub gpu_bar: Option<(PciAddress, u8)>,
}

/// A mapping shared with the kernel (a socket's ring, or anonymous memory it is given),
/// unmapped on drop.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn new(fd: &OwnedFd, len: usize) -> Result<Mapping, LoopbackError> {
        Self::map(Some(fd), len, 0)
    }

    /// Maps `len` bytes of `fd` at `offset` (a ring), or fresh zeroed memory with no `fd`.
    pub fn map(fd: Option<&OwnedFd>, len: usize, offset: i64) -> Result<Mapping, LoopbackError> {
        let (flags, raw) = match fd {
            Some(f) => (libc::MAP_SHARED | libc::MAP_POPULATE, f.as_raw_fd()),
            None => (
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
            ),
        };
        // SAFETY: a fresh mapping (the kernel chooses the address) of a socket's ring or of
        // anonymous memory; nothing else is mapped or aliased by it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                raw,
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(LoopbackError::Setup(format!(
                "mmap of a {len}-byte ring: {}",
                io::Error::last_os_error()
            )));
        }
        let ptr = NonNull::new(p.cast())
            .ok_or_else(|| LoopbackError::Setup("mmap of a ring returned address 0".into()))?;
        Ok(Mapping { ptr, len })
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The address of the first byte.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The status word at `off` (4-byte aligned, inside the mapping), shared with the kernel.
    pub fn status(&self, off: usize) -> &AtomicU32 {
        assert!(
            off % 4 == 0 && off + 4 <= self.len,
            "status word outside the ring"
        );
        // SAFETY: in bounds and aligned (checked above; the mapping is page-aligned); the
        // kernel and this process hand the surrounding block or frame back and forth through
        // this word, so it is only accessed atomically.
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(off).cast()) }
    }

    /// `len` bytes at `off` (inside the mapping), while this process owns them.
    pub fn bytes(&mut self, off: usize, len: usize) -> &mut [u8] {
        assert!(
            off <= self.len && len <= self.len - off,
            "range outside the ring"
        );
        // SAFETY: in bounds (checked above); the caller owns the block or frame (its status
        // word says so), so the kernel does not write these bytes while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no slice into it outlives self.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(4096).max(4096)
}

fn set_opt<T>(fd: &OwnedFd, opt: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` is a live, initialised value of the size passed; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
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

fn packet_socket() -> Result<OwnedFd, LoopbackError> {
    socket(
        AddressFamily::Packet,
        SockType::Raw,
        SockFlag::empty(),
        None,
    )
    .map_err(|e| os_err("socket(AF_PACKET, SOCK_RAW)", e))
}

fn no_ring(what: &str, e: io::Error) -> LoopbackError {
    LoopbackError::Setup(format!(
        "{what}: {e}: this kernel cannot give a packet socket that ring (PACKET_MMAP with TPACKET_V3 needs Linux 3.2, its TX ring 4.11)"
    ))
}

/// A TPACKET_V3 RX ring: blocks of received packets.
struct RxRing {
    fd: OwnedFd,
    map: Mapping,
    block_size: usize,
    blocks: usize,
    next: usize,
}

impl RxRing {
    /// A ring on interface `ifindex` for the pattern EtherType, sized so a block fills with
    /// half a window of `frame`-byte frames (or a burst, whichever is less).
    fn open(
        ifindex: i32,
        frame: usize,
        batch: usize,
        window: usize,
    ) -> Result<Self, LoopbackError> {
        let fd = packet_socket()?;
        set_opt(&fd, libc::PACKET_VERSION, &ring::TPACKET_V3)
            .map_err(|e| no_ring("PACKET_VERSION TPACKET_V3 on the RX socket", e))?;
        let per = (frame + RX_OVERHEAD).next_multiple_of(16);
        let block_size = (per * batch.min(window / 2).max(1))
            .next_power_of_two()
            .clamp(page_size(), 4 << 20)
            .max(per.next_power_of_two());
        let blocks = (2 * window * per).div_ceil(block_size).clamp(4, 1024);
        let frame_size = 2048.min(block_size);
        let req = libc::tpacket_req3 {
            tp_block_size: block_size as u32,
            tp_block_nr: blocks as u32,
            tp_frame_size: frame_size as u32,
            tp_frame_nr: (blocks * (block_size / frame_size)) as u32,
            tp_retire_blk_tov: RETIRE_MS,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        set_opt(&fd, libc::PACKET_RX_RING, &req)
            .map_err(|e| no_ring("PACKET_RX_RING (TPACKET_V3 blocks)", e))?;
        let map = Mapping::new(&fd, block_size * blocks)?;
        bind(fd.as_raw_fd(), &link_addr(ifindex, PATTERN_ETHERTYPE))
            .map_err(|e| os_err("bind(AF_PACKET) of the RX ring socket", e))?;
        Ok(RxRing {
            fd,
            map,
            block_size,
            blocks,
            next: 0,
        })
    }

    /// Hands every packet of every retired block to `each`, then the blocks back to the
    /// kernel; returns the packets seen. A malformed block is an error.
    fn reap(&mut self, mut each: impl FnMut(RxPacket<'_>)) -> Result<usize, LoopbackError> {
        let mut n = 0;
        for _ in 0..self.blocks {
            let off = self.next * self.block_size;
            if self
                .map
                .status(off + ring::BLOCK_STATUS)
                .load(Ordering::Acquire)
                & ring::TP_STATUS_USER
                == 0
            {
                break;
            }
            let block = self.map.bytes(off, self.block_size);
            for p in ring::rx_block(block).map_err(|e| bad_block(self.next, e))? {
                each(p.map_err(|e| bad_block(self.next, e))?);
                n += 1;
            }
            self.map
                .status(off + ring::BLOCK_STATUS)
                .store(ring::TP_STATUS_KERNEL, Ordering::Release);
            self.next = (self.next + 1) % self.blocks;
        }
        Ok(n)
    }
}

fn bad_block(index: usize, e: ring::RingError) -> LoopbackError {
    LoopbackError::Failed(format!(
        "the kernel's RX ring block {index} is malformed: {e}"
    ))
}

/// A TX ring of frames (TPACKET_V3 where the kernel allows, else TPACKET_V2).
struct TxRing {
    fd: OwnedFd,
    map: Mapping,
    layout: TxLayout,
    frame_size: usize,
    per_block: usize,
    block_size: usize,
    frames: usize,
    head: usize,
}

impl TxRing {
    /// A ring of at least `slots` frames of up to `max_frame` bytes on interface `ifindex`.
    fn open(ifindex: i32, max_frame: usize, slots: usize) -> Result<Self, LoopbackError> {
        let fd = packet_socket()?;
        let layout = match set_opt(&fd, libc::PACKET_VERSION, &ring::TPACKET_V3) {
            Ok(()) => ring::TX_V3,
            Err(_) => {
                set_opt(&fd, libc::PACKET_VERSION, &ring::TPACKET_V2)
                    .map_err(|e| no_ring("PACKET_VERSION on the TX socket", e))?;
                ring::TX_V2
            }
        };
        let frame_size = (layout.data + max_frame).next_power_of_two();
        let block_size = frame_size.max(page_size()).max(64 << 10);
        let per_block = block_size / frame_size;
        let frames = slots.clamp(per_block, 1 << 16).next_multiple_of(per_block);
        let blocks = frames / per_block;
        let req = libc::tpacket_req3 {
            tp_block_size: block_size as u32,
            tp_block_nr: blocks as u32,
            tp_frame_size: frame_size as u32,
            tp_frame_nr: frames as u32,
            tp_retire_blk_tov: 0,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        // TPACKET_V2 takes the shorter tpacket_req (the first four fields of tpacket_req3).
        let set = if layout.version == ring::TPACKET_V3 {
            set_opt(&fd, libc::PACKET_TX_RING, &req)
        } else {
            let r2 = libc::tpacket_req {
                tp_block_size: req.tp_block_size,
                tp_block_nr: req.tp_block_nr,
                tp_frame_size: req.tp_frame_size,
                tp_frame_nr: req.tp_frame_nr,
            };
            set_opt(&fd, libc::PACKET_TX_RING, &r2)
        };
        set.map_err(|e| no_ring("PACKET_TX_RING", e))?;
        let map = Mapping::new(&fd, block_size * blocks)?;
        bind(fd.as_raw_fd(), &link_addr(ifindex, 0))
            .map_err(|e| os_err("bind(AF_PACKET) of the TX ring socket", e))?;
        Ok(TxRing {
            fd,
            map,
            layout,
            frame_size,
            per_block,
            block_size,
            frames,
            head: 0,
        })
    }

    /// Fills the next frame with `len` bytes written by `fill` and marks it for sending;
    /// false when that frame is still the kernel's (the ring is full).
    fn push(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) -> Result<bool, LoopbackError> {
        let i = self.head;
        let off = (i / self.per_block) * self.block_size + (i % self.per_block) * self.frame_size;
        let status = self
            .map
            .status(off + self.layout.status)
            .load(Ordering::Acquire);
        match ring::tx_slot(status) {
            TxSlot::Busy => return Ok(false),
            TxSlot::Rejected => {
                return Err(LoopbackError::Failed(format!(
                    "the kernel refused a {len}-byte frame in its TX ring (TP_STATUS_WRONG_FORMAT)"
                )))
            }
            TxSlot::Free => {}
        }
        let l = self.layout;
        let frame = self.map.bytes(off, self.frame_size);
        fill(&mut frame[l.data..l.data + len]);
        frame[l.len..l.len + 4].copy_from_slice(&(len as u32).to_ne_bytes());
        if l.version == ring::TPACKET_V3 {
            // tp_next_offset: the kernel refuses a V3 TX frame that names a next one.
            frame[..4].fill(0);
        }
        self.map
            .status(off + l.status)
            .store(ring::TX_SEND_REQUEST, Ordering::Release);
        self.head = (i + 1) % self.frames;
        Ok(true)
    }

    /// Asks the kernel to send the frames marked so far, without waiting; false when it had
    /// no room now (the frames stay marked and go with the next kick).
    fn kick(&self, name: &str) -> Result<bool, LoopbackError> {
        // SAFETY: a zero-length send on a socket with a TX ring only reads the ring.
        let r = unsafe { libc::send(self.fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT) };
        if r >= 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ENOBUFS) {
            return Ok(false);
        }
        Err(LoopbackError::Setup(format!(
            "send (TX ring) on {name}: {e}"
        )))
    }
}

/// Waits up to 1 ms for the RX ring to retire a block or the TX socket to free room.
fn wait(rx: &RxRing, tx: &TxRing) {
    let mut fds = [
        libc::pollfd {
            fd: rx.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: tx.fd.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        },
    ];
    // SAFETY: two initialised pollfds we own for the call; a bounded timeout.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1) };
}

/// Runs the PACKET_MMAP loop-back and returns its report.
pub fn run(r: &Run) -> Result<LoopbackReport, LoopbackError> {
    let mut bar = r.gpu_bar.map(|(d, b)| SysfsBar::open(d, b)).transpose()?;
    let link = open_link(r.tx, r.rx, r.frame_size)?;
    let mut txr = TxRing::open(link.a.ifindex, link.max_frame, r.window.max(r.batch))?;
    let mut rxr = RxRing::open(link.b.ifindex, link.max_frame, r.batch, r.window)?;
    let cpu = CpuClock::start();
    let start = Instant::now();
    let t = exchange(r, &link, &mut txr, &mut rxr, bar.as_mut(), start)?;
    let elapsed = start.elapsed();
    let cpu_s = cpu.seconds();
    let version = if txr.layout.version == ring::TPACKET_V3 {
        3
    } else {
        2
    };
    let buffers = Some(match r.gpu_bar {
        Some((d, b)) => format!(
            "TPACKET_V3 RX ring, TPACKET_V{version} TX ring + CPU copies to/from gpu-bar {d}/{b}"
        ),
        None => format!("TPACKET_V3 RX ring, TPACKET_V{version} TX ring"),
    });
    Ok(t.report(RunInfo {
        mode: "kernel-tpacket-v3",
        tx: r.tx,
        rx: r.rx,
        max_frame: link.max_frame,
        batch: r.batch,
        elapsed,
        buffers,
    })
    .with_cpu(cpu_s))
}

/// The send/receive loop: bursts into the TX ring, blocks out of the RX ring, every frame
/// verified, until the limit is reached and everything sent is accounted for or stalled.
fn exchange(
    r: &Run,
    link: &Link,
    txr: &mut TxRing,
    rxr: &mut RxRing,
    mut bar: Option<&mut SysfsBar>,
    start: Instant,
) -> Result<Tally, LoopbackError> {
    let (fs, amac, bmac) = (link.fs, link.a.mac, link.b.mac);
    let mut t = Tally::new(fs);
    let mut last_progress = Instant::now();
    let mut unkicked = false;
    loop {
        let sending = r.limit.more(t.sent, start);
        let in_flight = t.in_flight() as usize;
        if !sending && in_flight == 0 {
            break;
        }
        let mut moved = false;
        let room = if sending {
            r.window
                .saturating_sub(in_flight)
                .min(r.batch)
                .min(r.limit.remaining(t.sent))
        } else {
            0
        };
        for i in 0..room {
            let seq = t.sent;
            let pushed = txr.push(fs, |buf| match bar.as_deref_mut() {
                Some(g) => {
                    let gs = g.slot(i, SLOT);
                    pattern::fill(&mut gs[..fs], bmac, amac, seq);
                    buf.copy_from_slice(&gs[..fs]);
                }
                None => pattern::fill(buf, bmac, amac, seq),
            })?;
            if !pushed {
                t.tx_full += 1;
                break;
            }
            t.sent += 1;
            unkicked = true;
            moved = true;
        }
        if unkicked {
            unkicked = !txr.kick(&link.a.name)?;
            if unkicked {
                t.tx_full += 1;
            }
        }
        let n = rxr.reap(|p| {
            let check = match bar.as_deref_mut() {
                Some(g) => {
                    let half = g.slots(SLOT) / 2;
                    let gs = g.slot(half + (t.received as usize % half), SLOT);
                    let n = p.data.len().min(gs.len());
                    gs[..n].copy_from_slice(&p.data[..n]);
                    pattern::verify(&gs[..n], bmac, amac, fs)
                }
                None => pattern::verify(p.data, bmac, amac, fs),
            };
            t.account(check);
        })?;
        moved |= n > 0;
        if moved {
            last_progress = Instant::now();
        } else if last_progress.elapsed() > super::STALL_DEADLINE {
            t.stalled = true;
            t.lost = t.sent - t.received;
            break;
        } else {
            wait(rxr, txr);
        }
    }
    Ok(t)
}
