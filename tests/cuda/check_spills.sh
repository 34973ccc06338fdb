#!/bin/sh
# tests/cuda/check_spills.sh NVCC SOURCE_DIR ARCH... — every cuda kernel of worker/cuda/ fits
# its registers on those architectures: ptxas (-warn-spills) reports no spill to local memory.
# A spill only shows as slowness on a device, which CI does not have; this sees it without
# one. Registered with ctest where the build has nvcc (for sm_90, the H100/H200 the GPU
# targets name); not a build flag, so building for another architecture never fails on it.
set -u
nvcc=$1 src=$2
shift 2
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
fail=0
for arch in "$@"; do
    for f in "$src"/worker/cuda/*.cu; do
        "$nvcc" -std=c++17 -O3 -arch="sm_$arch" --expt-relaxed-constexpr -I"$src" \
            -I"$src/include" -c "$f" -o "$tmp/k.o" -Xptxas -warn-spills >"$tmp/log" 2>&1
        st=$?
        if [ $st -ne 0 ]; then
            echo "FAIL sm_$arch $(basename "$f"): nvcc exit $st"
            cat "$tmp/log"
            fail=1
        elif grep -qi "spill" "$tmp/log"; then
            echo "FAIL sm_$arch $(basename "$f") spills registers:"
            grep -i "spill" "$tmp/log" | sed 's/^/    /'
            fail=1
        else
            echo "ok   sm_$arch $(basename "$f")"
        fi
    done
done
exit $fail
