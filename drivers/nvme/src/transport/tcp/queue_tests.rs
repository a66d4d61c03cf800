//! Tests of [`super::queue::TcpQueue`] against a hand-driven target on a loopback socket.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::fabrics::KEEP_ALIVE_OPCODE;
use super::pdu::CMD_HLEN;
use super::queue::TcpQueue;
use super::rx::Negotiated;

const NEG: Negotiated = Negotiated {
    hdgst: false,
    ddgst: false,
    cpda: 0,
    maxh2cdata: 4096,
};

/// A CapsuleResp PDU: success for command `cid`.
fn resp(cid: u16) -> Vec<u8> {
    let mut v = vec![5, 0, 24, 0, 24, 0, 0, 0];
    v.extend_from_slice(&[0; 12]);
    v.extend_from_slice(&cid.to_le_bytes());
    v.extend_from_slice(&0u16.to_le_bytes());
    v
}

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
    // The target answers the first Keep Alive only after 150 ms, the others at once.
    let target = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut cap = [0u8; CMD_HLEN];
        while t0.elapsed() < Duration::from_millis(600) {
            match t.read_exact(&mut cap) {
                Ok(()) => {}
                Err(_) => continue,
            }
            seen.push((t0.elapsed(), cap[8]));
            if seen.len() == 1 {
                std::thread::sleep(Duration::from_millis(150));
            }
            let cid = u16::from_le_bytes([cap[10], cap[11]]);
            t.write_all(&resp(cid)).unwrap();
        }
        seen
    });
    let mut reported = 0;
    while t0.elapsed() < Duration::from_millis(500) {
        q.poll(&mut |_| reported += 1).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let seen = target.join().unwrap();
    assert_eq!(reported, 0, "Keep Alive completions are the queue's own");
    assert!(seen.iter().all(|&(_, op)| op == KEEP_ALIVE_OPCODE));
    // About one every 40 ms after the first answer (at ~190 ms) until 500 ms: 1 + ~7.
    assert!(seen.len() >= 4, "only {} Keep Alives in 500 ms", seen.len());
    assert!(seen.len() <= 13, "{} Keep Alives in 500 ms", seen.len());
    // The first is due after 40 ms, not at once.
    assert!(seen[0].0 >= Duration::from_millis(35), "{:?}", seen[0].0);
    // Never two in flight: the second waits for the (late) answer to the first.
    assert!(seen[1].0 >= Duration::from_millis(150), "{:?}", seen[1].0);
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

/// An R2T PDU for command `cid`: `len` bytes from `off`.
fn r2t(cid: u16, ttag: u16, off: u32, len: u32) -> Vec<u8> {
    let mut v = vec![9, 0, 24, 0, 24, 0, 0, 0];
    v.extend_from_slice(&cid.to_le_bytes());
    v.extend_from_slice(&ttag.to_le_bytes());
    v.extend_from_slice(&off.to_le_bytes());
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(&[0; 4]);
    v
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
        q.submit(super::fabrics::keep_alive(), "Flush", None, None, 0, 0, tag)
            .map_err(|(e, _)| e)
            .unwrap();
    }
    let data: Vec<u8> = (0..10240u32).map(|i| (i * 7 % 251) as u8).collect();
    let w = super::fabrics::rw(true, 1, 0, 20);
    q.submit(w, "Write", Some(true), Some(data.clone()), 0, 10240, 99)
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
