"""examples/python/kernels_torch_model.py: the user tower on libflame's kernels agrees with
the same model in plain PyTorch (the script exits 1 when over its tolerance), on the CPU, and
on CUDA where a GPU is usable."""
import os
import subprocess
import sys

import pytest

from conftest import REPO

torch = pytest.importorskip("torch", reason="torch is not installed: the PyTorch kernels example is skipped")


def run(device):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "python"), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, str(REPO / "examples/python/kernels_torch_model.py"), "--device", device,
                        "--users", "40"], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert "max |libflame - PyTorch|" in p.stdout
    return p.stdout


def test_example_on_the_cpu():
    run("cpu")


def test_example_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device usable by torch: the example's GPU run is skipped")
    run("cuda")
