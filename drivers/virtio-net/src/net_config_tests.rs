//! Device-configuration parsing: short windows, impossible values, the control-queue index
//! overflow, and the `fuzz_net_config` target.

use proptest::prelude::*;

use super::*;
use crate::Features as F;

fn cfg_bytes(mac: [u8; 6], status: u16, pairs: u16, mtu: u16) -> Vec<u8> {
    let mut b = vec![0u8; 12];
    b[..6].copy_from_slice(&mac);
    b[6..8].copy_from_slice(&status.to_le_bytes());
    b[8..10].copy_from_slice(&pairs.to_le_bytes());
    b[10..12].copy_from_slice(&mtu.to_le_bytes());
    b
}

/// Parses `bytes[..len]`, panicking (failing the test) on any read outside the window.
fn parse(
    offered: F,
    accepted: F,
    bytes: &[u8],
    len: Option<usize>,
) -> Result<NetDeviceConfig, NetConfigError> {
    let l = len.unwrap_or(0);
    let r8 = |o: usize| {
        assert!(o < l, "read8 at {o} outside a {l}-byte window");
        bytes[o]
    };
    let r16 = |o: usize| {
        assert!(o + 2 <= l, "read16 at {o} outside a {l}-byte window");
        u16::from_le_bytes([bytes[o], bytes[o + 1]])
    };
    parse_net_config(offered, accepted, len, r8, r16)
}

#[test]
fn full_window_reads_every_field() {
    let b = cfg_bytes([2, 0, 0, 0, 0, 7], 1, 4, 9000);
    let all = F::NET_MAC | F::NET_STATUS | F::NET_MQ | F::NET_MTU;
    let c = parse(all, all, &b, Some(12)).unwrap();
    assert_eq!(
        c,
        NetDeviceConfig {
            mac: Some([2, 0, 0, 0, 0, 7]),
            max_pairs: 4,
            mtu: Some(9000)
        }
    );
}

#[test]
fn short_window_for_mac_is_a_typed_error_not_a_panic() {
    let b = cfg_bytes([2, 0, 0, 0, 0, 7], 1, 1, 1500);
    for len in 0..6 {
        let e = parse(F::NET_MAC, F::NET_MAC, &b, Some(len)).unwrap_err();
        assert_eq!(
            e,
            NetConfigError::Short {
                field: "mac",
                off: 0,
                end: 6,
                len
            }
        );
    }
    let e = parse(F::NET_MAC, F::NET_MAC, &b, None).unwrap_err();
    assert_eq!(
        e,
        NetConfigError::Missing {
            what: "VIRTIO_NET_F_MAC"
        }
    );
}

#[test]
fn short_window_for_status_is_refused_at_bring_up() {
    let b = cfg_bytes([0; 6], 1, 1, 1500);
    let f = F::NET_MAC | F::NET_STATUS;
    let e = parse(f, f, &b, Some(7)).unwrap_err();
    assert_eq!(
        e,
        NetConfigError::Short {
            field: "status",
            off: 6,
            end: 8,
            len: 7
        }
    );
    assert!(parse(f, f, &b, Some(8)).is_ok());
}

#[test]
fn short_window_for_mtu_and_mq_is_refused() {
    let b = cfg_bytes([0; 6], 1, 2, 1500);
    let e = parse(F::NET_MTU, F::NET_MTU, &b, Some(11)).unwrap_err();
    assert!(
        matches!(e, NetConfigError::Short { field: "mtu", .. }),
        "{e}"
    );
    let e = parse(F::NET_MQ, F::NET_MQ, &b, Some(9)).unwrap_err();
    assert!(
        matches!(
            e,
            NetConfigError::Short {
                field: "max_virtqueue_pairs",
                ..
            }
        ),
        "{e}"
    );
    // Offered but not accepted: the field is informational, a short window reads as 1.
    assert_eq!(
        parse(F::NET_MQ, F::empty(), &b, Some(9)).unwrap().max_pairs,
        1
    );
}

#[test]
fn impossible_values_are_refused() {
    let e = parse(
        F::NET_MTU,
        F::NET_MTU,
        &cfg_bytes([0; 6], 0, 1, 67),
        Some(12),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            NetConfigError::BadValue {
                field: "mtu",
                value: 67,
                ..
            }
        ),
        "{e}"
    );
    for pairs in [0u16, 0x8000, 0xffff] {
        let e = parse(
            F::NET_MQ,
            F::NET_MQ,
            &cfg_bytes([0; 6], 0, pairs, 1500),
            Some(12),
        )
        .unwrap_err();
        assert!(
            matches!(e, NetConfigError::BadValue { field: "max_virtqueue_pairs", value, .. } if value == u32::from(pairs)),
            "{e}"
        );
    }
}

#[test]
fn ctrl_queue_index_never_wraps_onto_rx_queue_0() {
    // 0x8000 pairs: 2 x 0x8000 wrapped to 0 in a u16 (release) and set the control queue up
    // over RX queue 0.
    let e = ctrl_queue_index(F::NET_MQ | F::NET_CTRL_VQ, 0x8000, 0xffff).unwrap_err();
    assert!(
        matches!(
            e,
            NetConfigError::BadValue {
                field: "max_virtqueue_pairs",
                value: 0x8000,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(ctrl_queue_index(F::NET_MQ, 0x7fff, 0xffff), Ok(0xfffe));
    assert_eq!(ctrl_queue_index(F::NET_MQ, 4, 9), Ok(8));
    assert_eq!(ctrl_queue_index(F::NET_CTRL_VQ, 4, 3), Ok(2));
    let e = ctrl_queue_index(F::NET_MQ, 4, 8).unwrap_err();
    assert!(
        matches!(
            e,
            NetConfigError::BadValue {
                field: "num_queues",
                value: 8,
                ..
            }
        ),
        "{e}"
    );
    let e = ctrl_queue_index(F::NET_CTRL_VQ, 1, 2).unwrap_err();
    assert!(
        matches!(
            e,
            NetConfigError::BadValue {
                field: "num_queues",
                ..
            }
        ),
        "{e}"
    );
}

proptest! {
    #![proptest_config(crate::fuzz_cases::config())]

    /// Fuzz target `fuzz_net_config`: any window length, any bytes, any feature bits: never
    /// a read outside the window, never a panic; what is accepted obeys the spec's ranges.
    #[test]
    fn fuzz_net_config(
        bytes in proptest::collection::vec(any::<u8>(), 16),
        len in proptest::option::of(0usize..16),
        offered in any::<u64>(),
        accepted in any::<u64>(),
        num_queues in any::<u16>(),
    ) {
        let (offered, accepted) = (F::from_bits_retain(offered), F::from_bits_retain(accepted));
        if let Ok(c) = parse(offered, accepted, &bytes, len) {
            prop_assert!(c.max_pairs >= 1 && c.max_pairs < MAX_VIRTQUEUE_PAIRS_LIMIT);
            prop_assert!(c.mtu.is_none_or(|m| m >= MIN_MTU));
            prop_assert_eq!(c.mac.is_some(), accepted.contains(F::NET_MAC));
            if let Ok(q) = ctrl_queue_index(accepted, c.max_pairs, num_queues) {
                prop_assert!(q < num_queues);
                prop_assert!(q >= 2 && q % 2 == 0, "never over a data queue's slot 0/1: {}", q);
            }
        }
    }
}
