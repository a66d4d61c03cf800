//! The VF side of the 82576 mailbox (V2PMAILBOX and the 16-word VMBMEM) and the answers of the
//! PF's kernel driver (Linux `igb_rcv_msg_from_vf`: RESET, SET_MAC_ADDR, SET_VLAN, SET_LPE),
//! written independently of the driver's table so a wrong bit on either side shows up in the
//! tests.

/// V2PMAILBOX: the VF posts a request.
pub(crate) const REQ: u32 = 1 << 0;
/// V2PMAILBOX: the VF acknowledges the PF's message.
pub(crate) const ACK: u32 = 1 << 1;
/// V2PMAILBOX: the VF holds the buffer.
pub(crate) const VFU: u32 = 1 << 2;
/// V2PMAILBOX: the PF wrote a message (clear on read).
pub(crate) const PFSTS: u32 = 1 << 4;
/// V2PMAILBOX: the PF acknowledged the VF's message (clear on read).
pub(crate) const PFACK: u32 = 1 << 5;
/// V2PMAILBOX: the PF was reset.
pub(crate) const RSTI: u32 = 1 << 6;
/// V2PMAILBOX: the VF's reset is done (clear on read).
pub(crate) const RSTD: u32 = 1 << 7;
/// Bits cleared by a read.
pub(crate) const R2C: u32 = PFSTS | PFACK | RSTD;

const MSG_ACK: u32 = 0x8000_0000;
const MSG_NACK: u32 = 0x4000_0000;
const MSG_CTS: u32 = 0x2000_0000;
const VF_RESET: u32 = 0x01;
const VF_SET_MAC_ADDR: u32 = 0x02;
const VF_SET_VLAN: u32 = 0x04;
const VF_SET_LPE: u32 = 0x05;
const PF_CONTROL_MSG: u32 = 0x0100;

/// How the PF's kernel driver answers the VF's mailbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PfDriver {
    /// As Linux igb does: RESET gets ACK and the VF's MAC (NACK when the PF has none for it),
    /// SET_MAC_ADDR and SET_VLAN get ACK (or NACK, see [`super::vf::IgbVfConfig`]), anything
    /// else NACK; before a RESET every request is NACKed.
    #[default]
    Answers,
    /// No driver is bound to the PF: it stays in reset (V2PMAILBOX.RSTI) and requests are
    /// neither acknowledged nor answered.
    Gone,
    /// A PF driver brought the PF up but never answers the mailbox (hung).
    Silent,
    /// The PF acknowledges every request (PFACK) but never writes an answer.
    AckOnly,
    /// Every request is NACKed, RESET included.
    NackAll,
    /// Every request is answered with these words (at most 16 are written), with PFACK and
    /// PFSTS raised as the flags say.
    Garbage {
        /// The answer's words.
        reply: Vec<u32>,
        /// Whether the request is acknowledged.
        pfack: bool,
        /// Whether the answer is signalled.
        pfsts: bool,
    },
}

/// The mailbox and what the PF driver remembers of this VF.
#[derive(Debug, Default)]
pub(crate) struct Mailbox {
    pub(crate) v2p: u32,
    pub(crate) mem: [u32; 16],
    /// The VF completed a RESET handshake (clear to send).
    pub(crate) cts: bool,
    pub(crate) vlans: Vec<u16>,
    pub(crate) requests: u64,
    /// A receive limit (bytes, FCS included) the PF driver accepted, for the pool to apply.
    pub(crate) lpe: Option<u32>,
    /// An answer held back behind a PF control message, written once the VF ACKs that.
    pending: Option<Vec<u32>>,
}

/// The PF-side policy the responder applies.
pub(crate) struct Policy<'a> {
    pub(crate) driver: &'a PfDriver,
    pub(crate) mac_locked: bool,
    pub(crate) vlan_refused: bool,
    /// A PF control message (a link ping) goes out before each answer.
    pub(crate) ping_first: bool,
}

impl Mailbox {
    /// A V2PMAILBOX read: the clear-on-read bits go.
    pub(crate) fn read_v2p(&mut self) -> u32 {
        let v = self.v2p;
        self.v2p &= !R2C;
        v
    }

    /// A V2PMAILBOX write: VFU follows the value; ACK releases an answer held back; REQ hands the buffer to the PF driver, whose
    /// answer lands at once. `mac` is the VF's MAC as the PF driver holds it.
    pub(crate) fn write_v2p(&mut self, v: u32, policy: &Policy<'_>, mac: &mut Option<[u8; 6]>) {
        self.v2p = (self.v2p & !VFU) | (v & VFU);
        if v & ACK != 0 {
            if let Some(answer) = self.pending.take() {
                self.write_answer(&answer, PFSTS);
            }
        }
        if v & REQ == 0 {
            return;
        }
        self.requests += 1;
        let (reply, pfack, pfsts) = match policy.driver {
            PfDriver::Gone | PfDriver::Silent => return,
            PfDriver::AckOnly => (Vec::new(), true, false),
            PfDriver::Garbage {
                reply,
                pfack,
                pfsts,
            } => (reply.clone(), *pfack, *pfsts),
            PfDriver::NackAll => {
                self.cts = self.cts || self.mem[0] & 0xffff == VF_RESET;
                (vec![self.mem[0] | MSG_NACK | MSG_CTS], true, true)
            }
            PfDriver::Answers => {
                let r = self.answer(policy, mac);
                let sts = !r.is_empty();
                (r, true, sts)
            }
        };
        let bits = if pfack { PFACK } else { 0 } | if pfsts { PFSTS } else { 0 };
        if policy.ping_first && pfsts {
            self.pending = Some(reply);
            self.write_answer(&[PF_CONTROL_MSG | MSG_CTS], bits);
        } else {
            self.write_answer(&reply, bits);
        }
    }

    fn write_answer(&mut self, words: &[u32], bits: u32) {
        for (w, r) in self.mem.iter_mut().zip(words) {
            *w = *r;
        }
        self.v2p |= bits;
    }

    /// Linux igb's answer to the message in the buffer.
    fn answer(&mut self, policy: &Policy<'_>, mac: &mut Option<[u8; 6]>) -> Vec<u32> {
        let m0 = self.mem[0];
        if m0 & (MSG_ACK | MSG_NACK) != 0 {
            return Vec::new();
        }
        let ok = |yes: bool| m0 | MSG_CTS | if yes { MSG_ACK } else { MSG_NACK };
        match m0 & 0xffff {
            VF_RESET => {
                self.cts = true;
                self.vlans.clear();
                match mac {
                    Some(m) => vec![
                        VF_RESET | MSG_ACK,
                        u32::from_le_bytes([m[0], m[1], m[2], m[3]]),
                        u32::from_le_bytes([m[4], m[5], 0, 0]),
                    ],
                    None => vec![VF_RESET | MSG_NACK, 0, 0],
                }
            }
            _ if !self.cts => vec![ok(false)],
            VF_SET_MAC_ADDR => {
                let a = self.mem[1].to_le_bytes();
                let b = self.mem[2].to_le_bytes();
                let new = [a[0], a[1], a[2], a[3], b[0], b[1]];
                let valid = new != [0; 6] && new[0] & 1 == 0;
                if valid && !policy.mac_locked {
                    *mac = Some(new);
                }
                vec![ok(valid && !policy.mac_locked)]
            }
            VF_SET_VLAN => {
                let vid = (self.mem[1] & 0xfff) as u16;
                if policy.vlan_refused {
                    return vec![ok(false)];
                }
                self.vlans.retain(|&v| v != vid);
                if (m0 >> 16) & 0xff != 0 {
                    self.vlans.push(vid);
                }
                vec![ok(true)]
            }
            VF_SET_LPE => {
                let size = self.mem[1];
                let fits = (64..=9728).contains(&size);
                if fits {
                    self.lpe = Some(size);
                }
                vec![ok(fits)]
            }
            _ => vec![ok(false)],
        }
    }
}
