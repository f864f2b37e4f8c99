"""sdk/python builds into an installable, typed wheel (pip fetches hatchling)."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile

SDK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "sdk", "python")


def test_wheel_contents(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), SDK],
                   check=True, timeout=300)
    [whl] = [p for p in os.listdir(tmp_path) if p.endswith(".whl")]
    names = zipfile.ZipFile(tmp_path / whl).namelist()
    for f in ("forkbox/__init__.py", "forkbox/py.typed", "forkbox/_core.py", "forkbox/integrations/anthropic.py",
              "forkbox/integrations/openai_agents.py", "forkbox/integrations/langchain.py"):
        assert f in names, names
    meta = zipfile.ZipFile(tmp_path / whl).read([n for n in names if n.endswith("METADATA")][0]).decode()
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert [r for r in requires if "extra ==" not in r] == ["Requires-Dist: httpx>=0.27"]
