"""repl/space.py on its own, in a plain python3 (FORKBOX_TEST_PYTHON, as
tests/repl/test_repl.py; default: the one running pytest): what a freeze saves,
what a thaw brings back, and a thaw without a saved state (the sandbox had
no REPL when it was frozen). The whole path through a server is
tests/e2e/test_spaces.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys

PYTHON = os.environ.get("FORKBOX_TEST_PYTHON", sys.executable)
SPACE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "repl", "space.py")

FREEZE = """
import json, socket, sys
SRC = open(sys.argv[1]).read()
shared = [1, 2, 3]
alias = shared
def double(v):
    return 2 * v
class Box:
    def __init__(self, v): self.v = v
box = Box(shared)
sock = socket.socket()
gen = (i for i in range(2))
exec(compile(SRC, '<forkbox-space>', 'exec'), {'_user': globals(), '_path': sys.argv[2], '_mode': 'freeze'})
"""

THAW = """
import sys
SRC = open(sys.argv[1]).read()
exec(compile(SRC, '<forkbox-space>', 'exec'), {'_user': globals(), '_path': sys.argv[2], '_mode': 'thaw'})
print(alias is shared, box.v is shared, double(21), 'sock' in globals(), 'gen' in globals())
"""


def run(code: str, path: str) -> list[str]:
    p = subprocess.run([PYTHON, "-c", code, SPACE, path], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def test_freeze_then_thaw_round_trip(tmp_path):
    state = str(tmp_path / ".forkbox-space" / "state.pkl")
    [saved] = run(FREEZE, state)
    saved = json.loads(saved)
    assert {"alias", "shared", "double", "Box", "box", "json", "socket", "sys"} <= set(saved["saved"])
    assert {u["name"]: u["type"] for u in saved["unsaved"]} == {"sock": "socket", "gen": "generator"}
    thawed, check = run(THAW, state)
    thawed = json.loads(thawed)
    assert thawed["failed"] == [] and {u["name"] for u in thawed["unsaved"]} == {"sock", "gen"}
    # Shared references stay shared; functions and classes come back by value.
    assert check == "True True 42 False False"
    assert not os.path.exists(os.path.dirname(state)), "a thaw removes the saved state"


def test_thaw_without_a_saved_state_says_so(tmp_path):
    state = str(tmp_path / ".forkbox-space" / "state.pkl")
    code = ("import sys\nexec(compile(open(sys.argv[1]).read(), '<forkbox-space>', 'exec'), "
            "{'_user': globals(), '_path': sys.argv[2], '_mode': 'thaw'})")
    [answer] = run(code, state)
    answer = json.loads(answer)
    assert answer["restored"] == [] and answer["failed"][0]["name"] == "(globals)"
    assert "no running REPL" in answer["failed"][0]["reason"]
