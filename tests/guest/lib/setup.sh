# shellcheck shell=sh
# Shared helpers of the setup.sh guest tests (10-setup-sh.sh, 11-setup-in-use.sh; sourced after
# lib/tap.sh, never run). The caller sets SETUP (the command to run), OUT, ERR and UBD_STATE_DIR.

# skip WHY: one TAP "# SKIP" line, counted in $skipped (the suite counts it as skipped).
skipped=0
skip() {
    n=$((n + 1))
    skipped=$((skipped + 1))
    echo "ok $n # SKIP $1"
}
is_drv() { [ "$(drv "$1")" = "$2" ]; }

# run_setup MODE [VAR=VALUE...]: run setup.sh with the given environment; status in $rc.
run_setup() {
    m=$1
    shift
    env "$@" $SETUP "$m" >"$OUT" 2>"$ERR"
    rc=$?
}

# The state a bad input must not change: drivers, overrides, hugepages, /dev/vfio, ownerships.
snapshot() {
    for d in /sys/bus/pci/devices/*; do
        echo "${d##*/} $(drv "${d##*/}") $(cat "$d/driver_override" 2>/dev/null)"
    done
    cat /sys/kernel/mm/hugepages/*/nr_hugepages
    ls -ln /dev/vfio /dev/hugepages 2>/dev/null
    grep hugetlbfs /proc/mounts
    cat "$UBD_STATE_DIR/original-drivers" 2>/dev/null
}
