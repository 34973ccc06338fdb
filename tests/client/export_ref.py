#!/usr/bin/python3
"""tests/client/export_ref.py — PyTorch's side of test_hp_export.c.

  export_ref.py export DIR AUTODIFF [--as NAME] [--bias-buffer | --mha] [--dropout P] [HPCTL FLAGS...]
                  exports the GPT-2-style model below with hp_export (autodiff torch | hp) to
                  DIR/job-AUTODIFF.pb (or DIR/job-NAME.pb), its weights to
                  DIR/init.safetensors; --bias-buffer: the causal mask as nanoGPT's buffer;
                  --mha: the attention as nn.MultiheadAttention with an additive mask buffer;
                  --mha-forward-mask: the same, its mask made in forward by triu;
                  --ops (after those): OpsNet, the decomposed ops, instead of the GPT;
                  --ops2: OpsNet2, more of them; --ops3: OpsNet3, the less common ones;
                  --ops4: OpsNet4, repeat_interleave, GroupNorm, tensor constants;
                  --ops5: OpsNet5, losses, logic and math of models beyond the GPT;
                  --ops6: OpsNet6, a top-2 mixture of experts, sort, topk, gather/scatter;
                  --ops7: OpsNet7, nn.LSTM and in-place ops (autodiff hp);
                  --ops8: OpsNet8, Conv1d (depthwise causal, dilated, grouped), Conv2d, pooling;
                  --bf16 (after those): the model in bf16 (model.to(torch.bfloat16));
                  --label-smoothing E (after those): cross entropy with label_smoothing=E;
                  --sum-loss (after those): cross entropy with reduction='sum', over B·T;
                  --loss-3d, --loss-3d-none: cross entropy of [B, V, T] scores (nll_loss2d),
                  mean or per position then averaged; --gather-loss: log-probabilities
                  picked by gather;
                  --dropout P: nanoGPT's dropouts (embeddings, attention weights, both
                  residual branches) with p = P (default 0: they fold away);
                  --native-dropout (after --dropout): through torch.native_dropout
  export_ref.py train DIR STEPS [--mha] [--dropout P]  trains the same model from
                  DIR/init.safetensors on DIR/tokens.bin (an llm.c shard of exactly B windows
                  of T+1 tokens) with torch.optim.AdamW, torchtitan's LR schedule and
                  clip_grad_norm_, as hp's job does; writes DIR/ref/metrics.jsonl (the losses)
                  and DIR/ref/model.safetensors (the final weights); --mha, --ops, --ops2..5,
                  --label-smoothing E, --sum-loss, --loss-3d(-none), --gather-loss: the export's models and
                  loss; --dropout P: with
                  nanoGPT's dropouts drawing hp's masks (include/hp/rng.h, seed 0)
  export_ref.py conv DIR                             exports a model with a ConvTranspose2d: must fail
  export_ref.py longsort DIR                         one with a sort of 512 entries: must fail
  export_ref.py refused DIR lstm|inplace-view|param-view torch|hp   exports OpsNet7, a write
                  through a view read afterwards, or a kept view of a parameter: must fail
  export_ref.py llama DIR AUTODIFF [HPCTL FLAGS...]  exports the Llama below (torchtitan's FQNs)
                  to DIR/job-llama-AUTODIFF.pb, its state to DIR/llama.safetensors

The model is nanoGPT's shape, written here: learned positions, LayerNorm with bias, a
GELU-tanh MLP, causal attention with a mask computed in forward (no buffer), lm_head tied to
the token embedding. The Llama is torchtitan's, written here with its FQNs (tok_embeddings,
layers.N.attention.wq/wk/wv/wo, feed_forward.w1/w2/w3, attention_norm, ffn_norm, norm,
output): RMSNorm as x * rsqrt(mean(x^2) + eps) * w, RoPE on adjacent pairs (torchtitan's
complex form written with real cos/sin tables, buffers precomputed as torchtitan precomputes
freqs_cis, since torch 1.13's make_fx cannot carry complex values into hp), grouped-query
attention through repeat_kv, the attention unfused (torch 1.13 has no
scaled_dot_product_attention), SwiGLU. Exit 3 when torch is missing.
"""
import json
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "client"))
sys.path.insert(0, os.path.join(ROOT, "tests", "worker"))

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("export_ref.py: python3-torch is missing", file=sys.stderr)
    sys.exit(3)

import adamw_ref  # noqa: E402
import hp_export  # noqa: E402
from hp_export import safetensors  # noqa: E402

V, T, C, H, L, B = 64, 16, 32, 4, 2, 4
LR, WARMUP, WD, CLIP = 1e-3, 2, 0.1, 1.0
DROPOUT = 0.0  # nanoGPT's dropout p (export --dropout)
NATIVE_DROPOUT = False  # export --native-dropout: call torch.native_dropout instead


class NativeDropout(nn.Module):
    """Dropout through torch.native_dropout, which make_fx records as aten.native_dropout and
    aten.native_dropout_backward (what nn.Dropout records on a GPU)."""
    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        return torch.native_dropout(x, self.p, self.training)[0] if self.p > 0 else x


# ---- hp's dropout mask (include/hp/rng.h), so PyTorch can train with the elements hp drops ----
M32, M64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
HP_SEED = 0  # the job's seed (hpctl's default)
HP_STEP = [0]  # the training step hp's masks are drawn for (1-based)


def philox(ctr, key):
    c, k = list(ctr), list(key)
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & M32, (k[1] + 0xBB67AE85) & M32]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & M32, (p0 >> 32) ^ c[3] ^ k[1], p0 & M32]
    return c


def stream_id(name):
    h = 0xcbf29ce484222325
    for ch in name.encode():
        h = ((h ^ ch) * 0x100000001b3) & M64
    return h


def hp_keep(fqn, step, p, n):
    """hp's keep mask of a whole tensor of n elements (hp_dropout_keep)."""
    th = min(round(p * 2.0 ** 32), M32)
    st = (stream_id(fqn) + step * 0x9E3779B97F4A7C15) & M64
    key = [HP_SEED & M32, HP_SEED >> 32]
    out = []
    for q in range((n + 3) // 4):
        out += philox([q & M32, q >> 32, st & M32, st >> 32], key)
    return torch.tensor([w >= th for w in out[:n]])


class HpMaskDropout(nn.Module):
    """Dropout with hp's mask for the step HP_STEP (fqn: set from the module's path)."""
    def __init__(self, p):
        super().__init__()
        self.p, self.fqn = p, None

    def forward(self, x):
        keep = hp_keep(self.fqn, HP_STEP[0], 1.0 - (1.0 - self.p), x.numel()).view(x.shape)
        return x * (keep.to(x.dtype) / (1.0 - self.p))


HP_MASK = False  # train --dropout: PyTorch draws hp's masks


def dropout():
    if HP_MASK and DROPOUT > 0:
        return HpMaskDropout(DROPOUT)
    return NativeDropout(DROPOUT) if NATIVE_DROPOUT else nn.Dropout(DROPOUT)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        # No bias on the q/k/v projection: the key bias's gradient is zero in exact arithmetic
        # (it shifts each row of scores by a constant, which softmax ignores), so AdamW turns
        # each implementation's rounding noise there into lr-sized steps of random sign and
        # no two implementations agree on it. Every other Linear and LayerNorm has its bias.
        self.c_attn = nn.Linear(C, 3 * C, bias=False)
        self.c_proj = nn.Linear(C, C)
        self.attn_dropout, self.resid_dropout = dropout(), dropout()

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(b, t, H, c // H).transpose(1, 2)
        k = k.view(b, t, H, c // H).transpose(1, 2)
        v = v.view(b, t, H, c // H).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))
        att = att.masked_fill(~mask, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class BiasAttention(Attention):
    """nanoGPT's own form: the causal mask a buffer, compared with 0 (hp_export computes it in
    the graph, so the attention still fuses)."""
    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(b, t, H, c // H).transpose(1, 2)
        k = k.view(b, t, H, c // H).transpose(1, 2)
        v = v.view(b, t, H, c // H).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class MhaAttention(nn.Module):
    """torch's own nn.MultiheadAttention (packed in_proj_weight, make_fx's baddbmm of the mask)
    with the additive causal mask as a buffer, triu(full(-inf), 1) as
    nn.Transformer.generate_square_subsequent_mask makes it; no biases (the key bias's gradient
    is zero in exact arithmetic, see Attention)."""
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(C, H, bias=False, batch_first=True)
        self.register_buffer("mask", torch.triu(torch.full((T, T), float("-inf")), 1))

    def forward(self, x):
        t = x.size(1)
        y, _ = self.mha(x, x, x, attn_mask=self.mask[:t, :t], need_weights=False)
        return y


class MhaForwardMask(MhaAttention):
    """The same with the mask made in forward: triu(full(-inf), 1), make_fx's full and triu."""
    def forward(self, x):
        t = x.size(1)
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        y, _ = self.mha(x, x, x, attn_mask=mask, need_weights=False)
        return y


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)
        self.dropout = dropout()

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, attn=Attention):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(C), attn()
        self.ln_2, self.mlp = nn.LayerNorm(C), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, attn=Attention):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, C), wpe=nn.Embedding(T, C), drop=dropout(),
            h=nn.ModuleList([Block(attn) for _ in range(L)]), ln_f=nn.LayerNorm(C)))
        self.lm_head = nn.Linear(C, V, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for blk in self.transformer.h:
            x = blk(x)
        return self.lm_head(self.transformer.ln_f(x))


def make(attn=Attention):
    torch.manual_seed(1234)
    m = GPT(attn)
    with torch.no_grad():  # non-trivial norms, so their gradients are tested too
        for n, p in m.named_parameters():
            if "ln" in n:
                p.add_(0.1 * torch.randn(p.shape))
    return m


class OpsNet(nn.Module):
    """Ops hp_export decomposes rather than maps one to one (aten_map's second table): a
    hand-written RMSNorm (pow, mean, rsqrt) and LayerNorm (mean, var), a gated MLP (chunk,
    sigmoid, silu, tanh, relu), leaky_relu, clamp, softplus, a masked assignment (index_put_),
    ne; their backwards as torch records them (ge, le, logical_and_, scalar_tensor,
    leaky_relu_backward, softplus_backward, index_put)."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.g1 = nn.Parameter(1 + 0.1 * torch.randn(C))
        self.g2, self.b2 = nn.Parameter(1 + 0.1 * torch.randn(C)), nn.Parameter(torch.zeros(C))
        self.a, self.b = nn.Linear(C, 2 * C), nn.Linear(C, C)
        self.out = nn.Linear(C, V)

    def forward(self, idx):
        x = self.emb(idx)
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.g1
        u, g = self.a(h).chunk(2, dim=-1)
        x = x + self.b(u * torch.sigmoid(g) + 0.1 * F.silu(g) + torch.tanh(u) * F.relu(g))
        x = x + 0.5 * F.leaky_relu(x, 0.2) + 0.3 * torch.clamp(x, -0.5, 0.5)
        mu, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
        x = (x - mu) / torch.sqrt(var + 1e-5) * self.g2 + self.b2
        x = x + 0.2 * F.softplus(x, beta=2.0, threshold=1.0)
        x[x > 1.0] = 1.0  # index_put_ (its backward: index_put of the gradient)
        x = torch.where(idx.unsqueeze(-1) != 3, x, 0.5 * x)  # ne
        return self.out(x)


def make_ops():
    torch.manual_seed(77)
    return OpsNet()


class OpsNet2(nn.Module):
    """Rotary embeddings computed in forward (sin, cos), a GELU written with erf, and more
    decompositions: abs, sign,
    minimum/maximum of tensors,
    reciprocal, logsumexp, std, F.normalize (norm), F.pad, roll, hardtanh, elu, mish, a max
    subtracted (amax, whose backward counts the maxima with a sum of bools), and their
    backwards as torch records them (sgn, masked_fill_, hardtanh_backward, elu_backward)."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.a, self.b = nn.Linear(C, C), nn.Linear(C, C)
        self.out = nn.Linear(C, V)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, C, 2).float() / C)))

    def forward(self, idx):
        x = self.emb(idx)
        # rotary embedding as Hugging Face's Llama computes it, in forward: cos/sin of angles
        ang = torch.arange(idx.shape[1], dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        ang = torch.cat([ang, ang], dim=-1)
        half = torch.cat([-x[..., C // 2:], x[..., :C // 2]], dim=-1)
        x = x * ang.cos() + half * ang.sin()
        u, w = self.a(x), self.b(x)
        x = x + 0.2 * torch.sin(u) + 0.2 * torch.cos(w)
        x = x + 0.2 * (0.5 * w * (1.0 + torch.erf(w / math.sqrt(2.0))))  # GELU written out
        x = x + 0.3 * torch.abs(u) * torch.sign(w) + 0.2 * torch.minimum(u, w)
        x = x + 0.2 * torch.maximum(u, 0.5 * w) + 0.1 * torch.reciprocal(torch.abs(u) + 1.0)
        x = x - 0.1 * torch.logsumexp(u, dim=-1, keepdim=True) + 0.1 * torch.logsumexp(w, -1)[..., None]
        x = x + 0.2 * F.normalize(u, dim=-1) + 0.1 * u / (u.std(-1, keepdim=True) + 1.0)
        x = x + 0.2 * F.pad(w, (0, 0, 1, 0))[:, :-1] + 0.1 * torch.roll(u, 2, dims=1)
        x = x + 0.2 * F.hardtanh(w, -0.3, 0.4) + 0.2 * F.elu(u, alpha=0.7) + 0.1 * F.mish(w)
        x = x - 0.5 * x.amax(-1, keepdim=True)
        return self.out(x)


def make_ops2():
    torch.manual_seed(78)
    return OpsNet2()


class OpsNet3(nn.Module):
    """The less common ops hp_export decomposes (aten_extra.py): index_select of a parameter
    table by the tokens and of a dim by a constant reversed index (their backward index_add),
    indexing (table[idx], u[:, reversed positions]; backward index_put with accumulate),
    cumsum and flip over the positions, repeat, amin, log1p, expm1, logsigmoid, hardswish,
    hardsigmoid, and their backwards as torch records them."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.table = nn.Parameter(0.5 * torch.randn(V, C))
        self.a, self.b = nn.Linear(C, C), nn.Linear(C, C)
        self.out = nn.Linear(C, V)

    def forward(self, idx):
        x = self.emb(idx)
        x = x + 0.5 * torch.index_select(self.table, 0, idx.reshape(-1)).reshape(x.shape)
        u, w = self.a(x), self.b(x)
        x = x + 0.2 * torch.cumsum(u, dim=1) / idx.shape[1] + 0.2 * torch.flip(w, [1])
        x = x + 0.2 * u.repeat(1, 1, 2)[..., C // 2:C // 2 + C] - 0.1 * u.amin(-1, keepdim=True)
        x = x + 0.2 * torch.log1p(u.abs()) + 0.2 * torch.expm1(0.3 * w)
        x = x + 0.2 * F.logsigmoid(u) + 0.2 * F.hardswish(w) + 0.2 * F.hardsigmoid(u)
        x = x + 0.1 * torch.index_select(w, 2, torch.arange(C - 1, -1, -1))
        x = x + 0.3 * self.table[idx] + 0.1 * u[:, torch.arange(idx.shape[1] - 1, -1, -1)]
        return self.out(x)


def make_ops3():
    torch.manual_seed(79)
    return OpsNet3()


class OpsNet4(nn.Module):
    """Ops more models write than the GPT does: repeat_interleave (Mistral's grouped-query
    keys and values, dim=2; along the positions; with no dim, flattened) and GroupNorm (over
    [B, C, T] with affine, RWKV's over [B·T, C], and F.group_norm without affine), with their
    backwards as torch records them (index_add, native_group_norm_backward); and tensor
    constants made in forward (torch.tensor of floats: ALiBi-like slopes; of integers: a
    permutation to index by; of bools: a mask), which make_fx captures as constants; and
    an i64 positions buffer and a bool buffer, which hp recreates from their init."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.kv = nn.Linear(C, C // 2)
        self.gn = nn.GroupNorm(4, C)
        self.ln_x = nn.GroupNorm(H, C)
        self.out = nn.Linear(C, V)
        self.register_buffer("pos", torch.arange(T))  # i64 and bool buffers hp recreates
        self.register_buffer("on", torch.ones(C, dtype=torch.bool))

    def forward(self, idx):
        b, t = idx.shape
        x = self.emb(idx) + 0.5 * self.emb(self.pos[:t]).masked_fill(~self.on, 0.0)
        kv = self.kv(x).view(b, t, H // 2, C // H)
        x = x + 0.5 * torch.repeat_interleave(kv, repeats=2, dim=2).reshape(b, t, C)
        half = x[:, :t // 2]
        x = x + 0.3 * half.repeat_interleave(2, dim=1)
        x = x + 0.2 * kv.repeat_interleave(2).view(b, t, C)
        x = x + 0.5 * self.gn(x.transpose(1, 2)).transpose(1, 2)
        x = x + 0.5 * self.ln_x(x.reshape(b * t, C)).view(b, t, C)
        x = x + 0.3 * F.group_norm(x.transpose(1, 2), 2).transpose(1, 2)
        slopes = torch.tensor([2.0 ** (-(i + 1) / 4) for i in range(C)])
        perm = torch.tensor([(5 * i + 3) % C for i in range(C)])
        keep = torch.tensor([i % 3 != 1 for i in range(C)])
        x = x * slopes + 0.3 * x[:, :, perm].masked_fill(~keep, 0.0)
        return self.out(x)


class OpsNet5(nn.Module):
    """Ops of models beyond the GPT (client/hp_export/aten_more.py): exp2, log2, log10, a
    scalar's power, sinh, cosh, celu, PReLU (per channel, shared), logaddexp, soft- and
    hardshrink, index_fill, new_full/new_ones, isinf, GLU, addcmul, addcdiv, lerp, var_mean,
    max/min over a dim and over all, argmax/argmin (their indices looking up embeddings),
    boolean logic (&, |, ^, any, all), cosine similarity (sqrt_, clamp_min_), nan_to_num,
    rounding (a straight-through estimator), a one-hot of the tokens by scatter_, integer
    arithmetic on constants (folded), and auxiliary losses (mse, smooth_l1, huber, l1, kl_div
    both ways, binary cross entropy with and without logits) scaling the logits, pow of two
    tensors (negative bases, whole and fractional exponents, 0⁰), fmod and remainder, a sum
    with dtype=, atan, asin, acos, atan2 (every quadrant, the axes), prod and cumprod, with the
    backwards torch records."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.a, self.b = nn.Linear(C, C), nn.Linear(C, 2 * C)
        self.head = nn.Linear(C, 1)
        self.prelu, self.prelu1 = nn.PReLU(C), nn.PReLU()
        self.out = nn.Linear(C, V)

    def forward(self, idx):
        b, t = idx.shape
        x = self.emb(idx)
        u, w = self.a(x), F.glu(self.b(x), -1)
        x = x + 0.2 * self.prelu(u.transpose(1, 2)).transpose(1, 2) + 0.2 * self.prelu1(w)
        x = x + 0.1 * torch.logaddexp(u, w) + 0.2 * F.softshrink(u, 0.3)
        x = x + 0.2 * F.hardshrink(w, 0.2) + x.new_full(x.shape, 0.1) - x.new_ones(())
        x = x.index_fill(-1, torch.tensor([1, 4]), 0.5)
        x = torch.where(torch.isinf(x / (u.unsqueeze(0).squeeze() > 10)), 0.0, x)
        x = x + 0.1 * torch.exp2(0.5 * u) + 0.1 * torch.log2(u.abs() + 1)
        x = x + 0.1 * torch.log10(w.abs() + 1) + 0.1 * torch.pow(1.5, w)
        x = x + 0.05 * torch.sinh(u) + 0.05 * torch.cosh(0.5 * w) + 0.2 * F.celu(u, 0.5)
        x = torch.addcmul(x, u, w, value=0.1) + 0.5 * torch.addcdiv(u, u, w.abs() + 1, value=0.1)
        x = torch.lerp(x, u, 0.2) + 0.1 * torch.lerp(u, w, torch.sigmoid(x))
        var, mean = torch.var_mean(x, -1, keepdim=True)
        x = (x - mean) / torch.sqrt(var + 1e-5)
        x = x + 0.3 * torch.max(u, -1, keepdim=True).values - 0.3 * torch.min(w, 1)[0].unsqueeze(1)
        x = x + 0.01 * (u.max() - w.min()) + 0.2 * self.emb(u.argmax(-1) + w.argmin(-1))
        x = x + 0.1 * self.emb(torch.max(u, -1)[1]) * (u > 3).any().float()
        m = ((u > 0) & (w > 0)) | ((u < -0.5) ^ (w < -0.5))
        x = torch.where(m, x, 0.5 * x) * (1 + 0.1 * (u > 1).any(-1, keepdim=True).float() -
                                          0.1 * (w > -2).all(-1, keepdim=True).float())
        x = x + 0.2 * F.cosine_similarity(u, w, -1).unsqueeze(-1)
        x = x + 0.1 * torch.nan_to_num(torch.log(u))
        x = x + (torch.round(u * 4) / 4 - u).detach() + 0.1 * torch.floor(w) + 0.1 * torch.ceil(w)
        onehot = torch.zeros(b, t, V).scatter_(2, idx.unsqueeze(-1), 1.0)
        x = x + 0.3 * onehot[..., :C] + 0.1 * ((torch.arange(C) // 4) % 3).float()
        x = x + 0.1 * (torch.arange(C) & 1).float()
        base = torch.tensor([-2.0, -1.5, 0.0, 0.5, 3.0, -0.7, 0.0, -2.0])
        ex = torch.tensor([3.0, 2.0, 0.0, -1.0, 0.5, 1.0, 2.0, 0.5])
        sp = torch.nan_to_num(torch.pow(base, ex), nan=0.25).sum(dtype=torch.float32)
        x = x + 0.01 * sp + 0.1 * torch.fmod(u, 0.7) + 0.1 * torch.remainder(w, -0.6)
        x = x + 0.1 * torch.fmod(w, u.abs() + 0.5) + 0.05 * torch.pow(u.abs() + 0.5, w)
        x = x + 0.02 * torch.pow(-u.abs() - 0.5, torch.round(w.detach()).clamp(-2, 3))
        tv = torch.tensor([-1e4, -3.0, -1.0, -0.3, 0.0, 0.2, 0.5, 1.0, 2.5, 1e5])
        sv = torch.tensor([-1.0, -0.7, -0.3, 0.0, 0.45, 0.55, 0.99, 1.0])
        ys = torch.tensor([1.0, 1.0, -1.0, -1.0, 0.0, 2.0, -2.0, 0.0, 0.0])
        xs = torch.tensor([2.0, -2.0, 3.0, -3.0, -1.0, 0.0, 0.0, 0.0, 1.0])
        tr = torch.atan(tv).sum() + torch.asin(sv).sum() + 0.5 * torch.acos(sv).sum()
        tr = tr + torch.atan2(ys, xs).sum() + torch.prod(tv[1:9]) + torch.cumprod(sv, 0).sum()
        inf = torch.tensor([float("-inf"), 0.0, 1.0, float("inf")])  # a constant with ±inf
        tr = tr + inf[:3].exp().sum() + torch.fmod(tv[:4], inf[3:]).sum()
        tr = tr + torch.fmod(tv[1:9], 0.7).sum() + torch.remainder(tv[1:9], -0.4).sum()
        x = x + 0.01 * tr + 0.1 * torch.atan(u) + 0.1 * torch.asin(torch.tanh(w) * 0.9)
        x = x + 0.05 * torch.acos(torch.tanh(u) * 0.8) + 0.1 * torch.atan2(u, w)
        x = x + 0.1 * torch.prod(torch.sigmoid(u[..., :6]) + 0.5, -1, keepdim=True)
        x = x + 0.1 * torch.cumprod(torch.sigmoid(w) + 0.5, 1) / 10
        aux = F.mse_loss(u, w.detach()) + F.smooth_l1_loss(u, w.detach(), beta=0.5)
        aux = aux + F.huber_loss(w, u.detach(), delta=0.7) + F.l1_loss(u, w)
        aux = aux + F.kl_div(F.log_softmax(u, -1), F.softmax(w.detach(), -1),
                             reduction="batchmean")
        aux = aux + F.kl_div(F.log_softmax(u, -1), F.log_softmax(w, -1), reduction="batchmean",
                             log_target=True)
        logit = self.head(x).squeeze(-1)
        tgt = (idx > V // 2).float()
        aux = aux + F.binary_cross_entropy(torch.sigmoid(logit), tgt)
        aux = aux + F.binary_cross_entropy_with_logits(logit, tgt, pos_weight=torch.tensor(2.0))
        aux = aux + F.mse_loss(u, w, reduction="sum") / 100
        return self.out(x) * (1 + 0.1 * torch.tanh(aux))


class OpsNet6(nn.Module):
    """Selection by data (client/hp_export/aten_select.py): a mixture of four experts behind a
    top-2 router (topk, a softmax over the two, the gates scattered back by scatter with two
    indices), a descending sort of the router scores (its values, and its last index looking up
    an embedding), topk of the smallest, argsort, gather and scatter_add with several indices
    along a dim, a gather along the positions, and first- and last-position pooling (x[:, 0],
    x[:, -1]: select_backward); with the backwards torch records (sort's and topk's are
    scatters of every index)."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.router = nn.Linear(C, 4, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(C, 2 * C), nn.SiLU(),
                                                   nn.Linear(2 * C, C)) for _ in range(4))
        self.out = nn.Linear(C, V)

    def forward(self, idx):
        x = self.emb(idx)
        logits = self.router(x)
        vals, sel = torch.topk(logits, 2, dim=-1)
        gates = torch.zeros_like(logits).scatter(-1, sel, F.softmax(vals, -1))
        x = x + sum(gates[..., e:e + 1] * ex(x) for e, ex in enumerate(self.experts))
        s, order = torch.sort(logits, dim=-1, descending=True)
        x = x + 0.1 * s[..., :1] - 0.1 * s[..., -1:] + 0.1 * self.emb(order[..., -1])
        low, lowi = torch.topk(x[..., :8], 3, dim=-1, largest=False)
        x = x + 0.1 * low.sum(-1, keepdim=True) + 0.05 * lowi.float().mean(-1, keepdim=True)
        g = torch.gather(x, -1, torch.argsort(x[..., :6], dim=-1))
        x = x + 0.1 * g.mean(-1, keepdim=True) + 0.05 * g[..., :1]
        x = x.scatter_add(-1, lowi, 0.2 * low)
        back = torch.gather(x, 1, sel[..., :1].expand(-1, -1, C)[:, :4])  # 4 positions' rows
        x = x + 0.1 * back.mean(1, keepdim=True)
        x = x + 0.1 * x[:, -1:].detach() + 0.1 * (x[:, 0] + x[:, -1]).unsqueeze(1)  # pooling
        return self.out(x)


def make_ops6():
    torch.manual_seed(82)
    return OpsNet6()


class OpsNet7(nn.Module):
    """nn.LSTM and nn.GRU (batch_first), whose weights the modules read through their own
    _flat_weights lists (the trace captures them as constants: hp_export maps them back to the
    parameters), whose cells write sigmoid_/tanh_/add_ into the pieces of their unsafe_split
    gates and whose output GRU turns with transpose_; and in-place ops on fresh values
    (sigmoid_, tanh_, relu_, silu_, exp_, neg_, clamp_, mul_/add_ of a scalar, transpose_).
    Exported with autodiff="hp" only: torch's traced backward gives the LSTM no gradient."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.rnn = nn.LSTM(C, C, batch_first=True)
        self.gru = nn.GRU(C, C, batch_first=True)
        self.out = nn.Linear(C, V)

    def forward(self, idx):
        x = self.emb(idx)
        h = self.rnn(x)[0] + self.gru(x)[0]
        t = x * 1.0
        t.transpose_(1, 2)
        x = x + 0.1 * t.transpose(1, 2)
        y = x.clone()
        y.mul_(2.0).add_(0.5).sigmoid_()
        z = h.clone()
        z.tanh_()
        w = x.clone()
        w.clamp_(-1, 1)
        w.relu_()
        v = x.clone()
        v.neg_()
        v.exp_()
        u = h * 1.0
        F.silu(u, inplace=True)
        g = x * 1.0
        F.relu(g, inplace=True)
        return self.out(x + h + 0.5 * y + z + w + 0.01 * v + u + 0.1 * g)


def make_ops7():
    torch.manual_seed(83)
    return OpsNet7()


class InPlaceThroughView(nn.Module):
    """x's view written in place, then x read: the functional form would miss the write."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.out = nn.Linear(C, V)

    def forward(self, idx):
        x = self.emb(idx) * 1.0
        y = x.view(B, T, 2, C // 2)[:, :, 0]
        y.mul_(2.0)
        return self.out(x)


class FrozenViewNet(nn.Module):
    """A view of a parameter kept aside at construction: the trace captures it as a constant."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.out = nn.Linear(C, V)
        self.rows = [self.out.weight.data[:4]]

    def forward(self, idx):
        x = self.emb(idx)
        return self.out(x) + (x @ self.rows[0].t()).sum(-1, keepdim=True)


class OpsNet8(nn.Module):
    """Convolutions and pooling (client/hp_export/aten_conv.py): a causal depthwise Conv1d
    with kernel 4 (Mamba's), a Conv1d pair with padding, dilation 2 and 4 groups, a Conv2d
    stack over [B, 1, T, C] (3x3 with bias; then 3x2, stride (2, 1), dilation (1, 2), 2
    groups, no bias); avg and max pooling in 1-d and 2-d (padded, strided, dilated, without
    count_include_pad) and adaptive average pooling; with the backwards torch records."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.dw = nn.Conv1d(C, C, 4, groups=C, padding=3)
        self.a = nn.Conv1d(C, 2 * C, 3, padding=1)
        self.b = nn.Conv1d(2 * C, C, 5, padding=4, dilation=2, groups=4)
        self.c1 = nn.Conv2d(1, 4, 3, padding=1)
        self.c2 = nn.Conv2d(4, 4, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2),
                            groups=2, bias=False)
        self.out = nn.Linear(C, V)

    def forward(self, idx):
        x = self.emb(idx)
        h = x.transpose(1, 2)
        x = x + F.silu(self.dw(h)[..., :T]).transpose(1, 2)
        x = x + 0.5 * self.b(F.silu(self.a(x.transpose(1, 2)))).transpose(1, 2)
        y = self.c2(F.gelu(self.c1(x.unsqueeze(1))))  # [B, 4, T/2, C-2]
        y = y.mean(1).repeat_interleave(2, 1)
        x = x + 0.3 * F.pad(y, (0, 2))
        h, q = x.transpose(1, 2), x.unsqueeze(1)  # [B, C, T], [B, 1, T, C]
        a = F.avg_pool1d(h, 2).repeat_interleave(2, -1)
        m = F.max_pool1d(h, 4, 2, 1).repeat_interleave(2, -1)[..., :T]
        x = x + 0.3 * (a + m).transpose(1, 2) + 0.3 * F.max_pool2d(q, 3, 1, 1).squeeze(1)
        x = x + 0.3 * F.avg_pool2d(q, 3, 1, 1, count_include_pad=False).squeeze(1)
        d = F.adaptive_avg_pool2d(q, (4, 8)).squeeze(1)
        x = x + 0.2 * d.repeat_interleave(4, 1).repeat_interleave(4, 2)
        f = F.max_pool2d(q, (2, 2), dilation=(1, 2), stride=(2, 2), padding=(0, 1)).squeeze(1)
        return self.out(x + 0.1 * f.repeat_interleave(2, 1).mean(-1, keepdim=True))


def make_ops8():
    torch.manual_seed(84)
    return OpsNet8()


def make_ops5():
    torch.manual_seed(81)
    return OpsNet5()


def make_ops4():
    torch.manual_seed(80)
    return OpsNet4()


class ConvNet(nn.Module):
    """A transposed convolution: refused (aten_conv.py composes the forward kind)."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, 8)
        self.conv = nn.ConvTranspose2d(1, 4, 3, padding=1)
        self.head = nn.Linear(32, V)

    def forward(self, idx):
        x = self.conv(self.emb(idx).unsqueeze(1))
        b, c, t, d = x.shape
        return self.head(x.permute(0, 2, 1, 3).reshape(b, t, c * d))


def _mix64(x):  # splitmix64's finalizer (worker/data.c)
    x ^= x >> 30
    x = (x * 0xbf58476d1ce4e5b9) & M64
    x ^= x >> 27
    x = (x * 0x94d049bb133111eb) & M64
    return x ^ (x >> 31)


def hp_window(seed, n_windows, e, i):
    """The window hp's loader reads as sample i of epoch e (worker/data.c's window_of)."""
    bits = 0
    while bits < 62 and (1 << bits) < n_windows:
        bits += 1
    half = 1 if bits < 2 else (bits + 1) // 2
    mask = (1 << half) - 1
    key = _mix64(seed ^ _mix64((e + 0x68705f64617461) & M64))
    x = i
    while True:
        l, r = x >> half, x & mask
        for rnd in range(6):
            f = _mix64(r ^ _mix64((key + rnd * 0x9e3779b97f4a7c15) & M64)) & mask
            l, r = r, l ^ f
        x = l << half | r
        if x < n_windows:
            return x


def hp_batch(d, step):
    """Step `step`'s (1-based) batch in hp's sample order: with dropout the rows matter, since
    hp's mask is drawn at each element's index in hp's batch."""
    with open(d + "/tokens.bin", "rb") as f:
        buf = f.read()
    n = struct.unpack("<256i", buf[:1024])[2]
    toks = torch.tensor(struct.unpack("<%dH" % n, buf[1024:1024 + 2 * n]), dtype=torch.int64)
    ws = [hp_window(HP_SEED, B, ((step - 1) * B + b) // B, ((step - 1) * B + b) % B)
          for b in range(B)]
    x = torch.stack([toks[w * T:w * T + T] for w in ws])
    y = torch.stack([toks[w * T + 1:w * T + T + 1] for w in ws])
    return x, y


def batch(d):
    with open(d + "/tokens.bin", "rb") as f:
        buf = f.read()
    n = struct.unpack("<256i", buf[:1024])[2]
    toks = torch.tensor(struct.unpack("<%dH" % n, buf[1024:1024 + 2 * n]), dtype=torch.int64)
    x = torch.stack([toks[k * T:k * T + T] for k in range(B)])
    y = torch.stack([toks[k * T + 1:k * T + T + 1] for k in range(B)])
    return x, y


def smoothed_loss(eps):
    """Cross entropy with label smoothing: torch 1.13 records its ignore_index handling with
    index_put_, masked_select and (backward) masked_scatter."""
    def loss(logits, labels):
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                               label_smoothing=eps)
    return loss


def loss_3d(logits, labels):
    """Cross entropy over [B, V, T] scores (the class dim second): torch's nll_loss2d."""
    return F.cross_entropy(logits.transpose(1, 2), labels)


def loss_3d_none(logits, labels):
    """The same per position (reduction='none'), then their mean."""
    return F.cross_entropy(logits.transpose(1, 2), labels, reduction="none").mean()


def gather_loss(logits, labels):
    """The mean log-likelihood picked with gather (per-token log-probabilities, as RL and
    preference losses take them), plus a little of the probabilities picked the same way."""
    logp = F.log_softmax(logits, dim=-1)
    picked = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    p = torch.gather(logp.exp(), 2, labels[..., None])
    return -picked.mean() - 0.1 * p.mean()


LOSSES = {"--sum-loss": None, "--loss-3d": loss_3d, "--loss-3d-none": loss_3d_none,
          "--gather-loss": gather_loss}


def sum_loss(logits, labels):
    """The mean cross entropy written as a sum over the batch (reduction='sum') over B·T."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                           reduction="sum") / labels.numel()


def do_export(d, autodiff, flags):
    name, attn = autodiff, Attention
    if flags[:1] == ["--as"]:
        name, flags = flags[1], flags[2:]
    if flags[:1] == ["--bias-buffer"]:  # nanoGPT's registered causal mask
        attn, flags = BiasAttention, flags[1:]
    if flags[:1] == ["--mha"]:  # nn.MultiheadAttention with an additive mask buffer
        attn, flags = MhaAttention, flags[1:]
    if flags[:1] == ["--mha-forward-mask"]:  # the same mask made in forward (triu)
        attn, flags = MhaForwardMask, flags[1:]
    global DROPOUT, NATIVE_DROPOUT
    if flags[:1] == ["--dropout"]:
        DROPOUT, flags = float(flags[1]), flags[2:]
    if flags[:1] == ["--native-dropout"]:
        NATIVE_DROPOUT, flags = True, flags[1:]
    model = None
    if flags[:1] == ["--ops"]:  # OpsNet instead of the GPT
        model, flags = make_ops(), flags[1:]
    if flags[:1] == ["--ops2"]:  # OpsNet2 instead of the GPT
        model, flags = make_ops2(), flags[1:]
    if flags[:1] == ["--ops3"]:  # OpsNet3 instead of the GPT
        model, flags = make_ops3(), flags[1:]
    if flags[:1] == ["--ops4"]:  # OpsNet4 instead of the GPT
        model, flags = make_ops4(), flags[1:]
    if flags[:1] == ["--ops5"]:  # OpsNet5 instead of the GPT
        model, flags = make_ops5(), flags[1:]
    if flags[:1] == ["--ops6"]:  # OpsNet6 instead of the GPT
        model, flags = make_ops6(), flags[1:]
    if flags[:1] == ["--ops7"]:  # OpsNet7 instead of the GPT
        model, flags = make_ops7(), flags[1:]
    if flags[:1] == ["--ops8"]:  # OpsNet8 instead of the GPT
        model, flags = make_ops8(), flags[1:]
    half = flags[:1] == ["--bf16"]  # the model in bf16, as model.to(torch.bfloat16) makes it
    if half:
        flags = flags[1:]
    loss = hp_export.default_loss
    if flags[:1] == ["--label-smoothing"]:
        loss, flags = smoothed_loss(float(flags[1])), flags[2:]
    if flags[:1] and flags[0] in LOSSES:
        loss, flags = LOSSES[flags[0]] or sum_loss, flags[1:]
    x = torch.zeros(B, T, dtype=torch.int64)
    model = model or make(attn)
    if half:
        model = model.to(torch.bfloat16)
    hp_export.export(model, (x, x.clone()), loss,
                     out="%s/job-%s.pb" % (d, name), weights=d + "/init.safetensors",
                     autodiff=autodiff, hpctl=os.environ.get("HPCTL"),
                     train={"lr": LR, "warmup": WARMUP, "weight_decay": WD, "grad_clip": CLIP,
                            "log_interval": 1},
                     extra_args=flags)


def do_train(d, steps, flags=()):
    global DROPOUT, HP_MASK
    attn, ops = Attention, None
    if list(flags[:1]) == ["--mha"]:
        attn, flags = MhaAttention, flags[1:]
    if list(flags[:1]) == ["--ops"]:
        ops, flags = make_ops, flags[1:]
    if list(flags[:1]) == ["--ops2"]:
        ops, flags = make_ops2, flags[1:]
    if list(flags[:1]) == ["--ops3"]:
        ops, flags = make_ops3, flags[1:]
    if list(flags[:1]) == ["--ops4"]:
        ops, flags = make_ops4, flags[1:]
    if list(flags[:1]) == ["--ops5"]:
        ops, flags = make_ops5, flags[1:]
    if list(flags[:1]) == ["--ops6"]:
        ops, flags = make_ops6, flags[1:]
    if list(flags[:1]) == ["--ops7"]:
        ops, flags = make_ops7, flags[1:]
    if list(flags[:1]) == ["--ops8"]:
        ops, flags = make_ops8, flags[1:]
    if list(flags[:1]) == ["--dropout"]:  # with hp's masks
        DROPOUT, HP_MASK = float(flags[1]), True
    loss_fn = hp_export.default_loss
    if list(flags[:1]) == ["--label-smoothing"]:
        loss_fn = smoothed_loss(float(flags[1]))
    if list(flags[:1]) and flags[0] in LOSSES:
        loss_fn = LOSSES[flags[0]] or sum_loss
    m = ops() if ops else make(attn)
    for name, mod in m.named_modules():
        if isinstance(mod, HpMaskDropout):
            mod.fqn = name + "#0"
    w, _ = safetensors.load(d + "/init.safetensors")
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(w[n])
    params = [p for _, p in m.named_parameters()]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=WD,
                            foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, adamw_ref.build_lambda(steps, WARMUP, -1, "linear", 0.0))
    x, y = batch(d)
    os.makedirs(d + "/ref", exist_ok=True)
    with open(d + "/ref/metrics.jsonl", "w") as f:
        for s in range(steps):
            HP_STEP[0] = s + 1
            if HP_MASK:
                x, y = hp_batch(d, s + 1)
            opt.zero_grad()
            loss = loss_fn(m(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, CLIP)
            opt.step()
            sched.step()
            f.write(json.dumps({"step": s + 1, "loss": loss.item()}) + "\n")
    safetensors.save(d + "/ref/model.safetensors",
                     {n: p.detach() for n, p in m.named_parameters()}, {"format": "pt"})


class LongSortNet(nn.Module):
    """A sort along T·C = 512 entries: more rounds than aten_select composes."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.out = nn.Linear(C, V)

    def forward(self, idx):
        x = self.emb(idx)
        s = torch.sort(x.flatten(1), -1).values.view(x.shape)
        return self.out(x + 0.1 * s)


def do_conv(d, model=ConvNet, autodiff="torch"):
    x = torch.zeros(B, T, dtype=torch.int64)
    try:
        hp_export.export(model(), (x, x.clone()), out=d + "/conv.pb", autodiff=autodiff,
                         hpctl=os.environ.get("HPCTL"))
    except hp_export.ExportError as e:
        print(e)
        return 1
    return 0


# ---- the Llama, torchtitan's FQNs ---------------------------------------------------------

LV, LDIM, LNH, LNKV, LL, LFFN = V, 64, 4, 2, 2, 96
LEPS, LTHETA = 1e-5, 500000.0


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + LEPS)).type_as(x) * self.weight


def precompute_freqs(dim, end, theta):
    """torchtitan's precompute_freqs_cis as (cos, sin) of its angles."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    f = torch.outer(torch.arange(end, dtype=torch.float32), freqs)
    return torch.cos(f), torch.sin(f)


def apply_rotary_emb(x, cos, sin):
    """torchtitan's rotation of adjacent pairs (x[2i], x[2i+1]) by position * freqs[i]."""
    b, t, h, d = x.shape
    a, c = x.float().reshape(b, t, h, d // 2, 2).unbind(-1)
    cos, sin = cos[:t].view(1, t, 1, d // 2), sin[:t].view(1, t, 1, d // 2)
    out = torch.stack((a * cos - c * sin, a * sin + c * cos), dim=-1)
    return out.flatten(3).type_as(x)


def repeat_kv(x, n_rep):
    bs, slen, n_kv, hd = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, slen, n_kv, n_rep, hd).reshape(bs, slen, n_kv * n_rep, hd)


class LlamaAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.hd = LDIM // LNH
        self.wq = nn.Linear(LDIM, LNH * self.hd, bias=False)
        self.wk = nn.Linear(LDIM, LNKV * self.hd, bias=False)
        self.wv = nn.Linear(LDIM, LNKV * self.hd, bias=False)
        self.wo = nn.Linear(LNH * self.hd, LDIM, bias=False)

    def forward(self, x, cos, sin):
        bs, t, _ = x.shape
        xq = self.wq(x).view(bs, t, LNH, self.hd)
        xk = self.wk(x).view(bs, t, LNKV, self.hd)
        xv = self.wv(x).view(bs, t, LNKV, self.hd)
        xq, xk = apply_rotary_emb(xq, cos, sin), apply_rotary_emb(xk, cos, sin)
        keys, values = repeat_kv(xk, LNH // LNKV), repeat_kv(xv, LNH // LNKV)
        q, k, v = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        return self.wo((att @ v).transpose(1, 2).contiguous().view(bs, t, -1))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(LDIM, LFFN, bias=False)
        self.w2 = nn.Linear(LFFN, LDIM, bias=False)
        self.w3 = nn.Linear(LDIM, LFFN, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention, self.feed_forward = LlamaAttention(), FeedForward()
        self.attention_norm, self.ffn_norm = RMSNorm(LDIM), RMSNorm(LDIM)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(LV, LDIM)
        cos, sin = precompute_freqs(LDIM // LNH, T, LTHETA)
        self.register_buffer("freqs_cos", cos)
        self.register_buffer("freqs_sin", sin)
        self.layers = nn.ModuleDict({str(i): TransformerBlock() for i in range(LL)})
        self.norm = RMSNorm(LDIM)
        self.output = nn.Linear(LDIM, LV, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cos, self.freqs_sin)
        return self.output(self.norm(h))


def make_llama():
    torch.manual_seed(7)
    m = Llama()
    with torch.no_grad():  # non-trivial norms, so their gradients are tested too
        for n, p in m.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn(p.shape))
    return m


def do_llama(d, autodiff, flags):
    x = torch.zeros(B, T, dtype=torch.int64)
    hp_export.export(make_llama(), (x, x.clone()), hp_export.default_loss,
                     out="%s/job-llama-%s.pb" % (d, autodiff), weights=d + "/llama.safetensors",
                     autodiff=autodiff, hpctl=os.environ.get("HPCTL"),
                     train={"lr": LR, "warmup": WARMUP, "weight_decay": WD, "grad_clip": CLIP,
                            "log_interval": 1},
                     extra_args=flags)


def main():
    torch.set_num_threads(1)
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "export":
        do_export(d, sys.argv[3], sys.argv[4:])
    elif mode == "train":
        do_train(d, int(sys.argv[3]), sys.argv[4:])
    elif mode == "conv":
        return do_conv(d)
    elif mode == "longsort":
        return do_conv(d, LongSortNet)
    elif mode == "refused":  # refused DIR MODEL AUTODIFF: must fail
        return do_conv(d, {"lstm": make_ops7, "inplace-view": InPlaceThroughView,
                           "param-view": FrozenViewNet}[sys.argv[3]], sys.argv[4])
    elif mode == "llama":
        do_llama(d, sys.argv[3], sys.argv[4:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
