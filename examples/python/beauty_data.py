"""Amazon Beauty as a multi-task ranking problem (for train_sumi_beauty.py).

Per user (items oldest first, n >= 5): the last 3 items are the test future, the items
before them, P, are all that training sees.
  training cut t (1 <= t < len(P)): history P[:t]; task "next" = P[t], task "next3" = any of
    P[t:t+3]; candidates = those (up to 3) items plus uniform random negatives. Labels come
    from membership, so a sampled negative that happens to be a positive is labelled right.
  test: history P; candidates = the 3 future items (distinct) + `num_negatives` items the
    user never interacted with, drawn with a fixed seed; "next" = the first future item.
Side feature (one slot): each item's popularity decile in P over all users (1..10, 0 = never
seen in training), a bag of one id per token, to exercise side features end to end.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np

FUTURE = 3
POP_BUCKETS = 11  # 0 = unseen, 1..10 = deciles


def read_sequences(path) -> List[np.ndarray]:
    with open(path) as f:
        return [np.array(line.split()[1:], dtype=np.int64) for line in f if line.strip()]


def popularity_buckets(prefixes: List[np.ndarray], num_items: int) -> np.ndarray:
    """int64 [num_items]: the decile (1..10) of each item's training count, 0 if unseen."""
    counts = np.bincount(np.concatenate(prefixes), minlength=num_items)
    seen = counts > 0
    ranks = np.argsort(np.argsort(counts[seen], kind="stable"), kind="stable")
    out = np.zeros(num_items, dtype=np.int64)
    out[seen] = 1 + (10 * ranks) // max(1, seen.sum())
    return out


@dataclass
class Beauty:
    prefixes: List[np.ndarray]   # P per user
    futures: List[np.ndarray]    # the last 3 items per user
    num_items: int               # table rows: ids 0..max id (0 unused)
    pop: np.ndarray              # int64 [num_items] popularity bucket per item
    cuts: np.ndarray             # int64 [num_cuts, 2]: (user, t) training cuts

    @classmethod
    def load(cls, path, max_users=None):
        seqs = read_sequences(path)[:max_users]
        num_items = int(max(s.max() for s in seqs)) + 1
        prefixes = [s[:-FUTURE] for s in seqs]
        cuts = np.array([(u, t) for u, p in enumerate(prefixes) for t in range(1, len(p))], dtype=np.int64)
        return cls(prefixes, [s[-FUTURE:] for s in seqs], num_items, popularity_buckets(prefixes, num_items), cuts)

    def train_batch(self, rng, batch, negatives, max_len):
        """(histories, candidates [B, 3 + negatives], labels [B, 3 + negatives, 2])."""
        pick = self.cuts[rng.integers(0, len(self.cuts), size=batch)]
        hist, cand = [], np.empty((batch, FUTURE + negatives), dtype=np.int64)
        labels = np.zeros(cand.shape + (2,), dtype=np.float32)
        for b, (u, t) in enumerate(pick):
            p = self.prefixes[u]
            hist.append(p[max(0, t - max_len):t])
            fut = p[t:t + FUTURE]
            cand[b, :len(fut)] = fut
            cand[b, len(fut):] = rng.integers(1, self.num_items, size=cand.shape[1] - len(fut))
            labels[b, :, 0] = cand[b] == p[t]
            labels[b, :, 1] = np.isin(cand[b], fut)
        return hist, cand, labels

    def test_requests(self, num_negatives, seed=0):
        """Per user (history P, candidates int64, labels float32 [M, 2]); the same for every
        scorer, so PyTorch and libflame see identical requests."""
        rng = np.random.default_rng(seed)
        out = []
        for p, fut, in zip(self.prefixes, self.futures):
            seen = set(p.tolist()) | set(fut.tolist())
            negs = []
            while len(negs) < num_negatives:
                for i in rng.integers(1, self.num_items, size=2 * num_negatives).tolist():
                    if i not in seen and len(negs) < num_negatives:
                        seen.add(i)
                        negs.append(i)
            pos = list(dict.fromkeys(fut.tolist()))
            cand = np.array(pos + negs, dtype=np.int64)
            labels = np.stack([cand == fut[0], np.isin(cand, fut)], -1).astype(np.float32)
            out.append((p, cand, labels))
        return out

    def side(self, items: np.ndarray):
        """The one side-feature slot of `items` as a CSR (offsets, ids) pair."""
        return np.arange(len(items) + 1, dtype=np.int64), self.pop[items]
