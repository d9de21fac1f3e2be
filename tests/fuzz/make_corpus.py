"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/): small valid inputs
and edge cases of each format, so that the fuzzers start from the interesting parts.
Run from the repository root: python3 tests/fuzz/make_corpus.py (it replaces the files)."""
import json
import shutil
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tests" / "python")]
import flame_testlib  # noqa: E402
from flame.tools import reference  # noqa: E402

OUT = ROOT / "tests" / "fuzz" / "corpus"


def put(target, name, data):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def record(bags, dense=()):
    """The record encoding of docs/features.md."""
    head = struct.pack("<II", len(bags), len(dense)) + b"".join(struct.pack("<I", len(b)) for b in bags)
    head += b"\0" * (-len(head) % 8)
    return head + b"".join(struct.pack("<q", i) for b in bags for i in b) + struct.pack(f"<{len(dense)}f", *dense)


def safetensors(header):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    tiny = flame_testlib.config(d_model=4, max_len=3, tables=[{"name": "item", "rows": 5, "dim": 4}],
                                position={"rule": "left_padded_slot", "rows": 3, "candidate_position": -1},
                                blocks={"count": 1, "num_heads": 1, "ffn_dim": 4})
    side = flame_testlib.CASES["relu_concat_projection_side_sumi"]
    tmp = OUT.parent / "tmp.safetensors"
    for name, cfg in (("tiny_dot", tiny), ("tiny_sumi", dict(tiny, head=flame_testlib.SUMI_HEAD))):
        reference.save(tmp, cfg, reference.random_model(cfg, 1))
        put("safetensors", name, tmp.read_bytes())
    reference.save(tmp, tiny, reference.random_model(tiny, 1), dtype="F16")
    put("safetensors", "tiny_f16", tmp.read_bytes())
    tmp.unlink()
    put("safetensors", "empty_header", safetensors({}))
    put("safetensors", "metadata_only", safetensors({"__metadata__": {"flame.config": json.dumps(tiny)}}))
    put("safetensors", "one_tensor", safetensors({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}) +
        b"\0" * 8)
    put("safetensors", "short", b"\x08\0\0\0\0\0\0\0{}")

    for name, cfg in flame_testlib.CASES.items():
        put("config", name, json.dumps(cfg))
    put("config", "tiny", json.dumps(tiny))
    put("config", "trailing", json.dumps(tiny) + " x")

    put("feature_file", "basic", "# c\nflame-features 1 slots=2 dense=1\n1\t1,2\t3\t0.5\n2\t\t4\t-1\n")
    put("feature_file", "no_slots", "flame-features 1 slots=0 dense=0\n7\n")
    put("feature_file", "crlf", "flame-features 1 slots=1 dense=0\r\n3\t1,1,1\r\n")
    put("feature_file", "bad_header", "flame-features 2 slots=1 dense=0\n")

    for slots, rec in ((2, record([[1, 2], [3]], [0.5])), (0, record([])), (1, record([[]], [1, 2, 3])),
                       (3, record([[1], [], [2, 3, 4]]))):
        put("record", f"slots{slots}", bytes([slots]) + rec)
    put("record", "truncated", bytes([2]) + record([[1, 2], [3]])[:-3])

    def bulk(b):
        return b"$%d\r\n%s\r\n" % (len(b), b)

    r1, r2 = record([[1, 2]]), record([[]])
    put("redis", "two_values", bytes([1, 3, 1]) + b"*2\r\n" + bulk(r1) + b"$-1\r\n")
    put("redis", "pipelined", bytes([3, 1, 1]) + b"*2\r\n" + bulk(r1) + bulk(r2) + b"*2\r\n$-1\r\n" + bulk(r1))
    put("redis", "error", bytes([0, 0, 1]) + b"-ERR wrong\r\n")
    put("redis", "wrong_length", bytes([1, 3, 1]) + b"*1\r\n" + bulk(r1))
    put("redis", "nested", bytes([0, 0, 0]) + b"*1\r\n*1\r\n:5\r\n")

    put("user_cache", "meta", struct.pack("<I", 64 + 8 * 2) + struct.pack("<Q", (1 << 63) | 1000))
    put("user_cache", "slot_lens", struct.pack("<I", 64 + 8 * 4) + b"\xff\xff\0\0\x01\0\0\0")
    put("user_cache", "hint", struct.pack("<I", 64) + struct.pack("<q", 3))

    # fuzz_bags.c's reader: requests-1, then per request flags, history_len, num_candidates,
    # the ids, per slot and side a bag (mode, id count, [offsets], ids), the user id; then the
    # short-output flag. Values below 0xf0 are taken mod 48.
    def request(flags, hist, cands, bags, user=0):
        out = bytes([flags, len(hist), len(cands)]) + bytes(hist) + bytes(cands)
        for mode, ids, offsets in bags:
            out += bytes([mode, len(ids)]) + (bytes(offsets) if mode & 1 else b"") + bytes(ids)
        return out + bytes([user])

    valid = request(0, [1, 2, 3], [4, 5], [(0, [1, 2, 3], ()), (0, [4, 5, 6], ()), (0, [1, 2], ()), (0, [3], ())])
    put("bags", "one_valid", b"\0" + valid + b"\0")
    put("bags", "two_valid_short_out", b"\1" + valid + valid + b"\1")
    put("bags", "fuzzed_offsets", b"\0" + request(0, [1, 2], [3], [(1, [1, 2], (0, 1, 2)), (3, [6], (0, 9, 1)),
                                                                    (1, [2], (0, 1)), (1, [], (5, 0))]) + b"\0")
    put("bags", "out_of_range", b"\0" + request(0, [39, 40], [0xf5, 7], [(0, [6, 7], ()), (0, [12, 13], ()),
                                                                        (0, [], ()), (0, [0], ())]) + b"\0")
    # an empty history with history_side NULL (validation once formed &NULL[slot])
    put("bags", "regress_empty_history_null_side", bytes.fromhex(
        "0101000102000002030102000102" "7e030201010009010603010001020001" "03000000"))
    put("bags", "no_side", b"\0" + request(3, [1], [2], []) + b"\0")
    put("bags", "user_cache_flag", b"\0" + request(4 | 8, [], [2], [(0, [], ()), (0, [], ()), (0, [1], ()),
                                                                    (0, [1], ())]) + b"\0")


if __name__ == "__main__":
    main()
