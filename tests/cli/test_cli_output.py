"""The output contract (interp.cli.output): check first, stage, move into place whole."""

from __future__ import annotations

import errno
import os

import pytest

import interp.pages.html as html
from interp.cli.output import (
    OutputError,
    UsageError,
    check_out_dir,
    check_out_file,
    staged_output,
    write_file,
)


def leftovers(folder):
    """Staging folders or temp files anywhere under ``folder``."""
    return [p for p in folder.rglob("*") if ".interp-staging-" in p.name or p.suffix == ".tmp"]


def test_new_folder_appears_whole(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    assert check_out_dir(out) == out
    assert not (tmp_path / "a").exists()  # checking writes nothing
    with staged_output(out, owns=["x.csv", "y.html"]) as stage:
        stage.write_text("x.csv", "1\n")
        stage.write_text("y.html", "<p>")
        assert not out.exists()  # nothing shows before the commit
    assert stage.written == [out / "x.csv", out / "y.html"]
    assert (out / "x.csv").read_text() == "1\n" and (out / "y.html").read_text() == "<p>"
    assert leftovers(tmp_path) == []
    mask = os.umask(0)
    os.umask(mask)
    assert (out.stat().st_mode & 0o777) == 0o777 & ~mask


def test_existing_folder_is_replaced_file_by_file_and_keeps_other_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "x.csv").write_text("old")
    (out / "stale.html").write_text("from an earlier run")
    (out / "notes.txt").write_text("the user's own")
    with staged_output(out, owns=["x.csv", "stale.html"]) as stage:
        stage.write_text("x.csv", "new")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "x.csv"]
    assert (out / "x.csv").read_text() == "new"
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "error",
    [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt(), RuntimeError("boom")],
)
def test_failure_midway_keeps_the_old_state(tmp_path, monkeypatch, error):
    out = tmp_path / "out"
    out.mkdir()
    (out / "x.csv").write_text("old x")
    (out / "y.html").write_text("old y")
    real = html.write_text_atomic

    def second_fails(path, text):
        if path.name == "y.html":
            raise error
        return real(path, text)

    monkeypatch.setattr(html, "write_text_atomic", second_fails)
    expected = OutputError if isinstance(error, OSError) else type(error)
    with pytest.raises(expected) as info:
        with staged_output(out, owns=["x.csv", "y.html"]) as stage:
            stage.write_text("x.csv", "new x")
            stage.write_text("y.html", "new y")
    if isinstance(error, OSError):  # the user's path and a plain reason, no temp name
        assert str(info.value).startswith(f"could not write {out / 'y.html'}: no space left")
        assert "staging" not in str(info.value)
    assert (out / "x.csv").read_text() == "old x" and (out / "y.html").read_text() == "old y"
    assert sorted(p.name for p in out.iterdir()) == ["x.csv", "y.html"]
    assert leftovers(tmp_path) == []


def test_failure_into_a_new_folder_leaves_nothing(tmp_path):
    out = tmp_path / "new"
    with pytest.raises(KeyboardInterrupt):
        with staged_output(out) as stage:
            stage.write_text("x.csv", "1")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_a_failed_commit_puts_every_old_file_back(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("a", "b", "c"):
        (out / name).write_text(f"old {name}")
    real = os.replace
    calls = []

    def third_move_fails(src, dst):
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(errno.EIO, "I/O error")
        return real(src, dst)

    with pytest.raises(OutputError, match=f"could not move the new files into {out}"):
        with staged_output(out, owns=["a", "b", "c"]) as stage:
            for name in ("a", "b", "c"):
                (stage.path / name).write_text(f"new {name}")
            monkeypatch.setattr(os, "replace", third_move_fails)  # the commit's moves
    assert {p.name: p.read_text() for p in out.iterdir()} == {
        "a": "old a",
        "b": "old b",
        "c": "old c",
    }
    assert leftovers(tmp_path) == []


def test_check_out_dir_refuses_at_once(tmp_path, monkeypatch):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(UsageError, match=f"--out {a_file} is a file"):
        check_out_dir(a_file)
    with pytest.raises(UsageError, match="is a file, so no folder"):
        check_out_dir(a_file / "sub")

    import tempfile

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    with pytest.raises(UsageError, match=f"--out {tmp_path / 'out'}: cannot write in .*read-only"):
        check_out_dir(tmp_path / "out")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_check_out_dir_refuses_a_read_only_parent(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        with pytest.raises(UsageError, match="permission denied"):
            check_out_dir(parent / "out")
    finally:
        parent.chmod(0o755)


def test_check_out_file_and_write_file(tmp_path, monkeypatch):
    with pytest.raises(UsageError, match="is a folder"):
        check_out_file(tmp_path)
    with pytest.raises(UsageError, match="should end in .html"):
        check_out_file(tmp_path / "page.txt")
    page = check_out_file(tmp_path / "sub" / "page.html")
    assert write_file(page, "new") == page and page.read_text() == "new"

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(html, "write_text_atomic", full)
    with pytest.raises(OutputError, match=f"could not write {page}: no space left"):
        write_file(page, "newer")
    assert page.read_text() == "new"
