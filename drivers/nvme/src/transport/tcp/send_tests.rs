//! Tests of what [`super::queue::TcpQueue`] sends for R2Ts: only data of the live write the
//! target names, inside its data; a command that ends takes its queued sends with it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::pdu::CMD_HLEN;
use super::queue::{TcpCommand, TcpCompletion, TcpQueue};
use super::rx::Negotiated;
use super::test_pdus::{r2t, resp, resp_failed};
use super::TcpError;

const NEG: Negotiated = Negotiated {
    hdgst: false,
    ddgst: false,
    cpda: 0,
    maxh2cdata: 1 << 20,
};

fn set_buf(fd: i32, opt: i32, v: i32) {
    // SAFETY: a valid int option on an open socket.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&v as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
}

/// A queue (depth 8) over loopback with small socket buffers, and the target's end.
fn tight_loopback() -> (TcpQueue<Vec<u8>>, TcpStream) {
    tight_loopback_timeout(Duration::from_secs(30))
}

/// [`tight_loopback`] whose commands time out after `timeout`.
fn tight_loopback_timeout(timeout: Duration) -> (TcpQueue<Vec<u8>>, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    set_buf(l.as_raw_fd(), libc::SO_RCVBUF, 4096);
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    set_buf(c.as_raw_fd(), libc::SO_SNDBUF, 4096);
    c.set_nonblocking(true).unwrap();
    let (t, _) = l.accept().unwrap();
    t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    (TcpQueue::new(c, NEG, 1, 8, 0, timeout), t)
}

/// Submit a read (`write` false) or a write of `len` bytes tagged `tag`, send it, and return
/// its command ID as the target sees it.
fn submit_one(
    q: &mut TcpQueue<Vec<u8>>,
    t: &mut TcpStream,
    write: bool,
    len: usize,
    tag: u64,
) -> u16 {
    let sqe = super::fabrics::rw(write, 1, 0, (len / 512) as u32);
    let cmd = if write {
        TcpCommand::new(sqe, "Write").write(0, len as u32)
    } else {
        TcpCommand::new(sqe, "Read").read(0, len as u32)
    };
    q.submit(cmd.buf(vec![0xaa; len]).tag(tag))
        .map_err(|(e, _)| e)
        .unwrap();
    q.poll(&mut |_| panic!("nothing can complete yet")).unwrap();
    let mut cap = [0u8; CMD_HLEN];
    t.read_exact(&mut cap).unwrap();
    assert_eq!(cap[0], 4, "a CapsuleCmd");
    u16::from_le_bytes([cap[10], cap[11]])
}

/// Poll until the queue fails; returns the error and what came back through `done`.
fn until_error(q: &mut TcpQueue<Vec<u8>>) -> (TcpError, Vec<TcpCompletion<Vec<u8>>>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut back = Vec::new();
    loop {
        if let Err(e) = q.poll(&mut |c| back.push(c)) {
            return (e, back);
        }
        assert!(Instant::now() < deadline, "the queue accepted the PDU");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Everything the host sends until it closes the connection.
fn rest_of_stream(t: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let _ = t.read_to_end(&mut got);
    got
}

/// The R2T is refused as `field`; the command comes back (failed, with its buffer), the
/// connection is closed, and not one byte went out after the R2T.
fn assert_refused(q: &mut TcpQueue<Vec<u8>>, t: &mut TcpStream, field: &str, tag: u64) {
    let (e, back) = until_error(q);
    match &e {
        TcpError::Protocol {
            pdu: "R2T",
            field: f,
            ..
        } => assert_eq!(*f, field, "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].tag, tag);
    assert!(back[0].buf.is_some(), "the buffer comes back");
    assert!(matches!(
        back[0].result,
        Err(TcpError::ConnectionLost { .. })
    ));
    assert!(q.is_dead());
    assert_eq!(rest_of_stream(t), b"", "the host sent data after the R2T");
}

#[test]
fn an_r2t_for_a_read_fails_the_connection_and_sends_nothing() {
    let (mut q, mut t) = tight_loopback();
    let cid = submit_one(&mut q, &mut t, false, 4096, 1);
    t.write_all(&r2t(cid, 5, 0, 4096)).unwrap();
    assert_refused(&mut q, &mut t, "CCCID", 1);
}

#[test]
fn an_r2t_past_the_end_of_a_write_fails_the_connection_and_sends_nothing() {
    let (mut q, mut t) = tight_loopback();
    let cid = submit_one(&mut q, &mut t, true, 8192, 1);
    t.write_all(&r2t(cid, 5, 0, 65536)).unwrap();
    assert_refused(&mut q, &mut t, "R2TL", 1);
}

#[test]
fn an_r2t_after_its_write_completed_fails_the_connection_and_sends_nothing() {
    let (mut q, mut t) = tight_loopback();
    let cid = submit_one(&mut q, &mut t, true, 8192, 1);
    t.write_all(&r2t(cid, 5, 0, 8192)).unwrap();
    let mut h2c = vec![0u8; 24 + 8192];
    let deadline = Instant::now() + Duration::from_secs(5);
    t.set_nonblocking(true).unwrap();
    let mut at = 0;
    while at < h2c.len() && Instant::now() < deadline {
        q.poll(&mut |_| panic!("not answered yet")).unwrap();
        if let Ok(k) = t.read(&mut h2c[at..]) {
            at += k;
        }
    }
    t.set_nonblocking(false).unwrap();
    assert_eq!(at, h2c.len());
    assert_eq!(h2c[0], 6, "H2CData");
    assert!(h2c[24..].iter().all(|&b| b == 0xaa));
    t.write_all(&resp(cid)).unwrap();
    let mut ok = false;
    while !ok && Instant::now() < deadline {
        q.poll(&mut |c| ok = c.tag == 1 && c.result.is_ok())
            .unwrap();
    }
    assert!(ok, "the write did not complete");
    // The same R2T again: its command is gone.
    t.write_all(&r2t(cid, 5, 0, 8192)).unwrap();
    let (e, back) = until_error(&mut q);
    assert!(
        matches!(
            e,
            TcpError::Protocol {
                pdu: "R2T",
                field: "CCCID",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(back.is_empty());
    assert_eq!(
        rest_of_stream(&mut t),
        b"",
        "the host sent data after the R2T"
    );
}

#[test]
fn an_r2t_for_a_read_that_took_a_finished_writes_id_sends_nothing() {
    let (mut q, mut t) = tight_loopback();
    let w = submit_one(&mut q, &mut t, true, 8192, 1);
    t.write_all(&resp_failed(w, 0x02)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut failed = false;
    while !failed && Instant::now() < deadline {
        q.poll(&mut |c| failed = c.tag == 1 && c.result.is_err())
            .unwrap();
    }
    assert!(failed);
    let r = submit_one(&mut q, &mut t, false, 65536, 2);
    assert_eq!(r, w, "command IDs are reused last-in first-out");
    t.write_all(&r2t(r, 5, 0, 8192)).unwrap();
    assert_refused(&mut q, &mut t, "CCCID", 2);
}

/// The target asks for a write's data while the host's socket is full (another write's data
/// fills it), so the H2CData PDU waits in the send batch, not yet on the wire; then the target
/// fails that write. Its PDU is dropped unsent: the write comes back failed, the connection
/// lives on, and the target sees no byte of it.
#[test]
fn a_write_failed_while_its_data_waits_to_be_sent_drops_that_data_and_keeps_the_connection() {
    let (mut q, mut t) = tight_loopback();
    let big = submit_one(&mut q, &mut t, true, 2 << 20, 1);
    let small = submit_one(&mut q, &mut t, true, 65536, 2);
    t.write_all(&r2t(big, 7, 0, 2 << 20)).unwrap();
    t.write_all(&r2t(small, 8, 0, 65536)).unwrap();
    for _ in 0..50 {
        q.poll(&mut |_| panic!("not answered yet")).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    t.write_all(&resp_failed(small, 0x02)).unwrap();
    let mut back = Vec::new();
    let start = Instant::now();
    while back.is_empty() && start.elapsed() < Duration::from_secs(5) {
        q.poll(&mut |c| back.push(c)).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].tag, 2);
    assert!(matches!(back[0].result, Err(TcpError::Command { .. })));
    // The target takes all the big write's data: two 1 MiB H2CData PDUs, nothing else.
    let want = 2 * (24 + (1 << 20));
    let mut stream = Vec::new();
    t.set_nonblocking(true).unwrap();
    // Until all of it came, then 200 ms more: anything else the host sends shows up.
    let mut quiet = None;
    let mut b = vec![0u8; 1 << 16];
    while quiet.is_none_or(|q: Instant| q.elapsed() < Duration::from_millis(200))
        && start.elapsed() < Duration::from_secs(20)
    {
        q.poll(&mut |_| panic!("not answered yet")).unwrap();
        if let Ok(k) = t.read(&mut b) {
            stream.extend_from_slice(&b[..k]);
        }
        if quiet.is_none() && stream.len() >= want {
            quiet = Some(Instant::now());
        }
    }
    assert_eq!(stream.len(), want);
    let mut at = 0;
    while at < stream.len() {
        assert_eq!(stream[at], 6, "H2CData");
        assert_eq!(u16::from_le_bytes([stream[at + 8], stream[at + 9]]), big);
        at += u32::from_le_bytes(stream[at + 4..at + 8].try_into().unwrap()) as usize;
    }
    t.set_nonblocking(false).unwrap();
    t.write_all(&resp(big)).unwrap();
    let mut ok = false;
    while !ok && start.elapsed() < Duration::from_secs(25) {
        q.poll(&mut |c| ok = c.tag == 1 && c.result.is_ok())
            .unwrap();
    }
    assert!(ok, "the big write did not complete");
}

/// A write whose data waits to be sent (the target stopped reading) times out: it comes back
/// with its buffer, the connection is closed, and none of its data goes out afterwards.
#[test]
fn a_write_timed_out_while_its_data_waits_comes_back_and_nothing_more_is_sent() {
    let (mut q, mut t) = tight_loopback_timeout(Duration::from_millis(300));
    let cid = submit_one(&mut q, &mut t, true, 2 << 20, 1);
    t.write_all(&r2t(cid, 7, 0, 2 << 20)).unwrap();
    let t0 = Instant::now();
    let (e, back) = until_error(&mut q);
    assert!(matches!(e, TcpError::Timeout { .. }), "{e:?}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].tag, 1);
    assert_eq!(back[0].buf.as_ref().map(Vec::len), Some(2 << 20));
    // What the host's socket held before the timeout, then the end of the stream: less than
    // the write's data.
    let rest = rest_of_stream(&mut t);
    assert!(rest.len() < 2 << 20, "{} bytes", rest.len());
    assert!(q.poll(&mut |_| panic!("nothing is left")).is_err());
}
