//! Guest tests of DH-HMAC-CHAP on the NVMe/TCP initiator against the Linux kernel's target
//! (nvmet) over loopback in the test-bed guest: the target admits each test's host NQN with
//! `dhchap_key` / `dhchap_ctrl_key` / `dhchap_hash` / `dhchap_dhgroup` (scripts/vm/nvmet.sh
//! --allow-host). The right key connects and moves data byte-exact with every hash and the
//! null and ffdhe2048 groups, uni- and bidirectional; a wrong key, a missing key and a wrong
//! controller key are refused by name before any I/O; the kernel's own initiator connects
//! with the same `DHHC-1:` keys and reads what ubdirect wrote. On a kernel without
//! DH-HMAC-CHAP (Debian's 6.1) every test is a counted skip.

use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ubdirect_nvme::transport::tcp::auth::messages::failure;
use ubdirect_nvme::transport::tcp::auth::{
    AuthConfig, AuthError, Authenticated, DhGroup, DhchapSecret, HashFn,
};
use ubdirect_nvme::transport::tcp::ctrl::{TcpController, TcpOptions};
use ubdirect_nvme::transport::tcp::fabrics;
use ubdirect_nvme::transport::tcp::host::{uuid_of_nqn, HostIdentity};
use ubdirect_nvme::transport::tcp::queue::{TcpCommand, TcpQueue};
use ubdirect_nvme::transport::tcp::{addr::TcpTarget, TcpError};
use ubdirect_testbed as testbed;

const NQN: &str = "nqn.2026-11.io.ubdirect:auth";
const PORT: &str = "4430";
const ADDR: &str = "127.0.0.1:4430";
const LBA: usize = 4096;
/// The text every skip of this binary holds (scripts/vm/expected-skips).
const NO_AUTH: &str = "the guest kernel has no DH-HMAC-CHAP";

/// What nvmet.sh said when it failed: its exit status and stderr.
struct ScriptError {
    code: i32,
    stderr: String,
}

fn nvmet_try(args: &[&str]) -> Result<String, ScriptError> {
    let out = Command::new("sh")
        .arg("/ubd/scripts/vm/nvmet.sh")
        .args(args)
        .output()
        .expect("run nvmet.sh");
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    Err(ScriptError {
        code: out.status.code().unwrap_or(-1),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    })
}

fn nvmet(args: &[&str]) -> String {
    nvmet_try(args).unwrap_or_else(|e| panic!("nvmet.sh {args:?}: {} ({})", e.stderr, e.code))
}

/// The target (a 64 MiB file namespace on port 4430, its own NQN), set up once per test
/// binary; the tests run one at a time (--test-threads=1) and each admits its own host.
fn target() -> TcpTarget {
    static UP: OnceLock<()> = OnceLock::new();
    testbed::require();
    UP.get_or_init(|| {
        nvmet(&[
            "127.0.0.1",
            "--file",
            "/tmp/nvmf-auth.img",
            "--size",
            "64M",
            "--port",
            PORT,
            "--nqn",
            NQN,
        ]);
    });
    TcpTarget {
        addr: ADDR.into(),
        subnqn: NQN.into(),
        nsid: Some(1),
    }
}

/// A fixed host identity per test (`n`), so the target's entry names it.
fn host(n: u8) -> HostIdentity {
    let nqn = format!("nqn.2014-08.org.nvmexpress:uuid:6ab1c1e0-5d2a-4c1b-9e7f-0000000000{n:02x}");
    HostIdentity {
        id: uuid_of_nqn(&nqn).expect("a uuid NQN"),
        nqn,
        source: "test",
    }
}

/// A secret of `len` bytes of `byte`, transformed with `transform`.
fn secret(byte: u8, len: usize, transform: Option<HashFn>) -> DhchapSecret {
    DhchapSecret::from_key(&vec![byte; len], transform)
}

/// Write `s` (its DHHC-1 text) to a file only root reads; returns the path.
fn key_file(name: &str, s: &DhchapSecret) -> String {
    let dir = "/tmp/ubd-auth-keys";
    std::fs::create_dir_all(dir).unwrap();
    let path = format!("{dir}/{name}");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    writeln!(f, "{}", s.to_text().as_str()).unwrap();
    path
}

/// How the target authenticates one host.
struct TargetKeys<'a> {
    key: &'a DhchapSecret,
    ctrl_key: Option<&'a DhchapSecret>,
    hash: HashFn,
    group: DhGroup,
}

/// Admit `h` on the target with `k`. False (after printing the skip) when this kernel has no
/// DH-HMAC-CHAP.
fn admit(h: &HostIdentity, k: &TargetKeys<'_>) -> bool {
    target();
    let kf = key_file("target-host.key", k.key);
    let ckf = k.ctrl_key.map(|c| key_file("target-ctrl.key", c));
    let mut args = vec![
        "--allow-host",
        &h.nqn,
        "--nqn",
        NQN,
        "--dhchap-key-file",
        &kf,
    ];
    if let Some(c) = &ckf {
        args.extend(["--dhchap-ctrl-key-file", c.as_str()]);
    }
    args.extend([
        "--dhchap-hash",
        k.hash.name(),
        "--dhchap-dhgroup",
        k.group.name(),
    ]);
    match nvmet_try(&args) {
        Ok(out) => {
            print!("{out}");
            true
        }
        Err(e) if e.code == 3 => {
            testbed::skip(&format!("{NO_AUTH}: {}", e.stderr));
            false
        }
        Err(e) => panic!("nvmet.sh {args:?}: {} ({})", e.stderr, e.code),
    }
}

fn deny(h: &HostIdentity) {
    nvmet(&["--deny-host", &h.nqn, "--nqn", NQN]);
}

/// Host options: `secret` / `ctrl` as the host's secrets, offering every hash and group (as
/// the kernel's host does).
///
/// nvmet (6.12, and upstream since) takes its configured DH group whenever the host offers
/// any other group before it, and when the host offers only that group it falls back to it
/// only if the kernel has a key-agreement algorithm of that name: a host offering only the
/// null group is refused with "DH group unusable". Offering every group, the host gets the
/// configured one, null included.
fn opts(secret: Option<&DhchapSecret>, ctrl: Option<&DhchapSecret>) -> TcpOptions {
    TcpOptions {
        auth: AuthConfig {
            secret: secret.cloned(),
            ctrl_secret: ctrl.cloned(),
            ..AuthConfig::default()
        },
        // ffdhe2048 in a debug build under TCG: seconds per exponentiation, on both sides.
        connect_timeout: Duration::from_secs(60),
        admin_timeout: Duration::from_secs(60),
        io_timeout: Duration::from_secs(30),
        ..TcpOptions::default()
    }
}

fn connect(h: &HostIdentity, o: &TcpOptions) -> Result<TcpController, TcpError> {
    TcpController::connect(&target(), h, o)
}

/// The authentication error of a refused connect; panics on success or another error.
fn refused(r: Result<TcpController, TcpError>) -> AuthError {
    match r {
        Err(TcpError::Auth { qid, source }) => {
            assert_eq!(qid, 0, "refused on the admin queue, before any I/O queue");
            source
        }
        Err(e) => panic!("not an authentication error: {e}"),
        Ok(_) => panic!("the connection was not refused"),
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len / 8)
        .flat_map(|i| (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i as u64).to_le_bytes())
        .collect()
}

/// An I/O queue of `c` (it authenticates too).
fn io_queue(c: &TcpController) -> TcpQueue<Vec<u8>> {
    c.io_queue::<Vec<u8>>(8)
        .expect("an I/O queue (it authenticates too)")
}

/// Write `len` bytes of pattern `seed` at `slba` on a new I/O queue of `c` and read them
/// back byte-exact.
fn write_then_read(c: &TcpController, slba: u64, seed: u64, len: usize) {
    write_then_read_on(&mut io_queue(c), slba, seed, len);
}

/// Write `len` bytes of pattern `seed` at `slba` on `q` and read them back byte-exact.
fn write_then_read_on(q: &mut TcpQueue<Vec<u8>>, slba: u64, seed: u64, len: usize) {
    let to = Duration::from_secs(30);
    let data = pattern(seed, len);
    let blocks = (len / LBA) as u32;
    q.run(
        TcpCommand::new(fabrics::rw(true, 1, slba, blocks), "Write")
            .write(0, len as u32)
            .buf(data.clone()),
        to,
    )
    .unwrap_or_else(|e| panic!("write {len} at {slba}: {e}"));
    let (_, got) = q
        .run(
            TcpCommand::new(fabrics::rw(false, 1, slba, blocks), "Read")
                .read(0, len as u32)
                .buf(vec![0xee; len]),
            to,
        )
        .unwrap_or_else(|e| panic!("read {len} at {slba}: {e}"));
    assert!(
        got.expect("the buffer comes back") == data,
        "read {len} at {slba} differs from what was written"
    );
}

/// nvmet's and the kernel host's log lines about authentication (dmesg).
fn auth_log() -> String {
    let out = Command::new("dmesg")
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    String::from_utf8_lossy(&out)
        .lines()
        .filter(|l| l.contains("nvme") && (l.contains("auth") || l.contains("dhchap")))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
#[ignore = "guest: needs nvmet with DH-HMAC-CHAP, run by scripts/test.sh"]
fn nvmf_auth_right_key_writes_and_reads_back_byte_exact() {
    let h = host(1);
    let key = secret(0x11, 32, Some(HashFn::Sha256));
    let k = TargetKeys {
        key: &key,
        ctrl_key: None,
        hash: HashFn::Sha256,
        group: DhGroup::Null,
    };
    if !admit(&h, &k) {
        return;
    }
    let c = connect(&h, &opts(Some(&key), None)).expect("connect with the key");
    let ns = c.namespace(1).unwrap();
    assert_eq!((ns.lba_size, ns.size_bytes()), (4096, 64 << 20));
    // 4 KiB in the capsule, 256 KiB through R2T and H2CData, on one I/O queue. (A new queue
    // right after dropping one reuses its queue ID, which nvmet may still be tearing down:
    // "qid 1 has already been created", Command Sequence Error.)
    let mut q = io_queue(&c);
    write_then_read_on(&mut q, 0, 1, LBA);
    write_then_read_on(&mut q, 64, 2, 256 << 10);
    drop(q);
    let a = c
        .reauthenticate()
        .expect("re-authentication on the admin queue");
    assert_eq!(
        a,
        Authenticated {
            hash: HashFn::Sha256,
            group: DhGroup::Null,
            bidirectional: false
        }
    );
    drop(c);
    deny(&h);
}

#[test]
#[ignore = "guest: needs nvmet with DH-HMAC-CHAP, run by scripts/test.sh"]
fn nvmf_auth_every_hash_with_the_null_and_ffdhe2048_groups() {
    let h = host(2);
    for (i, hash) in HashFn::ALL.into_iter().enumerate() {
        for group in [DhGroup::Null, DhGroup::Ffdhe2048] {
            // A key as long as the hash's digest, transformed with it; the DH groups also
            // authenticate the controller.
            let key = secret(0x20 + i as u8, hash.digest_len(), Some(hash));
            let ctrl = secret(0x30 + i as u8, 32, None);
            let bidi = group != DhGroup::Null;
            let k = TargetKeys {
                key: &key,
                ctrl_key: bidi.then_some(&ctrl),
                hash,
                group,
            };
            if !admit(&h, &k) {
                return;
            }
            let start = Instant::now();
            let o = opts(Some(&key), k.ctrl_key);
            let c =
                connect(&h, &o).unwrap_or_else(|e| panic!("{} {}: {e}", hash.name(), group.name()));
            let took = start.elapsed();
            write_then_read(&c, 256 + i as u64 * 8, 10 + i as u64, 2 * LBA);
            let a = c.reauthenticate().expect("re-authentication");
            assert_eq!(
                a,
                Authenticated {
                    hash,
                    group,
                    bidirectional: bidi
                }
            );
            println!(
                "{} {}{}: connected in {took:?}, data byte-exact, re-authenticated",
                hash.name(),
                group.name(),
                if bidi { ", bidirectional" } else { "" }
            );
        }
    }
    deny(&h);
    println!("kernel log:\n{}", auth_log());
}

#[test]
#[ignore = "guest: needs nvmet with DH-HMAC-CHAP, run by scripts/test.sh"]
fn nvmf_auth_wrong_key_is_refused_by_name_before_any_io() {
    let h = host(3);
    let key = secret(0x41, 32, Some(HashFn::Sha256));
    let k = TargetKeys {
        key: &key,
        ctrl_key: None,
        hash: HashFn::Sha256,
        group: DhGroup::Ffdhe2048,
    };
    if !admit(&h, &k) {
        return;
    }
    // The same format, another key; then the right key with another transform hash.
    for (what, wrong) in [
        ("another key", secret(0x42, 32, Some(HashFn::Sha256))),
        ("another transform", secret(0x41, 32, Some(HashFn::Sha384))),
    ] {
        // nvmet answers AUTH_Failure1, or its connection closes first (it fails the
        // controller as it refuses the host): both name the Reply and the host secret.
        let e = refused(connect(&h, &opts(Some(&wrong), None)));
        println!("{what}: {e}");
        match &e {
            AuthError::Refused { step, explanation } => {
                assert_eq!(
                    (*step, *explanation),
                    ("DH-HMAC-CHAP_Reply", failure::FAILED)
                )
            }
            AuthError::ClosedAfter { step } => assert_eq!(*step, "DH-HMAC-CHAP_Reply"),
            e => panic!("{what}: not a refusal of the host's key: {e:?}"),
        }
        assert!(e.to_string().contains("host secret"), "{e}");
    }
    // The right key still connects: the refusals left nothing behind on the target.
    let c = connect(&h, &opts(Some(&key), None)).expect("the right key");
    write_then_read(&c, 512, 3, LBA);
    drop(c);
    deny(&h);
    println!("kernel log:\n{}", auth_log());
}

#[test]
#[ignore = "guest: needs nvmet with DH-HMAC-CHAP, run by scripts/test.sh"]
fn nvmf_auth_missing_key_and_unknown_host_are_refused_by_name() {
    let h = host(4);
    let key = secret(0x51, 48, Some(HashFn::Sha384));
    let k = TargetKeys {
        key: &key,
        ctrl_key: None,
        hash: HashFn::Sha384,
        group: DhGroup::Null,
    };
    if !admit(&h, &k) {
        return;
    }
    let e = refused(connect(&h, &opts(None, None)));
    println!("no key: {e}");
    assert_eq!(e, AuthError::NoSecret { subnqn: NQN.into() });
    assert!(e.to_string().contains("requires authentication"), "{e}");
    // A host the target does not admit at all: refused at Connect, before authentication.
    let e = connect(&host(5), &opts(Some(&key), None)).unwrap_err();
    println!("unknown host: {e}");
    assert!(
        matches!(&e, TcpError::Connect { qid: 0, status, .. } if status.sct == 1 && status.sc == 0x84),
        "{e}"
    );
    assert!(e.to_string().contains("not allowed"), "{e}");
    deny(&h);
}

#[test]
#[ignore = "guest: needs nvmet with DH-HMAC-CHAP, run by scripts/test.sh"]
fn nvmf_auth_bidirectional_refuses_a_wrong_controller_key() {
    let h = host(6);
    let key = secret(0x61, 64, Some(HashFn::Sha512));
    let ctrl = secret(0x62, 64, Some(HashFn::Sha512));
    let k = TargetKeys {
        key: &key,
        ctrl_key: Some(&ctrl),
        hash: HashFn::Sha512,
        group: DhGroup::Ffdhe2048,
    };
    if !admit(&h, &k) {
        return;
    }
    let wrong = secret(0x63, 64, Some(HashFn::Sha512));
    let e = refused(connect(&h, &opts(Some(&key), Some(&wrong))));
    println!("wrong controller key: {e}");
    assert_eq!(e, AuthError::ControllerMismatch);
    assert!(e.to_string().contains("not the intended target"), "{e}");
    let c = connect(&h, &opts(Some(&key), Some(&ctrl))).expect("the right controller key");
    write_then_read(&c, 768, 4, LBA);
    drop(c);
    deny(&h);
    println!("kernel log:\n{}", auth_log());
}

#[test]
#[ignore = "guest: needs nvmet with DH-HMAC-CHAP, run by scripts/test.sh"]
fn nvmf_auth_a_dh_group_the_host_did_not_offer_is_refused() {
    let h = host(8);
    let key = secret(0x81, 32, Some(HashFn::Sha256));
    let k = TargetKeys {
        key: &key,
        ctrl_key: None,
        hash: HashFn::Sha256,
        group: DhGroup::Ffdhe2048,
    };
    if !admit(&h, &k) {
        return;
    }
    // The host offers ffdhe3072 only. nvmet answers with its configured ffdhe2048 anyway (it
    // keeps its own group when the host offers another): the host refuses that as a
    // downgrade. A target that refuses the offer instead (AUTH_Failure1, DH group unusable)
    // is refused as well; either way nothing but the authentication messages was sent.
    let mut o = opts(Some(&key), None);
    o.auth.groups = vec![DhGroup::Ffdhe3072];
    let e = refused(connect(&h, &o));
    println!("host offers ffdhe3072 only, target set to ffdhe2048: {e}");
    match &e {
        AuthError::GroupNotOffered { id, offered } => {
            assert_eq!(
                (*id, offered.as_str()),
                (DhGroup::Ffdhe2048.id(), "ffdhe3072")
            );
        }
        AuthError::Refused { explanation, .. } => {
            assert_eq!(*explanation, failure::DHGROUP_UNUSABLE, "{e}")
        }
        e => panic!("not a refusal naming the DH group: {e:?}"),
    }
    // Offering ffdhe2048 too, the same host connects.
    o.auth.groups = vec![DhGroup::Ffdhe3072, DhGroup::Ffdhe2048];
    let c = connect(&h, &o).expect("connect offering ffdhe2048 too");
    assert_eq!(c.reauthenticate().unwrap().group, DhGroup::Ffdhe2048);
    drop(c);
    deny(&h);
}

/// Sets the kernel host's admin command timeout (nvme_core.admin_timeout, seconds) while it
/// lives, and puts the old value back when dropped: a refused kernel host otherwise waits the
/// default 60 s for the answer to its last authentication message.
struct KernelAdminTimeout(Option<String>);

const ADMIN_TIMEOUT: &str = "/sys/module/nvme_core/parameters/admin_timeout";

impl KernelAdminTimeout {
    fn set(secs: u32) -> KernelAdminTimeout {
        let old = std::fs::read_to_string(ADMIN_TIMEOUT).ok();
        if old.is_some() && std::fs::write(ADMIN_TIMEOUT, secs.to_string()).is_err() {
            return KernelAdminTimeout(None);
        }
        KernelAdminTimeout(old)
    }
}

impl Drop for KernelAdminTimeout {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = std::fs::write(ADMIN_TIMEOUT, old.trim());
        }
    }
}

#[test]
#[ignore = "guest: needs nvmet with DH-HMAC-CHAP, run by scripts/test.sh"]
fn nvmf_auth_kernel_host_connects_with_the_same_keys_and_reads_what_ubdirect_wrote() {
    let h = host(7);
    let key = secret(0x71, 48, Some(HashFn::Sha384));
    let ctrl = secret(0x72, 32, None);
    let k = TargetKeys {
        key: &key,
        ctrl_key: Some(&ctrl),
        hash: HashFn::Sha384,
        group: DhGroup::Ffdhe2048,
    };
    if !admit(&h, &k) {
        return;
    }
    let (slba, seed) = (1024u64, 7u64);
    let c = connect(&h, &opts(Some(&key), Some(&ctrl))).expect("ubdirect");
    write_then_read(&c, slba, seed, 2 * LBA);
    drop(c);
    // The kernel's initiator, as the same host with the same key files' text.
    let kf = key_file("host.key", &key);
    let ckf = key_file("host-ctrl.key", &ctrl);
    let wrong = key_file("host-wrong.key", &secret(0x73, 48, Some(HashFn::Sha384)));
    let timeout = KernelAdminTimeout::set(10);
    let base = [
        "--connect",
        "127.0.0.1",
        "--port",
        PORT,
        "--nqn",
        NQN,
        "--hostnqn",
        &h.nqn,
    ];
    let e = match nvmet_try(&[&base[..], &["--dhchap-secret-file", &wrong]].concat()) {
        Err(e) => e,
        Ok(dev) => panic!("the kernel host connected with a wrong key: {dev}"),
    };
    if e.code == 3 {
        testbed::skip(&format!("{NO_AUTH}: {}", e.stderr));
        deny(&h);
        return;
    }
    println!("kernel host, wrong key: {}", e.stderr);
    assert!(e.stderr.contains("refused"), "{}", e.stderr);
    drop(timeout);
    let args = [
        &base[..],
        &[
            "--dhchap-secret-file",
            &kf,
            "--dhchap-ctrl-secret-file",
            &ckf,
        ],
    ]
    .concat();
    let dev = nvmet(&args).trim().to_owned();
    println!("kernel host, same keys: {dev}");
    let f = std::fs::OpenOptions::new().read(true).open(&dev).unwrap();
    let mut got = vec![0u8; 2 * LBA];
    let r = f.read_exact_at(&mut got, slba * LBA as u64);
    drop(f);
    let log = auth_log();
    nvmet(&["--disconnect", "--nqn", NQN]);
    r.unwrap_or_else(|e| panic!("read {dev}: {e}"));
    // The kernel host says what it agreed on with nvmet (its dmesg lines).
    let ctl = dev
        .trim_start_matches("/dev/")
        .rsplit_once('n')
        .map_or("", |(c, _)| c);
    for want in [
        format!("{ctl}: qid 0: authenticated with hash hmac(sha384) dhgroup ffdhe2048"),
        format!("{ctl}: qid 0: controller authenticated"),
    ] {
        assert!(
            log.contains(&want),
            "no \"{want}\" in the kernel log:\n{log}"
        );
    }
    assert!(
        got == pattern(seed, 2 * LBA),
        "the kernel host read other bytes than ubdirect wrote"
    );
    deny(&h);
    println!("kernel log:\n{log}");
}
