#!/usr/bin/env bash
# Install everything the ubdirect tests need on a Debian 12 (bookworm) machine, as root.
#
# Idempotent and quiet when everything is already there: each package is checked with
# `dpkg -s` first and apt runs only for what is missing. QEMU comes from bookworm-backports
# (bookworm's own 7.2 cannot sit beside a newer qemu-utils; see docs TESTBED notes), so the
# backports suite is added to /etc/apt/sources.list.d/ubdirect-backports.list when no sources
# file names it yet.
#
# Usage: scripts/deps.sh            (env UBD_DEPS_VERBOSE=1 to list what is checked)
set -euo pipefail

# Packages from bookworm-backports.
BACKPORTS_PKGS=(qemu-system-x86)
# From trixie-backports, pinned at priority 50 (/etc/apt/preferences.d/ubdirect-trixie-backports)
# so that nothing installed is ever upgraded from it: the source of the "ubd" guest kernel
# (scripts/vm/kernel-build.sh). Its build tools come from bookworm (KBUILD_PKGS).
TRIXIE_BPO_PKGS=(linux-source-7.3)
KBUILD_PKGS=(make gcc libc6-dev bc bison flex libelf-dev libssl-dev)
# Packages from bookworm itself.
# - busybox-static: the guest's whole userland;  cpio: the initramfs;  kmod: depmod/modprobe
#   resolve the guest modules;  xz-utils, zstd: kernel modules and the kernel image payload;
# - binutils: strip test binaries before they go into the initramfs;  jq: read cargo's JSON;
# - perl: generate the NVMe image pattern;  diffutils (cmp): host checks;
# - gzip, bzip2, lz4, lzop: the other possible vmlinuz payload formats;
# - valgrind: callgrind counts the NVMe path's instructions per I/O (scripts/bench/nvme-insn.sh --check),
#   and memcheck runs the C API's test program (capi/tests/c_program.rs);
# - pkgconf: the C API's pkg-config file is checked by building the C example with its flags;
# - ca-certificates, apt-utils are not needed: packages come through apt itself.
BASE_PKGS=(busybox-static cpio kmod xz-utils zstd binutils jq perl diffutils gzip bzip2 lz4 lzop valgrind
    coreutils util-linux pkgconf python3-venv python3-pip)

log() { printf 'deps: %s\n' "$*"; }
die() {
    printf 'deps: error: %s\n' "$*" >&2
    exit 1
}

missing() {
    local p out=()
    for p in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
            out+=("$p")
        fi
        [[ ${UBD_DEPS_VERBOSE:-0} == 1 ]] && log "checked $p" >&2
    done
    printf '%s\n' "${out[@]}"
}

[[ -r /etc/debian_version ]] || die "this script supports Debian 12 (bookworm) only"

mapfile -t need_base < <(missing "${BASE_PKGS[@]}" | sed '/^$/d')
mapfile -t need_bpo < <(missing "${BACKPORTS_PKGS[@]}" | sed '/^$/d')
mapfile -t need_kb < <(missing "${KBUILD_PKGS[@]}" | sed '/^$/d')
need_base+=("${need_kb[@]}")
mapfile -t need_tbpo < <(missing "${TRIXIE_BPO_PKGS[@]}" | sed '/^$/d')

# The guest kernel (scripts/vm) also comes from bookworm-backports: the suite must be known.
have_bpo=1
grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/ || have_bpo=0

have_tbpo=1
grep -rqs 'trixie-backports' /etc/apt/sources.list /etc/apt/sources.list.d/ &&
    [[ -f /etc/apt/preferences.d/ubdirect-trixie-backports ]] || have_tbpo=0

if ((have_bpo == 1 && have_tbpo == 1 && ${#need_base[@]} == 0 && ${#need_bpo[@]} == 0 && ${#need_tbpo[@]} == 0)); then
    exit 0
fi

[[ $(id -u) == 0 ]] ||
    die "missing packages (${need_base[*]} ${need_bpo[*]} ${need_tbpo[*]}) or the bookworm-/trixie-backports suites, and not root: run as root"

export DEBIAN_FRONTEND=noninteractive
if ((have_bpo == 0)); then
    log "adding bookworm-backports to /etc/apt/sources.list.d/ubdirect-backports.list"
    echo 'deb http://deb.debian.org/debian bookworm-backports main' \
        >/etc/apt/sources.list.d/ubdirect-backports.list
fi

if ((have_tbpo == 0)); then
    log "adding trixie-backports (pinned at 50: only linux-source-7.3 comes from it)"
    grep -rqs 'trixie-backports' /etc/apt/sources.list /etc/apt/sources.list.d/ ||
        echo 'deb http://deb.debian.org/debian trixie-backports main' \
            >/etc/apt/sources.list.d/ubdirect-trixie-backports.list
    printf '%s\n' '# ubdirect (scripts/deps.sh): only linux-source-7.3 comes from trixie-backports; nothing else upgrades.' \
        'Package: *' 'Pin: release n=trixie-backports' 'Pin-Priority: 50' \
        >/etc/apt/preferences.d/ubdirect-trixie-backports
fi

if ((${#need_base[@]} + ${#need_bpo[@]} + ${#need_tbpo[@]} > 0)); then log "installing: ${need_base[*]} ${need_bpo[*]} ${need_tbpo[*]}"; fi
apt-get update -qq || die "apt-get update failed: check the network and /etc/apt/sources.list*"
if ((${#need_base[@]} > 0)); then
    apt-get install -y -qq --no-install-recommends "${need_base[@]}" >/dev/null ||
        die "apt-get install ${need_base[*]} failed"
fi
if ((${#need_bpo[@]} > 0)); then
    apt-get install -y -qq --no-install-recommends -t bookworm-backports "${need_bpo[@]}" >/dev/null ||
        die "apt-get install -t bookworm-backports ${need_bpo[*]} failed"
fi

if ((${#need_tbpo[@]} > 0)); then
    apt-get install -y -qq --no-install-recommends -t trixie-backports "${need_tbpo[@]}" >/dev/null ||
        die "apt-get install -t trixie-backports ${need_tbpo[*]} failed"
fi

left=$(missing "${BASE_PKGS[@]}" "${BACKPORTS_PKGS[@]}" "${KBUILD_PKGS[@]}" "${TRIXIE_BPO_PKGS[@]}" | sed '/^$/d' | tr '\n' ' ')
[[ -z $left ]] || die "still missing after apt: $left"
log "all test dependencies installed"
