//! The transport seam of the controller logic (SPDK's transport table): reading CAP, enabling
//! the controller and waiting for CSTS.RDY (bounded), and Identify are written once here, over
//! [`ControllerTransport`]. PCIe provides register access by MMIO and admin commands on its
//! admin rings ([`super::Controller`]); NVMe/TCP by Property Get / Set and capsules on its
//! admin connection ([`crate::transport::tcp::ctrl::TcpController`]). Queue creation stays
//! each transport's own (Create I/O SQ/CQ vs Fabrics Connect): it shares no logic.

use std::time::{Duration, Instant};

use zerocopy::FromBytes;

use crate::error::NvmeError;
use crate::spec::command::cns;
use crate::spec::identify::{IdentifyController, IdentifyNamespace, IDENTIFY_LEN};
use crate::spec::regs::{Cap, Cc, Csts, REG_CAP, REG_CC, REG_CSTS};

/// How long [`wait_ready`] sleeps between two CSTS reads.
const READY_POLL: Duration = Duration::from_micros(100);

/// Register access: MMIO on PCIe, Property Get / Set on fabrics.
pub trait Registers {
    /// The transport's error; the shared code's own faults are [`NvmeError`]s
    /// (`DeviceGone`, `ControllerFatal`, `ReadyTimeout`), the same on every transport.
    type Error: From<NvmeError>;
    /// Read CAP (8 bytes).
    fn read_cap(&mut self) -> Result<u64, Self::Error>;
    /// Read CSTS (4 bytes), as the controller reports it.
    fn read_csts(&mut self) -> Result<u32, Self::Error>;
    /// Write CC (4 bytes).
    fn write_cc(&mut self, cc: u32) -> Result<(), Self::Error>;
}

/// What a transport gives the shared controller logic: registers and admin commands.
pub trait ControllerTransport: Registers {
    /// Run Identify `cns` for `nsid` (an admin command named `what`), its 4 KiB into `page`.
    fn identify(
        &mut self,
        cns: u8,
        nsid: u32,
        what: &'static str,
        page: &mut [u8; IDENTIFY_LEN],
    ) -> Result<(), Self::Error>;
}

/// Read CAP: all-ones is [`NvmeError::DeviceGone`].
pub fn read_cap<T: Registers>(t: &mut T) -> Result<Cap, T::Error> {
    let cap = t.read_cap()?;
    if cap == u64::MAX {
        return Err(NvmeError::DeviceGone { register: "CAP" }.into());
    }
    Ok(Cap(cap))
}

/// Read CSTS: all-ones is [`NvmeError::DeviceGone`]; with `during`, CFS is
/// [`NvmeError::ControllerFatal`] (without, a fatal controller may still be disabled).
pub fn read_csts<T: Registers>(t: &mut T, during: Option<&'static str>) -> Result<Csts, T::Error> {
    let csts = Csts(t.read_csts()?);
    if csts.is_all_ones() {
        return Err(NvmeError::DeviceGone { register: "CSTS" }.into());
    }
    match during {
        Some(during) if csts.cfs() => Err(NvmeError::ControllerFatal {
            csts: csts.0,
            during,
        }
        .into()),
        _ => Ok(csts),
    }
}

/// Poll CSTS until RDY equals `ready`, at most `timeout` ([`NvmeError::ReadyTimeout`] then).
/// `during` as in [`read_csts`].
pub fn wait_ready<T: Registers>(
    t: &mut T,
    ready: bool,
    timeout: Duration,
    during: Option<&'static str>,
) -> Result<(), T::Error> {
    let start = Instant::now();
    loop {
        let csts = read_csts(t, during)?;
        if csts.rdy() == ready {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(NvmeError::ReadyTimeout {
                ready,
                timeout,
                csts: csts.0,
            }
            .into());
        }
        std::thread::sleep(READY_POLL);
    }
}

/// Enable the controller (CC.EN with 4 KiB pages, 64-byte SQ and 16-byte CQ entries) and wait
/// for CSTS.RDY=1, at most `timeout`.
pub fn enable<T: Registers>(
    t: &mut T,
    timeout: Duration,
    during: &'static str,
) -> Result<(), T::Error> {
    t.write_cc(Cc::enabled(0, 6, 4).0)?;
    wait_ready(t, true, timeout, Some(during))
}

/// Identify Controller (CNS 01h).
pub fn identify_controller<T: ControllerTransport>(
    t: &mut T,
) -> Result<Box<IdentifyController>, T::Error> {
    let mut page = Box::new([0u8; IDENTIFY_LEN]);
    t.identify(cns::CONTROLLER, 0, "Identify Controller", &mut page)?;
    Ok(Box::new(
        IdentifyController::read_from_bytes(&page[..]).expect("size matches"),
    ))
}

/// Identify Namespace (CNS 00h) of `nsid`.
pub fn identify_namespace<T: ControllerTransport>(
    t: &mut T,
    nsid: u32,
) -> Result<Box<IdentifyNamespace>, T::Error> {
    let mut page = Box::new([0u8; IDENTIFY_LEN]);
    t.identify(cns::NAMESPACE, nsid, "Identify Namespace", &mut page)?;
    Ok(Box::new(
        IdentifyNamespace::read_from_bytes(&page[..]).expect("size matches"),
    ))
}

/// PCIe: the registers are BAR0 (MMIO never fails; a gone device reads all-ones).
impl Registers for &ubdirect_core::Mmio {
    type Error = NvmeError;
    fn read_cap(&mut self) -> Result<u64, NvmeError> {
        Ok(self.read64(REG_CAP))
    }
    fn read_csts(&mut self) -> Result<u32, NvmeError> {
        Ok(self.read32(REG_CSTS))
    }
    fn write_cc(&mut self, cc: u32) -> Result<(), NvmeError> {
        self.write32(REG_CC, cc);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transport whose CSTS follows a script (the last value repeats).
    struct Script {
        csts: Vec<u32>,
        reads: usize,
        cc: Vec<u32>,
    }

    impl Registers for Script {
        type Error = NvmeError;
        fn read_cap(&mut self) -> Result<u64, NvmeError> {
            Ok(u64::MAX)
        }
        fn read_csts(&mut self) -> Result<u32, NvmeError> {
            let v = self.csts[self.reads.min(self.csts.len() - 1)];
            self.reads += 1;
            Ok(v)
        }
        fn write_cc(&mut self, cc: u32) -> Result<(), NvmeError> {
            self.cc.push(cc);
            Ok(())
        }
    }

    impl ControllerTransport for Script {
        fn identify(
            &mut self,
            _: u8,
            _: u32,
            _: &'static str,
            _: &mut [u8; IDENTIFY_LEN],
        ) -> Result<(), NvmeError> {
            Ok(())
        }
    }

    fn script(csts: &[u32]) -> Script {
        Script {
            csts: csts.to_vec(),
            reads: 0,
            cc: Vec::new(),
        }
    }

    #[test]
    fn enable_writes_cc_and_waits_for_rdy() {
        let mut t = script(&[0, 0, 1]);
        enable(&mut t, Duration::from_secs(5), "enabling").unwrap();
        assert_eq!(t.cc, vec![Cc::enabled(0, 6, 4).0]);
        assert_eq!(t.reads, 3);
    }

    #[test]
    fn faults_are_the_same_errors_on_every_transport() {
        let e = enable(&mut script(&[0]), Duration::from_millis(5), "enabling").unwrap_err();
        assert!(
            matches!(
                e,
                NvmeError::ReadyTimeout {
                    ready: true,
                    csts: 0,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = enable(&mut script(&[0, 2]), Duration::from_secs(5), "enabling").unwrap_err();
        assert!(
            matches!(
                e,
                NvmeError::ControllerFatal {
                    csts: 2,
                    during: "enabling"
                }
            ),
            "{e:?}"
        );
        // Disabling a fatal controller is allowed: CFS does not stop the wait without `during`.
        wait_ready(&mut script(&[3, 2]), false, Duration::from_secs(5), None).unwrap();
        let e = read_csts(&mut script(&[u32::MAX]), None).unwrap_err();
        assert!(matches!(e, NvmeError::DeviceGone { register: "CSTS" }));
        let e = read_cap(&mut script(&[0])).unwrap_err();
        assert!(matches!(e, NvmeError::DeviceGone { register: "CAP" }));
    }
}
