"""flame.kernels on the CPU: the embedding bag and SUMI attention against float64 numpy
references on fresh random inputs (and against torch.nn.functional.embedding_bag and a masked
scaled_dot_product_attention where torch is installed), and the rejections with their messages
leaving the output as it was."""
import numpy as np
import pytest

import flame
import flame.kernels as fk

RNG = np.random.default_rng()


def bf16_bits(x):
    """bfloat16 bit patterns of float32 values that bfloat16 holds exactly"""
    return (np.asarray(x, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_nearest(x):
    """bfloat16 bit patterns of float32 values rounded to nearest, ties to even: of the two
    patterns around x (its top half, and the next one away from zero) the nearer in float64,
    the even one on a tie (finite x; the next pattern past the largest finite one is infinity,
    as IEEE 754's overflow has it: 2^128 for the distance)"""
    x = np.asarray(x, dtype=np.float32)
    lo = (x.view(np.uint32) >> 16).astype(np.uint16)
    hi = lo + np.uint16(1)
    a = np.abs(x.astype(np.float64))
    vlo = np.abs(bf16_value(lo).astype(np.float64))
    vhi = np.abs(bf16_value(hi).astype(np.float64))
    vhi[(hi & 0x7fff) == 0x7f80] = 2.0 ** 128
    take_hi = (vhi - a < a - vlo) | ((vhi - a == a - vlo) & (lo % 2 == 1))
    return np.where(take_hi, hi, lo)


def random_tables(n, same_dim=None):
    tables, values = [], []
    for _ in range(n):
        rows, dim = int(RNG.integers(1, 200)), same_dim or int(RNG.integers(1, 40))
        kind = RNG.integers(4)
        if kind == 0:
            t = RNG.uniform(-1, 1, (rows, dim)).astype(np.float32)
            tables.append(t), values.append(t.astype(np.float64))
        elif kind == 1:  # k/64: exact in float16 and bfloat16
            v = RNG.integers(-64, 65, (rows, dim)) / 64.0
            tables.append(v.astype(np.float16)), values.append(v)
        elif kind == 2:
            v = RNG.integers(-64, 65, (rows, dim)) / 64.0
            tables.append(("bfloat16", bf16_bits(v))), values.append(v)
        else:
            q = RNG.integers(-128, 128, (rows, dim)).astype(np.int8)
            qp = np.stack([RNG.uniform(-0.05, 0.05, rows), RNG.uniform(-1, 1, rows)], 1).astype(np.float32)
            tables.append((q, qp)), values.append(qp[:, :1].astype(np.float64) * q + qp[:, 1:].astype(np.float64))
    return tables, values


def reference_bag(values, pools, ids, offsets, weights, combine):
    cols = []
    for v, pool, i, o, w in zip(values, pools, ids, offsets, weights):
        batch = len(i) if o is None else len(o) - 1
        out = np.zeros((batch, v.shape[1]))
        for b in range(batch):
            lo, hi = (b, b + 1) if o is None else (o[b], o[b + 1])
            for j in range(lo, hi):
                out[b] += (1.0 if w is None else float(w[j])) * v[i[j]]
            if pool == "mean" and hi > lo:
                out[b] /= hi - lo
        cols.append(out)
    return sum(cols) if combine == "sum" else np.concatenate(cols, 1)


@pytest.mark.parametrize("rep", range(20))
def test_embedding_bag_against_reference(rep):
    n = int(RNG.integers(1, 5))
    combine = "sum" if RNG.integers(3) == 0 else "concat"
    tables, values = random_tables(n, same_dim=int(RNG.integers(1, 30)) if combine == "sum" else None)
    pools = [("sum", "mean")[RNG.integers(2)] for _ in range(n)]
    batch = int(RNG.integers(0, 40))
    ids, offsets, weights = [], [], []
    for v in values:
        if RNG.integers(4) == 0:
            o = None
            k = batch
        else:
            o = np.concatenate([[0], np.cumsum(RNG.integers(0, 6, batch))]).astype(np.int64)
            k = int(o[-1])
        ids.append(RNG.integers(0, v.shape[0], k).astype(np.int64))
        offsets.append(o)
        weights.append(RNG.uniform(-2, 2, k).astype(np.float32) if RNG.integers(3) == 0 else None)
    copy = bool(RNG.integers(2))  # float16 and bfloat16 tables are borrowed in place too
    with fk.EmbeddingBag(tables, pooling=pools, combine=combine, copy=copy, threads=2) as bag:
        out = np.full((batch, bag.width + 3), np.nan, dtype=np.float32)
        got = bag(ids, offsets, weights, out=out[:, :bag.width])
        # float16 and bfloat16 outputs: the float32 output rounded once, to nearest even
        f16 = bag(ids, offsets, weights, out_dtype="float16")
        b16 = np.full((batch, bag.width + 2), 0xffff, dtype=np.uint16)  # a NaN pattern
        assert bag(ids, offsets, weights, out=b16[:, :bag.width], out_dtype="bfloat16") is not None
    want = reference_bag(values, pools, ids, offsets, weights, combine)
    assert got.shape == want.shape
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max(initial=0))))
    assert np.all(np.isnan(out[:, bag.width:]))  # the stride's gap is not written
    assert f16.dtype == np.float16 and f16.shape == want.shape
    np.testing.assert_array_equal(f16.view(np.uint16), got.astype(np.float16).view(np.uint16))  # numpy rounds to even
    np.testing.assert_array_equal(b16[:, :bag.width], bf16_nearest(got))
    assert np.all(b16[:, bag.width:] == 0xffff)
    scale = max(1.0, float(np.abs(want).max(initial=0)))
    np.testing.assert_allclose(f16.astype(np.float64), want, rtol=1e-3, atol=1e-3 * scale)
    np.testing.assert_allclose(bf16_value(b16[:, :bag.width]).astype(np.float64), want, rtol=8e-3, atol=8e-3 * scale)


def test_half_outputs_round_to_nearest_even():
    """Chosen float32 values, each a bag of one id of a one-column table: float16 and bfloat16
    outputs are them rounded to nearest with ties to even (the bits given here): ties, the
    values beside them, the largest finite values and the ties past them (to infinity),
    subnormals and the ties between them."""
    cases = [  # float32 bits, float16 bits, bfloat16 bits
        (0x3F801000, 0x3C00, 0x3F80), (0x3F803000, 0x3C02, 0x3F80), (0x3F801001, 0x3C01, 0x3F80),
        (0x3F808000, 0x3C04, 0x3F80), (0x3F818000, 0x3C0C, 0x3F82), (0x3F808001, 0x3C04, 0x3F81),
        (0x477FE000, 0x7BFF, 0x4780), (0x477FEFFF, 0x7BFF, 0x4780), (0x477FF000, 0x7C00, 0x4780),
        (0xC77FF000, 0xFC00, 0xC780), (0x387FE000, 0x0400, 0x3880), (0x33000000, 0x0000, 0x3300),
        (0x33000001, 0x0001, 0x3300), (0x33C00000, 0x0002, 0x33C0), (0x7F7F7FFF, 0x7C00, 0x7F7F),
        (0x7F7F8000, 0x7C00, 0x7F80), (0x00018000, 0x0000, 0x0002), (0x80000001, 0x8000, 0x8000),
    ]
    table = np.array([[c[0]] for c in cases], dtype=np.uint32).view(np.float32)
    with fk.EmbeddingBag([table], copy=False) as bag:
        ids = np.arange(len(cases))
        np.testing.assert_array_equal(bag([ids], out_dtype="float16").view(np.uint16)[:, 0], [c[1] for c in cases])
        np.testing.assert_array_equal(bag([ids], out_dtype="bfloat16")[:, 0], [c[2] for c in cases])
        out = np.zeros((len(cases), 1), np.float32)
        with pytest.raises(flame.ShapeError, match=r"out must be a writeable float16 \[18, 1\] array"):
            bag([ids], out=out, out_dtype="float16")
        with pytest.raises(flame.ShapeError, match=r"uint16 \(bfloat16 bit patterns\)"):
            bag([ids], out=out.view(np.float32).astype(np.float16), out_dtype="bfloat16")
        with pytest.raises(flame.InvalidArgumentError, match="out_dtype 'int8' is not one of"):
            bag([ids], out_dtype="int8")
    np.testing.assert_array_equal(bf16_nearest(table[:, 0]), [c[2] for c in cases])  # the tests' reference too


def test_embedding_bag_rejections_name_table_bag_value():
    t = RNG.uniform(-1, 1, (10, 4)).astype(np.float32)
    with fk.EmbeddingBag([t, t], pooling="mean") as bag:
        out = np.full((2, 8), np.nan, dtype=np.float32)
        with pytest.raises(flame.InvalidArgumentError, match=r"table 1 bag 1: ids\[2\] = 10 is outside 0..9"):
            bag([[1, 2], [0, 1, 10]], [[0, 1, 2], [0, 1, 3]], out=out)
        assert np.all(np.isnan(out))
        with pytest.raises(flame.InvalidArgumentError, match=r"table 0: offsets\[batch = 2\] = 1 but num_ids = 2"):
            bag([[1, 2], [0, 1]], [[0, 1, 1], [0, 1, 2]], out=out)
        with pytest.raises(flame.InvalidArgumentError, match=r"weights\[0\] = nan is not finite"):
            bag([[1, 2], [0, 1]], None, [None, np.array([np.nan, 1], np.float32)], out=out)
        assert np.all(np.isnan(out))
        with pytest.raises(flame.ShapeError):
            bag([[1, 2], [0, 1, 2]])  # batches of 2 and 3 bags
        assert bag([np.zeros(0, np.int64)] * 2).shape == (0, 8)  # batch 0
    with pytest.raises(flame.InvalidArgumentError, match="dim 3 differs from table 0's 4 under SUM combine"):
        fk.EmbeddingBag([t, t[:, :3].copy()], combine="sum")


def test_uint64_ids_and_non_numeric_weights_are_named():
    """uint64 ids and counts above 2**63 - 1 were converted to int64 and refused as the negative
    number they wrapped to; weights that are no numbers raised numpy's ValueError."""
    t = RNG.uniform(-1, 1, (10, 4)).astype(np.float32)
    with fk.EmbeddingBag([t]) as bag:
        with pytest.raises(flame.InvalidArgumentError, match=r"ids\[0\]\[1\] = 9223372036854775808 does not fit int64"):
            bag([np.array([1, 2**63], np.uint64)])
        with pytest.raises(flame.DTypeError, match=r"weights\[0\] must hold numbers, not <U1"):
            bag([[1, 2]], weights=[np.array(["a", "b"])])
        np.testing.assert_array_equal(bag([np.array([1, 2], np.uint64)]), t[[1, 2]])
    q = RNG.uniform(-1, 1, (5, 8)).astype(np.float32)
    with pytest.raises(flame.InvalidArgumentError, match=r"cu_history\[1\] = 18446744073709551615 does not fit"):
        fk.sumi_attention(q, q, q, np.array([0, 2**64 - 1], np.uint64), heads=2)


def test_weights_of_another_shape_than_the_ids_are_refused():
    """weights[t] holds one weight per id of ids[t], in its shape; a 2-D array of as many
    numbers was flattened, so a [1, n] or [n, 1] array (or a scalar for one id) passed."""
    t = RNG.uniform(-1, 1, (10, 4)).astype(np.float32)
    with fk.EmbeddingBag([t]) as bag:
        for w, ids, shapes in ((np.array([[0.5, 2.0]], np.float32), [1, 2], r"\(1, 2\).*\(2,\)"),
                               (np.array([[0.5], [2.0]], np.float32), [1, 2], r"\(2, 1\).*\(2,\)"),
                               (np.float32(0.5), [1], r"\(\).*\(1,\)")):
            with pytest.raises(flame.ShapeError, match=shapes):
                bag([ids], weights=[w])
        with pytest.raises(ValueError, match=r"weights\[0\] has shape \(3,\), ids\[0\] has shape \(2,\)"):
            bag([[1, 2]], weights=[[1.0, 2.0, 3.0]])
        want = 0.5 * t[1] + 2.0 * t[2]
        for w in ([0.5, 2.0], np.array([0.5, 2.0]), np.array([0.5, 2.0], np.float32)):  # lists, float64
            np.testing.assert_allclose(bag([[1, 2]], [[0, 2]], weights=[w])[0], want, rtol=1e-6)
        np.testing.assert_array_equal(bag([np.zeros(0, np.int64)], weights=[[]]), np.zeros((0, 4), np.float32))


def test_embedding_bag_update_rows():
    q = RNG.integers(-128, 128, (6, 5)).astype(np.int8)
    qp = np.ones((6, 2), np.float32)
    f16 = (RNG.integers(-64, 65, (6, 5)) / 64.0).astype(np.float16)
    with fk.EmbeddingBag([(q, qp), f16]) as bag:
        newq = RNG.integers(-128, 128, (1, 5)).astype(np.int8)
        bag.update_rows(0, 2, newq, np.array([[0.5, -1.0]], np.float32))
        newh = np.full((1, 5), 0.25, np.float16)
        bag.update_rows(1, 4, newh)
        got = bag([[2], [4]])
        np.testing.assert_allclose(got[0, :5], 0.5 * newq[0].astype(np.float64) - 1.0, rtol=1e-6)
        np.testing.assert_array_equal(got[0, 5:], np.full(5, 0.25, np.float32))
        with pytest.raises(flame.InvalidArgumentError, match=r"rows 5..6 \(2 rows\) are not within 0..5"):
            bag.update_rows(1, 5, np.zeros((2, 5), np.float16))
        # a float table takes numbers it can hold; int8 is never cast (200 would wrap)
        with pytest.raises(flame.InvalidArgumentError, match="values: 100000.0 does not fit table 1's float16"):
            bag.update_rows(1, 0, np.full((1, 5), 1e5, np.float32))
        with pytest.raises(flame.DTypeError, match="values are int64; table 0 holds int8"):
            bag.update_rows(0, 0, [[200] * 5], np.ones((1, 2), np.float32))
        # table and first_row are checked whole, not by their low bits (2**32 was table 0)
        for args, err, what in (((2**32, 0), flame.InvalidArgumentError, "table = 4294967296 is outside"),
                                ((1, 2**64 + 1), flame.InvalidArgumentError, "first_row = 18446744073709551617"),
                                ((1, 1.7), flame.DTypeError, "first_row must be an int, got float")):
            with pytest.raises(err, match=what):
                bag.update_rows(*args, newh)
        np.testing.assert_array_equal(bag([[2], [4]]), got)  # nothing written by the refused calls


def test_embedding_bag_borrow_rules():
    """copy=False uses the caller's array itself: a copy made on the way would leave updates
    behind, and a read-only one must not be written."""
    t = RNG.uniform(-1, 1, (8, 4)).astype(np.float32)
    with pytest.raises(flame.ShapeError, match="table 0: copy=False borrows the float32 table in place: it must "
                                               "be C-contiguous"):
        fk.EmbeddingBag([t[:, ::2]], copy=False)
    q = np.zeros((8, 4), np.int8)
    with pytest.raises(flame.DTypeError, match="table 1: copy=False borrows the qparams in place: it must be float32"):
        fk.EmbeddingBag([t, (q, np.ones((8, 2)))], copy=False)
    with pytest.raises(flame.ShapeError, match="table 1: copy=False borrows the float16 table in place: it must "
                                               "be C-contiguous"):
        fk.EmbeddingBag([t, t.astype(np.float16)[:, ::2]], copy=False)
    with pytest.raises(flame.ShapeError, match="table 0: copy=False borrows the bfloat16 table in place"):
        fk.EmbeddingBag([("bfloat16", bf16_bits(t)[::2])], copy=False)
    with fk.EmbeddingBag([t], copy=False) as bag:  # writeable: updates land in the caller's array
        bag.update_rows(0, 3, [[7, 7, 7, 7]])  # numbers a float table can hold are converted
        assert t[3].tolist() == [7.0] * 4
    # float16 and bfloat16 tables beside float32 ones are borrowed too: read and updated in place
    h, b = t.astype(np.float16), bf16_bits(np.round(t * 64) / 64)
    with fk.EmbeddingBag([t, h, ("bfloat16", b)], copy=False) as bag:
        h[5] = 0.5
        b[5] = bf16_bits(np.full(4, -2.0))
        np.testing.assert_array_equal(bag([[5], [5], [5]]), [[*t[5], 0.5, 0.5, 0.5, 0.5, -2.0, -2.0, -2.0, -2.0]])
        bag.update_rows(1, 2, [[1, 2, 3, 4]])
        bag.update_rows(2, 2, bf16_bits(np.array([[1, 2, 3, 4]], np.float32)))
        assert h[2].tolist() == [1, 2, 3, 4] and bf16_value(b[2]).tolist() == [1, 2, 3, 4]
    hr = h.copy()
    hr.flags.writeable = False
    with fk.EmbeddingBag([hr], copy=False) as bag:  # a read-only float16 table is read, never written
        with pytest.raises(flame.InvalidArgumentError, match="table 0 is borrowed read-only memory"):
            bag.update_rows(0, 0, np.zeros((1, 4), np.float16))
    ro = t.copy()
    ro.flags.writeable = False
    with fk.EmbeddingBag([ro], copy=False) as bag:  # read-only memory (a read-only mmap, bytes) is read
        np.testing.assert_array_equal(bag([[5]]), ro[5:6])
        with pytest.raises(flame.InvalidArgumentError, match="table 0 is borrowed read-only memory"):
            bag.update_rows(0, 0, np.zeros((1, 4), np.float32))
    assert ro[0].tolist() == t[0].tolist()
    with fk.EmbeddingBag([ro]) as bag:  # copied: its own memory, updatable
        bag.update_rows(0, 0, np.zeros((1, 4), np.float32))
        assert bag([[0]]).tolist() == [[0.0] * 4]
    with pytest.raises(flame.InvalidArgumentError, match="threads = 4294967298 is outside"):
        fk.EmbeddingBag([t], threads=2**32 + 2)


def reference_attention(q, k, v, ch, cc, heads, mask):
    rows, w = q.shape
    dh = w // heads
    out = np.zeros((rows, w))
    for s in range(len(ch) - 1):
        n, m = ch[s + 1] - ch[s], (cc[s + 1] - cc[s]) if cc is not None else 0
        r0, L = ch[s] + (cc[s] if cc is not None else 0), n + m
        pos = np.arange(L)
        if mask == "none":
            vis = np.ones((L, L), bool)
        elif mask == "causal":
            vis = pos[None, :] <= pos[:, None]
        else:
            vis = np.where(pos[:, None] < n, pos[None, :] <= pos[:, None],
                           (pos[None, :] < n) | (pos[None, :] == pos[:, None]))
        for h in range(heads):
            c = slice(h * dh, (h + 1) * dh)
            S = q[r0:r0 + L, c].astype(np.float64) @ k[r0:r0 + L, c].astype(np.float64).T / np.sqrt(dh)
            S = np.where(vis, S, -np.inf)
            P = np.exp(S - S.max(1, keepdims=True)) if L else S
            P /= P.sum(1, keepdims=True) if L else 1
            out[r0:r0 + L, c] = P @ v[r0:r0 + L, c].astype(np.float64)
    return out


@pytest.mark.parametrize("mask", ["sumi", "causal", "none"])
@pytest.mark.parametrize("fused", [False, True])
def test_sumi_attention_against_reference(mask, fused):
    for _ in range(4):
        B, heads, dh = int(RNG.integers(1, 5)), int(RNG.integers(1, 4)), int(RNG.integers(1, 33))
        n = RNG.integers(0, 30, B) * (RNG.integers(0, 4, B) > 0)
        m = RNG.integers(0, 8, B) * (n > 0)
        ch = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
        cc = np.concatenate([[0], np.cumsum(m)]).astype(np.int64)
        rows, w = int(ch[-1] + cc[-1]), heads * dh
        if fused:
            big = RNG.uniform(-2, 2, (rows, 3 * w + 2)).astype(np.float32)
            qkv = big[:, :3 * w]
            q, k, v = qkv[:, :w], qkv[:, w:2 * w], qkv[:, 2 * w:]
            got = fk.sumi_attention(cu_history=ch, cu_candidates=cc, heads=heads, qkv=qkv, mask=mask, threads=2)
        else:
            q, k, v = (RNG.uniform(-2, 2, (rows, w)).astype(np.float32) for _ in range(3))
            got = fk.sumi_attention(q, k, v, ch, cc, heads=heads, mask=mask, threads=2)
        want = reference_attention(q, k, v, ch, cc, heads, mask)
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_sumi_attention_rejections():
    q = RNG.uniform(-1, 1, (5, 8)).astype(np.float32)
    out = np.full((5, 8), np.nan, np.float32)
    with pytest.raises(flame.InvalidArgumentError, match=r"sequence 0: cu_history\[1\] = -1 is outside"):
        fk.sumi_attention(q, q, q, [0, -1, 5], heads=2, out=out)
    with pytest.raises(flame.InvalidArgumentError, match="rows 5, the sequences hold 4 history"):
        fk.sumi_attention(q, q, q, [0, 4], heads=2, out=out)
    with pytest.raises(flame.InvalidArgumentError, match="out overlaps"):
        fk.sumi_attention(q, q, q, [0, 5], heads=2, out=q)
    with pytest.raises(flame.DTypeError):
        fk.sumi_attention(q.astype(np.float16), q, q, [0, 5], heads=2)
    with pytest.raises(flame.ShapeError, match=r"cu_history must be 1-D, got shape \(2, 1\)"):
        fk.sumi_attention(q, q, q, [[0], [5]], heads=2, out=out)  # not flattened into [0, 5]
    with pytest.raises(flame.InvalidArgumentError, match="heads = 4294967298 is outside"):
        fk.sumi_attention(q, q, q, [0, 5], heads=2**32 + 2, out=out)  # not its low bits (2)
    with pytest.raises(flame.ShapeError, match="have 8 columns, not a multiple of 3 heads"):
        fk.sumi_attention(q, q, q, [0, 5], heads=3, out=out)
    with pytest.raises(flame.ShapeError, match=r"k \(5, 4\) and v \(5, 8\) must share one shape"):
        fk.sumi_attention(q, q[:, :4], q, [0, 5], heads=2, out=out)
    assert np.all(np.isnan(out))


def test_against_torch_where_installed():
    torch = pytest.importorskip("torch", reason="torch is not installed: the comparison with PyTorch is skipped")
    F = torch.nn.functional
    t = RNG.uniform(-1, 1, (50, 16)).astype(np.float32)
    ids = RNG.integers(0, 50, 30).astype(np.int64)
    off = np.array([0, 3, 3, 10, 30], np.int64)
    w = RNG.uniform(-1, 1, 30).astype(np.float32)
    with fk.EmbeddingBag([t], pooling="sum") as bag:
        got = bag([ids], [off], [w])
    want = F.embedding_bag(torch.from_numpy(ids), torch.from_numpy(t), torch.from_numpy(off[:-1]), mode="sum",
                           per_sample_weights=torch.from_numpy(w)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    n, m, heads, dh = 12, 4, 2, 8
    q, k, v = (RNG.uniform(-1, 1, (n + m, heads * dh)).astype(np.float32) for _ in range(3))
    got = fk.sumi_attention(q, k, v, [0, n], [0, m], heads=heads)
    pos = torch.arange(n + m)
    allowed = torch.where(pos[:, None] < n, pos[None, :] <= pos[:, None], (pos[None, :] < n) | (pos[None, :] == pos[:, None]))
    split = lambda x: torch.from_numpy(x).view(n + m, heads, dh).transpose(0, 1)
    want = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=allowed)
    np.testing.assert_allclose(got, want.transpose(0, 1).reshape(n + m, heads * dh).numpy(), rtol=1e-5, atol=1e-5)
