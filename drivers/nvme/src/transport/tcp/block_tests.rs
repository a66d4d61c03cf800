//! Tests of [`super::block::TcpBlockQueue`] against a hand-driven target on a loopback socket.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ubdirect_core::seams::BlockQueue;
use ubdirect_core::{DmaDomain, PoolConfig, UbPool, UbRegistry};

use super::block::TcpBlockQueue;
use super::pdu::CMD_HLEN;
use super::queue::TcpQueue;
use super::rx::Negotiated;
use crate::info::NamespaceInfo;

const NEG: Negotiated = Negotiated {
    hdgst: false,
    ddgst: false,
    cpda: 0,
    maxh2cdata: 4096,
};

/// A C2HData PDU (LAST_PDU, SUCCESS: no response follows) of `data` for command `cid`.
fn c2h_success(cid: u16, data: &[u8]) -> Vec<u8> {
    let plen = 24 + data.len() as u32;
    let mut v = vec![7, (1 << 2) | (1 << 3), 24, 24];
    v.extend_from_slice(&plen.to_le_bytes());
    v.extend_from_slice(&cid.to_le_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&(data.len() as u32).to_le_bytes());
    v.extend_from_slice(&[0; 4]);
    v.extend_from_slice(data);
    v
}

/// An initiator queue of `depth` over loopback, and the target's end of the connection.
fn pair(depth: u16) -> (TcpBlockQueue, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    c.set_nodelay(true).unwrap();
    c.set_nonblocking(true).unwrap();
    let (t, _) = l.accept().unwrap();
    t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let q: TcpQueue<ubdirect_core::UbBuf> =
        TcpQueue::new(c, NEG, 1, depth, 0, Duration::from_secs(5));
    let ns = NamespaceInfo {
        nsid: 1,
        nsze: 1024,
        ncap: 1024,
        nuse: 1024,
        flbas: 0,
        lba_size: 512,
        metadata_size: 0,
        lbaf: Vec::new(),
    };
    (TcpBlockQueue::new(q, &ns, depth as usize, 4096), t)
}

#[test]
fn poll_never_returns_more_than_max() {
    let registry = UbRegistry::new(DmaDomain::host_only());
    let pool = UbPool::with_anonymous(
        &registry,
        PoolConfig {
            block_size: 4096,
            block_count: 8,
        },
        None,
    )
    .unwrap();
    let (mut q, mut t) = pair(8);
    for tag in 0..8u64 {
        q.submit_read(pool.get().unwrap(), tag * 512, 512, tag)
            .map_err(|(_, e)| e)
            .unwrap();
    }
    // The first poll sends the 8 capsules; the target reads them and answers all 8 at once.
    let mut got = Vec::new();
    q.poll(8, &mut |c| got.push(c.tag)).unwrap();
    let mut caps = [0u8; 8 * CMD_HLEN];
    t.read_exact(&mut caps).unwrap();
    let mut answer = Vec::new();
    for cap in caps.chunks_exact(CMD_HLEN) {
        let cid = u16::from_le_bytes([cap[10], cap[11]]);
        answer.extend(c2h_success(cid, &[cid as u8; 512]));
    }
    t.write_all(&answer).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    // Everything is in the socket now: each poll hands back at most `max`.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut sizes = Vec::new();
    while got.len() < 8 && Instant::now() < deadline {
        let mut k = 0;
        let n = q
            .poll(3, &mut |c| {
                k += 1;
                assert!(c.result.is_ok());
                got.push(c.tag)
            })
            .unwrap();
        assert_eq!(n, k);
        assert!(n <= 3, "poll(3) returned {n} completions");
        if n > 0 {
            sizes.push(n);
        }
    }
    assert_eq!(sizes, vec![3, 3, 2]);
    got.sort();
    assert_eq!(got, (0..8).collect::<Vec<_>>());
    assert_eq!(q.in_flight(), 0);
}
