"""Custom templates (docs/templates.md): recipes built step by step in
sandboxes into content-keyed layers, live sandboxes saved with their REPL
state, and /v1/templates to list, show and delete them. Everything runs
against a real server of this module's own; packages come from Debian's
mirror and PyPI (through a TLS-inspecting proxy on some hosts: the build's
sandboxes trust the host's CAs, docs/network.md#host-cas)."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import textwrap
import time

import httpx
import pytest

from conftest import running, serve
from helpers import FORKBOX_BIN, ForkboxServer, assert_json_error, create_raw, delete_raw, exec_ok

BUILD_TIMEOUT = 900


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def build(c: httpx.Client, recipe: dict) -> list[dict]:
    """POST a recipe; the NDJSON events it streamed (the last is done/error)."""
    events = []
    with c.stream("POST", "/v1/templates", json=recipe, timeout=BUILD_TIMEOUT) as r:
        if r.status_code != 200:
            r.read()
            return [{"type": "http_error", "status": r.status_code, "body": r.json()}]
        assert r.headers["content-type"].startswith("application/x-ndjson"), r.headers
        for line in r.iter_lines():
            if line.strip():
                events.append(json.loads(line))
    return events


def steps(events: list[dict]) -> list[tuple[str, bool]]:
    return [(e["step"], e["cached"]) for e in events if e["type"] == "step"]


def done(events: list[dict]) -> dict:
    assert events and events[-1]["type"] == "done", events[-5:]
    return events[-1]["template"]


def wait_warm(c: httpx.Client, name: str, timeout: float = 120) -> None:
    """Until the template's zygote serves (creates are forks from then on)."""
    deadline = time.monotonic() + timeout
    while name not in c.get("/v1/pool").json()["templates"]:
        assert time.monotonic() < deadline, f"template {name} never got a warm zygote"
        time.sleep(0.2)


def layer_dirs(srv: ForkboxServer) -> set[str]:
    root = os.path.join(srv.state_dir, "custom-templates", "layers")
    return {d for d in os.listdir(root) if not d.endswith(".partial")} if os.path.isdir(root) else set()


@pytest.fixture(scope="module")
def srv(say, server):  # `server` first: the default template is built
    yield from serve(ForkboxServer("templates", build_templates=False, log=say))


@pytest.fixture(scope="module")
def c(srv):
    with srv.http(timeout=300.0) as client:
        yield client


RECIPE = {
    "name": "tools",
    "description": "jq, art and a script",
    "apt": ["jq"],
    "pip": ["art"],
    "commands": ["echo built > /etc/built-marker", "rm /etc/debian_version"],
    "preimport": ["art"],
    "limits": {"ram_mib": 768, "idle_timeout_seconds": 120},
}


def recipe(**changes) -> dict:
    r = json.loads(json.dumps(RECIPE))
    r["files"] = [{"path": "/opt/app/hello.sh", "content_b64": b64(b"#!/bin/sh\necho hello from the recipe\n"), "mode": 0o755}]
    r.update(changes)
    return r


@pytest.fixture(scope="module")
def tools(c):
    """The recipe template, built once for the module."""
    events = build(c, recipe())
    return events, done(events)


def test_a_recipe_builds_step_by_step_with_logs(tools):
    events, info = tools
    assert steps(events) == [("write /opt/app/hello.sh", False), ("apt-get install jq", False), ("pip install art", False),
                             ("run echo built > /etc/built-marker", False), ("run rm /etc/debian_version", False),
                             ("import art", False)], steps(events)
    totals = {e["total"] for e in events if e["type"] == "step"}
    assert totals == {6}, totals
    logs = "".join(e["text"] for e in events if e["type"] == "log")
    assert "jq" in logs and "Successfully installed art" in logs, logs[-2000:]
    assert info["kind"] == "recipe" and info["base"] == "default" and info["state"] == "ready", info
    assert info["layers"] == 6, info  # five steps that change files, over the built-in
    assert info["preimport"] == ["numpy", "pandas", "art"], info
    assert info["limits"] == {"ram_mib": 768, "idle_timeout_seconds": 120}, info
    assert info["size_bytes"] > 100_000, info
    assert info["recipe"]["apt"] == ["jq"] and all(f["content_b64"] == "" for f in info["recipe"]["files"]), info


def test_a_recipe_templates_sandboxes_have_its_packages_files_imports_and_limits(c, tools):
    wait_warm(c, "tools")
    sid = create_raw(c, template="tools")
    try:
        # First exec: `art` was imported by the zygote, before any user code.
        assert exec_ok(c, sid, "import sys; print('art' in sys.modules, 'numpy' in sys.modules)") == "True True\n"
        out = exec_ok(c, sid, "jq --version; /opt/app/hello.sh; cat /etc/built-marker; test -e /etc/debian_version || echo gone; "
                              "stat -c %a /opt/app/hello.sh; python3 -c 'import art; print(art.__version__)'", language="bash")
        lines = out.split("\n")
        assert lines[0].startswith("jq-1.") and lines[1:5] == ["hello from the recipe", "built", "gone", "755"], out
        info = c.get(f"/v1/sandboxes/{sid}").json()
        assert info["ram_mib"] == 768 and info["idle_timeout_seconds"] == 120 and info["template"] == "tools", info
        # A create's own fields win over the template's defaults.
        other = create_raw(c, template="tools", ram_mib=512)
        assert c.get(f"/v1/sandboxes/{other}").json()["ram_mib"] == 512
        delete_raw(c, other)
        # The network setup's resolv.conf of the build is not in the template.
        assert "127.0.0.53" in exec_ok(c, sid, "cat /etc/resolv.conf", language="bash")
    finally:
        delete_raw(c, sid)
    plain = create_raw(c)
    try:
        out = exec_ok(c, plain, "command -v jq || echo none; test -e /etc/debian_version && echo here", language="bash")
        assert out == "none\nhere\n", out
    finally:
        delete_raw(c, plain)


def test_an_unchanged_recipe_runs_nothing_and_a_changed_step_rebuilds_from_there(srv, c, tools):
    before = layer_dirs(srv)
    mtimes = {d: os.stat(os.path.join(srv.state_dir, "custom-templates", "layers", d, "layer.json")).st_mtime_ns for d in before}
    again = build(c, recipe())
    assert [cached for _, cached in steps(again)] == [True] * 5 + [False], steps(again)
    assert not [e for e in again if e["type"] == "log"], "a cached step ran something"
    assert done(again)["created_at"] == tools[1]["created_at"], "an unchanged recipe re-registered the template"
    assert layer_dirs(srv) == before
    changed = recipe(commands=["echo built > /etc/built-marker", "rm /etc/debian_version; echo v2 > /etc/version-2"])
    events = build(c, changed)
    assert [cached for _, cached in steps(events)] == [True, True, True, True, False, False], steps(events)
    done(events)
    new = layer_dirs(srv) - before
    assert len(new) == 1, new
    for d in before:
        path = os.path.join(srv.state_dir, "custom-templates", "layers", d, "layer.json")
        try:
            mtime = os.stat(path).st_mtime_ns
        except FileNotFoundError:
            continue  # the replaced step's layer, collected as soon as nothing uses it (counted below)
        assert mtime == mtimes[d], f"layer {d} was rewritten"
    sid = create_raw(c, template="tools")
    try:
        assert exec_ok(c, sid, "cat /etc/version-2; jq -n 1", language="bash") == "v2\n1\n"
    finally:
        delete_raw(c, sid)
    # The replaced step's layer is collected once nothing stands on it.
    deadline = time.monotonic() + 20
    while len(layer_dirs(srv) - before) + len(before - layer_dirs(srv)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(before - layer_dirs(srv)) == 1, (before, layer_dirs(srv))


def test_a_recipe_on_a_custom_template_stacks_on_its_layers(c, tools):
    events = build(c, {"name": "tools-plus", "base": "tools", "commands": ["jq -n '{a: 1}' > /etc/from-base.json"]})
    info = done(events)
    assert info["base"] == "tools" and info["layers"] == 7 and "art" in info["preimport"], info
    sid = create_raw(c, template="tools-plus")
    try:
        assert exec_ok(c, sid, "cat /etc/from-base.json | jq -c .; cat /etc/built-marker", language="bash") == '{"a":1}\nbuilt\n'
    finally:
        delete_raw(c, sid)
    assert c.get("/v1/templates/tools").json()["in_use"]["templates"] == ["tools-plus"]
    assert c.delete("/v1/templates/tools-plus").status_code == 204


def test_a_failed_step_streams_its_output_and_registers_nothing(c):
    events = build(c, {"name": "broken", "commands": ["echo about to fail; exit 3"]})
    assert events[-1]["type"] == "error" and "exited with 3" in events[-1]["error"], events
    assert "about to fail\n" in [e.get("text") for e in events if e["type"] == "log"], events
    assert_json_error(c.get("/v1/templates/broken"), 404)
    assert_json_error(c.post("/v1/sandboxes", json={"template": "broken"}), 404)
    # A preimport that does not import fails the build too.
    events = build(c, {"name": "broken", "preimport": ["no_such_module_here"]})
    assert events[-1]["type"] == "error" and "ModuleNotFoundError" in json.dumps(events), events[-3:]


@pytest.mark.parametrize("body,status,needle", [
    ({"name": "Bad Name"}, 400, "template name"),
    ({"name": "default"}, 409, "built-in"),
    ({"name": "x1", "base": "nope"}, 404, "unknown template"),
    ({"name": "x1", "base": "x1"}, 400, "own base"),
    ({"name": "x1", "apt": ["jq; rm -rf /"]}, 400, "apt"),
    ({"name": "x1", "pip": ["--index-url=http://evil"]}, 400, "pip"),
    ({"name": "x1", "pip": ["a b"]}, 400, "pip"),
    ({"name": "x1", "files": [{"path": "etc/x", "content_b64": ""}]}, 400, "absolute"),
    ({"name": "x1", "files": [{"path": "/etc/x", "content_b64": "!!!"}]}, 400, "base64"),
    ({"name": "x1", "files": [{"path": "/etc/x", "content_b64": "", "mode": 0o17777}]}, 400, "mode"),
    ({"name": "x1", "commands": ["  "]}, 400, "commands"),
    ({"name": "x1", "preimport": ["a-b"]}, 400, "preimport"),
    ({"name": "x1", "limits": {"ram_mib": 10 ** 9}}, 400, "ram_mib"),
    ({"name": "x1", "limits": {"cpu": 2}}, 400, "unknown field"),
    ({"name": "x1", "egress": {"allow": ["not a domain!"]}}, 400, ""),
    ({"name": "x1", "surprise": True}, 400, "unknown field"),
])
def test_bad_recipes_get_a_clear_error_before_anything_runs(c, body, status, needle):
    err = assert_json_error(c.post("/v1/templates", json=body), status)
    assert needle in err["error"], err
    assert c.get("/v1/templates/x1").status_code == 404


def test_builtins_cannot_be_deleted_or_replaced(c):
    assert_json_error(c.delete("/v1/templates/default"), 409)
    assert_json_error(c.post("/v1/sandboxes/sb-" + "z" * 20 + "/template", json={"name": "default"}), 409)
    names = [t["name"] for t in c.get("/v1/templates").json()]
    assert names[:2] == ["default", "python-datasci"], names
    info = c.get("/v1/templates/default").json()
    assert info["kind"] == "builtin" and info["preimport"] == ["numpy", "pandas"], info


SETUP = textwrap.dedent("""
    import os, socket, numpy as np, pandas as pd
    rng = np.random.default_rng(7)
    pd.DataFrame({'a': rng.integers(0, 1000, 200_000), 'b': rng.random(200_000)}).to_csv('/root/data.csv', index=False)
    df = pd.read_csv('/root/data.csv')
    reads = 1
    os.remove('/root/data.csv')          # nothing left to read it again from
    big = np.arange(5_000_000)           # a large buffer (pickled out of band)
    def total(frame): return int(frame.a.sum())
    class Point:
        def __init__(self, x): self.x = x
    p = Point(3)
    alias = df                           # shared references stay shared
    sock = socket.socket()               # cannot be saved
    os.makedirs('/srv/work', exist_ok=True); os.chdir('/srv/work')
    os.environ['STAGE'] = 'saved'
    open('/srv/work/notes.txt', 'w').write('kept')
    os.remove('/etc/debian_version')
    print(total(df))
""")


def test_a_saved_sandbox_gives_new_sandboxes_its_dataframe_without_rereading_it(srv, c):
    src = create_raw(c, ram_mib=2048)
    try:
        want = exec_ok(c, src, SETUP).strip()
        r = c.post(f"/v1/sandboxes/{src}/template", json={"name": "with-df", "description": "a DataFrame, loaded"})
        assert r.status_code == 200, r.text
        info = r.json()
        assert info["kind"] == "saved" and info["saved_from"] == src and info["base"] == "default", info
        assert info["limits"]["ram_mib"] == 2048 and info["layers"] == 2, info
        assert [u["name"] for u in info["unsaved"]] == ["sock"], info
        # The source sandbox goes on, its state untouched and no save files left.
        assert exec_ok(c, src, "import os; print(reads, total(df), os.getcwd(), os.path.exists('/.forkbox-space'))") == \
            f"1 {want} /srv/work False\n"
        wait_warm(c, "with-df")
        made = [create_raw(c, template="with-df") for _ in range(3)]
        try:
            for sid in made:
                out = exec_ok(c, sid, "import os; print(reads, total(df), alias is df, big.sum(), p.x, os.getcwd(), os.environ['STAGE'], "
                                      "open('notes.txt').read(), os.path.exists('/etc/debian_version'), os.path.exists('/root/data.csv'), "
                                      "os.path.exists('/.forkbox-space'), 'sock' in globals())")
                assert out == f"1 {want} True 12499997500000 3 /srv/work saved kept False False False False\n", out
            # Each is its own copy.
            exec_ok(c, made[0], "df.loc[0, 'a'] = 10**9; reads = 2")
            assert exec_ok(c, made[1], "print(reads, total(df))") == f"1 {want}\n"
            pool = c.get("/v1/pool").json()["templates"]
            assert pool.get("with-df", {}).get("served", 0) >= 1, pool
            use = c.get("/v1/templates/with-df").json()["in_use"]
            assert set(made) <= set(use["sandboxes"]), use
        finally:
            for sid in made:
                delete_raw(c, sid)
    finally:
        delete_raw(c, src)


def test_deleting_a_template_in_use_is_409_unless_forced(srv, c):
    src = create_raw(c)
    exec_ok(c, src, "open('/etc/only-in-layer', 'w').write('layer data'); x = 5")
    assert c.post(f"/v1/sandboxes/{src}/template", json={"name": "doomed"}).status_code == 200
    delete_raw(c, src)
    user = create_raw(c, template="doomed")
    before = layer_dirs(srv)
    err = assert_json_error(c.delete("/v1/templates/doomed"), 409)
    assert "1 sandbox" in err["error"], err
    # Forced: the name goes at once; the sandbox keeps its files.
    assert c.delete("/v1/templates/doomed?force=true").status_code == 204
    assert_json_error(c.get("/v1/templates/doomed"), 404)
    assert_json_error(c.post("/v1/sandboxes", json={"template": "doomed"}), 404)
    assert exec_ok(c, user, "print(open('/etc/only-in-layer').read(), x)") == "layer data 5\n"
    assert layer_dirs(srv) == before, "a layer a live sandbox stands on was removed"
    delete_raw(c, user)
    # Spaces depend on their template too.
    sp_src = create_raw(c)
    assert c.post(f"/v1/sandboxes/{sp_src}/template", json={"name": "spaced"}).status_code == 200
    on = create_raw(c, template="spaced")
    delete_raw(c, sp_src)
    space = c.post(f"/v1/sandboxes/{on}/freeze").json()["space_id"]
    assert c.get("/v1/templates/spaced").json()["in_use"]["spaces"] == [space]
    assert_json_error(c.delete("/v1/templates/spaced"), 409)
    assert c.delete(f"/v1/spaces/{space}").status_code == 204
    assert c.delete("/v1/templates/spaced").status_code == 204
    # With nothing on them any more, both templates' layers are collected.
    c.post("/v1/templates", json={"name": "gc-nudge", "commands": ["true"]}).read()
    deadline = time.monotonic() + 20
    while (layer_dirs(srv) & before) - layer_dirs_of_templates(c, srv) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (layer_dirs(srv) - layer_dirs_of_templates(c, srv)), (layer_dirs(srv), layer_dirs_of_templates(c, srv))
    assert c.delete("/v1/templates/gc-nudge").status_code == 204


def layer_dirs_of_templates(c: httpx.Client, srv: ForkboxServer) -> set[str]:
    """Layers the registered custom templates stand on (read from disk)."""
    root = os.path.join(srv.state_dir, "custom-templates")
    keep = set()
    for f in os.listdir(os.path.join(root, "templates")):
        top = json.load(open(os.path.join(root, "templates", f))).get("top")
        while top:
            keep.add(top)
            top = json.load(open(os.path.join(root, "layers", top, "layer.json"))).get("parent")
    return keep


def test_the_cli_builds_a_toml_recipe_with_files_next_to_it(srv, c, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "greeting.txt").write_text("hi from a file beside the recipe\n")
    (tmp_path / "recipe.toml").write_text(textwrap.dedent("""
        name = "from-cli"
        base = "default"
        commands = ["cat /srv/greeting.txt > /srv/copy.txt"]
        preimport = ["json"]

        [[files]]
        src = "data/greeting.txt"
        path = "/srv/greeting.txt"
        mode = 0o600

        [limits]
        ram_mib = 640
    """))
    out = subprocess.run([FORKBOX_BIN, "template", "build", str(tmp_path / "recipe.toml"), "--url", srv.url],
                         capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    assert out.returncode == 0, out
    assert "step 1/3" in out.stderr and "built template from-cli" in out.stdout, out
    listed = subprocess.run([FORKBOX_BIN, "template", "list", "--url", srv.url], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and any(l.split()[:2] == ["from-cli", "recipe"] for l in listed.stdout.splitlines()), listed
    sid = create_raw(c, template="from-cli")
    try:
        assert exec_ok(c, sid, "cat /srv/copy.txt; stat -c %a /srv/greeting.txt", language="bash") == \
            "hi from a file beside the recipe\n600\n"
    finally:
        delete_raw(c, sid)
    # A failing build exits non-zero with the server's reason.
    (tmp_path / "bad.toml").write_text('name = "from-cli-bad"\ncommands = ["exit 7"]\n')
    bad = subprocess.run([FORKBOX_BIN, "template", "build", str(tmp_path / "bad.toml"), "--url", srv.url],
                         capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    assert bad.returncode == 1 and "exited with 7" in bad.stderr, bad
    rm = subprocess.run([FORKBOX_BIN, "template", "rm", "from-cli", "--url", srv.url], capture_output=True, text=True, timeout=60)
    assert rm.returncode == 0, rm
    assert c.get("/v1/templates/from-cli").status_code == 404


def test_custom_templates_and_their_state_survive_a_restart(say, server):
    with running(ForkboxServer("templates-restart", build_templates=False, log=say)) as s:
        with s.http(timeout=300.0) as c:
            src = create_raw(c)
            exec_ok(c, src, "import pandas as pd\nframe = pd.DataFrame({'v': [1, 2, 3]})\nopen('/srv/mark', 'w').write('m')")
            assert c.post(f"/v1/sandboxes/{src}/template", json={"name": "lasting"}).status_code == 200
            delete_raw(c, src)
        assert s.stop() == 0
        s.start()
        s.wait_ready()
        with s.http(timeout=300.0) as c:
            assert c.get("/v1/templates/lasting").json()["kind"] == "saved"
            for _ in range(2):  # the first may be made before the pool is warm
                sid = create_raw(c, template="lasting")
                assert exec_ok(c, sid, "print(int(frame.v.sum()), open('/srv/mark').read())") == "6 m\n"
                delete_raw(c, sid)
            assert c.delete("/v1/templates/lasting").status_code == 204


def test_a_keys_templates_are_its_own(say, server):
    s = ForkboxServer("templates-keys", build_templates=False, log=say)
    alice, bob = s.add_key("alice"), s.add_key("bob")
    with running(s):
        with s.http(alice, timeout=300.0) as a, s.http(bob, timeout=300.0) as b:
            src = create_raw(a)
            exec_ok(a, src, "secret = 'alice only'")
            assert a.post(f"/v1/sandboxes/{src}/template", json={"name": "private"}).status_code == 200
            assert [t["name"] for t in b.get("/v1/templates").json()] == ["default", "python-datasci"]
            assert_json_error(b.get("/v1/templates/private"), 404)
            assert_json_error(b.post("/v1/sandboxes", json={"template": "private"}), 404)
            assert_json_error(b.delete("/v1/templates/private"), 404)
            bsrc = create_raw(b)
            assert_json_error(b.post(f"/v1/sandboxes/{bsrc}/template", json={"name": "private"}), 409)
            assert_json_error(b.post("/v1/templates", json={"name": "private"}), 409)
            mine = create_raw(a, template="private")
            assert exec_ok(a, mine, "print(secret)") == "alice only\n"
            for sid, cl in ((src, a), (mine, a), (bsrc, b)):
                delete_raw(cl, sid)
            assert a.delete("/v1/templates/private").status_code == 204


def test_a_sandbox_cannot_change_its_template_for_the_next_one(c, tools):
    """Layers are read-only lowers: a sandbox that rewrites, deletes and
    renames the template's files, and tries the layers' own mounts, changes
    only its own copy."""
    sid = create_raw(c, template="tools")
    try:
        out = exec_ok(c, sid, textwrap.dedent("""
            set +e
            echo tampered > /opt/app/hello.sh
            rm -f /etc/built-marker /usr/bin/jq
            mv /opt/app /opt/app-moved
            grep -c ' overlay ' /proc/self/mountinfo
            grep -o 'lowerdir=[^,]*' /proc/self/mountinfo | head -1
            mount -o remount,rw / 2>&1 | tail -1
            echo done
        """), language="bash")
        lines = out.splitlines()
        # Layers are named by the shim's descriptors, never by host path.
        assert lines[-1] == "done" and lines[1].startswith("lowerdir=/proc/self/fd/"), out
        assert "custom-templates" not in out and "/var/lib" not in out, out  # no host path shows
    finally:
        delete_raw(c, sid)
    fresh = create_raw(c, template="tools")
    try:
        out = exec_ok(c, fresh, "/opt/app/hello.sh; cat /etc/built-marker; jq -n 2", language="bash")
        assert out == "hello from the recipe\nbuilt\n2\n", out
    finally:
        delete_raw(c, fresh)


def test_recipe_files_land_inside_the_template_whatever_their_path_says(srv, c):
    escape = "/../../../../../tmp/forkbox-template-escape"
    events = build(c, {"name": "escapes", "files": [{"path": escape, "content_b64": b64(b"inside")}],
                       "commands": ["ln -s /etc/shadow /srv/shadow-link; cat /tmp/forkbox-template-escape"]})
    done(events)
    assert not os.path.exists("/tmp/forkbox-template-escape"), "a recipe file was written on the host"
    assert "inside" in "".join(e["text"] for e in events if e["type"] == "log")
    sid = create_raw(c, template="escapes")
    try:
        # The symlink stays a symlink into the sandbox's own /etc.
        assert exec_ok(c, sid, "readlink /srv/shadow-link; cat /tmp/forkbox-template-escape", language="bash") == "/etc/shadow\ninside"
    finally:
        delete_raw(c, sid)
    layers = os.path.join(srv.state_dir, "custom-templates", "layers")
    links = [os.path.join(r, f) for r, _, fs in os.walk(layers) for f in fs if f == "shadow-link"]
    assert links and all(os.readlink(p) == "/etc/shadow" for p in links), links
    assert c.delete("/v1/templates/escapes").status_code == 204


def test_without_the_warm_pool_a_create_loads_the_template_state_itself(say, server):
    with running(ForkboxServer("templates-cold", ["--no-warm-pool"], build_templates=False, log=say)) as s:
        with s.http(timeout=300.0) as c:
            src = create_raw(c)
            exec_ok(c, src, "import json\nmemo = {'k': [1, 2]}")
            assert c.post(f"/v1/sandboxes/{src}/template", json={"name": "cold"}).status_code == 200
            built = done(build(c, {"name": "cold-recipe", "base": "cold", "preimport": ["csv"]}))
            assert built["preimport"] == ["numpy", "pandas", "csv"], built
            delete_raw(c, src)
            sid = create_raw(c, template="cold")
            assert exec_ok(c, sid, "print(memo['k'], 'json' in dir())") == "[1, 2] True\n"
            other = create_raw(c, template="cold-recipe")
            # A recipe on a saved template has its files, imports its modules, not its REPL state.
            assert exec_ok(c, other, "import sys; print('csv' in sys.modules, 'memo' in globals())") == "True False\n"
            assert c.get("/v1/pool").json()["templates"] == {}
            for x in (sid, other):
                delete_raw(c, x)
