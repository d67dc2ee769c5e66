"""Tests for tenzro_training.trainer.feedback_store: which saved error-feedback state a restart
finds, and what pruning leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from tenzro_training.trainer import TrainerProcessError
from tenzro_training.trainer.feedback_store import FeedbackStore


def test_newest_before_skips_the_round_being_retried_and_prune_keeps_the_newer(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "state")
    assert store.rounds() == [] and store.newest_before(5) is None and store.load(0) is None  # no directory yet
    for r in (0, 2, 3):
        store.save(r, b"state %d" % r)
    (store.dir / "feedback-round-x.safetensors").write_bytes(b"not ours")
    (store.dir / "feedback-round-\u00b2.safetensors").write_bytes(b"a superscript two is no round")
    assert store.rounds() == [0, 2, 3]
    assert store.newest_before(3) == (2, b"state 2")  # round 3's state is what a retry of 3 replaces
    assert store.newest_before(1) == (0, b"state 0") and store.newest_before(0) is None
    assert store.load(3) == b"state 3" and (store.path(3).stat().st_mode & 0o777) == 0o600
    store.prune(3)
    assert store.rounds() == [3]
    store.prune(None)
    assert store.rounds() == [] and (store.dir / "feedback-round-x.safetensors").exists()


def test_an_unwritable_directory_is_a_trainer_process_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(TrainerProcessError, match="cannot save the error-feedback state"):
        FeedbackStore(tmp_path / "file" / "state").save(0, b"x")


@pytest.mark.parametrize("what", ["fifo", "directory"])
def test_something_else_in_a_state_files_place_stops_the_trainer_with_one_line(tmp_path: Path, what: str) -> None:
    """A FIFO named like a state file blocked the restarted trainer until a writer came (trainer
    kill campaign): the file is opened as a regular file or refused at once, with its path."""
    import os

    store = FeedbackStore(tmp_path / "state")
    store.dir.mkdir()
    if what == "fifo":
        os.mkfifo(store.path(1))
    else:
        store.path(1).mkdir()
    with pytest.raises(TrainerProcessError, match=r"cannot read the error-feedback state .*feedback-round-1.*not a "
                                                  r"regular file \(fix or remove it, then restart\)"):
        store.newest_before(2)


def test_a_state_that_cannot_be_deleted_is_logged_and_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """In a read-only directory the prune at the run's end raised PermissionError out of the
    trainer as a traceback, and left the files (trainer kill campaign). Deleting old states is
    housekeeping: a warning per file, and the trainer goes on."""
    store = FeedbackStore(tmp_path / "state")
    for r in (0, 1, 2):
        store.save(r, b"state")
    real_unlink = Path.unlink

    def unlink(self: Path, missing_ok: bool = False) -> None:
        if self.name == "feedback-round-0.safetensors":
            raise PermissionError(13, "Permission denied")
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    with caplog.at_level("WARNING", logger="tenzro.trainer"):
        store.prune(None)
    assert store.rounds() == [0]
    assert [r.getMessage() for r in caplog.records] == [
        f"cannot delete the old error-feedback state {store.path(0)}: Permission denied"]


def test_rounds_ascend_as_numbers_and_a_large_state_is_read_back_whole(tmp_path: Path) -> None:
    import os

    store = FeedbackStore(tmp_path / "state")
    for r in (10, 9, 100, 2):
        store.save(r, b"state %d" % r)
    assert store.rounds() == [2, 9, 10, 100]  # not the directory's order, nor "10" < "9"
    assert store.newest_before(100) == (10, b"state 10")
    big = os.urandom(3 << 20)  # a model of ~800k parameters
    store.save(11, big)
    assert store.load(11) == big and store.newest_before(12) == (11, big)


def test_a_state_gone_between_listing_and_reading_is_skipped_quietly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A state listed by rounds() and deleted before it is read (another prune) is no state:
    the next older one is used, and pruning it is not worth a warning."""
    store = FeedbackStore(tmp_path / "state")
    store.save(1, b"state 1")
    monkeypatch.setattr(store, "rounds", lambda: [1, 2])  # round 2's file is already gone
    assert store.newest_before(3) == (1, b"state 1")
    with caplog.at_level("WARNING", logger="tenzro.trainer"):
        store.prune(None)
    assert caplog.records == [] and not store.path(1).exists()
