"""Large byte strings on the wire: cutting payloads and weights into canonical chunks, the keys
that tell chunk streams apart, and ChunkAssembler, the bounded reassembly buffer that hands a
byte string back only whole and hash-checked."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tenzro_training.errors import GossipReject
from tenzro_training.fragments import FragmentLayout
from tenzro_training.gossip.messages import (
    MAX_CHUNK_BYTES,
    ChunkedMessage,
    ModelChunk,
    PayloadChunk,
    RoundFinalizedMsg,
    compute_chunk_count,
    validate_chunk_geometry,
)
from tenzro_training.payload import compute_max_payload_bytes


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
