#!/bin/bash
# scripts/fuzz-shards.sh: the by-hand fuzz run: each fuzz target as SHARDS processes of
# CASES cases (default 16 x 62,500 = 1,000,000), one seed per process (UBD_FUZZ_SEED = base +
# 1000 x target number + shard), the shards of one target in parallel.
#
#   scripts/fuzz-shards.sh LIMIT_S BIN:TEST ...
#     BIN   a test binary (cargo test --no-run prints their paths; a copy carried to a larger
#           machine works: the binaries need nothing but libc)
#     TEST  the exact libtest name (e.g. fuzz_io_queue_pair, ring::split::tests::fuzz_used_ring)
#   env: OUT (log folder, default ./fuzz-out), FZ_SHARDS (16), FZ_CASES (62500), FZ_BASE (20261130)
# Prints one line per target (shards passed, cases, panic lines, wall, max RSS, failed shards,
# seeds); the logs are $OUT/<test>/shard<i>.log, each naming its seed.
set -u
limit=${1:?usage: fuzz-shards.sh LIMIT_S BIN:TEST ...}
shift
OUT=${OUT:-./fuzz-out}
shards=${FZ_SHARDS:-16} cases=${FZ_CASES:-62500} base=${FZ_BASE:-20261130}
T=
[ -x /usr/bin/time ] && T='/usr/bin/time -f maxrss_kb_%M'
sum=$OUT/summary.txt
mkdir -p "$OUT"
ti=0
for spec in "$@"; do
    ti=$((ti + 1))
    bin=${spec%%:*} test=${spec#*:}
    [ -x "$bin" ] || { echo "fuzz-shards.sh: no executable '$bin'" >&2; exit 2; }
    d=$OUT/$ti-${test##*::}
    mkdir -p "$d"
    t0=$(date +%s.%N)
    for i in $(seq 0 $((shards - 1))); do
        seed=$((base + 1000 * ti + i))
        (
            # shellcheck disable=SC2086 # $T is a command prefix or nothing
            UBD_FUZZ_PROGRESS=1 UBD_FUZZ_CASES=$cases UBD_FUZZ_SEED=$seed timeout -s KILL "$limit" \
                $T "$bin" --exact "$test" --nocapture --test-threads 1 >"$d/shard$i.log" 2>&1
            echo "rc $?" >>"$d/shard$i.log"
        ) &
    done
    wait
    t1=$(date +%s.%N)
    ok=$(grep -l '^test result: ok. 1 passed' "$d"/shard*.log | wc -l)
    panics=$(cat "$d"/shard*.log | grep -c 'panicked')
    fails=$(grep -L '^test result: ok. 1 passed' "$d"/shard*.log | tr '\n' ' ')
    rss=$(grep -ho 'maxrss_kb_[0-9]*' "$d"/shard*.log | tr _ ' ' | awk '{ if ($3 > m) m = $3 } END { print m + 0 }')
    printf '%s: %d of %d shards passed x %d cases = %d cases; panic lines %d; wall %.0f s; max RSS %d MB; failed shards: %s; seeds %d..%d\n' \
        "$test" "$ok" "$shards" "$cases" $((ok * cases)) "$panics" "$(awk "BEGIN { print $t1 - $t0 }")" $((rss / 1024)) \
        "${fails:-none}" $((base + 1000 * ti)) $((base + 1000 * ti + shards - 1)) | tee -a "$sum"
done
