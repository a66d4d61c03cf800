//! The doctor's table of supported devices names exactly the devices the drivers accept.

use ubdirect::diag::topology::drivers::{IdMatch, SUPPORTED};

#[test]
fn the_doctors_igb_ids_are_the_drivers() {
    let mut doctor: Vec<u16> = SUPPORTED
        .iter()
        .filter(|m| m.driver == "igb")
        .filter_map(|m| match m.ids {
            IdMatch::Id {
                vendor: 0x8086,
                device,
            } => Some(device),
            _ => None,
        })
        .collect();
    let mut driver = ubdirect::igb::regs::PF_DEVICE_IDS.to_vec();
    doctor.sort_unstable();
    driver.sort_unstable();
    assert_eq!(doctor, driver);
}

#[test]
fn the_doctors_igb_vf_id_is_the_drivers() {
    let doctor: Vec<u16> = SUPPORTED
        .iter()
        .filter(|m| m.driver == "igb-vf")
        .filter_map(|m| match m.ids {
            IdMatch::Id {
                vendor: 0x8086,
                device,
            } => Some(device),
            _ => None,
        })
        .collect();
    assert_eq!(doctor, [ubdirect::igb::regs::VF_DEVICE_ID]);
}
