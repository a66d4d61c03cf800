//! Fabrics commands (NVMe over Fabrics 1.1, chapter 3 and 6): Connect with its data, Property
//! Get / Set, Keep Alive, and the Discovery log page, plus the SGL data pointers NVMe/TCP uses.

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::spec::Sqe;

/// Opcode of every Fabrics command.
pub const FABRICS_OPCODE: u8 = 0x7f;
/// Keep Alive (admin opcode).
pub const KEEP_ALIVE_OPCODE: u8 = 0x18;
/// Discovery log page identifier.
pub const DISCOVERY_LOG_ID: u8 = 0x70;
/// Controller ID asking the target for a dynamic admin controller.
pub const CNTLID_DYNAMIC: u16 = 0xffff;
/// The well-known NQN of discovery controllers.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Longest NQN (bytes, without the terminating NUL).
pub const NQN_MAX: usize = 223;
/// In-capsule data the admin queue of an NVMe/TCP controller accepts (8 KiB, as Linux).
pub const ADMIN_ICDATA: usize = 8192;

/// Fabrics command types (FCTYPE, SQE byte 4).
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
}

/// Controller properties (register offsets of the PCIe BAR0 map).
pub mod property {
    /// Controller Capabilities (8 bytes).
    pub const CAP: u32 = 0x00;
    /// Version (4 bytes).
    pub const VS: u32 = 0x08;
    /// Controller Configuration (4 bytes).
    pub const CC: u32 = 0x14;
    /// Controller Status (4 bytes).
    pub const CSTS: u32 = 0x1c;
}

/// PSDT = 01b in CDW0: the data pointer is an SGL (fabrics commands always use SGLs).
pub const PSDT_SGL: u32 = 1 << 14;
/// SGL descriptor type byte: Data Block, subtype Offset (in-capsule data).
pub const SGL_INCAPSULE: u8 = 0x01;
/// SGL descriptor type byte: Transport Data Block, subtype Transport Specific (data moved by
/// C2HData / R2T + H2CData).
pub const SGL_TRANSPORT: u8 = 0x5a;

/// The name of a Connect command's status (the command-specific codes are Connect's own).
pub fn connect_status_name(sct: u8, sc: u8) -> &'static str {
    match (sct, sc) {
        (0, 0) => "Successful Completion",
        (1, 0x80) => "Connect Incompatible Format",
        (1, 0x81) => "Connect Controller Busy",
        (1, 0x82) => "Connect Invalid Parameters",
        (1, 0x83) => "Connect Restart Discovery",
        (1, 0x84) => "Connect Invalid Host",
        (0, 0x02) => "Invalid Field in Command",
        _ => "Connect failed",
    }
}

/// A Read (`write` false) or Write of `nlb` blocks from `slba` of namespace `nsid`.
pub fn rw(write: bool, nsid: u32, slba: u64, nlb: u32) -> Sqe {
    use crate::spec::command::io_opcode;
    let mut s = Sqe::new(if write {
        io_opcode::WRITE
    } else {
        io_opcode::READ
    });
    s.nsid = nsid;
    s.set_slba(slba);
    s.cdw12 = nlb.saturating_sub(1) & 0xffff;
    s
}

/// Set the SQE's data pointer to one SGL descriptor.
pub fn set_sgl(sqe: &mut Sqe, sgl_type: u8, addr: u64, len: u32) {
    sqe.cdw0 |= PSDT_SGL;
    sqe.prp1 = addr;
    sqe.prp2 = len as u64 | ((sgl_type as u64) << 56);
}

/// The data length an SQE's SGL descriptor names.
pub fn sgl_len(sqe: &Sqe) -> u32 {
    sqe.prp2 as u32
}

/// A Fabrics Connect command for queue `qid` of `sqsize` entries (1's based; sent 0's based),
/// with the keep-alive timeout in milliseconds (admin queue only, else 0).
pub fn connect(qid: u16, sqsize: u16, kato_ms: u32) -> Sqe {
    let mut s = Sqe::new(FABRICS_OPCODE);
    s.nsid = fctype::CONNECT as u32;
    // RECFMT 0 (bits 15:0), QID (bits 31:16).
    s.cdw10 = (qid as u32) << 16;
    // SQSIZE 0's based (bits 15:0), CATTR 0.
    s.cdw11 = sqsize.saturating_sub(1) as u32;
    s.cdw12 = kato_ms;
    set_sgl(
        &mut s,
        SGL_INCAPSULE,
        0,
        std::mem::size_of::<ConnectData>() as u32,
    );
    s
}

/// A Property Get of `offset` (8 bytes wide for CAP, else 4).
pub fn property_get(offset: u32) -> Sqe {
    let mut s = Sqe::new(FABRICS_OPCODE);
    s.nsid = fctype::PROPERTY_GET as u32;
    s.cdw10 = (offset == property::CAP) as u32;
    s.cdw11 = offset;
    s
}

/// A 4-byte Property Set of `offset` to `value`.
pub fn property_set(offset: u32, value: u32) -> Sqe {
    let mut s = Sqe::new(FABRICS_OPCODE);
    s.nsid = fctype::PROPERTY_SET as u32;
    s.cdw10 = 0;
    s.cdw11 = offset;
    s.cdw12 = value;
    s
}

/// A Keep Alive command.
pub fn keep_alive() -> Sqe {
    Sqe::new(KEEP_ALIVE_OPCODE)
}

/// Get Log Page of the discovery log, `len` bytes (a multiple of 4) from byte `offset`.
pub fn discovery_log(len: u32, offset: u64) -> Sqe {
    let mut s = Sqe::new(crate::spec::command::admin_opcode::GET_LOG_PAGE);
    let numd = len / 4 - 1;
    s.cdw10 = DISCOVERY_LOG_ID as u32 | ((numd & 0xffff) << 16);
    s.cdw11 = numd >> 16;
    s.cdw12 = offset as u32;
    s.cdw13 = (offset >> 32) as u32;
    s
}

/// The data of a Connect command (1,024 bytes).
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct ConnectData {
    /// Host identifier (a UUID).
    pub hostid: [u8; 16],
    /// Controller ID: [`CNTLID_DYNAMIC`] for the admin queue, the admin queue's for I/O queues.
    pub cntlid: u16,
    /// Reserved.
    pub rsvd: [u8; 238],
    /// Subsystem NQN, NUL-terminated.
    pub subnqn: [u8; 256],
    /// Host NQN, NUL-terminated.
    pub hostnqn: [u8; 256],
    /// Reserved.
    pub rsvd2: [u8; 256],
}

const _: () = assert!(std::mem::size_of::<ConnectData>() == 1024);

/// Why an NQN cannot be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NqnError {
    /// Empty.
    Empty,
    /// Longer than 223 bytes.
    TooLong,
    /// Contains a NUL or a non-printable / non-ASCII byte.
    BadByte,
}

impl std::fmt::Display for NqnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NqnError::Empty => "it is empty",
            NqnError::TooLong => "it is longer than 223 bytes",
            NqnError::BadByte => "it has a byte that is not printable ASCII",
        })
    }
}

/// Check an NQN the way a target will: 1 to 223 printable ASCII bytes.
pub fn check_nqn(nqn: &str) -> Result<(), NqnError> {
    if nqn.is_empty() {
        return Err(NqnError::Empty);
    }
    if nqn.len() > NQN_MAX {
        return Err(NqnError::TooLong);
    }
    if !nqn.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(NqnError::BadByte);
    }
    Ok(())
}

impl ConnectData {
    /// Connect data for `subnqn` from host `hostnqn` / `hostid`, asking for controller `cntlid`.
    pub fn new(
        hostid: [u8; 16],
        cntlid: u16,
        subnqn: &str,
        hostnqn: &str,
    ) -> Result<ConnectData, NqnError> {
        check_nqn(subnqn)?;
        check_nqn(hostnqn)?;
        let mut d = ConnectData::new_zeroed();
        d.hostid = hostid;
        d.cntlid = cntlid;
        d.subnqn[..subnqn.len()].copy_from_slice(subnqn.as_bytes());
        d.hostnqn[..hostnqn.len()].copy_from_slice(hostnqn.as_bytes());
        Ok(d)
    }
}

/// Discovery log page header (1,024 bytes).
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct DiscoveryLogHeader {
    /// Generation counter: changes when the log changes.
    pub genctr: u64,
    /// Number of records.
    pub numrec: u64,
    /// Record format (0).
    pub recfmt: u16,
    /// Reserved.
    pub rsvd: [u8; 1006],
}

/// One discovery log entry (1,024 bytes).
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct DiscoveryLogEntry {
    /// Transport type (3 = TCP, 1 = RDMA, 2 = FC, 254 = loop).
    pub trtype: u8,
    /// Address family (1 = IPv4, 2 = IPv6).
    pub adrfam: u8,
    /// Subsystem type (1 = referral, 2 = NVM subsystem, 3 = current discovery subsystem).
    pub subtype: u8,
    /// Transport requirements.
    pub treq: u8,
    /// Port ID.
    pub portid: u16,
    /// Controller ID (0xffff: dynamic).
    pub cntlid: u16,
    /// Admin max SQ size.
    pub asqsz: u16,
    /// Entry flags.
    pub eflags: u16,
    /// Reserved.
    pub rsvd: [u8; 20],
    /// Transport service identifier (the port, as text).
    pub trsvcid: [u8; 32],
    /// Reserved.
    pub rsvd2: [u8; 192],
    /// Subsystem NQN.
    pub subnqn: [u8; 256],
    /// Transport address (the IP address, as text).
    pub traddr: [u8; 256],
    /// Transport specific address subtype.
    pub tsas: [u8; 256],
}

const _: () = assert!(std::mem::size_of::<DiscoveryLogHeader>() == 1024);
const _: () = assert!(std::mem::size_of::<DiscoveryLogEntry>() == 1024);

/// One subsystem a discovery controller lists, decoded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DiscoveryRecord {
    /// Transport ("tcp", "rdma", "fc", "loop" or the number).
    pub transport: String,
    /// Address family ("ipv4", "ipv6", ...).
    pub family: String,
    /// "nvme", "discovery", "current discovery" or the number.
    pub subtype: String,
    /// Port ID.
    pub portid: u16,
    /// Transport address.
    pub traddr: String,
    /// Transport service ID (port).
    pub trsvcid: String,
    /// Subsystem NQN.
    pub subnqn: String,
}

/// Text of a fixed, NUL- or space-padded field; non-printable bytes become '?'.
pub fn field_text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    b[..end]
        .iter()
        .map(|&c| {
            if c.is_ascii_graphic() || c == b' ' {
                c as char
            } else {
                '?'
            }
        })
        .collect::<String>()
        .trim_end()
        .to_string()
}

impl DiscoveryRecord {
    /// Decode an entry (every byte pattern decodes; unknown codes are shown as numbers).
    pub fn from_entry(e: &DiscoveryLogEntry) -> DiscoveryRecord {
        DiscoveryRecord {
            transport: match e.trtype {
                1 => "rdma".into(),
                2 => "fc".into(),
                3 => "tcp".into(),
                254 => "loop".into(),
                n => format!("trtype {n}"),
            },
            family: match e.adrfam {
                1 => "ipv4".into(),
                2 => "ipv6".into(),
                3 => "ib".into(),
                4 => "fc".into(),
                254 => "loop".into(),
                n => format!("adrfam {n}"),
            },
            subtype: match e.subtype {
                1 => "discovery".into(),
                2 => "nvme".into(),
                3 => "current discovery".into(),
                n => format!("subtype {n}"),
            },
            portid: e.portid,
            traddr: field_text(&e.traddr),
            trsvcid: field_text(&e.trsvcid),
            subnqn: field_text(&e.subnqn),
        }
    }
}

/// Why a discovery log page is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryLogError {
    /// Shorter than its header.
    Short,
    /// RECFMT is not 0.
    RecordFormat(u16),
}

/// Decode a discovery log page read in full: at most `numrec` entries, and only those the page
/// holds (a NUMREC larger than the page is clamped, never trusted for an allocation).
pub fn parse_discovery_log(
    page: &[u8],
) -> Result<(u64, u64, Vec<DiscoveryRecord>), DiscoveryLogError> {
    let (hdr, rest) =
        DiscoveryLogHeader::ref_from_prefix(page).map_err(|_| DiscoveryLogError::Short)?;
    if hdr.recfmt != 0 {
        return Err(DiscoveryLogError::RecordFormat(hdr.recfmt));
    }
    let fit = (rest.len() / 1024) as u64;
    let n = hdr.numrec.min(fit) as usize;
    let recs = rest
        .chunks_exact(1024)
        .take(n)
        .map(|c| DiscoveryRecord::from_entry(DiscoveryLogEntry::ref_from_bytes(c).unwrap()))
        .collect();
    Ok((hdr.genctr, hdr.numrec, recs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    /// Connect SQE image as Linux's nvmf_connect_command lays it out: opcode 0x7f, FCTYPE at
    /// byte 4, SGL at 24..40 (type byte 39 = 0x01 in-capsule, length 1024), RECFMT 40, QID 42,
    /// SQSIZE 44 (0's based), KATO 48.
    #[test]
    fn connect_sqe_image() {
        let mut s = connect(3, 128, 0);
        s.set_cid(0x0a0b);
        let b = s.as_bytes();
        assert_eq!(&b[..6], &[0x7f, 0x40, 0x0b, 0x0a, 0x01, 0]);
        assert_eq!(
            &b[24..40],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0x01]
        );
        assert_eq!(&b[40..48], &[0, 0, 3, 0, 127, 0, 0, 0]);
        let s = connect(0, 32, 5000);
        assert_eq!(&s.as_bytes()[48..52], &5000u32.to_le_bytes());
    }

    /// Property Get CAP: ATTRIB (byte 40) = 1 (8 bytes), OFFSET (byte 44) = 0; CSTS: 4 bytes at
    /// 0x1c. Property Set CC: value at byte 48.
    #[test]
    fn property_sqe_images() {
        let b = property_get(property::CAP);
        assert_eq!((b.as_bytes()[4], b.as_bytes()[40], b.cdw11), (4, 1, 0));
        let b = property_get(property::CSTS);
        assert_eq!(
            (b.as_bytes()[40], &b.as_bytes()[44..48]),
            (0, &[0x1c, 0, 0, 0][..])
        );
        let b = property_set(property::CC, 0x0046_0001);
        assert_eq!(b.as_bytes()[4], 0);
        assert_eq!(&b.as_bytes()[44..52], &[0x14, 0, 0, 0, 1, 0, 0x46, 0]);
    }

    #[test]
    fn connect_data_layout_and_nqn_checks() {
        let d = ConnectData::new([7; 16], 0xffff, "nqn.a", "nqn.host").unwrap();
        let b = d.as_bytes();
        assert_eq!(&b[16..18], &[0xff, 0xff]);
        assert_eq!(&b[256..262], b"nqn.a\0");
        assert_eq!(&b[512..521], b"nqn.host\0");
        assert_eq!(
            ConnectData::new([0; 16], 1, "", "h").err(),
            Some(NqnError::Empty)
        );
        let long = "n".repeat(224);
        assert_eq!(
            ConnectData::new([0; 16], 1, &long, "h").err(),
            Some(NqnError::TooLong)
        );
        assert_eq!(
            ConnectData::new([0; 16], 1, "a b", "h").err(),
            Some(NqnError::BadByte)
        );
        assert!(ConnectData::new([0; 16], 1, &"n".repeat(223), "h").is_ok());
    }

    #[test]
    fn discovery_log_decodes_and_clamps() {
        let mut page = vec![0u8; 1024 + 2 * 1024];
        page[0] = 9; // genctr
        page[8] = 200; // numrec: more than the page holds
        let e = &mut page[1024..2048];
        e[0] = 3;
        e[1] = 1;
        e[2] = 2;
        e[32..36].copy_from_slice(b"4420");
        e[256..266].copy_from_slice(b"nqn.test.1");
        e[512..521].copy_from_slice(b"10.0.2.15");
        let (gen, numrec, recs) = parse_discovery_log(&page).unwrap();
        assert_eq!((gen, numrec, recs.len()), (9, 200, 2));
        assert_eq!(recs[0].transport, "tcp");
        assert_eq!(recs[0].subtype, "nvme");
        assert_eq!(recs[0].traddr, "10.0.2.15");
        assert_eq!(recs[0].trsvcid, "4420");
        assert_eq!(recs[0].subnqn, "nqn.test.1");
        assert_eq!(
            parse_discovery_log(&page[..100]).err(),
            Some(DiscoveryLogError::Short)
        );
        page[16] = 1;
        assert_eq!(
            parse_discovery_log(&page).err(),
            Some(DiscoveryLogError::RecordFormat(1))
        );
    }

    #[test]
    fn discovery_log_command() {
        let s = discovery_log(4096, 1024);
        assert_eq!(s.opcode(), 0x02);
        assert_eq!(s.cdw10, 0x70 | (1023 << 16));
        assert_eq!(s.cdw12, 1024);
    }
}
