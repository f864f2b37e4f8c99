"""docs/security.md's attack table and this suite stay in step: each row
names one test of the suite, and each attack of the suite has its row."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from helpers import REPO

HERE = os.path.dirname(os.path.abspath(__file__))


def table_tests() -> list[str]:
    """The test named in each row, `…[id]` completed from the row above."""
    names, last = [], None
    with open(os.path.join(REPO, "docs", "security.md")) as f:
        for line in f:
            if not re.match(r"\| \d+ \|", line):
                continue
            ref = re.findall(r"`([^`]*(?:::|…)[^`]*)`\s*\|\s*$", line)
            assert ref, f"a row of the attack table names no test: {line.strip()}"
            name = ref[0]
            if name.startswith("…"):
                name = last.split("[")[0] + name[1:]
            names.append(name)
            last = name
    return names


def test_the_attack_table_names_each_attack_once():
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", HERE],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    collected = {line.split("tests/adversarial/", 1)[1] for line in out.stdout.splitlines() if "::" in line}
    collected.discard(f"{os.path.basename(__file__)}::test_the_attack_table_names_each_attack_once")
    assert collected, out.stdout + out.stderr
    rows = table_tests()
    assert len(rows) == len(set(rows)), sorted(r for r in rows if rows.count(r) > 1)
    assert set(rows) == collected, {"rows naming no test": sorted(set(rows) - collected),
                                    "attacks without a row": sorted(collected - set(rows))}
