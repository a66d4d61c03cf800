#!/usr/bin/env bash
# Check a guest run's skips against the allow-list of skips the test bed is expected to cause.
#
#   scripts/vm/skips.sh ALLOW-LIST BOOT [guest.log]      (the log on stdin when not given)
#
# A skip is what the counters (guest/tap-count.awk, guest/libtest-count.awk) count as skipped:
# a TAP "ok ... # SKIP why" or "not ok ... # TODO why" line, a TAP "1..0 # SKIP why" plan (a
# whole file skipped) and a Rust test's "UBD-SKIP <test>: <why>" line. BOOT names the boot the
# log comes from: 6.12, 6.1, ubd, ubd-noiommu (scripts/vm/suite.sh), pair-6.12, pair-ubd
# (scripts/vm/pair.sh's initiator). The allow-list holds one entry a line,
#   [BOOT BOOT...] <text> -- <why the test bed cannot avoid it in those boots>
# ('#' starts a comment): a skip is allowed when BOOT is among the entry's boots and its line
# contains <text>. An entry without its boots, or without a reason, is an error in the list.
# Prints "allowed: LINE (why)" or "unexpected: LINE" per skip and a last line "skips: N, N
# allowed, N unexpected"; exit 1 when any is unexpected, 2 when the list cannot be used.
set -euo pipefail
allow=${1:?usage: skips.sh ALLOW-LIST BOOT [guest.log]}
boot=${2:?usage: skips.sh ALLOW-LIST BOOT [guest.log]}
log=${3:-/dev/stdin}
[[ -f $allow ]] || { echo "skips.sh: no allow-list file '$allow'" >&2 && exit 2; }
awk -v allow="$allow" -v boot="$boot" '
    BEGIN {
        while ((getline l < allow) > 0) {
            ln++
            sub(/#.*/, "", l)
            if (l !~ /[^ \t]/) continue
            sub(/^[ \t]+/, "", l)
            i = index(l, " -- ")
            if (substr(l, 1, 1) != "[" || index(l, "]") == 0 || i == 0) {
                printf "skips.sh: %s line %d: want \"[BOOT...] <text> -- <why>\", got: %s\n", allow, ln, l > "/dev/stderr"
                bad = 1
                exit 2
            }
            j = index(l, "]")
            scope = substr(l, 2, j - 2)
            t = substr(l, j + 1, i - j - 1)
            sub(/^[ \t]+/, "", t); sub(/[ \t]+$/, "", t)
            if (t == "" || scope !~ /[^ \t,]/) {
                printf "skips.sh: %s line %d: an entry names its boots and its text: %s\n", allow, ln, l > "/dev/stderr"
                bad = 1
                exit 2
            }
            gsub(/,/, " ", scope)
            na++
            text[na] = t
            why[na] = substr(l, i + 4)
            boots[na] = " " scope " "
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
            if (index(boots[j], " " boot " ") && index(line, text[j])) {
                print "allowed: " line " (" why[j] ")"
                a++
                return
            }
        }
        print "unexpected: " line
        u++
    }
    END {
        if (bad) exit 2
        printf "skips: %d, %d allowed, %d unexpected\n", n, a, u
        exit (u > 0)
    }' "$log"
