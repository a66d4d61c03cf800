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
use ubdirect_core::pci::PciAddress;
use ubdirect_virtio_net::pattern::{self, PATTERN_ETHERTYPE};

use super::report::{CpuClock, LoopbackReport, Tally};
use super::sysfs_bar::SysfsBar;
use super::{Limit, LoopbackError};

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
pub fn run(
    tx: PciAddress,
    rx: PciAddress,
    frame_size: Option<usize>,
    batch: usize,
    window: usize,
    limit: Limit,
    gpu_bar: Option<(PciAddress, u8)>,
) -> Result<LoopbackReport, LoopbackError> {
    // The copy path: pattern written in "GPU memory", copied to the socket buffer; received
    // frames copied from the socket buffer into "GPU memory" and verified there.
    let mut bar = gpu_bar.map(|(d, b)| SysfsBar::open(d, b)).transpose()?;
    let Link {
        a,
        b,
        max_frame,
        fs,
    } = open_link(tx, rx, frame_size)?;
    let cpu = CpuClock::start();
    let txs = packet_socket(a.ifindex, 0)?;
    let rxs = packet_socket(b.ifindex, PATTERN_ETHERTYPE)?;

    // Buffers made once: `batch` TX frames, `batch` RX slots of max_frame.
    let mut txbufs: Vec<Vec<u8>> = (0..batch).map(|_| vec![0u8; fs]).collect();
    let mut rxbufs: Vec<Vec<u8>> = (0..batch).map(|_| vec![0u8; max_frame.max(fs)]).collect();
    // SAFETY: zeroed mmsghdr/iovec arrays are valid; pointers are filled before each call.
    let mut txiov: Vec<libc::iovec> = vec![unsafe { std::mem::zeroed() }; batch];
    // SAFETY: as above.
    let mut txmsg: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; batch];
    // SAFETY: as above.
    let mut rxiov: Vec<libc::iovec> = vec![unsafe { std::mem::zeroed() }; batch];
    // SAFETY: as above.
    let mut rxmsg: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; batch];
    for i in 0..batch {
        rxiov[i] = libc::iovec {
            iov_base: rxbufs[i].as_mut_ptr().cast(),
            iov_len: rxbufs[i].len(),
        };
        rxmsg[i].msg_hdr.msg_iov = &mut rxiov[i];
        rxmsg[i].msg_hdr.msg_iovlen = 1;
    }

    let mut t = Tally::new(fs);
    let start = Instant::now();
    let mut last_progress = Instant::now();
    let mut next_seq = 0u64;
    loop {
        let sending = limit.more(next_seq, start);
        let in_flight = t.in_flight() as usize;
        if !sending && in_flight == 0 {
            break;
        }
        // Send one batch if the window allows.
        let room = window.saturating_sub(in_flight).min(batch);
        if sending && room > 0 {
            let n = room.min(limit.remaining(next_seq));
            for i in 0..n {
                match bar.as_mut() {
                    Some(g) => {
                        // TX slots in the BAR's lower half, RX slots in its upper half.
                        let gs = g.slot(i, SLOT);
                        pattern::fill(&mut gs[..fs], b.mac, a.mac, next_seq + i as u64);
                        txbufs[i].copy_from_slice(&gs[..fs]);
                    }
                    None => pattern::fill(&mut txbufs[i], b.mac, a.mac, next_seq + i as u64),
                }
                txiov[i] = libc::iovec {
                    iov_base: txbufs[i].as_mut_ptr().cast(),
                    iov_len: fs,
                };
                txmsg[i].msg_hdr.msg_iov = &mut txiov[i];
                txmsg[i].msg_hdr.msg_iovlen = 1;
            }
            // SAFETY: n initialised mmsghdrs pointing at live iovecs and buffers.
            let r = unsafe {
                libc::sendmmsg(
                    txs.as_raw_fd(),
                    txmsg.as_mut_ptr(),
                    n as u32,
                    libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                next_seq += r as u64;
                t.sent = next_seq;
                last_progress = Instant::now();
            } else if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::WouldBlock && e.raw_os_error() != Some(libc::ENOBUFS)
                {
                    return Err(LoopbackError::Setup(format!("sendmmsg on {}: {e}", a.name)));
                }
                t.tx_full += 1;
            }
        }
        // Receive what is there.
        // SAFETY: batch mmsghdrs pointing at live RX buffers.
        let r = unsafe {
            libc::recvmmsg(
                rxs.as_raw_fd(),
                rxmsg.as_mut_ptr(),
                batch as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r > 0 {
            for m in &rxmsg[..r as usize] {
                let len = m.msg_len as usize;
                let idx = (m.msg_hdr.msg_iov as usize - rxiov.as_ptr() as usize)
                    / std::mem::size_of::<libc::iovec>();
                let got = &rxbufs[idx][..len.min(rxbufs[idx].len())];
                let check = match bar.as_mut() {
                    Some(g) => {
                        let half = g.slots(SLOT) / 2;
                        let gs = g.slot(half + (t.received as usize % half), SLOT);
                        gs[..got.len()].copy_from_slice(got);
                        pattern::verify(&gs[..got.len()], b.mac, a.mac, fs)
                    }
                    None => pattern::verify(got, b.mac, a.mac, fs),
                };
                t.account(check);
            }
            last_progress = Instant::now();
        } else if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock {
                return Err(LoopbackError::Setup(format!("recvmmsg on {}: {e}", b.name)));
            }
        }
        if last_progress.elapsed() > super::STALL_DEADLINE {
            // Nothing moved for the stall deadline: what is missing is lost.
            t.stalled = true;
            t.lost = next_seq - t.received;
            break;
        }
    }
    let elapsed = start.elapsed();
    let buffers =
        gpu_bar.map(|(d, b)| format!("socket buffers + CPU copies to/from gpu-bar {d}/{b}"));
    Ok(t.report(
        "kernel", tx, rx, max_frame, batch, elapsed, buffers, None, None,
    )
    .with_cpu(cpu.seconds()))
}
