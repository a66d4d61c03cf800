#!/usr/bin/env bash
# Check a guest run's skips against the allow-list of skips the test bed is expected to cause.
#
#   scripts/vm/skips.sh ALLOW-LIST [guest.log]      (the log on stdin when not given)
#
# A skip is what the counters (guest/tap-count.awk, guest/libtest-count.awk) count as skipped:
# a TAP "ok ... # SKIP why" or "not ok ... # TODO why" line, a TAP "1..0 # SKIP why" plan (a
# whole file skipped) and a Rust test's "UBD-SKIP <test>: <why>" line. The allow-list holds one
# entry a line, "<text> -- <why the test bed cannot avoid it>" ('#' starts a comment): a skip is
# allowed when its line contains <text>. Prints "allowed: LINE (why)" or "unexpected: LINE" per
# skip and a last line "skips: N, N allowed, N unexpected"; exit 1 when any is unexpected.
set -euo pipefail
allow=${1:?usage: skips.sh ALLOW-LIST [guest.log]}
log=${2:-/dev/stdin}
[[ -f $allow ]] || { echo "skips.sh: no allow-list file '$allow'" >&2 && exit 2; }
awk -v allow="$allow" '
    BEGIN {
        while ((getline l < allow) > 0) {
            sub(/#.*/, "", l)
            if (l !~ /[^ \t]/) continue
            i = index(l, " -- ")
            if (i == 0) { text[++na] = l; why[na] = "no reason given" }
            else { text[++na] = substr(l, 1, i - 1); why[na] = substr(l, i + 4) }
            sub(/^[ \t]+/, "", text[na]); sub(/[ \t]+$/, "", text[na])
        }
    }
    { sub(/\r+$/, "") }
    /^ok([ \t]|$)/ && /# *[Ss][Kk][Ii][Pp]/ { skip($0); next }
    /^not ok([ \t]|$)/ && /# *[Tt][Oo][Dd][Oo]/ { skip($0); next }
    /^1\.\.0([^0-9]|$)/ { skip($0); next }
    index($0, "UBD-SKIP ") { skip(substr($0, index($0, "UBD-SKIP "))); next }
    function skip(line,   j) {
        n++
        for (j = 1; j <= na; j++) {
            if (text[j] != "" && index(line, text[j])) { print "allowed: " line " (" why[j] ")"; a++; return }
        }
        print "unexpected: " line
        u++
    }
    END {
        printf "skips: %d, %d allowed, %d unexpected\n", n, a, u
        exit (u > 0)
    }' "$log"
