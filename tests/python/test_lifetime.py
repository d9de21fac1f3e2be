"""A handle closed (or dropped) while other threads, or the callback it runs under, are
inside calls on it: the calls finish with correct results, the handle is destroyed after the
last of them, and later calls raise ClosedError. Each case runs in a child process
(lifetime_cases.py) so that a use-after-free shows as a crash or wrong scores of that case."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lifetime_cases

HERE = Path(__file__).resolve().parent
CASES = sorted(name[len("case_"):] for name in dir(lifetime_cases) if name.startswith("case_"))


@pytest.mark.parametrize("case", CASES)
def test_closing_while_in_use(case, tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = subprocess.run([sys.executable, str(HERE / "lifetime_cases.py"), case], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), \
        f"exit status {p.returncode}\nstdout:\n{p.stdout[-2000:]}\nstderr:\n{p.stderr[-4000:]}"
