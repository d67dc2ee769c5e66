"""Hot backups of a running node's store: a consistent copy taken without stopping the node.

What this module is: :func:`write_backup`, which writes a RocksDB checkpoint of the node's store
into a new directory ``backup-<UTC instant>/db`` under a backups root, whole or not at all. The
node runs it on its service thread when it gets SIGUSR1 (``node/main.py``), so it falls between
two service calls like any other, and a store written by a finished call is what it copies.

Why: the only supported copy was a cold one (stop the node, copy the data dir): a plain copy of
``db/`` while the node writes can catch a compaction's new files without their MANIFEST
(docs/node.md "Backups and restores"). A checkpoint is taken by the store's own opener.

What it is NOT: the final model files (``models/``: rebuilt from the store on request,
``NodeService.final_model_path``), the p2p key or dev accounts (an identity, not state), or a
retention policy (old backups are the operator's to delete).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from storage.files import fsync_directory
from storage.interface import KVStore, StorageError

__all__ = ["BACKUP_PREFIX", "PARTIAL_SUFFIX", "compute_backup_name", "write_backup"]

BACKUP_PREFIX = "backup-"
PARTIAL_SUFFIX = ".partial"
"""A backup being written; renamed to its final name once whole. One left behind is from a
backup that failed or a node that died mid-way: never a backup, safe to delete."""


def compute_backup_name(now_ms: int) -> str:
    """``backup-YYYYMMDDTHHMMSS.mmmZ`` (UTC): names sort by time."""
    seconds, millis = divmod(now_ms, 1000)
    return f"{BACKUP_PREFIX}{time.strftime('%Y%m%dT%H%M%S', time.gmtime(seconds))}.{millis:03d}Z"


def write_backup(store: KVStore, root: Path, now_ms: int) -> Path:
    """Checkpoint ``store`` into ``root/<compute_backup_name(now_ms)>/db`` and return that
    backup's directory, a data dir that ``tenzro audit --data-dir`` checks and ``tenzro node
    --data-dir`` starts from. It is written under a ``.partial`` name and renamed once whole
    (then the rename is made durable), so a backup directory is always complete. StorageError
    when the store cannot checkpoint (the in-memory store), the directory cannot be made or
    exists, or the checkpoint fails; nothing is left then."""
    checkpoint = getattr(store, "create_checkpoint", None)
    if checkpoint is None:
        raise StorageError("backups need the RocksDB store; this node keeps its state in memory")
    final = root / compute_backup_name(now_ms)
    partial = final.with_name(final.name + PARTIAL_SUFFIX)
    if final.exists():
        raise StorageError(f"backup {final} already exists")
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial.mkdir(mode=0o700)
    except OSError as exc:  # named by the path that failed: the root may be a file (backup probe)
        raise StorageError(f"cannot create backup directory {exc.filename or partial}: {exc.strerror or exc}") from None
    try:
        checkpoint(partial / "db")
        os.rename(partial, final)
        fsync_directory(root)
    except BaseException as exc:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(exc, OSError):
            raise StorageError(f"cannot write backup {final}: {exc.strerror or exc}") from None
        raise
    return final
