"""bench/gpu/torch_peer.py — what the PyTorch peers of bench/gpu/check.sh (torch_llama.py,
torch_attention.py, torch_gemm.py) share: PyTorch with CUDA and F.scaled_dot_product_attention,
or one JSON line saying why there is none; and timing with CUDA events."""
import json


def cuda_torch():
    """(torch, torch.nn.functional); None after printing {"error": ...} (the caller exits 3)."""
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 - any import failure means no peer
        print(json.dumps({"error": "torch: %s" % e}))
        return None
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch %s has no CUDA" % torch.__version__}))
        return None
    if not hasattr(F, "scaled_dot_product_attention"):
        print(json.dumps({"error": "torch %s has no scaled_dot_product_attention" %
                          torch.__version__}))
        return None
    return torch, F


def median_ms(torch, fn, repeat, inner=1):
    """Milliseconds a call of fn takes on the device: three warm-up calls, then the median over
    `repeat` timings of `inner` calls each (CUDA events around them)."""
    for _ in range(3):
        fn()
    ms = []
    for _ in range(repeat):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(inner):
            fn()
        e.record()
        torch.cuda.synchronize()
        ms.append(s.elapsed_time(e) / inner)
    return sorted(ms)[len(ms) // 2]
