"""Puts python/ (the flame package) and this folder (test helpers) on sys.path."""
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "python"), str(Path(__file__).resolve().parent)]


def shared_dir():
    return Path(os.environ.get("FLAME_SHARED_DIR", REPO.parent / "shared"))


@pytest.fixture(scope="session")  # session: module-scoped fixtures (a trained model) build on it
def beauty_dir():
    d = shared_dir() / "data" / "amazon-beauty"
    need = [d / "iclrec-beauty.safetensors", d / "Beauty.txt", d / "iclrec-beauty.metrics.json"]
    missing = [str(p) for p in need if not p.exists()]
    if missing:
        pytest.skip(f"shared Beauty data not found ({', '.join(missing)}); set FLAME_SHARED_DIR")
    return d
