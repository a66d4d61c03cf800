//! The XDP side of the AF_XDP path, written over the raw `bpf()` syscall and rtnetlink (no
//! libbpf, no clang): an XSKMAP, a six-instruction XDP program
//! `return bpf_redirect_map(&xsks_map, ctx->rx_queue_index, XDP_PASS)`, and its attachment
//! to an interface (driver mode where the driver allows, generic mode otherwise), removed on
//! drop.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::LoopbackError;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const FUNC_REDIRECT_MAP: i32 = 51;
const XDP_PASS: i32 = 2;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_FLAGS: u16 = 3;
const NLA_F_NESTED: u16 = 1 << 15;
/// Generic XDP (on the skb, any driver).
pub const XDP_FLAGS_SKB_MODE: u32 = 2;
/// Native XDP in the driver.
pub const XDP_FLAGS_DRV_MODE: u32 = 4;
/// XSKMAP entries (RX queues a program can redirect from).
const MAP_ENTRIES: u32 = 64;

/// A `union bpf_attr` as bytes (the fields each command reads are set by offset; the rest
/// stays zero, which the kernel requires).
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 128])
    }
    fn u32(mut self, off: usize, v: u32) -> Attr {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(mut self, off: usize, v: u64) -> Attr {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
}

fn bpf(cmd: libc::c_long, attr: &Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, 128-byte, zero-padded bpf_attr; pointers inside it (program,
    // license, log, key, value) point at live buffers of the caller for the call.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.0.as_ptr(), attr.0.len() as u32) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn fd_of(r: libc::c_long) -> OwnedFd {
    // SAFETY: `r` is a file descriptor the bpf() call just returned to this process.
    unsafe { OwnedFd::from_raw_fd(r as i32) }
}

fn bpf_err(what: &str, e: io::Error) -> LoopbackError {
    let why = match e.raw_os_error() {
        Some(libc::EPERM) => " (needs root: CAP_BPF and CAP_NET_ADMIN, or CAP_SYS_ADMIN)",
        Some(libc::ENOSYS) => {
            " (this kernel was built without the bpf() system call, CONFIG_BPF_SYSCALL)"
        }
        _ => "",
    };
    LoopbackError::Setup(format!("{what}: {e}{why}"))
}

/// One eBPF instruction: opcode, registers, offset, immediate.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
    let mut i = [0u8; 8];
    i[0] = code;
    i[1] = dst | (src << 4);
    i[2..4].copy_from_slice(&off.to_le_bytes());
    i[4..8].copy_from_slice(&imm.to_le_bytes());
    i
}

/// `return bpf_redirect_map(&map, ctx->rx_queue_index, XDP_PASS)`.
pub fn redirect_program(map_fd: i32) -> [[u8; 8]; 6] {
    [
        insn(0x61, 2, 1, 16, 0), // r2 = *(u32 *)(r1 + 16): rx_queue_index
        insn(0x18, 1, BPF_PSEUDO_MAP_FD, 0, map_fd), // r1 = map (ld_imm64, first half)
        insn(0, 0, 0, 0, 0),     //          (second half)
        insn(0xb7, 3, 0, 0, XDP_PASS), // r3 = XDP_PASS
        insn(0x85, 0, 0, 0, FUNC_REDIRECT_MAP), // call bpf_redirect_map
        insn(0x95, 0, 0, 0, 0),  // exit
    ]
}

/// An XSKMAP and the XDP program redirecting into it.
pub struct Redirect {
    map: OwnedFd,
    prog: OwnedFd,
}

impl Redirect {
    /// Creates the map and loads the program.
    pub fn load() -> Result<Redirect, LoopbackError> {
        let attr = Attr::new()
            .u32(0, BPF_MAP_TYPE_XSKMAP)
            .u32(4, 4)
            .u32(8, 4)
            .u32(12, MAP_ENTRIES);
        let map = fd_of(
            bpf(BPF_MAP_CREATE, &attr).map_err(|e| bpf_err("bpf(BPF_MAP_CREATE, XSKMAP)", e))?,
        );
        let prog = redirect_program(map.as_raw_fd());
        let license = c"GPL";
        let mut log = vec![0u8; 4096];
        let attr = Attr::new()
            .u32(0, BPF_PROG_TYPE_XDP)
            .u32(4, prog.len() as u32)
            .u64(8, prog.as_ptr() as u64)
            .u64(16, license.as_ptr() as u64)
            .u32(24, 1)
            .u32(28, log.len() as u32)
            .u64(32, log.as_mut_ptr() as u64);
        let prog = bpf(BPF_PROG_LOAD, &attr).map_err(|e| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            bpf_err(
                &format!(
                    "bpf(BPF_PROG_LOAD) of the XDP redirect program (verifier: {})",
                    text.trim()
                ),
                e,
            )
        })?;
        Ok(Redirect {
            map,
            prog: fd_of(prog),
        })
    }

    /// Points RX queue `queue` at the AF_XDP socket `xsk`.
    pub fn insert(&self, queue: u32, xsk: &OwnedFd) -> Result<(), LoopbackError> {
        let value: i32 = xsk.as_raw_fd();
        let attr = Attr::new()
            .u32(0, self.map.as_raw_fd() as u32)
            .u64(8, &queue as *const u32 as u64)
            .u64(16, &value as *const i32 as u64);
        bpf(BPF_MAP_UPDATE_ELEM, &attr)
            .map_err(|e| bpf_err("bpf(BPF_MAP_UPDATE_ELEM, XSKMAP)", e))?;
        Ok(())
    }

    /// Attaches the program to `ifindex`: driver mode first, generic mode when the driver
    /// cannot; the attachment is removed when the result drops.
    pub fn attach(&self, ifindex: i32, name: &str) -> Result<Attached, LoopbackError> {
        let fd = self.prog.as_raw_fd();
        match set_xdp(ifindex, fd, XDP_FLAGS_DRV_MODE) {
            Ok(()) => Ok(Attached {
                ifindex,
                flags: XDP_FLAGS_DRV_MODE,
            }),
            Err(drv) => match set_xdp(ifindex, fd, XDP_FLAGS_SKB_MODE) {
                Ok(()) => Ok(Attached {
                    ifindex,
                    flags: XDP_FLAGS_SKB_MODE,
                }),
                Err(e) => Err(LoopbackError::Setup(format!(
                    "cannot attach an XDP program to {name}: driver mode: {drv}; generic mode: {e}{}",
                    if e.raw_os_error() == Some(libc::EPERM) { " (needs CAP_NET_ADMIN)" } else { "" }
                ))),
            },
        }
    }
}

/// An XDP program attached to an interface; detached on drop.
pub struct Attached {
    ifindex: i32,
    flags: u32,
}

impl Attached {
    /// True when the program runs in the driver (native XDP), false for generic XDP.
    pub fn native(&self) -> bool {
        self.flags == XDP_FLAGS_DRV_MODE
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        let _ = set_xdp(self.ifindex, -1, self.flags);
    }
}

/// The RTM_SETLINK request that sets (`prog_fd`) or removes (-1) an interface's XDP program.
pub fn setlink_xdp_request(ifindex: i32, prog_fd: i32, flags: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(52);
    let total: u32 = 16 + 16 + 4 + 8 + 8;
    m.extend_from_slice(&total.to_ne_bytes());
    m.extend_from_slice(&libc::RTM_SETLINK.to_ne_bytes());
    m.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
    m.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]); // ifinfomsg family, pad, type
    m.extend_from_slice(&ifindex.to_ne_bytes());
    m.extend_from_slice(&[0u8; 8]); // flags, change
    m.extend_from_slice(&20u16.to_ne_bytes());
    m.extend_from_slice(&(IFLA_XDP | NLA_F_NESTED).to_ne_bytes());
    m.extend_from_slice(&8u16.to_ne_bytes());
    m.extend_from_slice(&IFLA_XDP_FD.to_ne_bytes());
    m.extend_from_slice(&prog_fd.to_ne_bytes());
    m.extend_from_slice(&8u16.to_ne_bytes());
    m.extend_from_slice(&IFLA_XDP_FLAGS.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m
}

/// The result of a netlink request from the kernel's reply: the NLMSG_ERROR's code (0: done).
/// The reply is untrusted: a short or unexpected one is an error.
pub fn netlink_ack(reply: &[u8]) -> io::Result<()> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed netlink reply");
    let rd = |o: usize| -> Option<[u8; 4]> { reply.get(o..o + 4)?.try_into().ok() };
    let ty = reply.get(4..6).ok_or_else(bad)?;
    if u16::from_ne_bytes([ty[0], ty[1]]) != libc::NLMSG_ERROR as u16 {
        return Err(bad());
    }
    let code = i32::from_ne_bytes(rd(16).ok_or_else(bad)?);
    match code {
        0 => Ok(()),
        c if c < 0 && c > -4096 => Err(io::Error::from_raw_os_error(-c)),
        _ => Err(bad()),
    }
}

fn set_xdp(ifindex: i32, prog_fd: i32, flags: u32) -> io::Result<()> {
    // SAFETY: plain socket creation; the descriptor is owned right after.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` was just returned by socket() and is owned by nothing else.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    let msg = setlink_xdp_request(ifindex, prog_fd, flags);
    // SAFETY: sends the bytes of `msg`, a live buffer of that length.
    if unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut reply = [0u8; 4096];
    let tv = libc::timeval {
        tv_sec: 2,
        tv_usec: 0,
    };
    // SAFETY: SO_RCVTIMEO reads a timeval we own; the reply waits at most 2 s.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    // SAFETY: receives into `reply`, a live buffer of its length.
    let n = unsafe { libc::recv(sock.as_raw_fd(), reply.as_mut_ptr().cast(), reply.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    netlink_ack(&reply[..n as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_kernel_support_is_named() {
        let e = bpf_err(
            "bpf(BPF_PROG_LOAD)",
            io::Error::from_raw_os_error(libc::ENOSYS),
        );
        assert!(e.to_string().contains("CONFIG_BPF_SYSCALL"), "{e}");
        let e = bpf_err(
            "bpf(BPF_MAP_CREATE)",
            io::Error::from_raw_os_error(libc::EPERM),
        );
        assert!(e.to_string().contains("CAP_BPF"), "{e}");
    }

    #[test]
    fn program_encodes_the_redirect() {
        let p = redirect_program(7);
        assert_eq!(
            p[0],
            [0x61, 0x12, 16, 0, 0, 0, 0, 0],
            "r2 = *(u32 *)(r1 + 16)"
        );
        assert_eq!(p[1], [0x18, 0x11, 0, 0, 7, 0, 0, 0], "r1 = map fd 7");
        assert_eq!(p[4][4], 51, "bpf_redirect_map");
        assert_eq!(p[5][0], 0x95, "exit");
    }

    #[test]
    fn setlink_request_is_well_formed() {
        let m = setlink_xdp_request(3, 9, XDP_FLAGS_SKB_MODE);
        assert_eq!(
            u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize,
            m.len()
        );
        assert_eq!(i32::from_ne_bytes(m[20..24].try_into().unwrap()), 3);
        assert_eq!(i32::from_ne_bytes(m[40..44].try_into().unwrap()), 9);
        assert_eq!(
            u32::from_ne_bytes(m[48..52].try_into().unwrap()),
            XDP_FLAGS_SKB_MODE
        );
    }

    #[test]
    fn netlink_replies_are_checked() {
        let mut r = vec![0u8; 36];
        r[4..6].copy_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
        assert!(netlink_ack(&r).is_ok());
        r[16..20].copy_from_slice(&(-libc::EOPNOTSUPP).to_ne_bytes());
        assert_eq!(
            netlink_ack(&r).unwrap_err().raw_os_error(),
            Some(libc::EOPNOTSUPP)
        );
        r[16..20].copy_from_slice(&i32::MIN.to_ne_bytes());
        assert_eq!(
            netlink_ack(&r).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        assert!(netlink_ack(&r[..10]).is_err());
        assert!(netlink_ack(&[]).is_err());
        r[4] = 99;
        assert!(netlink_ack(&r[..20]).is_err());
    }
}
