#!/usr/bin/env bash
# Fetch and prepare the guest kernel from Debian's linux-image .deb, cached under
# $UBD_VM_CACHE/kernel-<series>/:
#   vmlinux        the uncompressed ELF kernel (booted directly: no decompression under TCG)
#   kver           the kernel release string
#   modroot/lib/modules/<kver>/   the decompressed modules the guest needs, with their
#                  dependencies, modules.builtin and a depmod'ed modules.dep (so a busybox
#                  `modprobe` in the guest works too)
#   modules.load   their paths relative to that directory, in load order (insmod in the guest)
# A re-run with the cache in place does nothing and prints the cache directory.
# `ubd` is the kernel built from source with everything built in (kernel-build.sh; no modules).
#
# Usage: kernel.sh [6.12|6.1|ubd]  (env UBD_VM_MODULES: module names to resolve)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

series=${1:-$UBD_VM_KERNEL}
case $series in
6.12 | 6.1) ;;
ubd) exec "$UBD_VM_DIR/kernel-build.sh" ;;
*) vm_die "unknown kernel series '$series': use 6.12 (bookworm-backports), 6.1 (bookworm) or ubd (built from linux-source-7.3, scripts/vm/kernel-build.sh)" ;;
esac

kdir="$UBD_VM_CACHE/kernel-$series"
stamp="$kdir/.ready"
want="modules: $UBD_VM_MODULES; on demand: $UBD_VM_MODULES_ONDEMAND"
if [[ -f $stamp && $(cat "$stamp") == "$want" && -f $kdir/vmlinux ]]; then
    echo "$kdir"
    exit 0
fi

# apt's lists may be empty (container images drop them): refresh once before giving up.
pkg=$(vm_kernel_package "$series") ||
    { [[ $(id -u) == 0 ]] && vm_log "no linux-image-amd64 $series.* in apt's lists: apt-get update" &&
        apt-get update -qq >&2 && pkg=$(vm_kernel_package "$series"); } ||
    vm_die "no linux-image-amd64 $series.* package in apt's lists: run scripts/deps.sh (it adds bookworm-backports and runs apt-get update)"

debs="$UBD_VM_CACHE/debs"
mkdir -p "$debs"
deb=$(ls "$debs/${pkg}_"*.deb 2>/dev/null | head -n1 || true)
if [[ -z $deb ]]; then
    vm_log "downloading $pkg"
    (cd "$debs" && apt-get download -q "$pkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2) ||
        true
    deb=$(ls "$debs/${pkg}_"*.deb 2>/dev/null | head -n1 || true)
    [[ -n $deb ]] || vm_die "apt-get download $pkg failed: check the network and apt's sources"
fi

vm_log "preparing kernel $pkg in $kdir"
rm -rf "$kdir"
mkdir -p "$kdir"
root="$kdir/root"
dpkg-deb -x "$deb" "$root"
kver=$(ls "$root/lib/modules" | head -n1)
[[ -n $kver ]] || vm_die "$deb holds no /lib/modules/<kver>"
echo "$kver" >"$kdir/kver"
mods="$kdir/modroot/lib/modules/$kver"
mkdir -p "$mods"

"$UBD_VM_DIR/extract-vmlinux.sh" "$root/boot/vmlinuz-$kver" "$kdir/vmlinux" ||
    vm_die "could not extract vmlinux from $root/boot/vmlinuz-$kver"

depmod -b "$root" "$kver"
: >"$kdir/modules.load"
: >"$kdir/modules.ondemand"
# UBD_VM_MODULES go to modules.load (insmod'ed at boot, in order); UBD_VM_MODULES_ONDEMAND are only
# copied (busybox modprobe finds them through modules.dep).
for m in $UBD_VM_MODULES "@ondemand" $UBD_VM_MODULES_ONDEMAND; do
    if [[ $m == @ondemand ]]; then list="$kdir/modules.ondemand" && continue; fi
    list=${list:-$kdir/modules.load}
    modprobe -d "$root" -S "$kver" --show-depends "$m" >"$kdir/deps.tmp" ||
        vm_die "module $m not found in $kver (UBD_VM_MODULES='$UBD_VM_MODULES')"
    while read -r kind path _; do
        [[ $kind == insmod ]] || continue
        rel=${path#"$root/lib/modules/$kver/"}
        rel=${rel%.xz}
        rel=${rel%.zst}
        rel=${rel%.gz}
        grep -qxF "$rel" "$kdir/modules.load" "$kdir/modules.ondemand" && continue
        mkdir -p "$(dirname "$mods/$rel")"
        case $path in
        *.xz) xz -dc "$path" >"$mods/$rel" ;;
        *.zst) zstd -qdc "$path" >"$mods/$rel" ;;
        *.gz) gzip -dc "$path" >"$mods/$rel" ;;
        *) cp "$path" "$mods/$rel" ;;
        esac
        echo "$rel" >>"$list"
    done <"$kdir/deps.tmp"
done
rm -f "$kdir/deps.tmp"
cp "$root/lib/modules/$kver/modules.builtin" "$root/lib/modules/$kver/modules.builtin.modinfo" "$mods/"
cp "$kdir/modules.load" "$mods/modules.order"
depmod -b "$kdir/modroot" "$kver"


rm -rf "$root"
echo "$want" >"$stamp"
vm_log "kernel $kver ready: $(wc -l <"$kdir/modules.load") modules"
echo "$kdir"
