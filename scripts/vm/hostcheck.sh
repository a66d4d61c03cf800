#!/usr/bin/env bash
# Run the guest's UBD-HOSTCHECK requests against a run directory's backing files, after the
# guest has exited. Reads the guest log on stdin (or the file given as $2); every line holding
#   UBD-HOSTCHECK <name> file-eq <fileA>:<offA> <fileB>:<offB> <len>
#   UBD-HOSTCHECK <name> file-bytes <file>:<off> <hexbytes>
# is one test. File names are bare names inside the run directory; numbers are decimal or 0x hex.
# Prints TAP lines and a last line "hostcheck: N passed, N failed"; exit 1 if any failed.
#
# Usage: hostcheck.sh <run-dir> [guest.log]
set -euo pipefail

dir=${1:?usage: hostcheck.sh <run-dir> [guest.log]}
log=${2:-/dev/stdin}
pass=0 fail=0 n=0

num() { [[ $1 =~ ^(0x[0-9a-fA-F]+|[0-9]+)$ ]] && echo $(($1)); }

# file_ok NAME: the bare name of an existing file in the run directory.
file_ok() { [[ $1 =~ ^[A-Za-z0-9._-]+$ && $1 != . && $1 != .. && -f $dir/$1 ]]; }

# check WORDS...: run one request; prints nothing and returns 0 when it holds, else says why.
check() {
    local kind=$1
    shift
    case $kind in
    file-eq)
        (($# == 3)) || { echo "file-eq wants <fileA>:<offA> <fileB>:<offB> <len>, got '$*'" && return 1; }
        local fa=${1%:*} fb=${2%:*} oa ob len sa sb
        oa=$(num "${1##*:}") || { echo "bad offset in '$1'" && return 1; }
        ob=$(num "${2##*:}") || { echo "bad offset in '$2'" && return 1; }
        len=$(num "$3") || { echo "bad length '$3'" && return 1; }
        file_ok "$fa" || { echo "no file '$fa' in the run directory (use a bare name: nvme0.img, gpubar, ...)" && return 1; }
        file_ok "$fb" || { echo "no file '$fb' in the run directory (use a bare name: nvme0.img, gpubar, ...)" && return 1; }
        sa=$(stat -c %s "$dir/$fa")
        sb=$(stat -c %s "$dir/$fb")
        ((oa + len <= sa)) || { echo "$fa:$oa+$len runs past its end ($sa bytes)" && return 1; }
        ((ob + len <= sb)) || { echo "$fb:$ob+$len runs past its end ($sb bytes)" && return 1; }
        local out
        if out=$(cmp -i "$oa:$ob" -n "$len" "$dir/$fa" "$dir/$fb" 2>&1); then
            return 0
        fi
        echo "${out//$dir\//} (cmp counts bytes from 1 at the range starts)"
        return 1
        ;;
    file-bytes)
        (($# == 2)) || { echo "file-bytes wants <file>:<off> <hexbytes>, got '$*'" && return 1; }
        local f=${1%:*} off hex got size
        off=$(num "${1##*:}") || { echo "bad offset in '$1'" && return 1; }
        hex=${2,,}
        [[ $hex =~ ^([0-9a-f][0-9a-f])+$ ]] || { echo "bad hex bytes '$2' (want an even number of hex digits)" && return 1; }
        file_ok "$f" || { echo "no file '$f' in the run directory (use a bare name: nvme0.img, gpubar, ...)" && return 1; }
        size=$(stat -c %s "$dir/$f")
        ((off + ${#hex} / 2 <= size)) || { echo "$f:$off+$((${#hex} / 2)) runs past its end ($size bytes)" && return 1; }
        got=$(od -An -v -tx1 -j "$off" -N $((${#hex} / 2)) "$dir/$f" | tr -d ' \n')
        [[ $got == "$hex" ]] && return 0
        echo "$f at $off holds ${got:0:64} not ${hex:0:64}"
        return 1
        ;;
    *)
        echo "unknown check kind '$kind' (file-eq or file-bytes)"
        return 1
        ;;
    esac
}

while IFS= read -r line; do
    [[ $line == *UBD-HOSTCHECK\ * ]] || continue
    # shellcheck disable=SC2086 # split the request into words
    set -- ${line#*UBD-HOSTCHECK }
    n=$((n + 1))
    name=${1:-unnamed}
    (($# > 0)) && shift
    if why=$(check "$@"); then
        echo "ok $n - hostcheck $name"
        pass=$((pass + 1))
    else
        echo "not ok $n - hostcheck $name: $why"
        fail=$((fail + 1))
    fi
done <"$log"
echo "hostcheck: $pass passed, $fail failed"
((fail == 0))
