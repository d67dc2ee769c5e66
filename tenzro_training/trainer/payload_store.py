"""The payloads a trainer signed, kept on disk until their round is finalized, so that a restart
resubmits the same bytes instead of equivocating; and the lock that keeps two processes of one
account out of one state directory."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from tenzro_training.trainer import TrainerProcessError

__all__ = ["MAX_SAVED_PAYLOAD_BYTES", "PayloadStore"]

log = logging.getLogger("tenzro.trainer")

MAX_SAVED_PAYLOAD_BYTES = 1 << 32
"""The largest saved payload read back: far above any payload a node accepts (docs/node.md
``max_payload_bytes``, 64 MiB by default); the bound is for what else may be in its place."""


class PayloadStore:
    """This trainer's payloads, kept from before their first submission until their round is
    finalized, one file per (task, round, fragment, base model) under
    ``root/task-<task_id>/<address>/``.

    Why: a payload's bytes depend on the torch thread count and the GPU kernels, so a trainer
    restarted mid-round would NOT recompute the same bytes, and a second payload hash for the
    same (task, round, fragment) is equivocation (the stake is burned). A restarted trainer
    resubmits the saved bytes instead: an idempotent replay.

    Each file also names the model hash the payload was trained from (``base``): a run has one
    starting model per round, so a file of the same task id and round with another base is from
    another run (a task id reused on another node) and is never submitted. It was, and a
    gradient of another model was accepted and paid (trainer restart probe)."""

    def __init__(self, root: Path, task_id: str, address: str) -> None:
        self.dir = root / f"task-{task_id}" / address.lower()

    def path(self, round_: int, fragment: int, base: bytes) -> Path:
        return self.dir / f"round-{round_}-fragment-{fragment}-{base.hex()}.payload"

    def load(self, round_: int, fragments: int, base: bytes) -> list[bytes | None]:
        """The saved payload of each fragment of ``round_`` trained from ``base`` (None where
        none is saved). Saves of that round from another base are left alone: they were signed,
        and deleting them (as until 2026-11-26) let a node that served the round again with
        another model have the trainer sign a second payload (the SigningGuard now refuses)."""
        from storage.files import NotReadable, read_saved_file

        out: list[bytes | None] = []
        for f in range(fragments):
            path = self.path(round_, f, base)
            try:  # not read_bytes: a FIFO in its place blocked the trainer (trainer kill campaign)
                out.append(read_saved_file(path, MAX_SAVED_PAYLOAD_BYTES))
            except NotReadable as exc:
                raise TrainerProcessError(f"cannot read saved payload {path}: {exc.reason}") from None
        return out

    def save(self, round_: int, fragment: int, base: bytes, payload: bytes) -> None:
        from storage.files import write_file_atomically

        path = self.path(round_, fragment, base)
        try:
            write_file_atomically(path, payload, mode=0o600)
        except OSError as exc:
            raise TrainerProcessError(f"cannot save payload {path}: {exc.strerror}") from None

    def lock(self) -> int:
        """Claim this (task, account) directory for this process: a descriptor holding an
        exclusive flock on it (the caller closes it; the kernel does if the process dies).
        TrainerProcessError when another process holds it.

        Why: two processes of one account (a supervisor and a manual start, two copies of one
        unit file) train the same round, and their payloads differ (thread counts, kernels): two
        payload hashes for one (task, round, fragment) are equivocation, and the stake is
        burned. Only processes sharing this state directory can be stopped here; docs say so."""
        from tenzro_training.filelock import try_lock_directory

        try:
            fd = try_lock_directory(self.dir, mode=0o700)
        except OSError as exc:
            raise TrainerProcessError(f"cannot use state directory {self.dir}: {exc.strerror or exc}") from None
        if fd is None:
            raise TrainerProcessError(
                f"another trainer process of this account already runs this task from {self.dir} (nothing "
                f"staked): two would submit different payloads for one round, which is equivocation and "
                f"burns the stake"
            )
        try:
            # Every round writes here (payloads, error feedback, the signing record): a directory
            # it cannot write stops the trainer now, before it enrolls, not after it staked.
            probe, name = tempfile.mkstemp(dir=self.dir, prefix=".write-check-")
            os.close(probe)
            os.unlink(name)
        except OSError as exc:
            os.close(fd)
            raise TrainerProcessError(f"cannot write in state directory {self.dir}: {exc.strerror or exc} "
                                      "(nothing staked)") from None
        return fd

    def prune(self, before_round: int | None) -> None:
        """Delete the saved payloads of rounds < ``before_round`` (None: all of them), and the
        temporary files of saves this trainer's earlier process did not finish (killed)."""
        from storage.files import remove_temporary_files

        if not self.dir.is_dir():
            return
        try:
            remove_temporary_files(self.dir)
            for file in self.dir.glob("round-*-fragment-*.payload"):
                try:
                    round_ = int(file.name.split("-")[1])
                except ValueError:
                    continue
                if before_round is None or round_ < before_round:
                    file.unlink(missing_ok=True)
        except OSError as exc:
            # Housekeeping: nothing depends on the removal (a finalized round's payload is never
            # submitted again). It raised out of the trainer as a traceback when the directory
            # was read-only (trainer kill campaign); the next save says what is wrong.
            log.warning("cannot delete old saved payloads in %s: %s", self.dir, exc.strerror or exc)
