# Count one Rust test binary's output. Prints "passed failed skipped".
# -v rc=<exit status of the binary>. Sums libtest's "test result:" lines; a binary without one
# (harness = false, or killed) counts as one test passed or failed by its exit status; a non-zero
# exit after a summary without failures (a crash after the tests) counts one failure. A test that
# returned early printing "UBD-SKIP <test>: <reason>" (ubdirect_core::testbed::skip; anywhere on a
# line, as --nocapture output follows "test x ... ") counts as skipped, not passed; libtest's
# "ignored" counts as skipped too.
/^test result: / {
    for (i = 1; i < NF; i++) {
        if ($(i + 1) ~ /^passed/) p += $i
        if ($(i + 1) ~ /^failed/) f += $i
        if ($(i + 1) ~ /^ignored/) s += $i
    }
    r++
}
index($0, "UBD-SKIP ") { k++ }
END {
    if (r == 0) { if (rc == 0) p++; else f++ }
    else if (rc != 0 && f == 0) f++
    # A skip marker moves one test from passed to skipped (a failing test stays failed).
    m = (k < p) ? k : p
    p -= m
    s += m
    printf "%d %d %d\n", p, f, s
}
