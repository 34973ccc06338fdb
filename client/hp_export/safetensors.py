"""Safetensors (Hugging Face's format) written directly: an 8-byte little-endian header
length, a JSON header (name -> dtype, shape, data_offsets; "__metadata__" strings), then the
raw little-endian tensor bytes. Debian ships no `safetensors` package; the format is small."""
import json
import os
import struct

import torch

_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.bool: "BOOL", torch.float64: "F64"}


def save(path, tensors, metadata=None):
    """Writes {name: tensor} to path atomically (temp file, fsync, rename)."""
    header, blobs, at = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.dtype not in _NAMES:
            raise ValueError("%s: dtype %s has no safetensors name here" % (name, t.dtype))
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        blob = raw.numpy().tobytes()  # numpy writes the host's order: little-endian here
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load(path):
    """{name: tensor}, metadata: for tests and round trips."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    meta = header.pop("__metadata__", {})
    by_name = {v: k for k, v in _NAMES.items()}
    data = bytearray(buf[8 + n:])
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        dt = by_name[e["dtype"]]
        raw_dt = torch.int16 if dt == torch.bfloat16 else dt
        t = torch.frombuffer(data[b:end], dtype=raw_dt).clone() if end > b else torch.empty(0, dtype=raw_dt)
        if dt == torch.bfloat16:
            t = t.view(torch.bfloat16)
        out[name] = t.reshape(e["shape"])
    return out, meta
