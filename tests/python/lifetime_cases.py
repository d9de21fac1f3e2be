"""Closing handles while other threads use them, one case per function, each run in a child
process by test_lifetime.py (`python3 lifetime_cases.py CASE`), so that a crash is a failed
case rather than a dead test run. A case prints "ok" when every call either returned the
right value or raised ClosedError, and the closed handle refuses calls afterwards.

Calls are held inside the library deterministically where a callback allows it: a fetch
callback of a feature source that waits for an Event keeps flame_score / item cache get /
source fetch / scheduler score running while the handle is closed. The model is big enough
(a 1.3 MB item table) that freeing it returns its pages to the system, so a call reading it
after a premature destroy faults instead of reading stale memory."""
import gc
import os
import sys
import threading
import time

import numpy as np

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")]
import flame  # noqa: E402
from flame.tools import reference  # noqa: E402

ITEMS = 20000
CFG = {
    "format": "flame", "version": 1, "d_model": 16, "max_len": 6,
    "tables": [{"name": "item", "rows": ITEMS, "dim": 16}, {"name": "cat", "rows": 7, "dim": 16}],
    "features": [{"name": "item", "table": "item", "input": "item", "pooling": "sum"},
                 {"name": "cat", "table": "cat", "input": "side", "pooling": "sum"}],
    "combine": "sum", "projection": False,
    "position": {"rule": "left_padded_slot", "rows": 6, "candidate_position": -1},
    "input_layernorm": True,
    "blocks": {"count": 2, "num_heads": 2, "ffn_dim": 24, "norm": "post", "activation": "gelu_erf"},
    "final_layernorm": False, "layernorm": {"eps": 1e-12, "eps_inside_sqrt": True},
    "head": {"type": "sumi", "tasks": [{"name": "click", "hidden": [8], "activation": "relu"}]},
}
HIST, CANDS = np.array([5, 17, 300, 4000]), np.arange(100, 164)
THREADS = 6
ROUNDS = 12


def record(i):
    return flame.FeatureRecord.of([[int(i) % 7]])


def sides(ids):
    return [flame.bags([[int(i) % 7] for i in ids])]


def model_path():
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"flame-lifetime-{os.getpid()}.safetensors")
    reference.save(path, CFG, reference.random_model(CFG, 3))
    return path


def expected(path):
    with flame.Model(path) as m, flame.Engine(m) as e:
        return e.score(HIST, CANDS, sides(HIST), sides(CANDS))


class Gate:
    """A fetch callback that blocks its first call until opened: a call is then in flight."""

    def __init__(self):
        self.entered, self.opened, self.first = threading.Event(), threading.Event(), True
        self.lock = threading.Lock()

    def __call__(self, ids):
        with self.lock:
            first, self.first = self.first, False
        if first:
            self.entered.set()
            self.opened.wait(30)
        return [record(i) for i in ids]


def in_thread(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: B902 - reported by the caller
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def held_call(make_call, close):
    """Runs make_call() on a thread until its fetch callback blocks, runs close(), then lets
    the call finish; returns the call's value (raising what it raised)."""
    t, out = in_thread(make_call)
    assert GATE.entered.wait(30), "the call never reached its fetch callback"
    close()
    GATE.opened.set()
    t.join(60)
    assert not t.is_alive(), "the call did not finish"
    if "error" in out:
        raise out["error"]
    return out["value"]


def refused(fn):
    try:
        fn()
    except flame.ClosedError:
        return
    raise AssertionError(f"{fn} ran on a closed handle")


GATE = Gate()


# ------------------------------------------------ a call held in flight while its handle closes

def case_engine_close_during_score():
    path = model_path()
    want = expected(path)
    model = flame.Model(path)
    engine = flame.Engine(model)
    cache = flame.ItemCache(flame.FeatureSource.from_callback(1, GATE))
    engine.set_item_cache(cache)
    model.close()
    cache.close()

    got = held_call(lambda: engine.score(HIST, CANDS), engine.close)
    assert np.array_equal(got, want), "scores of a call whose engine closed under it differ"
    refused(lambda: engine.score(HIST, CANDS))


def case_scheduler_close_during_score():
    path = model_path()
    want = expected(path)
    with flame.Model(path) as model:
        engine = flame.Engine(model)
    engine.set_item_cache(flame.ItemCache(flame.FeatureSource.from_callback(1, GATE)))
    sched = flame.Scheduler(engine)

    def close_both():
        sched.close()
        engine.close()

    got = held_call(lambda: sched.score(HIST, CANDS), close_both)
    assert np.array_equal(got, want)
    refused(lambda: sched.score(HIST, CANDS))
    refused(lambda: engine.score(HIST, CANDS))


def case_item_cache_close_during_get():
    cache = flame.ItemCache(flame.FeatureSource.from_callback(1, GATE))
    got = held_call(lambda: cache.get(np.arange(1000)), cache.close)
    assert got == [record(i) for i in range(1000)]
    refused(lambda: cache.get([1]))


def case_source_close_during_fetch():
    src = flame.FeatureSource.from_callback(1, GATE)
    got = held_call(lambda: src.fetch(np.arange(1000)), src.close)
    assert got == [record(i) for i in range(1000)]
    refused(lambda: src.fetch([1]))


# ------------------------------------------------ callbacks closing the handles they run under

def case_fetch_callback_closes_its_cache_and_source():
    handles = {}

    def fetch(ids):
        handles["cache"].close()
        handles["src"].close()
        return [record(i) for i in ids]

    handles["src"] = src = flame.FeatureSource.from_callback(1, fetch)
    handles["cache"] = cache = flame.ItemCache(src)
    assert cache.get(np.arange(500)) == [record(i) for i in range(500)]
    refused(lambda: cache.get([1]))
    refused(lambda: src.fetch([1]))


def case_done_callback_closes_its_scheduler_and_engine():
    path = model_path()
    want = expected(path)
    with flame.Model(path) as model:
        engine = flame.Engine(model)
    sched = flame.Scheduler(engine, workers=2)
    futs = [sched.submit(HIST, CANDS, sides(HIST), sides(CANDS)) for _ in range(20)]
    closed = threading.Event()

    def close_all(_):
        sched.close()
        engine.close()
        closed.set()

    futs[0].add_done_callback(close_all)
    assert closed.wait(60)
    for f in futs:  # every queued request is still scored
        assert np.array_equal(f.result(60), want)
    refused(lambda: sched.submit(HIST, CANDS, sides(HIST), sides(CANDS)))
    refused(lambda: engine.score(HIST, CANDS, sides(HIST), sides(CANDS)))


def case_dropped_while_a_call_runs():
    """The last reference dropped (and the collector run) while another thread's call is in
    flight: the object lives until the call returns."""
    path = model_path()
    want = expected(path)
    with flame.Model(path) as model:
        engine = flame.Engine(model)
    engine.set_item_cache(flame.ItemCache(flame.FeatureSource.from_callback(1, GATE)))
    t, out = in_thread(lambda: engine.score(HIST, CANDS))
    assert GATE.entered.wait(30)
    del engine
    gc.collect()
    GATE.opened.set()
    t.join(60)
    assert "error" not in out, out.get("error")
    assert np.array_equal(out["value"], want)


# ------------------------------------------------ many threads calling while another closes

def hammer(call, check, close, threads=THREADS):
    """threads call call() in a loop until it raises ClosedError; close() runs once as many
    calls as threads have returned (all threads are then busy calling); every value must pass
    check()."""
    bad, counts, progress = [], [], [0]
    start = threading.Barrier(threads + 1)

    def worker():
        start.wait()
        n = 0
        while True:
            try:
                v = call()
            except flame.ClosedError:
                break
            except Exception as e:  # noqa: BLE001 - anything else is a wrong result
                bad.append(e)
                break
            if not check(v):
                bad.append(v)
                break
            n += 1
            progress[0] += 1
        counts.append(n)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    deadline = time.monotonic() + 30
    while progress[0] < threads and time.monotonic() < deadline and not bad:
        time.sleep(0.001)
    close()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts), "a caller never saw the handle closed"
    assert not bad, f"{len(bad)} wrong result(s), the first: {bad[0]!r}"
    assert sum(counts) > 0, "no call ran before close: the case tests nothing"


def case_threads_score_while_engine_closes():
    for _ in range(ROUNDS):  # each round closes a fresh handle under its callers
        _threads_score_while_engine_closes()


def _threads_score_while_engine_closes():
    path = model_path()
    want = expected(path)
    with flame.Model(path) as model:
        engine = flame.Engine(model)
    hammer(lambda: engine.score(HIST, CANDS, sides(HIST), sides(CANDS)), lambda v: np.array_equal(v, want),
           engine.close)


def case_threads_score_while_scheduler_closes():
    for _ in range(ROUNDS):  # each round closes a fresh handle under its callers
        _threads_score_while_scheduler_closes()


def _threads_score_while_scheduler_closes():
    path = model_path()
    want = expected(path)
    with flame.Model(path) as model:
        engine = flame.Engine(model)
    sched = flame.Scheduler(engine, max_wait_us=200)

    def close():
        sched.close()
        engine.close()

    hammer(lambda: sched.score(HIST, CANDS, sides(HIST), sides(CANDS)), lambda v: np.array_equal(v, want), close)


def case_threads_make_engines_while_model_closes():
    for _ in range(ROUNDS):  # each round closes a fresh handle under its callers
        _threads_make_engines_while_model_closes()


def _threads_make_engines_while_model_closes():
    path = model_path()
    want = expected(path)
    model = flame.Model(path)

    def call():
        with flame.Engine(model) as e:
            return model.info.num_items, e.score(HIST, CANDS, sides(HIST), sides(CANDS))

    hammer(call, lambda v: v[0] == ITEMS and np.array_equal(v[1], want), model.close)


def case_threads_get_while_item_cache_closes():
    for _ in range(ROUNDS):  # each round closes a fresh handle under its callers
        _threads_get_while_item_cache_closes()


def _threads_get_while_item_cache_closes():
    cache = flame.ItemCache(flame.FeatureSource.from_callback(1, lambda ids: [record(i) for i in ids]),
                            max_entries=64)
    ids = np.arange(256)
    want = [record(i) for i in ids]
    hammer(lambda: (cache.get(ids), cache.stats()), lambda v: v[0] == want, cache.close)


def case_threads_fetch_while_source_closes():
    for _ in range(ROUNDS):  # each round closes a fresh handle under its callers
        _threads_fetch_while_source_closes()


def _threads_fetch_while_source_closes():
    src = flame.FeatureSource.from_file(FEATURES)
    want = [record(i) for i in range(64)]
    hammer(lambda: src.fetch(np.arange(64)), lambda v: v == want, src.close)


def case_threads_read_while_user_cache_closes():
    for _ in range(ROUNDS):  # each round closes a fresh handle under its callers
        _threads_read_while_user_cache_closes()


def _threads_read_while_user_cache_closes():
    name = f"/flame-lifetime-{os.getpid()}"
    cache = flame.UserCache(name, "create", capacity=1024, max_ids=64)
    try:
        for u in range(64):
            cache.put_history(u, np.arange(u, u + 40))

        def call():
            u = int(np.random.randint(64))
            cache.put_history(u, np.arange(u, u + 40))
            return u, cache.get(u), cache.stats()

        hammer(call, lambda v: np.array_equal(v[1].bags[0], np.arange(v[0], v[0] + 40)), cache.close)
    finally:
        flame.UserCache.unlink(name)


def case_threads_alloc_while_pinned_pool_closes():
    for _ in range(ROUNDS):  # each round closes a fresh handle under its callers
        _threads_alloc_while_pinned_pool_closes()


def _threads_alloc_while_pinned_pool_closes():
    pool = flame.PinnedPool(pin=False, max_cached_bytes=0)

    def call():
        buf = pool.alloc(1 << 20)
        a = buf.array(np.uint8)
        a[:] = 7
        ok = int(a.sum()) == 7 << 20
        del a, buf
        pool.stats()
        time.sleep(0.001)  # moments without a live buffer, when close() is allowed
        return ok

    def close():
        while True:  # refused while a buffer lives: retry until a moment with none
            try:
                pool.close()
                return
            except flame.InvalidArgumentError:
                time.sleep(0.001)

    hammer(call, bool, close)


def write_features():
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"flame-lifetime-{os.getpid()}.features")
    with open(path, "w") as f:
        f.write("flame-features 1 slots=1 dense=0\n")
        for i in range(64):
            f.write(f"{i}\t{i % 7}\n")
    return path


if __name__ == "__main__":
    FEATURES = write_features()
    try:
        globals()["case_" + sys.argv[1]]()
    finally:
        for suffix in (".features", ".safetensors"):
            try:
                os.unlink(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"flame-lifetime-{os.getpid()}{suffix}"))
            except FileNotFoundError:
                pass
    print("ok")
