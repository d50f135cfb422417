"""A warm fork server: a Python process that has imported torch, transformers, TransformerLens
and interp once, and forks a child for each command it is asked to run.

Importing those takes 5-9 s of a fresh interpreter's start, and the documents' examples start
dozens of them (every ``interp ...`` command and every document's driver). A command run here
is still its own process with fresh state, only its imports already done:

- the child gets the caller's argv, working directory, environment and stdin/stdout/stderr
  (the file descriptors themselves, passed over the Unix socket), its own process group, fresh
  ``random`` and numpy seeds and torch's default seed, as a new interpreter would;
- the command runs as ``python -m MODULE`` or ``python SCRIPT`` would (``runpy``, as
  ``__main__``, ``sys.path[0]`` set the same way), and the child ends the way an interpreter
  does: an uncaught exception prints its traceback and exits 1, ``SystemExit`` gives the
  code, ``atexit`` handlers run;
- the exit status goes back to the caller, which exits with it, or dies of the same signal
  when the command was killed by one (so its parent sees what a fresh interpreter's would:
  ``returncode`` -N, a shell 128 + N); SIGINT or SIGTERM sent to the caller (Ctrl-C, a test's
  signal) reaches the command's process group, and a caller that dies (a timeout) takes that
  group with it;
- ``sys.executable`` in the command is ``python`` beside the socket, a shim that runs
  ``python ARGS...`` through the server too: the processes a command starts with
  ``sys.executable`` (the local executors' workers) are forked as well. ``-u`` is served
  (the server runs unbuffered); a call with any other interpreter option (``-c``, ``-X``...)
  runs in a fresh interpreter.

A request whose environment differs from the server's in anything but the variables of
``MAY_DIFFER`` runs in a fresh interpreter instead (``os.execv``), as it does when no server is
running: settings read at import time (``HF_HUB_OFFLINE``, ``OMP_NUM_THREADS``, ``PYTHONPATH``)
are the server's, so only a request that would have read the same ones may use it.

Start: ``python tests/fork_server.py serve SOCKET [MODULE...]`` (imports the modules, by
default ``PRELOAD``, then prints ``ready``). Run a command: ``python tests/fork_server.py call
SOCKET -m MODULE ARGS...`` or ``... call SOCKET SCRIPT ARGS...``. This file imports only the
standard library until it serves, so a call costs a bare interpreter's start.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import struct
import sys

# variables a command may set differently from the server: none of them is read at import time
# (a shell sets PS1, PS2, PS4 and OPTIND in what it runs, interactive or not; jupyter_client
# tells a kernel its parent and session in JPY_*; COLUMNS and LINES, the terminal's size, are
# read when output is laid out, and a test process gets them set once pytest has started)
MAY_DIFFER = frozenset(
    {"PATH", "PWD", "OLDPWD", "SHLVL", "_", "PYTEST_CURRENT_TEST", "PS1", "PS2", "PS4", "OPTIND"}
    | {"JPY_PARENT_PID", "JPY_SESSION_NAME", "COLUMNS", "LINES"}
)
# what the server imports before it serves: interp's every module (the commands import them
# lazily as they run) and the libraries they need, with the parts that loading a model imports
# lazily (TransformerLens's bridge and transformers' models: about 5 s of each command)
PRELOAD = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformer_lens",
    "transformer_lens.model_bridge",
    "interp",
)
REFUSED = -1000  # the server's answer for a request it does not take


def _env_key(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in MAY_DIFFER}


def _preload(names) -> None:
    import importlib
    import pkgutil

    for name in names:
        module = importlib.import_module(name)
        if name != "interp":
            continue
        for info in pkgutil.walk_packages(module.__path__, "interp."):
            if info.name.rsplit(".", 1)[-1] == "__main__":
                continue  # running it is the command's job
            try:
                importlib.import_module(info.name)
            except ImportError:
                pass  # an optional dependency (ray, submitit) that is not installed


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the caller hung up")
        data += chunk
    return data


def shim_path(path: str) -> str:
    """The ``python`` shim of the server at socket ``path``: ``python ARGS...`` through it."""
    return os.path.join(os.path.dirname(os.path.abspath(path)), "python")


def _write_shim(path: str) -> str:
    import shlex

    shim = shim_path(path)
    this = os.path.abspath(__file__)
    line = " ".join(shlex.quote(part) for part in (sys.executable, this, "call", path))
    with open(shim, "w", encoding="utf-8") as f:
        f.write(f'#!/bin/sh\nexec {line} "$@"\n')
    os.chmod(shim, 0o755)
    return shim


def _runnable(argv: list[str], unbuffered: bool) -> list[str] | None:
    """``argv`` as the server runs it (``-m MODULE ARGS`` or ``SCRIPT ARGS``), or None when
    only a fresh interpreter can (an interpreter option other than ``-u`` in an unbuffered
    server, or no module or script)."""
    while argv and argv[0] == "-u" and unbuffered:
        argv = argv[1:]
    if not argv or argv == ["-m"] or (argv[0].startswith("-") and argv[0] != "-m"):
        return None
    return argv


def serve(path: str, preload=PRELOAD):
    """Import ``preload`` and listen on ``path``; return only in a command's process, with the
    command to run."""
    started_with = dict(os.environ)
    shim = _write_shim(path)
    _preload(preload)
    # what the imports set (torch's inductor sets TORCHINDUCTOR_CACHE_DIR): a command's process
    # gets it as a fresh interpreter would once it imported the same, unless its caller set it
    set_by_imports = {k: v for k, v in os.environ.items() if k not in started_with}
    gc.collect()
    gc.freeze()  # the commands' collections skip what is here (and leave its pages shared)
    env_key = _env_key(started_with)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the per-command waiters reap themselves
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        conn, _ = listener.accept()
        try:
            _, fds, _, _ = socket.recv_fds(conn, 1, 3)
            (size,) = struct.unpack("!I", _recv_exact(conn, 4))
            request = json.loads(_recv_exact(conn, size))
        except (ConnectionError, OSError, ValueError):
            conn.close()
            continue
        differs = sorted(set(_env_key(request["env"]).items()) ^ set(env_key.items()))
        argv = _runnable(request["argv"], bool(started_with.get("PYTHONUNBUFFERED")))
        if len(fds) != 3 or differs or argv is None:
            why = "an interpreter option it does not serve" if argv is None else ""
            if differs:
                why += f"{'; ' if why else ''}its environment differs in "
                why += str(sorted({k for k, _ in differs}))
            sys.stderr.write(f"fork server: a fresh interpreter for {request['argv'][:2]}: {why}\n")
            conn.sendall(struct.pack("!i", REFUSED))
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            command = os.fork()
            if command == 0:
                conn.close()
                sys.executable = shim
                return _become({**request, "argv": argv}, fds, set_by_imports)
            _wait_and_answer(conn, command, fds)
        conn.close()
        for fd in fds:
            os.close(fd)


def _wait_and_answer(conn: socket.socket, pid: int, fds: list[int]) -> None:
    """The waiter: send the command's exit status to its caller, or kill the command's process
    group when the caller goes away first. Never returns."""
    for fd in fds:
        os.close(fd)
    status = None
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    while status is None:
        waiting = [conn] + ([pidfd] if pidfd is not None else [])
        readable, _, _ = select.select(waiting, [], [], 0.05 if pidfd is None else None)
        if conn in readable:
            try:
                signals = conn.recv(16)
            except OSError:
                signals = b""
            try:  # a signal the caller got, forwarded; or the caller hung up (killed, timed out)
                for signum in signals or [signal.SIGKILL]:
                    os.killpg(pid, signum)
            except ProcessLookupError:
                pass
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = raw
    try:  # -N for a command killed by signal N
        conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
    except OSError:
        pass
    os._exit(0)


def _become(request: dict, fds: list[int], set_by_imports: dict[str, str]):
    """In the command's process: take over the caller's stdio, directory and environment."""
    os.setpgid(0, 0)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({**set_by_imports, **request["env"]})
    _fresh_seeds()
    argv = request["argv"]
    if argv[0] == "-m":
        module, args = argv[1], argv[2:]
        sys.path[0] = os.getcwd()
    else:
        module, args = None, argv[1:]
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))

    def run() -> None:
        import runpy

        if module is not None:
            sys.argv = [module, *args]  # runpy puts the module's file first
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [argv[0], *args]
            runpy.run_path(argv[0], run_name="__main__")

    return run


def _fresh_seeds() -> None:
    """The seeds a new interpreter would start with: random and numpy from the OS, torch's
    fixed default."""
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        torch.manual_seed(torch.initial_seed())


def call(path: str, argv: list[str]) -> int:
    """Run ``argv`` (``-m MODULE ARGS`` or ``SCRIPT ARGS``) in the server at ``path``; a fresh
    interpreter instead when there is none or it refuses."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:  # no server (any more): a fresh interpreter, as without one
        os.execv(sys.executable, [sys.executable, *argv])
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)})
    socket.send_fds(conn, [b"r"], [0, 1, 2])
    data = request.encode()
    conn.sendall(struct.pack("!I", len(data)) + data)

    def forward(signum, frame) -> None:  # to the command, as if it had been sent to it
        with contextlib.suppress(OSError):
            conn.send(bytes([signum]))

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    try:
        (code,) = struct.unpack("!i", _recv_exact(conn, 4))
    except (ConnectionError, OSError):
        sys.stderr.write(f"fork server at {path} went away while running {argv}\n")
        return 1
    if code == REFUSED:
        os.execv(sys.executable, [sys.executable, *argv])
    if code < 0:  # killed by a signal: die of it too, as the command's process did
        die_of(-code)
    return code


def die_of(signum: int) -> None:
    """End this process by signal ``signum``, its default action, no core file."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if signum not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # a signal whose default action is not to end the process


def exit_like_an_interpreter(job) -> None:
    """Run ``job`` as a main program and exit as the interpreter does, up to its finalization:
    the exit code from ``SystemExit`` (1 and the traceback for any other exception), then
    non-daemon threads joined, ``atexit`` handlers run, stdout and stderr flushed. The
    interpreter's last step, tearing down every module, is skipped (``os._exit``): it takes
    2-3 s after torch and touches every inherited page; Python never promised that objects
    still alive at exit are finalized."""
    import atexit
    import threading

    try:
        job()
        code = 0
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            sys.stderr.write(f"{stop.code}\n")
            code = 1
    except KeyboardInterrupt:  # the interpreter prints it, then dies of SIGINT
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # what the interpreter does first at exit: join non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code < 0:
        die_of(-code)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        # serve returns only in a command's process
        exit_like_an_interpreter(serve(sys.argv[2], sys.argv[3:] or PRELOAD))
    elif sys.argv[1] == "call":
        sys.exit(call(sys.argv[2], sys.argv[3:]))
    else:
        sys.exit(
            f"usage: {sys.argv[0]} serve SOCKET [MODULE...] | "
            "call SOCKET (-m MODULE | SCRIPT) ARGS..."
        )
