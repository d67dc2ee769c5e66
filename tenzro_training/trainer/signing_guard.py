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
- a (round, fragment) already signed may be signed again only for a payload hash it was signed
  for (an exact replay: the node answers it as a no-op);
- nothing new is signed for a round below the highest round signed: rounds never go back.

The record is one append-only text file, ``signed-payloads.log``, in the trainer's per-task,
per-account state directory (``PayloadStore.dir``, which one process holds at a time): a line
``<round> <fragment> <payload hash hex>`` per signature, written and fsynced BEFORE the
signature is made. A line cut short by a crash ends the file without its newline: it is
dropped when the file is read (its signature was never made); any other damage refuses to
start, since what was signed is then unknown. Records are never pruned: a task id reused by
another run on the same chain makes the old signatures valid evidence in the new run, so a
trainer that signed for a task id never signs new payloads for that task id again from the
same state directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tenzro_training.trainer import TrainerError

__all__ = ["RECORD_FILE", "SigningGuard", "SigningRefused"]

RECORD_FILE = "signed-payloads.log"
"""The guard's file in the state directory."""

_LINE = re.compile(r"(\d{1,20}) (\d{1,10}) ([0-9a-f]{64})")
_SAVED = re.compile(r"round-(\d{1,20})-fragment-(\d{1,10})(?:-[0-9a-f]{64})?\.payload")


class SigningRefused(TrainerError):
    """Signing this payload would be equivocation (or the record of what was signed is damaged)."""


class SigningGuard:
    """The signatures of one (task, account), as :data:`RECORD_FILE` in ``directory`` holds them."""

    def __init__(self, directory: Path) -> None:
        """Read the record (creating it, seeded from the payloads saved in ``directory`` by a
        trainer that predates the record: each was signed before it was published).
        SigningRefused when the record is damaged."""
        from tenzro_training.payload import compute_payload_hash

        self.path = directory / RECORD_FILE
        self._signed: dict[tuple[int, int], set[bytes]] = {}
        self._max_round = -1
        try:
            text = self.path.read_bytes().decode("ascii")
        except FileNotFoundError:
            seeds = []
            for file in sorted(directory.glob("round-*-fragment-*.payload")):
                m = _SAVED.fullmatch(file.name)
                if m is not None:
                    seeds.append((int(m[1]), int(m[2]), compute_payload_hash(file.read_bytes())))
            self._append(seeds, create=True)
            return
        except (OSError, UnicodeDecodeError) as exc:
            raise SigningRefused(f"cannot read the record of signed payloads {self.path}: {exc}") from None
        lines = text.split("\n")
        if lines[-1]:  # a line a crash cut short: its signature was never made; cut it off
            try:
                os.truncate(self.path, len(text) - len(lines[-1]))
            except OSError as exc:
                raise SigningRefused(f"cannot repair the record of signed payloads {self.path}: {exc}") from None
            lines[-1] = ""
        for number, line in enumerate(lines[:-1], 1):
            m = _LINE.fullmatch(line)
            if m is None:
                raise SigningRefused(f"the record of signed payloads {self.path} is damaged at line {number}: "
                                     "what this trainer signed is unknown, so it signs nothing (move the file "
                                     "aside only if no run with this task id will ever count these signatures)")
            self._note(int(m[1]), int(m[2]), bytes.fromhex(m[3]))

    def signed(self, round_: int, fragment: int) -> frozenset[bytes]:
        """The payload hashes signed for (round, fragment) (empty: none)."""
        return frozenset(self._signed.get((round_, fragment), ()))

    @property
    def highest_round(self) -> int:
        """The highest round anything was signed for (-1: none)."""
        return self._max_round

    def record(self, round_: int, fragment: int, payload_hash: bytes) -> None:
        """Allow signing ``payload_hash`` for (round, fragment): record it durably first, or
        raise SigningRefused (module docstring)."""
        held = self._signed.get((round_, fragment))
        if held:
            if payload_hash in held:
                return
            raise SigningRefused(
                f"refusing to sign a second payload for round {round_} fragment {fragment}: this trainer "
                f"already signed 0x{min(held).hex()} for it, and two are equivocation (the stake is burned). "
                "The node served this round again with another model or after it was finalized")
        if round_ < self._max_round:
            raise SigningRefused(
                f"refusing to sign a payload for round {round_}: this trainer already signed for round "
                f"{self._max_round}, and rounds never go back (the node's view went backwards)")
        self._append([(round_, fragment, payload_hash)])

    def _note(self, round_: int, fragment: int, payload_hash: bytes) -> None:
        self._signed.setdefault((round_, fragment), set()).add(payload_hash)
        self._max_round = max(self._max_round, round_)

    def _append(self, entries: list[tuple[int, int, bytes]], *, create: bool = False) -> None:
        data = "".join(f"{r} {f} {h.hex()}\n" for r, f, h in entries).encode("ascii")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                view = memoryview(data)
                while view:  # a crash leaves a prefix: at worst a cut last line
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            if create:  # the new file's name is durable too
                dir_fd = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
        except OSError as exc:
            raise SigningRefused(f"cannot record a signature in {self.path}: {exc.strerror or exc}") from None
        for r, f, h in entries:
            self._note(r, f, h)
