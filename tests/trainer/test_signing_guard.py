"""The trainer's slashing protection (``trainer.signing_guard``): what was signed is recorded
before it is signed, survives restarts and crashes, and a second payload for one (round,
fragment) or a round going back is refused. The hostile-node scenarios that made an honest
trainer equivocate are in tests/trainer/test_process.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tenzro_training.trainer.signing_guard import RECORD_FILE, SigningGuard, SigningRefused

H1, H2, H3 = (hashlib.sha256(b"%d" % i).digest() for i in range(3))


def test_a_replay_is_allowed_a_second_payload_is_not(tmp_path: Path) -> None:
    guard = SigningGuard(tmp_path)
    guard.record(3, 0, H1)
    guard.record(3, 0, H1)  # the same bytes again: a replay the node answers as a no-op
    guard.record(3, 1, H2)
    with pytest.raises(SigningRefused, match="second payload for round 3 fragment 0"):
        guard.record(3, 0, H3)
    assert guard.signed(3, 0) == {H1} and guard.signed(4, 0) == frozenset() and guard.highest_round == 3
    assert (tmp_path / RECORD_FILE).read_text() == f"3 0 {H1.hex()}\n3 1 {H2.hex()}\n"  # the refusal wrote nothing


def test_rounds_never_go_back(tmp_path: Path) -> None:
    guard = SigningGuard(tmp_path)
    guard.record(5, 0, H1)
    guard.record(5, 1, H2)  # the rest of the highest round is still fine
    with pytest.raises(SigningRefused, match="rounds never go back"):
        guard.record(4, 0, H3)
    guard.record(6, 0, H3)


def test_the_record_survives_a_restart_and_a_crash_mid_line(tmp_path: Path) -> None:
    SigningGuard(tmp_path).record(2, 0, H1)
    path = tmp_path / RECORD_FILE
    with path.open("a") as fh:
        fh.write(f"2 1 {H2.hex()[:20]}")  # killed while writing: this signature was never made
    guard = SigningGuard(tmp_path)
    assert guard.signed(2, 0) == {H1} and guard.signed(2, 1) == frozenset()
    guard.record(2, 1, H3)  # the cut line is gone: the next record is a line of its own
    assert path.read_text() == f"2 0 {H1.hex()}\n2 1 {H3.hex()}\n"
    again = SigningGuard(tmp_path)
    with pytest.raises(SigningRefused):
        again.record(2, 0, H2)


@pytest.mark.parametrize("damage", ["2 0 nothex\n", "\n", "x\n2 0 " + "ab" * 32 + "\n"])
def test_a_damaged_record_refuses_to_sign_anything(tmp_path: Path, damage: str) -> None:
    (tmp_path / RECORD_FILE).write_text(damage)
    with pytest.raises(SigningRefused, match="damaged at line 1"):
        SigningGuard(tmp_path)


def test_a_new_record_starts_from_the_payloads_saved_before_it(tmp_path: Path) -> None:
    """A trainer upgraded mid-round holds saved payloads (signed before they were published) but
    no record yet, some under the old name without the model hash: each counts as signed."""
    (tmp_path / f"round-4-fragment-0-{'ab' * 32}.payload").write_bytes(b"current name")
    (tmp_path / "round-4-fragment-1.payload").write_bytes(b"legacy name")
    (tmp_path / ".round-4-fragment-2.payload.x.tmp").write_bytes(b"an unfinished save: never signed")
    guard = SigningGuard(tmp_path)
    assert guard.signed(4, 0) == {hashlib.sha256(b"current name").digest()}
    assert guard.signed(4, 1) == {hashlib.sha256(b"legacy name").digest()}
    assert guard.signed(4, 2) == frozenset() and guard.highest_round == 4
    with pytest.raises(SigningRefused):
        guard.record(4, 1, H1)
    assert SigningGuard(tmp_path).signed(4, 1) == guard.signed(4, 1)  # written down, not re-seeded
