#!/usr/bin/env bash
# Host tests of the test bed's own logic: the TAP and libtest counters the guest plan uses, the
# skip allow-list scoped by boot, the suite's closing lines, the host-check runner, the pair
# runs' target checks and counts, nvme-insn.sh --check's refusal of an empty measurement, and
# the NVMe image pattern. No guest needed; run by scripts/test.sh.
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
expect "tap: exit 0 without TAP is one failure (it tested nothing)" "0 1 0" "$(tap 0 'just text\n')"
expect "tap: exit 0 and an empty output is one failure" "0 1 0" "$(tap 0 '')"
expect "tap: a plan alone with its tests run is not that failure" "1 0 0" "$(tap 0 '1..1\nok 1\n')"
expect "tap: non-zero exit after only oks is a failure" "2 1 0" "$(tap 1 'ok 1\nok 2\n')"
expect "tap: missing planned tests fail" "1 2 0" "$(tap 0 '1..3\nok 1 - a\n')"
expect "tap: Bail out! fails" "1 1 0" "$(tap 0 'ok 1\nBail out! no devices\n')"
expect "tap: lines that only look like TAP do not count (no TAP: one failure)" "0 1 0" "$(tap 0 '# ok 1\n  ok 2\nokay\nnot okay\n')"
expect "tap: a 1..0 # SKIP file counts one skipped" "0 0 1" "$(tap 0 '1..0 # SKIP ubdirect binary not in the guest\n')"
expect "tap: a bare 1..0 plan counts one skipped" "0 0 1" "$(tap 0 '1..0\n')"
expect "tap: 1..10 is a plan of ten, not a skip" "1 9 0" "$(tap 0 '1..10\nok 1\n')"

# libtest counting (passed failed skipped)
expect "libtest: sums result lines" "5 1 0" "$(lt 101 'test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s\ntest result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.2s\n')"
expect "libtest: no summary and exit 0 is one pass (harness = false)" "1 0 0" "$(lt 0 'hello\n')"
expect "libtest: no summary and killed is one failure" "0 1 0" "$(lt 137 'test a ... \n')"
expect "libtest: crash after a clean summary is a failure" "2 1 0" "$(lt 139 'test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s\n')"
expect "libtest: ignored counts as skipped" "0 0 4" "$(lt 0 'test result: ok. 0 passed; 0 failed; 4 ignored; 0 measured; 0 filtered out; finished in 0.0s\n')"
expect "libtest: a UBD-SKIP line moves a pass to skipped" "2 0 1" \
    "$(lt 0 'test a ... UBD-SKIP a: no multiqueue NIC\nok\ntest result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s\n')"
expect "libtest: a UBD-SKIP line on its own line counts too" "0 0 2" \
    "$(lt 0 'UBD-SKIP a: x\nUBD-SKIP b: y\ntest result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s\n')"
expect "libtest: a skip never turns a failure into a skip" "0 1 0" \
    "$(lt 101 'UBD-SKIP a: x\ntest result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s\n')"
expect "libtest: harness-less binary that skipped" "0 0 1" "$(lt 0 'UBD-SKIP main: no device\n')"

# The skip allow-list (skips.sh): every skip line the counters count is checked, in its boot.
printf '%s\n' '# comment' '' '[6.12 ubd] no vfat -- this kernel has no vfat module' '[6.12,6.1] UBD-SKIP y: -- y needs z' >"$tmp/allow"
: >"$tmp/allow-none"
sk() { printf '%b' "$3" | "$here/skips.sh" "$1" "$2" >"$tmp/sk.out" 2>&1; echo "$? $(tail -n1 "$tmp/sk.out")"; }
log='ok 1 - a\nok 2 - b # SKIP no vfat\n1..0 # SKIP no binary\ntest x ... UBD-SKIP x: no mq\nnot ok 3 - c # TODO later\nnot ok 4 - d\n# ok 5 # SKIP\n'
expect "skips: an empty allow-list flags every kind of skip" "1 skips: 4, 0 allowed, 4 unexpected" "$(sk "$tmp/allow-none" 6.12 "$log")"
expect "skips: an unexpected skip is named with its reason" "1" "$(grep -c '^unexpected: UBD-SKIP x: no mq$' "$tmp/sk.out")"
expect "skips: allowed by fixed text in its boot, comments and blank lines ignored" "1 skips: 4, 1 allowed, 3 unexpected" "$(sk "$tmp/allow" ubd "$log")"
expect "skips: the allowed line carries the reason" "1" "$(grep -c '^allowed: ok 2 - b # SKIP no vfat (this kernel has no vfat module)$' "$tmp/sk.out")"
expect "skips: the same text in a boot the entry does not name is unexpected" "1 skips: 4, 0 allowed, 4 unexpected" "$(sk "$tmp/allow" 6.1 "$log")"
expect "skips: no skip, nothing to allow" "0 skips: 0, 0 allowed, 0 unexpected" "$(sk "$tmp/allow-none" 6.12 'ok 1\ntest result: ok. 1 passed\n')"
expect "skips: all allowed (boots split by commas or spaces)" "0 skips: 2, 2 allowed, 0 unexpected" "$(sk "$tmp/allow" 6.12 'ok 2 # SKIP no vfat\nUBD-SKIP y: z\n')"
expect "skips: a missing allow-list is an error" "2" "$(printf '' | "$here/skips.sh" "$tmp/nope" 6.12 >/dev/null 2>&1; echo $?)"
expect "skips: no boot is an error" "1" "$(printf '' | "$here/skips.sh" "$tmp/allow" >/dev/null 2>&1; echo $?)"
printf '%s\n' 'no vfat -- an entry without its boots' >"$tmp/allow-unscoped"
expect "skips: an entry without its boots is an error in the list" "2" "$(sk "$tmp/allow-unscoped" 6.12 'ok 1 # SKIP no vfat\n' | cut -d' ' -f1)"
expect "skips: ... named with its line" "1" "$(grep -c 'line 1: want "\[BOOT...\] <text> -- <why>"' "$tmp/sk.out")"
printf '%s\n' '[6.12] no vfat' >"$tmp/allow-noreason"
expect "skips: an entry without a reason is an error in the list" "2" "$(sk "$tmp/allow-noreason" 6.12 'ok 1 # SKIP no vfat\n' | cut -d' ' -f1)"
# The project's own list: the dma-buf tests' skip is allowed on the Debian kernels only, the
# no-IOMMU tests' skip in the IOMMU boots only.
real="$here/expected-skips"
dmabuf='test the_domain_reports_iommufd_and_its_ioas_ranges ... UBD-SKIP the_domain_reports_iommufd_and_its_ioas_ranges: needs the iommufd back end (this kernel gave Some(Type1): boot --kernel ubd)\n'
noiommu='UBD-SKIP noiommu_nvme_write_read: needs the no-IOMMU boot (scripts/vm/suite.sh --kernel ubd --no-iommu)\n'
expect "expected-skips: a dma-buf skip on 6.12 is allowed" "0 skips: 1, 1 allowed, 0 unexpected" "$(sk "$real" 6.12 "$dmabuf")"
expect "expected-skips: a dma-buf skip on ubd (fallen back to type1) fails" "1 skips: 1, 0 allowed, 1 unexpected" "$(sk "$real" ubd "$dmabuf")"
expect "expected-skips: a no-IOMMU skip in an IOMMU boot is allowed" "0 skips: 1, 1 allowed, 0 unexpected" "$(sk "$real" ubd "$noiommu")"
expect "expected-skips: a no-IOMMU skip in the no-IOMMU boot fails" "1 skips: 1, 0 allowed, 1 unexpected" "$(sk "$real" ubd-noiommu "$noiommu")"
expect "expected-skips: nothing is allowed in a pair boot" "1 skips: 1, 0 allowed, 1 unexpected" "$(sk "$real" pair-6.12 "$dmabuf")"
expect "expected-skips: every entry is scoped and has a reason" "0" "$(sk "$real" 6.12 '' | cut -d' ' -f1)"

# The closing lines (summary.sh) from a fake run directory.
rd="$tmp/rd"
mkdir -p "$rd"
echo "prepare 1.0s, guest 2.0s (boot to /init 1s)" >"$rd/timing"
# run_summary GUEST-LOG HOSTCHECK-LOG [RC]: exit status and the closing lines joined by '|'.
run_summary() {
    printf '%b' "$1" >"$rd/guest.log"
    printf '%b' "$2" >"$rd/hostcheck.log"
    UBD_VM_EXPECTED_SKIPS="$tmp/allow" "$here/summary.sh" "$rd" "${3:-0}" 900 7 "${4:-6.12}" >"$tmp/sum.out" 2>&1
    echo "$? $(grep -v '^$' "$tmp/sum.out" | sed 's/;.*//' | paste -sd'|')"
}
suites='@@UBD-SUITE@@ guest-shell 3 0 1\n@@UBD-SUITE@@ guest-rust 5 0 0\n'
expect "summary: all passed, an allowed skip, host checks as requested" \
    "0 guest-shell: 3 passed, 0 failed, 1 skipped|guest-rust: 5 passed, 0 failed, 0 skipped|hostcheck: 2 passed, 0 failed, 0 skipped (2 requested)|guest: 10 passed, 0 failed, 1 skipped" \
    "$(run_summary "${suites}ok 4 # SKIP no vfat\n@@UBD-HOSTCHECKS@@ 2\n" 'ok 1 - hostcheck a\nok 2 - hostcheck b\n')"
expect "summary: a requested host check that never ran fails" \
    "1 guest-shell: 3 passed, 0 failed, 1 skipped|guest-rust: 5 passed, 0 failed, 0 skipped|hostcheck: 1 passed, 1 failed, 0 skipped (2 requested, 1 ran: see $rd/hostcheck.log)|guest: 9 passed, 1 failed, 1 skipped" \
    "$(run_summary "${suites}@@UBD-HOSTCHECKS@@ 2\n" 'ok 1 - hostcheck a\n')"
expect "summary: more host checks than requested fails" "1" \
    "$(run_summary "${suites}@@UBD-HOSTCHECKS@@ 0\n" 'ok 1 - hostcheck a\n' | cut -c1)"
expect "summary: no requested count from the guest fails" "1" "$(run_summary "$suites" '' | cut -c1)"
expect "summary: a skip the allow-list does not hold fails and is named" \
    "1 skip not allowed in boot 6.12 by $tmp/allow: UBD-SKIP m: no multiqueue NIC|guest: 8 passed, 1 failed, 1 skipped" \
    "$(run_summary "${suites}test m ... UBD-SKIP m: no multiqueue NIC\n@@UBD-HOSTCHECKS@@ 0\n" '' | sed 's/^\([01]\) .*|\(skip not\)/\1 \2/')"
expect "summary: a skip allowed in another boot fails in this one" \
    "1 skip not allowed in boot 6.1 by $tmp/allow: ok 4 # SKIP no vfat|guest: 10 passed, 1 failed, 1 skipped" \
    "$(run_summary "${suites}ok 4 # SKIP no vfat\n@@UBD-HOSTCHECKS@@ 2\n" 'ok 1 - hostcheck a\nok 2 - hostcheck b\n' 0 6.1 | sed 's/^\([01]\) .*|\(skip not\)/\1 \2/')"
expect "summary: an allow-list it cannot use fails" "1" \
    "$(UBD_VM_EXPECTED_SKIPS="$tmp/allow-unscoped" "$here/summary.sh" "$rd" 0 900 7 6.12 >/dev/null 2>&1; echo $?)"
expect "summary: a suite the guest never reported fails" "1 guest-shell: 0 passed, 1 failed, 0 skipped (the guest never reported this suite" \
    "$(run_summary '@@UBD-SUITE@@ guest-rust 5 0 0\n@@UBD-HOSTCHECKS@@ 0\n' '' | cut -d'|' -f1 | sed 's/: see .*//')"
expect "summary: a guest killed at its deadline fails" "1" \
    "$(run_summary "${suites}@@UBD-HOSTCHECKS@@ 0\n" '' 124 | cut -c1)"
expect "summary: the deadline is named" "1" "$(grep -c '^guest: 8 passed, 1 failed, 1 skipped (DEADLINE: the guest was killed after 900s)' "$tmp/sum.out")"
echo "no guest heartbeat for 120 s" >"$rd/frozen"
expect "summary: a frozen guest fails and is named" "1 1" \
    "$(run_summary "${suites}@@UBD-HOSTCHECKS@@ 0\n" '' 123 | cut -c1) $(grep -c '^guest: 8 passed, 1 failed, 1 skipped (FROZE: no guest heartbeat for 120 s)' "$tmp/sum.out")"
rm -f "$rd/frozen"
expect "summary: a suite booted again after a frozen boot names it" "1" \
    "$(UBD_VM_EXPECTED_SKIPS="$tmp/allow" "$here/summary.sh" "$rd" 0 900 7 6.12 'after a first boot that froze (x)' 2>&1 | grep -c '^guest: .*; after a first boot that froze (x)$')"

# A pair run's target checks (targetcheck.sh): each request checked in the target's run
# directory; a request count that differs from the checks that ran fails.
mkdir -p "$tmp/tgt"
printf 'ABCD' >"$tmp/tgt/nvme0.img"
tc() { printf '%b' "$2" >"$tmp/ilog" && "$here/targetcheck.sh" "$1" "$tmp/ilog" >"$tmp/tc.out" 2>&1; echo "$? $(tail -n1 "$tmp/tc.out")"; }
expect "targetcheck: requested and ran" "0 targetcheck: 1 passed, 0 failed (1 requested)" \
    "$(tc "$tmp/tgt" 'ok 1\nUBD-TARGETCHECK w file-bytes nvme0.img:1 4243\n@@UBD-TARGETCHECKS@@ 1\n')"
expect "targetcheck: a check that fails is named" "1 1" \
    "$(tc "$tmp/tgt" 'UBD-TARGETCHECK w file-bytes nvme0.img:1 ff\n@@UBD-TARGETCHECKS@@ 1\n' | cut -c1) $(grep -c '^targetcheck: not ok 1 - hostcheck w' "$tmp/tc.out")"
expect "targetcheck: a request lost on the console fails" "1 targetcheck: 1 passed, 1 failed (2 requested, 1 ran)" \
    "$(tc "$tmp/tgt" 'UBD-TARGETCHECK w file-bytes nvme0.img:1 4243\n@@UBD-TARGETCHECKS@@ 2\n')"
expect "targetcheck: no request count from the initiator fails" "1" \
    "$(tc "$tmp/tgt" 'UBD-TARGETCHECK w file-bytes nvme0.img:1 4243\n' | cut -c1)"
expect "targetcheck: no target run directory fails" "1 targetcheck: 0 passed, 1 failed (no target run directory '': 1 requested, 0 ran)" \
    "$(tc '' 'UBD-TARGETCHECK w file-bytes nvme0.img:1 4243\n@@UBD-TARGETCHECKS@@ 1\n')"
expect "targetcheck: none requested, none ran" "0 targetcheck: 0 passed, 0 failed (0 requested)" "$(tc "$tmp/tgt" '@@UBD-TARGETCHECKS@@ 0\n')"

# A pair run's count (pair-count.sh): TAP + target checks + skips allowed in its boot.
pc() { printf '%b' "$3" >"$tmp/plog" && UBD_VM_EXPECTED_SKIPS="$tmp/allow" "$here/pair-count.sh" "$1" "$tmp/plog" "$2" >"$tmp/pc.out" 2>&1; tail -n1 "$tmp/pc.out"; }
pend='pair: initiator status 0, target status 0, targetcheck 1 passed, 0 failed\n'
expect "pair-count: TAP and target checks added" "3 0 0" "$(pc pair-6.12 0 "1..2\nok 1\nok 2\n$pend")"
expect "pair-count: a skip not allowed in the pair boot fails and is named" "2 1 1 1" \
    "$(pc pair-6.12 0 "1..2\nok 1\nok 2 # SKIP no vfat\n$pend") $(grep -c '^skip not allowed in boot pair-6.12: ok 2 # SKIP no vfat' "$tmp/pc.out")"
expect "pair-count: a script that printed no TAP fails" "1 1 0" "$(pc pair-ubd 0 "just text\n$pend")"
expect "pair-count: no closing pair line fails" "1 1 0" "$(pc pair-ubd 0 '1..1\nok 1\n')"
expect "pair-count: failed target checks count" "1 3 0" \
    "$(pc pair-ubd 0 '1..1\nok 1\npair: initiator status 0, target status 0, targetcheck 0 passed, 3 failed\n')"

# test.sh's closing line (total.sh) from its summary lines; FAILED-STEPS first.
tot() { printf '%b' "$2" | "$here/total.sh" "$1"; }
ok_lines='fmt: ok\nhost: 10 passed, 0 failed\nvm-selftest: 5 passed, 0 failed\nguest: 20 passed, 0 failed, 1 skipped (guest 200s)\n'
expect "total: every counted line added up, skips from guest lines" "total: 41 passed, 0 failed, 1 skipped" \
    "$(tot 0 "${ok_lines}soak: 6 passed, 0 failed (77s)\n")"
expect "total: a soak line with 1 failure is 1 failed" "total: 40 passed, 1 failed, 1 skipped" \
    "$(tot 1 "${ok_lines}soak: 5 passed, 1 failed (77s)\n")"
expect "total: a soak that printed no summary counts as 1 failed" "total: 35 passed, 1 failed, 1 skipped" \
    "$(tot 1 "${ok_lines}soak: 0 passed, 1 failed (scripts/soak.sh exited 125 without its summary; see x)\n")"
expect "total: guest[K] and guest-pair[K] lines count, hostcheck and guest-rust do not" "total: 7 passed, 2 failed, 3 skipped" \
    "$(tot 1 'guest-rust: 9 passed, 9 failed, 9 skipped\nhostcheck: 9 passed, 0 failed\nguest[6.12]: 4 passed, 1 failed, 2 skipped\nguest-pair[ubd]: 3 passed, 1 failed, 1 skipped\n')"
expect "total: the host line's skipped (GPU tests not run) count" "total: 10 passed, 0 failed, 5 skipped" \
    "$(tot 0 'host: 10 passed, 0 failed, 5 skipped (not run: 5 GPU tests need an NVIDIA GPU and driver, run them with --ignored on a GPU machine: a b c d e) (12s)\n')"
expect "total: the python line counts, its skips too" "total: 13 passed, 1 failed, 2 skipped" \
    "$(tot 1 'host: 10 passed, 0 failed\npython: 3 passed, 1 failed, 2 skipped (wheel ubdirect-0.1.0-cp39-abi3-linux_x86_64.whl, 30s)\n')"
expect "total: each FAILED step is one failure" "total: 10 passed, 2 failed, 0 skipped" \
    "$(tot 1 'deps: FAILED (run it as root)\nclippy: FAILED (40s)\nhost: 10 passed, 0 failed\n')"
expect "total: a failed step with no counted failure still shows one" "total: 10 passed, 1 failed, 0 skipped" \
    "$(tot 1 'host: 10 passed, 0 failed\nembedder: no\n')"

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

# Bad input to the test bed's own commands: refused by name, nothing started.
# out_of CMD...: "<exit status> <first line of stderr holding 'error'/'nvmet.sh:'>".
out_of() {
    "$@" >/dev/null 2>"$tmp/err"
    echo "$? $(grep -m1 -E 'error|nvmet.sh:' "$tmp/err")"
}
expect "run.sh: --no-iommu on a Debian kernel is refused" \
    "2 vm: error: --no-iommu needs --kernel ubd: Debian's 6.12 kernel has no CONFIG_VFIO_NOIOMMU" \
    "$(out_of "$here/run.sh" --kernel 6.12 --no-iommu -- true)"
expect "run.sh: a malformed --peer is refused" \
    "2 vm: error: --peer wants listen:PATH:IP/LEN or connect:PATH:IP/LEN (e.g. listen:/tmp/ubd-pair.sock:10.77.0.1/24), got 'listen:/tmp/x'" \
    "$(out_of "$here/run.sh" --peer listen:/tmp/x -- true)"
expect "kernel.sh: an unknown kernel names the choices" \
    "2 vm: error: unknown kernel series '7.0': use 6.12 (bookworm-backports), 6.1 (bookworm) or ubd (built from linux-source-7.3, scripts/vm/kernel-build.sh)" \
    "$(out_of "$here/kernel.sh" 7.0)"
expect "nvmet.sh: no address" "1 nvmet.sh: no address: nvmet.sh ADDR [--dev DEV | --file PATH] (e.g. 127.0.0.1)" \
    "$(out_of sh "$here/nvmet.sh")"
expect "nvmet.sh: --dev that is not a block device" \
    "1 nvmet.sh: $tmp is not a block device (a test-bed namespace on the kernel nvme driver, e.g. /dev/nvme0n1)" \
    "$(out_of sh "$here/nvmet.sh" 127.0.0.1 --dev "$tmp")"
expect "nvmet.sh: --dev and --file together" "1 nvmet.sh: --dev and --file exclude each other" \
    "$(out_of sh "$here/nvmet.sh" 127.0.0.1 --dev /dev/null --file "$tmp/f")"
expect "nvmet.sh: ... and created no file" "no" "$([[ -e $tmp/f ]] && echo yes || echo no)"
expect "nvmet.sh: DH-HMAC-CHAP settings without a host key" \
    "1 nvmet.sh: --dhchap-ctrl-key-file, --dhchap-hash and --dhchap-dhgroup need --dhchap-key-file" \
    "$(out_of sh "$here/nvmet.sh" --allow-host nqn.2014-08.org.nvmexpress:uuid:x --dhchap-hash 'hmac(sha512)')"
expect "nvmet.sh: an unreadable host key file" "1 nvmet.sh: cannot read the secret file $tmp/no.key" \
    "$(out_of sh "$here/nvmet.sh" --allow-host nqn.2014-08.org.nvmexpress:uuid:x --dhchap-key-file "$tmp/no.key")"
expect "nvmet.sh: a controller secret without a host secret (kernel host)" \
    "1 nvmet.sh: --dhchap-ctrl-secret-file needs --dhchap-secret-file" \
    "$(out_of sh "$here/nvmet.sh" --connect 127.0.0.1 --dhchap-ctrl-secret-file "$tmp/no.key")"
expect "pair.sh: no initiator command" "2 vm: error: no initiator command: scripts/vm/pair.sh [options] -- <command> (see --help)" \
    "$(out_of "$here/pair.sh")"

# The guest's CPU watch (guest/cpuwatch) on a clock file it is given: quiet while every
# heartbeat is fresh; a watch whose heartbeat stops (SIGSTOP) is reported by the other once,
# and its CPU gets a task.
if (($(nproc) >= 2)); then
    mkdir -p "$tmp/cw"
    echo "100.00 5.00" >"$tmp/clock"
    UBD_CPUWATCH_UPTIME="$tmp/clock" sh "$here/guest/cpuwatch" 0 "$tmp/cw" 5 0.1 >"$tmp/cw0.out" &
    cw0=$!
    UBD_CPUWATCH_UPTIME="$tmp/clock" sh "$here/guest/cpuwatch" 1 "$tmp/cw" 5 0.1 >"$tmp/cw1.out" &
    cw1=$!
    sleep 0.6
    expect "cpuwatch: nothing reported while every heartbeat is fresh" "" "$(cat "$tmp/cw0.out" "$tmp/cw1.out")"
    kill -STOP "$cw1"
    echo "106.00 5.00" >"$tmp/clock"
    for _ in $(seq 100); do # up to 10 s on a loaded host; ~0.2 s on a quiet one
        (($(wc -l <"$tmp/cw0.out") >= 2)) && break
        sleep 0.1
    done
    kill "$cw0"
    kill -CONT "$cw1"
    kill "$cw1"
    wait "$cw0" "$cw1" 2>/dev/null
    expect "cpuwatch: a stalled CPU is reported and woken" \
        "GUEST-CPU-STALL cpu 1: no heartbeat for 6 s at t=106 s (a lost timer interrupt?): waking it from cpu 0
GUEST-CPU-STALL cpu 1: ran a task again at t=106 s" "$(head -n 2 "$tmp/cw0.out")"
    expect "cpuwatch: the stalled watch itself reported nothing" "" "$(cat "$tmp/cw1.out")"
else
    n=$((n + 1))
    echo "ok $n - cpuwatch: needs 2 CPUs # SKIP"
fi

# The instruction-count check (scripts/bench/nvme-insn.sh --check) refuses a measurement that saw
# nothing: a "binary" that reports its reads but has none of the example's step functions.
if command -v valgrind >/dev/null && command -v callgrind_annotate >/dev/null; then
    printf '#!/bin/sh\necho "completed 20000 sq_doorbells 20000 cq_doorbells 20000"\n' >"$tmp/insn-fake"
    chmod +x "$tmp/insn-fake"
    BIN="$tmp/insn-fake" "$here/../bench/nvme-insn.sh" --check >"$tmp/insn.out" 2>&1
    expect "nvme-insn --check: zero instructions counted fails" "1 1" \
        "$? $(grep -c '^insn-check: FAILED (the measurement saw too little of the driver: QD1 submit 0 complete 0 insn/IO' "$tmp/insn.out")"
else
    n=$((n + 1))
    echo "ok $n - nvme-insn --check: no valgrind # SKIP run scripts/deps.sh"
fi

# The NVMe image pattern (images.sh) matches ubdirect_testbed::pattern_word.
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
