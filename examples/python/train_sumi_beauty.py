"""Trains a multi-task SUMI ranking model on Amazon Beauty in PyTorch, exports it as a flame
model file, and evaluates it with PyTorch and with libflame (through the flame package):
AUC per task and HR@10 of the "next" task must agree to 4 decimals.

    python3 examples/python/train_sumi_beauty.py --data ../shared/data/amazon-beauty/Beauty.txt \\
        --out build/beauty-sumi.flame --steps 300                   # CPU, a few minutes
    ... --device cuda --steps 8000 --batch 512                       # GPU

Prints one JSON line with both evaluations; exits 1 if they disagree. Problem set-up:
beauty_data.py; the model: the config below (docs/model-format.md).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "python")]  # beauty_data, and flame from this checkout

import torch  # noqa: E402

import flame  # noqa: E402
from flame.tools import torch_ref  # noqa: E402
from beauty_data import POP_BUCKETS, Beauty  # noqa: E402
from metrics import auc, hit_rate  # noqa: E402

TASKS = ("next", "next3")


def model_config(num_items, d=64, max_len=50, blocks=2, heads=2):
    return {
        "format": "flame", "version": 1, "d_model": d, "max_len": max_len,
        "tables": [{"name": "item", "rows": num_items, "dim": d}, {"name": "pop", "rows": POP_BUCKETS, "dim": d}],
        "features": [{"name": "item", "table": "item", "input": "item", "pooling": "sum"},
                     {"name": "pop", "table": "pop", "input": "side", "pooling": "sum"}],
        "combine": "sum", "projection": False,
        # candidates get their own position row (max_len), apart from every history slot
        "position": {"rule": "left_padded_slot", "rows": max_len + 1, "candidate_position": max_len},
        "input_layernorm": True,
        "blocks": {"count": blocks, "num_heads": heads, "ffn_dim": 4 * d, "norm": "pre", "activation": "gelu_erf"},
        "final_layernorm": True,
        "layernorm": {"eps": 1e-6, "eps_inside_sqrt": True},
        "head": {"type": "sumi", "tasks": [{"name": t, "hidden": [d], "activation": "relu"} for t in TASKS]},
    }


def tensors(data, hists, cand, max_len, device):
    """Torch inputs of a batch: padded histories, candidates and the popularity side slot."""
    h, lens = torch_ref.pad_histories(hists, max_len)
    c = torch.as_tensor(cand)
    hs = torch.as_tensor(data.pop)[h].masked_fill(h == 0, -1)[..., None]  # [B, L, 1]; padding = empty bag
    cs = torch.as_tensor(data.pop)[c][..., None]
    return [x.to(device) for x in (h, c, lens)] + [[hs.to(device)], [cs.to(device)]]


def train(model, data, args):
    rng = np.random.default_rng(args.seed)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    model.train()
    t0, ml = time.time(), model.config["max_len"]
    for step in range(1, args.steps + 1):
        hists, cand, labels = data.train_batch(rng, args.batch, args.negatives, ml)
        h, c, lens, hs, cs = tensors(data, hists, cand, ml, args.device)
        logits = model(h, c, lens, hs, cs)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.as_tensor(labels, device=args.device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % max(1, args.steps // 10) == 0 or step == args.steps:
            print(f"step {step}/{args.steps} loss {loss.item():.4f} ({time.time() - t0:.0f} s)", file=sys.stderr)


def evaluate(per_user_scores, requests):
    """AUC per task over all (user, candidate) pairs, and HR@10 of "next" (target index 0)."""
    scores = np.concatenate(per_user_scores)
    labels = np.concatenate([r[2] for r in requests])
    out = {f"AUC_{t}": auc(scores[:, k], labels[:, k]) for k, t in enumerate(TASKS)}
    out["HR@10_next"] = hit_rate([s[:, 0] for s in per_user_scores], [0] * len(requests), 10)
    return out


@torch.no_grad()
def scores_torch(model, data, requests, device, batch=512):
    model.eval()
    out, ml = [], model.config["max_len"]
    for lo in range(0, len(requests), batch):
        chunk = requests[lo:lo + batch]
        width = max(len(r[1]) for r in chunk)
        cand = np.zeros((len(chunk), width), dtype=np.int64)  # padding candidates change nothing (SUMI)
        for b, r in enumerate(chunk):
            cand[b, :len(r[1])] = r[1]
        p = model.predict(*tensors(data, [r[0] for r in chunk], cand, ml, device)).float().cpu().numpy()
        out += [p[b, :len(r[1])] for b, r in enumerate(chunk)]
    return out


def scores_libflame(path, data, requests, batch=256):
    with flame.Model(path) as model, flame.Engine(model, max_batch=batch) as engine:
        out = []
        for lo in range(0, len(requests), batch):
            out += engine.score_batch([flame.Request(h, c, [data.side(h)], [data.side(c)])
                                       for h, c, _ in requests[lo:lo + batch]])
        return out, engine.stats()["engine"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(HERE.parents[2] / "shared/data/amazon-beauty/Beauty.txt"))
    ap.add_argument("--out", default="build/beauty-sumi.flame")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--negatives", type=int, default=20, help="sampled negatives per training example")
    ap.add_argument("--eval-negatives", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--max-users", type=int, help="use only the first N users (quick runs)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)

    data = Beauty.load(args.data, args.max_users)
    cfg = model_config(data.num_items, d=args.d_model, blocks=args.blocks)
    model = torch_ref.FlameModel(cfg, dropout=args.dropout).to(args.device)
    print(f"{len(data.prefixes)} users, {data.num_items - 1} items, {len(data.cuts)} training cuts; "
          f"device {args.device}", file=sys.stderr)
    t0 = time.time()
    train(model, data, args)
    train_s = time.time() - t0

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    flame.tools.export(model, args.out)
    requests = data.test_requests(args.eval_negatives)
    t0 = time.time()
    st = scores_torch(model, data, requests, args.device)
    torch_s = time.time() - t0
    t0 = time.time()
    sf, stats = scores_libflame(args.out, data, requests)
    flame_s = time.time() - t0
    m_torch, m_flame = evaluate(st, requests), evaluate(sf, requests)
    max_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(st, sf))
    agree = all(round(m_torch[k], 4) == round(m_flame[k], 4) or abs(m_torch[k] - m_flame[k]) < 5e-5 for k in m_torch)
    print(json.dumps({"torch": m_torch, "libflame": m_flame, "agree_4_decimals": agree,
                      "max_abs_score_diff": max_diff, "users": len(requests), "steps": args.steps,
                      "device": args.device, "train_s": round(train_s, 1), "eval_torch_s": round(torch_s, 1),
                      "eval_libflame_s": round(flame_s, 1), "libflame_stats": stats, "model": args.out}))
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
