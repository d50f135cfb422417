"""The fork server behind the documents' examples (tests/fork_server.py): a command run there
behaves as in a fresh interpreter, its failures included, so the examples can still fail."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

SERVER = Path(__file__).resolve().parent / "fork_server.py"


@contextlib.contextmanager
def _serving(preload: str, env=None):
    """A server preloading ``preload``, as ``(socket path, process)``; killed on leaving."""
    path = Path(tempfile.mkdtemp(prefix="interp-fork-")) / "server.sock"
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "serve", str(path), preload],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        yield path, proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server():
    """A server that preloads only ``json`` (quick to start; the machinery is the same)."""
    with _serving("json") as serving:
        yield serving


def _call(server, script: Path, *args: str, env=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SERVER), "call", str(server[0]), str(script), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
    )


def _script(tmp_path: Path, code: str) -> Path:
    path = tmp_path / "script.py"
    path.write_text(code, encoding="utf-8")
    return path


def test_a_command_gets_its_argv_directory_output_and_a_forked_process(server, tmp_path):
    code = (
        "import os, sys\n"
        "print(sys.argv[1:], os.getcwd(), sys.path[0], __name__, 'json' in sys.modules)\n"
        "print(os.getppid() != int(sys.argv[1]))\n"
        "sys.stderr.write('to stderr')\n"
    )
    script = _script(tmp_path, code)
    done = _call(server, script, str(os.getpid()), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # the process is the server's: json was imported there, and its parent is not the caller
    assert done.stdout.splitlines() == [
        f"['{os.getpid()}'] {tmp_path} {tmp_path} __main__ True",
        "True",
    ]
    assert done.stderr == "to stderr"


@pytest.mark.parametrize(
    "code, status, stderr",
    [
        ("raise ValueError('wrong')", 1, "ValueError: wrong"),
        ("import sys; sys.exit(3)", 3, ""),
        ("import sys; sys.exit('a message')", 1, "a message"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9, ""),
        ("raise KeyboardInterrupt", -2, "KeyboardInterrupt"),
        ("import atexit, sys; atexit.register(lambda: sys.exit(4))", 0, ""),
    ],
)
def test_failures_reach_the_caller_as_from_a_fresh_interpreter(
    server, tmp_path, code, status, stderr
):
    """The caller ends as a fresh interpreter would: the same exit code, or killed by the same
    signal (``returncode`` -N; a shell says 128 + N), which is how an executor tells a killed
    worker from a failed one."""
    script = _script(tmp_path, code)
    done = _call(server, script)
    assert done.returncode == status, done.stderr
    assert stderr in done.stderr
    fresh = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert (fresh.returncode, stderr in fresh.stderr) == (status, True)


def test_the_commands_python_is_served_too(server, tmp_path):
    """``sys.executable`` in a command runs ``python -m MODULE`` / ``python SCRIPT`` forked from
    the server as well (the local executors' workers); an option the server cannot honour
    (``-c`` here) gets a fresh interpreter."""
    (tmp_path / "inner.py").write_text("import sys\nprint('json' in sys.modules)\n")
    code = (
        "import subprocess, sys\n"
        "for args in (['-m', 'inner'], ['inner.py'], ['-c', 'import sys; print(\"json\" in "
        "sys.modules)']):\n"
        "    done = subprocess.run([sys.executable, *args], capture_output=True, text=True)\n"
        "    print(done.returncode, done.stdout.strip())\n"
    )
    done = _call(server, _script(tmp_path, code), cwd=tmp_path)
    assert done.stdout.splitlines() == ["0 True", "0 True", "0 False"], done.stderr


def test_a_command_runs_its_threads_and_exit_handlers(server, tmp_path):
    code = (
        "import atexit, threading, time\n"
        "atexit.register(print, 'at exit')\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n"
    )
    done = _call(server, _script(tmp_path, code))
    assert (done.returncode, done.stdout.splitlines()) == (0, ["thread", "at exit"])


def test_another_environment_gets_a_fresh_interpreter(server, tmp_path):
    script = _script(tmp_path, "import sys; print('json' in sys.modules)")
    done = _call(server, script, env=dict(os.environ, INTERP_FORK_TEST="1"))
    assert (done.returncode, done.stdout) == (0, "False\n")  # not the server's process
    assert _call(server, script).stdout == "True\n"


def test_what_the_imports_set_in_the_environment_is_the_commands_too(tmp_path):
    """A module that sets a variable when imported (torch's inductor sets its cache folder):
    a fresh interpreter would have it once it imported the same, so the command has it, and
    the server does not count it as a difference from the caller's environment."""
    (tmp_path / "sets_env.py").write_text("import os\nos.environ['SET_BY_IMPORT'] = 'yes'\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("SET_BY_IMPORT", None)
    with _serving("sets_env", env=env) as serving:
        script = _script(tmp_path, "import os, sys\nprint(os.environ.get('SET_BY_IMPORT'))\n")
        done = _call(serving, script, env=env)
        assert (done.returncode, done.stdout) == (0, "yes\n"), done.stderr
        done = _call(serving, script, env={**env, "SET_BY_IMPORT": "mine"})
        assert done.stdout == "mine\n"  # the caller's own value wins (a fresh interpreter, here)
    proc = serving[1]
    # the first call was forked: only the second, whose variable differs, was refused
    assert proc.stderr.read().count("a fresh interpreter") == 1


def test_a_command_run_by_a_shell_is_forked(server, tmp_path):
    """The documents' commands run in a shell, which sets variables of its own (PS1 and the
    like): they are no difference, or every command would start a fresh interpreter."""
    script = _script(tmp_path, "import sys\nprint('json' in sys.modules)\n")
    line = f'"{sys.executable}" "{SERVER}" call "{server[0]}" "{script}"'
    for shell in ("sh", "bash"):
        done = subprocess.run([shell, "-c", line], capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout) == (0, "True\n"), (shell, done.stderr)


def test_a_signal_to_the_caller_reaches_the_command(server, tmp_path):
    """Ctrl-C (SIGINT) or SIGTERM sent to the caller is the command's, as it would be for a
    fresh interpreter: a KeyboardInterrupt there, the default action here."""
    import signal
    import time

    code = (
        "import pathlib, sys, time\n"
        "pathlib.Path(sys.argv[1]).write_text('started')\n"
        "try:\n"
        "    time.sleep(60)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n"
        "    sys.exit(130)\n"
    )
    script = _script(tmp_path, code)
    for signum, status, out in ((signal.SIGINT, 130, "interrupted\n"), (signal.SIGTERM, -15, "")):
        marker = tmp_path / f"started-{signum}"
        caller = subprocess.Popen(
            [sys.executable, str(SERVER), "call", str(server[0]), str(script), str(marker)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        caller.send_signal(signum)
        stdout, stderr = caller.communicate(timeout=30)
        assert (caller.returncode, stdout) == (status, out), stderr
