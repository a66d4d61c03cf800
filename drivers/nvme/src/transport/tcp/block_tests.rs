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
use super::test_pdus::c2h_success;
use crate::info::NamespaceInfo;

const NEG: Negotiated = Negotiated {
    hdgst: false,
    ddgst: false,
    cpda: 0,
    maxh2cdata: 4096,
};

/// An initiator queue of `depth` over loopback, and the target's end of the connection.
/// A host-only pool of two 4 KiB blocks.
fn two_page_pool(registry: &std::sync::Arc<UbRegistry>) -> std::sync::Arc<UbPool> {
    UbPool::with_anonymous(
        registry,
        PoolConfig {
            block_size: 4096,
            block_count: 2,
        },
        None,
    )
    .unwrap()
}

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
        protection_type: 0,
        command_set: crate::CommandSet::Nvm,
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

#[test]
fn an_empty_poll_waits_for_the_socket_and_wakes_when_data_arrives() {
    let registry = UbRegistry::new(DmaDomain::host_only());
    let pool = two_page_pool(&registry);
    let (mut q, mut t) = pair(2);
    q.set_idle_wait(Duration::from_millis(200));
    q.submit_read(pool.get().unwrap(), 0, 512, 7)
        .map_err(|(_, e)| e)
        .unwrap();
    // The first poll sends the capsule; nothing answers: it waits, then returns empty.
    let t0 = Instant::now();
    assert_eq!(q.poll(8, &mut |_| panic!("no answer yet")).unwrap(), 0);
    let waited = t0.elapsed();
    assert_eq!(q.idle_waits(), 1);
    // poll(2) sleeps at least its timeout when nothing arrives.
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
    let mut cap = [0u8; CMD_HLEN];
    t.read_exact(&mut cap).unwrap();
    let cid = u16::from_le_bytes([cap[10], cap[11]]);
    // The answer comes 50 ms into the next wait: that poll returns it, well before 10 s.
    q.set_idle_wait(Duration::from_secs(10));
    let answer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        t.write_all(&c2h_success(cid, &[9; 512])).unwrap();
        t
    });
    let t0 = Instant::now();
    let mut got = Vec::new();
    assert_eq!(q.poll(8, &mut |c| got.push(c.tag)).unwrap(), 1);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(got, vec![7]);
    assert_eq!(q.idle_waits(), 2);
    let _t = answer.join().unwrap();
    // Nothing in flight: an empty poll returns at once, without waiting.
    assert_eq!(q.poll(8, &mut |_| {}).unwrap(), 0);
    assert_eq!(q.idle_waits(), 2);
}

#[test]
fn an_empty_poll_spins_up_to_the_idle_spin_before_it_waits() {
    let registry = UbRegistry::new(DmaDomain::host_only());
    let pool = two_page_pool(&registry);
    let (mut q, mut t) = pair(2);
    q.set_idle_spin(Duration::from_millis(30));
    q.set_idle_wait(Duration::from_millis(100));
    q.submit_read(pool.get().unwrap(), 0, 512, 7)
        .map_err(|(_, e)| e)
        .unwrap();
    // Nothing answers: the poll spins its 30 ms, then waits its 100 ms, and returns empty.
    let t0 = Instant::now();
    assert_eq!(q.poll(8, &mut |_| panic!("no answer yet")).unwrap(), 0);
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(130), "{took:?}");
    assert_eq!((q.spin_hits(), q.idle_waits()), (0, 1));
    let mut cap = [0u8; CMD_HLEN];
    t.read_exact(&mut cap).unwrap();
    let cid = u16::from_le_bytes([cap[10], cap[11]]);
    // An answer arriving while it spins is taken there: no wait in poll(2).
    q.set_idle_spin(Duration::from_secs(10));
    let answer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        t.write_all(&c2h_success(cid, &[9; 512])).unwrap();
        t
    });
    let mut got = Vec::new();
    assert_eq!(q.poll(8, &mut |c| got.push(c.tag)).unwrap(), 1);
    assert_eq!(got, vec![7]);
    assert_eq!((q.spin_hits(), q.idle_waits()), (1, 1));
    let _t = answer.join().unwrap();
}

#[test]
fn a_block_of_a_file_region_is_refused_for_reads_and_writes() {
    let path = std::env::temp_dir().join(format!("ubd-tcp-file-{}", std::process::id()));
    std::fs::write(&path, vec![0x5au8; 4096]).unwrap();
    let registry = UbRegistry::new(DmaDomain::host_only());
    let region = registry
        .register_file(&std::fs::File::open(&path).unwrap(), 0, 4096)
        .unwrap();
    let cfg = PoolConfig {
        block_size: 4096,
        block_count: 1,
    };
    let pool = UbPool::new(&registry, region, cfg).unwrap();
    let (mut q, _t) = pair(4);
    let (b, e) = q.submit_write(pool.get().unwrap(), 0, 512, 0).unwrap_err();
    assert!(e.to_string().contains("read-only UB file region"), "{e}");
    let (_b, e) = q.submit_read(b, 0, 512, 1).unwrap_err();
    assert!(e.to_string().contains("read-only UB file region"), "{e}");
    assert!(std::fs::read(&path).unwrap() == vec![0x5au8; 4096]);
    let _ = std::fs::remove_file(&path);
}
