"""The gossip rules a TRAINER applies before it delivers or relays a message.

Why a second rule set: a trainer holds getRun's JSON view of its run, not a ``RunState``, so
it cannot run the node's ``gossip.validate_*_gossip`` rules, yet in a gossipsub mesh it relays
whatever its validator passes. Before these rules it relayed anything that decoded, so an
outsider connected to one trainer could have every trainer forward forged payload chunks and
finalize notices. These rules check every SIGNED claim a trainer can check from its view, and
nothing that a stale view could get wrong:

- REJECT (the sender is penalised, nothing relayed) only for what is wrong whatever the run's
  state: a message that does not decode or is on the wrong topic, a fragment index or size
  beyond the run's, a signature that does not recover to the claimed signer, a VRF proof that
  does not verify under the ticket's own key;
- IGNORE (not relayed, no penalty) for what the view cannot vouch for: another run, a signer
  that is not (yet) among the run's trainers or ranked syncer candidates, a duplicate.

What the trainer USES is checked again on the whole message (weights against the committed
model hash, trainer/process.py). The node applies the full rules (gossip/validation.py).

Pure core: no I/O. ``TrainerGossipView.from_run_view`` parses the getRun JSON; the trainer's
shell swaps in a new view each time it polls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tenzro_training import vrf
from tenzro_training.addresses import parse_address
from tenzro_training.auth import AuthError, FinalizeRound, SubmitOuterGradient, validate_signer
from tenzro_training.errors import GossipIgnore, GossipReject, TenzroError, VRFError
from tenzro_training.gossip import (
    ElectionTicketMsg,
    GossipMessage,
    ModelChunk,
    ModelRequest,
    PayloadChunk,
    RoundFinalizedMsg,
    RunSealedMsg,
    SeenCache,
    SyncerStatus,
    check_signature_cached,
    check_status_interval,
    compute_chunk_dedup_key,
    decode_message,
    get_topic,
    note_status,
)

__all__ = ["TrainerGossipView", "find_round_finalized_mismatch", "validate_gossip_as_trainer"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainerGossipView:
    """What a trainer knows about its run, as its validators need it."""

    task_id: str
    round: int
    """The round in progress as of the view (it only grows, so an older message is stale)."""
    fragment_count: int
    trainers: frozenset[bytes]
    """20-byte addresses of the run's enrolled, unslashed trainers."""
    syncers: frozenset[bytes]
    """20-byte addresses of every ranked syncer candidate: failover can make any of them the syncer."""
    election_seed: bytes
    chain_id: int
    max_payload_bytes: int
    """The largest payload any fragment admits (``payload.compute_max_payload_bytes``)."""
    max_model_bytes: int
    """The model's EXACT size: 4 bytes per parameter of the fragments. Weights streams
    (RoundFinalizedMsg, ModelChunk) of any other size are rejected."""
    payload_bytes: tuple[int, ...] = ()
    """Per fragment, the largest payload its layout admits (empty: ``max_payload_bytes`` for all)."""

    @classmethod
    def from_run_view(
        cls, view: Mapping[str, Any], *, chain_id: int, max_payload_bytes: int, max_model_bytes: int,
        payload_bytes: tuple[int, ...] = (),
    ) -> TrainerGossipView:
        """From ``tenzro_training_getRun``'s result (ValueError if it is not one)."""
        def count(key: str) -> int:  # a JSON integer: int() took 2.9 as round 2 and "7" as 7
            value = view[key]
            if type(value) is not int or value < 0:
                raise ValueError(f"{key} is {value!r}, not a non-negative integer")
            return value

        try:
            ranking = view["election"]["ranking"] or []
            seed_hex = view["election"]["seed"]
            if not isinstance(view["task_id"], str):
                raise ValueError("task_id is not a string")
            return cls(
                task_id=view["task_id"],
                round=count("round"),
                fragment_count=count("fragment_count"),
                trainers=frozenset(
                    parse_address(t["address"]) for t in view["trainers"] if not t["slashed"]
                ),
                syncers=frozenset(parse_address(c["address"]) for c in ranking),
                election_seed=bytes.fromhex(seed_hex[2:] if seed_hex.startswith("0x") else seed_hex),
                chain_id=chain_id,
                max_payload_bytes=max_payload_bytes,
                max_model_bytes=max_model_bytes,
                payload_bytes=tuple(payload_bytes),
            )
        except (KeyError, TypeError, AttributeError, ValueError, TenzroError) as exc:
            raise ValueError(f"not a getRun view: {exc!r}") from None


def validate_gossip_as_trainer(
    topic: str, data: bytes, view: TrainerGossipView | None, seen: SeenCache, *,
    origin: str | None = None, model_sources: frozenset[str] | None = None,
) -> GossipMessage:
    """Decode ``data`` from ``topic`` and apply the trainer rules; GossipReject or GossipIgnore.

    ``view`` None (the trainer has not read its run yet) ignores everything that decodes.
    ``origin`` is the libp2p peer id that published the message (its libp2p signature, checked
    before any topic validator, covers the data); ``model_sources`` the peers whose weights
    streams this trainer takes, its node's (None: any peer's, for a relay that uses no weights).
    """
    msg = decode_message(data)
    # [REJECT] the message type belongs to the topic it arrived on.
    if get_topic(msg) != topic:
        raise GossipReject(f"{type(msg).__name__} does not belong on {topic}")
    # [IGNORE] it is about this trainer's run (the trainer knows no other).
    if view is None or msg.task_id != view.task_id:
        raise GossipIgnore(f"not this trainer's run: {msg.task_id}")
    # [IGNORE] weights (RoundFinalizedMsg, ModelChunk) come from this trainer's node. Neither
    # Tenzro signature covers the weight bytes, so a peer could otherwise publish a well-sized
    # stream naming the committed hash with other bytes, and every trainer would relay it.
    # IGNORE, not REJECT: another node of the network may be honest, just not ours.
    if (isinstance(msg, (RoundFinalizedMsg, ModelChunk)) and model_sources is not None
            and origin not in model_sources):
        raise GossipIgnore(f"weights published by {origin}, not by this trainer's node")
    if isinstance(msg, PayloadChunk):
        _payload_chunk(msg, view, seen, origin)
    elif isinstance(msg, RoundFinalizedMsg):
        _round_finalized(msg, view, seen, origin)
    elif isinstance(msg, ModelChunk):
        key = compute_chunk_dedup_key("model-chunk", msg, origin)
        _dedup(key, seen)
        _check_model_size(msg.total_size, view)
        seen.add(key, stream=key[1])  # the hash is checked against the committed one on the whole model
    elif isinstance(msg, ModelRequest):
        key = ("model-request", msg.task_id, msg.requester, msg.round, msg.nonce)
        _dedup(key, seen)
        # [REJECT] the requester it names signed RequestModel{taskId, requester, round, nonce}.
        check_signature_cached(msg.signed_message(), msg.signature, msg.requester, view.chain_id, seen)
        # [IGNORE] the requester is one of the run's trainers.
        if msg.requester not in view.trainers:
            raise GossipIgnore(f"0x{msg.requester.hex()} is not a trainer of {msg.task_id} here")
        seen.add(key)
    elif isinstance(msg, ElectionTicketMsg):
        _ticket(msg, view, seen)
    elif isinstance(msg, SyncerStatus):
        key = ("status", msg.task_id, msg.syncer, msg.round, msg.status, msg.at_ms)
        _dedup(key, seen)
        # [IGNORE] it is about one of the run's syncer candidates.
        if msg.syncer not in view.syncers:
            raise GossipIgnore(f"0x{msg.syncer.hex()} is not a ranked syncer of {msg.task_id} here")
        check_status_interval(msg, seen)  # unsigned: one a second per syncer, whoever sends them
        seen.add(key)
        note_status(msg, seen)
    elif isinstance(msg, RunSealedMsg):
        key = ("sealed", msg.task_id, msg.run_root, msg.final_model_hash)
        _dedup(key, seen)
        seen.add(key)  # unsigned: the trainer re-reads the sealed run over JSON-RPC before using it
    return msg


def _check_model_size(total_size: int, view: TrainerGossipView) -> None:
    # [REJECT] the weights are exactly the run's model (4 bytes per parameter of its fragments).
    if total_size != view.max_model_bytes:
        raise GossipReject(f"weights of {total_size} bytes, the model has {view.max_model_bytes}")


def _dedup(key: tuple[object, ...], seen: SeenCache) -> None:
    # [IGNORE] not seen before.
    if key in seen:
        raise GossipIgnore("duplicate")


def _payload_chunk(msg: PayloadChunk, view: TrainerGossipView, seen: SeenCache, origin: str | None) -> None:
    key = compute_chunk_dedup_key("payload", msg, origin)
    _dedup(key, seen)
    # [IGNORE] not for a round that had ended when the view was read (a replay of old chunks).
    if msg.round < view.round:
        raise GossipIgnore(f"payload for round {msg.round}, round {view.round} is in progress")
    # [REJECT] the fragment exists.
    if msg.fragment >= view.fragment_count:
        raise GossipReject(f"fragment {msg.fragment} >= fragment_count {view.fragment_count}")
    # [REJECT] the payload is not larger than the node accepts.
    limit = view.payload_bytes[msg.fragment] if msg.fragment < len(view.payload_bytes) else view.max_payload_bytes
    if msg.total_size > limit:
        raise GossipReject(f"payload of {msg.total_size} bytes exceeds {limit} (fragment {msg.fragment})")
    # [REJECT] the signature recovers to the trainer it names (checked before membership, so a
    # forged chunk is penalised even when it names a stranger).
    signed = SubmitOuterGradient(msg.task_id, msg.round, msg.fragment, msg.payload_hash)
    check_signature_cached(signed, msg.signature, msg.trainer, view.chain_id, seen)
    # [IGNORE] that trainer is enrolled and unslashed as far as this view knows.
    if msg.trainer not in view.trainers:
        raise GossipIgnore(f"0x{msg.trainer.hex()} is not a trainer of {msg.task_id} here")
    seen.add(key, stream=key[1])


def _round_finalized(msg: RoundFinalizedMsg, view: TrainerGossipView, seen: SeenCache, origin: str | None) -> None:
    key = compute_chunk_dedup_key("finalized", msg, origin)
    _dedup(key, seen)
    # [IGNORE] not older than the last finalized round as of the view (late joiners use ModelRequest).
    if msg.round + 1 < view.round:
        raise GossipIgnore(f"round {msg.round} is stale, round {view.round} is in progress")
    # [REJECT] one aggregate hash per fragment.
    if len(msg.aggregate_hashes) != view.fragment_count:
        raise GossipReject(f"{len(msg.aggregate_hashes)} aggregate hashes for {view.fragment_count} fragments")
    _check_model_size(msg.total_size, view)
    # [REJECT] the syncer it names signed FinalizeRound{taskId, round}.
    check_signature_cached(FinalizeRound(msg.task_id, msg.round), msg.syncer_signature, msg.syncer, view.chain_id, seen)
    # [IGNORE] that syncer is one of the run's ranked candidates.
    if msg.syncer not in view.syncers:
        raise GossipIgnore(f"0x{msg.syncer.hex()} is not a ranked syncer of {msg.task_id} here")
    seen.add(key, stream=key[1])


def _ticket(msg: ElectionTicketMsg, view: TrainerGossipView, seen: SeenCache) -> None:
    ticket = msg.ticket
    key = ("ticket", msg.task_id, ticket.address, ticket.vrf_public_key, ticket.proof)
    _dedup(key, seen)
    # [REJECT] the proof verifies over the run's election seed under the ticket's own key (whether
    # that key is the candidate's REGISTERED key only the node knows: it checks again).
    try:
        vrf.verify(ticket.vrf_public_key, view.election_seed, ticket.proof)
    except VRFError as exc:
        raise GossipReject(f"invalid ticket proof: {exc}") from None
    seen.add(key)


def find_round_finalized_mismatch(
    msg: RoundFinalizedMsg, record_syncer: bytes, committed_model_hash: bytes, chain_id: int
) -> str | None:
    """Why a reassembled RoundFinalized is not the one the run's round record commits to, or None.

    The node makes these checks in ``gossip.validate_round_finalized_gossip`` against its
    RunState; a trainer makes them here, once the round record is in its getRun view, before it
    applies the weights (a ranked candidate that is not the round's syncer passes the relay rules).
    """
    if msg.syncer != record_syncer:
        return f"from 0x{msg.syncer.hex()}, the record names 0x{record_syncer.hex()}"
    try:
        validate_signer(FinalizeRound(task_id=msg.task_id, round=msg.round), msg.syncer_signature,
                        record_syncer, chain_id)
    except AuthError as exc:
        return f"bad syncer signature: {exc}"
    if msg.model_hash != committed_model_hash:
        return f"names model 0x{msg.model_hash.hex()}, the record commits 0x{committed_model_hash.hex()}"
    return None
