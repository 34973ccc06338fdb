#!/usr/bin/env bash
# The main job on its embedded default: installs what is missing, builds, writes the Llama-3
# debugmodel job (a CPU-sized batch and sequence, FSDP over a 2-rank mesh) and trains it in
# standalone mode on the built-in corpus, showing the loss fall. Outputs land in build/run/
# (metrics.jsonl, checkpoints/, model.safetensors).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs" --target hpctl hp-worker

mkdir -p build/jobs
rm -rf build/run
build/client/hpctl new --model llama3:debugmodel --batch 8 --seq 256 --steps 40 --lr 3e-3 \
    --warmup 4 --log-interval 5 --checkpoint-interval 20 \
    --fsdp 'layers.*' --fsdp 'tok_embeddings.*' --fsdp 'output.*' --fsdp 'norm.*' \
    --mesh dp=2 -o build/jobs/debugmodel.pb
build/client/hpctl plan build/jobs/debugmodel.pb
build/worker/hp-worker --standalone build/jobs/debugmodel.pb --out build/run
