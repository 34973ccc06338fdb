"""bench/gpu/torch_peer.py — what the PyTorch peers of bench/gpu/check.sh (torch_llama.py,
torch_attention.py) share: PyTorch with CUDA and F.scaled_dot_product_attention, or one JSON
line saying why there is none."""
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
