//! The `--json` schema of docs/json.md, and running the built `ubdirect` binary.

/// Validate `doc` against the JSON Schema in docs/json.md; the errors as text.
pub fn validate(doc: &serde_json::Value) -> Result<(), String> {
    let text = include_str!("../../docs/json.md");
    let start = text
        .find("```json\n")
        .expect("docs/json.md has a ```json block")
        + 8;
    let end = start + text[start..].find("\n```").expect("the block ends");
    let schema: serde_json::Value = serde_json::from_str(&text[start..end]).expect("schema JSON");
    let v = jsonschema::validator_for(&schema).map_err(|e| format!("bad schema: {e}"))?;
    let errs: Vec<String> = v.iter_errors(doc).map(|e| e.to_string()).collect();
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("\n"))
    }
}

/// Run `bin` with `args` (and `env`); exit status, stdout, stderr.
#[allow(unused_imports)]
pub use ubdirect_testbed::cli::run;

/// The pipeline run whose `--json` both JSON tests validate: `src` to the null sink in 256 KiB
/// blocks at queue depth 4, with `extra` arguments, verified, with segments.
#[allow(dead_code)]
pub fn pipeline_json_args<'a>(src: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "pipeline",
        "--source",
        src,
        "--sink",
        "null",
        "--block-size",
        "256K",
        "-q",
        "4",
    ];
    a.extend_from_slice(extra);
    a.extend(["--verify", "--segments", "--json"]);
    a
}

/// Run and parse stdout as a `--json` document that validates; panics with the output if not.
#[allow(dead_code)]
pub fn json_of(bin: &str, args: &[&str], env: &[(&str, &str)], want_rc: i32) -> serde_json::Value {
    let (rc, out, err) = run(bin, args, env);
    assert_eq!(
        rc, want_rc,
        "ubdirect {args:?}: exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    );
    let v: serde_json::Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("ubdirect {args:?}: stdout is not JSON ({e}):\n{out}\n{err}"));
    if let Err(e) = validate(&v) {
        panic!("ubdirect {args:?}: output does not validate against docs/json.md:\n{e}\n{out}");
    }
    v
}

/// Why `msg` shows a Rust type name (`::`, `Arc<`, a CamelCase word), if it does.
#[allow(dead_code)]
pub fn type_name_in(msg: &str) -> Option<String> {
    if msg.contains("::") || msg.contains("Arc<") {
        return Some("`::` or `Arc<`".into());
    }
    msg.split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .filter(|w| w.starts_with(|c: char| c.is_ascii_uppercase()))
        .filter(|w| !["KiB", "MiB", "GiB", "TiB", "LimitMEMLOCK"].contains(w))
        .find(|w| {
            w.as_bytes()
                .windows(2)
                .any(|p| p[0].is_ascii_lowercase() && p[1].is_ascii_uppercase())
        })
        .map(|w| format!("CamelCase word `{w}`"))
}
