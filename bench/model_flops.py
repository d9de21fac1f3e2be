"""Useful FLOPs of one forward of a flame model (sumi head) for B users, L history items and
M candidates each: what a forward must compute, not what an implementation happens to.

    python3 bench/model_flops.py bench/ref_gr_config.json 32 1024 512

Counted (a multiply-add is 2 FLOPs; T = B * (L + M) tokens):
  - the input projection: 2 * T * e * d, e the width of the combined embedding bags
    (0 without a projection); the bags' sums are memory traffic, not counted;
  - every block but the last, for all T tokens: Q, K, V and output projections 2 * T * 4d^2,
    the FFN 2 * T * 2 * d * ffn, and attention over the pairs the SUMI mask allows
    (history causal, candidate sees the history and itself):
    4 * B * d * (L(L+1)/2 + M*L + M)  (QK^T and PV, d = heads * head dim);
  - the last block: K and V of the history tokens (2 * B * L * 2d^2; their other outputs
    feed nothing), and for the candidates Q, K, V, output, FFN and attention
    (4 * B * d * (M*L + M));
  - the task MLPs on the B * M candidates (2 * in * out per layer).
LayerNorm, GELU, softmax and biases are O(T * d) and left out, as in the usual MFU accounting
(PaLM, arXiv:2204.02311, appendix B)."""
import json
import sys


def forward_flops(cfg, B, L, M):
    d = cfg["d_model"]
    blocks = cfg["blocks"]
    nb, ffn = blocks["count"], blocks["ffn_dim"]
    T = B * (L + M)
    f = 0.0
    if cfg.get("projection"):
        dims = {t["name"]: t["dim"] for t in cfg["tables"]}
        widths = [dims[ft["table"]] for ft in cfg["features"]]
        e = max(widths) if cfg.get("combine", "sum") == "sum" else sum(widths)
        f += 2.0 * T * e * d
    dense = lambda n: 2.0 * n * (4 * d * d + 2 * d * ffn)  # noqa: E731
    pairs_all = L * (L + 1) / 2 + M * L + M
    for _ in range(nb - 1):
        f += dense(T) + 4.0 * B * d * pairs_all
    f += 2.0 * B * L * 2 * d * d + dense(B * M) + 4.0 * B * d * (M * L + M)
    head = cfg.get("head", {})
    for task in head.get("tasks", []):
        dims = [d] + list(task.get("hidden", [])) + [1]
        f += sum(2.0 * B * M * a * b for a, b in zip(dims, dims[1:]))
    return f


if __name__ == "__main__":
    cfg = json.load(open(sys.argv[1]))
    B, L, M = (int(x) for x in sys.argv[2:5])
    print(json.dumps({"B": B, "L": L, "M": M, "flops": forward_flops(cfg, B, L, M)}))
