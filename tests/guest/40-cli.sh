#!/bin/sh
# Guest test (TAP): the CLI in its users' terms on the guest's real devices. `ubdirect log smart`
# and `log error` (text and --json), the one spelling of namespaces and offsets (--ns, --offset,
# old spellings still accepted), and every error path a user can reach here printing a message
# with the fix and no Rust type name (`::`, `Arc<`, a CamelCase word).

cd /ubd || exit 1
OUT=/tmp/cli-test.out
ERR=/tmp/cli-test.err
DUMP_OUT_LINES=30
DUMP_ERR_LINES=30
# shellcheck source=tests/guest/lib/tap.sh
. tests/guest/lib/tap.sh

# u WANT_RC ARGS...: run ubdirect, keep stdout/stderr, compare the exit status.
u() {
    want=$1
    shift
    ubdirect "$@" >"$OUT" 2>"$ERR"
    rc=$?
    [ "$rc" = "$want" ] || { echo "# exit $rc, wanted $want: ubdirect $*"; return 1; }
}

# no_type_names: stderr holds no `::`, `Arc<` or CamelCase word (units and LimitMEMLOCK aside).
no_type_names() {
    bad=$(grep -oE '::|Arc<|[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*' "$ERR" | grep -vxE 'KiB|MiB|GiB|TiB|LimitMEMLOCK')
    [ -z "$bad" ] || { echo "# type names on stderr: $bad"; return 1; }
}

# error_case NAME WANT_RC PATTERN ARGS...: the command fails with WANT_RC, says PATTERN, and
# names no Rust type.
error_case() {
    name=$1 want=$2 pat=$3
    shift 3
    if u "$want" "$@" && err_has "$pat" && no_type_names; then ok "$name"; else not_ok "$name"; fi
}

# ---- devices on their kernel drivers ----
bind-kernel "$NVME0" "$NVME1" "$NIC0" "$NIC1" >/dev/null 2>&1
error_case "identify on the kernel nvme driver: bind with scripts/setup.sh and PCI_ALLOWED" 1 \
    "PCI_ALLOWED=$NVME0 scripts/setup.sh" identify "$NVME0"
error_case "log smart on the kernel nvme driver: same fix" 1 "PCI_ALLOWED=$NVME0 scripts/setup.sh" log smart "$NVME0"
error_case "loopback on kernel NICs: same fix" 1 "not vfio-pci" loopback --tx "$NIC0" --rx "$NIC1" --frames 10
error_case "a PCI address that does not exist" 1 "no PCI device 0000:00:1f.7" identify 00:1f.7

# ---- NVMe on vfio-pci ----
bind-vfio "$NVME0" "$NVME1" "$IVSHMEM" >/dev/null 2>&1
if u 0 log smart "$NVME0" && out_has "^temperature  *: [0-9-]* °C ([0-9]* K)" && out_has "^available_spare  *: [0-9]*%" &&
    out_has "^num_err_log_entries"; then
    ok "log smart: nvme-cli's smart-log fields"
else not_ok "log smart: nvme-cli's smart-log fields"; fi
if u 0 log smart "$NVME0" --json && out_has '"schema": "ubdirect/1"' && out_has '"command": "log smart"' &&
    out_has '"temperature_k": [1-9]'; then
    ok "log smart --json: the shared envelope"
else not_ok "log smart --json: the shared envelope"; fi
if u 0 log error "$NVME1" && out_has "Error Information log of NVMe controller $NVME1: [0-9]* entr"; then
    ok "log error: entries in use"
else not_ok "log error: entries in use"; fi
if u 0 log error "$NVME1" --json && out_has '"command": "log error"' && out_has '"entries": \['; then
    ok "log error --json: the shared envelope"
else not_ok "log error --json: the shared envelope"; fi
error_case "log smart of a device that is not NVMe" 1 "not an NVMe controller" log smart "$IVSHMEM"

# ---- one spelling for namespaces and offsets ----
if u 0 perf "$NVME1" --ns 2 --offset 4M --span 4M -o 4K -q 4 --seconds 0.3 --json && out_has '"nsid": 2' &&
    out_has '"queue_depth": 4' && out_has '"bytes_per_s"'; then
    ok "perf --ns 2 --offset 4M --span 4M -o 4K --seconds"
else not_ok "perf --ns 2 --offset 4M --span 4M -o 4K --seconds"; fi
if u 0 perf "$NVME1" --ns 2 --offset-mib 4 --span-mib 4 -q 4 --time 0.3 --json && out_has '"nsid": 2'; then
    ok "perf: the old --offset-mib/--span-mib/--time still work"
else not_ok "perf: the old --offset-mib/--span-mib/--time still work"; fi
if u 0 pipeline --source "nvme:$NVME1" --ns 2 --offset 1M -q 4 --block-size 64K --bytes 2M --verify &&
    out_has "nvme:$NVME1/2" && out_has "verify.*OK"; then
    ok "pipeline --ns 2 --offset 1M -q 4, verified"
else not_ok "pipeline --ns 2 --offset 1M -q 4, verified"; fi

# ---- error paths with a device ----
error_case "perf: a namespace that is not active lists the active ids" 1 "ids are 1, 2" perf "$NVME1" --ns 3 -t 0.1
error_case "perf: an I/O size that is not a block multiple names the next one" 1 "use -o 4096" perf "$NVME1" --ns 2 -o 1K -t 0.1
error_case "perf: an offset past the end" 1 "past the end of namespace" perf "$NVME0" --offset 1T -t 0.1
error_case "pipeline: the same device as source and BAR sink" 1 "named twice" \
    pipeline --source "nvme:$NVME0" --sink "bar:$NVME0/0" --bytes 1M
error_case "pipeline: --ns with a file source" 1 "file: source has none" pipeline --source file:/dev/null --ns 2
error_case "perf: --offset and --offset-mib together is a usage error" 2 "cannot be used with" \
    perf "$NVME0" --offset 1M --offset-mib 1

# ---- test-bed hooks stay out of --help (operator settings such as UBD_DHCHAP_SECRET belong) ----
if u 0 pipeline --help && ! out_has hostcheck && ! grep -v 'UBD_DHCHAP_' "$OUT" | grep -q UBD_ &&
    out_has -- "--ns <NSID>"; then
    ok "pipeline --help: no test-bed hooks, --ns shown"
else not_ok "pipeline --help: no test-bed hooks, --ns shown"; fi

rm -f "$OUT" "$ERR"
echo "1..$n"
[ "$failed" = 0 ]
