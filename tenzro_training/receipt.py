"""The TrainingReceipt: what a sealed run leaves behind, and how anyone re-checks its run root.

What this module is: the :class:`TrainingReceipt` value of SPEC.md "TrainingReceipt" (task_id,
the full spec, run_root, final_model_hash, the aggregation transcript, the trainers with their
DID, address, stake and accepted submissions, the syncers, sealed_at), :func:`compute_receipt`
that derives it from a Sealed :class:`~tenzro_training.run_state.RunState`, its JSON form
(``to_dict``/``from_dict``), and the verifiers:

- :func:`verify_receipt_root` recomputes the run root from the spec's canonical bytes, the
  transcript (one leaf per RoundRecord) and the final model record, exactly as the node did when
  sealing (``records.compute_run_leaves`` + ``merkle.run_root``);
- :func:`verify_receipt` additionally checks what the transcript determines: every trainer's
  ``accepted_submissions`` and the ``syncers`` list. A trainer's DID, stake and ``slashed`` flag
  (and ``sealed_at``) are NOT committed by the run root (SPEC.md fixes the leaves); they are
  vouched for by the chain's sealed-receipt record, whose digest of the receipt's ABI bytes the
  TRAINING_VERIFY precompile compares (docs/receipt.md). A receipt passing these checks is
  therefore not necessarily the one the node sealed.

ABI encoding: the Ethereum-ABI form the contracts and TRAINING_VERIFY decode (ReceiptV1) is
``receipt_abi.py`` (``encode_receipt``/``decode_receipt``/``verify_receipt_bytes``), specified in
docs/receipt.md; payee weights are :attr:`ReceiptTrainer.reward_weight` (0 for a slashed
trainer). The offline check of a receipt against its election and signatures is
``receipt_check.py``.

What it is NOT: the run lifecycle (``run.py``), storage, or the precompile. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tenzro_training.jsonfields import decode_address, decode_amount, decode_array, decode_hex, decode_int, decode_object
from tenzro_training.addresses import Address, format_address
from tenzro_training.errors import EncodingError, InvalidState, TenzroError
from tenzro_training.merkle import run_root as compute_run_root
from tenzro_training.records import HASH_LENGTH, FinalModelRecord, RoundRecord, compute_run_leaves
from tenzro_training.run_state import (
    DID_PATTERN,
    RunState,
    RunStatus,
    round_record_from_dict,
    round_record_to_dict,
)
from tenzro_training.spec import TrainingTaskSpec

__all__ = [
    "RECEIPT_VERSION",
    "ReceiptTrainer",
    "TrainingReceipt",
    "compute_receipt",
    "compute_accepted_counts",
    "compute_syncers",
    "verify_receipt_root",
    "verify_receipt",
]

RECEIPT_VERSION = 1
"""Written as ``"version"`` by ``TrainingReceipt.to_dict``."""

_U256 = 2**256


def _fail(path: str, reason: str) -> EncodingError:
    return EncodingError(f"receipt {path}: {reason}")


def _check_int(path: str, value: object, maximum: int) -> int:
    return decode_int(f"receipt {path}", value, maximum)


def _check_bytes(path: str, value: object, length: int) -> bytes:
    if type(value) is not bytes or len(value) != length:
        raise _fail(path, f"expected {length} bytes, got {value!r}")
    return value


def _unhex(path: str, value: object) -> bytes:
    return decode_hex(f"receipt {path}", value, HASH_LENGTH)


def _unaddress(path: str, value: object) -> Address:
    return decode_address(f"receipt {path}", value)


def _obj(path: str, value: object, keys: tuple[str, ...]) -> Mapping[str, Any]:
    return decode_object(f"receipt {path}", value, keys)


def _arr(path: str, value: object) -> list[Any]:
    return decode_array(f"receipt {path}", value)


@dataclass(frozen=True, slots=True)
class ReceiptTrainer:
    """One enrolled trainer as the receipt reports it."""

    did: str
    """Its DID (``did:tenzro:<kind>:<id>``)."""
    address: Address
    """Its 20-byte account (the payee)."""
    stake: int
    """attoTNZO it bonded (returned at sealing, or burned if slashed)."""
    accepted_submissions: int
    """How many of its outer gradients were aggregated, over all rounds and fragments (exactly
    the number of times its address appears in the transcript's ``accepted`` lists)."""
    slashed: bool
    """True if it equivocated: its stake was burned and it forfeits its reward."""

    def __post_init__(self) -> None:
        if not isinstance(self.did, str) or DID_PATTERN.fullmatch(self.did) is None:
            raise _fail("trainer.did", f"expected did:tenzro:<kind>:<id>, got {self.did!r}")
        _check_bytes("trainer.address", self.address, 20)
        _check_int("trainer.stake", self.stake, _U256 - 1)
        _check_int("trainer.accepted_submissions", self.accepted_submissions, 2**64 - 1)
        if not isinstance(self.slashed, bool):
            raise _fail("trainer.slashed", "expected a bool")

    @property
    def reward_weight(self) -> int:
        """The payout weight: accepted submissions, or 0 if slashed (what the node paid by)."""
        return 0 if self.slashed else self.accepted_submissions

    def to_dict(self) -> dict[str, Any]:
        return {
            "did": self.did,
            "address": format_address(self.address),
            "stake": str(self.stake),
            "accepted_submissions": self.accepted_submissions,
            "slashed": self.slashed,
        }

    @classmethod
    def from_dict(cls, obj: object, path: str = "trainer") -> ReceiptTrainer:
        d = _obj(path, obj, ("did", "address", "stake", "accepted_submissions", "slashed"))
        stake = decode_amount(f"{path}.stake", d["stake"])
        return cls(d["did"], _unaddress(f"{path}.address", d["address"]), stake, d["accepted_submissions"], d["slashed"])


@dataclass(frozen=True, slots=True)
class TrainingReceipt:
    """The receipt of a sealed run (SPEC.md "TrainingReceipt")."""

    task_id: str
    """The run's task_id (equals ``spec.task_id``)."""
    spec: TrainingTaskSpec
    """The full spec as posted (its canonical bytes are leaf 0)."""
    run_root: bytes
    """SHA-256(b"tenzro/train/run-root/v1" || MTH(leaves)), 32 bytes."""
    final_model_hash: bytes
    """Hash of the final global model (the FinalModelRecord's, and the last round record's)."""
    transcript: tuple[RoundRecord, ...]
    """Every round record, round 0 first: the aggregation transcript."""
    trainers: tuple[ReceiptTrainer, ...]
    """Every enrolled trainer, in enrollment order (position = shard index)."""
    syncers: tuple[Address, ...]
    """Every address that finalized a round, in order of first appearance in the transcript."""
    sealed_at: int
    """When the run was sealed, unix seconds (floor of the sealing instant in ms / 1000)."""

    def __post_init__(self) -> None:
        if not isinstance(self.spec, TrainingTaskSpec):
            raise _fail("spec", "expected a TrainingTaskSpec")
        if self.task_id != self.spec.task_id:
            raise _fail("task_id", f"{self.task_id!r} differs from the spec's {self.spec.task_id!r}")
        _check_bytes("run_root", self.run_root, HASH_LENGTH)
        _check_bytes("final_model_hash", self.final_model_hash, HASH_LENGTH)
        for name, cls in (("transcript", RoundRecord), ("trainers", ReceiptTrainer), ("syncers", bytes)):
            value = getattr(self, name)
            if isinstance(value, list):
                value = tuple(value)
                object.__setattr__(self, name, value)
            if not isinstance(value, tuple) or not all(isinstance(x, cls) for x in value):
                raise _fail(name, f"expected a tuple of {cls.__name__}")
        for i, address in enumerate(self.syncers):
            _check_bytes(f"syncers[{i}]", address, 20)
        _check_int("sealed_at", self.sealed_at, 2**64 - 1)

    @property
    def final_record(self) -> FinalModelRecord:
        """The last leaf: FinalModelRecord(task_id, len(transcript), final_model_hash)."""
        return FinalModelRecord(self.task_id, len(self.transcript), self.final_model_hash)

    def to_dict(self) -> dict[str, Any]:
        """JSON view (hashes 0x-hex, addresses EIP-55, stakes decimal strings); lossless."""
        return {
            "version": RECEIPT_VERSION,
            "task_id": self.task_id,
            "spec": self.spec.to_dict(),
            "run_root": "0x" + self.run_root.hex(),
            "final_model_hash": "0x" + self.final_model_hash.hex(),
            "transcript": [round_record_to_dict(r) for r in self.transcript],
            "trainers": [t.to_dict() for t in self.trainers],
            "syncers": [format_address(a) for a in self.syncers],
            "sealed_at": self.sealed_at,
        }

    @classmethod
    def from_dict(cls, obj: object) -> TrainingReceipt:
        """Parse ``to_dict()`` output strictly; EncodingError (a TenzroError) when malformed.

        It does not verify the root: call :func:`verify_receipt` for that.
        """
        keys = ("version", "task_id", "spec", "run_root", "final_model_hash", "transcript", "trainers", "syncers", "sealed_at")
        d = _obj("", obj, keys)
        if type(d["version"]) is not int or d["version"] != RECEIPT_VERSION:  # true == 1.0 == 1
            raise _fail("version", f"unsupported version {d['version']!r}")
        try:
            spec = TrainingTaskSpec.from_dict(d["spec"], supported_only=False)
        except TenzroError as exc:
            raise _fail("spec", str(exc)) from None
        return cls(
            task_id=d["task_id"],
            spec=spec,
            run_root=_unhex("run_root", d["run_root"]),
            final_model_hash=_unhex("final_model_hash", d["final_model_hash"]),
            transcript=tuple(
                round_record_from_dict(r, f"transcript[{i}]") for i, r in enumerate(_arr("transcript", d["transcript"]))
            ),
            trainers=tuple(
                ReceiptTrainer.from_dict(t, f"trainers[{i}]") for i, t in enumerate(_arr("trainers", d["trainers"]))
            ),
            syncers=tuple(_unaddress(f"syncers[{i}]", a) for i, a in enumerate(_arr("syncers", d["syncers"]))),
            sealed_at=d["sealed_at"],
        )


def compute_accepted_counts(transcript: tuple[RoundRecord, ...]) -> dict[Address, int]:
    """How often each address appears in the transcript's ``accepted`` lists (rounds x fragments)."""
    counts: dict[Address, int] = {}
    for record in transcript:
        for outcome in record.fragments:
            for address in outcome.accepted:
                counts[address] = counts.get(address, 0) + 1
    return counts


def compute_syncers(transcript: tuple[RoundRecord, ...]) -> tuple[Address, ...]:
    """Every round's syncer, deduplicated, in order of first appearance."""
    seen: dict[Address, None] = {}
    for record in transcript:
        seen.setdefault(record.syncer, None)
    return tuple(seen)


def compute_receipt(run: RunState) -> TrainingReceipt:
    """The receipt of a Sealed run (InvalidState for any other status)."""
    if not isinstance(run, RunState):
        raise EncodingError(f"compute_receipt needs a RunState, got {type(run).__name__}")
    if run.status is not RunStatus.SEALED or run.run_root is None or run.final_record is None or run.ended_at_ms is None:
        raise InvalidState(run.task_id, run.status.value, "issue a receipt")
    counts = compute_accepted_counts(run.records)
    trainers = tuple(
        ReceiptTrainer(t.did, t.address, t.stake, counts.get(t.address, 0), t.slashed) for t in run.trainers
    )
    return TrainingReceipt(
        task_id=run.task_id,
        spec=run.spec,
        run_root=run.run_root,
        final_model_hash=run.final_record.final_model_hash,
        transcript=run.records,
        trainers=trainers,
        syncers=compute_syncers(run.records),
        sealed_at=run.ended_at_ms // 1000,
    )


def verify_receipt_root(receipt: TrainingReceipt) -> bool:
    """True iff the run root recomputed from the spec's canonical bytes, the transcript and the
    final model record equals ``receipt.run_root``, the transcript has ``spec.max_rounds``
    rounds and the last round's model hash is the final model hash. Never raises."""
    try:
        if not isinstance(receipt, TrainingReceipt):
            return False
        if len(receipt.transcript) != receipt.spec.max_rounds:
            return False
        if receipt.transcript and receipt.transcript[-1].model_hash != receipt.final_model_hash:
            return False
        leaves = compute_run_leaves(receipt.spec.canonical_bytes(), receipt.transcript, receipt.final_record)
        return compute_run_root(leaves) == receipt.run_root
    except TenzroError:
        return False


def find_rule_violation(spec: TrainingTaskSpec, transcript: tuple[RoundRecord, ...]) -> str | None:
    """Why ``transcript`` breaks the run's own aggregation and quorum rules, or None: every
    round record must name ``spec.aggregation`` and have ``architecture.fragment_count``
    fragments, each with K..M (``quorum``..``trainer_count``) accepted trainers.

    Why a receipt check needs this: a round is finalized only once every fragment has K
    accepted submissions, so a record with fewer is a node that dropped honest inputs from the
    aggregate and from the payouts and committed the result, and a record with an extra
    fragment pays its accepted trainers for work that does not exist; the run root alone would
    vouch for either. The Solidity verifier checks the same (docs/receipt.md "Validity")."""
    fragments = spec.architecture.fragment_count
    for record in transcript:
        where = f"round record {record.round}"
        if record.rule != spec.aggregation:
            return f"{where} uses {record.rule.to_spec()}, the spec says {spec.aggregation.to_spec()}"
        if len(record.fragments) != fragments:
            return f"{where} has {len(record.fragments)} fragments, not {fragments}"
        for f, outcome in enumerate(record.fragments):
            n = len(outcome.accepted)
            if not spec.quorum <= n <= spec.trainer_count:
                return f"{where} fragment {f}: {n} accepted, quorum is {spec.quorum} of {spec.trainer_count}"
    return None


def verify_receipt(receipt: TrainingReceipt) -> bool:
    """:func:`verify_receipt_root` plus every field the transcript determines: each trainer's
    ``accepted_submissions``, no address listed twice, no accepted address missing from the
    trainers, and ``syncers``; and the transcript keeps the spec's rule and quorum
    (:func:`find_rule_violation`). Never raises."""
    if not verify_receipt_root(receipt):
        return False
    try:
        if find_rule_violation(receipt.spec, receipt.transcript) is not None:
            return False
    except TenzroError:
        return False
    counts = compute_accepted_counts(receipt.transcript)
    addresses = [t.address for t in receipt.trainers]
    if len(set(addresses)) != len(addresses) or not set(counts) <= set(addresses):
        return False
    if any(t.accepted_submissions != counts.get(t.address, 0) for t in receipt.trainers):
        return False
    return receipt.syncers == compute_syncers(receipt.transcript)
