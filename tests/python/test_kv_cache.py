"""The user-history KV cache from Python: Engine(kv_cache_bytes=...) and Request(kv_cache=True),
directly or through a Scheduler, give the scores of the cache off (a miss, a hit, a grown
history), the stats count them, and the argument checks name what is wrong."""
import numpy as np
import pytest

import flame
import flame_testlib as lib
from flame.tools import reference

CASE = "post_sumi_from_oldest"  # positions count from the oldest item: grown histories extend


@pytest.fixture
def engines(tmp_path):
    cfg = lib.CASES[CASE]
    path = tmp_path / "m.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 11))
    with flame.Model(path) as m, flame.Engine(m) as off, flame.Engine(m, kv_cache_bytes=1 << 20,
                                                                        kv_cache_block_tokens=4) as on:
        yield m, off, on


def test_scores_and_stats(engines):
    m, off, on = engines
    rng = np.random.default_rng(5)
    n = m.info.num_items
    h = rng.integers(0, n, 6)
    for step, length in enumerate([3, 3, 5]):  # a miss, a hit, an extension
        c = rng.integers(0, n, 9)
        want = off.score(h[:length], c)
        got = on.score(h[:length], c, user_id=4, kv_cache=True)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
        assert np.all(np.isfinite(got))
    s = on.stats()["engine"]
    assert (s["kv_cache_misses"], s["kv_cache_hits"], s["kv_cache_extensions"]) == (1, 1, 1)
    assert s["kv_cache_tokens_saved"] == 3 + 3 and s["kv_cache_tokens_computed"] == 3 + 2
    assert 0 < s["kv_cache_bytes"] <= s["kv_cache_budget_bytes"]
    batch = on.score_batch([flame.Request(h[:5], c, user_id=4, kv_cache=True, history_version=0),
                            flame.Request(h[:2], c)])
    np.testing.assert_allclose(batch[0], off.score(h[:5], c), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(batch[1], off.score(h[:2], c), rtol=2e-5, atol=2e-5)
    assert on.stats()["engine"]["kv_cache_hits"] == 2


def test_refusals(engines):
    m, off, on = engines
    with pytest.raises(flame.ShapeError, match="kv_cache is set but no user_id"):
        on.score([1, 2], [3], kv_cache=True)
    with pytest.raises(flame.InvalidArgumentError, match="history_version = -1 is outside"):
        on.score([1, 2], [3], user_id=1, kv_cache=True, history_version=-1)
    with pytest.raises(flame.InvalidArgumentError, match="the engine has no KV cache"):
        off.score([1, 2], [3], user_id=1, kv_cache=True)
    with pytest.raises(flame.InvalidArgumentError, match="FLAME_OPT_KV_CACHE_BYTES = -1 is out of range"):
        flame.Engine(m, kv_cache_bytes=-1)


def test_through_a_scheduler(engines):
    """Scheduler.score and submit take kv_cache and history_version as Engine.score does: the
    same user scored twice through the scheduler is a miss then a hit, with the engine's scores."""
    m, off, on = engines
    rng = np.random.default_rng(7)
    n = m.info.num_items
    h, c = rng.integers(0, n, 5), rng.integers(0, n, 9)
    want = off.score(h, c)
    with flame.Scheduler(on, [(4, 16)], max_wait_us=1000) as s:
        first = s.score(h, c, user_id=8, kv_cache=True)
        second = s.submit(h, c, user_id=8, kv_cache=True, history_version=3).result(timeout=30)
    for got in (first, second):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    st = on.stats()["engine"]
    assert (st["kv_cache_misses"], st["kv_cache_hits"]) == (1, 1)
    assert st["kv_cache_tokens_computed"] == 5 and st["kv_cache_tokens_saved"] == 5
    np.testing.assert_allclose(second, on.score(h, c, user_id=8, kv_cache=True, history_version=3),
                               rtol=2e-5, atol=2e-5)
    assert on.stats()["engine"]["kv_cache_hits"] == 2


def test_scheduler_refusals(engines):
    """The scheduler refuses what Engine.score refuses, in its words, with nothing queued."""
    m, off, on = engines
    h, c = [1, 2], [3]
    with pytest.raises(flame.ShapeError, match="kv_cache is set but no user_id") as direct:
        on.score(h, c, kv_cache=True)
    with flame.Scheduler(on, [(4, 16)]) as s:
        for call in (s.score, s.submit):
            with pytest.raises(flame.ShapeError) as through:
                call(h, c, kv_cache=True)
            assert str(through.value) == str(direct.value)
            for version in (2**64, -1):  # history_version is a uint64_t
                with pytest.raises(flame.InvalidArgumentError) as direct_v:
                    on.score(h, c, user_id=1, kv_cache=True, history_version=version)
                with pytest.raises(flame.InvalidArgumentError, match=f"history_version = {version} is outside") \
                        as through_v:
                    call(h, c, user_id=1, kv_cache=True, history_version=version)
                assert str(through_v.value) == str(direct_v.value)
        assert s.stats()["submitted"] == 0
