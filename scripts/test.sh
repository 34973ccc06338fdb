#!/usr/bin/env bash
# Installs what is missing, builds hp twice (release with -Werror, and ASan+UBSan) and runs
# every test in both, then builds the libFuzzer targets (clang) and runs each 30 s on its
# seeds, then a ThreadSanitizer build of the threaded parts and their tests. Exits non-zero on
# any failure. This is the README's test command and exactly what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh

jobs=$(nproc 2>/dev/null || echo 2)

echo "== format check (clang-format)"
files=$(git ls-files '*.c' '*.h' '*.cpp' 2>/dev/null || find . -name '*.[ch]' -not -path './build*')
if [ -n "$files" ]; then
    clang-format --dry-run --Werror $files
fi

echo "== build (release, -Werror)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHP_WERROR=ON >/dev/null
cmake --build build -j"$jobs"

echo "== tests (release)"
ctest --test-dir build --output-on-failure -j"$jobs"

# OpenBLAS picks its kernels per core type, and results must not depend on which: run the
# release suite again under each x86-64 core type this CPU can execute (Debian's OpenBLAS
# ships them all). A machine whose environment already pins OPENBLAS_CORETYPE (some need it to
# avoid a crashing kernel) keeps its own choice, and this stage says so.
if [ "$(uname -m)" = x86_64 ] && [ -z "${OPENBLAS_CORETYPE:-}" ]; then
    flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
    has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
    for ct in Haswell Zen SandyBridge Nehalem Prescott; do
        case $ct in
            Haswell | Zen) has avx2 fma || continue ;;
            SandyBridge) has avx || continue ;;
            Nehalem) has sse4_2 || continue ;;
            Prescott) has pni || continue ;;
        esac
        echo "== tests (release, OPENBLAS_CORETYPE=$ct)"
        OPENBLAS_CORETYPE=$ct ctest --test-dir build --output-on-failure -j"$jobs"
    done
elif [ -n "${OPENBLAS_CORETYPE:-}" ]; then
    echo "== OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE is set by this machine: core-type stage skipped"
fi

# The sanitizer build runs the cuda backend on cuemu (tests/cuemu: CUDA emulated on the CPU), so
# its entries and kernels run under ASan + UBSan here, GPU or not.
echo "== build (ASan + UBSan, cuda backend on cuemu)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DHP_SANITIZE=ON -DHP_CUDA_EMU=ON -DHP_WERROR=ON \
    >/dev/null
cmake --build build-asan -j"$jobs"

echo "== tests (ASan + UBSan)"
# Criterion runs each test in a child process and does not fail a test whose child only
# printed a LeakSanitizer or UBSan report at exit: scan the full log for any report.
log=build-asan/ctest.log
set +e
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -V -j"$jobs" >"$log" 2>&1
rc=$?
set -e
tail -n 40 "$log"
if grep -nE "ERROR: (LeakSanitizer|AddressSanitizer)|runtime error:" "$log"; then
    echo "sanitizer reports found (full log: $log)" >&2
    exit 1
fi
[ $rc -eq 0 ] || exit $rc

echo "== build (libFuzzer targets: clang, ASan + UBSan)"
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHP_FUZZ=ON -DHP_WERROR=ON \
    >/dev/null
cmake --build build-fuzz -j"$jobs"

echo "== fuzz (each target 30 s on tests/fuzz/corpus/TARGET; any crash fails)"
bench/fuzz.sh --time 30 --build build-fuzz --jobs "$jobs"

# ThreadSanitizer over the threaded parts: the compute pool (worker/threads.c) and the shm
# communicator's comm thread in hp-worker, the agent's threads, and in hpd the gRPC
# completion-queue thread, the HTTP pool, the compile pool and the signal thread. Criterion cannot run under TSan
# (its arena is mapped at fixed addresses TSan reserves: Snaipe/Criterion#274), so the TSan
# build holds hpd, hp-worker and hpctl only, and the release build's test drivers run against
# them (HP_BINARY_DIR=build-tsan). Every report goes to build-tsan/tsan-reports/ and any file
# there fails the stage; tests/tsan.supp holds entries for uninstrumented libraries only (gRPC
# and what it uses, libmicrohttpd), each justified there.
echo "== build (ThreadSanitizer: hpd, hp-worker, hpctl)"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHP_TSAN=ON -DHP_WERROR=ON >/dev/null
cmake --build build-tsan -j"$jobs" --target hpd hp-worker hpctl hp_proto_desc

echo "== tests (ThreadSanitizer)"
tsan=$PWD/build-tsan
rm -rf "$tsan/tsan-reports" "$tsan/tsan-run"
mkdir -p "$tsan/tsan-reports"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 log_path=$tsan/tsan-reports/report suppressions=$PWD/tests/tsan.supp"
set +e
(
    set -e
    # A world-2 FSDP run with two compute threads per rank: the pool, the comm thread, shm;
    # two micro-steps a step (gradient accumulation) and forward-only evaluations.
    "$tsan/client/hpctl" new --model llama3:debugmodel --layers 2 --dim 64 --heads 4 \
        --kv-heads 2 --ffn-hidden 128 --vocab 256 --seq 32 --batch 4 --global-batch 8 --steps 4 \
        --checkpoint-interval 2 --mesh dp=2 --fsdp 'layers.*' --eval-interval 2 --eval-steps 2 \
        --eval-data text:/usr/share/common-licenses/GPL-3 -o "$tsan/tsan-job.pb" >/dev/null
    HP_CPU_PEAK_FLOPS=1e11 "$tsan/worker/hp-worker" --standalone "$tsan/tsan-job.pb" --threads 2 \
        --out "$tsan/tsan-run" >/dev/null
    echo "tsan: hp-worker --standalone (world 2, 2 threads, accumulation, evaluation): ok"
    # The release build's drivers (they start hpd, hp-worker and hpctl from HP_BINARY_DIR).
    for t in test_agent test_fsdp_train test_tp_train test_rpc_python test_hpctl_remote test_harden \
        test_http test_hpd_config test_evaluation; do
        start=$(date +%s)
        HP_BINARY_DIR=$tsan HP_SOURCE_DIR=$PWD build/tests/$t --jobs 1 --verbose=0
        echo "tsan: $t: ok ($(($(date +%s) - start)) s)"
    done
)
rc=$?
set -e
unset TSAN_OPTIONS
if [ -n "$(ls -A "$tsan/tsan-reports")" ]; then
    cat "$tsan"/tsan-reports/* | head -n 200
    echo "ThreadSanitizer reports found: $tsan/tsan-reports/" >&2
    exit 1
fi
exit $rc
