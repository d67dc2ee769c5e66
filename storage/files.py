"""Whole-file writes that a crash can never leave half-done.

What this module is: :func:`write_file_atomically`, used for files derived from or beside the
store (the node's final model file, checkpoints a trainer or sponsor writes). What it is NOT: the
node's state, which lives in the key-value store (:mod:`storage.interface`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_file_atomically"]


def write_file_atomically(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one, never a part.

    A temporary file in the same directory is written and fsynced, renamed over ``path``, and the
    directory is fsynced so the rename itself survives a power loss. Parent directories are
    created. On any failure the temporary file is removed and the error propagates.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
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
