"""GET /v1/sandboxes/{id}/diff/{other}: computed on the host from the
copy-on-write layers, it must agree with the podflare SDK's own client-side
`Sandbox.diff` (sha256sum of every file, run inside both sandboxes) on every
case here."""
from __future__ import annotations

import pytest

from helpers import assert_json_error


def server_diff(http, a: str, b: str, paths: list[str] | None = None) -> dict:
    params = {"paths": ",".join(paths)} if paths is not None else {}
    r = http.get(f"/v1/sandboxes/{a}/diff/{b}", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def sdk_diff(a, b, paths=None) -> dict:
    return a.diff(b, paths)


def py(sb, code: str) -> None:
    r = sb.run_code(code)
    assert r.exit_code == 0, (code, r.stdout, r.stderr)


SETUP = r'''
import os
os.makedirs('/root/proj/sub', exist_ok=True)
for i in range(20):
    open(f'/root/proj/f{i}.txt', 'w').write(f'file {i}\n')
open('/root/proj/sub/deep.bin', 'wb').write(bytes(range(256)) * 100)
open('/tmp/scratch', 'w').write('scratch')
open('/root/with space.txt', 'w').write('spaced')
os.symlink('/etc/passwd', '/root/link-to-passwd')
'''

CHANGES_A = r'''
import os, shutil
open('/root/proj/f1.txt', 'w').write('changed by a\n')          # modified
open('/root/proj/f2.txt', 'w').write('file 2\n')                # rewritten, same bytes
os.remove('/root/proj/f3.txt')                                  # removed
open('/root/proj/new-a.txt', 'w').write('new in a')             # added
shutil.rmtree('/root/proj/sub')                                 # removed dir
open('/etc/hostname-copy', 'w').write('x')                      # outside the default paths
with open('/etc/debian_version', 'a') as f: f.write('a')         # a template file, modified
os.makedirs('/tmp/dir-a/x', exist_ok=True)
open('/tmp/dir-a/x/y', 'w').write('y')
'''

CHANGES_B = r'''
import os
open('/root/proj/f1.txt', 'w').write('changed by b\n')
open('/root/proj/f4.txt', 'w').write('FILE 4\n')                # same size, other bytes
open('/root/with space.txt', 'w').write('SPACED')
os.remove('/tmp/scratch')
os.remove('/etc/debian_version')                                 # a template file, removed
'''


@pytest.fixture
def forked_pair(sandbox):
    py(sandbox, SETUP)
    a, b = sandbox.fork(2)
    py(a, CHANGES_A)
    py(b, CHANGES_B)
    yield sandbox, a, b
    a.close()
    b.close()


@pytest.mark.parametrize("paths", [None, ["/root"], ["/tmp"], ["/root/proj"], ["/root/", "/tmp"], ["/etc"],
                                   ["/root/proj/f1.txt"], ["/nonexistent"], ["/root/link-to-passwd"], ["/root", "/root"]])
def test_agrees_with_the_sdk_on_forks(http, forked_pair, paths):
    parent, a, b = forked_pair
    for x, y in ((a, b), (b, a), (parent, a), (a, parent), (parent, b), (a, a)):
        expected = sdk_diff(x, y, paths)
        got = server_diff(http, x.id, y.id, paths)
        assert got == expected, (paths, x.id, y.id)


def test_agrees_with_the_sdk_on_unrelated_sandboxes(http, make_sandbox):
    one, two = make_sandbox(), make_sandbox()
    py(one, SETUP)
    py(two, "import os\nos.makedirs('/root/proj', exist_ok=True)\nopen('/root/proj/f0.txt', 'w').write('file 0\\n')\n"
            "open('/root/proj/f5.txt', 'w').write('other')\nopen('/root/only-two', 'w').write('2')")
    for paths in (None, ["/root"], ["/usr/lib/python3/dist-packages/numpy/__init__.py"]):
        assert server_diff(http, one.id, two.id, paths) == sdk_diff(one, two, paths)
        assert server_diff(http, two.id, one.id, paths) == sdk_diff(two, one, paths)


def test_a_fresh_fork_differs_in_nothing(http, sandbox):
    py(sandbox, SETUP)
    (child,) = sandbox.fork(1)
    try:
        assert server_diff(http, sandbox.id, child.id, ["/"]) == {"added": [], "removed": [], "modified": []}
    finally:
        child.close()


@pytest.mark.parametrize("paths", ["relative/path", "/ok,relative", "/a\x00b", ",".join(["/x"] * 65)])
def test_bad_paths_are_400(http, forked_pair, paths):
    parent, a, _ = forked_pair
    assert_json_error(http.get(f"/v1/sandboxes/{parent.id}/diff/{a.id}", params={"paths": paths}), 400)


def test_unknown_sandboxes_are_404(http, sandbox):
    assert_json_error(http.get(f"/v1/sandboxes/{sandbox.id}/diff/sb-nope0000000000000000"), 404)
    assert_json_error(http.get(f"/v1/sandboxes/sb-nope0000000000000000/diff/{sandbox.id}"), 404)
