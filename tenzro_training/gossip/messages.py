"""The gossip messages: topics, typed and versioned message values (built from untrusted bytes:
construction checks every field) and their one canonical byte encoding."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import ClassVar, Union

from eth_account import Account

from tenzro_training.auth import DEFAULT_CHAIN_ID, RequestModel, sign_message
from tenzro_training.errors import ElectionError, GossipReject
from tenzro_training.records import Ticket, is_valid_task_id


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


def compute_model_request(*, task_id: str, round: int, nonce: int, private_key: bytes,
                          chain_id: int = DEFAULT_CHAIN_ID) -> ModelRequest:
    """A ModelRequest (version 2) signed by ``private_key``'s account, the requester."""
    requester = bytes.fromhex(Account.from_key(private_key).address[2:])
    signature = sign_message(RequestModel(task_id, requester, round, nonce), private_key, chain_id)
    return ModelRequest(task_id=task_id, requester=requester, round=round, nonce=nonce, signature=signature)
