"""examples/python/train_sumi_beauty.py end to end on a slice of Beauty: trains a few
steps, exports, and PyTorch and libflame agree on AUC and HR@10 (the script exits 1 if not)."""
import json
import subprocess
import sys

import pytest

from conftest import REPO

pytest.importorskip("torch", reason="torch is not installed: the training example is skipped")


def test_train_export_and_both_evaluations_agree(beauty_dir, tmp_path):
    out = tmp_path / "sumi.flame"
    p = subprocess.run([sys.executable, str(REPO / "examples/python/train_sumi_beauty.py"), "--data",
                        str(beauty_dir / "Beauty.txt"), "--out", str(out), "--steps", "4", "--batch", "64",
                        "--max-users", "400", "--eval-negatives", "30", "--device", "cpu"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["agree_4_decimals"] and r["users"] == 400 and out.exists()
    assert r["max_abs_score_diff"] < 1e-5
    for k in ("AUC_next", "AUC_next3", "HR@10_next"):
        assert abs(r["torch"][k] - r["libflame"][k]) < 1e-4 and 0 < r["torch"][k] <= 1
    assert r["libflame_stats"]["requests"] == 400
