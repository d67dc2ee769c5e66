"""storage.files: atomic whole-file writes, and clearing what a killed writer leaves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from storage.files import remove_temporary_files, write_file_atomically

REPO = Path(__file__).resolve().parents[2]


def test_write_replaces_the_whole_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "model.safetensors"
    write_file_atomically(target, b"old")
    write_file_atomically(target, b"new" * 1000, mode=0o600)
    assert target.read_bytes() == b"new" * 1000
    assert os.stat(target).st_mode & 0o777 == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.safetensors"]


def test_a_failed_write_removes_its_temporary(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_file_atomically(tmp_path / "f", "not bytes")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_killed_writer_leaves_a_temporary_that_is_removed(tmp_path: Path) -> None:
    """SIGKILL (here: os._exit) between the write and the rename skips every cleanup path."""
    child = f"""
import os, sys
sys.path.insert(0, {str(REPO)!r})
import storage.files as files
def die(src, dst):
    os._exit(9)
files.os.replace = die
files.write_file_atomically({str(tmp_path / "run-1.safetensors")!r}, b"x" * 4096)
"""
    assert subprocess.run([sys.executable, "-c", child], check=False).returncode == 9
    left = list(tmp_path.iterdir())
    assert len(left) == 1 and left[0].name.startswith(".run-1.safetensors.") and left[0].name.endswith(".tmp")
    assert left[0].stat().st_size == 4096
    (tmp_path / "run-2.safetensors").write_bytes(b"kept")
    (tmp_path / ".tmp").write_bytes(b"not ours: no name between prefix and suffix")
    (tmp_path / ".keep").mkdir()
    (tmp_path / ".dir.tmp").mkdir()  # only regular files are removed
    assert remove_temporary_files(tmp_path) == left
    assert sorted(p.name for p in tmp_path.iterdir()) == [".dir.tmp", ".keep", ".tmp", "run-2.safetensors"]
    assert remove_temporary_files(tmp_path) == []
    assert remove_temporary_files(tmp_path / "missing") == []
