#!/usr/bin/env bash
# Host tests of the test bed's own logic: the TAP and libtest counters the guest plan uses, the
# host-check runner, and the NVMe image pattern. No guest needed; run by scripts/test.sh.
# Prints TAP and a last line "vm-selftest: N passed, N failed"; exit 1 if any failed.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0 pass=0 fail=0

# expect NAME WANT GOT
expect() {
    n=$((n + 1))
    if [[ $2 == "$3" ]]; then
        echo "ok $n - $1"
        pass=$((pass + 1))
    else
        echo "not ok $n - $1: want '$2', got '$3'"
        fail=$((fail + 1))
    fi
}
tap() { printf '%b' "$2" >"$tmp/in" && awk -v rc="$1" -f "$here/guest/tap-count.awk" "$tmp/in"; }
lt() { printf '%b' "$2" >"$tmp/in" && awk -v rc="$1" -f "$here/guest/libtest-count.awk" "$tmp/in"; }

# TAP counting (passed failed skipped)
expect "tap: ok and not ok lines" "2 1 0" "$(tap 1 'ok 1 - a\nnot ok 2 - b\nok 3 - c\n')"
expect "tap: numberless ok lines count" "2 0 0" "$(tap 0 'ok - a\nok\n')"
expect "tap: SKIP and TODO are skipped" "1 0 2" "$(tap 0 'ok 1 - a # SKIP no nic\nnot ok 2 - b # TODO later\nok 3\n')"
expect "tap: exit 3 without TAP is one failure" "0 1 0" "$(tap 3 'no tap here\n')"
expect "tap: exit 0 without TAP counts nothing" "0 0 0" "$(tap 0 'just text\n')"
expect "tap: non-zero exit after only oks is a failure" "2 1 0" "$(tap 1 'ok 1\nok 2\n')"
expect "tap: missing planned tests fail" "1 2 0" "$(tap 0 '1..3\nok 1 - a\n')"
expect "tap: Bail out! fails" "1 1 0" "$(tap 0 'ok 1\nBail out! no devices\n')"
expect "tap: lines that only look like TAP do not count" "0 0 0" "$(tap 0 '# ok 1\n  ok 2\nokay\nnot okay\n')"

# libtest counting (passed failed skipped)
expect "libtest: sums result lines" "5 1 0" "$(lt 101 'test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s\ntest result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.2s\n')"
expect "libtest: no summary and exit 0 is one pass (harness = false)" "1 0 0" "$(lt 0 'hello\n')"
expect "libtest: no summary and killed is one failure" "0 1 0" "$(lt 137 'test a ... \n')"
expect "libtest: crash after a clean summary is a failure" "2 1 0" "$(lt 139 'test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s\n')"
expect "libtest: ignored counts as skipped" "0 0 4" "$(lt 0 'test result: ok. 0 passed; 0 failed; 4 ignored; 0 measured; 0 filtered out; finished in 0.0s\n')"

# Host checks
mkdir -p "$tmp/run"
printf 'ABCDEFGH' >"$tmp/run/a.img"
printf 'xxABCDyy' >"$tmp/run/b.img"
printf 'secret' >"$tmp/outside"
printf '\xab\xcd' >"$tmp/run/c.img"
hc() { printf '%s\n' "$@" | "$here/hostcheck.sh" "$tmp/run" >"$tmp/hc.out" 2>&1; echo "$? $(tail -n1 "$tmp/hc.out")"; }
expect "hostcheck: file-eq holds" "0 hostcheck: 1 passed, 0 failed" "$(hc 'UBD-HOSTCHECK e file-eq a.img:0 b.img:2 4')"
expect "hostcheck: file-eq differs" "1 hostcheck: 0 passed, 1 failed" "$(hc 'UBD-HOSTCHECK e file-eq a.img:0 b.img:0 4')"
expect "hostcheck: file-bytes with hex offset, after a libtest prefix" "0 hostcheck: 1 passed, 0 failed" \
    "$(hc 'test x ... UBD-HOSTCHECK b file-bytes a.img:0x2 4344')"
expect "hostcheck: file-bytes uppercase hex" "0 hostcheck: 1 passed, 0 failed" "$(hc 'UBD-HOSTCHECK b file-bytes c.img:0 ABCD')"
expect "hostcheck: file-bytes differs" "1 hostcheck: 0 passed, 1 failed" "$(hc 'UBD-HOSTCHECK b file-bytes a.img:0 4142ff')"
expect "hostcheck: past the end fails" "1 hostcheck: 0 passed, 1 failed" "$(hc 'UBD-HOSTCHECK b file-bytes a.img:7 4849')"
expect "hostcheck: a path out of the run directory fails" "1 hostcheck: 0 passed, 1 failed" \
    "$(hc 'UBD-HOSTCHECK p file-bytes ../outside:0 73')"
expect "hostcheck: odd hex fails" "1 hostcheck: 0 passed, 1 failed" "$(hc 'UBD-HOSTCHECK b file-bytes a.img:0 414')"
expect "hostcheck: unknown kind fails" "1 hostcheck: 0 passed, 1 failed" "$(hc 'UBD-HOSTCHECK k file-sha a.img:0 00')"
expect "hostcheck: missing words fail" "1 hostcheck: 0 passed, 1 failed" "$(hc 'UBD-HOSTCHECK k file-eq a.img:0 b.img:0')"
expect "hostcheck: several lines, other lines ignored" "1 hostcheck: 1 passed, 1 failed" \
    "$(hc 'noise' 'UBD-HOSTCHECK a file-bytes a.img:0 41' 'UBD-HOSTCHECK b file-bytes a.img:0 42')"
expect "hostcheck: a failure says why" "1" "$(grep -c 'not ok 2 - hostcheck b: a.img at 0 holds 41 not 42' "$tmp/hc.out")"

# The NVMe image pattern (images.sh) matches ubdirect_core::testbed::pattern_word.
img="${UBD_VM_CACHE:-$here/../../.vm-cache}/images/nvme1-ns2.img"
if [[ -f $img ]]; then
    expect "pattern: nvme1-ns2.img word at 0x1000 is (3 << 56) | 0x1000" " 0300000000001000" \
        "$(od -An -tx8 -j 4096 -N 8 "$img")"
    expect "pattern: nvme1-ns2.img last word" " 0300000003fffff8" "$(od -An -tx8 -j $((64 * 1048576 - 8)) -N 8 "$img")"
else
    n=$((n + 1))
    echo "ok $n - pattern: no cached image yet # SKIP run scripts/vm/images.sh"
fi

echo "vm-selftest: $pass passed, $fail failed"
((fail == 0))
