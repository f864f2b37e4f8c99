"""Today's Python in sandboxes (docs/templates.md#debian): the built-ins are
Debian 13 with Python 3.13, numpy 2 and pandas 2; `pip install` works as a
user expects on it; `--debian 12` builds them from bookworm instead; and what
was made on one release (a Space, a saved template) keeps its release when
the server switches to the other."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import start_server, stop_and_assert_clean
from helpers import FORKBOX_BIN, TEMPLATES_DIR, assert_json_error, create_raw, delete_raw, exec_ok, exec_raw

py = exec_ok

STACK = """
import sys, platform
import numpy as np, pandas as pd, requests, httpx, yaml, tabulate
release = dict(l.strip().split('=', 1) for l in open('/etc/os-release') if '=' in l)
print(release['VERSION_ID'].strip('"'), '%d.%d' % sys.version_info[:2],
      np.__version__.split('.')[0], pd.__version__.split('.')[0])
"""

# What code written for numpy 2 / pandas 2 relies on, each of which fails on
# Debian 12's numpy 1.24 and pandas 1.5.
MODERN = """
import numpy as np, pandas as pd
df = pd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})
print(df.map(str).to_dict('list'))                        # DataFrame.map: pandas 2.1
print(np.unique_counts(np.array([3, 3, 1])).counts.tolist())  # the array-API set functions: numpy 2.0
print(np.dtype(np.float64).isnative, np.__version__ >= '2', type(np.float64(1).item()).__name__)
print(df.to_markdown(index=False).splitlines()[0])
"""

# A one-module wheel written in the sandbox: `pip install` of a local file,
# so what is tested is PEP 668's marker and where pip puts things, not the
# network (tests/e2e/test_egress.py fetches one from PyPI).
WHEEL = """
import base64, hashlib, zipfile
name = 'forkbox_probe'
files = {
    f'{name}.py': b'ANSWER = 42\\n',
    f'{name}-1.0.dist-info/METADATA': b'Metadata-Version: 2.1\\nName: forkbox-probe\\nVersion: 1.0\\n',
    f'{name}-1.0.dist-info/WHEEL': b'Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n',
}
def digest(data):
    return 'sha256=' + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()
record = ''.join(f'{p},{digest(d)},{len(d)}\\n' for p, d in files.items()) + f'{name}-1.0.dist-info/RECORD,,\\n'
with zipfile.ZipFile(f'/tmp/{name}-1.0-py3-none-any.whl', 'w') as z:
    for p, d in files.items():
        z.writestr(p, d)
    z.writestr(f'{name}-1.0.dist-info/RECORD', record)
"""


@pytest.mark.parametrize("template", ["default", "python-datasci"])
def test_the_builtins_are_debian_13_with_python_3_13_numpy_2_and_pandas_2(datasci, template):
    http, _ = datasci
    sid = create_raw(http, template=template)
    try:
        assert py(http, sid, STACK) == "13 3.13 2 2\n"
        assert py(http, sid, MODERN).splitlines() == [
            "{'a': ['1', '2'], 'b': ['x', 'y']}", "[1, 2]", "True True float", "|   a | b   |"]
        assert py(http, sid, "python3 --version", language="bash") == "Python 3.13.5\n"
        if template == "python-datasci":
            out = py(http, sid, "import matplotlib, scipy, sklearn, seaborn, sympy, openpyxl, PIL\n"
                                "print(matplotlib.__version__.split('.')[:2], sympy.sqrt(8))")
            assert out == "['3', '10'] 2*sqrt(2)\n", out
    finally:
        delete_raw(http, sid)


def test_pip_install_works_without_flags_and_the_repl_imports_it_at_once(http):
    sid = create_raw(http, egress=False)
    try:
        # The premise: the template does not have it, and the marker pip obeys is gone.
        assert "ModuleNotFoundError" in exec_raw(http, sid, "import forkbox_probe").stderr
        assert py(http, sid, "import glob, sysconfig; print(glob.glob(sysconfig.get_path('stdlib') + '/EXTERNALLY-MANAGED'))") == "[]\n"
        py(http, sid, WHEEL)
        out = py(http, sid, "pip install --no-index --no-deps --quiet /tmp/forkbox_probe-1.0-py3-none-any.whl 2>&1; "
                            "echo rc=$?", language="bash")
        assert out.endswith("rc=0\n"), out
        # Into /usr/local (Debian's pip), which the running REPL already searches.
        out = py(http, sid, "import forkbox_probe; print(forkbox_probe.ANSWER, forkbox_probe.__file__)")
        assert out == "42 /usr/local/lib/python3.13/dist-packages/forkbox_probe.py\n", out
        # A venv works too (python3-venv), with pip in it and the system's packages kept out.
        py(http, sid, "python3 -m venv /tmp/venv && /tmp/venv/bin/pip install --no-index --quiet "
                      "/tmp/forkbox_probe-1.0-py3-none-any.whl", language="bash")
        out = exec_raw(http, sid, "/tmp/venv/bin/python -c 'import numpy'", language="bash")
        assert out.exit_code == 1 and "No module named 'numpy'" in out.stderr, out
        assert py(http, sid, "/tmp/venv/bin/python -c 'import forkbox_probe; print(forkbox_probe.__file__)'",
                  language="bash") == "/tmp/venv/lib/python3.13/site-packages/forkbox_probe.py\n"
    finally:
        delete_raw(http, sid)


def test_fork_children_reseed_numpy_2_generators_the_repl_holds(http):
    """numpy 2 code draws from `default_rng()` Generators, which no at-fork
    hook reseeds: the REPL gives each child's generators (and RandomStates
    and random.Randoms bound to a global) fresh entropy, and leaves the
    parent's streams where they were."""
    sid = create_raw(http)
    draw = "print([int(g.integers(0, 2**62)), int(legacy.randint(0, 2**31)), r.getrandbits(62), int(np.random.randint(0, 2**31))])"
    try:
        py(http, sid, "import random, numpy as np\nnp.random.seed(7)\n"
                      "g = np.random.default_rng(7)\nlegacy = np.random.RandomState(7)\nr = random.Random(7)")
        r = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 3})
        assert r.status_code == 200, r.text
        kids = r.json()["children"]
        try:
            draws = [json.loads(py(http, k, draw)) for k in kids]
            for i in range(4):
                column = [d[i] for d in draws]
                assert len(set(column)) == 3, (i, draws)
            # The parent's seeded streams go on as seeded: its first draws are a fresh seed 7's.
            got = py(http, sid, "print([int(g.integers(0, 2**62)), int(legacy.randint(0, 2**31)), r.getrandbits(62)])")
            want = py(http, sid, "print([int(np.random.default_rng(7).integers(0, 2**62)), "
                                 "int(np.random.RandomState(7).randint(0, 2**31)), random.Random(7).getrandbits(62)])")
            assert got == want, (got, want)
        finally:
            for k in kids:
                delete_raw(http, k)
    finally:
        delete_raw(http, sid)


def debian_12_built() -> bool:
    """`forkbox template build default --debian 12` was run (./dev test does)."""
    out = subprocess.run([FORKBOX_BIN, "template", "ls", "--debian", "12",
                          "--state-dir", os.path.dirname(os.path.normpath(TEMPLATES_DIR))],
                         capture_output=True, text=True, timeout=60)
    return any(line.startswith("default\t") and "current=-" not in line for line in out.stdout.splitlines())


@pytest.fixture(scope="module")
def switched(say, server):
    """A server on Debian 13, then the same state directory served with
    `--debian 12` (the built-ins already built for both)."""
    assert debian_12_built(), "build it first: forkbox template build default --debian 12"
    srv = start_server(say, "debian", build=False)
    yield srv
    stop_and_assert_clean(srv)


def test_a_space_and_a_saved_template_keep_their_release_when_the_server_switches(switched):
    srv = switched
    with srv.http(timeout=300) as c:
        sid = create_raw(c, egress=False)
        py(c, sid, "import sys, numpy as np\nmade_on = sys.version_info[:2]\nlucky = np.arange(5) * 7\n"
                   "open('/root/kept.txt', 'w').write('kept')")
        r = c.post(f"/v1/sandboxes/{sid}/template", json={"name": "made-on-13"})
        assert r.status_code == 200, r.text
        r = c.post(f"/v1/sandboxes/{sid}/freeze")
        assert r.status_code == 200, r.text
        space = r.json()["space_id"]

    srv.stop()
    srv.args += ["--debian", "12"]
    srv.start()
    srv.wait_ready()
    with srv.http(timeout=300) as c:
        # New sandboxes of the built-in: Debian 12's stack.
        new = create_raw(c, egress=False)
        assert py(c, new, STACK) == "12 3.11 1 1\n"
        delete_raw(c, new)
        # The Space resumes on the version it was frozen on, its REPL whole.
        r = c.post(f"/v1/spaces/{space}/resume", json={})
        assert r.status_code == 200, r.text
        back = r.json()["id"]
        out = py(c, back, STACK + "print(made_on, lucky.tolist(), open('/root/kept.txt').read())")
        assert out == "13 3.13 2 2\n(3, 13) [0, 7, 14, 21, 28] kept\n", out
        delete_raw(c, back)
        # A saved template stays on the release it was saved from.
        t = create_raw(c, template="made-on-13", egress=False)
        assert py(c, t, STACK + "print(lucky.tolist())") == "13 3.13 2 2\n[0, 7, 14, 21, 28]\n"
        delete_raw(c, t)
        assert c.delete("/v1/templates/made-on-13").status_code == 204


def test_a_space_whose_recorded_rootfs_is_not_a_template_version_resumes_on_the_current_one(switched):
    """meta.json is the server's, but a path in it is never trusted to name
    anything but a built version of the template."""
    srv = switched
    with srv.http(timeout=300) as c:
        sid = create_raw(c, egress=False)
        py(c, sid, "x = 1")
        r = c.post(f"/v1/sandboxes/{sid}/freeze")
        assert r.status_code == 200, r.text
        space = r.json()["space_id"]
    srv.stop()
    meta_path = os.path.join(srv.state_dir, "spaces", space, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    assert meta["rootfs"].startswith(os.path.join(TEMPLATES_DIR, "default") + "/"), meta
    meta["rootfs"] = "/"
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    srv.start()
    srv.wait_ready()
    with srv.http(timeout=300) as c:
        back = c.post(f"/v1/spaces/{space}/resume", json={}).json()["id"]
        assert py(c, back, "import os; print(x, os.path.exists('/etc/debian_version'), os.path.isdir('/var/lib/forkbox'))") == \
            "1 True False\n"
        delete_raw(c, back)
        assert_json_error(c.get(f"/v1/spaces/{space}"), 404)
