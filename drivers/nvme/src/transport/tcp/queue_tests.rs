//! Tests of [`super::queue::TcpQueue`] against a hand-driven target on a loopback socket.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::fabrics::KEEP_ALIVE_OPCODE;
use super::pdu::CMD_HLEN;
use super::queue::{TcpCommand, TcpQueue};
use super::rx::Negotiated;
use super::test_pdus::{c2h_success, r2t, resp};
use super::TcpError;

const NEG: Negotiated = Negotiated {
    hdgst: false,
    ddgst: false,
    cpda: 0,
    maxh2cdata: 4096,
};

#[test]
fn keep_alive_is_sent_from_poll_when_due_one_at_a_time_and_never_reported() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    c.set_nonblocking(true).unwrap();
    let (mut t, _) = l.accept().unwrap();
    t.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut q: TcpQueue<Vec<u8>> = TcpQueue::new(c, NEG, 0, 4, 0, Duration::from_secs(5));
    q.set_keep_alive(Some(Duration::from_millis(40)));
    let t0 = Instant::now();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_target = stop.clone();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count_target = count.clone();
    // The target answers the first Keep Alive only after 150 ms, the others at once. The test
    // ends on a count (5 Keep Alives), not on a time window: on a loaded 2-core CI machine a
    // poll loop can be descheduled for hundreds of milliseconds.
    let target = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut cap = [0u8; CMD_HLEN];
        while !stop_target.load(std::sync::atomic::Ordering::Relaxed) {
            match t.read_exact(&mut cap) {
                Ok(()) => {}
                Err(_) => continue,
            }
            seen.push((t0.elapsed(), cap[8]));
            count_target.store(seen.len(), std::sync::atomic::Ordering::Relaxed);
            if seen.len() == 1 {
                std::thread::sleep(Duration::from_millis(150));
            }
            let cid = u16::from_le_bytes([cap[10], cap[11]]);
            t.write_all(&resp(cid)).unwrap();
        }
        seen
    });
    let mut reported = 0;
    while count.load(std::sync::atomic::Ordering::Relaxed) < 5
        && t0.elapsed() < Duration::from_secs(20)
    {
        q.poll(&mut |_| reported += 1).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    // The last answer reaches the queue (its completion must not be reported either).
    for _ in 0..50 {
        q.poll(&mut |_| reported += 1).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = target.join().unwrap();
    assert_eq!(reported, 0, "Keep Alive completions are the queue's own");
    assert!(seen.iter().all(|&(_, op)| op == KEEP_ALIVE_OPCODE));
    assert!(
        seen.len() >= 5,
        "only {} Keep Alives in {:?}",
        seen.len(),
        t0.elapsed()
    );
    // The first is due after 40 ms, not at once.
    assert!(seen[0].0 >= Duration::from_millis(35), "{:?}", seen[0].0);
    // Never two in flight: the second waits for the (late) answer to the first.
    assert!(seen[1].0 >= Duration::from_millis(150), "{:?}", seen[1].0);
    // Then one per interval, never more often (a loaded machine may make them later).
    for w in seen[1..].windows(2) {
        assert!(w[1].0 - w[0].0 >= Duration::from_millis(35), "{seen:?}");
    }
}

#[test]
fn no_keep_alive_unless_asked() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    c.set_nonblocking(true).unwrap();
    let (mut t, _) = l.accept().unwrap();
    t.set_nonblocking(true).unwrap();
    let mut q: TcpQueue<Vec<u8>> = TcpQueue::new(c, NEG, 0, 4, 0, Duration::from_secs(5));
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(100) {
        q.poll(&mut |_| {}).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut b = [0u8; 1];
    assert!(t.read(&mut b).is_err(), "the queue sent something unasked");
}

#[test]
fn batched_sends_carry_every_capsule_and_h2c_chunks_in_order() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    c.set_nonblocking(true).unwrap();
    let (mut t, _) = l.accept().unwrap();
    t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut q: TcpQueue<Vec<u8>> = TcpQueue::new(c, NEG, 1, 40, 0, Duration::from_secs(5));
    // 36 commands without data (more than two batches) and one 10 KiB write that needs an
    // R2T, answered in 4096-byte H2CData PDUs (MAXH2CDATA).
    for tag in 0..36u64 {
        q.submit(TcpCommand::new(super::fabrics::keep_alive(), "Flush").tag(tag))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    let data: Vec<u8> = (0..10240u32).map(|i| (i * 7 % 251) as u8).collect();
    let w = super::fabrics::rw(true, 1, 0, 20);
    q.submit(
        TcpCommand::new(w, "Write")
            .write(0, 10240)
            .buf(data.clone())
            .tag(99),
    )
    .map_err(|(e, _)| e)
    .unwrap();
    q.poll(&mut |_| {}).unwrap();
    let mut caps = vec![0u8; 37 * CMD_HLEN];
    t.read_exact(&mut caps).unwrap();
    let cids: Vec<u16> = caps
        .chunks_exact(CMD_HLEN)
        .map(|c| {
            assert_eq!(c[0], 4, "a CapsuleCmd");
            u16::from_le_bytes([c[10], c[11]])
        })
        .collect();
    let wcid = cids[36];
    t.write_all(&r2t(wcid, 7, 0, 10240)).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut h2c = Vec::new();
    while h2c.len() < 10240 + 3 * 24 && Instant::now() < deadline {
        q.poll(&mut |c| got.push(c.tag)).unwrap();
        let mut b = [0u8; 65536];
        t.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
        if let Ok(k) = t.read(&mut b) {
            h2c.extend_from_slice(&b[..k]);
        }
    }
    let mut at = 0;
    let mut off = 0u32;
    for (i, len) in [4096u32, 4096, 2048].into_iter().enumerate() {
        let h = &h2c[at..at + 24];
        assert_eq!(h[0], 6, "H2CData");
        assert_eq!(h[1] & (1 << 2) != 0, i == 2, "LAST_PDU only on the last");
        assert_eq!(u16::from_le_bytes([h[8], h[9]]), wcid);
        assert_eq!(u16::from_le_bytes([h[10], h[11]]), 7);
        assert_eq!(u32::from_le_bytes(h[12..16].try_into().unwrap()), off);
        assert_eq!(u32::from_le_bytes(h[16..20].try_into().unwrap()), len);
        assert_eq!(
            &h2c[at + 24..at + 24 + len as usize],
            &data[off as usize..(off + len) as usize]
        );
        at += 24 + len as usize;
        off += len;
    }
    assert_eq!(at, h2c.len());
    let mut answer = Vec::new();
    for &cid in &cids {
        answer.extend(resp(cid));
    }
    t.write_all(&answer).unwrap();
    while got.len() < 37 && Instant::now() < deadline {
        q.poll(&mut |c| {
            assert!(c.result.is_ok());
            got.push(c.tag)
        })
        .unwrap();
    }
    got.sort();
    let mut want: Vec<u64> = (0..36).collect();
    want.push(99);
    assert_eq!(got, want);
}

/// A queue of `depth` over loopback with the target's end.
fn loopback(depth: u16) -> (TcpQueue<Vec<u8>>, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    c.set_nonblocking(true).unwrap();
    let (t, _) = l.accept().unwrap();
    t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    (
        TcpQueue::new(c, NEG, 1, depth, 0, Duration::from_secs(5)),
        t,
    )
}

/// Submit reads of `lens` bytes (tags 0..), send them, and return the target's view of the
/// command IDs in order.
fn submit_reads(q: &mut TcpQueue<Vec<u8>>, t: &mut TcpStream, lens: &[usize]) -> Vec<u16> {
    for (tag, &len) in lens.iter().enumerate() {
        let sqe = super::fabrics::rw(false, 1, 0, (len / 512) as u32);
        q.submit(
            TcpCommand::new(sqe, "Read")
                .read(0, len as u32)
                .buf(vec![0; len])
                .tag(tag as u64),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    }
    q.poll(&mut |_| panic!("nothing can complete yet")).unwrap();
    let mut caps = vec![0u8; lens.len() * CMD_HLEN];
    t.read_exact(&mut caps).unwrap();
    caps.chunks_exact(CMD_HLEN)
        .map(|c| u16::from_le_bytes([c[10], c[11]]))
        .collect()
}

/// The bytes the target sends for command `cid`: each byte names the command and its offset.
fn pattern(cid: u16, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7) ^ cid as u8)
        .collect()
}

#[test]
fn pdus_that_arrived_together_are_taken_with_one_recv() {
    let (mut q, mut t) = loopback(8);
    let cids = submit_reads(&mut q, &mut t, &[512; 8]);
    let mut answer = Vec::new();
    for &cid in &cids {
        answer.extend(c2h_success(cid, &pattern(cid, 512)));
    }
    t.write_all(&answer).unwrap();
    assert!(q.wait_ready(Duration::from_secs(5)).unwrap());
    // All 4,288 bytes in the socket (one loopback write).
    std::thread::sleep(Duration::from_millis(50));
    let before = q.recv_calls();
    let mut got = Vec::new();
    let n = q.poll(&mut |c| got.push(c)).unwrap();
    assert_eq!(n, 8);
    // One recv with the 16 PDUs (8 headers, 8 payloads), one that finds the socket empty;
    // one recv per header and per payload was 16 and more.
    assert!(
        q.recv_calls() - before <= 2,
        "{} recv calls",
        q.recv_calls() - before
    );
    for c in got {
        let cid = cids[c.tag as usize];
        assert!(c.result.is_ok());
        assert_eq!(c.buf.unwrap(), pattern(cid, 512), "command {cid}");
    }
}

#[test]
fn large_and_small_payloads_land_whole_through_the_receive_buffer_and_direct() {
    let (mut q, mut t) = loopback(4);
    // 200 KiB: its start comes through the 64 KiB receive buffer, the rest straight in.
    let lens = [4096, 200 * 1024, 512, 64 * 1024 + 512];
    let cids = submit_reads(&mut q, &mut t, &lens);
    let mut answer = Vec::new();
    for (&cid, &len) in cids.iter().zip(&lens) {
        answer.extend(c2h_success(cid, &pattern(cid, len)));
    }
    let target = std::thread::spawn(move || {
        t.write_all(&answer).unwrap();
        t
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < lens.len() && Instant::now() < deadline {
        q.poll(&mut |c| got.push(c)).unwrap();
    }
    let _t = target.join().unwrap();
    assert_eq!(got.len(), lens.len());
    for c in got {
        let i = c.tag as usize;
        assert!(c.result.is_ok());
        let b = c.buf.unwrap();
        assert!(
            b == pattern(cids[i], lens[i]),
            "read {i} of {} bytes",
            lens[i]
        );
    }
}

#[test]
fn a_connection_closed_after_kato_without_keep_alive_says_keep_alive_expired() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    c.set_nonblocking(true).unwrap();
    let (t, _) = l.accept().unwrap();
    let mut q: TcpQueue<Vec<u8>> = TcpQueue::new(c, NEG, 0, 4, 0, Duration::from_secs(5));
    // KATO 100 ms (a Keep Alive every 50 ms): nobody polls for 300 ms; the target gives up.
    q.set_keep_alive(Some(Duration::from_millis(50)));
    std::thread::sleep(Duration::from_millis(300));
    drop(t);
    let e = first_error(&mut q);
    match &e {
        TcpError::KeepAliveExpired { idle, kato } => {
            assert_eq!(*kato, Duration::from_millis(100));
            assert!(*idle >= Duration::from_millis(300), "{idle:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("poll the admin queue"), "{e}");
}

#[test]
fn a_connection_closed_while_keep_alives_flow_is_just_closed() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    c.set_nonblocking(true).unwrap();
    let (t, _) = l.accept().unwrap();
    let mut q: TcpQueue<Vec<u8>> = TcpQueue::new(c, NEG, 0, 4, 0, Duration::from_secs(5));
    q.set_keep_alive(Some(Duration::from_secs(10)));
    drop(t);
    let e = first_error(&mut q);
    assert!(matches!(e, TcpError::Closed { .. }), "{e:?}");
}

/// Poll until the queue reports an error (the peer's close may take a moment to arrive).
fn first_error(q: &mut TcpQueue<Vec<u8>>) -> TcpError {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Err(e) = q.poll(&mut |_| {}) {
            return e;
        }
        assert!(
            Instant::now() < deadline,
            "no error within 5 s of the close"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// At depth every command goes on the wire without waiting for an earlier answer.
/// The target reads all 128 capsules before it answers any (a queue that held commands back
/// would leave `read_exact` short: it times out after 5 s), then answers them all; the 128
/// reads submitted again from the completion callback, as `perf` does, go out from one
/// more poll, again before any answer.
#[test]
fn all_commands_at_depth_are_sent_before_any_answer_and_resubmits_go_out_at_once() {
    const DEPTH: usize = 128;
    let (mut q, mut t) = loopback(DEPTH as u16);
    let cids = submit_reads(&mut q, &mut t, &[512; DEPTH]);
    assert_eq!(cids.len(), DEPTH);
    let mut answer = Vec::new();
    for &cid in &cids {
        answer.extend(c2h_success(cid, &pattern(cid, 512)));
    }
    let target = std::thread::spawn(move || {
        t.write_all(&answer).unwrap();
        t
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = 0;
    let mut back = Vec::new();
    while got < DEPTH && Instant::now() < deadline {
        got += q.poll(&mut |c| back.push(c)).unwrap();
        for c in back.drain(..) {
            let sqe = super::fabrics::rw(false, 1, 0, 1);
            let b = c.buf.expect("a read's buffer comes back");
            q.submit(TcpCommand::new(sqe, "Read").read(0, 512).buf(b).tag(c.tag))
                .map_err(|(e, _)| e)
                .unwrap();
        }
    }
    let mut t = target.join().unwrap();
    assert_eq!(got, DEPTH);
    assert_eq!(q.in_flight(), DEPTH);
    q.poll(&mut |_| panic!("nothing was answered yet")).unwrap();
    let mut caps = vec![0u8; DEPTH * CMD_HLEN];
    t.read_exact(&mut caps).unwrap();
    assert!(caps.chunks_exact(CMD_HLEN).all(|c| c[0] == 0x04));
}

/// A write the target asks data of (R2T) and then fails at once (error CapsuleResp right
/// behind the R2T) while the host's socket is full: the H2CData it queued is dropped when the
/// write ends, so nothing is sent for it, neither from its buffer nor from the 4 KiB read that
/// takes its command ID at once (IDs are reused last-in first-out).
#[test]
fn a_write_failed_after_its_r2t_sends_no_data_not_even_from_the_command_reusing_its_id() {
    use std::os::fd::AsRawFd;
    fn set_buf(fd: i32, opt: i32, v: i32) {
        // SAFETY: a valid int option on an open socket.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&v as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            );
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    set_buf(l.as_raw_fd(), libc::SO_RCVBUF, 4096);
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    set_buf(c.as_raw_fd(), libc::SO_SNDBUF, 4096);
    c.set_nonblocking(true).unwrap();
    let (mut t, _) = l.accept().unwrap();
    set_buf(t.as_raw_fd(), libc::SO_RCVBUF, 4096);
    let neg = Negotiated {
        hdgst: false,
        ddgst: false,
        cpda: 0,
        maxh2cdata: 1 << 20,
    };
    let mut q: TcpQueue<Vec<u8>> = TcpQueue::new(c, neg, 1, 64, 0, Duration::from_secs(60));
    // A: 64 KiB write (cid 0); B: 2 MiB write (cid 1).
    q.submit(
        TcpCommand::new(super::fabrics::rw(true, 1, 0, 128), "Write")
            .write(0, 65536)
            .buf(vec![0xaa; 65536])
            .tag(100),
    )
    .map_err(|(e, _)| e)
    .unwrap();
    q.submit(
        TcpCommand::new(super::fabrics::rw(true, 1, 0, 4096), "Write")
            .write(0, 2 << 20)
            .buf(vec![0xbb; 2 << 20])
            .tag(101),
    )
    .map_err(|(e, _)| e)
    .unwrap();
    q.poll(&mut |_| {}).unwrap();
    let mut caps = [0u8; 2 * CMD_HLEN];
    t.read_exact(&mut caps).unwrap();
    let cid_a = u16::from_le_bytes([caps[10], caps[11]]);
    let cid_b = u16::from_le_bytes([caps[CMD_HLEN + 10], caps[CMD_HLEN + 11]]);
    // B's data fills the host's socket (the target does not read).
    t.write_all(&r2t(cid_b, 7, 0, 2 << 20)).unwrap();
    for _ in 0..100 {
        q.poll(&mut |_| {}).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    // 20 more commands: the batch (16) fills, the rest waits in the send queue.
    for tag in 0..20u64 {
        q.submit(TcpCommand::new(super::fabrics::keep_alive(), "Flush").tag(200 + tag))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    q.poll(&mut |_| {}).unwrap();
    // The target asks for A's data, then fails A (status: Invalid Field).
    let mut fail = resp(cid_a);
    fail[22..24].copy_from_slice(&(0x02u16 << 1).to_le_bytes());
    t.write_all(&r2t(cid_a, 9, 0, 65536)).unwrap();
    t.write_all(&fail).unwrap();
    let mut a_done = false;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !a_done && Instant::now() < deadline {
        q.poll(&mut |c| {
            if c.tag == 100 {
                assert!(c.result.is_err());
                a_done = true;
            }
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(a_done, "A did not complete");
    // A new 4 KiB read takes A's command ID (its buffer is larger, so the over-read below
    // stays inside the allocation in this test; with a 4 KiB Vec it reads past it).
    q.submit(
        TcpCommand::new(super::fabrics::rw(false, 1, 0, 8), "Read")
            .read(0, 4096)
            .buf(vec![0x55; 128 << 10])
            .tag(300),
    )
    .map_err(|(e, _)| e)
    .unwrap();
    // The target now reads everything and records every H2CData header.
    t.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
    let mut stream = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    // B's data in two H2CData PDUs, the 20 capsules and the read's: then 200 ms more, so
    // anything else the host sends shows up.
    let want = 2 * 24 + (2 << 20) + 20 * CMD_HLEN + CMD_HLEN;
    let mut quiet: Option<Instant> = None;
    while quiet.is_none_or(|q| q.elapsed() < Duration::from_millis(200))
        && Instant::now() < deadline
    {
        let _ = q.poll(&mut |_| {});
        let mut b = vec![0u8; 1 << 16];
        if let Ok(k) = t.read(&mut b) {
            stream.extend_from_slice(&b[..k]);
        }
        if quiet.is_none() && stream.len() >= want {
            quiet = Some(Instant::now());
        }
    }
    let mut at = 0;
    let mut stale = Vec::new();
    while at + 8 <= stream.len() {
        let plen = u32::from_le_bytes(stream[at + 4..at + 8].try_into().unwrap()) as usize;
        if stream[at] == 6 && at + 24 <= stream.len() {
            let cccid = u16::from_le_bytes([stream[at + 8], stream[at + 9]]);
            let datal = u32::from_le_bytes(stream[at + 16..at + 20].try_into().unwrap());
            if cccid == cid_a {
                stale.push(datal);
            }
        }
        at += plen;
    }
    assert!(
        stale.is_empty(),
        "H2CData sent for command id {cid_a} after it completed (now a 4 KiB READ): DATAL {stale:?}"
    );
    assert_eq!(
        stream.len(),
        want,
        "B's data and the 21 capsules, nothing else"
    );
}
