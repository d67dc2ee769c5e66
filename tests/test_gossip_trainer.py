"""The trainer's gossip rules (tenzro_training.gossip_trainer), against a view built by the real
getRun renderer from a run driven through the real transitions (tests/test_gossip.World)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenzro_training import gossip as g
from tenzro_training.election import make_ticket
from tenzro_training.errors import GossipIgnore, GossipReject
from tenzro_training.gossip import (
    TOPIC_SYNCER,
    TOPIC_TRAINING,
    ElectionTicketMsg,
    RunSealedMsg,
    SeenCache,
    SyncerStatus,
)
from tenzro_training.gossip_trainer import TrainerGossipView, validate_gossip_as_trainer
from tenzro_training.records import Ticket
from tenzro_training.run_state import compute_run_view
from tests.test_gossip import (
    CHAIN_ID,
    OUTSIDER_KEY,
    SYNCER_KEYS,
    SYNCERS,
    TASK,
    TRAINER_KEYS,
    TRAINERS,
    VRF_SECRETS,
    World,
    addr,
    finalized_chunks,
    h,
    payload_chunks,
    sample_messages,
)

MAX_PAYLOAD = 4096
MAX_MODEL = 64
"""The model size of the views (finalized_chunks carries 64 bytes of weights)."""


def make_view(w: World, **kw: object) -> TrainerGossipView:
    kw.setdefault("chain_id", CHAIN_ID)
    kw.setdefault("max_payload_bytes", MAX_PAYLOAD)
    kw.setdefault("max_model_bytes", MAX_MODEL)
    return TrainerGossipView.from_run_view(compute_run_view(w.run, 1_000), **kw)  # type: ignore[arg-type]


@pytest.fixture
def view() -> TrainerGossipView:
    w = World()
    w.to_training()
    return make_view(w)


def check(topic: str, msg: g.GossipMessage, view: TrainerGossipView | None, seen: SeenCache | None = None) -> None:
    validate_gossip_as_trainer(topic, g.encode_message(msg), view, seen if seen is not None else SeenCache())


def test_view_is_read_from_get_run(view: TrainerGossipView) -> None:
    assert view.task_id == TASK and view.fragment_count == 2 and view.round == 0
    assert view.trainers == frozenset(TRAINERS)
    assert view.syncers == frozenset(SYNCERS)
    assert len(view.election_seed) == 32


def test_invalid_view_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not a getRun view"):
        TrainerGossipView.from_run_view({"task_id": TASK}, chain_id=1, max_payload_bytes=1, max_model_bytes=1)


def test_invalid_view_with_a_non_integer_count_or_task_id_is_a_value_error() -> None:
    w = World()
    w.to_training()
    good = compute_run_view(w.run, 1_000)
    TrainerGossipView.from_run_view(good, chain_id=1, max_payload_bytes=1, max_model_bytes=1)
    bad = [("round", -1), ("round", 2.9), ("round", True), ("round", "0"),
           ("fragment_count", -2), ("fragment_count", "7"), ("fragment_count", 2.0), ("task_id", 7)]
    for key, value in bad:
        with pytest.raises(ValueError, match="not a getRun view"):
            TrainerGossipView.from_run_view({**good, key: value}, chain_id=1, max_payload_bytes=1, max_model_bytes=1)


def test_payload_chunk_from_an_enrolled_trainer_passes_once(view: TrainerGossipView) -> None:
    seen = SeenCache()
    chunk = payload_chunks(1)[0]
    check(TOPIC_TRAINING, chunk, view, seen)
    with pytest.raises(GossipIgnore, match="duplicate"):
        check(TOPIC_TRAINING, chunk, view, seen)


def test_invalid_payload_chunk_wrongly_signed_is_rejected_even_for_a_stranger(view: TrainerGossipView) -> None:
    with pytest.raises(GossipReject, match="bad signature"):
        check(TOPIC_TRAINING, payload_chunks(0, key=OUTSIDER_KEY)[0], view)  # names trainer 0, signed by outsider
    with pytest.raises(GossipReject, match="bad signature"):
        check(TOPIC_TRAINING, payload_chunks(0, signature=b"\0" * 65)[0], view)
    with pytest.raises(GossipReject, match="bad signature"):
        check(TOPIC_TRAINING, payload_chunks(0, sign_fragment=1)[0], view)  # signed for another fragment


def test_invalid_payload_chunk_rejected_copy_does_not_shadow_the_valid_one(view: TrainerGossipView) -> None:
    seen = SeenCache()
    with pytest.raises(GossipReject):
        check(TOPIC_TRAINING, payload_chunks(0, key=OUTSIDER_KEY)[0], view, seen)
    check(TOPIC_TRAINING, payload_chunks(0)[0], view, seen)


def test_payload_chunk_from_a_signer_the_view_does_not_know_is_ignored(view: TrainerGossipView) -> None:
    """Correctly signed by someone not enrolled as far as this (possibly stale) view knows: not
    relayed, not penalised."""
    from dataclasses import replace

    stale = replace(view, trainers=frozenset(TRAINERS[:1]))
    with pytest.raises(GossipIgnore, match="not a trainer"):
        check(TOPIC_TRAINING, payload_chunks(2)[0], stale)


def test_stale_payload_chunks_and_notices_are_ignored(view: TrainerGossipView) -> None:
    from dataclasses import replace

    later = replace(view, round=2)
    with pytest.raises(GossipIgnore, match="round 2 is in progress"):
        check(TOPIC_TRAINING, payload_chunks(0, round_=1)[0], later)
    check(TOPIC_TRAINING, payload_chunks(0, round_=2)[0], later)
    w = World()
    w.to_training()
    with pytest.raises(GossipIgnore, match="stale"):
        check(TOPIC_SYNCER, finalized_chunks(w, round_=0)[0], replace(make_view(w), round=2))
    check(TOPIC_SYNCER, finalized_chunks(w, round_=1)[0], replace(make_view(w), round=2))


def test_invalid_payload_chunk_fragment_or_size(view: TrainerGossipView) -> None:
    with pytest.raises(GossipReject, match="fragment 2 >= fragment_count 2"):
        check(TOPIC_TRAINING, payload_chunks(0, fragment=2)[0], view)
    with pytest.raises(GossipReject, match="exceeds 4096"):
        check(TOPIC_TRAINING, payload_chunks(0, payload=b"x" * (MAX_PAYLOAD + 1))[0], view)


def test_payload_chunk_of_exactly_the_size_limit_passes(view: TrainerGossipView) -> None:
    from dataclasses import replace

    check(TOPIC_TRAINING, payload_chunks(0, payload=b"x" * MAX_PAYLOAD)[0], view)
    per_fragment = replace(view, payload_bytes=(100, 50))
    check(TOPIC_TRAINING, payload_chunks(0, payload=b"x" * 100)[0], per_fragment)
    with pytest.raises(GossipReject, match="exceeds 100 [(]fragment 0[)]"):
        check(TOPIC_TRAINING, payload_chunks(0, payload=b"x" * 101)[0], per_fragment)


def test_chunks_of_a_dropped_stream_pass_again_for_every_chunked_kind() -> None:
    """The dedup cache indexes a chunk under (origin,) + stream key, what the assembler reports
    when it drops a stream: a republish of that stream is then not a duplicate."""
    w = World()
    w.to_training()
    view = make_view(w)
    cases = [
        (TOPIC_TRAINING, payload_chunks(0)[0]),
        (TOPIC_SYNCER, finalized_chunks(w)[0]),
        (TOPIC_TRAINING, g.compute_model_chunks(task_id=TASK, round=0, model_hash=h("m"), weights=b"\0" * MAX_MODEL)[0]),
    ]
    for topic, chunk in cases:
        seen = SeenCache()
        data = g.encode_message(chunk)
        validate_gossip_as_trainer(topic, data, view, seen, origin="peer")
        with pytest.raises(GossipIgnore, match="duplicate"):
            validate_gossip_as_trainer(topic, data, view, seen, origin="peer")
        seen.forget_stream(("peer",) + g.compute_stream_key(chunk))
        validate_gossip_as_trainer(topic, data, view, seen, origin="peer")


def test_messages_before_the_view_or_for_another_run_are_ignored(view: TrainerGossipView) -> None:
    from dataclasses import replace

    with pytest.raises(GossipIgnore, match="not this trainer's run"):
        check(TOPIC_TRAINING, payload_chunks(0)[0], None)
    with pytest.raises(GossipIgnore, match="not this trainer's run"):
        check(TOPIC_TRAINING, payload_chunks(0)[0], replace(view, task_id="another-run"))


def test_invalid_wrong_topic_or_garbage_is_rejected(view: TrainerGossipView) -> None:
    with pytest.raises(GossipReject, match="does not belong"):
        check(TOPIC_SYNCER, payload_chunks(0)[0], view)
    with pytest.raises(GossipReject):
        validate_gossip_as_trainer(TOPIC_TRAINING, b"\x01\x01garbage", view, SeenCache())


def test_round_finalized_from_a_ranked_syncer_passes() -> None:
    w = World()
    w.to_training()
    check(TOPIC_SYNCER, finalized_chunks(w)[0], make_view(w))


def test_invalid_round_finalized_forged_or_malformed() -> None:
    w = World()
    w.to_training()
    view = make_view(w)
    forged = finalized_chunks(w, syncer_key=OUTSIDER_KEY, syncer=SYNCERS[0])  # names a syncer, an outsider signs
    with pytest.raises(GossipReject, match="bad signature"):
        check(TOPIC_SYNCER, forged[0], view)
    with pytest.raises(GossipReject, match="1 aggregate hashes for 2"):
        check(TOPIC_SYNCER, finalized_chunks(w, aggregate_hashes=(h("x"),))[0], view)
    with pytest.raises(GossipReject, match="the model has 64"):
        check(TOPIC_SYNCER, finalized_chunks(w, weights=b"\0" * (MAX_MODEL + 8))[0], view)
    with pytest.raises(GossipReject, match="the model has 64"):  # shorter weights too
        check(TOPIC_SYNCER, finalized_chunks(w, weights=b"\0" * 8)[0], view)
    stranger = finalized_chunks(w, syncer_key=OUTSIDER_KEY)  # signed by itself, but not ranked
    with pytest.raises(GossipIgnore, match="not a ranked syncer"):
        check(TOPIC_SYNCER, stranger[0], view)


def test_weights_are_taken_only_from_the_trainers_node() -> None:
    """RoundFinalized and ModelChunk streams carry weights no Tenzro signature covers, so a
    trainer takes (and relays) them only when libp2p says its node published them; every other
    message type is judged as before, whoever published it."""
    w = World()
    w.to_training()
    view = make_view(w)
    node, other = "16Uiu2HAmNode", "16Uiu2HAmOther"
    weights_msgs = [(TOPIC_SYNCER, finalized_chunks(w)[0]),
                    (TOPIC_TRAINING, g.compute_model_chunks(task_id=TASK, round=0, model_hash=h("m"),
                                                            weights=b"\1" * MAX_MODEL)[0])]
    for topic, msg in weights_msgs:
        data = g.encode_message(msg)
        seen = SeenCache()
        with pytest.raises(GossipIgnore, match="not by this trainer's node"):
            validate_gossip_as_trainer(topic, data, view, seen, origin=other, model_sources=frozenset({node}))
        # Ignored, not remembered: the node's own copy of the same bytes still passes.
        validate_gossip_as_trainer(topic, data, view, seen, origin=node, model_sources=frozenset({node}))
        # No model_sources (a relay that uses no weights): any origin.
        validate_gossip_as_trainer(topic, data, view, SeenCache(), origin=other)
    # A payload chunk is signed by its trainer: its libp2p origin does not matter.
    validate_gossip_as_trainer(TOPIC_TRAINING, g.encode_message(payload_chunks(0)[0]), view, SeenCache(),
                               origin=other, model_sources=frozenset({node}))


def test_tickets_need_a_proof_over_the_run_seed(view: TrainerGossipView) -> None:
    good = ElectionTicketMsg(task_id=TASK, ticket=make_ticket(VRF_SECRETS[0], SYNCERS[0], view.election_seed))
    seen = SeenCache()
    check(TOPIC_SYNCER, good, view, seen)
    with pytest.raises(GossipIgnore, match="duplicate"):
        check(TOPIC_SYNCER, good, view, seen)
    wrong_seed = ElectionTicketMsg(task_id=TASK, ticket=make_ticket(VRF_SECRETS[0], SYNCERS[0], b"\x09" * 32))
    with pytest.raises(GossipReject, match="invalid ticket proof"):
        check(TOPIC_SYNCER, wrong_seed, view)
    garbage = ElectionTicketMsg(task_id=TASK, ticket=Ticket(SYNCERS[0], wrong_seed.ticket.vrf_public_key, b"\x05" * 80))
    with pytest.raises(GossipReject, match="invalid ticket proof"):
        check(TOPIC_SYNCER, garbage, view)


def test_model_request_status_and_sealed_rules(view: TrainerGossipView) -> None:
    check(TOPIC_TRAINING, g.compute_model_request(task_id=TASK, round=0, nonce=1, private_key=TRAINER_KEYS[0],
                                                 chain_id=CHAIN_ID), view)
    with pytest.raises(GossipIgnore, match="not a trainer"):
        check(TOPIC_TRAINING, g.compute_model_request(task_id=TASK, round=0, nonce=1, private_key=OUTSIDER_KEY,
                                                     chain_id=CHAIN_ID), view)
    spoofed = dataclasses.replace(
        g.compute_model_request(task_id=TASK, round=0, nonce=1, private_key=OUTSIDER_KEY, chain_id=CHAIN_ID),
        requester=TRAINERS[0])
    with pytest.raises(GossipReject, match="bad signature"):
        check(TOPIC_TRAINING, spoofed, view)
    check(TOPIC_SYNCER, SyncerStatus(task_id=TASK, syncer=SYNCERS[0], round=0, status="aggregating", at_ms=5), view)
    with pytest.raises(GossipIgnore, match="not a ranked syncer"):
        check(TOPIC_SYNCER, SyncerStatus(task_id=TASK, syncer=addr(SYNCER_KEYS[0])[::-1], round=0,
                                         status="aggregating", at_ms=5), view)
    seen = SeenCache()
    sealed = RunSealedMsg(task_id=TASK, run_root=h("root"), final_model_hash=h("final"))
    check(TOPIC_SYNCER, sealed, view, seen)
    with pytest.raises(GossipIgnore, match="duplicate"):
        check(TOPIC_SYNCER, sealed, view, seen)
    with pytest.raises(GossipReject, match="the model has 64"):
        check(TOPIC_TRAINING, g.compute_model_chunks(task_id=TASK, round=1, model_hash=h("m"),
                                                      weights=b"\1" * (MAX_MODEL + 4))[0], view)
    # Reviewer repro node_relays.py / forged_model.py: an unsigned ModelChunk naming the
    # committed hash with weights of another size is stopped at the first relay.
    with pytest.raises(GossipReject, match="the model has 64"):
        check(TOPIC_TRAINING, g.compute_model_chunks(task_id=TASK, round=1, model_hash=h("m"),
                                                      weights=b"\1" * 8)[0], view)
    check(TOPIC_TRAINING, g.compute_model_chunks(task_id=TASK, round=1, model_hash=h("m"),
                                                  weights=b"\1" * MAX_MODEL)[0], view)


_ENCODED = [g.encode_message(m) for m in sample_messages()]


@settings(max_examples=200, deadline=None)
@given(base=st.sampled_from(_ENCODED), pos=st.integers(0, 2000), patch=st.binary(min_size=1, max_size=8),
       topic=st.sampled_from([TOPIC_TRAINING, TOPIC_SYNCER]))
def test_fuzz_mutated_messages_only_reject_or_ignore(base: bytes, pos: int, patch: bytes, topic: str) -> None:
    w = World()
    w.to_training()
    data = base[:pos] + patch + base[pos + len(patch):]
    try:
        validate_gossip_as_trainer(topic, data, make_view(w), SeenCache())
    except (GossipReject, GossipIgnore):
        pass
