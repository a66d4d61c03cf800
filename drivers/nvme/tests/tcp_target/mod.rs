//! A fake NVMe/TCP target on loopback with a real medium: enough of the protocol for a
//! [`TcpController`] to connect and for I/O queues to read, write (in-capsule data and
//! R2T + H2CData), flush, write zeroes and deallocate. One thread per connection.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ubdirect_nvme::transport::tcp::addr::TcpTarget;
use ubdirect_nvme::transport::tcp::ctrl::{TcpController, TcpOptions};
use ubdirect_nvme::transport::tcp::host::HostIdentity;

/// CAP: MQES 127, TO 1 (500 ms), CSS bit 0 (NVM).
const CAP: u64 = 127 | (1 << 24) | (1 << 37);
/// Bytes per logical block of the one namespace.
pub const LBA: usize = 4096;
/// Blocks of the namespace.
pub const BLOCKS: u64 = 256;
/// Largest H2CData PDU the target takes (ICResp MAXH2CDATA).
const MAXH2CDATA: u32 = 8192;

/// The target's medium, shared by every connection.
pub type Medium = Arc<Mutex<Vec<u8>>>;

/// Start a target and connect a controller to it; the medium starts filled with 0x11.
pub fn connect() -> (TcpController, Medium) {
    let medium: Medium = Arc::new(Mutex::new(vec![0x11; LBA * BLOCKS as usize]));
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let m = medium.clone();
    std::thread::spawn(move || {
        for t in l.incoming() {
            let Ok(t) = t else { return };
            let m = m.clone();
            std::thread::spawn(move || Conn { t, m, qid: None }.serve());
        }
    });
    let target = TcpTarget {
        addr,
        subnqn: "nqn.2026-11.io.ubdirect:medium".into(),
        nsid: None,
    };
    let host = HostIdentity {
        nqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000002".into(),
        id: [2; 16],
        source: "test",
    };
    let ctrl = TcpController::connect(&target, &host, &TcpOptions::default()).unwrap();
    (ctrl, medium)
}

fn capsule_resp(cid: u16, result: u64, status: u16) -> Vec<u8> {
    let mut v = vec![5, 0, 24, 0, 24, 0, 0, 0];
    v.extend_from_slice(&result.to_le_bytes());
    v.extend_from_slice(&[0; 4]);
    v.extend_from_slice(&cid.to_le_bytes());
    v.extend_from_slice(&(status << 1).to_le_bytes());
    v
}

fn c2h(cid: u16, data: &[u8]) -> Vec<u8> {
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

fn r2t(cid: u16, len: u32) -> Vec<u8> {
    let mut v = vec![9, 0, 24, 0];
    v.extend_from_slice(&24u32.to_le_bytes());
    v.extend_from_slice(&cid.to_le_bytes());
    v.extend_from_slice(&cid.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(&[0; 4]);
    v
}

fn identify_controller() -> Vec<u8> {
    let mut page = vec![0u8; 4096];
    page[24..38].copy_from_slice(b"medium-target ");
    page[516..520].copy_from_slice(&1u32.to_le_bytes()); // NN
    page[1792..1796].copy_from_slice(&(4u32 + 4096 / 16).to_le_bytes()); // IOCCSZ: 4 KiB in capsule
    page
}

fn identify_namespace() -> Vec<u8> {
    let mut page = vec![0u8; 4096];
    for at in [0, 8, 16] {
        page[at..at + 8].copy_from_slice(&BLOCKS.to_le_bytes());
    }
    page[130] = LBA.trailing_zeros() as u8; // LBAF0.LBADS
    page
}

struct Conn {
    t: TcpStream,
    m: Medium,
    /// The queue this connection joined (Fabrics Connect).
    qid: Option<u16>,
}

/// Generic command status: Invalid Command Opcode.
const INVALID_OPCODE: u16 = 0x01;

impl Conn {
    fn serve(mut self) {
        self.t
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut ic = [0u8; 128];
        if self.t.read_exact(&mut ic).is_err() {
            return;
        }
        let mut icresp = [0u8; 128];
        icresp[0] = 1;
        icresp[2] = 128;
        icresp[4] = 128;
        icresp[12..16].copy_from_slice(&MAXH2CDATA.to_le_bytes());
        self.t.write_all(&icresp).unwrap();
        while let Some((sqe, data)) = self.read_capsule() {
            let out = self.answer(&sqe, data);
            if self.t.write_all(&out).is_err() {
                return;
            }
        }
    }

    /// The next command capsule: its SQE and in-capsule data.
    fn read_capsule(&mut self) -> Option<([u8; 64], Vec<u8>)> {
        let (ch, rest) = self.read_pdu()?;
        assert_eq!(ch[0], 4, "a command capsule");
        let mut sqe = [0u8; 64];
        sqe.copy_from_slice(&rest[..64]);
        Some((sqe, rest[64..].to_vec()))
    }

    fn read_pdu(&mut self) -> Option<([u8; 8], Vec<u8>)> {
        let mut ch = [0u8; 8];
        self.t.read_exact(&mut ch).ok()?;
        let plen = u32::from_le_bytes(ch[4..8].try_into().unwrap()) as usize;
        let mut rest = vec![0u8; plen - 8];
        self.t.read_exact(&mut rest).ok()?;
        Some((ch, rest))
    }

    /// The data of a write sent without in-capsule data: R2T, then H2CData PDUs.
    fn pull(&mut self, cid: u16, len: usize) -> Vec<u8> {
        self.t.write_all(&r2t(cid, len as u32)).unwrap();
        let mut data = vec![0u8; len];
        let mut got = 0;
        while got < len {
            let (ch, rest) = self.read_pdu().expect("H2CData");
            assert_eq!(ch[0], 6, "H2CData");
            // After the common header: CCCID, TTAG, DATAO, DATAL, reserved; data at PDO.
            let off = u32::from_le_bytes(rest[4..8].try_into().unwrap()) as usize;
            let n = u32::from_le_bytes(rest[8..12].try_into().unwrap()) as usize;
            let pdo = ch[3] as usize - 8;
            data[off..off + n].copy_from_slice(&rest[pdo..pdo + n]);
            got += n;
        }
        data
    }

    fn answer(&mut self, sqe: &[u8; 64], data: Vec<u8>) -> Vec<u8> {
        let cid = u16::from_le_bytes([sqe[2], sqe[3]]);
        let dw = |i: usize| u32::from_le_bytes(sqe[4 * i..4 * i + 4].try_into().unwrap());
        if sqe[0] == 0x7f {
            return match sqe[4] {
                0x01 => {
                    self.qid = Some((dw(10) >> 16) as u16);
                    capsule_resp(cid, 1, 0)
                }
                0x04 if dw(11) == 0x00 => capsule_resp(cid, CAP, 0),
                0x04 if dw(11) == 0x1c => capsule_resp(cid, 1, 0),
                _ => capsule_resp(cid, 0, 0),
            };
        }
        if self.qid == Some(0) {
            return match sqe[0] {
                0x18 => capsule_resp(cid, 0, 0),
                0x09 => capsule_resp(cid, 3 << 16 | 3, 0),
                0x06 if dw(10) & 0xff == 1 => c2h(cid, &identify_controller()),
                0x06 if dw(10) & 0xff == 0 => c2h(cid, &identify_namespace()),
                _ => capsule_resp(cid, 0, INVALID_OPCODE),
            };
        }
        self.io(
            sqe[0],
            cid,
            dw(10) as u64 | (dw(11) as u64) << 32,
            (dw(12) & 0xffff) as usize + 1,
            data,
        )
    }

    /// Flush, Write, Read, Write Zeroes, Dataset Management against the medium.
    fn io(&mut self, opcode: u8, cid: u16, slba: u64, nlb: usize, data: Vec<u8>) -> Vec<u8> {
        let range = |slba: u64, nlb: usize| {
            let at = slba as usize * LBA;
            at..at + nlb * LBA
        };
        match opcode {
            0x00 => capsule_resp(cid, 0, 0),
            0x01 => {
                let len = nlb * LBA;
                let data = if data.is_empty() {
                    self.pull(cid, len)
                } else {
                    data
                };
                self.m.lock().unwrap()[range(slba, nlb)].copy_from_slice(&data[..len]);
                capsule_resp(cid, 0, 0)
            }
            0x02 => c2h(cid, &self.m.lock().unwrap()[range(slba, nlb)]),
            0x08 => {
                self.m.lock().unwrap()[range(slba, nlb)].fill(0);
                capsule_resp(cid, 0, 0)
            }
            0x09 => {
                let data = if data.is_empty() {
                    self.pull(cid, 16)
                } else {
                    data
                };
                let n = u32::from_le_bytes(data[4..8].try_into().unwrap()) as usize;
                let at = u64::from_le_bytes(data[8..16].try_into().unwrap());
                self.m.lock().unwrap()[range(at, n)].fill(0);
                capsule_resp(cid, 0, 0)
            }
            _ => capsule_resp(cid, 0, INVALID_OPCODE),
        }
    }
}
