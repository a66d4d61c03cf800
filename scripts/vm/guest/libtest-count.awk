# Count one Rust test binary's output. Prints "passed failed skipped".
# -v rc=<exit status of the binary>. Sums libtest's "test result:" lines; a binary without one
# (harness = false, or killed) counts as one test passed or failed by its exit status; a non-zero
# exit after a summary without failures (a crash after the tests) counts one failure.
/^test result: / {
    for (i = 1; i < NF; i++) {
        if ($(i + 1) ~ /^passed/) p += $i
        if ($(i + 1) ~ /^failed/) f += $i
        if ($(i + 1) ~ /^ignored/) s += $i
    }
    r++
}
END {
    if (r == 0) { if (rc == 0) p++; else f++ }
    else if (rc != 0 && f == 0) f++
    printf "%d %d %d\n", p, f, s
}
