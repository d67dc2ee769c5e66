"""storage.files: atomic whole-file writes, clearing what a killed writer leaves, opening files a
user names, and the digests remembered of them."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from storage.files import (
    FileDigests,
    NotReadable,
    open_regular_file,
    read_regular_file,
    read_saved_file,
    remove_temporary_files,
    write_file_atomically,
)

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


def test_read_regular_file_bounds_and_kinds(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"12345")
    assert read_regular_file(f, 5) == b"12345"
    with pytest.raises(NotReadable, match="file is 5 bytes, the limit is 4"):
        read_regular_file(f, 4)
    link = tmp_path / "link"
    link.symlink_to(f)
    assert read_regular_file(link, 5) == b"12345"
    with pytest.raises(NotReadable, match="cannot open"):
        read_regular_file(link, 5, follow_symlinks=False)
    with pytest.raises(NotReadable, match="cannot open"):
        read_regular_file(tmp_path / "missing", 5)
    with pytest.raises(NotReadable, match="NUL"):
        read_regular_file(str(tmp_path / "a\x00b"), 5)
    for not_regular in (tmp_path, Path("/dev/zero")):
        with pytest.raises(NotReadable, match="not a regular file"):
            read_regular_file(not_regular, 5)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(NotReadable, match="not a regular file"):  # returns at once: no writer needed
        read_regular_file(fifo, 5)


def test_read_saved_file_is_none_only_when_nothing_is_there(tmp_path: Path) -> None:
    """A trainer's saved payloads and state: absent is "not saved"; anything else in the file's
    place is refused at once (a FIFO blocked a restarted trainer: trainer kill campaign)."""
    assert read_saved_file(tmp_path / "missing", 5) is None
    (tmp_path / "f").write_bytes(b"saved")
    assert read_saved_file(tmp_path / "f", 5) == b"saved"
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tmp_path / "fifo")
    for odd in ("dangling", "fifo"):
        with pytest.raises(NotReadable):
            read_saved_file(tmp_path / odd, 5)
    with pytest.raises(NotReadable, match="not a regular file"):
        read_saved_file(tmp_path, 5)


# --- FileDigests (moved from rpc/artifacts: the node's posts and its checkpoint route share it) ---


def _digest(cache: FileDigests, path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return cache.digest(fd, os.fstat(fd))
    finally:
        os.close(fd)


def test_a_settled_files_digest_is_computed_once(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    path.write_bytes(b"a" * 100_000)
    cache = FileDigests(settled_ns=0)
    for _ in range(3):
        assert _digest(cache, path) == hashlib.sha256(b"a" * 100_000).digest()
    assert cache.hashed == 1
    # Changed (even to the same size): hashed again.
    path.write_bytes(b"b" * 100_000)
    assert _digest(cache, path) == hashlib.sha256(b"b" * 100_000).digest()
    assert cache.hashed == 2


def test_a_file_changed_just_now_is_not_remembered(tmp_path: Path) -> None:
    """Within one timestamp tick a change may keep the key: such a digest is not kept."""
    path = tmp_path / "ckpt"
    path.write_bytes(b"a")
    cache = FileDigests()  # 2 s settling
    _digest(cache, path)
    _digest(cache, path)
    assert cache.hashed == 2


def test_the_digest_cache_is_bounded(tmp_path: Path) -> None:
    cache = FileDigests(entries=2, settled_ns=0)
    paths = [tmp_path / str(i) for i in range(3)]
    for i, path in enumerate(paths):
        path.write_bytes(bytes([i]))
        _digest(cache, path)
    _digest(cache, paths[0])  # dropped for the third
    assert cache.hashed == 4


def test_a_digest_past_its_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    path.write_bytes(b"a" * 100)
    fd, info = open_regular_file(path)
    try:
        with pytest.raises(NotReadable, match="file is 100 bytes, the limit is 99"):
            FileDigests(settled_ns=0).digest(fd, info, 99)
        assert FileDigests(settled_ns=0).digest(fd, info, 100) == hashlib.sha256(b"a" * 100).digest()
    finally:
        os.close(fd)


def test_open_regular_file_refuses_what_is_not_one(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(NotReadable, match="not a regular file"):
        open_regular_file(fifo)  # non-blocking: no writer needed to return
    target = tmp_path / "target"
    target.write_bytes(b"x")
    link = tmp_path / "link"
    link.symlink_to(target)
    fd, _ = open_regular_file(link)
    os.close(fd)
    with pytest.raises(NotReadable, match="cannot open"):
        open_regular_file(link, follow_symlinks=False)
