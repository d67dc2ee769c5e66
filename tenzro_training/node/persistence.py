"""How the node stores its values: byte encodings, and the one place a transition becomes batch
operations.

What this module is: encoders/decoders for every value the node service writes (run state,
receipt, ledger entries, submission records, equivocation evidence, round aggregation reports,
the genesis record), each strict on the way back in (a malformed stored value is a
:class:`~storage.interface.StorageError`: the store is damaged, not the caller wrong), and
:func:`compute_transition_ops`, which turns (run before/after, ledger before/after, extra
writes) into the list of :data:`~storage.interface.Operation` that one ``atomic_batch`` applies.
Key formats are :mod:`storage.schema`'s; model tensors are :mod:`.model_state`'s.

What it is NOT: I/O. Nothing here touches a store; the service applies the operations.

Encodings (docs/node.md "What is stored where"):

- amounts: uint256 big-endian, 32 bytes; an escrow is sponsor (20 bytes) || amount; the supply
  entry is minted || burned;
- run state, receipts, evidence, genesis record: UTF-8 JSON with sorted keys and no whitespace
  (``RunState.to_dict`` / ``TrainingReceipt.to_dict`` are lossless and deterministic, so equal
  values give equal bytes); a run's value has ``record_count`` in place of ``records``, each
  committed round record being its own value under ``schema.round_record_key`` (schema 4);
- a submission record: 0x01 || payload_hash (32) || signature (65); the payload bytes are stored
  once per (task, hash) under ``schema.payload_key`` (the key carries task, round, fragment and
  trainer, so the record plus its key is the whole signed SubmitOuterGradient);
- a finalize record: 0x01 || syncer (20) || signature (65), the syncer's FinalizeRound
  signature of one round under ``schema.finalize_signature_key``;
- round reports: a JSON array of the per-fragment ``AggregationReport.canonical_bytes()``
  (RFC 8785, so hashing an element's canonical form gives its FragmentOutcome.report_hash).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import rfc8785

from storage import schema
from storage.interface import BatchOp, Operation, StorageError
from tenzro_training.addresses import format_address, parse_address
from tenzro_training.auth import SubmitOuterGradient
from tenzro_training.errors import TenzroError
from tenzro_training.jsontext import is_json_depth_ok
from tenzro_training.ledger import Escrow, Ledger, compute_changes
from tenzro_training.receipt import TrainingReceipt
from tenzro_training.receipt_abi import compute_receipt_digest
from tenzro_training.receipt_abi import encode_receipt as encode_receipt_abi
from tenzro_training.receipt_check import SlashingAttestation
from tenzro_training.records import RoundRecord
from tenzro_training.run_state import TERMINAL_STATUSES, RunState, round_record_to_dict

__all__ = [
    "EVIDENCE_VERSION",
    "FinalizeRecord",
    "StoredRun",
    "SubmissionRecord",
    "compute_genesis_ops",
    "compute_report_canonical",
    "compute_transition_ops",
    "decode_chain_id",
    "decode_escrow",
    "decode_genesis_record",
    "encode_genesis_record",
    "decode_evidence",
    "decode_finalize_record",
    "decode_json",
    "decode_receipt",
    "decode_run",
    "decode_sealed_record",
    "decode_submission_record",
    "decode_supply",
    "decode_u256",
    "encode_chain_id",
    "encode_escrow",
    "encode_evidence",
    "encode_finalize_record",
    "encode_json",
    "encode_receipt",
    "encode_round_record",
    "encode_round_reports",
    "encode_run",
    "encode_sealed_record",
    "encode_submission_record",
    "encode_supply",
    "encode_u256",
    "decode_round_reports",
    "load_ledger_entries",
    "stored_run",
]

_U256: Final = 2**256
_SUBMISSION_RECORD_VERSION: Final = 1
_FINALIZE_RECORD_VERSION: Final = 1
_GENESIS_RECORD_VERSION: Final = 1
EVIDENCE_VERSION: Final = 2
"""Version 2 adds ``"slashed_in_round"``; version 1 records (written when only the current
round's conflicts were slashed) are still read, with it equal to the evidence round."""


# --- primitives ------------------------------------------------------------------------------


def encode_u256(value: int) -> bytes:
    """32-byte big-endian uint256."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _U256:
        raise ValueError(f"not a uint256: {value!r}")  # a bug upstream, never stored input
    return value.to_bytes(32, "big")


def decode_u256(raw: bytes, what: str = "amount") -> int:
    if not isinstance(raw, bytes) or len(raw) != 32:
        raise StorageError(f"stored {what} is malformed: expected 32 bytes")
    return int.from_bytes(raw, "big")


def encode_chain_id(chain_id: int) -> bytes:
    """The store's chain id record (``schema.NODE_CHAIN_ID_KEY``): a u256, as a config may name
    any chain id below 2^256."""
    return encode_u256(chain_id)


def decode_chain_id(raw: bytes) -> int:
    return decode_u256(raw, "chain id")


def encode_genesis_record(genesis: Sequence[tuple[bytes, int]]) -> bytes:
    """The store's genesis record (``schema.NODE_GENESIS_KEY``): the configured ``(address,
    balance)`` accounts the store was created with, in their configured order."""
    return encode_json(
        {
            "version": _GENESIS_RECORD_VERSION,
            "genesis": [{"address": format_address(a), "balance": str(b)} for a, b in genesis],
        }
    )


def decode_genesis_record(raw: bytes) -> list[tuple[bytes, int]]:
    """The ``(address, balance)`` pairs of a stored genesis record, sorted (what a configured
    genesis is compared with: its order does not matter)."""
    doc = decode_json(raw, "genesis record")
    try:
        return sorted((parse_address(entry["address"]), int(entry["balance"])) for entry in doc["genesis"])
    except (TypeError, KeyError, ValueError, OverflowError, TenzroError):  # OverflowError: int(1e400)
        raise StorageError("the stored genesis record is malformed") from None


def encode_escrow(escrow: Escrow) -> bytes:
    return escrow.sponsor + encode_u256(escrow.amount)


def decode_escrow(raw: bytes) -> Escrow:
    if not isinstance(raw, bytes) or len(raw) != 52:
        raise StorageError("stored escrow is malformed: expected 52 bytes")
    try:
        return Escrow(sponsor=raw[:20], amount=int.from_bytes(raw[20:], "big"))
    except TenzroError as exc:
        raise StorageError(f"stored escrow is malformed: {exc}") from None


def encode_supply(minted: int, burned: int) -> bytes:
    return encode_u256(minted) + encode_u256(burned)


def decode_supply(raw: bytes) -> tuple[int, int]:
    if not isinstance(raw, bytes) or len(raw) != 64:
        raise StorageError("stored supply counters are malformed: expected 64 bytes")
    return int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big")


def encode_json(value: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no whitespace, ASCII, no NaN."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text.encode("ascii")


def decode_json(raw: bytes, what: str) -> Any:
    """Parse stored JSON; StorageError if it is not (a damaged or foreign store)."""
    if not isinstance(raw, bytes) or not is_json_depth_ok(raw):
        raise StorageError(f"stored {what} is not valid JSON")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise StorageError(f"stored {what} is not valid JSON") from None


# --- runs and receipts -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredRun:
    """What the store holds of one run: its value in ``training_runs`` and how many of its round
    records are under their own :func:`~storage.schema.round_record_key` (0 for a version-3
    value, which holds them inline: its next transition writes them all)."""

    value: bytes
    record_count: int


def encode_run(run: RunState) -> bytes:
    """The run's value in ``training_runs``: ``RunState.to_dict()`` with ``records`` replaced by
    ``record_count`` (schema version 4; the records are :func:`encode_round_record` values)."""
    d = run.to_dict(records=False)
    d["record_count"] = len(run.records)
    return encode_json(d)


def encode_round_record(record: RoundRecord) -> bytes:
    """One committed round's value under ``schema.round_record_key``."""
    return encode_json(round_record_to_dict(record))


def read_run_status(raw: bytes) -> object:
    """The ``status`` a stored run value names, read without building the run (a node's start
    compares it with an ended run's summary); None when it names none."""
    d = decode_json(raw, "run state")
    return d.get("status") if isinstance(d, dict) else None


def decode_run(raw: bytes, records: Sequence[tuple[int, bytes]] = ()) -> RunState:
    """The run from its value and its stored round records ``(round, value)`` in key order. A
    version-4 value names its ``record_count``, and exactly rounds 0..count-1 must be given; a
    version-3 value holds ``records`` inline, and none may be given."""
    d = decode_json(raw, "run state")
    if isinstance(d, dict) and "record_count" in d:
        count = d.pop("record_count")
        if type(count) is not int or count < 0:
            raise StorageError(f"stored run state is malformed: record_count {count!r}")
        rounds = [r for r, _ in records]
        # The length first: list(range(count)) of a damaged count of 10**8 took 3.8 GiB (fuzzing probe).
        if len(rounds) != count or rounds != list(range(count)):
            shown = f"rounds {rounds[:3]}{'...' if len(rounds) > 3 else ''}" if rounds else "none"
            raise StorageError(f"stored run state names {count} round record(s), the store holds {shown}")
        d["records"] = [decode_json(value, f"round record {r}") for r, value in records]
        task_id = d["spec"].get("task_id") if isinstance(d.get("spec"), dict) else None
        for r, record in enumerate(d["records"]):
            # A record under another round's key (swapped values) would pass the load otherwise.
            if not isinstance(record, dict) or record.get("round") != r or record.get("task_id") != task_id:
                raise StorageError(f"stored round record {r} of {task_id!r} is not that round's record")
    elif records:
        raise StorageError("a version-3 run state holds its records inline, yet round records are stored for it")
    try:
        return RunState.from_dict(d)
    except TenzroError as exc:
        if isinstance(exc, StorageError):
            raise
        raise StorageError(f"stored run state is malformed: {exc}") from None


def stored_run(raw: bytes) -> StoredRun:
    """The :class:`StoredRun` of a value read from ``training_runs`` (a version-3 value: 0 records
    under their own keys)."""
    d = decode_json(raw, "run state")
    count = d.get("record_count", 0) if isinstance(d, dict) else 0
    return StoredRun(raw, count if type(count) is int else 0)


def encode_receipt(receipt: TrainingReceipt) -> bytes:
    return encode_json(receipt.to_dict())


def decode_receipt(raw: bytes) -> TrainingReceipt:
    try:
        return TrainingReceipt.from_dict(decode_json(raw, "receipt"))
    except TenzroError as exc:
        if isinstance(exc, StorageError):
            raise
        raise StorageError(f"stored receipt is malformed: {exc}") from None


# --- submissions and evidence ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SubmissionRecord:
    """What the node keeps of an accepted submission besides the payload bytes."""

    payload_hash: bytes
    """SHA-256 of the payload (the bytes are under ``schema.payload_key(task, payload_hash)``)."""
    signature: bytes
    """The trainer's 65-byte EIP-712 signature over SubmitOuterGradient(task, round, fragment,
    payload_hash): kept so an equivocation's first message can be shown later."""


def encode_sealed_record(receipt: TrainingReceipt) -> bytes:
    """The :func:`storage.schema.sealed_record_key` value of a sealed receipt: its run root
    (32 bytes) || the SHA-256 of ``receipt_abi.encode_receipt`` of it (32 bytes), the bytes
    getReceipt's ``abi`` answers and TRAINING_VERIFY accepts. EncodingError if it cannot be
    ABI-encoded."""
    return receipt.run_root + compute_receipt_digest(encode_receipt_abi(receipt))


def decode_sealed_record(raw: bytes) -> tuple[bytes, bytes]:
    """(run root, receipt digest) of a sealed record; StorageError if it is not 64 bytes."""
    if not isinstance(raw, bytes) or len(raw) != 64:
        raise StorageError(f"a sealed record must be 64 bytes, got {len(raw) if isinstance(raw, bytes) else raw!r}")
    return raw[:32], raw[32:]


_ENDED_SUMMARY_VERSION = 1
_ENDED_SUMMARY_FIELDS: dict[str, tuple[type, ...]] = {
    "task_id": (str,), "status": (str,), "round": (int,), "max_rounds": (int,), "spec_hash": (str,),
    "sponsor": (str,), "syncer": (str, type(None)), "posted_at_ms": (int,), "updated_at_ms": (int,),
    "next_deadline_ms": (int, type(None)),
}
_ENDED_STATUSES = frozenset(s.value for s in TERMINAL_STATUSES)


def encode_ended_summary(entry: dict[str, Any]) -> bytes:
    """The :func:`storage.schema.ended_summary_key` value: an ended run's listRuns entry."""
    return encode_json({"version": _ENDED_SUMMARY_VERSION, "entry": entry})


def decode_ended_summary(raw: bytes, task_id: str) -> dict[str, Any]:
    """The listRuns entry an ended run's summary holds; StorageError unless it is one, of an
    ended run named ``task_id`` (a damaged or foreign store)."""
    doc = decode_json(raw, f"summary of {task_id}")
    entry = doc.get("entry") if isinstance(doc, dict) and doc.get("version") == _ENDED_SUMMARY_VERSION else None
    if (
        not isinstance(entry, dict)
        or entry.keys() != _ENDED_SUMMARY_FIELDS.keys()
        or any(type(entry[k]) not in kinds for k, kinds in _ENDED_SUMMARY_FIELDS.items())
        or entry["task_id"] != task_id
        or entry["status"] not in _ENDED_STATUSES
    ):
        raise StorageError(f"the stored summary of the ended run {task_id} is damaged")
    return entry


def encode_submission_record(record: SubmissionRecord) -> bytes:
    if len(record.payload_hash) != 32 or len(record.signature) != 65:
        raise ValueError("submission record needs a 32-byte hash and a 65-byte signature")
    return bytes((_SUBMISSION_RECORD_VERSION,)) + record.payload_hash + record.signature


def decode_submission_record(raw: bytes) -> SubmissionRecord:
    if not isinstance(raw, bytes) or len(raw) != 98 or raw[0] != _SUBMISSION_RECORD_VERSION:
        raise StorageError("stored submission record is malformed")
    return SubmissionRecord(raw[1:33], raw[33:98])


@dataclass(frozen=True, slots=True)
class FinalizeRecord:
    """A finalized round's syncer signature, kept for the receipt's attestations (and the
    RoundFinalized gossip after a restart)."""

    syncer: bytes
    """The 20-byte address the signature recovers to (the round record's syncer)."""
    signature: bytes
    """The syncer's 65-byte EIP-712 signature over FinalizeRound(task, round)."""


def encode_finalize_record(record: FinalizeRecord) -> bytes:
    if len(record.syncer) != 20 or len(record.signature) != 65:
        raise ValueError("finalize record needs a 20-byte syncer and a 65-byte signature")
    return bytes((_FINALIZE_RECORD_VERSION,)) + record.syncer + record.signature


def decode_finalize_record(raw: bytes) -> FinalizeRecord:
    if not isinstance(raw, bytes) or len(raw) != 86 or raw[0] != _FINALIZE_RECORD_VERSION:
        raise StorageError("stored finalize record is malformed")
    return FinalizeRecord(raw[1:21], raw[21:86])


def encode_evidence(
    msg_first: SubmitOuterGradient,
    sig_first: bytes | None,
    msg_second: SubmitOuterGradient,
    sig_second: bytes,
    trainer: bytes,
    chain_id: int,
    slashed_in_round: int,
) -> bytes:
    """Equivocation evidence: both signed EIP-712 messages (full typed data, so anyone can
    re-derive the digests) with their signatures, the signer they recover to, and the round that
    was current when the slashing took effect (later than the messages' round when they name a
    finalized round). The first signature is None only if its submission record is missing (a
    damaged store)."""
    return encode_json(
        {
            "version": EVIDENCE_VERSION,
            "trainer": format_address(trainer),
            "chain_id": chain_id,
            "slashed_in_round": slashed_in_round,
            "messages": [
                {
                    "typed_data": msg_first.typed_data(chain_id),
                    "signature": None if sig_first is None else "0x" + sig_first.hex(),
                },
                {"typed_data": msg_second.typed_data(chain_id), "signature": "0x" + sig_second.hex()},
            ],
        }
    )


def decode_evidence(raw: bytes) -> SlashingAttestation:
    """The trainer, round, fragment, both payload hashes and signatures of stored evidence
    (:func:`encode_evidence`), for getReceipt's attestations; StorageError if malformed."""
    value = decode_json(raw, "equivocation evidence")
    try:
        if value["version"] not in (1, EVIDENCE_VERSION) or len(value["messages"]) != 2:
            raise ValueError("version or message count")
        messages = [m["typed_data"]["message"] for m in value["messages"]]
        signatures = [m["signature"] for m in value["messages"]]
        keys = {(m["taskId"], m["round"], m["fragment"]) for m in messages}
        if len(keys) != 1 or signatures[1] is None:
            raise ValueError("the two messages differ in task, round or fragment")
        round_ = messages[0]["round"]
        return SlashingAttestation.from_dict(
            {
                "trainer": value["trainer"],
                "round": round_,
                "fragment": messages[0]["fragment"],
                "payloads": [
                    {"payload_hash": m["payloadHash"], "signature": sig} for m, sig in zip(messages, signatures)
                ],
                "slashed_in_round": value["slashed_in_round"] if value["version"] >= 2 else round_,
            },
            "evidence",
        )
    except (KeyError, TypeError, ValueError, TenzroError):
        raise StorageError("stored equivocation evidence is malformed") from None


# --- aggregation reports ---------------------------------------------------------------------


def encode_round_reports(canonical_reports: Sequence[bytes]) -> bytes:
    """A JSON array of the per-fragment reports' RFC 8785 bytes (itself RFC 8785)."""
    return b"[" + b",".join(canonical_reports) + b"]"


def decode_round_reports(raw: bytes) -> list[dict[str, Any]]:
    """The per-fragment report documents, fragment order."""
    value = decode_json(raw, "round reports")
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise StorageError("stored round reports are malformed")
    return value


def compute_report_canonical(document: dict[str, Any]) -> bytes:
    """RFC 8785 bytes of one stored report document (SHA-256 of them is its report_hash)."""
    return rfc8785.dumps(document)


# --- the ledger ------------------------------------------------------------------------------


def load_ledger_entries(
    accounts: Iterable[tuple[bytes, bytes]], ledger_entries: Iterable[tuple[bytes, bytes]]
) -> Ledger | None:
    """Rebuild the Ledger from the raw ``accounts`` and ``ledger`` families (None if both are
    empty and no supply entry exists). StorageError if any entry is malformed or the entries
    violate the ledger's conservation invariant."""
    balances: dict[bytes, int] = {}
    for key, value in accounts:
        try:
            balances[schema.parse_account_key(key)] = decode_u256(value, "balance")
        except StorageError:
            raise
    escrows: dict[str, Escrow] = {}
    bonds: dict[tuple[str, bytes], int] = {}
    supply: tuple[int, int] | None = None
    for key, value in ledger_entries:
        if key == schema.LEDGER_SUPPLY_KEY:
            supply = decode_supply(value)
        elif key[:1] == b"e":
            escrows[schema.parse_escrow_key(key)] = decode_escrow(value)
        elif key[:1] == b"b":
            bonds[schema.parse_bond_key(key)] = decode_u256(value, "bond")
        else:
            raise StorageError(f"unknown key in the ledger family: {key[:40]!r}")
    if supply is None:
        if balances or escrows or bonds:
            raise StorageError("ledger entries are stored without supply counters: the store is damaged")
        return None
    try:
        return Ledger(accounts=balances, escrows=escrows, bonds=bonds, minted=supply[0], burned=supply[1])
    except TenzroError as exc:
        raise StorageError(f"stored ledger is inconsistent: {exc}") from None


def _ledger_ops(before: Ledger, after: Ledger) -> list[Operation]:
    changes = compute_changes(before, after)
    ops: list[Operation] = []
    for address, balance in changes.balances:
        key = schema.account_key(address)
        ops.append((BatchOp.DELETE, schema.CF_ACCOUNTS, key, None) if balance == 0 else
                   (BatchOp.PUT, schema.CF_ACCOUNTS, key, encode_u256(balance)))
    for task_id, escrow in changes.escrows:
        key = schema.escrow_key(task_id)
        ops.append((BatchOp.DELETE, schema.CF_LEDGER, key, None) if escrow is None else
                   (BatchOp.PUT, schema.CF_LEDGER, key, encode_escrow(escrow)))
    for (task_id, trainer), amount in changes.bonds:
        key = schema.bond_key(task_id, trainer)
        ops.append((BatchOp.DELETE, schema.CF_LEDGER, key, None) if amount is None else
                   (BatchOp.PUT, schema.CF_LEDGER, key, encode_u256(amount)))
    if (before.minted, before.burned) != (after.minted, after.burned):
        supply = encode_supply(after.minted, after.burned)
        ops.append((BatchOp.PUT, schema.CF_LEDGER, schema.LEDGER_SUPPLY_KEY, supply))
    return ops


def compute_genesis_ops(ledger: Ledger, record: bytes) -> list[Operation]:
    """The batch that creates a new store's ledger: every balance, the supply counters and the
    genesis flag (written together, so a crash never leaves balances without the flag)."""
    supply = (BatchOp.PUT, schema.CF_LEDGER, schema.LEDGER_SUPPLY_KEY, encode_supply(ledger.minted, ledger.burned))
    ops = [op for op in _ledger_ops(Ledger(), ledger) if op[1:3] != supply[1:3]]
    ops.append(supply)
    ops.append((BatchOp.PUT, schema.CF_META, schema.NODE_GENESIS_KEY, record))
    return ops


# --- one transition, one batch ---------------------------------------------------------------


def compute_transition_ops(
    stored: StoredRun | None,
    run: RunState,
    ledger_before: Ledger,
    ledger_after: Ledger,
    extra: Sequence[Operation] = (),
) -> tuple[list[Operation], StoredRun]:
    """Every write of one applied transition, in the order they go into ONE atomic batch: the
    run's value (only if its bytes changed), the round records committed since ``stored`` (each
    written once: a transition costs the same in round 600 as in round 1), the ledger entries
    that differ (balances in ``accounts``; escrows, bonds and supply in ``ledger``), then
    ``extra`` (submissions, payloads, evidence, model state, reports, receipt). Returns the
    operations and what the store then holds of the run. An unchanged run with no ledger change
    and no extra writes gives no operations: a harmless replay writes nothing."""
    encoded = encode_run(run)
    written = 0 if stored is None else stored.record_count
    if len(run.records) < written:
        raise ValueError(f"run {run.task_id} has {len(run.records)} records, the store {written}: records are never removed")
    ops: list[Operation] = []
    if stored is None or encoded != stored.value:
        ops.append((BatchOp.PUT, schema.CF_TRAINING_RUNS, schema.run_key(run.task_id), encoded))
    ops.extend(
        (BatchOp.PUT, schema.CF_META, schema.round_record_key(run.task_id, record.round), encode_round_record(record))
        for record in run.records[written:]
    )
    ops.extend(_ledger_ops(ledger_before, ledger_after))
    ops.extend(extra)
    return ops, StoredRun(encoded, len(run.records))
