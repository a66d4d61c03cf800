#!/usr/bin/env bash
# Instructions per I/O of `ubdirect perf`'s own loop beside the driver's, on the host: the
# perf worker (src/cli/perf.rs, worker) against the NVMe device model (the ignored test
# cli::perf::model_loop::perf_loop_on_the_model) under `valgrind --tool=callgrind`, collecting
# inside `worker` only and never inside the model (NvmeModel's MMIO handler is toggled off, so
# the counts are host code: the loop, the driver, the library code they call). Each depth runs
# twice (SHORT and LONG seconds) and the difference is divided by the difference in I/Os, so the
# set-up (queue creation, buffers) and the drain fall out exactly.
#
# Instructions are grouped by the source file they come from (inlined code keeps its file) and,
# for the standard library's inlined code, by the function it was inlined into:
#   perf loop  the worker's own lines (src/cli/perf.rs: worker, Worker and its parts: slot table,
#              request set-up, counters, checks, rdtsc)
#   closure    the poll closure's lines (Worker::reap: latency, counts, verify, the free list)
#   histogram  core/src/util/histogram.rs (recording a latency)
#   driver     drivers/nvme/src/ and the rest of core/src, and std code inlined there (submit,
#              ring, poll, the doorbell writes); std code the compiler inlined from the driver
#              straight into the worker counts as the perf loop's
#   library    everything else (libc memset/memcpy, ...)
#
#   scripts/bench/perf-insn.sh          the table for DEPTHS (default "1 32 128 256")
#   scripts/bench/perf-insn.sh --lines  also the perf loop's costliest source lines per I/O
# env: DEPTHS, SHORT (default 0.3), LONG (default 1.5) seconds, BIN (the release test binary
# of ubdirect-cli instead of building one)
set -euo pipefail
cd "$(dirname "$0")/../.."

lines=0
while (($# > 0)); do
    case $1 in
    --lines) lines=1 && shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
    *) echo "perf-insn.sh: unknown argument '$1' (see --help)" >&2 && exit 2 ;;
    esac
done
DEPTHS=${DEPTHS:-"1 32 128 256"}
SHORT=${SHORT:-0.3} LONG=${LONG:-1.5}
fail() { echo "perf-insn.sh: $*" >&2 && exit 2; }
command -v valgrind >/dev/null && command -v callgrind_annotate >/dev/null ||
    fail "needs valgrind (callgrind): run scripts/deps.sh as root (or apt-get install valgrind)"
bin=${BIN:-}
if [[ -z $bin ]]; then
    bin=$(cargo test --release -q -p ubdirect-cli --bin ubdirect --no-run --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
    [[ -x $bin ]] || fail "cargo test --release -p ubdirect-cli --no-run built no test binary"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run QD SECONDS -> "ios perf closure histogram driver library sq_doorbells cq_doorbells" (totals); keeps
# the annotation in $tmp/an.QD.SECONDS
run() {
    local q=$1 s=$2 out
    out=$(UBD_PERF_QD=$q UBD_PERF_SECONDS=$s valgrind --tool=callgrind \
        --callgrind-out-file="$tmp/cg" --collect-atstart=no \
        --toggle-collect='ubdirect::cli::perf::worker' \
        --toggle-collect='*NvmeModel*mmio_write*' \
        "$bin" --ignored --exact cli::perf::model_loop::perf_loop_on_the_model \
        --test-threads=1 --nocapture 2>"$tmp/vg") ||
        fail "valgrind QD$q ${s}s failed: $(tail -n 5 "$tmp/vg")"
    out=$(grep -o 'perf-model:.*' <<<"$out") || fail "QD$q: the harness printed no result"
    callgrind_annotate --auto=no --inclusive=no --threshold=100 "$tmp/cg" >"$tmp/an.$q.$s" 2>/dev/null
    [[ $lines == 0 ]] || callgrind_annotate --auto=yes --show-percs=no --context=0 \
        --threshold=100 "$tmp/cg" >"$tmp/src.$q.$s" 2>/dev/null || true
    awk -v out="$out" '
        {
            n = $1; gsub(",", "", n)
            if (n !~ /^[0-9]+$/ || NF < 2 || /PROGRAM TOTALS/) next
            # "1,234 (12.34%)  file:function [object]": the file the instructions come from.
            file = $0; sub(/^[^)]*\)[ \t]+/, "", file)
            fn = file; sub(/^[^:]*:/, "", fn)
            if (file ~ /^core\/src\/util\/histogram\.rs/) c["hist"] += n
            else if (file ~ /^(drivers\/nvme\/src|core\/src)/) c["driver"] += n
            else if (fn ~ /^<?ubdirect::cli::perf::[A-Za-z_:]*reap::\{\{closure\}\}/) c["closure"] += n
            else if (fn ~ /^<?ubdirect::cli::perf::/) c["perf"] += n
            else if (fn ~ /^(<)?ubdirect_(nvme|core)/) c["driver"] += n
            else c["lib"] += n
        }
        END {
            split(out, w, " ")
            for (i = 1; i < length(w); i++) f[w[i]] = w[i + 1]
            printf "%d %d %d %d %d %d %d %d\n", f["completed"], c["perf"], c["closure"], c["hist"], c["driver"], c["lib"], f["sq_doorbells"], f["cq_doorbells"]
        }' "$tmp/an.$q.$s"
}
per() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN { printf "%.0f", (a - b) / n }'; }

echo "# $(date -u '+%F %T UTC'), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src drivers core || echo '+changes'), (${LONG}s - ${SHORT}s runs) per I/O"
echo "| QD | I/Os counted | perf loop insn/IO | its poll closure | histogram record | driver (submit, ring, poll, doorbells) | other library | total insn/IO | SQ doorbells/IO | CQ doorbells/IO |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for q in $DEPTHS; do
    read -r i1 p1 c1 h1 d1 l1 sq1 cq1 < <(run "$q" "$SHORT")
    read -r i2 p2 c2 h2 d2 l2 sq2 cq2 < <(run "$q" "$LONG")
    n=$((i2 - i1))
    ((n > 0)) || fail "QD$q: the longer run completed no more I/Os ($i1 vs $i2)"
    echo "| $q | $n | $(per "$p2" "$p1" $n) | $(per "$c2" "$c1" $n) | $(per "$h2" "$h1" $n) | $(per "$d2" "$d1" $n) | $(per "$l2" "$l1" $n) | $(per $((p2 + c2 + h2 + d2 + l2)) $((p1 + c1 + h1 + d1 + l1)) $n) | $(awk -v a=$((sq2 - sq1)) -v n=$n 'BEGIN { printf "%.3f", a / n }') | $(awk -v a=$((cq2 - cq1)) -v n=$n 'BEGIN { printf "%.3f", a / n }') |"
    if ((lines == 1)) && [[ -s $tmp/src.$q.$LONG ]]; then
        echo "QD$q: costliest lines of the long run (instructions, all I/Os; file at its '-- Auto-annotated source' header):"
        awk '/Auto-annotated source:/ { keep = ($0 ~ /src\/cli\/perf/) } keep && $1 ~ /^[0-9,]+$/ { n = $1; gsub(",", "", n); if (n + 0 > 0) print }' "$tmp/src.$q.$LONG" |
            sort -t' ' -k1,1 -rn | awk '{ n = $1; gsub(",", "", n) } { print }' | sort -rn | head -n 25
    fi
done
