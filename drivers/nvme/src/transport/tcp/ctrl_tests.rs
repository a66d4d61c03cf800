//! Tests of [`super::ctrl::TcpController`]'s bring-up against a fake target on loopback: it
//! runs the controller logic shared with PCIe ([`crate::controller::transport`]), so its
//! faults are the very errors a local controller gives.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::addr::TcpTarget;
use super::ctrl::{TcpController, TcpOptions};
use super::host::HostIdentity;
use super::test_pdus::{c2h_success, resp_with as resp};
use super::TcpError;
use crate::error::NvmeError;
use crate::spec::regs::Cc;

/// CAP: MQES 127, TO 1 (500 ms), CSS bit 0 (NVM).
const CAP: u64 = 127 | (1 << 24) | (1 << 37);

/// One connection of a fake target whose CSTS always reads `csts`; records the CC values
/// written (Property Set).
fn serve(mut t: TcpStream, csts: u32, cc: Arc<Mutex<Vec<u32>>>) {
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
            (0x7f, 0x01) => resp(cid, 1),
            (0x7f, 0x04) if dw(11) == 0x00 => resp(cid, CAP),
            (0x7f, 0x04) if dw(11) == 0x1c => resp(cid, csts as u64),
            (0x7f, 0x00) => {
                cc.lock().unwrap().push(dw(12));
                resp(cid, 0)
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
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let cc = Arc::new(Mutex::new(Vec::new()));
    let seen = cc.clone();
    let srv = std::thread::spawn(move || {
        let (t, _) = l.accept().unwrap();
        serve(t, csts, seen);
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
    let r = TcpController::connect(&target, &host, &TcpOptions::default());
    let took = t0.elapsed();
    if r.is_err() {
        // The initiator closed its connection: the target's thread ends.
        srv.join().unwrap();
    }
    let cc = cc.lock().unwrap().clone();
    (r, cc, took)
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
