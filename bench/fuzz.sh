#!/usr/bin/env bash
# bench/fuzz.sh — runs every libFuzzer target of tests/fuzz on its committed seeds and prints,
# per target, the executions, libFuzzer's final coverage (cov: edges, ft: features), the
# corpus it grew, the time and the crashes (any crash, leak, sanitizer report, timeout or
# out-of-memory counts: libFuzzer stops at the first and leaves the input in
# BUILD/fuzz-artifacts/). Exits non-zero when any target crashed.
#
#   bench/fuzz.sh [--runs N | --time S] [--build DIR] [--jobs J] [TARGET...]
#
# Defaults: --runs 1000000 (the issue's "≥ 1M executions per target"), --build build-fuzz,
# --jobs = CPUs (targets run side by side, one process each), every target. scripts/test.sh
# runs `bench/fuzz.sh --time 30`. The build dir must hold a -DHP_FUZZ=ON build
# (CC=clang cmake -S . -B build-fuzz -DHP_FUZZ=ON && cmake --build build-fuzz).
# New inputs go to BUILD/fuzz-corpus/TARGET (never into tests/fuzz/corpus: add one there by
# hand when it is worth keeping, e.g. a crash's reproducer as a regression seed).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=-runs=1000000
build="build-fuzz"
jobs=$(nproc 2>/dev/null || echo 2)
targets=()
while [ $# -gt 0 ]; do
    case $1 in
        --runs) mode=-runs=$2; shift 2 ;;
        --time) mode=-max_total_time=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        --jobs) jobs=$2; shift 2 ;;
        -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
        -*) echo "bench/fuzz.sh: unknown flag $1" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
if [ ${#targets[@]} -eq 0 ]; then
    for d in tests/fuzz/corpus/*/; do targets+=("$(basename "$d")"); done
fi
for t in "${targets[@]}"; do
    [ -x "$build/fuzz_$t" ] || { echo "bench/fuzz.sh: no $build/fuzz_$t (build with -DHP_FUZZ=ON)" >&2; exit 2; }
done

# The shard and checkpoint-index targets write each input to a file: a tmpfs makes that cheap.
tmpdir=${TMPDIR:-/tmp}
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then tmpdir=/dev/shm; fi
logs=$build/fuzz-logs
mkdir -p "$logs" "$build/fuzz-artifacts"
run_one() { # TARGET: one libFuzzer process; its exit status goes to LOG.rc
    local t=$1 start end rc
    mkdir -p "$build/fuzz-corpus/$t"
    start=$(date +%s.%N)
    set +e
    # -timeout: one input running over 25 s is a hang (reported as a crash). -rss_limit_mb:
    # libFuzzer's default 2 GB is the out-of-memory bound. Leaks are on (ASan's default).
    TMPDIR=$tmpdir "$build/fuzz_$t" "$mode" -timeout=25 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$t-" \
        "$build/fuzz-corpus/$t" "tests/fuzz/corpus/$t" >"$logs/$t.log" 2>&1
    rc=$?
    set -e
    end=$(date +%s.%N)
    echo "$rc $(echo "$end - $start" | bc)" >"$logs/$t.rc"
}
export -f run_one
export build logs mode tmpdir
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one "$@"' _ {}

printf '%-12s %10s %8s %8s %6s %8s %8s\n' target execs cov ft corp time_s crashes
fail=0
for t in "${targets[@]}"; do
    read -r rc secs <"$logs/$t.rc"
    log=$logs/$t.log
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
    crashes=0
    if [ "$rc" != 0 ] || grep -qE '^(==[0-9]+==ERROR|SUMMARY: (Address|Undefined|Leak)Sanitizer)|runtime error:' "$log"; then
        crashes=1
        fail=1
    fi
    printf '%-12s %10s %8s %8s %6s %8.0f %8s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$secs" "$crashes"
done
if [ $fail != 0 ]; then
    for t in "${targets[@]}"; do
        read -r rc _ <"$logs/$t.rc"
        if [ "$rc" != 0 ]; then
            echo "== fuzz_$t failed (exit $rc): the end of $logs/$t.log" >&2
            tail -n 60 "$logs/$t.log" >&2
        fi
    done
    ls -l "$build/fuzz-artifacts" >&2
    exit 1
fi
