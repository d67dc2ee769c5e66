"""End to end: ``tenzro train verify-run`` and ``export-model`` without ``--data-dir`` (CLI
subprocesses) against a REAL dev node that sealed a run, over its ``artifacts/v1`` routes; and a
node with ``prune_payloads`` whose sealed run cannot be recomputed from it (410, exit 1)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tenzro_training.receipt_check import CHECK_NAMES
from tenzro_training.run_replay import RUN_CHECK_NAMES
from tests.e2e.conftest import TRAINERS, NodeProcess, Task, TinyModel, new_task, run_to_training, tenzro

pytestmark = pytest.mark.slow


def seal(task: Task) -> None:
    """Post, elect, enroll the three trainers, and play both rounds to Sealed (every trainer
    submits every fragment; the rank-1 syncer finalizes)."""
    view = run_to_training(task)
    syncer = task.syncer_by_rank(view, 1)
    for round_ in range(task.spec["max_rounds"]):
        for who in TRAINERS:
            for fragment in range(len(task.layouts)):
                task.submit(who, round_, fragment, seed=round_)
        task.finalize(syncer, round_)
    task.wait_status("Sealed")


def test_verify_run_and_export_model_from_a_real_node(
    node: NodeProcess, tiny_model: TinyModel, tmp_path: Path
) -> None:
    task = new_task(tiny_model, node, "e2e-verify-run")
    seal(task)
    r = tenzro("train", "verify-run", "--task-id", task.task_id, "--rpc", node.url)
    assert r.code == 0, r.out + r.err
    lines = r.out.splitlines()
    assert [line.split()[1] for line in lines] == ["task_id", *CHECK_NAMES, *RUN_CHECK_NAMES]
    assert all(line.startswith("ok    ") for line in lines)
    assert "12 accepted payload(s)" in r.out  # 2 rounds x 2 fragments x 3 trainers

    # The sponsor's own copy of the checkpoint gives the same verdict, in JSON.
    r = tenzro("train", "verify-run", "--task-id", task.task_id, "--checkpoint", str(tiny_model.checkpoint),
               "--rpc", node.url, "--json")
    assert r.code == 0 and r.json()["ok"] is True, r.out + r.err

    remote, local = tmp_path / "remote.safetensors", tmp_path / "local.safetensors"
    r = tenzro("train", "export-model", "--task-id", task.task_id, "--rpc", node.url, "--out", str(remote), "--json")
    assert r.code == 0, r.err
    assert r.json()["receipt_checked"] is True
    r2 = tenzro("train", "export-model", "--task-id", task.task_id, "--data-dir", str(node.data_dir), "--out", str(local),
                "--json")
    assert r2.code == 0, r2.err
    assert remote.read_bytes() == local.read_bytes() and r.json()["model_hash"] == r2.json()["model_hash"]

    # A run that does not exist: the node answers getReceipt with an error (exit 1, one line).
    r = tenzro("train", "verify-run", "--task-id", "e2e-no-such-run", "--rpc", node.url)
    assert r.code == 1 and r.out == "" and r.err.count("\n") == 1 and "UnknownTask" in r.err


def test_verify_run_against_a_pruning_node_fails_naming_the_payload(
    node_factory: Callable[..., NodeProcess], tiny_model: TinyModel
) -> None:
    pruning = node_factory("pruning", prune_payloads=True)
    task = new_task(tiny_model, pruning, "e2e-verify-pruned")
    seal(task)
    r = tenzro("train", "verify-run", "--task-id", task.task_id, "--rpc", pruning.url, "--json")
    assert r.code == 1, r.out + r.err
    report = json.loads(r.out)
    by_name = {c["name"]: c for c in report["checks"]}
    assert by_name["checkpoint"]["ok"] and by_name["initial_model"]["ok"]
    assert not by_name["payloads"]["ok"] and "round 0 fragment 0 trainer 0x" in by_name["payloads"]["detail"]
    assert "the node pruned the payload (HTTP 410" in by_name["payloads"]["detail"]
    assert report["skipped"] == ["rounds", "final_model_hash", "model_file"]
    assert r.err == "tenzro: run verification failed: payloads\n"
    # Its model is still served and still checks against the receipt.
    r = tenzro("train", "export-model", "--task-id", task.task_id, "--rpc", pruning.url, "--out",
               str(pruning.data_dir.parent / "m.safetensors"))
    assert r.code == 0, r.err
