"""One Byzantine trainer in a real run, with REAL OS processes on 127.0.0.1 (Byzantine probe,
2026-11-27).

A ``tenzro node --dev`` with gossip on, the syncer daemon and three trainer processes carry a
CoordinateMedian run (M = K = 3, 2 rounds, the tiny model) to Sealed. ``trainer:2`` is
``tests/e2e/byzantine_trainer.py``: the real trainer, sending +1e6 in every value of every outer
gradient (exactly the node's default ``max_gradient_abs``, so the node accepts every payload).
Under Mean that moves each weight by ~4.4e5 in the first round (1e6 / 3, times the outer step's
0.7 x (1 + 0.9) with Nesterov momentum): the model breaks at once and every trainer stops,
saying why. Under the median of three the attacker's value is the largest in every coordinate
and the honest ones decide.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from tenzro_training.receipt import TrainingReceipt, verify_receipt
from tests.e2e.conftest import Child, NodeProcess, Task, TinyModel, rpc, start_gossip_run, tenzro

pytestmark = pytest.mark.slow

ATTACK_VALUE = 1e6
RUN_TIMEOUT_S = 120.0


def start_run(tmp_path: Path, tiny_model: TinyModel, aggregation: Any, task_id: str,
              children: list[Child]) -> tuple[NodeProcess, Task, list[Child]]:
    """The node, the posted task and its three trainers (the last one the attacker), all started;
    every process started is in ``children`` (the node is not: the caller stops it)."""
    return start_gossip_run(tmp_path, tiny_model, task_id, children, aggregation=aggregation,
                            attacker_env={"TENZRO_BYZANTINE_VALUE": repr(ATTACK_VALUE)})


def stop_all(node: NodeProcess, children: list[Child]) -> None:
    for child in children:
        child.stop()
    code = node.stop()
    assert code == 0, node.stderr()[-4000:]
    for child in children:
        assert "Traceback" not in child.err(), f"{child.name}:\n{child.err()[-4000:]}"


def test_one_byzantine_trainer_does_not_move_a_median_run(tmp_path: Path, tiny_model: TinyModel) -> None:
    children: list[Child] = []
    node, task, trainers = start_run(tmp_path, tiny_model, "CoordinateMedian", "byzantine-median", children)
    try:
        for child in trainers:
            assert child.wait(RUN_TIMEOUT_S) == 0, f"{child.name}:\n{child.out()}\n{child.err()[-4000:]}"

        view = task.get()
        assert view["status"] == "Sealed" and len(view["round_records"]) == 2
        receipt_doc = rpc(node.url, "tenzro_training_getReceipt", {"task_id": task.task_id})
        receipt = TrainingReceipt.from_dict(receipt_doc["receipt"])
        assert verify_receipt(receipt)
        # The attacker's payloads were accepted, every one: its weight in the payout is the same
        # as an honest trainer's (docs/lifecycle.md "Sealed": accepted is not selected).
        attacker = task.address("trainer:2").lower()
        assert {"0x" + bytes(t.address).hex(): t.accepted_submissions for t in receipt.trainers} == {
            task.address(f"trainer:{i}").lower(): 4 for i in range(3)}
        for record in view["round_records"]:
            for fragment in record["fragments"]:
                assert attacker in [a.lower() for a in fragment["accepted"]]

        # The model: every weight moved by what the honest trainers sent, nothing near the attack.
        initial = load_file(str(tiny_model.checkpoint))
        final = load_file(str(node.data_dir / "models" / f"{task.task_id}.safetensors"))
        assert final.keys() == initial.keys()
        moved = max(float((final[name].float() - initial[name].float()).abs().max()) for name in initial)
        assert 0 < moved < 1.0, moved  # under Mean: ~4.4e5 after the first round alone

        # A third party recomputes it all, the attacker's payloads included, from the node's URL.
        checked = tenzro("train", "verify-run", "--task-id", task.task_id, "--rpc", node.url, "--json")
        assert checked.code == 0 and checked.json()["ok"], checked.out + checked.err
    finally:
        stop_all(node, children)


def test_under_mean_the_same_trainer_stops_every_trainer_with_the_reason(tmp_path: Path,
                                                                         tiny_model: TinyModel) -> None:
    """Round 0 commits the poisoned model; round 1's first forward pass on it is not finite, for
    the attacker too. Every trainer stops (exit 1) saying which model of which round and why,
    instead of only "inner step 0: loss is nan"; nothing is submitted for round 1."""
    children: list[Child] = []
    node, task, trainers = start_run(tmp_path, tiny_model, "Mean", "byzantine-mean", children)
    try:
        for child in trainers:
            assert child.wait(RUN_TIMEOUT_S) == 1, f"{child.name}:\n{child.out()}\n{child.err()[-4000:]}"
        view = task.get()
        assert view["status"] == "Training" and view["round"] == 1 and len(view["round_records"]) == 1
        poisoned = view["round_records"][0]["model_hash"]
        for child in trainers:
            last = child.err().strip().splitlines()[-1]
            assert last.startswith(f"tenzro: round 1: the global model {poisoned} (committed by round 0) gives a "
                                   "non-finite loss"), last
            assert "the run's model has diverged" in last and "nothing was signed for this round" in last
        assert view["submission_counts"] == [0, 0], view["submission_counts"]
    finally:
        stop_all(node, children)
