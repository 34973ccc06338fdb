#!/usr/bin/env bash
# tests/fuzz/make_seeds.sh — regenerates the committed seed corpora under tests/fuzz/corpus/
# with hp's own writers: hpctl new (jobs), hpctl inspect --hpir (.hpir text),
# build-fuzz/hp_fuzz_seeds (programs, frames, safetensors, llm.c shards, a checkpoint
# index), and the config files below. Usage (from the repository root, after a release build
# and a -DHP_FUZZ=ON build):
#   tests/fuzz/make_seeds.sh [HPCTL] [FUZZ_BUILD]     (defaults build/client/hpctl, build-fuzz)
set -euo pipefail
cd "$(dirname "$0")/../.."
hpctl=${1:-build/client/hpctl}
fb=${2:-build-fuzz}
c=tests/fuzz/corpus
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir -p $c/job $c/hpir $c/config
tiny=(--model llama3:debugmodel --layers 1 --dim 16 --heads 2 --ffn-hidden 32 --vocab 64 --seq 8 --batch 2)
"$hpctl" new --model mlp -o $c/job/mlp.pb
"$hpctl" new --model mlp --mesh dp=2 --fsdp '*' --name fsdp2 -o $c/job/mlp-fsdp2.pb
"$hpctl" new "${tiny[@]}" --kv-heads 1 -o $c/job/llama-tiny.pb
"$hpctl" new "${tiny[@]}" --kv-heads 2 --mesh tp=2 --tp-plan llama -o $c/job/llama-tp2.pb
cp tests/golden/small_mlp.hpir $c/hpir/small_mlp.hpir
"$hpctl" inspect $c/job/mlp.pb --hpir >$c/hpir/mlp.hpir
"$hpctl" inspect $c/job/llama-tiny.pb --hpir >$c/hpir/llama-tiny.hpir
"$fb/hp_fuzz_seeds" $c $c/job/*.pb

printf '# hpd.conf\nlisten = 127.0.0.1:7070\nhttp = off\nslots = 4\nlog-level = debug # inline\n' \
    >$c/config/basic.conf
printf 'worker-listen = 0.0.0.0:0\nadvertise = node-1:7072\nlauncher = slurm\nslurm-partition = gpu\nslurm-time = 1-00:00:00\nslurm-poll-ms = 500\non-sigterm = cancel\nmetrics-retention = 60\n' \
    >$c/config/slurm.conf
printf 'launcher = systemd\nsystemd-manager = user\nsystemd-token = file\nsystemd-slice = hp.slice\nsystemd-poll-ms = 250\nheartbeat-ms = 2000\nlaunch-timeout-s = 30\n' \
    >$c/config/systemd.conf
echo "seeds: $(find $c -type f | wc -l) files under $c"
