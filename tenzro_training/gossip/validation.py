"""The ``validate_*_gossip`` rules of both topics (consensus-specs style: every check under a
``# [REJECT]`` or ``# [IGNORE]`` comment), over an explicit run view (GossipContext) and dedup
cache (SeenCache)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from tenzro_training.auth import (
    DEFAULT_CHAIN_ID,
    AuthError,
    FinalizeRound,
    RequestModel,
    SubmitOuterGradient,
    validate_signer,
)
from tenzro_training.election import validate_ticket
from tenzro_training.errors import ElectionError, GossipIgnore, GossipReject
from tenzro_training.gossip.chunks import StreamSizes, compute_chunk_dedup_key
from tenzro_training.gossip.messages import (
    MAX_CHUNK_BYTES,
    ElectionTicketMsg,
    GossipMessage,
    MessageKind,
    ModelChunk,
    ModelRequest,
    PayloadChunk,
    RoundFinalizedMsg,
    RunSealedMsg,
    SyncerStatus,
    compute_chunk_count,
    decode_message,
    get_topic,
)
from tenzro_training.records import Candidate
from tenzro_training.run_state import RunState, RunStatus, get_current_syncer, get_trainer


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
    if get_topic(msg) != topic:
        raise GossipReject(f"{msg.KIND.name} does not belong on topic {topic}")
    _VALIDATORS[msg.KIND](msg, ctx, seen)
    return msg
