"""flame.tools.convert iclrec: name mapping, inferred config, errors, and the converted model's
forward against an ICLRec-style padded-window forward written from the Beauty README."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from conftest import REPO
from flame.tools import convert, reference, st_io

ITEMS, D, FFN, MAX_LEN, LAYERS = 23, 8, 20, 7, 2


def iclrec_state_dict(seed=0):
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.3  # noqa: E731
    sd = {"item_embeddings.weight": f(ITEMS, D), "position_embeddings.weight": f(MAX_LEN, D),
          "LayerNorm.weight": 1 + f(D), "LayerNorm.bias": f(D)}
    for i in range(LAYERS):
        p = f"item_encoder.layer.{i}."
        for m in ("query", "key", "value", "dense"):
            sd[p + f"attention.{m}.weight"], sd[p + f"attention.{m}.bias"] = f(D, D), f(D)
        for ln in ("attention.LayerNorm", "intermediate.LayerNorm"):
            sd[p + ln + ".weight"], sd[p + ln + ".bias"] = 1 + f(D), f(D)
        sd[p + "intermediate.dense_1.weight"], sd[p + "intermediate.dense_1.bias"] = f(FFN, D), f(FFN)
        sd[p + "intermediate.dense_2.weight"], sd[p + "intermediate.dense_2.bias"] = f(D, FFN), f(D)
    return sd


def run_convert(tmp_path, sd, *extra):
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file(sd, str(src))
    return convert.main(["iclrec", str(src), str(dst), *extra]), dst


def test_names_shapes_and_config(tmp_path):
    sd = iclrec_state_dict()
    rc, dst = run_convert(tmp_path, sd)
    assert rc == 0
    meta, t, dtypes = st_io.read(dst)
    cfg = json.loads(meta["flame.config"])
    assert cfg["d_model"] == D and cfg["max_len"] == MAX_LEN and cfg["tables"] == [{"name": "item", "rows": ITEMS, "dim": D}]
    assert cfg["blocks"] == {"count": LAYERS, "num_heads": 2, "ffn_dim": FFN, "norm": "post", "activation": "gelu_erf"}
    assert cfg["position"] == {"rule": "left_padded_slot", "rows": MAX_LEN, "candidate_position": -1}
    assert cfg["layernorm"] == {"eps": 1e-12, "eps_inside_sqrt": True}
    assert cfg["head"] == {"type": "dot", "table": "item"} and cfg["input_layernorm"] and not cfg["final_layernorm"]
    assert set(dtypes.values()) == {"F32"} and len(t) == len(sd)
    pairs = {"tables.item.weight": "item_embeddings.weight", "position.weight": "position_embeddings.weight",
             "input_ln.bias": "LayerNorm.bias", "blocks.1.attn.o.weight": "item_encoder.layer.1.attention.dense.weight",
             "blocks.0.ln1.weight": "item_encoder.layer.0.attention.LayerNorm.weight",
             "blocks.1.ln2.bias": "item_encoder.layer.1.intermediate.LayerNorm.bias",
             "blocks.0.ffn.fc2.weight": "item_encoder.layer.0.intermediate.dense_2.weight",
             "blocks.1.attn.k.bias": "item_encoder.layer.1.attention.key.bias"}
    for ours, theirs in pairs.items():
        np.testing.assert_array_equal(t[ours], sd[theirs])
    reference.load(dst)  # passes the format's own tensor checks


def test_options_and_dtype(tmp_path):
    rc, dst = run_convert(tmp_path, iclrec_state_dict(), "--num-heads", "4", "--eps", "1e-5", "--dtype", "BF16")
    assert rc == 0
    cfg, _ = reference.load(dst)
    assert cfg["blocks"]["num_heads"] == 4 and cfg["layernorm"]["eps"] == 1e-5
    assert set(st_io.read(dst)[2].values()) == {"BF16"}


def test_unused_tensor_dropped_with_note(tmp_path, capsys):
    sd = iclrec_state_dict()
    sd["criterion.weight"] = np.ones(3, dtype=np.float32)
    rc, dst = run_convert(tmp_path, sd)
    assert rc == 0 and "criterion.weight" in capsys.readouterr().err
    assert "criterion.weight" not in st_io.read(dst)[1]


@pytest.mark.parametrize("drop", ["item_encoder.layer.1.intermediate.LayerNorm.bias", "position_embeddings.weight",
                                  "LayerNorm.weight", "item_encoder.layer.0.attention.value.weight"])
def test_missing_tensor_exits_2_naming_it(tmp_path, capsys, drop):
    sd = iclrec_state_dict()
    del sd[drop]
    rc, dst = run_convert(tmp_path, sd)
    assert rc == 2 and f"missing tensor '{drop}'" in capsys.readouterr().err and not dst.exists()


def test_bad_shape_and_heads_exit_2(tmp_path, capsys):
    sd = iclrec_state_dict()
    sd["item_encoder.layer.1.attention.query.weight"] = np.zeros((D, D + 1), dtype=np.float32)
    assert run_convert(tmp_path, sd)[0] == 2
    assert "item_encoder.layer.1.attention.query.weight" in capsys.readouterr().err
    assert run_convert(tmp_path, iclrec_state_dict(), "--num-heads", "3")[0] == 2
    assert "num_heads" in capsys.readouterr().err


def test_weights_libflame_would_refuse_are_not_written(tmp_path, capsys):
    """A NaN, or a value F16 cannot hold (it ends at 65504), would make a file libflame refuses
    to load: the converter says so instead of writing it."""
    sd = iclrec_state_dict()
    sd["item_embeddings.weight"][3, 1] = 1e5
    rc, dst = run_convert(tmp_path, sd, "--dtype", "F16")
    assert rc == 2 and "tensor 'tables.item.weight': value 100000.0 (flat index 25) overflows F16" in \
        capsys.readouterr().err and not dst.exists()
    assert run_convert(tmp_path, sd, "--dtype", "F32")[0] == 0  # F32 holds it
    sd["LayerNorm.bias"][2] = np.nan
    assert run_convert(tmp_path, sd)[0] == 2
    assert "value nan (flat index 2) is not finite" in capsys.readouterr().err


def test_zero_options_and_bad_headers_exit_2(tmp_path, capsys):
    assert run_convert(tmp_path, iclrec_state_dict(), "--num-heads", "0")[0] == 2  # not the default 2
    assert "--num-heads 0 must be at least 1" in capsys.readouterr().err
    bad = tmp_path / "bad.safetensors"
    for raw, what in ((b"1234", "too short for a safetensors header"),
                      ((10**12).to_bytes(8, "little") + b"{}", "header length 1000000000000 exceeds the file size"),
                      ((2).to_bytes(8, "little") + b"[]", "the safetensors header is not a JSON object")):
        bad.write_bytes(raw)
        assert convert.main(["iclrec", str(bad), str(tmp_path / "o.safetensors")]) == 2
        assert what in capsys.readouterr().err


def test_evaluate_refuses_ids_outside_the_table(tmp_path, capsys):
    from flame.tools import evaluate
    rc, dst = run_convert(tmp_path, iclrec_state_dict())
    data = tmp_path / "seq.txt"
    for text, what in (("1 2 -3 4\n", "seq.txt:1: item id -3 is outside 0..22"),  # numpy read -1 as the last
                       ("1 2 3\n2 23\n", "seq.txt:2: item id 23 is outside 0..22"),
                       ("1\n2\n", "no line has an item to hold out")):
        data.write_text(text)
        assert evaluate.main([str(dst), str(data)]) == 2
        assert what in capsys.readouterr().err


def test_cli_exit_status(tmp_path):
    sd = iclrec_state_dict()
    del sd["item_embeddings.weight"]
    save_file(sd, str(tmp_path / "in.safetensors"))
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    p = subprocess.run([sys.executable, "-m", "flame.tools.convert", "iclrec", str(tmp_path / "in.safetensors"),
                        str(tmp_path / "out.safetensors")], env=env, capture_output=True, text=True)
    assert p.returncode == 2 and "missing tensor 'item_embeddings.weight'" in p.stderr


def iclrec_forward(sd, history, heads=2):
    """ICLRec as the Beauty README describes it: left-padded window of MAX_LEN with item 0,
    position = slot, additive -10000 mask on padding keys and future keys, post-LN blocks."""
    sd = {k: v.astype(np.float64) for k, v in sd.items()}
    ln = lambda x, p: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12) \
        * sd[p + ".weight"] + sd[p + ".bias"]  # noqa: E731
    lin = lambda x, p: x @ sd[p + ".weight"].T + sd[p + ".bias"]  # noqa: E731
    ids = np.zeros(MAX_LEN, dtype=np.int64)
    h = list(history)[-MAX_LEN:]
    ids[MAX_LEN - len(h):] = h
    x = ln(sd["item_embeddings.weight"][ids] + sd["position_embeddings.weight"], "LayerNorm")
    keep = (ids > 0)[None, :] & np.tril(np.ones((MAX_LEN, MAX_LEN), dtype=bool))
    add = np.where(keep, 0.0, -10000.0)
    dh = D // heads
    for i in range(LAYERS):
        p = f"item_encoder.layer.{i}."
        q, k, v = (lin(x, p + f"attention.{m}").reshape(MAX_LEN, heads, dh).transpose(1, 0, 2)
                   for m in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(dh) + add
        s = np.exp(s - s.max(-1, keepdims=True))
        a = ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(MAX_LEN, D)
        x = ln(lin(a, p + "attention.dense") + x, p + "attention.LayerNorm")
        f = lin(x, p + "intermediate.dense_1")
        f = f * 0.5 * (1 + np.vectorize(math.erf)(f / math.sqrt(2)))
        x = ln(lin(f, p + "intermediate.dense_2") + x, p + "intermediate.LayerNorm")
    return sd["item_embeddings.weight"] @ x[-1]


@pytest.mark.parametrize("n", [1, 3, MAX_LEN, MAX_LEN + 4])
def test_converted_model_matches_iclrec_forward(tmp_path, n):
    sd = iclrec_state_dict(seed=n)
    rc, dst = run_convert(tmp_path, sd)
    cfg, t = reference.load(dst)
    history = np.random.default_rng(n).integers(1, ITEMS, size=n)  # item 0 is ICLRec's padding
    ours = reference.score(cfg, t, history, np.arange(ITEMS))[:, 0]
    np.testing.assert_allclose(ours, iclrec_forward(sd, history), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_written_files_get_the_mode_of_the_umask(tmp_path, umask):
    """safetensors writes 0600 files; a model a service account cannot read is a trap, so
    files get 0666 less the umask, as any file the process creates."""
    path = tmp_path / "m.flame"
    code = ("import os, sys\nos.umask(%d)\nsys.path.insert(0, %r)\nfrom flame import reference\n"
            "import flame_testlib as lib\ncfg = lib.CASES['iclrec_like']\n"
            "reference.save(%r, cfg, reference.random_model(cfg, 0))\n") % (umask, str(Path(__file__).parent), str(path))
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(REPO / "python")})
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
