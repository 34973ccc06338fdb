#!/usr/bin/env bash
# The main job on its embedded default: installs what is missing, builds, starts the
# coordinator (hpd) on loopback with a temporary state dir, submits the Llama-3 debugmodel
# job (a CPU-sized batch and sequence, FSDP over a 2-rank mesh), watches it train to
# completion on the built-in corpus, and stops the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs" --target hpctl hp-worker hpd

state=$(mktemp -d /tmp/hp-main-XXXXXX)
build/daemon/hpd --listen 127.0.0.1:0 --http 127.0.0.1:0 --worker-listen 127.0.0.1:0 \
    --state-dir "$state" \
    --slots 2 >"$state/hpd.out" 2>"$state/hpd.log" &
hpd_pid=$!
cleanup() {
    kill -TERM "$hpd_pid" 2>/dev/null && wait "$hpd_pid" 2>/dev/null || true
    rm -rf "$state"
}
trap cleanup EXIT
for _ in $(seq 300); do
    grep -q "hpd listening" "$state/hpd.out" 2>/dev/null && break
    kill -0 "$hpd_pid" 2>/dev/null || { cat "$state/hpd.log" >&2; exit 1; }
    sleep 0.1
done
head -n 1 "$state/hpd.out"
export HP_SERVER
HP_SERVER=$(sed -n 's/.*grpc=\([^ ]*\).*/\1/p' "$state/hpd.out")
export HP_STATE_DIR="$state" # the token lives here

build/client/hpctl new --model llama3:debugmodel --batch 8 --seq 256 --steps 40 --lr 3e-3 \
    --warmup 4 --log-interval 5 --checkpoint-interval 20 --max-restarts 2 \
    --fsdp 'layers.*' --fsdp 'tok_embeddings.*' --fsdp 'output.*' --fsdp 'norm.*' \
    --mesh dp=2 -o "$state/debugmodel.pb"
build/client/hpctl submit "$state/debugmodel.pb" --watch
