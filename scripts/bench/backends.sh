#!/usr/bin/env bash
# DMA back ends side by side: `ubdirect perf` 4 KiB random reads on one null-co NVMe
# controller (QEMU's NVMe in front of a null block driver, so the controller is cheap and what
# differs per I/O shows) at 00:10.0, 1 vCPU, release build, the built `ubd` guest kernel.
#   boot 1 (intel-iommu): per round and depth, type1 and iommufd (`UBD_IOMMU_BACKEND`), the order
#          alternating between rounds, and the floor loop (type1) as the yardstick;
#   boot 2 (--no-iommu): per round and depth, no-IOMMU (`--allow-noiommu`) and the floor loop.
# A boot has an IOMMU or not, so no-IOMMU cannot share a boot with the other two: compare it
# through each boot's floor loop (ubdirect / floor), not by raw IOPS across boots.
# Prints every run ("B <boot> <round> <backend> <qd> <iops> <mean_ns>"), then medians and ratios.
#
#   scripts/bench/backends.sh     (env: ROUNDS=3 DEPTHS="1 32 128" SECS=2 BIN=target/release/ubdirect)
#
# Build first: cargo build --release --bin ubdirect
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/ubdirect}
[[ -x $BIN ]] || { echo "backends.sh: $BIN missing: cargo build --release --bin ubdirect" >&2; exit 2; }
ROUNDS=${ROUNDS:-3}
DEPTHS=${DEPTHS:-"1 32 128"}
SECS=${SECS:-2}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# The guest half: one perf run -> one B line (iops and mean latency of the total).
guest='
one() { boot=$1 r=$2 be=$3 q=$4; shift 4
  if ubdirect perf 0000:00:10.0 -q "$q" -o 4096 -w randread -t "$SECS" --json "$@" >/tmp/b.json 2>/tmp/b.err; then
    awk -v b="$boot" -v r="$r" -v e="$be" -v q="$q" '"'"'
      /"total":/ { t = 1 } { gsub(/[",]/, "") }
      t && $1 == "iops:" && iops == "" { iops = $2 } t && $1 == "mean:" && mean == "" { mean = $2 }
      END { printf "B %s %s %s %s %.0f %.0f\n", b, r, e, q, iops, mean }'"'"' /tmp/b.json
  else echo "FAIL $boot $r $be $q $(head -n1 /tmp/b.err)"; fi; }
bind-vfio 0000:00:10.0 >/dev/null 2>&1 || echo "# bind-vfio failed"
r=1
while [ "$r" -le "$ROUNDS" ]; do
  for q in $DEPTHS; do
    if [ "$BOOT" = 1 ]; then
      one 1 "$r" floor "$q" --engine floor --shadow-doorbells off
      if [ $((r % 2)) = 1 ]; then order="type1 iommufd"; else order="iommufd type1"; fi
      for be in $order; do UBD_IOMMU_BACKEND=$be one 1 "$r" "$be" "$q" --shadow-doorbells off; done
    else
      one 2 "$r" floor "$q" --engine floor --shadow-doorbells off --allow-noiommu
      one 2 "$r" noiommu "$q" --shadow-doorbells off --allow-noiommu
    fi
  done
  r=$((r + 1))
done'
qemu="-drive driver=null-co,size=1G,read-zeroes=on,if=none,id=nullb -device nvme,serial=ubdnull,drive=nullb,addr=0x10"
echo "# $(date -u '+%F %T UTC'), host load average: $(cut -d' ' -f1-3 /proc/loadavg), commit $(git rev-parse --short HEAD)"
scripts/vm/run.sh --kernel ubd --smp 1 --tick oneshot --devices nvme0 --bin "$BIN" --extra-qemu "$qemu" \
    --env BOOT=1 --env "ROUNDS=$ROUNDS" --env "DEPTHS=$DEPTHS" --env "SECS=$SECS" \
    -- "$guest" | tee -a "$log" | grep -E '^(B|FAIL|#) ' || true
# No-IOMMU: setup.sh's system opt-in first (the library's is --allow-noiommu).
scripts/vm/run.sh --kernel ubd --no-iommu --smp 1 --tick oneshot --devices nvme0 --bin "$BIN" --extra-qemu "$qemu" \
    --env BOOT=2 --env "ROUNDS=$ROUNDS" --env "DEPTHS=$DEPTHS" --env "SECS=$SECS" \
    -- "PCI_ALLOWED=0000:00:10.0 UBD_ALLOW_NOIOMMU=1 bash scripts/setup.sh config >/dev/null 2>&1 || echo '# setup.sh config failed'; $guest" |
    tee -a "$log" | grep -E '^(B|FAIL|#) ' || true
echo "# done $(date -u '+%T UTC'), host load average: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$log" <<'PY'
import sys, statistics as st, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 7 and f[0] == "B":
        runs[(f[1], f[3], int(f[4]))].append((float(f[5]), float(f[6])))
depths = sorted({q for _, _, q in runs})
med = lambda b, e, q, i: st.median(x[i] for x in runs[(b, e, q)]) if runs.get((b, e, q)) else None
print("\n| QD | boot | back end | runs | IOPS median (range) | mean lat (us) | / that boot's floor |")
print("| ---: | ---: | --- | ---: | ---: | ---: | ---: |")
for q in depths:
    for b, e in (("1", "floor"), ("1", "type1"), ("1", "iommufd"), ("2", "floor"), ("2", "noiommu")):
        v = runs.get((b, e, q), [])
        if not v:
            print(f"| {q} | {b} | {e} | 0 | failed | | |"); continue
        io = [x[0] for x in v]
        fl = med(b, "floor", q, 0)
        ratio = f"{st.median(io) / fl:.2f}" if fl and e != "floor" else ""
        print(f"| {q} | {b} | {e} | {len(v)} | {st.median(io):,.0f} ({min(io):,.0f}-{max(io):,.0f}) | {med(b, e, q, 1) / 1e3:.1f} | {ratio} |")
PY
