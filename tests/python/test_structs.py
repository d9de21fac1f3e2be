"""The ctypes mirrors in flame/_structs.py against the C compiler's view of flame.h: the same
size and every field at the same offset. A field appended to a public struct in flame.h and
not here (or misdeclared here) fails this test instead of corrupting memory at run time."""
import ctypes
import os
import shutil
import subprocess

import pytest

from conftest import REPO
from flame import _structs

MIRRORS = {  # ctypes class -> C type
    _structs.ModelInfo: "flame_model_info", _structs.Bags: "flame_bags", _structs.Request: "flame_request",
    _structs.EngineStats: "flame_engine_stats", _structs.NumaInfo: "flame_numa_info",
    _structs.PinnedPoolParams: "flame_pinned_pool_params", _structs.PinnedPoolStats: "flame_pinned_pool_stats",
    _structs.UserCacheParams: "flame_user_cache_params", _structs.UserFeatures: "flame_user_features",
    _structs.UserCacheStats: "flame_user_cache_stats", _structs.RedisOptions: "flame_redis_options",
    _structs.ItemCacheStats: "flame_item_cache_stats", _structs.ItemCacheParams: "flame_item_cache_params",
    _structs.BatchProfile: "flame_batch_profile",
    _structs.SchedulerParams: "flame_scheduler_params", _structs.SchedulerStats: "flame_scheduler_stats",
    _structs.EmbeddingTable: "flame_embedding_table", _structs.EmbeddingBagParams: "flame_embedding_bag_params",
    _structs.EmbeddingBagInput: "flame_embedding_bag_input", _structs.EmbeddingBagBatch: "flame_embedding_bag_batch",
    _structs.AttentionParams: "flame_attention_params",
    _structs.SubmitOptions: "flame_submit_options", _structs.Latency: "flame_latency",
    _structs.MetricsSources: "flame_metrics_sources",
}


def test_every_mirror_matches_flame_h(tmp_path):
    cc = os.environ.get("CC", "cc")
    if not shutil.which(cc):
        pytest.fail(f"no C compiler ({cc}) to check the struct layouts with")
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <flame/flame.h>", "int main(void) {"]
    for cls, ctype in MIRRORS.items():
        lines.append(f'printf("{cls.__name__} size %zu\\n", sizeof({ctype}));')
        for name, _ in cls._fields_:
            lines.append(f'printf("{cls.__name__} {name} %zu\\n", offsetof({ctype}, {name}));')
    lines.append("return 0; }")
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-std=c11", "-I", str(REPO / "include"), "-o", str(exe), str(src)], check=True)
    want = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines():
        cls, key, value = line.split()
        want[cls, key] = int(value)
    for cls in MIRRORS:
        assert ctypes.sizeof(cls) == want[cls.__name__, "size"], f"{cls.__name__}: size"
        for name, _ in cls._fields_:
            assert getattr(cls, name).offset == want[cls.__name__, name], f"{cls.__name__}.{name}: offset"
