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

from tenzro_training.gossip.chunks import (
    ChunkAssembler,
    StreamSizes,
    compute_chunk_dedup_key,
    compute_chunks,
    compute_model_chunks,
    compute_payload_chunks,
    compute_round_finalized_chunks,
    compute_stream_key,
    compute_stream_sizes,
)
from tenzro_training.gossip.messages import (
    GOSSIP_VERSION,
    MAX_AGGREGATE_HASHES,
    MAX_CHUNK_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_TOTAL_CHUNKS,
    MESSAGE_VERSIONS,
    SYNCER_STATUSES,
    TOPIC_SYNCER,
    TOPIC_TRAINING,
    ChunkedMessage,
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
    compute_model_request,
    decode_message,
    encode_message,
    get_topic,
    validate_chunk_geometry,
)
from tenzro_training.gossip.validation import (
    SYNCER_STATUS_INTERVAL_MS,
    GossipContext,
    SeenCache,
    WeightsDigests,
    check_signature_cached,
    check_status_interval,
    note_status,
    validate_election_ticket_gossip,
    validate_gossip,
    validate_model_chunk_gossip,
    validate_model_request_gossip,
    validate_payload_chunk_gossip,
    validate_round_finalized_gossip,
    validate_run_sealed_gossip,
    validate_syncer_status_gossip,
)

__all__ = [
    "TOPIC_TRAINING",
    "TOPIC_SYNCER",
    "GOSSIP_VERSION",
    "MESSAGE_VERSIONS",
    "MAX_CHUNK_BYTES",
    "MAX_MESSAGE_BYTES",
    "MAX_AGGREGATE_HASHES",
    "MAX_TOTAL_CHUNKS",
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
