"""run_code / run_code_stream: exact output, results, displays, errors, timeouts."""
from __future__ import annotations

import time

import pytest

import forkbox
from forkbox import Event, Execution


def test_stdout_is_exact_bytes_not_joined_lines(sb):
    ex = sb.run_code("print('a')\nprint('b', end='')\nimport sys; sys.stderr.write('e1\\ne2')")
    assert isinstance(ex, Execution)
    assert ex.stdout == "a\nb"
    assert ex.stderr == "e1\ne2"
    assert ex.exit_code == 0 and ex.ok and ex.error is None
    ex = sb.run_code("print('trailing')")
    assert ex.stdout == "trailing\n"  # podflare's join would lose the newline
    ex = sb.run_code("print()\nprint()")
    assert ex.stdout == "\n\n"


def test_a_line_longer_than_an_event_comes_back_whole(sb):
    ex = sb.run_code("print('x' * 200_000 + 'end')")
    assert ex.stdout == "x" * 200_000 + "end\n"
    assert sum(1 for e in ex.events if e.type == "stdout") > 1  # it did come in pieces


def test_bytes_that_are_not_utf8(sb):
    ex = sb.run_code("import os; os.write(1, b'\\xff\\xfeok\\n')")
    out = b"".join(e.raw for e in ex.events if e.type == "stdout")
    assert out == b"\xff\xfeok\n"


def test_result_is_the_mime_bundle_of_the_last_expression(sb):
    ex = sb.run_code("x = 6 * 7\nx")
    assert ex.result == {"text/plain": "42"} and ex.text == "42"
    ex = sb.run_code("class H:\n    def _repr_html_(self): return '<b>h</b>'\n    def __repr__(self): return 'H()'\nH()")
    assert ex.result == {"text/plain": "H()", "text/html": "<b>h</b>"}
    assert sb.run_code("None").result is None


def test_displays_in_order(sb):
    ex = sb.run_code("display({'text/plain': 'one', 'image/png': 'aGk='}, raw=True)\n"
                     "display('two')\nprint('between')\n3")
    assert ex.displays == [{"text/plain": "one", "image/png": "aGk="}, {"text/plain": "'two'"}]
    assert ex.stdout == "between\n" and ex.text == "3"


def test_error_is_structured(sb):
    ex = sb.run_code("def f():\n    raise ValueError('bad value')\nprint('before')\nf()")
    assert ex.exit_code == 1 and not ex.ok
    assert ex.stdout == "before\n"
    assert ex.error.name == "ValueError" and ex.error.value == "bad value"
    assert ex.error.traceback[0].startswith("Traceback") and ex.error.traceback[-1] == "ValueError: bad value"
    assert "ValueError: bad value" in ex.stderr
    assert str(ex.error) == "ValueError: bad value"


def test_system_exit_and_bash(sb):
    assert sb.run_code("raise SystemExit(7)").exit_code == 7
    ex = sb.run_code("echo out; echo err >&2; exit 3", language="bash")
    assert (ex.stdout, ex.stderr, ex.exit_code) == ("out\n", "err\n", 3)


def test_state_persists_between_calls(sb):
    sb.run_code("import json\ncounter = {'n': 1}")
    sb.run_code("counter['n'] += 1")
    assert sb.run_code("print(json.dumps(counter))").stdout == '{"n": 2}\n'


def test_warnings_tell_that_the_repl_died(sb):
    ex = sb.run_code("import os; os._exit(3)")
    assert ex.exit_code != 0 and ex.error is not None
    ex = sb.run_code("print('alive')")
    assert ex.stdout == "alive\n"
    assert len(ex.warnings) == 1 and ex.warnings[0], ex.events


def test_timeout_raises_with_the_partial_execution(sb):
    with pytest.raises(forkbox.Timeout) as info:
        sb.run_code("import time\nprint('started', flush=True)\ntime.sleep(30)", timeout=0.5)
    e = info.value
    assert isinstance(e, TimeoutError) and isinstance(e, forkbox.ForkboxError)
    assert e.execution.exit_code == 124 and e.execution.timed_out
    assert e.execution.stdout == "started\n"
    with pytest.raises(forkbox.Timeout):
        sb.run_code("sleep 30", language="bash", timeout=0.5)
    # a Python TimeoutError of the user's own is just an error
    ex = sb.run_code("raise TimeoutError('mine')")
    assert ex.exit_code == 1 and ex.error.name == "TimeoutError" and not ex.timed_out
    assert sb.run_code("print('still here')").stdout == "still here\n"


def test_callbacks_get_output_as_it_arrives(sb):
    out, err = [], []
    ex = sb.run_code("import sys\nfor i in range(3):\n    print(i)\nsys.stderr.write('x\\n')",
                     on_stdout=out.append, on_stderr=err.append)
    # The lines printed together come in one chunk (docs/api.md#chunks).
    assert out == ["0\n1\n2\n"] and err == ["x\n"]
    assert ex.stdout == "".join(out)
    out = []
    sb.run_code("import time\nprint('one', flush=True)\ntime.sleep(0.5)\nprint('two')", on_stdout=out.append)
    assert out == ["one\n", "two\n"]


def test_many_lines_come_in_few_events_with_every_byte(sb):
    ex = sb.run_code("for i in range(30000): print(i)")
    assert ex.stdout == "".join(f"{i}\n" for i in range(30000))
    stdout = [e for e in ex.events if e.type == "stdout"]
    assert len(stdout) < 300, len(stdout)
    assert sum(e.lines for e in stdout) == 30000


def test_stream_yields_typed_events_while_the_code_runs(sb):
    code = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.4)\n'done'"
    seen, arrival = [], []
    start = time.monotonic()
    for ev in sb.run_code_stream(code):
        assert isinstance(ev, Event)
        seen.append(ev)
        arrival.append(time.monotonic() - start)
    assert [e.type for e in seen] == ["stdout", "stdout", "stdout", "result", "exit"]
    assert [e.seq for e in seen] == list(range(5))
    assert [e.data for e in seen[:3]] == ["0", "1", "2"] and all(e.nl for e in seen[:3])
    assert seen[3].bundle == {"text/plain": "'done'"} and seen[-1].data == 0
    assert arrival[2] - arrival[0] > 0.6  # streamed, not delivered at the end


def test_bad_language_is_bad_request(sb):
    with pytest.raises(forkbox.BadRequest) as info:
        sb.run_code("1", language="ruby")
    assert info.value.status == 400 and "language" in info.value.message


def test_code_over_10_mib_is_payload_too_large(sb):
    with pytest.raises(forkbox.PayloadTooLarge) as info:
        sb.run_code("#" * (10 * 1024 * 1024 + 1))
    assert info.value.status == 413


def test_replay(sb):
    sb.run_code("print('r1')")
    evs = sb.replay()
    assert any(e.type == "stdout" and e.data == "r1" for e in evs)
    assert evs[-1].type == "exit"
