"""`.ci/install_chromium.sh` waits, bounded, for another apt/dpkg to let go of the lock."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "install_chromium.sh"
FAKE_APT = """#!/bin/bash
n=$(cat "$COUNT" 2>/dev/null || echo 0); echo $((n + 1)) > "$COUNT"
if (( n < LOCKED_CALLS )); then
    echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1 (apt)" >&2
    exit 100
fi
echo "apt-get $*" >> "$CALLS"
"""


def run_with_fake_apt(tmp_path: Path, locked_calls: int, wait_s: int):
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(FAKE_APT)
    (bin_dir / "chromium").write_text("#!/bin/bash\necho Chromium 1\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    # the script's own search would find a chromium already installed here: skip it
    script = tmp_path / "install.sh"
    script.write_text(
        SCRIPT.read_text().replace(
            "for candidate in /usr/lib/chromium/chromium chromium chromium-browser google-chrome",
            "for candidate in no-such-browser",
        )
    )
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "COUNT": str(tmp_path / "count"),
        "CALLS": str(tmp_path / "calls"),
        "LOCKED_CALLS": str(locked_calls),
        "APT_LOCK_WAIT": str(wait_s),
        "APT_LOCK_POLL": "0.1",
        "HOME": str(tmp_path),
    }
    if os.geteuid() != 0:
        (bin_dir / "sudo").write_text('#!/bin/bash\nexec "$@"\n')
        (bin_dir / "sudo").chmod(0o755)
    return subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60
    )


def test_waits_while_the_lock_is_held_then_installs(tmp_path):
    result = run_with_fake_apt(tmp_path, locked_calls=3, wait_s=30)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("holds the apt/dpkg lock; waiting") == 3
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[3] for c in calls] == ["update", "install"]
    assert all("DPkg::Lock::Timeout=" in c for c in calls)


def test_gives_up_after_the_limit_with_a_message(tmp_path):
    result = run_with_fake_apt(tmp_path, locked_calls=10**6, wait_s=1)
    assert result.returncode == 100
    assert "the apt/dpkg lock was still held after 1s" in result.stderr
    assert not (tmp_path / "calls").exists()
