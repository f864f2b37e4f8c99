"""`language="bash"`: a fresh `bash -c` per call in /root, sharing the
sandbox's filesystem with the Python REPL."""
from __future__ import annotations

import time

from helpers import exec_raw


def bash(sb, cmd):
    return sb.run_code(cmd, language="bash")


def test_each_call_is_a_fresh_shell(sandbox):
    r = bash(sandbox, "export X=1; Y=2; cd /tmp; echo \"set:$X:$Y:$(pwd)\"")
    assert r.exit_code == 0 and r.stdout == "set:1:2:/tmp"
    r = bash(sandbox, "echo \"[$X][$Y]\"; pwd")
    assert r.exit_code == 0 and r.stdout == "[][]\n/root"


def test_cwd_is_root_and_user_is_root(sandbox):
    r = bash(sandbox, "pwd; id -u; echo $HOME")
    assert r.stdout == "/root\n0\n/root"


def test_files_are_shared_with_python(sandbox):
    r = bash(sandbox, "echo from-bash > /root/b.txt && mkdir -p /srv/data && echo deep > /srv/data/f")
    assert r.exit_code == 0
    r = sandbox.run_code("print(open('/root/b.txt').read().strip(), open('/srv/data/f').read().strip())")
    assert r.exit_code == 0 and r.stdout == "from-bash deep"
    r = sandbox.run_code("open('/tmp/p.txt', 'w').write('from-python\\n')")
    assert r.exit_code == 0
    r = bash(sandbox, "cat /tmp/p.txt")
    assert r.stdout == "from-python"


def test_root_can_write_anywhere_in_its_filesystem(sandbox):
    """uid 0 in the sandbox owns its whole root filesystem, `/` included."""
    r = bash(sandbox, "set -e; mkdir /workspace; echo w > /workspace/f; touch /topfile; echo conf > /etc/fb.conf; "
                      "install -m 755 /bin/true /usr/local/bin/fbtrue; mkdir -p /opt/app; chown 1000:1000 /opt/app; "
                      "stat -c '%u' /opt/app; rm /topfile; echo done")
    assert r.exit_code == 0 and r.stdout == "1000\ndone", r
    r = sandbox.run_code("import os\nos.makedirs('/data/x')\nopen('/data/x/y', 'w').write('1')\nprint(sorted(os.listdir('/data')))")
    assert r.exit_code == 0 and r.stdout == "['x']", r


def test_python_state_is_untouched_by_bash(sandbox):
    assert sandbox.run_code("v = 'py-state'").exit_code == 0
    assert bash(sandbox, "echo hi").exit_code == 0
    assert sandbox.run_code("print(v)").stdout == "py-state"


def test_exit_codes(sandbox):
    assert bash(sandbox, "exit 7").exit_code == 7
    assert bash(sandbox, "false").exit_code == 1
    assert bash(sandbox, "true").exit_code == 0
    assert bash(sandbox, "no-such-command-xyz").exit_code == 127
    assert bash(sandbox, "kill -9 $$").exit_code == 137


def test_stderr_is_captured(sandbox):
    r = bash(sandbox, "echo oops >&2; echo ok; ls /nonexistent-dir")
    assert r.stdout == "ok"
    assert r.stderr.startswith("oops\n")
    assert "nonexistent-dir" in r.stderr
    assert r.exit_code == 2


def test_background_process_does_not_block_the_call(sandbox):
    t0 = time.monotonic()
    r = bash(sandbox, "sleep 100 & echo started")
    took = time.monotonic() - t0
    assert r.exit_code == 0 and r.stdout == "started"
    assert took < 5, f"the call waited {took:.1f} s for a background sleep"
    # the sandbox keeps working (and the background sleep does not break the next call)
    r = bash(sandbox, "echo next")
    assert r.exit_code == 0 and r.stdout == "next"


def test_bash_timeout(sandbox, http):
    t0 = time.monotonic()
    e = exec_raw(http, sandbox.id, "echo going; sleep 30", language="bash", timeout_ms=500)
    assert e.exit_code == 124, e
    assert time.monotonic() - t0 < 5
    assert e.stdout == "going\n"
    assert [x.get("ename") for x in e.errors] == ["TimeoutError"], e
    assert bash(sandbox, "echo fine").stdout == "fine"


def test_bash_has_a_sane_environment(sandbox):
    r = bash(sandbox, "echo $PATH; echo $HOSTNAME; hostname; echo $LANG")
    path, hostname_env, hostname, lang = r.stdout.split("\n")
    assert "/usr/bin" in path and "/bin" in path
    assert hostname_env == sandbox.id == hostname
    assert lang.endswith("UTF-8")
