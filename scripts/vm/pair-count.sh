#!/usr/bin/env bash
# Count one pair run (scripts/vm/pair.sh -- sh tests/guest/pair/X.sh) from its output, for
# scripts/test.sh:
#
#   scripts/vm/pair-count.sh BOOT LOG STATUS
#
# BOOT: pair-<kernel> (the scope of the allowed skips, scripts/vm/expected-skips); LOG: pair.sh's
# output; STATUS: its exit status. Counts the initiator's TAP (guest/tap-count.awk: a script that
# printed no TAP fails), adds the target checks from pair.sh's closing "pair: ... targetcheck N
# passed, N failed" line (missing: one failure) and one failure for each skip the allow-list
# (UBD_VM_EXPECTED_SKIPS, default scripts/vm/expected-skips) does not allow in BOOT, each named on
# a line "skip not allowed in boot BOOT: ...". Last line: "P F S" (passed failed skipped).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
boot=${1:?usage: pair-count.sh BOOT LOG STATUS}
log=${2:?usage: pair-count.sh BOOT LOG STATUS}
rc=${3:?usage: pair-count.sh BOOT LOG STATUS}
allow=${UBD_VM_EXPECTED_SKIPS:-$here/expected-skips}
read -r p f s < <(awk -v rc="$rc" -f "$here/guest/tap-count.awk" "$log")
read -r tp tf < <(sed -n 's/^pair: .*targetcheck \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$log" | tail -n1)
if [[ -z ${tp:-} ]]; then
    echo "pair-count: no closing 'pair: ... targetcheck' line in $log (pair.sh stopped early)"
    tp=0 tf=1
fi
report=$("$here/skips.sh" "$allow" "$boot" "$log" 2>&1)
unexpected=$(sed -n 's/^skips: .*, \([0-9]*\) unexpected$/\1/p' <<<"$report")
if [[ -z $unexpected ]]; then
    echo "pair-count: could not check the skips against $allow: ${report//$'\n'/ }"
    unexpected=1
fi
grep '^unexpected: ' <<<"$report" | sed "s/^unexpected: /skip not allowed in boot $boot: /"
echo "$((p + tp)) $((f + tf + unexpected)) $s"
