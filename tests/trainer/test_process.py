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


def test_inbox_reassembles_notices_models_and_sealed_for_its_run_only() -> None:
    inbox = _Inbox(TASK, g, model_bytes=len(WEIGHTS))
    feed(inbox, notice(task="another-run"))
    assert inbox.finalized == {}
    feed(inbox, notice(0))
    msg, data = inbox.finalized[0]
    assert data == WEIGHTS and msg.model_hash == h("model")
    feed(inbox, g.compute_model_chunks(task_id=TASK, round=1, model_hash=h("m1"), weights=WEIGHTS))
    assert inbox.models[(1, h("m1"))] == WEIGHTS
    feed(inbox, [g.RunSealedMsg(task_id=TASK, run_root=h("root"), final_model_hash=h("final"))])
    assert inbox.sealed.run_root == h("root")
    assert inbox.changed.is_set()


def test_inbox_keeps_the_first_notice_until_it_is_discarded() -> None:
    inbox = _Inbox(TASK, g, model_bytes=len(WEIGHTS))
    feed(inbox, notice(0, key=SYNCER_KEYS[1], syncer=SYNCERS[1], model=h("early")))  # held first
    feed(inbox, notice(0))
    assert inbox.finalized[0][0].model_hash == h("early")
    inbox.discard_finalized(0)
    feed(inbox, notice(0))
    assert inbox.finalized[0][0].model_hash == h("model")


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
