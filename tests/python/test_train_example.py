"""examples/python/train_sumi_beauty.py end to end on a slice of Beauty: trains a few
steps, exports, and PyTorch and libflame agree on AUC and HR@10 (the script exits 1 if not).
The exported model then scores real users of that slice with the KV cache as without it: a
miss, a hit, a history grown by the user's next items, and after other users evicted it."""
import importlib.util
import json
import math
import subprocess
import sys

import numpy as np
import pytest

import flame
from conftest import REPO
from flame.tools import st_io

pytest.importorskip("torch", reason="torch is not installed: the training example is skipped")

MAX_USERS, EVAL_NEGATIVES = 400, 30


@pytest.fixture(scope="module")
def trained(beauty_dir, tmp_path_factory):
    """(model file, the script's completed process): one training run for the module's tests."""
    out = tmp_path_factory.mktemp("sumi") / "sumi.flame"
    p = subprocess.run([sys.executable, str(REPO / "examples/python/train_sumi_beauty.py"), "--data",
                        str(beauty_dir / "Beauty.txt"), "--out", str(out), "--steps", "4", "--batch", "64",
                        "--max-users", str(MAX_USERS), "--eval-negatives", str(EVAL_NEGATIVES), "--device", "cpu"],
                       capture_output=True, text=True, timeout=600)
    return out, p


def test_train_export_and_both_evaluations_agree(trained):
    out, p = trained
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["agree_4_decimals"] and r["users"] == MAX_USERS and out.exists()
    assert r["max_abs_score_diff"] < 1e-5
    for k in ("AUC_next", "AUC_next3", "HR@10_next"):
        assert abs(r["torch"][k] - r["libflame"][k]) < 1e-4 and 0 < r["torch"][k] <= 1
    assert r["libflame_stats"]["requests"] == MAX_USERS


# ---- the KV cache on the trained model

EXTENDING_RULES = ("none", "from_oldest")  # docs/kv-cache.md: the rules whose rows stay when a history grows
TOL = {"rtol": 2e-5, "atol": 2e-5}         # float32, as tests/python/test_kv_cache.py


@pytest.fixture(scope="module")
def beauty(beauty_dir):
    """The example's data set-up (beauty_data.py) on the slice the model was trained on."""
    spec = importlib.util.spec_from_file_location("beauty_data", REPO / "examples/python/beauty_data.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod.Beauty.load(beauty_dir / "Beauty.txt", MAX_USERS)


@pytest.fixture(scope="module")
def model_files(trained, tmp_path_factory):
    """{name: (path, config)}: the exported model, and the same weights with positions counted
    from the oldest item (every row a grown history keeps stays valid: extensions)."""
    path, p = trained
    assert p.returncode == 0, p.stderr[-2000:]
    meta, tensors, dtypes = st_io.read(path)
    cfg = json.loads(meta["flame.config"])
    oldest = json.loads(meta["flame.config"])
    oldest["position"]["rule"] = "from_oldest"
    other = tmp_path_factory.mktemp("sumi") / "sumi-from-oldest.flame"
    assert set(dtypes.values()) == {"F32"}
    st_io.write(other, tensors, {"flame.config": json.dumps(oldest)})
    return {"exported": (path, cfg), "from_oldest": (other, oldest)}


class Scorer:
    """Scores a user's (history, candidates) with the popularity side feature on an engine
    without the cache and on one with it (kv_cache=True), and compares the two."""

    def __init__(self, data, off, on):
        self.data, self.off, self.on = data, off, on

    def __call__(self, user, history, candidates):
        d = self.data
        args = (history, candidates, [d.side(history)], [d.side(candidates)])
        want = self.off.score(*args)
        got = self.on.score(*args, user_id=user, kv_cache=True)
        assert np.all(np.isfinite(want)) and want.shape == (len(candidates), 2)
        np.testing.assert_allclose(got, want, **TOL, err_msg=f"user {user}, history of {len(history)}")


def kv_stats(engine):
    s = engine.stats()["engine"]
    return {k[len("kv_cache_"):]: v for k, v in s.items() if k.startswith("kv_cache_")}


@pytest.mark.parametrize("variant", ["exported", "from_oldest"])
def test_kv_cache_scores_real_users_as_without_it(model_files, beauty, variant):
    """Three users, each: a miss, a hit with other candidates, the history grown by the user's
    next item (then a hit), grown by the next three. The example's rule, left_padded_slot, moves
    every row of a grown history, so there a grown history is a miss; from_oldest extends."""
    path, cfg = model_files[variant]
    if variant == "exported":
        assert cfg["position"]["rule"] == "left_padded_slot"  # the case this variant covers
    extends = cfg["position"]["rule"] in EXTENDING_RULES
    assert extends == (variant == "from_oldest")
    data = beauty
    first, other = data.test_requests(EVAL_NEGATIVES, seed=0), data.test_requests(EVAL_NEGATIVES, seed=1)
    max_len = cfg["max_len"]
    # the three users with the longest histories that 3 more items leave inside the window
    users = sorted((u for u, p in enumerate(data.prefixes) if len(p) + 3 <= max_len),
                   key=lambda u: (-len(data.prefixes[u]), u))[:3]
    with flame.Model(path) as m, flame.Engine(m) as off, \
            flame.Engine(m, kv_cache_bytes=1 << 22, kv_cache_block_tokens=8) as on:
        score = Scorer(data, off, on)
        want = dict.fromkeys(("hits", "misses", "extensions", "evictions", "tokens_computed", "tokens_saved"), 0)
        for step in range(5):
            for u in users:
                p, fut = data.prefixes[u], data.futures[u]
                n = len(p)
                if step == 0:    # first visit
                    score(u, p, first[u][1])
                    want["misses"] += 1
                    want["tokens_computed"] += n
                elif step == 1:  # same history, the other candidate set
                    score(u, p, other[u][1])
                    assert not np.array_equal(first[u][1], other[u][1])
                    want["hits"] += 1
                    want["tokens_saved"] += n
                elif step == 3:  # the grown history again
                    score(u, np.concatenate([p, fut[:1]]), other[u][1])
                    want["hits"] += 1
                    want["tokens_saved"] += n + 1
                else:            # grown by 1 item (step 2), then by 2 more (step 4)
                    cached, grown = (n, n + 1) if step == 2 else (n + 1, n + 3)
                    score(u, np.concatenate([p, fut[:grown - n]]), first[u][1])
                    if extends:
                        want["extensions"] += 1
                        want["tokens_computed"] += grown - cached
                        want["tokens_saved"] += cached
                    else:
                        want["misses"] += 1
                        want["tokens_computed"] += grown
                s = kv_stats(on)
                assert {k: s[k] for k in want} == want, f"step {step}, user {u}"
        # per user: misses at the first visit and (left_padded_slot) at each growth, hits at steps 1 and 3
        assert (s["misses"], s["hits"], s["extensions"]) == ((3, 6, 6) if extends else (9, 6, 0))
        # every entry holds its user's latest window, n + 3 tokens, in 8-token blocks
        token_bytes = m.info.num_blocks * 2 * m.info.d_model * 4
        assert s["bytes"] == sum(math.ceil((len(data.prefixes[u]) + 3) / 8) for u in users) * 8 * token_bytes
        assert kv_stats(off)["budget_bytes"] == 0


def test_kv_cache_eviction_on_real_users(model_files, beauty):
    """A budget of exactly two users' blocks, three users: each miss that finds it full evicts
    the least recently used entries (not the oldest stored) until its blocks are free; an evicted
    user's next visit is a miss, then a hit; the scores stay those without the cache."""
    path, cfg = model_files["exported"]
    data = beauty
    first, other = data.test_requests(EVAL_NEGATIVES, seed=0), data.test_requests(EVAL_NEGATIVES, seed=1)
    bt = 4
    window = {u: min(len(p), cfg["max_len"]) for u, p in enumerate(data.prefixes)}
    blocks = {u: math.ceil(n / bt) for u, n in window.items()}
    by_len = sorted(window, key=lambda u: (len(data.prefixes[u]), u))
    a, b, c = by_len[-1], by_len[len(by_len) // 2], by_len[0]  # longest (past max_len), median, shortest
    # each eviction below frees enough with one entry: C's blocks fit in A's and in B's
    assert blocks[a] >= blocks[c] and blocks[b] >= blocks[c] >= 1 and len(data.prefixes[a]) > cfg["max_len"]
    with flame.Model(path) as m:
        block_bytes = bt * m.info.num_blocks * 2 * m.info.d_model * 4  # K and V in float32, every layer
        budget = (blocks[a] + blocks[b]) * block_bytes
        with flame.Engine(m) as off, \
                flame.Engine(m, kv_cache_bytes=budget + block_bytes - 1, kv_cache_block_tokens=bt) as on:
            score = Scorer(data, off, on)
            # (user, candidates, a hit?, evictions so far, users cached after the call)
            sequence = [(a, first, False, 0, (a,)),
                        (b, first, False, 0, (a, b)),   # the budget is full
                        (a, other, True, 0, (a, b)),    # A used last: B is the least recently used
                        (c, first, False, 1, (a, c)),   # evicts B, though A was stored before it
                        (a, first, True, 1, (a, c)),
                        (b, other, False, 2, (a, b)),   # evicts C
                        (c, other, False, 3, (b, c)),   # evicts A
                        (a, other, False, 4, (a, c)),   # A again: a miss; evicts B
                        (a, first, True, 4, (a, c))]
            want = {"hits": 0, "misses": 0, "extensions": 0, "tokens_computed": 0, "tokens_saved": 0}
            for i, (u, cands, hit, evictions, cached) in enumerate(sequence):
                score(u, data.prefixes[u], cands[u][1])
                want["hits" if hit else "misses"] += 1
                want["tokens_saved" if hit else "tokens_computed"] += window[u]
                s = kv_stats(on)
                assert {k: s[k] for k in want} == want and s["evictions"] == evictions, f"call {i}"
                assert s["bytes"] == sum(blocks[v] for v in cached) * block_bytes, f"call {i}"
            assert (want["misses"], want["hits"], s["evictions"]) == (6, 3, 4)
            assert s["budget_bytes"] == budget and s["peak_bytes"] == budget
