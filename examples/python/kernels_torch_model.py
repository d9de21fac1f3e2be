"""A PyTorch user tower whose embedding layer is flame.kernels.EmbeddingBag and whose attention
is flame.kernels.sumi_attention, checked against the same model in plain PyTorch.

The tower: three multi-hot sparse features pooled by a table-batched embedding bag (sum, one
bag per user and feature, concatenated) and a user history of item ids attended with the SUMI
mask together with candidate items (history causal; a candidate sees the history and itself),
then a linear head that scores each candidate. Runs on CUDA when torch and libflame both see a
GPU (tables, ids and activations stay on the device, on torch's current stream; attention in
float16), on the CPU otherwise (float32). Prints the largest absolute difference between the
two models' scores and exits non-zero when it is over the tolerance.

    PYTHONPATH=python python examples/python/kernels_torch_model.py [--device cpu|cuda] [--users 64]
"""
import argparse
import sys

import torch
import torch.nn.functional as F

import flame
import flame.kernels as fk

FEATURES = [(5000, 32), (800, 16), (120, 16)]  # (rows, dim) of the sparse feature tables
ITEMS, D, HEADS = 20000, 64, 4


class Tower(torch.nn.Module):
    """The weights, and the plain PyTorch forward (F.embedding_bag, masked SDPA)."""

    def __init__(self):
        super().__init__()
        self.tables = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(r, d) * 0.1) for r, d in FEATURES])
        self.items = torch.nn.Parameter(torch.randn(ITEMS, D) * 0.1)
        self.qkv = torch.nn.Linear(D, 3 * D)
        self.head = torch.nn.Linear(D + sum(d for _, d in FEATURES), 1)

    def pooled(self, ids, offsets):
        return torch.cat([F.embedding_bag(i, t, o, mode="sum", include_last_offset=True)
                          for t, i, o in zip(self.tables, ids, offsets)], 1)

    def attend(self, x, cu_hist, cu_cand):
        out = torch.empty_like(x)
        dh = D // HEADS
        q, k, v = self.qkv(x).split(D, 1)
        for s in range(len(cu_hist) - 1):
            n, m = int(cu_hist[s + 1] - cu_hist[s]), int(cu_cand[s + 1] - cu_cand[s])
            r0 = int(cu_hist[s] + cu_cand[s])
            pos = torch.arange(n + m, device=x.device)
            mask = torch.where(pos[:, None] < n, pos[None, :] <= pos[:, None],
                               (pos[None, :] < n) | (pos[None, :] == pos[:, None]))
            split = lambda t: t[r0:r0 + n + m].view(n + m, HEADS, dh).transpose(0, 1)
            o = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask)
            out[r0:r0 + n + m] = o.transpose(0, 1).reshape(n + m, D)
        return out

    def score(self, pooled, attended, cu_hist, cu_cand):
        """One score per candidate: the head over [its attended row, its user's pooled features]."""
        rows = []
        for s in range(len(cu_hist) - 1):
            n, m = int(cu_hist[s + 1] - cu_hist[s]), int(cu_cand[s + 1] - cu_cand[s])
            r0 = int(cu_hist[s] + cu_cand[s])
            cand = attended[r0 + n:r0 + n + m]
            rows.append(torch.cat([cand, pooled[s].expand(m, -1)], 1))
        return self.head(torch.cat(rows)).squeeze(1)

    def forward(self, batch):
        ids, offsets, seq, cu_hist, cu_cand = batch
        x = F.embedding(seq, self.items)
        return self.score(self.pooled(ids, offsets), self.attend(x, cu_hist, cu_cand), cu_hist, cu_cand)


class FlameTower(torch.nn.Module):
    """The same model with libflame's kernels: the sparse features and the history rows come
    from embedding bags (the history as one id a bag), the attention from sumi_attention."""

    def __init__(self, ref, device, attn_dtype):
        super().__init__()
        self.ref, self.attn_dtype = ref, attn_dtype
        on_gpu = device.type == "cuda"
        tabs = [t.detach() if on_gpu else t.detach().numpy() for t in ref.tables]
        self.bag = fk.EmbeddingBag(tabs, pooling="sum")  # CUDA tables are borrowed in place
        self.item_bag = fk.EmbeddingBag([ref.items.detach() if on_gpu else ref.items.detach().numpy()])

    def forward(self, batch):
        ids, offsets, seq, cu_hist, cu_cand = batch
        pooled = self.bag(ids, offsets=offsets, check=False)  # no wait for the stream here
        x = self.item_bag([seq], check=False)  # offsets None: one id a bag, a gather
        qkv = self.ref.qkv(x).to(self.attn_dtype)
        attended = fk.sumi_attention(qkv=qkv, cu_history=cu_hist, cu_candidates=cu_cand, heads=HEADS).float()
        return self.ref.score(pooled, attended, cu_hist, cu_cand)

    def check_indices(self):
        """Raises for a bad id the device found in the batches since the last check (one wait)."""
        self.bag.index_status()
        self.item_bag.index_status()


def make_batch(users, device):
    ids, offsets = [], []
    for rows, _ in FEATURES:
        sizes = torch.randint(0, 6, (users,))
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)]).to(device))
        ids.append(torch.randint(0, rows, (int(sizes.sum()),)).to(device))
    n = torch.randint(0, 120, (users,))
    m = torch.randint(1, 20, (users,))
    cu_hist = torch.cat([torch.zeros(1, dtype=torch.int64), n.cumsum(0)])  # host data (see flame.kernels)
    cu_cand = torch.cat([torch.zeros(1, dtype=torch.int64), m.cumsum(0)])
    seq = torch.randint(0, ITEMS, (int(n.sum() + m.sum()),)).to(device)
    return ids, offsets, seq, cu_hist, cu_cand


def gpu_usable():
    if not torch.cuda.is_available():
        return False
    try:
        fk.EmbeddingBag([torch.zeros(1, 1, device="cuda")])
        return True
    except (flame.NoDeviceError, flame.UnsupportedError):
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if gpu_usable() else "cpu")
    ap.add_argument("--users", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    attn_dtype = torch.float16 if device.type == "cuda" else torch.float32
    tol = 2e-2 if device.type == "cuda" else 1e-4
    with torch.no_grad():
        ref = Tower().to(device).eval()
        ours = FlameTower(ref, device, attn_dtype)
        batch = make_batch(args.users, device)
        want = ref(batch)
        got = ours(batch)
        ours.check_indices()
    diff = float((got - want).abs().max())
    print(f"device {device} users {args.users} candidates {got.numel()}: max |libflame - PyTorch| = {diff:.3g} "
          f"(tolerance {tol:g})")
    if not (diff <= tol):  # NaN fails too
        print("FAIL: over tolerance", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
