#!/usr/bin/env bash
# Set up and run everything CI checks: lint, type check, the full test suite, the real-SGLang
# tier (SGLang's own pool classes, in .venv-sglang; SKIP_SGLANG_TIER=1 skips it) and the real-vLLM
# tier (vLLM 0.33's own KV cache allocation and connector, in .venv-vllm; SKIP_VLLM_TIER=1 skips it).
# Arguments go to the main suite's pytest. Every step runs even when one fails; the last lines sum
# up each step and the total, and the exit status is 1 when any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
SUMMARY=()
FAILED=0
T0=$SECONDS

# run NAME CMD...: run CMD with its output shown and kept; record NAME's result line.
run() {
    local name=$1 t0=$SECONDS log="$LOGS/$1.log" result
    shift
    echo "== $name: $*"
    "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    # pytest -q ends with "N passed, M skipped in 12.3s"; ruff and mypy with their own last line
    result=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped|deselected)' "$log" | tail -1 | sed -E 's/^=+ | =+$//g')
    [ -n "$result" ] || result=$(tail -1 "$log")
    [ "$rc" = 0 ] || FAILED=1
    SUMMARY+=("$(printf '%-12s %-8s %s (%d s)' "$name" "$([ "$rc" = 0 ] && echo ok || echo FAILED)" "$result" $((SECONDS - t0)))")
}

skip() { SUMMARY+=("$(printf '%-12s %-8s %s' "$1" skipped "$2")"); }

run ruff .venv/bin/ruff check flexkv_adapter tests scripts
run mypy .venv/bin/mypy
# The tiers' tests run next in their own environments: the main suite leaves them out instead of
# listing each as skipped. A tier that is skipped is said so once, in the summary.
run main .venv/bin/python -m pytest -q --ignore=tests/sglang --ignore=tests/vllm "$@"
# tier NAME SKIP_VARIABLE: install the engine into .venv-NAME and run tests/NAME there, unless skipped.
tier() {
    local name=$1 skip_var=$2
    if [ "${!skip_var:-0}" = "1" ]; then
        skip "$name" "$skip_var=1 (tests/$name not run)"
    elif bash "scripts/install_${name}_cpu.sh"; then
        REQUIRE_ENGINE_TIER=1 run "$name" ".venv-$name/bin/python" -m pytest -q -p no:cacheprovider "tests/$name"
    else
        SUMMARY+=("$(printf '%-12s %-8s %s' "$name" FAILED "install_${name}_cpu.sh failed")"); FAILED=1
    fi
}
tier sglang SKIP_SGLANG_TIER
tier vllm SKIP_VLLM_TIER

echo
echo "== summary"
printf '%s\n' "${SUMMARY[@]}"
count() { printf '%s\n' "${SUMMARY[@]}" | grep -oE "[0-9]+ $1" | awk '{s += $1} END {print s + 0}'; }
total="$(count passed) passed, $(count failed) failed, $(count 'errors?') errors, $(count skipped) skipped"
elapsed=$((SECONDS - T0))
printf '%-12s %-8s %s in %d min %d s\n' total "$([ "$FAILED" = 0 ] && echo ok || echo FAILED)" "$total" \
    $((elapsed / 60)) $((elapsed % 60))
exit "$FAILED"
