#!/usr/bin/env bash
# Run a pair run's target-side checks (scripts/vm/pair.sh) and compare them with the requests.
#
#   scripts/vm/targetcheck.sh TARGET-RUN-DIR INITIATOR-LOG
#
# The initiator printed "UBD-TARGETCHECK <name> file-bytes|file-eq ..." (hostcheck.sh's syntax)
# and, at its end, "@@UBD-TARGETCHECKS@@ N": how many it printed. Each request is checked against
# the target's run directory (results in TARGET-RUN-DIR/targetcheck.log). Prints each failed
# check as "targetcheck: not ok ..." and a last line "targetcheck: N passed, N failed (<why>)".
# A request count that differs from the checks that ran (a line lost on the console, a target
# without a run directory) or is missing counts one failure. Exit 1 when any failed.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tdir=${1?usage: targetcheck.sh TARGET-RUN-DIR INITIATOR-LOG}
ilog=${2:?usage: targetcheck.sh TARGET-RUN-DIR INITIATOR-LOG}
pass=0 fail=0 note=
requested=$(sed -n 's/^.*@@UBD-TARGETCHECKS@@ \([0-9]*\).*$/\1/p' "$ilog" 2>/dev/null | tail -n1)
reqs=$(grep -o 'UBD-TARGETCHECK .*' "$ilog" 2>/dev/null | sed 's/^UBD-TARGETCHECK /UBD-HOSTCHECK /')
if [[ -n $reqs ]]; then
    if [[ -n $tdir && -d $tdir ]]; then
        "$here/hostcheck.sh" "$tdir" <<<"$reqs" >"$tdir/targetcheck.log" 2>&1
        pass=$(grep -c '^ok ' "$tdir/targetcheck.log")
        fail=$(grep -c '^not ok ' "$tdir/targetcheck.log")
        grep '^not ok ' "$tdir/targetcheck.log" | sed 's/^/targetcheck: /'
    else
        note="no target run directory '$tdir': "
    fi
fi
if [[ -z $requested ]]; then
    note="${note}the initiator never said how many it requested (no @@UBD-TARGETCHECKS@@ line in $ilog)"
    fail=$((fail + 1))
elif ((pass + fail != requested)); then
    note="${note}$requested requested, $((pass + fail)) ran"
    fail=$((fail + 1))
else
    note="${note}$requested requested"
fi
echo "targetcheck: $pass passed, $fail failed ($note)"
((fail == 0))
