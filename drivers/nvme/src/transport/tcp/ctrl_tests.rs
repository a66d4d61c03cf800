//! Tests of [`super::ctrl::TcpController`]'s bring-up against a fake target on loopback: it
//! runs the controller logic shared with PCIe ([`crate::controller::transport`]), so its
//! faults are the very errors a local controller gives.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::addr::TcpTarget;
use super::ctrl::{TcpController, TcpOptions};
use super::fabrics;
use super::host::HostIdentity;
use super::queue::{TcpCommand, TcpQueue};
use super::test_pdus::{c2h_success, resp_with as resp};
use super::TcpError;
use crate::error::NvmeError;
use crate::spec::regs::Cc;

/// CAP: MQES 127, TO 1 (500 ms), CSS bit 0 (NVM).
const CAP: u64 = 127 | (1 << 24) | (1 << 37);

/// What the fake target saw.
#[derive(Debug, Default)]
struct Seen {
    /// CC values written (Property Set).
    cc: Vec<u32>,
    /// Set Features Number of Queues CDW11s.
    set_features: Vec<u32>,
    /// Connects: (QID, SQSIZE as sent, 0-based).
    connects: Vec<(u16, u16)>,
}

/// One connection of a fake target whose CSTS always reads `csts` and that grants `granted`
/// I/O queues; records what it saw.
fn serve(mut t: TcpStream, csts: u32, granted: u16, seen: Arc<Mutex<Seen>>) {
    t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut ic = [0u8; 128];
    if t.read_exact(&mut ic).is_err() {
        return;
    }
    let mut icresp = [0u8; 128];
    icresp[0] = 1;
    icresp[2] = 128;
    icresp[4] = 128;
    icresp[12..16].copy_from_slice(&4096u32.to_le_bytes());
    t.write_all(&icresp).unwrap();
    loop {
        let mut ch = [0u8; 8];
        if t.read_exact(&mut ch).is_err() {
            return;
        }
        let plen = u32::from_le_bytes(ch[4..8].try_into().unwrap()) as usize;
        let mut rest = vec![0u8; plen - 8];
        if t.read_exact(&mut rest).is_err() {
            return;
        }
        assert_eq!(ch[0], 4, "a command capsule");
        let sqe = &rest[..64];
        let cid = u16::from_le_bytes([sqe[2], sqe[3]]);
        let dw = |i: usize| u32::from_le_bytes(sqe[4 * i..4 * i + 4].try_into().unwrap());
        let out = match (sqe[0], sqe[4]) {
            (0x7f, 0x01) => {
                let qid = (dw(10) >> 16) as u16;
                seen.lock().unwrap().connects.push((qid, dw(11) as u16));
                resp(cid, 1)
            }
            (0x7f, 0x04) if dw(11) == 0x00 => resp(cid, CAP),
            (0x7f, 0x04) if dw(11) == 0x1c => resp(cid, csts as u64),
            (0x7f, 0x00) => {
                seen.lock().unwrap().cc.push(dw(12));
                resp(cid, 0)
            }
            // Keep Alive.
            (0x18, _) => resp(cid, 0),
            // A Read: this target has dropped the controller (as a target does once its
            // keep-alive timeout passed): the connection closes.
            (0x02, _) => return,
            (0x09, _) if dw(10) == 0x07 => {
                seen.lock().unwrap().set_features.push(dw(11));
                let n = granted as u64 - 1;
                resp(cid, n << 16 | n)
            }
            (0x06, _) => {
                let mut page = vec![0u8; 4096];
                page[24..35].copy_from_slice(b"fake-target");
                page[1792..1796].copy_from_slice(&4u32.to_le_bytes());
                c2h_success(cid, &page)
            }
            other => panic!("unexpected command {other:?}"),
        };
        t.write_all(&out).unwrap();
    }
}

fn connect(csts: u32) -> (Result<TcpController, TcpError>, Vec<u32>, Duration) {
    let (r, seen, took) = connect_granting(csts, 4);
    let cc = seen.lock().unwrap().cc.clone();
    (r, cc, took)
}

/// Connect to a fake target (every connection served) granting `granted` I/O queues.
fn connect_granting(
    csts: u32,
    granted: u16,
) -> (Result<TcpController, TcpError>, Arc<Mutex<Seen>>, Duration) {
    connect_with(csts, granted, &TcpOptions::default())
}

/// [`connect_granting`] with options `opts`.
fn connect_with(
    csts: u32,
    granted: u16,
    opts: &TcpOptions,
) -> (Result<TcpController, TcpError>, Arc<Mutex<Seen>>, Duration) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for t in l.incoming() {
            let Ok(t) = t else { return };
            let log = log.clone();
            std::thread::spawn(move || serve(t, csts, granted, log));
        }
    });
    let target = TcpTarget {
        addr,
        subnqn: "nqn.2026-11.io.ubdirect:fake".into(),
        nsid: None,
    };
    let host = HostIdentity {
        nqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001".into(),
        id: [1; 16],
        source: "test",
    };
    let t0 = Instant::now();
    let r = TcpController::connect(&target, &host, opts);
    let took = t0.elapsed();
    (r, seen, took)
}

#[test]
fn tcp_bring_up_runs_the_shared_controller_logic() {
    let (r, cc, _) = connect(1);
    let c = r.unwrap();
    assert_eq!(c.info().mn, "fake-target");
    assert_eq!(c.cap().0, CAP);
    // The CC the shared enable writes on every transport.
    assert_eq!(cc, vec![Cc::enabled(0, 6, 4).0]);
}

#[test]
fn a_fabrics_controller_that_never_gets_ready_is_the_pcie_ready_timeout() {
    let (r, cc, took) = connect(0);
    let e = r.unwrap_err();
    assert!(
        matches!(
            e,
            TcpError::Controller(NvmeError::ReadyTimeout {
                ready: true,
                csts: 0,
                ..
            })
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("within CAP.TO = 500ms"), "{e}");
    assert_eq!(cc.len(), 1);
    // CAP.TO 500 ms; measured ~0.5 s; 3x on a loaded machine.
    assert!(took < Duration::from_millis(1500), "{took:?}");
}

#[test]
fn a_fabrics_controller_reporting_cfs_is_the_pcie_controller_fatal() {
    let (r, _, _) = connect(2);
    let e = r.unwrap_err();
    assert!(
        matches!(
            e,
            TcpError::Controller(NvmeError::ControllerFatal {
                csts: 2,
                during: "enabling the controller"
            })
        ),
        "{e:?}"
    );
}

/// The same limits as a PCIe controller's (`model_api::io_queues_take_the_granted_ids_and_entries_within_cap_mqes`):
/// ids 1..=granted (Set Features, Number of Queues), lowest free first, given back on drop;
/// entries = depth + 1 within CAP.MQES + 1; one queue too many is `NoQueuesLeft`.
#[test]
fn io_queues_take_the_granted_ids_and_entries_within_cap_mqes_as_on_pcie() {
    let (r, seen, _) = connect_granting(1, 2);
    let c = r.unwrap();
    assert_eq!(c.io_queues_granted(), 2);
    let a = c.io_queue::<Vec<u8>>(32).unwrap();
    let b = c.io_queue::<Vec<u8>>(1000).unwrap();
    assert_eq!((a.qid(), a.free_slots()), (1, 32));
    // CAP.MQES 127: 128 entries, one kept free.
    assert_eq!((b.qid(), b.free_slots()), (2, 127));
    assert_eq!(c.io_queues_in_use(), 2);
    let e = c.io_queue::<Vec<u8>>(8).unwrap_err();
    assert!(
        matches!(
            e,
            TcpError::Controller(NvmeError::NoQueuesLeft { granted: 2 })
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("drop one first"), "{e}");
    let e = c.io_queue::<Vec<u8>>(0).unwrap_err();
    assert!(
        matches!(e, TcpError::Controller(NvmeError::InvalidArgument(_))),
        "{e:?}"
    );
    drop(a);
    assert_eq!(c.io_queues_in_use(), 1);
    let again = c.io_queue::<Vec<u8>>(8).unwrap();
    assert_eq!(again.qid(), 1);
    let seen = seen.lock().unwrap();
    // 16 queues asked for (0-based in both halves).
    assert_eq!(seen.set_features, vec![15 << 16 | 15]);
    // The admin queue's 32 entries, then each I/O queue's entries, 0-based.
    assert_eq!(seen.connects, vec![(0, 31), (1, 32), (2, 127), (1, 8)]);
}

/// Read block 0 on `q`: the error.
fn read_fails(q: &mut TcpQueue<Vec<u8>>) -> TcpError {
    q.run(
        TcpCommand::new(fabrics::rw(false, 1, 0, 1), "Read")
            .read(0, 512)
            .buf(vec![0u8; 512]),
        Duration::from_secs(5),
    )
    .unwrap_err()
}

#[test]
fn an_io_queue_whose_controller_missed_its_keep_alives_says_keep_alive_expired() {
    let o = TcpOptions {
        kato_ms: 100,
        ..TcpOptions::default()
    };
    let (r, _, _) = connect_with(1, 4, &o);
    let c = r.unwrap();
    let mut q = c.io_queue::<Vec<u8>>(4).unwrap();
    // Nobody polls the admin queue: no Keep Alive for 3 KATOs; then the target closes the
    // I/O queue's connection.
    std::thread::sleep(Duration::from_millis(300));
    let e = read_fails(&mut q);
    assert!(
        matches!(e, TcpError::KeepAliveExpired { idle, kato }
            if kato == Duration::from_millis(100) && idle >= Duration::from_millis(300)),
        "{e:?}"
    );
    assert!(e.to_string().contains("poll the admin queue"), "{e}");
}

#[test]
fn an_io_queue_closed_while_keep_alives_are_answered_is_just_closed() {
    let o = TcpOptions {
        kato_ms: 1000,
        ..TcpOptions::default()
    };
    let (r, _, _) = connect_with(1, 4, &o);
    let c = r.unwrap();
    let mut q = c.io_queue::<Vec<u8>>(4).unwrap();
    // Keep Alives flow (every KATO/2; the blocking one as well), then the target closes.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(700) {
        c.poll_admin().unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    c.keep_alive().unwrap();
    let e = read_fails(&mut q);
    assert!(matches!(e, TcpError::Closed { .. }), "{e:?}");
}
