#!/bin/sh
# Guest test (TAP): `ubdirect devices` and `ubdirect doctor` against the guest's real devices,
# compared with what sysfs says; exit codes 0 / 1 / 2. Devices are left on their kernel drivers.

cd /ubd || exit 1
OUT=/tmp/dd-test.out
ERR=/tmp/dd-test.err
DUMP_OUT_LINES=60
# shellcheck source=tests/guest/lib/tap.sh
. tests/guest/lib/tap.sh

ubd() {
    ubdirect "$@" >"$OUT" 2>"$ERR"
    rc=$?
}

if ! command -v ubdirect >/dev/null; then
    echo "1..0 # SKIP ubdirect binary not in the guest (build it: cargo build --bin ubdirect)"
    exit 0
fi

# json_field ADDR FIELD: a device's top-level field from `devices --json` (pretty-printed:
# device fields are indented 6 spaces, nested ones deeper).
json_field() {
    awk -v a="\"$1\"," -v f="\"$2\":" '
        /^      "address": / { cur = ($2 == a) }
        cur && $1 == f { v = $2; sub(/,$/, "", v); gsub(/"/, "", v); print v; exit }' "$OUT"
}

# Start from the kernel drivers whatever ran before (00-testbed.sh leaves devices on vfio-pci).
bind-kernel $UBD_TEST_DEVICES >/dev/null 2>&1

# ---- devices ---------------------------------------------------------------------------------
ubd devices --json
check "devices --json exits 0" [ "$rc" = 0 ]
count=$(grep -c '^      "address": ' "$OUT")
# shellcheck disable=SC2086 # count the words
want=$(set -- $UBD_TEST_DEVICES && echo $#)
check "devices --json lists exactly the test devices: 4 NVMe, 3 virtio-net NICs, 2 igb NICs and ivshmem ($want; got $count)" eval '[ "$count" = "$want" ] && [ "$want" = 10 ]'
for a in $NVME0 $NVME1 $NIC0 $NIC1 $IVSHMEM; do
    want_drv=$(drv "$a")
    [ -n "$want_drv" ] || want_drv=null
    got_drv=$(json_field "$a" driver)
    got_grp=$(json_field "$a" iommu_group)
    check "devices --json: $a driver $got_drv, group $got_grp match sysfs ($want_drv, $(grp "$a"))" \
        eval '[ "$got_drv" = "$want_drv" ] && [ "$got_grp" = "$(grp "$a")" ]'
done
check "devices --json: NVMe role and class" eval '[ "$(json_field "$NVME0" role)" = nvme ] && [ "$(json_field "$NVME0" class)" = $((0x010802)) ]'
check "devices --json: ivshmem is a memory device with a 64 MiB prefetchable 64-bit BAR2" \
    eval '[ "$(json_field "$IVSHMEM" role)" = memory ] && grep -A6 "\"index\": 2" "$OUT" | grep -q "\"size\": 67108864"'

ubd devices
check "devices table: a header and $want rows" eval '[ "$rc" = 0 ] && [ "$(sed "/^\$/q" "$OUT" | grep -c .)" = $((want + 1)) ] && out_has "^ADDRESS *ID *CLASS *DRIVER *DMA *GROUP *NUMA *LINK *BARS"'
check "devices table: ivshmem row shows RAM, no driver, no DMA back end, its group and 2:64M(p64)" \
    eval 'grep "^$IVSHMEM " "$OUT" | grep -q "1af4:1110 *RAM (0500) *- *- *$(grp "$IVSHMEM") .*2:64M(p64)"'
ubd devices --all
total=$(ls /sys/bus/pci/devices | wc -l)
check "devices --all lists every PCI device ($total) and names shared groups" \
    eval '[ "$rc" = 0 ] && [ "$(sed "/^\$/,\$d" "$OUT" | wc -l)" = $((total + 1)) ] && out_has "shares IOMMU group with"'
ubd devices "${NVME1#0000:}"
check "devices BDF (short form) lists that device only" eval '[ "$rc" = 0 ] && [ "$(wc -l <"$OUT")" = 2 ] && out_has "^$NVME1 "'
ubd devices 00:4.0.1
check "devices with a malformed address: usage error, exit 2" eval '[ "$rc" = 2 ] && err_has "malformed PCI address"'
ubd devices 0000:00:1e.7
check "devices with a missing device: exit 1, ubdirect: error: naming it" eval '[ "$rc" = 1 ] && err_has "^ubdirect: error: no PCI device 0000:00:1e.7"'

# ---- doctor, devices on kernel drivers -----------------------------------------------------------
ubd doctor
check "doctor exits 0 when there are only warnings" eval '[ "$rc" = 0 ] && out_has "summary: [0-9]* ok, [1-9][0-9]* warnings, 0 errors"'
check "doctor sees the translated IOMMU and dmar0" out_has "^\[ ok \] iommu: translated.*dmar0"
check "doctor sees the vfio modules" out_has "^\[ ok \] vfio: "
check "doctor flags the ivshmem BAR (64M) as small" eval 'out_has "^\[warn\] bar $IVSHMEM: largest BAR is BAR2 = 64M" && out_has "Resizable BAR"'
check "doctor picks ivshmem as the GPU stand-in" out_has "^gpu: $IVSHMEM"
check "doctor warns that nvme0 is on the nvme driver" out_has "^\[warn\] driver $NVME0: NVMe $NVME0 is bound to nvme, not vfio-pci"
check "doctor reports free hugepages per node" out_has "^\[ ok \] hugepages: node0 2048kB $(cat /sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages)/"

# ---- doctor with the devices on vfio-pci ---------------------------------------------------------
bind-vfio $NVME0 $NVME1 $UBD_NVME_MDTS0 $IVSHMEM >/dev/null
ubd doctor
check "doctor with devices on vfio-pci: groups viable, no driver warnings" \
    eval '[ "$rc" = 0 ] && out_has "^\[ ok \] group $NVME0: alone in IOMMU group $(grp "$NVME0")" && ! out_has "^\[warn\] driver"'
ubd doctor --pool-mib 1048576
check "doctor fails (exit 1) when the pool cannot get its hugepages" \
    eval '[ "$rc" = 1 ] && out_has "^\[FAIL\] hugepages: .*the pool needs 1T" && out_has "HUGEMEM=1048576"'
ubd doctor --json --pool-mib 1048576
errs=$(awk -F': ' '/^  "errors": / { sub(/,/, "", $2); print $2 }' "$OUT")
check "doctor --json: counts and exit agree (errors=$errs)" eval '[ "$rc" = 1 ] && [ "$errs" = 1 ] && out_has "\"severity\": \"error\""'
ubd doctor --gpu "$IVSHMEM" "$NVME0"
check "doctor BDF --gpu: checks that device and its locality to the GPU" \
    eval '[ "$rc" = 0 ] && out_has "^devices: $NVME0$" && out_has "^\[ ok \] root-port $NVME0: same root complex pci0000:00"'
ubd doctor --gpu zz
check "doctor --gpu with a malformed address: exit 2" [ "$rc" = 2 ]
ubd doctor 0000:00:1e.7
check "doctor with a missing device: exit 1 and an error line" eval '[ "$rc" = 1 ] && err_has "^ubdirect: error: no PCI device"'
bind-kernel $NVME0 $NVME1 $UBD_NVME_MDTS0 $IVSHMEM >/dev/null 2>&1
check "devices are back on their kernel drivers" eval '[ "$(drv "$NVME0")" = nvme ] && [ "$(drv "$NVME1")" = nvme ] && [ -z "$(drv "$IVSHMEM")" ]'

# ---- CLI conventions -----------------------------------------------------------------------------
ubd --version
check "--version exits 0" eval '[ "$rc" = 0 ] && out_has "^ubdirect "'
ubd --help
check "--help lists devices and doctor" eval '[ "$rc" = 0 ] && out_has "devices" && out_has "doctor"'
ubd frobnicate
check "unknown subcommand: exit 2" [ "$rc" = 2 ]

echo "1..$n"
echo "devices-doctor: $((n - failed)) passed, $failed failed"
[ "$failed" = 0 ]
