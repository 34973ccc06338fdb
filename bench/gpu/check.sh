#!/bin/bash
# bench/gpu/check.sh — the device check of the cuda backend (issue 12), one script for a
# machine with one or more NVIDIA GPUs, ≤ 8 minutes on one H200, printing one summary:
#   1. builds hp (Release, kernels for sm_90 unless HP_CUDA_ARCHS says otherwise) in
#      $BUILD (default build-gpu),
#   2. runs every CUDA test (tests/worker/test_cuda_*.c: every op vs the reference evaluator,
#      the backend's math, device faults, cuda vs cpu training, NCCL collectives at world 1
#      and, with 2+ GPUs, world 2, FSDP and dp x tp training on NCCL against world 1),
#   3. trains the debugmodel 20 steps on one GPU (the loss must fall),
#   4. trains a ~1B Llama (dim 2048, 16 layers, 16 heads, 8 kv heads, ffn 8192, vocab 128256,
#      seq 2048) 30 steps: tokens/s, MFU (torchtitan's formula, worker/metrics.c) and peak
#      memory, medians over the steps after the first 5,
#   5. where PyTorch with CUDA is importable, the same model in PyTorch eager and
#      torch.compile (bench/gpu/torch_llama.py, bf16 autocast) and the ratios hp / PyTorch.
# Without a GPU it still builds and runs the tests (they skip), says "no GPU" and exits 0.
#
# usage: bench/gpu/check.sh            (from the repository root)
# env:   BUILD=DIR  BUILD_TYPE=Release  HP_CUDA_ARCHS="90"  ONE_B_BATCH=2  ONE_B_STEPS=30
#        ONE_B_DTYPE=bf16  HP_CUDA_TF32=1  TORCH_STEPS=30  ONE_B_PROFILE=0
#        HP_GPU_BUNDLE=hp-gpu.tar.xz   (a tarball of bench/gpu/bundle.sh: its binaries are run
#                                       instead of a build, for a GPU machine without hp's
#                                       build dependencies)
#        HP_GPU_LOGS=DIR               (where the logs go; default a new /tmp/hp-gpu-check-*)
#        ONE_B_PROFILE=1 runs the ~1B model a few more steps (PROFILE_STEPS, default 6) with
#        HP_CUDA_PROFILE=1 and prints the device time (and operand GB/s) per op, attention's
#        TFLOP/s from it, and PyTorch's fused attention on the same shapes
#        (bench/gpu/torch_attention.py) beside it; and each GEMM shape's TFLOP/s from the
#        profile beside torch.mm's on the same shape and layout (bench/gpu/torch_gemm.py); the
#        profiled run tunes its GEMMs (HP_CUDA_GEMM_TUNE=1) and the summary says what that
#        saves a step against cuBLASLt's first candidate (the timed run does not tune).
#        It runs the forward attention's other shape too (HP_CUDA_FLASH_ROWS=16, 2 steps) and
#        prints both rates, and each op's time a kernel against its roofline on the device's
#        planning profile (bench/gpu/roofline.py over hpctl plan's estimate.compute_by_op). TORCH_PEER=0 skips the PyTorch runs (a quick check of hp alone).
#        (the ~1B run uses the mixed-precision policy: --param-dtype bf16 --reduce-dtype f32, bf16
#        GEMMs on cuBLASLt, f32 master weights; ONE_B_DTYPE=f32 runs it in f32, where TF32 GEMMs
#        are on by default here and HP_CUDA_TF32=0 turns them off)
# Exit status: 0 when every stage that could run passed, 1 otherwise.
set -u
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
BUILD=${BUILD:-$ROOT/build-gpu}
ARCHS=${HP_CUDA_ARCHS:-90}
BUILD_TYPE=${BUILD_TYPE:-Release}
JOBS=$(nproc 2>/dev/null || echo 4)
OUT=${HP_GPU_LOGS:-$(mktemp -d /tmp/hp-gpu-check-XXXXXX)}
mkdir -p "$OUT"
START=$(date +%s)
declare -a SUMMARY
FAILED=0
say() { echo "== $*"; }
row() { SUMMARY+=("$1"); }
fail() { FAILED=1; row "$1"; }
elapsed() { echo $(($(date +%s) - START)); }

GPU=yes
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then GPU=no; fi
if [ "$GPU" = yes ]; then
    NGPU=$(nvidia-smi -L | grep -c '^GPU')
    GPUNAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
    row "device        $NGPU x $GPUNAME, driver $DRIVER"
else
    row "device        no GPU (nvidia-smi finds none): the GPU stages below are skipped"
fi

# The CUDA libraries a bundle leaves to the target (libcudart, libcublasLt, libnccl): where the
# loader does not find them, the toolkit's folders and those of Python's nvidia-* wheels.
cuda_lib_path() {
    local bin=$1 lib dir cands
    cands=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda-*/lib64 /usr/local/cuda-*/lib
           /usr/lib/x86_64-linux-gnu)
    for dir in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
        cands+=("$dir"/nvidia/*/lib)
    done
    for lib in $(ldd "$bin" | awk '/not found/{print $1}'); do
        for dir in "${cands[@]}"; do
            if [ -e "$dir/$lib" ]; then
                export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
                break
            fi
        done
    done
    ldd "$bin" | awk '/not found/{print $1}'
}

# ---- 1. build ---------------------------------------------------------------------------------
if [ -n "${HP_GPU_BUNDLE:-}" ]; then
    say "bundle $HP_GPU_BUNDLE"
    rm -rf "$OUT/bundle" && mkdir -p "$OUT/bundle"
    if ! tar -C "$OUT/bundle" -xJf "$HP_GPU_BUNDLE"; then
        fail "bundle        FAILED: cannot unpack $HP_GPU_BUNDLE"
        printf '%s\n' "${SUMMARY[@]}"
        exit 1
    fi
    BUILD=$OUT/bundle/hp
    export LD_LIBRARY_PATH="$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export HP_BINARY_DIR=$BUILD HP_SOURCE_DIR=$ROOT
    missing=$(cuda_lib_path "$BUILD/worker/hp-worker"; cuda_lib_path "$BUILD/tests/test_cuda_ops")
    if [ -n "$missing" ]; then
        fail "bundle        FAILED: libraries not found here: $(echo "$missing" | tr '\n' ' ')"
        printf '%s\n' "${SUMMARY[@]}"
        exit 1
    fi
    row "bundle        ok: $(ldd "$BUILD/worker/hp-worker" | awk '/libcublasLt|libnccl/{print $3}' | tr '\n' ' ')"
else
say "build ($BUILD, sm $ARCHS)"
if cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" -DHP_WERROR=ON -DHP_CUDA_ARCHS="$ARCHS" \
        >"$OUT/cmake.log" 2>&1 &&
    cmake --build "$BUILD" -j"$JOBS" --target hp-worker hpctl test_cuda_backend test_cuda_ops \
        test_cuda_train test_cuda_nccl >"$OUT/build.log" 2>&1; then
    if grep -q "building the cuda backend" "$OUT/cmake.log"; then
        row "build         ok, cuda backend built ($(elapsed) s)"
    else
        fail "build         ok but WITHOUT the cuda backend (no nvcc/cuBLASLt/NCCL found)"
    fi
else
    fail "build         FAILED: see $OUT/cmake.log, $OUT/build.log"
    tail -30 "$OUT/build.log"
    printf '%s\n' "${SUMMARY[@]}"
    exit 1
fi
fi

# ---- 2. the CUDA tests ------------------------------------------------------------------------
for t in test_cuda_backend test_cuda_ops test_cuda_train test_cuda_nccl; do
    say "$t"
    log="$OUT/$t.log"
    t0=$(date +%s)
    timeout 300 "$BUILD/tests/$t" --jobs 1 --verbose=1 >"$log" 2>&1
    rc=$?
    dt=$(($(date +%s) - t0))
    synth=$(grep 'Synthesis' "$log" | tail -1 | sed 's/.*Synthesis: //')
    skips=$(grep -c '^\[SKIP\]' "$log")
    if [ $rc -eq 0 ]; then
        row "$(printf '%-13s ok: %s, %s skipped (%d s)' "$t" "$synth" "$skips" "$dt")"
    else
        fail "$(printf '%-13s FAILED (exit %s): %s — %s' "$t" "$rc" "$synth" "$log")"
        grep -E '^\[(FAIL|----)\]' "$log" | head -20
    fi
done

if [ "$GPU" = no ]; then
    row "training      skipped: no GPU"
    echo
    echo "==== GPU check summary ($(elapsed) s) ===="
    printf '%s\n' "${SUMMARY[@]}"
    echo "no GPU: nothing ran on a device"
    exit $FAILED
fi

# metrics.jsonl -> "first_loss last_loss median_tps median_mfu max_mem_bytes flops_per_token
# median_tflops" over steps > skip
stats() {
    python3 - "$1" "$2" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
skip = int(sys.argv[2])
t = [r for r in rows if r["step"] > skip] or rows
med = lambda k: sorted(r[k] for r in t)[len(t) // 2]
mfu = sorted((r.get("mfu_pct") or 0) for r in t)[len(t) // 2]
print(rows[0]["loss"], rows[-1]["loss"], med("tps"), mfu, max(r["memory_bytes"] for r in rows),
      rows[-1]["flops_per_token"], med("tflops"), len(rows))
PY
}

# ---- 3. the debugmodel, 20 steps --------------------------------------------------------------
say "debugmodel 20 steps"
D="$OUT/debug"
if "$BUILD/client/hpctl" new --model llama3:debugmodel --device cuda --steps 20 --lr 3e-3 \
        --log-interval 1 -o "$OUT/debug.pb" >/dev/null &&
    timeout 180 "$BUILD/worker/hp-worker" --standalone "$OUT/debug.pb" --out "$D" \
        >"$OUT/debug.log" 2>&1; then
    read -r f l tps _ _ _ _ n < <(stats "$D/metrics.jsonl" 3)
    if python3 -c "import sys; sys.exit(0 if $l < $f - 0.5 else 1)"; then
        row "$(printf 'debugmodel    ok: loss %.3f -> %.3f in %d steps, %.0f tokens/s' "$f" "$l" "$n" "$tps")"
    else
        fail "$(printf 'debugmodel    FAILED: the loss did not fall (%.3f -> %.3f)' "$f" "$l")"
    fi
else
    fail "debugmodel    FAILED: $(tail -1 "$OUT/debug.log")"
fi

# ---- 4. the ~1B Llama, 30 steps ---------------------------------------------------------------
B=${ONE_B_BATCH:-2}
S=${ONE_B_STEPS:-30}
DT=${ONE_B_DTYPE:-bf16}
case $DT in
    bf16) POLICY=(--param-dtype bf16 --reduce-dtype f32) ;;
    f32) POLICY=() ;;
    *) echo "ONE_B_DTYPE must be bf16 or f32, not '$DT'" >&2; exit 2 ;;
esac
# the ~1B model's shape, for hp, for its attention's rate and for the PyTorch peers
DIM=2048 LAYERS=16 HEADS=16 KV_HEADS=8 FFN=8192 VOCAB=128256 SEQ=2048
SHAPE=(--dim "$DIM" --layers "$LAYERS" --heads "$HEADS" --kv-heads "$KV_HEADS" --ffn-hidden "$FFN"
       --vocab "$VOCAB" --batch "$B" --seq "$SEQ")
say "~1B Llama, $S steps, batch $B x $SEQ, $DT"
G="$OUT/1b"
HP_TPS=""
if "$BUILD/client/hpctl" new --model llama3:debugmodel "${SHAPE[@]}" --device cuda --steps "$S" \
        "${POLICY[@]}" --log-interval 1 --name llama-1b -o "$OUT/1b.pb" >/dev/null &&
    HP_CUDA_TF32=${HP_CUDA_TF32:-1} timeout 300 "$BUILD/worker/hp-worker" --standalone \
        "$OUT/1b.pb" --out "$G" >"$OUT/1b.log" 2>&1; then
    read -r f l HP_TPS HP_MFU mem FPT TFL n < <(stats "$G/metrics.jsonl" 5)
    row "$(printf '~1B hp %-6s %.0f tokens/s, MFU %.1f%% (target 45%%), %.1f TFLOPS, peak %.1f GiB, loss %.3f -> %.3f (%d steps)' \
        "$DT" "$HP_TPS" "$HP_MFU" "$TFL" "$(python3 -c "print($mem / 2**30)")" "$f" "$l" "$n")"
else
    fail "~1B hp        FAILED or over 300 s: $(tail -1 "$OUT/1b.log")"
    if [ -f "$G/metrics.jsonl" ]; then
        read -r f l HP_TPS HP_MFU mem FPT TFL n < <(stats "$G/metrics.jsonl" 5)
        row "$(printf '              (%d steps ran: %.0f tokens/s, MFU %.1f%%)' "$n" "$HP_TPS" "$HP_MFU")"
    fi
fi

# ---- 4b. where the ~1B step's device time goes (ONE_B_PROFILE=1) -----------------------------
# attention's rates from a HP_CUDA_PROFILE=1 log: causal forward 2·B·H·T²·D FLOPs a call,
# backward 2.5 times that (FlashAttention's accounting), over the op's profiled device time
attention_rates() {
    python3 - "$1" "$B" "$HEADS" "$SEQ" "$((DIM / HEADS))" <<'PY'
import sys
b, h, t, d = (int(x) for x in sys.argv[2:6])
fwd = 2.0 * b * h * t * t * d
rate = {False: 0.0, True: 0.0}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 5 and f[0] in ("_scaled_dot_product_flash_attention",
                                "_scaled_dot_product_flash_attention_backward"):
        calls, ms = int(f[1]), float(f[2])
        flops = fwd * (2.5 if f[0].endswith("backward") else 1.0)
        rate[f[0].endswith("backward")] = calls * flops / (ms / 1e3) / 1e12 if ms > 0 else 0
print("%.1f %.1f" % (rate[False], rate[True]))
PY
}
if [ "${ONE_B_PROFILE:-0}" = 1 ]; then
    PS=${PROFILE_STEPS:-6}
    say "~1B profile, $PS steps, HP_CUDA_PROFILE=1"
    if "$BUILD/client/hpctl" new --model llama3:debugmodel "${SHAPE[@]}" --device cuda --steps "$PS" \
            "${POLICY[@]}" --log-interval 1 --name llama-1b-profile -o "$OUT/1b-prof.pb" >/dev/null &&
        HP_CUDA_PROFILE=1 HP_CUDA_GEMM_TUNE=1 HP_CUDA_TF32=${HP_CUDA_TF32:-1} timeout 300 \
            "$BUILD/worker/hp-worker" \
            --standalone "$OUT/1b-prof.pb" --out "$OUT/1b-prof" >"$OUT/1b-profile.log" 2>&1; then
        sed -n '/^cuda profile/,$p' "$OUT/1b-profile.log" | head -32
        top=$(sed -n '/^cuda profile/,$p' "$OUT/1b-profile.log" | sed -n '3,6p' |
              awk '{printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $5}')
        row "~1B profile   top device time: $top ($OUT/1b-profile.log)"
        read -r HP_AF HP_AB < <(attention_rates "$OUT/1b-profile.log")
        row "$(printf '~1B attention hp: forward %s TFLOP/s, backward %s (the profiled device time)' \
            "${HP_AF:-?}" "${HP_AB:-?}")"
        # the forward's other shape (16 query rows a warp, 64 a block: HP_CUDA_FLASH_ROWS=16)
        # on the same job, 2 steps: which one the default should be
        if HP_CUDA_PROFILE=1 HP_CUDA_FLASH_ROWS=16 HP_CUDA_TF32=${HP_CUDA_TF32:-1} timeout 150 \
                "$BUILD/worker/hp-worker" --standalone "$OUT/1b-prof.pb" --steps 2 \
                --out "$OUT/1b-prof16" >"$OUT/1b-profile-rows16.log" 2>&1; then
            read -r HP_AF16 _ < <(attention_rates "$OUT/1b-profile-rows16.log")
            row "~1B attention forward at 16 rows a warp: ${HP_AF16:-?} TFLOP/s (default 32: ${HP_AF:-?})"
        else
            fail "~1B attention forward at 16 rows a warp FAILED: $(tail -1 "$OUT/1b-profile-rows16.log")"
        fi
        # the profiled run tuned its GEMMs (HP_CUDA_GEMM_TUNE=1; the timed run above did not):
        # what the kept candidates save a step against cuBLASLt's first
        tune=$(python3 - "$OUT/1b-profile.log" "$PS" <<'PY'
import sys
sys.path.insert(0, "bench/gpu")
from torch_gemm import gemm_rows  # the profile's GEMM table (no torch needed)
rows = gemm_rows(sys.argv[1])
calls = {(r["batch"], r["m"], r["n"], r["k"], r["trans"], r["din"], r["dout"]): r["calls"]
         for r in rows}
gemm_ms = sum(r["ms"] for r in rows)
first, kept = {}, {}
for line in open(sys.argv[1], errors="replace"):
    f = line.split()
    if len(f) >= 13 and f[0] == "tune":
        din, dout = f[6].rstrip(":").split(">")
        key = (int(f[1]), int(f[2]), int(f[3]), int(f[4]), f[5], din, dout)
        first[key], kept[key] = float(f[8]), float(f[12])
steps = int(sys.argv[2])
saved = sum((first[k] - kept[k]) * calls.get(k, 0) for k in first) / 1e3 / steps
print("tuning saves %.2f ms a step against cuBLASLt's first candidate (%d shapes tuned; "
      "the GEMMs took %.1f ms a step)" % (saved, len(first), gemm_ms / steps))
PY
)
        row "~1B GEMM tune $tune"
        # each op's measured time a kernel against its roofline on this device's planning
        # profile (hpctl plan's estimate.compute_by_op: FLOPs and bytes per kernel)
        case "$GPUNAME" in
            *H200*) RPROF=h200 ;; *H100*) RPROF=h100 ;; *A100*) RPROF=a100 ;; *B200*) RPROF=b200 ;;
            *) RPROF="" ;;
        esac
        if [ -n "$RPROF" ] &&
            "$BUILD/client/hpctl" plan --json --device-profile "$RPROF" "$OUT/1b-prof.pb" \
                >"$OUT/1b-plan.json" 2>"$OUT/1b-plan.err" &&
            python3 bench/gpu/roofline.py "$OUT/1b-profile.log" "$OUT/1b-plan.json" \
                >"$OUT/1b-roofline.txt" 2>&1; then
            head -16 "$OUT/1b-roofline.txt"
            r=$(python3 -c 'import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("%.1f ms a step of device time where the roofline is %.1f ms: %.0f%% of it" % (
    j["measured_ms_per_step"], j["roofline_ms_per_step"], 100 * j["fraction"]))' \
                "$OUT/1b-roofline.txt")
            row "~1B roofline  $r (profile $RPROF; per op: $OUT/1b-roofline.txt)"
        elif [ -z "$RPROF" ]; then
            row "~1B roofline  not compared: no planning profile for $GPUNAME"
        else
            row "~1B roofline  not compared: $(cat "$OUT/1b-plan.err" "$OUT/1b-roofline.txt" 2>/dev/null | tail -2 | tr '\n' ' ')"
        fi
    else
        fail "~1B profile   FAILED: $(tail -1 "$OUT/1b-profile.log")"
    fi
fi

# ---- 4c. PyTorch's fused attention on the same shapes: the kernel-level peer ----------------
if [ "${ONE_B_PROFILE:-0}" = 1 ] && [ "${TORCH_PEER:-1}" != 0 ] &&
    python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    say "PyTorch attention (F.scaled_dot_product_attention)"
    if timeout 120 python3 bench/gpu/torch_attention.py --batch "$B" --heads "$HEADS" \
            --kv-heads "$KV_HEADS" --seq "$SEQ" --dim "$((DIM / HEADS))" \
            >"$OUT/torch-attn.json" 2>"$OUT/torch-attn.log"; then
        r=$(python3 - "$OUT/torch-attn.json" "${HP_AF:-0}" "${HP_AB:-0}" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
hf, hb = float(sys.argv[2]), float(sys.argv[3])
print("forward %.1f TFLOP/s, backward %.1f; hp / torch = %.2fx forward, %.2fx backward" % (
    j["forward_tflops"], j["backward_tflops"], hf / j["forward_tflops"],
    hb / j["backward_tflops"]))
PY
)
        row "~1B attention torch: $r"
    else
        row "~1B attention torch did not run: $(tail -1 "$OUT/torch-attn.log")"
    fi
fi

# ---- 4d. the same GEMMs in PyTorch: is cuBLASLt's first heuristic as fast as torch's pick? ----
if [ "${ONE_B_PROFILE:-0}" = 1 ] && [ "${TORCH_PEER:-1}" != 0 ] && [ -f "$OUT/1b-profile.log" ] &&
    python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    say "PyTorch GEMMs on the profiled shapes (torch.mm)"
    if HP_CUDA_TF32=${HP_CUDA_TF32:-1} timeout 120 python3 bench/gpu/torch_gemm.py \
            "$OUT/1b-profile.log" >"$OUT/torch-gemm.json" 2>"$OUT/torch-gemm.log"; then
        python3 - "$OUT/torch-gemm.json" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if "m" in j:
        print("  %5d x %5d x %5d %-2s %-9s %5d calls: hp %6.1f TFLOP/s, torch %6.1f (hp/torch time %.2f)%s"
              % (j["m"], j["n"], j["k"], j["trans"], j["din"] + ">" + j["dout"], j["calls"],
                 j["hp_tflops"], j["torch_tflops"], j["hp_over_torch_time"],
                 "  [" + j["note"] + "]" if "note" in j else ""))
PY
        r=$(python3 - "$OUT/torch-gemm.json" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("hp %.1f ms, torch %.1f ms for the same calls: hp/torch time %.2fx" % (
    j["hp_ms"], j["torch_ms"], j["hp_over_torch_time"] or float("nan")))
PY
)
        row "~1B GEMMs     $r (top shapes in $OUT/torch-gemm.json)"
    else
        row "~1B GEMMs     torch did not run: $(tail -1 "$OUT/torch-gemm.log" "$OUT/torch-gemm.json" 2>/dev/null | tail -1)"
    fi
fi

# ---- 5. PyTorch eager and torch.compile -------------------------------------------------------
if [ "${TORCH_PEER:-1}" = 0 ]; then
    row "~1B torch     skipped: TORCH_PEER=0"
elif python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    for mode in eager compile; do
        say "PyTorch $mode"
        if timeout 240 python3 bench/gpu/torch_llama.py --mode $mode --dim "$DIM" \
                --layers "$LAYERS" --heads "$HEADS" --kv-heads "$KV_HEADS" --ffn "$FFN" \
                --vocab "$VOCAB" --batch "$B" --seq "$SEQ" \
                --steps "${TORCH_STEPS:-$S}" >"$OUT/torch-$mode.json" 2>"$OUT/torch-$mode.log"; then
            r=$(python3 - "$OUT/torch-$mode.json" "${HP_TPS:-0}" "${FPT:-0}" "${HP_MFU:-0}" "${TFL:-0}" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
hp, fpt, mfu, tfl = map(float, sys.argv[2:6])
peak = tfl * 1e12 / (mfu / 100) if mfu > 0 else 0
tmfu = 100 * fpt * j["tokens_per_s"] / peak if peak > 0 else float("nan")
ratio = hp / j["tokens_per_s"] if j["tokens_per_s"] > 0 else float("nan")
print("%.0f tokens/s, MFU %.1f%%, peak %.1f GiB (torch %s); hp / torch = %.2fx" % (
    j["tokens_per_s"], tmfu, j["peak_bytes"] / 2**30, j["torch"], ratio))
PY
)
            row "$(printf '~1B torch %-7s %s' "$mode" "$r")"
        else
            row "$(printf '~1B torch %-7s did not run: %s' "$mode" "$(tail -1 "$OUT/torch-$mode.log" "$OUT/torch-$mode.json" 2>/dev/null | tail -1)")"
        fi
    done
else
    row "~1B torch     skipped: PyTorch with CUDA is not importable here"
fi

echo
echo "==== GPU check summary ($(elapsed) s; logs in $OUT) ===="
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
