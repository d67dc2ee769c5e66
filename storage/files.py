"""Whole-file writes that a crash can never leave half-done.

What this module is: :func:`write_file_atomically`, used for files derived from or beside the
store (the node's final model file, checkpoints a trainer or sponsor writes, a trainer's saved
payloads), :func:`remove_temporary_files`, which clears what a killed writer left behind, and
:func:`read_regular_file`, for files a user or a spec names (which may be anything).
What it is NOT: the node's state, which lives in the key-value store (:mod:`storage.interface`).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

__all__ = ["NotReadable", "fsync_directory", "read_regular_file", "remove_temporary_files", "write_file_atomically"]

_TMP_PREFIX = "."
_TMP_SUFFIX = ".tmp"


def write_file_atomically(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one, never a part.

    A temporary file in the same directory is written and fsynced, renamed over ``path``, and the
    directory is fsynced so the rename itself survives a power loss. Parent directories are
    created. On any failure the temporary file is removed and the error propagates; a process
    killed before the rename (SIGKILL, power loss) leaves it, as ``.<name>.<random>.tmp``, for
    :func:`remove_temporary_files`.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f"{_TMP_PREFIX}{target.name}.", suffix=_TMP_SUFFIX)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_directory(target.parent)


def fsync_directory(path: str | os.PathLike[str]) -> None:
    """fsync the directory ``path``, so that the entries created, renamed or removed in it survive
    a power loss (an fsync of a file does not cover its name)."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_temporary_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files that writers killed mid-write left in ``directory``.

    Each is as large as the file it was to become (a whole model), and its random name means no
    later write replaces it, so without this every crash at the wrong moment leaks one for
    good. Only regular files named as :func:`write_file_atomically` names them are touched. Call
    it only while no other process writes into ``directory`` (the node does so at startup, while
    it holds the store's lock). Returns the paths removed; a missing directory has none.
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return removed
    for entry in entries:
        name = entry.name
        ours = name.startswith(_TMP_PREFIX) and name.endswith(_TMP_SUFFIX)
        if not ours or len(name) <= len(_TMP_PREFIX + _TMP_SUFFIX):
            continue
        if entry.is_file(follow_symlinks=False):
            Path(entry.path).unlink(missing_ok=True)
            removed.append(Path(entry.path))
    return sorted(removed)


class NotReadable(ValueError):
    """A named file is not something to read whole: ``reason`` says why (one line, no path)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def read_regular_file(path: str | os.PathLike[str], max_bytes: int, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes``, or NotReadable.

    Why not ``Path.read_bytes``: a FIFO blocks the open until a writer comes, and ``/dev/zero``
    or ``/dev/urandom`` never end (reading one fills memory until the kernel kills the process).
    The file is opened non-blocking, refused unless fstat says it is a regular file, and read
    to one byte past the limit, so a file that grows while it is read is refused too.
    """
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise NotReadable(f"cannot open: {exc.strerror or exc}") from None
    except ValueError:  # an embedded NUL byte
        raise NotReadable("cannot open: the path holds a NUL byte") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotReadable("not a regular file")
        if info.st_size > max_bytes:
            raise NotReadable(f"file is {info.st_size} bytes, the limit is {max_bytes}")
        chunks = []
        remaining = max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except OSError as exc:
        raise NotReadable(f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise NotReadable(f"file is larger than the limit of {max_bytes} bytes")
    return data
