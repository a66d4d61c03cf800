#!/usr/bin/env bash
# Build (once) the guest kernel "ubd" from Debian's linux-source-7.3 (trixie-backports, installed
# by scripts/deps.sh) with the fragment scripts/vm/kernel-config/ubd.config on top of
# `allnoconfig`: everything the test bed needs is built in (vfio with type1, IOMMUFD and the
# device cdev, no-IOMMU mode, vfio-pci dma-buf, NVMe host and NVMe-oF TCP host/target, ...).
# Cached under $UBD_VM_CACHE/kernel-ubd/ in the layout kernel.sh gives the Debian kernels:
#   vmlinux, kver, modroot/lib/modules/<kver>/ (modules.builtin, empty modules.order: /init
#   loads nothing and busybox modprobe knows the built-in ones), modules.load (empty),
#   config (the final .config), build-time (wall, user, sys, load average of the build)
# keyed by a hash of the fragment, this script and the source package version: a cached run
# costs nothing. The object tree ($UBD_VM_CACHE/kbuild-ubd) is kept, so a changed fragment
# rebuilds only what changed. Prints the kernel directory.
#
# Usage: kernel-build.sh            (env UBD_VM_KBUILD_JOBS: make -j, default nproc;
#                                    UBD_VM_KBUILD_NICE: nice level, default 10)
# Concurrent callers are serialised by a lock ($UBD_VM_CACHE/kernel-ubd.lock): the second one
# waits for the first build and then uses its kernel.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

pkg=linux-source-7.3
tarball=/usr/src/$pkg.tar.xz
fragment="$UBD_VM_DIR/kernel-config/ubd.config"
ver=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null) && [[ -f $tarball ]] ||
    vm_die "$pkg is not installed (the ubd guest kernel is built from it): run scripts/deps.sh as root (it adds trixie-backports, pinned low, for this one package)"
key=$( { echo "$pkg $ver"; cat "$fragment" "${BASH_SOURCE[0]}"; } | sha256sum | cut -c1-16)

kdir="$UBD_VM_CACHE/kernel-ubd"
# One build at a time: a second caller (scripts/test.sh starts the build early, in the
# background; the ubd suite asks for the kernel later) waits here, then finds it ready.
mkdir -p "$UBD_VM_CACHE"
exec 9>"$UBD_VM_CACHE/kernel-ubd.lock"
if ! flock -n 9; then
    vm_log "waiting for the ubd kernel build already running ($UBD_VM_CACHE/kernel-ubd.lock)"
    flock 9
fi
if [[ -f $kdir/.ready && $(cat "$kdir/.ready") == "key: $key" && -f $kdir/vmlinux ]]; then
    echo "$kdir"
    exit 0
fi

for tool in make gcc bc bison flex; do
    command -v "$tool" >/dev/null || vm_die "$tool not found (needed to build the ubd guest kernel): run scripts/deps.sh"
done

# ---- the source tree, extracted once per package version ----
src="$UBD_VM_CACHE/src/$pkg-$(printf '%s' "$ver" | tr -c 'A-Za-z0-9._-' '_')"
if [[ ! -f $src/.extracted ]]; then
    vm_log "extracting $tarball into $src"
    rm -rf "$src" "$src.tmp"
    mkdir -p "$src.tmp"
    tar -xf "$tarball" -C "$src.tmp"
    mv "$src.tmp/$pkg" "$src"
    rmdir "$src.tmp"
    : >"$src/.extracted"
fi

# ---- configure: allnoconfig + fragment, then check every requested =y survived ----
obj="$UBD_VM_CACHE/kbuild-ubd"
mkdir -p "$obj"
vm_log "configuring $pkg $ver with $fragment (object tree $obj)"
(cd "$src" && scripts/kconfig/merge_config.sh -n -O "$obj" "$fragment") >"$obj/config.log" 2>&1 ||
    vm_die "merge_config.sh failed: see $obj/config.log"
lost=$(grep -E '^CONFIG_[A-Z0-9_]+=y$' "$fragment" | while read -r want; do
    grep -qxF "$want" "$obj/.config" || printf '%s ' "${want%=y}"
done)
[[ -z $lost ]] ||
    vm_die "these options of $fragment are not set in the final config (a dependency is missing or the symbol was renamed in $ver): $lost; see $obj/config.log"

# ---- build: vmlinux only (booted uncompressed), no modules ----
jobs=${UBD_VM_KBUILD_JOBS:-$(nproc)}
vm_log "building $pkg $ver (make -j$jobs vmlinux, nice ${UBD_VM_KBUILD_NICE:-10}; log $obj/build.log)"
load0=$(cut -d' ' -f1-3 /proc/loadavg)
TIMEFORMAT='wall %Rs user %Us sys %Ss'
{ time nice -n "${UBD_VM_KBUILD_NICE:-10}" make -C "$obj" -j"$jobs" vmlinux modules >"$obj/build.log" 2>&1; } 2>"$obj/time" ||
    { tail -n 30 "$obj/build.log" >&2; vm_die "kernel build failed: see $obj/build.log"; }
kver=$(make -s -C "$obj" kernelrelease 2>/dev/null | tail -n1)
[[ -n $kver ]] || vm_die "could not read the kernel release from $obj"

rm -rf "$kdir.tmp"
mkdir -p "$kdir.tmp/modroot"
make -s -C "$obj" modules_install INSTALL_MOD_PATH="$kdir.tmp/modroot" >>"$obj/build.log" 2>&1 ||
    vm_die "make modules_install failed: see $obj/build.log"
mods="$kdir.tmp/modroot/lib/modules/$kver"
rm -f "$mods/build" "$mods/source"
: >"$mods/modules.order"
: >"$kdir.tmp/modules.load"
depmod -b "$kdir.tmp/modroot" "$kver"
cp "$obj/vmlinux" "$kdir.tmp/vmlinux"
cp "$obj/.config" "$kdir.tmp/config"
echo "$kver" >"$kdir.tmp/kver"
echo "$(cat "$obj/time"), load average before $load0 after $(cut -d' ' -f1-3 /proc/loadavg), make -j$jobs, $(date -u +%FT%TZ)" >"$kdir.tmp/build-time"
echo "key: $key" >"$kdir.tmp/.ready"
rm -rf "$kdir"
mv "$kdir.tmp" "$kdir"
vm_log "kernel $kver built: $(cat "$kdir/build-time")"
echo "$kdir"
