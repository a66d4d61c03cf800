#!/usr/bin/env bash
# Create (once) the pristine NVMe backing images with a deterministic pattern, so that reads
# are checkable, in $UBD_VM_CACHE/images/. Each run copies them into its run directory.
#
# Pattern: 64 MiB per image; the little-endian u64 at every 8-byte aligned byte offset `off` is
#   (image_id << 56) | off
# with image_id 1 = nvme0.img, 2 = nvme1-ns1.img, 3 = nvme1-ns2.img. No word is zero, and every
# block says where it lies. ubdirect_testbed::pattern_word() computes the same value.
# Prints the images directory.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

dir="$UBD_VM_CACHE/images"
size=$((64 << 20))
mkdir -p "$dir"
id=0
for f in nvme0.img nvme1-ns1.img nvme1-ns2.img; do
    id=$((id + 1))
    [[ -f $dir/$f && $(stat -c %s "$dir/$f") == "$size" ]] && continue
    perl -e '
        my ($id, $size) = @ARGV;
        my $chunk = 1 << 20;
        binmode STDOUT;
        for (my $o = 0; $o < $size; $o += $chunk) {
            print pack("Q<*", map { ($id << 56) | ($o + $_ * 8) } 0 .. ($chunk / 8 - 1));
        }' "$id" "$size" >"$dir/$f.tmp"
    mv "$dir/$f.tmp" "$dir/$f"
    vm_log "created $dir/$f (pattern id $id)"
done
echo "$dir"
