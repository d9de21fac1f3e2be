"""AUC and HR@K for ranking scores (numpy only)."""
import numpy as np


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve over all pairs, ties counted half (Mann-Whitney U)."""
    scores, labels = np.asarray(scores, dtype=np.float64).ravel(), np.asarray(labels).ravel() > 0
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s))
    _, first, counts = np.unique(s, return_index=True, return_counts=True)
    avg = first + (counts - 1) / 2.0 + 1  # average 1-based rank of each tie group
    ranks[order] = np.repeat(avg, counts)
    pos, neg = labels.sum(), (~labels).sum()
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def hit_rate(per_user_scores, targets, k=10) -> float:
    """Share of users whose target candidate (an index) is among the top k; a tie with the
    target counts against it (the pessimistic rank)."""
    hits = [int(np.sum(s >= s[t]) - 1 < k) for s, t in zip(per_user_scores, targets)]
    return float(np.mean(hits))
