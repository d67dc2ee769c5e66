"""Exclusive advisory locks (``flock``) that a process holds for as long as it uses something
that must have one user: a store directory, a peer identity key, a trainer's payload directory.

Why flock and not a pid file: the kernel releases it when the holder dies, SIGKILL included, so
a crash never leaves a stale lock for an operator to clean up; and it lives on the file's or the
directory's own descriptor, so deleting some ``LOCK`` file beside it cannot break it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["try_lock_directory", "try_lock_exclusive"]


def try_lock_exclusive(path: str | Path, *, directory: bool = False) -> int | None:
    """A descriptor of ``path`` holding an exclusive flock (close it to release), or None when
    another holder has it: another process, or another descriptor of this one. OSError when
    ``path`` cannot be opened."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0) | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def try_lock_directory(path: str | Path, *, mode: int = 0o777) -> int | None:
    """``try_lock_exclusive`` on the directory ``path``, made first (with its parents, ``mode``
    less the umask) if it does not exist."""
    os.makedirs(path, mode=mode, exist_ok=True)
    return try_lock_exclusive(path, directory=True)
