"""The Ethereum-ABI form of a TrainingReceipt (ReceiptV1): what contracts and TRAINING_VERIFY read.

What this module is: the pinned receipt ABI of docs/receipt.md --

    receipt bytes = abi.encode(ReceiptV1), ONE top-level tuple:
    (uint16 version = 1, string taskId, bytes specCanonical, address sponsor, uint256 rewardPool,
     bytes32 runRoot, bytes32 finalModelHash, bytes[] roundRecords,
     (address trainer, uint256 weight, uint256 stake, string did, bool slashed)[] trainers,
     address[] syncers, uint64 sealedAt)

-- with :func:`encode_receipt`, the strict :func:`decode_receipt` (exactly the canonical bytes
:func:`encode_receipt` writes, nothing else) and :func:`verify_receipt_bytes`, the validity
predicate the precompile and the Solidity verifier implement (docs/receipt.md "Validity").

What it is NOT: it does not know which runs a chain has sealed (the precompile's ``sealed``
lookup does), it pays nobody (contracts/src/TenzroRewardEscrow.sol does) and it does no I/O.

VALID is not "the receipt the node sealed": the run root does not commit a trainer's ``slashed``
flag, stake or DID, nor ``sealedAt``, and the weight rule accepts ``slashed=false, weight=count``
as well as ``slashed=true, weight=0`` for any trainer. Whatever pays by a receipt must also bind
its exact bytes to the sealed one: :func:`compute_receipt_digest` is the digest the chain's sealed
record holds and TRAINING_VERIFY compares (docs/receipt.md "TRAINING_VERIFY precompile").

Design notes:
- ``trainers`` are written in canonical order (strictly ascending address bytes), whatever the
  order of the :class:`~tenzro_training.receipt.TrainingReceipt` (enrollment order); a decoded
  receipt therefore lists its trainers by address.
- ``weight`` is :attr:`ReceiptTrainer.reward_weight`: the trainer's accepted submissions, or 0
  when slashed. Decoding a slashed trainer (weight must be 0) restores its
  ``accepted_submissions`` from the transcript, the only place the ABI still carries it.
- The decoder walks the one canonical head/tail layout (every offset must point exactly where
  the encoder puts the next tail, every padding byte is zero, nothing trails), so the decoded
  value can never be larger than the input (no aliased offsets), and then re-encodes and compares
  byte for byte as a final guard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import hashlib

import eth_abi

from tenzro_training.errors import EncodingError, TenzroError
from tenzro_training.receipt import (
    RECEIPT_VERSION,
    ReceiptTrainer,
    TrainingReceipt,
    compute_accepted_counts,
    verify_receipt,
)
from tenzro_training.records import HASH_LENGTH, decode_round_record, encode_round_record
from tenzro_training.spec import TrainingTaskSpec

__all__ = [
    "RECEIPT_ABI_VERSION",
    "RECEIPT_ABI_TYPE",
    "TRAINER_ABI_TYPE",
    "MAX_RECEIPT_BYTES",
    "RECEIPT_DIGEST_LENGTH",
    "MAX_DID_BYTES",
    "compute_receipt_digest",
    "compute_receipt_size",
    "compute_receipt_size_bound",
    "compute_round_record_size",
    "encode_receipt",
    "decode_receipt",
    "read_receipt_task_id",
    "verify_receipt_bytes",
]

RECEIPT_ABI_VERSION = RECEIPT_VERSION
"""The ``version`` field (1): the ABI form moves with the receipt's JSON version."""

TRAINER_ABI_TYPE = "(address,uint256,uint256,string,bool)"
RECEIPT_ABI_TYPE = (
    f"(uint16,string,bytes,address,uint256,bytes32,bytes32,bytes[],{TRAINER_ABI_TYPE}[],address[],uint64)"
)
"""The one top-level tuple; ``abi.decode(data, (ReceiptV1))`` in Solidity."""

MAX_RECEIPT_BYTES = 4 * 1024 * 1024
"""Inputs longer than this are refused before any parsing (the precompile's cap too)."""

RECEIPT_DIGEST_LENGTH = 32
"""Bytes of :func:`compute_receipt_digest` (SHA-256)."""

_WORD = 32
_U256 = 2**256

MAX_DID_BYTES = len("did:tenzro:") + 32 + len(":") + 128
"""The longest DID the grammar allows (``did:tenzro:<kind 1-32>:<id 1-128>``, ASCII): 172."""


# --- sizes ---------------------------------------------------------------------------------------
#
# A receipt carries the whole transcript (SPEC), so its size grows with rounds x fragments x
# trainers, and a claim must carry it in one transaction: calldata, the precompile's per-word
# gas, and the contract's memory all grow with it. A node refuses at postTask a spec whose receipt
# could outgrow what it can still get paid for (node config ``max_receipt_bytes``), using the
# bound below; the exact formula is tested against the encoder.


def _padded(n: int) -> int:
    return -(-n // _WORD) * _WORD


def compute_round_record_size(task_id_bytes: int, accepted_per_fragment: list[int]) -> int:
    """Bytes of ``encode_round_record`` of a record with this task id length and these
    accepted-list lengths: 10 head words, the task id string, and the fragments array (one
    offset, five head words, and the ``accepted`` array per fragment)."""
    fragments = len(accepted_per_fragment)
    return (10 * _WORD + _WORD + _padded(task_id_bytes) + _WORD
            + fragments * (_WORD + 5 * _WORD + _WORD) + _WORD * sum(accepted_per_fragment))


def compute_receipt_size(
    task_id_bytes: int, spec_bytes: int, round_record_sizes: list[int], did_bytes: list[int], syncers: int
) -> int:
    """Bytes of ``encode_receipt`` of a receipt with these parts: the tuple's offset and 11 head
    words, then the tails of taskId, specCanonical, roundRecords (an offset and a length word
    per record), trainers (an offset, 5 head words and the DID string each) and syncers."""
    return (_WORD + 11 * _WORD
            + _WORD + _padded(task_id_bytes)
            + _WORD + _padded(spec_bytes)
            + _WORD + sum(2 * _WORD + _padded(n) for n in round_record_sizes)
            + _WORD + sum(_WORD + 5 * _WORD + _WORD + _padded(n) for n in did_bytes)
            + _WORD + _WORD * syncers)


def compute_receipt_size_bound(spec: TrainingTaskSpec) -> int:
    """The most bytes the receipt of a run of ``spec`` can take: every round accepts every
    trainer in every fragment, every trainer's DID is as long as the grammar allows, and every
    round has a different syncer. A receipt a node seals is never longer (tested): it lists at
    most ``trainer_count`` trainers because enrollment refuses more (RunFull). The validity rules
    do not require that, so a receipt nobody sealed can be longer; none is paid (TRAINING_VERIFY
    pays only the sealed bytes)."""
    if not isinstance(spec, TrainingTaskSpec):
        raise EncodingError(f"compute_receipt_size_bound needs a TrainingTaskSpec, got {type(spec).__name__}")
    task_id_bytes = len(spec.task_id.encode())
    m, rounds = spec.trainer_count, spec.max_rounds
    record = compute_round_record_size(task_id_bytes, [m] * spec.architecture.fragment_count)
    return (_WORD + 11 * _WORD
            + _WORD + _padded(task_id_bytes)
            + _WORD + _padded(len(spec.canonical_bytes()))
            + _WORD + rounds * (2 * _WORD + _padded(record))
            + _WORD + m * (7 * _WORD + _padded(MAX_DID_BYTES))
            + _WORD + _WORD * rounds)


# --- a strict decoder for the few ABI types the receipt uses ---------------------------------
#
# Types are small trees: ("uint", bits) | ("address",) | ("bool",) | ("bytes32",) | ("bytes",)
# | ("string",) | ("array", elem) | ("tuple", (components...)). Only "uint"/"address"/"bool"/
# "bytes32" and tuples of them are static; the receipt's tuples are all dynamic.


@dataclass(frozen=True, slots=True)
class _T:
    kind: str
    bits: int = 0
    elem: Any = None
    parts: tuple[Any, ...] = ()

    @property
    def dynamic(self) -> bool:
        if self.kind in ("bytes", "string", "array"):
            return True
        return self.kind == "tuple" and any(p.dynamic for p in self.parts)

    @property
    def head_size(self) -> int:
        """Bytes this type takes in its parent's head (an offset word when dynamic)."""
        if self.kind == "tuple" and not self.dynamic:
            return sum(p.head_size for p in self.parts)
        return _WORD


_ADDRESS = _T("address")
_TRAINER = _T("tuple", parts=(_ADDRESS, _T("uint", 256), _T("uint", 256), _T("string"), _T("bool")))
_RECEIPT = _T(
    "tuple",
    parts=(
        _T("uint", 16), _T("string"), _T("bytes"), _ADDRESS, _T("uint", 256), _T("bytes32"), _T("bytes32"),
        _T("array", elem=_T("bytes")), _T("array", elem=_TRAINER), _T("array", elem=_ADDRESS), _T("uint", 64),
    ),
)


class _Strict:
    """Reads one value at a time; ``tail`` offsets must equal the canonical positions."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def word(self, pos: int) -> bytes:
        if pos < 0 or pos + _WORD > len(self.data):
            raise EncodingError(f"truncated receipt: word at byte {pos} runs past the end ({len(self.data)} bytes)")
        return self.data[pos : pos + _WORD]

    def uint(self, pos: int, bits: int) -> int:
        value = int.from_bytes(self.word(pos), "big")
        if value >> bits:
            raise EncodingError(f"value at byte {pos} does not fit uint{bits}")
        return value

    def static(self, t: _T, pos: int) -> Any:
        if t.kind == "uint":
            return self.uint(pos, t.bits)
        if t.kind == "address":
            return self.uint(pos, 160).to_bytes(20, "big")
        if t.kind == "bool":
            value = self.uint(pos, 1)
            return value == 1
        if t.kind == "bytes32":
            return self.word(pos)
        raise EncodingError(f"internal: {t.kind} is not static")  # pragma: no cover

    def value(self, t: _T, pos: int) -> tuple[Any, int]:
        """Decode the value whose encoding starts at ``pos``; return it and the end position."""
        if not t.dynamic:
            if t.kind == "tuple":
                return self.sequence(list(t.parts), pos)
            return self.static(t, pos), pos + _WORD
        if t.kind in ("bytes", "string"):
            length = self.uint(pos, 256)
            start = pos + _WORD
            if length > len(self.data) - start:
                raise EncodingError(f"truncated receipt: {t.kind} of {length} bytes at byte {pos}")
            padded = -(-length // _WORD) * _WORD
            if start + padded > len(self.data):
                raise EncodingError(f"truncated receipt: padding of the {t.kind} at byte {pos}")
            if any(self.data[start + length : start + padded]):
                raise EncodingError(f"non-zero padding after the {t.kind} at byte {pos}")
            raw = self.data[start : start + length]
            if t.kind == "string":
                try:
                    return raw.decode("utf-8"), start + padded
                except UnicodeDecodeError:
                    raise EncodingError(f"string at byte {pos} is not UTF-8") from None
            return raw, start + padded
        if t.kind == "array":
            count = self.uint(pos, 256)
            base = pos + _WORD
            # Each element needs at least its head: refuse absurd counts before allocating.
            if count > (len(self.data) - base) // t.elem.head_size:
                raise EncodingError(f"truncated receipt: {count} array elements at byte {pos} cannot fit")
            return self.sequence([t.elem] * count, base)
        return self.sequence(list(t.parts), pos)  # a dynamic tuple

    def sequence(self, types: list[_T], base: int) -> tuple[Any, int]:
        """Head/tail encoding of ``types`` starting at ``base``; offsets are relative to ``base``."""
        head = sum(t.head_size for t in types)
        cursor = base + head
        if cursor > len(self.data):
            raise EncodingError(f"truncated receipt: a head of {head} bytes at byte {base}")
        out: list[Any] = []
        pos = base
        for t in types:
            if t.dynamic:
                offset = int.from_bytes(self.word(pos), "big")
                if offset != cursor - base:
                    raise EncodingError(
                        f"non-canonical offset at byte {pos}: {offset}, canonical is {cursor - base}"
                    )
                item, cursor = self.value(t, cursor)
                pos += _WORD
            else:
                item, pos = self.value(t, pos)
            out.append(item)
        return tuple(out), cursor


# --- encode / decode --------------------------------------------------------------------------


def _abi_value(r: TrainingReceipt) -> tuple[Any, ...]:
    trainers = sorted(r.trainers, key=lambda t: t.address)
    return (
        RECEIPT_ABI_VERSION,
        r.task_id,
        r.spec.canonical_bytes(),
        r.spec.sponsor_address_bytes,
        r.spec.reward_pool,
        r.run_root,
        r.final_model_hash,
        [encode_round_record(rec) for rec in r.transcript],
        [(t.address, t.reward_weight, t.stake, t.did, t.slashed) for t in trainers],
        list(r.syncers),
        r.sealed_at,
    )


def encode_receipt(r: TrainingReceipt) -> bytes:
    """``abi.encode(ReceiptV1)`` of a receipt (trainers in canonical address order).

    EncodingError if ``r`` is not a TrainingReceipt or two trainers share an address."""
    if not isinstance(r, TrainingReceipt):
        raise EncodingError(f"encode_receipt needs a TrainingReceipt, got {type(r).__name__}")
    addresses = [t.address for t in r.trainers]
    if len(set(addresses)) != len(addresses):
        raise EncodingError("receipt lists a trainer address twice")
    return eth_abi.encode([RECEIPT_ABI_TYPE], [_abi_value(r)])


def compute_receipt_digest(data: bytes) -> bytes:
    """SHA-256 of receipt bytes: what a chain's sealed record holds for the receipt it sealed.

    Since :func:`decode_receipt` accepts only the canonical encoding, one receipt has exactly one
    byte string, so equal digests mean equal receipts, every uncommitted field included. SHA-256
    because every other hash of the run root is SHA-256 too (one primitive for a native
    implementation; the EVM's 0x02 precompile for a contract)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise EncodingError(f"receipt must be bytes, got {type(data).__name__}")
    return hashlib.sha256(bytes(data)).digest()


def read_receipt_task_id(data: bytes) -> str:
    """The ``taskId`` of receipt bytes, read from the canonical head alone (the top-level offset,
    the taskId offset and the string): nothing else is decoded. EncodingError when those words
    are not where :func:`encode_receipt` puts them.

    Why: TRAINING_VERIFY looks the chain's sealed record up by task id and compares digests
    before it spends the validity rules (spec parsing, the Merkle root, re-encoding: tens of ms
    in Python for a large receipt) on bytes the chain never sealed. The decoder walks the same
    canonical layout, so whenever :func:`decode_receipt` succeeds its ``task_id`` is this one."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise EncodingError(f"receipt must be bytes, got {type(data).__name__}")
    reader = _Strict(bytes(data))
    if reader.uint(0, 256) != _WORD:
        raise EncodingError(f"non-canonical offset at byte 0: canonical is {_WORD}")
    head = sum(t.head_size for t in _RECEIPT.parts)
    if reader.uint(2 * _WORD, 256) != head:  # the tuple starts at _WORD; taskId is its 2nd field
        raise EncodingError(f"non-canonical offset at byte {2 * _WORD}: canonical is {head}")
    task_id, _ = reader.value(_RECEIPT.parts[1], _WORD + head)
    return str(task_id)


def decode_receipt(data: bytes) -> TrainingReceipt:
    """Decode receipt bytes; EncodingError unless ``data`` is exactly ``encode_receipt`` of the
    result. Checks the ABI's redundant fields against the spec (taskId, sponsor, rewardPool) and
    the trainers' canonical order; it does NOT check the run root or the weights against the
    transcript (that is :func:`verify_receipt_bytes`)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise EncodingError(f"receipt must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_RECEIPT_BYTES:
        raise EncodingError(f"receipt of {len(data)} bytes exceeds {MAX_RECEIPT_BYTES}")
    (value,), end = _Strict(data).sequence([_RECEIPT], 0)
    if end != len(data):
        raise EncodingError(f"{len(data) - end} unexpected bytes after the receipt")
    (version, task_id, spec_canonical, sponsor, reward_pool, run_root, final_model_hash,
     round_leaves, trainer_rows, syncers, sealed_at) = value
    if version != RECEIPT_ABI_VERSION:
        raise EncodingError(f"receipt version {version} is not supported (only {RECEIPT_ABI_VERSION})")
    try:
        spec = TrainingTaskSpec.from_json(spec_canonical, supported_only=False)
    except TenzroError as exc:
        raise EncodingError(f"specCanonical is not a valid spec: {exc}") from None
    if spec.canonical_bytes() != spec_canonical:
        raise EncodingError("specCanonical is not the spec's RFC 8785 canonical bytes")
    if task_id != spec.task_id:
        raise EncodingError(f"taskId {task_id!r} differs from the spec's {spec.task_id!r}")
    if sponsor != spec.sponsor_address_bytes:
        raise EncodingError("sponsor differs from the spec's sponsor_address")
    if reward_pool != spec.reward_pool:
        raise EncodingError(f"rewardPool {reward_pool} differs from the spec's {spec.reward_pool}")
    transcript = tuple(decode_round_record(leaf) for leaf in round_leaves)
    counts = compute_accepted_counts(transcript)
    trainers: list[ReceiptTrainer] = []
    for i, (address, weight, stake, did, slashed) in enumerate(trainer_rows):
        if i and not trainer_rows[i - 1][0] < address:
            raise EncodingError(f"trainers[{i}] is out of canonical (strictly ascending address) order")
        if slashed and weight != 0:
            raise EncodingError(f"trainers[{i}] is slashed but has weight {weight} (must be 0)")
        accepted = counts.get(address, 0) if slashed else weight
        if accepted >= 2**64:
            raise EncodingError(f"trainers[{i}] weight {weight} does not fit uint64")
        trainers.append(ReceiptTrainer(did, address, stake, accepted, slashed))
    receipt = TrainingReceipt(
        task_id=task_id,
        spec=spec,
        run_root=run_root,
        final_model_hash=final_model_hash,
        transcript=transcript,
        trainers=tuple(trainers),
        syncers=tuple(syncers),
        sealed_at=sealed_at,
    )
    if encode_receipt(receipt) != data:
        raise EncodingError("non-canonical receipt: re-encoding the decoded receipt gives other bytes")
    return receipt


def verify_receipt_bytes(claimed_root: bytes, data: bytes) -> TrainingReceipt | None:
    """The receipt if ``data`` is a VALID receipt (docs/receipt.md "Validity") whose run root is
    ``claimed_root``; otherwise None. Never raises (any failure, even an unexpected one, is None)."""
    try:
        if type(claimed_root) is not bytes or len(claimed_root) != HASH_LENGTH:
            return None
        receipt = decode_receipt(data)
        if receipt.run_root != claimed_root:
            return None
        # Root recomputation (spec leaf + round leaves + final record, rounds in order, task ids),
        # max_rounds, last model hash, weights against the accepted lists, syncers, and every
        # round keeping the spec's rule with K..M accepted per fragment.
        return receipt if verify_receipt(receipt) else None
    except Exception:  # noqa: BLE001 -- a predicate over untrusted bytes: every failure is "invalid"
        return None
