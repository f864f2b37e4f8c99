"""Rich output of repl/repl.py (docs/outputs.md): `display()` and the value of
the last expression as MIME bundles (`M` and `V` frames), IPython's
`_repr_*_` protocol, matplotlib figures, pandas, and the bundle size limit.

matplotlib and pandas tests need them in the interpreter under test
(FORKBOX_TEST_PYTHON); tests/e2e/test_outputs.py runs them in the templates.
"""
import base64
import json

import pytest

from test_repl import PYTHON, Repl, fresh  # noqa: F401 (a fixture)

MAX_BUNDLE = 4 << 20          # bytes of one bundle's JSON
PNG = b'\x89PNG\r\n\x1a\n'


def has_module(name):
    import subprocess
    return subprocess.run([PYTHON, '-c', 'import ' + name], capture_output=True).returncode == 0


needs_mpl = pytest.mark.skipif(not has_module('matplotlib'), reason='matplotlib not in %s (covered by tests/e2e/test_outputs.py)' % PYTHON)
needs_pandas = pytest.mark.skipif(not has_module('pandas'), reason='pandas not in %s (covered by tests/e2e/test_outputs.py)' % PYTHON)


def displays(r):
    return [json.loads(p) for t, p in r.frames if t == 'M']


def kinds(r):
    return [t for t, _ in r.frames if t in 'MV']


@pytest.fixture(scope='module')
def repl():
    r = Repl()
    r.ok(RICH)
    yield r
    r.close()


# One class per _repr_*_ method, and what it must become.
RICH = '''
class R:
    def __init__(self, name, value):
        self.name, self.value = name, value
    def __repr__(self):
        return 'R(%s)' % self.name
    def __getattr__(self, attr):
        if attr == '_repr_%s_' % self.name:
            return lambda: self.value
        raise AttributeError(attr)
'''
TYPES = [
    ('html', '"<b>hi</b>"', 'text/html', '<b>hi</b>'),
    ('markdown', '"# hi"', 'text/markdown', '# hi'),
    ('latex', 'r"$\\alpha$"', 'text/latex', '$\\alpha$'),
    ('svg', '"<svg xmlns=\'http://www.w3.org/2000/svg\'/>"', 'image/svg+xml', "<svg xmlns='http://www.w3.org/2000/svg'/>"),
    ('png', 'b"\\x89PNG\\r\\n\\x1a\\nrest"', 'image/png', base64.b64encode(PNG + b'rest').decode()),
    ('jpeg', 'b"\\xff\\xd8\\xff"', 'image/jpeg', base64.b64encode(b'\xff\xd8\xff').decode()),
    ('pdf', 'b"%PDF-1.4"', 'application/pdf', base64.b64encode(b'%PDF-1.4').decode()),
    ('json', '{"a": [1, 2.5, None, "x"]}', 'application/json', {'a': [1, 2.5, None, 'x']}),
    ('javascript', '"alert(1)"', 'application/javascript', 'alert(1)'),
]


# ── display() and the result ─────────────────────────────────────────────

def test_display_is_a_builtin_not_a_global(fresh):
    assert fresh.value("'display' in globals(), callable(display), display.__module__") == "(False, True, 'forkbox_repl')"
    assert fresh.value("import builtins; builtins.display is display") == 'True'


@pytest.mark.parametrize('name,value,mime,expected', TYPES, ids=[t[0] for t in TYPES])
def test_each_repr_method_gives_its_type(repl, name, value, mime, expected):
    r = repl.ok('x = R(%r, %s)\ndisplay(x)\nprint("between")\nx' % (name, value))
    assert displays(r) == [{'text/plain': 'R(%s)' % name, mime: expected}]
    assert r.values == [{'text/plain': 'R(%s)' % name, mime: expected}]     # the result: the same bundle
    assert kinds(r) == ['M', 'V']
    assert r.out == b'between\n' and r.raw_out == b'' and r.err == b''


def test_display_leaves_stdout_alone_and_keeps_order(repl):
    r = repl.ok('print("a")\ndisplay(1, "s", None)\nprint("b")')
    assert displays(r) == [{'text/plain': '1'}, {'text/plain': "'s'"}, {'text/plain': 'None'}]
    assert r.out == b'a\nb\n' and r.values == []
    # frames in the order of the code: O(a), three M, O(b)
    assert [t for t, _ in r.frames] == ['O', 'M', 'M', 'M', 'O']


def test_display_returns_none_and_plain_values_have_only_text(repl):
    r = repl.ok('v = display(R("html", "<i/>"))\nv is None')
    assert r.values == [{'text/plain': 'True'}]
    r = repl.ok('[1, 2], {"k": R("html", "<i/>")}')
    assert r.values == [{'text/plain': "([1, 2], {'k': R(html)})"}]


def test_classes_are_not_asked_for_their_reprs(repl):
    r = repl.ok('class K:\n    def _repr_html_(self):\n        return "<b/>"\ndisplay(K)\nK().__class__')
    assert displays(r) == [{'text/plain': "<class '__main__.K'>"}]
    assert r.values == [{'text/plain': "<class '__main__.K'>"}]
    assert displays(repl.ok('display(K())'))[0]['text/html'] == '<b/>'


def test_objects_answering_every_attribute_give_text_only(repl):
    code = ('class Any:\n    def __getattr__(self, a):\n        return lambda *x, **k: "<b>%s</b>" % a\n'
            '    def __repr__(self):\n        return "Any"\nAny()')
    assert repl.ok(code).values == [{'text/plain': 'Any'}]


def test_repr_mimebundle(repl):
    code = ('class MB:\n'
            '    def _repr_mimebundle_(self, include=None, exclude=None):\n'
            '        return {"text/html": "<p>mb</p>", "application/vnd.custom+json": {"k": 1}, "text/plain": "MB!"}, {}\n'
            '    def _repr_html_(self):\n        return "<p>loses</p>"\n'
            '    def _repr_markdown_(self):\n        return "*md*"\n'
            'MB()')
    assert repl.ok(code).values == [{'text/plain': 'MB!', 'text/html': '<p>mb</p>',
                                     'application/vnd.custom+json': {'k': 1}, 'text/markdown': '*md*'}]


def test_repr_returning_data_and_metadata_or_none(repl):
    r = repl.ok('display(R("html", ("<b/>", {"isolated": True})), R("html", None))')
    assert displays(r) == [{'text/plain': 'R(html)', 'text/html': '<b/>'}, {'text/plain': 'R(html)'}]
    assert r.err == b''


def test_include_and_exclude(repl):
    r = repl.ok('x = R("html", "<b/>")\ndisplay(x, include=["text/html"])\ndisplay(x, exclude=["text/html"])\n'
                'display(x, include=["text/plain", "text/html"], exclude=["text/plain"], metadata={}, display_id=None)')
    assert displays(r) == [{'text/html': '<b/>'}, {'text/plain': 'R(html)'}, {'text/html': '<b/>'}]


def test_raw_bundles(repl):
    r = repl.ok('display({"text/plain": "p", "text/html": "<b/>", "image/png": b"\\x89PNG", "application/json": [1]}, raw=True)')
    assert displays(r) == [{'text/plain': 'p', 'text/html': '<b/>', 'image/png': base64.b64encode(b'\x89PNG').decode(),
                            'application/json': [1]}]
    r = repl.run('display("not a dict", raw=True)')
    assert r.error['ename'] == 'TypeError' and displays(r) == []


# ── errors in user reprs ─────────────────────────────────────────────────

def test_a_failing_repr_method_leaves_its_type_out_with_a_warning(repl):
    code = ('class Bad:\n    def __repr__(self):\n        return "Bad"\n'
            '    def _repr_html_(self):\n        raise ValueError("no html")\n'
            '    def _repr_markdown_(self):\n        return "*ok*"\n'
            '    def _repr_png_(self):\n        return 42\n'
            'display(Bad())\nBad()')
    r = repl.ok(code)
    want = {'text/plain': 'Bad', 'text/markdown': '*ok*'}
    assert displays(r) == [want] and r.values == [want]
    err = r.err.decode()
    assert '[forkbox] Bad._repr_html_() raised ValueError: no html; text/html left out\n' in err
    assert '[forkbox] Bad._repr_png_() returned int, not image/png; image/png left out\n' in err
    assert r.out == b''


def test_json_that_is_not_json_is_left_out(repl):
    r = repl.ok('display(R("json", {"x": float("nan")}), R("json", {1j: 2}), R("json", "[1, 2]"))')
    assert displays(r) == [{'text/plain': 'R(json)'}, {'text/plain': 'R(json)'},
                           {'text/plain': 'R(json)', 'application/json': [1, 2]}]
    assert r.err.count(b'application/json left out') == 2


def test_a_failing_plain_repr_is_the_callers_exception(repl):
    r = repl.run('class B:\n    def __repr__(self):\n        raise KeyError("r")\ndisplay(B())')
    assert r.exit_code == 1 and r.error['ename'] == 'KeyError' and displays(r) == []
    assert b'in __repr__' in r.err and b'forkbox_repl' not in r.err


def test_keyboard_interrupt_in_a_repr_method_interrupts(repl):
    r = repl.run('class I:\n    def _repr_html_(self):\n        raise KeyboardInterrupt\ndisplay(I())')
    assert r.exit_code == 130 and displays(r) == []


def test_display_from_a_thread_arrives_before_the_end(repl):
    r = repl.ok('import threading\nt = threading.Thread(target=display, args=(R("html", "<t/>"),))\nt.start(); t.join()')
    assert displays(r) == [{'text/plain': 'R(html)', 'text/html': '<t/>'}]


# ── the size limit ───────────────────────────────────────────────────────

def test_a_bundle_of_exactly_the_limit_passes_whole(repl):
    # {"text/plain":"p","image/png":"<n>"}: 29 bytes around the data
    n = MAX_BUNDLE - len('{"text/plain":"p","image/png":""}')
    r = repl.ok('display({"text/plain": "p", "image/png": "A" * %d}, raw=True)' % n)
    [b] = displays(r)
    assert b['image/png'] == 'A' * n and r.err == b''
    assert len(r.payload('M')) == MAX_BUNDLE


def test_one_byte_over_the_limit_drops_the_biggest_type(repl):
    n = MAX_BUNDLE - len('{"text/plain":"p","image/png":""}') + 1
    r = repl.ok('display({"text/plain": "p", "text/html": "<b/>", "image/png": "A" * %d}, raw=True)' % n)
    assert displays(r) == [{'text/plain': 'p', 'text/html': '<b/>'}]
    assert r.err.decode() == '[forkbox] image/png (4.0 MiB) left out of a display: a bundle is limited to 4.0 MiB\n'


def test_text_plain_at_the_limit_and_over_it(repl):
    # the result of 'x' * n is "'xxx…'": {"text/plain":"'…'"} is n + 19 bytes
    n = MAX_BUNDLE - 19
    r = repl.ok("'x' * %d" % n)
    assert r.values[0]['text/plain'] == "'" + 'x' * n + "'" and r.err == b''
    assert len(r.payload('V')) == MAX_BUNDLE
    r = repl.ok("'x' * %d + 'é'" % (n - 1))   # one byte more: cut
    v = r.payload('V')
    assert len(v) <= MAX_BUNDLE and len(v) > MAX_BUNDLE - 100
    text = json.loads(v)['text/plain']
    assert text.startswith("'xx") and text.endswith('\n[forkbox: cut; the whole text was %d characters]' % (n + 2))
    assert r.err.decode().startswith('[forkbox] text/plain of the result cut to ')
    assert r.out == b''


def test_the_limit_applies_to_rich_types_of_the_result(repl):
    r = repl.ok('R("svg", "<svg>" + " " * %d)' % MAX_BUNDLE)
    assert r.values == [{'text/plain': 'R(svg)'}]
    assert b'image/svg+xml (4.0 MiB) left out of the result' in r.err


# ── pandas ───────────────────────────────────────────────────────────────

@needs_pandas
def test_a_dataframe_gives_html_and_text(repl):
    r = repl.ok('import pandas as pd\ndf = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})\ndf')
    [v] = r.values
    assert set(v) == {'text/plain', 'text/html'}
    assert v['text/plain'] == repl.ok('print(repr(df), end="")').out.decode()
    assert '<table' in v['text/html'] and '<td>x</td>' in v['text/html']
    assert r.out == b'' and displays(r) == []
    assert displays(repl.ok('display(df)')) == [v]


# ── matplotlib ───────────────────────────────────────────────────────────

@pytest.fixture
def mpl(fresh):
    fresh.ok('import matplotlib\nmatplotlib.use("Agg")\nimport matplotlib.pyplot as plt')
    return fresh


def png_of(bundle):
    data = base64.b64decode(bundle['image/png'], validate=True)
    assert data.startswith(PNG) and len(data) > 1000, data[:16]
    return data


@needs_mpl
def test_plt_show_displays_and_closes_the_figure(mpl):
    r = mpl.ok('plt.plot([1, 2, 3])\nplt.show()\nprint("after")\nplt.get_fignums()')
    [d] = displays(r)
    assert d['text/plain'].startswith('<Figure size 640x480 with 1 Axes')
    assert set(d) == {'text/plain', 'image/png'}
    png_of(d)
    assert r.values == [{'text/plain': '[]'}] and r.out == b'after\n'


@needs_mpl
def test_figures_left_open_are_displayed_after_the_result_then_closed(mpl):
    r = mpl.ok('fig, ax = plt.subplots()\nax.plot([3, 1, 2])\nplt.figure()\n1 + 1')
    assert kinds(r) == ['V', 'M']      # the empty figure is closed without a display
    png_of(displays(r)[0])
    assert r.values == [{'text/plain': '2'}]
    r = mpl.ok('plt.get_fignums()')
    assert r.values == [{'text/plain': '[]'}] and displays(r) == []


@needs_mpl
def test_a_figure_as_the_last_expression_is_the_result_not_again_a_display(mpl):
    r = mpl.ok('fig = plt.figure()\nfig.gca().plot([1, 2])\nfig')
    assert displays(r) == []
    png_of(r.values[0])
    assert mpl.value('plt.get_fignums()') == '[]'


@needs_mpl
def test_a_failing_cell_still_shows_its_figures(mpl):
    r = mpl.run('plt.plot([1, 2])\n1 / 0')
    assert r.error['ename'] == 'ZeroDivisionError'
    png_of(displays(r)[0])


@needs_mpl
def test_svg_on_request(mpl):
    r = mpl.ok('plt.plot([1, 2])\ndisplay(plt.gcf(), include=["image/svg+xml"])')
    [d] = displays(r)           # displayed already: not again at the end
    assert list(d) == ['image/svg+xml'] and '<svg' in d['image/svg+xml']
    r = mpl.ok('display.set_figure_formats("png", "svg")\nplt.plot([1, 2])\nplt.show()')
    [d] = displays(r)
    assert list(d) == ['text/plain', 'image/png', 'image/svg+xml']
    png_of(d)
    assert d['image/svg+xml'].lstrip().startswith('<?xml') and '<svg' in d['image/svg+xml']
    r = mpl.ok('display.set_figure_formats("image/svg+xml")\nplt.plot([1, 2])')
    assert list(displays(r)[0]) == ['text/plain', 'image/svg+xml']
    r = mpl.run('display.set_figure_formats("gif")')
    assert r.error['ename'] == 'ValueError' and "'gif'" in r.error['evalue']


@needs_mpl
def test_no_figure_formats_leaves_figures_open(mpl):
    r = mpl.ok('display.set_figure_formats()\nplt.plot([1, 2])\nplt.show()')
    assert displays(r) == []
    assert mpl.value('len(plt.get_fignums())') == '1'
    r = mpl.ok('display(plt.gcf())')
    assert list(displays(r)[0]) == ['text/plain']


@needs_mpl
def test_pyplot_imported_in_a_later_call_is_hooked_and_stdout_is_unchanged(fresh):
    assert fresh.value("import sys; 'matplotlib' in sys.modules") == 'False'   # never imported eagerly
    r = fresh.ok('import matplotlib.pyplot as plt\nplt.plot([1])\nprint("x")\nplt.show()')
    assert len(displays(r)) == 1 and r.out == b'x\n' and r.raw_out == b''
    assert fresh.value('plt.show.__module__') == "'forkbox_repl'"
