"""flame.tools.torch_ref (the PyTorch model), flame.export and `convert sasrec` against libflame
and the float64 numpy reference. Skipped where torch is not installed (CI); they run on
any machine with torch, e.g. the GPU machine."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the PyTorch reference/exporter tests are skipped")

import flame  # noqa: E402
import flame_testlib as lib  # noqa: E402
from flame_testlib import rel_err, score_scale  # noqa: E402
from flame.tools import convert, reference, st_io, torch_ref  # noqa: E402

RTOL = 1e-5  # fp32 vs fp32 (libflame) and fp32 vs fp64 (reference), relative to the largest score


def module_for(cfg, seed):
    """A FlameModel holding reference.random_model's weights, in eval mode."""
    t = reference.random_model(cfg, seed)
    m = torch_ref.FlameModel(cfg).eval()
    m.load_state_dict({k: torch.from_numpy(v) for k, v in t.items()})
    return m, {k: v.astype(np.float64) for k, v in t.items()}


def requests(cfg, seed):
    rng = np.random.default_rng(seed)
    ml = cfg["max_len"]
    return [lib.random_request(cfg, rng, n, m) for n, m in [(0, 3), (1, 1), (2, 7), (ml, 5), (ml + 5, 17)]]


ERRORS = []  # (torch vs libflame, torch vs reference) per request, for the summary below
CONFIGS = {**lib.CASES, **{f"random{s}": lib.random_config(np.random.default_rng(s)) for s in range(24)}}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_torch_matches_libflame_and_reference(tmp_path, name):
    cfg = CONFIGS[name]
    m, t64 = module_for(cfg, seed=11)
    path = tmp_path / "m.safetensors"
    assert flame.tools.export(m, path) == cfg
    with flame.Model(path) as fm, flame.Engine(fm) as engine:
        for i, r in enumerate(requests(cfg, seed=2)):
            ours = m.score(*r)
            assert ours.shape == (len(r[1]), 1 if cfg["head"]["type"] == "dot" else len(cfg["head"]["tasks"]))
            scale = score_scale(cfg, t64, r)
            err_c = rel_err(ours, engine.score(*r), scale)
            err_r = rel_err(ours, reference.score(cfg, t64, *r), scale)
            ERRORS.append((err_c, err_r))
            assert err_c < RTOL, f"{name} request {i}: torch vs libflame {err_c:.3g}"
            assert err_r < RTOL, f"{name} request {i}: torch vs reference {err_r:.3g}"


@pytest.mark.parametrize("name", ["pre_tanh_final_sumi_from_recent", "relu_concat_projection_side_sumi",
                                  "deep_pre_side_dot_projection", "random3", "random7"])
def test_gpu_parity(tmp_path, name):
    """PyTorch on the GPU against libflame on the CPU, and libflame's own GPU engine against
    PyTorch where this build and machine have one."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    cfg = CONFIGS[name]
    m, t64 = module_for(cfg, seed=11)
    path = tmp_path / "m.safetensors"
    flame.tools.export(m, path)
    m = m.cuda()
    with flame.Model(path) as fm, flame.Engine(fm) as cpu:
        try:
            gpu = flame.Engine(fm, device="cuda")
        except (flame.UnsupportedError, flame.NoDeviceError) as e:
            gpu = None
            print(f"libflame GPU engine not available: {e}")
        for i, r in enumerate(requests(cfg, seed=2)):
            ours, scale = m.score(*r), score_scale(cfg, t64, r)
            assert rel_err(ours, cpu.score(*r), scale) < RTOL, f"{name} request {i}: torch cuda vs libflame cpu"
            if gpu is not None:
                assert rel_err(ours, gpu.score(*r), scale) < RTOL, f"{name} request {i}: torch vs libflame cuda"
        if gpu is not None:
            gpu.close()


def test_parity_summary():
    """Prints the worst errors of the parity test above (run after it, in file order)."""
    if not ERRORS:
        pytest.skip("the parity test did not run")
    worst = np.max(np.array(ERRORS), axis=0)
    print(f"parity over {len(ERRORS)} requests, {len(CONFIGS)} configs: torch vs libflame {worst[0]:.2e}, "
          f"torch vs float64 reference {worst[1]:.2e}")
    assert worst[0] < RTOL and worst[1] < RTOL


def batch_of(cfg, reqs, width):
    """reqs as one left-padded batch of window `width` with padded side bags."""
    hist, lens = torch_ref.pad_histories([r[0] for r in reqs], cfg["max_len"])
    if width > hist.shape[1]:  # extra padding columns must change nothing
        hist = torch.cat([torch.full((len(reqs), width - hist.shape[1]), 7), hist], 1)
    L, M = hist.shape[1], max(len(r[1]) for r in reqs)
    cand = torch.zeros(len(reqs), M, dtype=torch.long)
    for b, r in enumerate(reqs):
        cand[b, :len(r[1])] = torch.from_numpy(np.asarray(r[1]))
    hs = cs = None
    if reqs[0][2] is not None:
        def pad(bags_list, rows, right):
            out = torch.full((len(reqs), rows, 4), -1, dtype=torch.long)
            for b, (o, i) in enumerate(bags_list):
                p = torch_ref.padded_bags(o, i, max(0, len(o) - 1 - cfg["max_len"]) if right else 0)
                if right:
                    out[b, rows - p.shape[0]:, :p.shape[1]] = p
                else:
                    out[b, :p.shape[0], :p.shape[1]] = p
            return out
        k = len(reqs[0][2])
        hs = [pad([r[2][s] for r in reqs], L, True) for s in range(k)]
        cs = [pad([r[3][s] for r in reqs], M, False) for s in range(k)]
    return hist, cand, lens, hs, cs


@pytest.mark.parametrize("name", ["pre_tanh_final_sumi_from_recent", "relu_concat_projection_side_sumi",
                                  "deep_pre_side_dot_projection", "random3", "random7"])
def test_batched_forward_equals_per_request(name):
    """Padding (of histories, candidates, bags, and extra window columns) changes no score."""
    cfg = CONFIGS[name]
    m, _ = module_for(cfg, seed=4)
    reqs = [r for r in requests(cfg, seed=5)]
    for width in (0, cfg["max_len"]):
        hist, cand, lens, hs, cs = batch_of(cfg, reqs, width)
        with torch.no_grad():
            got = m.predict(hist, cand, lens, hs, cs).numpy()
        for b, r in enumerate(reqs):
            want = m.score(*r)
            np.testing.assert_allclose(got[b, :len(r[1])], want, rtol=1e-5, atol=1e-6, err_msg=f"{name} user {b}")


@pytest.mark.parametrize("name", [n for n, c in CONFIGS.items() if c["head"]["type"] == "sumi"][:8])
def test_sdpa_attention_equals_the_masked_one(name):
    """attention = "sdpa" (two fused SDPA calls a block, histories without padding) gives the
    masked attention's scores, on full windows and on histories shorter than the window."""
    cfg = CONFIGS[name]
    m, _ = module_for(cfg, seed=8)
    rng = np.random.default_rng(9)
    for L in (1, max(1, cfg["max_len"] // 2), cfg["max_len"]):
        reqs = [lib.random_request(cfg, rng, L, 6) for _ in range(3)]
        hist, cand, _, hs, cs = batch_of(cfg, reqs, 0)
        assert hist.shape[1] == L
        with torch.no_grad():
            m.attention = "mask"
            want = m.predict(hist, cand, None, hs, cs).numpy()
            m.attention = "sdpa"
            got = m.predict(hist, cand, None, hs, cs).numpy()
        m.attention = "mask"
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{name} L {L}")


@pytest.mark.parametrize("name", [n for n, c in CONFIGS.items() if c["head"]["type"] == "sumi"][:8])
def test_sdpa_lse_attention_equals_the_masked_one(name):
    """attention = "sdpa_lse" (the candidates over the history alone, their own keys merged
    through the fused kernel's log-sum-exp) gives the masked attention's scores, on the CPU
    and, where there is one, on the GPU in fp16 (against float32 on the CPU: the fp16 model's
    own rounding is within the bound); also with no history (each candidate sees itself
    alone)."""
    cfg = CONFIGS[name]
    m, _ = module_for(cfg, seed=8)
    rng = np.random.default_rng(10)
    devices = [("cpu", torch.float32, 1e-5)] + ([("cuda", torch.float16, 1e-2)] if torch.cuda.is_available() else [])
    for dev, dtype, tol in devices:
        md = module_for(cfg, seed=8)[0].to(dev).to(dtype)
        kernel = md.use_sdpa_lse(dev, dtype)
        assert kernel in (("flash_cpu",) if dev == "cpu" else ("cudnn", "flash")), kernel
        assert md.attention == "sdpa_lse"
        for L in (0, 1, max(1, cfg["max_len"] // 2), cfg["max_len"]):
            reqs = [lib.random_request(cfg, rng, L, 6) for _ in range(3)]
            hist, cand, lens, hs, cs = batch_of(cfg, reqs, 0)
            if L == 0:  # the batch keeps one padding column: without it, a window of none
                assert (lens == 0).all() and hist.shape[1] == 1
                hist, hs = hist[:, 1:], hs if hs is None else [t[:, 1:] for t in hs]
            assert hist.shape[1] == L
            on = lambda ts: ts if ts is None else [t.to(dev) for t in ts]  # noqa: E731
            with torch.no_grad():
                want = m.predict(hist, cand, None, hs, cs).numpy()
                got = md.predict(hist.to(dev), cand.to(dev), None, on(hs), on(cs)).float().cpu().numpy()
            assert np.isfinite(got).all(), f"{name} {dev} L {L}"
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"{name} {dev} L {L}")


def test_training_step_has_finite_gradients_and_learns():
    """Padded batches (including an empty history) give finite gradients, and a few Adam
    steps fit a fixed target: the module is usable for training."""
    cfg = lib.CASES["pre_tanh_final_sumi_from_recent"]
    torch.manual_seed(0)
    m = torch_ref.FlameModel(cfg, dropout=0.1)
    hist, lens = torch_ref.pad_histories([[1, 2, 3], [], [4, 5, 6, 7, 8, 9, 10]], cfg["max_len"])
    cand = torch.tensor([[5, 6], [7, 8], [9, 10]])
    y = torch.tensor([[[1.0, 0, 1], [0, 1, 0]]] * 3)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(m(hist, cand, lens), y)
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("dtype", ["F32", "BF16"])
def test_export_and_from_file_round_trip(tmp_path, dtype):
    cfg = lib.CASES["relu_concat_projection_side_sumi"]
    m = torch_ref.FlameModel(cfg)
    path = tmp_path / "m.safetensors"
    flame.tools.export(m.state_dict(), path, cfg, dtype=dtype)  # a state_dict plus config works too
    meta, tensors, dtypes = st_io.read(path)
    assert json.loads(meta["flame.config"]) == cfg and set(dtypes.values()) == {dtype}
    back = torch_ref.FlameModel.from_file(path)
    for k, v in m.state_dict().items():
        want = v.numpy() if dtype == "F32" else st_io.bf16_bits_to_f32(st_io.f32_to_bf16_bits(v.numpy()))
        np.testing.assert_array_equal(back.state_dict()[k].numpy(), want, err_msg=k)


def test_export_refuses_wrong_tensors(tmp_path):
    cfg = lib.CASES["iclrec_like"]
    sd = torch_ref.FlameModel(cfg).state_dict()
    sd["extra.weight"] = torch.zeros(2)
    with pytest.raises(ValueError, match="unexpected tensor 'extra.weight'"):
        flame.tools.export(sd, tmp_path / "x.safetensors", cfg)
    del sd["extra.weight"], sd["blocks.0.ln1.bias"]
    with pytest.raises(ValueError, match="missing tensor 'blocks.0.ln1.bias'"):
        flame.tools.export(sd, tmp_path / "x.safetensors", cfg)
    with pytest.raises(ValueError, match="no config"):
        flame.tools.export({}, tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


# ---------------------------------------------------------------- convert sasrec


class SASRecLike(torch.nn.Module):
    """The computation of pmixer/SASRec.pytorch python/model.py, written from its description
    here (same parameter names): input item_emb * sqrt(d) + pos_emb[slot + 1] (row 0 = padding,
    zero), causal mask only, pre- or post-LN blocks of MultiheadAttention and a 1x1-conv ReLU
    FFN, last LayerNorm (eps 1e-8); score = <feats[-1], item_emb[c]>."""

    def __init__(self, items, d, blocks, heads, max_len, norm_first):
        super().__init__()
        nn = torch.nn
        self.item_emb = nn.Embedding(items + 1, d, padding_idx=0)
        self.pos_emb = nn.Embedding(max_len + 1, d, padding_idx=0)
        self.attention_layernorms = nn.ModuleList(nn.LayerNorm(d, eps=1e-8) for _ in range(blocks))
        self.attention_layers = nn.ModuleList(nn.MultiheadAttention(d, heads) for _ in range(blocks))
        self.forward_layernorms = nn.ModuleList(nn.LayerNorm(d, eps=1e-8) for _ in range(blocks))
        self.forward_layers = nn.ModuleList(nn.ModuleDict({"conv1": nn.Conv1d(d, d, 1), "conv2": nn.Conv1d(d, d, 1)})
                                            for _ in range(blocks))
        self.last_layernorm = nn.LayerNorm(d, eps=1e-8)
        self.norm_first = norm_first
        for p in self.parameters():  # non-trivial LayerNorm and bias values
            torch.nn.init.normal_(p, std=0.3)

    def ffn(self, i, x):
        f = self.forward_layers[i]
        return f["conv2"](torch.relu(f["conv1"](x.transpose(-1, -2)))).transpose(-1, -2)

    def scores(self, window):  # window: [L] ids, left-padded with 0
        L, d = len(window), self.item_emb.embedding_dim
        ids = torch.as_tensor(window)[None]
        x = self.item_emb(ids) * d ** 0.5 + self.pos_emb(torch.arange(1, L + 1) * (ids != 0))
        causal = ~torch.tril(torch.ones(L, L, dtype=torch.bool))
        for i, attn in enumerate(self.attention_layers):
            x = x.transpose(0, 1)
            if self.norm_first:
                q = self.attention_layernorms[i](x)
                x = (x + attn(q, q, q, attn_mask=causal)[0]).transpose(0, 1)
                x = x + self.ffn(i, self.forward_layernorms[i](x))
            else:
                x = self.attention_layernorms[i](x + attn(x, x, x, attn_mask=causal)[0]).transpose(0, 1)
                x = self.forward_layernorms[i](x + self.ffn(i, x))
        return self.item_emb.weight @ self.last_layernorm(x)[0, -1]


@pytest.mark.parametrize("norm_first", [False, True])
def test_convert_sasrec_matches_its_forward_on_full_windows(tmp_path, norm_first):
    torch.manual_seed(1)
    items, d, max_len = 30, 8, 6
    ref = SASRecLike(items, d, blocks=2, heads=2, max_len=max_len, norm_first=norm_first).eval()
    with torch.no_grad():
        ref.item_emb.weight[0] = 0
        ref.pos_emb.weight[0] = 0
    src = tmp_path / "SASRec.epoch=3.lr=0.001.layer=2.head=2.hidden=8.maxlen=6.pth"
    torch.save(ref.state_dict(), src)
    dst = tmp_path / "sasrec.safetensors"
    args = ["sasrec", str(src), str(dst)] + (["--norm", "pre"] if norm_first else [])
    assert convert.main(args) == 0  # head=2 and maxlen=6 come from the file name
    cfg, _ = reference.load(dst)
    assert cfg["blocks"]["num_heads"] == 2 and cfg["max_len"] == 6 and cfg["blocks"]["norm"] == ("pre" if norm_first else "post")
    rng = np.random.default_rng(0)
    with flame.Model(dst) as fm, flame.Engine(fm) as engine, torch.no_grad():
        for n in (max_len, max_len + 3):
            hist = rng.integers(1, items + 1, size=n)
            want = ref.scores(hist[-max_len:]).numpy()
            got = engine.score(hist, np.arange(items + 1))[:, 0]
            assert rel_err(got, want) < RTOL, (n, rel_err(got, want))
        # shorter histories: SASRec.pytorch also attends to its padding slots, flame does not
        hist = rng.integers(1, items + 1, size=3)
        padded = np.concatenate([np.zeros(max_len - 3, np.int64), hist])
        assert rel_err(engine.score(hist, np.arange(items + 1))[:, 0], ref.scores(padded).numpy()) > 1e-3


def test_convert_sasrec_errors(tmp_path, capsys):
    ref = SASRecLike(10, 4, blocks=1, heads=1, max_len=5, norm_first=False)
    sd = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    del sd["forward_layers.0.conv2.bias"]
    st_io.write(tmp_path / "in.safetensors", sd)
    assert convert.main(["sasrec", str(tmp_path / "in.safetensors"), str(tmp_path / "o.safetensors")]) == 2
    assert "missing tensor 'forward_layers.0.conv2.bias'" in capsys.readouterr().err
    sd = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    st_io.write(tmp_path / "in.safetensors", sd)
    assert convert.main(["sasrec", str(tmp_path / "in.safetensors"), str(tmp_path / "o.safetensors"),
                         "--max-len", "9"]) == 2
    assert "max_len 9 needs pos_emb rows 1..9" in capsys.readouterr().err
