#!/usr/bin/env bash
# The project's single test command (CI runs exactly this, through .ci/run):
#   1. scripts/deps.sh                                  (packages; quiet when installed)
#   2. cargo fmt --all --check
#   3. cargo clippy --workspace --all-targets -- -D warnings
#      RUSTDOCFLAGS=-D warnings cargo doc --workspace --no-deps
#   4. cargo test --workspace                           host tests  -> "host: N passed, N failed,
#                                                       N skipped" (skipped: the GPU tests, named)
#      scripts/vm/selftest.sh                           the test bed's logic -> "vm-selftest: ..."
#      scripts/python-check.sh                          the wheel (pip wheel ./python) and pytest
#                                                       python/tests -> "python: N passed, N failed,
#                                                       N skipped" (skipped: the GPU tests)
#      scripts/embedder-check.sh                        an nvme-only embedder compiles no clap,
#                                                       indicatif, cudarc, io-uring -> "embedder: ..."
#      scripts/bench/nvme-insn.sh --check               NVMe instructions per I/O (callgrind) under
#                                                       their limits -> "insn-check: ok|FAILED (...)"
#   5. scripts/vm/suite.sh --kernel K                   the whole guest suite in one QEMU boot per
#      kernel K: Debian 6.12 (vfio type1, what most users have) and ubd (built from
#      linux-source-7.3 by scripts/vm/kernel-build.sh: iommufd and the vfio device cdev, chosen
#      automatically)
#      -> "guest-shell[K]: ...", "guest-rust[K]: ...", "hostcheck[K]: ...",
#         "guest[K]: N passed, N failed, N skipped" (both counted); a skip that
#         scripts/vm/expected-skips does not allow, or a requested host check that never ran,
#         counts as a failure
#      scripts/vm/suite.sh --kernel ubd --no-iommu --filter noiommu   the ubd kernel without an
#      IOMMU (vfio no-IOMMU mode), the *noiommu* tests only -> "guest[ubd-noiommu]: ..." (counted)
#      scripts/vm/pair.sh per tests/guest/pair/*.sh       two guests (NVMe-oF target + initiator)
#      -> "guest-pair[K]: N passed, N failed, N skipped" (TAP + target-side checks, counted; a
#      skip not allowed in boot pair-K, or a requested target check that never ran, fails)
#      scripts/vm/igbvf.sh                           the igb VF tests in a guest of their own
#      shape (32-bit physical addresses) -> "guest[igbvf]: N passed, N failed, N skipped" (counted)
#   6. scripts/soak.sh --duration 120s --seed 2026      guest soak with faults -> "soak: N passed, N failed"
#      (its own boot; a fixed seed, so a failure can be run again as it was; its checks:
#      mismatches, hangs, leaks, job failures, faults survived and verified, status, minimum
#      rounds, every fault kind injected: 120 s gives the two host faults room after each other),
#      counted in the totals; a failed check fails test.sh. A guest stuck in the kernel is
#      bounded: soak.sh stops QEMU and counts it (RELIABILITY.md, "Soak").
#   7. after a whole run (no filter): every test RELIABILITY.md cites ran in one of this run's
#      logs, or was skipped visibly -> "cited-tests: N ran, N skipped visibly, N never ran"
#      (tests/reliability_citations.rs::every_cited_test_ran_in_the_suite; one never run fails)
# Every step runs even when an earlier one failed; the exit status is 1 if any failed.
#
# Options (for iterating):
#   --host-only | --guest-only     run only the host part (1-4) or only the guest part (1, 5)
#   --no-lint                      skip fmt, clippy and doc
#   --filter SUBSTRING             host: a libtest name filter; guest: see scripts/vm/suite.sh
#   --no-deps                      skip scripts/deps.sh (e.g. not root, packages known present)
#   --no-soak                      skip step 6, the 120 s soak (also skipped with --filter)
#   --kernels "6.12 ubd"           the guest kernels for the whole suite, in order (UBD_TEST_KERNELS,
#                                  default "6.12 ubd"; --kernel K = only K). The ubd kernel's
#                                  no-IOMMU boot always runs.
#   any other option goes to scripts/vm/suite.sh / run.sh (e.g. --test-timeout 900)
# The whole script is one { ...; exit; } block: bash parses it all before running any of it, so
# editing this file while a run is in progress cannot make that run execute fragments of the new
# text (see scripts/vm/run.sh).
{
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo" || exit 2
host=1 guest=1 lint=1 deps=1 soak=1 filter='' suite_args=() kernels=${UBD_TEST_KERNELS:-6.12 ubd}
while (($# > 0)); do
    case $1 in
    --host-only) guest=0 && shift ;;
    --guest-only) host=0 && lint=0 && shift ;;
    --no-lint) lint=0 && shift ;;
    --no-deps) deps=0 && shift ;;
    --no-soak) soak=0 && shift ;;
    --filter) filter=$2 && suite_args+=(--filter "$2") && shift 2 ;;
    --kernels) kernels=$2 && shift 2 ;;
    --kernel) kernels=$2 && shift 2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
    --*)
        if (($# > 1)) && [[ $2 != --* ]]; then suite_args+=("$1" "$2") && shift 2; else suite_args+=("$1") && shift; fi
        ;;
    *) echo "test.sh: unknown argument '$1' (see --help)" >&2 && exit 2 ;;
    esac
done

logs="$repo/target/ubd-test"
mkdir -p "$logs"
summary=() failed=0
t_all=$(date +%s)

step() { printf '\n==== %s\n' "$*"; }
note() { # note LINE FAILED?
    summary+=("$1")
    (($2 == 0)) || failed=1
}
elapsed() { echo "$(($(date +%s) - $1))s"; }

if ((deps == 1)); then
    step "scripts/deps.sh"
    if scripts/deps.sh; then :; else note "deps: FAILED (scripts/deps.sh; run it as root)" 1; fi
fi

# The ubd guest kernel (built from source, ~9 min of CPU) builds in the background at nice 10
# from here on, on the CPU time the lint and host steps leave idle; the ubd suite waits for it
# (kernel-build.sh's lock) if it is not done by then.
kbuild_pid=''
if ((guest == 1)) && [[ " $kernels " == *" ubd "* || -z $filter || $filter == *noiommu* ]]; then
    scripts/vm/kernel-build.sh >"$logs/kernel-build.log" 2>&1 &
    kbuild_pid=$!
fi

if ((lint == 1)); then
    step "cargo fmt --all --check"
    if cargo fmt --all --check; then note "fmt: ok" 0; else note "fmt: FAILED (run cargo fmt -p <crate>)" 1; fi
    step "cargo clippy --workspace --all-targets -- -D warnings"
    t=$(date +%s)
    if cargo clippy --workspace --all-targets -- -D warnings; then
        note "clippy: ok ($(elapsed "$t"))" 0
    else
        note "clippy: FAILED ($(elapsed "$t"))" 1
    fi
    step "RUSTDOCFLAGS=-D warnings cargo doc --workspace --no-deps"
    if RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps; then
        note "doc: ok" 0
    else
        note "doc: FAILED (a broken intra-doc link or a missing doc comment: see above)" 1
    fi
fi

if ((host == 1)); then
    step "cargo test --workspace${filter:+ -- $filter}"
    t=$(date +%s)
    host_args=()
    [[ -n $filter ]] && host_args=(-- "$filter")
    cargo test --workspace "${host_args[@]}" 2>&1 | tee "$logs/host.log"
    rc=${PIPESTATUS[0]}
    # libtest's "test result:" lines summed; cargo failing without a failed test (a build
    # error) counts as one failure.
    read -r hp hf _ < <(awk -v rc="$rc" -f scripts/vm/guest/libtest-count.awk "$logs/host.log")
    extra=
    if ((rc != 0)) && ! grep -q '^test result: FAILED' "$logs/host.log"; then
        extra=" (cargo test exited $rc without a failed test: build error? see $logs/host.log)"
    fi
    # Ignored tests no step of this script runs (libtest's "ignored, gpu: ..." reason: they
    # need an NVIDIA GPU) are counted as skipped and named, not left out of the counts; the
    # other ignored tests are the guest tests, run in step 5.
    gpu=$(grep -c '^test .* \.\.\. ignored, gpu:' "$logs/host.log")
    skip_note=
    ((gpu == 0)) || skip_note=" (not run: $gpu GPU tests need an NVIDIA GPU and driver, run them with --ignored on a GPU machine: $(sed -n 's/^test \(.*\) \.\.\. ignored, gpu:.*/\1/p' "$logs/host.log" | paste -sd' '))"
    note "host: $hp passed, $hf failed, $gpu skipped$skip_note$extra ($(elapsed "$t"))" "$hf"

    step "scripts/vm/selftest.sh (the test bed's own logic)"
    scripts/vm/selftest.sh >"$logs/vm-selftest.log" 2>&1
    rc=$?
    grep '^not ok' "$logs/vm-selftest.log"
    line=$(tail -n1 "$logs/vm-selftest.log")
    [[ $line == vm-selftest:* ]] || line="vm-selftest: 0 passed, 1 failed (see $logs/vm-selftest.log)"
    note "$line" "$rc"

    step "scripts/python-check.sh (pip wheel ./python, pytest python/tests)"
    scripts/python-check.sh 2>&1 | tee "$logs/python.log"
    rc=${PIPESTATUS[0]}
    line=$(grep '^python: ' "$logs/python.log" | tail -n1)
    [[ -n $line ]] || line="python: 0 passed, 1 failed, 0 skipped (scripts/python-check.sh exited $rc; see $logs/python.log)"
    note "$line" "$rc"

    step "scripts/embedder-check.sh (the facade's nvme feature alone)"
    scripts/embedder-check.sh 2>&1 | tee "$logs/embedder.log"
    rc=${PIPESTATUS[0]}
    line=$(grep '^embedder: ' "$logs/embedder.log" | tail -n1)
    [[ -n $line ]] || line="embedder: FAILED (see $logs/embedder.log)"
    note "$line" "$rc"

    # Instructions per I/O of the NVMe path under callgrind (exact counts: not flaky), against
    # limits ~15-20 % above today's: a slower I/O path fails here.
    if [[ -z $filter || $filter == *insn* ]]; then
        step "scripts/bench/nvme-insn.sh --check (NVMe instructions per I/O)"
        t=$(date +%s)
        scripts/bench/nvme-insn.sh --check 2>&1 | tee "$logs/insn.log"
        rc=${PIPESTATUS[0]}
        line=$(grep '^insn-check: ' "$logs/insn.log" | tail -n1)
        [[ -n $line ]] || line="insn-check: FAILED (scripts/bench/nvme-insn.sh --check exited $rc; see $logs/insn.log)"
        ((rc == 0)) || [[ $line == *FAILED* ]] || line="insn-check: FAILED (exit $rc; see $logs/insn.log)"
        note "${line%)}, $(elapsed "$t"))" "$rc"
    fi
fi

if ((guest == 1)); then
    # The ubd kernel also boots once without an IOMMU for the tests named *noiommu*
    # ("ubd-noiommu": suite.sh --kernel ubd --no-iommu --filter noiommu).
    runs=$kernels
    [[ -z $filter || $filter == *noiommu* ]] && runs="$runs ubd-noiommu"
    for k in $runs; do
        kargs=(--kernel "$k" "${suite_args[@]}")
        [[ $k == ubd-noiommu ]] && kargs=(--kernel ubd --no-iommu --filter noiommu)
        step "scripts/vm/suite.sh ${kargs[*]}"
        scripts/vm/suite.sh "${kargs[@]}" 2>&1 | tee "$logs/guest-$k.log"
        rc=${PIPESTATUS[0]}
        # The suite's closing lines, named by kernel: "guest-shell[6.12]: ...".
        mapfile -t glines < <(grep -E '^(guest-shell|guest-rust|hostcheck|guest|skips): |^skip not allowed ' "$logs/guest-$k.log" |
            sed -E "s/^(guest-shell|guest-rust|hostcheck|guest|skips): /\\1[$k]: /")
        if ((${#glines[@]} == 0)); then
            note "guest[$k]: 0 passed, 1 failed (scripts/vm/suite.sh --kernel $k exited $rc before its summary; see $logs/guest-$k.log)" 1
        else
            for l in "${glines[@]}"; do summary+=("$l"); done
            ((rc == 0)) || failed=1
        fi
        # Two guests (tests/guest/pair/*.sh on the initiator): TAP counted by tap-count.awk, plus
        # the target-side checks pair.sh ran.
        if [[ $k != ubd-noiommu ]] && [[ -z $filter || $filter == *pair* || $filter == *nvmet* ]]; then
            pp=0 pf=0 ps=0
            for f in tests/guest/pair/*.sh; do
                [[ -f $f ]] || continue
                step "scripts/vm/pair.sh --kernel $k -- sh $f"
                scripts/vm/pair.sh --kernel "$k" -- "sh $f" 2>&1 | tee "$logs/pair-$k-$(basename "$f").log"
                rc=${PIPESTATUS[0]}
                # TAP, target checks and the skips allowed in boot pair-K: scripts/vm/pair-count.sh.
                scripts/vm/pair-count.sh "pair-$k" "$logs/pair-$k-$(basename "$f").log" "$rc" >"$logs/pair-$k-$(basename "$f").count"
                sed '$d' "$logs/pair-$k-$(basename "$f").count"
                read -r a b c < <(tail -n1 "$logs/pair-$k-$(basename "$f").count")
                pp=$((pp + ${a:-0})) pf=$((pf + ${b:-1})) ps=$((ps + ${c:-0}))
            done
            note "guest-pair[$k]: $pp passed, $pf failed, $ps skipped" "$pf"
        fi
    done
fi

# The igb VF tests need a guest of another shape (32-bit physical addresses, so that QEMU maps
# the VFs' BARs where the guest put them): scripts/vm/igbvf.sh boots it, on the 6.12 kernel.
if ((guest == 1)) && [[ -z $filter || $filter == *igbvf* ]]; then
    step "scripts/vm/igbvf.sh"
    t=$(date +%s)
    scripts/vm/igbvf.sh 2>&1 | tee "$logs/guest-igbvf.log"
    rc=${PIPESTATUS[0]}
    read -r vp vf vs < <(awk -v rc="$rc" -f scripts/vm/guest/libtest-count.awk "$logs/guest-igbvf.log")
    note "guest[igbvf]: $vp passed, $vf failed, $vs skipped ($(elapsed "$t"))" "$vf"
fi

if ((guest == 1 && soak == 1)) && [[ -z $filter ]]; then
    step "scripts/soak.sh --duration 120s --seed 2026"
    t=$(date +%s)
    scripts/soak.sh --duration 120s --seed 2026 2>&1 | tee "$logs/soak.log"
    rc=${PIPESTATUS[0]}
    line=$(grep -E '^soak: [0-9]+ passed, [0-9]+ failed' "$logs/soak.log" | tail -n1)
    [[ -n $line ]] || line="soak: 0 passed, 1 failed (scripts/soak.sh exited $rc without its summary; see $logs/soak.log)"
    [[ $line =~ ^soak:\ [0-9]+\ passed,\ 0\ failed ]] || rc=1
    note "$line ($(elapsed "$t"))" "$rc"
fi

# A background kernel build no suite waited for (a guest part that stopped early) ends here.
[[ -z $kbuild_pid ]] || wait "$kbuild_pid" 2>/dev/null || true

# Every test RELIABILITY.md cites ran somewhere above (or was skipped visibly, named): checked
# over this run's logs, so only after a whole run (host and guest, no filter).
if ((host == 1 && guest == 1)) && [[ -z $filter ]]; then
    step "cited tests ran (tests/reliability_citations.rs, over $logs/*.log)"
    UBD_TEST_LOGS=$logs UBD_TEST_LOGS_SINCE=$t_all cargo test -q --test reliability_citations -- \
        --ignored --exact every_cited_test_ran_in_the_suite --nocapture 2>&1 | tee "$logs/cited-tests.txt"
    rc=${PIPESTATUS[0]}
    line=$(grep -E '^cited-tests: [0-9]+ ran' "$logs/cited-tests.txt" | tail -n1)
    if ((rc != 0)); then
        line="cited-tests: FAILED: ${line#cited-tests: } (names in $logs/cited-tests.txt)"
    fi
    note "$line" "$rc"
fi

printf '\n==== summary (%s)\n' "$(elapsed "$t_all")"
printf '%s\n' "${summary[@]}"
if ((failed == 0)); then echo "test.sh: all passed"; else echo "test.sh: FAILED"; fi
# One machine-readable closing line: the host, test-bed, guest and soak counts added up, plus one
# failure for each other step that failed (deps, fmt, clippy, doc): scripts/vm/total.sh.
printf '%s\n' "${summary[@]}" | scripts/vm/total.sh "$failed"
exit "$failed"
}
