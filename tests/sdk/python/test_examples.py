"""The runnable examples/ (docs/sdk-python.md): each script runs as a user
would run it, against the live server, and prints what it promises."""
from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest

from conftest import REPO


def run_example(name: str, url: str, *args: str) -> str:
    env = dict(os.environ, FORKBOX_URL=url, PYTHONPATH=os.path.join(REPO, "sdk", "python", "src"))
    p = subprocess.run([sys.executable, os.path.join(REPO, "examples", name), *args],
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_agent_checkpoints_undoes_the_step_that_broke_the_state(url):
    out = run_example("agent_checkpoints.py", url)
    assert out.splitlines() == [
        "keep  'data = [3, 1, 2]'",
        "keep  'data.sort()'",
        "undo  'data = None  # a bad idea: it destroys the data': state check failed",
        "keep  'data.append(4)'",
        "keep  'total = sum(data)'",
        "final: ([1, 2, 3, 4], 10)",
    ]


def test_tree_search_keeps_the_best_idea(url):
    out = run_example("tree_search.py", url)
    scores = {line.split(":")[0].strip(): float(line.split("mse")[1]) for line in out.splitlines() if "mse" in line}
    assert set(scores) == {"mean", "median", "linear", "constant"}, out
    best = min(scores, key=scores.get)
    assert out.splitlines()[-1].startswith(f"kept: {best} "), out


def test_plot_image_writes_a_real_png(url, tmp_path):
    target = tmp_path / "plot.png"
    out = run_example("plot_image.py", url, str(target))
    data = target.read_bytes()
    assert out.strip() == f"wrote {target} ({len(data)} bytes)"
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 300 and height > 200, (width, height)
