"""The typed values a run commits to, and their byte encodings (the leaves of the run root).

What this module is:
- the election's input values ``Candidate`` (a registered syncer candidate) and ``Ticket`` (its
  VRF proof over the election seed);
- the committed records ``FragmentOutcome``, ``RoundRecord`` and ``FinalModelRecord``;
- their Ethereum ABI encodings (so a Solidity contract can ``abi.decode`` a leaf), strict
  decoders that accept exactly the canonical bytes the encoders produce, and
  ``compute_run_leaves``, the ordered leaf list whose ``merkle.run_root`` commits a run.

What it is NOT: it computes no hashes of models or reports (those arrive as 32-byte values
from the fragment, aggregation and model code), it does not run elections or aggregations, and
it does no I/O. The receipt encoding lives elsewhere and may embed these leaves.

Leaf layout (docs/records.md has the byte-level specification)::

    RoundRecord leaf = abi.encode(uint8 kind=1, uint16 version=1, string task_id, uint64 round,
                                  address syncer, uint32 syncer_rank, uint8 rule_kind,
                                  uint32 rule_param,
                                  (bytes32, address[], uint32, uint32, bytes32)[] fragments,
                                  bytes32 model_hash)
    FinalModelRecord leaf = abi.encode(uint8 kind=2, uint16 version=1, string task_id,
                                       uint64 rounds, bytes32 final_model_hash)

Leaf 0 of a run is the spec's RFC 8785 canonical JSON, which starts with ``{`` (0x7b); every ABI
leaf starts with 31 zero bytes (the padded ``kind``), so no leaf of one family can be read as the
other.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import eth_abi

from tenzro_training.jsontext import is_json_depth_ok
from tenzro_training.addresses import ADDRESS_LENGTH, Address
from tenzro_training.errors import AggregationError, ElectionError, EncodingError
from tenzro_training.rules import AggregationRule, RuleKind

__all__ = [
    "HASH_LENGTH",
    "VRF_PUBLIC_KEY_LENGTH",
    "VRF_PROOF_LENGTH",
    "MAX_STAKE",
    "RECORD_VERSION",
    "RecordKind",
    "Candidate",
    "Ticket",
    "FragmentOutcome",
    "RoundRecord",
    "FinalModelRecord",
    "ROUND_RECORD_ABI_TYPES",
    "FINAL_MODEL_RECORD_ABI_TYPES",
    "is_valid_task_id",
    "encode_round_record",
    "decode_round_record",
    "encode_final_model_record",
    "decode_final_model_record",
    "compute_run_leaves",
]

HASH_LENGTH = 32
VRF_PUBLIC_KEY_LENGTH = 32
VRF_PROOF_LENGTH = 80
MAX_STAKE = 2**256 - 1
"""Stakes are uint256 attoTNZO amounts."""

RECORD_VERSION = 1
"""The only encoding version this module writes and reads."""

_UINT16_MAX = 2**16 - 1
_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1
_WORD = 32
# The same rule as the task spec: 1-128 ASCII chars, so its UTF-8 bytes are its chars.
_TASK_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_MAX_TASK_ID_LENGTH = 128

_FRAGMENT_ABI_TYPE = "(bytes32,address[],uint32,uint32,bytes32)[]"
ROUND_RECORD_ABI_TYPES: tuple[str, ...] = (
    "uint8", "uint16", "string", "uint64", "address", "uint32", "uint8", "uint32",
    _FRAGMENT_ABI_TYPE, "bytes32",
)
"""The ABI parameter list of a RoundRecord leaf (Solidity: ``abi.decode(leaf, (...))``)."""
FINAL_MODEL_RECORD_ABI_TYPES: tuple[str, ...] = ("uint8", "uint16", "string", "uint64", "bytes32")
"""The ABI parameter list of a FinalModelRecord leaf."""


class RecordKind(enum.IntEnum):
    """The first ABI word of a committed record: which record it is."""

    ROUND = 1
    FINAL_MODEL = 2


# --- field checks (each raises the error class its caller names) -----------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_uint(err: type[Exception], name: str, value: object, maximum: int, minimum: int = 0) -> None:
    if not _is_int(value):
        raise err(f"{name} must be an int, got {type(value).__name__}")
    if not minimum <= value <= maximum:  # type: ignore[operator]
        raise err(f"{name} must be in {minimum}..{maximum}, got {value}")


def _check_bytes(err: type[Exception], name: str, value: object, length: int) -> None:
    # Exactly ``bytes``: these values are dict keys and sort keys, so one type only.
    if type(value) is not bytes:
        raise err(f"{name} must be bytes, got {type(value).__name__}")
    if len(value) != length:
        raise err(f"{name} must be {length} bytes, got {len(value)}")


def is_valid_task_id(value: object) -> bool:
    """True for 1-128 characters of [A-Za-z0-9._-] (the TrainingTaskSpec rule)."""
    return isinstance(value, str) and _TASK_ID.fullmatch(value) is not None


def _check_task_id(err: type[Exception], value: object) -> None:
    if not is_valid_task_id(value):
        raise err(f"task_id must be 1-128 chars of [A-Za-z0-9._-], got {value!r}")


# --- election inputs ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    """A syncer candidate registered in the node configuration (election input)."""

    address: Address
    """The candidate's 20-byte account address; the run's syncer is identified by it."""
    vrf_public_key: bytes
    """The 32-byte ECVRF-EDWARDS25519-SHA512-TAI public key its tickets must verify under."""
    stake: int
    """Bonded stake in attoTNZO, 0..2^256-1; a zero stake is registered but never ranked."""

    def __post_init__(self) -> None:
        _check_bytes(ElectionError, "candidate address", self.address, ADDRESS_LENGTH)
        _check_bytes(ElectionError, "candidate vrf_public_key", self.vrf_public_key, VRF_PUBLIC_KEY_LENGTH)
        _check_uint(ElectionError, "candidate stake", self.stake, MAX_STAKE)


@dataclass(frozen=True, slots=True)
class Ticket:
    """A candidate's election ticket: its VRF proof over the election seed.

    Constructing one checks only lengths; whether the proof verifies is ``election``'s business.
    """

    address: Address
    """The 20-byte address of the candidate the ticket claims to be for."""
    vrf_public_key: bytes
    """The 32-byte VRF public key the proof is claimed under (must match the registration)."""
    proof: bytes
    """The 80-byte ECVRF proof (Gamma || c || s) of the election seed."""

    def __post_init__(self) -> None:
        _check_bytes(ElectionError, "ticket address", self.address, ADDRESS_LENGTH)
        _check_bytes(ElectionError, "ticket vrf_public_key", self.vrf_public_key, VRF_PUBLIC_KEY_LENGTH)
        _check_bytes(ElectionError, "ticket proof", self.proof, VRF_PROOF_LENGTH)


# --- committed records ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FragmentOutcome:
    """What one fragment's aggregation produced in one round."""

    aggregate_hash: bytes
    """SHA-256 (32 bytes) of the fragment's aggregate outer gradient, as the aggregation module hashes it."""
    accepted: tuple[Address, ...]
    """Addresses of the trainers whose outer gradients were aggregated, strictly ascending bytes
    (the canonical input order of every rule); at least one."""
    selected: int
    """For Krum: the canonical index (into ``accepted``) of the selected input; otherwise 0."""
    trimmed: int
    """For TrimmedMean: how many values were dropped from EACH end, floor(K * alpha_bps / 10000)
    with K = len(accepted); otherwise 0."""
    report_hash: bytes
    """SHA-256 (32 bytes) of the aggregation report's canonical bytes (aggregation module)."""

    def __post_init__(self) -> None:
        if isinstance(self.accepted, list):
            object.__setattr__(self, "accepted", tuple(self.accepted))
        _check_bytes(EncodingError, "aggregate_hash", self.aggregate_hash, HASH_LENGTH)
        _check_bytes(EncodingError, "report_hash", self.report_hash, HASH_LENGTH)
        _check_uint(EncodingError, "selected", self.selected, _UINT32_MAX)
        _check_uint(EncodingError, "trimmed", self.trimmed, _UINT32_MAX)
        if not isinstance(self.accepted, tuple):
            raise EncodingError(f"accepted must be a tuple of addresses, got {type(self.accepted).__name__}")
        if not self.accepted:
            raise EncodingError("accepted must name at least one trainer")
        for address in self.accepted:
            _check_bytes(EncodingError, "accepted address", address, ADDRESS_LENGTH)
        for a, b in zip(self.accepted, self.accepted[1:]):
            if not a < b:
                raise EncodingError(
                    f"accepted must be strictly ascending (canonical order): 0x{a.hex()} then 0x{b.hex()}"
                )


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """The commitment to one finalized round: one leaf of the run root."""

    task_id: str
    """The run's task_id (1-128 chars of [A-Za-z0-9._-])."""
    round: int
    """The round index r, 0-based (uint64)."""
    syncer: Address
    """The 20-byte address of the syncer that finalized the round."""
    syncer_rank: int
    """That syncer's election rank: 1 for the elected syncer, 2+ after failover (uint32)."""
    rule_kind: RuleKind
    """The aggregation rule's wire code (``rules.RuleKind``; a bare int is accepted and normalised)."""
    rule_param: int
    """alpha_bps for TrimmedMean, f for Krum, 0 otherwise (uint32)."""
    fragments: tuple[FragmentOutcome, ...]
    """One outcome per fragment, in fragment index order; at least one."""
    model_hash: bytes
    """SHA-256 (32 bytes) of the global model after this round's outer step."""

    def __post_init__(self) -> None:
        if isinstance(self.fragments, list):
            object.__setattr__(self, "fragments", tuple(self.fragments))
        _check_task_id(EncodingError, self.task_id)
        _check_uint(EncodingError, "round", self.round, _UINT64_MAX)
        _check_bytes(EncodingError, "syncer", self.syncer, ADDRESS_LENGTH)
        _check_uint(EncodingError, "syncer_rank", self.syncer_rank, _UINT32_MAX, minimum=1)
        _check_uint(EncodingError, "rule_kind", self.rule_kind, 255)
        _check_uint(EncodingError, "rule_param", self.rule_param, _UINT32_MAX)
        _check_bytes(EncodingError, "model_hash", self.model_hash, HASH_LENGTH)
        try:
            rule = AggregationRule(self.rule_kind, self.rule_param)
        except AggregationError as exc:
            raise EncodingError(f"rule_kind/rule_param: {exc}") from None
        object.__setattr__(self, "rule_kind", rule.kind)
        if not isinstance(self.fragments, tuple) or not self.fragments:
            raise EncodingError("fragments must be a non-empty tuple of FragmentOutcome")
        for index, outcome in enumerate(self.fragments):
            if not isinstance(outcome, FragmentOutcome):
                raise EncodingError(f"fragments[{index}] must be a FragmentOutcome, got {type(outcome).__name__}")
            _check_outcome_against_rule(index, outcome, rule)

    @property
    def rule(self) -> AggregationRule:
        """The aggregation rule as a ``rules.AggregationRule`` value."""
        return AggregationRule(self.rule_kind, self.rule_param)


def _check_outcome_against_rule(index: int, outcome: FragmentOutcome, rule: AggregationRule) -> None:
    """The per-fragment fields that the rule and K = len(accepted) determine must agree with them."""
    k = len(outcome.accepted)
    where = f"fragments[{index}]"
    try:
        rule.validate_for_quorum(k)
    except AggregationError as exc:
        raise EncodingError(f"{where}: {exc}") from None
    expected_trimmed = rule.trimmed_per_side(k)
    if outcome.trimmed != expected_trimmed:
        raise EncodingError(
            f"{where}: trimmed={outcome.trimmed} but {rule.kind.spec_name} over K={k} trims {expected_trimmed}"
        )
    if rule.kind is RuleKind.KRUM:
        if outcome.selected >= k:
            raise EncodingError(f"{where}: Krum selected index {outcome.selected} >= K={k}")
    elif outcome.selected != 0:
        raise EncodingError(f"{where}: selected must be 0 for {rule.kind.spec_name}, got {outcome.selected}")


@dataclass(frozen=True, slots=True)
class FinalModelRecord:
    """The commitment to the run's final model: the last leaf of a sealed run."""

    task_id: str
    """The run's task_id (1-128 chars of [A-Za-z0-9._-])."""
    rounds: int
    """How many rounds were finalized (uint64); equals the number of round records."""
    final_model_hash: bytes
    """SHA-256 (32 bytes) of the final global model."""

    def __post_init__(self) -> None:
        _check_task_id(EncodingError, self.task_id)
        _check_uint(EncodingError, "rounds", self.rounds, _UINT64_MAX)
        _check_bytes(EncodingError, "final_model_hash", self.final_model_hash, HASH_LENGTH)


# --- encoding ---------------------------------------------------------------------------------


def _require(value: object, cls: type, what: str) -> None:
    if not isinstance(value, cls):
        raise EncodingError(f"{what} must be a {cls.__name__}, got {type(value).__name__}")


def encode_round_record(record: RoundRecord) -> bytes:
    """The RoundRecord leaf: ``abi.encode`` of ROUND_RECORD_ABI_TYPES (canonical ABI bytes)."""
    _require(record, RoundRecord, "record")
    # Construction validated every field; rebuilding revalidates a value someone forced past
    # the frozen dataclass (object.__setattr__) before it is committed.
    record = RoundRecord(*(getattr(record, f) for f in RoundRecord.__dataclass_fields__))
    fragments = [
        (f.aggregate_hash, list(f.accepted), f.selected, f.trimmed, f.report_hash) for f in record.fragments
    ]
    return eth_abi.encode(
        ROUND_RECORD_ABI_TYPES,
        [
            int(RecordKind.ROUND), RECORD_VERSION, record.task_id, record.round, record.syncer,
            record.syncer_rank, int(record.rule_kind), record.rule_param, fragments, record.model_hash,
        ],
    )


def encode_final_model_record(record: FinalModelRecord) -> bytes:
    """The FinalModelRecord leaf: ``abi.encode`` of FINAL_MODEL_RECORD_ABI_TYPES."""
    _require(record, FinalModelRecord, "record")
    record = FinalModelRecord(record.task_id, record.rounds, record.final_model_hash)
    return eth_abi.encode(
        FINAL_MODEL_RECORD_ABI_TYPES,
        [int(RecordKind.FINAL_MODEL), RECORD_VERSION, record.task_id, record.rounds, record.final_model_hash],
    )


# --- strict decoding --------------------------------------------------------------------------
#
# The decoders walk the one canonical layout the encoder produces: every offset must point exactly
# where the encoder puts the next item, every padding byte must be zero and nothing may follow the
# last item. Two encodings of one record would give two leaves (two run roots) for the same facts,
# and offsets that alias one another would let a small input decode into a huge value, so the
# layout is checked here rather than left to a general ABI decoder. As a final guard the decoded
# record is re-encoded and must equal the input byte for byte.


class _Reader:
    """Bounds-checked 32-byte word reads from an ABI blob."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def word(self, pos: int, what: str) -> bytes:
        if pos + _WORD > len(self.data):
            raise EncodingError(f"truncated: {what} at byte {pos} runs past the end ({len(self.data)} bytes)")
        return self.data[pos : pos + _WORD]

    def uint(self, pos: int, bits: int, what: str) -> int:
        value = int.from_bytes(self.word(pos, what), "big")
        if value >> bits:
            raise EncodingError(f"{what} at byte {pos} does not fit uint{bits} (non-zero padding)")
        return value

    def offset(self, pos: int, expected: int, what: str) -> None:
        value = int.from_bytes(self.word(pos, what), "big")
        if value != expected:
            raise EncodingError(f"non-canonical {what} at byte {pos}: {value}, canonical is {expected}")

    def address(self, pos: int, what: str) -> bytes:
        w = self.word(pos, what)
        if any(w[: _WORD - ADDRESS_LENGTH]):
            raise EncodingError(f"{what} at byte {pos} has non-zero padding")
        return w[_WORD - ADDRESS_LENGTH :]

    def bytes32(self, pos: int, what: str) -> bytes:
        return self.word(pos, what)

    def task_id(self, pos: int) -> tuple[str, int]:
        """Read the ABI ``string`` at ``pos``; return it and the position after its padding."""
        length = self.uint(pos, 256, "task_id length")
        if length > _MAX_TASK_ID_LENGTH:
            raise EncodingError(f"task_id length {length} exceeds {_MAX_TASK_ID_LENGTH}")
        padded = -(-length // _WORD) * _WORD
        start = pos + _WORD
        if start + padded > len(self.data):
            raise EncodingError("truncated: task_id runs past the end")
        raw = self.data[start : start + length]
        if any(self.data[start + length : start + padded]):
            raise EncodingError("task_id has non-zero padding")
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            raise EncodingError("task_id is not ASCII") from None
        if not is_valid_task_id(text):
            raise EncodingError(f"task_id must be 1-128 chars of [A-Za-z0-9._-], got {text!r}")
        return text, start + padded


def _as_bytes(data: object) -> bytes:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise EncodingError(f"record encoding must be bytes, got {type(data).__name__}")


def _check_header(r: _Reader, kind: RecordKind) -> None:
    got = r.uint(0, 8, "kind")
    if got != kind:
        raise EncodingError(f"record kind {got}, expected {int(kind)} ({kind.name})")
    version = r.uint(_WORD, 16, "version")
    if version != RECORD_VERSION:
        raise EncodingError(f"record version {version} is not supported (only {RECORD_VERSION})")


def _check_round_trip(data: bytes, encoded: bytes) -> None:
    if encoded != data:
        raise EncodingError("non-canonical encoding: re-encoding the decoded record gives other bytes")


def decode_round_record(data: bytes) -> RoundRecord:
    """Decode a RoundRecord leaf; EncodingError unless ``data`` is exactly its canonical encoding."""
    data = _as_bytes(data)
    r = _Reader(data)
    _check_header(r, RecordKind.ROUND)
    head = 10 * _WORD
    r.offset(2 * _WORD, head, "task_id offset")
    round_ = r.uint(3 * _WORD, 64, "round")
    syncer = r.address(4 * _WORD, "syncer")
    syncer_rank = r.uint(5 * _WORD, 32, "syncer_rank")
    rule_kind = r.uint(6 * _WORD, 8, "rule_kind")
    rule_param = r.uint(7 * _WORD, 32, "rule_param")
    model_hash = r.bytes32(9 * _WORD, "model_hash")
    task_id, array_at = r.task_id(head)
    r.offset(8 * _WORD, array_at, "fragments offset")

    count = r.uint(array_at, 256, "fragment count")
    base = array_at + _WORD  # tuple offsets are relative to the word after the length
    # Each fragment needs at least its offset word and 7 words of its own (5 head words, the
    # address count and one address): reject absurd counts before looping over them.
    if count > (len(data) - base) // (8 * _WORD):
        raise EncodingError(f"truncated: {count} fragments cannot fit in {len(data)} bytes")
    cursor = count * _WORD
    fragments: list[FragmentOutcome] = []
    for i in range(count):
        r.offset(base + i * _WORD, cursor, f"fragments[{i}] offset")
        t = base + cursor
        aggregate_hash = r.bytes32(t, f"fragments[{i}].aggregate_hash")
        r.offset(t + _WORD, 5 * _WORD, f"fragments[{i}].accepted offset")
        selected = r.uint(t + 2 * _WORD, 32, f"fragments[{i}].selected")
        trimmed = r.uint(t + 3 * _WORD, 32, f"fragments[{i}].trimmed")
        report_hash = r.bytes32(t + 4 * _WORD, f"fragments[{i}].report_hash")
        n = r.uint(t + 5 * _WORD, 256, f"fragments[{i}].accepted length")
        first = t + 6 * _WORD
        if n > (len(data) - first) // _WORD:
            raise EncodingError(f"truncated: fragments[{i}] claims {n} accepted addresses")
        accepted = tuple(Address(r.address(first + j * _WORD, f"fragments[{i}].accepted[{j}]")) for j in range(n))
        fragments.append(FragmentOutcome(aggregate_hash, accepted, selected, trimmed, report_hash))
        cursor += (6 + n) * _WORD
    if base + cursor != len(data):
        raise EncodingError(f"{len(data) - (base + cursor)} unexpected bytes after the record")
    record = RoundRecord(
        task_id, round_, Address(syncer), syncer_rank, rule_kind, rule_param, tuple(fragments), model_hash
    )
    _check_round_trip(data, encode_round_record(record))
    return record


def decode_final_model_record(data: bytes) -> FinalModelRecord:
    """Decode a FinalModelRecord leaf; EncodingError unless ``data`` is exactly its canonical encoding."""
    data = _as_bytes(data)
    r = _Reader(data)
    _check_header(r, RecordKind.FINAL_MODEL)
    head = 5 * _WORD
    r.offset(2 * _WORD, head, "task_id offset")
    rounds = r.uint(3 * _WORD, 64, "rounds")
    final_model_hash = r.bytes32(4 * _WORD, "final_model_hash")
    task_id, end = r.task_id(head)
    if end != len(data):
        raise EncodingError(f"{len(data) - end} unexpected bytes after the record")
    record = FinalModelRecord(task_id, rounds, final_model_hash)
    _check_round_trip(data, encode_final_model_record(record))
    return record


# --- the run's leaves -------------------------------------------------------------------------


def _spec_task_id(spec_canonical: bytes) -> str:
    if not is_json_depth_ok(spec_canonical):
        raise EncodingError("spec_canonical nests too deeply")
    try:
        spec: Any = json.loads(spec_canonical.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise EncodingError("spec_canonical is not UTF-8 JSON") from None
    task_id = spec.get("task_id") if isinstance(spec, dict) else None
    if not is_valid_task_id(task_id):
        raise EncodingError("spec_canonical has no valid task_id")
    return str(task_id)


def compute_run_leaves(
    spec_canonical: bytes,
    rounds: Sequence[RoundRecord],
    final: FinalModelRecord | None,
) -> list[bytes]:
    """The ordered leaves of a run: spec canonical bytes, one leaf per round, then the final record.

    ``final`` is None while the run is still training (or if it failed before sealing). Raises
    EncodingError unless the parts belong together: ``spec_canonical`` is a JSON object (leaf 0
    must start with ``{``) whose task_id every record carries, ``rounds[i].round == i``, and
    ``final.rounds == len(rounds)``.
    """
    if not isinstance(spec_canonical, bytes) or not spec_canonical.startswith(b"{"):
        raise EncodingError("spec_canonical must be the spec's canonical JSON bytes (starting with '{')")
    task_id = _spec_task_id(spec_canonical)
    if isinstance(rounds, (bytes, str)) or not isinstance(rounds, Sequence):
        raise EncodingError("rounds must be a sequence of RoundRecord")
    leaves = [spec_canonical]
    for i, record in enumerate(rounds):
        _require(record, RoundRecord, f"rounds[{i}]")
        if record.task_id != task_id:
            raise EncodingError(f"rounds[{i}] is for task {record.task_id!r}, the spec is {task_id!r}")
        if record.round != i:
            raise EncodingError(f"rounds[{i}] has round {record.round}: rounds must be 0, 1, 2, ... in order")
        leaves.append(encode_round_record(record))
    if final is not None:
        _require(final, FinalModelRecord, "final")
        if final.task_id != task_id:
            raise EncodingError(f"final record is for task {final.task_id!r}, the spec is {task_id!r}")
        if final.rounds != len(rounds):
            raise EncodingError(f"final record says {final.rounds} rounds, {len(rounds)} round records given")
        leaves.append(encode_final_model_record(final))
    return leaves
