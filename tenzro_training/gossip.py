"""Gossip messages of the two Tenzro Train topics: typed schemas, wire encoding, validation, reassembly.

What it is: the pure rules of the gossip data plane (SPEC.md "Gossip").

- Typed, versioned messages (frozen dataclasses) and their byte encoding: one type tag byte, one
  version byte, then a fixed binary body (big-endian integers, length-prefixed strings and data).
  The encoding is canonical: :func:`decode_message` re-encodes what it read and rejects any other
  byte string, so one message has exactly one encoding (needed for the dedup cache and evidence).
- ``validate_*_gossip`` functions in the consensus-specs style: each raises :class:`GossipReject`
  (invalid: drop it, never relay it, penalise whoever sent it) or :class:`GossipIgnore` (not useful
  now: duplicate, stale, about a run we do not know; drop it silently). Every check sits under a
  ``# [REJECT]`` / ``# [IGNORE]`` comment. The run view (:class:`GossipContext`) and the dedup
  cache (:class:`SeenCache`) are explicit arguments.
- Chunking of large byte strings (outer-gradient payloads, new global weights) into canonical
  chunks of at most :data:`MAX_CHUNK_BYTES`, and :class:`ChunkAssembler`, a bounded reassembly
  buffer that hands back the whole byte string only once every chunk arrived and its SHA-256 matches.

What it is NOT: no networking (``tenzro_training.p2p.host`` owns libp2p), no storage, no decision
about what a node does with a valid message (the node service and the trainer decide). Decoding the
reassembled weights into tensors and checking them against ``model_hash`` is the caller's job
(``global_model``), because it needs the model layout. Pure core: no I/O imports.

Authentication (Tenzro-level, on top of libp2p's per-message peer signature):

- PayloadChunk carries the trainer's EIP-712 ``SubmitOuterGradient{taskId, round, fragment,
  payloadHash}`` signature: the same signature the node stores with the submission.
- RoundFinalizedMsg carries the syncer's EIP-712 ``FinalizeRound{taskId, round}`` signature. It
  does not cover the weights: their size must be the run's model size exactly, and the receiver
  hashes them to ``model_hash`` before use.
- ModelRequest (version 2) carries the requester's EIP-712 ``RequestModel{taskId, requester,
  round, nonce}`` signature, so nobody can make a node broadcast a model in a trainer's name.
- ElectionTicketMsg is self-authenticating: a VRF proof under the candidate's registered key.
- ModelChunk and RunSealedMsg are bound to hashes the receiver already holds in its run view
  (the committed model hash, the sealed run root); RunSealedMsg about a run not sealed locally is
  ignored, never relayed.
- SyncerStatus is advisory and carries no Tenzro signature (signing it with FinalizeRound would
  leak a finalize authorisation early). It is only accepted from the claimed current syncer's name
  and never changes state.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeVar, Union

from eth_account import Account

from tenzro_training.auth import (
    DEFAULT_CHAIN_ID,
    AuthError,
    FinalizeRound,
    RequestModel,
    SubmitOuterGradient,
    sign_message,
    validate_signer,
)
from tenzro_training.election import validate_ticket
from tenzro_training.errors import ElectionError, GossipIgnore, GossipReject
from tenzro_training.fragments import FragmentLayout
from tenzro_training.payload import compute_max_payload_bytes
from tenzro_training.records import Candidate, Ticket, is_valid_task_id
from tenzro_training.run_state import RunState, RunStatus, get_current_syncer, get_trainer

__all__ = [
    "TOPIC_TRAINING",
    "TOPIC_SYNCER",
    "GOSSIP_VERSION",
    "MESSAGE_VERSIONS",
    "MAX_CHUNK_BYTES",
    "MAX_MESSAGE_BYTES",
    "SYNCER_STATUSES",
    "MessageKind",
    "PayloadChunk",
    "ElectionTicketMsg",
    "SyncerStatus",
    "RoundFinalizedMsg",
    "ModelRequest",
    "ModelChunk",
    "RunSealedMsg",
    "GossipMessage",
    "ChunkedMessage",
    "GossipContext",
    "StreamSizes",
    "SeenCache",
    "SYNCER_STATUS_INTERVAL_MS",
    "WeightsDigests",
    "check_status_interval",
    "note_status",
    "ChunkAssembler",
    "encode_message",
    "decode_message",
    "compute_chunks",
    "compute_chunk_count",
    "compute_payload_chunks",
    "compute_round_finalized_chunks",
    "compute_model_chunks",
    "compute_model_request",
    "check_signature_cached",
    "compute_stream_key",
    "compute_stream_sizes",
    "compute_chunk_dedup_key",
    "get_topic",
    "validate_chunk_geometry",
    "validate_payload_chunk_gossip",
    "validate_election_ticket_gossip",
    "validate_syncer_status_gossip",
    "validate_round_finalized_gossip",
    "validate_model_request_gossip",
    "validate_model_chunk_gossip",
    "validate_run_sealed_gossip",
    "validate_gossip",
]

TOPIC_TRAINING = "tenzro/training/1.0.0"
"""Outer-gradient payload chunks (trainers -> node), model requests and answers."""
TOPIC_SYNCER = "tenzro/training/syncer/1.0.0"
"""Election tickets, syncer status, round transitions with the new weights, run sealed."""

GOSSIP_VERSION = 1
"""The body layout version of every kind not listed otherwise in :data:`MESSAGE_VERSIONS`."""

MAX_CHUNK_BYTES = 1 << 20
"""Largest ``data`` of one chunk (1 MiB): a whole message stays far below the transport's RPC limit."""

MAX_MESSAGE_BYTES = MAX_CHUNK_BYTES + 64 * 1024
"""Largest encoded message decode accepts: a full chunk plus generous room for the header fields
(at most MAX_AGGREGATE_HASHES = 1024 hashes of 32 bytes plus the fixed fields)."""

MAX_AGGREGATE_HASHES = 1024
"""Most fragments a RoundFinalizedMsg may name (far above any architecture's fragment_count)."""

MAX_TOTAL_CHUNKS = 1 << 16
"""Most chunks one chunked byte string may have (64 GiB at 1 MiB): bounds the assembler's index."""

SYNCER_STATUSES = frozenset({"elected", "aggregating", "finalized", "failover", "alive"})
"""The advisory status words a SyncerStatus may carry."""

_HASH = 32
_ADDRESS = 20
_SIGNATURE = 65
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


class MessageKind(enum.IntEnum):
    """The type tag byte (first byte of every encoded message). Values never change."""

    PAYLOAD_CHUNK = 1
    ELECTION_TICKET = 2
    SYNCER_STATUS = 3
    ROUND_FINALIZED = 4
    MODEL_REQUEST = 5
    MODEL_CHUNK = 6
    RUN_SEALED = 7


# --- field checks (construction raises GossipReject: a message is built from untrusted bytes) ---


def _reject(what: str) -> GossipReject:
    return GossipReject(what)


def _check_int(name: str, value: object, maximum: int) -> None:
    if type(value) is not int or not 0 <= value <= maximum:
        raise _reject(f"{name}: expected an int in 0..{maximum}, got {value!r}")


def _check_bytes(name: str, value: object, length: int) -> None:
    if type(value) is not bytes or len(value) != length:
        raise _reject(f"{name}: expected {length} bytes")


def _check_task_id(value: object) -> None:
    if not is_valid_task_id(value):
        raise _reject(f"task_id: not a valid task id: {value!r}")


def _check_data(value: object) -> None:
    if type(value) is not bytes or len(value) > MAX_CHUNK_BYTES:
        raise _reject(f"data: expected bytes of at most {MAX_CHUNK_BYTES}")


def compute_chunk_count(total_size: int, max_chunk: int = MAX_CHUNK_BYTES) -> int:
    """How many chunks a byte string of ``total_size`` splits into (an empty one is one empty chunk)."""
    return max(1, -(-total_size // max_chunk))


def validate_chunk_geometry(seq: int, total_chunks: int, total_size: int, data_len: int) -> None:
    """Raise GossipReject unless (seq, total_chunks, total_size, len(data)) is a canonical chunk.

    Canonical chunking cuts at every MAX_CHUNK_BYTES: chunk ``seq`` has exactly
    ``min(MAX_CHUNK_BYTES, total_size - seq * MAX_CHUNK_BYTES)`` bytes. Fixing every chunk's size
    means a sender cannot make a receiver buffer more than the announced total.
    """
    # [REJECT] total_chunks is the canonical count for total_size.
    if total_chunks != compute_chunk_count(total_size) or total_chunks > MAX_TOTAL_CHUNKS:
        raise _reject(f"chunk count {total_chunks} does not fit total size {total_size}")
    # [REJECT] seq indexes a chunk.
    if not 0 <= seq < total_chunks:
        raise _reject(f"chunk seq {seq} outside 0..{total_chunks - 1}")
    # [REJECT] the chunk has its canonical length.
    expected = min(MAX_CHUNK_BYTES, total_size - seq * MAX_CHUNK_BYTES)
    if data_len != expected:
        raise _reject(f"chunk {seq} has {data_len} bytes, expected {expected}")


class _Chunked:
    """Shared checks of the chunk fields (seq, total_chunks, total_size, data)."""

    __slots__ = ()

    seq: int
    total_chunks: int
    total_size: int
    data: bytes

    def _check_chunk_fields(self) -> None:
        _check_int("seq", self.seq, _U32)
        _check_int("total_chunks", self.total_chunks, _U32)
        _check_int("total_size", self.total_size, _U64)
        _check_data(self.data)
        validate_chunk_geometry(self.seq, self.total_chunks, self.total_size, len(self.data))

    def _check_fp32_total(self) -> None:
        # [REJECT] fp32 weights come in whole 4-byte elements.
        if self.total_size % 4:
            raise _reject(f"total_size {self.total_size} is not a whole number of fp32 values")


# --- messages ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PayloadChunk(_Chunked):
    """One chunk of a trainer's outer-gradient payload (topic ``TOPIC_TRAINING``)."""

    KIND: ClassVar[MessageKind] = MessageKind.PAYLOAD_CHUNK
    task_id: str
    round: int
    """The round the outer gradient is for (uint64)."""
    fragment: int
    """The fragment index (uint32)."""
    trainer: bytes
    """The trainer's 20-byte address: the signer of ``signature``."""
    payload_hash: bytes
    """SHA-256 of the whole payload (the safetensors bytes): the reassembly check and the signed value."""
    signature: bytes
    """The trainer's 65-byte EIP-712 SubmitOuterGradient{taskId, round, fragment, payloadHash} signature."""
    seq: int
    """This chunk's index, 0-based."""
    total_chunks: int
    total_size: int
    """Length of the whole payload in bytes."""
    data: bytes
    """This chunk's bytes (canonical length, see :func:`validate_chunk_geometry`)."""

    def __post_init__(self) -> None:
        _check_task_id(self.task_id)
        _check_int("round", self.round, _U64)
        _check_int("fragment", self.fragment, _U32)
        _check_bytes("trainer", self.trainer, _ADDRESS)
        _check_bytes("payload_hash", self.payload_hash, _HASH)
        _check_bytes("signature", self.signature, _SIGNATURE)
        self._check_chunk_fields()


@dataclass(frozen=True, slots=True, kw_only=True)
class ElectionTicketMsg:
    """A syncer candidate's election ticket (topic ``TOPIC_SYNCER``)."""

    KIND: ClassVar[MessageKind] = MessageKind.ELECTION_TICKET
    task_id: str
    ticket: Ticket
    """The candidate's VRF proof over the run's election seed (address, VRF key, 80-byte proof)."""

    def __post_init__(self) -> None:
        _check_task_id(self.task_id)
        if not isinstance(self.ticket, Ticket):
            raise _reject("ticket: expected a Ticket")


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncerStatus:
    """Advisory liveness/progress note from the current syncer (topic ``TOPIC_SYNCER``)."""

    KIND: ClassVar[MessageKind] = MessageKind.SYNCER_STATUS
    task_id: str
    syncer: bytes
    """The 20-byte address of the syncer the note is about."""
    round: int
    status: str
    """One of :data:`SYNCER_STATUSES`."""
    at_ms: int
    """Sender's wall clock (unix ms) when it sent the note."""

    def __post_init__(self) -> None:
        _check_task_id(self.task_id)
        _check_bytes("syncer", self.syncer, _ADDRESS)
        _check_int("round", self.round, _U64)
        if self.status not in SYNCER_STATUSES:
            raise _reject(f"status: expected one of {sorted(SYNCER_STATUSES)}, got {self.status!r}")
        _check_int("at_ms", self.at_ms, _U64)


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundFinalizedMsg(_Chunked):
    """One chunk of a round transition: the finalized round's commitments and the new weights.

    ``data`` chunks the concatenated new fp32 fragment weights (raw little-endian, fragment order);
    ``data_hash`` is the SHA-256 of that whole concatenation, which the assembler checks. Use
    :func:`compute_round_finalized_chunks` to build the chunk list.
    """

    KIND: ClassVar[MessageKind] = MessageKind.ROUND_FINALIZED
    task_id: str
    round: int
    """The round that was finalized."""
    syncer: bytes
    """The 20-byte address of the syncer that finalized it."""
    syncer_signature: bytes
    """The syncer's 65-byte EIP-712 FinalizeRound{taskId, round} signature."""
    aggregate_hashes: tuple[bytes, ...]
    """Per-fragment aggregate hashes of the round record, fragment order."""
    model_hash: bytes
    """Global model hash after the outer step (the round record's model_hash)."""
    seq: int
    total_chunks: int
    total_size: int
    data_hash: bytes
    """SHA-256 of the whole concatenated weights (all chunks' data in seq order)."""
    data: bytes

    def __post_init__(self) -> None:
        _check_task_id(self.task_id)
        _check_int("round", self.round, _U64)
        _check_bytes("syncer", self.syncer, _ADDRESS)
        _check_bytes("syncer_signature", self.syncer_signature, _SIGNATURE)
        if type(self.aggregate_hashes) is list:
            object.__setattr__(self, "aggregate_hashes", tuple(self.aggregate_hashes))
        if type(self.aggregate_hashes) is not tuple or not 1 <= len(self.aggregate_hashes) <= MAX_AGGREGATE_HASHES:
            raise _reject(f"aggregate_hashes: expected 1..{MAX_AGGREGATE_HASHES} hashes")
        for i, h in enumerate(self.aggregate_hashes):
            _check_bytes(f"aggregate_hashes[{i}]", h, _HASH)
        _check_bytes("model_hash", self.model_hash, _HASH)
        _check_bytes("data_hash", self.data_hash, _HASH)
        self._check_chunk_fields()
        self._check_fp32_total()


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRequest:
    """A peer (a trainer that joined late or missed a round) asks for the current global model."""

    KIND: ClassVar[MessageKind] = MessageKind.MODEL_REQUEST
    task_id: str
    requester: bytes
    """The requester's 20-byte address: the signer of ``signature``."""
    round: int
    """The round the requester believes is current."""
    nonce: int
    """Random uint64 so repeated requests are distinct messages."""
    signature: bytes
    """The requester's 65-byte EIP-712 RequestModel{taskId, requester, round, nonce} signature
    (version 2; version 1 carried none, so anyone could make a node broadcast a model in an
    enrolled trainer's name)."""

    def __post_init__(self) -> None:
        _check_task_id(self.task_id)
        _check_bytes("requester", self.requester, _ADDRESS)
        _check_int("round", self.round, _U64)
        _check_int("nonce", self.nonce, _U64)
        _check_bytes("signature", self.signature, _SIGNATURE)

    def signed_message(self) -> RequestModel:
        """The EIP-712 message ``signature`` is over."""
        return RequestModel(self.task_id, self.requester, self.round, self.nonce)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelChunk(_Chunked):
    """One chunk of the node's answer to a ModelRequest: the full fp32 global model weights.

    ``round`` is the number of finalized rounds the model reflects (0: the initial checkpoint);
    ``model_hash`` must be the committed hash for it. ``data_hash`` as in RoundFinalizedMsg.
    """

    KIND: ClassVar[MessageKind] = MessageKind.MODEL_CHUNK
    task_id: str
    round: int
    model_hash: bytes
    seq: int
    total_chunks: int
    total_size: int
    data_hash: bytes
    data: bytes

    def __post_init__(self) -> None:
        _check_task_id(self.task_id)
        _check_int("round", self.round, _U64)
        _check_bytes("model_hash", self.model_hash, _HASH)
        _check_bytes("data_hash", self.data_hash, _HASH)
        self._check_chunk_fields()
        self._check_fp32_total()


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSealedMsg:
    """A run reached Sealed: its run root and final model hash (topic ``TOPIC_SYNCER``)."""

    KIND: ClassVar[MessageKind] = MessageKind.RUN_SEALED
    task_id: str
    run_root: bytes
    final_model_hash: bytes

    def __post_init__(self) -> None:
        _check_task_id(self.task_id)
        _check_bytes("run_root", self.run_root, _HASH)
        _check_bytes("final_model_hash", self.final_model_hash, _HASH)


GossipMessage = Union[
    PayloadChunk, ElectionTicketMsg, SyncerStatus, RoundFinalizedMsg, ModelRequest, ModelChunk, RunSealedMsg
]
ChunkedMessage = Union[PayloadChunk, RoundFinalizedMsg, ModelChunk]

_TOPIC_OF = {
    MessageKind.PAYLOAD_CHUNK: TOPIC_TRAINING,
    MessageKind.MODEL_REQUEST: TOPIC_TRAINING,
    MessageKind.MODEL_CHUNK: TOPIC_TRAINING,
    MessageKind.ELECTION_TICKET: TOPIC_SYNCER,
    MessageKind.SYNCER_STATUS: TOPIC_SYNCER,
    MessageKind.ROUND_FINALIZED: TOPIC_SYNCER,
    MessageKind.RUN_SEALED: TOPIC_SYNCER,
}


MESSAGE_VERSIONS: dict[MessageKind, int] = {kind: GOSSIP_VERSION for kind in MessageKind}
"""The one body layout version each kind is written and accepted in (the byte after the tag).
ModelRequest is at version 2: it gained the requester's signature."""
MESSAGE_VERSIONS[MessageKind.MODEL_REQUEST] = 2


def get_topic(msg: GossipMessage) -> str:
    """The topic a message type is published on."""
    return _TOPIC_OF[msg.KIND]


# --- encoding ------------------------------------------------------------------------------------
# Body field codes: "s" u16-length UTF-8 string, "Q" u64, "I" u32, "aN" N raw bytes, "d" u32-length
# bytes, "H" u16-count list of 32-byte hashes. One table per kind lists (attribute, code) in order.

_LAYOUT: dict[MessageKind, tuple[tuple[str, str], ...]] = {
    MessageKind.PAYLOAD_CHUNK: (
        ("task_id", "s"), ("round", "Q"), ("fragment", "I"), ("trainer", "a20"), ("payload_hash", "a32"),
        ("signature", "a65"), ("seq", "I"), ("total_chunks", "I"), ("total_size", "Q"), ("data", "d"),
    ),
    MessageKind.ELECTION_TICKET: (
        ("task_id", "s"), ("ticket.address", "a20"), ("ticket.vrf_public_key", "a32"), ("ticket.proof", "a80"),
    ),
    MessageKind.SYNCER_STATUS: (
        ("task_id", "s"), ("syncer", "a20"), ("round", "Q"), ("status", "s"), ("at_ms", "Q"),
    ),
    MessageKind.ROUND_FINALIZED: (
        ("task_id", "s"), ("round", "Q"), ("syncer", "a20"), ("syncer_signature", "a65"),
        ("aggregate_hashes", "H"), ("model_hash", "a32"), ("seq", "I"), ("total_chunks", "I"),
        ("total_size", "Q"), ("data_hash", "a32"), ("data", "d"),
    ),
    MessageKind.MODEL_REQUEST: (
        ("task_id", "s"), ("requester", "a20"), ("round", "Q"), ("nonce", "Q"), ("signature", "a65"),
    ),
    MessageKind.MODEL_CHUNK: (
        ("task_id", "s"), ("round", "Q"), ("model_hash", "a32"), ("seq", "I"), ("total_chunks", "I"),
        ("total_size", "Q"), ("data_hash", "a32"), ("data", "d"),
    ),
    MessageKind.RUN_SEALED: (("task_id", "s"), ("run_root", "a32"), ("final_model_hash", "a32")),
}

_CLASS: dict[MessageKind, type] = {
    MessageKind.PAYLOAD_CHUNK: PayloadChunk,
    MessageKind.ELECTION_TICKET: ElectionTicketMsg,
    MessageKind.SYNCER_STATUS: SyncerStatus,
    MessageKind.ROUND_FINALIZED: RoundFinalizedMsg,
    MessageKind.MODEL_REQUEST: ModelRequest,
    MessageKind.MODEL_CHUNK: ModelChunk,
    MessageKind.RUN_SEALED: RunSealedMsg,
}


def _get_attr(msg: object, path: str) -> object:
    for part in path.split("."):
        msg = getattr(msg, part)
    return msg


def encode_message(msg: GossipMessage) -> bytes:
    """``kind (u8) || MESSAGE_VERSIONS[kind] (u8) || body``; the body is the kind's fields in table order."""
    return b"".join(_encoded_parts(msg))


def _encoded_parts(msg: GossipMessage) -> list[bytes]:
    """The pieces :func:`encode_message` joins, a variable-length value apart from its length:
    decode_message compares them in place with what it parsed, never joining a 1 MiB chunk's
    copy (2026-11-27: the join and the compare were ~6% of a subscriber's CPU, py-spy)."""
    kind = getattr(msg, "KIND", None)
    if kind not in _LAYOUT or not isinstance(msg, _CLASS[kind]):
        raise GossipReject(f"not a gossip message: {type(msg).__name__}")
    out = [bytes((kind, MESSAGE_VERSIONS[kind]))]
    for attr, code in _LAYOUT[kind]:
        value = _get_attr(msg, attr)
        if code == "s":
            raw = value.encode("utf-8")
            out.append(struct.pack(">H", len(raw)) + raw)
        elif code == "Q":
            out.append(struct.pack(">Q", value))
        elif code == "I":
            out.append(struct.pack(">I", value))
        elif code == "d":
            out.append(struct.pack(">I", len(value)))
            out.append(value)
        elif code == "H":
            out.append(struct.pack(">H", len(value)) + b"".join(value))
        else:  # fixed-length bytes, checked at construction
            out.append(value)
    return out


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise _reject(f"truncated message: wanted {n} bytes at offset {self.pos}")
        out = self.data[self.pos:end]
        self.pos = end
        return out

    def read(self, code: str) -> object:
        if code == "s":
            raw = self.take(struct.unpack(">H", self.take(2))[0])
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _reject("string field is not UTF-8") from None
        if code == "Q":
            return struct.unpack(">Q", self.take(8))[0]
        if code == "I":
            return struct.unpack(">I", self.take(4))[0]
        if code == "d":
            n = struct.unpack(">I", self.take(4))[0]
            if n > MAX_CHUNK_BYTES:
                raise _reject(f"data field of {n} bytes exceeds {MAX_CHUNK_BYTES}")
            return self.take(n)
        if code == "H":
            n = struct.unpack(">H", self.take(2))[0]
            return tuple(self.take(_HASH) for _ in range(n))
        return self.take(int(code[1:]))


def decode_message(data: bytes) -> GossipMessage:
    """Parse one encoded message. Raises GossipReject (and only that) on anything malformed:
    unknown kind or version, truncation, trailing bytes, oversize, out-of-range fields, non-canonical
    chunking."""
    # [REJECT] the input is a byte string no longer than MAX_MESSAGE_BYTES.
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise _reject(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_MESSAGE_BYTES:
        raise _reject(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    # [REJECT] a known type tag and this version.
    if len(data) < 2:
        raise _reject("message shorter than its 2-byte header")
    try:
        kind = MessageKind(data[0])
    except ValueError:
        raise _reject(f"unknown message type {data[0]}") from None
    if data[1] != MESSAGE_VERSIONS[kind]:
        raise _reject(f"unsupported {kind.name} version {data[1]}")
    reader = _Reader(data)
    reader.pos = 2
    fields = {attr: reader.read(code) for attr, code in _LAYOUT[kind]}
    # [REJECT] no trailing bytes.
    if reader.pos != len(data):
        raise _reject(f"{len(data) - reader.pos} trailing bytes")
    if kind is MessageKind.ELECTION_TICKET:
        try:
            ticket = Ticket(fields.pop("ticket.address"), fields.pop("ticket.vrf_public_key"), fields.pop("ticket.proof"))
        except ElectionError as exc:
            raise _reject(f"ticket: {exc}") from None
        fields["ticket"] = ticket
    # Field constructors raise GossipReject on out-of-range values (bad task id, bad geometry, ...).
    msg = _CLASS[kind](**fields)
    # [REJECT] the encoding is canonical (cannot differ for a valid message today; guards future fields).
    pos = 0
    for part in _encoded_parts(msg):
        if not data.startswith(part, pos):
            raise _reject("non-canonical encoding")
        pos += len(part)
    if pos != len(data):
        raise _reject("non-canonical encoding")
    return msg


# --- chunking ------------------------------------------------------------------------------------


def compute_chunks(data: bytes, max_chunk: int = MAX_CHUNK_BYTES) -> list[bytes]:
    """Cut ``data`` into consecutive pieces of ``max_chunk`` bytes (the last may be shorter; empty
    data gives one empty piece). With the default size these are the canonical gossip chunks."""
    if type(max_chunk) is not int or max_chunk < 1:
        raise ValueError(f"max_chunk must be a positive int, got {max_chunk!r}")
    view = memoryview(bytes(data))
    count = compute_chunk_count(len(view), max_chunk)
    return [bytes(view[i * max_chunk:(i + 1) * max_chunk]) for i in range(count)]


_C = TypeVar("_C", PayloadChunk, RoundFinalizedMsg, ModelChunk)


def _chunk_stream(cls: type[_C], data: bytes, hash_field: str, **header: object) -> list[_C]:
    """Every chunk of ``data`` as ``cls`` messages: the same header on each, ``hash_field`` set to
    SHA-256(data), canonical pieces with their seq/total_chunks/total_size."""
    digest = hashlib.sha256(data).digest()
    pieces = compute_chunks(data)
    return [
        cls(**header, **{hash_field: digest}, seq=i, total_chunks=len(pieces), total_size=len(data), data=piece)
        for i, piece in enumerate(pieces)
    ]


def compute_payload_chunks(
    *, task_id: str, round: int, fragment: int, trainer: bytes, signature: bytes, payload: bytes
) -> list[PayloadChunk]:
    """Every PayloadChunk of one signed outer-gradient payload (payload_hash = SHA-256(payload))."""
    return _chunk_stream(PayloadChunk, payload, "payload_hash", task_id=task_id, round=round, fragment=fragment,
                         trainer=trainer, signature=signature)


def compute_round_finalized_chunks(
    *,
    task_id: str,
    round: int,
    syncer: bytes,
    syncer_signature: bytes,
    aggregate_hashes: tuple[bytes, ...],
    model_hash: bytes,
    weights: bytes,
) -> list[RoundFinalizedMsg]:
    """Every RoundFinalizedMsg chunk carrying ``weights`` (concatenated fp32 fragments, fragment order)."""
    return _chunk_stream(RoundFinalizedMsg, weights, "data_hash", task_id=task_id, round=round, syncer=syncer,
                         syncer_signature=syncer_signature, aggregate_hashes=tuple(aggregate_hashes),
                         model_hash=model_hash)


def compute_model_chunks(*, task_id: str, round: int, model_hash: bytes, weights: bytes) -> list[ModelChunk]:
    """Every ModelChunk of the full fp32 global model weights after ``round`` finalized rounds."""
    return _chunk_stream(ModelChunk, weights, "data_hash", task_id=task_id, round=round, model_hash=model_hash)


def compute_model_request(*, task_id: str, round: int, nonce: int, private_key: bytes,
                          chain_id: int = DEFAULT_CHAIN_ID) -> ModelRequest:
    """A ModelRequest (version 2) signed by ``private_key``'s account, the requester."""
    requester = bytes.fromhex(Account.from_key(private_key).address[2:])
    signature = sign_message(RequestModel(task_id, requester, round, nonce), private_key, chain_id)
    return ModelRequest(task_id=task_id, requester=requester, round=round, nonce=nonce, signature=signature)


def compute_stream_key(msg: ChunkedMessage) -> tuple[object, ...]:
    """What identifies the byte string a chunk belongs to: every header field except seq and data.

    Two chunks with equal keys must carry pieces of the same byte string; any header difference
    (another signature, another hash) makes a different stream.
    """
    if isinstance(msg, PayloadChunk):
        return (msg.KIND, msg.task_id, msg.round, msg.fragment, msg.trainer, msg.payload_hash, msg.signature,
                msg.total_chunks, msg.total_size)
    if isinstance(msg, RoundFinalizedMsg):
        return (msg.KIND, msg.task_id, msg.round, msg.syncer, msg.syncer_signature, msg.aggregate_hashes,
                msg.model_hash, msg.total_chunks, msg.total_size, msg.data_hash)
    if isinstance(msg, ModelChunk):
        return (msg.KIND, msg.task_id, msg.round, msg.model_hash, msg.total_chunks, msg.total_size, msg.data_hash)
    raise GossipReject(f"not a chunked message: {type(msg).__name__}")


def compute_chunk_dedup_key(tag: str, msg: ChunkedMessage, source: object = None) -> tuple[object, ...]:
    """The dedup key of one chunk: its publishing peer, its stream key, its seq and the SHA-256
    of its data. ``key[1]`` = (source,) + stream key is the stream the chunk belongs to, exactly
    as :class:`ChunkAssembler` keys it.

    Together these cover every field of the message and who published it: a peer that copies a
    signed header onto other bytes makes a DIFFERENT key, and so does a peer that republishes a
    genuine chunk byte for byte. Either way the genuine chunk from its own publisher is never
    ignored as a duplicate of the copy (which would leave the genuine stream, kept apart by
    publisher in the assembler, waiting forever for that seq).
    """
    return (tag, (source,) + compute_stream_key(msg), msg.seq, hashlib.sha256(msg.data).digest())


@dataclass(frozen=True, slots=True)
class StreamSizes:
    """The byte sizes a run's chunked streams may announce (from its fragment layouts)."""

    model_bytes: int
    """Exact length of the concatenated fp32 fragment weights (RoundFinalizedMsg, ModelChunk)."""
    payload_bytes: tuple[int, ...]
    """Per fragment, the largest outer-gradient payload its layout admits
    (``payload.compute_max_payload_bytes``: the header cap plus fp32 data; a payload's header
    length varies with its metadata, so an exact size is not fixed by the layout alone)."""


def compute_stream_sizes(layouts: Sequence[FragmentLayout]) -> StreamSizes:
    """:class:`StreamSizes` of a run whose fragments are ``layouts`` (fragment order)."""
    return StreamSizes(
        model_bytes=4 * sum(lay.numel for lay in layouts),
        payload_bytes=tuple(compute_max_payload_bytes(lay) for lay in layouts),
    )


def _expected_hash(msg: ChunkedMessage) -> bytes:
    return msg.payload_hash if isinstance(msg, PayloadChunk) else msg.data_hash


class ChunkAssembler:
    """Bounded reassembly of chunked byte strings (payloads, weights).

    ``add(chunk, source)`` returns the whole byte string once its last missing chunk arrives and
    the SHA-256 of the concatenation equals the announced hash; otherwise None. ``source`` is the
    libp2p peer that published the chunk (its libp2p-signed originator, not the forwarder).

    A stream is one source's chunks under one header (every field but seq and data,
    :func:`compute_stream_key`). The source matters because the header's Tenzro signature covers
    only the payload hash, not the chunk bytes or the announced size: a peer that copies a
    genuine header onto random bytes makes chunks that pass validation. Kept apart by source,
    its forgeries form a stream of their own that fails its hash check, instead of taking the
    genuine chunks' places in the genuine stream (which then failed on every republish).

    Bounds: at most ``max_pending`` incomplete streams and ``max_total_bytes`` announced bytes
    across them (reserved when a stream starts, so one in progress can always finish); one stream
    announcing more than ``max_total_bytes`` on its own is rejected; at most ``max_per_source``
    incomplete streams per source: a source's new stream beyond that takes the place of its own
    least recently active one (when that makes room; otherwise the new one is refused), so one
    peer (copying one signature onto many announced sizes, which cost it a few bytes each)
    cannot reserve the whole buffer.

    Eviction (a new stream that does not fit): streams that received no chunk while
    ``stale_after`` chunks went through the assembler, or for ``idle_s`` seconds of ``clock``, are
    evicted first, least recently active first (counted in ``evicted``); so room held by a peer
    that stopped sending comes back. Then streams that hold fewer received bytes than the new
    stream's first chunk, fewest first, if evicting them makes room: announcing a stream costs a
    few bytes, holding a slot against honest traffic now costs whole chunks. Otherwise the NEW
    stream is refused (its chunk dropped, counted in ``refused``): a stream in progress (a whole
    chunk or more) is never evicted by a newer one, so many concurrent streams cannot thrash each
    other into zero completions, and a flood of forged first chunks cannot push out a genuine
    stream that is progressing.

    Every stream dropped without delivery (evicted, refused, hash mismatch) is reported to
    ``on_drop((source,) + stream_key)``, the stream ``compute_chunk_dedup_key`` indexes its
    chunks under: the owner of the dedup cache forgets that stream's chunks there, so a
    republish of the genuine bytes is accepted again. Completed streams are remembered
    (``max_done`` keys) so late duplicates of their chunks return None instead of starting a new
    stream.

    Not thread-safe; one owner (the consumer of a subscription) uses it.
    """

    def __init__(self, max_total_bytes: int, max_pending: int, max_done: int = 4096, *,
                 stale_after: int | None = None, max_per_source: int | None = None,
                 idle_s: float | None = None, clock: Callable[[], float] | None = None,
                 on_drop: Callable[[tuple[object, ...]], None] | None = None) -> None:
        self._pending: OrderedDict[tuple[object, ...], dict[int, bytes]] = OrderedDict()
        self._sizes: dict[tuple[object, ...], int] = {}
        self._active: dict[tuple[object, ...], int] = {}
        self._last_chunk_at: dict[tuple[object, ...], float] = {}
        self._held: dict[tuple[object, ...], int] = {}
        self._per_source: dict[object, int] = {}
        self._done: OrderedDict[tuple[object, ...], None] = OrderedDict()
        self._fixed_stale = stale_after
        self.resize(max_total_bytes, max_pending)
        if max_done < 0:
            raise ValueError("max_done >= 0 required")
        if max_per_source is not None and max_per_source < 1:
            raise ValueError("max_per_source >= 1 required")
        if (idle_s is None) != (clock is None) or (idle_s is not None and idle_s <= 0):
            raise ValueError("idle_s > 0 and clock go together")
        self.max_done = max_done
        self.max_per_source = max_per_source
        self.idle_s = idle_s
        self._clock = clock
        self.on_drop = on_drop
        self._tick = 0
        self.pending_bytes = 0
        """Sum of the announced total sizes of incomplete streams (the memory bound)."""
        self.evicted = 0
        """Incomplete streams dropped for room (stale or idle, or a source's own beyond its share)."""
        self.refused = 0
        """New streams refused for lack of room."""
        self.hash_mismatches = 0
        """Completed streams whose bytes did not hash to the announced hash."""
        self.completed = 0

    def resize(self, max_total_bytes: int, max_pending: int) -> None:
        """Change the bounds (streams already buffered stay; new ones see the new bounds)."""
        if max_total_bytes < 0 or max_pending < 1:
            raise ValueError("max_total_bytes >= 0, max_pending >= 1 required")
        self.max_total_bytes = max_total_bytes
        self.max_pending = max_pending
        self.stale_after = self._fixed_stale if self._fixed_stale is not None else 2 * max(
            max_pending, max_total_bytes // MAX_CHUNK_BYTES)

    def __len__(self) -> int:
        return len(self._pending)

    def _drop(self, key: tuple[object, ...]) -> None:
        if self._pending.pop(key, None) is not None:
            source = key[0]
            left = self._per_source[source] - 1
            if left:
                self._per_source[source] = left
            else:
                del self._per_source[source]
        self._active.pop(key, None)
        self._last_chunk_at.pop(key, None)
        self._held.pop(key, None)
        self.pending_bytes -= self._sizes.pop(key, 0)

    def _lost(self, key: tuple[object, ...]) -> None:
        if self.on_drop is not None:
            self.on_drop(key)

    def _evict(self, key: tuple[object, ...]) -> None:
        self._drop(key)
        self.evicted += 1
        self._lost(key)

    def _remember_done(self, key: tuple[object, ...]) -> None:
        self._done[key] = None
        while len(self._done) > self.max_done:
            self._done.popitem(last=False)

    def _fits(self, size: int) -> bool:
        return len(self._pending) < self.max_pending and self.pending_bytes + size <= self.max_total_bytes

    def _is_stale(self, key: tuple[object, ...], now: float | None) -> bool:
        if self._tick - self._active[key] > self.stale_after:
            return True
        return now is not None and self.idle_s is not None and now - self._last_chunk_at[key] > self.idle_s

    def _make_room(self, size: int, now: float | None, incoming: int) -> bool:
        """Make room for a new stream of ``size`` announced bytes whose first chunk carries
        ``incoming`` bytes; False if it cannot.

        First stale or idle streams go (least recently active first). Then, only if that is
        enough, streams holding fewer received bytes than the incoming chunk, fewest first: a
        stream announced with a few bytes sent (what forged headers under many signing keys cost
        an attacker: the gossip probe held all 64 slots for ~5 KB/s) yields to one that brings
        more. A stream in progress holds at least one whole chunk, so it is not pushed out by a
        newcomer's first chunk (no thrashing among honest streams)."""
        if self._fits(size):
            return True
        stale = sorted((at, key) for key, at in self._active.items() if self._is_stale(key, now))
        for _, key in stale:
            self._evict(key)
            if self._fits(size):
                return True
        weaker = sorted((held, self._active[key], key) for key, held in self._held.items() if held < incoming)
        count, reserved, chosen = len(self._pending), self.pending_bytes, []
        for _, _, key in weaker:
            chosen.append(key)
            count, reserved = count - 1, reserved - self._sizes[key]
            if count < self.max_pending and reserved + size <= self.max_total_bytes:
                for victim in chosen:
                    self._evict(victim)
                return True
        return False

    def _make_source_room(self, source: object, size: int) -> bool:
        """A source at its share gives up its own least recently active stream for a new one of
        ``size`` announced bytes, if that makes room for it; False (nothing evicted) if not."""
        if self.max_per_source is None or self._per_source.get(source, 0) < self.max_per_source:
            return True
        _, oldest = min((at, key) for key, at in self._active.items() if key[0] == source)
        if self.pending_bytes - self._sizes[oldest] + size > self.max_total_bytes:
            return False
        self._evict(oldest)
        return True

    def add(self, chunk: ChunkedMessage, source: object = None) -> bytes | None:
        """Take one chunk published by ``source``; return the verified whole byte string when
        this chunk completes its stream.

        Raises GossipReject when the chunk is not a canonical chunk, the stream alone exceeds the
        byte bound, or the completed bytes do not hash to the announced hash (the stream is dropped).
        """
        key = (source,) + compute_stream_key(chunk)
        validate_chunk_geometry(chunk.seq, chunk.total_chunks, chunk.total_size, len(chunk.data))
        if key in self._done:
            return None  # a late duplicate of a stream already delivered
        self._tick += 1
        now = self._clock() if self._clock is not None else None
        parts = self._pending.get(key)
        if parts is None:
            if chunk.total_size > self.max_total_bytes:
                self._lost(key)
                raise GossipReject(f"stream of {chunk.total_size} bytes exceeds the buffer of {self.max_total_bytes}")
            if not (self._make_source_room(source, chunk.total_size)
                    and self._make_room(chunk.total_size, now, len(chunk.data))):
                self.refused += 1
                self._lost(key)
                return None
            parts = {}
            self._pending[key] = parts
            self._per_source[source] = self._per_source.get(source, 0) + 1
            self._sizes[key] = chunk.total_size
            self.pending_bytes += chunk.total_size
        if chunk.seq in parts:
            return None  # duplicate chunk
        parts[chunk.seq] = chunk.data
        self._held[key] = self._held.get(key, 0) + len(chunk.data)
        self._active[key] = self._tick
        if now is not None:
            self._last_chunk_at[key] = now
        if len(parts) < chunk.total_chunks:
            return None
        whole = b"".join(parts[i] for i in range(chunk.total_chunks))
        self._drop(key)
        if hashlib.sha256(whole).digest() != _expected_hash(chunk):
            self.hash_mismatches += 1
            self._lost(key)
            raise GossipReject("reassembled bytes do not match the announced hash")
        self._remember_done(key)
        self.completed += 1
        return whole


# --- validation context and dedup cache ----------------------------------------------------------


def _no_candidate(address: bytes) -> Candidate | None:
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class GossipContext:
    """What a validator may know about the world; built by the shell, read by the rules.

    ``get_run`` and ``get_candidate`` are view functions over the caller's state (the node's store,
    or a trainer's cached copy of getRun). Build a fresh context (or ``dataclasses.replace``) per
    message so ``now_ms`` is current.
    """

    get_run: Callable[[str], RunState | None]
    """The run with this task id as the receiver knows it, or None."""
    get_candidate: Callable[[bytes], Candidate | None] = _no_candidate
    """The registered syncer candidate with this address, or None (election tickets)."""
    chain_id: int = DEFAULT_CHAIN_ID
    """The EIP-712 chain id the signatures must be made for."""
    now_ms: int = 0
    """The receiver's wall clock, unix ms."""
    max_payload_bytes: int = 64 << 20
    """Largest outer-gradient payload accepted (the node's configured limit)."""
    max_model_bytes: int = 4 << 30
    """Largest concatenated weights accepted in RoundFinalizedMsg/ModelChunk."""
    max_clock_skew_ms: int = 120_000
    """How far a SyncerStatus ``at_ms`` may be from ``now_ms`` before it is stale/rejected."""
    get_sizes: Callable[[str], StreamSizes | None] | None = None
    """The run's stream sizes (from its fragment layouts), or None when the receiver does not
    know them (yet): then chunks of that run are IGNOREd. Leaving the whole field None checks
    sizes only against ``max_payload_bytes``/``max_model_bytes`` (receivers without layouts)."""
    source: object = None
    """The peer that published the message (its libp2p-signed originator): part of a chunk's
    dedup key, as of its reassembly stream."""
    get_weights: Callable[[str, bytes], WeightsDigests | None] | None = None
    """(task id, model hash) -> the digests of the weights this receiver holds and publishes for
    that model, or None. When set (a node), weights messages (RoundFinalizedMsg, ModelChunk)
    must be exactly those bytes, or they are not relayed (see :class:`WeightsDigests`)."""


@dataclass(frozen=True, slots=True)
class WeightsDigests:
    """What a node knows of the weights it publishes for one model: their SHA-256 (a weights
    message's ``data_hash``) and the SHA-256 of each canonical chunk.

    Why: neither Tenzro signature covers weight bytes, and the committed model hash is public,
    so any peer could publish well-sized streams naming it (or copying a genuine RoundFinalized
    header) with other bytes. Trainers take weights only from their node and drop those, but the
    node itself relayed them to its whole mesh, keyless bandwidth amplification (gossip probe,
    2026-11-26). Honest publishers of one model send the same bytes (they are a pure function of
    the committed state), so a node relays exactly the bytes it holds and nothing else."""

    data_hash: bytes
    chunk_hashes: tuple[bytes, ...]
    total_size: int

    @classmethod
    def of(cls, data: bytes, data_hash: bytes | None = None) -> WeightsDigests:
        """The digests of ``data`` (``data_hash``: its SHA-256 when the caller has it already,
        as every chunk of a published stream does)."""
        view = memoryview(data)
        chunks = tuple(hashlib.sha256(view[i * MAX_CHUNK_BYTES:(i + 1) * MAX_CHUNK_BYTES]).digest()
                       for i in range(compute_chunk_count(len(data))))
        return cls(data_hash or hashlib.sha256(data).digest(), chunks, len(data))


def _check_held_weights(msg: RoundFinalizedMsg | ModelChunk, chunk_hash: bytes, ctx: GossipContext) -> None:
    """A receiver that holds weights (``ctx.get_weights``) relays only the exact bytes it holds."""
    if ctx.get_weights is None:
        return
    held = ctx.get_weights(msg.task_id, msg.model_hash)
    # [IGNORE] the receiver holds the weights of that model (else it cannot check the bytes).
    if held is None:
        raise GossipIgnore(f"weights of model 0x{msg.model_hash.hex()} are not held here")
    # [REJECT] the chunk is a canonical piece of exactly those bytes.
    if (msg.data_hash != held.data_hash or msg.total_size != held.total_size
            or msg.total_chunks != len(held.chunk_hashes) or chunk_hash != held.chunk_hashes[msg.seq]):
        raise GossipReject(f"weights of model 0x{msg.model_hash.hex()} differ from the ones held here")


def _get_sizes(ctx: GossipContext, task_id: str) -> StreamSizes | None:
    if ctx.get_sizes is None:
        return None
    sizes = ctx.get_sizes(task_id)
    # [IGNORE] the receiver knows the run's fragment layouts (it cannot size-check the stream otherwise).
    if sizes is None:
        raise GossipIgnore(f"fragment layouts of {task_id} not known here yet")
    return sizes


def _check_weights_size(total_size: int, ctx: GossipContext, task_id: str) -> None:
    # [REJECT] the weights are not larger than the receiver accepts.
    if total_size > ctx.max_model_bytes:
        raise GossipReject(f"weights of {total_size} bytes exceed {ctx.max_model_bytes}")
    sizes = _get_sizes(ctx, task_id)
    # [REJECT] the weights are exactly the run's model: 4 bytes per parameter of its fragments.
    if sizes is not None and total_size != sizes.model_bytes:
        raise GossipReject(f"weights of {total_size} bytes, the model has {sizes.model_bytes}")


def _seen_digest(key: object) -> bytes:
    """The 32-byte BLAKE2b of ``repr(key)``: what :class:`SeenCache` stores for a key or stream.

    Why a digest: a chunk key holds its publisher, the stream's whole signed header and a data
    hash (~610 B as a tuple), so a full cache of 65,536 keys held ~38 MiB for good; digests hold
    it to a fraction of that (``tests/test_gossip.py::test_seen_cache_memory_is_digests``). The
    keys are tuples of str, bytes, int, None, IntEnum members, nested tuples and frozen
    dataclasses of those, whose ``repr`` is one-to-one (a key with a float, a set or an object
    of default ``repr`` would break dedup: keep them out). 256 bits because a hit is not only
    "duplicate": for a ``("sig", ...)`` key it means "signature already verified", so a
    collision between an attacker's own valid key and one naming a victim with a junk signature
    would pass that check; at 128 bits that is a 2^64 birthday search, at 256 bits 2^128.
    """
    return hashlib.blake2b(repr(key).encode(), digest_size=32).digest()


class SeenCache:
    """Bounded set of message keys already accepted (oldest forgotten first), plus verified signatures.

    The dedup cache of the validators: a key is recorded only after a message passed every check,
    so a rejected copy never shadows a valid one. Chunk keys are indexed by their stream
    (``add(key, stream=...)``) so a stream that failed reassembly or was evicted can be forgotten
    with :meth:`forget_stream`, and its genuine republish is accepted again. Keys and streams are
    held as digests (:func:`_seen_digest`), never as the tuples themselves.

    One thread (the validator's) owns it; :meth:`forget_stream` alone may be called from any
    thread: it only appends to a deque (atomic), and the owner applies the request on its next
    lookup.
    """

    def __init__(self, max_entries: int = 65536) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self._keys: OrderedDict[bytes, bytes | None] = OrderedDict()
        self._streams: dict[bytes, tuple[bytes, set[bytes]]] = {}
        """stream digest -> (that digest, shared as every key's value; the stream's key digests)"""
        self._forget: deque[object] = deque()
        self._marks: OrderedDict[tuple[object, ...], int] = OrderedDict()

    def __len__(self) -> int:
        self._apply_forgets()
        return len(self._keys)

    def __contains__(self, key: tuple[object, ...]) -> bool:
        self._apply_forgets()
        return _seen_digest(key) in self._keys

    def add(self, key: tuple[object, ...], stream: object = None) -> None:
        self._apply_forgets()
        digest = _seen_digest(key)
        if digest in self._keys:
            self._keys.move_to_end(digest)
        else:
            stream_digest = None
            if stream is not None:
                stream_digest = _seen_digest(stream)
                stream_digest, keys = self._streams.setdefault(stream_digest, (stream_digest, set()))
                keys.add(digest)
            self._keys[digest] = stream_digest
        while len(self._keys) > self.max_entries:
            old, old_stream = self._keys.popitem(last=False)
            self._unindex(old, old_stream)

    MAX_MARKS = 4096
    """Marks kept (oldest set forgotten first)."""

    def get_mark(self, key: tuple[object, ...]) -> int | None:
        """The last value :meth:`set_mark` recorded under ``key`` (a rule's high-water mark,
        e.g. the newest SyncerStatus time of a syncer), or None."""
        return self._marks.get(key)

    def set_mark(self, key: tuple[object, ...], value: int) -> None:
        self._marks[key] = value
        self._marks.move_to_end(key)
        while len(self._marks) > self.MAX_MARKS:
            self._marks.popitem(last=False)

    def forget_stream(self, stream: object) -> None:
        """Forget every key added with ``stream`` (thread-safe: applied by the owner's next call)."""
        self._forget.append(stream)

    def _unindex(self, digest: bytes, stream_digest: bytes | None) -> None:
        if stream_digest is None:
            return
        entry = self._streams.get(stream_digest)
        if entry is not None:
            entry[1].discard(digest)
            if not entry[1]:
                del self._streams[stream_digest]

    def _apply_forgets(self) -> None:
        while self._forget:
            stream = self._forget.popleft()
            for digest in self._streams.pop(_seen_digest(stream), (b"", ()))[1]:
                self._keys.pop(digest, None)


def _get_run(ctx: GossipContext, task_id: str) -> RunState:
    run = ctx.get_run(task_id)
    # [IGNORE] the run is known to the receiver (it may not have seen the post yet).
    if run is None:
        raise GossipIgnore(f"unknown run {task_id}")
    return run


def check_signature_cached(msg: SubmitOuterGradient | FinalizeRound | RequestModel, signature: bytes, signer: bytes,
                           chain_id: int, seen: SeenCache) -> None:
    """[REJECT] unless ``signature`` over ``msg`` recovers to ``signer``; a good one is remembered
    in ``seen``, so a stream's later chunks (same signature) cost no second recovery."""
    sig_key = ("sig", msg, signature, signer, chain_id)
    if sig_key in seen:
        return  # recovered once already (every chunk of a stream carries the same signature)
    try:
        validate_signer(msg, signature, signer, chain_id)
    except AuthError as exc:
        raise GossipReject(f"bad signature: {exc}") from None
    seen.add(sig_key)


# --- validation: training topic ------------------------------------------------------------------


def validate_payload_chunk_gossip(msg: PayloadChunk, ctx: GossipContext, seen: SeenCache) -> None:
    """Rules for a PayloadChunk before it is delivered or relayed."""
    # [REJECT] the message is a PayloadChunk (constructed, so its fields and geometry are valid).
    if not isinstance(msg, PayloadChunk):
        raise GossipReject("expected a PayloadChunk")
    key = compute_chunk_dedup_key("payload", msg, ctx.source)
    # [IGNORE] not seen before (the same whole message: another body is not a duplicate).
    if key in seen:
        raise GossipIgnore("duplicate payload chunk")
    run = _get_run(ctx, msg.task_id)
    # [IGNORE] the run is Training (before: too early; after: stale).
    if run.status is not RunStatus.TRAINING:
        raise GossipIgnore(f"run {msg.task_id} is {run.status.value}, not Training")
    # [IGNORE] the chunk is for the current round (older: stale; newer: the receiver is behind).
    if msg.round != run.round:
        raise GossipIgnore(f"payload for round {msg.round}, current round is {run.round}")
    # [REJECT] the fragment exists.
    if msg.fragment >= run.spec.architecture.fragment_count:
        raise GossipReject(f"fragment {msg.fragment} >= fragment_count {run.spec.architecture.fragment_count}")
    # [REJECT] the payload is not larger than the receiver accepts.
    if msg.total_size > ctx.max_payload_bytes:
        raise GossipReject(f"payload of {msg.total_size} bytes exceeds {ctx.max_payload_bytes}")
    sizes = _get_sizes(ctx, msg.task_id)
    # [REJECT] the payload is not larger than the fragment's layout admits (header cap + fp32 data).
    if sizes is not None and (msg.fragment >= len(sizes.payload_bytes)
                              or msg.total_size > sizes.payload_bytes[msg.fragment]):
        raise GossipReject(f"payload of {msg.total_size} bytes is larger than fragment {msg.fragment} admits")
    # [REJECT] the trainer is enrolled in the run and not slashed.
    trainer = get_trainer(run, msg.trainer)
    if trainer is None or trainer.slashed:
        raise GossipReject(f"0x{msg.trainer.hex()} is not an enrolled, unslashed trainer of {msg.task_id}")
    # [REJECT] the trainer signed SubmitOuterGradient{taskId, round, fragment, payloadHash}.
    signed = SubmitOuterGradient(msg.task_id, msg.round, msg.fragment, msg.payload_hash)
    check_signature_cached(signed, msg.signature, msg.trainer, ctx.chain_id, seen)
    seen.add(key, stream=key[1])


def validate_model_request_gossip(msg: ModelRequest, ctx: GossipContext, seen: SeenCache) -> None:
    """Rules for a ModelRequest (a request changes nothing; the rules only limit noise)."""
    # [REJECT] the message is a ModelRequest.
    if not isinstance(msg, ModelRequest):
        raise GossipReject("expected a ModelRequest")
    key = ("model-request", msg.task_id, msg.requester, msg.round, msg.nonce)
    # [IGNORE] not seen before.
    if key in seen:
        raise GossipIgnore("duplicate model request")
    run = _get_run(ctx, msg.task_id)
    # [IGNORE] the run has a model worth sending (Training or Sealed).
    if run.status not in (RunStatus.TRAINING, RunStatus.SEALED):
        raise GossipIgnore(f"run {msg.task_id} is {run.status.value}")
    # [IGNORE] it asks for the run's current model (after ``run.round`` finalized rounds; a
    # trainer reads the round from getRun just before it asks). Only the dedup cache stopped a
    # kept request from being replayed by anyone, in the requester's name, once the cache or a
    # restart forgot it; now it works only until the next round (gossip probe, 2026-11-26).
    if msg.round != run.round:
        raise GossipIgnore(f"model request for round {msg.round}; the run is at {run.round}")
    # [REJECT] the requester is an enrolled, unslashed trainer (anyone else has no use for the weights).
    trainer = get_trainer(run, msg.requester)
    if trainer is None or trainer.slashed:
        raise GossipReject(f"0x{msg.requester.hex()} is not an enrolled, unslashed trainer of {msg.task_id}")
    # [REJECT] the requester signed RequestModel{taskId, requester, round, nonce}.
    check_signature_cached(msg.signed_message(), msg.signature, msg.requester, ctx.chain_id, seen)
    seen.add(key)


def _committed_model_hash(run: RunState, round_: int) -> bytes | None:
    """The model hash after ``round_`` finalized rounds, or None if that many are not finalized yet."""
    if round_ == 0:
        return run.initial_model_hash
    if round_ <= len(run.records):
        return run.records[round_ - 1].model_hash
    return None


def validate_model_chunk_gossip(msg: ModelChunk, ctx: GossipContext, seen: SeenCache) -> None:
    """Rules for a ModelChunk (the node's answer to a ModelRequest)."""
    # [REJECT] the message is a ModelChunk.
    if not isinstance(msg, ModelChunk):
        raise GossipReject("expected a ModelChunk")
    key = compute_chunk_dedup_key("model-chunk", msg, ctx.source)
    # [IGNORE] not seen before (the same whole message).
    if key in seen:
        raise GossipIgnore("duplicate model chunk")
    run = _get_run(ctx, msg.task_id)
    _check_weights_size(msg.total_size, ctx, msg.task_id)
    expected = _committed_model_hash(run, msg.round)
    # [IGNORE] the receiver knows the model hash of that round (else it is behind; it cannot check).
    if expected is None:
        raise GossipIgnore(f"round {msg.round} is not finalized here yet")
    # [IGNORE] it is the current model (an older one is stale).
    if msg.round != len(run.records):
        raise GossipIgnore(f"model after round {msg.round} is stale")
    # [REJECT] model_hash is the committed one.
    if msg.model_hash != expected:
        raise GossipReject("model_hash differs from the committed model hash")
    _check_held_weights(msg, key[3], ctx)
    seen.add(key, stream=key[1])


# --- validation: syncer topic --------------------------------------------------------------------


def validate_election_ticket_gossip(msg: ElectionTicketMsg, ctx: GossipContext, seen: SeenCache) -> None:
    """Rules for an election ticket."""
    # [REJECT] the message is an ElectionTicketMsg.
    if not isinstance(msg, ElectionTicketMsg):
        raise GossipReject("expected an ElectionTicketMsg")
    key = ("ticket", msg.task_id, msg.ticket.address, msg.ticket.vrf_public_key, msg.ticket.proof)
    # [IGNORE] not seen before.
    if key in seen:
        raise GossipIgnore("duplicate ticket")
    run = _get_run(ctx, msg.task_id)
    # [IGNORE] the election is open: the run is Posted/Electing and its deadline has not passed.
    if run.status not in (RunStatus.POSTED, RunStatus.ELECTING) or ctx.now_ms > run.election.deadline_ms:
        raise GossipIgnore(f"election of {msg.task_id} is closed")
    # [REJECT] the ticket's address is a registered candidate.
    candidate = ctx.get_candidate(msg.ticket.address)
    if candidate is None:
        raise GossipReject(f"0x{msg.ticket.address.hex()} is not a registered candidate")
    # [REJECT] the ticket's VRF proof verifies over the run's seed under the registered key.
    try:
        validate_ticket(msg.ticket, candidate, run.election.seed)
    except ElectionError as exc:
        raise GossipReject(f"invalid ticket: {exc}") from None
    seen.add(key)


def validate_syncer_status_gossip(msg: SyncerStatus, ctx: GossipContext, seen: SeenCache) -> None:
    """Rules for an advisory SyncerStatus (unsigned at the Tenzro level; see the module docstring)."""
    # [REJECT] the message is a SyncerStatus.
    if not isinstance(msg, SyncerStatus):
        raise GossipReject("expected a SyncerStatus")
    key = ("status", msg.task_id, msg.syncer, msg.round, msg.status, msg.at_ms)
    # [IGNORE] not seen before.
    if key in seen:
        raise GossipIgnore("duplicate status")
    run = _get_run(ctx, msg.task_id)
    # [IGNORE] the run is not over.
    if run.status in (RunStatus.SEALED, RunStatus.CANCELLED, RunStatus.FAILED):
        raise GossipIgnore(f"run {msg.task_id} is {run.status.value}")
    # [IGNORE] the note is recent (older than the allowed skew: stale).
    if msg.at_ms + ctx.max_clock_skew_ms < ctx.now_ms:
        raise GossipIgnore("stale status")
    # [REJECT] the note is not from the future beyond the allowed skew.
    if msg.at_ms > ctx.now_ms + ctx.max_clock_skew_ms:
        raise GossipReject("status dated in the future")
    # [REJECT] it names the run's current syncer.
    if get_current_syncer(run) != msg.syncer:
        raise GossipReject(f"0x{msg.syncer.hex()} is not the current syncer of {msg.task_id}")
    check_status_interval(msg, seen)
    seen.add(key)
    note_status(msg, seen)


SYNCER_STATUS_INTERVAL_MS = 1_000
"""A SyncerStatus is relayed only if dated this much after the last one relayed for its syncer."""


def _status_mark(msg: SyncerStatus) -> tuple[object, ...]:
    return ("status", msg.task_id, msg.syncer)


def note_status(msg: SyncerStatus, seen: SeenCache) -> None:
    """Record an accepted SyncerStatus's time as its syncer's mark (:func:`check_status_interval`)."""
    seen.set_mark(_status_mark(msg), msg.at_ms)


def check_status_interval(msg: SyncerStatus, seen: SeenCache) -> None:
    """[IGNORE] a SyncerStatus dated less than SYNCER_STATUS_INTERVAL_MS after the last one
    accepted for its (task, syncer).

    Why: a status carries no Tenzro signature, so anyone could publish thousands a second naming
    the current syncer with fresh ``at_ms`` values; every node and trainer relayed them, and each
    took a slot of the dedup cache, evicting the keys that stop replays (gossip probe,
    2026-11-26: ~53,000 accepted in 90 s from one peer). Now a syncer's statuses cost the network
    one message a second whoever sends them. A forger dating one up to the clock skew ahead
    silences the real syncer's advisory notes that long; nothing acts on them."""
    last = seen.get_mark(_status_mark(msg))
    if last is not None and msg.at_ms < last + SYNCER_STATUS_INTERVAL_MS:
        raise GossipIgnore(f"status at {msg.at_ms} is within {SYNCER_STATUS_INTERVAL_MS} ms of the last one")


def validate_round_finalized_gossip(msg: RoundFinalizedMsg, ctx: GossipContext, seen: SeenCache) -> None:
    """Rules for a RoundFinalizedMsg chunk.

    The receiver may be behind (the round is still open locally: the syncer must be the current one
    and the fragment count must fit) or up to date (the round record exists: every committed field
    must match it exactly).
    """
    # [REJECT] the message is a RoundFinalizedMsg.
    if not isinstance(msg, RoundFinalizedMsg):
        raise GossipReject("expected a RoundFinalizedMsg")
    key = compute_chunk_dedup_key("finalized", msg, ctx.source)
    # [IGNORE] not seen before (the same whole message).
    if key in seen:
        raise GossipIgnore("duplicate round-finalized chunk")
    run = _get_run(ctx, msg.task_id)
    # [REJECT] one aggregate hash per fragment.
    if len(msg.aggregate_hashes) != run.spec.architecture.fragment_count:
        raise GossipReject(f"{len(msg.aggregate_hashes)} aggregate hashes for {run.spec.architecture.fragment_count} fragments")
    _check_weights_size(msg.total_size, ctx, msg.task_id)
    if msg.round < len(run.records):
        record = run.records[msg.round]
        # [IGNORE] it is about the last finalized round (older ones are stale).
        if msg.round != len(run.records) - 1:
            raise GossipIgnore(f"round {msg.round} is stale")
        # [REJECT] syncer, aggregate hashes and model hash equal the committed round record.
        if (msg.syncer != record.syncer or msg.model_hash != record.model_hash
                or msg.aggregate_hashes != tuple(f.aggregate_hash for f in record.fragments)):
            raise GossipReject(f"round {msg.round} differs from the committed round record")
    else:
        # [IGNORE] it is about the round in progress (a later one: the receiver is behind).
        if run.status is not RunStatus.TRAINING or msg.round != run.round:
            raise GossipIgnore(f"round {msg.round} is not the round in progress here")
        # [REJECT] it comes from the run's current syncer.
        if get_current_syncer(run) != msg.syncer:
            raise GossipReject(f"0x{msg.syncer.hex()} is not the current syncer of {msg.task_id}")
    _check_held_weights(msg, key[3], ctx)
    # [REJECT] the syncer signed FinalizeRound{taskId, round}.
    check_signature_cached(FinalizeRound(msg.task_id, msg.round), msg.syncer_signature, msg.syncer, ctx.chain_id, seen)
    seen.add(key, stream=key[1])


def validate_run_sealed_gossip(msg: RunSealedMsg, ctx: GossipContext, seen: SeenCache) -> None:
    """Rules for RunSealedMsg: only relayed by peers that hold the sealed run and agree with it."""
    # [REJECT] the message is a RunSealedMsg.
    if not isinstance(msg, RunSealedMsg):
        raise GossipReject("expected a RunSealedMsg")
    key = ("sealed", msg.task_id, msg.run_root, msg.final_model_hash)
    # [IGNORE] not seen before.
    if key in seen:
        raise GossipIgnore("duplicate run-sealed")
    run = _get_run(ctx, msg.task_id)
    # [IGNORE] the receiver knows the run as Sealed (it cannot check the claim otherwise).
    if run.status is not RunStatus.SEALED or run.run_root is None or run.final_record is None:
        raise GossipIgnore(f"run {msg.task_id} is not sealed here")
    # [REJECT] run root and final model hash equal the sealed ones.
    if msg.run_root != run.run_root or msg.final_model_hash != run.final_record.final_model_hash:
        raise GossipReject(f"run root or final model hash differs from the sealed run {msg.task_id}")
    seen.add(key)


_VALIDATORS: dict[MessageKind, Callable[..., None]] = {
    MessageKind.PAYLOAD_CHUNK: validate_payload_chunk_gossip,
    MessageKind.MODEL_REQUEST: validate_model_request_gossip,
    MessageKind.MODEL_CHUNK: validate_model_chunk_gossip,
    MessageKind.ELECTION_TICKET: validate_election_ticket_gossip,
    MessageKind.SYNCER_STATUS: validate_syncer_status_gossip,
    MessageKind.ROUND_FINALIZED: validate_round_finalized_gossip,
    MessageKind.RUN_SEALED: validate_run_sealed_gossip,
}


def validate_gossip(topic: str, data: bytes, ctx: GossipContext, seen: SeenCache) -> GossipMessage:
    """Decode ``data`` received on ``topic`` and run its rules; return the message if it passes.

    The topic validator of the p2p host calls this. Raises GossipReject or GossipIgnore only.
    """
    msg = decode_message(data)
    # [REJECT] the message type belongs to the topic it arrived on.
    if _TOPIC_OF[msg.KIND] != topic:
        raise GossipReject(f"{msg.KIND.name} does not belong on topic {topic}")
    _VALIDATORS[msg.KIND](msg, ctx, seen)
    return msg
