"""Unit tests of the trainer process's gossip side (the whole process runs in tests/e2e):
the inbox that reassembles what it waits for, the RoundFinalized check against the round record,
and the topic validator wiring."""

from __future__ import annotations

import pytest

from tenzro_training import gossip as g
from tenzro_training.auth import FinalizeRound, sign_message
from tenzro_training.errors import GossipIgnore, GossipReject
from tenzro_training.gossip_trainer import find_round_finalized_mismatch
from tenzro_training.trainer.process import _Inbox, _trainer_validator
from tests.test_gossip import CHAIN_ID, OUTSIDER_KEY, SYNCER_KEYS, SYNCERS, TASK, h, payload_chunks

WEIGHTS = bytes(range(256)) * 4


def notice(round_: int = 0, *, key: bytes = SYNCER_KEYS[0], syncer: bytes = SYNCERS[0], model: bytes = h("model"),
           task: str = TASK, weights: bytes = WEIGHTS, chain_id: int = CHAIN_ID) -> list[g.RoundFinalizedMsg]:
    return g.compute_round_finalized_chunks(
        task_id=task, round=round_, syncer=syncer, syncer_signature=sign_message(FinalizeRound(task, round_), key, chain_id),
        aggregate_hashes=(h("a0"), h("a1")), model_hash=model, weights=weights,
    )


def feed(inbox: _Inbox, messages: list[g.GossipMessage]) -> None:
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
    inbox = _Inbox(TASK, g, model_bytes=len(WEIGHTS))
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
    inbox.expect_model((1, h("m1")))
    feed(inbox, model)
    assert inbox.models[model[0].data_hash] == WEIGHTS
    feed(inbox, [g.RunSealedMsg(task_id=TASK, run_root=h("root"), final_model_hash=h("final"))])
    assert inbox.sealed.run_root == h("root")
    assert inbox.changed.is_set()
    inbox.expect_model(None)
    inbox.expect_finalized(None)
    assert inbox.models == {} and inbox.finalized == {}  # pruned once used


def test_inbox_keeps_candidate_notices_per_data_hash() -> None:
    inbox = _Inbox(TASK, g, model_bytes=len(WEIGHTS))
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

    inbox = _Inbox(TASK, g, model_bytes=len(WEIGHTS))
    inbox.expect_model((3, h("want")))
    for i in range(40):
        feed(inbox, g.compute_model_chunks(task_id=TASK, round=10**6 + i, model_hash=os.urandom(32), weights=WEIGHTS))
    assert inbox.models == {} and len(inbox._assembler) == 0 and inbox.counters["unexpected"] == 40


def test_inbox_forged_model_chunks_do_not_evict_the_genuine_notice() -> None:
    # Reviewer repro inbox_evict.py: 4 unsigned ModelChunk seq-0s evicted the genuine RoundFinalized.
    import os

    weights = os.urandom(2 * g.MAX_CHUNK_BYTES)
    inbox = _Inbox(TASK, g, model_bytes=len(weights))
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
                               p2p_key=tmp_path / "unused", bootstrap=("/ip4/127.0.0.1/tcp/9",),
                               model_timeout_s=model_timeout_s, chain_id=CHAIN_ID)
    tr = _Trainer(cfg, lambda line: None)
    tr.g, tr.layouts, tr.model = g, layouts, model
    nbytes = 4 * sum(lay.numel for lay in layouts)
    tr.inbox = _Inbox(TASK, g, nbytes, verify=tr.verify_weights)
    published: list[bytes] = []

    class Host:
        async def publish(self, topic: str, data: bytes) -> None:
            published.append(data)

    tr.host = Host()
    return tr, compute_state_model_hash(model, real), compute_weights_bytes(real), nbytes, published


def test_a_forged_model_answer_is_dropped_and_the_genuine_one_accepted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    tr, committed, real, nbytes, published = _trainer_with_model(tmp_path)
    forged = g.compute_model_chunks(task_id=TASK, round=3, model_hash=committed, weights=b"\0" * nbytes)
    genuine = g.compute_model_chunks(task_id=TASK, round=3, model_hash=committed, weights=real)

    async def main() -> None:
        async def arrive() -> None:
            await asyncio.sleep(0.05)
            feed(tr.inbox, forged)  # completes first: used to be kept and then crash the trainer
            feed(tr.inbox, genuine)

        task = asyncio.create_task(arrive())
        await tr.request_model({"round": 3, "model_hash": "0x" + committed.hex()}, asyncio.Event())
        await task

    asyncio.run(main())
    assert tr.held_hash == committed and tr.inbox.counters["forged"] == 1
    assert tr.inbox.models == {} and tr.inbox.await_model is None  # pruned after use
    request = g.decode_message(published[0])
    assert isinstance(request, g.ModelRequest) and request.requester == tr.addr_bytes  # signed (version 2)


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
                 "--bootstrap", "/ip4/127.0.0.1/tcp/9", "--rpc", "http://127.0.0.1:9", "--device", "cuda:0"])
    err = capsys.readouterr().err
    assert code != 0 and "no CUDA device" in err and "Traceback" not in err
    assert not (tmp_path / "k").exists()  # no identity made, nothing staked


def _trainer_for(spec_path, task_id: str):  # type: ignore[no-untyped-def]
    from pathlib import Path

    from tenzro_training.trainer.process import TrainerProcessConfig, _Trainer

    cfg = TrainerProcessConfig(task_id=task_id, rpc_url="http://127.0.0.1:9", private_key=b"\x11" * 32,
                               spec_path=spec_path, p2p_key=Path("unused"), bootstrap=("/ip4/127.0.0.1/tcp/9",))
    return _Trainer(cfg, print)


def test_the_spec_comes_from_the_file_or_the_node_and_must_match_the_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from tenzro_training.spec import TrainingTaskSpec
    from tenzro_training.trainer.process import TrainerProcessError
    from tests.test_spec import example

    obj = example()
    spec = TrainingTaskSpec.from_dict(obj)
    view = {"spec": obj, "spec_hash": "0x" + spec.spec_hash().hex()}
    assert _trainer_for(None, spec.task_id).load_spec(view) == spec  # served by the node
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(obj))
    assert _trainer_for(path, spec.task_id).load_spec({"spec_hash": view["spec_hash"]}) == spec  # from --spec

    tampered = json.loads(json.dumps(obj))
    tampered["max_rounds"] = spec.max_rounds + 1  # a node serving another spec than the run committed to
    with pytest.raises(TrainerProcessError, match="the node's spec hashes to 0x"):
        _trainer_for(None, spec.task_id).load_spec({**view, "spec": tampered})
    with pytest.raises(TrainerProcessError, match="is for"):
        _trainer_for(None, "another-task").load_spec(view)
    with pytest.raises(TrainerProcessError, match="the node's spec is invalid"):
        _trainer_for(None, spec.task_id).load_spec({"spec_hash": view["spec_hash"]})  # an old node: no spec
    path.write_text("{not json")
    with pytest.raises(TrainerProcessError, match="is not valid JSON"):
        _trainer_for(path, spec.task_id).load_spec(view)
    with pytest.raises(TrainerProcessError, match="cannot read"):
        _trainer_for(tmp_path / "missing.json", spec.task_id).load_spec(view)


def test_a_host_that_fails_to_start_is_still_stopped(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """P7: host.start() ran outside the try/finally that stops the host, so a start that failed
    (or was cancelled) half-way left the libp2p thread and its socket behind."""
    import asyncio
    from types import SimpleNamespace

    import tenzro_training.cli as cli
    import tenzro_training.p2p.host as p2p_host
    import tenzro_training.trainer.data as data
    import tenzro_training.trainer.inner as inner
    import tenzro_training.trainer.model as model
    import tenzro_training.trainer.process as process
    from tenzro_training.fragments import TensorSpec, compute_fragment_layouts

    stopped: list[bool] = []

    class FailingHost:
        def __init__(self, config: object) -> None:
            pass

        async def start(self) -> None:
            raise process.TrainerProcessError("listening, then the bootstrap dial blew up")

        async def stop(self) -> None:
            stopped.append(True)

    layouts = compute_fragment_layouts([TensorSpec("w", (8,), "float32")], 1)
    monkeypatch.setattr(p2p_host, "P2PHost", FailingHost)
    monkeypatch.setattr(cli, "compute_layouts_from_view", lambda view: layouts)
    monkeypatch.setattr(process, "compute_model_layout_from_view", lambda view, lays: None)
    monkeypatch.setattr(model, "get_adapter", lambda family: SimpleNamespace(config_from_spec=lambda spec: None))
    monkeypatch.setattr(inner.InnerConfig, "from_spec", classmethod(lambda cls, spec, batch_size: None))
    monkeypatch.setattr(data, "load_corpus", lambda ref: None)
    monkeypatch.setattr(data, "validate_dataset_hash", lambda corpus, h: None)
    tr = _trainer_for(None, TASK)
    spec = SimpleNamespace(architecture=SimpleNamespace(family="x", dtype="fp32"), dataset_ref="r", dataset_hash="h")

    async def get_run() -> dict[str, object]:
        return {}

    async def enroll(view: object, stop: object) -> dict[str, object]:
        return {}

    tr.get_run = get_run  # type: ignore[method-assign]
    tr.load_spec = lambda view: spec  # type: ignore[method-assign]
    tr.enroll = enroll  # type: ignore[method-assign]
    tr.cfg = process.TrainerProcessConfig(**{**{f: getattr(tr.cfg, f) for f in tr.cfg.__dataclass_fields__},
                                             "device": "cpu"})
    with pytest.raises(process.TrainerProcessError, match="blew up"):
        asyncio.run(tr.run(asyncio.Event()))
    assert stopped == [True]
