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


def test_write_gives_the_file_its_mode_whatever_the_temporary_had(tmp_path: Path) -> None:
    target = tmp_path / "model.safetensors"
    write_file_atomically(target, b"x")
    assert os.stat(target).st_mode & 0o777 == 0o644  # the default, not mkstemp's 0o600
    write_file_atomically(target, b"y", mode=0o640)
    assert os.stat(target).st_mode & 0o777 == 0o640


def test_only_temporaries_named_as_a_writer_names_them_are_removed(tmp_path: Path) -> None:
    ours = sorted(tmp_path / f".run-{i}.safetensors.{i}abc.tmp" for i in range(5))
    for path in reversed(ours):
        path.write_bytes(b"left")
    kept = {
        "run.tmp": b"no leading dot",
        ".hidden": b"no .tmp suffix",
        "..tmp": b"nothing between prefix and suffix",
    }
    for name, data in kept.items():
        (tmp_path / name).write_bytes(data)
    target = tmp_path / "target"
    target.write_bytes(b"a file a link points to")
    (tmp_path / ".link.abc.tmp").symlink_to(target)  # a symlink is not a regular file: kept
    assert remove_temporary_files(tmp_path) == ours  # sorted
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, ".link.abc.tmp", "target"])
    assert target.read_bytes() == b"a file a link points to"


def test_removing_temporaries_of_a_path_that_is_not_a_directory_fails(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        remove_temporary_files(f)  # only a missing directory means "nothing to remove"


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


# A regular file whose fstat size (0) is not what a read gives: a file that grew after its fstat.
GROWN = Path("/proc/self/status")


def test_a_file_larger_than_its_fstat_said_is_refused_not_cut(tmp_path: Path) -> None:
    assert os.stat(GROWN).st_size == 0 < len(GROWN.read_bytes())
    with pytest.raises(NotReadable, match="larger than the limit of 10 bytes"):
        read_regular_file(GROWN, 10)
    fd, info = open_regular_file(GROWN)
    try:
        with pytest.raises(NotReadable, match="larger than the limit of 10 bytes"):
            FileDigests(settled_ns=0).digest(fd, info, 10)
    finally:
        os.close(fd)


def test_reads_and_refusals_close_their_descriptors(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"12345")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        assert read_regular_file(f, 5) == b"12345"
        with pytest.raises(NotReadable):
            read_regular_file(f, 4)
        with pytest.raises(NotReadable, match="not a regular file"):
            open_regular_file(fifo)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_file_rewritten_to_the_same_size_and_mtime_is_hashed_again(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    path.write_bytes(b"a" * 1000)
    cache = FileDigests(settled_ns=0)
    assert _digest(cache, path) == hashlib.sha256(b"a" * 1000).digest()
    stamp = os.stat(path)
    path.write_bytes(b"b" * 1000)
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # mtime put back; ctime cannot be
    assert os.stat(path).st_mtime_ns == stamp.st_mtime_ns and os.stat(path).st_size == stamp.st_size
    assert _digest(cache, path) == hashlib.sha256(b"b" * 1000).digest()


def test_the_digest_cache_keeps_the_most_recently_used(tmp_path: Path) -> None:
    cache = FileDigests(entries=2, settled_ns=0)
    paths = [tmp_path / str(i) for i in range(3)]
    for i, path in enumerate(paths):
        path.write_bytes(bytes([i]))
    _digest(cache, paths[0])
    _digest(cache, paths[1])
    _digest(cache, paths[0])  # used again: now the most recent
    _digest(cache, paths[2])  # drops paths[1], not paths[0]
    assert cache.hashed == 3
    _digest(cache, paths[0])
    assert cache.hashed == 3
    _digest(cache, paths[1])
    assert cache.hashed == 4


def test_a_digest_of_a_file_changed_since_its_fstat_is_not_remembered(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    path.write_bytes(b"a" * 100)
    stale = os.stat(path)
    path.write_bytes(b"b" * 200)
    cache = FileDigests(settled_ns=0)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert cache.digest(fd, stale) == hashlib.sha256(b"b" * 200).digest()
    finally:
        os.close(fd)
    assert len(cache) == 0  # not kept under the key of the file as it was


def test_a_file_whose_status_changed_just_now_is_not_remembered(tmp_path: Path) -> None:
    """Settling counts from the later of mtime and ctime: an old mtime set just now (ctime now)
    does not make a file settled."""
    path = tmp_path / "ckpt"
    path.write_bytes(b"a")
    old = os.stat(path).st_mtime_ns - 3600 * 10**9
    os.utime(path, ns=(old, old))
    cache = FileDigests()  # 2 s settling
    _digest(cache, path)
    _digest(cache, path)
    assert cache.hashed == 2 and len(cache) == 0
