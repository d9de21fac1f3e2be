"""Engine.score_topk (flame_score_batch_topk) against a full sort of Engine.score_batch's
scores: the whole catalogue as candidates, random candidates with repeats, fewer than k;
and the argument checks."""
import numpy as np
import pytest

import flame
import flame_testlib as lib
from flame.tools import reference

DOT = "no_blocks_dot"


@pytest.fixture
def dot_engine(tmp_path):
    cfg = lib.CASES[DOT]
    path = tmp_path / "dot.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 3))
    with flame.Model(path) as m, flame.Engine(m) as e:
        yield m, e


def full_sort(scores, cands, k):
    order = sorted(range(len(cands)), key=lambda i: (-scores[i], cands[i], i))[:k]
    return [cands[i] for i in order], [scores[i] for i in order]


def test_matches_full_sort(dot_engine):
    m, e = dot_engine
    n = m.info.num_items
    rng = np.random.default_rng(5)
    c1 = rng.integers(0, n, 30)
    c1[5:9] = c1[4]  # repeats: equal scores, ordered by id then position
    reqs = [(rng.integers(0, n, 6), np.arange(n)), (rng.integers(0, n, 3), c1), ([], [1, 2, 3])]
    k = 8
    ids, sc = e.score_topk(reqs, k)
    assert ids.shape == (3, k) and sc.shape == (3, k) and ids.dtype == np.int64 and sc.dtype == np.float32
    full = e.score_batch(reqs)
    for r, (h, c) in enumerate(reqs):
        want_ids, want_sc = full_sort(full[r][:, 0].tolist(), list(np.asarray(c, dtype=np.int64)), k)
        got = len(want_ids)
        assert ids[r, :got].tolist() == want_ids
        assert sc[r, :got].tolist() == want_sc
        assert (ids[r, got:] == -1).all() and np.isneginf(sc[r, got:]).all()


def test_arguments_are_checked(dot_engine):
    _, e = dot_engine
    with pytest.raises(ValueError, match="k = 0"):
        e.score_topk([([1], [2])], 0)
    with pytest.raises(TypeError):
        e.score_topk([([1], [2])], True)
    with pytest.raises(flame.InvalidArgumentError, match="task 1: the model scores 1 task"):
        e.score_topk([([1], [2])], 4, task=1)
    with pytest.raises(flame.InvalidArgumentError, match="out of range"):
        e.score_topk([([1], [-1])], 4)
