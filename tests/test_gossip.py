"""Gossip message schemas, validation rules and reassembly (pure; no network).

The run views are real RunStates driven through the lifecycle transitions, with trainers and
syncer candidates that hold real secp256k1 keys, so every signature rule is exercised with real
EIP-712 signatures (right signer, wrong signer, wrong fields, garbage).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from typing import Any

import pytest
from eth_account import Account
from hypothesis import given, settings
from hypothesis import strategies as st

from tenzro_training import gossip as g
from tenzro_training.gossip import messages as gossip_messages
from tenzro_training import vrf
from tenzro_training.auth import FinalizeRound, SubmitOuterGradient, sign_message
from tenzro_training.election import make_ticket
from tenzro_training.errors import GossipIgnore, GossipReject
from tenzro_training.gossip import (
    MAX_CHUNK_BYTES,
    TOPIC_SYNCER,
    TOPIC_TRAINING,
    ChunkAssembler,
    ElectionTicketMsg,
    GossipContext,
    ModelRequest,
    PayloadChunk,
    RoundFinalizedMsg,
    RunSealedMsg,
    SeenCache,
    SyncerStatus,
    WeightsDigests,
)
from tenzro_training.ledger import Ledger, credit
from tenzro_training.records import Candidate, FragmentOutcome, Ticket
from tenzro_training.run import (
    process_enroll,
    process_finalize,
    process_post_task,
    process_submission,
    process_tick,
    process_ticket,
)
from tenzro_training.run_state import (
    RunStatus,
    RunTimings,
    get_accepted_submissions,
    get_current_syncer,
    get_trainer,
)
from tests.test_run import make_spec

TASK = "run-test"
CHAIN_ID = 1337
SPONSOR_KEY = b"\x51" * 32
TRAINER_KEYS = [bytes([0x61 + i]) * 32 for i in range(3)]
OUTSIDER_KEY = b"\x7f" * 32
SYNCER_KEYS = [bytes([0x91 + i]) * 32 for i in range(2)]
VRF_SECRETS = [bytes([0xA1 + i]) * 32 for i in range(2)]
TIMINGS = RunTimings(election_window_ms=100, enrollment_window_ms=1_000, round_timeout_ms=100_000,
                     finalize_window_ms=50_000, min_stake=10)
INITIAL_MODEL = hashlib.sha256(b"initial").digest()


def addr(key: bytes) -> bytes:
    return bytes.fromhex(Account.from_key(key).address[2:])


SPONSOR = addr(SPONSOR_KEY)
TRAINERS = [addr(k) for k in TRAINER_KEYS]
OUTSIDER = addr(OUTSIDER_KEY)
SYNCERS = [addr(k) for k in SYNCER_KEYS]
CANDIDATES = {SYNCERS[i]: Candidate(SYNCERS[i], vrf.public_key(VRF_SECRETS[i]), 100) for i in range(2)}


def h(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


class World:
    """A run driven through the real transitions; ``view`` is what a validator may see."""

    def __init__(self) -> None:
        spec = make_spec(sponsor_address="0x" + SPONSOR.hex())
        ledger = credit(Ledger(), SPONSOR, 10_000)
        for t in TRAINERS:
            ledger = credit(ledger, t, 1_000)
        t = process_post_task(spec, SPONSOR, ledger, 0, TIMINGS, INITIAL_MODEL)
        self.run, self.ledger = t.run, t.ledger
        self.electing = self.run

    def step(self, fn: Callable[..., Any], *args: Any) -> None:
        t = fn(self.run, self.ledger, *args)
        self.run, self.ledger = t.run, t.ledger

    def elect(self) -> None:
        for i, s in enumerate(SYNCERS):
            self.step(process_ticket, CANDIDATES[s], make_ticket(VRF_SECRETS[i], s, self.run.election.seed), 10 + i)
        self.step(process_tick, TIMINGS.election_window_ms + 1)

    def to_training(self) -> None:
        self.elect()
        for i, t in enumerate(TRAINERS):
            self.step(process_enroll, t, f"did:tenzro:node:t{i}", 50, 200 + i)
        assert self.run.status is RunStatus.TRAINING

    def finalize_round(self, now: int) -> None:
        r = self.run.round
        for t in TRAINERS[:2]:
            for f in range(2):
                self.step(process_submission, t, r, f, h(f"{t.hex()}/{r}/{f}"), now)
        outcomes = [
            FragmentOutcome(h(f"agg/{r}/{f}"), tuple(a for a, _ in get_accepted_submissions(self.run, f)), 0, 0, h("rep"))
            for f in range(2)
        ]
        syncer = get_current_syncer(self.run)
        self.step(process_finalize, syncer, r, outcomes, h(f"model/{r}"), now + 2_000)

    def ctx(self, now_ms: int = 1_000, **kw: Any) -> GossipContext:
        run = self.run
        kw.setdefault("chain_id", CHAIN_ID)
        return GossipContext(get_run=lambda task: run if task == TASK else None, get_candidate=CANDIDATES.get,
                             now_ms=now_ms, **kw)


@pytest.fixture
def training() -> World:
    w = World()
    w.to_training()
    return w


def payload_chunks(trainer_index: int = 0, *, round_: int = 0, fragment: int = 0, payload: bytes = b"p" * 100,
                   key: bytes | None = None, sign_round: int | None = None, sign_fragment: int | None = None,
                   signature: bytes | None = None) -> list[PayloadChunk]:
    digest = hashlib.sha256(payload).digest()
    if signature is None:
        msg = SubmitOuterGradient(TASK, round_ if sign_round is None else sign_round,
                                  fragment if sign_fragment is None else sign_fragment, digest)
        signature = sign_message(msg, key or TRAINER_KEYS[trainer_index], CHAIN_ID)
    return g.compute_payload_chunks(task_id=TASK, round=round_, fragment=fragment, trainer=TRAINERS[trainer_index],
                                    signature=signature, payload=payload)


def finalized_chunks(w: World, *, round_: int = 0, syncer_key: bytes | None = None, syncer: bytes | None = None,
                     aggregate_hashes: tuple[bytes, ...] | None = None, model_hash: bytes | None = None,
                     weights: bytes = b"\0" * 64) -> list[RoundFinalizedMsg]:
    current = get_current_syncer(w.run)
    if syncer_key is None:
        syncer_key = SYNCER_KEYS[SYNCERS.index(current)] if current in SYNCERS else SYNCER_KEYS[0]
    return g.compute_round_finalized_chunks(
        task_id=TASK, round=round_, syncer=syncer or addr(syncer_key),
        syncer_signature=sign_message(FinalizeRound(TASK, round_), syncer_key, CHAIN_ID),
        aggregate_hashes=aggregate_hashes or (h(f"agg/{round_}/0"), h(f"agg/{round_}/1")),
        model_hash=model_hash or h(f"model/{round_}"), weights=weights,
    )


def sample_messages() -> list[g.GossipMessage]:
    proof_ticket = make_ticket(VRF_SECRETS[0], SYNCERS[0], b"\x01" * 32)
    return [
        payload_chunks(payload=os.urandom(10))[0],
        ElectionTicketMsg(task_id=TASK, ticket=proof_ticket),
        SyncerStatus(task_id=TASK, syncer=SYNCERS[0], round=3, status="aggregating", at_ms=123),
        g.compute_round_finalized_chunks(task_id=TASK, round=1, syncer=SYNCERS[0], syncer_signature=b"\x01" * 65,
                                         aggregate_hashes=(h("a"), h("b")), model_hash=h("m"), weights=b"\0" * 8)[0],
        g.compute_model_request(task_id=TASK, round=2, nonce=2**64 - 1, private_key=TRAINER_KEYS[0], chain_id=CHAIN_ID),
        g.compute_model_chunks(task_id=TASK, round=1, model_hash=h("m"), weights=b"\1" * 12)[0],
        RunSealedMsg(task_id=TASK, run_root=h("root"), final_model_hash=h("final")),
    ]


# --- schemas ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("msg", sample_messages(), ids=lambda m: type(m).__name__)
def test_every_message_round_trips_canonically(msg: g.GossipMessage) -> None:
    data = g.encode_message(msg)
    assert data[0] == msg.KIND and data[1] == g.MESSAGE_VERSIONS[msg.KIND]
    assert g.decode_message(data) == msg
    assert g.encode_message(g.decode_message(data)) == data


@pytest.mark.parametrize("msg", sample_messages(), ids=lambda m: type(m).__name__)
def test_a_field_that_would_encode_otherwise_is_non_canonical(msg: g.GossipMessage, monkeypatch: pytest.MonkeyPatch) -> None:
    """The canonical check compares the encoding's pieces in place (no joined copy of a 1 MiB
    chunk): a piece that differs from what was parsed, or pieces that cover less or more than
    the message, are refused. No field's parse is lossy today; a future one would be caught."""
    data = g.encode_message(msg)
    parts = gossip_messages._encoded_parts(msg)
    assert b"".join(parts) == data
    last = parts[-1]
    variants = [
        parts[:-1] + [bytes([last[0] ^ 1]) + last[1:]] if last else parts[:-1] + [b"x"],  # one byte differs
        parts[:-1] + [last, b"\0"],  # longer than the message
        [parts[0]] + parts[1:-1] + ([last[:-1]] if last else []),  # shorter
    ]
    for variant in variants:
        monkeypatch.setattr(gossip_messages, "_encoded_parts", lambda m, v=variant: v)
        with pytest.raises(GossipReject, match="non-canonical"):
            g.decode_message(data)


def test_topics_of_message_types() -> None:
    topics = [g.get_topic(m) for m in sample_messages()]
    assert topics == [TOPIC_TRAINING, TOPIC_SYNCER, TOPIC_SYNCER, TOPIC_SYNCER, TOPIC_TRAINING, TOPIC_TRAINING,
                      TOPIC_SYNCER]


def test_encoding_is_pinned() -> None:
    # A reference vector: changing the layout must be a deliberate version bump.
    msg = RunSealedMsg(task_id="t", run_root=b"\x01" * 32, final_model_hash=b"\x02" * 32)
    assert g.encode_message(msg) == b"\x07\x01\x00\x01t" + b"\x01" * 32 + b"\x02" * 32
    req = ModelRequest(task_id="ab", requester=b"\x03" * 20, round=1, nonce=2, signature=b"\x04" * 65)
    assert g.encode_message(req).hex() == "0502" + "0002" + "6162" + "03" * 20 + "%016x" % 1 + "%016x" % 2 + "04" * 65
    # Version 1 (unsigned) ModelRequests are no longer accepted.
    with pytest.raises(GossipReject, match="version"):
        g.decode_message(b"\x05\x01" + g.encode_message(req)[2:-65])


def test_full_chunk_fits_the_message_limit() -> None:
    msg = payload_chunks(payload=b"x" * (MAX_CHUNK_BYTES + 1))[0]
    assert len(msg.data) == MAX_CHUNK_BYTES
    assert len(g.encode_message(msg)) <= g.MAX_MESSAGE_BYTES
    many = g.compute_round_finalized_chunks(task_id=TASK, round=0, syncer=SYNCERS[0], syncer_signature=b"\1" * 65,
                                            aggregate_hashes=(h("x"),) * g.MAX_AGGREGATE_HASHES, model_hash=h("m"),
                                            weights=b"\0" * MAX_CHUNK_BYTES)
    assert len(g.encode_message(many[0])) <= g.MAX_MESSAGE_BYTES


def test_compute_chunks_cuts_canonically() -> None:
    assert g.compute_chunks(b"") == [b""]
    assert g.compute_chunks(b"abcde", 2) == [b"ab", b"cd", b"e"]
    assert g.compute_chunks(b"abcd", 2) == [b"ab", b"cd"]
    data = os.urandom(2 * MAX_CHUNK_BYTES + 7)
    chunks = g.compute_chunks(data)
    assert [len(c) for c in chunks] == [MAX_CHUNK_BYTES, MAX_CHUNK_BYTES, 7]
    assert b"".join(chunks) == data
    with pytest.raises(ValueError):
        g.compute_chunks(b"x", 0)
    for size in (True, 2.0):  # True is an int subclass, 2.0 equals 2: neither is a chunk size
        with pytest.raises(ValueError, match="positive int"):
            g.compute_chunks(b"ab", size)  # type: ignore[arg-type]


def _corrupt(data: bytes, offset: int, value: bytes) -> bytes:
    return data[:offset] + value + data[offset + len(value):]


def test_invalid_decode_unknown_type_and_version() -> None:
    data = g.encode_message(sample_messages()[6])
    with pytest.raises(GossipReject, match="unknown message type"):
        g.decode_message(b"\x63" + data[1:])
    with pytest.raises(GossipReject, match="version"):
        g.decode_message(data[:1] + b"\x02" + data[2:])
    with pytest.raises(GossipReject):
        g.decode_message(b"")
    with pytest.raises(GossipReject):
        g.decode_message(b"\x07")


def test_invalid_decode_truncated_and_trailing() -> None:
    for msg in sample_messages():
        data = g.encode_message(msg)
        with pytest.raises(GossipReject):
            g.decode_message(data[:-1])
        with pytest.raises(GossipReject, match="trailing"):
            g.decode_message(data + b"\0")


def test_invalid_decode_oversized() -> None:
    with pytest.raises(GossipReject, match="exceeds"):
        g.decode_message(b"\x01\x01" + b"\0" * g.MAX_MESSAGE_BYTES)
    # A data field announcing more than a chunk is refused before reading it.
    msg = payload_chunks()[0]
    data = g.encode_message(msg)
    at = len(data) - len(msg.data) - 4
    with pytest.raises(GossipReject, match="exceeds"):
        g.decode_message(_corrupt(data, at, (MAX_CHUNK_BYTES + 1).to_bytes(4, "big")))


def test_invalid_decode_non_canonical_chunking() -> None:
    msg = payload_chunks(payload=b"x" * 10)[0]
    for bad in (
        dict(total_chunks=2),  # 10 bytes are one chunk
        dict(seq=1, total_chunks=1),  # seq out of range
    ):
        with pytest.raises(GossipReject):
            dataclasses.replace(msg, **bad)
    # A short non-final chunk: declared 2 MiB + 1 in 3 chunks, but chunk 0 carries 10 bytes.
    with pytest.raises(GossipReject, match="expected"):
        dataclasses.replace(msg, total_size=2 * MAX_CHUNK_BYTES + 1, total_chunks=3)


def test_invalid_fields_rejected_at_construction() -> None:
    msg = payload_chunks()[0]
    for bad in (dict(task_id="bad id!"), dict(trainer=b"\1" * 19), dict(signature=b"\1" * 64),
                dict(round=-1), dict(round=True), dict(fragment=2**32), dict(payload_hash="00" * 32)):
        with pytest.raises(GossipReject):
            dataclasses.replace(msg, **bad)
    with pytest.raises(GossipReject, match="status"):
        SyncerStatus(task_id=TASK, syncer=SYNCERS[0], round=0, status="hacked", at_ms=0)
    with pytest.raises(GossipReject, match="fp32"):
        g.compute_model_chunks(task_id=TASK, round=0, model_hash=h("m"), weights=b"\0" * 7)
    with pytest.raises(GossipReject, match="aggregate_hashes"):
        g.compute_round_finalized_chunks(task_id=TASK, round=0, syncer=SYNCERS[0], syncer_signature=b"\1" * 65,
                                         aggregate_hashes=(), model_hash=h("m"), weights=b"")


def test_invalid_decode_bad_strings() -> None:
    msg = SyncerStatus(task_id=TASK, syncer=SYNCERS[0], round=0, status="alive", at_ms=0)
    data = g.encode_message(msg)
    with pytest.raises(GossipReject, match="UTF-8"):
        g.decode_message(_corrupt(data, 4, b"\xff"))  # first task id byte
    with pytest.raises(GossipReject, match="task_id"):
        g.decode_message(_corrupt(data, 4, b" "))


def test_invalid_encode_non_message() -> None:
    with pytest.raises(GossipReject):
        g.encode_message("not a message")  # type: ignore[arg-type]


_VALIDATORS = [g.validate_payload_chunk_gossip, g.validate_election_ticket_gossip, g.validate_syncer_status_gossip,
               g.validate_round_finalized_gossip, g.validate_model_request_gossip, g.validate_model_chunk_gossip,
               g.validate_run_sealed_gossip]


@pytest.mark.parametrize("validate", _VALIDATORS, ids=lambda f: f.__name__)
def test_invalid_message_of_another_kind_is_rejected_by_each_validator(
        validate: Callable[..., None], training: World) -> None:
    accepts = {g.validate_payload_chunk_gossip: PayloadChunk, g.validate_election_ticket_gossip: ElectionTicketMsg,
               g.validate_syncer_status_gossip: SyncerStatus, g.validate_round_finalized_gossip: RoundFinalizedMsg,
               g.validate_model_request_gossip: ModelRequest, g.validate_model_chunk_gossip: g.ModelChunk,
               g.validate_run_sealed_gossip: RunSealedMsg}[validate]
    others = [m for m in sample_messages() if not isinstance(m, accepts)]
    assert len(others) == 6
    for msg in others:
        with pytest.raises(GossipReject, match="expected a"):
            validate(msg, training.ctx(), SeenCache())


# --- fuzz ----------------------------------------------------------------------------------------

_ENCODED = [g.encode_message(m) for m in sample_messages()]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_random_bytes_only_reject(data: bytes) -> None:
    try:
        msg = g.decode_message(data)
    except GossipReject:
        return
    assert g.encode_message(msg) == data


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_ENCODED), st.integers(0, 10_000), st.binary(min_size=1, max_size=8), st.booleans())
def test_fuzz_mutated_messages_only_reject_or_ignore(base: bytes, pos: int, patch: bytes, cut: bool) -> None:
    pos %= len(base)
    data = base[:pos] if cut else _corrupt(base, pos, patch)[: len(base)]
    w = World()
    seen = SeenCache()
    for topic in (TOPIC_TRAINING, TOPIC_SYNCER):
        try:
            g.validate_gossip(topic, data, w.ctx(), seen)
        except (GossipReject, GossipIgnore):
            pass


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes_validate_only_reject_or_ignore(data: bytes) -> None:
    w = World()
    for prefix in (b"\x01\x01", b"\x04\x01", b""):
        for topic in (TOPIC_TRAINING, TOPIC_SYNCER):
            try:
                g.validate_gossip(topic, prefix + data, w.ctx(), SeenCache())
            except (GossipReject, GossipIgnore):
                pass


# --- payload chunks ---------------------------------------------------------------------------------


def test_payload_chunk_valid_then_duplicate_ignored(training: World) -> None:
    seen = SeenCache()
    chunks = payload_chunks(payload=os.urandom(MAX_CHUNK_BYTES + 10))
    for c in chunks:
        assert g.validate_gossip(TOPIC_TRAINING, g.encode_message(c), training.ctx(), seen) == c
    with pytest.raises(GossipIgnore, match="duplicate"):
        g.validate_payload_chunk_gossip(chunks[1], training.ctx(), seen)


def test_invalid_payload_unsigned(training: World) -> None:
    chunk = payload_chunks(signature=b"\0" * 65)[0]
    with pytest.raises(GossipReject, match="signature"):
        g.validate_payload_chunk_gossip(chunk, training.ctx(), SeenCache())


def test_invalid_payload_wrongly_signed(training: World) -> None:
    # Signed by another enrolled trainer, by an outsider, and for another round / fragment.
    for chunks in (payload_chunks(0, key=TRAINER_KEYS[1]), payload_chunks(0, key=OUTSIDER_KEY),
                   payload_chunks(0, sign_round=1), payload_chunks(0, sign_fragment=1)):
        with pytest.raises(GossipReject, match="signature"):
            g.validate_payload_chunk_gossip(chunks[0], training.ctx(), SeenCache())
    # Signed for another chain.
    with pytest.raises(GossipReject, match="signature"):
        g.validate_payload_chunk_gossip(payload_chunks()[0], training.ctx(chain_id=1), SeenCache())


def test_invalid_payload_rejected_copy_does_not_shadow_valid_one(training: World) -> None:
    seen = SeenCache()
    good = payload_chunks()[0]
    bad = dataclasses.replace(good, signature=payload_chunks(key=OUTSIDER_KEY)[0].signature)
    with pytest.raises(GossipReject):
        g.validate_payload_chunk_gossip(bad, training.ctx(), seen)
    g.validate_payload_chunk_gossip(good, training.ctx(), seen)


def test_invalid_payload_not_enrolled(training: World) -> None:
    digest = hashlib.sha256(b"x").digest()
    sig = sign_message(SubmitOuterGradient(TASK, 0, 0, digest), OUTSIDER_KEY, CHAIN_ID)
    chunk = g.compute_payload_chunks(task_id=TASK, round=0, fragment=0, trainer=OUTSIDER, signature=sig, payload=b"x")[0]
    with pytest.raises(GossipReject, match="not an enrolled"):
        g.validate_payload_chunk_gossip(chunk, training.ctx(), SeenCache())


def test_invalid_payload_bad_fragment_and_oversized(training: World) -> None:
    with pytest.raises(GossipReject, match="fragment_count"):
        g.validate_payload_chunk_gossip(payload_chunks(fragment=2)[0], training.ctx(), SeenCache())
    with pytest.raises(GossipReject, match="exceeds"):
        g.validate_payload_chunk_gossip(payload_chunks()[0], training.ctx(max_payload_bytes=99), SeenCache())


def test_payload_of_exactly_the_size_limit_is_accepted(training: World) -> None:
    chunk = payload_chunks(payload=b"p" * 100)[0]
    g.validate_payload_chunk_gossip(chunk, training.ctx(max_payload_bytes=100), SeenCache())
    with pytest.raises(GossipReject, match="exceeds"):
        g.validate_payload_chunk_gossip(chunk, training.ctx(max_payload_bytes=99), SeenCache())


def test_invalid_payload_stale_future_unknown_or_not_training(training: World) -> None:
    with pytest.raises(GossipIgnore, match="round"):
        g.validate_payload_chunk_gossip(payload_chunks(round_=1)[0], training.ctx(), SeenCache())
    unknown = GossipContext(get_run=lambda task: None, chain_id=CHAIN_ID)
    with pytest.raises(GossipIgnore, match="unknown run"):
        g.validate_payload_chunk_gossip(payload_chunks()[0], unknown, SeenCache())
    training.finalize_round(5_000)
    with pytest.raises(GossipIgnore, match="round"):
        g.validate_payload_chunk_gossip(payload_chunks(round_=0)[0], training.ctx(), SeenCache())
    w = World()
    with pytest.raises(GossipIgnore, match="not Training"):
        g.validate_payload_chunk_gossip(payload_chunks()[0], w.ctx(), SeenCache())


def test_invalid_message_on_wrong_topic(training: World) -> None:
    data = g.encode_message(payload_chunks()[0])
    with pytest.raises(GossipReject, match="does not belong"):
        g.validate_gossip(TOPIC_SYNCER, data, training.ctx(), SeenCache())


# --- election tickets --------------------------------------------------------------------------------


def test_ticket_valid_then_duplicate_ignored() -> None:
    w = World()
    msg = ElectionTicketMsg(task_id=TASK, ticket=make_ticket(VRF_SECRETS[0], SYNCERS[0], w.run.election.seed))
    seen = SeenCache()
    g.validate_gossip(TOPIC_SYNCER, g.encode_message(msg), w.ctx(now_ms=50), seen)
    with pytest.raises(GossipIgnore, match="duplicate"):
        g.validate_election_ticket_gossip(msg, w.ctx(now_ms=50), seen)


def test_invalid_ticket_unregistered_bad_proof_or_key() -> None:
    w = World()
    seed = w.run.election.seed
    outsider = make_ticket(b"\x33" * 32, OUTSIDER, seed)
    with pytest.raises(GossipReject, match="not a registered"):
        g.validate_election_ticket_gossip(ElectionTicketMsg(task_id=TASK, ticket=outsider), w.ctx(50), SeenCache())
    wrong_seed = make_ticket(VRF_SECRETS[0], SYNCERS[0], b"\x09" * 32)
    with pytest.raises(GossipReject, match="invalid ticket"):
        g.validate_election_ticket_gossip(ElectionTicketMsg(task_id=TASK, ticket=wrong_seed), w.ctx(50), SeenCache())
    other_key = make_ticket(VRF_SECRETS[1], SYNCERS[0], seed)  # syncer 0's address, syncer 1's VRF key
    with pytest.raises(GossipReject, match="invalid ticket"):
        g.validate_election_ticket_gossip(ElectionTicketMsg(task_id=TASK, ticket=other_key), w.ctx(50), SeenCache())
    forged = Ticket(SYNCERS[0], CANDIDATES[SYNCERS[0]].vrf_public_key, b"\x05" * 80)
    with pytest.raises(GossipReject, match="invalid ticket"):
        g.validate_election_ticket_gossip(ElectionTicketMsg(task_id=TASK, ticket=forged), w.ctx(50), SeenCache())


def test_invalid_ticket_after_election_closed(training: World) -> None:
    w = World()
    msg = ElectionTicketMsg(task_id=TASK, ticket=make_ticket(VRF_SECRETS[0], SYNCERS[0], w.run.election.seed))
    with pytest.raises(GossipIgnore, match="closed"):
        g.validate_election_ticket_gossip(msg, w.ctx(now_ms=TIMINGS.election_window_ms + 1), SeenCache())
    with pytest.raises(GossipIgnore, match="closed"):
        g.validate_election_ticket_gossip(msg, training.ctx(now_ms=50), SeenCache())


# --- syncer status -------------------------------------------------------------------------------------


def test_syncer_status_rules(training: World) -> None:
    current = get_current_syncer(training.run)
    ok = SyncerStatus(task_id=TASK, syncer=current, round=0, status="alive", at_ms=1_000)
    seen = SeenCache()
    g.validate_syncer_status_gossip(ok, training.ctx(now_ms=1_000), seen)
    with pytest.raises(GossipIgnore, match="duplicate"):
        g.validate_syncer_status_gossip(ok, training.ctx(now_ms=1_000), seen)


def test_syncer_status_one_a_second_per_syncer(training: World) -> None:
    """Gossip probe (stop 20): unsigned statuses with fresh at_ms values were all relayed (~53,000
    in 90 s from one peer), each taking a dedup-cache slot."""
    current = get_current_syncer(training.run)
    seen = SeenCache()
    first = SyncerStatus(task_id=TASK, syncer=current, round=0, status="alive", at_ms=10_000)
    g.validate_syncer_status_gossip(first, training.ctx(now_ms=10_000), seen)
    for at in (10_001, 10_999, 9_000):
        with pytest.raises(GossipIgnore, match="within 1000 ms"):
            g.validate_syncer_status_gossip(dataclasses.replace(first, at_ms=at, status="failover"),
                                            training.ctx(now_ms=10_500), seen)
    g.validate_syncer_status_gossip(dataclasses.replace(first, at_ms=11_000), training.ctx(now_ms=11_000), seen)
    marks = SeenCache()
    for i in range(SeenCache.MAX_MARKS + 5):
        marks.set_mark(("k", i), i)
    assert marks.get_mark(("k", 0)) is None and marks.get_mark(("k", SeenCache.MAX_MARKS + 4)) == SeenCache.MAX_MARKS + 4


def test_invalid_syncer_status_not_current_stale_or_future(training: World) -> None:
    current = get_current_syncer(training.run)
    other = next(s for s in SYNCERS if s != current)
    msg = SyncerStatus(task_id=TASK, syncer=other, round=0, status="alive", at_ms=1_000)
    with pytest.raises(GossipReject, match="current syncer"):
        g.validate_syncer_status_gossip(msg, training.ctx(now_ms=1_000), SeenCache())
    ok = dataclasses.replace(msg, syncer=current)
    with pytest.raises(GossipIgnore, match="stale"):
        g.validate_syncer_status_gossip(ok, training.ctx(now_ms=1_000 + 200_000), SeenCache())
    with pytest.raises(GossipReject, match="future"):
        g.validate_syncer_status_gossip(ok, training.ctx(now_ms=0, max_clock_skew_ms=10), SeenCache())


def test_syncer_status_exactly_the_clock_skew_old_or_ahead_is_accepted(training: World) -> None:
    current = get_current_syncer(training.run)
    msg = SyncerStatus(task_id=TASK, syncer=current, round=0, status="alive", at_ms=1_000)
    g.validate_syncer_status_gossip(msg, training.ctx(now_ms=1_000 + 500, max_clock_skew_ms=500), SeenCache())
    with pytest.raises(GossipIgnore, match="stale"):
        g.validate_syncer_status_gossip(msg, training.ctx(now_ms=1_000 + 501, max_clock_skew_ms=500), SeenCache())
    g.validate_syncer_status_gossip(msg, training.ctx(now_ms=1_000 - 500, max_clock_skew_ms=500), SeenCache())
    with pytest.raises(GossipReject, match="future"):
        g.validate_syncer_status_gossip(msg, training.ctx(now_ms=1_000 - 501, max_clock_skew_ms=500), SeenCache())


def test_syncer_status_about_a_sealed_run_is_ignored(training: World) -> None:
    training.finalize_round(5_000)
    training.finalize_round(9_000)
    assert training.run.status is RunStatus.SEALED
    last_syncer = training.run.records[-1].syncer
    msg = SyncerStatus(task_id=TASK, syncer=last_syncer, round=2, status="finalized", at_ms=12_000)
    with pytest.raises(GossipIgnore, match="Sealed|sealed"):
        g.validate_syncer_status_gossip(msg, training.ctx(now_ms=12_000), SeenCache())


# --- round finalized -----------------------------------------------------------------------------------


def test_round_finalized_in_progress_and_after_commit(training: World) -> None:
    chunks = finalized_chunks(training, weights=b"\1" * (MAX_CHUNK_BYTES + 8))
    seen = SeenCache()
    for c in chunks:  # the receiver has not finalized yet
        g.validate_gossip(TOPIC_SYNCER, g.encode_message(c), training.ctx(), seen)
    with pytest.raises(GossipIgnore, match="duplicate"):
        g.validate_round_finalized_gossip(chunks[0], training.ctx(), seen)
    training.finalize_round(5_000)  # now the receiver holds the record: fields must match it
    g.validate_round_finalized_gossip(chunks[0], training.ctx(), SeenCache())


def test_invalid_round_finalized_wrong_signature_or_syncer(training: World) -> None:
    current = get_current_syncer(training.run)
    other_key = next(k for k in SYNCER_KEYS if addr(k) != current)
    # Not the current syncer (validly self-signed).
    with pytest.raises(GossipReject, match="current syncer"):
        g.validate_round_finalized_gossip(finalized_chunks(training, syncer_key=other_key)[0], training.ctx(), SeenCache())
    # Names the current syncer but is signed by someone else.
    forged = finalized_chunks(training, syncer_key=other_key, syncer=current)[0]
    with pytest.raises(GossipReject, match="signature"):
        g.validate_round_finalized_gossip(forged, training.ctx(), SeenCache())
    unsigned = dataclasses.replace(finalized_chunks(training)[0], syncer_signature=b"\0" * 65)
    with pytest.raises(GossipReject, match="signature"):
        g.validate_round_finalized_gossip(unsigned, training.ctx(), SeenCache())
    # Signed for another round.
    sig_r1 = sign_message(FinalizeRound(TASK, 1), SYNCER_KEYS[SYNCERS.index(current)], CHAIN_ID)
    with pytest.raises(GossipReject, match="signature"):
        g.validate_round_finalized_gossip(dataclasses.replace(finalized_chunks(training)[0], syncer_signature=sig_r1),
                                          training.ctx(), SeenCache())


def test_invalid_round_finalized_contradicts_record_or_layout(training: World) -> None:
    with pytest.raises(GossipReject, match="aggregate hashes"):
        g.validate_round_finalized_gossip(finalized_chunks(training, aggregate_hashes=(h("x"),))[0], training.ctx(),
                                          SeenCache())
    training.finalize_round(5_000)
    with pytest.raises(GossipReject, match="differs"):
        g.validate_round_finalized_gossip(finalized_chunks(training, model_hash=h("evil"))[0], training.ctx(), SeenCache())
    with pytest.raises(GossipReject, match="differs"):
        g.validate_round_finalized_gossip(finalized_chunks(training, aggregate_hashes=(h("a"), h("b")))[0],
                                          training.ctx(), SeenCache())
    with pytest.raises(GossipReject, match="exceed"):
        g.validate_round_finalized_gossip(finalized_chunks(training)[0], training.ctx(max_model_bytes=8), SeenCache())


def test_invalid_round_finalized_stale_or_future(training: World) -> None:
    with pytest.raises(GossipIgnore, match="not the round in progress"):
        g.validate_round_finalized_gossip(finalized_chunks(training, round_=1)[0], training.ctx(), SeenCache())
    training.finalize_round(5_000)
    training.finalize_round(9_000)  # sealed after max_rounds = 2
    assert training.run.status is RunStatus.SEALED
    with pytest.raises(GossipIgnore, match="stale"):
        g.validate_round_finalized_gossip(finalized_chunks(training, round_=0)[0], training.ctx(), SeenCache())


# --- model request / model chunk / run sealed ---------------------------------------------------------


def test_model_request_rules(training: World) -> None:
    req = g.compute_model_request(task_id=TASK, round=0, nonce=7, private_key=TRAINER_KEYS[0], chain_id=CHAIN_ID)
    seen = SeenCache()
    g.validate_gossip(TOPIC_TRAINING, g.encode_message(req), training.ctx(), seen)
    with pytest.raises(GossipIgnore, match="duplicate"):
        g.validate_model_request_gossip(req, training.ctx(), seen)
    with pytest.raises(GossipReject, match="not an enrolled, unslashed trainer"):
        g.validate_model_request_gossip(dataclasses.replace(req, requester=OUTSIDER), training.ctx(), SeenCache())
    with pytest.raises(GossipIgnore):
        g.validate_model_request_gossip(req, World().ctx(), SeenCache())


def test_invalid_model_request_for_another_round_is_a_replay(training: World) -> None:
    """Gossip probe (stop 20): a trainer's signed request, kept by anyone who relayed it, made
    the node broadcast the whole model again whenever the dedup cache or a restart forgot it;
    its round was never checked. Now it is good only while its round is the run's."""
    old = g.compute_model_request(task_id=TASK, round=0, nonce=7, private_key=TRAINER_KEYS[0], chain_id=CHAIN_ID)
    g.validate_model_request_gossip(old, training.ctx(), SeenCache())
    training.finalize_round(5_000)
    with pytest.raises(GossipIgnore, match="the run is at 1"):
        g.validate_model_request_gossip(old, training.ctx(), SeenCache())  # a fresh cache: after a restart
    ahead = g.compute_model_request(task_id=TASK, round=2, nonce=7, private_key=TRAINER_KEYS[0], chain_id=CHAIN_ID)
    with pytest.raises(GossipIgnore, match="the run is at 1"):
        g.validate_model_request_gossip(ahead, training.ctx(), SeenCache())
    now = g.compute_model_request(task_id=TASK, round=1, nonce=7, private_key=TRAINER_KEYS[0], chain_id=CHAIN_ID)
    g.validate_model_request_gossip(now, training.ctx(), SeenCache())


def test_invalid_model_request_of_a_slashed_trainer(training: World) -> None:
    training.step(process_submission, TRAINERS[0], 0, 0, h("a"), 1_000)
    training.step(process_submission, TRAINERS[0], 0, 0, h("b"), 1_001)  # equivocation: slashed
    assert get_trainer(training.run, TRAINERS[0]).slashed  # type: ignore[union-attr]
    req = g.compute_model_request(task_id=TASK, round=0, nonce=1, private_key=TRAINER_KEYS[0], chain_id=CHAIN_ID)
    with pytest.raises(GossipReject, match="unslashed"):
        g.validate_model_request_gossip(req, training.ctx(), SeenCache())


def test_invalid_model_request_spoofing_an_enrolled_trainer_is_rejected(training: World) -> None:
    # Reviewer repro spoof_request.py: an outsider names trainer 0's public address.
    spoofed = g.compute_model_request(task_id=TASK, round=0, nonce=1, private_key=OUTSIDER_KEY, chain_id=CHAIN_ID)
    spoofed = dataclasses.replace(spoofed, requester=TRAINERS[0])
    with pytest.raises(GossipReject, match="bad signature"):
        g.validate_gossip(TOPIC_TRAINING, g.encode_message(spoofed), training.ctx(), SeenCache())
    other_nonce = g.compute_model_request(task_id=TASK, round=0, nonce=1, private_key=TRAINER_KEYS[0], chain_id=CHAIN_ID)
    with pytest.raises(GossipReject, match="bad signature"):  # a signature lifted onto another nonce
        g.validate_model_request_gossip(dataclasses.replace(other_nonce, nonce=2), training.ctx(), SeenCache())


def test_model_chunk_rules(training: World) -> None:
    chunks = g.compute_model_chunks(task_id=TASK, round=0, model_hash=INITIAL_MODEL, weights=b"\0" * 16)
    g.validate_gossip(TOPIC_TRAINING, g.encode_message(chunks[0]), training.ctx(), SeenCache())
    wrong = g.compute_model_chunks(task_id=TASK, round=0, model_hash=h("evil"), weights=b"\0" * 16)
    with pytest.raises(GossipReject, match="committed"):
        g.validate_model_chunk_gossip(wrong[0], training.ctx(), SeenCache())
    future = g.compute_model_chunks(task_id=TASK, round=1, model_hash=h("model/0"), weights=b"\0" * 16)
    with pytest.raises(GossipIgnore, match="not finalized"):
        g.validate_model_chunk_gossip(future[0], training.ctx(), SeenCache())
    training.finalize_round(5_000)
    g.validate_model_chunk_gossip(future[0], training.ctx(), SeenCache())
    with pytest.raises(GossipIgnore, match="stale"):
        g.validate_model_chunk_gossip(chunks[0], training.ctx(), SeenCache())


def test_default_context_accepts_weights_up_to_4_gib(training: World) -> None:
    """The node's bridge leaves ``max_model_bytes`` at its default: 4 GiB of fp32 weights."""
    ctx = training.ctx()
    assert ctx.max_model_bytes == 4 << 30
    first = g.ModelChunk(task_id=TASK, round=0, model_hash=INITIAL_MODEL, seq=0, total_chunks=4096,
                         total_size=4 << 30, data_hash=h("weights"), data=bytes(MAX_CHUNK_BYTES))
    g.validate_model_chunk_gossip(first, ctx, SeenCache())
    larger = dataclasses.replace(first, total_chunks=4097, total_size=(4 << 30) + 4)
    with pytest.raises(GossipReject, match="exceed"):
        g.validate_model_chunk_gossip(larger, ctx, SeenCache())


def test_a_node_relays_only_the_weights_it_holds(training: World) -> None:
    """Gossip probe (stop 20): the committed model hash is public and no signature covers weight
    bytes, so any peer's well-sized streams naming it (or copying a genuine RoundFinalized
    header) were relayed by the node to its whole mesh. A receiver that holds the weights
    (``get_weights``: a node) relays exactly those bytes."""
    weights = bytes(range(256)) * (MAX_CHUNK_BYTES // 128)  # two canonical chunks
    held = {(TASK, INITIAL_MODEL): WeightsDigests.of(weights)}
    ctx = training.ctx(get_weights=lambda task, model: held.get((task, model)))
    genuine = g.compute_model_chunks(task_id=TASK, round=0, model_hash=INITIAL_MODEL, weights=weights)
    assert len(genuine) == 2
    for c in genuine:
        g.validate_model_chunk_gossip(c, ctx, SeenCache())
    forged = g.compute_model_chunks(task_id=TASK, round=0, model_hash=INITIAL_MODEL, weights=weights[::-1])
    with pytest.raises(GossipReject, match="differ from the ones held here"):
        g.validate_model_chunk_gossip(forged[0], ctx, SeenCache())
    copied_header = dataclasses.replace(genuine[1], data=bytes(len(genuine[1].data)))  # the genuine data_hash
    with pytest.raises(GossipReject, match="differ from the ones held here"):
        g.validate_model_chunk_gossip(copied_header, ctx, SeenCache())
    with pytest.raises(GossipIgnore, match="not held here"):  # weights this node did not publish
        g.validate_model_chunk_gossip(genuine[0], training.ctx(get_weights=lambda task, model: None), SeenCache())
    g.validate_model_chunk_gossip(forged[0], training.ctx(), SeenCache())  # a trainer's rules: no bytes to compare
    # RoundFinalized the same way, checked before the syncer's signature.
    new_model = h("model/0")
    round_weights = b"\x07" * 64
    header = finalized_chunks(training, weights=round_weights)
    held[(TASK, new_model)] = WeightsDigests.of(round_weights)
    g.validate_round_finalized_gossip(header[0], ctx, SeenCache())
    copy = finalized_chunks(training, weights=b"\x08" * 64)
    with pytest.raises(GossipReject, match="differ from the ones held here"):
        g.validate_round_finalized_gossip(copy[0], ctx, SeenCache())


def test_run_sealed_rules(training: World) -> None:
    msg = RunSealedMsg(task_id=TASK, run_root=h("root"), final_model_hash=h("model/1"))
    with pytest.raises(GossipIgnore, match="not sealed"):
        g.validate_run_sealed_gossip(msg, training.ctx(), SeenCache())
    training.finalize_round(5_000)
    training.finalize_round(9_000)
    run = training.run
    assert run.run_root is not None and run.final_record is not None
    good = RunSealedMsg(task_id=TASK, run_root=run.run_root, final_model_hash=run.final_record.final_model_hash)
    seen = SeenCache()
    g.validate_gossip(TOPIC_SYNCER, g.encode_message(good), training.ctx(), seen)
    with pytest.raises(GossipIgnore, match="duplicate"):
        g.validate_run_sealed_gossip(good, training.ctx(), seen)
    with pytest.raises(GossipReject, match="differs"):
        g.validate_run_sealed_gossip(dataclasses.replace(good, run_root=h("other")), training.ctx(), SeenCache())


def test_seen_cache_is_bounded() -> None:
    seen = SeenCache(max_entries=3)
    for i in range(5):
        seen.add(("k", i))
    assert len(seen) == 3 and ("k", 0) not in seen and ("k", 4) in seen


# --- assembler ---------------------------------------------------------------------------------------


def test_assembler_out_of_order_and_duplicates() -> None:
    data = os.urandom(3 * MAX_CHUNK_BYTES + 1)
    chunks = payload_chunks(payload=data)
    asm = ChunkAssembler(max_total_bytes=16 << 20, max_pending=4)
    order = [2, 0, 2, 3, 0]
    assert [asm.add(chunks[i]) for i in order] == [None] * 5
    assert asm.pending_bytes == len(data)
    assert asm.add(chunks[1]) == data
    assert asm.pending_bytes == 0 and len(asm) == 0 and asm.completed == 1
    assert asm.add(chunks[1]) is None  # late duplicate of a delivered stream
    assert len(asm) == 0


def test_assembler_empty_and_single_chunk() -> None:
    asm = ChunkAssembler(max_total_bytes=1 << 20, max_pending=1)
    assert asm.add(payload_chunks(payload=b"")[0]) == b""
    assert asm.add(g.compute_model_chunks(task_id=TASK, round=0, model_hash=h("m"), weights=b"\1" * 8)[0]) == b"\1" * 8


def test_invalid_assembler_hash_mismatch() -> None:
    chunks = payload_chunks(payload=b"a" * (MAX_CHUNK_BYTES + 1))
    tampered = dataclasses.replace(chunks[1], data=b"b")
    asm = ChunkAssembler(max_total_bytes=4 << 20, max_pending=2)
    assert asm.add(chunks[0]) is None
    with pytest.raises(GossipReject, match="hash"):
        asm.add(tampered)
    assert len(asm) == 0 and asm.pending_bytes == 0
    weights = g.compute_round_finalized_chunks(task_id=TASK, round=0, syncer=SYNCERS[0], syncer_signature=b"\1" * 65,
                                               aggregate_hashes=(h("a"),), model_hash=h("m"), weights=b"\0" * 8)[0]
    with pytest.raises(GossipReject, match="hash"):
        asm.add(dataclasses.replace(weights, data=b"\1" * 8))


def test_invalid_assembler_stream_larger_than_buffer() -> None:
    asm = ChunkAssembler(max_total_bytes=MAX_CHUNK_BYTES, max_pending=2)
    with pytest.raises(GossipReject, match="exceeds the buffer"):
        asm.add(payload_chunks(payload=b"x" * (MAX_CHUNK_BYTES + 1))[0])


def test_assembler_refuses_a_new_stream_rather_than_evict_one_in_progress() -> None:
    dropped: list[object] = []
    asm = ChunkAssembler(max_total_bytes=5 * MAX_CHUNK_BYTES, max_pending=2, on_drop=dropped.append)
    streams = [payload_chunks(payload=bytes([i]) * (2 * MAX_CHUNK_BYTES), fragment=i % 2) for i in range(3)]
    asm.add(streams[0][0])
    asm.add(streams[1][0])
    assert len(asm) == 2
    assert asm.add(streams[2][0]) is None  # max_pending reached: the NEW stream is refused
    assert len(asm) == 2 and asm.refused == 1 and asm.evicted == 0 and asm.pending_bytes == 4 * MAX_CHUNK_BYTES
    assert dropped == [(None,) + g.compute_stream_key(streams[2][0])]  # its dedup entries get forgotten
    assert asm.add(streams[1][1]) == streams[1][0].data + streams[1][1].data
    assert asm.add(streams[0][1]) == streams[0][0].data + streams[0][1].data
    assert asm.add(streams[2][0]) is None and asm.add(streams[2][1]) == streams[2][0].data + streams[2][1].data


def test_assembler_evicts_stale_streams_least_recently_active_first() -> None:
    dropped: list[object] = []
    asm = ChunkAssembler(max_total_bytes=64 * MAX_CHUNK_BYTES, max_pending=2, stale_after=3, on_drop=dropped.append)
    idle = payload_chunks(payload=b"i" * (2 * MAX_CHUNK_BYTES))
    busy = payload_chunks(payload=b"b" * (9 * MAX_CHUNK_BYTES), fragment=1)
    asm.add(idle[0])
    for c in busy[:4]:
        asm.add(c)  # 4 chunks went through since idle's last one: idle is stale
    new = payload_chunks(payload=b"n" * 10, trainer_index=1)
    assert asm.add(new[0]) == b"n" * 10
    assert asm.evicted == 1 and dropped == [(None,) + g.compute_stream_key(idle[0])]
    assert [asm.add(c) for c in busy[4:]][-1] == b"b" * (9 * MAX_CHUNK_BYTES)  # never evicted while active


def test_assembler_completes_concurrent_streams_without_thrashing() -> None:
    # Reviewer repro post_validation_loss.py (a), scaled: 8 publishers interleave 4-chunk streams
    # into a buffer that holds 6 of them. Evicting the oldest completed none of them.
    asm = ChunkAssembler(max_total_bytes=24 * MAX_CHUNK_BYTES, max_pending=64)
    streams = [payload_chunks(payload=bytes([t]) * (4 * MAX_CHUNK_BYTES), fragment=t % 2,
                              round_=t // 2) for t in range(8)]
    done = sum(asm.add(s[seq]) is not None for seq in range(4) for s in streams)
    assert done == 6 and asm.evicted == 0 and asm.refused > 0


def test_assembler_forged_first_chunks_do_not_push_out_a_genuine_stream() -> None:
    # Reviewer repro inbox_evict.py: 4 forged seq-0 chunks used to evict the genuine stream.
    asm = ChunkAssembler(max_total_bytes=4 * 2 * MAX_CHUNK_BYTES, max_pending=4)
    real = g.compute_model_chunks(task_id=TASK, round=0, model_hash=h("m"), weights=os.urandom(2 * MAX_CHUNK_BYTES))
    asm.add(real[0])
    for i in range(4):
        asm.add(g.compute_model_chunks(task_id=TASK, round=0, model_hash=h(f"x{i}"),
                                       weights=os.urandom(2 * MAX_CHUNK_BYTES))[0])
    assert asm.add(real[1]) == real[0].data + real[1].data


def test_assembler_keeps_streams_with_different_headers_apart() -> None:
    a = payload_chunks(payload=b"q" * 10)[0]
    b = dataclasses.replace(a, signature=payload_chunks(payload=b"q" * 10, key=OUTSIDER_KEY)[0].signature)
    asm = ChunkAssembler(max_total_bytes=1 << 20, max_pending=4)
    assert asm.add(a) == b"q" * 10
    assert asm.add(b) == b"q" * 10  # another stream (other signature), delivered on its own
    assert g.compute_stream_key(a) != g.compute_stream_key(b)


def _other_value(value: Any) -> Any:
    """A valid value of the same kind as ``value`` that differs from it."""
    if isinstance(value, bool) or not isinstance(value, (int, str, bytes, tuple)):
        raise AssertionError(f"no other value for {value!r}")
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "-b"
    if isinstance(value, bytes):
        return bytes([value[0] ^ 0xFF]) + value[1:]
    return value + (h("extra"),)


def test_stream_key_tells_apart_every_header_field_of_every_chunked_kind() -> None:
    """The stream key is every header field but seq and data (and the chunk geometry, which a
    header difference there cannot leave canonical): one field changed is another stream, and
    the assembler keeps the two apart."""
    weights = b"\2" * (MAX_CHUNK_BYTES + 8)
    streams = [
        payload_chunks(payload=b"p" * (MAX_CHUNK_BYTES + 8)),
        g.compute_round_finalized_chunks(task_id=TASK, round=0, syncer=SYNCERS[0], syncer_signature=b"\1" * 65,
                                         aggregate_hashes=(h("a"),), model_hash=h("m"), weights=weights),
        g.compute_model_chunks(task_id=TASK, round=0, model_hash=h("m"), weights=weights),
    ]
    for chunks in streams:
        first = chunks[0]
        key = g.compute_stream_key(first)
        assert g.compute_stream_key(chunks[1]) == key  # seq and data are not in it
        headers = [f.name for f in dataclasses.fields(first)
                   if f.name not in ("seq", "data", "total_chunks", "total_size")]
        assert len(headers) >= 4
        for name in headers:
            changed = dataclasses.replace(first, **{name: _other_value(getattr(first, name))})
            assert g.compute_stream_key(changed) != key, (type(first).__name__, name)
            asm = ChunkAssembler(max_total_bytes=4 * MAX_CHUNK_BYTES, max_pending=4)
            assert asm.add(first) is None and asm.add(changed) is None
            assert len(asm) == 2, (type(first).__name__, name)


def test_assembler_default_staleness_is_twice_the_larger_bound() -> None:
    # Counted in chunks: twice max_pending, or twice the whole chunks the byte bound holds.
    assert ChunkAssembler(max_total_bytes=10 * MAX_CHUNK_BYTES, max_pending=4).stale_after == 20
    asm = ChunkAssembler(max_total_bytes=MAX_CHUNK_BYTES + 5, max_pending=3)
    assert asm.stale_after == 6
    asm.resize(40 * MAX_CHUNK_BYTES, 4)
    assert asm.stale_after == 80
    assert ChunkAssembler(max_total_bytes=1, max_pending=1, stale_after=7).stale_after == 7


def test_assembler_a_stream_is_stale_only_after_more_than_stale_after_chunks() -> None:
    asm = ChunkAssembler(max_total_bytes=64 * MAX_CHUNK_BYTES, max_pending=2, stale_after=3)
    idle = payload_chunks(payload=b"i" * (2 * MAX_CHUNK_BYTES))
    busy = payload_chunks(payload=b"b" * (4 * MAX_CHUNK_BYTES), fragment=1)
    new = payload_chunks(payload=b"n" * 10, trainer_index=1)
    asm.add(idle[0])
    asm.add(busy[0])
    asm.add(busy[1])
    assert asm.add(new[0]) is None  # idle's last chunk is exactly 3 chunks back: not yet stale
    assert asm.refused == 1 and asm.evicted == 0
    assert asm.add(new[0]) == b"n" * 10  # 4 chunks back now: stale, evicted for the new one
    assert asm.evicted == 1


def test_assembler_staleness_counts_from_a_stream_s_latest_chunk() -> None:
    asm = ChunkAssembler(max_total_bytes=64 * MAX_CHUNK_BYTES, max_pending=2, stale_after=3)
    a = payload_chunks(payload=b"a" * (3 * MAX_CHUNK_BYTES))
    b = payload_chunks(payload=b"b" * (3 * MAX_CHUNK_BYTES), fragment=1)
    new = payload_chunks(payload=b"n" * 10, trainer_index=1)
    for chunk in (a[0], b[0], a[1], b[1]):
        asm.add(chunk)
    assert asm.add(new[0]) is None  # a started 4 chunks back but received one 2 chunks back
    assert asm.evicted == 0 and asm.refused == 1
    assert asm.add(a[2]) == b"a" * (3 * MAX_CHUNK_BYTES)


def test_assembler_a_stream_is_idle_only_after_more_than_idle_s() -> None:
    now = [0.0]
    asm = ChunkAssembler(max_total_bytes=4 * MAX_CHUNK_BYTES, max_pending=64, idle_s=30.0, clock=lambda: now[0])
    stuck = payload_chunks(payload=os.urandom(4 * MAX_CHUNK_BYTES))
    fresh = payload_chunks(trainer_index=1, payload=os.urandom(2 * MAX_CHUNK_BYTES))
    asm.add(stuck[0], "slow")
    now[0] = 20.0
    asm.add(stuck[1], "slow")  # idleness counts from here
    now[0] = 50.0
    assert asm.add(fresh[0], "trainer") is None and asm.refused == 1  # exactly idle_s: not yet idle
    now[0] = 50.5
    assert asm.add(fresh[0], "trainer") is None and asm.evicted == 1 and asm.refused == 1
    assert asm.add(fresh[1], "trainer") == b"".join(c.data for c in fresh)


def test_assembler_remembers_the_most_recently_completed_streams() -> None:
    asm = ChunkAssembler(max_total_bytes=1 << 20, max_pending=2, max_done=2)
    a, b, c = (payload_chunks(payload=bytes([i]) * 5)[0] for i in range(3))
    assert [asm.add(x) for x in (a, b, c)] == [bytes([0]) * 5, bytes([1]) * 5, bytes([2]) * 5]
    assert asm.add(c) is None and asm.add(b) is None  # the two latest are remembered
    assert asm.add(a) == bytes([0]) * 5  # the oldest was forgotten: a new stream again
    assert asm.completed == 4


def test_assembler_keeps_nothing_of_streams_no_longer_pending() -> None:
    """A completed or dropped stream leaves no bookkeeping behind: neither its held-bytes count
    (a later eviction must not look it up) nor its publisher's stream count (one entry per
    peer ever seen would grow without bound)."""
    asm = ChunkAssembler(max_total_bytes=2 * MAX_CHUNK_BYTES, max_pending=8)
    for i in range(5):
        assert asm.add(payload_chunks(payload=bytes([i]) * 10)[0], f"peer-{i}") == bytes([i]) * 10
    assert asm._per_source == {} and asm._held == {}
    big = payload_chunks(payload=os.urandom(2 * MAX_CHUNK_BYTES))
    assert asm.add(big[0], "trainer") is None
    newcomer = payload_chunks(trainer_index=1, payload=os.urandom(MAX_CHUNK_BYTES))
    assert asm.add(newcomer[0], "other") is None  # no room, and nothing weaker to evict
    assert asm.refused == 1 and asm.evicted == 0
    assert asm.add(big[1], "trainer") == b"".join(c.data for c in big)
    assert asm._per_source == {} and asm._held == {} and asm.pending_bytes == 0


def test_assembler_evicts_the_streams_holding_fewest_bytes_first() -> None:
    dropped: list[object] = []
    genuine = payload_chunks(payload=os.urandom(2 * MAX_CHUNK_BYTES))
    asm = ChunkAssembler(max_total_bytes=4 * MAX_CHUNK_BYTES, max_pending=8, on_drop=dropped.append)
    phantoms = []
    for i, held in enumerate((5, 1)):
        phantom = dataclasses.replace(genuine[0], total_size=MAX_CHUNK_BYTES + held, total_chunks=2, seq=1,
                                      data=b"x" * held)
        phantoms.append(phantom)
        assert asm.add(phantom, f"sybil-{i}") is None
    assert asm.add(genuine[0], "trainer") is None
    # Evicting one phantom makes room; the one holding 1 byte goes, not the one holding 5.
    assert asm.evicted == 1 and len(asm) == 2
    assert dropped == [("sybil-1",) + g.compute_stream_key(phantoms[1])]


def test_assembler_evicts_down_to_a_lowered_stream_bound() -> None:
    genuine = payload_chunks(payload=os.urandom(2 * MAX_CHUNK_BYTES))
    asm = ChunkAssembler(max_total_bytes=64 * MAX_CHUNK_BYTES, max_pending=3)
    for i in range(3):
        phantom = dataclasses.replace(genuine[0], total_size=MAX_CHUNK_BYTES + 1 + i, total_chunks=2, seq=1,
                                      data=b"x" * (1 + i))
        asm.add(phantom, f"sybil-{i}")
    asm.resize(64 * MAX_CHUNK_BYTES, 2)  # three streams held, two now allowed
    assert asm.add(genuine[0], "trainer") is None
    assert len(asm) == 2 == asm.max_pending and asm.evicted == 2


def test_assembler_a_source_at_its_share_gives_up_its_least_recently_active_stream() -> None:
    dropped: list[object] = []
    asm = ChunkAssembler(max_total_bytes=64 * MAX_CHUNK_BYTES, max_pending=8, max_per_source=2,
                         on_drop=dropped.append)
    a, b, c = (payload_chunks(fragment=i, payload=os.urandom(2 * MAX_CHUNK_BYTES)) for i in range(3))
    asm.add(a[0], "peer")
    asm.add(b[0], "peer")
    assert asm.add(c[0], "peer") is None
    assert asm.evicted == 1 and dropped == [("peer",) + g.compute_stream_key(a[0])]
    assert asm.add(b[1], "peer") == b"".join(x.data for x in b)
    assert asm.add(c[1], "peer") == b"".join(x.data for x in c)


def test_invalid_assembler_stream_larger_than_buffer_is_reported_dropped() -> None:
    dropped: list[object] = []
    asm = ChunkAssembler(max_total_bytes=MAX_CHUNK_BYTES, max_pending=2, on_drop=dropped.append)
    chunk = payload_chunks(payload=b"x" * (MAX_CHUNK_BYTES + 1))[0]
    with pytest.raises(GossipReject, match="exceeds the buffer"):
        asm.add(chunk, "peer")
    assert dropped == [("peer",) + g.compute_stream_key(chunk)]


def test_assembler_a_repeated_seq_with_other_bytes_does_not_replace_the_first() -> None:
    genuine = payload_chunks(payload=os.urandom(2 * MAX_CHUNK_BYTES))
    asm = ChunkAssembler(max_total_bytes=4 * MAX_CHUNK_BYTES, max_pending=2)
    assert asm.add(genuine[0], "trainer") is None
    assert asm.add(dataclasses.replace(genuine[0], data=os.urandom(MAX_CHUNK_BYTES)), "trainer") is None
    assert asm.add(genuine[1], "trainer") == b"".join(c.data for c in genuine)
    assert asm.hash_mismatches == 0


def test_assembler_a_stream_holds_every_byte_it_received() -> None:
    """Held bytes add up over a stream's chunks: one holding a whole chunk and a short last one
    is not weaker than a newcomer's first whole chunk, whatever order its chunks came in."""
    held = payload_chunks(payload=os.urandom(2 * MAX_CHUNK_BYTES + 10))
    asm = ChunkAssembler(max_total_bytes=3 * MAX_CHUNK_BYTES, max_pending=8)
    asm.add(held[0], "a")
    asm.add(held[2], "a")  # the short last chunk arrives last
    newcomer = payload_chunks(trainer_index=1, payload=os.urandom(2 * MAX_CHUNK_BYTES))
    assert asm.add(newcomer[0], "b") is None
    assert asm.refused == 1 and asm.evicted == 0
    assert asm.add(held[1], "a") == b"".join(c.data for c in held)


# --- forged streams, dedup shadowing, exact sizes (reviewer repros) ----------------------------------


def sizes_ctx(w: World, *, model_bytes: int = 64, payload_bytes: tuple[int, ...] = (4096, 4096),
              **kw: Any) -> GossipContext:
    sizes = g.StreamSizes(model_bytes=model_bytes, payload_bytes=payload_bytes)
    return w.ctx(get_sizes=lambda task: sizes if task == TASK else None, **kw)


def test_invalid_weights_streams_of_another_size_than_the_model(training: World) -> None:
    # Reviewer repro node_relays.py: the node relayed RoundFinalized/ModelChunk streams of any size
    # naming the committed hashes. Now the size must be exactly the model's.
    chunks = g.compute_model_chunks(task_id=TASK, round=0, model_hash=INITIAL_MODEL, weights=b"\x42" * 8)
    with pytest.raises(GossipReject, match="the model has 64"):
        g.validate_model_chunk_gossip(chunks[0], sizes_ctx(training), SeenCache())
    exact = g.compute_model_chunks(task_id=TASK, round=0, model_hash=INITIAL_MODEL, weights=b"\x42" * 64)
    g.validate_model_chunk_gossip(exact[0], sizes_ctx(training), SeenCache())
    with pytest.raises(GossipReject, match="the model has 64"):
        g.validate_round_finalized_gossip(finalized_chunks(training, weights=b"\x42" * 4096)[0], sizes_ctx(training),
                                          SeenCache())
    g.validate_round_finalized_gossip(finalized_chunks(training)[0], sizes_ctx(training), SeenCache())
    # A receiver that does not know the run's layouts yet cannot size-check: it ignores.
    unknown = training.ctx(get_sizes=lambda task: None)
    with pytest.raises(GossipIgnore, match="layouts"):
        g.validate_model_chunk_gossip(exact[0], unknown, SeenCache())


def test_invalid_payload_stream_larger_than_its_fragment_admits(training: World) -> None:
    # Reviewer repro evict_flood.py: total_size is unsigned; one observed signature gave streams of
    # any size up to max_payload_bytes. Now the fragment's layout bounds it.
    real = payload_chunks(0, payload=os.urandom(MAX_CHUNK_BYTES + 10))
    ctx = sizes_ctx(training, payload_bytes=(MAX_CHUNK_BYTES + 10, 100), max_payload_bytes=64 << 20)
    g.validate_payload_chunk_gossip(real[0], ctx, SeenCache())
    forged = dataclasses.replace(real[0], total_size=2 * MAX_CHUNK_BYTES + 1, total_chunks=3)
    with pytest.raises(GossipReject, match="larger than fragment 0 admits"):
        g.validate_payload_chunk_gossip(forged, ctx, SeenCache())
    assert g.compute_stream_sizes(()).model_bytes == 0


def test_forged_chunk_body_does_not_shadow_the_genuine_chunk(training: World) -> None:
    # Reviewer repro shadow_payload.py: a relay copies chunk 1's signed header onto garbage. The
    # dedup key was (stream, seq): the genuine chunk 1 and every republish were then ignored.
    seen = SeenCache()
    asm = ChunkAssembler(max_total_bytes=64 << 20, max_pending=64, on_drop=seen.forget_stream)
    payload = os.urandom(MAX_CHUNK_BYTES + 100)
    real = payload_chunks(0, payload=payload)
    forged1 = dataclasses.replace(real[1], data=b"\xee" * len(real[1].data))
    ctx = training.ctx(max_payload_bytes=64 << 20)

    def deliver(c: PayloadChunk) -> bytes | None:
        return asm.add(g.validate_gossip(TOPIC_TRAINING, g.encode_message(c), ctx, seen))  # type: ignore[arg-type]

    assert deliver(real[0]) is None
    with pytest.raises(GossipReject, match="hash"):
        deliver(forged1)  # completes the stream with the forged body: the hash check drops it
    assert deliver(real[1]) is None  # not a duplicate of the forgery: accepted, relayed, buffered
    with pytest.raises(GossipIgnore, match="duplicate"):
        g.validate_gossip(TOPIC_TRAINING, g.encode_message(real[1]), ctx, seen)
    assert deliver(real[0]) == payload  # the republish of chunk 0 is accepted again: reassembled


def test_seen_cache_forgets_a_stream_from_another_thread() -> None:
    import threading

    seen = SeenCache(max_entries=4)
    seen.add(("a", 1), stream="s1")
    seen.add(("b", 1), stream="s1")
    seen.add(("c", 1), stream="s2")
    t = threading.Thread(target=seen.forget_stream, args=("s1",))
    t.start()
    t.join()
    assert ("a", 1) not in seen and ("b", 1) not in seen and ("c", 1) in seen
    for i in range(8):  # overflowing unindexes the oldest keys too
        seen.add(("d", i), stream="s3")
    assert len(seen) == 4 and ("c", 1) not in seen
    seen.forget_stream("s3")
    assert len(seen) == 0


def test_seen_cache_memory_is_digests() -> None:
    """The cache keeps digests, not the keys it is given: a full cache of chunk keys (each a
    ~610-byte tuple of the stream's signed header) held ~38 MiB for good before; a key's parts
    are freed once the caller drops them, and equal keys (however built) still match."""
    import gc
    import weakref

    class Part:
        def __repr__(self) -> str:
            return "Part()"

    part = Part()
    freed = weakref.ref(part)
    seen = SeenCache()
    seen.add(("payload", ("peer", part), 0, b"h"), stream=("peer", part))
    del part
    gc.collect()
    assert freed() is None  # neither the key nor its stream is held
    assert ("payload", ("peer", Part()), 0, b"h") in seen
    assert ("payload", ("peer", Part()), 1, b"h") not in seen
    assert ("payload", ("peer", Part()), 0, b"h" + b"\0") not in seen
    seen.forget_stream(("peer", Part()))
    assert len(seen) == 0


def test_chunks_of_a_dropped_stream_are_accepted_again_for_every_chunked_kind(training: World) -> None:
    """What the assembler reports to ``on_drop`` ((source,) + stream key) is what the dedup cache
    indexes each kind's chunks under, so a republish of a dropped stream is not a duplicate."""
    cases = [
        (g.validate_payload_chunk_gossip, payload_chunks()[0]),
        (g.validate_round_finalized_gossip, finalized_chunks(training)[0]),
        (g.validate_model_chunk_gossip,
         g.compute_model_chunks(task_id=TASK, round=0, model_hash=INITIAL_MODEL, weights=b"\0" * 16)[0]),
    ]
    for validate, chunk in cases:
        seen = SeenCache()
        ctx = training.ctx(source="peer")
        validate(chunk, ctx, seen)
        with pytest.raises(GossipIgnore, match="duplicate"):
            validate(chunk, ctx, seen)
        seen.forget_stream(("peer",) + g.compute_stream_key(chunk))
        validate(chunk, ctx, seen)


def test_assembler_forged_chunks_from_another_peer_do_not_poison_the_genuine_stream() -> None:
    """Probe repro attack_poison.py: a peer that copies a genuine header onto random bytes and
    sends every seq first used to take the genuine chunks' places, so the genuine stream failed
    its hash check on every republish. Streams are now kept apart by their publishing peer."""
    dropped: list[object] = []
    genuine = payload_chunks(payload=os.urandom(4 * MAX_CHUNK_BYTES))
    forged = [dataclasses.replace(c, data=os.urandom(len(c.data))) for c in genuine]
    asm = ChunkAssembler(max_total_bytes=64 * MAX_CHUNK_BYTES, max_pending=8, on_drop=dropped.append)
    out = []
    for fake, real in zip(forged, genuine):
        try:
            out.append(asm.add(fake, "attacker"))
        except GossipReject:
            out.append("forgery refused")
        out.append(asm.add(real, "trainer"))
    assert out[-2:] == ["forgery refused", b"".join(c.data for c in genuine)]
    assert asm.hash_mismatches == 1 and asm.completed == 1
    assert dropped == [("attacker",) + g.compute_stream_key(genuine[0])]  # the forger's own stream


def test_assembler_one_peer_cannot_reserve_the_buffer_with_copied_headers() -> None:
    """Probe repro attack_phantom.py: one copied signature and 64 announced sizes (a few bytes
    sent each) used to fill every stream slot, and new genuine payloads were refused even after
    the attacker left. A peer now holds at most max_per_source streams."""
    genuine = payload_chunks(payload=os.urandom(2 * MAX_CHUNK_BYTES))
    asm = ChunkAssembler(max_total_bytes=64 * 3 * MAX_CHUNK_BYTES, max_pending=64, max_per_source=4)
    for extra in range(1, 65):
        phantom = dataclasses.replace(genuine[0], total_size=2 * MAX_CHUNK_BYTES + extra, total_chunks=3, seq=2,
                                      data=b"x" * extra)
        assert asm.add(phantom, "attacker") is None
    assert len(asm) == 4 and asm.evicted == 60 and asm.refused == 0
    other = payload_chunks(trainer_index=1, payload=os.urandom(2 * MAX_CHUNK_BYTES))
    assert [asm.add(c, "trainer-1") for c in other][-1] == b"".join(c.data for c in other)
    assert [asm.add(c, "trainer-0") for c in genuine][-1] == b"".join(c.data for c in genuine)


def test_assembler_gives_the_room_of_idle_streams_to_new_ones() -> None:
    now = [0.0]
    asm = ChunkAssembler(max_total_bytes=4 * MAX_CHUNK_BYTES, max_pending=64, idle_s=30.0, clock=lambda: now[0])
    stuck = payload_chunks(payload=os.urandom(4 * MAX_CHUNK_BYTES))
    asm.add(stuck[0], "gone")
    fresh = payload_chunks(trainer_index=1, payload=os.urandom(2 * MAX_CHUNK_BYTES))
    assert asm.add(fresh[0], "trainer") is None and asm.refused == 1  # no room while the other is live
    now[0] = 31.0
    assert asm.add(fresh[0], "trainer") is None and asm.evicted == 1
    assert asm.add(fresh[1], "trainer") == b"".join(c.data for c in fresh)


def test_invalid_assembler_settings() -> None:
    with pytest.raises(ValueError):
        ChunkAssembler(max_total_bytes=1, max_pending=1, max_per_source=0)
    with pytest.raises(ValueError):
        ChunkAssembler(max_total_bytes=1, max_pending=1, idle_s=5.0)  # no clock
    with pytest.raises(ValueError):
        ChunkAssembler(max_total_bytes=1, max_pending=1, idle_s=0.0, clock=lambda: 0.0)


def test_invalid_assembler_bounds_at_construction_and_resize() -> None:
    for total, pending in ((-1, 1), (1, 0), (1, -1)):
        with pytest.raises(ValueError, match="max_pending >= 1"):
            ChunkAssembler(max_total_bytes=total, max_pending=pending)
    with pytest.raises(ValueError, match="max_done"):
        ChunkAssembler(max_total_bytes=1, max_pending=1, max_done=-1)
    asm = ChunkAssembler(max_total_bytes=0, max_pending=1)  # the smallest legal bounds
    assert asm.add(payload_chunks(payload=b"")[0]) == b""
    for total, pending in ((-1, 1), (1, 0)):
        with pytest.raises(ValueError, match="max_pending >= 1"):
            asm.resize(total, pending)
    assert (asm.max_total_bytes, asm.max_pending) == (0, 1)  # a refused resize changes nothing


def test_assembler_with_max_done_zero_remembers_no_completed_stream() -> None:
    asm = ChunkAssembler(max_total_bytes=1 << 20, max_pending=2, max_done=0)
    chunk = payload_chunks(payload=b"abc")[0]
    assert asm.add(chunk) == b"abc"
    assert asm.add(chunk) == b"abc"  # not remembered: the repeat is a new stream, delivered again
    assert asm.completed == 2 and len(asm) == 0
    remembering = ChunkAssembler(max_total_bytes=1 << 20, max_pending=2, max_done=1)
    assert remembering.add(chunk) == b"abc" and remembering.add(chunk) is None


def test_assembler_evicts_every_weaker_stream_needed_for_the_bytes_bound() -> None:
    """Slots are plentiful here (max_pending=8), so the byte bound alone decides how many
    phantom streams (announced for a chunk and a byte, holding 1 byte) must yield: all three."""
    genuine = payload_chunks(payload=os.urandom(3 * MAX_CHUNK_BYTES))
    asm = ChunkAssembler(max_total_bytes=4 * MAX_CHUNK_BYTES, max_pending=8)
    for i in range(3):
        size = MAX_CHUNK_BYTES + 1 + i
        phantom = dataclasses.replace(genuine[0], total_size=size, total_chunks=2, seq=1, data=b"x" * (1 + i))
        assert asm.add(phantom, f"sybil-{i}") is None
    assert len(asm) == 3 and asm.pending_bytes == 3 * MAX_CHUNK_BYTES + 6
    assert asm.add(genuine[0], "trainer") is None
    assert asm.evicted == 3 and asm.refused == 0 and len(asm) == 1
    assert asm.pending_bytes == 3 * MAX_CHUNK_BYTES <= asm.max_total_bytes
    assert [asm.add(c, "trainer") for c in genuine[1:]][-1] == b"".join(c.data for c in genuine)


def test_assembler_streams_announced_for_a_few_bytes_yield_to_one_that_brings_a_chunk() -> None:
    """Probe repro attack_sybil.py: one connection signing with 17 libp2p keys, 4 phantom
    streams each (a copied header, only the short last chunk sent, 1-64 bytes), renewed every
    5 s, held all 64 slots for ~5 KB/s and refused every honest payload. Held bytes now decide."""
    genuine = payload_chunks(payload=os.urandom(2 * MAX_CHUNK_BYTES + 64))
    asm = ChunkAssembler(max_total_bytes=64 * 4 * MAX_CHUNK_BYTES, max_pending=64, max_per_source=4)
    for sybil in range(16):
        for extra in range(4):
            size = 2 * MAX_CHUNK_BYTES + 1 + 4 * sybil + extra
            phantom = dataclasses.replace(genuine[0], total_size=size, total_chunks=3, seq=2,
                                          data=b"x" * (size - 2 * MAX_CHUNK_BYTES))
            asm.add(phantom, f"sybil-{sybil}")
    assert len(asm) == 64 and asm.refused == 0
    honest = payload_chunks(trainer_index=1, payload=os.urandom(2 * MAX_CHUNK_BYTES + 5))
    assert [asm.add(c, "trainer-1") for c in honest][-1] == b"".join(c.data for c in honest)
    assert asm.evicted == 1 and asm.refused == 0
    # A stream in progress (a whole chunk held) is not pushed out by a newcomer's first chunk.
    real = [payload_chunks(trainer_index=i % 3, fragment=i // 3, payload=os.urandom(2 * MAX_CHUNK_BYTES))
            for i in range(2)]
    full = ChunkAssembler(max_total_bytes=64 * MAX_CHUNK_BYTES, max_pending=1)
    full.add(real[0][0], "a")
    assert full.add(real[1][0], "b") is None and full.refused == 1 and full.evicted == 0
    assert full.add(real[0][1], "a") == b"".join(c.data for c in real[0])


def test_a_genuine_chunk_copied_by_another_peer_first_still_completes_its_stream() -> None:
    """Review repro echo.py: with streams kept apart by publisher but the dedup key not, a copy
    of a genuine chunk from another peer, arriving first, made the genuine chunk a "duplicate":
    it was neither delivered nor relayed and the genuine stream waited forever. The dedup key
    now names the publisher too. The validator and the assembler run together here, as in the
    node's bridge."""
    w = World()
    w.to_training()
    seen = SeenCache()
    asm = ChunkAssembler(max_total_bytes=64 * MAX_CHUNK_BYTES, max_pending=8, on_drop=seen.forget_stream)
    genuine = payload_chunks(payload=os.urandom(2 * MAX_CHUNK_BYTES + 7))
    out = []
    for chunk in [genuine[0]] + genuine:  # the copier's seq 0 arrives before the trainer's
        source = "copier" if len(out) == 0 else "trainer"
        data = g.encode_message(chunk)
        g.validate_gossip(g.TOPIC_TRAINING, data, w.ctx(source=source), seen)
        out.append(asm.add(chunk, source))
    assert out[-1] == b"".join(c.data for c in genuine) and asm.completed == 1
    # The same chunk again from the same publisher is still a duplicate.
    with pytest.raises(GossipIgnore, match="duplicate"):
        g.validate_gossip(g.TOPIC_TRAINING, g.encode_message(genuine[0]), w.ctx(source="copier"), seen)


def test_assembler_a_peer_keeps_its_streams_when_its_new_one_could_not_fit_anyway() -> None:
    """Review repro source_room2.py: a peer at its share gave up its oldest stream first, and
    the new one was then refused for room: a stream lost for nothing."""
    asm = ChunkAssembler(max_total_bytes=5 * MAX_CHUNK_BYTES, max_pending=8, max_per_source=1)
    old = payload_chunks(payload=os.urandom(2 * MAX_CHUNK_BYTES))
    other = payload_chunks(trainer_index=1, payload=os.urandom(3 * MAX_CHUNK_BYTES))
    asm.add(old[0], "peer")
    asm.add(other[0], "other")
    big = payload_chunks(fragment=1, payload=os.urandom(4 * MAX_CHUNK_BYTES))
    assert asm.add(big[0], "peer") is None and asm.refused == 1 and asm.evicted == 0
    assert asm.add(old[1], "peer") == b"".join(c.data for c in old)  # still there, and completes
    # When the new stream fits once the peer's oldest is gone, that one still makes way.
    first = payload_chunks(fragment=2, payload=os.urandom(2 * MAX_CHUNK_BYTES))
    second = payload_chunks(fragment=3, payload=os.urandom(2 * MAX_CHUNK_BYTES))
    asm.add(first[0], "peer")
    assert asm.add(second[0], "peer") is None and asm.evicted == 1 and len(asm) == 2
    assert asm.add(second[1], "peer") == b"".join(c.data for c in second)
