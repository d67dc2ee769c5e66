"""What this trainer has signed for a task, kept on disk, so that it never signs a second payload
for one (task, round, fragment): the trainer's slashing protection.

Why: two different payload hashes signed by one trainer for one (task, round, fragment) are
equivocation, and the whole stake is burned. A trainer only knows the round it is in from its
node's getRun, so a hostile or stale node, or anyone able to rewrite a plain-http answer, could
serve a round the trainer had already submitted with another starting model, or a round number
going backwards; the trainer trained the round again and signed new bytes, and the node then
held valid evidence against it (trainer probe, 2026-11-26). Validator clients keep the same kind
of record for the same reason (Ethereum's slashing-protection database).

The rules, checked before every signature:
- a (round, fragment) already signed may be signed again only for the payload hash it was signed
  for (an exact replay: the node answers it as a no-op);
- nothing is signed for a round below the record's floor: the rounds this account may have signed
  before the record existed (below).

There is no "highest round" rule: the record holds every signature made since it was created, so
the per-(round, fragment) rule alone prevents equivocation, and a high-water mark let ONE forged
round number (2^64 - 1) lock the trainer out of every later round of the task (review).

The record is one append-only text file, ``signed-payloads.log``, in the trainer's per-task,
per-account state directory (``PayloadStore.dir``, which one process holds at a time), written
and fsynced BEFORE each signature is made:

- ``<round> <fragment> <payload hash hex>``: a signature;
- ``floor <round>``: nothing new below this round (first line only, see below);
- ``blocked <round> <fragment>``: nothing at all for it (two different saved payloads were found
  for it when the record was created: at least one was signed, maybe both).

A line cut short by a crash ends the file without its newline: it is dropped, and cut off the
file, when the file is read (its signature was never made). Any other damage refuses to start,
since what was signed is then unknown.

Creating the record (atomically: temporary file, fsync, rename): a trainer that predates the
record, or a new or moved state directory, may already have signed for this task. Its saved
payloads were each signed before they were published, so each becomes a line (``blocked`` where
one (round, fragment) has several). When the account is already enrolled in the run, the caller
passes a ``floor``: the round after the one the run is in (that one may have been signed from
another state directory, with no save here: a record begun mid-round by a fresh state directory
let it be signed again, review), capped at the spec's rounds. The floor trusts the node's word
at that one moment, raised again if the answer the trainer enrolls from shows the account
enrolled (``raise_floor``). It is best effort: a node or a man in the middle that hides an earlier
enrollment from a NEW state directory in every answer can still get a second signature. Never
replace the state directory of an account enrolled in a run (and use https).

Records are never pruned: a task id reused by another run on the same chain makes the old
signatures valid evidence in the new run.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tenzro_training.trainer import TrainerError

__all__ = ["RECORD_FILE", "SigningGuard", "SigningRecordError", "SigningRefused"]

RECORD_FILE = "signed-payloads.log"
"""The guard's file in the state directory."""
MAX_RECORD_BYTES = 1 << 30
"""The largest record read back (~80 bytes per signed payload: millions of rounds x fragments);
the bound is for what else may be in its place."""

_SIGNED = re.compile(rb"(\d{1,20}) (\d{1,10}) ([0-9a-f]{64})")
_FLOOR = re.compile(rb"floor (\d{1,20})")
_BLOCKED = re.compile(rb"blocked (\d{1,20}) (\d{1,10})")
_SAVED = re.compile(r"round-(\d{1,20})-fragment-(\d{1,10})(?:-[0-9a-f]{64})?\.payload")


class SigningRefused(TrainerError):
    """Signing this payload would (or could) be equivocation: the trainer skips it."""


class SigningRecordError(TrainerError):
    """The record cannot be read, repaired or written: nothing can be signed safely, and the
    trainer stops (skipping every round instead trained each one for nothing; review)."""


class SigningGuard:
    """The signatures of one (task, account), as :data:`RECORD_FILE` in ``directory`` holds them."""

    def __init__(self, directory: Path, *, floor_if_new: int | None = None) -> None:
        """Read the record, or create it (module docstring) with ``floor_if_new`` as its floor
        (None: the account is not enrolled yet, nothing can have been signed beyond the saves).
        SigningRecordError when the record is damaged or cannot be written."""
        self.path = directory / RECORD_FILE
        self._signed: dict[tuple[int, int], bytes] = {}
        self._blocked: set[tuple[int, int]] = set()
        self._unusable = False
        self._created_here = False
        self._appended = False
        self.floor = 0
        """No new signature for a round below this one."""
        from storage.files import NotReadable, read_saved_file

        try:  # a regular file only: a FIFO in its place blocked the trainer (trainer kill campaign)
            raw = read_saved_file(self.path, MAX_RECORD_BYTES)
        except NotReadable as exc:
            raise SigningRecordError(f"cannot read the record of signed payloads {self.path}: {exc.reason}") from None
        if raw is None:
            self._create(directory, floor_if_new)
            return
        *lines, tail = raw.split(b"\n")
        if tail:  # a line a crash cut short (any bytes): its signature was never made; cut it off
            try:
                os.truncate(self.path, len(raw) - len(tail))
            except OSError as exc:
                raise SigningRecordError(f"cannot repair the record of signed payloads {self.path}: {exc}") from None
        for number, line in enumerate(lines, 1):
            if (m := _SIGNED.fullmatch(line)) is not None and (int(m[1]), int(m[2])) not in self._signed:
                self._signed[int(m[1]), int(m[2])] = bytes.fromhex(m[3].decode())
            elif (m := _BLOCKED.fullmatch(line)) is not None:
                self._blocked.add((int(m[1]), int(m[2])))
            elif number == 1 and (m := _FLOOR.fullmatch(line)) is not None:
                self.floor = int(m[1])
            else:
                raise SigningRecordError(
                    f"the record of signed payloads {self.path} is damaged at line {number}: what this "
                    "trainer signed is unknown, so it signs nothing (move the file aside only if no run "
                    "with this task id on this chain will ever count these signatures)")

    def signed(self, round_: int, fragment: int) -> bool:
        """Whether anything may have been signed for (round, fragment)."""
        key = (round_, fragment)
        return key in self._signed or key in self._blocked or round_ < self.floor

    def check(self, round_: int, fragment: int, payload_hash: bytes) -> bool:
        """SigningRefused unless signing ``payload_hash`` for (round, fragment) is allowed;
        True when it is an exact replay (already recorded). Writes nothing: a caller signing
        several fragments checks them all first, so a round is never half signed and then
        refused."""
        key = (round_, fragment)
        held = self._signed.get(key)
        if held == payload_hash:
            return True
        if held is not None or key in self._blocked:
            raise SigningRefused(
                f"refusing to sign a second payload for round {round_} fragment {fragment}: this trainer "
                "already signed another for it, and two are equivocation (the stake is burned)")
        if round_ < self.floor:
            raise SigningRefused(
                f"refusing to sign for round {round_}: this trainer's record of signatures began at round "
                f"{self.floor} (created while enrolled), and it may have signed earlier rounds before that")
        return False

    def record(self, round_: int, fragment: int, payload_hash: bytes) -> None:
        """Allow signing ``payload_hash`` for (round, fragment): record it durably first, or
        raise SigningRefused (module docstring)."""
        if self.check(round_, fragment, payload_hash):
            return  # an exact replay
        self._append(f"{round_} {fragment} {payload_hash.hex()}\n".encode("ascii"))
        self._signed[round_, fragment] = payload_hash

    def raise_floor(self, floor: int) -> None:
        """Raise the floor of a record this process created and has not signed into yet: a later
        answer showed the account enrolled before this process could have enrolled it (the first
        answer, which set the floor, may have been stale or forged). Only ever more restrictive."""
        if not self._created_here or self._appended or floor <= self.floor:
            return
        from storage.files import write_file_atomically

        lines = [f"floor {floor}"] + [f"{r} {f} {h.hex()}" for (r, f), h in sorted(self._signed.items())]
        lines += [f"blocked {r} {f}" for r, f in sorted(self._blocked)]
        try:
            write_file_atomically(self.path, "".join(line + "\n" for line in lines).encode("ascii"), mode=0o600)
        except OSError as exc:
            raise SigningRecordError(f"cannot raise the floor of {self.path}: {exc.strerror}") from None
        self.floor = floor

    def _create(self, directory: Path, floor: int | None) -> None:
        from storage.files import NotReadable, read_regular_file, write_file_atomically
        from tenzro_training.payload import compute_payload_hash
        from tenzro_training.trainer.payload_store import MAX_SAVED_PAYLOAD_BYTES

        saved: dict[tuple[int, int], set[bytes]] = {}
        try:
            for file in sorted(directory.glob("round-*-fragment-*.payload")):
                m = _SAVED.fullmatch(file.name)
                if m is not None:
                    data = read_regular_file(file, MAX_SAVED_PAYLOAD_BYTES)
                    saved.setdefault((int(m[1]), int(m[2])), set()).add(compute_payload_hash(data))
        except OSError as exc:
            raise SigningRecordError(f"cannot read the saved payloads in {directory}: {exc.strerror or exc}") from None
        except NotReadable as exc:
            raise SigningRecordError(f"cannot read the saved payloads in {directory}: {exc.reason}") from None
        lines = [] if floor is None else [f"floor {floor}"]
        for (r, f), hashes in sorted(saved.items()):
            if len(hashes) == 1:
                lines.append(f"{r} {f} {next(iter(hashes)).hex()}")
            else:
                lines.append(f"blocked {r} {f}")
        try:
            write_file_atomically(self.path, "".join(line + "\n" for line in lines).encode("ascii"), mode=0o600)
        except OSError as exc:
            raise SigningRecordError(f"cannot create the record of signed payloads {self.path}: {exc.strerror}") from None
        self.floor = floor or 0
        self._created_here = True
        for (r, f), hashes in saved.items():
            if len(hashes) == 1:
                self._signed[r, f] = next(iter(hashes))
            else:
                self._blocked.add((r, f))

    def _append(self, line: bytes) -> None:
        if self._unusable:
            raise SigningRecordError(f"the record of signed payloads {self.path} holds a partial line this "
                                     "process could not remove; restart the trainer (it cuts such a line off)")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            raise SigningRecordError(f"cannot record a signature in {self.path}: {exc.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            try:
                self._appended = True  # set first: a failed append also ends raise_floor's window
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError as exc:
                try:  # no partial line left for a later append to glue onto
                    os.ftruncate(fd, size)
                except OSError:
                    self._unusable = True
                raise SigningRecordError(f"cannot record a signature in {self.path}: {exc.strerror}") from None
        finally:
            os.close(fd)
