//! The VF side of the 82576 mailbox: take the buffer (VFU), write the message into VMBMEM,
//! post it (REQ), wait for the PF's acknowledgement (PFACK), wait for its answer (PFSTS),
//! read it and acknowledge it (ACK). Every wait has a deadline; every answer is checked
//! against the request before anything in it is used.

use std::sync::Arc;
use std::time::Duration;

use ubdirect_core::pci::PciAddress;
use ubdirect_core::Mmio;

use super::regs::*;
use crate::bringup::poll_until;
use crate::error::{IgbError, Result};

/// Words of an answer this driver reads (type word and up to two words of data).
const ANSWER_WORDS: usize = 3;
/// PF control messages skipped while waiting for one answer before giving up.
const MAX_CONTROL_MSGS: usize = 8;

/// An answer the PF driver accepted or refused; its words are checked to belong to the request.
pub(crate) enum Answer {
    /// ACK, with the answer's words.
    Ack([u32; ANSWER_WORDS]),
    /// NACK.
    Nack,
}

/// The mailbox of one VF.
pub(crate) struct Mailbox {
    regs: Arc<Mmio>,
    addr: PciAddress,
    timeout: Duration,
    /// Clear-on-read bits seen and not yet consumed.
    seen: u32,
    /// The last V2PMAILBOX value read (for errors).
    last: u32,
}

impl Mailbox {
    /// The mailbox of the VF at `addr` whose registers are `regs`; each wait lasts at most
    /// `timeout`.
    pub(crate) fn new(regs: Arc<Mmio>, addr: PciAddress, timeout: Duration) -> Mailbox {
        Mailbox {
            regs,
            addr,
            timeout,
            seen: 0,
            last: 0,
        }
    }

    /// V2PMAILBOX with the clear-on-read bits seen earlier still set.
    fn read(&mut self) -> Result<u32> {
        let v = self.regs.read32(V2PMAILBOX);
        if v == u32::MAX {
            return Err(IgbError::DeviceGone {
                addr: self.addr,
                cause: "V2PMAILBOX reads all-ones (0xffffffff)",
            });
        }
        self.last = v;
        self.seen |= v & MBX_R2C;
        Ok(v | self.seen)
    }

    /// Whether any bit of `mask` is set (consuming the clear-on-read ones).
    fn take(&mut self, mask: u32) -> Result<bool> {
        let v = self.read()?;
        self.seen &= !mask;
        Ok(v & mask != 0)
    }

    /// Waits for `cond` on V2PMAILBOX (polling `step` first each time) until the deadline.
    fn wait(
        &mut self,
        request: &'static str,
        stage: &'static str,
        mut step: impl FnMut(&mut Mailbox) -> Result<bool>,
    ) -> Result<()> {
        let waited = self.timeout;
        let got = poll_until(waited, || match step(self) {
            Ok(false) => None,
            other => Some(other),
        });
        match got {
            Some(r) => r.map(|_| ()),
            None => Err(IgbError::MailboxTimeout {
                addr: self.addr,
                request,
                stage,
                waited,
                v2p: self.last,
            }),
        }
    }

    /// Waits, up to `deadline`, for the PF to be out of reset (RSTI clear).
    pub(crate) fn wait_pf_ready(&mut self, deadline: Duration) -> Result<()> {
        let mut last = Ok(0);
        let ready = poll_until(deadline, || {
            last = self.read();
            match last {
                Ok(v) => (v & MBX_RSTI == 0).then_some(()),
                Err(_) => Some(()),
            }
        });
        last?;
        if ready.is_none() {
            return Err(IgbError::PfNotReady {
                addr: self.addr,
                waited: deadline,
            });
        }
        // A reset-done indication belongs to the past from here on.
        self.seen &= !MBX_RSTD;
        Ok(())
    }

    /// Takes VMBMEM for the VF (VFU reads back set).
    fn lock(&mut self, request: &'static str) -> Result<()> {
        self.wait(request, "the buffer lock (VFU) never came", |m| {
            m.regs.write32(V2PMAILBOX, MBX_VFU);
            Ok(m.read()? & MBX_VFU != 0)
        })
    }

    /// Posts `msg` and waits for the PF's acknowledgement.
    fn post(&mut self, msg: &[u32], request: &'static str) -> Result<()> {
        self.lock(request)?;
        // Indications of an earlier exchange must not pass for this one's.
        self.take(MBX_PFSTS | MBX_PFACK)?;
        for (i, w) in msg.iter().enumerate().take(VMBMEM_WORDS) {
            self.regs.write32(VMBMEM + 4 * i, *w);
        }
        self.regs.write32(V2PMAILBOX, MBX_REQ);
        self.wait(request, "no acknowledgement (PFACK)", |m| m.take(MBX_PFACK))
    }

    /// Waits for the PF's answer, reads its first words and acknowledges it.
    fn answer(&mut self, request: &'static str) -> Result<[u32; ANSWER_WORDS]> {
        self.wait(request, "no answer (PFSTS)", |m| m.take(MBX_PFSTS))?;
        self.lock(request)?;
        let mut words = [0u32; ANSWER_WORDS];
        for (i, w) in words.iter_mut().enumerate() {
            *w = self.regs.read32(VMBMEM + 4 * i);
        }
        self.regs.write32(V2PMAILBOX, MBX_ACK);
        Ok(words)
    }

    /// Sends `msg` (its type in the low 16 bits of word 0) and returns the PF's checked
    /// answer: it must be of the same type and carry ACK or NACK. PF control messages that
    /// arrive first are acknowledged and passed over (at most 8).
    pub(crate) fn request(&mut self, msg: &[u32], request: &'static str) -> Result<Answer> {
        self.post(msg, request)?;
        let mut words = self.answer(request)?;
        // The PF driver's own messages (a ping when its link changes) may come first.
        for _ in 0..MAX_CONTROL_MSGS {
            if words[0] & 0xffff != PF_CONTROL_MSG {
                break;
            }
            words = self.answer(request)?;
        }
        let w0 = words[0];
        let garbage = |what| IgbError::MailboxGarbage {
            addr: self.addr,
            request,
            word: w0,
            what,
        };
        if w0 & 0xffff != msg[0] & 0xffff {
            return Err(garbage("an answer to another request"));
        }
        match (w0 & MSG_ACK != 0, w0 & MSG_NACK != 0) {
            (true, false) => Ok(Answer::Ack(words)),
            (false, true) => Ok(Answer::Nack),
            _ => Err(garbage("it carries neither ACK nor NACK, or both")),
        }
    }

    /// The RESET handshake: returns the MAC the PF driver assigned (None when it has none for
    /// this VF and NACKs). A MAC that is multicast or zero is [`IgbError::MailboxGarbage`].
    pub(crate) fn reset(&mut self) -> Result<Option<[u8; 6]>> {
        let words = match self.request(&[VF_RESET], "RESET")? {
            Answer::Nack => return Ok(None),
            Answer::Ack(w) => w,
        };
        let (a, b) = (words[1].to_le_bytes(), words[2].to_le_bytes());
        let mac = [a[0], a[1], a[2], a[3], b[0], b[1]];
        if mac == [0; 6] || mac[0] & 1 != 0 {
            return Err(IgbError::MailboxGarbage {
                addr: self.addr,
                request: "RESET",
                word: words[1],
                what: "the MAC it carries is zero or multicast",
            });
        }
        Ok(Some(mac))
    }

    /// Asks the PF driver to give the VF `mac`.
    pub(crate) fn set_mac(&mut self, mac: [u8; 6]) -> Result<()> {
        let msg = [
            VF_SET_MAC_ADDR,
            u32::from_le_bytes([mac[0], mac[1], mac[2], mac[3]]),
            u32::from_le_bytes([mac[4], mac[5], 0, 0]),
        ];
        self.acked(&msg, "SET_MAC_ADDR")
    }

    /// Asks the PF driver to add (`on`) or remove VLAN `vid` from the VF's filter.
    pub(crate) fn set_vlan(&mut self, vid: u16, on: bool) -> Result<()> {
        let msg = [
            VF_SET_VLAN | (u32::from(on) << MSG_INFO_SHIFT),
            u32::from(vid),
        ];
        self.acked(&msg, "SET_VLAN")
    }

    /// Asks the PF driver to let the VF receive frames of up to `max_frame` bytes (FCS
    /// included); without it the PF's pool limit drops untagged frames over 1514 bytes.
    pub(crate) fn set_lpe(&mut self, max_frame: u32) -> Result<()> {
        self.acked(&[VF_SET_LPE, max_frame], "SET_LPE")
    }

    fn acked(&mut self, msg: &[u32], request: &'static str) -> Result<()> {
        match self.request(msg, request)? {
            Answer::Ack(_) => Ok(()),
            Answer::Nack => Err(IgbError::MailboxNack {
                addr: self.addr,
                request,
            }),
        }
    }
}
