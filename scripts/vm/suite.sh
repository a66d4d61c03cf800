#!/usr/bin/env bash
# The guest test suite in one boot: build the workspace's test binaries and the ubdirect binary,
# boot the guest once, run the test plan (scripts/vm/guest/ubd-plan: tests/guest/*.sh, binding
# to vfio-pci, Rust guest tests), then run the guest's UBD-HOSTCHECK requests on the host.
#
#   scripts/vm/suite.sh [--filter SUBSTRING] [--test-bin FILE]... [--skip shell|bind|rust]...
#                       [--test-timeout SECONDS] [run.sh options...]
#
# --filter: a test script or binary whose name holds SUBSTRING runs whole; otherwise SUBSTRING
#   is a libtest test-name filter and scripts are skipped.
# --test-bin FILE: run these test executables instead of building and finding the workspace's.
# --test-timeout: seconds per script or test binary in the guest (default 600).
# Other options go to scripts/vm/run.sh (e.g. --kernel 6.1, --kernel ubd, --no-iommu,
# --timeout 1800, --extra-qemu ...). No-IOMMU tests only: --kernel ubd --no-iommu --filter noiommu.
#
# Prints one closing line per suite (guest-shell, guest-rust, hostcheck), "N passed, N failed,
# N skipped" each, and "guest: N passed, N failed, N skipped"; saves the guest log, dmesg and
# hostcheck.log in the run directory. Exit 1 if anything failed, the guest did not finish, a
# host check the guest requested never ran, or a test was skipped that scripts/vm/expected-skips
# (UBD_VM_EXPECTED_SKIPS=FILE for another list) does not allow in this boot (each counts one
# failure; the boot is the kernel, "ubd-noiommu" for --kernel ubd --no-iommu).
# The whole script is one { ...; exit; } block: bash parses it all before running any of it, so
# editing this file while a run is in progress cannot make that run execute fragments of the new
# text (see scripts/vm/run.sh).
{
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

filter='' skip='' explicit_bins=() test_timeout=600 run_args=() run_timeout=${UBD_VM_SUITE_TIMEOUT:-1800}
while (($# > 0)); do
    case $1 in
    --filter) filter=$2 && shift 2 ;;
    --test-bin) explicit_bins+=(--test-bin "$2") && shift 2 ;;
    --skip) skip="$skip $2" && shift 2 ;;
    --test-timeout) test_timeout=$2 && shift 2 ;;
    --timeout) run_timeout=$2 && shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
    --) vm_die "suite.sh runs the test plan: no command line (use scripts/vm/run.sh for that)" ;;
    --no-iommu) run_args+=("$1") && shift ;;
    --kernel | --devices | --extra-qemu | --append | --mem | --smp | --hugepages | --tick | --files | --bin | --env | --run-dir)
        run_args+=("$1" "$2") && shift 2 ;;
    *) vm_die "unknown option '$1' (see --help)" ;;
    esac
done

cd "$UBD_REPO"
t0=$(date +%s)
# The boot (the scope of scripts/vm/expected-skips): the kernel, "-noiommu" without an IOMMU.
boot=$UBD_VM_KERNEL no_iommu=${UBD_VM_NO_IOMMU:-0}
for ((i = 0; i < ${#run_args[@]}; i++)); do
    [[ ${run_args[i]} == --kernel ]] && boot=${run_args[i + 1]}
    [[ ${run_args[i]} == --no-iommu ]] && no_iommu=1
done
[[ $no_iommu == 1 ]] && boot="$boot-noiommu"

# ---- the test binaries: every tests/guest_*.rs executable of the workspace with tests to run ----
test_bins=("${explicit_bins[@]}")
if ((${#explicit_bins[@]} == 0)); then
    cargo_q=()
    [[ -n ${CI:-} ]] && cargo_q=(--quiet)
    json=$(mktemp)
    trap 'rm -f "$json"' EXIT
    if [[ -f src/main.rs ]]; then
        cargo build "${cargo_q[@]}" --bin ubdirect --message-format=json-render-diagnostics >"$json" ||
            vm_die "cargo build --bin ubdirect failed"
        cli=$(jq -r 'select(.reason == "compiler-artifact" and .target.name == "ubdirect"
            and .executable != null) | .executable' "$json" | tail -n1)
        [[ -n $cli ]] && test_bins+=(--bin "$cli")
    fi
    # The embedding examples run in the guest too (tests/guest_examples.rs runs them by name).
    cargo build "${cargo_q[@]}" --workspace --examples --message-format=json-render-diagnostics >"$json" ||
        vm_die "cargo build --examples failed"
    while read -r ex; do
        [[ -n $ex ]] && test_bins+=(--bin "$ex")
    done < <(jq -r 'select(.reason == "compiler-artifact" and (.target.kind | index("example"))
        and .executable != null) | .executable' "$json")
    # The C API's test program (capi/tests/guest_capi.rs runs it by name), compiled with
    # warnings as errors against libubdirect, plain and with AddressSanitizer; and its perf loop.
    if [[ -f capi/tests/c/api_test.c ]]; then
        cargo build "${cargo_q[@]}" -p ubdirect-capi --message-format=json-render-diagnostics >"$json" ||
            vm_die "cargo build -p ubdirect-capi failed"
        capi_so=$(jq -r 'select(.reason == "compiler-artifact") | .filenames[]
            | select(endswith("/libubdirect.so"))' "$json" | tail -n1)
        [[ -n $capi_so ]] || vm_die "cargo build -p ubdirect-capi built no libubdirect.so"
        capi_dir=$(dirname "$capi_so")
        # The programs find the library beside them ($ORIGIN): in the guest both sit in /ubd/bin
        # (the library through --files), whatever the checkout's path (the guest mounts a tmpfs
        # on /tmp, which would hide a library staged at a /tmp path).
        capi_c="$capi_dir/capi-c" && capi_files="$capi_dir/capi-files"
        mkdir -p "$capi_c" "$capi_files/bin"
        cp -f "$capi_so" "$capi_c/libubdirect.so"
        cp -f "$capi_so" "$capi_files/bin/libubdirect.so"
        for v in plain asan; do
            out="$capi_c/ubd_capi_test" && san=()
            [[ $v == asan ]] && out+=_asan && san=(-fsanitize=address -fno-omit-frame-pointer)
            cc -std=c11 -Wall -Wextra -Werror -g "${san[@]}" -Icapi/include capi/tests/c/api_test.c \
                -o "$out" -L"$capi_c" -Wl,-rpath,'$ORIGIN' -lubdirect ||
                vm_die "cc capi/tests/c/api_test.c ($v) failed"
            test_bins+=(--bin "$out")
        done
        cc -std=c11 -O2 -Wall -Wextra -Werror -Icapi/include examples/c/perf_loop.c \
            -o "$capi_c/ubd_capi_perf_loop" -L"$capi_c" -Wl,-rpath,'$ORIGIN' -lubdirect ||
            vm_die "cc examples/c/perf_loop.c failed"
        test_bins+=(--bin "$capi_c/ubd_capi_perf_loop" --files "$capi_files")
    fi
    # The Python package's guest tests (tests/guest/*python*.sh): the interpreter, its standard
    # library, the wheel's contents and pytest, staged only when the plan runs such a script.
    for t in tests/guest/*python*.sh; do
        [[ -f $t && " $skip " != *" shell "* ]] || continue
        [[ -z $filter || $(basename "$t") == *"$filter"* ]] || continue
        py_files="${CARGO_TARGET_DIR:-$UBD_REPO/target}/guest-python"
        "$UBD_VM_DIR/python-files.sh" "$py_files" || vm_die "staging the Python files for the guest failed"
        test_bins+=(--files "$py_files")
        break
    done
    cargo test "${cargo_q[@]}" --workspace --no-run --message-format=json-render-diagnostics >"$json" ||
        vm_die "cargo test --workspace --no-run failed (see the compiler messages above)"
    mapfile -t all_bins < <(jq -r 'select(.reason == "compiler-artifact" and .profile.test == true
        and .executable != null) | .executable' "$json" | sort -u)
    for b in "${all_bins[@]}"; do
        name=$(basename "$b")
        args=(--list --ignored --format terse)
        [[ -n $filter && $name != *"$filter"* ]] && args+=("$filter")
        count=$("$b" "${args[@]}" 2>/dev/null | grep -c ': test$' || true)
        # scripts/vm/README.md: guest tests live in <crate>/tests/guest_*.rs. Ignored tests of other
        # binaries belong to other runners (e.g. "gpu:" tests for a CUDA machine).
        if [[ $name != guest_* ]]; then
            ((count == 0)) || vm_log "not a guest test binary (not tests/guest_*.rs), left out: $name ($count ignored)"
        elif ((count > 0)) || [[ -z $filter || $name == *"$filter"* ]]; then
            test_bins+=(--test-bin "$b")
            vm_log "guest tests: $name ($count)"
        fi
    done
fi

# ---- one boot; a second one, with the whole plan again, only when the first froze ----
# A frozen guest (run.sh status 123: no heartbeat, or a vCPU without timer interrupts; a TCG
# failure below the guest's user space, where the driver runs) says nothing about the tests: the
# suite runs again in a fresh boot, once, and the closing line names the frozen boot.
earlier=
for attempt in 1 2; do
    where=$(mktemp)
    set +e
    UBD_VM_RUN_DIR_FILE=$where "$UBD_VM_DIR/run.sh" --timeout "$run_timeout" "${run_args[@]}" "${test_bins[@]}" \
        --env "UBD_FILTER=$filter" --env "UBD_TEST_TIMEOUT=$test_timeout" --env "UBD_PLAN_SKIP=$skip" \
        --env "RUST_BACKTRACE=${RUST_BACKTRACE:-1}" ${RUST_LOG:+--env "RUST_LOG=$RUST_LOG"} \
        -- ubd-plan
    rc=$?
    set -e
    run_dir=$(cat "$where" 2>/dev/null || true)
    rm -f "$where"
    ((rc == 123 && attempt == 1)) || break
    earlier="after a first boot that froze ($(cat "$run_dir/frozen" 2>/dev/null); diagnosis $run_dir/freeze-diag.log)"
    vm_log "the guest froze: $(cat "$run_dir/frozen" 2>/dev/null); the whole suite runs again in a fresh boot"
done
glog="$run_dir/guest.log"
[[ -n $run_dir && -f $glog ]] || vm_die "no guest log in '$run_dir': the guest never started (run.sh status $rc)"

# ---- results: the closing lines (scripts/vm/summary.sh; host-tested by selftest.sh) ----
"$UBD_VM_DIR/summary.sh" "$run_dir" "$rc" "$run_timeout" "$(($(date +%s) - t0))" "$boot" "$earlier"
exit
}
