"""Leave-last-out full-sort evaluation of a dot-head flame model with the numpy reference.

    PYTHONPATH=python python3 -m flame.tools.evaluate MODEL.safetensors Beauty.txt

Protocol (data/amazon-beauty/README.md): per line `user i1 i2 ... in`, target = in, input =
i1..i(n-1) keeping the most recent max_len; score every item id; the scores of the history's
items are set to exactly 0; rank; HR@K and NDCG@K (rank from 0, gain 1/log2(rank+2)).
"History" is all of i1..i(n-1), also the items older than the window, as ICLRec's rating
matrix does: this reproduces the published metrics to every digit, while zeroing only the
kept window (--mask input) moves NDCG by up to 0.0001 through the 144 users longer than 50.

Ties: the ranking is a stable sort by descending score over item ids 0..N-1, so an item
tied with the target ranks ahead of it iff its id is smaller. The count of users whose
top-20 membership depends on a tie is reported, to show how much the rule matters.
"""
import argparse
import sys
import time

import numpy as np

from . import reference


def read_sequences(path, num_items):
    """The item sequences of the lines that have one (a user with no item has no target, as
    flame-score skips it); ids must lie in 0..num_items-1 (numpy would read -1 as the last)."""
    seqs = []
    with open(path) as f:
        for no, line in enumerate(f, 1):
            try:
                s = np.array(line.split()[1:], dtype=np.int64)
            except (ValueError, OverflowError):
                raise ValueError(f"{path}:{no}: an item id is not an integer of int64") from None
            bad = np.flatnonzero((s < 0) | (s >= num_items))
            if bad.size:
                raise ValueError(f"{path}:{no}: item id {s[bad[0]]} is outside 0..{num_items - 1}")
            if s.size:
                seqs.append(s)
    if not seqs:
        raise ValueError(f"{path}: no line has an item to hold out (each is 'user item item ...')")
    return seqs


def user_states(cfg, t, histories):
    """h_last [B, d] for histories (each already at most max_len, oldest first), all users
    at once: a left-padded [B, L] window with a padding-aware causal mask, which equals the
    per-request computation for every real query token. Empty histories give zeros."""
    if cfg["head"]["type"] != "dot" or any(f["input"] != "item" for f in cfg["features"]):
        raise ValueError("batched evaluation supports dot-head models with item features only")
    B, L = len(histories), max(1, max(len(h) for h in histories))
    ids = np.zeros((B, L), dtype=np.int64)
    valid = np.zeros((B, L), dtype=bool)
    for b, h in enumerate(histories):
        if len(h):
            ids[b, L - len(h):], valid[b, L - len(h):] = h, True
    x = reference.embed(cfg, t, ids)
    # a real token in slot s of the L-window is history item i = s - (L - n) of n, so two
    # position rules reduce to a function of s alone; from_oldest's row i depends on n
    rule, ml = cfg["position"]["rule"], cfg["max_len"]
    if rule == "from_oldest":
        n = valid.sum(1)
        x = x + t["position.weight"][np.maximum(np.arange(L)[None, :] - (L - n)[:, None], 0)]
    elif rule != "none":
        s = np.arange(L)
        x = x + t["position.weight"][ml - L + s if rule == "left_padded_slot" else L - 1 - s]
    mask = valid[:, None, :] & np.tril(np.ones((L, L), dtype=bool))[None]
    h = reference.encode(x, mask, t, cfg, rows=[L - 1])[:, 0, :]
    h[~valid[:, -1]] = 0.0
    return h


def evaluate(model_path, data_path, ks=(5, 10, 20), dtype=np.float64, mask_scope="full", batch=2048):
    cfg, t = reference.load(model_path)
    t = {k: v.astype(dtype) for k, v in t.items()}
    table = t[f"tables.{cfg['head']['table']}.weight"]
    seqs = read_sequences(data_path, table.shape[0])
    ids = np.arange(table.shape[0])
    ml, K = cfg["max_len"], max(ks)
    ranks, tie_sensitive = [], 0
    for lo in range(0, len(seqs), batch):
        chunk = seqs[lo:lo + batch]
        inputs = [s[:-1][-ml:] for s in chunk]
        scores = user_states(cfg, t, inputs) @ table.T
        for b, s in enumerate(chunk):
            scores[b, inputs[b] if mask_scope == "input" else s[:-1]] = 0.0
        target = np.array([s[-1] for s in chunk])
        ts = scores[np.arange(len(chunk)), target][:, None]
        greater = (scores > ts).sum(1)
        tied = (scores == ts)
        before = (tied & (ids[None] < target[:, None])).sum(1)
        ranks.append(greater + before)
        # users whose target shares its score with another item and could reach the top K
        tie_sensitive += int(np.sum((tied.sum(1) > 1) & (greater < K)))
    rank = np.concatenate(ranks)
    out = {}
    for k in ks:
        hit = rank < k
        out[f"HR@{k}"] = float(hit.mean())
        out[f"NDCG@{k}"] = float(np.where(hit, 1.0 / np.log2(rank + 2.0), 0.0).mean())
    out["users"], out["tie_sensitive_users"] = len(seqs), tie_sensitive
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m flame.tools.evaluate", description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--mask", choices=["full", "input"], default="full",
                    help="zero the scores of the whole history (default, as ICLRec) or only the kept window")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        m = evaluate(args.model, args.data, dtype=np.dtype(args.dtype), mask_scope=args.mask)
    except (ValueError, OSError) as e:
        print(f"flame.tools.evaluate: {e}", file=sys.stderr)
        return 2
    dt = time.perf_counter() - t0
    print(" ".join(f"{k} {m[k]:.4f}" for k in ("HR@5", "NDCG@5", "HR@10", "NDCG@10", "HR@20", "NDCG@20")))
    print(f"{m['users']} users, {m['tie_sensitive_users']} with a tie at the target inside the top 20, "
          f"{dt:.1f} s ({args.dtype})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
