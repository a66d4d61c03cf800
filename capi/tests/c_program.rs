//! The C test program (tests/c/api_test.c) and the C examples (examples/c/*.c),
//! compiled with `cc -Wall -Werror` against include/ubdirect.h and libubdirect; the test
//! program runs against the NVMe device model, once more under valgrind where it is installed.
//! Cargo does not build a cdylib for integration tests, so this builds libubdirect itself
//! (`cargo build -p ubdirect-capi --features test-model`). A missing `cc` skips with the
//! reason printed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The directory of libubdirect.so built with the `test-model` feature (built once).
fn lib_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let o = Command::new(env!("CARGO"))
            .args(["build", "-p", "ubdirect-capi", "--features", "test-model"])
            .args(["--message-format=json-render-diagnostics"])
            .current_dir(manifest())
            .output()
            .expect("run cargo build");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "cargo build -p ubdirect-capi --features test-model failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let so = out
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["reason"] == "compiler-artifact")
            .flat_map(|v| v["filenames"].as_array().cloned().unwrap_or_default())
            .filter_map(|f| f.as_str().map(PathBuf::from))
            .find(|f| f.file_name().is_some_and(|n| n == "libubdirect.so"))
            .expect("cargo built libubdirect.so");
        so.parent().expect("a directory").to_path_buf()
    })
    .clone()
}

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// True when `tool --version` runs.
fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Compile `src` into `out` with `cc -Wall -Werror` and `defines`; panics with cc's output.
fn compile(src: &Path, out: &Path, defines: &[&str]) {
    let lib = lib_dir();
    let o = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g"])
        .args(defines)
        .arg("-I")
        .arg(manifest().join("include"))
        .arg(src)
        .arg("-o")
        .arg(out)
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lubdirect")
        .output()
        .expect("run cc");
    assert!(
        o.status.success(),
        "cc {} failed:\n{}{}",
        src.display(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Run `cmd`; panics unless it exits 0 with "0 failed" in its summary line.
fn run_checked(mut cmd: Command, what: &str) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{what} exited {}:\n{out}", o.status);
    assert!(
        out.contains("api_test: ") && out.contains(" passed, 0 failed"),
        "{what}:\n{out}"
    );
    out
}

#[test]
fn the_c_test_program_passes_against_the_device_model() {
    if !have("cc") {
        println!("skipped: no C compiler `cc` on PATH (install gcc: scripts/deps.sh does)");
        return;
    }
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let exe = tmp.join("api_test");
    compile(
        &manifest().join("tests/c/api_test.c"),
        &exe,
        &["-DUBD_TEST_MODEL"],
    );
    let out = run_checked(Command::new(&exe), "api_test");
    assert!(
        out.contains("ok - the read gives back the written bytes exactly"),
        "{out}"
    );
    assert!(
        out.contains("ok - a missing PCI device gives -ENODEV"),
        "{out}"
    );

    if !have("valgrind") {
        println!("skipped valgrind run: valgrind is not installed (scripts/deps.sh installs it)");
        return;
    }
    let mut vg = Command::new("valgrind");
    vg.args([
        "--error-exitcode=99",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite",
        "--quiet",
    ])
    .arg(&exe);
    let out = run_checked(vg, "api_test under valgrind");
    println!("{out}");
}

#[test]
fn the_c_examples_compile_with_warnings_as_errors() {
    if !have("cc") {
        println!("skipped: no C compiler `cc` on PATH (install gcc: scripts/deps.sh does)");
        return;
    }
    for name in ["hello_nvme", "perf_loop"] {
        let src = manifest().join(format!("../examples/c/{name}.c"));
        let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
        compile(&src, &exe, &[]);
        let o = Command::new(&exe).output().expect("run the example");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{name} without arguments prints its usage: {err}"
        );
        assert!(err.contains("usage"), "{name}: {err}");
    }
}

#[test]
fn the_pkg_config_file_of_an_install_builds_the_example() {
    for tool in ["cc", "make", "pkg-config"] {
        if !have(tool) {
            println!("skipped: no `{tool}` on PATH (scripts/deps.sh installs it)");
            return;
        }
    }
    let lib = lib_dir();
    let prefix = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capi-prefix");
    let _ = std::fs::remove_dir_all(&prefix);
    let profile = lib
        .file_name()
        .expect("target/<profile>")
        .to_string_lossy()
        .into_owned();
    let target = lib.parent().expect("target/");
    let o = Command::new("make")
        .arg("-C")
        .arg(manifest())
        .arg("install")
        .arg(format!("PREFIX={}", prefix.display()))
        .arg(format!("PROFILE={profile}"))
        .arg(format!("TARGET={}", target.display()))
        .arg("NO_BUILD=1")
        .output()
        .expect("run make");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "make install failed:\n{log}");
    let o = Command::new("pkg-config")
        .args(["--cflags", "--libs", "ubdirect"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .expect("run pkg-config");
    let flags = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "pkg-config: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        flags.contains(&format!("-I{}/include", prefix.display())),
        "{flags}"
    );
    assert!(flags.contains("-lubdirect"), "{flags}");
    let exe = prefix.join("hello_nvme");
    let o = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
        .arg(manifest().join("../examples/c/hello_nvme.c"))
        .arg("-o")
        .arg(&exe)
        .args(flags.split_whitespace())
        .arg(format!("-Wl,-rpath,{}/lib", prefix.display()))
        .output()
        .expect("run cc");
    assert!(
        o.status.success(),
        "cc with pkg-config's flags: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = Command::new(&exe).output().expect("run hello_nvme");
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
