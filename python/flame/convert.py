"""Converts other recommenders' checkpoints to the flame format.

    PYTHONPATH=python python3 -m flame.convert iclrec IN.safetensors OUT.safetensors

iclrec: ICLRec / S3-Rec / SASRec-as-in-ICLRec state_dicts (BERT-style post-LN encoder,
left-padded window, dot-product scoring against the item table). Sizes come from the
tensors; the head count is not recorded in a state_dict, hence --num-heads.
Exit status 2 with a message naming the tensor when the state_dict does not fit.
"""
import argparse
import json
import re
import sys

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
    try:
        layout.check(cfg)
    except ValueError as e:
        raise ConvertError(str(e)) from None

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


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m flame.convert", description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=["iclrec"])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--num-heads", type=int, default=2, help="attention heads (not stored in the checkpoint; ICLRec default 2)")
    ap.add_argument("--eps", type=float, default=1e-12, help="LayerNorm eps (ICLRec: 1e-12, inside the sqrt)")
    ap.add_argument("--dtype", choices=st_io.DTYPES, default="F32", help="storage dtype of the output")
    args = ap.parse_args(argv)
    try:
        _, src, _ = st_io.read(args.input)
        cfg, out, dropped = iclrec(src, args.num_heads, args.eps)
    except (ConvertError, ValueError, OSError) as e:
        print(f"flame.convert: {args.input}: {e}", file=sys.stderr)
        return 2
    for name in dropped:
        print(f"flame.convert: note: dropping '{name}' (not used by the forward pass)", file=sys.stderr)
    st_io.write(args.output, out, {"flame.config": json.dumps(cfg)}, args.dtype)
    print(f"flame.convert: wrote {args.output}: d_model {cfg['d_model']}, {cfg['blocks']['count']} block(s), "
          f"{cfg['blocks']['num_heads']} heads, ffn {cfg['blocks']['ffn_dim']}, max_len {cfg['max_len']}, "
          f"{cfg['tables'][0]['rows']} items", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
