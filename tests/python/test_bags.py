"""Side-feature bags and id lists from Python: the wrapper knows each array's length and passes
it as the bag's id count, so offsets that end short of the ids (ids dropped) or past them
(memory outside the array read) are refused, here with a message naming the slot and both
numbers and, should a check here be bypassed, by the library itself. Booleans are not ids,
alone or inside a list. A request refused for its ids never reaches the feature source."""
import numpy as np
import pytest

import flame
import flame_testlib as lib
from flame import _arrays
from flame.tools import reference

SIDE = "relu_concat_projection_side_sumi"  # sumi head, 2 side slots (tables of 7 and 13 rows), 40 items


@pytest.fixture
def side_engine(tmp_path):
    cfg = lib.CASES[SIDE]
    path = tmp_path / "side.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 1))
    with flame.Model(path) as m, flame.Engine(m) as e:
        yield cfg, m, e


def _request(cfg, seed=0):
    return lib.random_request(cfg, np.random.default_rng(seed), 4, 3)


def test_offsets_must_end_at_the_number_of_ids(side_engine):
    cfg, _, e = side_engine
    h, c, hs, cs = _request(cfg)
    off, ids = hs[1]
    longer = (off, np.concatenate([ids, [1, 2]]).astype(np.int64))  # 2 ids beyond the last bag
    with pytest.raises(flame.ShapeError, match=rf"history_side\[1\] offsets\[4\] .* = {off[-1]}, but ids has "
                                               rf"{ids.size + 2} entries"):
        e.score(h, c, [hs[0], longer], cs)
    off, ids = cs[0]
    shorter = (np.concatenate([off[:-1], [off[-1] + 3]]).astype(np.int64), ids)  # 3 ids past the array
    with pytest.raises(flame.ShapeError, match=rf"request 1: candidate_side\[0\] offsets\[3\] .* = {off[-1] + 3}, "
                                               rf"but ids has {ids.size} entries"):
        e.score_batch([(h, c, hs, cs), (h, c, hs, [shorter, cs[1]])])
    with pytest.raises(flame.InvalidArgumentError, match=r"candidate_side\[0\] offsets\[0\] = 1, expected 0"):
        e.score(h, c, hs, [(off + 1, np.concatenate([[0], ids]).astype(np.int64)), cs[1]])
    with pytest.raises(flame.InvalidArgumentError, match=r"history side feature 'cat' \(slot 0\): offsets\[2\] = 1 < "
                                                        r"offsets\[1\] = 2 \(token 1's bag\)"):
        e.score(h, c, [(np.array([0, 2, 1, 3, 3]), np.array([0, 1, 2])), hs[1]], cs)  # decreasing: the library says
    with flame.Scheduler(e) as s:
        with pytest.raises(flame.ShapeError, match="but ids has"):
            s.score(h, c, [hs[0], longer], cs)
    np.testing.assert_array_equal(e.score(h, c, hs, cs), e.score(h, c, hs, cs))  # consistent bags still score


def test_the_library_gets_the_count_and_checks_it(side_engine, monkeypatch):
    """With the Python check switched off, the library still sees the array's true length:
    offsets past the ids are refused there, never read."""
    cfg, _, e = side_engine
    h, c, hs, cs = _request(cfg)
    monkeypatch.setattr(_arrays, "csr", lambda off, ii, name: None)
    off, ids = hs[0]
    past = (np.concatenate([off[:-1], [off[-1] + 1000]]).astype(np.int64), ids)
    with pytest.raises(flame.InvalidArgumentError) as ei:
        e.score(h, c, [past, hs[1]], cs)
    assert f"history side feature 'cat' (slot 0): offsets[4] (the end of token 3's bag) = {off[-1] + 1000}, " \
           f"but num_ids = {ids.size}" in ei.value.message
    short = (off, np.concatenate([ids, [0]]).astype(np.int64))
    with pytest.raises(flame.InvalidArgumentError, match=f"but num_ids = {ids.size + 1}"):
        e.score(h, c, [short, hs[1]], cs)


@pytest.mark.parametrize("ids, why", [([1, True], r"\[1\] is a bool \(True\)"),
                                      ((np.True_, 3), r"\[0\] is a bool"),
                                      ([False, True], "got booleans"),
                                      (np.array([True, False]), "int64 array, got bool")])
def test_booleans_are_not_ids(side_engine, ids, why):
    cfg, _, e = side_engine
    h, c, hs, cs = _request(cfg)
    with pytest.raises(flame.DTypeError, match="history" + ".*" + why) as ei:
        e.score(ids, c, hs, cs)
    assert isinstance(ei.value, TypeError)
    with pytest.raises(flame.DTypeError, match="candidates" + ".*" + why):
        e.score(h, ids, hs, cs)
    two_bags = np.array([0, 1, 2, 2, 2], dtype=np.int64)  # 4 history tokens, 2 ids
    with pytest.raises(flame.DTypeError, match=r"history_side\[0\] ids" + ".*" + why):
        e.score(h, c, [(two_bags, ids), hs[1]], cs)
    with pytest.raises(flame.DTypeError, match="bag 0" + ".*" + why):
        flame.FeatureRecord.of([ids, []])
    src = flame.FeatureSource.from_callback(2, lambda got: [None] * len(got))
    with flame.ItemCache(src) as cache:
        with pytest.raises(flame.DTypeError, match="ids" + ".*" + why):
            cache.get(ids)
    with pytest.raises(flame.DTypeError, match="history must be a sequence of integer ids, got a bool"):
        e.score(True, c, hs, cs)


def test_refused_request_fetches_nothing(side_engine):
    cfg, model, _ = side_engine
    fetched = []

    def fetch(ids):
        fetched.append(ids.copy())
        return [[[int(i) % 7], [int(i) % 13]] for i in ids]

    with flame.Engine(model) as engine, flame.ItemCache(flame.FeatureSource.from_callback(2, fetch)) as cache:
        engine.set_item_cache(cache)
        with pytest.raises(flame.InvalidArgumentError, match="history token 2, feature 'item'.*id 40 out of range"):
            engine.score([1, 2, 40], [3, 4])
        with pytest.raises(flame.InvalidArgumentError, match="request 1: candidate token 0"):
            engine.score_batch([([1, 2], [3]), ([5], [-1])])
        assert fetched == [] and cache.stats()["entries"] == 0
        engine.score([1, 2], [3])
        assert [f.tolist() for f in fetched] == [[1, 2, 3]]


def test_misaligned_arrays_are_copied_or_refused(side_engine):
    """C reads aligned int64 ids and writes aligned floats: a misaligned view (into a byte
    buffer) is copied on its way in, and refused as the output."""
    cfg, _, e = side_engine
    h, c, hs, cs = _request(cfg)
    mis = np.zeros(h.size * 8 + 1, np.uint8)[1:].view(np.int64)
    mis[:] = h
    assert not mis.flags.aligned and mis.flags.c_contiguous
    np.testing.assert_array_equal(e.score(mis, c, hs, cs), e.score(h, c, hs, cs))
    out = np.zeros(c.size * 3 * 4 + 1, np.uint8)[1:].view(np.float32).reshape(c.size, 3)
    with pytest.raises(flame.ShapeError, match="aligned"):
        e.score(h, c, hs, cs, out=out)
