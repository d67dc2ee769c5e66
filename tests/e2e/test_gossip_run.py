"""A whole run over the gossip data plane, with REAL OS processes on 127.0.0.1.

One ``tenzro node --dev --p2p-listen ...`` process, three ``tenzro trainer run`` processes (the
dev trainer keys) and the ``tenzro syncer run`` daemon for the elected syncer carry a small run
(M=3, K=2, F=2, 2 rounds, the tiny timesfm model, real statsmodels series) to Sealed. Every
payload travels as PayloadChunk gossip; trainers call submitOuterGradient with only the hash.
Trainer 2 stops after round 0 (``--rounds 1``) and is restarted: it gets the current model with a
ModelRequest over libp2p, verifies it against the committed hash, and trains round 1. Every
trainer ends holding the receipt's final model hash.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tenzro_training.receipt import TrainingReceipt, verify_receipt
from tests.e2e.conftest import (
    Child,
    TinyModel,
    documented_metrics,
    new_task,
    rpc,
    scrape_metric_families,
    scrape_metrics,
    start_p2p_node,
    tenzro,
    trainer_argv,
)

pytestmark = pytest.mark.slow

DATASET_REF = "statsmodels:co2,nile"
RUN_TIMEOUT_S = 90.0


def test_gossip_run_to_sealed_with_a_restarted_trainer(tmp_path: Path, tiny_model: TinyModel) -> None:
    from tenzro_training.trainer.data import compute_dataset_hash, load_corpus

    node, p2p_addr = start_p2p_node(tmp_path)
    children: list[Child] = []
    try:
        assert "/p2p/" in p2p_addr
        dataset_hash = "0x" + compute_dataset_hash(load_corpus(DATASET_REF)).hex()
        # A long straggler window: round 1 waits for the restarted trainer (every trainer submits).
        task = new_task(tiny_model, node, "gossip-run", dataset_ref=DATASET_REF, dataset_hash=dataset_hash,
                        grace_window_ms=30_000)
        spec_path = tmp_path / "spec.json"
        spec_path.write_text(json.dumps(task.spec))
        task.post()
        view = task.wait_status("Enrolling")
        syncer = task.syncer_by_rank(view, 1)
        children.append(Child("syncer", ["syncer", "run", "--key-file", str(node.data_dir / "dev-accounts.json"),
                                          "--account", syncer, "--rpc", node.url, "--poll-interval", "0.1"], tmp_path))
        keys = {i: tmp_path / f"trainer{i}.p2p-key" for i in range(3)}
        trainers = {
            # Trainer 1 has no --spec file: it trains on the spec the node serves.
            i: Child(f"trainer{i}", trainer_argv(node, task.task_id, spec_path if i != 1 else None, f"trainer:{i}",
                                                 p2p_addr, keys[i],
                                                 *(["--rounds", "1"] if i == 2 else []),
                                                 *(["--device", "cpu"] if i == 0 else []),
                                                 *(["--carry-optimizer-state"] if i == 1 else [])), tmp_path)
            for i in range(3)
        }
        children.extend(trainers.values())

        # Trainer 2 trains round 0 only, then exits cleanly once round 0's model is applied.
        assert trainers[2].wait(RUN_TIMEOUT_S) == 0, trainers[2].err()[-4000:]
        first = trainers[2].out()
        assert "round 0 submitted 2 fragments over gossip" in first
        assert "round 0 finalized model" in first and "stopping after 1 rounds" in first
        # Restarted (same keys): it is enrolled already, fetches the current model over libp2p.
        restarted = Child("trainer2-restart", trainer_argv(node, task.task_id, spec_path, "trainer:2", p2p_addr, keys[2]),
                          tmp_path)
        children.append(restarted)

        for child in (trainers[0], trainers[1], restarted):
            assert child.wait(RUN_TIMEOUT_S) == 0, f"{child.name}:\n{child.out()}\n{child.err()[-4000:]}"
        receipt_doc = rpc(node.url, "tenzro_training_getReceipt", {"task_id": task.task_id})
        receipt = TrainingReceipt.from_dict(receipt_doc["receipt"])
        assert verify_receipt(receipt)
        final = "0x" + receipt.final_model_hash.hex()
        view = task.get()
        assert view["status"] == "Sealed" and len(view["round_records"]) == 2

        # Late join / restart recovery: the model of round 1 came from a ModelRequest, verified.
        round1 = view["round_records"][0]["model_hash"]
        again = restarted.out()
        assert f"model round 1 hash {round1} from ModelRequest verified" in again, again
        assert "round 1 submitted 2 fragments over gossip" in again
        # Every trainer holds the receipt's final model.
        for child in (trainers[0], trainers[1], restarted):
            assert f"sealed final model {final} verified" in child.out(), child.out()
            assert f"round 1 finalized model {final} verified" in child.out()
        for i in (0, 1):
            assert f"round 0 finalized model {round1} verified" in trainers[i].out()
        assert "inner loop on cpu, AdamW state fresh each round" in trainers[0].out()
        assert "AdamW state carried from round to round" in trainers[1].out()
        # Trainer 1 runs the default --device auto: the GPU where there is one (a GPU machine runs
        # this test with trainers on both devices, docs/trainer.md "GPU check").
        assert f"inner loop on {'cuda' if torch.cuda.is_available() else 'cpu'}" in trainers[1].out()
        # All 12 payloads (3 trainers x 2 fragments x 2 rounds) reached the node as gossip; every
        # accepted submission named one of them by hash.
        held = [line for line in node.stderr().splitlines() if "(from gossip)" in line]
        assert len(held) == 12, "\n".join(held)
        assert all(t.accepted_submissions == 4 for t in receipt.trainers), receipt.trainers
        # The operator's view of the same: nothing dropped, every payload stored from gossip.
        m = scrape_metrics(node.url)
        messages = {labels[0][1]: v for labels, v in m["tenzro_gossip_messages_total"].items()}
        assert messages["delivered"] > 0 and messages["published"] > 0
        assert messages["dropped_outbound"] == messages["dropped_inbox"] == 0, messages
        bridge = {labels[0][1]: v for labels, v in m["tenzro_gossip_bridge_total"].items()}
        assert bridge["payloads_stored"] == 12 and bridge["finalized_published"] >= 2, bridge
        assert () in m["tenzro_gossip_peers"] and () in m["tenzro_gossip_bootstrap_unreachable"]
        # docs/node.md's metrics table is what a node with gossip exports, name, type and labels
        # (it had been checked by hand only: docs probe).
        documented = documented_metrics()
        assert len(documented) >= 20 and scrape_metric_families(node.url) == documented
        # A third party recomputes the run from the node's URL: the payloads it stored from
        # gossip, served back over /artifacts/v1, reproduce every round the trainers trained.
        checked = tenzro("train", "verify-run", "--task-id", task.task_id, "--rpc", node.url, "--json")
        assert checked.code == 0 and checked.json()["ok"], checked.out + checked.err
        assert "12 accepted payload(s)" in checked.out
    finally:
        for child in children:
            child.stop()
        code = node.stop()
    assert code == 0, node.stderr()[-4000:]
    assert "Traceback" not in node.stderr(), node.stderr()[-4000:]
    assert "auto_connector" not in node.stderr()  # libp2p's every-10-s INFO lines are silenced
    for child in children:
        assert "Traceback" not in child.err(), f"{child.name}:\n{child.err()[-4000:]}"


def test_trainer_sigterm_exits_cleanly(tmp_path: Path, tiny_model: TinyModel) -> None:
    """A trainer enrolled and waiting for training stops on SIGTERM: exit 0, no traceback."""
    from tenzro_training.trainer.data import compute_dataset_hash, load_corpus

    node, p2p_addr = start_p2p_node(tmp_path)
    child = None
    try:
        dataset_hash = "0x" + compute_dataset_hash(load_corpus(DATASET_REF)).hex()
        task = new_task(tiny_model, node, "gossip-sigterm", dataset_ref=DATASET_REF, dataset_hash=dataset_hash)
        spec_path = tmp_path / "spec.json"
        spec_path.write_text(json.dumps(task.spec))
        task.post()
        child = Child("trainer", trainer_argv(node, task.task_id, spec_path, "trainer:0", p2p_addr,
                                              tmp_path / "t.key"), tmp_path)
        # Enrolled (1 of 3 trainers): the run stays Enrolling and the trainer waits for Training.
        task.wait_for(lambda v: len(v["trainers"]) == 1, "the trainer's enrollment", timeout=60)
        child.proc.terminate()
        assert child.wait(30) == 0, child.err()[-4000:]
        assert "trainer stopped" in child.err()
        assert "Traceback" not in child.err(), child.err()[-4000:]
    finally:
        if child is not None:
            child.stop()
        code = node.stop()
    assert code == 0, node.stderr()[-4000:]
