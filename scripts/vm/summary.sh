#!/usr/bin/env bash
# The closing lines of a guest suite run (scripts/vm/suite.sh), from its run directory:
#
#   scripts/vm/summary.sh RUN-DIR RUN-STATUS RUN-TIMEOUT SUITE-SECONDS BOOT [EARLIER]
#
# BOOT: the boot the run was (6.12, 6.1, ubd, ubd-noiommu), the scope of its allowed skips.
# EARLIER: what happened to an earlier boot of this suite (suite.sh boots again after a frozen
# guest), shown on the closing line.
# Reads guest.log (the plan's "@@UBD-SUITE@@ <suite> <passed> <failed> <skipped>" and
# "@@UBD-HOSTCHECKS@@ <requested>" lines, the skip lines), hostcheck.log and timing. Prints
# "guest-shell: N passed, N failed, N skipped", the same for guest-rust and hostcheck, a line per
# skip that the allow-list (scripts/vm/expected-skips, or UBD_VM_EXPECTED_SKIPS=FILE) does not
# allow, and "guest: N passed, N failed, N skipped; <timing>". Failures added: a suite the guest
# never reported, a host-check count that differs from what the guest requested, each skip not
# allowed, a guest killed at its deadline or one that did not finish (RUN-STATUS not 0 or 1), and
# a plan that exited 1 without a counted failure. Exit 1 when anything failed.
set -euo pipefail
UBD_VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
run_dir=${1:?usage: summary.sh RUN-DIR RUN-STATUS RUN-TIMEOUT SUITE-SECONDS}
rc=${2:?run status}
run_timeout=${3:?run timeout}
suite_s=${4:?suite seconds}
boot=${5:?boot (6.12, 6.1, ubd, ubd-noiommu)}
earlier=${6:-}
glog="$run_dir/guest.log"

suite_line() { # suite_line NAME -> "passed failed skipped" or nothing
    sed -n "s/^@@UBD-SUITE@@ $1 \([0-9]*\) \([0-9]*\) \([0-9]*\)$/\1 \2 \3/p" "$glog" | tail -n1
}
total_pass=0 total_fail=0 total_skip=0 lines=()
for s in guest-shell guest-rust; do
    r=$(suite_line "$s")
    if [[ -z $r ]]; then
        lines+=("$s: 0 passed, 1 failed, 0 skipped (the guest never reported this suite: see $glog)")
        total_fail=$((total_fail + 1))
        continue
    fi
    read -r p f k <<<"$r"
    lines+=("$s: $p passed, $f failed, $k skipped")
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
    total_skip=$((total_skip + k))
done

# run.sh ran the guest's UBD-HOSTCHECK requests (after each test binary and at exit); the plan
# said how many the tests printed. One that never ran (lost on the console, printed after the
# guest stopped reading) is a failure, and so is one more than requested.
hp=$(grep -c '^ok ' "$run_dir/hostcheck.log" 2>/dev/null || true)
hf=$(grep -c '^not ok ' "$run_dir/hostcheck.log" 2>/dev/null || true)
hp=${hp:-0} hf=${hf:-0}
requested=$(sed -n 's/^@@UBD-HOSTCHECKS@@ \([0-9]*\)$/\1/p' "$glog" | tail -n1)
hc_note=
if [[ -z $requested ]]; then
    hc_note=" (the guest never said how many it requested: see $glog)"
    hf=$((hf + 1))
elif ((hp + hf != requested)); then
    hc_note=" ($requested requested, $((hp + hf)) ran: see $run_dir/hostcheck.log)"
    hf=$((hf + 1))
else
    hc_note=" ($requested requested)"
fi
lines+=("hostcheck: $hp passed, $hf failed, 0 skipped$hc_note")
total_pass=$((total_pass + hp))
total_fail=$((total_fail + hf))

# Every skip must be one the test bed is expected to cause.
allow=${UBD_VM_EXPECTED_SKIPS:-$UBD_VM_DIR/expected-skips}
skip_report=$("$UBD_VM_DIR/skips.sh" "$allow" "$boot" "$glog" 2>&1 || true)
unexpected=$(sed -n 's/^skips: .*, \([0-9]*\) unexpected$/\1/p' <<<"$skip_report")
if [[ -z $unexpected ]]; then
    lines+=("skips: could not check them against $allow: ${skip_report//$'\n'/ }")
    total_fail=$((total_fail + 1))
elif ((unexpected > 0)); then
    while IFS= read -r l; do lines+=("skip not allowed in boot $boot by $allow: ${l#unexpected: }"); done < <(grep '^unexpected: ' <<<"$skip_report")
    total_fail=$((total_fail + unexpected))
fi

status_note=
case $rc in
0 | 1) ;;
124)
    status_note=" (DEADLINE: the guest was killed after ${run_timeout}s)"
    total_fail=$((total_fail + 1))
    ;;
123)
    status_note=" (FROZE: $(cat "$run_dir/frozen" 2>/dev/null))"
    total_fail=$((total_fail + 1))
    ;;
*)
    status_note=" (the guest did not finish: run.sh status $rc)"
    total_fail=$((total_fail + 1))
    ;;
esac
# The plan's own verdict must agree with the counts.
if ((rc == 1 && total_fail == 0)); then
    status_note=" (the test plan exited 1 without a counted failure: see $glog)"
    total_fail=1
fi

echo
printf '%s\n' "${lines[@]}"
echo "guest: $total_pass passed, $total_fail failed, $total_skip skipped$status_note; $(cat "$run_dir/timing" 2>/dev/null), suite ${suite_s}s; logs: $run_dir${earlier:+; $earlier}"
((total_fail == 0))
