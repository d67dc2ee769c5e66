"""A node's final model files: ``data_dir/models/<task_id>.safetensors`` of each sealed run (a
SHELL helper of the node service: it writes files).

What this module is: :class:`ModelFiles`, which writes a sealed run's file once its sealing
batch committed, retries one that could not be written (a full disk) from the node's clock, and
at start restores what a crash left behind (a missing file, a half-written temporary one).

Why it is apart from the service's state: the file is derived from the store (the run's final
weights, which hash to its receipt's ``final_model_hash``), never the other way round, so a file
that cannot be written loses nothing and nothing the node commits waits on it; its failures are
logged and retried here instead of failing a call.

What it is NOT: the file's bytes, which the caller gives as ``export`` (the node service's
``export_final_model``; ``run_store.compute_final_model_file`` builds them, also offline for
``tenzro train export-model``), or thread-safe: the node service drives it from its one thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from storage import schema
from storage.files import remove_temporary_files, write_file_atomically
from storage.interface import StorageError

__all__ = ["MODEL_FILE_RETRY_MS", "ModelFiles"]

log = logging.getLogger("tenzro.node")

MODEL_FILE_RETRY_MS = 30_000
"""How often a sealed run's model file that could not be written is tried again."""

Export = Callable[[str], bytes]
"""A sealed run's final model file bytes, by task id (``NodeService.export_final_model``). Given
to each call rather than held, so this object keeps no reference back to the service."""


class ModelFiles:
    """The final model files under ``data_dir/models``; ``data_dir`` None is a node on an
    in-memory store, which has no files (:meth:`path` raises StorageError)."""

    def __init__(self, data_dir: Path | None) -> None:
        self._data_dir = data_dir
        # Sealed runs whose model file could not be written (tick retries them).
        self._pending: set[str] = set()
        self._retry_at_ms = 0

    def path(self, task_id: str) -> Path:
        if self._data_dir is None:
            raise StorageError("this node has no data directory (in-memory store)")
        schema.run_key(task_id)  # a valid task_id is a safe file name
        return self._data_dir / "models" / f"{task_id}.safetensors"

    def restore(self, sealed: Iterable[str], export: Export) -> None:
        """A sealed run's model file is written after its batch committed; a crash in between
        leaves it missing, so it is regenerated here from the stored final weights, and a crash
        during the write leaves a model-sized temporary file, removed here (this process holds
        the store, so no other node writes into its models directory). ``sealed``: the task ids
        of every sealed run the node holds."""
        if self._data_dir is None:
            return
        for path in remove_temporary_files(self._data_dir / "models"):
            log.warning("removed %s, left by a model file write that did not finish", path.name)
        for task_id in sorted(sealed):
            if not self.path(task_id).exists():
                try:
                    self.try_write(task_id, export)
                except StorageError as exc:
                    # An ended run is read back here, not at the summaries' read: a damaged one
                    # must not refuse the start ("Runs in memory"; soak probe: with its file gone
                    # it did), its calls answer StorageError and the audit lists it.
                    log.error("cannot rewrite the final model file of %s: %s; `tenzro audit` lists what it "
                              "finds", task_id, exc)

    def try_write(self, task_id: str, export: Export) -> None:
        """Write a sealed run's model file; when that fails (a full disk), say so once and leave
        it to :meth:`retry` (the node's tick) to try again, every :data:`MODEL_FILE_RETRY_MS`.
        The file is derived from the store, so nothing is lost meanwhile, but until 2026-11-25 a
        failure at the seal was retried only at the next start, and one at startup stopped the
        node with a traceback (storage fault probe)."""
        try:
            self._write(task_id, export)
        except OSError as exc:
            if task_id not in self._pending:
                log.error("cannot write the final model file of %s (%s); retrying every %d s", task_id,
                          exc.strerror or exc, MODEL_FILE_RETRY_MS // 1000)
            self._pending.add(task_id)
            return
        if task_id in self._pending:
            self._pending.discard(task_id)
            log.info("wrote the final model file of %s", task_id)

    def retry(self, now: int, export: Export) -> None:
        """Try the files that could not be written again, at most every :data:`MODEL_FILE_RETRY_MS`."""
        if not self._pending or now < self._retry_at_ms:
            return
        self._retry_at_ms = now + MODEL_FILE_RETRY_MS
        for task_id in sorted(self._pending):
            self.try_write(task_id, export)

    def _write(self, task_id: str, export: Export) -> None:
        """Write the final model file atomically: temporary file, fsync, rename, fsync dir."""
        write_file_atomically(self.path(task_id), export(task_id))
