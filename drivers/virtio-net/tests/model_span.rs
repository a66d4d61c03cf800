//! The driver's events name the NIC: bring-up runs inside a `virtio_net{addr=...}` span.
//! A capturing subscriber records the bring-up of a model NIC.

mod model_support;

use model_support::*;
use ubdirect_devmodel::virtio_net::{Hostile, NetModelConfig};
use ubdirect_testbed::log_capture::LogCapture;

#[test]
fn bring_up_events_carry_the_nic_address() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let out = LogCapture::default();
    let sub = tracing_subscriber::fmt()
        .with_writer(out.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let (_m, net) = tracing::subscriber::with_default(sub, || {
        open_model(
            &reg,
            &pool,
            NetModelConfig::default(),
            Hostile::default(),
            fast_cfg(64),
        )
    });
    let net = net.expect("open the model NIC");
    let addr = net.info().addr.to_string();
    let text = out.text();
    let line = text
        .lines()
        .find(|l| l.contains("virtio-net up"))
        .unwrap_or_else(|| panic!("no bring-up event in:\n{text}"));
    assert!(
        line.contains(&format!("virtio_net{{addr={addr}}}")),
        "the bring-up event is not inside the span of NIC {addr}: {line}"
    );
}
