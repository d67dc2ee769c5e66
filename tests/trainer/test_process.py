"""Unit tests of the trainer process's gossip side (the whole process runs in tests/e2e):
the inbox that reassembles what it waits for, the RoundFinalized check against the round record,
and the topic validator wiring."""

from __future__ import annotations

import pytest

from tenzro_training import auth
from tenzro_training import gossip as g
from tenzro_training.auth import FinalizeRound, sign_message
from tenzro_training.errors import GossipIgnore, GossipReject
from tenzro_training.gossip_trainer import find_round_finalized_mismatch
from tenzro_training.trainer.inbox import GossipInbox
from tenzro_training.trainer.process import _trainer_validator
from tests.test_gossip import CHAIN_ID, OUTSIDER_KEY, SYNCER_KEYS, SYNCERS, TASK, h, payload_chunks

WEIGHTS = bytes(range(256)) * 4
# A well-formed bootstrap address nobody answers on (these tests never dial).
_BOOTSTRAP = "/ip4/127.0.0.1/tcp/9/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"


def notice(round_: int = 0, *, key: bytes = SYNCER_KEYS[0], syncer: bytes = SYNCERS[0], model: bytes = h("model"),
           task: str = TASK, weights: bytes = WEIGHTS, chain_id: int = CHAIN_ID) -> list[g.RoundFinalizedMsg]:
    return g.compute_round_finalized_chunks(
        task_id=task, round=round_, syncer=syncer, syncer_signature=sign_message(FinalizeRound(task, round_), key, chain_id),
        aggregate_hashes=(h("a0"), h("a1")), model_hash=model, weights=weights,
    )


def feed(inbox: GossipInbox, messages: list[g.GossipMessage]) -> None:
    for m in messages:
        inbox._on_message(g.encode_message(m))


def test_round_finalized_matching_the_record_has_no_problem() -> None:
    msg = notice()[0]
    assert find_round_finalized_mismatch(msg, SYNCERS[0], h("model"), CHAIN_ID) is None


@pytest.mark.parametrize(
    "msg, record_syncer, committed, problem",
    [
        (notice()[0], SYNCERS[1], h("model"), "the record names"),  # a ranked candidate, not this round's syncer
        (notice(key=OUTSIDER_KEY)[0], SYNCERS[0], h("model"), "bad syncer signature"),
        (notice(model=h("other"))[0], SYNCERS[0], h("model"), "the record commits"),
        (notice(chain_id=1)[0], SYNCERS[0], h("model"), "bad syncer signature"),  # signed for another chain
    ],
)
def test_invalid_round_finalized_against_the_record(msg: g.RoundFinalizedMsg, record_syncer: bytes, committed: bytes,
                                                    problem: str) -> None:
    assert problem in (find_round_finalized_mismatch(msg, record_syncer, committed, CHAIN_ID) or "")


def test_inbox_reassembles_only_what_it_awaits_for_its_run() -> None:
    inbox = GossipInbox(TASK, g, model_bytes=len(WEIGHTS))
    feed(inbox, notice(0))
    assert inbox.finalized == {}  # no round awaited yet
    inbox.expect_finalized(0)
    feed(inbox, notice(task="another-run"))
    feed(inbox, notice(1))
    assert inbox.finalized == {}
    feed(inbox, notice(0))
    msg, data = inbox.finalized[notice(0)[0].data_hash]
    assert data == WEIGHTS and msg.model_hash == h("model")
    model = g.compute_model_chunks(task_id=TASK, round=1, model_hash=h("m1"), weights=WEIGHTS)
    feed(inbox, model)
    assert inbox.models == {}  # no ModelRequest outstanding
    inbox.expect_model(2)
    feed(inbox, model)
    assert inbox.models == {}  # an earlier round than the one asked for
    inbox.expect_model(1)
    feed(inbox, model)
    assert inbox.models[model[0].data_hash] == (1, h("m1"), WEIGHTS)
    feed(inbox, [g.RunSealedMsg(task_id=TASK, run_root=h("root"), final_model_hash=h("final"))])
    assert inbox.sealed.run_root == h("root")
    assert inbox.changed.is_set()
    inbox.expect_model(None)
    inbox.expect_finalized(None)
    assert inbox.models == {} and inbox.finalized == {}  # pruned once used


def test_inbox_keeps_candidate_notices_per_data_hash() -> None:
    inbox = GossipInbox(TASK, g, model_bytes=len(WEIGHTS))
    inbox.expect_finalized(0)
    early = notice(0, key=SYNCER_KEYS[1], syncer=SYNCERS[1], model=h("early"), weights=WEIGHTS[::-1])
    feed(inbox, early)  # held first
    feed(inbox, notice(0))  # another data hash: a candidate of its own, not hidden by the first
    assert {m.model_hash for m, _ in inbox.finalized.values()} == {h("early"), h("model")}
    inbox.discard_finalized(early[0].data_hash)
    assert [m.model_hash for m, _ in inbox.finalized.values()] == [h("model")]


def test_inbox_growth_is_bounded_by_what_is_awaited() -> None:
    # Reviewer repro inbox_growth.py: 40 forged ModelChunk streams were all kept (160 MiB there).
    import os

    inbox = GossipInbox(TASK, g, model_bytes=len(WEIGHTS))
    inbox.expect_model(3)
    for i in range(40):
        feed(inbox, g.compute_model_chunks(task_id=TASK, round=i % 3, model_hash=os.urandom(32), weights=WEIGHTS))
    assert inbox.models == {} and len(inbox._assembler) == 0 and inbox.counters["unexpected"] == 40
    # Later rounds are awaited too (the node answers with its current model), MAX_CANDIDATES at most.
    for i in range(40):
        feed(inbox, g.compute_model_chunks(task_id=TASK, round=10**6 + i, model_hash=os.urandom(32),
                                           weights=WEIGHTS[i:] + WEIGHTS[:i]))
    assert len(inbox.models) == inbox.MAX_CANDIDATES and inbox.counters["unexpected"] == 40 + 40 - inbox.MAX_CANDIDATES
    assert len(inbox._assembler) == 0


def test_inbox_expect_model_keeps_the_candidates_from_that_round_on() -> None:
    inbox = GossipInbox(TASK, g, model_bytes=len(WEIGHTS))
    inbox.expect_model(1)
    answers = {r: g.compute_model_chunks(task_id=TASK, round=r, model_hash=h(f"m{r}"),
                                         weights=WEIGHTS[r:] + WEIGHTS[:r]) for r in (1, 2, 3)}
    for chunks in answers.values():
        feed(inbox, chunks)
    assert sorted(c[0] for c in inbox.models.values()) == [1, 2, 3]
    inbox.expect_model(2)  # the round asked for is kept, earlier ones go
    assert sorted(c[0] for c in inbox.models.values()) == [2, 3]
    assert answers[2][0].data_hash in inbox.models and inbox.await_model == 2


def test_inbox_reassembles_every_candidate_notice_at_once() -> None:
    # MAX_CANDIDATES multi-chunk notices whose chunks interleave: the buffer holds them all.
    import os

    weights = [os.urandom(2 * g.MAX_CHUNK_BYTES) for _ in range(GossipInbox.MAX_CANDIDATES)]
    inbox = GossipInbox(TASK, g, model_bytes=len(weights[0]))
    inbox.expect_finalized(0)
    streams = [notice(0, model=h(f"m{i}"), weights=w) for i, w in enumerate(weights)]
    for seq in range(2):
        feed(inbox, [s[seq] for s in streams])
    assert sorted(data for _, data in inbox.finalized.values()) == sorted(weights)
    assert inbox._assembler.refused == 0 and inbox.counters == {"forged": 0, "unexpected": 0}


def test_inbox_a_stream_whose_bytes_fail_their_hash_is_forgotten_in_the_dedup_cache() -> None:
    import dataclasses

    class Seen:
        def __init__(self) -> None:
            self.forgotten: list[tuple[object, ...]] = []

        def forget_stream(self, stream: tuple[object, ...]) -> None:
            self.forgotten.append(stream)

    seen = Seen()
    inbox = GossipInbox(TASK, g, model_bytes=len(WEIGHTS), seen=seen)
    inbox.expect_finalized(0)
    forged = dataclasses.replace(notice(0)[0], data=bytes(len(WEIGHTS)))
    inbox._on_message(g.encode_message(forged), "peer")
    assert inbox.finalized == {} and inbox.counters == {"forged": 1, "unexpected": 0}
    assert seen.forgotten == [("peer",) + g.compute_stream_key(forged)]  # the genuine republish gets through
    inbox._on_message(g.encode_message(notice(0)[0]), "peer")
    assert [data for _, data in inbox.finalized.values()] == [WEIGHTS]


def test_inbox_keeps_what_verify_returns_and_signals_each_candidate() -> None:
    def verify(data: bytes, model_hash: bytes) -> object:
        return ("decoded", model_hash, len(data))

    inbox = GossipInbox(TASK, g, model_bytes=len(WEIGHTS), verify=verify)
    inbox.expect_finalized(0)
    inbox.expect_model(0)
    feed(inbox, notice(0))
    assert inbox.changed.is_set()
    assert [w for _, w in inbox.finalized.values()] == [("decoded", h("model"), len(WEIGHTS))]
    inbox.changed.clear()
    feed(inbox, g.compute_model_chunks(task_id=TASK, round=0, model_hash=h("m0"), weights=WEIGHTS))
    assert inbox.changed.is_set()
    assert list(inbox.models.values()) == [(0, h("m0"), ("decoded", h("m0"), len(WEIGHTS)))]


def test_inbox_drops_weights_of_another_size_than_the_model() -> None:
    inbox = GossipInbox(TASK, g, model_bytes=len(WEIGHTS))
    inbox.expect_finalized(0)
    inbox.expect_model(0)
    feed(inbox, notice(0, weights=WEIGHTS + bytes(4)))
    feed(inbox, g.compute_model_chunks(task_id=TASK, round=0, model_hash=h("m"), weights=WEIGHTS[:-4]))
    assert inbox.finalized == {} and inbox.models == {}
    assert inbox.counters["unexpected"] == 2 and len(inbox._assembler) == 0


def test_inbox_holds_at_most_max_candidates_notices_and_the_first_of_each_data_hash() -> None:
    inbox = GossipInbox(TASK, g, model_bytes=len(WEIGHTS))
    inbox.expect_finalized(0)
    feed(inbox, notice(0))
    # The same weights under another syncer's notice: the candidate held is not replaced.
    feed(inbox, notice(0, key=SYNCER_KEYS[1], syncer=SYNCERS[1]))
    assert [m.syncer for m, _ in inbox.finalized.values()] == [SYNCERS[0]]
    assert inbox.counters["unexpected"] == 1
    for i in range(1, inbox.MAX_CANDIDATES + 2):
        feed(inbox, notice(0, model=h(f"m{i}"), weights=WEIGHTS[i:] + WEIGHTS[:i]))
    assert len(inbox.finalized) == inbox.MAX_CANDIDATES
    assert inbox.counters["unexpected"] == 1 + 2 and len(inbox._assembler) == 0


def test_inbox_holds_the_first_model_answer_of_each_data_hash() -> None:
    inbox = GossipInbox(TASK, g, model_bytes=len(WEIGHTS))
    inbox.expect_model(1)
    first = g.compute_model_chunks(task_id=TASK, round=1, model_hash=h("m"), weights=WEIGHTS)
    feed(inbox, first)
    feed(inbox, g.compute_model_chunks(task_id=TASK, round=2, model_hash=h("m"), weights=WEIGHTS))
    assert inbox.models == {first[0].data_hash: (1, h("m"), WEIGHTS)}
    assert inbox.counters["unexpected"] == 1


def test_inbox_signals_the_run_sealed_message() -> None:
    inbox = GossipInbox(TASK, g, model_bytes=len(WEIGHTS))
    assert not inbox.changed.is_set()
    feed(inbox, [g.RunSealedMsg(task_id=TASK, run_root=h("root"), final_model_hash=h("final"))])
    assert inbox.changed.is_set() and inbox.sealed.final_model_hash == h("final")


def test_inbox_drain_drops_a_message_that_raises_and_goes_on() -> None:
    import asyncio
    import types

    from tenzro_training.errors import EncodingError

    def verify(data: bytes, model_hash: bytes) -> object:
        raise EncodingError("weights that do not decode")

    inbox = GossipInbox(TASK, g, model_bytes=len(WEIGHTS), verify=verify)
    inbox.expect_finalized(0)

    async def main() -> None:
        queue: asyncio.Queue[object] = asyncio.Queue()
        for msg in (notice(0)[0], g.RunSealedMsg(task_id=TASK, run_root=h("root"), final_model_hash=h("final"))):
            queue.put_nowait(types.SimpleNamespace(data=g.encode_message(msg), from_peer="peer"))
        queue.put_nowait(types.SimpleNamespace(data=b"\xff garbage", from_peer="peer"))
        task = asyncio.create_task(inbox.drain(queue))
        for _ in range(100):
            if queue.empty():
                break
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not task.done()  # still draining
        task.cancel()

    asyncio.run(main())
    assert inbox.finalized == {} and inbox.sealed is not None and inbox.sealed.run_root == h("root")


def test_inbox_wait_awaits_a_change_after_it_was_called() -> None:
    import asyncio

    inbox = GossipInbox(TASK, g, model_bytes=len(WEIGHTS))
    inbox.changed.set()  # a change the caller already looked at
    asyncio.run(inbox.wait(0.01))
    assert not inbox.changed.is_set()  # waited for a new one (none came), not returned on the old


def test_inbox_forged_model_chunks_do_not_evict_the_genuine_notice() -> None:
    # Reviewer repro inbox_evict.py: 4 unsigned ModelChunk seq-0s evicted the genuine RoundFinalized.
    import os

    weights = os.urandom(2 * g.MAX_CHUNK_BYTES)
    inbox = GossipInbox(TASK, g, model_bytes=len(weights))
    inbox.expect_finalized(0)
    real = notice(0, weights=weights)
    feed(inbox, real[:1])
    for _ in range(4):
        feed(inbox, g.compute_model_chunks(task_id=TASK, round=0, model_hash=os.urandom(32), weights=weights)[:1])
    feed(inbox, real[1:])
    assert real[0].data_hash in inbox.finalized and inbox._assembler.evicted == 0


# --- forged weights streams never stop the trainer (reviewer repros forged_model/forged_finalized) ---


def _trainer_with_model(tmp_path, model_timeout_s: float = 2.0):  # type: ignore[no-untyped-def]
    import torch

    from tenzro_training.fragments import TensorSpec, compute_fragment_layouts
    from tenzro_training.global_model import ModelLayout, compute_state_model_hash
    from tenzro_training.node.gossip_bridge import compute_weights_bytes
    from tenzro_training.trainer.process import TrainerProcessConfig, _Trainer

    layouts = compute_fragment_layouts([TensorSpec("w", (64,), "float32")], 2)
    model = ModelLayout.from_views(layouts)
    real = [torch.arange(lay.numel, dtype=torch.float32) for lay in layouts]
    cfg = TrainerProcessConfig(task_id=TASK, rpc_url="http://127.0.0.1:9", private_key=b"\x11" * 32, spec_path=None,
                               p2p_key=tmp_path / "unused", bootstrap=(_BOOTSTRAP,),
                               model_timeout_s=model_timeout_s, chain_id=CHAIN_ID)
    tr = _Trainer(cfg, lambda line: None)
    tr.g, tr.layouts, tr.model = g, layouts, model
    nbytes = 4 * sum(lay.numel for lay in layouts)
    tr.inbox = GossipInbox(TASK, g, nbytes, verify=tr.verify_weights)
    published: list[bytes] = []

    class Host:
        async def publish(self, topic: str, data: bytes) -> None:
            published.append(data)

    tr.host = Host()
    return tr, compute_state_model_hash(model, real), compute_weights_bytes(real), nbytes, published


def _another_model(tr) -> tuple[bytes, bytes]:  # type: ignore[no-untyped-def]
    """(model hash, weights bytes) of a model other than ``_trainer_with_model``'s."""
    import torch

    from tenzro_training.global_model import compute_state_model_hash
    from tenzro_training.node.gossip_bridge import compute_weights_bytes

    weights = [torch.full((lay.numel,), 0.5, dtype=torch.float32) for lay in tr.layouts]
    return compute_state_model_hash(tr.model, weights), compute_weights_bytes(weights)


def _view(round_: int, model_hash: bytes, status: str = "Training") -> dict[str, object]:
    return {"round": round_, "status": status, "model_hash": "0x" + model_hash.hex(), "round_records": []}


def _serve_views(tr, *views: dict[str, object]) -> list[dict[str, object]]:  # type: ignore[no-untyped-def]
    """Make ``tr``'s getRun answer the last of ``views`` (append to the list returned to move the run)."""
    served = list(views)

    async def get_run() -> dict[str, object]:
        return served[-1]

    tr.get_run = get_run
    return served


def _request_model_as_chunks_arrive(tr, view: dict[str, object], chunks: list[g.GossipMessage]) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """``tr.request_model(view)``'s answer, with ``chunks`` reaching the trainer's inbox (in
    order) 50 ms into the request, as gossip would."""
    import asyncio

    async def main() -> dict[str, object]:
        async def arrive() -> None:
            await asyncio.sleep(0.05)
            feed(tr.inbox, chunks)

        task = asyncio.create_task(arrive())
        try:
            return await tr.request_model(view, asyncio.Event())
        finally:
            await task

    return asyncio.run(main())


def test_a_forged_model_answer_is_dropped_and_the_genuine_one_accepted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tr, committed, real, nbytes, published = _trainer_with_model(tmp_path)

    _serve_views(tr, _view(3, committed))
    forged = g.compute_model_chunks(task_id=TASK, round=3, model_hash=committed, weights=b"\0" * nbytes)
    genuine = g.compute_model_chunks(task_id=TASK, round=3, model_hash=committed, weights=real)
    # The forged stream completes first: it used to be kept and then crash the trainer.
    _request_model_as_chunks_arrive(tr, {"round": 3, "model_hash": "0x" + committed.hex()}, forged + genuine)
    assert tr.held_hash == committed and tr.inbox.counters["forged"] == 1
    assert tr.inbox.models == {} and tr.inbox.await_model is None  # pruned after use
    request = g.decode_message(published[0])
    assert isinstance(request, g.ModelRequest) and request.requester == tr.addr_bytes  # signed (version 2)


def test_a_model_answer_for_a_round_the_run_moved_on_to_is_taken(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """P4: the node answers with the model it holds when it answers. Rounds shorter than its
    answer interval (5 s per trainer) made every answer one round ahead of the trainer's view;
    pinned to that view, the trainer dropped them all and gave up."""
    tr, stale, _, _, _ = _trainer_with_model(tmp_path)
    current, weights = _another_model(tr)
    _serve_views(tr, _view(5, current))
    answer = g.compute_model_chunks(task_id=TASK, round=5, model_hash=current, weights=weights)
    got = _request_model_as_chunks_arrive(tr, _view(3, stale), answer)
    assert tr.held_hash == current and got["round"] == 5  # the caller goes on from the run's round
    assert tr.inbox.counters["forged"] == 0 and tr.inbox.models == {}


@pytest.mark.parametrize("answer_round", [3, 4])
def test_a_model_answer_the_run_does_not_commit_is_dropped(tmp_path, answer_round: int) -> None:  # type: ignore[no-untyped-def]
    """A later round's answer is taken only when getRun shows the run commits it; one for the
    run's own round with another model is a forgery, counted as one."""
    from tenzro_training.trainer.process import TrainerProcessError

    tr, committed, _, _, _ = _trainer_with_model(tmp_path, model_timeout_s=0.3)
    other, weights = _another_model(tr)

    _serve_views(tr, _view(3, committed))  # the run has not moved
    tr.MODEL_ASK_INTERVAL_S = 0.1
    feed_later = g.compute_model_chunks(task_id=TASK, round=answer_round, model_hash=other, weights=weights)
    with pytest.raises(TrainerProcessError, match="no verified model for round 3"):
        _request_model_as_chunks_arrive(tr, _view(3, committed), feed_later)
    assert tr.held_hash is None and tr.inbox.counters["forged"] == 1


def test_each_model_request_follows_the_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A re-ask first looks at getRun: it asks for the round the run is at, and an answer for
    the round it asked before, now outrun, is dropped without counting as forged."""
    import asyncio

    tr, stale, stale_bytes, _, published = _trainer_with_model(tmp_path)
    current, weights = _another_model(tr)
    views = _serve_views(tr, _view(3, stale))
    tr.MODEL_ASK_INTERVAL_S = 0.1

    async def main() -> dict[str, object]:
        async def arrive() -> None:
            await asyncio.sleep(0.05)
            views.append(_view(4, current))  # round 3 is finalized before any answer arrives
            await asyncio.sleep(0.3)
            feed(tr.inbox, g.compute_model_chunks(task_id=TASK, round=3, model_hash=stale, weights=stale_bytes))
            feed(tr.inbox, g.compute_model_chunks(task_id=TASK, round=4, model_hash=current, weights=weights))

        task = asyncio.create_task(arrive())
        got = await tr.request_model(_view(3, stale), asyncio.Event())
        await task
        return got

    got = asyncio.run(main())
    asked = [g.decode_message(m).round for m in published]
    assert asked[0] == 3 and asked[-1] == 4
    assert tr.held_hash == current and got["round"] == 4 and tr.inbox.counters["forged"] == 0


def test_a_model_request_that_the_run_keeps_outrunning_gives_up(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Following the run restarts model_timeout_s; the whole chase is still bounded."""
    import asyncio
    import time

    from tenzro_training.trainer.process import TrainerProcessError

    tr, committed, _, _, _ = _trainer_with_model(tmp_path, model_timeout_s=0.2)
    rounds = iter(range(3, 10**6))

    async def get_run() -> dict[str, object]:
        return _view(next(rounds), committed)  # a new round every time it looks

    tr.get_run = get_run  # type: ignore[method-assign]
    tr.MODEL_ASK_INTERVAL_S = 0.05
    tr.MODEL_CHASE_TIMEOUTS = 3
    started = time.monotonic()
    with pytest.raises(TrainerProcessError, match="moved on faster than the node's answers arrived"):
        asyncio.run(tr.request_model(_view(3, committed), asyncio.Event()))
    assert time.monotonic() - started < 5


def test_a_model_request_ends_when_the_run_ends(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    tr, committed, _, _, _ = _trainer_with_model(tmp_path)

    _serve_views(tr, _view(3, committed, status="Failed"))
    tr.MODEL_ASK_INTERVAL_S = 0.05
    got = asyncio.run(tr.request_model(_view(3, committed), asyncio.Event()))
    assert got["status"] == "Failed" and tr.held_hash is None and tr.inbox.await_model is None


def test_a_forged_round_finalized_is_dropped_and_the_genuine_one_accepted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    tr, committed, real, nbytes, _ = _trainer_with_model(tmp_path)
    forged = notice(0, model=committed, weights=b"\0" * nbytes)  # the syncer's header, other weights
    genuine = notice(0, model=committed, weights=real)
    view = {"round": 1, "status": "Training", "model_hash": "0x" + committed.hex(),
            "round_records": [{"model_hash": "0x" + committed.hex(), "syncer": "0x" + SYNCERS[0].hex()}]}

    async def get_run() -> dict[str, object]:
        return view

    tr.get_run = get_run  # type: ignore[method-assign]
    tr.inbox.expect_finalized(0)
    feed(tr.inbox, forged + genuine)
    asyncio.run(tr.wait_finalized(0, asyncio.Event()))
    assert tr.held_hash == committed and tr.inbox.counters["forged"] == 1
    assert tr.inbox.finalized == {} and tr.inbox.await_round is None


def test_a_notice_held_before_the_nodes_record_is_rechecked_at_the_poll_cadence(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A RoundFinalized for a round the node has no record of yet is held (a ranked candidate can
    sign one early). It was rechecked on every 0.2 s wake-up, each time with a getRun: every
    trainer called the node 5 times a second until the round closed (coverage probe). It is now
    rechecked with the polls (here every 1 s); once the record is there the notice is used."""
    import asyncio
    import dataclasses
    import time

    tr, committed, real, _, _ = _trainer_with_model(tmp_path)
    tr.cfg = dataclasses.replace(tr.cfg, poll_interval_s=0.2)
    record = {"model_hash": "0x" + committed.hex(), "syncer": "0x" + SYNCERS[0].hex()}
    calls: list[float] = []
    started = time.monotonic()

    async def get_run() -> dict[str, object]:
        calls.append(time.monotonic() - started)
        if calls[-1] < 2.0:  # the round still open, its deadline far away
            return {"round": 0, "status": "Training", "model_hash": "0x" + committed.hex(), "round_records": []}
        return {"round": 1, "status": "Training", "model_hash": "0x" + committed.hex(), "round_records": [record]}

    tr.get_run = get_run  # type: ignore[method-assign]
    tr.inbox.expect_finalized(0)
    feed(tr.inbox, notice(0, model=committed, weights=real))
    asyncio.run(tr.wait_finalized(0, asyncio.Event()))
    assert tr.held_hash == committed and tr.inbox.finalized == {}
    assert len(calls) <= 4, calls  # ~3 at a 1 s cadence over 2 s; it was ~11


def test_trainer_validator_uses_the_latest_view() -> None:
    from tests.test_gossip_trainer import make_view
    from tests.test_gossip import World

    w = World()
    w.to_training()
    current: list[object] = [None]
    validate = _trainer_validator(g.TOPIC_TRAINING, lambda: current[0])  # type: ignore[arg-type, return-value]
    good = g.encode_message(payload_chunks(0)[0])
    with pytest.raises(GossipIgnore, match="not this trainer's run"):
        validate(good, "peer")  # no view yet
    current[0] = make_view(w)
    validate(good, "peer")
    with pytest.raises(GossipReject, match="bad signature"):
        validate(g.encode_message(payload_chunks(1, key=OUTSIDER_KEY)[0]), "peer")


def test_trainer_validator_takes_weights_from_its_bootstrap_node_only() -> None:
    """The trainer process wires its --bootstrap peer ids in as the weights sources."""
    from tenzro_training.p2p.host import get_peer_ids
    from tests.test_gossip import World
    from tests.test_gossip_trainer import make_view

    w = World()
    w.to_training()
    view = make_view(w, max_model_bytes=64)
    (node,) = get_peer_ids((_BOOTSTRAP,))
    validate = _trainer_validator(g.TOPIC_TRAINING, lambda: view, model_sources=get_peer_ids((_BOOTSTRAP,)))
    chunk = g.encode_message(g.compute_model_chunks(task_id=view.task_id, round=0, model_hash=h("m0"),
                                                    weights=b"\0" * 64)[0])
    with pytest.raises(GossipIgnore, match="not by this trainer's node"):
        validate(chunk, "16Uiu2HAmSomeoneElse")
    validate(chunk, node)


def test_a_model_answer_seen_before_asking_does_not_hide_the_next_copy() -> None:
    """The node answers every ModelRequest with the same bytes. A copy that arrives before this
    trainer asks (another trainer's answer) is dropped by the inbox; it must not stay in the
    validator's dedup cache, or every later copy is a "duplicate" that never reaches the inbox
    (the e2e gossip run: two trainers got no model within 60 s)."""
    from tenzro_training.gossip import SeenCache
    from tests.test_gossip import World
    from tests.test_gossip_trainer import make_view

    w = World()
    w.to_training()
    weights = bytes(range(256)) * 8
    view = make_view(w, max_model_bytes=len(weights))
    seen = SeenCache()
    validate = _trainer_validator(g.TOPIC_TRAINING, lambda: view, seen)
    inbox = GossipInbox(view.task_id, g, model_bytes=len(weights), seen=seen)
    answer = g.compute_model_chunks(task_id=view.task_id, round=0, model_hash=h("m0"), weights=weights)

    def deliver() -> None:
        for chunk in answer:
            data = g.encode_message(chunk)
            try:
                validate(data, "node")
            except GossipIgnore:
                continue  # a duplicate: gossipsub drops it before the inbox
            inbox._on_message(data, "node")

    deliver()  # before this trainer asked: dropped
    assert inbox.models == {} and inbox.counters["unexpected"] == len(answer)
    inbox.expect_model(0)
    deliver()  # the node's answer to this trainer: the same bytes again
    assert inbox.models[answer[0].data_hash] == (0, h("m0"), weights)


def test_invalid_empty_tensors_in_the_view_stop_the_trainer() -> None:
    from tenzro_training.fragments import TensorSpec, compute_fragment_layouts
    from tenzro_training.trainer.process import TrainerProcessError, compute_model_layout_from_view

    layouts = compute_fragment_layouts([TensorSpec("w", (4,), "float32")], 2)
    assert [s.name for s in compute_model_layout_from_view({"empty_tensors": [{"name": "e", "shape": [0, 3]}]},
                                                           layouts).specs] == ["e", "w"]
    for bad in ([{"name": "w", "shape": [0]}],  # also a sliced tensor
                [{"name": "x", "shape": [2]}],  # not empty
                [{"name": "x"}],
                "nope"):
        with pytest.raises(TrainerProcessError, match="empty_tensors are malformed"):
            compute_model_layout_from_view({"empty_tensors": bad}, layouts)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_invalid_device_stops_the_trainer_before_it_calls_the_node(
    tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tenzro_training.cli import main

    monkeypatch.setenv("TENZRO_PRIVATE_KEY", "0x" + "11" * 32)
    spec = tmp_path / "spec.json"
    spec.write_text("{}")
    # Nothing listens on port 9: had the trainer called the node first, the error would be a connection error.
    code = main(["trainer", "run", "--task-id", "t", "--spec", str(spec), "--p2p-key", str(tmp_path / "k"),
                 "--bootstrap", _BOOTSTRAP, "--rpc", "http://127.0.0.1:9", "--device", "cuda:0"])
    err = capsys.readouterr().err
    assert code != 0 and "no CUDA device" in err and "Traceback" not in err
    assert not (tmp_path / "k").exists()  # no identity made, nothing staked


def _trainer_for(tmp_path, spec_path, task_id: str):  # type: ignore[no-untyped-def]
    """A trainer whose key and state directory live under ``tmp_path`` (a relative key path put
    its ``tenzro-trainer-state`` in the working directory)."""
    from tenzro_training.trainer.process import TrainerProcessConfig, _Trainer

    cfg = TrainerProcessConfig(task_id=task_id, rpc_url="http://127.0.0.1:9", private_key=b"\x11" * 32,
                               spec_path=spec_path, p2p_key=tmp_path / "unused", bootstrap=(_BOOTSTRAP,))
    return _Trainer(cfg, print)


def test_the_spec_comes_from_the_file_or_the_node_and_must_match_the_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from tenzro_training.spec import TrainingTaskSpec
    from tenzro_training.trainer.process import TrainerProcessError
    from tests.test_spec import example

    obj = example()
    spec = TrainingTaskSpec.from_dict(obj)
    view = {"spec": obj, "spec_hash": "0x" + spec.spec_hash().hex()}
    assert _trainer_for(tmp_path, None, spec.task_id).load_spec(view) == spec  # served by the node
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(obj))
    assert _trainer_for(tmp_path, path, spec.task_id).load_spec({"spec_hash": view["spec_hash"]}) == spec  # from --spec

    tampered = json.loads(json.dumps(obj))
    tampered["max_rounds"] = spec.max_rounds + 1  # a node serving another spec than the run committed to
    with pytest.raises(TrainerProcessError, match="the node's spec hashes to 0x"):
        _trainer_for(tmp_path, None, spec.task_id).load_spec({**view, "spec": tampered})
    with pytest.raises(TrainerProcessError, match="is for"):
        _trainer_for(tmp_path, None, "another-task").load_spec(view)
    with pytest.raises(TrainerProcessError, match="the node's spec is invalid"):
        _trainer_for(tmp_path, None, spec.task_id).load_spec({"spec_hash": view["spec_hash"]})  # an old node: no spec
    path.write_text("{not json")
    with pytest.raises(TrainerProcessError, match="is not valid JSON"):
        _trainer_for(tmp_path, path, spec.task_id).load_spec(view)
    with pytest.raises(TrainerProcessError, match="cannot read"):
        _trainer_for(tmp_path, tmp_path / "missing.json", spec.task_id).load_spec(view)


def _start_failure(kind: str) -> Exception:
    import pathlib

    from tenzro_training.p2p.host import P2PError
    from tenzro_training.p2p.keys import PeerKeyError
    from tenzro_training.trainer.process import TrainerProcessError

    if kind == "p2p":
        return P2PError("cannot listen on /ip4/127.0.0.1/tcp/4001: address in use, blew up")
    if kind == "peer_key":
        return PeerKeyError(pathlib.Path("k"), "in use by another running host, blew up")
    return TrainerProcessError("listening, then the bootstrap dial blew up")


def _trainer_with_fake_setup(tmp_path, monkeypatch, host_class):  # type: ignore[no-untyped-def]
    """A trainer on the CPU whose spec (2 rounds, 1 fragment of an 8-value tensor), model, dataset
    and libp2p host (``host_class``) are fakes: ``run`` gets as far as the host lets it."""
    from types import SimpleNamespace

    import tenzro_training.cli.layouts as cli_layouts
    import tenzro_training.p2p.host as p2p_host
    import tenzro_training.trainer.data as data
    import tenzro_training.trainer.inner as inner
    import tenzro_training.trainer.model as model
    import tenzro_training.trainer.process as process
    from tenzro_training.fragments import TensorSpec, compute_fragment_layouts

    layouts = compute_fragment_layouts([TensorSpec("w", (8,), "float32")], 1)
    monkeypatch.setattr(p2p_host, "P2PHost", host_class)
    monkeypatch.setattr(cli_layouts, "compute_layouts_from_view", lambda view: layouts)
    monkeypatch.setattr(process, "compute_model_layout_from_view",
                        lambda view, lays: SimpleNamespace(specs=(TensorSpec("w", (8,), "float32"),)))
    monkeypatch.setattr(model, "get_adapter", lambda family: SimpleNamespace(
        config_from_spec=lambda spec: SimpleNamespace(context_len=1, horizon=1), tensor_shapes=lambda cfg: {"w": (8,)}))
    monkeypatch.setattr(inner.InnerConfig, "from_spec", classmethod(lambda cls, spec, batch_size: None))
    monkeypatch.setattr(data, "load_corpus", lambda ref: None)
    monkeypatch.setattr(data, "validate_dataset_hash", lambda corpus, h: None)
    monkeypatch.setattr(data, "check_shardable", lambda *args: None)  # the corpus is a fake
    tr = _trainer_for(tmp_path, None, TASK)
    spec = SimpleNamespace(architecture=SimpleNamespace(family="x", dtype="fp32", fragment_count=1, metadata={}),
                           dataset_ref="r", dataset_hash="h", max_rounds=2, trainer_count=1)
    tr.load_spec = lambda view: spec  # type: ignore[method-assign]
    tr.cfg = process.TrainerProcessConfig(**{**{f: getattr(tr.cfg, f) for f in tr.cfg.__dataclass_fields__},
                                             "device": "cpu"})
    return tr


@pytest.mark.parametrize("kind", ["trainer", "p2p", "peer_key"])
def test_a_host_that_fails_to_start_is_still_stopped(tmp_path, monkeypatch, kind) -> None:  # type: ignore[no-untyped-def]
    """P7: host.start() ran outside the try/finally that stops the host, so a start that failed
    (or was cancelled) half-way left the libp2p thread and its socket behind.

    The host's own errors (P2PError, PeerKeyError) come out as TrainerProcessError, so the CLI
    exits 1 as for every trainer failure (docs/trainer-process.md); they used to reach the CLI
    as plain TenzroErrors and exit 2, the status for bad usage (docs audit)."""
    import asyncio

    import tenzro_training.trainer.process as process

    stopped: list[bool] = []

    class FailingHost:
        def __init__(self, config: object) -> None:
            pass

        async def start(self) -> None:
            raise _start_failure(kind)

        async def stop(self) -> None:
            stopped.append(True)

    tr = _trainer_with_fake_setup(tmp_path, monkeypatch, FailingHost)

    async def get_run() -> dict[str, object]:
        return {}

    async def enroll(view: object, stop: object) -> dict[str, object]:
        return {}

    tr.get_run = get_run  # type: ignore[method-assign]
    tr.enroll = enroll  # type: ignore[method-assign]
    with pytest.raises(process.TrainerProcessError, match="blew up"):
        asyncio.run(tr.run(asyncio.Event()))
    assert stopped == [True]


# --- a late or skipped round never ends the trainer (reviewer repro late_submit.py) -----------------


def _error(code: int, name: str) -> Exception:
    from tenzro_training.cli import EXIT_RPC_ERROR, CliError

    return CliError(f"error {code} {name}: {TASK}: refused", EXIT_RPC_ERROR, rpc_code=code)


BASE = b"\xab" * 32
"""The verified model hash a bare trainer's round starts from."""


def _bare_trainer(tmp_path, **overrides):  # type: ignore[no-untyped-def]
    from tenzro_training.trainer.process import TrainerProcessConfig, _Trainer

    cfg = TrainerProcessConfig(**{"task_id": TASK, "rpc_url": "http://127.0.0.1:9", "private_key": b"\x11" * 32,
                                  "spec_path": None, "p2p_key": tmp_path / "p2p.key",
                                  "bootstrap": (_BOOTSTRAP,), "chain_id": CHAIN_ID, **overrides})
    said: list[str] = []
    tr = _Trainer(cfg, said.append)

    async def publish_payload(*args: object) -> None:
        pass

    tr.publish_payload = publish_payload  # type: ignore[method-assign]
    return tr, said


class _ScriptedNode:
    """A trainer's RPC client that answers each call with the next of ``answers`` (an exception
    is raised): what the node said, or that it could not be reached."""

    def __init__(self, answers: list[object]) -> None:
        self.answers = answers

    def call(self, method: str, params: dict[str, object]) -> object:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _node_down() -> Exception:
    from tenzro_training.cli import EXIT_UNREACHABLE, CliError

    return CliError("cannot reach node at http://127.0.0.1:9/: [Errno 111] Connection refused", EXIT_UNREACHABLE)


@pytest.mark.parametrize("code, name", [(1305, "LateSubmission"), (1304, "RoundMismatch"), (1303, "InvalidState")])
def test_a_round_closed_to_this_trainer_is_skipped_not_fatal(tmp_path, code: int, name: str) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    tr, said = _bare_trainer(tmp_path)

    async def call(method: str, params: dict[str, object]) -> object:
        raise _error(code, name)

    tr.call = call  # type: ignore[method-assign]
    assert asyncio.run(tr.submit(0, [b"payload"], asyncio.Event())) is False
    assert said == [f"round 0 skipped: error {code} {name}: {TASK}: refused"]


def test_a_skipped_rounds_topk_values_go_back_into_the_residual(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Error feedback: fragment 0 was accepted, fragment 1 came late. Fragment 1's sent values never
    reach the model, so they go back into its residual (sent later, not lost); fragment 0's stay
    sent. A round whose payloads this process did not make (saved before a restart) restores nothing."""
    import asyncio

    import torch

    from tenzro_training.compression import ErrorFeedback, PayloadEncoding
    from tenzro_training.fragments import TensorSpec, compute_fragment_layouts

    tr, said = _bare_trainer(tmp_path)
    layouts = compute_fragment_layouts([TensorSpec("w", (40,), "float32")], 2)
    tr.feedback = ErrorFeedback(layouts, PayloadEncoding("topk", 1000, 1))
    grads = [torch.arange(1.0, lay.numel + 1) for lay in layouts]
    tr.feedback.compress(grads, "float32")
    tr.feedback_round = 0
    calls: list[int] = []

    async def call(method: str, params: dict[str, object]) -> object:
        calls.append(int(params["fragment"]))  # type: ignore[call-overload]
        if params["fragment"] == 1:
            raise _error(1305, "LateSubmission")
        return {}

    tr.call = call  # type: ignore[method-assign]
    assert asyncio.run(tr.submit(0, [b"payload-0", b"payload-1"], asyncio.Event())) is False
    assert calls == [0, 1] and said == [f"round 0 skipped: error 1305 LateSubmission: {TASK}: refused"]
    assert torch.equal(tr.feedback._residual[1], grads[1])  # all of it held again
    assert float(tr.feedback._residual[0].sum()) < float(grads[0].sum())  # the top-k went out
    assert tr.feedback_round is None and tr.feedback.restore_unsent([0]) == 1  # 0 was left as sent

    tr.feedback.compress(grads, "float32")
    tr.feedback_round = None  # payloads saved before a restart: nothing of this process's to restore
    before = [r.clone() for r in tr.feedback._residual]
    assert asyncio.run(tr.submit(1, [b"payload-2", b"payload-3"], asyncio.Event())) is False
    assert all(torch.equal(a, b) for a, b in zip(before, tr.feedback._residual))

    # The signing guard refuses round 2 (fragment 1 was signed with other bytes before): nothing
    # of the round is signed, so every fragment's values come back.
    from tenzro_training.payload import compute_payload_hash
    from tenzro_training.trainer.signing_guard import SigningRefused

    compensated = [g + r for g, r in zip(grads, tr.feedback._residual)]
    tr.feedback.compress(grads, "float32")
    tr.feedback_round = 2
    tr.signing_guard().record(2, 1, compute_payload_hash(b"other bytes"))
    with pytest.raises(SigningRefused):
        asyncio.run(tr.submit(2, [b"payload-4", b"payload-5"], asyncio.Event()))
    assert all(torch.equal(r, c) for r, c in zip(tr.feedback._residual, compensated))


def _topk_trainer(tmp_path, monkeypatch, encoding=None):  # type: ignore[no-untyped-def]
    """A bare trainer of a topk 10% task (or of ``encoding``) whose ``train`` is the real one over
    a fake inner loop: round r's outer gradients are a fixed function of r (as if every process
    trained alike)."""
    from types import SimpleNamespace

    import torch

    import tenzro_training.trainer.inner as inner
    import tenzro_training.trainer.process as process
    from tenzro_training.compression import PayloadEncoding
    from tenzro_training.fragments import TensorSpec, compute_fragment_layouts

    def run_inner_loop(state, cfg, model_cfg, shard, round_, *args, **kwargs):  # type: ignore[no-untyped-def]
        return SimpleNamespace(state={"round": round_}, train_loss=0.5, optimizer_state=None)

    def compute_outer_gradients(state, trained, layouts):  # type: ignore[no-untyped-def]
        gen = torch.Generator().manual_seed(1000 + trained["round"])
        return [torch.randn(lay.numel, generator=gen) for lay in layouts]

    monkeypatch.setattr(inner, "run_inner_loop", run_inner_loop)
    monkeypatch.setattr(inner, "compute_outer_gradients", compute_outer_gradients)
    monkeypatch.setattr(process, "compute_full_state", lambda model, weights: {})
    tr, said = _bare_trainer(tmp_path)
    tr.layouts = compute_fragment_layouts([TensorSpec("w", (40,), "float32"), TensorSpec("v", (13,), "float32")], 2)
    tr.encoding, tr.payload_dtype = encoding or PayloadEncoding("topk", 1000), "bfloat16"
    tr.weights, tr.model, tr.inner_cfg, tr.model_cfg, tr.shard, tr.shard_index, tr.device = [], None, None, None, None, 0, "cpu"
    return tr, said


def _topk_view(tr, records: list[tuple[bytes, list[bool]]]) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """getRun at round len(records) of a run started from BASE: each record is (the model it made,
    whether each fragment aggregated this trainer)."""
    return {"initial_model_hash": "0x" + BASE.hex(), "round_records": [
        {"round": r, "model_hash": "0x" + model.hex(),
         "fragments": [{"accepted": [tr.address] if took else ["0x" + "22" * 20]} for took in accepted]}
        for r, (model, accepted) in enumerate(records)]}


FEEDBACK_ENCODINGS = [{"topk": {"density_bps": 1000}}, {"q8": {"block_size": 16}}]


@pytest.mark.parametrize("encoding", FEEDBACK_ENCODINGS, ids=["topk", "q8"])
def test_a_restarted_trainer_resumes_its_error_feedback_bit_for_bit(tmp_path, monkeypatch, encoding) -> None:  # type: ignore[no-untyped-def]
    """At 1% the residual holds 99% of what a trainer computed: a restart used to start it from
    zero. Round 0's fragment 1 came late (its values went back into the residual); the trainer
    saved round 1's state and then died before saving round 1's payloads. The restarted process
    resumes from round 0's saved state (round 1's is not the one its retry follows), puts fragment
    1's values back because round 0's record did not aggregate them, and sends exactly the round 1
    payloads the process that never stopped sent."""
    import asyncio

    from tenzro_training.compression import PayloadEncoding

    enc = PayloadEncoding.from_json(encoding)
    first, _ = _topk_trainer(tmp_path, monkeypatch, enc)
    first.held_hash = BASE
    asyncio.run(first.get_payloads(0, _topk_view(first, [])))
    first.unsend(0, range(1, 2))  # fragment 1 late
    first.held_hash = _B
    view = _topk_view(first, [(_B, [True, False])])
    expected, resubmitted = asyncio.run(first.get_payloads(1, view))
    assert not resubmitted and first.feedback_store.rounds() == [0, 1]
    for f in range(2):
        first.payloads.path(1, f, _B).unlink()  # killed before round 1's payloads were saved

    restarted, said = _topk_trainer(tmp_path, monkeypatch, enc)
    restarted.held_hash = _B
    assert asyncio.run(restarted.get_payloads(1, view)) == (expected, False)
    assert said == ["error feedback resumed from round 0's saved state (1 fragments it did not aggregate "
                    "from this trainer put back)"]
    assert restarted.feedback is not None and first.feedback is not None
    assert all(torch_equal(a, b) for a, b in zip(restarted.feedback._residual, first.feedback._residual))

    # Had round 0 aggregated both fragments, nothing is put back, and the round differs.
    for f in range(2):
        first.payloads.path(1, f, _B).unlink()
    again, said = _topk_trainer(tmp_path, monkeypatch, enc)
    again.held_hash = _B
    payloads, _ = asyncio.run(again.get_payloads(1, _topk_view(first, [(_B, [True, True])])))
    assert said == ["error feedback resumed from round 0's saved state"] and payloads[1] != expected[1]
    assert payloads[0] == expected[0]


@pytest.mark.parametrize("encoding", FEEDBACK_ENCODINGS, ids=["topk", "q8"])
def test_a_restarted_trainer_resubmitting_a_round_holds_its_sent_values(tmp_path, monkeypatch, encoding) -> None:  # type: ignore[no-untyped-def]
    """Resubmitting round 0's saved payloads: the state saved with them, sent values included,
    so a fragment that then comes late goes back into the residual as in the first process."""
    import asyncio

    from tenzro_training.compression import PayloadEncoding

    enc = PayloadEncoding.from_json(encoding)
    first, first_said = _topk_trainer(tmp_path, monkeypatch, enc)
    first.held_hash = BASE
    view = _topk_view(first, [])
    payloads, _ = asyncio.run(first.get_payloads(0, view))
    assert first_said == []  # round 0 of a run has no earlier state to miss: nothing to say
    restarted, said = _topk_trainer(tmp_path, monkeypatch, enc)
    restarted.held_hash = BASE
    assert asyncio.run(restarted.get_payloads(0, view)) == (payloads, True)
    assert said == ["error feedback resumed from the state saved with round 0's payloads"]
    first.unsend(0, range(0, 2))
    restarted.unsend(0, range(0, 2))
    assert restarted.feedback is not None and first.feedback is not None
    assert all(torch_equal(a, b) for a, b in zip(restarted.feedback._residual, first.feedback._residual))
    assert restarted.feedback.residual_norm() > 0


@pytest.mark.parametrize("damage, why", [
    ("another base", "saved for base 0x" + "bb" * 32 + ", not 0x" + "ab" * 32),
    ("another task", "saved for task_id another-task"),
    ("another encoding", "saved for encoding"),
    ("garbage", "not a saved error-feedback state"),
])
def test_a_saved_state_not_of_this_run_is_left_unused(tmp_path, monkeypatch, damage: str, why: str) -> None:  # type: ignore[no-untyped-def]
    """A task id reused on another node, a file of another task or encoding, a damaged file: the
    trainer says so and starts from zero (the residual is no safety matter; the run goes on)."""
    import asyncio

    from tenzro_training.compression import PayloadEncoding

    first, _ = _topk_trainer(tmp_path, monkeypatch)
    first.held_hash = _B if damage == "another base" else BASE
    if damage == "another encoding":
        first.encoding = PayloadEncoding("topk", 100)
    asyncio.run(first.get_payloads(0, _topk_view(first, [])))
    if damage == "garbage":
        first.feedback_store.path(0).write_bytes(b"\x10" + b"\x00" * 7 + b"{not json")
    if damage == "another task":  # copied in by hand, say
        first.feedback_store.save(0, first.feedback.to_bytes(first._feedback_metadata(0) | {"task_id": "another-task"}))
    restarted, said = _topk_trainer(tmp_path, monkeypatch)
    restarted.held_hash = _C
    asyncio.run(restarted.get_payloads(1, _topk_view(restarted, [(_C, [True, True])])))
    assert len(said) == 1 and said[0].startswith("error feedback starts from zero: ") and why in said[0], said
    assert restarted.feedback is not None and restarted.feedback_store.rounds() == [0, 1]


@pytest.mark.parametrize("view, why", [
    ({"round_records": []}, "no record of round 0"),
    ({"round_records": [{"fragments": []}]}, "malformed (KeyError)"),  # no initial_model_hash
    ({"initial_model_hash": "0xzz", "round_records": [{"fragments": []}]}, "malformed (ValueError)"),
    ({"initial_model_hash": "0x" + "ab" * 32, "round_records": [{"fragments": [{}]}]}, "1 fragments, not 2"),
    ({"initial_model_hash": "0x" + "ab" * 32, "round_records": [{"fragments": [None, None]}]}, "malformed (TypeError)"),
    ({"initial_model_hash": "0x" + "ab" * 32, "round_records": "xx"}, "malformed"),
])
def test_a_getrun_view_that_does_not_say_how_round_q_ended_leaves_the_state_unused(tmp_path, monkeypatch, view,  # type: ignore[no-untyped-def]
                                                                                  why: str) -> None:
    """getRun's answer is the node's (untrusted): a record that is missing or malformed is no
    reason to crash the trainer; its saved state goes unused, said once."""
    import asyncio

    first, _ = _topk_trainer(tmp_path, monkeypatch)
    first.held_hash = BASE
    asyncio.run(first.get_payloads(0, _topk_view(first, [])))
    restarted, said = _topk_trainer(tmp_path, monkeypatch)
    restarted.held_hash = _C
    asyncio.run(restarted.get_payloads(1, view))
    assert len(said) == 1 and said[0].startswith("error feedback starts from zero") and why in said[0], said


def test_a_restart_without_its_saved_state_says_so_and_never_reaches_back_to_an_older_one(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Trainer kill campaign: resubmitting round 1's payloads without round 1's state, the next
    round resumed from round 0's, whose residual holds what round 1's payloads had already sent;
    a fresh round with no state at all said nothing, though the docs list the line."""
    import asyncio

    first, _ = _topk_trainer(tmp_path, monkeypatch)
    first.held_hash = BASE
    asyncio.run(first.get_payloads(0, _topk_view(first, [])))
    first.held_hash = _B
    view1 = _topk_view(first, [(_B, [True, True])])
    sent, _ = asyncio.run(first.get_payloads(1, view1))
    first.feedback_store.path(1).unlink()  # lost; round 0's is still there

    restarted, said = _topk_trainer(tmp_path, monkeypatch)
    restarted.held_hash = _B
    assert asyncio.run(restarted.get_payloads(1, view1)) == (sent, True)
    restarted.held_hash = _C
    asyncio.run(restarted.get_payloads(2, _topk_view(first, [(_B, [True, True]), (_C, [True, True])])))
    assert said == ["error feedback starts from zero: no state was saved with round 1's payloads"]

    for r in restarted.feedback_store.rounds():  # nothing saved at all, round 3 trained afresh
        restarted.feedback_store.path(r).unlink()
    again, said = _topk_trainer(tmp_path, monkeypatch)
    again.held_hash = _D
    asyncio.run(again.get_payloads(3, _topk_view(first, [(_B, [True, True]), (_C, [True, True]), (_D, [True, True])])))
    assert said == ["error feedback starts from zero: no state was saved before round 3"]


def test_a_refused_state_is_said_once_and_a_resumed_one_prunes_the_older(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A damaged state was read again, and refused again, at the next round; and a restart
    resumed from round q left the states before q until a later round's payloads were saved
    (5 model-sized files after repeated kills, trainer kill campaign)."""
    import asyncio

    first, _ = _topk_trainer(tmp_path, monkeypatch)
    first.held_hash = BASE
    asyncio.run(first.get_payloads(0, _topk_view(first, [])))
    first.held_hash = _B
    asyncio.run(first.get_payloads(1, _topk_view(first, [(_B, [True, True])])))
    for f in range(2):
        first.payloads.path(1, f, _B).unlink()  # killed after round 1's state, before its payloads
    assert first.feedback_store.rounds() == [0, 1]

    records = [(_B, [True, True]), (_C, [True, True])]  # the run moved on without it
    resumed, said = _topk_trainer(tmp_path, monkeypatch)
    resumed.held_hash = _C
    asyncio.run(resumed.get_payloads(2, _topk_view(first, records)))
    assert said == ["error feedback resumed from round 1's saved state"]
    assert resumed.feedback_store.rounds() == [1, 2]  # round 0's is gone at once

    resumed.feedback_store.path(2).write_bytes(b"damaged")
    for f in range(2):
        resumed.payloads.path(2, f, _C).unlink()
    refused, said = _topk_trainer(tmp_path, monkeypatch)
    refused.held_hash = _D
    records.append((_D, [True, True]))
    asyncio.run(refused.get_payloads(3, _topk_view(first, records)))
    refused.held_hash = _E
    records.append((_E, [True, True]))
    asyncio.run(refused.get_payloads(4, _topk_view(first, records)))
    assert len(said) == 1 and said[0].startswith("error feedback starts from zero: ") and "round-2" in said[0], said


def torch_equal(a, b) -> bool:  # type: ignore[no-untyped-def]
    import torch

    return a is None and b is None or a is not None and b is not None and torch.equal(a, b)


@pytest.mark.parametrize("code, name, why", [(1306, "NotEnrolled", "no longer"), (1311, "Equivocation", "slashed")])
def test_invalid_trainer_out_of_the_run_stops_with_a_clear_line(tmp_path, code: int, name: str, why: str) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from tenzro_training.trainer.process import TrainerProcessError

    tr, _ = _bare_trainer(tmp_path)

    async def call(method: str, params: dict[str, object]) -> object:
        raise _error(code, name)

    tr.call = call  # type: ignore[method-assign]
    with pytest.raises(TrainerProcessError, match=f"this trainer is out of {TASK}: .*{why}"):
        asyncio.run(tr.submit(0, [b"payload"], asyncio.Event()))


def _round_view(tr, round_: int, **extra: object) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {"status": "Training", "round": round_, "trainer_count": 1, "model_hash": "0x" + "ab" * 32,
            "round_records": [{}] * round_, "trainers": [{"address": tr.address, "shard": 0, "slashed": False}],
            **extra}


def test_a_late_trainer_skips_the_round_and_trains_the_next(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Reviewer repro late_submit.py: LateSubmission (normal outside the first K) escaped submit()
    and ``_rounds`` as a CliError: ``tenzro trainer run`` exited 1 for good."""
    import asyncio
    from types import SimpleNamespace

    import tenzro_training.trainer.data as data
    from tenzro_training.fragments import TensorSpec, compute_fragment_layouts

    monkeypatch.setattr(data, "shard_windows", lambda *args: None)
    tr, said = _bare_trainer(tmp_path, rounds=2)
    tr.layouts = compute_fragment_layouts([TensorSpec("w", (8,), "float32")], 1)
    tr.model_cfg = SimpleNamespace(context_len=1, horizon=1)
    tr.held_hash = bytes.fromhex("ab" * 32)
    tr.inbox = GossipInbox(TASK, g, 32)
    tr.last_loss = 0.5
    submitted: list[int] = []
    waited: list[int] = []
    views = iter([_round_view(tr, 0), _round_view(tr, 1)])  # round 0 open: wait for it to close without us

    async def wait_training(stop: object) -> dict[str, object]:
        return _round_view(tr, 0)

    async def get_run() -> dict[str, object]:
        return next(views)

    async def call(method: str, params: dict[str, object]) -> object:
        assert tr.payloads.path(int(params["round"]), 0, BASE).exists()  # type: ignore[call-overload]  # saved first
        submitted.append(int(params["round"]))  # type: ignore[call-overload]
        if params["round"] == 0:
            raise _error(1305, "LateSubmission")
        return {}

    async def wait_finalized(round_: int, stop: object) -> dict[str, object]:
        waited.append(round_)
        return _round_view(tr, round_ + 1)

    tr.wait_training, tr.get_run, tr.call, tr.wait_finalized = wait_training, get_run, call, wait_finalized  # type: ignore[method-assign]
    tr.train = lambda round_: [b"payload-%d" % round_]  # type: ignore[method-assign]
    assert asyncio.run(tr._rounds(asyncio.Event(), corpus=None)) == 0
    assert submitted == [0, 1] and waited == [0, 1]
    assert any(line.startswith("round 0 skipped: error 1305") for line in said)
    assert any(line.startswith("round 1 submitted 1 fragments") for line in said)
    assert not tr.payloads.path(0, 0, BASE).exists()  # round 0 is over: its saved payload is gone


@pytest.mark.parametrize("step, said", [
    (0, "round 1: the global model 0x" + "ab" * 32 + " (committed by round 0) gives a non-finite loss (nan) before "
        "any inner step: the run's model has diverged"),
    (3, "round 1: the inner loop diverged at inner step 3 (loss inf) from the global model 0x" + "ab" * 32),
])
def test_invalid_loss_stops_the_trainer_with_the_round_and_the_model(tmp_path, monkeypatch, step: int,  # type: ignore[no-untyped-def]
                                                                     said: str) -> None:
    """Byzantine probe (2026-11-27): a global model poisoned under Mean stopped every trainer with
    only "inner step 0: loss is nan", naming neither the round nor that the model was the cause.
    Nothing is signed or submitted for the round."""
    import asyncio
    from types import SimpleNamespace

    import tenzro_training.trainer.data as data
    from tenzro_training.fragments import TensorSpec, compute_fragment_layouts
    from tenzro_training.trainer.inner import InnerLoopDiverged
    from tenzro_training.trainer.process import TrainerProcessError

    monkeypatch.setattr(data, "shard_windows", lambda *args: None)
    tr, _ = _bare_trainer(tmp_path)
    tr.layouts = compute_fragment_layouts([TensorSpec("w", (8,), "float32")], 1)
    tr.model_cfg = SimpleNamespace(context_len=1, horizon=1)
    tr.held_hash = bytes.fromhex("ab" * 32)
    tr.inbox = GossipInbox(TASK, g, 32)
    calls: list[str] = []

    async def wait_training(stop: object) -> dict[str, object]:
        return _round_view(tr, 1)

    async def call(method: str, params: dict[str, object]) -> object:
        calls.append(method)
        return {}

    def train(round_: int) -> list[bytes]:
        raise InnerLoopDiverged(step, float("nan") if step == 0 else float("inf"))

    tr.wait_training, tr.call, tr.train = wait_training, call, train  # type: ignore[method-assign]
    with pytest.raises(TrainerProcessError) as info:
        asyncio.run(tr._rounds(asyncio.Event(), corpus=None))
    assert str(info.value).startswith(said), str(info.value)
    assert "nothing was signed for this round" in str(info.value)
    assert calls == [] and not tr.signing_guard().signed(1, 0) and not tr.payloads.path(1, 0, BASE).exists()


# --- the wait for a round follows the node's deadlines (reviewer repro wait_final.py) --------------


@pytest.mark.parametrize("restart", [False, True])
def test_a_round_that_closed_while_the_node_restarted_asks_for_the_model_at_once(tmp_path, restart: bool) -> None:  # type: ignore[no-untyped-def]
    """A node killed between committing a round and publishing its RoundFinalized never publishes
    it; every trainer then waited model_timeout_s / 2 (30 s) before asking for the model, even
    on a sealed run (node kill campaign). A round seen closed first after a reconnect is asked
    for at once; without a restart the notice still gets its grace."""
    import asyncio
    import time

    tr, _ = _bare_trainer(tmp_path, model_timeout_s=0.4, poll_interval_s=0.01)
    tr.inbox = GossipInbox(TASK, g, 1024)
    polls: list[float] = []
    asked: list[int] = []

    async def get_run() -> dict[str, object]:
        polls.append(time.monotonic())
        if len(polls) == 1:
            return _round_view(tr, 0)  # still open
        if restart and len(polls) == 2:
            tr.reconnected_at = time.monotonic()  # what call() records: the node answered again
        return _round_view(tr, 1, status="Sealed")

    async def request_model(view: dict[str, object], stop: object) -> dict[str, object]:
        asked.append(len(polls))
        return view

    tr.get_run = get_run  # type: ignore[method-assign]
    tr.request_model = request_model  # type: ignore[method-assign]
    assert asyncio.run(tr.wait_finalized(0, asyncio.Event()))["status"] == "Sealed"
    if restart:
        assert asked == [2]  # at the first poll that saw the round closed
    else:  # its RoundFinalized gets model_timeout_s / 2 (polls every 0.05 s here)
        assert len(asked) == 1 and asked[0] > 2 and polls[-1] - polls[1] >= 0.2


def test_wait_finalized_waits_past_model_timeout_while_the_round_is_open(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import asyncio
    import time

    tr, _ = _bare_trainer(tmp_path, model_timeout_s=0.2, poll_interval_s=0.01)
    tr.inbox = GossipInbox(TASK, g, 1024)
    now_ms = int(time.time() * 1000)
    polls: list[float] = []

    async def get_run() -> dict[str, object]:
        polls.append(time.monotonic())
        if len(polls) < 30:  # round 0 open, quorum not reached, its deadline an hour away
            return _round_view(tr, 0, now_ms=now_ms, round_deadline_ms=now_ms + 3_600_000, quorum_at_ms=None,
                               finalize_deadline_ms=None)
        return _round_view(tr, 0, status="Failed", end_reason="quorum")

    tr.get_run = get_run  # type: ignore[method-assign]
    started = time.monotonic()
    view = asyncio.run(tr.wait_finalized(0, asyncio.Event()))
    assert view["status"] == "Failed" and len(polls) == 30
    assert time.monotonic() - started > 5 * 0.2  # far beyond model_timeout_s: it used to give up there


def test_invalid_round_open_past_the_nodes_deadline_gives_up(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from tenzro_training.trainer.process import TrainerProcessError

    tr, _ = _bare_trainer(tmp_path, model_timeout_s=1.0, poll_interval_s=0.01)
    tr.inbox = GossipInbox(TASK, g, 1024)

    async def get_run() -> dict[str, object]:  # quorum reached, finalize deadline (after failovers) long past
        return _round_view(tr, 0, now_ms=10_000_000, round_deadline_ms=1, quorum_at_ms=5,
                           finalize_deadline_ms=10_000_000 - 1_001)

    tr.get_run = get_run  # type: ignore[method-assign]
    with pytest.raises(TrainerProcessError, match="after the deadline the node reports"):
        asyncio.run(tr.wait_finalized(0, asyncio.Event()))


def test_invalid_round_wait_beyond_the_safety_net_gives_up(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from tenzro_training.trainer.process import TrainerProcessError

    tr, _ = _bare_trainer(tmp_path, max_round_wait_s=0.3, poll_interval_s=0.01)
    tr.inbox = GossipInbox(TASK, g, 1024)

    async def get_run() -> dict[str, object]:
        return _round_view(tr, 0, now_ms=0, round_deadline_ms=3_600_000, quorum_at_ms=None, finalize_deadline_ms=None)

    tr.get_run = get_run  # type: ignore[method-assign]
    with pytest.raises(TrainerProcessError, match="--max-round-wait 0.3s"):
        asyncio.run(tr.wait_finalized(0, asyncio.Event()))


def test_round_wait_deadline_follows_quorum_and_failover() -> None:
    from tenzro_training.trainer.process import compute_round_wait_deadline_ms

    assert compute_round_wait_deadline_ms({"round_deadline_ms": 100, "quorum_at_ms": None,
                                           "finalize_deadline_ms": None}) == 100
    # Quorum reached: the round deadline no longer applies; a failover pushed the finalize deadline.
    assert compute_round_wait_deadline_ms({"round_deadline_ms": 100, "quorum_at_ms": 50,
                                           "finalize_deadline_ms": 900}) == 900
    assert compute_round_wait_deadline_ms({"next_deadline_ms": 7}) == 7
    assert compute_round_wait_deadline_ms({}) is None
    # Quorum reached, no finalize deadline yet: the round deadline is over, the next one applies.
    assert compute_round_wait_deadline_ms({"round_deadline_ms": 100, "quorum_at_ms": 50, "finalize_deadline_ms": None,
                                           "next_deadline_ms": 700}) == 700
    assert compute_round_wait_deadline_ms({"round_deadline_ms": 100, "quorum_at_ms": 50}) is None


# --- restart safety: the saved payload bytes are resubmitted, never recomputed ---------------------


def test_a_restarted_trainer_resubmits_the_saved_payload_not_a_recomputed_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Reviewer repro threads.py: payload bytes depend on the torch thread count (and GPU kernels),
    so a recomputed payload after a restart had another hash: equivocation, the stake burned."""
    import asyncio

    from tenzro_training.fragments import TensorSpec, compute_fragment_layouts

    layouts = compute_fragment_layouts([TensorSpec("w", (8,), "float32")], 2)
    first, _ = _bare_trainer(tmp_path)
    first.layouts, first.held_hash = layouts, BASE
    first.train = lambda round_: [b"four-threads-f0", b"four-threads-f1"]  # type: ignore[method-assign]
    assert asyncio.run(first.get_payloads(3, {})) == ([b"four-threads-f0", b"four-threads-f1"], False)

    restarted, _ = _bare_trainer(tmp_path)  # same key, same p2p key directory
    restarted.layouts, restarted.held_hash = layouts, BASE

    def train(round_: int) -> list[bytes]:
        raise AssertionError("a saved round must not be recomputed")

    restarted.train = train  # type: ignore[method-assign]
    assert asyncio.run(restarted.get_payloads(3, {})) == ([b"four-threads-f0", b"four-threads-f1"], True)

    restarted.payloads.prune(4)  # round 3 finalized
    assert restarted.payloads.load(3, 2, BASE) == [None, None]
    other, _ = _bare_trainer(tmp_path, private_key=b"\x22" * 32)  # another trainer sharing the directory
    assert other.payloads.dir != restarted.payloads.dir


@pytest.mark.parametrize("carry", [True, False])
def test_the_inner_optimizer_state_carries_from_round_to_round_when_asked(  # type: ignore[no-untyped-def]
    tmp_path, carry: bool
) -> None:
    """DiLoCo keeps each worker's inner AdamW moments across rounds; the trainer can too
    (``--carry-optimizer-state``). Round 1's payloads must be exactly what the inner loop gives
    with round 0's moments (carried) or without them (the default)."""
    import torch

    from tenzro_training.global_model import compute_full_state, compute_initial_model
    from tenzro_training.trainer.data import load_corpus, shard_windows
    from tenzro_training.trainer.inner import InnerConfig, compute_outer_gradients, make_payloads, run_inner_loop
    from tenzro_training.trainer.model import create_init_checkpoint
    from tests.trainer.conftest import TINY_MODEL

    initial = compute_initial_model(create_init_checkpoint(TINY_MODEL, 0), 2)
    tr, _ = _bare_trainer(tmp_path, carry_optimizer_state=carry)
    tr.model, tr.layouts, tr.weights = initial.model, initial.model.layouts, list(initial.weights)
    tr.model_cfg, tr.inner_cfg = TINY_MODEL, InnerConfig(inner_steps=3, lr=1e-3, batch_size=8, seed=1)
    tr.shard_index, tr.shard = 0, shard_windows(load_corpus(), 0, 3, TINY_MODEL.context_len, TINY_MODEL.horizon)
    tr.device, tr.payload_dtype = torch.device("cpu"), "float32"

    state = compute_full_state(initial.model, initial.weights)
    first = run_inner_loop(state, tr.inner_cfg, TINY_MODEL, tr.shard, 0, 0)
    expected = {}
    for moments in (first.optimizer_state, None):
        second = run_inner_loop(state, tr.inner_cfg, TINY_MODEL, tr.shard, 1, 0, optimizer_state=moments)
        grads = compute_outer_gradients(state, second.state, tr.layouts)
        expected[moments is not None] = make_payloads(TASK, 1, tr.layouts, grads)
    assert expected[True] != expected[False]

    assert tr.train(0) == make_payloads(TASK, 0, tr.layouts, compute_outer_gradients(state, first.state, tr.layouts))
    moments = [s["exp_avg"].data_ptr() for s in tr.optimizer_state["state"].values()] if tr.optimizer_state else []
    assert tr.train(1) == expected[carry]  # the weights were not changed: the same global model
    if carry:  # handed to the next round, never copied: one set of moments on the device
        assert [s["exp_avg"].data_ptr() for s in tr.optimizer_state["state"].values()] == moments != []
    steps = [float(s["step"]) for s in tr.optimizer_state["state"].values()] if tr.optimizer_state else []
    assert steps == ([6.0] * len(steps) if carry else []) and (steps or not carry)


def test_invalid_carry_optimizer_state_setting(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tenzro_training.trainer.process import TrainerProcessError

    with pytest.raises(TrainerProcessError, match="carry_optimizer_state must be a bool"):
        _bare_trainer(tmp_path, carry_optimizer_state="no")


def test_a_partially_saved_round_is_trained_again_whole(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A partial save (stopped while saving) was never signed: its fragment is replaced, so the
    round's fragments come from one inner loop (kept, it mixed two: review, 2026-11-26)."""
    import asyncio

    from tenzro_training.fragments import TensorSpec, compute_fragment_layouts

    layouts = compute_fragment_layouts([TensorSpec("w", (8,), "float32")], 2)
    tr, _ = _bare_trainer(tmp_path, state_dir=tmp_path / "state")
    tr.layouts, tr.held_hash = layouts, BASE
    tr.signing_guard()  # opened before enrolling, as `run` does: before any save
    tr.payloads.save(0, 0, BASE, b"saved-f0")
    tr.train = lambda round_: [b"new-f0", b"new-f1"]  # type: ignore[method-assign]
    assert asyncio.run(tr.get_payloads(0, {})) == ([b"new-f0", b"new-f1"], False)
    assert tr.payloads.load(0, 2, BASE) == [b"new-f0", b"new-f1"]
    assert tr.payloads.dir.is_relative_to(tmp_path / "state")

    # A save older than the record of signatures may have been signed: its bytes are kept.
    old, _ = _bare_trainer(tmp_path / "old", state_dir=tmp_path / "old-state")
    old.layouts, old.held_hash = layouts, BASE
    old.payloads.dir.mkdir(parents=True)
    old.payloads.save(0, 0, BASE, b"saved-f0")
    old.train = lambda round_: [b"new-f0", b"new-f1"]  # type: ignore[method-assign]
    assert asyncio.run(old.get_payloads(0, {})) == ([b"saved-f0", b"new-f1"], False)


def test_a_payload_saved_for_another_run_with_the_task_id_is_not_submitted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The saved payloads were keyed by task id only: a trainer that had saved round 0 of a run
    and then joined another run with the same task id (another node) submitted the saved bytes,
    a gradient of another model, and it was accepted and paid (trainer restart probe). A save
    names the model hash it was trained from. It was then DELETED and the round trained again,
    which, when the "other run" was this run served with another model by a hostile node,
    signed a second payload for the round: equivocation (trainer probe, stop 20). Now the
    saves are kept, nothing is submitted and nothing new is signed."""
    import asyncio

    from tenzro_training.fragments import TensorSpec, compute_fragment_layouts
    from tenzro_training.trainer.signing_guard import SigningRefused

    tr, _ = _bare_trainer(tmp_path)
    tr.layouts = compute_fragment_layouts([TensorSpec("w", (8,), "float32")], 2)
    for f in range(2):
        tr.payloads.save(0, f, b"\x01" * 32, b"old-run-f%d" % f)
    tr.held_hash = BASE  # this run's round-0 model
    trained: list[int] = []
    tr.train = lambda round_: trained.append(round_) or [b"new-f0", b"new-f1"]  # type: ignore[method-assign]
    with pytest.raises(SigningRefused, match="may already have signed a payload for it"):
        asyncio.run(tr.get_payloads(0, {}))
    assert trained == []
    other_base = "01" * 32
    assert sorted(p.name for p in tr.payloads.dir.glob("*.payload")) == [
        f"round-0-fragment-{f}-{other_base}.payload" for f in range(2)
    ]


def test_prune_removes_saved_payloads_and_unfinished_saves(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tr, _ = _bare_trainer(tmp_path, state_dir=tmp_path / "state")
    for r in range(3):
        tr.payloads.save(r, 0, BASE, b"p%d" % r)
    stale = tr.payloads.dir / ".round-2-fragment-1.payload.k1ll3d.tmp"  # a save killed before its rename
    stale.write_bytes(b"half")
    tr.payloads.prune(2)
    assert sorted(p.name for p in tr.payloads.dir.iterdir()) == [f"round-2-fragment-0-{BASE.hex()}.payload"]
    tr.payloads.prune(None)
    assert list(tr.payloads.dir.iterdir()) == []


def test_the_payload_store_refuses_a_fifo_and_logs_what_it_cannot_delete(tmp_path, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    """Trainer kill campaign: a FIFO in a saved payload's place blocked the restarted trainer,
    and a read-only state directory made the prune raise a traceback (the trainer could never
    come back, and the run failed its quorum). Now: one line for the FIFO; a warning for what
    cannot be deleted, and the trainer goes on."""
    import os
    from pathlib import Path

    from tenzro_training.trainer.process import TrainerProcessError

    tr, _ = _bare_trainer(tmp_path, state_dir=tmp_path / "state")
    tr.payloads.save(0, 0, BASE, b"p0")
    os.mkfifo(tr.payloads.path(0, 1, BASE))
    with pytest.raises(TrainerProcessError, match=r"cannot read saved payload .*fragment-1.*: not a regular file"):
        tr.payloads.load(0, 2, BASE)
    tr.payloads.path(0, 1, BASE).unlink()

    def unlink(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "unlink", unlink)
    with caplog.at_level("WARNING", logger="tenzro.trainer"):
        tr.payloads.prune(None)
    assert [r.getMessage() for r in caplog.records] == [
        f"cannot delete old saved payloads in {tr.payloads.dir}: Permission denied"]
    assert tr.payloads.load(0, 2, BASE) == [b"p0", None]


def test_a_state_directory_it_cannot_write_stops_the_trainer_before_it_enrolls(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every round writes into the state directory; a read-only one was found only after the
    trainer had enrolled and staked, at its first save or prune (trainer kill campaign)."""
    import os
    import tempfile

    from tenzro_training.trainer.process import TrainerProcessError

    tr, _ = _bare_trainer(tmp_path, state_dir=tmp_path / "state")
    os.close(tr.payloads.lock())  # writable: fine, and nothing left behind by the check
    assert list(tr.payloads.dir.iterdir()) == []

    def mkstemp(*args: object, **kwargs: object) -> tuple[int, str]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    with pytest.raises(TrainerProcessError, match=r"cannot write in state directory .*: Permission denied "
                                                  r"\(nothing staked\)"):
        tr.payloads.lock()
    monkeypatch.undo()
    os.close(tr.payloads.lock())  # the refused lock was released, not leaked: it can be taken again


def test_the_payload_store_keeps_one_private_directory_per_task_and_account(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An address spelled in another case is the same account, so the same directory (and lock);
    a payload is saved 0600 under a name with its round, fragment and base, and read back whole."""
    import os

    from tenzro_training.trainer.process import PayloadStore

    store = PayloadStore(tmp_path, "t-1", "0xABcdEF")
    assert store.dir == tmp_path / "task-t-1" / "0xabcdef" == PayloadStore(tmp_path, "t-1", "0xabcdef").dir
    assert store.path(3, 1, BASE) == store.dir / f"round-3-fragment-1-{BASE.hex()}.payload"
    fd = store.lock()
    try:
        assert (store.dir.stat().st_mode & 0o077) == 0  # made 0700: payloads and the signing record
        big = os.urandom(3 << 20)
        store.save(3, 1, BASE, big)
        assert store.load(3, 2, BASE) == [None, big] and (store.path(3, 1, BASE).stat().st_mode & 0o777) == 0o600
    finally:
        os.close(fd)


def test_the_payload_store_says_what_it_cannot_do_in_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    from tenzro_training.trainer.process import PayloadStore, TrainerProcessError

    (tmp_path / "file").write_text("")
    blocked = PayloadStore(tmp_path / "file", "t-1", "0xab")  # its directory would be under a file
    with pytest.raises(TrainerProcessError, match=r"cannot use state directory .*/file/task-t-1/0xab: "):
        blocked.lock()
    with pytest.raises(TrainerProcessError, match=r"cannot save payload .*round-0-fragment-0-"):
        blocked.save(0, 0, BASE, b"p")
    store = PayloadStore(tmp_path / "state", "t-1", "0xab")
    fd = store.lock()
    try:
        with pytest.raises(TrainerProcessError, match="another trainer process of this account already runs"):
            store.lock()
    finally:
        os.close(fd)
    os.close(store.lock())  # released with its descriptor


def test_prune_deletes_saved_payloads_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Files of the state directory that are not saved payloads (a name whose round is no number,
    the signing record, error-feedback states) are left, and do not stop the pruning."""
    from tenzro_training.trainer.process import PayloadStore

    store = PayloadStore(tmp_path, "t-1", "0xab")
    store.save(0, 0, BASE, b"p0")
    others = ["round-x-fragment-0-ab.payload", "round-0-notes.txt", "signed-payloads.log",
              "feedback-round-0.safetensors"]
    for name in others:
        (store.dir / name).write_bytes(b"other")
    store.prune(None)
    assert sorted(p.name for p in store.dir.iterdir()) == sorted(others)


# --- nothing is staked before every check that can refuse the trainer (reviewer repro fake_enroll.py) -


def test_invalid_dataset_stops_the_trainer_before_it_enrolls(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import asyncio
    from types import SimpleNamespace

    import tenzro_training.trainer.data as data
    import tenzro_training.trainer.inner as inner
    import tenzro_training.trainer.model as model
    from tenzro_training.trainer.process import TrainerProcessError

    monkeypatch.setattr(model, "get_adapter", lambda family: SimpleNamespace(config_from_spec=lambda spec: None))
    monkeypatch.setattr(inner.InnerConfig, "from_spec", classmethod(lambda cls, spec, batch_size: None))
    monkeypatch.setattr(data, "load_corpus", lambda ref: ())

    def wrong_hash(corpus: object, expected: object) -> None:
        raise data.DatasetError("dataset hash is 0x01, the task expects 0x00")

    monkeypatch.setattr(data, "validate_dataset_hash", wrong_hash)
    tr, _ = _bare_trainer(tmp_path, device="cpu")
    spec = SimpleNamespace(architecture=SimpleNamespace(family="x", dtype="fp32", fragment_count=1, metadata={}),
                           dataset_ref="r", dataset_hash="h", max_rounds=2)
    calls: list[str] = []

    async def call(method: str, params: dict[str, object]) -> object:
        calls.append(method)
        return {"task_id": TASK, "round": 0, "status": "Enrolling", "trainers": []}

    tr.call = call  # type: ignore[method-assign]
    tr.load_spec = lambda view: spec  # type: ignore[method-assign]
    with pytest.raises(TrainerProcessError, match="nothing staked.*dataset hash is 0x01"):
        asyncio.run(tr.run(asyncio.Event()))
    assert calls == ["tenzro_training_getRun"]  # no enrollTrainer


@pytest.mark.parametrize("context_len, fits", [(2048, False), (32, True)])
def test_a_corpus_too_short_for_the_spec_windows_stops_the_trainer_before_it_enrolls(
    tmp_path, context_len: int, fits: bool
) -> None:  # type: ignore[no-untyped-def]
    """The shard index comes with enrollment, but whether the real corpus fills M shards at the
    spec's context and horizon does not: with context 2048 the default corpus has no training
    window, which was found only after staking (ML review). Real corpus, real spec."""
    import asyncio
    import json
    from pathlib import Path

    from tenzro_training.spec import TrainingTaskSpec
    from tenzro_training.trainer.data import DEFAULT_DATASET_REF, compute_dataset_hash, load_corpus
    from tenzro_training.trainer.process import TrainerProcessError

    doc = json.loads((Path(__file__).parents[2] / "tenzro_training/data/timesfm-200m-task.json").read_text())
    doc["dataset_ref"] = DEFAULT_DATASET_REF
    doc["dataset_hash"] = "0x" + compute_dataset_hash(load_corpus(DEFAULT_DATASET_REF)).hex()
    doc["architecture"]["metadata"] = {**doc["architecture"]["metadata"], "context_len": context_len, "horizon": 8}
    spec = TrainingTaskSpec.from_dict(doc)
    tr, _ = _bare_trainer(tmp_path, device="cpu")
    if fits:
        assert len(asyncio.run(tr.prepare(spec))) == len(load_corpus(DEFAULT_DATASET_REF))
        return
    with pytest.raises(TrainerProcessError, match=r"nothing staked.*0 training windows cannot fill 8 shards"):
        asyncio.run(tr.prepare(spec))


def test_a_second_process_of_one_account_stops_before_it_enrolls(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two trainer processes of one account train the same round with different bytes, which is
    equivocation: the second one (same state directory) stops at once, nothing staked, and the
    directory is free again once the first one is gone (P7)."""
    import asyncio
    import os

    from tenzro_training.trainer.process import TrainerProcessError

    first, _ = _bare_trainer(tmp_path, device="cpu")
    held = first.payloads.lock()
    second, _ = _bare_trainer(tmp_path, device="cpu")
    calls: list[str] = []

    async def call(method: str, params: dict[str, object]) -> object:
        calls.append(method)
        return {"task_id": TASK, "round": 0, "status": "Enrolling", "trainers": []}

    second.call = call  # type: ignore[method-assign]
    with pytest.raises(TrainerProcessError, match="another trainer process of this account.*nothing staked"):
        asyncio.run(second.run(asyncio.Event()))
    assert calls == ["tenzro_training_getRun"]  # no enrollTrainer
    other, _ = _bare_trainer(tmp_path, private_key=b"\x22" * 32)  # another account: its own directory
    os.close(other.payloads.lock())
    os.close(held)
    os.close(second.payloads.lock())  # free once the first process is gone


def test_a_trainer_setup_failure_exits_1(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import tenzro_training.trainer.process as process
    from tenzro_training.cli import main
    from tenzro_training.trainer.data import DatasetError

    async def run_trainer(cfg: object, announce: object = None) -> int:
        raise DatasetError("dataset hash is 0x01, the task expects 0x00")

    monkeypatch.setattr(process, "run_trainer", run_trainer)
    monkeypatch.setenv("TENZRO_PRIVATE_KEY", "0x" + "11" * 32)
    code = main(["trainer", "run", "--task-id", "t", "--p2p-key", str(tmp_path / "k"),
                 "--bootstrap", _BOOTSTRAP, "--rpc", "http://127.0.0.1:9"])
    assert code == 1 and "dataset hash is 0x01" in capsys.readouterr().err  # docs/trainer-process.md: exit 1


@pytest.mark.parametrize(("name", "value", "said"), [
    ("TENZRO_LOG_LEVEL", "verbose", "TENZRO_LOG_LEVEL='verbose' is not a log level"),
    ("TENZRO_LOG_FORMAT", "logfmt", "TENZRO_LOG_FORMAT='logfmt' is not a log format (one of text, json)"),
])
def test_invalid_log_setting_is_a_one_line_usage_error(tmp_path, monkeypatch, capsys, name, value, said) -> None:  # type: ignore[no-untyped-def]
    from tenzro_training.cli import main

    monkeypatch.setenv("TENZRO_PRIVATE_KEY", "0x" + "11" * 32)
    monkeypatch.setenv(name, value)
    code = main(["trainer", "run", "--task-id", "t", "--p2p-key", str(tmp_path / "k"),
                 "--bootstrap", _BOOTSTRAP, "--rpc", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 2 and said in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("listen", "bootstrap", "match"), [
    (("/ip4/127.0.0.1/tcp/0",), ("garbage",), "bootstrap address 'garbage' is not a multiaddr"),
    (("/ip4/127.0.0.1/tcp/0",), ("/ip4/127.0.0.1/tcp/4001",), "ending in /p2p/<peer id>"),
    (("nonsense",), (_BOOTSTRAP,), "listen address 'nonsense' is not a multiaddr"),
    (("/dns4/localhost/tcp/0",), (_BOOTSTRAP,), "must start with /ip4/ or /ip6/"),  # libp2p binds all interfaces
])
def test_invalid_multiaddrs_are_refused_before_anything_starts(tmp_path, listen, bootstrap, match) -> None:  # type: ignore[no-untyped-def]
    from tenzro_training.trainer.process import TrainerProcessConfig, TrainerProcessError

    with pytest.raises(TrainerProcessError, match=match):
        TrainerProcessConfig(task_id=TASK, rpc_url="http://127.0.0.1:9", private_key=b"\x11" * 32, spec_path=None,
                             p2p_key=tmp_path / "unused", bootstrap=bootstrap, listen=listen)


def test_a_payload_gossip_never_delivered_is_sent_inline(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Peers that drop or forge chunks (the gossip probe) used to fail the trainer's round after
    submit_timeout_s of PayloadUnavailable; the same signed submission now goes over JSON-RPC."""
    import asyncio
    import base64

    tr, said = _bare_trainer(tmp_path, submit_timeout_s=0.2)
    sent: list[dict[str, object]] = []

    async def call(method: str, params: dict[str, object]) -> object:
        sent.append(params)
        if "payload" not in params:
            raise _error(1312, "PayloadUnavailable")
        return {"accepted_count": 1}

    tr.call = call  # type: ignore[method-assign]
    assert asyncio.run(tr.submit(0, [b"payload"], asyncio.Event())) is True
    assert all("payload_hash" in p and "payload" not in p for p in sent[:-1]) and len(sent) > 1
    last = sent[-1]
    assert base64.b64decode(str(last["payload"])) == b"payload" and "payload_hash" not in last
    assert last["signature"] == sent[0]["signature"]  # the same signed submission
    assert tr.inline_submissions == 1 and said == ["round 0 fragment 0: gossip did not deliver the payload; sent inline"]


def test_once_one_fragments_gossip_was_lost_the_next_is_republished_at_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A node killed while a round's payloads travelled lost all of them; each fragment then
    waited its own quarter budget before being published again, one after the other: ~15 s per
    fragment, minutes for a 12-fragment model (node kill campaign). The first fragment still
    waits (its chunks may only be slow); the later ones go again at their first "unavailable"."""
    import asyncio

    tr, _ = _bare_trainer(tmp_path, submit_timeout_s=2.0)
    published: list[int] = []
    calls: list[int] = []

    async def publish_payload(round_: int, fragment: int, payload: bytes, signature: bytes) -> None:
        published.append(fragment)

    async def call(method: str, params: dict[str, object]) -> object:
        fragment = int(params["fragment"])  # type: ignore[call-overload]
        calls.append(fragment)
        if published.count(fragment) < 2:  # the first publication of every fragment was lost
            raise _error(1312, "PayloadUnavailable")
        return {"accepted_count": 1}

    tr.publish_payload = publish_payload  # type: ignore[method-assign]
    tr.call = call  # type: ignore[method-assign]
    assert asyncio.run(tr.submit(0, [b"f0", b"f1", b"f2"], asyncio.Event())) is True
    assert published == [0, 1, 2, 0, 1, 2]
    assert calls.count(0) > 2 and calls.count(1) == calls.count(2) == 2  # asked, republished, accepted


def test_a_node_restart_is_waited_for_not_fatal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A trainer exited on the first call that could not reach its node, so a node restart ended
    every trainer calling it at that moment and the run failed at its round timeout (trainer
    restart probe). Once the node has answered, such calls are retried for node_retry_s; before
    that, an unreachable node is still a setup error."""
    import asyncio
    import time

    from tenzro_training.cli import EXIT_RPC_ERROR, CliError

    tr, said = _bare_trainer(tmp_path, node_retry_s=0.6)
    answers: list[object] = []
    down = _node_down()
    tr.client = _ScriptedNode(answers)
    answers[:] = [down]
    with pytest.raises(CliError):  # never reached: no retry
        asyncio.run(tr.call("tenzro_training_getRun", {}))
    answers[:] = [{"round": 0}, down, down, {"round": 1}]
    assert asyncio.run(tr.call("tenzro_training_getRun", {})) == {"round": 0}
    assert tr.reconnected_at is None
    before = time.monotonic()
    assert asyncio.run(tr.call("tenzro_training_getRun", {})) == {"round": 1}
    assert said[0].startswith("node unreachable (cannot reach node") and said[-1] == "node reachable again"
    assert tr.reconnected_at is not None and tr.reconnected_at > before  # wait_finalized asks for the model at once
    answers[:] = [_error(1305, "LateSubmission")]  # a node's answer is never retried
    with pytest.raises(CliError, match="LateSubmission"):
        asyncio.run(tr.call("tenzro_training_submitOuterGradient", {}))
    answers[:] = [down] * 10
    with pytest.raises(CliError, match="Connection refused"):  # gives up after node_retry_s
        asyncio.run(tr.call("tenzro_training_getRun", {}))
    assert len(answers) < 10
    # A call the node refused unrun for load (LimitExceeded, docs/rpc.md "Resource limits") is
    # sent again, even before a first answer; another refusal never is.
    fresh, said = _bare_trainer(tmp_path, node_retry_s=0.6)
    fresh.client = _ScriptedNode(answers)
    answers[:] = [_error(1800, "LimitExceeded"), {"round": 2}]
    assert asyncio.run(fresh.call("tenzro_training_getRun", {})) == {"round": 2}
    assert said[0].startswith("node busy (error 1800 LimitExceeded")
    # An answer that is no JSON-RPC answer (no error code) came from the node: never retried either.
    answers[:] = [CliError("the node's answer is not JSON-RPC", EXIT_RPC_ERROR), {"round": 3}]
    with pytest.raises(CliError, match="not JSON-RPC"):
        asyncio.run(fresh.call("tenzro_training_getRun", {}))
    assert answers == [{"round": 3}]


def test_an_unreachable_bootstrap_peer_stops_the_trainer_before_it_stakes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """With its --bootstrap node unreachable on gossip a trainer still enrolled (stake bonded, a
    slot taken) and gave up 60 s later (trainer restart probe); it now waits for the node's
    pubsub stream first."""
    import asyncio

    from tenzro_training.p2p.host import get_peer_ids
    from tenzro_training.trainer.process import TrainerProcessError

    tr, _ = _bare_trainer(tmp_path, model_timeout_s=0.3, poll_interval_s=0.05)
    peers: list[str] = ["someone-else"]

    class Host:
        def connected_peers(self) -> tuple[str, ...]:
            return tuple(peers)

    tr.host = Host()
    with pytest.raises(TrainerProcessError, match=r"no --bootstrap peer answered .* \(nothing staked\)"):
        asyncio.run(tr.wait_for_bootstrap(asyncio.Event()))
    peers.extend(get_peer_ids((_BOOTSTRAP,)))
    asyncio.run(tr.wait_for_bootstrap(asyncio.Event()))  # the node's stream is up: returns at once


# --- a hostile node cannot make the trainer equivocate (trainer probe, stop 20) --------------------


_A, _B, _C, _D, _E = b"\xaa" * 32, b"\xbb" * 32, b"\xcc" * 32, b"\xdd" * 32, b"\xee" * 32


def _hostile_view(tr, round_: int, model_hash: bytes, records: int | None = None) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {"task_id": TASK, "status": "Training", "round": round_, "trainer_count": 1,
            "model_hash": "0x" + model_hash.hex(), "round_records": [{}] * (round_ if records is None else records),
            "trainers": [{"address": tr.address, "shard": 0, "slashed": False}]}


def _signing_trainer(tmp_path, monkeypatch, **overrides):  # type: ignore[no-untyped-def]
    """A bare trainer of 2 fragments whose every SubmitOuterGradient signature is recorded, and
    whose gradient depends on the model it trains from (as a real one does)."""
    from types import SimpleNamespace

    import tenzro_training.trainer.data as data
    from tenzro_training.fragments import TensorSpec, compute_fragment_layouts

    monkeypatch.setattr(data, "shard_windows", lambda *args: None)  # the corpus is a fake
    tr, said = _bare_trainer(tmp_path, **overrides)
    tr.layouts = compute_fragment_layouts([TensorSpec("w", (8,), "float32")], 2)
    tr.model_cfg = SimpleNamespace(context_len=1, horizon=1)
    tr.inbox = GossipInbox(TASK, g, 64)
    tr.last_loss = 0.5
    signed: dict[tuple[int, int], set[bytes]] = {}
    sign = tr.sign

    def recording(msg):  # type: ignore[no-untyped-def]
        if isinstance(msg, auth.SubmitOuterGradient):
            signed.setdefault((msg.round, msg.fragment), set()).add(msg.payload_hash)
        return sign(msg)

    async def call(method: str, params: dict[str, object]) -> object:
        return {}

    tr.sign, tr.call = recording, call  # type: ignore[method-assign]
    tr.train = lambda r: [b"grad r%d f%d from %s" % (r, f, (tr.held_hash or b"").hex().encode()) for f in range(2)]  # type: ignore[method-assign]
    return tr, said, signed


def test_a_round_going_back_is_refused_not_signed_again(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Probe p1: round 3 submitted and finalized (model C), round 4 submitted, then getRun says
    round 3 again with model C: the trainer trained round 3 from C and signed a second payload
    for (3, f). Anyone able to rewrite a plain-http getRun answer could do it. Now the round is
    skipped with nothing signed, and the trainer goes on."""
    import asyncio

    tr, said, signed = _signing_trainer(tmp_path, monkeypatch, rounds=3)
    tr.held_hash = _A
    answers = iter(["finalized 3", "back to 3", "finalized 5"])

    async def wait_training(stop: object) -> dict[str, object]:
        return _hostile_view(tr, 3, _A)

    async def wait_finalized(round_: int, stop: object) -> dict[str, object]:
        answer = next(answers)
        if answer == "finalized 3":
            tr.held_hash = _C
            return _hostile_view(tr, 4, _C)
        return _hostile_view(tr, 3, _C) if answer == "back to 3" else _hostile_view(tr, 6, _C)

    async def get_run() -> dict[str, object]:
        return _hostile_view(tr, 5, _C)

    tr.wait_training, tr.wait_finalized, tr.get_run = wait_training, wait_finalized, get_run  # type: ignore[method-assign]
    assert asyncio.run(tr._rounds(asyncio.Event(), corpus=None)) == 0
    assert sorted(signed) == [(3, 0), (3, 1), (4, 0), (4, 1), (5, 0), (5, 1)]
    assert all(len(h) == 1 for h in signed.values())
    assert any(line.startswith("round 3 refused by the signing guard: round 3 fragment 0: this trainer may already")
               for line in said)
    assert said[-1] == "stopping after 3 rounds as asked"  # the skipped round does not count


def test_a_round_served_again_with_another_model_is_refused(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Probe p2a: after round 3 was submitted from model A, the node serves round 3 with model B
    (and weights hashing to B). The saved round-3 payloads were deleted as "another run's" and
    the round trained again: a second signed payload for (3, f)."""
    import asyncio

    tr, said, signed = _signing_trainer(tmp_path, monkeypatch, rounds=2)
    tr.held_hash = _A

    async def wait_training(stop: object) -> dict[str, object]:
        return _hostile_view(tr, 3, _A)

    async def wait_finalized(round_: int, stop: object) -> dict[str, object]:
        return _hostile_view(tr, 3, _B)

    async def request_model(view: dict[str, object], stop: object) -> dict[str, object]:
        tr.held_hash = _B  # the node serves weights that hash to what it claims
        return view

    async def get_run() -> dict[str, object]:
        return _hostile_view(tr, 4, _B)

    tr.wait_training, tr.wait_finalized, tr.request_model, tr.get_run = (  # type: ignore[method-assign]
        wait_training, wait_finalized, request_model, get_run)
    assert asyncio.run(tr._rounds(asyncio.Event(), corpus=None)) == 0
    assert sorted(signed) == [(3, 0), (3, 1), (4, 0), (4, 1)] and all(len(h) == 1 for h in signed.values())
    assert any(line.startswith("round 3 refused by the signing guard: ") for line in said)


def test_a_restarted_trainer_told_another_model_for_its_round_signs_nothing(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Probe p2b: the first process saved and submitted round 3 from A; the restarted one is
    told the round starts from B."""
    import asyncio

    from tenzro_training.trainer.signing_guard import SigningRefused

    first, _, signed = _signing_trainer(tmp_path, monkeypatch)
    first.held_hash = _A
    payloads, _ = asyncio.run(first.get_payloads(3, {}))
    assert asyncio.run(first.submit(3, payloads, asyncio.Event()))
    second, _, signed_after = _signing_trainer(tmp_path, monkeypatch)
    second.held_hash = _B
    with pytest.raises(SigningRefused, match="may already have signed a payload for it"):
        asyncio.run(second.get_payloads(3, {}))
    assert signed_after == {}
    second.held_hash = _A  # the true model: the saved bytes are replayed, nothing new signed
    replay, resubmitted = asyncio.run(second.get_payloads(3, {}))
    assert resubmitted and replay == payloads
    assert asyncio.run(second.submit(3, replay, asyncio.Event()))
    assert signed_after == signed


def test_one_view_claiming_a_later_round_does_not_prune_an_open_round(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Probe p3: getRun said round 4 (no record of round 3): prune(4) deleted round 3's saved
    bytes, and when round 3 came back it was trained again (bytes differ across thread counts
    and GPUs: a second payload)."""
    import asyncio

    tr, _, _ = _signing_trainer(tmp_path, monkeypatch, rounds=1)
    tr.held_hash = _A
    asyncio.run(tr.get_payloads(3, {}))  # trained and saved, about to be submitted
    views = iter([_hostile_view(tr, 4, _A, records=3)])

    async def wait_training(stop: object) -> dict[str, object]:
        return next(views)

    async def no_training(round_: int, view: object) -> object:
        raise AssertionError("not reached")

    tr.wait_training = wait_training  # type: ignore[method-assign]
    tr.get_payloads = no_training  # type: ignore[method-assign]
    with pytest.raises(AssertionError, match="not reached"):
        asyncio.run(tr._rounds(asyncio.Event(), corpus=None))
    assert len(list(tr.payloads.dir.glob("round-3-fragment-*.payload"))) == 2  # round 3 has no record yet: kept


def test_the_wait_for_training_is_bounded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Probe (stop 20): a node answering "Enrolling" forever held a bonded trainer forever."""
    import asyncio

    from tenzro_training.trainer.process import TrainerProcessError

    tr, _ = _bare_trainer(tmp_path, max_round_wait_s=0.2, poll_interval_s=0.05)
    polls: list[int] = []

    async def get_run() -> dict[str, object]:
        polls.append(1)
        return {"task_id": TASK, "round": 0, "status": "Enrolling"}

    tr.get_run = get_run  # type: ignore[method-assign]
    with pytest.raises(TrainerProcessError, match="did not start training within --max-round-wait 0.2s"):
        asyncio.run(tr.wait_training(asyncio.Event()))
    assert 2 <= len(polls) <= 10


def test_layouts_of_another_model_stop_the_trainer_before_it_enrolls(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Probe (stop 20): the node's layouts were checked only against the hashes the same node
    states; another model's passed, and the trainer failed in its inner loop with the stake
    bonded. The real adapter's shapes for the shipped spec against a tampered layout."""
    import json

    from tenzro_training.fragments import TensorSpec
    from tenzro_training.global_model import ModelLayout
    from tenzro_training.spec import TrainingTaskSpec
    from tenzro_training.trainer.model import get_adapter
    from tenzro_training.trainer.process import TrainerProcessError
    from tests.test_spec import example

    spec = TrainingTaskSpec.from_dict(json.loads(json.dumps(example())))
    tr, _ = _bare_trainer(tmp_path)
    tr.model_cfg = get_adapter(spec.architecture.family).config_from_spec(spec)
    shapes = get_adapter(spec.architecture.family).tensor_shapes(tr.model_cfg)
    specs = [TensorSpec(name, shape, "float32") for name, shape in shapes.items()]
    tr.model = ModelLayout.from_specs(specs, spec.architecture.fragment_count)
    tr.layouts = tr.model.layouts
    tr.check_layouts_fit_model(spec)  # the spec's own model: fine
    first = next(iter(shapes))
    for bad in ([TensorSpec("evil.weight", (4,), "float32"), *specs[1:]],
                [TensorSpec(first, (*shapes[first][:-1], shapes[first][-1] + 1), "float32"), *specs[1:]]):
        tr.model = ModelLayout.from_specs(bad, spec.architecture.fragment_count)
        tr.layouts = tr.model.layouts
        with pytest.raises(TrainerProcessError, match="do not describe the spec's model .nothing staked."):
            tr.check_layouts_fit_model(spec)
    tr.model = ModelLayout.from_specs(specs, spec.architecture.fragment_count + 1)
    tr.layouts = tr.model.layouts
    with pytest.raises(TrainerProcessError, match="fragment layouts; the spec has"):
        tr.check_layouts_fit_model(spec)


def test_a_view_whose_round_disagrees_with_its_records_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from tenzro_training.trainer.process import TrainerProcessError

    tr, _ = _bare_trainer(tmp_path)

    async def call(method: str, params: dict[str, object]) -> object:
        return {"task_id": TASK, "round": 3, "status": "Training", "round_records": [{}]}

    tr.call = call  # type: ignore[method-assign]
    with pytest.raises(TrainerProcessError, match="inconsistent: round 3 with 1 round records"):
        asyncio.run(tr.get_run())


def test_a_round_past_the_specs_last_is_skipped_unsigned(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Review (stop 20): the spec (hash-checked) bounds the rounds; a node's round past it is bogus."""
    import asyncio

    from tenzro_training.trainer.process import TrainerProcessError

    tr, said, signed = _signing_trainer(tmp_path, monkeypatch, rounds=1)
    tr.held_hash = _A
    tr.max_rounds = 3

    async def wait_training(stop: object) -> dict[str, object]:
        return _hostile_view(tr, 3, _A)

    async def get_run() -> dict[str, object]:
        return _hostile_view(tr, 3, _A) | {"status": "Cancelled"}

    tr.wait_training, tr.get_run = wait_training, get_run  # type: ignore[method-assign]
    with pytest.raises(TrainerProcessError, match="the run ended: Cancelled"):
        asyncio.run(tr._rounds(asyncio.Event(), corpus=None))
    assert signed == {} and any("the run's spec has 3 rounds" in line for line in said)


@pytest.mark.parametrize(("status", "round_", "floor"), [
    ("Training", 3, 4),  # round 3 may have been signed from another state directory: it is out too
    ("Enrolling", 0, 0),  # enrolled, nothing submitted yet
    ("Training", 2**40, 5),  # capped at the spec's rounds: a forged round cannot plant a larger floor
])
def test_a_record_begun_while_enrolled_starts_after_the_runs_round(tmp_path, status: str, round_: int,  # type: ignore[no-untyped-def]
                                                                   floor: int) -> None:
    """Review (stop 20): a fresh --state-dir mid-round took the run's round as its floor, and
    re-signed that round, which the node already held from the old directory: slashed by an
    honest node."""
    tr, _ = _bare_trainer(tmp_path)
    tr.max_rounds = 5
    tr.open_signing_guard({"status": status, "round": round_, "trainers": [{"address": tr.address}]})
    assert tr.guard is not None and tr.guard.floor == floor


def test_a_record_begun_before_enrolling_has_no_floor(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tr, _ = _bare_trainer(tmp_path)
    tr.max_rounds = 5
    tr.open_signing_guard({"status": "Training", "round": 3, "trainers": [{"address": "0x" + "00" * 20}]})
    assert tr.guard is not None and tr.guard.floor == 0


def test_refused_rounds_are_said_once_paced_and_bounded(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Review (stop 20): a node serving refused rounds back to back (here 3 and 4, below a floor
    of 5) made the trainer spin: 20,000 getRun calls and lines in 1.6 s, and --rounds never
    ended it. Now each refused round is said once, the loop pauses, and refusals alone end
    after --max-round-wait."""
    import asyncio

    from tenzro_training.trainer.process import TrainerProcessError
    from tenzro_training.trainer.signing_guard import SigningGuard

    tr, said, signed = _signing_trainer(tmp_path, monkeypatch, rounds=1, poll_interval_s=0.01, max_round_wait_s=0.3)
    tr.payloads.dir.mkdir(parents=True)
    tr.guard = SigningGuard(tr.payloads.dir, floor_if_new=5)
    tr.held_hash = _A
    flip = [3]
    polls: list[int] = []

    async def wait_training(stop: object) -> dict[str, object]:
        return _hostile_view(tr, 3, _A)

    async def get_run() -> dict[str, object]:
        polls.append(1)
        flip[0] = 7 - flip[0]
        return _hostile_view(tr, flip[0], _A)

    tr.wait_training, tr.get_run = wait_training, get_run  # type: ignore[method-assign]
    with pytest.raises(TrainerProcessError, match="no round could be signed for --max-round-wait 0.3s"):
        asyncio.run(tr._rounds(asyncio.Event(), corpus=None))
    refusals = [line for line in said if "refused by the signing guard" in line]
    assert signed == {} and len(refusals) == 2  # rounds 3 and 4, once each
    assert len(polls) <= 40  # paced by poll_interval_s (0.01 s) over 0.3 s, not thousands


def test_a_round_with_one_refused_fragment_is_not_half_signed(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Review (stop 20): submit recorded and signed fragment by fragment, so a refusal at
    fragment 1 came after fragment 0 was signed and published."""
    import asyncio

    from tenzro_training.trainer.signing_guard import SigningRefused

    tr, _, signed = _signing_trainer(tmp_path, monkeypatch)
    guard = tr.signing_guard()
    guard.record(3, 1, b"\x01" * 32)
    with pytest.raises(SigningRefused, match="round 3 fragment 1"):
        asyncio.run(tr.submit(3, [b"fragment 0", b"fragment 1"], asyncio.Event()))
    assert signed == {} and not guard.signed(3, 0)


def test_an_enrollment_found_later_raises_the_floor_of_a_new_record(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Review (stop 20): the floor came from the first answer only; one that hid the account's
    enrollment (stale or forged) left a new record with no floor, and the round in progress,
    signed from an old state directory, was signed again."""
    import asyncio

    tr, _ = _bare_trainer(tmp_path)
    tr.max_rounds = 10
    tr.open_signing_guard({"status": "Training", "round": 3, "trainers": []})  # the enrollment hidden
    assert tr.guard is not None and tr.guard.floor == 0
    view = _hostile_view(tr, 3, _A)
    assert asyncio.run(tr.enroll(view, asyncio.Event())) == view  # already enrolled: a restart
    assert tr.guard.floor == 4
    from tenzro_training.trainer.signing_guard import SigningGuard

    assert SigningGuard(tr.payloads.dir).floor == 4  # written down
    tr.guard.record(4, 0, b"\x02" * 32)
    tr.guard.raise_floor(9)  # after a signature of this process, the floor stays
    assert tr.guard.floor == 4


def test_every_later_view_must_name_the_checked_spec(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from tenzro_training.trainer.process import TrainerProcessError

    tr, _ = _bare_trainer(tmp_path)
    tr.spec_hash = "0x" + "ab" * 32
    answer = {"task_id": TASK, "round": 0, "status": "Enrolling", "spec_hash": "0x" + "AB" * 32}

    async def call(method: str, params: dict[str, object]) -> object:
        return answer

    tr.call = call  # type: ignore[method-assign]
    asyncio.run(tr.get_run())  # the same hash (any case)
    answer["spec_hash"] = "0x" + "cd" * 32
    with pytest.raises(TrainerProcessError, match="names spec '0xcdcd"):
        asyncio.run(tr.get_run())


# --- what the trainer refuses before it reaches a node, and the node answers it trusts (mutation campaign) ---


@pytest.mark.parametrize(("overrides", "said"), [
    ({"private_key": b"\x11" * 31}, "private_key must be 32 bytes"),
    ({"rounds": 0}, "rounds must be >= 1, got 0"),
    ({"rounds": True}, "rounds must be >= 1, got True"),
    ({"batch_size": True}, "batch_size must be an integer >= 1, got True"),
    ({"batch_size": 2.0}, "batch_size must be an integer >= 1, got 2.0"),
    ({"bootstrap": ()}, "at least one --bootstrap multiaddr (the node's p2p address) is needed"),
    ({"submit_timeout_s": 0.0}, "submit_timeout_s must be > 0"),
    ({"model_timeout_s": float("nan")}, "model_timeout_s must be > 0"),
    ({"max_round_wait_s": -1.0}, "max_round_wait_s must be > 0"),
    ({"poll_interval_s": 0}, "poll_interval_s must be > 0"),
    ({"node_retry_s": 0.0}, "node_retry_s must be > 0"),
])
def test_invalid_trainer_settings_are_refused_in_one_line(tmp_path, overrides, said) -> None:  # type: ignore[no-untyped-def]
    """A setting that would make the trainer sign with a wrong key, never stop, or spin without
    pause is refused on construction, before a node is called or an identity made; the CLI prints
    exactly this line."""
    from tenzro_training.trainer.process import TrainerProcessError

    with pytest.raises(TrainerProcessError) as info:
        _bare_trainer(tmp_path, **overrides)
    assert str(info.value) == said


def test_the_smallest_trainer_settings_are_accepted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One round and a batch of one are valid settings (the bounds are inclusive)."""
    tr, _ = _bare_trainer(tmp_path, rounds=1, batch_size=1, submit_timeout_s=1e-3)
    assert (tr.cfg.rounds, tr.cfg.batch_size) == (1, 1)


def test_fragment_weights_split_in_fragment_order_and_fill_the_layouts_exactly() -> None:
    """The node's weights stream is every fragment's fp32 values back to back; a stream of any
    other length is not this model (a forged or truncated answer) and is refused, never padded."""
    import numpy as np

    from tenzro_training.fragments import TensorSpec, compute_fragment_layouts
    from tenzro_training.trainer.process import TrainerProcessError, decode_fragment_weights

    layouts = compute_fragment_layouts([TensorSpec("w", (6,), "float32")], 2)
    data = np.arange(6, dtype="<f4").tobytes()
    parts = decode_fragment_weights(data, layouts)
    assert [p.tolist() for p in parts] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    for bad in (data[:-4], data + b"\x00" * 4):
        with pytest.raises(TrainerProcessError, match=f"^model weights: {len(bad)} bytes, expected 24$"):
            decode_fragment_weights(bad, layouts)


def _answering(tr, answer: dict[str, object]) -> None:  # type: ignore[no-untyped-def]
    """Make ``tr``'s node answer every call with ``answer`` (a dict the test may change)."""

    async def call(method: str, params: dict[str, object]) -> object:
        return answer

    tr.call = call  # type: ignore[method-assign]


@pytest.mark.parametrize(("answer", "said"), [
    ({"task_id": "another-run", "round": 0}, f"the node answered getRun of {TASK} with another run's view "
                                             "('another-run')"),
    ({"round": 0}, f"the node answered getRun of {TASK} with another run's view (None)"),
    ({"task_id": TASK, "round": 2.9}, "the node's getRun answer is malformed: round 2.9"),
    ({"task_id": TASK, "round": True}, "the node's getRun answer is malformed: round True"),
    ({"task_id": TASK, "round": "3"}, "the node's getRun answer is malformed: round '3'"),
    ({"task_id": TASK, "round": -1}, "the node's getRun answer is malformed: round -1"),
    ({"task_id": TASK, "round": 2**64}, f"the node's getRun answer is malformed: round {2**64}"),
    ({"task_id": TASK, "round": 0, "status": "Training"}, "inconsistent: round 0 with no round records"),
])
def test_invalid_getrun_answers_are_refused(tmp_path, answer: dict[str, object], said: str) -> None:  # type: ignore[no-untyped-def]
    """Every getRun answer decides what the trainer trains, prunes and signs: another run's view or
    a round that is not a JSON integer in range (int() took 2.9 as round 2) stops it."""
    import asyncio

    from tenzro_training.trainer.process import TrainerProcessError

    tr, _ = _bare_trainer(tmp_path)
    _answering(tr, answer)
    with pytest.raises(TrainerProcessError) as info:
        asyncio.run(tr.get_run())
    assert said in str(info.value)


def test_the_largest_round_and_a_run_not_training_without_records_are_accepted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    tr, _ = _bare_trainer(tmp_path)
    answer: dict[str, object] = {"task_id": TASK, "round": 2**64 - 1, "status": "Enrolling"}
    _answering(tr, answer)
    assert asyncio.run(tr.get_run()) == answer
    answer.update(round=2, status="Training", round_records=[{}, {}])
    assert asyncio.run(tr.get_run()) == answer


def _gossip_view_answer(tr, **extra: object) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {"task_id": TASK, "round": 1, "status": "Training", "round_records": [{}], "fragment_count": 2,
            "trainers": [{"address": tr.address, "slashed": False}],
            "election": {"ranking": [{"address": "0x" + "22" * 20}], "seed": "0x" + "33" * 32}, **extra}


def test_each_getrun_answer_becomes_the_view_the_topic_validators_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The gossip validators (p2p thread) judge messages by the latest run view, the trainer's
    chain id and the payload and model limits of its layouts; a getRun answer they cannot read
    stops the trainer instead of leaving them on a stale view."""
    import asyncio

    from tenzro_training.trainer.process import TrainerProcessError

    tr, _ = _bare_trainer(tmp_path)
    answer = _gossip_view_answer(tr)
    _answering(tr, answer)
    asyncio.run(tr.get_run())
    assert tr.gossip_view is None  # before the layouts are known there are no limits to judge by
    tr.gossip_limits, tr.payload_limits = (100, 800), (100, 90)
    asyncio.run(tr.get_run())
    view = tr.gossip_view
    assert view is not None and (view.task_id, view.round, view.fragment_count, view.chain_id) == (TASK, 1, 2, CHAIN_ID)
    assert (view.max_payload_bytes, view.max_model_bytes, view.payload_bytes) == (100, 800, (100, 90))
    answer["round"] = 2
    answer["round_records"] = [{}, {}]
    asyncio.run(tr.get_run())
    assert tr.gossip_view is not view and tr.gossip_view.round == 2
    del answer["election"]
    with pytest.raises(TrainerProcessError, match="the node's getRun answer is malformed: not a getRun view"):
        asyncio.run(tr.get_run())


def _enrollment_node(tr, views: list[dict[str, object]]) -> list[tuple[str, dict[str, object]]]:  # type: ignore[no-untyped-def]
    """``tr``'s node: getRun answers ``views`` in turn (the last one for good); every other call
    is recorded and answered with shard 2."""
    calls: list[tuple[str, dict[str, object]]] = []

    async def get_run() -> dict[str, object]:
        return views.pop(0) if len(views) > 1 else views[0]

    async def call(method: str, params: dict[str, object]) -> object:
        calls.append((method, params))
        return {"shard": 2}

    tr.get_run, tr.call = get_run, call  # type: ignore[method-assign]
    return calls


def test_enrollment_waits_for_it_to_open_and_stakes_with_a_signature_of_the_trainer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The trainer enrolls (bonds its stake) once the run is Enrolling, with an EnrollTrainer the
    node can check came from this trainer's key, for the stake and DID configured; it then goes
    on from a fresh view, which shows the enrollment."""
    import asyncio

    from tenzro_training.auth import EnrollTrainer, recover_signer

    tr, said = _bare_trainer(tmp_path, poll_interval_s=0.01, stake=5 * 10**17)
    enrolled = {"status": "Enrolling", "trainers": [{"address": tr.address}]}
    calls = _enrollment_node(tr, [{"status": "Electing", "trainers": []}, {"status": "Enrolling", "trainers": []},
                                  enrolled])
    assert asyncio.run(tr.enroll({"status": "Posted", "trainers": []}, asyncio.Event())) == enrolled
    did = f"did:tenzro:trainer:{tr.address.lower()}"
    [(method, params)] = calls
    assert method == "tenzro_training_enrollTrainer"
    assert {k: v for k, v in params.items() if k != "signature"} == {
        "task_id": TASK, "did": did, "address": tr.address, "stake": str(5 * 10**17)}
    msg = EnrollTrainer(task_id=TASK, did=did, trainer=bytes.fromhex(tr.address[2:]), stake=5 * 10**17)
    assert recover_signer(msg, bytes.fromhex(str(params["signature"])[2:]), CHAIN_ID) == tr.address
    assert said == [f"enrolled {tr.address} in {TASK} shard 2"]

    named, _ = _bare_trainer(tmp_path / "named", did="did:tenzro:trainer:lab-7")
    calls = _enrollment_node(named, [{"status": "Enrolling", "trainers": []}])
    asyncio.run(named.enroll({"status": "Enrolling", "trainers": []}, asyncio.Event()))
    assert calls[0][1]["did"] == "did:tenzro:trainer:lab-7"


def test_an_enrolled_trainer_never_enrolls_again_and_a_closed_run_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A restarted trainer finds its address (in any case) among the run's trainers and stakes
    nothing more; a run past enrollment it is not part of is an error, with no call made."""
    import asyncio

    from tenzro_training.trainer.process import TrainerProcessError

    tr, _ = _bare_trainer(tmp_path)
    mine = {"status": "Training", "round": 0, "trainers": [{"address": tr.address.lower()}]}
    calls = _enrollment_node(tr, [mine])
    assert asyncio.run(tr.enroll(mine, asyncio.Event())) is mine
    for status in ("Training", "Sealed"):
        with pytest.raises(TrainerProcessError, match=f"^cannot enroll: the run is {status}$"):
            asyncio.run(tr.enroll({"status": status, "round": 0, "trainers": [{"address": "0x" + "00" * 20}]},
                                  asyncio.Event()))
    stop = asyncio.Event()
    stop.set()  # told to stop while enrollment is not open: it does not wait
    with pytest.raises(TrainerProcessError, match="^cannot enroll: the run is Posted$"):
        asyncio.run(tr.enroll({"status": "Posted", "trainers": []}, stop))
    assert calls == []


def test_a_sealed_run_ends_the_trainer_only_on_its_final_model(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """At the end the trainer holds the model the receipt commits: fetched if it missed the last
    RoundFinalized, an error if it cannot get it (a node that serves another model)."""
    import asyncio

    from tenzro_training.trainer.process import TrainerProcessError

    tr, said = _bare_trainer(tmp_path)
    asked: list[int] = []
    serves: list[bytes] = []

    async def request_model(view: dict[str, object], stop: object) -> dict[str, object]:
        asked.append(int(view["round"]))  # type: ignore[call-overload]
        tr.held_hash = serves[0]
        return view

    tr.request_model = request_model  # type: ignore[method-assign]
    sealed = {"status": "Sealed", "round": 5, "final_record": {"final_model_hash": "0x" + _A.hex()}}
    tr.held_hash = _A
    assert asyncio.run(tr.finish(sealed, asyncio.Event())) == 0 and asked == []
    assert said == [f"sealed final model 0x{_A.hex()} verified"]
    tr.held_hash, serves[:] = _B, [_A]
    assert asyncio.run(tr.finish(sealed, asyncio.Event())) == 0 and asked == [5]
    tr.held_hash, serves[:] = _B, [_C]
    with pytest.raises(TrainerProcessError, match=f"^final model 0x{_C.hex()} differs from 0x{_A.hex()}$"):
        asyncio.run(tr.finish(sealed, asyncio.Event()))
    for record in (None, {}):
        with pytest.raises(TrainerProcessError, match="^the run is Sealed without a final record$"):
            asyncio.run(tr.finish({"status": "Sealed", "round": 5, "final_record": record}, asyncio.Event()))


def test_a_sealed_run_prunes_the_saved_state_and_checks_the_final_model(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Once the run is Sealed nothing can be submitted again: the saved payloads and error
    feedback go, and the trainer ends on the receipt's model."""
    import asyncio

    tr, said, signed = _signing_trainer(tmp_path, monkeypatch)
    tr.held_hash = _A
    tr.payloads.save(2, 0, _A, b"saved")
    tr.feedback_store.save(2, b"state")

    async def wait_training(stop: object) -> dict[str, object]:
        return _hostile_view(tr, 3, _A) | {"status": "Sealed", "final_record": {"final_model_hash": "0x" + _A.hex()}}

    tr.wait_training = wait_training  # type: ignore[method-assign]
    assert asyncio.run(tr._rounds(asyncio.Event(), corpus=None)) == 0
    assert signed == {} and said == [f"sealed final model 0x{_A.hex()} verified"]
    assert tr.payloads.load(2, 1, _A) == [None] and tr.feedback_store.rounds() == []


@pytest.mark.parametrize(("change", "said"), [
    ({"status": "Failed", "end_reason": "quorum"}, "^the run ended: Failed \\(quorum\\)$"),
    ({"trainers": "slashed"}, "^this trainer was slashed$"),
    ({"trainers": "absent"}, f"^this trainer is not enrolled in {TASK} \\(Training\\)$"),
])
def test_a_run_the_trainer_can_no_longer_serve_stops_it(tmp_path, monkeypatch, change, said) -> None:  # type: ignore[no-untyped-def]
    """A run that ended unsealed, a slashed trainer or one not enrolled stop the trainer with
    their reason and nothing signed; an ended run's saved payloads are of no use any more."""
    import asyncio

    from tenzro_training.trainer.process import TrainerProcessError

    tr, _, signed = _signing_trainer(tmp_path, monkeypatch)
    tr.held_hash = _A
    tr.payloads.save(2, 0, _A, b"saved")
    view = _hostile_view(tr, 3, _A) | change
    if change.get("trainers") == "slashed":
        view["trainers"] = [{"address": "0x" + "00" * 20, "shard": 1, "slashed": False},
                            {"address": tr.address.lower(), "shard": 0, "slashed": True}]
    elif change.get("trainers") == "absent":
        view["trainers"] = [{"address": "0x" + "00" * 20, "shard": 0, "slashed": False}]

    async def wait_training(stop: object) -> dict[str, object]:
        return view

    tr.wait_training = wait_training  # type: ignore[method-assign]
    with pytest.raises(TrainerProcessError, match=said):
        asyncio.run(tr._rounds(asyncio.Event(), corpus=None))
    assert signed == {}
    assert tr.payloads.load(2, 1, _A) == ([None] if view["status"] == "Failed" else [b"saved"])


def test_a_shard_that_cannot_be_built_stops_the_trainer(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    import tenzro_training.trainer.data as data
    from tenzro_training.trainer import TrainerError
    from tenzro_training.trainer.process import TrainerProcessError

    tr, _, signed = _signing_trainer(tmp_path, monkeypatch)
    shards: list[tuple[object, ...]] = []

    def shard_windows(*args: object) -> None:
        shards.append(args[1:])
        raise TrainerError("too few windows")

    monkeypatch.setattr(data, "shard_windows", shard_windows)

    async def wait_training(stop: object) -> dict[str, object]:
        return _hostile_view(tr, 0, _A) | {"trainer_count": 3, "trainers": [{"address": tr.address, "shard": 2,
                                                                             "slashed": False}]}

    tr.wait_training = wait_training  # type: ignore[method-assign]
    with pytest.raises(TrainerProcessError, match="^cannot build shard 2: too few windows$"):
        asyncio.run(tr._rounds(asyncio.Event(), corpus=None))
    assert shards == [(2, 3, 1, 1)] and signed == {}


def test_a_trainer_stopped_in_its_inner_loop_ends_with_nothing_saved_or_signed(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from tenzro_training.trainer.inner import InnerLoopStopped

    tr, _, signed = _signing_trainer(tmp_path, monkeypatch)
    tr.held_hash = _A

    async def wait_training(stop: object) -> dict[str, object]:
        return _hostile_view(tr, 3, _A)

    def train(round_: int) -> list[bytes]:
        raise InnerLoopStopped("stopped")

    tr.wait_training, tr.train = wait_training, train  # type: ignore[method-assign]
    assert asyncio.run(tr._rounds(asyncio.Event(), corpus=None)) == 0
    assert signed == {} and tr.payloads.load(3, 2, _A) == [None, None]


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_trainer_cleanly(tmp_path, monkeypatch, signum: str) -> None:  # type: ignore[no-untyped-def]
    """SIGINT/SIGTERM end ``tenzro trainer run`` with status 0 (docs/trainer-process.md): the
    inner loop's thread is told to stop and the run task cancelled; a trainer that ends by
    itself returns its own status."""
    import asyncio
    import os
    import signal

    import tenzro_training.trainer.process as process

    trainers: list[process._Trainer] = []
    cancelled: list[bool] = []

    class Trainer(process._Trainer):
        async def run(self, stop: asyncio.Event) -> int:
            trainers.append(self)
            if signum == "none":
                return 7
            os.kill(os.getpid(), getattr(signal, signum))
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
            return 5

    monkeypatch.setattr(process, "_Trainer", Trainer)
    tr, _ = _bare_trainer(tmp_path)
    said: list[str] = []
    assert asyncio.run(process.run_trainer(tr.cfg, announce=said.append)) == 0
    assert said == ["stopping (signal)"] and cancelled == [True] and trainers[0].stopping.is_set()
    signum = "none"
    assert asyncio.run(process.run_trainer(tr.cfg, announce=said.append)) == 7
    assert len(said) == 1 and not trainers[1].stopping.is_set()


def test_a_trainer_config_defaults_to_the_documented_settings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """docs/trainer-process.md states these defaults (60 s for a payload to reach the node and for
    a model answer, 300 s of node retries, a 6 h safety net, a 10^18 stake, batches of 16, fresh
    AdamW moments each round): a trainer started without tuning runs with exactly them."""
    import dataclasses

    from tenzro_training.trainer.process import TrainerProcessConfig

    cfg = TrainerProcessConfig(task_id=TASK, rpc_url="http://127.0.0.1:9", private_key=b"\x11" * 32, spec_path=None,
                               p2p_key=tmp_path / "p2p.key", bootstrap=(_BOOTSTRAP,))
    assert (cfg.chain_id, cfg.listen, cfg.rounds, cfg.did, cfg.stake, cfg.batch_size, cfg.device) == (
        auth.DEFAULT_CHAIN_ID, ("/ip4/127.0.0.1/tcp/0",), None, None, 10**18, 16, "auto")
    assert cfg.carry_optimizer_state is False and cfg.state_dir is None
    assert (cfg.submit_timeout_s, cfg.model_timeout_s, cfg.max_round_wait_s, cfg.poll_interval_s,
            cfg.node_retry_s) == (60.0, 60.0, 6 * 3600.0, 0.2, 300.0)
    with pytest.raises(dataclasses.FrozenInstanceError):  # checked once, on construction: never changed after
        cfg.rounds = 0  # type: ignore[misc]


def test_a_model_answer_whose_weights_do_not_hash_to_the_commitment_is_dropped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The weights themselves are checked against the model the run commits, whatever stream
    they came in (here one the inbox did not check): a forged answer under the right header is
    dropped and counted, and the genuine one is still taken."""
    tr, committed, real, nbytes, _ = _trainer_with_model(tmp_path)
    tr.inbox = GossipInbox(TASK, g, nbytes)  # keeps what it reassembles, unverified
    _serve_views(tr, _view(3, committed))
    forged = g.compute_model_chunks(task_id=TASK, round=3, model_hash=committed, weights=b"\0" * nbytes)
    genuine = g.compute_model_chunks(task_id=TASK, round=3, model_hash=committed, weights=real)
    _request_model_as_chunks_arrive(tr, _view(3, committed), forged + genuine)
    assert tr.held_hash == committed and tr.inbox.counters["forged"] == 1 and tr.inbox.models == {}


@pytest.mark.parametrize("forgery", ["signer", "weights"])
def test_a_round_finalized_that_does_not_match_the_record_leads_to_a_model_request(tmp_path, forgery: str) -> None:  # type: ignore[no-untyped-def]
    """A notice signed by a ranked candidate that is not the round's syncer, or carrying weights
    that do not hash to the committed model, is dropped, never applied; the committed model is
    then fetched with a ModelRequest (the genuine notice may have been passed over meanwhile)."""
    import asyncio

    tr, committed, real, nbytes, _ = _trainer_with_model(tmp_path)
    tr.inbox = GossipInbox(TASK, g, nbytes)  # keeps what it reassembles, unverified
    if forgery == "signer":
        held = notice(0, key=SYNCER_KEYS[1], syncer=SYNCERS[1], model=committed, weights=real)
    else:
        held = notice(0, model=committed, weights=b"\0" * nbytes)
    view = {"round": 1, "status": "Training", "model_hash": "0x" + committed.hex(),
            "round_records": [{"model_hash": "0x" + committed.hex(), "syncer": "0x" + SYNCERS[0].hex()}]}
    _serve_views(tr, view)
    asked: list[dict[str, object]] = []

    async def request_model(view: dict[str, object], stop: object) -> dict[str, object]:
        asked.append(view)
        return view

    tr.request_model = request_model  # type: ignore[method-assign]
    tr.inbox.expect_finalized(0)
    feed(tr.inbox, held)
    assert asyncio.run(tr.wait_finalized(0, asyncio.Event())) is view
    assert asked == [view] and tr.held_hash is None
    assert tr.inbox.finalized == {} and tr.inbox.await_round is None


def test_the_trainer_hears_its_node_before_it_enrolls_and_listens_on_both_topics(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The order of a start: signing record, host, a --bootstrap peer on gossip, THEN enrollment
    (the stake), then both topics validated and subscribed, and a peer on each before the first
    round; the gossip readers end with the rounds and the host is stopped. It says where it
    listens and where its inner loop runs (the GPU by name)."""
    import asyncio

    import torch

    from tenzro_training.p2p.host import get_peer_ids
    from tenzro_training.payload import compute_max_payload_bytes

    events: list[str] = []
    queues: list[asyncio.Queue[object]] = []

    class Host:
        addrs = ["/ip4/127.0.0.1/tcp/4242/p2p/me"]

        def __init__(self, config: object) -> None:
            events.append("host")

        async def start(self) -> None:
            events.append(f"start guard={tr.guard is not None}")

        def connected_peers(self) -> frozenset[str]:
            events.append("peers")
            return get_peer_ids((_BOOTSTRAP,))

        def set_validator(self, topic: str, validate: object) -> None:
            events.append(f"validate {topic}")

        async def subscribe(self, topic: str) -> asyncio.Queue[object]:
            events.append(f"subscribe {topic}")
            queues.append(asyncio.Queue())
            return queues[-1]

        async def wait_for_peers(self, topic: str, n: int, timeout: float) -> None:
            events.append(f"wait {topic} {n} {timeout:g}")

        async def stop(self) -> None:
            events.append("stop")

    tr = _trainer_with_fake_setup(tmp_path, monkeypatch, Host)
    view = {"spec_hash": "0x" + "AB" * 32, "round": 0, "status": "Enrolling", "trainers": []}
    said: list[str] = []
    tr.say = said.append

    async def get_run() -> dict[str, object]:
        return view

    async def enroll(v: object, stop: object) -> dict[str, object]:
        events.append("enroll")
        return view

    async def rounds(stop: object, corpus: object) -> int:
        events.append("rounds")
        return 4

    tr.get_run, tr.enroll, tr._rounds = get_run, enroll, rounds  # type: ignore[method-assign]
    tr.g, tr.device = g, torch.device("cuda", 1)  # what ``run`` sets before ``_run``
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Fake GPU 9000")

    async def main() -> tuple[int, list[asyncio.Task[object]]]:
        got = await tr._run(view, asyncio.Event())
        await asyncio.sleep(0)
        return got, [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]

    got, left = asyncio.run(main())
    assert got == 4 and left == []
    training, syncer = g.TOPIC_TRAINING, g.TOPIC_SYNCER
    assert events == ["host", "start guard=True", "peers", "enroll", f"validate {training}", f"subscribe {training}",
                      f"validate {syncer}", f"subscribe {syncer}", f"wait {training} 1 60", f"wait {syncer} 1 60",
                      "rounds", "stop"]
    assert said == [f"tenzro trainer {tr.address} p2p /ip4/127.0.0.1/tcp/4242/p2p/me",
                    "inner loop on cuda:1 (Fake GPU 9000), AdamW state fresh each round"]
    assert tr.spec_hash == "0x" + "ab" * 32 and tr.max_rounds == 2
    assert tr.gossip_limits == (compute_max_payload_bytes(tr.layouts[0]), 32)
    assert tr.payload_limits == (compute_max_payload_bytes(tr.layouts[0]),)


def test_refusals_other_than_a_closed_round_are_not_retried(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Only PayloadUnavailable is retried: any other refusal (here a bad signature) reaches the
    caller at once, as does PayloadUnavailable once the trainer is told to stop; and an inline
    payload the node still says it lacks is a node fault, said with the payload's hash."""
    import asyncio

    from tenzro_training.cli import CliError
    from tenzro_training.payload import compute_payload_hash
    from tenzro_training.trainer.process import TrainerProcessError

    tr, _ = _bare_trainer(tmp_path, submit_timeout_s=0.05)
    refusal = [_error(1202, "SignatureInvalid")]
    calls: list[dict[str, object]] = []

    async def call(method: str, params: dict[str, object]) -> object:
        calls.append(params)
        raise refusal[0]

    tr.call = call  # type: ignore[method-assign]
    with pytest.raises(CliError, match="SignatureInvalid"):
        asyncio.run(tr.submit(0, [b"payload"], asyncio.Event()))
    assert len(calls) == 1
    refusal[0] = _error(1312, "PayloadUnavailable")
    stop = asyncio.Event()
    stop.set()
    with pytest.raises(CliError, match="PayloadUnavailable"):
        asyncio.run(tr.submit(1, [b"payload"], stop))
    assert len(calls) == 2
    with pytest.raises(TrainerProcessError, match=f"^round 2 fragment 0: the node never held payload "
                                                  f"0x{compute_payload_hash(b'payload').hex()}$"):
        asyncio.run(tr.submit(2, [b"payload"], asyncio.Event()))
    assert "payload" in calls[-1] and tr.inline_submissions == 1


def test_no_payload_is_made_without_a_verified_model_and_a_stop_before_the_node_answers_stakes_nothing(
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from tenzro_training.trainer.process import TrainerProcessError

    tr, _ = _bare_trainer(tmp_path)
    with pytest.raises(TrainerProcessError, match="^internal: no verified global model to train from$"):
        asyncio.run(tr.get_payloads(0, {}))

    class Host:
        def connected_peers(self) -> tuple[str, ...]:
            return ()

    tr.host = Host()
    stop = asyncio.Event()
    stop.set()
    with pytest.raises(TrainerProcessError, match=r"^stopped before a --bootstrap peer answered \(nothing staked\)$"):
        asyncio.run(tr.wait_for_bootstrap(stop))


def test_an_aggregated_rounds_values_never_come_back_into_the_residual(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Once a round's payloads were accepted their top-k values are in the model. A node that then
    serves that round again and refuses the resubmission (LateSubmission) must not put them back
    into the residual: they would be sent, and aggregated, twice."""
    import asyncio
    import dataclasses
    from types import SimpleNamespace

    import tenzro_training.trainer.data as data

    monkeypatch.setattr(data, "shard_windows", lambda *args: None)  # the corpus is a fake
    tr, said = _topk_trainer(tmp_path, monkeypatch)
    tr.cfg = dataclasses.replace(tr.cfg, rounds=2)
    tr.model_cfg, tr.inbox, tr.held_hash = SimpleNamespace(context_len=1, horizon=1), GossipInbox(TASK, g, 212), BASE
    submitted: list[int] = []
    residuals: list[list[object]] = []

    async def wait_training(stop: object) -> dict[str, object]:
        return _hostile_view(tr, 3, BASE)

    async def call(method: str, params: dict[str, object]) -> object:
        submitted.append(int(params["fragment"]))  # type: ignore[call-overload]
        if len(submitted) > 2:
            raise _error(1305, "LateSubmission")
        return {}

    async def wait_finalized(round_: int, stop: object) -> dict[str, object]:
        assert tr.feedback is not None
        residuals.append([r.clone() for r in tr.feedback._residual])
        return _hostile_view(tr, 3, BASE)  # round 3 again, from the same model

    async def get_run() -> dict[str, object]:
        return _hostile_view(tr, 4, BASE)

    tr.wait_training, tr.call, tr.wait_finalized, tr.get_run = wait_training, call, wait_finalized, get_run  # type: ignore[method-assign]
    assert asyncio.run(tr._rounds(asyncio.Event(), corpus=None)) == 0
    assert submitted == [0, 1, 0] and any(line.startswith("round 3 skipped: error 1305") for line in said)
    assert tr.feedback is not None and all(torch_equal(a, b) for a, b in zip(tr.feedback._residual, residuals[0]))


def test_the_first_view_past_enrollment_starts_the_rounds_and_a_stop_ends_every_wait(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The rounds start from the first view that is past enrollment (whatever it is: the main loop
    judges it); a stop ends the waits (for training, for a round's end) and the main loop as a
    cancellation or status 0, never as a view the trainer would act on."""
    import asyncio
    from types import SimpleNamespace

    import tenzro_training.trainer.data as data

    tr, _ = _bare_trainer(tmp_path, poll_interval_s=0.01)
    tr.inbox = GossipInbox(TASK, g, 1024)
    served = [{"task_id": TASK, "round": 0, "status": "Enrolling"}, {"task_id": TASK, "round": 0, "status": "Failed"}]

    async def get_run() -> dict[str, object]:
        return served.pop(0) if len(served) > 1 else served[0]

    tr.get_run = get_run  # type: ignore[method-assign]
    assert asyncio.run(tr.wait_training(asyncio.Event()))["status"] == "Failed"
    stop = asyncio.Event()
    stop.set()
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(tr.wait_training(stop))
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(tr.wait_finalized(0, stop))

    async def wait_training(stop: object) -> dict[str, object]:
        return _round_view(tr, 0)

    tr.wait_training = wait_training  # type: ignore[method-assign]
    tr.model_cfg = SimpleNamespace(context_len=1, horizon=1)
    monkeypatch.setattr(data, "shard_windows", lambda *args: None)  # the corpus is a fake
    assert asyncio.run(tr._rounds(stop, corpus=None)) == 0


def test_weights_are_taken_only_if_they_fit_the_layouts_and_hash_to_the_commitment(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The check the gossip inbox runs on every reassembled weights stream: a stream of the wrong
    size or of another model is dropped (None), never raised, so a forger cannot stop the trainer."""
    tr, committed, real, _, _ = _trainer_with_model(tmp_path)
    other, other_bytes = _another_model(tr)
    weights = tr.verify_weights(real, committed)
    assert weights is not None and [w.tolist() for w in weights] == [[float(i) for i in range(32)]] * 2
    assert tr.verify_weights(real[:-4], committed) is None
    assert tr.verify_weights(other_bytes, committed) is None
    assert tr.verify_weights(other_bytes, other) is not None


def test_a_model_request_stops_when_told_to_or_when_the_run_ends_while_an_answer_waits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    tr, committed, real, _, published = _trainer_with_model(tmp_path)
    stop = asyncio.Event()
    stop.set()
    view = _view(3, committed)
    assert asyncio.run(tr.request_model(view, stop)) is view and published == [] and tr.held_hash is None

    _serve_views(tr, _view(3, committed, status="Cancelled"))  # the run ended as the answer arrived
    tr.MODEL_ASK_INTERVAL_S = 60.0
    answer = g.compute_model_chunks(task_id=TASK, round=3, model_hash=committed, weights=real)
    assert _request_model_as_chunks_arrive(tr, _view(3, committed), answer)["status"] == "Cancelled" and tr.held_hash is None and tr.inbox.await_model is None


def test_a_spec_file_is_read_up_to_the_documented_64_mib(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """docs/cli.md: `tenzro trainer run --spec` reads at most 64 MiB; a larger file is refused
    with its size, before it is parsed."""
    import json

    from tenzro_training.spec import TrainingTaskSpec
    from tenzro_training.trainer.process import TrainerProcessError
    from tests.test_spec import example

    spec = TrainingTaskSpec.from_dict(example())
    text = json.dumps(example()).encode()
    path = tmp_path / "spec.json"
    path.write_bytes(text + b" " * ((64 << 20) - len(text)))
    view = {"spec_hash": "0x" + spec.spec_hash().hex()}
    assert _trainer_for(tmp_path, path, spec.task_id).load_spec(view) == spec
    with path.open("ab") as f:
        f.write(b" ")
    with pytest.raises(TrainerProcessError, match=f"^cannot read spec {path}: file is {(64 << 20) + 1} bytes, "
                                                  f"the limit is {64 << 20}$"):
        _trainer_for(tmp_path, path, spec.task_id).load_spec(view)


def test_an_unreachable_node_is_retried_with_the_documented_backoff(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """docs/trainer-process.md: 0.5 s doubling to 5 s. Retrying faster loads a node that is
    restarting; slower wastes the round it comes back for."""
    import asyncio

    tr, said = _bare_trainer(tmp_path, node_retry_s=3600.0)
    pauses: list[float] = []
    sleep = asyncio.sleep

    async def no_wait(delay: float) -> None:
        pauses.append(delay)
        await sleep(0)

    tr.client = _ScriptedNode([{"round": 0}, *[_node_down()] * 6, {"round": 1}])
    assert asyncio.run(tr.call("tenzro_training_getRun", {})) == {"round": 0}
    monkeypatch.setattr(asyncio, "sleep", no_wait)
    assert asyncio.run(tr.call("tenzro_training_getRun", {})) == {"round": 1}
    assert pauses == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert said[0].endswith("; retrying for up to 3600 s")


def test_each_trainer_line_is_written_out_at_once_with_its_time(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """A supervisor, a log shipper or `tail -f` reads the trainer's lines from a pipe or a file,
    where Python buffers stdout by the block: each line is flushed as it is said, after the time
    of day; the end is said on stderr."""
    import io
    import re
    import sys

    import tenzro_training.trainer.process as process
    from tenzro_training.cli import main

    class Pipe(io.StringIO):
        def __init__(self) -> None:
            super().__init__()
            self.flushed: list[str] = []

        def flush(self) -> None:
            self.flushed.append(self.getvalue())

    out = Pipe()
    seen: list[list[str]] = []

    async def run_trainer(cfg: object, announce: object = None) -> int:
        announce("round 0 submitted")  # type: ignore[operator]
        seen.append(list(out.flushed))  # before the trainer goes on
        return 0

    monkeypatch.setattr(process, "run_trainer", run_trainer)
    monkeypatch.setenv("TENZRO_PRIVATE_KEY", "0x" + "11" * 32)
    monkeypatch.setattr(sys, "stdout", out)
    code = main(["trainer", "run", "--task-id", "t", "--p2p-key", str(tmp_path / "k"),
                 "--bootstrap", _BOOTSTRAP, "--rpc", "http://127.0.0.1:9"])
    monkeypatch.undo()
    assert code == 0 and len(seen[0]) >= 1
    assert re.fullmatch(r"\d\d:\d\d:\d\d round 0 submitted\n", seen[0][-1]), seen
    assert "trainer stopped" in capsys.readouterr().err


def test_a_round_the_record_may_have_signed_is_refused_with_its_reason(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The refusal says why the trainer may already have signed: a round before the record began
    (it was created while enrolled), or one it signed itself and no longer holds the bytes of
    for the model it is told to train from; the first round of the record is of the second kind."""
    import asyncio

    from tenzro_training.fragments import TensorSpec, compute_fragment_layouts
    from tenzro_training.payload import compute_payload_hash
    from tenzro_training.trainer.signing_guard import SigningGuard, SigningRefused

    tr, _ = _bare_trainer(tmp_path)
    tr.layouts = compute_fragment_layouts([TensorSpec("w", (8,), "float32")], 1)
    tr.payloads.dir.mkdir(parents=True)
    tr.guard = SigningGuard(tr.payloads.dir, floor_if_new=5)
    tr.guard.record(5, 0, compute_payload_hash(b"signed from model A"))
    tr.held_hash = _B
    with pytest.raises(SigningRefused, match="its record of signatures began at round 5 .created while enrolled"):
        asyncio.run(tr.get_payloads(4, {}))
    with pytest.raises(SigningRefused, match=f"it signed one before and does not hold it for the model it now trains "
                                             f"from .0x{_B.hex()}."):
        asyncio.run(tr.get_payloads(5, {}))


def test_a_state_directory_that_cannot_be_made_stops_the_trainer_in_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tenzro_training.trainer.process import TrainerProcessError

    (tmp_path / "taken").write_text("a file, not a directory")
    tr, _ = _bare_trainer(tmp_path, state_dir=tmp_path / "taken")
    with pytest.raises(TrainerProcessError, match=f"^cannot use state directory {tr.payloads.dir}: Not a directory$"):
        tr.signing_guard()
    assert tr.guard is None


@pytest.mark.parametrize("status", ["Posted", "Electing", "Enrolling"])
def test_a_stop_before_training_began_leaves_the_record_of_signatures_as_it_was(tmp_path, status: str) -> None:  # type: ignore[no-untyped-def]
    """Before the run trains no round can have been signed: an enrollment seen then (here as the
    trainer is told to stop) raises no floor, so no round of the run is refused later."""
    import asyncio

    tr, _ = _bare_trainer(tmp_path)
    tr.max_rounds = 10
    tr.open_signing_guard({"status": status, "round": 0, "trainers": []})
    stop = asyncio.Event()
    stop.set()
    view = {"status": status, "round": 3, "trainers": [{"address": tr.address}]}
    assert asyncio.run(tr.enroll(view, stop)) is view
    assert tr.guard is not None and tr.guard.floor == 0


def test_a_payload_is_published_as_the_signed_chunks_of_its_fragment(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What a node reassembles and checks against the submission's signature: every chunk of the
    payload, for this trainer, round and fragment, with the signature the submission carries."""
    import asyncio

    tr, _, _, _, published = _trainer_with_model(tmp_path)
    payload, sig = bytes(range(256)) * 10_000, b"\x07" * 65
    asyncio.run(tr.publish_payload(3, 1, payload, sig))
    chunks = g.compute_payload_chunks(task_id=TASK, round=3, fragment=1, trainer=tr.addr_bytes, signature=sig,
                                      payload=payload)
    assert len(chunks) > 1 and published == [g.encode_message(c) for c in chunks]


def test_a_round_open_exactly_the_grace_past_the_nodes_deadline_is_still_waited_for(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The node's own clock decides: past its deadline by model_timeout_s (1 s here) the round is
    still awaited; only beyond that is the node taken to have stopped advancing the run."""
    import asyncio

    tr, _ = _bare_trainer(tmp_path, model_timeout_s=1.0, poll_interval_s=0.01)
    tr.inbox = GossipInbox(TASK, g, 1024)
    polls: list[int] = []

    async def get_run() -> dict[str, object]:
        polls.append(1)
        if len(polls) < 3:
            return _round_view(tr, 0, now_ms=10_000_000, quorum_at_ms=5, finalize_deadline_ms=10_000_000 - 1_000)
        return _round_view(tr, 0, status="Failed", end_reason="quorum")

    tr.get_run = get_run  # type: ignore[method-assign]
    assert asyncio.run(tr.wait_finalized(0, asyncio.Event()))["status"] == "Failed" and len(polls) == 3


def test_the_signing_guards_refusals_name_the_first_ten_rounds(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from tenzro_training.trainer.process import TrainerProcessError
    from tenzro_training.trainer.signing_guard import SigningGuard

    tr, _, signed = _signing_trainer(tmp_path, monkeypatch, poll_interval_s=0.001, max_round_wait_s=0.3)
    tr.payloads.dir.mkdir(parents=True)
    tr.guard = SigningGuard(tr.payloads.dir, floor_if_new=1000)
    tr.held_hash = _A
    rounds = iter(range(1, 1000))

    async def wait_training(stop: object) -> dict[str, object]:
        return _hostile_view(tr, 0, _A)

    async def get_run() -> dict[str, object]:
        return _hostile_view(tr, next(rounds), _A)  # a new round below the floor each time

    tr.wait_training, tr.get_run = wait_training, get_run  # type: ignore[method-assign]
    with pytest.raises(TrainerProcessError, match=r"refused rounds \[0, 1, 2, 3, 4, 5, 6, 7, 8, 9\]$"):
        asyncio.run(tr._rounds(asyncio.Event(), corpus=None))
    assert signed == {} and next(rounds) > 11
