"""The trainer's slashing protection (``trainer.signing_guard``): what was signed is recorded
before it is signed, survives restarts and crashes, and a second payload for one (round,
fragment), or a round the record cannot vouch for, is refused. The hostile-node scenarios that
made an honest trainer equivocate are in tests/trainer/test_process.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tenzro_training.trainer.signing_guard import RECORD_FILE, SigningGuard, SigningRecordError, SigningRefused

H1, H2, H3 = (hashlib.sha256(b"%d" % i).digest() for i in range(3))


def test_a_replay_is_allowed_a_second_payload_is_not(tmp_path: Path) -> None:
    guard = SigningGuard(tmp_path)
    guard.record(3, 0, H1)
    guard.record(3, 0, H1)  # the same bytes again: a replay the node answers as a no-op
    guard.record(3, 1, H2)
    with pytest.raises(SigningRefused, match="second payload for round 3 fragment 0"):
        guard.record(3, 0, H3)
    assert guard.signed(3, 0) and not guard.signed(4, 0)
    assert (tmp_path / RECORD_FILE).read_text() == f"3 0 {H1.hex()}\n3 1 {H2.hex()}\n"  # the refusal wrote nothing


def test_one_forged_high_round_does_not_lock_out_later_rounds(tmp_path: Path) -> None:
    """Review (stop 20): a "rounds never go back" high-water mark let one forged round number
    (2^64 - 1) refuse every honest round of the task for good. The record is complete from its
    creation, so (round, fragment) alone decides."""
    guard = SigningGuard(tmp_path)
    guard.record(2**64 - 1, 0, H1)
    guard.record(5, 0, H2)
    assert SigningGuard(tmp_path).signed(5, 0)


def test_a_record_begun_mid_run_refuses_the_rounds_before_it(tmp_path: Path) -> None:
    """Review (stop 20): created while the account is enrolled (an upgrade, a new --state-dir),
    the record cannot know what was signed before: rounds below the run's round then are out."""
    guard = SigningGuard(tmp_path, floor_if_new=7)
    assert guard.signed(6, 0) and not guard.signed(7, 0)
    with pytest.raises(SigningRefused, match="record of signatures began at round 7"):
        guard.record(6, 0, H1)
    guard.record(7, 0, H1)
    again = SigningGuard(tmp_path, floor_if_new=99)  # an existing record keeps its own floor
    assert again.floor == 7 and again.signed(7, 0) and not again.signed(8, 0)


def test_the_record_survives_a_restart_and_a_crash_mid_line(tmp_path: Path) -> None:
    SigningGuard(tmp_path).record(2, 0, H1)
    path = tmp_path / RECORD_FILE
    with path.open("ab") as fh:
        fh.write(b"2 1 " + H2.hex()[:20].encode() + b"\xff\xfe")  # killed mid-write (stale bytes too)
    guard = SigningGuard(tmp_path)
    assert guard.signed(2, 0) and not guard.signed(2, 1)
    guard.record(2, 1, H3)  # the cut line is gone: the next record is a line of its own
    assert path.read_text() == f"2 0 {H1.hex()}\n2 1 {H3.hex()}\n"
    with pytest.raises(SigningRefused):
        SigningGuard(tmp_path).record(2, 0, H2)


@pytest.mark.parametrize("damage", ["2 0 nothex\n", "\n", "x\n2 0 " + "ab" * 32 + "\n", "2 0 x\n", "blocked 1\n"])
def test_a_damaged_record_refuses_to_sign_anything(tmp_path: Path, damage: str) -> None:
    (tmp_path / RECORD_FILE).write_text(damage)
    with pytest.raises(SigningRecordError, match="damaged at line 1"):
        SigningGuard(tmp_path)


def test_a_floor_after_the_first_line_is_damage(tmp_path: Path) -> None:
    (tmp_path / RECORD_FILE).write_text(f"2 0 {H1.hex()}\nfloor 0\n")
    with pytest.raises(SigningRecordError, match="damaged at line 2"):
        SigningGuard(tmp_path)


def test_a_new_record_starts_from_the_payloads_saved_before_it(tmp_path: Path) -> None:
    """A trainer upgraded mid-round holds saved payloads (signed before they were published) but
    no record yet, some under the old name without the model hash: each counts as signed, and a
    (round, fragment) with two different saves is blocked outright."""
    (tmp_path / f"round-4-fragment-0-{'ab' * 32}.payload").write_bytes(b"current name")
    (tmp_path / "round-4-fragment-1.payload").write_bytes(b"legacy name")
    (tmp_path / f"round-4-fragment-2-{'ab' * 32}.payload").write_bytes(b"from model ab")
    (tmp_path / f"round-4-fragment-2-{'cd' * 32}.payload").write_bytes(b"from model cd")
    (tmp_path / ".round-4-fragment-3.payload.x.tmp").write_bytes(b"an unfinished save: never signed")
    guard = SigningGuard(tmp_path, floor_if_new=4)
    guard.record(4, 0, hashlib.sha256(b"current name").digest())  # a replay of the saved bytes
    with pytest.raises(SigningRefused):
        guard.record(4, 1, H1)
    for saved in (b"from model ab", b"from model cd"):
        with pytest.raises(SigningRefused):
            guard.record(4, 2, hashlib.sha256(saved).digest())
    assert not guard.signed(4, 3)
    text = (tmp_path / RECORD_FILE).read_text()
    assert text.startswith("floor 4\n") and "blocked 4 2\n" in text
    assert SigningGuard(tmp_path).signed(4, 2)  # written down, not seeded again


@pytest.mark.parametrize("where", ["record", "saved payload"])
def test_a_fifo_in_the_state_directory_is_refused_not_waited_on(tmp_path: Path, where: str) -> None:
    """A FIFO named like the record or a saved payload blocked the trainer's start until a
    writer came (trainer kill campaign): read as regular files only, refused at once."""
    import os

    os.mkfifo(tmp_path / (RECORD_FILE if where == "record" else f"round-4-fragment-0-{'ab' * 32}.payload"))
    with pytest.raises(SigningRecordError, match="not a regular file"):
        SigningGuard(tmp_path)


def test_seeding_that_cannot_read_a_save_refuses_cleanly(tmp_path: Path) -> None:
    (tmp_path / f"round-4-fragment-0-{'ab' * 32}.payload").mkdir()  # not a file
    with pytest.raises(SigningRecordError, match="cannot read the saved payloads"):
        SigningGuard(tmp_path)
    assert not (tmp_path / RECORD_FILE).exists()


def test_a_record_that_cannot_be_written_stops_rather_than_skips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review (stop 20): an I/O failure raised the refusal the trainer skips a round on, so it
    trained every round and signed none, forever. It is a SigningRecordError, which stops it;
    a failed append is cut back, and when even that fails the guard refuses every later append."""
    import os

    guard = SigningGuard(tmp_path)
    guard.record(1, 0, H1)
    path = tmp_path / RECORD_FILE
    real_write = os.write

    def short_then_full(fd: int, data: object) -> int:
        real_write(fd, bytes(data)[:5])  # type: ignore[call-overload]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", short_then_full)
    with pytest.raises(SigningRecordError, match="No space left"):
        guard.record(1, 1, H2)
    monkeypatch.setattr(os, "write", real_write)
    assert path.read_text() == f"1 0 {H1.hex()}\n"  # the partial line was cut back
    assert not issubclass(SigningRecordError, SigningRefused)
    monkeypatch.setattr(os, "write", short_then_full)
    monkeypatch.setattr(os, "ftruncate", lambda fd, size: (_ for _ in ()).throw(OSError(5, "EIO")))
    with pytest.raises(SigningRecordError):
        guard.record(1, 1, H2)
    monkeypatch.setattr(os, "write", real_write)
    with pytest.raises(SigningRecordError, match="partial line"):
        guard.record(1, 1, H2)
    assert SigningGuard(tmp_path).signed(1, 0)  # the next start cuts the partial line off
    assert not SigningGuard(tmp_path).signed(1, 1)


def test_round_zero_can_be_signed_in_a_record_without_a_floor(tmp_path: Path) -> None:
    """A record created with no floor (the account not enrolled yet) vouches for every round,
    round 0 included, also once it is read back after a restart."""
    guard = SigningGuard(tmp_path)
    assert guard.floor == 0 and not guard.signed(0, 0)
    assert guard.check(0, 0, H1) is False  # allowed, and not a replay
    guard.record(0, 0, H1)
    again = SigningGuard(tmp_path)
    assert again.floor == 0 and not again.signed(0, 1)
    again.record(0, 1, H2)
    assert again.check(0, 0, H1) is True
    assert (tmp_path / RECORD_FILE).read_text() == f"0 0 {H1.hex()}\n0 1 {H2.hex()}\n"


def test_a_record_read_back_keys_each_signature_by_its_round_and_fragment(tmp_path: Path) -> None:
    """Lines whose round equals another line's fragment (or the reverse) are different
    signatures; the same (round, fragment) on two lines is damage."""
    lines = [f"0 0 {H1.hex()}", f"5 0 {H2.hex()}", f"1 1 {H1.hex()}", f"1 0 {H3.hex()}", f"0 5 {H3.hex()}"]
    (tmp_path / RECORD_FILE).write_text("".join(line + "\n" for line in lines))
    guard = SigningGuard(tmp_path)
    for r, f, h in [(0, 0, H1), (5, 0, H2), (1, 1, H1), (1, 0, H3), (0, 5, H3)]:
        assert guard.check(r, f, h) is True
    assert not guard.signed(5, 5) and not guard.signed(0, 1)
    (tmp_path / RECORD_FILE).write_text(f"2 0 {H1.hex()}\n2 0 {H1.hex()}\n")
    with pytest.raises(SigningRecordError, match="damaged at line 2"):
        SigningGuard(tmp_path)


def test_a_record_that_cannot_be_read_or_repaired_refuses_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    (tmp_path / RECORD_FILE).mkdir()  # not a file: unreadable, and not to be replaced
    with pytest.raises(SigningRecordError, match="cannot read the record"):
        SigningGuard(tmp_path)
    (tmp_path / RECORD_FILE).rmdir()
    (tmp_path / RECORD_FILE).write_bytes(f"2 0 {H1.hex()}\n2 1 ab".encode())  # a line cut short

    def fail(*args: object) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(os, "truncate", fail)
    with pytest.raises(SigningRecordError, match="cannot repair the record"):
        SigningGuard(tmp_path)


def test_a_record_that_cannot_be_created_refuses_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    def fail(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(SigningRecordError, match="cannot create the record"):
        SigningGuard(tmp_path, floor_if_new=3)
    assert not (tmp_path / RECORD_FILE).exists()


def test_a_record_file_removed_under_the_guard_refuses_the_next_signature(tmp_path: Path) -> None:
    guard = SigningGuard(tmp_path)
    (tmp_path / RECORD_FILE).unlink()
    with pytest.raises(SigningRecordError, match="cannot record a signature"):
        guard.record(1, 0, H1)
    assert not (tmp_path / RECORD_FILE).exists()  # not recreated empty behind the guard's back


def test_the_record_file_is_private(tmp_path: Path) -> None:
    import stat

    guard = SigningGuard(tmp_path)
    assert stat.S_IMODE((tmp_path / RECORD_FILE).stat().st_mode) == 0o600
    guard.raise_floor(5)  # rewritten: still private
    assert stat.S_IMODE((tmp_path / RECORD_FILE).stat().st_mode) == 0o600


def test_a_single_saved_payload_stays_a_replayable_signature_after_a_restart(tmp_path: Path) -> None:
    saved = b"saved before the record"
    (tmp_path / f"round-2-fragment-0-{'ab' * 32}.payload").write_bytes(saved)
    digest = hashlib.sha256(saved).digest()
    SigningGuard(tmp_path)
    assert (tmp_path / RECORD_FILE).read_text() == f"2 0 {digest.hex()}\n"
    again = SigningGuard(tmp_path)
    assert again.check(2, 0, digest) is True
    with pytest.raises(SigningRefused):
        again.record(2, 0, H1)


def test_raise_floor_only_rewrites_a_fresh_record_upwards(tmp_path: Path) -> None:
    """raise_floor (a later answer showed the account enrolled): the floor line is rewritten
    first, every signature and block is kept; a lower or equal floor, a record this process did
    not create, or one it already signed into is left as it is."""
    (tmp_path / "round-1-fragment-0.payload").write_bytes(b"one save")
    (tmp_path / f"round-1-fragment-1-{'ab' * 32}.payload").write_bytes(b"save a")
    (tmp_path / f"round-1-fragment-1-{'cd' * 32}.payload").write_bytes(b"save b")
    one = hashlib.sha256(b"one save").digest()
    path = tmp_path / RECORD_FILE
    guard = SigningGuard(tmp_path)
    created = path.read_text()
    assert created == f"1 0 {one.hex()}\nblocked 1 1\n"
    guard.raise_floor(0)  # not above the floor (0): nothing written, not even "floor 0"
    assert path.read_text() == created and guard.floor == 0
    guard.raise_floor(6)
    assert guard.floor == 6 and path.read_text() == f"floor 6\n1 0 {one.hex()}\nblocked 1 1\n"
    guard.raise_floor(6)
    guard.raise_floor(4)
    assert guard.floor == 6 and path.read_text().startswith("floor 6\n")
    with pytest.raises(SigningRefused, match="began at round 6"):
        guard.record(5, 0, H1)
    reread = SigningGuard(tmp_path)
    assert reread.floor == 6 and reread.signed(1, 0) and reread.signed(1, 1) and not reread.signed(6, 0)
    reread.raise_floor(9)  # not created by this guard: its floor is the file's
    assert reread.floor == 6 and path.read_text().startswith("floor 6\n")
    guard.record(7, 0, H1)
    guard.raise_floor(9)  # signed into already: the window is closed
    assert guard.floor == 6 and path.read_text().startswith("floor 6\n")


def test_a_floor_that_cannot_be_raised_refuses_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    guard = SigningGuard(tmp_path, floor_if_new=2)

    def fail(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(SigningRecordError, match="cannot raise the floor"):
        guard.raise_floor(5)
    assert guard.floor == 2  # not raised in memory either: the file still says 2
    monkeypatch.undo()
    assert SigningGuard(tmp_path).floor == 2
