"""The example's AUC and HR@K against hand-computed values."""
import sys

import numpy as np

from conftest import REPO

sys.path.insert(0, str(REPO / "examples" / "python"))
from metrics import auc, hit_rate  # noqa: E402


def test_auc_counts_pairs_and_half_ties():
    assert auc([0.9, 0.1, 0.5], [1, 0, 0]) == 1.0
    assert auc([0.1, 0.9], [1, 0]) == 0.0
    # positives 0.8 and 0.5 vs negatives 0.5 and 0.2: pairs won 1 + 1 + 0.5 + 1 of 4
    assert auc(np.array([0.8, 0.5, 0.5, 0.2]), np.array([1, 1, 0, 0])) == 3.5 / 4


def test_hit_rate_ties_count_against_the_target():
    s = [np.array([0.5, 0.9, 0.1]), np.array([0.3, 0.3, 0.1]), np.array([0.9, 0.1, 0.2])]
    assert hit_rate(s, [0, 0, 0], k=1) == 1 / 3  # only user 3's target is strictly first
    assert hit_rate(s, [0, 0, 0], k=2) == 1.0
