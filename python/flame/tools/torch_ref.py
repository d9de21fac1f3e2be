"""PyTorch implementation of the flame architecture family (docs/model-format.md), for
training and for checking libflame.

`FlameModel(config)` builds every option of the format. Its parameter names are the
format's canonical tensor names, so `flame.export(model, path)` writes its state_dict as
is, and `FlameModel.from_file` loads any flame model file back.

Batched inputs (what training uses):
  history          int64 [B, L], left-padded: user b's n_b items, oldest first, fill the
                   last n_b columns (the padding value is ignored). L <= max_len; wider
                   windows keep their last max_len columns.
  history_lengths  int64 [B] (n_b); None = every row full.
  candidates       int64 [B, M]. Under the sumi head candidates never see each other, so
                   padding candidates cost compute but change no other score.
  history_side / candidate_side: per side-feature slot an int64 [B, L, K] / [B, M, K]
                   tensor of bag ids, -1 marking empty entries (K = largest bag).
`forward` returns logits [B, M, num_tasks] (pre-sigmoid for sumi, the dot product for dot);
`predict` applies the sigmoid of the sumi head, giving what flame_score returns.
Attention runs over real tokens only, as the format says: padding is masked out of every
real query's keys, so results do not depend on L.
"""
from __future__ import annotations

import json
import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

try:
    import torch
    from torch import nn
    import torch.nn.functional as F
except ImportError as e:  # the rest of the package works without torch
    raise ImportError(f"flame.torch_ref needs PyTorch ({e}): pip install torch, or pip install './python[torch]'") from e

from . import layout, quant, st_io


def activation(kind: str, x: torch.Tensor) -> torch.Tensor:
    if kind == "gelu_erf":
        return F.gelu(x)
    if kind == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if kind == "relu":
        return F.relu(x)
    raise ValueError(f"unknown activation {kind!r}")


class LayerNorm(nn.Module):
    """LayerNorm with the format's two eps placements (biased variance, then weight, bias)."""

    def __init__(self, d: int, eps: float, eps_inside_sqrt: bool):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))
        self.eps, self.inside = eps, eps_inside_sqrt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inside:
            return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
        mu = x.mean(-1, keepdim=True)
        var = (x - mu).pow(2).mean(-1, keepdim=True)
        return (x - mu) / (var.sqrt() + self.eps) * self.weight + self.bias


# Fused attention kernels that also return each query's log-sum-exp (natural log, float32), by
# device, fastest first: PyTorch's private entry points behind scaled_dot_product_attention
# (the public call does not return it). Which one works is found by select_lse_kernel.
def _lse_kernels(device: torch.device):
    ops = torch.ops.aten
    if device.type == "cuda":
        return [("cudnn", lambda q, k, v: ops._scaled_dot_product_cudnn_attention(q, k, v, None, True)[:2]),
                ("flash", lambda q, k, v: ops._scaled_dot_product_flash_attention(q, k, v)[:2])]
    return [("flash_cpu", lambda q, k, v: ops._scaled_dot_product_flash_attention_for_cpu(q, k, v)[:2])]


def sumi_attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, L: int, lse_kernel) -> torch.Tensor:
    """SUMI attention of q, k, v [B, H, T, dh] (the first L tokens the history) by two fused
    calls and no mask: the history's causal attention, and the candidates' over the history
    with its log-sum-exp, into which each candidate's own key is merged:
      lse' = logaddexp(lse, s),  o' = o exp(lse - lse') + v_self exp(s - lse'),
    s = q . k_self / sqrt(dh) (the online softmax's merge of two key sets, FlashAttention)."""
    B, H, T, dh = q.shape
    M = T - L
    parts = []
    if L:
        parts.append(F.scaled_dot_product_attention(q[:, :, :L], k[:, :, :L], v[:, :, :L], is_causal=True))
    if M:
        qc, kc, vc = q[:, :, L:], k[:, :, L:], v[:, :, L:]
        s = (qc.float() * kc.float()).sum(-1) / math.sqrt(dh)  # [B, H, M]
        if L:
            oc, lse = lse_kernel(qc, k[:, :, :L], v[:, :, :L])
            lse = lse.reshape(B, H, -1)[..., :M].float()
            both = torch.logaddexp(lse, s)
            oc = oc.float() * torch.exp(lse - both)[..., None] + vc.float() * torch.exp(s - both)[..., None]
        else:  # no history: each candidate sees itself alone
            oc = vc.float()
        parts.append(oc.to(q.dtype))
    return torch.cat(parts, 2)


def select_lse_kernel(device, dtype: torch.dtype, head_dim: int):
    """The first of _lse_kernels(device) that runs for this dtype and head dim and whose
    sumi_attention_lse matches an explicitly masked float32 attention on random inputs
    (relative error below 1e-2): (name, kernel), or None. Runs eagerly (not under compile)."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(0)
    B, H, L, M = 2, 2, 37, 5
    qkv = torch.randn(3, B, L + M, H, head_dim, generator=g)
    q, k, v = (t.to(device, dtype).transpose(1, 2) for t in qkv)  # the model's strided views
    i, j = torch.arange(L + M)[:, None], torch.arange(L + M)[None, :]
    mask = ((j < L) & ((j <= i) | (i >= L)) | (i == j)).to(device)
    q32, k32, v32 = q.float(), k.float(), v.float()
    logits = (q32 @ k32.transpose(-1, -2) / math.sqrt(head_dim)).masked_fill(~mask, float("-inf"))
    ref = torch.softmax(logits, -1) @ v32
    for name, fn in _lse_kernels(device):
        try:
            got = sumi_attention_lse(q, k, v, L, fn).float()
        except (RuntimeError, AttributeError, TypeError, NotImplementedError, ValueError):
            continue
        err = ((got - ref).norm() / ref.norm()).item()
        if err < 1e-2:  # (NaN fails this too)
            return name, fn
    return None


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.heads = heads

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor], sumi_len: Optional[int] = None,
                lse_kernel=None) -> torch.Tensor:
        """x [B, T, d]; mask [B, T, T] bool, True = key visible (every row has one). With
        sumi_len = L (no padding, the first L tokens the history, the rest candidates) the mask
        is the SUMI one and is not needed: two fused SDPA calls compute it, the history's
        causal attention and the candidates' over [history, candidates] with a mask that keeps
        each candidate's own key only (what a PyTorch user would write), or, given an
        lse_kernel (select_lse_kernel), the candidates' over the history alone with their own
        keys merged through the log-sum-exp (sumi_attention_lse: no mask, the fastest form)."""
        B, T, d = x.shape
        split = lambda a: a.view(B, T, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        if sumi_len is not None and lse_kernel is not None:
            a = sumi_attention_lse(q, k, v, sumi_len, lse_kernel)
            return self.o(a.transpose(1, 2).reshape(B, T, d))
        if sumi_len is not None:
            L = sumi_len
            parts = []
            if L:
                parts.append(F.scaled_dot_product_attention(q[:, :, :L], k[:, :, :L], v[:, :, :L], is_causal=True))
            if T > L:
                i = torch.arange(T - L, device=x.device)[:, None]
                j = torch.arange(T, device=x.device)[None, :]
                cmask = (j < L) | (j - L == i)  # [M, T]: the whole history and itself
                parts.append(F.scaled_dot_product_attention(q[:, :, L:], k, v, attn_mask=cmask))
            a = torch.cat(parts, 2)
            return self.o(a.transpose(1, 2).reshape(B, T, d))
        logits = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        logits = logits.masked_fill(~mask[:, None], float("-inf"))
        a = torch.softmax(logits, -1) @ v
        return self.o(a.transpose(1, 2).reshape(B, T, d))


class FFN(nn.Module):
    def __init__(self, d: int, ffn_dim: int, act: str):
        super().__init__()
        self.fc1, self.fc2, self.act = nn.Linear(d, ffn_dim), nn.Linear(ffn_dim, d), act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(activation(self.act, self.fc1(x)))


class Block(nn.Module):
    def __init__(self, cfg: Mapping[str, Any], dropout: float):
        super().__init__()
        d, b, ln = cfg["d_model"], cfg["blocks"], cfg["layernorm"]
        self.attn = Attention(d, b["num_heads"])
        self.ln1 = LayerNorm(d, ln["eps"], ln["eps_inside_sqrt"])
        self.ln2 = LayerNorm(d, ln["eps"], ln["eps_inside_sqrt"])
        self.ffn = FFN(d, b["ffn_dim"], b["activation"])
        self.pre = b["norm"] == "pre"
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor], sumi_len: Optional[int] = None,
                lse_kernel=None) -> torch.Tensor:
        if self.pre:
            x = x + self.drop(self.attn(self.ln1(x), mask, sumi_len, lse_kernel))
            return x + self.drop(self.ffn(self.ln2(x)))
        x = self.ln1(x + self.drop(self.attn(x, mask, sumi_len, lse_kernel)))
        return self.ln2(x + self.drop(self.ffn(x)))


class TaskHead(nn.Module):
    """MLP d_model -> hidden... -> 1; the activation between layers, none after the last."""

    def __init__(self, d: int, task: Mapping[str, Any]):
        super().__init__()
        widths = [d] + list(task["hidden"]) + [1]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.act = task["activation"]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = activation(self.act, h)
        return h[..., 0]


class Tables(nn.Module):
    """The embedding tables by name. Registered straight in _modules so that any table name
    (also "pop", "forward", ...) works; state_dict keys are tables.{name}.weight."""

    def __init__(self, tables):
        super().__init__()
        for t in tables:
            if "." in t["name"] or not t["name"]:
                raise ValueError(f"table name {t['name']!r} cannot be a torch module name (empty or has '.')")
            self._modules[t["name"]] = nn.Embedding(t["rows"], t["dim"])

    def __getitem__(self, name: str) -> nn.Embedding:
        return self._modules[name]


class FlameModel(nn.Module):
    """The flame architecture of `config` (a flame.config dict). `dropout` (training only,
    not part of the format) applies after the input embedding and on each residual branch."""

    def __init__(self, config: Mapping[str, Any], dropout: float = 0.0):
        super().__init__()
        cfg = layout.with_defaults(json.loads(json.dumps(config)))  # the library's defaults filled in
        layout.check(cfg)
        self.config = cfg
        d, ln = cfg["d_model"], cfg["layernorm"]
        self.tables = Tables(cfg["tables"])
        if cfg["projection"]:
            self.input_proj = nn.Linear(layout.embed_dim(cfg), d)
        if cfg["position"]["rule"] != "none":
            self.position = nn.Embedding(layout.position_rows(cfg), d)
        if cfg["input_layernorm"]:
            self.input_ln = LayerNorm(d, ln["eps"], ln["eps_inside_sqrt"])
        self.blocks = nn.ModuleList(Block(cfg, dropout) for _ in range(cfg["blocks"]["count"]))
        if cfg["final_layernorm"]:
            self.final_ln = LayerNorm(d, ln["eps"], ln["eps_inside_sqrt"])
        self.sumi = cfg["head"]["type"] == "sumi"
        if self.sumi:
            self.heads = nn.ModuleList(TaskHead(d, t) for t in cfg["head"]["tasks"])
        self.drop = nn.Dropout(dropout)
        self.num_side = layout.num_side(cfg)
        # "mask": attention with the explicit [T, T] mask (any padding); "sdpa": under the sumi
        # head and without padding (history_lengths None), two fused SDPA calls instead;
        # "sdpa_lse": the same with the candidates' own keys merged by log-sum-exp (use_sdpa_lse)
        self.attention = "mask"
        self.lse_kernel = None
        for e in self.modules():  # small embeddings train better than N(0, 1)
            if isinstance(e, nn.Embedding):
                nn.init.normal_(e.weight, std=0.02)

    # ------------------------------------------------------------ files

    @classmethod
    def from_file(cls, path) -> "FlameModel":
        """Loads a flame model file (F32/F16/BF16, int8 tables dequantized to float32 as
        libflame computes them) into a new module."""
        meta, tensors, dtypes = st_io.read(path)
        cfg = layout.parse(meta["flame.config"])
        tensors = quant.unpack(cfg, tensors, dtypes, np.float32)
        m = cls(cfg)
        m.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tensors.items()})
        return m

    # ------------------------------------------------------------ forward

    def _embed(self, ids: torch.Tensor, side: Optional[Sequence[torch.Tensor]]) -> torch.Tensor:
        """ids [B, T] -> pooled, combined, projected token vectors [B, T, d]."""
        parts, slot = [], 0
        for f in self.config["features"]:
            table = self.tables[f["table"]]
            if f["input"] == "item":
                parts.append(table(ids))  # a bag of one id: sum and mean agree
                continue
            bag = side[slot]
            slot += 1
            keep = (bag >= 0).unsqueeze(-1)
            v = (table(bag.clamp(min=0)) * keep).sum(-2)
            if f["pooling"] == "mean":
                v = v / keep.sum(-2).clamp(min=1)
            parts.append(v)
        e = sum(parts[1:], parts[0]) if self.config["combine"] == "sum" else torch.cat(parts, -1)
        return self.input_proj(e) if self.config["projection"] else e

    def _check_side(self, side, what):
        if self.num_side and (side is None or len(side) != self.num_side):
            raise ValueError(f"{what}: the model has {self.num_side} side-feature slot(s), "
                             f"got {0 if side is None else len(side)}")
        return side

    def forward(self, history: torch.Tensor, candidates: torch.Tensor,
                history_lengths: Optional[torch.Tensor] = None,
                history_side: Optional[Sequence[torch.Tensor]] = None,
                candidate_side: Optional[Sequence[torch.Tensor]] = None) -> torch.Tensor:
        """Logits [B, M, num_tasks]; see the module docstring for the inputs."""
        cfg, ml = self.config, self.config["max_len"]
        B, L = history.shape
        dev = history.device
        lengths = torch.full((B,), L, dtype=torch.long, device=dev) if history_lengths is None \
            else history_lengths.to(dev).long().clamp(max=L)
        if L > ml:  # the window keeps the most recent max_len items
            history, L = history[:, -ml:], ml
            history_side = None if history_side is None else [s[:, -ml:] for s in history_side]
            lengths = lengths.clamp(max=ml)
        self._check_side(history_side, "history_side")
        slot = torch.arange(L, device=dev)
        valid = slot[None, :] >= (L - lengths)[:, None]  # [B, L]
        x = self._embed(history.masked_fill(~valid, 0), history_side)
        rule = cfg["position"]["rule"]
        if rule != "none":
            x = x + self.history_positions(L, lengths)
        if self.sumi:
            c = self._embed(candidates, self._check_side(candidate_side, "candidate_side"))
            cp = cfg["position"].get("candidate_position", -1)
            if rule != "none" and cp >= 0:
                c = c + self.position.weight[cp]
            x = torch.cat([x, c], 1)
        T = x.shape[1]
        sumi_len, mask = None, None
        if self.attention in ("sdpa", "sdpa_lse") and self.sumi and history_lengths is None:
            sumi_len = L  # no padding: the blocks need no mask
        else:
            # history: causal over real tokens; candidates: all real history and themselves
            # (SUMI); the diagonal keeps padding rows finite (nothing real ever sees them)
            i, j = torch.arange(T, device=dev)[:, None], torch.arange(T, device=dev)[None, :]
            key_real = torch.cat([valid, valid.new_ones(B, T - L)], 1)
            sees_history = (j < L) & ((j <= i) | (i >= L))
            mask = (sees_history[None] & key_real[:, None, :]) | (i == j)[None]
        if cfg["input_layernorm"]:
            x = self.input_ln(x)
        x = self.drop(x)
        for blk in self.blocks:
            x = blk(x, mask, sumi_len, self.lse_kernel[1] if self.attention == "sdpa_lse" else None)
        if self.sumi:
            h = x[:, L:]
            if cfg["final_layernorm"]:
                h = self.final_ln(h)
            return torch.stack([head(h) for head in self.heads], -1)
        h = x[:, L - 1] if L else x.new_zeros(B, cfg["d_model"])
        if cfg["final_layernorm"]:
            h = self.final_ln(h)
        h = h * (lengths > 0)[:, None].to(h.dtype)  # no history, no user state: scores 0
        table = self.tables[cfg["head"]["table"]]
        return (table(candidates) * h[:, None, :]).sum(-1, keepdim=True)

    def history_positions(self, L: int, lengths: torch.Tensor) -> torch.Tensor:
        """The position embeddings of a left-padded window of L slots holding lengths[b] items
        (position rule not "none"): [L, d], or [B, L, d] under from_oldest, whose rows depend
        on the length. History item i of n sits in slot s = L - n + i."""
        rule, ml = self.config["position"]["rule"], self.config["max_len"]
        slot = torch.arange(L, device=lengths.device)
        if rule == "from_oldest":  # row i: slot s - (L - n_b), clamped in the padding
            return self.position((slot[None, :] - (L - lengths)[:, None]).clamp(min=0))
        return self.position(ml - L + slot if rule == "left_padded_slot" else L - 1 - slot)

    def use_sdpa_lse(self, device, dtype: torch.dtype) -> Optional[str]:
        """Attention "sdpa_lse" with the first log-sum-exp kernel that is right on this device
        and dtype (select_lse_kernel; call it eagerly, before torch.compile): its name, or None
        with the attention left as it was where none is."""
        cfg = self.config
        found = select_lse_kernel(device, dtype, cfg["d_model"] // cfg["blocks"]["num_heads"])
        if found is not None:
            self.attention, self.lse_kernel = "sdpa_lse", found
        return found and found[0]

    def predict(self, *args, **kwargs) -> torch.Tensor:
        """What libflame returns: sigmoid(logits) for sumi, the dot product for dot."""
        z = self.forward(*args, **kwargs)
        return torch.sigmoid(z) if self.sumi else z

    # ------------------------------------------------------------ one request, engine-style

    @torch.no_grad()
    def score(self, history, candidates, history_side=None, candidate_side=None) -> np.ndarray:
        """One request in flame.Engine.score's form (int64 ids, CSR side bags); returns
        float32 numpy [num_candidates, num_tasks], to compare with libflame."""
        dev = next(self.parameters()).device
        h = torch.as_tensor(np.asarray(history, dtype=np.int64).reshape(-1), device=dev)
        c = torch.as_tensor(np.asarray(candidates, dtype=np.int64).reshape(-1), device=dev)
        first = max(0, h.numel() - self.config["max_len"])
        hs = None if history_side is None else \
            [padded_bags(o, i, first).to(dev)[None] for o, i in history_side]
        cs = None if candidate_side is None or not self.sumi else \
            [padded_bags(o, i).to(dev)[None] for o, i in candidate_side]
        n = h.numel() - first
        out = self.predict(h[first:][None], c[None], torch.tensor([n], device=dev), hs, cs)[0]
        return out.float().cpu().numpy()


def padded_bags(offsets, ids, first: int = 0) -> torch.Tensor:
    """CSR (offsets, ids) -> int64 [num_tokens - first, K] with -1 for empty entries."""
    offsets, ids = np.asarray(offsets, dtype=np.int64), np.asarray(ids, dtype=np.int64)
    sizes = np.diff(offsets)[first:]
    out = np.full((len(sizes), max(1, int(sizes.max(initial=0)))), -1, dtype=np.int64)
    for j, (a, n) in enumerate(zip(offsets[first:-1], sizes)):
        out[j, :n] = ids[a:a + n]
    return torch.from_numpy(out)


def pad_histories(histories: Sequence[Any], max_len: int) -> "tuple[torch.Tensor, torch.Tensor]":
    """Variable-length histories -> (left-padded int64 [B, L], lengths [B]), keeping each
    user's most recent max_len items; L is the longest kept length (at least 1)."""
    kept = [np.asarray(h, dtype=np.int64)[-max_len:] if len(h) else np.zeros(0, np.int64) for h in histories]
    L = max(1, max((len(h) for h in kept), default=0))
    out = np.zeros((len(kept), L), dtype=np.int64)
    for b, h in enumerate(kept):
        if len(h):
            out[b, L - len(h):] = h
    return torch.from_numpy(out), torch.tensor([len(h) for h in kept], dtype=torch.long)
