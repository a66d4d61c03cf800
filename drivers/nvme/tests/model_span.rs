//! Every event of a controller's slow paths names the device: the driver enters an
//! `nvme{addr=...}` span. A capturing subscriber records what a warn-level filter
//! lets through while a controller with an empty namespace comes up.

mod model_support;

use model_support::{fast_opts, model};
use ubdirect_devmodel::nvme::{NsConfig, NvmeConfig};
use ubdirect_nvme::Controller;
use ubdirect_testbed::log_capture::LogCapture;

#[test]
fn bring_up_warnings_carry_the_controller_address() {
    let cfg = NvmeConfig {
        namespaces: vec![
            NsConfig {
                nsid: 1,
                blocks: 2048,
                lbads: 9,
            },
            NsConfig {
                nsid: 2,
                blocks: 0,
                lbads: 9,
            },
        ],
        ..NvmeConfig::default()
    };
    let (reg, _m, dev) = model(cfg);
    let addr = dev.address().to_string();
    let out = LogCapture::default();
    let sub = tracing_subscriber::fmt()
        .with_writer(out.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let ctrl = tracing::subscriber::with_default(sub, || {
        Controller::open_device(&reg, dev, fast_opts()).expect("open the model controller")
    });
    assert_eq!(ctrl.namespaces().len(), 1, "the empty namespace is skipped");
    let text = out.text();
    let line = text
        .lines()
        .find(|l| l.contains("namespace skipped: size 0"))
        .unwrap_or_else(|| panic!("no warning about the empty namespace in:\n{text}"));
    assert!(
        line.contains(&format!("nvme{{addr={addr}}}")),
        "the warning does not name controller {addr}: {line}"
    );
}
