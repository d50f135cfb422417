"""The output contract every command follows: check ``--out`` first, stage, move into place.

A command that writes a folder::

    from interp.cli.output import check_out_dir, staged_output

    def run(args):
        out = check_out_dir(args.out)         # before any model loads: refuses a file,
                                              # a read-only place... naming the user's path
        model = load_model(args.model)        # the slow part
        ...
        with staged_output(out, owns=FILES) as stage:
            stage.write_text("scores.csv", csv)   # into a hidden folder beside --out
            stage.write_text("report.html", page)
        for path in stage.written:            # every file is in place only here
            print(f"wrote {path}")

A command that writes one file (``interp attention --out page.html``)::

    out = check_out_file(args.out)            # before loading
    ...
    write_file(out, page)                     # temp file beside it, then one rename

The rule: ``--out`` is either left in its old state or holds the complete new set of files,
also when the run fails midway, the disk is full or the user presses Ctrl-C; the staging
folder is always removed. Files named in ``owns`` that this run did not write (say the
``report.html`` of an earlier run, now with ``--no-report``) are removed with the commit, so
the folder never mixes two runs. Other files in ``--out`` are left alone. Errors name the
user's path, never the temporary one.

Exit codes (``interp.cli.main``): 0 ok, 1 the work failed, 2 the command line was refused
(argparse, or a :class:`UsageError` raised before any model loads), 130 interrupted.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = [
    "UsageError",
    "OutputError",
    "Stage",
    "check_out_dir",
    "check_out_file",
    "committed",
    "staged_output",
    "terminal_table",
    "write_file",
]

_STAGE_PREFIX = ".interp-staging-"  # hidden, and recognisable if a crash ever leaves one
# the outputs this process has put in place: a Ctrl-C after they are (while the command prints
# its tables, say) ends with exit code 0 and their "wrote" lines, not 130 ("nothing written")
_COMMITTED: list[Path] = []


def committed(*, reset: bool = False) -> list[Path]:
    """The output files put in place so far by this process (``reset``: forget them first,
    as ``interp.cli.main`` does when a command starts)."""
    if reset:
        _COMMITTED.clear()
    return list(_COMMITTED)


class UsageError(ValueError):
    """The command line cannot work (checked before any model loads): exit code 2."""


class OutputError(OSError):
    """Writing the outputs failed; the message names the user's path."""


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "no space left on the device"
    if exc.errno == errno.EROFS:
        return "the file system is read-only"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return exc.strerror or str(exc)


def _existing_ancestor(path: Path) -> Path:
    for candidate in [path, *path.parents]:
        if candidate.exists():
            return candidate
    return Path(".")


def _stage_home(out: Path) -> Path:
    """Where the staging folder goes: inside an existing ``--out`` (same file system as the
    files it replaces), else in the nearest existing ancestor (which ``--out`` will be in)."""
    if out.is_dir():
        return out.resolve()
    return _existing_ancestor(out.absolute().parent).resolve()


def _probe(home: Path, shown: Path) -> None:
    """Make and remove an empty folder in ``home``: the only check that also catches
    read-only mounts, ACLs and quotas as the user running the command sees them."""
    if not home.is_dir():
        raise UsageError(
            f"--out {shown}: {home} is not a directory; pass a path whose parent is a directory"
        )
    try:
        probe = tempfile.mkdtemp(prefix=_STAGE_PREFIX, dir=home)
    except OSError as exc:
        raise UsageError(
            f"--out {shown}: cannot write in {home} ({_reason(exc)}); pass "
            "a --out in a folder you can write to"
        ) from None
    os.rmdir(probe)


def check_out_dir(out: str | os.PathLike) -> Path:
    """Check that ``out`` can become an output folder, before any work: it is not a file and
    the folder that will hold it can be written. Returns it as a ``Path`` (as the user wrote
    it, for messages). Raises :class:`UsageError`."""
    path = Path(out)
    if str(out) == "":
        raise UsageError("--out is empty; pass a folder name")
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {path} is a file; pass a folder (it is created if missing)")
    blocker = next((p for p in path.absolute().parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise UsageError(f"--out {path}: {blocker} is a file, so no folder can be made there")
    _probe(_stage_home(path), path)
    return path


def check_out_file(out: str | os.PathLike, *, suffix: str | None = ".html") -> Path:
    """Check that ``out`` can be written as one file, before any work: not a folder, a
    writable folder to hold it, and (unless ``suffix`` is None) the expected extension."""
    path = Path(out)
    if str(out) == "" or path.name in ("", ".", ".."):
        raise UsageError(f"--out {str(out)!r} is not a file name; pass e.g. page{suffix or ''}")
    if path.is_dir():
        raise UsageError(
            f"--out {path} is a folder; pass a file name such as {path / ('page' + (suffix or ''))}"
        )
    if suffix is not None and path.suffix.lower() != suffix:
        raise UsageError(f"--out {path} should end in {suffix} (it is written as {suffix[1:]})")
    blocker = next((p for p in path.absolute().parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise UsageError(f"--out {path}: {blocker} is a file, so no folder can be made there")
    _probe(_existing_ancestor(path.absolute().parent).resolve(), path)
    return path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C back while a few renames run: the commit happens whole. A Ctrl-C caught
    then is dropped, not re-raised: by then every file is in place, and the command ends at
    once with exit code 0 and its "wrote" lines, which is the truth. (Only the main thread
    may set signal handlers; elsewhere this does nothing.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        if previous is not None:  # None: a handler not set from Python; leave it alone
            signal.signal(signal.SIGINT, previous)


class Stage:
    """The hidden staging folder of one :func:`staged_output`. Write with
    :meth:`write_text` (or into :attr:`path` directly); after the
    ``with`` block, :attr:`written` lists the final paths."""

    def __init__(self, out: Path, path: Path):
        self.out = out  # the user's --out, for messages
        self.path = path  # the staging folder: files written here are moved into --out
        self.written: list[Path] = []

    def write_text(self, name: str, text: str) -> None:
        """Write ``name`` (UTF-8) into the stage; it reaches ``--out`` at the commit."""
        if not name or Path(name).name != name or name.startswith("."):
            raise ValueError(f"output name {name!r} must be a plain file name")
        from interp.pages import html  # looked up at call time (tests replace it)

        try:
            html.write_text_atomic(self.path / name, text)
        except OSError as exc:
            raise OutputError(
                f"could not write {self.out / name}: {_reason(exc)}; {self.out} was left as it was"
            ) from None


def _commit(stage: Stage, owns: Iterable[str]) -> list[Path]:
    out = stage.out
    names = sorted(p.name for p in stage.path.iterdir())
    if not out.exists():  # one rename puts the whole folder in place
        out.absolute().parent.mkdir(parents=True, exist_ok=True)
        os.chmod(stage.path, 0o777 & ~_umask())  # mkdtemp made it 0700
        os.rename(stage.path, out)
        return [out / name for name in names]
    # into an existing folder: the old files go aside into the stage, the new ones in; any
    # failure puts every old file back
    trash = stage.path / ".old"
    trash.mkdir()
    moved: list[tuple[Path, Path]] = []  # (from, to), undone in reverse
    try:
        for name in sorted(set(owns) | set(names)):
            if (out / name).exists() or (out / name).is_symlink():
                os.replace(out / name, trash / name)
                moved.append((out / name, trash / name))
            if name in names:
                os.replace(stage.path / name, out / name)
                moved.append((stage.path / name, out / name))
    except BaseException:
        for source, target in reversed(moved):
            with contextlib.suppress(OSError):
                os.replace(target, source)
        raise
    return [out / name for name in names]


@contextlib.contextmanager
def staged_output(out: str | os.PathLike, *, owns: Iterable[str] = ()) -> Iterator[Stage]:
    """Stage the files of one run and move them into ``out`` together when the block ends
    without an error. On any error (also ``KeyboardInterrupt``) nothing in ``out`` changes
    and the staging folder is removed. ``owns``: file names this command writes; stale ones
    from an earlier run are removed at the commit. Call :func:`check_out_dir` first."""
    out = Path(out)
    home = _stage_home(out)
    try:
        stage_path = Path(tempfile.mkdtemp(prefix=_STAGE_PREFIX, dir=home))
    except OSError as exc:
        raise OutputError(f"could not write into {out}: {_reason(exc)}") from None
    stage = Stage(out, stage_path)
    try:
        yield stage
        with _interrupts_deferred():
            try:
                stage.written = _commit(stage, owns)
                _COMMITTED.extend(stage.written)
            except OSError as exc:
                raise OutputError(
                    f"could not move the new files into {out}: "
                    f"{_reason(exc)}; {out} was left as it was"
                ) from None
    finally:
        with _interrupts_deferred():  # a Ctrl-C now would leave the hidden folder behind
            if stage_path.exists():
                shutil.rmtree(stage_path, ignore_errors=True)


def write_file(out: str | os.PathLike, text: str) -> Path:
    """Write one output file atomically (temp file beside it, fsync, rename); errors name
    ``out``. Call :func:`check_out_file` first."""
    from interp.pages import html  # looked up at call time (tests replace it)

    out = Path(out)
    try:
        with _interrupts_deferred():  # written and in place, or not at all (exit code 130)
            path = html.write_text_atomic(out, text)
            _COMMITTED.append(path)
            return path
    except OSError as exc:
        raise OutputError(
            f"could not write {out}: {_reason(exc)}; {out} was left as it was"
        ) from None


def _cell(value, decimals: int) -> str:
    import numpy as np
    import pandas as pd

    if value is None or value is pd.NA or value is pd.NaT:
        return "-"
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, float | np.floating):
        number = float(value)
        if not math.isfinite(number):
            return "-"
        # a value that rounds to zero prints as 0.000, not -0.000
        return f"{number if round(number, decimals) != 0 else 0.0:.{decimals}f}"
    return str(value)


def terminal_table(frame, *, decimals: int = 4) -> str:
    """``frame`` (a DataFrame) as aligned text for the terminal: no index, fixed decimals, and
    ``-`` where a value is missing or undefined (never ``<NA>`` or ``nan``)."""
    import pandas as pd

    shown = pd.DataFrame(
        {column: [_cell(v, decimals) for v in frame[column].tolist()] for column in frame.columns},
        columns=frame.columns,
    )
    return shown.to_string(index=False)


def check_shard(shard: tuple[int, int] | None, n_rows: int, what: str) -> tuple[int, int]:
    """``--shard I/N`` (None: the whole task, ``(0, 1)``), refused when shard ``I`` would get
    no row of the ``n_rows`` of ``what`` (the task file, or "the task")."""
    index, count = shard or (0, 1)
    if index >= n_rows:
        raise UsageError(
            f"--shard {index}/{count} has no rows: {what} has {n_rows}; use at most {n_rows} shards"
        )
    return index, count


def write_partial(out: Path, partial: dict, shard: tuple[int, int], owns: Iterable[str]) -> int:
    """Write a shard's ``partial.json`` (staged) and say which rows it holds; exit code 0."""
    import json

    with staged_output(out, owns=owns) as stage:
        stage.write_text("partial.json", json.dumps(partial) + "\n")
    rows = partial["rows"]
    shown = ", ".join(map(str, rows[:8])) + (" ..." if len(rows) > 8 else "")
    print(f"shard {shard[0]}/{shard[1]}: rows {shown}")
    for path in stage.written:
        print(f"wrote {path}")
    return 0
