#!/usr/bin/python3
"""Safetensors interop with PyTorch for tests/worker/test_safetensors.c.

Debian ships no `safetensors` Python package, so the format is parsed and written here by
hand (json + struct + torch.frombuffer), following the spec: 8-byte little-endian header
length, JSON header, data region.

    st_torch.py check FILE   read FILE (written by hp) and check every tensor's values
    st_torch.py write FILE   write the tensors the C test expects

Exit status: 0 ok, 1 mismatch, 3 torch missing.
"""
import json
import struct
import sys

try:
    import torch
except ImportError:
    print("st_torch.py: python3-torch is missing", file=sys.stderr)
    sys.exit(3)

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "BOOL": torch.bool}


def load(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = bytearray(buf[8 + n:])
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        dt = DTYPES[e["dtype"]]
        if end > b:
            t = torch.frombuffer(data[b:end], dtype=dt).clone()
        else:
            t = torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"])
    return out, meta


def save(path, tensors, meta):
    names = {v: k for k, v in DTYPES.items()}
    header, blobs, at = {"__metadata__": meta}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.int16) if t.dtype == torch.bfloat16 else t.contiguous()
        blob = raw.numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def expect(name, got, want):
    if got.dtype != want.dtype or list(got.shape) != list(want.shape) or not torch.equal(got, want):
        print(f"st_torch.py: tensor {name}: got {got!r}, want {want!r}", file=sys.stderr)
        sys.exit(1)


def check(path):
    t, meta = load(path)
    if meta != {"format": "pt"}:
        print(f"st_torch.py: metadata {meta}", file=sys.stderr)
        sys.exit(1)
    expect("a", t["a"], (torch.arange(6, dtype=torch.float32) * 0.5 - 1).reshape(2, 3))
    expect("b", t["b"], torch.tensor([1, -2, 0.5, 3.25], dtype=torch.bfloat16))
    expect("c", t["c"], torch.tensor([0.1, -7.5, 65504], dtype=torch.float16))
    expect("d", t["d"], torch.tensor([[-(1 << 40), 1], [2, 3]], dtype=torch.int64))
    expect("e", t["e"], torch.arange(-2, 3, dtype=torch.int32))
    expect("f", t["f"], torch.tensor([True, False, True]))
    expect("g", t["g"], torch.empty(0, 4))
    if sorted(t) != list("abcdefg"):
        print(f"st_torch.py: tensors {sorted(t)}", file=sys.stderr)
        sys.exit(1)


def write(path):
    save(path, {
        "x": torch.linspace(-1, 1, 6, dtype=torch.float32).reshape(3, 2),
        "y": torch.tensor([1.5, -0.25], dtype=torch.bfloat16),
        "z": torch.tensor([7, -8, 1 << 50], dtype=torch.int64),
        "w": torch.tensor([0.5, -2], dtype=torch.float16),
    }, {"format": "pt"})
    # our own reader must accept what we wrote
    load(path)


if __name__ == "__main__":
    {"check": check, "write": write}[sys.argv[1]](sys.argv[2])
