"""flame.kernels over DLPack: the capsule import itself (shapes, strides, dtypes, devices, the
deleter called exactly once, read-only and non-contiguous inputs), through a numpy-backed
producer everywhere; then PyTorch tensors against torch.nn.functional.embedding_bag and a masked
scaled_dot_product_attention, on the CPU where torch is installed and on CUDA where a GPU is
usable (each skipped with its reason otherwise)."""
import sys

import numpy as np
import pytest

import flame
import flame.kernels as fk
from flame import _dlpack

RNG = np.random.default_rng()


class Producer:
    """Any DLPack producer that is not a numpy array (the kernels take numpy arrays directly),
    backed by a numpy array, of the current protocol (DLPack 1.x capsules, read-only flag);
    counts the exports."""

    def __init__(self, a):
        self.a = a
        self.exports = 0

    def __dlpack__(self, stream=None, max_version=None):
        self.exports += 1
        return self.a.__dlpack__(max_version=max_version)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class OldProducer(Producer):
    """A producer of the pre-1.0 protocol: no max_version, 'dltensor' capsules."""

    def __dlpack__(self, stream=None):
        self.exports += 1
        return self.a.__dlpack__()


# ---- the import itself

@pytest.mark.parametrize("kind", [Producer, OldProducer])
@pytest.mark.parametrize("dtype,code", [("float32", 2), ("float16", 2), ("int64", 0), ("int8", 0), ("uint16", 1)])
def test_view_reads_shape_strides_dtype_and_calls_the_deleter_once(dtype, code, kind):
    base = RNG.integers(-50, 50, (6, 10)).astype(dtype)
    a = base[1:5, ::3]  # non-contiguous: a row stride of 10 and a column stride of 3 elements
    prod = kind(a)
    refs = sys.getrefcount(a)
    v = _dlpack.View(prod)
    assert v.shape == (4, 4) and v.strides == (10, 3)
    assert v.dtype == (code, np.dtype(dtype).itemsize * 8) and v.device == (_dlpack.KDL_CPU, 0)
    assert v.ptr == a.__array_interface__["data"][0]
    view = v.array()
    np.testing.assert_array_equal(view, a)
    assert sys.getrefcount(a) > refs  # the exported tensor holds the array
    del view
    v.close()
    v.close()  # idempotent: the deleter ran once
    assert sys.getrefcount(a) == refs and prod.exports == 1
    assert not v.read_only


def test_view_array_keeps_the_producer_alive_and_releases_it_when_freed():
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    prod = Producer(base)
    refs = sys.getrefcount(base)
    arr = _dlpack.View(prod).array()  # the View itself is dropped here
    assert sys.getrefcount(base) > refs
    np.testing.assert_array_equal(arr, base)
    del arr
    assert sys.getrefcount(base) == refs


def test_read_only_flag_gives_a_read_only_view():
    a = np.arange(6, dtype=np.int64)
    a.flags.writeable = False
    v = _dlpack.View(Producer(a))
    assert v.read_only
    arr = v.array()
    assert not arr.flags.writeable
    np.testing.assert_array_equal(arr, a)
    with pytest.raises(BufferError):  # the old protocol cannot say read-only: numpy refuses to export
        _dlpack.View(OldProducer(a))


class ClaimsCuda(Producer):
    """Says its tensor is on CUDA device 0 (it is not): where the device decides, this is refused."""

    def __dlpack_device__(self):
        return (_dlpack.KDL_CUDA, 0)


def test_devices_are_read_and_mixed_devices_refused():
    ids = np.arange(4, dtype=np.int64)
    with pytest.raises(flame.InvalidArgumentError, match="__dlpack_device__ said device type 2"):
        _dlpack.View(ClaimsCuda(ids))
    bag = fk.EmbeddingBag([np.ones((10, 3), np.float32)])
    with pytest.raises(flame.InvalidArgumentError, match="host arrays or all CUDA tensors"):
        bag([ClaimsCuda(ids)])
    q = np.ones((4, 8), np.float32)
    with pytest.raises(flame.InvalidArgumentError, match="on the host or all CUDA tensors"):
        fk.sumi_attention(ClaimsCuda(q), q, q, [0, 4], heads=2)
    with pytest.raises(flame.InvalidArgumentError, match="host arrays or all CUDA tensors"):
        fk.EmbeddingBag([np.ones((10, 3), np.float32), ClaimsCuda(np.ones((5, 3), np.float32))])


def test_compact_and_empty_tensors():
    v = _dlpack.View(Producer(np.zeros((0, 5), dtype=np.float32)))
    assert v.shape == (0, 5) and v.array().shape == (0, 5)
    v = _dlpack.View(Producer(np.ones(7, dtype=np.int64)))
    assert v.shape == (7,) and v.strides == (1,)


def test_a_producer_without_a_capsule_is_refused():
    class Bad:
        def __dlpack__(self, stream=None):
            return object()

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(flame.InvalidArgumentError, match="dltensor"):
        _dlpack.View(Bad())


# ---- the kernels through a DLPack producer (numpy-backed, so everywhere)

def test_embedding_bag_through_dlpack_matches_numpy_inputs():
    tables = [RNG.uniform(-1, 1, (50, 8)).astype(np.float32), RNG.uniform(-1, 1, (30, 4)).astype(np.float16)]
    ids = [RNG.integers(0, 50, 20), RNG.integers(0, 30, 9)]
    offs = [np.array([0, 5, 5, 20]), np.array([0, 3, 6, 9])]
    w = [None, RNG.uniform(0, 2, 9).astype(np.float32)]
    want = fk.EmbeddingBag(tables, pooling=["sum", "mean"])(ids, offsets=offs, weights=w)
    bag = fk.EmbeddingBag([Producer(t) for t in tables], pooling=["sum", "mean"])
    got = bag([Producer(i) for i in ids], offsets=[Producer(o) for o in offs],
              weights=[None, Producer(w[1])])
    np.testing.assert_array_equal(got, want)
    # a caller's output through DLPack is written in place and handed back
    out = np.full((3, 12), np.nan, dtype=np.float32)
    res = bag(ids, offsets=offs, weights=w, out=Producer(out))
    assert isinstance(res, Producer) and res.a is out
    np.testing.assert_array_equal(out, want)


def test_read_only_and_non_contiguous_inputs():
    t = RNG.uniform(-1, 1, (40, 6)).astype(np.float32)
    t.flags.writeable = False  # a read-only table and read-only ids are fine: they are only read
    ids = RNG.integers(0, 40, 24)
    ids.flags.writeable = False
    bag = fk.EmbeddingBag([t])
    want = t.astype(np.float64)[ids[::2]]
    # non-contiguous ids (every second one), as numpy and through DLPack: taken (copied to int64)
    np.testing.assert_allclose(bag([ids[::2]]), want, rtol=1e-6)
    np.testing.assert_allclose(bag([Producer(ids[::2])]), want, rtol=1e-6)
    out = np.zeros((12, 6), dtype=np.float32)
    out.flags.writeable = False
    with pytest.raises(flame.ShapeError, match="writeable"):
        bag([ids[::2]], out=out)
    with pytest.raises(flame.ShapeError, match="writeable"):  # read-only through DLPack too
        bag([ids[::2]], out=Producer(out))
    # a row-strided output is written in place; a column-strided one is refused
    wide = np.full((12, 9), np.nan, dtype=np.float32)
    bag([ids[::2]], out=wide[:, :6])
    np.testing.assert_allclose(wide[:, :6], want, rtol=1e-6)
    assert np.isnan(wide[:, 6:]).all()
    with pytest.raises(flame.ShapeError, match="unit column"):
        bag([ids[::2]], out=np.zeros((12, 12), dtype=np.float32)[:, ::2])


def test_sumi_attention_through_dlpack_matches_numpy_inputs():
    heads, dh, ch, cc = 2, 8, np.array([0, 5, 9]), np.array([0, 3, 3])
    rows = 12
    qkv = RNG.uniform(-1, 1, (rows, 3 * heads * dh)).astype(np.float32)
    want = fk.sumi_attention(qkv=qkv, cu_history=ch, cu_candidates=cc, heads=heads)
    got = fk.sumi_attention(qkv=Producer(qkv), cu_history=Producer(ch), cu_candidates=Producer(cc), heads=heads)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(flame.ShapeError, match="unit column"):
        fk.sumi_attention(qkv=Producer(np.zeros((rows, 6 * heads * dh), dtype=np.float32)[:, ::2]), cu_history=ch,
                          cu_candidates=cc, heads=heads)


# ---- PyTorch

def _torch():
    return pytest.importorskip("torch", reason="torch is not installed: the PyTorch tests are skipped")


def sumi_allowed(torch, n, m, mask):
    pos = torch.arange(n + m)
    if mask == "none":
        return torch.ones(n + m, n + m, dtype=torch.bool)
    if mask == "causal":
        return pos[None, :] <= pos[:, None]
    return torch.where(pos[:, None] < n, pos[None, :] <= pos[:, None],
                       (pos[None, :] < n) | (pos[None, :] == pos[:, None]))


def torch_attention(torch, q, k, v, ch, cc, heads, mask):
    """The masked SDPA of every sequence, in float64 on the CPU."""
    F = torch.nn.functional
    q, k, v = (x.detach().to("cpu", torch.float64) for x in (q, k, v))
    out = torch.zeros_like(q)
    dh = q.shape[1] // heads
    for s in range(len(ch) - 1):
        n, m = int(ch[s + 1] - ch[s]), int(cc[s + 1] - cc[s])
        r0 = int(ch[s] + cc[s])
        if n + m == 0:
            continue
        split = lambda x: x[r0:r0 + n + m].view(n + m, heads, dh).transpose(0, 1)
        o = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=sumi_allowed(torch, n, m, mask))
        out[r0:r0 + n + m] = o.transpose(0, 1).reshape(n + m, heads * dh)
    return out


def ragged(torch, num_seqs, max_n, max_m):
    n = torch.randint(0, max_n + 1, (num_seqs,))
    m = torch.randint(0, max_m + 1, (num_seqs,))
    ch = torch.cat([torch.zeros(1, dtype=torch.int64), n.cumsum(0)])
    cc = torch.cat([torch.zeros(1, dtype=torch.int64), m.cumsum(0)])
    return ch, cc, int(ch[-1] + cc[-1])


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_torch_cpu_embedding_bag_against_functional(mode):
    torch = _torch()
    F = torch.nn.functional
    tables = [torch.randn(100, 16), torch.randn(60, 8).to(torch.bfloat16), torch.randn(30, 4).to(torch.float16)]
    batch = 17
    ids, offs = [], []
    for t in tables:
        sizes = torch.randint(0, 6, (batch,))
        o = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)])
        ids.append(torch.randint(0, t.shape[0], (int(o[-1]),)))
        offs.append(o)
    w = [torch.rand(len(i)) * 2 for i in ids] if mode == "sum" else None
    bag = fk.EmbeddingBag(tables, pooling=mode)
    got = bag(ids, offsets=offs, weights=w)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and got.shape == (batch, 28)
    want = torch.cat([F.embedding_bag(i, t.double(), o, mode=mode, include_last_offset=True,
                                      per_sample_weights=None if w is None else w[j].double())
                      for j, (t, i, o) in enumerate(zip(tables, ids, offs))], 1)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # int32 ids are taken as well; a bad id names the table, the bag and the value
    got32 = bag([i.to(torch.int32) for i in ids], offsets=offs, weights=w)
    torch.testing.assert_close(got32, got, rtol=0, atol=0)
    bad = [i.clone() for i in ids]
    bad[1][0] = 60
    bag_of = int(torch.searchsorted(offs[1], torch.tensor(0), right=True)) - 1
    with pytest.raises(flame.InvalidArgumentError, match=f"table 1 bag {bag_of}: ids\\[0\\] = 60 is outside 0..59"):
        bag(bad, offsets=offs, weights=w)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_cpu_embedding_bag_half_tables_and_outputs(dtype):
    """CPU tensors of float16 or bfloat16 borrowed in place (copy=False: a change to the tensor
    shows in the next lookup), and outputs of that dtype: torch tensors holding the float32
    output rounded by torch's own conversion (to nearest even), bit for bit."""
    torch = _torch()
    dt = getattr(torch, dtype)
    tables = [torch.randn(80, 16).to(dt), torch.randn(40, 8)]
    batch = 23
    ids, offs = [], []
    for t in tables:
        o = torch.cat([torch.zeros(1, dtype=torch.int64), torch.randint(0, 6, (batch,)).cumsum(0)])
        ids.append(torch.randint(0, t.shape[0], (int(o[-1]),)))
        offs.append(o)
    bag = fk.EmbeddingBag(tables, pooling="mean", copy=False)
    f32 = bag(ids, offsets=offs)
    assert f32.dtype == torch.float32
    want = torch.cat([torch.nn.functional.embedding_bag(i, t.double(), o, mode="mean", include_last_offset=True)
                      for t, i, o in zip(tables, ids, offs)], 1)
    torch.testing.assert_close(f32.double(), want, rtol=1e-5, atol=1e-5)
    half = bag(ids, offsets=offs, out_dtype=dtype)
    assert half.dtype == dt and half.shape == (batch, 24)
    assert torch.equal(half.view(torch.int16), f32.to(dt).view(torch.int16))
    tables[0].zero_()  # borrowed: the next lookup reads the tensor as it is now
    again = bag(ids, offsets=offs)
    assert torch.equal(again[:, :16], torch.zeros(batch, 16)) and torch.equal(again[:, 16:], f32[:, 16:])


@pytest.mark.parametrize("mask", ["sumi", "causal", "none"])
def test_torch_cpu_attention_against_masked_sdpa(mask):
    torch = _torch()
    heads, dh = 3, 16
    ch, cc, rows = ragged(torch, 6, 20, 7)
    wide = torch.randn(rows, 3 * heads * dh + 5)  # Q, K, V as row-strided views of one tensor
    q, k, v = (wide[:, i * heads * dh:(i + 1) * heads * dh] for i in range(3))
    got = fk.sumi_attention(q, k, v, ch, cc, heads=heads, mask=mask)
    assert isinstance(got, torch.Tensor) and got.shape == (rows, heads * dh)
    torch.testing.assert_close(got.double(), torch_attention(torch, q, k, v, ch, cc, heads, mask), rtol=1e-4,
                               atol=1e-5)
    with pytest.raises(flame.ShapeError, match="unit column"):
        fk.sumi_attention(q.t().contiguous().t(), k, v, ch, cc, heads=heads)


def _cuda():
    torch = _torch()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device usable by torch: the GPU DLPack tests are skipped")
    try:
        fk.EmbeddingBag([np.zeros((1, 1), np.float32)], device="cuda")
    except (flame.NoDeviceError, flame.UnsupportedError) as e:
        pytest.skip(f"libflame has no usable GPU: {e}")
    return torch


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_cuda_embedding_bag_device_ids(dtype):
    torch = _cuda()
    F = torch.nn.functional
    dt = getattr(torch, dtype)
    tables = [torch.randn(1000, 64, device="cuda").to(dt), torch.randn(500, 32, device="cuda").to(dt)]
    batch = 300
    ids, offs = [], []
    for t in tables:
        sizes = torch.randint(0, 8, (batch,), device="cuda")
        o = torch.cat([torch.zeros(1, dtype=torch.int64, device="cuda"), sizes.cumsum(0)])
        ids.append(torch.randint(0, t.shape[0], (int(o[-1]),), device="cuda"))
        offs.append(o)
    w = [torch.rand(len(i), device="cuda") for i in ids]
    bag = fk.EmbeddingBag(tables, pooling="sum")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # the current stream is the one the lookup is enqueued on
        got = bag(ids, offsets=offs, weights=w, out_dtype=dtype)
    s.synchronize()
    assert got.device.type == "cuda" and got.dtype == dt and got.shape == (batch, 96)
    want = torch.cat([F.embedding_bag(i, t.double(), o, mode="sum", include_last_offset=True,
                                      per_sample_weights=wi.double()) for t, i, o, wi in zip(tables, ids, offs, w)], 1)
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * 4)
    # a bad device id: raised by check=True, or later by index_status with check=False
    bad = [i.clone() for i in ids]
    bad[0][3] = 1000
    with pytest.raises(flame.InvalidArgumentError, match="ids\\[3\\] = 1000 is outside 0..999"):
        bag(bad, offsets=offs, weights=w, out_dtype=dtype)
    out = torch.full((batch, 96), float("nan"), device="cuda", dtype=dt)
    bag(bad, offsets=offs, weights=w, out=out, out_dtype=dtype, check=False)
    with pytest.raises(flame.InvalidArgumentError, match="table 0 bag"):
        bag.index_status()
    assert torch.isnan(out.float()).all()  # nothing written
    bag.index_status()  # cleared


def test_torch_cuda_tensors_a_call_makes_stay_its_streams_until_its_work_is_done():
    """An output the call allocates (and int32 ids it converts) come from torch's allocator on the
    current stream; a lookup enqueued on another stream must keep that memory from the next
    allocation until the stream has run it. The other stream is kept busy past the call."""
    torch = _cuda()
    bag = fk.EmbeddingBag([torch.randn(1000, 64, device="cuda")], pooling="sum")
    ids = [torch.randint(0, 1000, (4096,), device="cuda", dtype=torch.int32)]
    offs = [torch.arange(0, 4097, 8, device="cuda")]
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU cycles ahead of the lookup
    out = bag(ids, offsets=offs, stream=s, check=False)
    ptr = out.data_ptr()
    del out
    again = torch.empty((512, 64), device="cuda")  # the same size, on the current stream
    assert again.data_ptr() != ptr, "the lookup's output memory was handed out while its stream still had to write it"
    s.synchronize()
    want = bag(ids, offsets=offs)
    torch.cuda.synchronize()
    assert want.shape == (512, 64) and torch.isfinite(want).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_cuda_attention_against_masked_sdpa(dtype):
    torch = _cuda()
    heads, dh = 4, 64
    ch, cc, rows = ragged(torch, 5, 300, 40)
    qkv = torch.randn(rows, 3 * heads * dh, device="cuda").to(getattr(torch, dtype))
    got = fk.sumi_attention(qkv=qkv, cu_history=ch, cu_candidates=cc, heads=heads)
    torch.cuda.synchronize()
    q, k, v = qkv.split(heads * dh, 1)
    tol = 2e-2 if dtype == "bfloat16" else 4e-3
    torch.testing.assert_close(got.double().cpu(), torch_attention(torch, q, k, v, ch, cc, heads, "sumi"), rtol=tol,
                               atol=tol)
