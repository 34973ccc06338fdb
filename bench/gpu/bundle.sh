#!/bin/bash
# bench/gpu/bundle.sh — packs a built tree's GPU binaries into one relocatable tarball, for a
# GPU machine that has the NVIDIA driver and CUDA libraries but not hp's build dependencies
# (libuv, gRPC, protobuf-c, OpenBLAS, Criterion, ...): build here, run there with
#   HP_GPU_BUNDLE=hp-gpu.tar.xz bench/gpu/check.sh
#
# usage: bench/gpu/bundle.sh [BUILD_DIR] [OUT.tar.xz]     (defaults: build-gpu, hp-gpu.tar.xz)
#
# The tarball holds hp-worker, hpctl, hpd and the test_cuda_* drivers at their build-tree
# paths, and lib/: every shared library they load except the C library's own (libc, libm,
# libdl, libpthread, librt, libresolv, the loader), libstdc++ / libgcc_s, and the CUDA
# libraries that come with a driver install (libcudart, libcublas*, libnccl): those are the
# target's, found there by check.sh. A library that is missing here fails the bundle.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-gpu}
OUT=${2:-hp-gpu.tar.xz}
BINS=(worker/hp-worker client/hpctl daemon/hpd tests/test_cuda_backend tests/test_cuda_ops
      tests/test_cuda_train tests/test_cuda_nccl)
for b in "${BINS[@]}"; do
    [ -x "$BUILD/$b" ] || { echo "bundle: $BUILD/$b is missing: build it first" >&2; exit 1; }
done
if [ "$(ldd "$BUILD/worker/hp-worker" | grep -c libcublasLt)" = 0 ]; then
    echo "bundle: $BUILD was built without the cuda backend" >&2
    exit 1
fi
STAGE=$(mktemp -d /tmp/hp-bundle-XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/hp/lib"
for b in "${BINS[@]}"; do
    mkdir -p "$STAGE/hp/$(dirname "$b")"
    cp "$BUILD/$b" "$STAGE/hp/$b"
done
skip='^(libc|libm|libdl|libpthread|librt|libresolv|ld-linux-x86-64|libstdc\+\+|libgcc_s|libcudart|libcublas|libcublasLt|libnccl|libcuda|linux-vdso)\.'
missing=$(for b in "${BINS[@]}"; do ldd "$BUILD/$b"; done | grep 'not found' || true)
if [ -n "$missing" ]; then
    echo "bundle: libraries missing here:" >&2
    echo "$missing" >&2
    exit 1
fi
for b in "${BINS[@]}"; do ldd "$BUILD/$b"; done | awk '/=> \//{print $1, $3}' | sort -u |
    while read -r name path; do
        if [[ ! $name =~ $skip ]]; then cp -L "$path" "$STAGE/hp/lib/$name"; fi
    done
tar -C "$STAGE" -cJf "$OUT" hp
echo "bundle: $OUT ($(du -h "$OUT" | cut -f1); $(find "$STAGE/hp/lib" -type f | wc -l) libraries)"
