//! The kernel baseline of `ubdirect loopback --kernel`: the same pattern frames between the
//! same two NICs, driven by the kernel's virtio-net driver through AF_PACKET raw sockets
//! (sendmmsg on NIC A's netdev, recvmmsg on NIC B's). The frames go through the socket copy
//! path: user buffer -> kernel skb -> device and back.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::socket::{
    bind, setsockopt, socket, sockopt, AddressFamily, LinkAddr, SockFlag, SockType, SockaddrLike,
};
use ubdirect::dma::pci::PciAddress;
use ubdirect::virtio_net::pattern::{self, PATTERN_ETHERTYPE};

use super::report::{CpuClock, LoopbackReport, RunInfo, Tally};
use super::sysfs_bar::SysfsBar;
use super::tpacket::Run;
use super::LoopbackError;

/// Bytes per BAR slot of the copy path (a frame fits).
pub const SLOT: usize = 16 << 10;

/// A NIC as the kernel sees it.
pub struct Netdev {
    /// Interface name (eth0, ...).
    pub name: String,
    /// Interface index.
    pub ifindex: i32,
    /// MAC address.
    pub mac: [u8; 6],
    /// MTU.
    pub mtu: usize,
}

/// Finds the kernel netdev of the virtio-net NIC at `addr` (it must be bound to virtio-pci).
pub fn netdev_of(addr: PciAddress) -> Result<Netdev, LoopbackError> {
    let dev = Path::new("/sys/bus/pci/devices").join(addr.to_string());
    let not_found = || {
        LoopbackError::Setup(format!(
        "NIC {addr} has no kernel network interface: --kernel needs it bound to its kernel driver (virtio-pci), e.g. `bind-kernel {addr}` in the guest or `scripts/setup.sh reset`"
    ))
    };
    let entries = std::fs::read_dir(&dev).map_err(|_| not_found())?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("virtio") {
            continue;
        }
        let Ok(nets) = std::fs::read_dir(e.path().join("net")) else {
            continue;
        };
        if let Some(n) = nets.flatten().next() {
            let ifname = n.file_name().to_string_lossy().into_owned();
            let sys = Path::new("/sys/class/net").join(&ifname);
            let read = |f: &str| std::fs::read_to_string(sys.join(f)).map(|s| s.trim().to_string());
            let ifindex: i32 = read("ifindex")
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(not_found)?;
            let mtu: usize = read("mtu")
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(not_found)?;
            let mac_s = read("address").map_err(|_| not_found())?;
            let mut mac = [0u8; 6];
            for (i, part) in mac_s.split(':').take(6).enumerate() {
                mac[i] = u8::from_str_radix(part, 16).map_err(|_| not_found())?;
            }
            return Ok(Netdev {
                name: ifname,
                ifindex,
                mac,
                mtu,
            });
        }
    }
    Err(not_found())
}

pub fn os_err(what: &str, e: nix::Error) -> LoopbackError {
    LoopbackError::Setup(format!(
        "{what}: {} (needs root / CAP_NET_RAW)",
        io::Error::from(e)
    ))
}

// SIOCGIFFLAGS / SIOCSIFFLAGS through nix's ioctl macros (the request numbers are not
// _IOC-encoded, hence the `_bad` forms). nix has no safe wrapper for interface flags.
nix::ioctl_readwrite_bad!(get_if_flags, libc::SIOCGIFFLAGS, libc::ifreq);
nix::ioctl_write_ptr_bad!(set_if_flags, libc::SIOCSIFFLAGS, libc::ifreq);

/// Sets IFF_UP on `name`.
fn if_up(sock: &OwnedFd, name: &str) -> Result<(), LoopbackError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(LoopbackError::Setup(format!("bad interface name {name}")));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value (an empty name, no flags).
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads a NUL-terminated name from, and writes the flags into, the
    // ifreq we own for the duration of the call.
    unsafe { get_if_flags(sock.as_raw_fd(), &mut ifr) }
        .map_err(|e| os_err(&format!("SIOCGIFFLAGS {name}"), e))?;
    // SAFETY: ifru_flags is the union field SIOCGIFFLAGS just filled.
    unsafe { ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS only reads the ifreq we own.
    unsafe { set_if_flags(sock.as_raw_fd(), &ifr) }
        .map_err(|e| os_err(&format!("SIOCSIFFLAGS {name} up"), e))?;
    Ok(())
}

/// Waits (at most 5 s) until `/sys/class/net/<name>/operstate` says "up".
fn wait_oper_up(name: &str) -> Result<(), LoopbackError> {
    let path = Path::new("/sys/class/net").join(name).join("operstate");
    let start = Instant::now();
    loop {
        let st = std::fs::read_to_string(&path).unwrap_or_default();
        if st.trim() == "up" || st.trim() == "unknown" {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(5) {
            return Err(LoopbackError::Setup(format!(
                "interface {name} did not come up within 5 s (operstate '{}'): check the link / cable",
                st.trim()
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The link-layer address an AF_PACKET socket binds to: interface `ifindex`, EtherType
/// `proto` (0: receive nothing, for a send-only socket).
pub fn link_addr(ifindex: i32, proto: u16) -> LinkAddr {
    // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto.to_be();
    sll.sll_ifindex = ifindex;
    let len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: `sll` is a complete, initialised sockaddr_ll of `len` bytes with family
    // AF_PACKET, which is what LinkAddr wraps. nix has no safe LinkAddr constructor.
    unsafe { LinkAddr::from_raw((&sll as *const libc::sockaddr_ll).cast(), Some(len)) }
        .expect("a sockaddr_ll of AF_PACKET with its own size is a LinkAddr")
}

/// An AF_PACKET raw socket bound to one interface and EtherType `proto`.
fn packet_socket(ifindex: i32, proto: u16) -> Result<OwnedFd, LoopbackError> {
    // Protocol 0 at socket(): nothing is received until bind names the EtherType (nix's
    // SockProtocol has no variant for an arbitrary EtherType).
    let fd = socket(
        AddressFamily::Packet,
        SockType::Raw,
        SockFlag::empty(),
        None,
    )
    .map_err(|e| os_err("socket(AF_PACKET, SOCK_RAW)", e))?;
    bind(fd.as_raw_fd(), &link_addr(ifindex, proto)).map_err(|e| os_err("bind(AF_PACKET)", e))?;
    // Socket buffers large enough for the whole window (the *FORCE variants pass rmem_max /
    // wmem_max as root), so the baseline is not limited by a small default buffer.
    let big = 8usize << 20;
    if setsockopt(&fd, sockopt::RcvBufForce, &big).is_err() {
        let _ = setsockopt(&fd, sockopt::RcvBuf, &big);
    }
    if setsockopt(&fd, sockopt::SndBufForce, &big).is_err() {
        let _ = setsockopt(&fd, sockopt::SndBuf, &big);
    }
    Ok(fd)
}

/// The two kernel interfaces of a kernel-path run, up, with the frame size checked.
pub struct Link {
    /// The sending interface (NIC A).
    pub a: Netdev,
    /// The receiving interface (NIC B).
    pub b: Netdev,
    /// The largest frame both carry (MTU + 14).
    pub max_frame: usize,
    /// The frame size of the run.
    pub fs: usize,
}

/// Finds both NICs' netdevs, checks the frame size, brings both interfaces up and waits
/// (bounded) for their links.
pub fn open_link(
    tx: PciAddress,
    rx: PciAddress,
    frame_size: Option<usize>,
) -> Result<Link, LoopbackError> {
    let a = netdev_of(tx)?;
    let b = netdev_of(rx)?;
    let max_frame = a.mtu.min(b.mtu) + 14;
    let fs = frame_size.unwrap_or(max_frame);
    super::check_frame_size(fs, max_frame, "the kernel interfaces' MTU + 14")?;
    // Interfaces up before the sockets bind (a packet socket bound to a down interface keeps
    // ENETDOWN pending), then wait (bounded) for the links to report up.
    {
        let ctl = socket(
            AddressFamily::Inet,
            SockType::Datagram,
            SockFlag::empty(),
            None,
        )
        .map_err(|e| os_err("socket(AF_INET) for interface flags", e))?;
        if_up(&ctl, &a.name)?;
        if_up(&ctl, &b.name)?;
    }
    wait_oper_up(&a.name)?;
    wait_oper_up(&b.name)?;
    Ok(Link {
        a,
        b,
        max_frame,
        fs,
    })
}

/// Runs the kernel-path loop-back and returns its report.
pub fn run(r: &Run) -> Result<LoopbackReport, LoopbackError> {
    // The copy path: pattern written in "GPU memory", copied to the socket buffer; received
    // frames copied from the socket buffer into "GPU memory" and verified there.
    let mut bar = r.gpu_bar.map(|(d, b)| SysfsBar::open(d, b)).transpose()?;
    let link = open_link(r.tx, r.rx, r.frame_size)?;
    let cpu = CpuClock::start();
    let txs = packet_socket(link.a.ifindex, 0)?;
    let rxs = packet_socket(link.b.ifindex, PATTERN_ETHERTYPE)?;
    let mut x = Exchange {
        r,
        link: &link,
        bar: bar.as_mut(),
        txs,
        rxs,
        io: Messages::new(r.batch, link.fs, link.max_frame),
        t: Tally::new(link.fs),
        next_seq: 0,
    };
    let start = Instant::now();
    x.run(start)?;
    let elapsed = start.elapsed();
    let buffers = r
        .gpu_bar
        .map(|(d, b)| format!("socket buffers + CPU copies to/from gpu-bar {d}/{b}"));
    Ok(x.t
        .report(RunInfo {
            mode: "kernel",
            tx: r.tx,
            rx: r.rx,
            max_frame: link.max_frame,
            batch: r.batch,
            elapsed,
            buffers,
        })
        .with_cpu(cpu.seconds()))
}

/// The buffers and message headers of `sendmmsg` and `recvmmsg`, made once: `batch` TX
/// frames, `batch` RX slots of the largest frame.
struct Messages {
    txbufs: Vec<Vec<u8>>,
    rxbufs: Vec<Vec<u8>>,
    txiov: Vec<libc::iovec>,
    txmsg: Vec<libc::mmsghdr>,
    rxiov: Vec<libc::iovec>,
    rxmsg: Vec<libc::mmsghdr>,
}

impl Messages {
    fn new(batch: usize, fs: usize, max_frame: usize) -> Messages {
        let mut m = Messages {
            txbufs: (0..batch).map(|_| vec![0u8; fs]).collect(),
            rxbufs: (0..batch).map(|_| vec![0u8; max_frame.max(fs)]).collect(),
            // SAFETY: zeroed mmsghdr/iovec arrays are valid; pointers are filled before each
            // call.
            txiov: vec![unsafe { std::mem::zeroed() }; batch],
            // SAFETY: as above.
            txmsg: vec![unsafe { std::mem::zeroed() }; batch],
            // SAFETY: as above.
            rxiov: vec![unsafe { std::mem::zeroed() }; batch],
            // SAFETY: as above.
            rxmsg: vec![unsafe { std::mem::zeroed() }; batch],
        };
        // The headers point into the vectors' heap memory, which stays where it is when the
        // struct moves.
        for i in 0..batch {
            m.rxiov[i] = libc::iovec {
                iov_base: m.rxbufs[i].as_mut_ptr().cast(),
                iov_len: m.rxbufs[i].len(),
            };
            m.rxmsg[i].msg_hdr.msg_iov = &mut m.rxiov[i];
            m.rxmsg[i].msg_hdr.msg_iovlen = 1;
        }
        m
    }
}

/// The exchange in progress: frames sent on A's socket, received and verified on B's.
struct Exchange<'a> {
    r: &'a Run,
    link: &'a Link,
    /// The "GPU memory" of the copy path: TX slots in the BAR's lower half, RX slots in its
    /// upper half.
    bar: Option<&'a mut SysfsBar>,
    txs: OwnedFd,
    rxs: OwnedFd,
    io: Messages,
    t: Tally,
    /// The sequence number of the next frame to send.
    next_seq: u64,
}

impl Exchange<'_> {
    /// Send and receive until the limit is reached and nothing is in flight, or until nothing
    /// moved for the stall deadline.
    fn run(&mut self, start: Instant) -> Result<(), LoopbackError> {
        let mut last_progress = Instant::now();
        loop {
            let sending = self.r.limit.more(self.next_seq, start);
            let in_flight = self.t.in_flight() as usize;
            if !sending && in_flight == 0 {
                return Ok(());
            }
            // Send one batch if the window allows.
            let room = self.r.window.saturating_sub(in_flight).min(self.r.batch);
            if sending && room > 0 && self.send(room)? {
                last_progress = Instant::now();
            }
            if self.receive()? {
                last_progress = Instant::now();
            }
            if last_progress.elapsed() > super::STALL_DEADLINE {
                // Nothing moved for the stall deadline: what is missing is lost.
                self.t.stalled = true;
                self.t.lost = self.next_seq - self.t.received;
                return Ok(());
            }
        }
    }

    /// Send up to `room` frames with one `sendmmsg`; whether any went.
    fn send(&mut self, room: usize) -> Result<bool, LoopbackError> {
        let (fs, a, b) = (self.link.fs, &self.link.a, &self.link.b);
        let io = &mut self.io;
        let n = room.min(self.r.limit.remaining(self.next_seq));
        for i in 0..n {
            let seq = self.next_seq + i as u64;
            match self.bar.as_mut() {
                Some(g) => {
                    let gs = g.slot(i, SLOT);
                    pattern::fill(&mut gs[..fs], b.mac, a.mac, seq);
                    io.txbufs[i].copy_from_slice(&gs[..fs]);
                }
                None => pattern::fill(&mut io.txbufs[i], b.mac, a.mac, seq),
            }
            io.txiov[i] = libc::iovec {
                iov_base: io.txbufs[i].as_mut_ptr().cast(),
                iov_len: fs,
            };
            io.txmsg[i].msg_hdr.msg_iov = &mut io.txiov[i];
            io.txmsg[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: n initialised mmsghdrs pointing at live iovecs and buffers.
        let r = unsafe {
            libc::sendmmsg(
                self.txs.as_raw_fd(),
                io.txmsg.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT,
            )
        };
        if r > 0 {
            self.next_seq += r as u64;
            self.t.sent = self.next_seq;
            return Ok(true);
        }
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock && e.raw_os_error() != Some(libc::ENOBUFS) {
                return Err(LoopbackError::Setup(format!("sendmmsg on {}: {e}", a.name)));
            }
            self.t.tx_full += 1;
        }
        Ok(false)
    }

    /// Receive what is there with one `recvmmsg` and verify it; whether anything came.
    fn receive(&mut self) -> Result<bool, LoopbackError> {
        let (fs, a, b) = (self.link.fs, &self.link.a, &self.link.b);
        let io = &mut self.io;
        // SAFETY: batch mmsghdrs pointing at live RX buffers.
        let r = unsafe {
            libc::recvmmsg(
                self.rxs.as_raw_fd(),
                io.rxmsg.as_mut_ptr(),
                self.r.batch as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock {
                return Err(LoopbackError::Setup(format!("recvmmsg on {}: {e}", b.name)));
            }
        }
        if r <= 0 {
            return Ok(false);
        }
        for m in &io.rxmsg[..r as usize] {
            let len = m.msg_len as usize;
            let idx = (m.msg_hdr.msg_iov as usize - io.rxiov.as_ptr() as usize)
                / std::mem::size_of::<libc::iovec>();
            let got = &io.rxbufs[idx][..len.min(io.rxbufs[idx].len())];
            let check = match self.bar.as_mut() {
                Some(g) => {
                    let half = g.slots(SLOT) / 2;
                    let gs = g.slot(half + (self.t.received as usize % half), SLOT);
                    gs[..got.len()].copy_from_slice(got);
                    pattern::verify(&gs[..got.len()], b.mac, a.mac, fs)
                }
                None => pattern::verify(got, b.mac, a.mac, fs),
            };
            self.t.account(check);
        }
        Ok(true)
    }
}
