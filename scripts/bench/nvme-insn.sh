#!/usr/bin/env bash
# Instructions per I/O of the NVMe driver's own code (issue 11), on the host: the real queue
# pair against the NVMe device model (drivers/nvme/examples/insn_per_io.rs) under
# `valgrind --tool=callgrind`, collecting only inside the example's three steps: submit_batch
# (submit_read for every free buffer: the driver's submit path and the caller's loop, ~28
# instructions of it), ring (SQ tail doorbell: the model fetches and completes the reads inside
# this MMIO write) and reap (poll, the caller's closure, CQ head doorbell). The model's own
# instructions (NvmeModel::mmio_write, inclusive) are subtracted, so "driver" counts only
# driver (and caller) code. Exact and repeatable (no PMU needed): the figures before/after a change.
#
#   scripts/bench/nvme-insn.sh        (env: DEPTHS="1 32 128" IOS=20000)
set -euo pipefail
cd "$(dirname "$0")/../.."
DEPTHS=${DEPTHS:-"1 32 128"}
IOS=${IOS:-20000}
command -v valgrind >/dev/null || { echo "nvme-insn.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
cargo build --release -q -p ubdirect-nvme --example insn_per_io
bin=target/release/examples/insn_per_io
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# $(date -u '+%F %T UTC'), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- drivers core || echo '+changes'), $IOS reads per depth"
echo "| QD | submit insn/IO | complete + doorbell writes insn/IO | driver total insn/IO | model insn/IO | SQ doorbells/IO | CQ doorbells/IO |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for q in $DEPTHS; do
    out=$(valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$q" --collect-atstart=no \
        --toggle-collect='insn_per_io::submit_batch' --toggle-collect='insn_per_io::ring' \
        --toggle-collect='insn_per_io::reap' "$bin" "$q" "$IOS" 2>"$tmp/vg.$q")
    callgrind_annotate --inclusive=yes "$tmp/cg.$q" >"$tmp/an.$q"
    python3 - "$tmp/an.$q" "$out" "$q" <<'PY'
import re, sys
an, out, q = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
def incl(pat):
    tot = 0
    for line in an.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\(.*?\)\s+(.*)", line) or re.match(r"\s*([\d,]+)\s+(.*)", line)
        if m and re.search(pat, m.group(2)):
            tot = max(tot, int(m.group(1).replace(",", "")))
    return tot
f = dict(re.findall(r"(\w+) (\d+)", out))
ios = int(f["completed"])
sub, ring, reap = incl(r"insn_per_io::submit_batch"), incl(r"insn_per_io::ring"), incl(r"insn_per_io::reap")
model = incl(r"NvmeModel as .*Device.*>::mmio_write")
# The model runs inside both doorbell writes (ring: fetch, read, post; reap: the CQ head):
# its instructions are taken out of the two together.
drv = sub + ring + reap - model
print(f"| {q} | {sub/ios:,.0f} | {(ring + reap - model)/ios:,.0f} | {drv/ios:,.0f} | {model/ios:,.0f} | "
      f"{int(f['sq_doorbells'])/ios:.3f} | {int(f['cq_doorbells'])/ios:.3f} |")
PY
done
