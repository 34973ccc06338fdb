#!/bin/bash
# bench/gpu/device_run.sh — the one command a session lent a GPU machine runs there (through
# the device tool, which copies the working tree and brings back what is written under $OUT):
# the machine's facts to $OUT/env.txt, bench/gpu/check.sh on a prebuilt bundle with its
# summary in $OUT/check.txt, and its logs (every test's, the profiles, the PyTorch peers') in
# $OUT/logs.tgz. Minutes on the device are scarce: build and bundle here first, where the
# build dependencies are,
#
#   cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DHP_CUDA_ARCHS=90 && cmake --build build-gpu -j
#   bench/gpu/bundle.sh build-gpu .devbundle/hp-gpu.tar.xz
#
# then run it there with .devbundle carried (it is git-ignored), e.g.
#
#   ONE_B_STEPS=20 TORCH_STEPS=20 ONE_B_PROFILE=1 PROFILE_STEPS=6 CHECK_TIMEOUT=440 \
#       bench/gpu/device_run.sh
#
# env: OUT (default /tmp/hp-device-out), HP_GPU_BUNDLE (default .devbundle/hp-gpu.tar.xz; an
# empty value builds on the device instead), CHECK_TIMEOUT (seconds, default 500), and every
# variable check.sh reads. Exit status: check.sh's (124 when the timeout cut it short).
set -u
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-/tmp/hp-device-out}
mkdir -p "$OUT"
LOGS=$(mktemp -d /tmp/hp-gpu-logs-XXXXXX)
{
    date -u
    uname -a
    nproc
    free -g
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
                 torch.cuda.is_available())'
} >"$OUT/env.txt" 2>&1
export HP_GPU_BUNDLE=${HP_GPU_BUNDLE-.devbundle/hp-gpu.tar.xz}
if [ -n "$HP_GPU_BUNDLE" ] && [ ! -f "$HP_GPU_BUNDLE" ]; then
    echo "device_run: no bundle at $HP_GPU_BUNDLE (bench/gpu/bundle.sh makes it; HP_GPU_BUNDLE= builds here)" |
        tee "$OUT/check.txt" >&2
    exit 2
fi
HP_GPU_LOGS=$LOGS timeout "${CHECK_TIMEOUT:-500}" bench/gpu/check.sh 2>&1 | tee "$OUT/check.txt"
rc=${PIPESTATUS[0]}
tar -C "$(dirname "$LOGS")" -czf "$OUT/logs.tgz" "$(basename "$LOGS")" 2>/dev/null
echo "device_run: check.sh exit $rc; $OUT: env.txt, check.txt, logs.tgz" >&2
exit "$rc"
