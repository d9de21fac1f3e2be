"""Converts other recommenders' checkpoints to the flame format.

    PYTHONPATH=python python3 -m flame.tools.convert iclrec IN.safetensors OUT.safetensors
    PYTHONPATH=python python3 -m flame.tools.convert sasrec IN.pth OUT.safetensors --norm post

iclrec: ICLRec / S3-Rec / SASRec-as-in-ICLRec state_dicts (BERT-style post-LN encoder,
left-padded window, dot-product scoring against the item table).
sasrec: pmixer/SASRec.pytorch state_dicts (python/model.py; see `sasrec` below for what
carries over exactly).
Sizes come from the tensors; what a state_dict does not record (head count, norm placement,
window) comes from options. .pt/.pth inputs need torch; .safetensors inputs do not.
Exit status 2 with a message naming the tensor when the state_dict does not fit.
"""
import argparse
import json
import math
import os
import re
import sys

import numpy as np
import safetensors

from . import layout, st_io


class ConvertError(Exception):
    pass


# flame name (per block) <- ICLRec name, under item_encoder.layer.{i}.
_BLOCK = {
    "attn.q": "attention.query", "attn.k": "attention.key", "attn.v": "attention.value",
    "attn.o": "attention.dense", "ln1": "attention.LayerNorm", "ln2": "intermediate.LayerNorm",
    "ffn.fc1": "intermediate.dense_1", "ffn.fc2": "intermediate.dense_2",
}
_TOP = {"tables.item": "item_embeddings", "position": "position_embeddings", "input_ln": "LayerNorm"}


def _check(cfg):
    """The config a converter built, checked as the loader would (ConvertError on a problem)."""
    try:
        layout.check(cfg)
    except ValueError as e:
        raise ConvertError(str(e)) from None


def _get(src, name):
    if name not in src:
        raise ConvertError(f"missing tensor '{name}'")
    return src[name]


def iclrec(src, num_heads=2, eps=1e-12):
    """({ICLRec name: array}) -> (config, {flame name: array}, [dropped names])."""
    items, d = _get(src, "item_embeddings.weight").shape
    max_len = _get(src, "position_embeddings.weight").shape[0]
    layers = sorted({int(m.group(1)) for k in src if (m := re.match(r"item_encoder\.layer\.(\d+)\.", k))})
    if layers != list(range(len(layers))):
        raise ConvertError(f"item_encoder layers are not numbered 0..n-1: {layers}")
    ffn = _get(src, "item_encoder.layer.0.intermediate.dense_1.weight").shape[0] if layers else 1
    cfg = {
        "format": "flame", "version": 1, "d_model": d, "max_len": max_len,
        "tables": [{"name": "item", "rows": items, "dim": d}],
        "features": [{"name": "item", "table": "item", "input": "item", "pooling": "sum"}],
        "combine": "sum", "projection": False,
        "position": {"rule": "left_padded_slot", "rows": max_len, "candidate_position": -1},
        "input_layernorm": True,
        "blocks": {"count": len(layers), "num_heads": num_heads, "ffn_dim": ffn,
                   "norm": "post", "activation": "gelu_erf"},
        "final_layernorm": False,
        "layernorm": {"eps": eps, "eps_inside_sqrt": True},
        "head": {"type": "dot", "table": "item"},
    }
    _check(cfg)

    names = {f"{k}.{w}": f"{v}.{w}" for k, v in _TOP.items() for w in ("weight", "bias")}
    names.pop("tables.item.bias"), names.pop("position.bias")
    for i in layers:
        for k, v in _BLOCK.items():
            for w in ("weight", "bias"):
                names[f"blocks.{i}.{k}.{w}"] = f"item_encoder.layer.{i}.{v}.{w}"
    out = {}
    for dst, shape in layout.shapes(cfg).items():
        a = _get(src, names[dst])
        if tuple(a.shape) != shape:
            raise ConvertError(f"tensor '{names[dst]}' has shape {list(a.shape)}, expected {list(shape)}")
        out[dst] = a
    used = set(names.values())
    return cfg, out, sorted(k for k in src if k not in used)


def sasrec(src, num_heads=1, norm="post", max_len=None, eps=1e-8):
    """pmixer/SASRec.pytorch (python/model.py, with --norm_first = "pre") -> flame.

    Its names: item_emb, pos_emb (row 0 = padding, real slot s uses row s + 1),
    attention_layernorms.{i}, attention_layers.{i}.in_proj_{weight,bias} (q, k, v stacked) and
    .out_proj, forward_layernorms.{i}, forward_layers.{i}.conv{1,2} (1x1 Conv1d = Linear,
    ReLU between), last_layernorm; LayerNorm eps 1e-8. The input scales item_emb by
    sqrt(d) but scoring uses it unscaled, so the file gets two tables: "item_input" (scaled,
    read by the input feature) and "item" (read by the dot head).

    Exactness: SASRec.pytorch masks attention causally only, so real tokens also attend to
    the window's padding slots; flame attends to real tokens only. Scores are equal for
    histories that fill the window (>= max_len items) and differ for shorter ones. The
    older top-level model.py (queries LN(x), keys and values x) is a different computation
    with the same names and is not supported."""
    items, d = _get(src, "item_emb.weight").shape
    pos = _get(src, "pos_emb.weight")
    max_len = max_len or pos.shape[0] - 1
    if not 1 <= max_len <= pos.shape[0] - 1:
        raise ConvertError(f"max_len {max_len} needs pos_emb rows 1..{max_len}, it has {pos.shape[0]} rows")
    layers = sorted({int(m.group(1)) for k in src if (m := re.match(r"attention_layers\.(\d+)\.", k))})
    if layers != list(range(len(layers))):
        raise ConvertError(f"attention_layers are not numbered 0..n-1: {layers}")
    if norm not in ("pre", "post"):
        raise ConvertError(f"norm must be pre or post, got {norm!r}")
    cfg = {
        "format": "flame", "version": 1, "d_model": d, "max_len": max_len,
        "tables": [{"name": "item_input", "rows": items, "dim": d}, {"name": "item", "rows": items, "dim": d}],
        "features": [{"name": "item", "table": "item_input", "input": "item", "pooling": "sum"}],
        "combine": "sum", "projection": False,
        "position": {"rule": "left_padded_slot", "rows": pos.shape[0] - 1, "candidate_position": -1},
        "input_layernorm": False,
        "blocks": {"count": len(layers), "num_heads": num_heads, "ffn_dim": d, "norm": norm, "activation": "relu"},
        "final_layernorm": True,
        "layernorm": {"eps": eps, "eps_inside_sqrt": True},
        "head": {"type": "dot", "table": "item"},
    }
    _check(cfg)
    emb = _get(src, "item_emb.weight")
    out = {"tables.item_input.weight": emb * np.float32(math.sqrt(d)), "tables.item.weight": emb,
           "position.weight": pos[1:],
           "final_ln.weight": _get(src, "last_layernorm.weight"), "final_ln.bias": _get(src, "last_layernorm.bias")}
    used = {"item_emb.weight", "pos_emb.weight", "last_layernorm.weight", "last_layernorm.bias"}

    def take(dst, name, fn=lambda a: a):
        out[dst] = fn(_get(src, name))
        used.add(name)

    for i in layers:
        p, a = f"blocks.{i}.", f"attention_layers.{i}."
        for j, m in enumerate("qkv"):
            take(p + f"attn.{m}.weight", a + "in_proj_weight", lambda w, j=j: w[j * d:(j + 1) * d])
            take(p + f"attn.{m}.bias", a + "in_proj_bias", lambda b, j=j: b[j * d:(j + 1) * d])
        for w in ("weight", "bias"):
            take(p + f"attn.o.{w}", a + f"out_proj.{w}")
            take(p + f"ln1.{w}", f"attention_layernorms.{i}.{w}")
            take(p + f"ln2.{w}", f"forward_layernorms.{i}.{w}")
        for k in (1, 2):
            take(p + f"ffn.fc{k}.weight", f"forward_layers.{i}.conv{k}.weight",
                 lambda w: w[..., 0] if w.ndim == 3 else w)
            take(p + f"ffn.fc{k}.bias", f"forward_layers.{i}.conv{k}.bias")
    out = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}
    for dst, shape in layout.shapes(cfg).items():
        if tuple(out[dst].shape) != shape:
            raise ConvertError(f"tensor for '{dst}' has shape {list(out[dst].shape)}, expected {list(shape)}")
    return cfg, out, sorted(k for k in src if k not in used)


def read_state_dict(path):
    """{name: float32 array} from a safetensors file, or a torch .pt/.pth state_dict."""
    if str(path).endswith((".pt", ".pth")):
        try:
            import torch
        except ImportError:
            raise ConvertError(f"{path}: reading .pt/.pth files needs torch (or convert it to safetensors)") from None
        sd = torch.load(path, map_location="cpu", weights_only=True)
        sd = sd.get("state_dict", sd)
        return {k: v.detach().float().numpy() for k, v in sd.items() if hasattr(v, "detach")}
    return st_io.read(path)[1]


def _from_filename(path, key):
    """SASRec.pytorch names its checkpoints ...head=1.hidden=50.maxlen=200.pth."""
    m = re.search(rf"[.]{key}=(\d+)", os.path.basename(str(path)))
    return int(m.group(1)) if m else None


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m flame.tools.convert", description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=["iclrec", "sasrec"])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--num-heads", type=int, help="attention heads (not stored in the checkpoint; default: ICLRec 2, "
                    "SASRec.pytorch head=N in the file name, else 1)")
    ap.add_argument("--eps", type=float, help="LayerNorm eps (ICLRec 1e-12, SASRec.pytorch 1e-8; inside the sqrt)")
    ap.add_argument("--norm", choices=["pre", "post"], default="post",
                    help="sasrec: 'pre' if trained with --norm_first, else 'post' (its default)")
    ap.add_argument("--max-len", type=int, help="sasrec: the --maxlen it was trained with (default: maxlen=N in the "
                    "file name, else pos_emb rows - 1)")
    ap.add_argument("--dtype", choices=st_io.DTYPES, default="F32", help="storage dtype of the output")
    args = ap.parse_args(argv)
    # a 0 given is refused, not taken for "not given" (the default)
    for flag, v in (("--num-heads", args.num_heads), ("--max-len", args.max_len)):
        if v is not None and v < 1:
            print(f"flame.tools.convert: {flag} {v} must be at least 1", file=sys.stderr)
            return 2
    try:
        src = read_state_dict(args.input)
        if args.kind == "iclrec":
            cfg, out, dropped = iclrec(src, 2 if args.num_heads is None else args.num_heads,
                                       1e-12 if args.eps is None else args.eps)
        else:
            heads = args.num_heads if args.num_heads is not None else _from_filename(args.input, "head") or 1
            max_len = args.max_len if args.max_len is not None else _from_filename(args.input, "maxlen")
            cfg, out, dropped = sasrec(src, heads, args.norm, max_len, 1e-8 if args.eps is None else args.eps)
    except (ConvertError, ValueError, OSError, safetensors.SafetensorError) as e:
        print(f"flame.tools.convert: {args.input}: {e}", file=sys.stderr)
        return 2
    for name in dropped:
        print(f"flame.tools.convert: note: dropping '{name}' (not used by the forward pass)", file=sys.stderr)
    try:
        st_io.write(args.output, out, {"flame.config": json.dumps(cfg)}, args.dtype)
    except (ValueError, OSError, safetensors.SafetensorError) as e:
        print(f"flame.tools.convert: {args.output}: {e}", file=sys.stderr)
        return 2
    print(f"flame.tools.convert: wrote {args.output}: d_model {cfg['d_model']}, {cfg['blocks']['count']} block(s), "
          f"{cfg['blocks']['num_heads']} heads, ffn {cfg['blocks']['ffn_dim']}, max_len {cfg['max_len']}, "
          f"{cfg['tables'][-1]['rows']} items", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
