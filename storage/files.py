"""Whole-file writes that a crash can never leave half-done.

What this module is: :func:`write_file_atomically`, used for files derived from or beside the
store (the node's final model file, checkpoints a trainer or sponsor writes, a trainer's saved
payloads), and :func:`remove_temporary_files`, which clears what a killed writer left behind.
What it is NOT: the node's state, which lives in the key-value store (:mod:`storage.interface`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["remove_temporary_files", "write_file_atomically"]

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
    dir_fd = os.open(target.parent, os.O_RDONLY)
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
