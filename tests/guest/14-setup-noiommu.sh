#!/bin/sh
# Guest test (TAP): scripts/setup.sh and vfio's unsafe no-IOMMU mode. Runs in every boot:
#   IOMMU boots: UBD_ALLOW_NOIOMMU=1 is ignored, the mode stays off, nothing is recorded.
#   the no-IOMMU boot (scripts/vm/suite.sh --kernel ubd --no-iommu --filter noiommu): without the
#   mode config refuses and says how to opt in, doctor fails; with UBD_ALLOW_NOIOMMU=1 config turns
#   the mode on and records it; reset refuses a device whose /dev/vfio/noiommu-N or device cdev a
#   process holds (naming it) and keeps the mode on while such a group is left; once let go, reset
#   turns the mode back off; a mode that was on before config stays on.
# Uses ivshmem (no kernel driver, no namespace touched). Leaves the mode as the boot set it.

cd /ubd || exit 1
SETUP="sh scripts/setup.sh"
export UBD_STATE_DIR=/tmp/ubd-setup-noiommu
rm -rf "$UBD_STATE_DIR"
OUT=/tmp/setup-noiommu.out
ERR=/tmp/setup-noiommu.err
# shellcheck source=tests/guest/lib/tap.sh
. tests/guest/lib/tap.sh
# shellcheck source=tests/guest/lib/setup.sh
. tests/guest/lib/setup.sh

param=/sys/module/vfio/parameters/enable_unsafe_noiommu_mode
mode() { cat "$param" 2>/dev/null || echo absent; }
bind-kernel $UBD_TEST_DEVICES >/dev/null 2>&1

if [ "${UBD_VM_NO_IOMMU:-0}" != 1 ]; then
    run_setup config HUGEMEM=0 UBD_ALLOW_NOIOMMU=1 "PCI_ALLOWED=$IVSHMEM"
    check "IOMMU on: UBD_ALLOW_NOIOMMU=1 is ignored and said so; the device gets an ordinary group" \
        eval '[ "$rc" = 0 ] && out_has "UBD_ALLOW_NOIOMMU=1 is ignored" && is_drv "$IVSHMEM" vfio-pci && [ -c "/dev/vfio/$(grp "$IVSHMEM")" ]'
    check "IOMMU on: no-IOMMU mode stays off and nothing about it is recorded" \
        eval '[ "$(mode)" != Y ] && ! grep -q noiommu "$UBD_STATE_DIR/settings" 2>/dev/null'
    run_setup reset
    check "IOMMU on: reset gives the device back and leaves the mode as it was" \
        eval '[ "$rc" = 0 ] && is_drv "$IVSHMEM" "" && [ "$(mode)" != Y ]'
    echo "1..$n"
    echo "setup-noiommu: $((n - failed - skipped)) passed, $failed failed, $skipped skipped (IOMMU boot)"
    [ "$failed" = 0 ]
    exit
fi

boot_mode=$(mode)
# ---- without the operator's opt-in: refused, nothing changed ----------------------------------
echo N >"$param"
before=$(snapshot)
run_setup config HUGEMEM=0
check "no IOMMU: config refuses, says how to enable it or opt in, changes nothing" \
    eval '[ "$rc" = 1 ] && err_has "no IOMMU" && err_has "intel_iommu=on" && err_has "UBD_ALLOW_NOIOMMU=1" && [ "$before" = "$(snapshot)" ]'
run_setup config HUGEMEM=0 UBD_ALLOW_NOIOMMU=yes
check "no IOMMU, UBD_ALLOW_NOIOMMU=yes: refused (exit 2, only 1 is accepted), changes nothing" \
    eval '[ "$rc" = 2 ] && err_has "UBD_ALLOW_NOIOMMU=.yes. is not understood: set UBD_ALLOW_NOIOMMU=1" && [ "$before" = "$(snapshot)" ]'
run_setup status
check "no IOMMU: status says so" eval '[ "$rc" = 0 ] && out_has "^no IOMMU"'
if command -v ubdirect >/dev/null; then
    ubdirect doctor >"$OUT" 2>"$ERR"
    rc=$?
    check "no IOMMU, mode off: ubdirect doctor fails (exit 1) naming the IOMMU" \
        eval '[ "$rc" = 1 ] && out_has "^\[FAIL\] iommu: no IOMMU groups"'
else
    not_ok "the ubdirect binary is not in the guest (doctor check)"
fi

# ---- the opt-in: config turns the mode on and records it ---------------------------------------
run_setup config HUGEMEM=0 UBD_ALLOW_NOIOMMU=1 "PCI_ALLOWED=$IVSHMEM"
g=$(grp "$IVSHMEM")
check "UBD_ALLOW_NOIOMMU=1: the mode goes on (with the warning) and ivshmem gets /dev/vfio/noiommu-$g" \
    eval '[ "$rc" = 0 ] && [ "$(mode)" = Y ] && err_has "UNSAFE" && is_drv "$IVSHMEM" vfio-pci && [ -c "/dev/vfio/noiommu-$g" ]'
check "config records that it turned the mode on (it was N)" grep -qx "noiommu N" "$UBD_STATE_DIR/settings"

# ---- a process holding the no-IOMMU group, then the device cdev: reset refuses, names it -------
sleep 120 3<"/dev/vfio/noiommu-$g" &
holder=$!
sleep 0.5
run_setup reset
check "reset refuses a device whose /dev/vfio/noiommu-$g is open, naming the process" \
    eval '[ "$rc" = 1 ] && is_drv "$IVSHMEM" vfio-pci && err_has "/dev/vfio/noiommu-$g is open by $holder(sleep)"'
check "reset keeps the mode on while a no-IOMMU group is left, and says why" \
    eval '[ "$(mode)" = Y ] && err_has "no-IOMMU mode left ON" && grep -qx "noiommu N" "$UBD_STATE_DIR/settings"'
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
cdev=$(ls /sys/bus/pci/devices/"$IVSHMEM"/vfio-dev 2>/dev/null | head -n1)
if [ -n "$cdev" ] && [ -c "/dev/vfio/devices/$cdev" ]; then
    sleep 120 3<"/dev/vfio/devices/$cdev" &
    holder=$!
    sleep 0.5
    run_setup reset
    check "reset refuses a device whose cdev /dev/vfio/devices/$cdev (iommufd) is open, naming the process" \
        eval '[ "$rc" = 1 ] && is_drv "$IVSHMEM" vfio-pci && err_has "/dev/vfio/devices/$cdev is open by $holder(sleep)"'
    kill "$holder" 2>/dev/null
    wait "$holder" 2>/dev/null
else
    not_ok "no vfio device cdev for $IVSHMEM on the ubd kernel"
fi

# ---- let go: reset gives the device back and turns the mode off -------------------------------
run_setup reset
check "reset gives the device back and turns the mode back off, saying so" \
    eval '[ "$rc" = 0 ] && is_drv "$IVSHMEM" "" && [ "$(mode)" = N ] && out_has "no-IOMMU mode: back to N"'
check "reset forgets the setting" eval '[ ! -s "$UBD_STATE_DIR/settings" ]'

# ---- a mode that was on before config is left on ---------------------------------------------
echo Y >"$param"
run_setup config HUGEMEM=0 UBD_ALLOW_NOIOMMU=1 "PCI_ALLOWED=$IVSHMEM"
run_setup reset
check "the mode on before config (the boot's vfio.enable_unsafe_noiommu_mode=1) stays on after reset" \
    eval '[ "$rc" = 0 ] && is_drv "$IVSHMEM" "" && [ "$(mode)" = Y ]'

echo "$boot_mode" >"$param"
echo "1..$n"
echo "setup-noiommu: $((n - failed - skipped)) passed, $failed failed, $skipped skipped (no-IOMMU boot)"
[ "$failed" = 0 ]
