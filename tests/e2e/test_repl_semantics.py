"""The persistent Python REPL, driven through the published podflare SDK
(and raw HTTP where the SDK drops fields): state survives between calls,
errors and exits do not poison it, timeouts and crashes are reported and
recovered from."""
from __future__ import annotations

import hashlib
import threading
import time

import pytest

from helpers import exec_raw


def run_ok(sb, code, language="python"):
    r = sb.run_code(code, language=language)
    assert r.exit_code == 0, (code, r)
    return r


# ── state persistence ───────────────────────────────────────────────────

def test_variables_imports_functions_and_classes_persist(sandbox):
    run_ok(sandbox, "x = 41\nimport json as J\n"
                    "def inc(v):\n    return v + 1\n"
                    "class Point:\n    def __init__(self, n):\n        self.n = n\n")
    r = run_ok(sandbox, "print(inc(x), J.dumps({'a': 1}), Point(5).n, Point.__module__)")
    assert r.stdout == '42 {"a": 1} 5 __main__'
    # pickle finds classes defined in earlier calls (they live in __main__)
    r = run_ok(sandbox, "import pickle\nprint(pickle.loads(pickle.dumps(Point(9))).n)")
    assert r.stdout == "9"


def test_open_file_handle_persists(sandbox):
    run_ok(sandbox, "fh = open('/root/data.txt', 'w+')\nfh.write('line1\\nline2\\nline3\\n')\nfh.flush()\nfh.seek(0)\n"
                    "first = fh.readline()")
    r = run_ok(sandbox, "print(repr(first), repr(fh.readline()), fh.closed)")
    assert r.stdout == "'line1\\n' 'line2\\n' False"
    r = run_ok(sandbox, "print(repr(fh.readline())); fh.close(); print(fh.closed)")
    assert r.stdout == "'line3\\n'\nTrue"


def test_thread_started_in_one_call_is_alive_in_the_next(sandbox):
    run_ok(sandbox, "import threading, time\nstop = threading.Event()\nticks = []\n"
                    "def loop():\n    while not stop.is_set():\n        ticks.append(time.monotonic())\n        time.sleep(0.02)\n"
                    "worker = threading.Thread(target=loop, daemon=True)\nworker.start()")
    r = run_ok(sandbox, "print(worker.is_alive(), len(ticks))")
    alive, n1 = r.stdout.split()
    assert alive == "True"
    time.sleep(0.3)  # the thread keeps running between calls
    r = run_ok(sandbox, "print(worker.is_alive(), len(ticks))")
    alive, n2 = r.stdout.split()
    assert alive == "True" and int(n2) > int(n1) + 3, (n1, n2)
    r = run_ok(sandbox, "stop.set(); worker.join(5); print(worker.is_alive())")
    assert r.stdout == "False"


def test_cwd_environ_and_sys_path_persist(sandbox):
    run_ok(sandbox, "import os, sys\nos.makedirs('/tmp/wd', exist_ok=True)\nos.chdir('/tmp/wd')\n"
                    "os.environ['FB_E2E'] = 'yes'\nsys.path.append('/tmp/wd')\n"
                    "open('/tmp/wd/fbmod.py', 'w').write('VALUE = 7\\n')")
    r = run_ok(sandbox, "import os, sys\nimport fbmod\nprint(os.getcwd(), os.environ.get('FB_E2E'), sys.path[-1], fbmod.VALUE)")
    assert r.stdout == "/tmp/wd yes /tmp/wd 7"
    # child processes inherit both
    r = run_ok(sandbox, "import subprocess\nprint(subprocess.run(['sh', '-c', 'echo $FB_E2E; pwd'], capture_output=True, text=True).stdout, end='')")
    assert r.stdout == "yes\n/tmp/wd"


# ── errors and exits ────────────────────────────────────────────────────

def test_exception_does_not_poison_the_repl(sandbox, http):
    run_ok(sandbox, "y = 1")
    r = sandbox.run_code("def f():\n    raise ValueError('boom')\nf()")
    assert r.exit_code == 1
    assert "Traceback (most recent call last)" in r.stderr
    assert "ValueError: boom" in r.stderr
    assert r.stdout == ""
    # the structured error event (raw HTTP; the SDK drops unknown fields)
    e = exec_raw(http, sandbox.id, "{}['missing']")
    assert e.exit_code == 1
    errs = e.errors
    assert len(errs) == 1, e
    assert errs[0]["ename"] == "KeyError" and "missing" in errs[0]["evalue"], errs
    assert any("KeyError" in line for line in errs[0]["traceback"]), errs
    # syntax errors too
    r = sandbox.run_code("def broken(:\n    pass")
    assert r.exit_code == 1 and "SyntaxError" in r.stderr
    # and the REPL is fine, with its state
    r = run_ok(sandbox, "print(y + 1)")
    assert r.stdout == "2"


@pytest.mark.parametrize("code,expected", [
    ("raise SystemExit(3)", 3),
    ("import sys\nsys.exit(42)", 42),
    ("import sys\nsys.exit()", 0),
    ("import sys\nsys.exit(0)", 0),
    ("raise SystemExit(None)", 0),
    ("import sys\nsys.exit('bye now')", 1),
])
def test_system_exit_codes(make_sandbox, code, expected):
    sb = make_sandbox()
    run_ok(sb, "kept = 'still here'")
    r = sb.run_code("print('before')\n" + code + "\nprint('not reached')")
    assert r.exit_code == expected, r
    assert r.stdout == "before"
    if "bye now" in code:
        assert "bye now" in r.stderr
    r = run_ok(sb, "print(kept)")  # SystemExit does not end the REPL
    assert r.stdout == "still here"


def test_last_expression_value_is_a_result_event(sandbox, http):
    e = exec_raw(http, sandbox.id, "a = 20\na * 2 + 2")
    assert e.exit_code == 0
    assert e.stdout == ""  # not printed
    assert [r["data"] for r in e.results] == ["42"], e
    assert e.results[0]["bundle"]["text/plain"] == "42"
    e = exec_raw(http, sandbox.id, "print('shown')\n'val' + 'ue'")
    assert e.stdout == "shown\n" and [r["data"] for r in e.results] == ["'value'"], e
    for code in ("None", "b = 3", "print('x')", "import os", "def g():\n    return 1"):
        e = exec_raw(http, sandbox.id, code)
        assert e.exit_code == 0 and e.results == [], (code, e)
    e = exec_raw(http, sandbox.id, "[1, 2][0] if False else None")
    assert e.results == [], e
    # the SDK sees no stdout for a bare expression
    r = run_ok(sandbox, "1 + 1")
    assert r.stdout == ""


def test_pandas_and_numpy_in_the_default_template(sandbox, http):
    e = exec_raw(http, sandbox.id, "import pandas as pd\nimport numpy as np\n"
                                   "print(np.arange(4).sum())\npd.DataFrame({'a': [1, 2]}).a.sum()")
    assert e.exit_code == 0, e
    assert e.stdout == "6\n"
    assert [r["data"] for r in e.results] in (["3"], ["np.int64(3)"]), e


def test_unicode_output(sandbox):
    text = "héllo wörld ✓ 日本語 🎉 Ωmega"
    r = run_ok(sandbox, f"import sys\nprint({text!r})\nprint({text!r}, file=sys.stderr)")
    assert r.stdout == text
    assert r.stderr == text
    r = run_ok(sandbox, f"echo '{text}'", language="bash")
    assert r.stdout == text


def test_large_output_is_intact(sandbox, http):
    # 5 MB of lines through the SDK
    n = 50_000
    r = run_ok(sandbox, f"for i in range({n}):\n    print(f'{{i:08d}}' + 'x' * 92)")
    lines = r.stdout.split("\n")
    assert len(lines) == n
    assert all(line == f"{i:08d}" + "x" * 92 for i, line in enumerate(lines))
    # one 5 MB line without a newline, rebuilt exactly from the raw events
    e = exec_raw(http, sandbox.id, "import sys\nsys.stdout.write('ab' * 2_500_000 + 'END')")
    assert e.exit_code == 0
    out = e.stdout
    assert len(out) == 5_000_003
    assert hashlib.sha256(out.encode()).hexdigest() == hashlib.sha256(("ab" * 2_500_000 + "END").encode()).hexdigest()
    assert e.of("stdout")[-1]["nl"] is False


# ── exec timeouts ───────────────────────────────────────────────────────

def test_timeout_interrupts_and_state_survives(sandbox, http):
    run_ok(sandbox, "marker = 'kept'")
    t0 = time.monotonic()
    e = exec_raw(http, sandbox.id, "import time\nprint('sleeping', flush=True)\ntime.sleep(60)", timeout_ms=500)
    took = time.monotonic() - t0
    assert e.exit_code == 124, e
    assert took < 5, f"timeout of 500 ms took {took:.1f} s"
    assert e.stdout == "sleeping\n"
    assert [x.get("ename") for x in e.errors] == ["TimeoutError"], e
    # the REPL survived the interrupt: no warning, state intact
    e = exec_raw(http, sandbox.id, "print(marker)")
    assert e.exit_code == 0 and e.stdout == "kept\n" and e.warnings == [], e


def test_interrupt_ignoring_code_is_killed_after_the_grace(small_server, small_http, small_sandbox):
    sid = small_sandbox
    assert exec_raw(small_http, sid, "marker = 1").exit_code == 0
    code = ("import time\nprint('stubborn', flush=True)\nwhile True:\n    try:\n        time.sleep(1)\n"
            "    except KeyboardInterrupt:\n        pass\n")
    t0 = time.monotonic()
    e = exec_raw(small_http, sid, code, timeout_ms=500)
    took = time.monotonic() - t0
    assert e.exit_code == 124, e
    assert took < 4, f"500 ms timeout + 500 ms grace took {took:.1f} s"
    assert e.stdout == "stubborn\n"
    assert len(e.errors) == 1, e
    # the next call is told that the state is gone
    e = exec_raw(small_http, sid, "print('marker' in globals())")
    assert e.exit_code == 0, e
    assert len(e.warnings) == 1, e
    assert e.stderr.startswith("[forkbox]"), e
    assert e.stdout == "False\n"
    # once
    e = exec_raw(small_http, sid, "print(2)")
    assert e.exit_code == 0 and e.warnings == [] and e.stderr == "", e
    info = small_http.get(f"/v1/sandboxes/{sid}").json()
    assert info["repl_restarts"] == 1, info


def test_output_held_before_a_call_that_keeps_the_gil_survives_the_kill(small_http, small_sandbox):
    # The REPL holds output up to 10 ms; a C loop that keeps the GIL (and
    # so never lets the SIGINT handler run) stops its flusher, and the kill
    # after the grace ends the process with the line unsent: the server
    # takes it from the REPL's journal.
    code = "print('stubborn')\nsum(range(10 ** 13))"
    e = exec_raw(small_http, small_sandbox, code, timeout_ms=500)
    assert e.exit_code == 124, e
    assert e.stdout == "stubborn\n", e
    assert len(e.errors) == 1 and "killed" in e.errors[0]["data"], e


# ── REPL death and recovery ─────────────────────────────────────────────

def _assert_recovered(http, sid, expect_restarts=1):
    e = exec_raw(http, sid, "print('doomed' in globals())")
    assert e.exit_code == 0, e
    assert len(e.warnings) == 1 and "[forkbox]" in e.stderr, e
    assert e.stdout == "False\n"
    e = exec_raw(http, sid, "import pandas\nprint('fresh and well')")
    assert e.exit_code == 0 and e.stdout == "fresh and well\n" and e.warnings == [], e
    assert http.get(f"/v1/sandboxes/{sid}").json()["repl_restarts"] == expect_restarts


def test_os_exit_is_reported_and_recovered(sandbox, http):
    assert exec_raw(http, sandbox.id, "doomed = 1").exit_code == 0
    e = exec_raw(http, sandbox.id, "import os\nprint('bye', flush=True)\nos._exit(3)")
    assert e.exit_code == 3, e
    assert e.stdout == "bye\n"
    assert len(e.errors) == 1 and e.errors[0]["data"], e
    _assert_recovered(http, sandbox.id)


def test_segfault_is_reported_and_recovered(sandbox, http):
    assert exec_raw(http, sandbox.id, "doomed = 1").exit_code == 0
    e = exec_raw(http, sandbox.id, "import ctypes\nctypes.string_at(0)")
    assert e.exit_code == 139, e
    assert len(e.errors) == 1, e
    assert "SIGSEGV" in e.errors[0]["data"] or "signal 11" in e.errors[0]["data"], e
    _assert_recovered(http, sandbox.id)


@pytest.mark.parametrize("forked", [False, True], ids=["sandbox", "fork-child"])
def test_output_held_before_an_oom_kill_is_delivered(make_sandbox, http, forked):
    sb = make_sandbox(ram_mib=256)
    target = sb.fork(1)[0] if forked else sb
    try:
        # The copy is one C call holding the GIL until the OOM killer ends it.
        e = exec_raw(http, target.id, "print('allocating')\nx = b'\\x01' * (1 << 30)")
        assert e.stdout == "allocating\n", e
        assert [x.get("ename") for x in e.errors] == ["MemoryError"], e
        _assert_recovered(http, target.id)
    finally:
        if forked:
            target.close()


def test_memory_bomb_is_reported_and_the_server_keeps_serving(make_sandbox, http):
    bomb = make_sandbox(ram_mib=256)
    other = make_sandbox()
    run_ok(other, "survivor = 'ok'")
    assert exec_raw(http, bomb.id, "doomed = 1").exit_code == 0
    result = {}

    def explode():
        result["e"] = exec_raw(http, bomb.id, "x = b'\\x01' * (1 << 30)\nprint(len(x))")
    t = threading.Thread(target=explode)
    t.start()
    # meanwhile the other sandbox answers
    for _ in range(3):
        r = run_ok(other, "print(survivor)")
        assert r.stdout == "ok"
    t.join(60)
    assert not t.is_alive()
    e = result["e"]
    assert e.exit_code != 0, e
    assert e.stdout == ""
    assert len(e.errors) == 1, e
    err = e.errors[0]
    assert err.get("ename") == "MemoryError", e
    assert "memory" in err["data"].lower(), e
    _assert_recovered(http, bomb.id)
    assert run_ok(other, "print(survivor)").stdout == "ok"
