"""flame.Scheduler: threads and futures through the batch-profile scheduler score what the
engine scores alone (to float rounding: another batch shape), requests are batched and split
as the profiles say, a bad request fails alone through its future, load is shed, and the
lifetime rules hold (closing the engine closes its schedulers; queued work completes)."""
import gc
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import flame
import flame_testlib as lib
from conftest import REPO
from flame.tools import reference

SIDE = "relu_concat_projection_side_sumi"  # sumi head, 2 side slots, 3 tasks, 40 items


@pytest.fixture
def engine(tmp_path):
    cfg = lib.CASES[SIDE]
    path = tmp_path / "m.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 4))
    with flame.Model(path) as m, flame.Engine(m) as e:
        yield cfg, e


def requests(cfg, seed, n, max_candidates=20):
    rng = np.random.default_rng(seed)
    return [lib.random_request(cfg, rng, int(rng.integers(0, 9)), int(rng.integers(1, max_candidates + 1)))
            for _ in range(n)]


def test_threads_batch_and_match_the_engine(engine):
    cfg, e = engine
    reqs = requests(cfg, 1, 16)
    want = [e.score(*r) for r in reqs]
    with flame.Scheduler(e, [(8, 32)], max_wait_us=2000) as s:
        bad = []

        def worker(t):
            for k in range(25):
                i = (t * 7 + k) % len(reqs)
                got = s.score(*reqs[i])
                if lib.rel_err(got, want[i]) >= 1e-5:
                    bad.append((t, k, lib.rel_err(got, want[i])))

        ts = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert bad == []
        st = s.stats()
    assert st["completed"] == 150 and st["failed"] == 0 and st["parts"] == 150
    assert st["batches"] < 150  # six threads waiting on one worker: batches of several
    assert st["profile_batches"] == [st["batches"]]  # one entry per profile given
    assert 0 < st["latency_p50_us"] <= st["latency_p99_us"] <= st["latency_max_us"] * 17 // 16


def test_futures_split_requests_and_a_bad_one(engine):
    cfg, e = engine
    reqs = requests(cfg, 2, 5, max_candidates=60)
    reqs.append(lib.random_request(cfg, np.random.default_rng(3), 4, 100))  # 100 candidates: 4 parts of 25
    want = [e.score(*r) for r in reqs]
    h, c, hs, cs = reqs[0]
    bad = (h, np.where(np.arange(c.size) == 0, 40, c), hs, cs)  # item 40 of 40
    with flame.Scheduler(e, [(4, 32)], max_wait_us=1_000_000) as s:
        futs = [s.submit(*r) for r in reqs]
        fbad = s.submit(*bad)
        out = np.full((reqs[1][1].size, 3), np.nan, np.float32)
        fout = s.submit(*reqs[1], out=out)
    for f, w in zip(futs, want):
        assert lib.rel_err(f.result(timeout=30), w) < 1e-5
    assert fout.result(timeout=30) is out
    with pytest.raises(flame.InvalidArgumentError, match="id 40 out of range"):
        fbad.result(timeout=30)


def test_split_and_profile_counts(engine):
    cfg, e = engine
    r = lib.random_request(cfg, np.random.default_rng(5), 6, 70)
    with flame.Scheduler(e, [(2, 16), (1, 32)]) as s:
        got = s.score(*r)
        st = s.stats()
    assert lib.rel_err(got, e.score(*r)) < 1e-5
    assert st["split"] == 1 and st["parts"] == 3  # 70 > 32: three parts of 24, 23, 23
    assert st["profile_batches"] == [0, st["batches"]]  # parts of 23-24: only (1, 32) holds them


def test_queue_full_and_bad_arguments(engine):
    cfg, e = engine
    r = requests(cfg, 6, 3)
    with flame.Scheduler(e, [(8, 32)], max_wait_us=5_000_000, max_queue=2) as s:
        a, b = s.submit(*r[0]), s.submit(*r[1])
        with pytest.raises(flame.UnavailableError, match="queue full"):
            s.submit(*r[2])
        with pytest.raises(flame.ShapeError):  # checked in Python, nothing queued
            s.submit(r[2][0], r[2][1], None, r[2][3])
        assert s.stats()["queued"] == 2
    assert a.done() and b.done() and a.exception() is None  # closing scored them
    for bad, err in [(dict(profiles=[]), flame.ShapeError), (dict(profiles=[(1, 2, 3)]), flame.ShapeError),
                     (dict(profiles=[(0, 8)]), flame.InvalidArgumentError),
                     (dict(profiles=[(1, 8)] * 17), flame.InvalidArgumentError),
                     (dict(max_wait_us=-1), flame.InvalidArgumentError), (dict(workers=65), flame.InvalidArgumentError),
                     (dict(workers=1.5), flame.DTypeError), (dict(profiles=[(-1, 8)]), flame.InvalidArgumentError)]:
        with pytest.raises(err):
            flame.Scheduler(e, **bad)
    with pytest.raises(TypeError, match="flame.Engine"):
        flame.Scheduler("engine")


def test_lifetime(engine, tmp_path):
    cfg, e = engine
    r = requests(cfg, 7, 1)[0]
    s = flame.Scheduler(e, max_wait_us=3_000_000)
    f = s.submit(*r)
    e.close()  # closes the scheduler first, which scores what it holds
    assert s.closed and f.done() and f.exception() is None
    with pytest.raises(flame.ClosedError, match="scheduler is closed"):
        s.score(*r)
    # a scheduler dropped without close() is destroyed at once (no reference cycle)
    path = tmp_path / "m2.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 4))
    with flame.Model(path) as m, flame.Engine(m) as e3:
        s3 = flame.Scheduler(e3)
        assert len(e3._schedulers) == 1
        s3.score(*r)
        del s3
        assert len(e3._schedulers) == 0
        gc.collect()


def test_future_callbacks_run_on_a_worker(engine):
    """A future's callbacks run on the scheduler's worker: score() there is refused instead of
    waiting forever for that worker, submit() works, and dropping the last reference to the
    scheduler there destroys it safely (the library frees it when the worker is through)."""
    cfg, e = engine
    r = requests(cfg, 8, 1)[0]
    holder, seen, cb_done = [flame.Scheduler(e, [(2, 128)], max_wait_us=300_000, workers=1)], {}, threading.Event()

    def cb(f):
        sched = holder[0]
        seen["thread"] = threading.get_ident()
        try:
            sched.score(*r)
        except flame.InvalidArgumentError as err:
            seen["score"] = str(err)
        seen["submitted"] = sched.submit(*r)  # queued: scored when the scheduler drains
        del sched
        holder.clear()  # the last reference goes here, on the worker
        cb_done.set()

    fut = holder[0].submit(*r)  # alone, it waits 300 ms for company: time to add the callback
    fut.add_done_callback(cb)
    assert fut.cancel() is False  # running from its submit on
    assert fut.result(timeout=30) is not None
    assert cb_done.wait(30)  # (the result is set before the callbacks run)
    assert seen["submitted"].result(timeout=30).shape == (r[1].size, 3)
    assert seen["thread"] != threading.get_ident()
    assert "would wait for the worker it runs on" in seen["score"]
    assert holder == [] and len(e._schedulers) == 0
    gc.collect()


def test_submit_to_a_closed_scheduler_keeps_nothing(engine):
    cfg, e = engine
    r = requests(cfg, 9, 1)[0]
    s = flame.Scheduler(e)
    s.close()
    for _ in range(3):
        with pytest.raises(flame.ClosedError):
            s.submit(*r)
    assert s._pending == {}


def _hold_worker(s, req):
    """Submits req and blocks the (one) worker in its future's callback until the returned
    event is set; None when the request completed before the callback could be attached."""
    release, held = threading.Event(), threading.Event()

    def block(_):
        if threading.current_thread() is threading.main_thread():
            return  # completed already: the callback runs here, and must not block
        held.set()
        release.wait(30)

    s.submit(*req).add_done_callback(block)
    return release if held.wait(5) else None


def test_priorities_deadlines_and_cancel(engine):
    cfg, e = engine
    reqs = requests(cfg, 7, 6)
    want = [e.score(*r) for r in reqs]
    with flame.Scheduler(e, [(1, 32)], workers=1) as s:
        for _ in range(5):
            release = _hold_worker(s, reqs[0])
            if release is not None:
                break
        assert release is not None, "the worker could not be held"
        order = []
        low = s.submit(*reqs[1], priority=flame.Scheduler.PRIORITY_LOW)
        normal = s.submit(*reqs[2])
        high = s.submit(*reqs[3], priority=flame.Scheduler.PRIORITY_HIGH)
        late = s.submit(*reqs[4], timeout_us=1000)
        gone = s.submit(*reqs[5], priority=flame.Scheduler.PRIORITY_HIGH, deadline_us=s.now_us() + 10**9)
        for name, f in (("low", low), ("normal", normal), ("high", high)):
            f.add_done_callback(lambda _, name=name: order.append(name))
        assert s.cancel(gone) is True
        assert s.cancel(gone) is False  # no longer queued
        with pytest.raises(flame.CancelledError, match="cancelled while queued"):
            gone.result(5)
        import time
        time.sleep(0.01)  # past late's deadline, while the worker is held
        release.set()
        with pytest.raises(flame.DeadlineExceededError, match="deadline passed 1000 us after the submit"):
            late.result(5)
        for f, i in ((low, 1), (normal, 2), (high, 3)):
            assert lib.rel_err(f.result(5), want[i]) < 1e-5
        assert order == ["high", "normal", "low"]
        st = s.stats()
        assert st["timeouts"] == 1 and st["cancelled"] == 1 and st["failed"] == 0
        with pytest.raises(flame.InvalidArgumentError, match="priority 5 is none of"):
            s.submit(*reqs[1], priority=5)
        with pytest.raises(flame.InvalidArgumentError, match="was never given"):
            s.cancel(10**6)


def test_submit_reads_copies_of_the_arrays(engine):
    """The arrays of a submitted request are copied: a caller refilling the same buffers for
    each submit (ids, bag offsets and bag ids) gets every request's own scores, not those of
    what the buffers hold when the batch is scored."""
    cfg, e = engine
    rng = np.random.default_rng(11)
    h, c = np.empty(5, np.int64), np.empty(8, np.int64)
    hs = [(np.empty(6, np.int64), np.empty(5, np.int64)) for _ in range(2)]  # slots cat (7 rows), tag (13)
    cs = [(np.empty(9, np.int64), np.empty(8, np.int64)) for _ in range(2)]
    futs = []
    with flame.Scheduler(e, [(8, 32)], max_wait_us=1_000_000) as s:
        for k in range(4):
            h[:], c[:] = rng.integers(0, 40, h.size), rng.integers(0, 40, c.size)
            for (off, ids), rows in zip(hs + cs, (7, 13, 7, 13)):
                ids[:] = rng.integers(0, rows, ids.size)
                off[:] = np.arange(off.size) if k % 2 else np.r_[0, np.full(off.size - 1, ids.size)]
            futs.append((s.submit(h, c, hs, cs), e.score(h, c, hs, cs)))
    for f, want in futs:
        assert lib.rel_err(f.result(timeout=30), want) < 1e-5


def test_submit_passes_read_only_arrays_as_they_are(engine):
    """What no array can write (read-only, and so every array it views) is not copied: a
    catalogue many requests share stays one array, which the library validates once a batch."""
    from flame import _arrays
    cfg, e = engine
    cat = np.arange(40)
    view = cat[:]
    view.flags.writeable = False
    assert not _arrays.frozen(view)  # its base still writes the memory
    cat.flags.writeable = False
    assert _arrays.frozen(cat) and _arrays.frozen(cat[5:]) and _arrays.private(cat) is cat
    assert _arrays.frozen(np.frombuffer(bytes(16), np.int64))
    assert not _arrays.frozen(np.frombuffer(bytearray(16), np.int64))
    h, _, hs, _ = lib.random_request(cfg, np.random.default_rng(12), 4, 0)
    cs = [flame.bags([[i % 7] for i in range(40)]), flame.bags([[i % 13] for i in range(40)])]
    keep = []
    e._request(flame.Request(h, cat, hs, cs), keep, private=True)
    assert any(k is cat for k in keep) and not any(k is h for k in keep)
    with flame.Scheduler(e, [(8, 64)], max_wait_us=100_000) as s:
        futs = [s.submit(h, cat, hs, cs) for _ in range(4)]
    want = e.score(h, cat, hs, cs)
    for f in futs:
        assert lib.rel_err(f.result(timeout=30), want) < 1e-5


EXIT_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[2])
import flame
e = flame.Engine(flame.Model(sys.argv[1]))
s = flame.Scheduler(e, max_wait_us=10_000_000)  # alone, a request waits 10 s for company
for i in range(3):
    s.submit([1, 2], [3, 4, 5]).add_done_callback(lambda f, i=i: print("done", i, f.result().shape, flush=True))
print("queued", flush=True)
"""  # ends with the requests queued and nothing closed


def test_requests_queued_at_exit_complete(tmp_path):
    """A program ending with requests queued (its scheduler never closed) has them scored and
    their futures' callbacks run at exit, while Python can still run them: left to the
    interpreter's finalization, the workers could not enter Python and the callbacks never ran."""
    cfg = lib.CASES["iclrec_like"]
    path = tmp_path / "m.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 1))
    p = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(path), str(REPO / "python")], env=dict(os.environ),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["queued"] + [f"done {i} (3, 1)" for i in range(3)], p.stdout + p.stderr
