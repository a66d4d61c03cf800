#!/usr/bin/env bash
# Extract the uncompressed ELF vmlinux from a bzImage (vmlinuz) by finding its compressed
# payload, the same approach as the kernel tree's scripts/extract-vmlinux (which Debian does
# not ship in any small package). Booting the ELF directly saves the guest ~5 s of
# decompression under TCG.
#
# Usage: extract-vmlinux.sh <vmlinuz> <out-vmlinux>
set -euo pipefail

in=${1:?usage: extract-vmlinux.sh <vmlinuz> <out-vmlinux>}
out=${2:?usage: extract-vmlinux.sh <vmlinuz> <out-vmlinux>}
tmp="$out.tmp"

is_elf() { [[ $(od -An -c -N4 "$1" 2>/dev/null | tr -d ' ') == '177ELF' ]]; }

# try <magic as grep -P pattern> <decompressor command...>
try() {
    local magic=$1 off
    shift
    # Every candidate offset: the payload is not always the first match.
    for off in $(LC_ALL=C grep -obUaP "$magic" "$in" 2>/dev/null | cut -d: -f1); do
        # Decompressors complain about trailing data: ignore their status, check the result.
        tail -c "+$((off + 1))" "$in" | "$@" >"$tmp" 2>/dev/null || true
        if is_elf "$tmp"; then
            mv "$tmp" "$out"
            return 0
        fi
    done
    rm -f "$tmp"
    return 1
}

try '\x28\xb5\x2f\xfd' zstd -dc ||
    try '\xfd\x37\x7a\x58\x5a\x00' xz -dc ||
    try '\x1f\x8b\x08' gzip -dc ||
    try '\x02\x21\x4c\x18' lz4 -dc ||
    try '\x89\x4c\x5a' lzop -dc ||
    try '\x42\x5a\x68' bzip2 -dc ||
    {
        echo "extract-vmlinux: no known compressed ELF payload in $in" >&2
        exit 1
    }
