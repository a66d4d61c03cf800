//! Every test RELIABILITY.md cites exists: each backticked name in a table's test column is
//! a file of the tree (`tests/guest/30-pipeline.sh`, `guest_faults.rs`) or a test function in
//! the file or module it names (`guest_faults.rs::nvme_reset_under_the_driver_times_out_and_reopens`,
//! `model_hostile::cap_mqes_zero_is_a_typed_error`, `pci_cap::tests::missing_notify_is_named`),
//! or, cited alone, a function defined somewhere in the tree. A renamed or moved test fails here.
//!
//! After the whole suite, `scripts/test.sh` runs the ignored test
//! `every_cited_test_ran_in_the_suite` over the suite's logs (`UBD_TEST_LOGS`): every cited
//! `#[test]` function must have run there (a libtest line `test ...::name ... ok`) or been
//! skipped visibly (`... ignored`), and every cited guest script must have run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The repository's files outside `target/` and hidden directories, by path relative to the
/// root, with their text (Rust and shell sources; empty for the others).
fn sources(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name == "target" {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                let text = if name.ends_with(".rs") || name.ends_with(".sh") {
                    std::fs::read_to_string(&p).unwrap_or_default()
                } else {
                    String::new()
                };
                out.insert(rel, text);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The backticked spans of the test column(s) of every table in `doc`, with the line they are on.
fn cited(doc: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut test_cols: Vec<usize> = Vec::new();
    let mut prev_was_table = false;
    for (n, line) in doc.lines().enumerate() {
        let is_table = line.starts_with('|');
        if !is_table {
            prev_was_table = false;
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        if !prev_was_table {
            // A header row: the columns whose title names tests.
            test_cols = cells
                .iter()
                .enumerate()
                .filter(|(_, c)| c.contains("test") && !c.contains("not handled"))
                .map(|(i, _)| i)
                .collect();
            prev_was_table = true;
            continue;
        }
        prev_was_table = true;
        for &i in &test_cols {
            let Some(cell) = cells.get(i) else { continue };
            for (k, span) in cell.split('`').enumerate() {
                if k % 2 == 1 {
                    out.push((n + 1, span.to_string()));
                }
            }
        }
    }
    out
}

/// Whether `text` defines a function `name`.
fn defines(text: &str, name: &str) -> bool {
    let needle = format!("fn {name}");
    text.match_indices(&needle).any(|(i, _)| {
        let after = text[i + needle.len()..].chars().next();
        !matches!(after, Some(c) if c.is_alphanumeric() || c == '_')
    })
}

/// Files that module path segment `seg` can name: `seg.rs`, `seg_tests.rs`, `seg/...` or the
/// path itself when `seg` is one.
fn files_for<'a>(src: &'a BTreeMap<String, String>, seg: &str) -> Vec<(&'a String, &'a String)> {
    let stem = seg.trim_end_matches(".rs").trim_end_matches(".sh");
    src.iter()
        .filter(|(path, _)| {
            if seg.contains('/') {
                return path.ends_with(seg);
            }
            let file = path.rsplit('/').next().unwrap();
            let fstem = file.trim_end_matches(".rs").trim_end_matches(".sh");
            fstem == stem
                || fstem == format!("{stem}_tests")
                || path.contains(&format!("/{stem}/"))
                || path.starts_with(&format!("{stem}/"))
        })
        .collect()
}

/// Why the citation `span` names nothing in the tree, if it does not.
fn check(src: &BTreeMap<String, String>, span: &str) -> Option<String> {
    let span = span.trim();
    // `a::b::{c, d}` cites c and d.
    if let Some((head, list)) = span.split_once("::{") {
        let names = list.trim_end_matches('}');
        return names
            .split(',')
            .find_map(|n| check(src, &format!("{head}::{}", n.trim())));
    }
    if span.contains([' ', '=']) || span.is_empty() || span.starts_with('/') {
        return None; // a command line, a setting or a system path, not a test
    }
    let segs: Vec<&str> = span.split("::").collect();
    let is_file = |s: &str| s.ends_with(".rs") || s.ends_with(".sh") || s.contains('/');
    if segs.len() == 1 {
        let s = segs[0];
        if is_file(s) {
            let found = src.keys().any(|p| {
                p.ends_with(s.trim_start_matches("./"))
                    && (s.contains('/') || p.rsplit('/').next() == Some(s))
            });
            return (!found).then(|| format!("no file {s}"));
        }
        let ident = s
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if ident && !src.values().any(|t| defines(t, s)) && files_for(src, s).is_empty() {
            return Some(format!("no fn, file or module {s}"));
        }
        return None;
    }
    let last = *segs.last().unwrap();
    let modules: Vec<&str> = segs[..segs.len() - 1]
        .iter()
        .copied()
        .filter(|s| *s != "tests" && *s != "crate" && !s.starts_with("ubdirect"))
        .collect();
    if last == "*" || last == "tests" {
        let m = modules.last().copied().unwrap_or(last);
        return files_for(src, m)
            .is_empty()
            .then(|| format!("no file or module {m}"));
    }
    if !last.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        || last.starts_with(|c: char| c.is_ascii_uppercase())
    {
        return None; // a type or variant (`PipelineError::Config`), not a test
    }
    // The innermost module that names files decides; a type path (`Mmio::check`) names none.
    for m in modules.iter().rev() {
        let files = files_for(src, m);
        if files.is_empty() {
            if is_file(m) {
                return Some(format!("no file {m}"));
            }
            continue;
        }
        return (!files.iter().any(|(_, t)| defines(t, last)))
            .then(|| format!("no fn {last} in {m}"));
    }
    (!src.values().any(|t| defines(t, last))).then(|| format!("no fn {last} anywhere"))
}

/// The `#[test]` functions the sources define: a `fn` whose attributes (the lines right above
/// it) include `#[test]`.
fn test_fns(src: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for text in src.values() {
        let mut attributed = false;
        for line in text.lines().map(str::trim) {
            if line.starts_with("#[test]") {
                attributed = true;
            } else if attributed && line.starts_with("fn ") {
                let name: String = line[3..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.insert(name);
                attributed = false;
            } else if !(line.starts_with("#[") || line.starts_with("//")) {
                attributed = false;
            }
        }
    }
    out
}

/// What the logs say of test function `name`: its libtest lines (`test a::b::name ... ok`).
#[derive(Debug, PartialEq)]
enum Ran {
    /// At least one run passed or failed (a failure is the suite's own count).
    Yes,
    /// Only ignored: a visible skip, with the reason libtest printed.
    Ignored(String),
    /// No line names it.
    Missing,
}

/// Every libtest result line of `logs`, by test function name (the last path segment).
fn results(logs: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in logs.lines() {
        let Some(rest) = line.trim_start().strip_prefix("test ") else {
            continue;
        };
        let Some((path, outcome)) = rest.split_once(" ... ") else {
            continue;
        };
        // `test a::b ... ok`, or `test a::b - should panic ... ok` for a #[should_panic] test.
        let path = path.split(" - ").next().unwrap_or(path);
        let name = path.rsplit("::").next().unwrap_or(path).trim();
        out.entry(name.to_string())
            .or_default()
            .push(outcome.trim().to_string());
    }
    out
}

fn ran(results: &BTreeMap<String, Vec<String>>, name: &str) -> Ran {
    match results.get(name) {
        None => Ran::Missing,
        Some(v) if v.iter().any(|o| !o.starts_with("ignored")) => Ran::Yes,
        Some(v) => Ran::Ignored(v[0].clone()),
    }
}

/// The cited test functions and guest scripts, deduplicated: `(name, is_script)`.
fn cited_runnables(doc: &str, tests: &BTreeSet<String>) -> BTreeSet<(String, bool)> {
    let mut out = BTreeSet::new();
    for (_, span) in cited(doc) {
        let span = span.trim();
        let names: Vec<&str> = match span.split_once("::{") {
            Some((_, l)) => l.trim_end_matches('}').split(',').map(str::trim).collect(),
            None if span.contains([' ', '=']) || span.starts_with('/') => continue,
            None => vec![span.rsplit("::").next().unwrap_or(span)],
        };
        for n in names {
            if n.ends_with(".sh") && (span.contains("tests/guest/") || !n.contains('/')) {
                let base = n.rsplit('/').next().unwrap_or(n);
                if span.contains("tests/guest/") || span == base {
                    out.insert((base.to_string(), true));
                }
            } else if tests.contains(n) {
                out.insert((n.to_string(), false));
            }
        }
    }
    out
}

#[test]
#[ignore = "needs the suite's logs: scripts/test.sh runs it with UBD_TEST_LOGS after the guest runs"]
fn every_cited_test_ran_in_the_suite() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir =
        std::env::var("UBD_TEST_LOGS").expect("UBD_TEST_LOGS: the directory of the suite's logs");
    // Only this run's logs: those written since UBD_TEST_LOGS_SINCE (seconds since the epoch).
    let since = std::env::var("UBD_TEST_LOGS_SINCE")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map(|s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
    let mut logs = String::new();
    for e in std::fs::read_dir(&dir)
        .expect("UBD_TEST_LOGS is a directory")
        .flatten()
    {
        let fresh = match (since, e.metadata().and_then(|m| m.modified())) {
            (Some(t), Ok(m)) => m >= t,
            _ => true,
        };
        if fresh && e.path().extension().is_some_and(|x| x == "log") {
            // The name too: a pair script's log is named after it (pair-6.12-nvmf.sh.log).
            logs.push_str(&format!("=== log {}\n", e.file_name().to_string_lossy()));
            logs.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
        }
    }
    let doc = std::fs::read_to_string(root.join("RELIABILITY.md")).unwrap();
    let src = sources(root);
    let results = results(&logs);
    let (mut yes, mut ignored, mut missing) = (0, Vec::new(), Vec::new());
    for (name, script) in cited_runnables(&doc, &test_fns(&src)) {
        if script {
            // The guest plan names each script it runs ("# 30-pipeline.sh" / "ok ... 30-pipeline.sh").
            if logs.contains(&name) {
                yes += 1;
            } else {
                missing.push(name);
            }
            continue;
        }
        match ran(&results, &name) {
            Ran::Yes => yes += 1,
            Ran::Ignored(why) => ignored.push(format!("{name} ({why})")),
            Ran::Missing => missing.push(name),
        }
    }
    println!(
        "cited-tests: {yes} ran, {} skipped visibly, {} never ran",
        ignored.len(),
        missing.len()
    );
    for i in &ignored {
        println!("cited-tests: skipped: {i}");
    }
    assert!(
        missing.is_empty(),
        "cited in RELIABILITY.md but not run anywhere in the suite:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_run_check_reads_libtest_lines_and_finds_test_functions() {
    let logs = "test model_hostile::a ... ok\ntest x::e - should panic ... ok\nrunning 2 tests\ntest b ... ignored, gpu: needs a GPU\ntest tests::c ... FAILED\ntest b ... ignored\n";
    let r = results(logs);
    assert_eq!(ran(&r, "a"), Ran::Yes);
    assert_eq!(
        ran(&r, "b"),
        Ran::Ignored("ignored, gpu: needs a GPU".into())
    );
    assert_eq!(
        ran(&r, "c"),
        Ran::Yes,
        "a failure is counted by the suite itself"
    );
    assert_eq!(ran(&r, "d"), Ran::Missing);
    assert_eq!(
        ran(&r, "e"),
        Ran::Yes,
        "a should_panic test's line names it too"
    );
    let mut src = BTreeMap::new();
    src.insert(
        "x.rs".to_string(),
        "#[test]\n#[ignore = \"guest\"]\nfn t1() {}\nfn helper() {}\n#[test]\n// why\nfn t2() {}\n"
            .to_string(),
    );
    let t = test_fns(&src);
    assert_eq!(t, ["t1", "t2"].iter().map(|s| s.to_string()).collect());
    let doc = "| # | what | test |\n| --- | --- | --- |\n| 1 | x | `x.rs::t1`, `helper`, `x.rs::{t1, t2}`, `tests/guest/30-pipeline.sh` |\n";
    let c = cited_runnables(doc, &t);
    let want: BTreeSet<(String, bool)> = [("t1", false), ("t2", false), ("30-pipeline.sh", true)]
        .iter()
        .map(|(n, s)| (n.to_string(), *s))
        .collect();
    assert_eq!(c, want);
}

#[test]
fn every_test_reliability_md_cites_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("RELIABILITY.md")).unwrap();
    let src = sources(root);
    let cites = cited(&doc);
    assert!(cites.len() > 100, "only {} citations found", cites.len());
    let stale: Vec<String> = cites
        .iter()
        .filter_map(|(line, span)| {
            check(&src, span).map(|why| format!("line {line}: `{span}`: {why}"))
        })
        .collect();
    assert!(
        stale.is_empty(),
        "{} stale citations:\n{}",
        stale.len(),
        stale.join("\n")
    );
}

#[test]
fn the_checker_finds_what_is_missing() {
    let mut src = BTreeMap::new();
    src.insert(
        "drivers/nvme/tests/model_hostile.rs".to_string(),
        "#[test]\nfn cap_mqes_zero_is_a_typed_error() {}\nfn helper_two() {}".to_string(),
    );
    src.insert(
        "tests/guest/30-pipeline.sh".to_string(),
        "#!/bin/sh".to_string(),
    );
    src.insert(
        "drivers/virtio-net/src/pci_cap.rs".to_string(),
        "mod tests { fn missing_notify_is_named() {} }".to_string(),
    );
    for ok in [
        "model_hostile::cap_mqes_zero_is_a_typed_error",
        "drivers/nvme/tests/model_hostile.rs::cap_mqes_zero_is_a_typed_error",
        "model_hostile.rs::{cap_mqes_zero_is_a_typed_error, helper_two}",
        "tests/guest/30-pipeline.sh",
        "30-pipeline.sh",
        "pci_cap::tests::missing_notify_is_named",
        "cap_mqes_zero_is_a_typed_error",
        "model_hostile",
        "cargo test -p x",
        "PipelineError::Config",
        "/sys/bus/pci/devices",
    ] {
        assert_eq!(check(&src, ok), None, "{ok}");
    }
    for stale in [
        "model_hostile::cap_mqes_zero_is_refused",
        "model_hostile.rs::{cap_mqes_zero_is_a_typed_error, gone}",
        "tests/guest/31-pipeline.sh",
        "model_hostiles.rs::cap_mqes_zero_is_a_typed_error",
        "pci_cap::tests::renamed",
        "renamed_test_fn",
    ] {
        assert!(check(&src, stale).is_some(), "{stale}");
    }
    let doc = "| # | scenario | test | not handled yet |\n| --- | --- | --- | --- |\n| 1 | x `CoreError::A` | `model_hostile::t` | `not_a_test` |\n";
    assert_eq!(cited(doc), [(3, "model_hostile::t".to_string())]);
}
