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
