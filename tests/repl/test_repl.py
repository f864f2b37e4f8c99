"""Tests for repl/bootstrap.py + repl/repl.py against docs/repl-protocol.md.

Runs on the host: starts the REPL with the fd layout of the protocol doc
(0 /dev/null, 1/2 pipes, 3 socketpair end, 4 memfd with repl.py) and drives it.
FORKBOX_TEST_PYTHON selects the interpreter (default: the one running pytest).
"""
import fcntl
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BOOTSTRAP = open(os.path.join(ROOT, 'repl', 'bootstrap.py')).read()
REPL_SRC = open(os.path.join(ROOT, 'repl', 'repl.py'), 'rb').read()
PYTHON = os.environ.get('FORKBOX_TEST_PYTHON', sys.executable)

FRESH_MAIN = ['__annotations__', '__builtins__', '__doc__', '__loader__',
              '__name__', '__package__', '__spec__']


class Result:
    def __init__(self):
        self.frames = []      # [(type, payload)] excluding D
        self.raw_out = b''
        self.raw_err = b''
        self.done = None      # decoded D payload

    def payload(self, kind):
        return b''.join(p for t, p in self.frames if t == kind)

    @property
    def out(self):
        return self.payload('O')

    @property
    def err(self):
        return self.payload('E')

    @property
    def values(self):
        return [json.loads(p) for t, p in self.frames if t == 'V']

    @property
    def exit_code(self):
        return self.done['exit_code']

    @property
    def error(self):
        return self.done['error']


class Repl:
    def __init__(self, cwd=None):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        memfd = os.memfd_create('repl.py')
        os.write(memfd, REPL_SRC)
        os.lseek(memfd, 0, os.SEEK_SET)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        cfd = child.fileno()

        def setup():
            a = fcntl.fcntl(cfd, fcntl.F_DUPFD, 100)
            b = fcntl.fcntl(memfd, fcntl.F_DUPFD, 100)
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.close(a)
            os.close(b)

        self.proc = subprocess.Popen(
            [PYTHON, '-u', '-c', BOOTSTRAP], stdin=subprocess.DEVNULL,
            stdout=out_w, stderr=err_w, close_fds=False, preexec_fn=setup, cwd=cwd)
        child.close()
        os.close(memfd)
        os.close(out_w)
        os.close(err_w)
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
        self.sock = parent
        self.out_r, self.err_r = out_r, err_r
        self.rbuf = b''
        self.received = 0         # bytes read from the control socket
        self.raw_out = b''
        self.raw_err = b''
        self.next_id = 1
        t, p = self.read_frame(timeout=10)
        assert t == 'R', (t, p)
        self.ready = json.loads(p)
        assert self.ready['pid'] == self.proc.pid

    # -- transport --
    def send(self, kind, payload):
        self.sock.sendall(struct.pack('>IB', len(payload) + 1, ord(kind)) + payload)

    def _drain_pipes(self):
        for fd in (self.out_r, self.err_r):
            while True:
                try:
                    d = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                if not d:
                    break
                if fd == self.out_r:
                    self.raw_out += d
                else:
                    self.raw_err += d

    def _frame_from_buf(self):
        if len(self.rbuf) >= 5:
            n = struct.unpack('>I', self.rbuf[:4])[0]
            if len(self.rbuf) >= 4 + n:
                t = chr(self.rbuf[4])
                p = self.rbuf[5:4 + n]
                self.rbuf = self.rbuf[4 + n:]
                return t, p
        return None

    def read_frame(self, timeout=10.0):
        """Next control frame (draining the raw pipes meanwhile); None on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            f = self._frame_from_buf()
            if f is not None:
                self._drain_pipes()
                return f
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self.sock, self.out_r, self.err_r], [], [], left)
            if self.sock in r:
                d = self.sock.recv(1 << 20)
                if not d:
                    raise EOFError('REPL closed the control socket')
                self.received += len(d)
                self.rbuf += d
            self._drain_pipes()

    def take_raw(self):
        self._drain_pipes()
        o, e = self.raw_out, self.raw_err
        self.raw_out = self.raw_err = b''
        return o, e

    # -- API --
    def start(self, code):
        eid = self.next_id
        self.next_id += 1
        self.send('X', json.dumps({'id': eid, 'code': code}).encode())
        return eid

    def wait(self, eid, timeout=10.0):
        res = Result()
        while True:
            f = self.read_frame(timeout)
            assert f is not None, 'timed out waiting for D; frames so far: %r' % res.frames[-5:]
            t, p = f
            if t == 'D':
                res.done = json.loads(p)
                assert res.done['id'] == eid
                break
            res.frames.append((t, p))
        res.raw_out, res.raw_err = self.take_raw()
        return res

    def run(self, code, timeout=10.0):
        return self.wait(self.start(code), timeout)

    def ok(self, code):
        r = self.run(code)
        assert r.exit_code == 0, (r.done, r.err, r.raw_err)
        return r

    def value(self, code):
        vals = self.ok(code).values
        assert len(vals) == 1, vals
        return vals[0]['text/plain']

    def close(self):
        self.sock.close()
        try:
            self.proc.wait(5)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            os.close(self.out_r)
            os.close(self.err_r)


@pytest.fixture(scope='module')
def repl():
    r = Repl()
    yield r
    r.close()


@pytest.fixture
def fresh():
    r = Repl()
    yield r
    r.close()


# ---------------------------------------------------------------------------
def test_ready_frame(repl):
    assert repl.ready['python'].startswith('%d.%d' % sys.version_info[:2]) or PYTHON != sys.executable


def test_clean_main(fresh):
    assert fresh.run('import os\nos.fstat(4)').error['ename'] == 'OSError'   # memfd closed
    fresh.ok('del os')
    assert fresh.value('sorted(globals())') == repr(FRESH_MAIN)
    assert fresh.value('__name__, __doc__, __spec__, __annotations__') == "('__main__', None, None, {})"
    assert fresh.value('import sys; sys.argv') == "['']"
    assert fresh.value("sys.path[0] in ('', __import__('os').getcwd())") == 'True'
    assert fresh.value("sys.modules['__main__'].__dict__ is globals()") == 'True'
    assert fresh.value('sys.stdout.isatty(), sys.stdout.fileno(), sys.stderr.fileno(), sys.stdout.encoding') \
        == "(False, 1, 2, 'utf-8')"


def test_state_persists(repl, tmp_path):
    p = tmp_path / 'f.txt'
    repl.ok('import math\nx = 41\ndef f(a):\n    return a + 1\nclass C:\n    v = 7\n'
            'fh = open(%r, "w")' % str(p))
    assert repl.value('f(x), math.pi > 3, C.v') == '(42, True, 7)'
    repl.ok('fh.write("hello")\nfh.close()')
    assert p.read_text() == 'hello'
    assert repl.value('import pickle\npickle.loads(pickle.dumps(C())).v') == '7'


def test_last_expression_value(repl):
    r = repl.ok('a = 2\na * 21')
    assert r.values == [{'text/plain': '42'}]
    assert r.out == b'' and r.raw_out == b''
    r = repl.ok('None')
    assert r.values == [] and r.out == b''
    r = repl.ok('print(3)')
    assert r.values == [] and r.out == b'3\n'
    r = repl.ok('"s"')
    assert r.values == [{'text/plain': "'s'"}]
    r = repl.ok('')
    assert r.frames == [] and r.error is None
    r = repl.ok('# only a comment\n')
    assert r.frames == []
    r = repl.ok('x = 5')
    assert r.values == []


def test_repr_error_is_user_exception(repl):
    r = repl.run('class Bad:\n    def __repr__(self):\n        raise ValueError("nope")\nBad()')
    assert r.exit_code == 1
    assert r.error['ename'] == 'ValueError'
    assert b'raise ValueError("nope")' in r.err
    assert r.values == []


def test_exception_traceback(repl):
    r = repl.run('def g():\n    return 1 / 0\n\ng()')
    assert r.exit_code == 1
    err = r.err.decode()
    assert err.startswith('Traceback (most recent call last):\n'), err
    assert 'line 4, in <module>' in err
    assert 'line 2, in g\n    return 1 / 0\n' in err
    assert err.rstrip().endswith('ZeroDivisionError: division by zero')
    assert 'forkbox' not in err and '<string>' not in err and 'repl' not in err
    assert r.error['ename'] == 'ZeroDivisionError'
    assert r.error['evalue'] == 'division by zero'
    assert r.error['traceback'] == err.splitlines()
    # the function's source is still shown from a later exec
    r = repl.run('g()')
    assert b'return 1 / 0' in r.err
    # and the REPL is fine afterwards
    assert repl.value('1 + 1') == '2'


def test_exception_in_last_expression_and_chained(repl):
    r = repl.run('{}["k"]')
    assert r.exit_code == 1 and r.error['ename'] == 'KeyError'
    err = r.err.decode()
    assert err.count('File "<exec-') == 1
    r = repl.run('try:\n    1/0\nexcept Exception as e:\n    raise ValueError("v") from e')
    err = r.err.decode()
    assert 'ZeroDivisionError' in err and 'direct cause' in err and 'ValueError: v' in err
    assert 'forkbox' not in err


def test_syntax_error(repl):
    r = repl.run('x = 1\n1 +')
    assert r.exit_code == 1
    err = r.err.decode()
    assert 'Traceback' not in err
    assert 'line 2' in err and '1 +' in err
    assert err.rstrip().splitlines()[-1].startswith('SyntaxError')
    assert r.error['ename'] == 'SyntaxError'
    # nothing ran
    r = repl.run('y_never_defined = 1\n)')
    assert r.exit_code == 1
    assert repl.run('y_never_defined').error['ename'] == 'NameError'


def test_system_exit(repl):
    r = repl.run('import sys\nsys.exit()')
    assert (r.exit_code, r.error, r.err) == (0, None, b'')
    r = repl.run('sys.exit(3)')
    assert (r.exit_code, r.error) == (3, None)
    r = repl.run('sys.exit("msg")')
    assert (r.exit_code, r.error, r.err) == (1, None, b'msg\n')
    r = repl.run('raise SystemExit(0)')
    assert r.exit_code == 0
    r = repl.run('exit(2)')
    assert r.exit_code == 2
    # exit() closes sys.stdin; the REPL keeps a usable (empty) stdin
    r = repl.run('input()')
    assert r.error['ename'] == 'EOFError'
    assert repl.value('"alive"') == "'alive'"


def test_stdout_stderr_order(repl):
    r = repl.ok('import sys\nprint("a")\nprint("b", file=sys.stderr)\nprint("c")\n'
                'sys.stdout.write("x")\nsys.stderr.write("y\\n")\nsys.stdout.write("z\\n")\nNone')
    got = [(t, p) for t, p in r.frames]
    merged = []
    for t, p in got:
        if merged and merged[-1][0] == t:
            merged[-1] = (t, merged[-1][1] + p)
        else:
            merged.append((t, p))
    assert merged == [('O', b'a\n'), ('E', b'b\n'), ('O', b'c\nx'), ('E', b'y\n'), ('O', b'z\n')]


def test_partial_line_flush(repl):
    eid = repl.start('import time\nprint("a", end="", flush=True)\ntime.sleep(3)\nprint("b")')
    t0 = time.monotonic()
    f = repl.read_frame(timeout=5)
    assert f == ('O', b'a')
    # It came while the code still slept (streamed), not at the end.
    assert time.monotonic() - t0 < 2.5
    r = repl.wait(eid)
    assert r.out == b'b\n'
    # unflushed partial line is sent before D
    r = repl.ok('print("tail", end="")')
    assert r.out == b'tail'


def test_raw_fd_output(repl):
    r = repl.ok('import os\nos.system("echo hi; echo there >&2")')
    assert r.raw_out == b'hi\n' and r.raw_err == b'there\n'
    assert r.out == b''
    r = repl.ok('import subprocess\nsubprocess.run(["echo", "sub"])\nos.write(1, b"w\\n")\nNone')
    assert r.raw_out == b'sub\nw\n'


def test_c_level_output(repl):
    r = repl.ok('import ctypes\nlibc = ctypes.CDLL(None)\nlibc.printf(b"x\\n")\nNone')
    assert r.raw_out == b'x\n'
    # fully buffered C stdio is flushed (fflush(NULL)) before D
    r = repl.ok('cstdout = ctypes.c_void_p.in_dll(libc, "stdout")\n'
                'libc.setvbuf(cstdout, None, 0, 65536)\nlibc.printf(b"buffered")\nNone')
    assert r.raw_out == b'buffered'
    repl.ok('libc.setvbuf(cstdout, None, 2, 0)')


def test_sigint_during_exec(repl):
    eid = repl.start('import time, sys\nprint("start", flush=True)\ntime.sleep(30)')
    assert repl.read_frame() == ('O', b'start\n')
    # The frame arrives while print() is still returning; give the REPL a
    # moment to reach the sleep so the traceback can name it.
    time.sleep(0.2)
    t0 = time.monotonic()
    os.kill(repl.proc.pid, signal.SIGINT)
    r = repl.wait(eid, timeout=5)
    assert time.monotonic() - t0 < 1.0
    assert r.exit_code == 130
    assert r.error['ename'] == 'KeyboardInterrupt'
    err = r.err.decode()
    assert 'Traceback (most recent call last):' in err and 'time.sleep(30)' in err
    assert err.rstrip().endswith('KeyboardInterrupt')
    assert repl.value('"still here"') == "'still here'"


def test_sigint_during_busy_loop_with_output(repl):
    eid = repl.start('i = 0\nwhile True:\n    i += 1\n    if i % 1000 == 0: print(i)')
    assert repl.read_frame()[0] == 'O'
    os.kill(repl.proc.pid, signal.SIGINT)
    r = repl.wait(eid, timeout=5)
    assert r.exit_code == 130
    # output framing survived the interrupt
    assert all(line.isdigit() for line in r.out.decode().split())
    assert repl.value('i > 0') == 'True'


def test_the_control_socket_moves_to_the_one_a_c_frame_brings(fresh):
    """A restored sandbox's REPL takes a control socket made in its own
    network namespace (docs/repl-protocol.md, `C`): the `c` answer is the
    first frame on the new socket, the REPL serves there with its state,
    output printed meanwhile by a thread reaches the new socket, and the
    old one gets nothing more."""
    r = fresh
    r.ok('x = 41\nimport threading, time\nstop = False\n'
         'def talk():\n    while not stop:\n        print("tick", flush=True)\n        time.sleep(0.002)\n'
         't = threading.Thread(target=talk, daemon=True); t.start()')
    time.sleep(0.05)
    new_server, new_repl = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    old = r.sock
    old.sendmsg([struct.pack('>IB', 3, ord('C')) + b'{}'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack('i', new_repl.fileno()))])
    new_repl.close()
    new_server.settimeout(10)
    assert new_server.recv(7, socket.MSG_WAITALL) == b'\x00\x00\x00\x03c{}'
    # The old socket got whole frames (the thread's output) up to the
    # move, then its end: the REPL no longer holds it.
    old.settimeout(10)
    left = b''
    while True:
        d = old.recv(1 << 16)
        if not d:
            break
        left += d
    while left:
        n, kind = struct.unpack('>IB', left[:5])
        assert len(left) >= 4 + n and chr(kind) == 'O', left[:40]
        left = left[4 + n:]
    r.sock, r.rbuf = new_server, b''
    res = r.run('stop = True; time.sleep(0.02); x + 1')
    assert res.values[-1]['text/plain'] == '42'
    assert r.run('print("after the move")').out.endswith(b'after the move\n')
    old.close()
    assert r.proc.poll() is None


def test_an_s_frame_reseeds_a_copied_repl(fresh):
    """criu's fork copies one REPL into several sandboxes without fork(2),
    so no at-fork hook runs: an `S` frame reseeds `random` and the
    generators bound to globals, as a fork child's REPL does."""
    r = fresh
    r.ok('import random\nrandom.seed(1)\ng = random.Random(7)\nbefore = (random.getstate(), g.getstate())')
    r.send('S', b'{}')
    res = r.run('print(random.getstate() != before[0], g.getstate() != before[1])')
    assert res.out == b'True True\n', res.out


@pytest.mark.skipif(subprocess.run([PYTHON, '-c', 'import numpy'], capture_output=True).returncode != 0,
                    reason='numpy not in %s (the python-datasci run has it)' % PYTHON)
def test_an_s_frame_gives_numpys_global_generator_a_new_whole_state(fresh):
    """numpy's global generator is reseeded with a state set from the
    kernel's entropy (cheaper than its seed()): the draws change, the state
    is a valid Mersenne Twister one, and a cached Gaussian is dropped as
    seed() would."""
    r = fresh
    r.ok('import numpy as np\nnp.random.seed(1)\nnp.random.standard_normal()\n'
         'before = np.random.get_state()\nexpect = np.random.random(4)\nnp.random.set_state(before)')
    assert r.value('before[3]') == '1'           # a Gaussian is cached
    r.send('S', b'{}')
    res = r.run('s = np.random.get_state()\n'
                'print(s[0], len(s[1]), s[2], s[3], (s[1] != before[1]).sum() > 600, '
                'list(np.random.random(4)) != list(expect))')
    assert res.out == b'MT19937 624 624 0 True True\n', res.out
    # Two reseeds give two different streams.
    r.ok('first = np.random.get_state()[1].copy()')
    r.send('S', b'{}')
    assert r.value('bool((np.random.get_state()[1] != first).sum() > 600)') == 'True'


def test_sigint_idle_ignored(repl):
    os.kill(repl.proc.pid, signal.SIGINT)
    time.sleep(0.2)
    os.kill(repl.proc.pid, signal.SIGINT)
    assert repl.read_frame(timeout=0.2) is None
    assert repl.proc.poll() is None
    r = repl.ok('1')
    assert r.values == [{'text/plain': '1'}] and r.err == b''


def test_large_output(repl):
    r = repl.ok('import sys\nsys.stdout.write("x" * 10_000_000)\nNone')
    assert r.out == b'x' * 10_000_000
    r = repl.ok('for i in range(100000): print(i)')
    assert r.out == ''.join('%d\n' % i for i in range(100000)).encode()
    r = repl.ok('print("é" * 1_000_000)')
    assert r.out == ('é' * 1_000_000 + '\n').encode()
    for t, p in r.frames:
        p.decode('utf-8')     # chunks never split a character


def test_stdout_reassignment(repl):
    r = repl.ok('import sys, os\nsys.stdout = open(os.devnull, "w")\nprint("lost")')
    assert r.out == b''
    r = repl.ok('print("back")')
    assert r.out == b'back\n'
    r = repl.ok('sys.stdout.close()\nprint("after close")')
    assert r.out == b'after close\n'


def test_background_thread_output(repl):
    repl.ok('import threading, time\n'
            'def bg():\n    time.sleep(0.2)\n    print("from thread")\n'
            'threading.Thread(target=bg).start()')
    f = repl.read_frame(timeout=5)
    assert f == ('O', b'from thread\n')


def test_unicode_and_bytes(repl):
    r = repl.ok('print("héllo ✓ 😀")')
    assert r.out == 'héllo ✓ 😀\n'.encode()
    r = repl.ok('import sys\nsys.stdout.buffer.write(b"\\xff\\n")\nNone')
    assert r.out == b'\xff\n'
    r = repl.ok('print("\\udcff")')
    assert r.out == b'\xff\n'
    r = repl.ok('sys.stderr.buffer.write(bytearray(b"\\x00\\x01\\n"))\nNone')
    assert r.err == b'\x00\x01\n'
    r = repl.ok('"\\udcff" + "ü"')
    assert r.values == [{'text/plain': "'\\udcffü'"}]
    r = repl.ok('class S:\n    def __repr__(self): return "\\udcff"\nS()')
    assert r.values == [{'text/plain': '\\udcff'}]


def test_top_level_await(repl):
    assert repl.value('import asyncio\nawait asyncio.sleep(0.01)\nawait asyncio.sleep(0, "r")') == "'r'"
    assert repl.value('z = await asyncio.sleep(0, 5)\nz') == '5'
    r = repl.run('async def boom():\n    raise KeyError("k")\nawait boom()')
    assert r.error['ename'] == 'KeyError'
    assert 'raise KeyError' in r.err.decode()
    assert repl.value('asyncio.run(asyncio.sleep(0, 6))') == '6'


def test_future_annotations_carry_over(fresh):
    fresh.ok('from __future__ import annotations')
    assert fresh.value('def f(x: undefined_name): pass\nf.__annotations__') == "{'x': 'undefined_name'}"


def test_fork_child_does_not_send_done(repl):
    r = repl.ok('import os\npid = os.fork()\nif pid == 0:\n    print("child")\n'
                'else:\n    os.waitpid(pid, 0)\n    print("parent")')
    assert b'child\n' in r.out and b'parent\n' in r.out
    assert repl.read_frame(timeout=0.3) is None
    assert repl.value('pid != 0') == 'True'


def test_socket_not_inherited(repl):
    r = repl.ok('import os\nos.system("for n in 3 4 7; do test -e /proc/$$/fd/$n && echo open$n; done")')
    assert r.raw_out == b''


def _raw_reply(repl, code):
    """What the first read of the control socket gets after an exec of code."""
    assert repl.rbuf == b''
    repl.start(code)
    select.select([repl.sock], [], [], 10)
    return repl.sock.recv(1 << 20)


def test_a_short_execs_output_goes_with_its_end_in_one_write(repl):
    # One write wakes the server once, not once per frame. The first read
    # after the socket turns readable gets every frame of the exec.
    for _ in range(20):
        data = _raw_reply(repl, 'print("a")\nimport sys\nprint("b", file=sys.stderr)\n7')
        repl.rbuf = data
        frames = []
        while (f := repl._frame_from_buf()) is not None:
            frames.append(f)
        assert [t for t, _ in frames] == ['O', 'E', 'V', 'D'], frames
        assert repl.rbuf == b''


def test_held_output_still_streams_while_a_cell_runs(repl):
    for code, first in (('print("line")', b'line\n'), ('sys.stdout.write("no newline")', b'no newline')):
        eid = repl.start('import sys, time\n%s\ntime.sleep(3)\nprint("end")' % code)
        t0 = time.monotonic()
        assert repl.read_frame(timeout=5) == ('O', first)
        assert time.monotonic() - t0 < 1.5
        assert repl.wait(eid).out == b'end\n'


@pytest.mark.parametrize('end, status', [('os._exit(3)', 3), ('os.abort()', -signal.SIGABRT)])
def test_held_output_goes_out_before_the_process_ends_at_once(fresh, end, status):
    fresh.start('import os\nprint("last words")\n' + end)
    assert fresh.read_frame(timeout=5) == ('O', b'last words\n')
    with pytest.raises(EOFError):
        fresh.read_frame(timeout=5)
    assert fresh.proc.wait(5) == status


def _journal(repl):
    """A descriptor of the REPL's output journal (its fd 8), to read with _read_journal."""
    return os.open('/proc/%d/fd/8' % repl.proc.pid, os.O_RDONLY)


def _read_journal(fd):
    """(stream offset, frames) as a server reads them: the open frame's
    length worked out (crates/repl-host/src/journal.rs)."""
    start, n, open_at, foreign = struct.unpack('<QIII', os.pread(fd, 20, 0))
    if foreign:
        return start, None
    data = bytearray(os.pread(fd, n, 24))
    if open_at and open_at - 1 + 5 <= n:
        data[open_at - 1:open_at + 3] = struct.pack('>I', n - (open_at - 1) - 4)
    return start, bytes(data)


def _settled_journal(repl, fd):
    """The journal once the REPL has emptied it after the write its D frame
    ended (it does so just after that write returns)."""
    deadline = time.monotonic() + 2
    while _read_journal(fd) != (repl.received, b'') and time.monotonic() < deadline:
        time.sleep(0.01)
    return _read_journal(fd)


def _frames(data):
    out = []
    while len(data) >= 5:
        n = struct.unpack('>I', data[:4])[0]
        out.append((chr(data[4]), data[5:4 + n]))
        data = data[4 + n:]
    return out


@pytest.mark.parametrize('stall', [
    'ctypes.PyDLL(None).sleep(30)',               # a C call that keeps the GIL
    'sum(range(10 ** 12))',                       # a builtin that never lets the flusher in
], ids=['c-call', 'builtin'])
def test_output_held_when_the_process_is_killed_is_in_its_journal(fresh, stall):
    j = _journal(fresh)
    fresh.start('import ctypes\nprint("last words")\nprint("err", file=__import__("sys").stderr)\n' + stall)
    # The flusher cannot run: nothing reaches the socket.
    assert fresh.read_frame(timeout=0.5) is None
    fresh.proc.kill()
    with pytest.raises(EOFError):
        fresh.read_frame(timeout=5)
    start, data = _read_journal(j)
    os.close(j)
    # What the socket did not bring, as a server reads it (crates/repl-host/src/journal.rs).
    assert start <= fresh.received <= start + len(data)
    assert _frames(data[fresh.received - start:]) == [('O', b'last words\n'), ('E', b'err\n')]


def test_the_journal_keeps_only_what_is_not_yet_written(fresh):
    j = _journal(fresh)
    for code in ('print(1)', 'print("x" * 200_000)', 'import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.05)',
                 'display({"a": 1}, raw=True)', '2 + 2'):
        fresh.ok(code)
        assert _settled_journal(fresh, j) == (fresh.received, b''), code
    # a held line waits in the journal, right after what the socket brought
    fresh.start('import ctypes\nprint("held")\nctypes.PyDLL(None).usleep(300_000)')
    time.sleep(0.1)
    start, data = _read_journal(j)
    assert start == fresh.received and _frames(data) == [('O', b'held\n')]
    os.close(j)


def test_a_user_fork_child_writing_to_the_socket_voids_the_journal(fresh):
    j = _journal(fresh)
    fresh.ok('import os\nprint("held")\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)')
    # a child that wrote nothing changed nothing
    assert _settled_journal(fresh, j) == (fresh.received, b'')
    r = fresh.ok('pid = os.fork()\nif pid == 0:\n    print("from the child")\n    os._exit(0)\nos.waitpid(pid, 0)')
    assert r.out == b'from the child\n'
    # the child's frames went on the same socket: the REPL's count of bytes
    # written no longer says where the server is, and the journal says so
    assert _read_journal(j)[1] is None
    fresh.ok('print(1)')
    assert _read_journal(j)[1] is None       # for good
    os.close(j)


@pytest.mark.parametrize('line, then', [
    ('print("before", flush=True)', 'os.write(1, b"child\\n")'),          # an explicit flush sends at once
    ('print("before")', 'subprocess.run(["echo", "child"])'),             # held output goes before a process starts
], ids=['flush', 'process'])
def test_a_line_sent_at_once_is_on_the_socket_before_what_follows_reaches_fd_1(repl, line, then):
    eid = repl.start('import os, subprocess, time\n%s\n%s\ntime.sleep(0.5)\nprint("later")' % (line, then))
    select.select([repl.out_r], [], [], 10)
    assert os.read(repl.out_r, 100) == b'child\n'
    # By then the line written before is on the socket, not held 10 ms.
    assert select.select([repl.sock], [], [], 0)[0] == [repl.sock]
    assert repl.read_frame(timeout=1) == ('O', b'before\n')
    assert repl.wait(eid).out == b'later\n'


def test_multiprocessing_fork_pool(repl):
    r = repl.ok('import multiprocessing as mp\ndef sq(x):\n    print("w", x)\n    return x * x\n'
                'with mp.get_context("fork").Pool(2) as p:\n    res = p.map(sq, range(4))\nres')
    assert r.values == [{'text/plain': '[0, 1, 4, 9]'}]
    assert sorted(r.out.splitlines()) == [b'w 0', b'w 1', b'w 2', b'w 3']


def test_sigint_during_heavy_output_keeps_framing(repl):
    repl.ok('import threading, sys\nstop_bg = False\ndef bg():\n    while not stop_bg:\n'
            '        sys.stderr.write("e" * 5000 + "\\n")\nthreading.Thread(target=bg, daemon=True).start()')
    for n in (10, 3000, 70000):
        eid = repl.start('while True: print("x" * %d)' % n)
        time.sleep(0.02)
        os.kill(repl.proc.pid, signal.SIGINT)
        r = repl.wait(eid)
        assert r.exit_code == 130
        assert set(r.out) <= set(b'x\n')
    repl.ok('stop_bg = True')
    time.sleep(0.05)
    assert repl.value('1 + 1') == '2'


def test_eof_exits(fresh):
    fresh.sock.shutdown(socket.SHUT_WR)
    assert fresh.proc.wait(5) == 0


def test_many_execs_in_a_row_stay_correct(repl):
    # Speed is measured by bench/run.py, not asserted here.
    for i in range(200):
        r = repl.run(f'print({i})')
        assert (r.out, r.exit_code) == (f'{i}\n'.encode(), 0)
