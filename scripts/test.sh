#!/usr/bin/env bash
# Installs what is missing, builds hp twice (release with -Werror, and ASan+UBSan), and runs
# every test in both. Exits non-zero on any failure. This is the README's test command and
# exactly what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh

jobs=$(nproc 2>/dev/null || echo 2)

echo "== format check (clang-format)"
files=$(git ls-files '*.c' '*.h' 2>/dev/null || find . -name '*.[ch]' -not -path './build*')
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

echo "== build (ASan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DHP_SANITIZE=ON -DHP_WERROR=ON >/dev/null
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
exit $rc
