#!/usr/bin/env bash
# Build (once) the base layer of the guest initramfs for a prepared kernel directory:
# busybox-static with its applet links, the directory skeleton and the kernel's modules.
# The per-run layer (/init, project files, binaries) is appended by run.sh: the kernel
# unpacks concatenated cpio archives in order. Uncompressed on purpose: no decompression
# under TCG. Prints the path of the cached archive.
#
# Usage: initramfs.sh <kernel-dir from kernel.sh>
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

kdir=${1:?usage: initramfs.sh <kernel-dir>}
out="$kdir/initramfs-base.cpio"
if [[ -f $out && $out -nt $kdir/.ready && $out -nt /bin/busybox && $out -nt ${BASH_SOURCE[0]} ]]; then
    echo "$out"
    exit 0
fi

bb=/bin/busybox
if ! [[ -x $bb ]] || ! $bb --list-full >/dev/null 2>&1; then vm_die "busybox-static missing: run scripts/deps.sh"; fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,lib,lib64,proc,sys,dev,tmp,run,root,etc,mnt,var}
cp "$bb" "$stage/bin/busybox"
for applet in $($bb --list-full); do
    [[ -e $stage/$applet || -L $stage/$applet ]] && continue
    mkdir -p "$stage/$(dirname "$applet")"
    ln -s /bin/busybox "$stage/$applet"
done
cp -a "$kdir/modroot/lib/modules" "$stage/lib/"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$stage/etc/passwd"
printf 'root:x:0:\n' >"$stage/etc/group"
(cd "$stage" && find . -mindepth 1 -print0 | LC_ALL=C sort -z |
    cpio --null -o -H newc --owner 0:0 --quiet) >"$out.tmp"
mv "$out.tmp" "$out"
vm_log "initramfs base: $out ($(du -h "$out" | cut -f1))"
echo "$out"
