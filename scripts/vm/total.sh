#!/usr/bin/env bash
# The closing line of scripts/test.sh from its summary lines (stdin, one a line):
#   total: N passed, N failed, N skipped
# It adds up the counted lines (skips from the host, python and guest lines) ("host:", "python:", "vm-selftest:", "guest:", "guest[K]:", "guest-pair[K]:",
# "soak:": "<name>: N passed, N failed[, N skipped]") and one failure for each other line that
# says FAILED (deps, fmt, clippy, doc). FAILED-STEPS (the one argument, 0 or 1) is whether
# test.sh saw a step fail: then the total shows at least one failure even if no line counted one.
#   printf '%s\n' "${summary[@]}" | scripts/vm/total.sh "$failed"
set -uo pipefail
failed=${1:?usage: total.sh FAILED-STEPS (0 or 1) < summary lines}
# The patterns live in variables: written inline after =~ (as test.sh had them), bash 5.2.15
# matched no guest-pair[K] line, so the pair suites' counts were left out of the total.
counted='^(host|python|vm-selftest|guest|soak|guest\[[^]]*\]|guest-pair\[[^]]*\]): ([0-9]+) passed, ([0-9]+) failed'
skipped='^(host|python|guest(-pair)?(\[[^]]*\])?): [0-9]+ passed, [0-9]+ failed, ([0-9]+) skipped'
tp=0 tf=0 ts=0
while IFS= read -r l; do
    if [[ $l =~ $counted ]]; then
        tp=$((tp + BASH_REMATCH[2])) tf=$((tf + BASH_REMATCH[3]))
        [[ $l =~ $skipped ]] && ts=$((ts + BASH_REMATCH[4]))
    elif [[ $l == *FAILED* ]]; then
        tf=$((tf + 1))
    fi
done
((failed == 0 || tf > 0)) || tf=1
echo "total: $tp passed, $tf failed, $ts skipped"
