"""flame.metrics_text parsed by prometheus_client's own parser: every family well formed
(histograms with cumulative buckets ending at their count), and the values equal the stats
and latency the library reports; feature resolution's parts (user cache, item cache, the
feature source's fetches) against a callback source that sleeps a known time."""
import os
import threading
import time

import numpy as np
import pytest

import flame
import flame_testlib as lib
from flame import reference

parser = pytest.importorskip("prometheus_client.parser", reason="prometheus_client (requirements.txt) is not installed")

SIDE = "relu_concat_projection_side_sumi"


@pytest.fixture
def engine(tmp_path):
    cfg = lib.CASES[SIDE]
    path = tmp_path / "m.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 4))
    with flame.Model(path) as m, flame.Engine(m) as e:
        yield cfg, e


def families(text):
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def value(fams, family, name, **labels):
    hits = [s.value for s in fams[family].samples if s.name == name and all(s.labels.get(k) == v
                                                                            for k, v in labels.items())]
    assert len(hits) == 1, (family, name, labels, hits)
    return hits[0]


def test_text_parses_and_matches_the_stats(engine):
    cfg, e = engine
    rng = np.random.default_rng(3)
    reqs = [lib.random_request(cfg, rng, int(rng.integers(0, 9)), int(rng.integers(1, 30))) for _ in range(12)]
    with flame.Scheduler(e, [(4, 32)], max_wait_us=500) as s:
        futs = [s.submit(*r) for r in reqs]
        for f in futs:
            f.result(10)
        text = s.metrics_text()
        st = s.stats()
        tot = s.latency("total")
    fams = families(text)
    for name, f in fams.items():
        assert name.startswith("flame_"), name
        if f.type == "histogram":
            for stage in {smp.labels["stage"] for smp in f.samples}:
                buckets = [(float(smp.labels["le"]), smp.value) for smp in f.samples
                           if smp.name == name + "_bucket" and smp.labels["stage"] == stage]
                counts = [v for _, v in sorted(buckets)]
                assert counts == sorted(counts) and counts[-1] == value(fams, name, name + "_count", stage=stage)
    assert fams["flame_scheduler_requests"].type == "counter"  # the parser strips _total from counter families
    assert value(fams, "flame_scheduler_requests", "flame_scheduler_requests_total", status="ok") == 12
    assert value(fams, "flame_scheduler_submitted", "flame_scheduler_submitted_total") == st["submitted"] == 12
    assert value(fams, "flame_scheduler_batches", "flame_scheduler_batches_total", profile="0") == st["batches"]
    assert value(fams, "flame_scheduler_batch_slots_used", "flame_scheduler_batch_slots_used_total") == \
        st["batch_slots_used"] == sum(len(r[1]) for r in reqs)
    assert value(fams, "flame_scheduler_stage_seconds", "flame_scheduler_stage_seconds_count", stage="total") == \
        tot["count"] == 12
    assert value(fams, "flame_scheduler_stage_seconds", "flame_scheduler_stage_seconds_sum", stage="total") == \
        pytest.approx(tot["sum_us"] / 1e6, abs=1e-6)
    assert value(fams, "flame_engine_requests", "flame_engine_requests_total") == 12
    assert value(fams, "flame_engine_candidates", "flame_engine_candidates_total") == sum(len(r[1]) for r in reqs)
    eng = flame.latency(e, "total")
    assert value(fams, "flame_engine_stage_seconds", "flame_engine_stage_seconds_count", stage="total") == \
        eng["count"] == st["batches"]
    assert eng["p50_us"] <= eng["p99_us"] <= eng["max_us"]


def test_latency_argument_errors(engine):
    _, e = engine
    with pytest.raises(flame.InvalidArgumentError, match="stage 'queue_wait' .*not timed by an engine|not timed"):
        flame.latency(e, "queue_wait")
    with pytest.raises(flame.InvalidArgumentError, match="none of"):
        flame.latency(e, "nope")
    with pytest.raises(flame.DTypeError):
        flame.latency(object(), "total")
    assert flame.metrics_text().strip() == ""
    # the C side reads each handle as its own type: a mixed-up one is refused before the call
    with flame.PinnedPool() as pool:
        for kw, what in ((dict(engine=pool), "engine must be a flame.Engine, got PinnedPool"),
                         (dict(pinned_pool=e), "pinned_pool must be a flame.PinnedPool, got Engine"),
                         (dict(scheduler=e), "scheduler must be a flame.Scheduler, got Engine")):
            with pytest.raises(flame.DTypeError, match=what):
                flame.metrics_text(**kw)
        assert "flame_pinned_pool" in flame.metrics_text(engine=e, pinned_pool=pool)


FETCH_SLEEP_S = 0.002


def test_feature_resolution_stages(tmp_path):
    """One sample per call of each part the call has: the item cache's for id-only requests,
    the source's only for calls that missed (each at least the callback's sleep), the user
    cache's for user-id requests, hit or miss; features is their sum; the text says the same."""
    cfg = lib.CASES[SIDE]  # 2 side slots (tables of 7 and 13 rows), 40 items
    path = tmp_path / "m.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 4))
    fetched, lock = [], threading.Lock()

    def fetch(ids):
        with lock:
            fetched.append(ids.tolist())
        time.sleep(FETCH_SLEEP_S)
        return [[[int(i) % 7], [int(i) % 13]] for i in ids]

    name = f"/flame-pytest-stages-{os.getpid()}"
    try:
        with flame.Model(path) as m, \
                flame.ItemCache(flame.FeatureSource.from_callback(2, fetch), refresh_thread=False) as ic, \
                flame.UserCache(name, "create", capacity=16, max_ids=16) as uc, \
                flame.Engine(m, item_cache=ic, user_cache=uc) as e:
            uc.put_history(1, [1, 2, 3])
            e.score([4, 5], [6])  # three ids missed: one fetch
            assert len(fetched) == 1
            e.score([4, 5], [6])  # all hits
            assert len(fetched) == 1
            e.score(None, [6, 7], user_id=1, from_user_cache=True)  # user hit; 1, 2, 3 and 7 missed: one fetch
            assert sorted(fetched[1]) == [1, 2, 3, 7]
            e.score(None, [6], user_id=2, from_user_cache=True)  # user miss (empty history); 6 hits
            assert len(fetched) == 2
            text = flame.metrics_text(engine=e)
            lat = {k: flame.latency(e, k) for k in flame.metrics.STAGES if k != "queue_wait"}
    finally:
        flame.UserCache.unlink(name)
    assert lat["total"]["count"] == 4
    assert lat["features"]["count"] == lat["item_cache"]["count"] == 4
    assert lat["user_cache"]["count"] == 2
    assert lat["source_fetch"]["count"] == 2
    assert lat["source_fetch"]["sum_us"] >= 2 * FETCH_SLEEP_S * 1e6
    assert lat["source_fetch"]["sum_us"] <= lat["item_cache"]["sum_us"]
    assert lat["features"]["sum_us"] == lat["user_cache"]["sum_us"] + lat["item_cache"]["sum_us"]
    assert lat["h2d"]["count"] == lat["d2h"]["count"] == 0  # the CPU
    fams = families(text)
    fam = "flame_engine_stage_seconds"
    # every engine stage the package names is exported, and no other (h2d and d2h: GPU only)
    assert {smp.labels["stage"] for smp in fams[fam].samples} == set(flame.metrics.STAGES) - {"queue_wait", "h2d", "d2h"}
    for stage, want in lat.items():
        if stage in ("h2d", "d2h"):
            continue
        assert value(fams, fam, fam + "_count", stage=stage) == want["count"], stage
        assert value(fams, fam, fam + "_bucket", stage=stage, le="+Inf") == want["count"], stage
        assert value(fams, fam, fam + "_sum", stage=stage) == pytest.approx(want["sum_us"] / 1e6, abs=1e-9), stage
    # both fetches slept 2 ms: none falls under the 1 ms bound
    assert value(fams, fam, fam + "_bucket", stage="source_fetch", le="0.001") == 0
    assert value(fams, "flame_item_cache_fetches", "flame_item_cache_fetches_total") == 2
