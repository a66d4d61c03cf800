//! The socket under one NVMe/TCP connection: connect with a deadline, non-blocking I/O
//! without SIGPIPE, and the ICReq / ICResp exchange.
//!
//! A socket transport makes syscalls on the I/O path by nature (send and receive); the PCIe
//! transport stays syscall-free.

use std::io::{self, IoSlice};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use zerocopy::IntoBytes;

use super::error::TcpError;
use super::ic::parse_icresp;
use super::pdu::{IcReq, IC_LEN};
use super::rx::Negotiated;

/// Connect to `addr` ("HOST:PORT") within `timeout`, trying each resolved address.
pub fn connect(addr: &str, timeout: Duration) -> Result<TcpStream, TcpError> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| TcpError::Address {
            input: addr.to_string(),
            reason: format!("cannot resolve it: {e}"),
        })?
        .collect();
    let mut last = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, timeout) {
            Ok(s) => {
                s.set_nodelay(true)
                    .map_err(|e| TcpError::io("setting TCP_NODELAY", e))?;
                set_quickack(&s).map_err(|e| TcpError::io("setting TCP_QUICKACK", e))?;
                s.set_nonblocking(true)
                    .map_err(|e| TcpError::io("making the socket non-blocking", e))?;
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) if e.kind() == io::ErrorKind::ConnectionRefused => TcpError::Refused {
            addr: addr.to_string(),
        },
        Some(e) if e.kind() == io::ErrorKind::TimedOut || e.kind() == io::ErrorKind::WouldBlock => {
            TcpError::ConnectTimeout {
                addr: addr.to_string(),
                waited: timeout,
            }
        }
        Some(e) => TcpError::io("connecting", e),
        None => TcpError::Address {
            input: addr.to_string(),
            reason: "it resolves to no address".into(),
        },
    })
}

/// TCP_QUICKACK: acknowledge at once instead of delaying ACKs (a command's response waits on
/// nothing then). Linux may leave quick-ack mode again on its own; it is set once, at connect,
/// not after every `recv` (a system call each).
pub fn set_quickack(s: &TcpStream) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: a valid int option value of its size, for the duration of the call; the fd is
    // an open socket owned by `s`.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `sendmsg` of the slices (MSG_NOSIGNAL: a closed peer is an error, not a SIGPIPE).
/// Ok(0) when the socket buffer is full.
pub fn send_iov(s: &TcpStream, iov: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: msghdr is plain data; all-zero is a valid empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: IoSlice is ABI-compatible with iovec (std guarantees it on Unix); the slices
    // live across the call; the fd is an open socket owned by `s`.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
}

/// `recv` into `len` bytes at `ptr`. Ok(None) when nothing is there; Err(UnexpectedEof) when
/// the peer closed the connection.
///
/// # Safety
/// `ptr..ptr+len` must be writable memory nobody else accesses during the call.
pub unsafe fn recv_raw(s: &TcpStream, ptr: *mut u8, len: usize) -> io::Result<Option<usize>> {
    // SAFETY: the caller guarantees the destination; the fd is an open socket.
    let n = unsafe { libc::recv(s.as_raw_fd(), ptr.cast(), len, libc::MSG_DONTWAIT) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock => Ok(None),
            io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    if n == 0 && len > 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Some(n as usize))
}

/// Send all of `data` before `deadline` (control path only: spins on a full socket buffer).
pub fn send_all(
    s: &TcpStream,
    data: &[u8],
    deadline: Instant,
    what: &'static str,
    waited: Duration,
) -> Result<(), TcpError> {
    let mut off = 0;
    while off < data.len() {
        let n = send_iov(s, &[IoSlice::new(&data[off..])]).map_err(|e| TcpError::io(what, e))?;
        off += n;
        if n == 0 {
            if Instant::now() >= deadline {
                return Err(TcpError::Timeout { what, waited });
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    Ok(())
}

/// Receive exactly `buf.len()` bytes before `deadline` (control path only).
pub fn recv_exact(
    s: &TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    what: &'static str,
    waited: Duration,
) -> Result<(), TcpError> {
    let mut off = 0;
    while off < buf.len() {
        // SAFETY: the destination is the rest of `buf`, borrowed mutably here.
        let r = unsafe { recv_raw(s, buf[off..].as_mut_ptr(), buf.len() - off) };
        match r.map_err(|e| TcpError::io(what, e))? {
            Some(n) => off += n,
            None => {
                if Instant::now() >= deadline {
                    return Err(TcpError::Timeout { what, waited });
                }
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
    Ok(())
}

/// The ICReq / ICResp exchange, bounded by `timeout`.
pub fn initialize(
    s: &TcpStream,
    hdgst: bool,
    ddgst: bool,
    timeout: Duration,
) -> Result<Negotiated, TcpError> {
    let deadline = Instant::now() + timeout;
    let req = IcReq::new(hdgst, ddgst);
    send_all(s, req.as_bytes(), deadline, "ICReq", timeout)?;
    let mut resp = [0u8; IC_LEN];
    recv_exact(s, &mut resp, deadline, "ICResp", timeout)?;
    parse_icresp(&resp, hdgst, ddgst)
}
