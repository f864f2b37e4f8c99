"""Rich outputs (docs/outputs.md) through a live server: `display` and
`result` events with MIME bundles over raw HTTP, the bundle limits, replay,
matplotlib in the `python-datasci` template, fork; and the podflare SDK's
stdout, which none of this changes."""
from __future__ import annotations

import base64
import json
import struct
import time

import pytest

from helpers import create_raw, delete_raw, exec_raw

MAX_BUNDLE = 4 << 20          # bytes of one bundle's JSON
REPLAY_BUNDLES = 16           # events of a replay that keep their bundle
PNG = b"\x89PNG\r\n\x1a\n"

# A class per _repr_*_ method of IPython's display protocol.
RICH = '''
class Rich:
    def __repr__(self):
        return "Rich()"
    def _repr_html_(self):
        return "<b>h</b>"
    def _repr_markdown_(self):
        return "**m**"
    def _repr_latex_(self):
        return r"$\\alpha$"
    def _repr_svg_(self):
        return "<svg xmlns='http://www.w3.org/2000/svg'/>"
    def _repr_png_(self):
        return b"\\x89PNG\\r\\n\\x1a\\n" + bytes(range(256))
    def _repr_jpeg_(self):
        return b"\\xff\\xd8\\xff\\xe0"
    def _repr_json_(self):
        return {"k": [1, 2.5, None]}
'''
RICH_BUNDLE = {
    "text/plain": "Rich()",
    "text/html": "<b>h</b>",
    "text/markdown": "**m**",
    "text/latex": "$\\alpha$",
    "image/svg+xml": "<svg xmlns='http://www.w3.org/2000/svg'/>",
    "image/png": base64.b64encode(PNG + bytes(range(256))).decode(),
    "image/jpeg": base64.b64encode(b"\xff\xd8\xff\xe0").decode(),
    "application/json": {"k": [1, 2.5, None]},
}


@pytest.fixture
def sid(http):
    s = create_raw(http)
    yield s
    delete_raw(http, s)


def ok(http, sid, code):
    r = exec_raw(http, sid, code)
    assert r.exit_code == 0, r
    return r


def displays(r):
    return r.of("display")


def png_bytes(bundle) -> bytes:
    data = base64.b64decode(bundle["image/png"], validate=True)
    assert data.startswith(PNG), data[:16]
    # the IHDR chunk: a real image of a real size
    width, height = struct.unpack(">II", data[16:24])
    assert data[12:16] == b"IHDR" and width > 100 and height > 100 and len(data) > 2000, (width, height, len(data))
    return data


# ── events ───────────────────────────────────────────────────────────────

def test_display_and_result_events_carry_every_type(http, sid):
    r = ok(http, sid, RICH + "print('before')\ndisplay(Rich())\nprint('after')\nRich()")
    [d] = displays(r)
    assert d["bundle"] == RICH_BUNDLE and d["data"] == "Rich()"
    assert set(d) == {"type", "data", "seq", "ts", "bundle"}
    [res] = r.results
    assert res["bundle"] == RICH_BUNDLE and res["data"] == "Rich()"
    assert [e["type"] for e in r.events] == ["stdout", "display", "stdout", "result", "exit"]
    assert r.stdout == "before\nafter\n" and r.stderr == ""


def test_display_without_text_plain_has_null_data(http, sid):
    r = ok(http, sid, RICH + "display(Rich(), include=['text/html'])\ndisplay({'text/markdown': '*x*'}, raw=True)")
    assert [(d["data"], d["bundle"]) for d in displays(r)] == [(None, {"text/html": "<b>h</b>"}), (None, {"text/markdown": "*x*"})]


def test_dataframe_gives_html_and_text(http, sid):
    r = ok(http, sid, "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})\ndf")
    [res] = r.results
    assert set(res["bundle"]) == {"text/plain", "text/html"}
    assert res["data"] == res["bundle"]["text/plain"] == ok(http, sid, "print(repr(df), end='')").stdout
    assert "<table" in res["bundle"]["text/html"] and "<td>y</td>" in res["bundle"]["text/html"]
    assert r.stdout == "" and displays(r) == []


def test_a_failing_repr_method_leaves_its_type_out(http, sid):
    r = ok(http, sid, "class B:\n    def _repr_html_(self):\n        raise RuntimeError('boom')\n"
                      "    def _repr_markdown_(self):\n        return '*m*'\ndisplay(B())\nprint('still running')")
    [d] = displays(r)
    assert set(d["bundle"]) == {"text/plain", "text/markdown"}
    assert "[forkbox] B._repr_html_() raised RuntimeError: boom; text/html left out" in r.stderr
    assert r.stdout == "still running\n"


def test_the_sdk_sees_the_same_stdout(sandbox):
    code = RICH + "print('before')\ndisplay(Rich())\nimport pandas as pd\ndisplay(pd.DataFrame({'a': [1]}))\nprint('after')\nRich()"
    r = sandbox.run_code(code)
    assert (r.exit_code, r.stdout, r.stderr) == (0, "before\nafter", "")
    events = list(sandbox.run_code_stream("display(Rich())\nprint('x')"))
    assert [e.type for e in events] == ["display", "stdout", "exit"]


def test_display_between_calls_is_attached_to_the_next(http, sid):
    ok(http, sid, "import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.3), display({'text/plain': 'late'}, raw=True))).start()")
    time.sleep(1.0)
    r = ok(http, sid, "print('next')")
    assert [(e["type"], e["data"]) for e in r.events] == [("display", "late"), ("stdout", "next"), ("exit", 0)]


# ── limits ───────────────────────────────────────────────────────────────

def test_a_bundle_of_exactly_the_limit_arrives_whole(http, sid):
    n = MAX_BUNDLE - len('{"text/plain":"p","image/png":""}')
    r = ok(http, sid, f"display({{'text/plain': 'p', 'image/png': 'A' * {n}}}, raw=True)")
    [d] = displays(r)
    assert len(d["bundle"]["image/png"]) == n and r.stderr == ""


def test_one_byte_over_the_limit_loses_the_big_type(http, sid):
    n = MAX_BUNDLE - len('{"text/plain":"p","image/png":""}') + 1
    r = ok(http, sid, f"display({{'text/plain': 'p', 'image/png': 'A' * {n}}}, raw=True)")
    assert [d["bundle"] for d in displays(r)] == [{"text/plain": "p"}]
    assert r.stderr == "[forkbox] image/png (4.0 MiB) left out of a display: a bundle is limited to 4.0 MiB\n"
    # a result's text/plain over the limit is cut, not lost
    r = ok(http, sid, f"'x' * {MAX_BUNDLE}")
    [res] = r.results
    assert len(json.dumps(res["bundle"], ensure_ascii=False, separators=(",", ":"))) <= MAX_BUNDLE
    assert res["data"].endswith("[forkbox: cut; the whole text was %d characters]" % (MAX_BUNDLE + 2))


WRITE_FRAME = """
import json, os
def compact(o):
    return json.dumps(o, separators=(',', ':')).encode()
def frame(kind, payload):
    data = (len(payload) + 1).to_bytes(4, 'big') + kind + payload
    while data:
        data = data[os.write(3, data):]
"""


def test_the_server_drops_a_bundle_over_the_limit(http, sid):
    # Only code writing to the control socket itself can send one.
    n = MAX_BUNDLE - len('{"text/plain":""}')
    r = ok(http, sid, WRITE_FRAME + f"frame(b'M', compact({{'text/plain': 'y' * {n}}}))\n"
                                    f"frame(b'M', compact({{'text/plain': 'z' * {n + 1}}}))\nprint('ok')")
    assert [len(d["data"]) for d in displays(r)] == [n]
    assert r.stdout == "ok\n"
    assert ok(http, sid, "1 + 1").results[0]["data"] == "2"     # the REPL is fine


def test_replay_keeps_the_bundles_of_the_newest_events(http, sid):
    big = "t" * (70 * 1024)
    ok(http, sid, f"for i in range({REPLAY_BUNDLES}):\n    display({{'text/plain': '%d {big}' % i, 'text/html': '<p/>'}}, raw=True)")
    replay = [e for e in (json.loads(l) for l in http.get(f"/v1/sandboxes/{sid}/replay").text.splitlines()) if e["type"] == "display"]
    assert len(replay) == REPLAY_BUNDLES and all(e["bundle"]["text/html"] == "<p/>" for e in replay)
    ok(http, sid, "display({'text/plain': 'last'}, raw=True)")
    replay = [e for e in (json.loads(l) for l in http.get(f"/v1/sandboxes/{sid}/replay").text.splitlines()) if e["type"] == "display"]
    assert "bundle" not in replay[0] and replay[0]["data"] == ("0 " + big)[:64 * 1024]
    assert [e["data"].split()[0] for e in replay[1:]] == [str(i) for i in range(1, REPLAY_BUNDLES)] + ["last"]
    assert all("bundle" in e for e in replay[1:])


# ── matplotlib (python-datasci) ──────────────────────────────────────────

@pytest.fixture
def mpl(datasci):
    c, _ = datasci
    s = create_raw(c, template="python-datasci")
    ok(c, s, "import matplotlib.pyplot as plt")
    yield c, s
    delete_raw(c, s)


def test_plt_show_gives_a_png_and_closes_the_figure(mpl):
    c, s = mpl
    r = ok(c, s, "import matplotlib\nprint(matplotlib.get_backend())\nplt.plot([1, 3, 2])\nplt.show()\nlen(plt.get_fignums())")
    [d] = displays(r)
    assert set(d["bundle"]) == {"text/plain", "image/png"} and d["data"].startswith("<Figure size 640x480")
    png_bytes(d["bundle"])
    assert r.stdout.lower() == "agg\n" and r.results[0]["data"] == "0"  # matplotlib 3.10 says "Agg"


def test_a_figure_left_open_is_displayed_at_the_end_once(mpl):
    c, s = mpl
    r = ok(c, s, "fig, ax = plt.subplots()\nax.bar(['a', 'b'], [1, 2])\n'done'")
    assert [e["type"] for e in r.events] == ["result", "display", "exit"]
    png_bytes(displays(r)[0]["bundle"])
    assert displays(ok(c, s, "x = 1")) == []      # closed: not shown again


def test_svg_on_request(mpl):
    c, s = mpl
    r = ok(c, s, "plt.plot([1, 2])\ndisplay(plt.gcf(), include=['image/svg+xml'])")
    [d] = displays(r)
    assert d["data"] is None and list(d["bundle"]) == ["image/svg+xml"]
    assert "<svg" in d["bundle"]["image/svg+xml"]
    r = ok(c, s, "display.set_figure_formats('png', 'svg')\nplt.plot([1, 2])")
    [d] = displays(r)
    png_bytes(d["bundle"])
    svg = d["bundle"]["image/svg+xml"]
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and svg.rstrip().endswith("</svg>")


def test_fork_children_keep_the_figure_formats_and_display(mpl):
    c, s = mpl
    ok(c, s, "display.set_figure_formats('svg')")
    (kid,) = c.post(f"/v1/sandboxes/{s}/fork", json={"n": 1}).json()["children"]
    try:
        r = ok(c, kid, "plt.plot([1, 2])\nplt.show()\ndisplay({'text/plain': 'kid'}, raw=True)")
        assert [sorted(d["bundle"]) for d in displays(r)] == [["image/svg+xml", "text/plain"], ["text/plain"]]
    finally:
        delete_raw(c, kid)


def test_the_sdk_stdout_is_unchanged_by_figures(datasci):
    from podflare import Sandbox
    with Sandbox(host=datasci[1], template="python-datasci") as sb:
        r = sb.run_code("import matplotlib.pyplot as plt\nprint('a')\nplt.plot([1])\nplt.show()\nprint('b')\nplt.plot([2])")
        assert (r.exit_code, r.stdout, r.stderr) == (0, "a\nb", "")
