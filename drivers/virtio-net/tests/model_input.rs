//! Device input on the device model that, unchecked, would panic, run away or corrupt state
//! (short device configuration, `2 x max_virtqueue_pairs` overflow, unaligned or out-of-BAR
//! capabilities, malformed used rings) and the control queue after a timeout. Each is a typed
//! error.

mod model_support;

use std::time::{Duration, Instant};

use model_support::*;
use ubdirect_devmodel::virtio_net::{CapSpec, Hostile, Layout, NetModelConfig, UsedTweak, BAR};
use ubdirect_virtio_net::net_config::NetConfigError;
use ubdirect_virtio_net::pci_cap::{CapError, CfgType};
use ubdirect_virtio_net::ring::RingError;
use ubdirect_virtio_net::{NetConfig, VirtioNetError};

const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];

fn open_err(cfg: NetModelConfig, plan: Hostile, net: NetConfig) -> VirtioNetError {
    let reg = registry();
    let pool = pool(&reg, 64);
    let (m, r) = open_model(&reg, &pool, cfg, plan, net);
    let e = r.err().expect("bring-up must fail");
    assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
    assert_eq!(pool.stats().in_use, 0, "a failed bring-up keeps no buffer");
    e
}

fn layout(f: impl FnOnce(&mut Layout)) -> Hostile {
    let mut l = Layout::default();
    f(&mut l);
    Hostile {
        layout: Some(l),
        ..Hostile::default()
    }
}

#[test]
fn short_device_config_window_is_a_typed_error() {
    // 4 bytes: reading the MAC (6 bytes) would go past the window (a panic in Mmio).
    let e = open_err(
        NetModelConfig::default(),
        layout(|l| l.device.length = 4),
        fast_cfg(8),
    );
    assert!(
        matches!(
            e,
            VirtioNetError::DeviceConfig {
                source: NetConfigError::Short {
                    field: "mac",
                    len: 4,
                    ..
                },
                ..
            }
        ),
        "{e}"
    );
    // 7 bytes: MAC fits, STATUS (read by link_up) does not: refused at bring-up.
    let e = open_err(
        NetModelConfig::default(),
        layout(|l| l.device.length = 7),
        fast_cfg(8),
    );
    assert!(
        matches!(
            e,
            VirtioNetError::DeviceConfig {
                source: NetConfigError::Short {
                    field: "status",
                    ..
                },
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("malformed device"), "{e}");
}

#[test]
fn max_virtqueue_pairs_0x8000_never_puts_the_control_queue_over_rx_queue_0() {
    let mut bytes = vec![0u8; 12];
    bytes[..6].copy_from_slice(&A);
    bytes[6] = 1;
    bytes[8..10].copy_from_slice(&0x8000u16.to_le_bytes());
    let plan = Hostile {
        device_cfg: Some(bytes),
        num_queues: Some(0xffff),
        ..Hostile::default()
    };
    let cfg = NetModelConfig {
        max_pairs: 2,
        ..NetModelConfig::default()
    };
    let net = NetConfig {
        queue_pairs: 2,
        ..fast_cfg(8)
    };
    let e = open_err(cfg, plan, net);
    assert!(
        matches!(
            e,
            VirtioNetError::DeviceConfig {
                source: NetConfigError::BadValue {
                    field: "max_virtqueue_pairs",
                    value: 0x8000,
                    ..
                },
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn unaligned_capabilities_are_refused_naming_the_capability() {
    for (plan, kind) in [
        (layout(|l| l.common.offset = 2), CfgType::Common),
        (layout(|l| l.device.offset = 0x2002), CfgType::Device),
        (layout(|l| l.notify.offset = 0x3001), CfgType::Notify),
    ] {
        let e = open_err(NetModelConfig::default(), plan, fast_cfg(8));
        assert!(
            matches!(e, VirtioNetError::Capabilities { source: CapError::Unaligned { kind: k, .. }, .. } if k == kind),
            "{kind:?}: {e}"
        );
    }
    let e = open_err(
        NetModelConfig::default(),
        layout(|l| l.notify_mult = 3),
        fast_cfg(8),
    );
    assert!(
        matches!(
            e,
            VirtioNetError::Capabilities {
                source: CapError::BadNotifyMultiplier(3),
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn capabilities_beyond_the_bar_are_refused() {
    let e = open_err(
        NetModelConfig::default(),
        layout(|l| {
            l.notify = CapSpec {
                bar: BAR,
                offset: 0x3f00,
                length: 0x1000,
            }
        }),
        fast_cfg(8),
    );
    assert!(
        matches!(e, VirtioNetError::CapOutsideBar { what: "notify", .. }),
        "{e}"
    );
    // A doorbell offset (queue_notify_off x multiplier) beyond the notify window.
    let plan = Hostile {
        notify_off: Some(0x4000),
        ..Hostile::default()
    };
    let e = open_err(NetModelConfig::default(), plan, fast_cfg(8));
    assert!(matches!(e, VirtioNetError::NotifyOutOfRange { .. }), "{e}");
}

/// Sends one frame that the model echoes; the plan's tweaks: [TX completion, RX delivery].
fn echo_with(
    tx: UsedTweak,
    rx: UsedTweak,
) -> (
    Result<usize, VirtioNetError>,
    Result<usize, VirtioNetError>,
    usize,
) {
    let reg = registry();
    let pool = pool(&reg, 64);
    let plan = Hostile {
        used: vec![tx, rx],
        ..Hostile::default()
    };
    let (m, nic) = open_model(&reg, &pool, NetModelConfig::default(), plan, fast_cfg(8));
    let mut nic = nic.unwrap();
    let mut v = vec![frame(&pool, 100, A, A, 1)];
    assert_eq!(nic.tx_burst(&mut v).unwrap(), 1);
    let mut out = Vec::with_capacity(8);
    let first = nic.rx_burst(&mut out);
    let again = nic.rx_burst(&mut out);
    let tx = nic.reclaim_tx();
    assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
    let _ = again;
    (first, tx, out.len())
}

#[test]
fn used_ring_id_len_and_index_out_of_range_are_typed_errors() {
    let none = UsedTweak::default();
    // id beyond the ring (8 entries)
    let (rx, _, n) = echo_with(
        none,
        UsedTweak {
            id: Some(999),
            ..none
        },
    );
    assert!(
        matches!(
            rx,
            Err(VirtioNetError::Ring {
                queue: 0,
                source: RingError::BadId { id: 999, size: 8 },
                ..
            })
        ),
        "{rx:?}"
    );
    assert_eq!(n, 0);
    // len beyond the RX buffer (12 + 1514)
    let (rx, _, n) = echo_with(
        none,
        UsedTweak {
            len: Some(4000),
            ..none
        },
    );
    assert!(
        matches!(
            rx,
            Err(VirtioNetError::Ring {
                source: RingError::BadLen {
                    len: 4000,
                    max: 1526,
                    ..
                },
                ..
            })
        ),
        "{rx:?}"
    );
    assert_eq!(
        n, 0,
        "no frame with a length beyond its buffer is delivered"
    );
    // used idx jumping by more than the queue size
    let (rx, _, _) = echo_with(
        none,
        UsedTweak {
            extra_idx: 100,
            ..none
        },
    );
    assert!(
        matches!(
            rx,
            Err(VirtioNetError::Ring {
                source: RingError::Overrun { .. },
                ..
            })
        ),
        "{rx:?}"
    );
    // The same on the TX queue (queue 1).
    let (_, tx, _) = echo_with(
        UsedTweak {
            id: Some(8),
            ..none
        },
        none,
    );
    assert!(
        matches!(
            tx,
            Err(VirtioNetError::Ring {
                queue: 1,
                source: RingError::BadId { id: 8, .. },
                ..
            })
        ),
        "{tx:?}"
    );
}

#[test]
fn malformed_completion_is_reported_again_on_every_burst() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let none = UsedTweak::default();
    let plan = Hostile {
        used: vec![
            none,
            UsedTweak {
                len: Some(1_000_000),
                ..none
            },
        ],
        ..Hostile::default()
    };
    let (_m, nic) = open_model(&reg, &pool, NetModelConfig::default(), plan, fast_cfg(8));
    let mut nic = nic.unwrap();
    nic.tx_burst(&mut vec![frame(&pool, 100, A, A, 1)]).unwrap();
    let mut out = Vec::with_capacity(8);
    for _ in 0..3 {
        let e = nic.rx_burst(&mut out).unwrap_err();
        assert!(
            matches!(
                e,
                VirtioNetError::Ring {
                    source: RingError::BadLen { .. },
                    ..
                }
            ),
            "{e}"
        );
    }
    assert_eq!(
        nic.pair(0).unwrap().rx_posted(),
        8,
        "the buffer stays the device's"
    );
}

#[test]
fn control_queue_after_a_timeout_is_wedged_and_sends_nothing() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let plan = Hostile {
        ctrl_silent_after: Some(0),
        ..Hostile::default()
    };
    let net = NetConfig {
        ctrl_timeout: Duration::from_millis(20),
        ..fast_cfg(8)
    };
    let (m, nic) = open_model(&reg, &pool, NetModelConfig::default(), plan, net);
    let mut nic = nic.unwrap();
    let t = Instant::now();
    let e = nic.set_promiscuous(false).unwrap_err();
    let took = t.elapsed();
    eprintln!("control command timed out after {took:?}");
    assert!(
        matches!(
            e,
            VirtioNetError::ControlTimeout {
                what: "RX_PROMISC",
                ..
            }
        ),
        "{e}"
    );
    // Measured 20.0-23.3 ms (5 runs, 2-core box under load): bound 3x.
    assert!(
        took >= Duration::from_millis(20) && took < Duration::from_millis(60),
        "{took:?}"
    );
    let notifies = m.stats().notifies;
    for r in [nic.set_all_multicast(true), nic.set_promiscuous(true)] {
        let e = r.unwrap_err();
        assert!(
            matches!(e, VirtioNetError::ControlQueueWedged { .. }),
            "{e}"
        );
        assert!(e.to_string().contains("timed out"), "{e}");
    }
    assert_eq!(
        m.stats().notifies,
        notifies,
        "no doorbell: the timed-out command's buffer is never reused"
    );
    assert_eq!(m.stats().ctrl_commands, 0);
}

#[test]
fn control_queue_after_a_malformed_answer_is_wedged() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let plan = Hostile {
        used: vec![UsedTweak {
            id: Some(5),
            ..UsedTweak::default()
        }],
        ..Hostile::default()
    };
    let (m, nic) = open_model(&reg, &pool, NetModelConfig::default(), plan, fast_cfg(8));
    let mut nic = nic.unwrap();
    let e = nic.set_promiscuous(false).unwrap_err();
    assert!(
        matches!(e, VirtioNetError::ControlCommand { ref reason, .. } if reason.contains("descriptor 5")),
        "{e}"
    );
    let e = nic.set_promiscuous(true).unwrap_err();
    assert!(
        matches!(e, VirtioNetError::ControlQueueWedged { .. }),
        "{e}"
    );
    assert_eq!(m.stats().ctrl_commands, 1);
}

#[test]
fn all_ones_device_is_gone_not_a_panic() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let plan = Hostile {
        all_ones_after: Some(0),
        ..Hostile::default()
    };
    let (_m, r) = open_model(&reg, &pool, NetModelConfig::default(), plan, fast_cfg(8));
    let e = r.err().expect("gone");
    assert!(matches!(e, VirtioNetError::DeviceGone { .. }), "{e}");
}

#[test]
fn reset_that_never_completes_is_a_bounded_reset_timeout() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let plan = Hostile {
        reset_stuck: true,
        ..Hostile::default()
    };
    let t = Instant::now();
    let (_m, r) = open_model(&reg, &pool, NetModelConfig::default(), plan, fast_cfg(8));
    let took = t.elapsed();
    let e = r.err().expect("stuck reset");
    assert!(
        matches!(e, VirtioNetError::ResetTimeout { status: 1, .. }),
        "{e}"
    );
    // RESET_TIMEOUT is 2 s; measured 2.0 s.
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(6),
        "{took:?}"
    );
    assert_eq!(pool.stats().in_use, 0);
}

#[test]
fn a_frame_from_a_file_changed_since_registration_is_refused_with_nothing_sent() {
    let path = std::env::temp_dir().join(format!("ubd-vnet-file-frame-{}", std::process::id()));
    std::fs::write(&path, vec![0x5au8; 4096]).unwrap();
    let reg = registry();
    let pool = pool(&reg, 16);
    let file = std::fs::File::open(&path).unwrap();
    let region = reg.register_file(&file, 0, 4096).unwrap();
    let file_pool = ubdirect_core::UbPool::new(
        &reg,
        region,
        ubdirect_core::PoolConfig {
            block_size: 4096,
            block_count: 1,
        },
    )
    .unwrap();
    let (m, nic) = open_model(
        &reg,
        &pool,
        NetModelConfig::default(),
        Hostile::default(),
        fast_cfg(8),
    );
    let mut nic = nic.unwrap();
    let b = file_pool.get().unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(1024))
        .unwrap();
    let mut v = vec![ubdirect_virtio_net::TxFrame::new(b, 100)
        .map_err(|(_, e)| e)
        .unwrap()];
    let notifies = m.stats().notifies;
    let e = nic.tx_burst(&mut v).unwrap_err();
    assert!(
        matches!(
            e,
            VirtioNetError::Core(ubdirect_core::CoreError::FileChanged {
                old_size: 4096,
                new_size: 1024,
                ..
            })
        ),
        "{e}"
    );
    assert_eq!(v.len(), 1, "the frame stays with the caller");
    assert_eq!(m.stats().tx_frames, 0, "the device took no frame");
    assert_eq!(m.stats().notifies, notifies, "no doorbell");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_frame_from_an_unchanged_file_region_is_refused_with_nothing_sent() {
    let path = std::env::temp_dir().join(format!("ubd-vnet-file-ro-{}", std::process::id()));
    std::fs::write(&path, vec![0x5au8; 4096]).unwrap();
    let reg = registry();
    let pool = pool(&reg, 16);
    let file = std::fs::File::open(&path).unwrap();
    let region = reg.register_file(&file, 0, 4096).unwrap();
    let cfg = ubdirect_core::PoolConfig {
        block_size: 4096,
        block_count: 1,
    };
    let file_pool = ubdirect_core::UbPool::new(&reg, region, cfg).unwrap();
    let (m, nic) = open_model(
        &reg,
        &pool,
        NetModelConfig::default(),
        Hostile::default(),
        fast_cfg(8),
    );
    let mut nic = nic.unwrap();
    let b = file_pool.get().unwrap();
    let mut v = vec![ubdirect_virtio_net::TxFrame::new(b, 100)
        .map_err(|(_, e)| e)
        .unwrap()];
    let notifies = m.stats().notifies;
    let e = nic.tx_burst(&mut v).unwrap_err();
    assert!(
        e.to_string().contains("read-only UB region") && e.to_string().contains("header"),
        "{e}"
    );
    assert_eq!(v.len(), 1, "the frame stays with the caller");
    assert_eq!(m.stats().tx_frames, 0, "the device took no frame");
    assert_eq!(m.stats().notifies, notifies, "no doorbell");
    assert!(
        std::fs::read(&path).unwrap() == vec![0x5au8; 4096],
        "the file is untouched"
    );
    let _ = std::fs::remove_file(&path);
}
