"""Whole-file writes that a crash can never leave half-done.

What this module is: :func:`write_file_atomically`, used for files derived from or beside the
store (the node's final model file, checkpoints a trainer or sponsor writes, a trainer's saved
payloads), :func:`remove_temporary_files`, which clears what a killed writer left behind,
:func:`read_regular_file` and :func:`open_regular_file`, for files a user or a spec names (which
may be anything), and :class:`FileDigests`, the SHA-256 of such files remembered while unchanged.
What it is NOT: the node's state, which lives in the key-value store (:mod:`storage.interface`).
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path

__all__ = [
    "FILE_DIGESTS",
    "FileDigests",
    "NotReadable",
    "fsync_directory",
    "open_regular_file",
    "read_regular_file",
    "read_saved_file",
    "remove_temporary_files",
    "write_file_atomically",
]

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


def open_regular_file(path: str | os.PathLike[str], *, follow_symlinks: bool = True) -> tuple[int, os.stat_result]:
    """An open descriptor of the regular file ``path`` and its ``fstat``, or NotReadable (the
    caller closes the descriptor).

    Why not ``open``: a FIFO blocks the open until a writer comes, and a device such as
    ``/dev/zero`` never ends. The file is opened non-blocking (and, with ``follow_symlinks``
    off, not through a final symlink) and refused unless fstat says it is a regular file.
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
    except OSError as exc:
        os.close(fd)
        raise NotReadable(f"cannot read: {exc.strerror or exc}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def read_regular_file(path: str | os.PathLike[str], max_bytes: int, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes``, or NotReadable.

    Why not ``Path.read_bytes``: a FIFO blocks the open until a writer comes, and ``/dev/zero``
    or ``/dev/urandom`` never end (reading one fills memory until the kernel kills the process).
    The file is opened as :func:`open_regular_file` opens it and read to one byte past the
    limit, so a file that grows while it is read is refused too.
    """
    fd, info = open_regular_file(path, follow_symlinks=follow_symlinks)
    try:
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


def read_saved_file(path: Path, max_bytes: int) -> bytes | None:
    """:func:`read_regular_file` of a file a process saved for itself (a trainer's payloads and
    state), None when nothing is at ``path``. Anything else there (a FIFO, a directory, a
    dangling symlink, a file it may not read) is NotReadable: the operator's to fix, never
    mistaken for "not saved"."""
    if not path.exists() and not path.is_symlink():
        return None
    return read_regular_file(path, max_bytes)


_HASH_CHUNK = 16 << 20


class FileDigests:
    """SHA-256 of files by (device, inode, size, mtime ns, ctime ns), the most recently used kept.

    Why: a node hashes files that anyone can name or ask for: a sponsor's post names any
    readable checkpoint (each refused post used to read the whole file again), and the
    checkpoint route (``rpc/artifacts.py``) must check the file against its spec before it
    sends a byte, for every GET. With the digest remembered, an unchanged file costs a
    ``fstat``. Any change through the file system moves ctime, so a changed file is hashed
    again; a digest is only remembered once the file has not changed for ``settled_ns`` (a
    change within one timestamp tick would otherwise keep a stale digest: git's "racy" rule).
    The digest is of the open descriptor given (read with ``pread``: its offset does not move),
    so a caller that then streams from it never sends a file replaced by rename under another's
    digest.
    """

    def __init__(self, entries: int = 256, settled_ns: int = 2_000_000_000) -> None:
        self._entries = entries
        self._settled_ns = settled_ns
        self._digests: OrderedDict[tuple[int, ...], bytes] = OrderedDict()
        self._lock = threading.Lock()
        self.hashed = 0
        """Files hashed (not found in the cache): what the tests count."""

    def __len__(self) -> int:
        return len(self._digests)

    def clear(self) -> None:
        with self._lock:
            self._digests.clear()

    @staticmethod
    def _key(info: os.stat_result) -> tuple[int, ...]:
        return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns

    def digest(self, fd: int, info: os.stat_result, max_bytes: int | None = None) -> bytes:
        """SHA-256 of the open regular file ``fd`` whose ``fstat`` is ``info``; NotReadable when
        it cannot be read or holds more than ``max_bytes`` (also when it grows while read)."""
        key = self._key(info)
        with self._lock:
            known = self._digests.get(key)
            if known is not None:
                self._digests.move_to_end(key)
                return known
            self.hashed += 1
        if max_bytes is not None and info.st_size > max_bytes:
            raise NotReadable(f"file is {info.st_size} bytes, the limit is {max_bytes}")
        digest, offset = hashlib.sha256(), 0
        try:
            while chunk := os.pread(fd, _HASH_CHUNK, offset):
                offset += len(chunk)
                if max_bytes is not None and offset > max_bytes:
                    raise NotReadable(f"file is larger than the limit of {max_bytes} bytes")
                digest.update(chunk)
            after = os.fstat(fd)
        except OSError as exc:
            raise NotReadable(f"cannot read: {exc.strerror or exc}") from None
        if self._key(after) == key and time.time_ns() - max(after.st_mtime_ns, after.st_ctime_ns) > self._settled_ns:
            with self._lock:
                self._digests[key] = digest.digest()
                while len(self._digests) > self._entries:
                    self._digests.popitem(last=False)
        return digest.digest()


FILE_DIGESTS = FileDigests()
"""The process's digests: a node's posts and its checkpoint route share them, so a checkpoint
hashed when its run was posted is served without being hashed again."""
