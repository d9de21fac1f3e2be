"""The ONNX Runtime peer of bench/beauty_bench.c: the same Beauty model, the same users.

    .venv/bin/python bench/onnx_beauty.py build  FLAME_FILE OUT.onnx
    .venv/bin/python bench/onnx_beauty.py verify FLAME_FILE OUT.onnx Beauty.txt [--users 8]
    .venv/bin/python bench/onnx_beauty.py time   OUT.onnx Beauty.txt [--users 2000] [--warmup 200]
                                        [--batch 256] [--batch-users 10240] [--threads 2]

build: the graph is written with the `onnx` package straight from the flame file, as a
PyTorch export of the ICLRec/SASRec model would look (opset 17):
    ids int64 [B, 50] (the left-padded window, item 0 = padding)
    x = LayerNormalization(Gather(item_table, ids) + position_table)      (positions = slots 0..49)
    mask = (1 - (ids > 0)[:, None, None, :] * tril(50x50)) * -10000     (ICLRec's additive mask)
    per block (post-LN): a = Softmax(q k^T / sqrt(dh) + mask) v; x = LN(x + dense(a));
                         x = LN(x + fc2(gelu_erf(fc1(x))))   (gelu as x * 0.5 * (1 + Erf(x / sqrt 2)))
    scores float32 [B, num_items] = x[:, 49, :] @ item_table^T
Weights are float32 initializers; linear weights are stored transposed ([in, out]) for MatMul,
as a PyTorch export constant-folds them. ONNX Runtime's own graph optimizer (ORT_ENABLE_ALL)
fuses LayerNorm, Gelu and MatMul+Add on session creation.

verify: scores of a few users (short, medium and longer-than-50 histories) from ONNX Runtime,
from libflame (the Python binding in python/flame) and from the float64 numpy reference
(python/flame/tools/reference.py); prints the max abs differences as JSON, exit 1 if any is >= 1e-4.

time: ONNX Runtime on the CPU provider, intra_op_num_threads = --threads, inter_op 1,
sequential execution. Users are chosen exactly as beauty-bench does (batch 1: line
floor(i * lines / N); batch B: consecutive lines from 0, one untimed warm-up batch first).
Runs go through IOBinding with preallocated input/output OrtValues, so the Python cost per
call is one method call; that floor is measured on an Identity graph and reported
(`py_call_floor_us`). Prints one JSON object.
"""
import argparse
import json
import math
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))


# ------------------------------------------------------------------ data

def read_sequences(path):
    """Item lists of the lines with >= 2 items (the user id dropped), as beauty-bench reads them."""
    out = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) >= 3:
                out.append(np.array(p[1:], dtype=np.int64))
    return out


def window(history, max_len):
    """The left-padded window of the most recent max_len items (0 = padding)."""
    w = np.zeros(max_len, dtype=np.int64)
    h = history[-max_len:]
    if len(h):
        w[max_len - len(h):] = h
    return w


def b1_users(lines, n):
    return [int(i * lines / n) for i in range(n)]


def percentile(sorted_vals, p):
    """Nearest rank, the rule of beauty-bench."""
    n = len(sorted_vals)
    rank = min(max(int(p / 100.0 * n + 0.999999), 1), n)
    return float(sorted_vals[rank - 1])


# ------------------------------------------------------------------ graph

def build(flame_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from flame.tools import st_io, layout

    meta, t, _ = st_io.read(flame_path)
    cfg = layout.parse(meta["flame.config"])
    want = {"head": "dot", "norm": "post", "rule": "left_padded_slot", "activation": "gelu_erf"}
    got = {"head": cfg["head"]["type"], "norm": cfg["blocks"]["norm"], "rule": cfg["position"]["rule"],
           "activation": cfg["blocks"]["activation"]}
    if got != want or len(cfg["features"]) != 1 or cfg["features"][0]["input"] != "item" or cfg["projection"] \
            or not cfg["input_layernorm"] or cfg["final_layernorm"] or not cfg["layernorm"]["eps_inside_sqrt"]:
        raise SystemExit(f"onnx_beauty: only ICLRec/SASRec-shaped models (converter output) are supported, got {got}")
    d, L = cfg["d_model"], cfg["max_len"]
    H = cfg["blocks"]["num_heads"]
    dh = d // H
    eps = float(cfg["layernorm"]["eps"])
    table = t[f"tables.{cfg['head']['table']}.weight"].astype(np.float32)
    item = t[f"tables.{cfg['features'][0]['table']}.weight"].astype(np.float32)
    num_items = table.shape[0]

    inits, nodes = [], []

    def init(name, a, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.array(a, dtype=dtype, order="C"), name))  # keeps 0-d scalars 0-d
        return name

    def node(op, ins, outs=None, **kw):
        outs = outs or [f"{op.lower()}_{len(nodes)}"]
        nodes.append(helper.make_node(op, ins, outs, **kw))
        return outs[0]

    def linear(x, name):
        y = node("MatMul", [x, init(name + ".wT", t[name + ".weight"].T)])
        return node("Add", [y, init(name + ".b", t[name + ".bias"])])

    def layernorm(x, name):
        return node("LayerNormalization", [x, init(name + ".w", t[name + ".weight"]), init(name + ".b", t[name + ".bias"])],
                    axis=-1, epsilon=eps)

    # embeddings + positions (slots 0..L-1 of the left-padded window), input LayerNorm
    e = node("Gather", [init("item_table", item), "item_seq"], axis=0)
    x = node("Add", [e, init("position_table", t["position.weight"][:L])])
    x = layernorm(x, "input_ln")

    # ICLRec's additive mask: -10000 where the key is padding or after the query
    pad = node("Greater", ["item_seq", init("zero_i64", np.array(0), np.int64)])
    pad = node("Unsqueeze", [pad, init("axes_1_2", np.array([1, 2]), np.int64)])
    vis = node("And", [pad, init("causal", np.tril(np.ones((L, L), dtype=bool))[None, None], bool)])
    vis = node("Cast", [vis], to=TensorProto.FLOAT)
    neg = node("Sub", [init("one", np.array(1.0)), vis])
    mask = node("Mul", [neg, init("minus_10000", np.array(-10000.0))])

    split_shape = init("split_shape", np.array([0, L, H, dh]), np.int64)
    merge_shape = init("merge_shape", np.array([0, L, d]), np.int64)
    scale = init("inv_sqrt_dh", np.array(math.sqrt(dh)))
    for i in range(cfg["blocks"]["count"]):
        p = f"blocks.{i}."
        q = node("Transpose", [node("Reshape", [linear(x, p + "attn.q"), split_shape])], perm=[0, 2, 1, 3])
        k = node("Transpose", [node("Reshape", [linear(x, p + "attn.k"), split_shape])], perm=[0, 2, 3, 1])
        v = node("Transpose", [node("Reshape", [linear(x, p + "attn.v"), split_shape])], perm=[0, 2, 1, 3])
        s = node("Div", [node("MatMul", [q, k]), scale])
        s = node("Softmax", [node("Add", [s, mask])], axis=-1)
        a = node("Transpose", [node("MatMul", [s, v])], perm=[0, 2, 1, 3])
        a = linear(node("Reshape", [a, merge_shape]), p + "attn.o")
        x = layernorm(node("Add", [a, x]), p + "ln1")
        h = linear(x, p + "ffn.fc1")
        g = node("Erf", [node("Div", [h, init(p + "sqrt2", np.array(math.sqrt(2.0)))])])
        g = node("Mul", [node("Mul", [h, node("Add", [g, init(p + "one", np.array(1.0))])]),
                         init(p + "half", np.array(0.5))])
        x = layernorm(node("Add", [linear(g, p + "ffn.fc2"), x]), p + "ln2")

    last = node("Gather", [x, init("last_slot", np.array(L - 1), np.int64)], axis=1)  # [B, d]
    node("MatMul", [last, init("item_table_T", table.T)], ["scores"])

    graph = helper.make_graph(
        nodes, "iclrec_beauty",
        [helper.make_tensor_value_info("item_seq", TensorProto.INT64, ["B", L])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["B", num_items])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="libflame-bench")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model, cfg


def session(path, threads):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


class Runner:
    """IOBinding over preallocated buffers: ids[:] = ...; run(); read out."""

    def __init__(self, sess, batch, L, num_items, in_name="item_seq", out_name="scores", in_dtype=np.int64):
        import onnxruntime as ort
        self.sess = sess
        self.ids = np.zeros((batch, L), dtype=in_dtype)
        self.out = np.zeros((batch, num_items), dtype=np.float32)
        self.binding = sess.io_binding()
        self.binding.bind_ortvalue_input(in_name, ort.OrtValue.ortvalue_from_numpy(self.ids))
        self.binding.bind_ortvalue_output(out_name, ort.OrtValue.ortvalue_from_numpy(self.out))
        self.run = lambda: sess.run_with_iobinding(self.binding)


# ------------------------------------------------------------------ commands

def cmd_build(a):
    import onnx
    model, cfg = build(a.flame)
    onnx.save(model, a.out)
    print(json.dumps({"onnx": a.out, "nodes": len(model.graph.node), "bytes": os.path.getsize(a.out)}))


def cmd_verify(a):
    from flame.tools import reference
    try:
        from flame import Engine, Model  # the public binding (python/flame/engine.py)
    except ImportError:
        from flame._native import Engine, Model  # trees before it
    import onnxruntime as ort

    cfg, t64 = reference.load(a.flame)
    L, M = cfg["max_len"], cfg["tables"][0]["rows"]
    seqs = read_sequences(a.sequences)
    lens = np.array([len(s) - 1 for s in seqs])
    # short, median-ish and long (> max_len) histories, plus the first users of the b1 sample
    picks = [int(np.argmin(lens)), int(np.argmax(lens)), int(np.flatnonzero(lens > L)[0]),
             int(np.flatnonzero(lens == L)[0]) if np.any(lens == L) else 0]
    picks += b1_users(len(seqs), 2000)[: max(0, a.users - len(picks))]
    sess = session(a.onnx, 2)
    eng = Engine(Model(a.flame))
    cands = np.arange(M, dtype=np.int64)
    ids = np.stack([window(seqs[u][:-1], L) for u in picks])
    ort_s = sess.run(["scores"], {"item_seq": ids})[0]
    worst = {"ort_vs_libflame": 0.0, "ort_vs_reference": 0.0, "libflame_vs_reference": 0.0}
    for j, u in enumerate(picks):
        h = seqs[u][:-1]
        fl = eng.score(h, cands)[:, 0]
        ref = reference.score(cfg, t64, h, cands)[:, 0]
        worst["ort_vs_libflame"] = max(worst["ort_vs_libflame"], float(np.max(np.abs(ort_s[j] - fl))))
        worst["ort_vs_reference"] = max(worst["ort_vs_reference"], float(np.max(np.abs(ort_s[j] - ref))))
        worst["libflame_vs_reference"] = max(worst["libflame_vs_reference"], float(np.max(np.abs(fl - ref))))
    ok = all(v < 1e-4 for v in worst.values())
    print(json.dumps({"users": picks, "history_lens": [int(lens[u]) for u in picks],
                      "score_abs_max": float(np.max(np.abs(ort_s))), "max_abs_diff": worst,
                      "onnxruntime": ort.__version__, "ok": ok}))
    return 0 if ok else 1


def py_call_floor_us(threads, reps=3000):
    """P50 of one run_with_iobinding on an Identity graph: the Python + ORT per-call floor
    (None where the onnx package, which builds that graph, is not installed)."""
    try:
        import onnx  # noqa: F401
        from onnx import TensorProto, helper
    except ImportError:
        return None
    import onnxruntime as ort
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "floor",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    r = Runner(sess, 1, 1, 1, "x", "y", np.float32)
    lat = []
    for i in range(reps):
        t0 = time.perf_counter_ns()
        r.run()
        lat.append(time.perf_counter_ns() - t0)
    return percentile(sorted(lat[reps // 10:]), 50) / 1e3


def cmd_time(a):
    import onnxruntime as ort
    t0 = time.perf_counter()
    sess = session(a.onnx, a.threads)
    create_us = (time.perf_counter() - t0) * 1e6
    L = sess.get_inputs()[0].shape[1]
    M = sess.get_outputs()[0].shape[1]
    seqs = read_sequences(a.sequences)
    n = len(seqs)
    wins = [window(s[:-1], L) for s in seqs]  # prepared outside the timed region, as for libflame

    # batch 1
    r1 = Runner(sess, 1, L, M)
    users = b1_users(n, a.users)
    for i in range(a.warmup):
        r1.ids[0] = wins[users[i % a.users]]
        r1.run()
    lat = np.empty(a.users)
    checksum = 0.0
    for i, u in enumerate(users):
        r1.ids[0] = wins[u]
        t = time.perf_counter_ns()
        r1.run()
        lat[i] = (time.perf_counter_ns() - t) / 1e3
        checksum += float(r1.out[0, -1])
    mean = float(lat.mean())
    lat.sort()

    # batch B
    B = a.batch
    rb = Runner(sess, B, L, M)
    calls = (a.batch_users + B - 1) // B
    blat = []
    nxt = 0
    for w in range(1 + calls):
        for r in range(B):
            rb.ids[r] = wins[nxt]
            nxt = (nxt + 1) % n
        t = time.perf_counter_ns()
        rb.run()
        dt = (time.perf_counter_ns() - t) / 1e3
        if w:
            blat.append(dt)
        checksum += float(rb.out[-1, -1])
    total = sum(blat)
    blat.sort()
    floor = py_call_floor_us(a.threads)
    print(json.dumps({
        "system": "onnxruntime", "version": ort.__version__, "session_create_us": round(create_us, 1),
        "intra_op_num_threads": a.threads, "inter_op_num_threads": 1, "execution_mode": "sequential",
        "graph_optimization_level": "ORT_ENABLE_ALL",
        "b1": {"users": a.users, "warmup": a.warmup, "p50_us": round(percentile(lat, 50), 2),
               "p90_us": round(percentile(lat, 90), 2), "p99_us": round(percentile(lat, 99), 2),
               "mean_us": round(mean, 2), "min_us": round(float(lat[0]), 2)},
        "batch": {"batch": B, "calls": calls, "users": calls * B, "users_per_s": round(calls * B / (total / 1e6), 1),
                  "call_p50_us": round(percentile(blat, 50), 1), "call_min_us": round(blat[0], 1)},
        "py_call_floor_us": None if floor is None else round(floor, 2),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "checksum": checksum}))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="onnx_beauty.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("flame")
    b.add_argument("out")
    v = sub.add_parser("verify")
    v.add_argument("flame")
    v.add_argument("onnx")
    v.add_argument("sequences")
    v.add_argument("--users", type=int, default=8)
    t = sub.add_parser("time")
    t.add_argument("onnx")
    t.add_argument("sequences")
    t.add_argument("--users", type=int, default=2000)
    t.add_argument("--warmup", type=int, default=200)
    t.add_argument("--batch", type=int, default=256)
    t.add_argument("--batch-users", type=int, default=256 * 40)
    t.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    return {"build": cmd_build, "verify": cmd_verify, "time": cmd_time}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
