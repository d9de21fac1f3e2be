"""The feature caches and host memory from Python: feature sources (file, Python callback,
Redis), the item cache, the shared-memory user cache, an Engine scoring id-only and
user-id-only requests through them (bitwise the scores of the same requests given in full),
the pinned pool and NUMA info, and every error path: bad arguments, closed handles, a
callback that raises, mismatched layouts. The Redis cases need a server (FLAME_TEST_REDIS_PORT;
tests/run-tests.sh starts one) and are skipped without it."""
import gc
import logging
import multiprocessing
import os
import threading
import weakref

import numpy as np
import pytest

import flame
import flame_testlib as lib
from flame import errors
from flame.tools import reference

SIDE = "relu_concat_projection_side_sumi"  # sumi head, 2 side slots (tables of 7 and 13 rows), 40 items


def random_records(cfg, rng, missing=()):
    """item id -> FeatureRecord (bags valid for cfg's side tables, 2 dense values: a feature
    file has one dense count), None for `missing` ids."""
    side_rows = [lib.layout.table(cfg, f["table"])["rows"] for f in cfg["features"] if f["input"] == "side"]
    items = lib.layout.table(cfg, "item")["rows"]
    out = {}
    for i in range(items):
        bags = [rng.integers(0, r, size=int(rng.integers(0, 4))).astype(np.int64) for r in side_rows]
        out[i] = None if i in missing else flame.FeatureRecord.of(bags, rng.standard_normal(2))
    return out


def write_feature_file(path, records, num_slots):
    dense = max((r.dense.size for r in records.values() if r is not None), default=0)
    with open(path, "w") as f:
        f.write(f"# test records\nflame-features 1 slots={num_slots} dense={dense}\n")
        for i, r in records.items():
            if r is None:
                continue
            fields = [",".join(map(str, b)) for b in r.bags]
            if dense:
                fields.append(",".join(repr(float(x)) for x in r.dense))
            f.write("\t".join([str(i)] + fields) + "\n")


def explicit_sides(records, ids):
    """The CSR bags of `ids` from the records (empty bags for missing ones), per slot."""
    slots = len(next(r for r in records.values() if r is not None).bags)
    out = []
    for s in range(slots):
        out.append(flame.bags([[] if records[int(i)] is None else records[int(i)].bags[s] for i in ids]))
    return out


@pytest.fixture
def side_model(tmp_path):
    cfg = lib.CASES[SIDE]
    path = tmp_path / "side.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 7))
    with flame.Model(path) as m:
        yield cfg, m


@pytest.fixture
def shm_name():
    name = f"/flame-pytest-{os.getpid()}-{threading.get_ident() % 10000}"
    yield name
    try:
        flame.UserCache.unlink(name)
    except flame.FlameIOError:
        pass


# ---------------------------------------------------------------- sources


def test_file_source_fetch_and_missing(tmp_path):
    cfg = lib.CASES[SIDE]
    recs = random_records(cfg, np.random.default_rng(1), missing={3, 5})
    write_feature_file(tmp_path / "f.txt", recs, 2)
    with flame.FeatureSource.from_file(tmp_path / "f.txt") as src:
        assert src.num_slots == 2
        ids = [0, 3, 7, 5, 39, 1000]
        got = src.fetch(ids)
        assert got[1] is None and got[3] is None and got[5] is None  # 1000: not in the file
        for i, g in zip(ids, got):
            if recs.get(i) is not None:
                assert g == recs[i]
                assert all(b.dtype == np.int64 for b in g.bags) and g.dense.dtype == np.float32
        assert src.fetch([]) == []


def test_file_source_errors(tmp_path):
    with pytest.raises(flame.FlameIOError, match="nope.txt"):
        flame.FeatureSource.from_file(tmp_path / "nope.txt")
    bad = tmp_path / "bad.txt"
    bad.write_text("flame-features 1 slots=1 dense=0\n4\t1,2\n5\t1\t9\n")
    with pytest.raises(flame.FormatError, match=":3"):
        flame.FeatureSource.from_file(bad)
    with pytest.raises(TypeError, match="from_file"):
        flame.FeatureSource()


def test_callback_source_gets_the_ids_and_its_records_come_back():
    seen = []

    def fetch(ids):
        seen.append(ids.copy())
        return [None if i % 2 else flame.FeatureRecord.of([[i, i + 1], []], [0.5 * i]) if i < 10 else [[i], [1, 2]]
                for i in ids]

    with flame.FeatureSource.from_callback(2, fetch) as src:
        got = src.fetch(np.array([4, 7, 12], dtype=np.int64))
    assert [s.tolist() for s in seen] == [[4, 7, 12]] and seen[0].dtype == np.int64
    assert got[0] == flame.FeatureRecord.of([[4, 5], []], [2.0])
    assert got[1] is None
    assert got[2] == flame.FeatureRecord.of([[12], [1, 2]])


def test_callback_errors_reach_the_caller_with_their_cause(caplog):
    def broken(ids):
        raise KeyError("store down")

    with flame.FeatureSource.from_callback(1, broken) as src:
        with pytest.raises(flame.UnavailableError, match="feature callback failed") as ei:
            src.fetch([1, 2])
        assert isinstance(ei.value.__cause__, KeyError)
    assert "KeyError" in caplog.text and "store down" in caplog.text

    def own_status(ids):
        raise flame.FormatError("bad record bytes")

    with flame.FeatureSource.from_callback(1, own_status) as src:
        with pytest.raises(flame.FormatError, match="FLAME_ERR_FORMAT") as ei:
            src.fetch([1])
        assert ei.value.__cause__.message == "bad record bytes"

    for status in (2**32, 2**64 + 4):  # not C ints: their low bits (FLAME_OK, FLAME_ERR_FORMAT) were passed on
        def odd_status(ids, status=status):
            raise flame.FlameError("odd", status)

        with flame.FeatureSource.from_callback(1, odd_status) as src:
            with pytest.raises(flame.UnavailableError, match="feature callback failed with FLAME_ERR_UNAVAILABLE"):
                src.fetch([1])

    for wrong, match in [(lambda ids: [[[1]]], "returned 1 record"),        # one record for two ids
                         (lambda ids: [[[1], [2]]] * 2, "2 bag"),             # two slots for a 1-slot source
                         (lambda ids: None, "returned None"),
                         (lambda ids: [[[1.5]]] * 2, "integer ids")]:
        with flame.FeatureSource.from_callback(1, wrong) as src:
            with pytest.raises(flame.InvalidArgumentError) as ei:
                src.fetch([1, 2])
            assert match in str(ei.value.__cause__), (match, ei.value.__cause__)
    with pytest.raises(TypeError, match="callable"):
        flame.FeatureSource.from_callback(1, "not a function")
    with pytest.raises(flame.InvalidArgumentError, match="num_slots = 65"):
        flame.FeatureSource.from_callback(65, lambda ids: [])


def test_an_error_and_its_cause_name_the_same_id():
    """An item cache fetches a batch refused for a record again id by id and fails naming the
    first id that fails alone; the error's cause was the exception of the last id retried (41
    here, where the message named 13)."""
    def fetch(ids):  # two bags for a 1-slot source: refused
        return [[[int(i)], [1]] if i in (13, 41) else [[int(i)]] for i in ids]

    with flame.FeatureSource.from_callback(1, fetch) as src:
        with pytest.raises(flame.InvalidArgumentError, match="for a batch of 3 ids beginning with id 12$") as ei:
            src.fetch([12, 13, 41])
        assert "record 1 (id 13)" in str(ei.value.__cause__)
        with flame.ItemCache(src, refresh_thread=False) as cache:
            with pytest.raises(flame.InvalidArgumentError, match="for id 13$") as ei:
                cache.get([12, 13, 41])
            assert "(id 13)" in str(ei.value.__cause__), ei.value.__cause__
            assert cache.get([12]) == [flame.FeatureRecord.of([[12]])]  # fetched alone, and cached


def test_a_callbacks_exception_is_not_kept_past_the_call():
    """What a fetch callback raised stayed in its thread's storage (with its traceback: the
    callback's frames and what they held) until that thread's next call, also after a call
    that succeeded in the end, such as a batch refused, then fetched id by id. (pytest's log
    capture keeps the warnings' records meanwhile: they hold the exception's text only.)"""
    class Held:
        pass

    held = []

    def fetch(ids):
        if len(ids) > 1:  # a batch is refused; each id alone is served
            h = Held()
            held.append(weakref.ref(h))
            raise flame.FormatError(f"batch of {len(ids)} refused")
        return [[[int(i)]] for i in ids]

    called, finish, got = threading.Event(), threading.Event(), []

    def worker():  # a thread that lives on after its call
        try:
            with flame.ItemCache(flame.FeatureSource.from_callback(1, fetch), refresh_thread=False) as cache:
                got.append(cache.get([1, 2]))
        except BaseException as e:  # noqa: B902 - reported by the test's thread
            got.append(e)
        called.set()
        finish.wait(30)

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert called.wait(30)
        assert got == [[flame.FeatureRecord.of([[1]]), flame.FeatureRecord.of([[2]])]]
        gc.collect()
        assert len(held) == 1 and held[0]() is None, "the refused batch's exception is still held"
    finally:
        finish.set()
        t.join(30)
    # a failure reported as the error's cause is held by that error alone
    with flame.FeatureSource.from_callback(1, fetch) as src:
        with pytest.raises(flame.FormatError) as ei:
            src.fetch([3, 4])
        assert isinstance(ei.value.__cause__, flame.FormatError)
        del ei
        gc.collect()
        assert len(held) == 2 and held[1]() is None


def test_the_callbacks_warning_holds_its_text_not_the_exception():
    """The warning a failed fetch logs carried the exception object as an argument, so a
    handler that keeps records (a memory handler, a test's capture) kept the exception, its
    traceback and the callback's frames alive. It carries the text; an exception whose
    __str__ raises is named by its type, and the call still fails with the callback's status."""
    class Held:
        pass

    held = []

    class Hostile(Exception):
        def __str__(self):
            raise RuntimeError("no text")

    def fetch(ids):
        h = Held()  # a local of the failing frame: reachable from the traceback only
        held.append(weakref.ref(h))
        if int(ids[0]) == 7:
            raise Hostile()
        raise flame.FormatError(f"refused id {int(ids[0])}")

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    log = logging.getLogger("flame")
    keep = Keep()
    log.addHandler(keep)
    try:
        with flame.FeatureSource.from_callback(1, fetch) as src:
            with pytest.raises(flame.FormatError):
                src.fetch([5])
            with pytest.raises(flame.UnavailableError) as ei:
                src.fetch([7])
            assert isinstance(ei.value.__cause__, Hostile)
            del ei
    finally:
        log.removeHandler(keep)
    gc.collect()
    assert len(held) == 2 and all(r() is None for r in held), "a kept record holds the exception"
    assert [r.getMessage() for r in records] == [
        "feature fetch callback raised FormatError: FLAME_ERR_FORMAT: refused id 5 (libflame gets FLAME_ERR_FORMAT)",
        "feature fetch callback raised Hostile: <Hostile whose str() raised> (libflame gets FLAME_ERR_UNAVAILABLE)"]
    assert not any(isinstance(a, BaseException) for r in records for a in r.args)


def test_closed_handles_are_refused(tmp_path):
    src = flame.FeatureSource.from_callback(1, lambda ids: [None] * len(ids))
    cache = flame.ItemCache(src)
    src.close()  # the cache keeps its own reference: it still fetches through the callback
    assert cache.get([3]) == [None]
    cache.close()
    cache.close()  # idempotent
    for fn in (lambda: cache.get([1]), cache.stats, lambda: cache.invalidate(1)):
        with pytest.raises(flame.ClosedError, match="item cache is closed"):
            fn()
    with pytest.raises(flame.ClosedError, match="feature source is closed"):
        src.fetch([1])


# ---------------------------------------------------------------- item cache


def test_item_cache_hits_misses_negative_entries_put_invalidate():
    calls = []

    def fetch(ids):
        calls.append(ids.tolist())
        return [None if i == 99 else [[i]] for i in ids]

    src = flame.FeatureSource.from_callback(1, fetch)
    with flame.ItemCache(src, max_entries=1000, shards=4, refresh_thread=False) as cache:
        assert cache.get([1, 2, 99]) == [flame.FeatureRecord.of([[1]]), flame.FeatureRecord.of([[2]]), None]
        assert calls == [[1, 2, 99]]  # the misses of a call: one batched fetch
        assert cache.get([2, 1, 99]) == [flame.FeatureRecord.of([[2]]), flame.FeatureRecord.of([[1]]), None]
        assert calls == [[1, 2, 99]]  # hits, the missing id included (negative entry)
        s = cache.stats()
        assert (s["hits"], s["misses"], s["fetches"], s["entries"]) == (3, 3, 1, 3)
        cache.put(1, flame.FeatureRecord.of([[7, 8]], [1.5]))
        assert cache.get([1]) == [flame.FeatureRecord.of([[7, 8]], [1.5])] and len(calls) == 1
        cache.invalidate(1)
        assert cache.get([1]) == [flame.FeatureRecord.of([[1]])] and calls[-1] == [1]
        assert cache.run_refresh() == 0  # nothing is due yet
    with pytest.raises(flame.ShapeError, match="2 bag"):
        flame.ItemCache(src).put(5, [[1], [2]])


def test_dense_values_float32_cannot_hold_are_refused(shm_name):
    """A finite dense value beyond float32 was converted to infinity: a record refused as "inf
    is not a finite float" (not the value given), and a user record stored with inf in it."""
    with pytest.raises(flame.InvalidArgumentError, match=r"dense\[1\] = 1e\+300 does not fit float32"):
        flame.FeatureRecord.of([[1]], [0.5, 1e300])
    with pytest.raises(flame.InvalidArgumentError, match=r"dense\[0\] = -1e\+39 does not fit float32"):
        flame.FeatureRecord.of([[1]], np.array([-1e39]))
    with pytest.raises(flame.DTypeError, match="dense must hold numbers"):
        flame.FeatureRecord.of([[1]], [10**400])
    with flame.UserCache(shm_name, "create", capacity=8, max_ids=4, max_dense=2) as uc:
        with pytest.raises(flame.InvalidArgumentError, match=r"dense\[0\] = 3.5e\+38 does not fit float32"):
            uc.put(1, [[1]], [3.5e38])
        assert uc.get(1) is None
        uc.put(1, [[1]], [np.inf, 3e38])  # infinity given is kept: the user cache stores any float32
        assert np.array_equal(uc.get(1).dense, np.array([np.inf, 3e38], np.float32))


def test_hostile_values_are_refused_as_the_feature_file_refuses_them():
    """A NaN or infinite dense value and a negative id, from a callback or a put, are
    InvalidArgumentError naming the value (the cause: the callback's own refusal); the other ids
    of the fetch are served and cached, the cache is unchanged by a refused put."""
    def fetch(ids):
        return [flame.FeatureRecord.of([[i], [-3 if i == 8 else 1]], [np.inf if i == 7 else 0.5]) for i in ids]

    src = flame.FeatureSource.from_callback(2, fetch)
    with pytest.raises(flame.InvalidArgumentError, match=r"record 1: slot 1: id -3 \(ids\[1\]\) is negative"):
        src.fetch([5, 8])
    with flame.ItemCache(src, refresh_thread=False) as cache:
        with pytest.raises(flame.InvalidArgumentError, match=r"dense\[0\] = inf is not a finite float") as ei:
            cache.get([5, 7])
        assert isinstance(ei.value.__cause__, flame.InvalidArgumentError)
        assert cache.stats()["entries"] == 1
        good = flame.FeatureRecord.of([[5], [1]], [0.5])
        assert cache.get([5]) == [good]
        for item, record, match in [(5, flame.FeatureRecord.of([[5], [1]], [np.nan]), r"dense\[0\] = nan"),
                                    (5, flame.FeatureRecord.of([[5], [1]], [-np.inf]), r"dense\[0\] = -inf"),
                                    (5, [[5], [-1]], r"slot 1: id -1 \(ids\[1\]\) is negative"),
                                    (-5, [[5], [1]], "item id -5 is negative")]:
            with pytest.raises(flame.InvalidArgumentError, match=match):
                cache.put(item, record)
        assert cache.get([5]) == [good] and cache.stats()["entries"] == 1

def test_refresh_thread_calls_back_into_python():
    """The cache's own C thread runs refresh-ahead through the Python callback (ctypes takes
    the GIL for it): a hot entry past 1% of its TTL is refreshed in the background."""
    threads, version = set(), [0]

    def fetch(ids):
        threads.add(threading.get_ident())
        return [[[int(i), version[0]]] for i in ids]

    with flame.ItemCache(flame.FeatureSource.from_callback(1, fetch), cold_ttl_us=2_000_000, hot_ttl_us=2_000_000,
                         refresh_percent=1, refresh_min_hits=1) as cache:
        assert cache.get([3])[0].bags[0].tolist() == [3, 0]
        version[0] = 1
        for _ in range(200):  # hits past the refresh point schedule the refresh
            cache.get([3])
            if cache.stats()["refreshes"]:
                break
            threading.Event().wait(0.01)
        assert cache.stats()["refreshes"] >= 1
        assert cache.get([3])[0].bags[0].tolist() == [3, 1]
    assert len(threads) == 2 and threading.get_ident() in threads  # this thread (the miss) and the refresher


def test_threads_score_through_a_callback_cache(side_model):
    cfg, model = side_model
    recs = random_records(cfg, np.random.default_rng(8))
    src = flame.FeatureSource.from_callback(2, lambda ids: [recs[int(i)] for i in ids])
    rng = np.random.default_rng(9)
    reqs = [(rng.integers(0, 40, 6), rng.integers(0, 40, 4)) for _ in range(8)]
    with flame.Engine(model) as full, flame.Engine(model) as engine, flame.ItemCache(src, max_entries=16) as cache:
        engine.set_item_cache(cache)  # 16 entries for 40 items: misses, fetches and evictions all along
        want = [full.score(h, c, explicit_sides(recs, h), explicit_sides(recs, c)) for h, c in reqs]
        bad = []

        def worker(t):
            for k in range(30):
                i = (t + k) % len(reqs)
                if not np.array_equal(engine.score(*reqs[i]), want[i]):
                    bad.append((t, k))

        ts = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert bad == []
        assert cache.stats()["evictions"] > 0 and engine.stats()["engine"]["calls"] == 4 * 30


def test_item_cache_options_are_checked():
    src = flame.FeatureSource.from_callback(1, lambda ids: [None] * len(ids))
    with pytest.raises(TypeError, match="unknown item cache option 'max_entry'"):
        flame.ItemCache(src, max_entry=5)
    with pytest.raises(flame.DTypeError, match="refresh_thread must be True or False"):
        flame.ItemCache(src, refresh_thread=1)
    with pytest.raises(flame.InvalidArgumentError, match="max_entries = 0 is out of range"):  # 0 is C's "default"
        flame.ItemCache(src, max_entries=0)
    # each field's own width, not its low bits: shards is 32-bit, max_entries 64-bit
    with pytest.raises(flame.InvalidArgumentError, match=r"shards = 4294967297 is outside \[0, 4294967296\)"):
        flame.ItemCache(src, shards=2**32 + 1)
    with pytest.raises(flame.InvalidArgumentError, match="max_entries = 18446744073709551616 is outside"):
        flame.ItemCache(src, max_entries=2**64)
    with pytest.raises(flame.InvalidArgumentError, match="num_slots = 4294967298 is outside"):
        flame.FeatureSource.from_callback(2**32 + 2, lambda ids: [None] * len(ids))
    with pytest.raises(flame.InvalidArgumentError, match="shards = 5000 is out of range"):  # the library's check
        flame.ItemCache(src, shards=5000)
    with pytest.raises(flame.InvalidArgumentError, match="hot_ttl_us = 1000 is below cold_ttl_us = 2000"):
        flame.ItemCache(src, hot_ttl_us=1000, cold_ttl_us=2000)
    with flame.ItemCache(src, refresh_percent=100, refresh_thread=False) as cache:  # refresh-ahead off
        assert cache.get([1]) == [None]
    with pytest.raises(TypeError, match="flame.FeatureSource"):
        flame.ItemCache("redis://x")


def test_engine_scores_id_only_requests_from_the_item_cache(side_model, tmp_path):
    cfg, model = side_model
    rng = np.random.default_rng(11)
    recs = random_records(cfg, rng, missing={4})
    write_feature_file(tmp_path / "f.txt", recs, 2)
    with flame.Engine(model) as full, flame.ItemCache(flame.FeatureSource.from_file(tmp_path / "f.txt")) as cache, \
            flame.Engine(model, item_cache=cache) as engine:
        reqs = [(rng.integers(0, 40, n), rng.integers(0, 40, m)) for n, m in [(3, 5), (0, 2), (9, 7)]]
        reqs.append((np.array([4, 4, 1]), np.array([4, 2])))  # a missing record: empty bags
        want = [full.score(h, c, explicit_sides(recs, h), explicit_sides(recs, c)) for h, c in reqs]
        for (h, c), w in zip(reqs, want):
            np.testing.assert_array_equal(engine.score(h, c), w)
        # a batch against the same batch given in full (a pass's token count can change the
        # BLAS kernel's accumulation order, so a batch equals single calls only to rounding)
        got = engine.score_batch([flame.Request(h, c) for h, c in reqs])
        for g, w in zip(got, full.score_batch([(h, c, explicit_sides(recs, h), explicit_sides(recs, c))
                                               for h, c in reqs])):
            np.testing.assert_array_equal(g, w)
        # bags given are still used as given
        h, c = reqs[0]
        np.testing.assert_array_equal(engine.score(h, c, explicit_sides(recs, h), explicit_sides(recs, c)), want[0])
        st = engine.stats()
        assert st["item_cache"]["hits"] > 0 and st["item_cache"]["entries"] > 0
        engine.set_item_cache(None)  # (detached after creation: the 0.2 setter)
        with pytest.raises(flame.ShapeError, match="item cache"):
            engine.score(h, c)
    with pytest.raises(TypeError, match="flame.ItemCache"):
        flame.Engine(model).set_item_cache(object())
    with pytest.raises(TypeError, match="item_cache must be a flame.ItemCache"):
        flame.Engine(model, item_cache=object())


def test_engine_item_cache_slot_count_and_callback_failure(side_model):
    cfg, model = side_model
    one_slot = flame.ItemCache(flame.FeatureSource.from_callback(1, lambda ids: [[[0]]] * len(ids)))
    with pytest.raises(flame.InvalidArgumentError, match="the item cache's records have 1 slots"):
        flame.Engine(model, item_cache=one_slot)
    with flame.Engine(model) as engine:
        with pytest.raises(flame.InvalidArgumentError, match="slot"):
            engine.set_item_cache(one_slot)

        def down(ids):
            raise ConnectionError("feature store unreachable")

        engine.set_item_cache(flame.ItemCache(flame.FeatureSource.from_callback(2, down)))
        with pytest.raises(flame.UnavailableError) as ei:
            engine.score([1, 2], [3])
        assert isinstance(ei.value.__cause__, ConnectionError)


# ---------------------------------------------------------------- user cache


def test_user_cache_round_trip_stats_and_params(shm_name):
    with flame.UserCache(shm_name, "create", capacity=64, num_slots=2, max_ids=8, max_dense=3) as uc:
        assert uc.params == {"capacity": 64, "num_slots": 2, "max_ids": 8, "max_dense": 3, "ttl_us": 0}
        assert uc.get(5) is None
        uc.put(5, [[1, 2, 3], [9]], dense=[0.5, -1.0])
        r = uc.get(5)
        assert [b.tolist() for b in r.bags] == [[1, 2, 3], [9]] and r.dense.tolist() == [0.5, -1.0]
        assert r.history.tolist() == [1, 2, 3] and 0 <= r.age_us < 10_000_000
        uc.put_history(-2**63, [4, 4])  # any int64 is a user id
        assert [b.tolist() for b in uc.get(-2**63).bags] == [[4, 4], []]
        assert uc.remove(5) and not uc.remove(5) and uc.get(5) is None
        s = uc.stats()
        assert (s["capacity"], s["records"], s["puts"], s["hits"], s["misses"]) == (64, 1, 2, 2, 2)
        # another handle, attached without a layout, reads the same table and learns its layout
        with flame.UserCache(shm_name, "attach") as other:
            assert other.params == uc.params
            assert other.get(-2**63).history.tolist() == [4, 4]
        with pytest.raises(flame.DTypeError, match="dense must hold numbers"):
            uc.put(6, [[1], []], dense=["a"])  # as FeatureRecord says it
        assert uc.get(6) is None


def test_user_cache_records_cross_processes(shm_name):
    with flame.UserCache(shm_name, "create", capacity=16, max_ids=4) as uc:
        p = multiprocessing.get_context("spawn").Process(target=_writer, args=(shm_name,))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        assert uc.get(77).history.tolist() == [3, 1, 4, 1]
        assert uc.stats()["puts"] == 1


def _writer(name):
    with flame.UserCache(name, "attach") as uc:
        uc.put_history(77, [3, 1, 4, 1])


def test_a_forked_child_forgets_inherited_handles(side_model):
    """A child of fork() exits promptly although it inherited an item cache whose refresh
    thread lives only in the parent (destroying it there would wait for that thread), and
    it can still make and use handles of its own."""
    cache = flame.ItemCache(flame.FeatureSource.from_callback(1, lambda ids: [[[1]]] * len(ids)))
    _, model = side_model
    p = multiprocessing.get_context("fork").Process(target=_forked, args=(cache, model))
    p.start()
    p.join(30)
    if p.exitcode is None:
        p.kill()
    assert p.exitcode == 0
    assert cache.get([5]) == [flame.FeatureRecord.of([[1]])]  # the parent's cache is untouched
    cache.close()


def _forked(cache, model):
    cache.close()  # forgotten, not destroyed
    with flame.Engine(model) as e:  # a handle of the child's own, over the inherited model
        assert e.score([1, 2], [3], [flame.bags([[0], [1]])] * 2, [flame.bags([[2]])] * 2).shape == (1, 3)


def test_user_cache_errors(shm_name):
    with pytest.raises(flame.InvalidArgumentError, match="'no-slash'"):
        flame.UserCache("no-slash")
    with pytest.raises(ValueError, match="mode must be one of"):
        flame.UserCache(shm_name, "open")
    with pytest.raises(flame.FlameIOError, match="No such file"):
        flame.UserCache(shm_name, "attach")
    with pytest.raises(flame.InvalidArgumentError, match="capacity = -1"):
        flame.UserCache(shm_name, capacity=-1)
    with pytest.raises(flame.InvalidArgumentError, match="num_slots 65"):
        flame.UserCache(shm_name, num_slots=65)
    with flame.UserCache(shm_name, "create", capacity=32, max_ids=4) as uc:
        with pytest.raises(flame.FormatError, match="max_ids 4, expected 8"):
            flame.UserCache(shm_name, "attach", capacity=32, max_ids=8)
        with pytest.raises(flame.FlameIOError, match="File exists"):
            flame.UserCache(shm_name, "create")
        with pytest.raises(flame.InvalidArgumentError, match="num_ids 5 is above the table's max_ids 4"):
            uc.put_history(1, [1, 2, 3, 4, 5])
        with pytest.raises(flame.ShapeError, match="1 per-slot id sequence"):
            uc.put(1, [[1], [2]])
        with pytest.raises(flame.DTypeError, match="user_id must be an int"):
            uc.get("alice")
        with pytest.raises(flame.InvalidArgumentError, match=r"is outside \[-9223372036854775808, 9223372036854775808\)"):
            uc.put_history(2**63, [1])
        with pytest.raises(flame.DTypeError, match="int64"):
            uc.put_history(1, np.array([1, 2], dtype=np.int32))
    with pytest.raises(flame.ClosedError, match="user cache is closed"):
        uc.get(1)


def test_engine_scores_from_the_user_cache(shm_name, tmp_path):
    cfg = lib.CASES["pre_tanh_final_sumi_from_recent"]  # sumi, no side features, max_len 6
    path = tmp_path / "m.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 3))
    rng = np.random.default_rng(5)
    with flame.Model(path) as model, flame.Engine(model) as engine, \
            flame.UserCache(shm_name, "create", capacity=64, max_ids=16) as uc:
        with pytest.raises(flame.InvalidArgumentError, match="no user cache"):
            engine.score(None, [1], user_id=1, from_user_cache=True)
        engine.set_user_cache(uc)
        hist = {u: rng.integers(0, 40, int(rng.integers(1, 16))) for u in range(4)}
        for u, h in hist.items():
            uc.put_history(u, h)
        cands = rng.integers(0, 40, 5)
        for u, h in hist.items():
            np.testing.assert_array_equal(engine.score(None, cands, user_id=u, from_user_cache=True),
                                          engine.score(h, cands))
        # a miss scores the empty history
        np.testing.assert_array_equal(engine.score(None, cands, user_id=999, from_user_cache=True),
                                      engine.score([], cands))
        got = engine.score_batch([flame.Request(None, cands, user_id=u, from_user_cache=True) for u in hist] +
                                 [flame.Request(hist[0], cands)])
        want = engine.score_batch([flame.Request(hist[u], cands) for u in list(hist) + [0]])  # same batch, in full
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        st = engine.stats()
        assert st["engine"]["user_cache_hits"] == 2 * len(hist) and st["engine"]["user_cache_misses"] == 1
        assert st["user_cache"]["hits"] == 2 * len(hist)
        with pytest.raises(flame.ShapeError, match="from_user_cache is set: the history comes from the user cache"):
            engine.score([1, 2], cands, user_id=0, from_user_cache=True)
        with pytest.raises(flame.ShapeError, match="no user_id is given"):
            engine.score(None, cands, from_user_cache=True)
        with pytest.raises(flame.ShapeError, match=r"history is None: pass \[\] for an empty history"):
            engine.score(None, cands)
        uc.put_history(50, [1, 41])  # an item id the model does not have
        with pytest.raises(flame.InvalidArgumentError, match="user 50's history in the user cache, position 1"):
            engine.score(None, cands, user_id=50, from_user_cache=True)
        with pytest.raises(TypeError, match="flame.UserCache"):
            engine.set_user_cache("users")
        # given at creation: the same scores; the engine keeps the cache after it is closed
        with flame.Engine(model, user_cache=uc) as given:
            uc.close()
            for u, h in hist.items():
                np.testing.assert_array_equal(given.score(None, cands, user_id=u, from_user_cache=True),
                                              engine.score(h, cands))
        with pytest.raises(TypeError, match="user_cache must be a flame.UserCache"):
            flame.Engine(model, user_cache="users")


# ---------------------------------------------------------------- Redis


@pytest.fixture
def redis_port():
    port = os.environ.get("FLAME_TEST_REDIS_PORT")
    if not port:
        pytest.skip("no Redis server: set FLAME_TEST_REDIS_PORT (tests/run-tests.sh starts one)")
    return int(port)


def test_redis_source_serves_what_was_loaded(tmp_path, redis_port):
    cfg = lib.CASES[SIDE]
    recs = random_records(cfg, np.random.default_rng(2), missing={9})
    write_feature_file(tmp_path / "f.txt", recs, 2)
    prefix = f"pytest:{os.getpid()}:"
    assert flame.load_redis(tmp_path / "f.txt", 2, port=redis_port, key_prefix=prefix) == 39
    with flame.FeatureSource.redis(2, port=redis_port, key_prefix=prefix, keys_per_command=7) as src, \
            flame.FeatureSource.from_file(tmp_path / "f.txt") as ref:
        ids = list(range(40)) + [12345]
        assert src.fetch(ids) == ref.fetch(ids)
    with pytest.raises(flame.FormatError, match="3 slots, expected 2|record has 2 slots, expected 3"):
        flame.FeatureSource.redis(3, port=redis_port, key_prefix=prefix).fetch([0])


def test_redis_unreachable_and_bad_options():
    with pytest.raises(flame.UnavailableError, match="127.0.0.1.*1"):
        flame.FeatureSource.redis(1, port=1, connect_timeout_ms=50)
    with pytest.raises(flame.DTypeError, match="port must be an int, got str"):
        flame.FeatureSource.redis(1, port="6379")
    with pytest.raises(flame.InvalidArgumentError, match=r"port = 4294973592 is outside \[-2147483648, 2147483648\)"):
        flame.FeatureSource.redis(1, port=2**32 + 6296)
    with pytest.raises(TypeError, match="unknown Redis option"):
        flame.load_redis("f.txt", 1, portt=1)


# ---------------------------------------------------------------- memory


def test_numa_info():
    info = flame.numa_info()
    assert info["mode"] in ("libnuma", "no_numa", "one_node")
    assert info["num_nodes"] >= 1 and 0 <= info["current_node"] < info["num_nodes"]


def test_pinned_pool_buffers_views_and_stats():
    pool = flame.PinnedPool(max_cached_bytes=1 << 20)
    buf = pool.alloc(10_000)
    assert buf.nbytes == 10_000 and buf.address % 4096 == 0
    x = buf.array(np.float32, (50, 50))
    x[:] = 3.0
    assert x.sum() == 7500.0
    del buf  # the view keeps the buffer
    s = pool.stats()
    assert s["bytes_requested"] == 10_000 and s["bytes_in_use"] >= 10_000 and s["misses"] == 1
    with pytest.raises(flame.InvalidArgumentError, match="1 buffer"):
        pool.close()
    del x  # now it goes back to the pool, and the next buffer of its class reuses it
    assert pool.stats()["bytes_in_use"] == 0
    again = pool.alloc(9_000)
    assert pool.stats()["hits"] == 1
    with pytest.raises(flame.InvalidArgumentError, match="needs 40000 bytes"):
        again.array(np.float64, 5000)
    del again
    with pytest.raises(flame.InvalidArgumentError):  # 0 bytes: the library says so
        pool.alloc(0)
    pool.close()
    with pytest.raises(flame.ClosedError, match="pinned pool is closed"):
        pool.alloc(1)
    with pytest.raises(flame.InvalidArgumentError, match="node"):
        flame.PinnedPool(numa_node=4096)


def test_pinned_buffer_views_of_impossible_shapes_are_refused():
    """Element counts are exact: np.prod wrapped 2**32 x 2**32 to 0 elements, so such a shape
    failed in reshape as "cannot reshape array of size 0" instead of naming the bytes it needs;
    negative dimensions and dtypes that cannot view memory are named as such."""
    with flame.PinnedPool(pin=False) as pool:
        buf = pool.alloc(4096)
        with pytest.raises(flame.InvalidArgumentError,
                           match=r"shape \(4294967296, 4294967296\) of float32 needs 73786976294838206464 bytes"):
            buf.array(np.float32, (2**32, 2**32))
        with pytest.raises(flame.InvalidArgumentError, match=r"shape \(-2, -2\) has a negative dimension"):
            buf.array(np.float32, (-2, -2))
        with pytest.raises(flame.DTypeError, match="cannot view raw memory"):
            buf.array(object)
        with pytest.raises(flame.DTypeError, match="cannot view raw memory"):
            buf.array(np.dtype("V0"))
        assert buf.array(np.int64, (8, 4)).shape == (8, 4) and buf.array(np.int64, np.int64(3)).shape == (3,)
        del buf


# ---------------------------------------------------------------- robustness (hostile use)


def test_feature_records_are_normalised_before_c():
    """Whatever arrays a FeatureRecord is made of, C reads C-contiguous int64 ids and float32
    values: other float dtypes and strided views are converted, float ids refused."""
    ids = np.arange(10, dtype=np.int64)
    r = flame.FeatureRecord((ids[::-2], ids[:3]), np.linspace(0, 1, 8)[::2])  # reversed, float64, strided
    assert r.bags[0].tolist() == [9, 7, 5, 3, 1] and r.bags[0].flags.c_contiguous
    assert r.dense.dtype == np.float32 and r.dense.tolist() == pytest.approx([0, 2 / 7, 4 / 7, 6 / 7])
    with pytest.raises(flame.DTypeError, match="int64"):
        flame.FeatureRecord((np.array([1.9]),))
    with pytest.raises(flame.DTypeError, match="dense must hold numbers"):
        flame.FeatureRecord(([1],), ["a"])
    with pytest.raises(flame.ShapeError, match="dense must be 1-D"):
        flame.FeatureRecord(([1],), np.zeros((2, 2)))
    src = flame.FeatureSource.from_callback(2, lambda ids: [None] * len(ids))
    with flame.ItemCache(src) as cache:
        cache.put(3, flame.FeatureRecord((ids[::-3], [4]), np.array([0.5, 1.5, 2.5], np.float16)))
        got = cache.get([3])[0]
        assert got.bags[0].tolist() == [9, 6, 3, 0] and got.dense.tolist() == [0.5, 1.5, 2.5]


def test_exit_requests_in_a_callback_reach_the_caller():
    def interrupted(ids):
        raise KeyboardInterrupt

    with flame.ItemCache(flame.FeatureSource.from_callback(1, interrupted)) as cache:
        with pytest.raises(KeyboardInterrupt):
            cache.get([1])


def test_cache_dropped_on_its_own_refresh_thread():
    """The last reference of an item cache goes inside its fetch callback on the refresh
    thread (as garbage collection can make it): the library frees it once the refresh is done."""
    holder, dropped = [], threading.Event()

    def fetch(ids):
        if threading.current_thread() is not threading.main_thread() and holder:
            holder.clear()  # the cache's last reference: destroyed right here, on the refresh thread
            dropped.set()
        return [[[int(i)]] for i in ids]

    cache = flame.ItemCache(flame.FeatureSource.from_callback(1, fetch), cold_ttl_us=1_000_000,
                            hot_ttl_us=1_000_000, refresh_percent=1, refresh_min_hits=1)
    cache.get([5])
    holder.append(cache)
    for _ in range(100):
        cache.get([5])
        if dropped.is_set():
            break
        threading.Event().wait(0.01)
    del cache  # holder's was the last reference only once the callback runs
    assert dropped.wait(10)
    threading.Event().wait(0.1)  # the refresh thread frees the cache on its way out


def test_forked_child_refuses_handles_that_own_threads(side_model):
    src = flame.FeatureSource.from_callback(1, lambda ids: [[[1]]] * len(ids))
    cache = flame.ItemCache(src)
    _, model = side_model
    p = multiprocessing.get_context("fork").Process(target=_use_inherited, args=(cache,))
    p.start()
    p.join(30)
    if p.exitcode is None:
        p.kill()
    assert p.exitcode == 0
    cache.close()


def _use_inherited(cache):
    try:
        cache.get([1])
    except flame.ClosedError as e:
        assert "before fork()" in str(e)
    else:
        raise AssertionError("an inherited item cache was used")


def test_user_cache_names_with_nul_are_refused():
    """Opening and unlinking refuse a name as every string passed to C is refused: naming the
    argument and the value (unlink said "must be a string without NUL characters")."""
    with pytest.raises(flame.InvalidArgumentError, match=r"FLAME_ERR_INVALID_ARG: name '/a\\x00/etc' holds a NUL character$"):
        flame.UserCache("/a\x00/etc")
    with pytest.raises(flame.InvalidArgumentError, match=r"FLAME_ERR_INVALID_ARG: name '/a\\x00b' holds a NUL character$"):
        flame.UserCache.unlink("/a\x00b")
    for fn in (flame.UserCache, flame.UserCache.unlink):
        with pytest.raises(flame.DTypeError, match="name must be a string, got bytes"):
            fn(b"/a")


def test_paths_and_redis_strings_with_nul_are_refused(tmp_path):
    """C reads a string up to its first NUL: "items.features\\x00x" opened items.features and a
    host "127.0.0.1\\x00x" connected to 127.0.0.1. A NUL is refused, naming the argument."""
    good = tmp_path / "items.features"
    good.write_text("flame-features 1 slots=1 dense=0\n4\t1\n")
    with pytest.raises(flame.InvalidArgumentError, match=r"path '.*items.features\\x00x' holds a NUL"):
        flame.FeatureSource.from_file(f"{good}\x00x")
    with pytest.raises(flame.InvalidArgumentError, match="path .* holds a NUL"):
        flame.load_redis(f"{good}\x00x", 1, port=1)
    for key in ("host", "key_prefix"):
        with pytest.raises(flame.InvalidArgumentError, match=f"{key} 'a\\\\x00b' holds a NUL"):
            flame.FeatureSource.redis(1, port=1, **{key: "a\x00b"})
    with pytest.raises(flame.DTypeError, match="path must be a path"):
        flame.FeatureSource.from_file(17)
