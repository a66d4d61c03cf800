#!/usr/bin/env bash
# Instructions per I/O of the NVMe driver's own code, on the host: the real queue
# pair against the NVMe device model (drivers/nvme/examples/insn_per_io.rs) under
# `valgrind --tool=callgrind`, collecting only inside the example's three steps: submit_batch
# (submit_read for every free buffer: the driver's submit path and the caller's loop, ~28
# instructions of it), ring (SQ tail doorbell: the model fetches and completes the reads inside
# this MMIO write) and reap (poll, the caller's closure, CQ head doorbell). The model's own
# instructions (NvmeModel::mmio_write, inclusive) are subtracted, so "driver" counts only
# driver (and caller) code. Exact and repeatable (no PMU needed): the figures before/after a change.
#
#   scripts/bench/nvme-insn.sh                  the table for DEPTHS (default "1 32 128")
#   scripts/bench/nvme-insn.sh --old BIN        before/after in one run: BIN is an older build of
#                                               the example (cp target/release/examples/insn_per_io
#                                               somewhere before changing the driver)
#   scripts/bench/nvme-insn.sh --check          the regression test (scripts/test.sh runs it): QD 1
#                                               and 32, each driver total against its limit below;
#                                               exit 1 when one is over, or under half of
#                                               its baseline (BASE below), or when submit or
#                                               complete counted nothing. Last line:
#                                               "insn-check: ok (...)" or "insn-check: FAILED (...)"
# env: DEPTHS, IOS (reads per depth, default 20000), BIN (use this build instead of building one)
set -euo pipefail
cd "$(dirname "$0")/../.."

# Limits of --check, driver total insn/IO (submit + complete + doorbells), about 15-20 % above
# what this tree measured (BENCHMARKS.md, "Instructions per I/O"): a slower I/O path fails
# scripts/test.sh; a faster one should lower them.
declare -A LIMIT=([1]=750 [32]=510)
# The counts those limits were set from (same source). A total under half of them, or a step
# with no instructions at all, is a broken measurement, not a fast driver: callgrind never saw
# the step functions (inlined, renamed, a binary without them), and an empty count is "under
# the limit". --check fails on it; a real speed-up that large lowers BASE and LIMIT together.
declare -A BASE=([1]=642 [32]=436)

check=0 old=
while (($# > 0)); do
    case $1 in
    --check) check=1 && shift ;;
    --old) old=${2:?--old needs the path of an older insn_per_io build} && shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
    *) echo "nvme-insn.sh: unknown argument '$1' (see --help)" >&2 && exit 2 ;;
    esac
done
if ((check == 1)); then DEPTHS=${DEPTHS:-"1 32"}; else DEPTHS=${DEPTHS:-"1 32 128"}; fi
IOS=${IOS:-20000}

fail() {
    echo "nvme-insn.sh: $*" >&2
    ((check == 0)) || echo "insn-check: FAILED ($*)" >&2
    exit 2
}
command -v valgrind >/dev/null && command -v callgrind_annotate >/dev/null ||
    fail "needs valgrind (callgrind): run scripts/deps.sh as root (or apt-get install valgrind)"
if [[ -n $old && ! -x $old ]]; then fail "--old $old: not an executable build of insn_per_io"; fi
bin=${BIN:-}
if [[ -z $bin ]]; then
    cargo build --release -q -p ubdirect-nvme --example insn_per_io || fail "cargo build --release --example insn_per_io failed"
    bin=${CARGO_TARGET_DIR:-target}/release/examples/insn_per_io
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# measure BIN QD -> "ios submit complete model sq_doorbells cq_doorbells" (instruction totals)
measure() {
    local b=$1 q=$2 out
    out=$(valgrind --tool=callgrind --callgrind-out-file="$tmp/cg" --collect-atstart=no \
        --toggle-collect='insn_per_io::submit_batch' --toggle-collect='insn_per_io::ring' \
        --toggle-collect='insn_per_io::reap' "$b" "$q" "$IOS" 2>"$tmp/vg") ||
        fail "valgrind $b $q $IOS failed: $(tail -n 5 "$tmp/vg")"
    callgrind_annotate --inclusive=yes "$tmp/cg" >"$tmp/an"
    # Inclusive count of the largest line naming each function (callgrind_annotate prints
    # "12,345,678 (45.6%)  file:function").
    awk -v out="$out" '
        function add(name, pat, n) { if ($0 ~ pat && n > v[name]) v[name] = n }
        {
            n = $1; gsub(",", "", n)
            if (n !~ /^[0-9]+$/) next
            n += 0
            add("sub", "insn_per_io::submit_batch", n)
            add("ring", "insn_per_io::ring", n)
            add("reap", "insn_per_io::reap", n)
            add("model", "NvmeModel as .*Device.*>::mmio_write", n)
        }
        END {
            split(out, w, " ")
            for (i = 1; i < length(w); i++) f[w[i]] = w[i + 1]
            # The model runs inside both doorbell writes (ring: fetch, read, post; reap: the CQ
            # head): its instructions are taken out of the two together.
            printf "%d %d %d %d %d %d\n", f["completed"], v["sub"], v["ring"] + v["reap"] - v["model"], v["model"], f["sq_doorbells"], f["cq_doorbells"]
        }' "$tmp/an"
}
per() { awk -v a="$1" -v n="$2" 'BEGIN { printf "%d", a / n + 0.5 }'; }

sha=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- drivers core || echo '+changes')
echo "# $(date -u '+%F %T UTC'), commit $sha, $IOS reads per depth${old:+; before: $old}"
if [[ -n $old ]]; then
    echo "| QD | submit insn/IO before | after | complete + doorbell writes before | after | driver total before | after |"
    echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
else
    echo "| QD | submit insn/IO | complete + doorbell writes insn/IO | driver total insn/IO | model insn/IO | SQ doorbells/IO | CQ doorbells/IO |"
    echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
fi
over=() within=() under=()
for q in $DEPTHS; do
    measure "$bin" "$q" >"$tmp/m"
    read -r ios sub comp model sqd cqd <"$tmp/m"
    ((ios > 0)) || fail "QD$q: no completed reads counted"
    s=$(per "$sub" "$ios") c=$(per "$comp" "$ios") t=$(per $((sub + comp)) "$ios")
    if [[ -n $old ]]; then
        measure "$old" "$q" >"$tmp/m"
        read -r oios osub ocomp _ <"$tmp/m"
        echo "| $q | $(per "$osub" "$oios") | $s | $(per "$ocomp" "$oios") | $c | $(per $((osub + ocomp)) "$oios") | $t |"
    else
        echo "| $q | $s | $c | $t | $(per "$model" "$ios") | $(awk -v a="$sqd" -v n="$ios" 'BEGIN { printf "%.3f", a / n }') | $(awk -v a="$cqd" -v n="$ios" 'BEGIN { printf "%.3f", a / n }') |"
    fi
    if ((check == 1)); then
        lim=${LIMIT[$q]:-}
        [[ -n $lim ]] || fail "no limit for QD$q (limits exist for QD ${!LIMIT[*]})"
        floor=$((${BASE[$q]:?no baseline for QD$q} / 2))
        if ((sub <= 0 || comp <= 0)); then
            under+=("QD$q submit $s complete $c insn/IO: callgrind counted no instructions in a step (submit_batch, or ring + reap less the model)")
        elif ((t < floor)); then
            under+=("QD$q $t < $floor insn/IO, half the baseline ${BASE[$q]}")
        elif ((t > lim)); then
            over+=("QD$q $t > $lim insn/IO")
        else
            within+=("$floor <= QD$q $t <= $lim")
        fi
    fi
done
if ((check == 1)); then
    if ((${#under[@]} > 0)); then
        msg=$(printf '%s; ' "${under[@]}")
        echo "insn-check: FAILED (the measurement saw too little of the driver: ${msg%; }; the example's step functions (insn_per_io::submit_batch, ring, reap) must stay out of line and keep their names, see --help)"
        exit 1
    fi
    if ((${#over[@]} > 0)); then
        echo "insn-check: FAILED (driver instructions per I/O over the limit: ${over[*]}; the I/O path got slower: find the cause with callgrind_annotate, see BENCHMARKS.md, Instructions per I/O)"
        exit 1
    fi
    echo "insn-check: ok (driver instructions per I/O: ${within[*]})"
fi
