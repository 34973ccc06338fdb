#!/usr/bin/env bash
# The main job on its embedded default: installs what is missing, builds, writes the Llama-3
# debugmodel job file and prints its compiled summary. (Later issues turn this into a real
# training run.)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs" --target hpctl

out=build/jobs
mkdir -p "$out"
build/client/hpctl new --model llama3:debugmodel -o "$out/debugmodel.pb"
build/client/hpctl inspect "$out/debugmodel.pb"
