#!/usr/bin/env bash
# An embedder that depends on the `ubdirect` facade with only the `nvme` feature compiles no
# CLI, terminal, CUDA or io_uring crate, and no crate of the NVMe/TCP host (the facade's and
# ubdirect-nvme's `nvmf` feature: crc32c, num-bigint) ("crates by job"): checks the dependency tree
# of examples/embedder-nvme-only with `cargo tree -e normal`, then builds it (`cargo check`,
# sharing the workspace's target/). Prints "embedder: ok" or names the crate that leaked in and
# the path it came by. Exit status 1 on failure. Run by scripts/test.sh (host part).
{
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
manifest="$repo/examples/embedder-nvme-only/Cargo.toml"
forbidden=(clap indicatif cudarc io-uring tracing-subscriber crc32c num-bigint)
# The workspace's versions: its lock file, trimmed by cargo to what the embedder uses (the
# example's own Cargo.lock is git-ignored, so it never drifts from the workspace's).
cp "$repo/Cargo.lock" "$repo/examples/embedder-nvme-only/Cargo.lock"

tree=$(cargo tree --manifest-path "$manifest" -e normal --prefix none) || {
    echo "embedder: FAILED: cargo tree --manifest-path $manifest failed (see above)" >&2
    exit 1
}
bad=0
for c in "${forbidden[@]}"; do
    if grep -q "^$c v" <<<"$tree"; then
        echo "embedder: FAILED: '$c' is in the normal dependencies of an nvme-only embedder; it comes in by:" >&2
        cargo tree --manifest-path "$manifest" -e normal -i "$c" >&2
        echo "  fix: make the dependency that pulls it in optional behind a facade feature (facade/Cargo.toml [features])" >&2
        bad=1
    fi
done
((bad == 0)) || exit 1
cargo check --quiet --manifest-path "$manifest" --target-dir "$repo/target" || {
    echo "embedder: FAILED: examples/embedder-nvme-only does not build with the facade's nvme feature alone (see the compiler messages above)" >&2
    exit 1
}
echo "embedder: ok (no ${forbidden[*]} with features = [\"nvme\"])"
exit 0
}
