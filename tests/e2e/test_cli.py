"""End to end through the ``tenzro`` CLI (subprocesses) against a REAL dev node.

A run is carried to a sealed receipt with the sponsor, trainer and syncer commands (signing keys
picked from the node's dev-accounts.json with ``--account``, or given in TENZRO_PRIVATE_KEY),
payloads built by ``make-gradient``, the receipt saved by ``get-receipt --out``, the final
model exported and checked against it, then scored beside the initial one by ``evaluate-model``
as a sponsor would. Exit codes: 0 ok, 1 node error, 2 usage, 3 unreachable.
"""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path

import pytest

from tenzro_training.receipt import TrainingReceipt, verify_receipt
from tests.e2e.conftest import NodeProcess, TinyModel, new_task, rpc, tenzro

pytestmark = pytest.mark.slow


def test_a_run_through_the_cli(node: NodeProcess, tiny_model: TinyModel, tmp_path: Path) -> None:
    from tenzro_training.trainer.data import compute_dataset_hash, load_corpus

    # The corpus's true hash (the shared spec's placeholder is enough for the node, which does
    # not load the data): evaluate-model checks it, as a trainer does.
    ref = "statsmodels:co2,nile"
    task = new_task(tiny_model, node, "e2e-cli", dataset_ref=ref,
                    dataset_hash="0x" + compute_dataset_hash(load_corpus(ref)).hex())
    keys = str(node.data_dir / "dev-accounts.json")
    url = node.url
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(task.spec))

    r = tenzro("train", "post-task", "--spec", str(spec_file), "--key-file", keys, "--account", "sponsor", "--rpc", url, "--json")
    assert r.code == 0, r.err
    assert r.json()["task_id"] == "e2e-cli"
    view = task.wait_status("Enrolling")
    syncer = task.syncer_by_rank(view, 1)

    r = tenzro("train", "enroll-trainer", "--task-id", "e2e-cli", "--did", "did:tenzro:trainer:cli-0", "--stake", str(10**18),
               "--key-file", keys, "--account", "trainer:0", "--rpc", url)
    assert r.code == 0, r.err
    assert "shard" in r.out and task.address("trainer:0") in r.out
    env = {"TENZRO_PRIVATE_KEY": task.accounts["trainer:1"]["private_key"]}
    r = tenzro("train", "enroll-trainer", "--task-id", "e2e-cli", "--did", "did:tenzro:trainer:cli-1", "--stake", str(10**18),
               "--rpc", url, env=env)
    assert r.code == 0, r.err
    task.enroll("trainer:2")
    task.wait_status("Training")

    r = tenzro("train", "list-runs", "--status", "Training", "--rpc", url, "--json")
    assert r.code == 0 and "e2e-cli" in [x["task_id"] for x in r.json()["runs"]]
    r = tenzro("train", "get-run", "--task-id", "e2e-cli", "--rpc", url)
    assert r.code == 0 and "status    Training   round 0" in r.out and "trainers  3" in r.out

    # trainer:0 builds its round-0 payloads with make-gradient (layouts from the node's getRun
    # for one, from the spec's init checkpoint for the other: the same layouts) and submits them.
    for fragment, source in ((0, ["--task-id", "e2e-cli"]), (1, ["--spec", str(spec_file)])):
        out = tmp_path / f"g{fragment}.safetensors"
        r = tenzro("train", "make-gradient", *source, "--round", "0", "--fragment", str(fragment), "--random-seed", "3",
                   "--out", str(out), "--rpc", url, "--json")
        assert r.code == 0, r.err
        made = r.json()
        r = tenzro("train", "submit-gradient", "--task-id", "e2e-cli", "--round", "0", "--fragment", str(fragment),
                   "--payload", str(out), "--key-file", keys, "--account", "trainer:0", "--rpc", url, "--json")
        assert r.code == 0, r.err
        assert r.json()["payload_hash"] == made["payload_hash"]
    for who in ("trainer:1", "trainer:2"):
        for fragment in range(2):
            task.submit(who, 0, fragment)

    # A trainer signing finalize is refused by the node: exit 1, one line on stderr.
    r = tenzro("train", "finalize-round", "--task-id", "e2e-cli", "--key-file", keys, "--account", "trainer:0", "--rpc", url)
    assert r.code == 1 and "NotSyncer" in r.err and r.err.count("\n") == 1
    assert "recovered" not in r.err  # the node recovered the trainer's own address: no chain hint
    # The syncer's key, signing for another chain: the node recovers an unrelated address, and
    # the refusal says the chain id is the likely cause.
    r = tenzro("train", "finalize-round", "--task-id", "e2e-cli", "--key-file", keys, "--account", syncer,
               "--chain-id", "1", "--rpc", url)
    assert r.code == 1 and "NotSyncer" in r.err and r.err.count("\n") == 1
    assert "another chain id" in r.err and "--chain-id 1)" in r.err
    r = tenzro("train", "finalize-round", "--task-id", "e2e-cli", "--key-file", keys, "--account", syncer, "--rpc", url, "--json")
    assert r.code == 0, r.err
    assert r.json()["round"] == 0 and r.json()["status"] == "Training"

    for who in ("trainer:0", "trainer:1", "trainer:2"):
        for fragment in range(2):
            task.submit(who, 1, fragment)
    # The syncer daemon, one pass: it finalizes the closed round 1, which seals the run.
    r = tenzro("syncer", "run", "--once", "--key-file", keys, "--account", syncer, "--rpc", url)
    assert r.code == 0, r.err
    assert "finalized e2e-cli round 1 status Sealed" in r.out

    receipt_file = tmp_path / "receipt.json"
    r = tenzro("train", "get-receipt", "--task-id", "e2e-cli", "--out", str(receipt_file), "--rpc", url)
    assert r.code == 0, r.err
    assert "rounds            2" in r.out
    receipt = TrainingReceipt.from_dict(json.loads(receipt_file.read_text())["receipt"])
    assert verify_receipt(receipt)
    assert [t.did for t in receipt.trainers] == ["did:tenzro:trainer:cli-0", "did:tenzro:trainer:cli-1", "did:tenzro:trainer:trainer-2"]

    model = tmp_path / "final.safetensors"
    r = tenzro("train", "export-model", "--task-id", "e2e-cli", "--data-dir", str(node.data_dir), "--out", str(model),
               "--check-receipt", "--rpc", url, "--json")
    assert r.code == 0, r.err
    assert r.json()["model_hash"] == "0x" + receipt.final_model_hash.hex() and r.json()["receipt_checked"]
    assert model.stat().st_size == r.json()["bytes"]

    # The sponsor scores the sealed model and the initial one on the spec's held-out windows.
    r = tenzro("train", "evaluate-model", "--spec", str(spec_file), "--model", str(model), "--with-init", "--json")
    assert r.code == 0, r.err
    scores = {m["name"]: m for m in r.json()["models"]}
    assert set(scores) == {"init_checkpoint", str(model)}
    assert all(math.isfinite(m["loss"]) for m in scores.values())
    assert scores[str(model)]["model_hash"] == "0x" + receipt.final_model_hash.hex()
    assert scores["init_checkpoint"]["model_hash"] == view["initial_model_hash"]


def test_cli_cancel_and_exit_codes(node: NodeProcess, tiny_model: TinyModel, tmp_path: Path) -> None:
    task = new_task(tiny_model, node, "e2e-cli-cancel")
    keys = str(node.data_dir / "dev-accounts.json")
    task.post()
    r = tenzro("train", "cancel-task", "--task-id", task.task_id, "--key-file", keys, "--account", "sponsor", "--rpc", node.url)
    assert r.code == 0, r.err
    assert "Cancelled" in r.out
    assert rpc(node.url, "tenzro_training_getRun", {"task_id": task.task_id})["status"] == "Cancelled"

    r = tenzro("train", "get-run", "--task-id", "no-such-task", "--rpc", node.url)
    assert r.code == 1 and r.err.startswith("tenzro: error 1301 UnknownTask: ") and r.err.count("\n") == 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/"
    r = tenzro("train", "list-runs", "--rpc", closed)
    assert r.code == 3 and "cannot reach node" in r.err
    bad_spec = tmp_path / "bad.json"
    bad_spec.write_text(json.dumps({**task.spec, "quorum": 9}))
    r = tenzro("train", "post-task", "--spec", str(bad_spec), "--key-file", keys, "--account", "sponsor", "--rpc", node.url)
    assert r.code == 2 and "quorum" in r.err
    r = tenzro("train", "address", "--key-file", keys, "--account", "syncer:9")
    assert r.code == 2 and "no account 'syncer:9'" in r.err
