#!/usr/bin/env bash
# The Python package on the host: build the wheel (pip wheel ./python: pip fetches maturin, the
# build backend; the dev profile, so the crates cargo test built are reused), install it into a
# virtual environment (target/pyenv, with pytest and numpy), run python/tests. The GPU tests
# skip without a GPU. Closing line: "python: N passed, N failed, N skipped (wheel NAME, Ns)".
# Env: UBD_PY_PROFILE (dev; "release" for the wheel users get), PYTHON (python3).
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo" || exit 2
t0=$(date +%s)
py=${PYTHON:-python3}
venv=$repo/target/pyenv
wheels=$repo/target/wheels
fail() {
    echo "python: 0 passed, 1 failed, 0 skipped ($*)"
    exit 1
}
if [[ ! -x $venv/bin/python ]]; then
    "$py" -m venv "$venv" || fail "$py -m venv failed: install python3-venv (scripts/deps.sh)"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check pytest numpy || fail "pip install pytest numpy failed"
rm -f "$wheels"/ubdirect-*.whl
profile=${UBD_PY_PROFILE:-dev}
MATURIN_PEP517_ARGS="--profile $profile" "$venv/bin/python" -m pip wheel -q --disable-pip-version-check \
    --no-deps ./python -w "$wheels" || fail "pip wheel ./python failed (see above)"
whl=$(ls "$wheels"/ubdirect-*.whl 2>/dev/null | head -1)
[[ -n $whl ]] || fail "pip wheel ./python left no wheel in $wheels"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$whl" ||
    fail "pip install $whl failed"
out=$(mktemp)
"$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
last=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$out" | tail -n1)
rm -f "$out"
count() { grep -oE "[0-9]+ $1" <<<"$last" | grep -oE '^[0-9]+' || echo 0; }
p=$(count passed) f=$(count failed) e=$(count error) s=$(count skipped)
f=$((f + e))
if ((rc != 0 && f == 0)); then f=1; fi # pytest failed without a failed test
echo "python: $p passed, $f failed, $s skipped (wheel $(basename "$whl"), $(($(date +%s) - t0))s)"
((f == 0))
