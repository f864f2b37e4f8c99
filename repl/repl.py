"""forkbox in-sandbox Python REPL (stdlib only).

Loaded by repl/bootstrap.py as module ``forkbox_repl``; the wire protocol is
docs/repl-protocol.md.  fd 3 is the control socket (framed), fd 1/2 are the raw
stdout/stderr pipes, Python-level sys.stdout/sys.stderr become ``O``/``E`` frames.
User code runs in ``__main__.__dict__``.
"""
import _socket
import _thread
import ast
import io
import json
import linecache
import os
import signal
import sys
import types

_CTL = 3                      # control socket fd
_CHUNK = 1 << 16              # max payload of one O/E frame
_LINEBUF = 1 << 16            # send output at once when this much is pending or held
_HOLD_NS = 10_000_000         # how long output may be held for more to go with it
_TIMER_FD = 7                 # the flusher thread's timerfd (docs/repl-protocol.md)
_JOURNAL_FD = 8               # the journal: a memfd the server reads if we die (same)
_JHDR = 24                    # journal header: u64 stream offset, u32 length, u32 open frame,
                              # u32 foreign writes, 4 spare bytes
_JSIZE = 33 * 4096            # header and 132 KiB of frames: more than is ever held (_LINEBUF)
_CO_COROUTINE = 0x80          # inspect.CO_COROUTINE
_AWAIT = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
_KEEP = ('__name__', '__doc__', '__package__', '__loader__', '__spec__',
         '__annotations__', '__builtins__')

_write = os.write
_exit_now = os._exit          # the REPL's own exits; user code's os._exit sends held output first
_monotonic = __import__('time').monotonic
_get_ident = _thread.get_ident
_eval = eval
_repr = repr
_TB = types.TracebackType
_MY = globals()

# ---- state -------------------------------------------------------------------
_lock = _thread.RLock()       # guards _pend/_pkind/_held/_armed and every write to the socket
_pend = bytearray()           # pending O/E bytes, all of kind _pkind
_pkind = b'O'
_held = bytearray()           # whole frames waiting to be written
_timer_on = False             # a flusher thread runs in this process
_armed = False                # its timer is set
_timerfd_create = _settime = None   # libc's timerfd_create, timerfd_settime
_ARM = _DISARM = None         # struct itimerspec: fire once after _HOLD_NS, and never
_jm = None                    # the journal's shared mapping (None: no journal)
_jhead = None                 # its length, open-frame and foreign-writes words (3 u32)
_jtaint = None                # in a fork child of user code: the parent's _jhead
_jaddr = 0                    # where the journal is mapped (a forked REPL unmaps its parent's)
_LIBC = None                  # libc through ctypes, loaded once (_libc): fork children inherit it
_jat = 0                      # stream offset of the journal's first byte (bytes written to fd 3)
_jin = 0                      # journal bytes before _held's: a write in progress
_jbad = False                 # it overflowed: empty until what is held now is written
_inflush = False              # re-entrancy guard (GC / signal handler during a write)
_MAIN = _get_ident()
_running = False              # user code executing on the main thread
_crit = 0                     # main thread inside a socket write: defer SIGINT
_int_pending = False
_child = False                # we are a fork() child of the REPL
_G = None                     # user globals (__main__.__dict__)
_BOOT = None                  # bootstrap frame's code object (hidden in tracebacks)
_n = 0
_fflags = 0                   # accumulated `from __future__` compiler flags
_FUTMASK = 0
_loop = None
_traceback = None
_cflush = None
_OUT = _ERR = _IN = None
_CTRL = None                  # the control socket reader (_Control)
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(',', ':')).encode
_strict = json.JSONEncoder(allow_nan=False).encode


# ---- framing -----------------------------------------------------------------
# Output is held, not written at once: waking the server costs the writer
# 200-270 µs on a VM whose other vCPU idles, and each wake-up can wait
# under load (docs/reliability.md, noisy neighbours). Frames gather in
# _held and leave in one write with the next frame that must go now (a
# short exec's output goes with its `D`), or when the flusher thread's
# timer fires, _HOLD_NS after the first of them: long cells still stream.
# Arming the timer is a timerfd_settime, which wakes nobody.
#
# Held output must not die with the process: a line printed just before a
# C call that keeps the GIL (the flusher cannot run) and is then killed (a
# timeout's SIGKILL, the OOM killer) would be lost. So every byte waiting
# to be written is also in the journal, a memfd at fd 8 mapped shared; the
# server holds a copy of the memfd and, when the REPL dies, passes on what
# the journal holds beyond what the socket brought it. Stores into the
# mapping are plain memory writes, in an order that a kill between any two
# leaves a header that describes whole bytes: data first, then the length.
# The pending bytes cost one copy and one length per write: their frame's
# length is left to the server (header word 3 says where that frame starts).
# A fork child of user code (multiprocessing) writes its own frames on the
# parent's socket, so the parent's count of bytes written no longer says
# where the server is in the stream: before its first write the child sets
# the parent's foreign-writes word, and the server then reads no journal.
def _jover():
    """The journal cannot hold what is added (it is being written now):
    keep it empty until the write is done."""
    global _jbad
    _jbad = True
    _jhead[0] = _jhead[1] = 0


def _start_journal():
    """A fresh, empty journal at fd 8 for a fresh control stream; none if
    that fails (output is then only as safe as the flusher makes it)."""
    global _jm, _jhead, _jat, _jin, _jbad, _jtaint, _jaddr
    _jm = _jtaint = None
    _jat = _jin = 0
    _jbad = False
    try:                      # mapped with libc: Python's mmap keeps a descriptor of its own
        import ctypes
        fd = os.memfd_create('forkbox-journal', os.MFD_CLOEXEC)
        if fd != _JOURNAL_FD:
            os.dup2(fd, _JOURNAL_FD, inheritable=False)
            os.close(fd)
        os.ftruncate(_JOURNAL_FD, _JSIZE)
        addr = _mmap()(None, _JSIZE, 3, 1, _JOURNAL_FD, 0)      # PROT_READ|PROT_WRITE, MAP_SHARED
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return
        m = memoryview((ctypes.c_char * _JSIZE).from_address(addr)).cast('B')
    except Exception:
        return
    with _lock:               # anything held already goes in first
        _pend_to_held_locked()
        _jm, _jhead, _jaddr = m, m[8:20].cast('I'), addr
        if _JHDR + len(_held) > _JSIZE:
            _jover()
        elif _held:
            _jm[_JHDR:_JHDR + len(_held)] = _held
            _jhead[0] = len(_held)


def _writeall(data):
    global _jtaint
    if _jtaint is not None:   # a user's fork child, on its parent's socket
        _jtaint[2] = 1
        _jtaint = None
    try:
        n = _write(_CTL, data)
        if n != len(data):
            mv = memoryview(data)[n:]
            while mv:
                mv = mv[_write(_CTL, mv):]
    except OSError:
        _exit_now(0)          # server went away


def _queue_locked(kind, payload, journaled=False):
    """Add a frame to _held. ``journaled``: it is the open frame of the
    pending bytes, whose payload the journal has already."""
    at = _jin + len(_held)
    head = (len(payload) + 1).to_bytes(4, 'big') + kind
    _held.extend(head)
    _held.extend(payload)
    if _jm is not None and not _jbad:
        if journaled:         # close the open frame: its length, then no open frame
            _jm[_JHDR + at:_JHDR + at + 4] = head[:4]
            _jhead[1] = 0
        else:
            start = _JHDR + at
            end = start + 5 + len(payload)
            if end > _JSIZE:
                _jover()
            else:
                _jm[start:start + 5] = head
                _jm[start + 5:end] = payload
                _jhead[0] = end - _JHDR


def _pend_to_held_locked():
    """Frame the pending O/E bytes into _held; caller holds _lock."""
    global _pend
    if not _pend:
        return
    data = _pend
    _pend = bytearray()
    kind = _pkind
    n = len(data)
    if n <= _CHUNK:
        _queue_locked(kind, data, True)
        return
    if _jm is not None and not _jbad:
        _jover()              # cut in several frames: it is written now
    pos = 0
    while pos < n:
        end = pos + _CHUNK
        if end < n:           # do not split a UTF-8 sequence between frames
            e = end
            while e > end - 3 and (data[e] & 0xC0) == 0x80:
                e -= 1
            if (data[e] & 0xC0) != 0x80:
                end = e
        else:
            end = n
        _queue_locked(kind, data[pos:end])
        pos = end


def _write_locked():
    """Write everything pending and held now; caller holds _lock."""
    global _held, _inflush, _armed, _jat, _jin, _jbad
    _pend_to_held_locked()
    if _armed:
        _armed = False
        _settime(_TIMER_FD, 0, _DISARM, None)
    if _inflush:              # re-entered from inside a write (GC, signal handler):
        return                # that write's loop sends what was added
    _inflush = True
    try:
        while _held:
            data = _held
            _held = bytearray()
            _jin += len(data)     # in the journal until the socket has all of it
            _writeall(data)
            _pend_to_held_locked()
        if _jin:              # all written: the journal starts afresh after it
            _jat += _jin
            _jin = 0
            _jbad = False
            if _jm is not None:
                _jhead[0] = _jhead[1] = 0
                _jm[0:8] = _jat.to_bytes(8, 'little')
    finally:
        _inflush = False


def _soon_locked(line_done):
    """Pending output goes within _HOLD_NS, or now if there is much of it or
    no flusher to send it later; without one a line waits for its end."""
    global _armed
    if len(_pend) + len(_held) >= _LINEBUF:
        _write_locked()
    elif _timer_on:
        if not _armed:
            _armed = True
            _settime(_TIMER_FD, 0, _ARM, None)
    elif line_done:
        _write_locked()


def _under_lock(fn, *args):
    """Run fn(*args) holding _lock. On the main thread a SIGINT meanwhile
    is held back (_crit) and raised after, so a frame is never cut short."""
    global _crit, _int_pending
    main = _get_ident() == _MAIN
    if main:
        _crit += 1
    try:
        with _lock:
            fn(*args)
    finally:
        if main:
            _crit -= 1
            if _int_pending and not _crit:
                _int_pending = False
                if _running:
                    raise KeyboardInterrupt


def _out_locked(kind, data, line_done):
    global _pkind
    if _pend and _pkind != kind:
        _pend_to_held_locked()
    _pkind = kind
    _pend.extend(data)
    if _jm is not None and not _jbad:
        # The pending bytes, as the open frame they will become: its kind
        # once, its length left to the server (header word 3 says where it is).
        at = _JHDR + _jin + len(_held)
        end = at + 5 + len(_pend)
        if end > _JSIZE:
            _jover()
        else:
            if len(_pend) == len(data):
                _jm[at + 4] = kind[0]
                _jhead[1] = at - _JHDR + 1
            _jm[end - len(data):end] = data
            _jhead[0] = end - _JHDR
    _soon_locked(line_done)


def _frame_locked(kind, payload, now):
    _pend_to_held_locked()
    _queue_locked(kind, payload)
    if now:
        _write_locked()
    else:
        _soon_locked(True)


def _out(kind, data, line_done):
    """Buffer O/E bytes and send them soon; thread-safe."""
    _under_lock(_out_locked, kind, data, line_done)


def _frame(kind, payload, now=True):
    """Send a frame after all output before it: at once, or (now=False: a
    result or a display) soon, like output."""
    _under_lock(_frame_locked, kind, payload, now)


def _flush_now():
    """Send all pending and held output at once (an explicit flush, before
    starting a process or forking: what it writes to fd 1/2 comes after)."""
    _under_lock(_write_locked)


def _flusher():
    """The flusher thread: sends held output when the timer fires."""
    global _timer_on
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())   # signals are the main thread's
    while True:
        try:
            os.read(_TIMER_FD, 8)
        except OSError:       # fd 7 closed under us: send at once from now on
            with _lock:
                _timer_on = False
                _write_locked()
            return
        with _lock:
            _write_locked()


def _libc():
    global _LIBC
    if _LIBC is None:
        import ctypes
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _mmap():
    """libc's mmap, typed to take and return addresses."""
    import ctypes
    mmap = _libc().mmap
    mmap.restype = ctypes.c_void_p
    mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    return mmap


def _drop_parent_journal():
    """In a forked REPL: unmap the journal inherited from the parent, still
    shared with it. Copying it (the fork plan's way with shared memory)
    cost every child 132 KiB per generation above it, kept for its life:
    a child starts a journal of its own (_start_journal) and never reads
    its parent's. Returns the range it unmapped, (0, 0) if none."""
    global _jaddr, _jhead, _jtaint
    import ctypes
    _jhead = _jtaint = None   # nothing may touch the mapping once it is gone
    start, _jaddr = _jaddr, 0
    if not start or _libc().munmap(ctypes.c_void_p(start), ctypes.c_size_t(_JSIZE)) != 0:
        return 0, 0
    return start, start + _JSIZE


def _start_flusher():
    """Put a fresh timerfd at fd 7 and start the flusher thread; output is
    sent at once if either fails. The libc functions and timer values are
    made once: fork children inherit them."""
    global _timerfd_create, _settime, _ARM, _DISARM, _timer_on
    try:
        if _settime is None:
            import ctypes
            import struct
            libc = _libc()
            _ARM = ctypes.create_string_buffer(struct.pack('4q', 0, 0, 0, _HOLD_NS))
            _DISARM = ctypes.create_string_buffer(32)
            _timerfd_create = libc.timerfd_create
            _settime = libc.timerfd_settime
        fd = _timerfd_create(1, os.O_CLOEXEC)           # CLOCK_MONOTONIC, TFD_CLOEXEC
        if fd < 0:
            return
        if fd != _TIMER_FD:
            os.dup2(fd, _TIMER_FD, inheritable=False)
            os.close(fd)
        _thread.start_new_thread(_flusher, ())
        _timer_on = True
    except Exception:
        pass


def _clean(o):
    if isinstance(o, str):
        return o.encode('utf-8', 'backslashreplace').decode('utf-8')
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_clean(v) for v in o]
    return o


def _json(o):
    s = _dumps(o)
    try:
        return s.encode('utf-8')
    except UnicodeEncodeError:  # lone surrogates: not representable in JSON for serde
        return _dumps(_clean(o)).encode('utf-8')


# ---- streams -----------------------------------------------------------------
class _Stream:
    """What our stdout/stderr text and binary streams share: write-only,
    never closed (close just flushes), not a tty, on fd 1 or 2."""

    def flush(self):
        _flush_now()

    def close(self):
        self.flush()

    @property
    def closed(self):
        return False

    def fileno(self):
        return self._fd

    def isatty(self):
        return False

    def readable(self):
        return False

    def writable(self):
        return True

    def seekable(self):
        return False


class _Bin(_Stream, io.BufferedIOBase):
    def __init__(self, kind, fd, name):
        self._k = kind
        self._fd = fd
        self.name = name

    mode = 'wb'

    def write(self, b):
        if type(b) is not bytes:
            b = memoryview(b).tobytes()
        _out(self._k, b, b'\n' in b)
        return len(b)



class _Text(_Stream, io.TextIOBase):
    encoding = 'utf-8'
    errors = 'surrogateescape'
    newlines = None
    line_buffering = True
    write_through = False
    mode = 'w'

    def __init__(self, kind, fd, name):
        self._k = kind
        self._fd = fd
        self.name = name
        self.buffer = _Bin(kind, fd, name)

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError('write() argument must be str, not ' + type(s).__name__)
        try:
            b = s.encode('utf-8', 'surrogateescape')
        except UnicodeEncodeError:
            b = s.encode('utf-8', 'backslashreplace')
        _out(self._k, b, '\n' in s)
        return len(s)


    def reconfigure(self, *args, **kwargs):
        pass


# ---- signals / fork ----------------------------------------------------------
def _on_sigint(signum, frame):
    global _int_pending
    if _running:
        if _crit:
            _int_pending = True
        else:
            raise KeyboardInterrupt


def _after_fork_child():
    global _lock, _child, _pend, _held, _timer_on, _armed, _inflush, _crit, _int_pending, _MAIN
    global _jm, _jat, _jin, _jbad, _jtaint
    _lock = _thread.RLock()
    _pend = bytearray()       # the parent sends its own pending and held output
    _held = bytearray()
    if _jm is not None:       # the parent's journal stays mapped here (a forked REPL
        _jtaint = _jhead      # unmaps it, _drop_parent_journal); only its foreign-writes
    _jm = None                # word may be written, by _writeall
    _jat = _jin = 0
    _jbad = False
    if _timer_on:             # the parent's timer; the flusher thread stayed there
        _close(_TIMER_FD)
    _timer_on = _armed = False
    _inflush = False
    _crit = 0
    _int_pending = False
    _child = True
    _MAIN = _get_ident()
    forking = _forking
    if forking is not None and forking[0] == _MAIN:
        _child = False        # a sandbox's REPL, not a user's fork child
        try:
            _join_sandbox(*forking[1:])
        except BaseException:
            _exit_now(121)


# ---- pid namespaces ----------------------------------------------------------
# The REPL lives in its family's pid namespace (so fork can place children in
# sibling sandboxes) while the processes it starts belong in its sandbox's own
# leaf pid namespace.  The kernel refuses to create threads while a thread's
# pid_for_children differs from its active pid namespace, so the REPL keeps
# pid_for_children = family (threads, from Python or C, just work) and
# switches the calling thread to the leaf only around process creation.
_FAMILY_FD = 5                # fd of the family pid namespace
_LEAF_FD = 6                  # fd of the sandbox's leaf pid namespace
_CLONE_NEWPID = 0x20000000
_setns = None


def _to_leaf():
    if _setns is not None:
        _setns(_LEAF_FD, _CLONE_NEWPID)


def _to_family():
    if _setns is not None:
        _setns(_FAMILY_FD, _CLONE_NEWPID)


def _spawning(fn, forks):
    """Wrap a process-creating function: held output goes first, and its
    children go to the leaf. ``forks``: fn returns in the child too (0, or
    (0, fd)) and the child must stay in the leaf."""
    def wrapper(*args, **kwargs):
        _flush_now()          # output held so far goes before what the process writes
        _until_read()
        _to_leaf()
        child = False
        try:
            r = fn(*args, **kwargs)
            if forks:
                child = (r[0] if type(r) is tuple else r) == 0
            return r
        finally:
            if not child:
                _to_family()
    return _like(fn, wrapper)


_SIOCOUTQ = 0x5411            # bytes sent on a socket that its reader has not read yet
_sleep = __import__('time').sleep


def _until_read():
    """Until the server has read all we sent on the control socket (at most
    50 ms). Output sent there and what a process started next writes to
    fd 1/2 reach the server by two ways; the server puts pipe output that
    is waiting when a frame arrives before the frame, so without this a
    slow server saw the child's first line before the output that preceded
    it."""
    queued = bytearray(4)
    deadline = None
    while True:
        try:
            _ioctl(_CTL, _SIOCOUTQ, queued)
        except OSError:
            return
        if not any(queued):
            return
        now = _monotonic()
        if deadline is None:
            deadline = now + 0.05
        elif now >= deadline:
            return
        _sleep(0.00005)


def _flushing(fn):
    """Wrap a function that ends the process at once (os._exit, os.abort):
    held output goes first, as it would at the end of the call."""
    def wrapper(*args, **kwargs):
        _flush_now()
        return fn(*args, **kwargs)
    return _like(fn, wrapper)


def _like(fn, wrapper):
    wrapper.__name__ = fn.__name__
    wrapper.__qualname__ = getattr(fn, '__qualname__', fn.__name__)
    wrapper.__doc__ = fn.__doc__
    wrapper.__wrapped__ = fn
    return wrapper


def _setup_pidns():
    """Returns whether process creation is redirected to the leaf (reported
    to the server in the ready frame)."""
    global _setns
    try:
        os.fstat(_FAMILY_FD)
        os.fstat(_LEAF_FD)
    except OSError:
        return False                  # not started by forkbox (tests on the host)
    libc = _libc()
    if libc.setns(_FAMILY_FD, _CLONE_NEWPID) != 0:
        return False
    _setns = libc.setns
    os.set_inheritable(_FAMILY_FD, False)
    os.set_inheritable(_LEAF_FD, False)
    # Keep CAP_SYS_ADMIN (needed for setns) for this process only: programs
    # it executes must not get it.  PR_CAPBSET_DROP = 24, CAP_SYS_ADMIN = 21.
    libc.prctl(24, 21, 0, 0, 0)
    return True


def _wrap_spawners():
    """Every way Python starts a process goes through _spawning, and every
    way it ends one at once through _flushing."""
    os._exit = _flushing(os._exit)
    os.abort = _flushing(os.abort)
    for name, forks in (('fork', True), ('forkpty', True), ('posix_spawn', False),
                        ('posix_spawnp', False), ('system', False)):
        fn = getattr(os, name, None)
        if fn is not None:
            setattr(os, name, _spawning(fn, forks))
    import _posixsubprocess
    import subprocess
    _posixsubprocess.fork_exec = _spawning(_posixsubprocess.fork_exec, False)
    if hasattr(subprocess, '_fork_exec'):
        subprocess._fork_exec = _posixsubprocess.fork_exec


# ---- control socket ----------------------------------------------------------
class _Control:
    """Reads frames from the control socket with recvmsg: descriptors
    attached to a frame (the server sends none; a fork child gets its own
    from the supervisor) land in ``fds`` and are closed, not leaked."""

    _ANC = _socket.CMSG_SPACE(64 * 4)

    def __init__(self):
        self.sock = _socket.socket(fileno=_CTL)
        self.sock.setblocking(True)
        self.buf = bytearray()
        self.fds = []
        import select
        self.poll = select.poll()
        self.poll.register(_CTL, select.POLLIN)

    def _fill(self):
        # Wait in poll(), not in a blocking recvmsg: that sleeper is woken
        # by every wake-up of the socket, also when the server reads what
        # we sent (room to write), and the server pays for that wake-up
        # (200 µs on a VM whose other vCPU idles) on its way to answer.
        # poll() is only woken for what it asked.
        self.poll.poll()
        data, anc, _flags, _addr = self.sock.recvmsg(1 << 16, self._ANC, _socket.MSG_CMSG_CLOEXEC)
        self.fds.extend(_rights(anc))
        self.buf += data
        return bool(data)

    def read(self, n):
        while len(self.buf) < n:
            if not self._fill():
                break
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def take_fds(self, n):
        got, self.fds = self.fds[:n], self.fds[n:]
        return got

    def reset(self):
        """In a fork child: fd 3 is a new socket; drop the parent's leftovers."""
        for fd in self.fds:
            _close(fd)
        self.fds = []
        self.buf = bytearray()


def _move_control(ctl):
    """C: a restored sandbox's control socket moves into the sandbox's own
    network namespace (crates/jail/src/shim/move_edges.rs). Under _lock no
    frame is half-written to either socket; the `c` answer is the first
    thing on the new one, and a fresh journal counts the new stream."""
    fds = ctl.take_fds(len(ctl.fds))
    if len(fds) != 1:
        for fd in fds:
            _close(fd)
        return
    with _lock:
        os.dup2(fds[0], _CTL, inheritable=False)
        _close(fds[0])
        ctl.reset()
        _writeall(b'\x00\x00\x00\x03c{}')
        _start_journal()
    # The restored sandbox has a name of its own (as a fork child does).
    new_host = os.uname().nodename
    if os.environ.get('HOSTNAME') not in (None, new_host):
        os.environ['HOSTNAME'] = new_host


def _rights(anc):
    """The descriptors of the SCM_RIGHTS messages among ``anc`` (recvmsg)."""
    fds = []
    for level, kind, raw in anc:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            n = len(raw) - len(raw) % 4
            fds.extend(int.from_bytes(raw[i:i + 4], sys.byteorder, signed=True) for i in range(0, n, 4))
    return fds


def _close(fd):
    try:
        os.close(fd)
    except OSError:
        pass


# ---- fork into new sandboxes (docs/architecture.md#processes-and-namespaces) ----
# The server sends one `F` frame per child, with a plan (in the first frame)
# of what to redo in the child so it shares nothing with its parent: which
# descriptors to reopen on the child's own files and which shared mappings
# to replace. The child's descriptors -- its mount, net, uts, ipc and leaf
# pid namespaces, its control socket and its stdout/stderr pipes, then (v1
# cgroups) its cgroups' `tasks` files -- never pass through this process,
# where other threads run user code: after each fork this (main) thread
# names the child to the family's supervisor, and the child, still
# single-threaded, asks for them; the supervisor copies them straight into
# it (two ioctls its seccomp filter hands to the supervisor, crates/jail
# notify/listener.rs and shim/handover.rs).
_os_fork = os.fork
_HANDOVER_TAKE = 0x00464201   # ioctl(slot, _, 0) in the child: a socket holding its descriptors
_HANDOVER_GIVE = 0x00464202   # ioctl(slot, _, pid) in the parent: pid is fork child `slot`
_ioctl = __import__('fcntl').ioctl
_NS_TYPES = (0x00020000, 0x40000000, 0x04000000, 0x08000000)   # mnt, net, uts, ipc
# Where each descriptor of a fork child is, as the supervisor sends them
# (defined in crates/jail/src/fork_fds.rs; a test there checks this line).
_FORK_FDS = {'mnt': 0, 'net': 1, 'uts': 2, 'ipc': 3, 'leaf': 4, 'control': 5, 'stdout': 6, 'stderr': 7, 'cgroup': 8}
_forks = set()                # pids of our fork children, reaped between frames
_forks_dead = {}              # fork child pid -> when we first saw it dead
_REAP_AFTER = 1.0             # seconds a dead fork child stays a zombie
_pending = []                 # (hand-over slot, descriptor count) of each child of the fork being assembled
_plan = None
# While the main thread forks a sandbox: (its thread id, hand-over slot,
# descriptor count, plan, cwd). The child joins its sandbox in
# _after_fork_child, the first at-fork hook (registered before any user
# code runs), so hooks a user registered with os.register_at_fork run in
# the child's own sandbox, and may start threads: joining a mount
# namespace needs a single-threaded process.
_forking = None


def _reap_forks():
    """Reap fork children that died a while ago.  Not at once: the family's
    supervisor reads a dead child's exit status from its zombie."""
    now = _monotonic()
    for pid in list(_forks):
        seen = _forks_dead.get(pid)
        if seen is None:
            try:
                dead = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                _forks.discard(pid)
                continue
            if dead is not None:
                _forks_dead[pid] = now
        elif now - seen >= _REAP_AFTER:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            _forks.discard(pid)
            del _forks_dead[pid]


def _fork_frame(ctl, msg):
    """Note one child's frame; fork once all have arrived.
    Returns in the parent and, with their own state, in every child."""
    global _plan
    for fd in ctl.take_fds(len(ctl.fds)):    # nothing is sent with a fork frame
        _close(fd)
    index = msg.get('index', 0)
    if index == 0:
        _pending.clear()
        _plan = msg.get('plan') or {}
    _pending.append((msg.get('slot', index), msg.get('fds', 8)))
    if len(_pending) < msg['count']:
        return
    children = list(_pending)
    _pending.clear()
    _fork(msg['id'], children, _plan)


def _fork(fid, children, plan):
    """Fork once per (hand-over slot, descriptor count) of ``children``."""
    global _forking
    _flush_all()
    _flush_now()
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = '/'
    pids = []
    error = None
    for i, (slot, n) in enumerate(children):
        if n < 8:
            error = 'fork frame %d announced %d descriptors, not 8 or more' % (i, n)
            break
        _forking = (_MAIN, slot, n, plan, cwd)
        try:
            pid = _os_fork()
        except OSError as e:
            error = 'fork: %s' % e
            break
        finally:
            _forking = None
        if pid == 0:          # joined its sandbox already, in _after_fork_child
            _frame(b'R', _json({'pid': os.getpid(), 'python': sys.version.split()[0], 'pidns': _setns is not None, 'forked': True}))
            _start_flusher()  # after joining the cgroups, which moved this thread only
            return
        _forks.add(pid)
        try:
            _ioctl(slot, _HANDOVER_GIVE, pid)
        except OSError as e:
            error = 'hand-over to fork child %d: %s' % (i, e)
            try:
                os.kill(pid, 9)
            except OSError:
                pass
            break
        pids.append(pid)
    _frame(b'f', _json({'id': fid, 'pids': pids, 'error': error}))


# The REPL's scheduler slice (crates/service/src/sandbox.rs, REPL_TIME_SLICE)
# and sched_setattr's number per machine. The slice is set with
# SCHED_FLAG_RESET_ON_FORK, so what the REPL starts runs with the default
# one, and a forked REPL asks for it anew.
_SLICE_NS = 300_000
_SCHED_SETATTR = {'x86_64': 314, 'aarch64': 274}.get(os.uname().machine)


def _short_slice(libc):
    """A short slice for this thread: woken for an exec, the REPL gets an
    early deadline and preempts hogs started from other REPLs."""
    if _SCHED_SETATTR is None:
        return
    import ctypes
    import struct
    # struct sched_attr: size, policy, flags (RESET_ON_FORK), nice, priority, runtime, deadline, period, util_min, util_max
    attr = ctypes.create_string_buffer(struct.pack('IIQiIQQQII', 56, 0, 1, 0, 0, _SLICE_NS, 0, 0, 0, 0))
    libc.syscall(_SCHED_SETATTR, 0, attr, 0)     # older kernels ignore the slice; failure changes nothing


def _take_descriptors(slot):
    """In fork child ``slot``: its descriptors, from the family's
    supervisor, which answers with a socket holding them in one message."""
    sock = _socket.socket(fileno=_ioctl(slot, _HANDOVER_TAKE, 0))
    try:
        _data, anc, _flags, _addr = sock.recvmsg(1, _Control._ANC, _socket.MSG_CMSG_CLOEXEC)
    finally:
        sock.close()
    return _rights(anc)


def _join_sandbox(slot, n, plan, cwd):
    """In fork child ``slot``, still single-threaded: take its ``n``
    descriptors and become the REPL of its own sandbox."""
    fds = _take_descriptors(slot)
    if len(fds) != n:
        _exit_now(121)
    _become_child(fds, plan, cwd)


def _become_child(fds, plan, cwd):
    libc = _libc()
    old_host = os.uname().nodename
    for fd, kind in zip(fds[_FORK_FDS['mnt']:_FORK_FDS['ipc'] + 1], _NS_TYPES):
        if libc.setns(fd, kind) != 0:
            _exit_now(121)
    if os.environ.get('HOSTNAME') == old_host:     # the child has its own name
        os.environ['HOSTNAME'] = os.uname().nodename
    # Join the new sandbox's cgroups: "0" moves the calling thread, and we
    # are single-threaded here, which spares the kernel's global
    # threadgroup lock (the server moves us if this fails).
    for fd in fds[_FORK_FDS['cgroup']:]:
        try:
            os.write(fd, b'0')
        except OSError:
            pass
    _short_slice(libc)
    ctl_fd, out_fd, err_fd, leaf = (fds[_FORK_FDS[name]] for name in ('control', 'stdout', 'stderr', 'leaf'))
    os.dup2(ctl_fd, _CTL, inheritable=False)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.dup2(leaf, _LEAF_FD, inheritable=False)
    for fd in fds:
        _close(fd)
    _CTRL.reset()
    _forks.clear()
    _forks_dead.clear()
    try:
        os.chdir(cwd)
    except OSError:
        os.chdir('/')
    for entry in plan.get('fds', ()):
        try:
            _redo_fd(entry)
        except OSError:
            _to_null(entry['fd'], entry.get('cloexec', True))
    journal_start, journal_end = _drop_parent_journal()
    for entry in plan.get('maps', ()):
        if entry['start'] < journal_end and entry['end'] > journal_start:
            continue          # the parent's journal: unmapped above, not copied
        try:
            _redo_map(entry)
        except (OSError, ValueError):
            pass
    _reseed()
    _start_journal()


def _to_null(fd, cloexec):
    null = os.open('/dev/null', os.O_RDWR)
    os.dup2(null, fd, inheritable=not cloexec)
    os.close(null)


def _copy_into(src, dst):
    pos = 0
    while True:
        chunk = os.pread(src, 1 << 20, pos)
        if not chunk:
            return
        os.write(dst, chunk)
        pos += len(chunk)


def _redo_fd(e):
    """Give the child its own object behind descriptor ``e['fd']``."""
    fd, kind, cloexec = e['fd'], e['kind'], e.get('cloexec', True)
    flags = e.get('flags', 0) & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC | os.O_NOCTTY | os.O_CLOEXEC)
    new = None
    if kind in ('file', 'dir'):
        new = os.open(e['path'], flags)         # the child's own copy of the file
    elif kind in ('deleted', 'memfd'):
        # No name to reopen: copy the contents into a new anonymous file.
        if kind == 'deleted':
            try:
                new = os.open(os.path.dirname(e['path']) or '/', os.O_TMPFILE | os.O_RDWR, 0o600)
            except OSError:
                new = None
        if new is None:
            new = os.memfd_create(e.get('name') or 'forkbox', os.MFD_CLOEXEC)
        try:
            _copy_into(fd, new)
        except OSError:
            pass
        if flags & (os.O_APPEND | os.O_NONBLOCK):
            import fcntl
            fcntl.fcntl(new, fcntl.F_SETFL, flags & (os.O_APPEND | os.O_NONBLOCK))
    elif kind == 'socket':
        new = _fresh_socket(fd)
    elif kind == 'epoll':
        import select
        ep = select.epoll()
        new = os.dup(ep.fileno())
        ep.close()
    elif kind == 'eventfd':
        new = os.eventfd(0)
    if new is None:
        _to_null(fd, cloexec)
        return
    os.dup2(new, fd, inheritable=not cloexec)
    os.close(new)
    if kind in ('file', 'deleted', 'memfd'):
        os.lseek(fd, e.get('pos', 0), os.SEEK_SET)


def _fresh_socket(fd):
    """A new socket like ``fd``'s: unconnected (the parent's connections are
    its own), but listening again on the same address if ``fd`` listened."""
    old = _socket.socket(fileno=os.dup(fd))
    try:
        new = _socket.socket(old.family, old.type, old.proto)
        try:
            if old.getsockopt(_socket.SOL_SOCKET, _socket.SO_ACCEPTCONN):
                name = old.getsockname()
                if old.family == _socket.AF_UNIX and isinstance(name, str) and name:
                    try:
                        os.unlink(name)
                    except OSError:
                        pass
                new.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
                new.bind(name)
                new.listen(128)
        except OSError:
            pass
        return new.detach()
    finally:
        old.close()


_PROT = {'r': 1, 'w': 2, 'x': 4}


def _redo_map(e):
    """Replace a shared mapping inherited from the parent, at the same
    address: a file mapping maps the child's own copy of the file, anything
    else (shared anonymous memory, SysV, memfd) gets a private copy."""
    import ctypes
    start, end = e['start'], e['end']
    size = end - start
    prot = sum(_PROT[c] for c in e.get('perms', 'rw')[:3] if c in _PROT)
    mmap = _mmap()
    MAP_SHARED, MAP_FIXED, MAP_ANON = 0x01, 0x10, 0x20
    if e.get('kind') == 'file':
        fd = os.open(e['path'], os.O_RDWR if prot & 2 else os.O_RDONLY)
        try:
            if mmap(start, size, prot, MAP_SHARED | MAP_FIXED, fd, e.get('offset', 0)) == ctypes.c_void_p(-1).value:
                raise OSError(ctypes.get_errno(), 'mmap')
        finally:
            os.close(fd)
        return
    data = ctypes.string_at(start, size) if prot & 1 else None
    if mmap(start, size, 3, MAP_SHARED | MAP_FIXED | MAP_ANON, -1, 0) == ctypes.c_void_p(-1).value:
        raise OSError(ctypes.get_errno(), 'mmap')
    if data is not None:
        ctypes.memmove(start, data, size)
    _libc().mprotect(ctypes.c_void_p(start), ctypes.c_size_t(size), prot)


def _reseed():
    """Siblings must not share random streams.  ``random`` reseeds itself in
    a fork child (an at-fork hook); numpy's global generator does not, nor
    do the generators user code keeps: numpy 2's ``default_rng()``
    ``Generator``s, ``RandomState``s and ``random.Random``s bound to a name
    of the REPL's globals get fresh entropy too (objects nested deeper are
    the user's to reseed). An `S` frame asks for this in a REPL that
    criu copied, where no at-fork hook ran: ``random`` too."""
    pyrandom = sys.modules.get('random')
    if pyrandom is not None:
        try:
            pyrandom.seed()
        except Exception:
            pass
    nprandom = sys.modules.get('numpy.random')
    if nprandom is not None:
        _reseed_numpy(nprandom)
    generator = getattr(nprandom, 'Generator', None)
    legacy = getattr(nprandom, 'RandomState', None)
    for value in list((_G or {}).values()):
        try:
            if generator is not None and isinstance(value, generator):
                bits = value.bit_generator
                bits.state = type(bits)().state   # a new one of its kind, seeded by the OS
            elif (legacy is not None and isinstance(value, legacy)) or \
                    (pyrandom is not None and isinstance(value, pyrandom.Random)):
                value.seed()
        except Exception:
            pass


def _reseed_numpy(nprandom):
    """numpy's global generator (a Mersenne Twister) gets a state of 624
    words from the kernel. Its ``seed()`` gets there through a SeedSequence
    at three times the cost (0.2-0.5 ms of a fork child's start)."""
    try:
        np = sys.modules['numpy']
        key = np.frombuffer(os.urandom(624 * 4), dtype=np.uint32)
        nprandom.mtrand._rand.set_state(('MT19937', key, 624))   # 624: twist before the first draw
    except Exception:
        try:
            nprandom.seed()
        except Exception:
            pass


# ---- rich output (docs/outputs.md) -------------------------------------------
# IPython's display protocol without IPython: display(obj) and the value of a
# last expression become MIME bundles (`M` and `V` frames); matplotlib figures
# shown with plt.show() or left open at the end of a call become images.
# matplotlib is never imported here: only figures of a pyplot the user
# imported are looked at.
_MAX_BUNDLE = 4 << 20         # bytes of one bundle's JSON (result or display)
_REPRS = (('text/html', '_repr_html_'), ('text/markdown', '_repr_markdown_'),
          ('text/latex', '_repr_latex_'), ('image/svg+xml', '_repr_svg_'),
          ('image/png', '_repr_png_'), ('image/jpeg', '_repr_jpeg_'),
          ('application/pdf', '_repr_pdf_'), ('application/json', '_repr_json_'),
          ('application/javascript', '_repr_javascript_'))
_BINARY = ('image/png', 'image/jpeg', 'application/pdf')
# Types without _repr_*_ methods: their bundle is their repr, asked nothing else.
_PLAIN = frozenset((int, float, complex, bool, str, bytes, bytearray, list, tuple, dict, set, frozenset, range, type(None)))
_FIG_FORMATS = {'png': 'image/png', 'svg': 'image/svg+xml', 'image/png': 'image/png', 'image/svg+xml': 'image/svg+xml'}
_fig_mimes = ['image/png']    # what a figure becomes; display.set_figure_formats changes it
_shown = []                   # figures displayed during this call: not again at its end
_b64 = __import__('binascii').b2a_base64


def _warn(msg):
    _ERR.write('[forkbox] %s\n' % msg)


def _wanted(mime, include, exclude):
    return (include is None or mime in include) and (exclude is None or mime not in exclude)


def _method(obj, name):
    """``obj.name`` if it is callable, else None (also when getattr raises)."""
    try:
        m = getattr(obj, name, None)
    except Exception:
        return None
    return m if callable(m) else None


def _encode(mime, v):
    """A value of type ``mime`` as JSON: bytes of binary types in base64,
    JSON types as JSON values, text as str; None if it cannot be."""
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], dict):
        v = v[0]              # (data, metadata)
    if mime in _BINARY:
        if isinstance(v, (bytes, bytearray, memoryview)):
            return _b64(v, newline=False).decode('ascii')
        return v if isinstance(v, str) else None
    if mime == 'application/json' or mime.endswith('+json'):
        if isinstance(v, (str, bytes)):
            v = json.loads(v)
        _strict(v)            # raises if it is not JSON (NaN included)
        return v
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode('utf-8', 'replace')
    return v if isinstance(v, str) else None


def _render(obj, mime, what, fn):
    """``fn()`` encoded as ``mime``; an exception (or a wrong type) leaves
    the type out with a warning on stderr instead of breaking the call."""
    try:
        v = fn()
        if v is None:
            return None
        enc = _encode(mime, v)
        if enc is None:
            _warn('%s returned %s, not %s; %s left out' % (what, type(v).__name__, mime, mime))
        return enc
    except Exception as e:
        _warn('%s raised %s: %s; %s left out' % (what, type(e).__name__, _safe_str(e), mime))
        return None


def _safe_str(e):
    try:
        return str(e)
    except Exception:
        return '<str() failed>'


def _figure_class():
    m = sys.modules.get('matplotlib.figure')
    return getattr(m, 'Figure', None) if m is not None else None


def _savefig(fig, mime):
    """A figure as PNG bytes or SVG text, as IPython's inline backend draws it."""
    buf = io.BytesIO()
    fmt = 'png' if mime == 'image/png' else 'svg'
    fig.canvas.print_figure(buf, format=fmt, bbox_inches='tight',
                            facecolor=fig.get_facecolor(), edgecolor=fig.get_edgecolor())
    data = buf.getvalue()
    return data if fmt == 'png' else data.decode('utf-8')


def _rich(obj, include, exclude):
    """The MIME types of ``obj`` beyond its repr."""
    out = {}
    if type(obj) in _PLAIN or isinstance(obj, type):
        return out
    fig = _figure_class()
    if fig is not None and isinstance(obj, fig):
        _shown.append(obj)
        asked = [m for m in (include or ()) if m in _FIG_FORMATS.values()]
        if not obj.axes:      # an empty figure draws nothing (like Jupyter)
            return out
        for mime in asked or _fig_mimes:
            if _wanted(mime, include, exclude) and mime not in out:
                v = _render(obj, mime, 'drawing the figure', lambda: _savefig(obj, mime))
                if v is not None:
                    out[mime] = v
        return out
    if _method(obj, '_ipython_canary_method_should_not_exist_') is not None:
        return out            # it claims every attribute
    name = type(obj).__name__
    m = _method(obj, '_repr_mimebundle_')
    if m is not None:
        try:
            r = m(include=include, exclude=exclude)
        except Exception as e:
            _warn('%s._repr_mimebundle_() raised %s: %s; its types left out' % (name, type(e).__name__, _safe_str(e)))
            r = None
        if isinstance(r, tuple) and r:
            r = r[0]
        if isinstance(r, dict):
            for mime, v in r.items():
                if isinstance(mime, str) and _wanted(mime, include, exclude):
                    v = _render(obj, mime, '%s._repr_mimebundle_()[%r]' % (name, mime), lambda v=v: v)
                    if v is not None:
                        out[mime] = v
    for mime, attr in _REPRS:
        if mime in out or not _wanted(mime, include, exclude):
            continue
        m = _method(obj, attr)
        if m is not None:
            v = _render(obj, mime, '%s.%s()' % (name, attr), m)
            if v is not None:
                out[mime] = v
    return out


def _bundle(obj, include=None, exclude=None):
    """The MIME bundle of ``obj``: ``text/plain`` is its repr (whose errors
    are the caller's, as with print), then what its _repr_*_ methods give."""
    b = {}
    if _wanted('text/plain', include, exclude):
        b['text/plain'] = _repr(obj)
    b.update(_rich(obj, include, exclude))
    return b


def _mib(n):
    return '%.1f MiB' % (n / 1048576)


def _fit(b, what):
    """The JSON of bundle ``b``, at most _MAX_BUNDLE bytes: the biggest
    types but text/plain are left out first, then text/plain is cut."""
    data = _json(b)
    if len(data) <= _MAX_BUNDLE:
        return data
    sizes = {k: len(_json({k: v})) - 2 for k, v in b.items()}     # "k":v
    total = len(data)
    for k in sorted((k for k in b if k != 'text/plain'), key=sizes.get, reverse=True):
        if total <= _MAX_BUNDLE:
            break
        del b[k]
        total -= sizes[k] + (1 if b else 0)
        _warn('%s (%s) left out of %s: a bundle is limited to %s' % (k, _mib(sizes[k]), what, _mib(_MAX_BUNDLE)))
    text = b.get('text/plain')
    if total > _MAX_BUNDLE and isinstance(text, str):
        room = _MAX_BUNDLE - (total - sizes['text/plain'])
        n = len(text)
        while True:
            cut = text[:n] + '\n[forkbox: cut; the whole text was %d characters]' % len(text)
            over = len(_json({'text/plain': cut})) - 2 - room
            if over <= 0 or n == 0:
                break
            n = max(0, n - over)  # every character is at least one byte of JSON
        b['text/plain'] = cut
        _warn('text/plain of %s cut to %d of %d characters: a bundle is limited to %s' % (what, n, len(text), _mib(_MAX_BUNDLE)))
    data = _json(b)
    return data if len(data) <= _MAX_BUNDLE else b'{}'


def _send_display(b):
    if b:
        _frame(b'M', _fit(b, 'a display'), now=False)


def display(*objs, include=None, exclude=None, raw=False, **ignored):
    """Show objects as rich output: each becomes one `display` event
    carrying a MIME bundle (text/plain, text/html, image/png, ...), built
    from its _repr_*_ methods as IPython does; stdout is not touched.

    include/exclude: MIME types to keep only / leave out; on a matplotlib
    figure, include may ask for image/svg+xml.  raw=True: each object is a
    bundle already ({mime: data}).  Other IPython keywords are ignored.
    display.set_figure_formats('png', 'svg') sets what figures become."""
    for obj in objs:
        if raw:
            if not isinstance(obj, dict):
                raise TypeError('display(raw=True) takes dicts of MIME type to data, not %s' % type(obj).__name__)
            b = {}
            for mime, v in obj.items():
                if isinstance(mime, str) and _wanted(mime, include, exclude):
                    v = _render(obj, mime, 'display(raw=True)[%r]' % mime, lambda v=v: v)
                    if v is not None:
                        b[mime] = v
        else:
            b = _bundle(obj, include, exclude)
        _send_display(b)


def set_figure_formats(*formats):
    """What a matplotlib figure becomes: any of 'png', 'svg' (or their MIME
    types), in order; none at all turns figures off: plt.show() and the
    end of a call then leave them alone (open)."""
    mimes = []
    for f in formats:
        mime = _FIG_FORMATS.get(f.lower() if isinstance(f, str) else f)
        if mime is None:
            raise ValueError('unknown figure format %r; use %s' % (f, ', '.join(repr(k) for k in _FIG_FORMATS)))
        if mime not in mimes:
            mimes.append(mime)
    _fig_mimes[:] = mimes


display.set_figure_formats = set_figure_formats


def _open_figures():
    helpers = sys.modules.get('matplotlib._pylab_helpers')
    if helpers is None or 'matplotlib.pyplot' not in sys.modules:
        return []
    try:
        return [m.canvas.figure for m in helpers.Gcf.get_all_fig_managers()]
    except Exception:
        return []


def _close_figures():
    try:
        sys.modules['matplotlib.pyplot'].close('all')
    except Exception:
        pass


def _show(*args, **kwargs):
    """forkbox: display every open figure (as display.set_figure_formats
    says; image/png by default) and close it."""
    if not _fig_mimes:
        return
    figs = _open_figures()
    for fig in figs:
        display(fig)
    if figs:
        _close_figures()


def _end_figures():
    """At the end of a call: figures left open and not displayed yet are
    displayed, then every open figure is closed (as Jupyter's inline backend)."""
    figs = _open_figures()
    try:
        if figs and _fig_mimes:
            for fig in figs:
                if fig.axes and not any(f is fig for f in _shown):
                    display(fig)
            _close_figures()
    finally:
        _shown.clear()


class _PyplotHook:
    """On sys.meta_path: when matplotlib.pyplot is first imported, its
    show() becomes _show (a post-import hook; it never imports anything)."""

    def find_spec(self, name, path=None, target=None):
        if name != 'matplotlib.pyplot':
            return None
        for finder in sys.meta_path:
            find = getattr(finder, 'find_spec', None) if finder is not self else None
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        run = getattr(spec.loader, 'exec_module', None)
        if run is not None:
            def exec_module(module):
                run(module)
                module.show = _show
            try:
                spec.loader.exec_module = exec_module
            except Exception:
                pass
        return spec


# ---- exec --------------------------------------------------------------------
def _compile(src, fn):
    global _fflags
    tree = compile(src, fn, 'exec', ast.PyCF_ONLY_AST | _fflags, True)
    body = tree.body
    last = body.pop() if body and type(body[-1]) is ast.Expr else None
    flags = _fflags | _AWAIT
    c1 = compile(tree, fn, 'exec', flags, True) if body else None
    if c1 is not None:
        _fflags |= c1.co_flags & _FUTMASK
    c2 = compile(ast.Expression(last.value), fn, 'eval', flags, True) if last is not None else None
    return c1, c2


def _await(coro):
    global _loop
    if _loop is None or _loop.is_closed():
        import asyncio
        _loop = asyncio.new_event_loop()
    task = _loop.create_task(coro)
    try:
        return _loop.run_until_complete(task)
    except BaseException:
        if not task.done():
            task.cancel()
        raise


def _user_tb(tb, fn):
    keep = []
    while tb is not None:
        f = tb.tb_frame
        if f.f_globals is not _MY and f.f_code is not _BOOT:
            keep.append(tb)
        tb = tb.tb_next
    for i, t in enumerate(keep):
        if t.tb_frame.f_code.co_filename == fn:
            del keep[:i]
            break
    new = None
    for t in reversed(keep):
        new = _TB(new, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return new


def _report(e, fn):
    global _traceback
    tb = _user_tb(e.__traceback__, fn)
    try:
        if _traceback is None:
            import traceback
            _traceback = traceback
        text = ''.join(_traceback.format_exception(type(e), e, tb))
    except BaseException:
        text = '%s: <traceback formatting failed>\n' % type(e).__name__
    try:
        evalue = str(e)
    except BaseException:
        evalue = '<exception str() failed>'
    sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
    sys.last_exc = e
    _ERR.write(text)
    return {'ename': type(e).__name__, 'evalue': evalue, 'traceback': text.splitlines()}


def _exit_code(e):
    c = e.code
    if c is None:
        return 0
    if isinstance(c, int):
        c = int(c)
        return c if -2**31 <= c < 2**31 else 1
    try:
        msg = str(c)
    except BaseException:
        msg = '<SystemExit code str() failed>'
    _ERR.write(msg + '\n')
    return 1


def _fflush():
    global _cflush
    if _cflush is None:
        try:
            import ctypes
            f = ctypes.CDLL(None).fflush
            f.argtypes = (ctypes.c_void_p,)
            f.restype = ctypes.c_int
            _cflush = f
        except BaseException:
            _cflush = False
    if _cflush:
        try:
            _cflush(None)
        except BaseException:
            pass


def _flush_all():
    for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if s is not None and s is not _OUT and s is not _ERR:
            try:
                s.flush()
            except BaseException:
                pass
    _fflush()


def _exec(eid, src):
    global _n, _running, _IN
    _n += 1
    fn = '<exec-%d>' % _n
    sys.stdout = _OUT
    sys.stderr = _ERR
    if _IN is not None and _IN.closed and sys.stdin is _IN:
        try:
            _IN = sys.stdin = open(0, 'r', closefd=False)
        except OSError:
            pass
    linecache.cache[fn] = (len(src), None, src.splitlines(True), fn)
    code = 0
    err = None
    val = None
    try:
        c1, c2 = _compile(src, fn)
        g = _G
        _running = True
        try:
            if c1 is not None:
                r = _eval(c1, g)
                if c1.co_flags & _CO_COROUTINE:
                    _await(r)
            if c2 is not None:
                v = _eval(c2, g)
                if c2.co_flags & _CO_COROUTINE:
                    v = _await(v)
                if v is not None:
                    val = _bundle(v)
                v = None
        finally:
            _running = False
    except SystemExit as e:
        _running = False
        code = _exit_code(e)
    except KeyboardInterrupt as e:
        _running = False
        err = _report(e, fn)
        code = 130
    except BaseException as e:
        _running = False
        err = _report(e, fn)
        code = 1
    if _child:                # a fork() child fell out of the user's code
        _flush_all()
        _flush_now()
        _exit_now(code & 0xFF)
    if val is not None:
        _frame(b'V', _fit(val, 'the result'), now=False)
    try:
        _running = True       # a timeout interrupts drawing figures too
        _end_figures()
    except BaseException:
        pass
    finally:
        _running = False
    _flush_all()
    _frame(b'D', _json({'id': eid, 'exit_code': code, 'error': err}))


def main():
    global _G, _BOOT, _OUT, _ERR, _IN, _FUTMASK, _MAIN
    import __future__
    for name in __future__.all_feature_names:
        _FUTMASK |= getattr(__future__, name).compiler_flag
    _MAIN = _get_ident()
    caller = sys._getframe(1)
    _BOOT = caller.f_code
    g = sys.modules['__main__'].__dict__
    for k in list(g):
        if k not in _KEEP:
            del g[k]
    g['__doc__'] = None
    g.setdefault('__annotations__', {})
    _G = g
    del caller, g
    __import__('builtins').display = display   # as IPython: in builtins, not in globals
    sys.meta_path.insert(0, _PyplotHook())
    sys.argv = ['']
    os.set_inheritable(_CTL, False)   # os.system() children must not get the socket
    os.set_blocking(_CTL, True)
    _OUT = _Text(b'O', 1, '<stdout>')
    _ERR = _Text(b'E', 2, '<stderr>')
    sys.stdout = _OUT
    sys.stderr = _ERR
    try:                              # exit()/quit() close sys.stdin: keep fd 0 open
        _IN = sys.stdin = open(0, 'r', closefd=False)
    except OSError:
        pass
    signal.signal(signal.SIGINT, _on_sigint)
    pidns = _setup_pidns()
    _wrap_spawners()
    os.register_at_fork(after_in_child=_after_fork_child)
    _start_flusher()
    _start_journal()
    _fflush()                         # import ctypes now, not during the first exec
    global _CTRL
    _CTRL = _Control()
    read = _CTRL.read
    loads = json.loads
    _frame(b'R', _json({'pid': os.getpid(), 'python': sys.version.split()[0], 'pidns': pidns}))
    while True:
        try:
            hdr = read(5)
            if len(hdr) < 5:
                _exit_now(0)
            n = int.from_bytes(hdr[:4], 'big') - 1
            payload = read(n) if n > 0 else b''
            if len(payload) < n:
                _exit_now(0)
            if _forks:
                _reap_forks()
            kind = hdr[4]
            try:
                msg = loads(payload)
            except Exception:
                continue
            if kind == 0x58:          # X: run code
                try:
                    eid = msg['id']
                    src = msg['code']
                except Exception:
                    continue
                _exec(eid, src)
            elif kind == 0x43:        # C: the control socket moves
                _move_control(_CTRL)
            elif kind == 0x53:        # S: this REPL is one of several copies
                _reseed()
            elif kind == 0x46:        # F: fork
                try:
                    _fork_frame(_CTRL, msg)
                except Exception as e:
                    _frame(b'f', _json({'id': msg.get('id'), 'pids': [], 'error': 'fork failed: %r' % e}))
        except KeyboardInterrupt:
            continue
        except Exception:     # raised by a signal handler between calls
            continue
