"""A topk or q8 trainer's error-feedback state on disk, one file per round, so that a restarted
trainer continues with what it had not yet sent instead of starting from zero.

Why on disk: at a density of 1% a round sends 1% of each fragment; the residual holds the other
99% of the outer gradients computed so far, which a restart would throw away. The file is about
the size of a raw fp32 payload (4 bytes per parameter, plus the last round's sent values), which
is what a trainer of a raw task already saves every round (PayloadStore); a q8 trainer's is
twice that, its sent values being the whole fragment. A q8 residual holds only rounding, but
which way each value was rounded is what keeps the quantiser unbiased over rounds.

Which file a restart reads (``TrainerProcess.resume_feedback``): resubmitting round r's saved
payloads, the state round r left (saved before its payloads, so it exists whenever they do);
training round r afresh, the newest state of a round before r. Files of older rounds are deleted
once round r's payloads are in hand, never before: a crash between saving round r's state and
its payloads leaves round r-1's state for the retry.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tenzro_training.trainer import TrainerProcessError

__all__ = ["MAX_STATE_FILE_BYTES", "FeedbackStore"]

log = logging.getLogger("tenzro.trainer")

MAX_STATE_FILE_BYTES = 16 << 30
"""The largest state file read back (a model of ~4G parameters), as for checkpoints: the file is
read whole, and something else in its place (a device, a growing file) must not fill memory."""


class FeedbackStore:
    """``feedback-round-<r>.safetensors`` files (``ErrorFeedback.to_bytes``) under ``dir``, the
    (task, account) state directory the PayloadStore locks."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def path(self, round_: int) -> Path:
        return self.dir / f"feedback-round-{round_}.safetensors"

    def save(self, round_: int, data: bytes) -> None:
        from storage.files import write_file_atomically

        path = self.path(round_)
        try:
            write_file_atomically(path, data, mode=0o600)
        except OSError as exc:
            raise TrainerProcessError(f"cannot save the error-feedback state {path}: {exc.strerror}") from None

    def rounds(self) -> list[int]:
        """The rounds with a saved state, ascending."""
        out = []
        for file in self.dir.glob("feedback-round-*.safetensors") if self.dir.is_dir() else ():
            number = file.name[len("feedback-round-") : -len(".safetensors")]
            if number.isascii() and number.isdigit():
                out.append(int(number))
        return sorted(out)

    def load(self, round_: int) -> bytes | None:
        """The saved state of ``round_``, None if there is none. TrainerProcessError for one that
        cannot be read at all (permissions, a directory or FIFO in its place: a FIFO blocked the
        trainer until a writer came, trainer kill campaign): the operator's to fix, so it is
        said and the trainer stops, rather than dropping a state a chmod would bring back."""
        from storage.files import NotReadable, read_saved_file

        path = self.path(round_)
        try:
            return read_saved_file(path, MAX_STATE_FILE_BYTES)
        except NotReadable as exc:
            raise TrainerProcessError(f"cannot read the error-feedback state {path}: {exc.reason} (fix or "
                                      "remove it, then restart)") from None

    def newest_before(self, round_: int) -> tuple[int, bytes] | None:
        """The newest saved state of a round < ``round_``, with its round."""
        for saved in reversed([r for r in self.rounds() if r < round_]):
            data = self.load(saved)
            if data is not None:
                return saved, data
        return None

    def prune(self, before_round: int | None) -> None:
        """Delete the states of rounds < ``before_round`` (None: all of them). A file that cannot
        be deleted (a read-only directory) is logged and left: nothing depends on its removal,
        and it raised out of the trainer as a traceback (trainer kill campaign)."""
        for saved in self.rounds():
            if before_round is None or saved < before_round:
                try:
                    self.path(saved).unlink(missing_ok=True)
                except OSError as exc:
                    log.warning("cannot delete the old error-feedback state %s: %s", self.path(saved),
                                exc.strerror or exc)
