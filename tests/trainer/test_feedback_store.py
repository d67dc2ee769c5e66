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
