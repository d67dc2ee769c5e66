"""End to end over raw JSON-RPC against REAL node processes (``tenzro node --dev``).

Covers a whole run to a sealed, verifiable receipt and the failure modes a public endpoint sees:
wrong signers, replays, equivocation (stake slashed), late submissions, unknown tasks, malformed
params and bodies, oversized bodies, cancellation (escrow refunded), syncer failover with the
syncer daemon, SIGKILL mid-round with a restart on the same data dir (the receipt equals an
uninterrupted run's), clean shutdown and startup failures.
"""

from __future__ import annotations

import json
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tenzro_training import __version__
from tenzro_training.receipt import TrainingReceipt, verify_receipt
from tests.e2e.conftest import (
    MAX_BODY_BYTES,
    REPO,
    TRAINERS,
    NodeProcess,
    Task,
    TinyModel,
    _child_env,
    new_task,
    node_command,
    post_raw,
    receipt_without_sealed_at,
    rpc,
    rpc_error,
    run_to_training,
    scrape_metrics,
    sighup_at_default_in_children,
    start_node,
    tenzro,
    write_config,
)

pytestmark = pytest.mark.slow

ROUNDS = 2
FRAGMENTS = 2


def submit_all(task: Task, round_: int, trainers: tuple[str, ...] = TRAINERS) -> None:
    for who in trainers:
        for fragment in range(FRAGMENTS):
            task.submit(who, round_, fragment)


def test_full_run_to_a_verified_receipt_with_error_cases(node: NodeProcess, tiny_model: TinyModel) -> None:
    task = new_task(tiny_model, node, "e2e-full")
    posted = task.post()
    assert posted["status"] in ("Posted", "Electing") and posted["fragment_count"] == FRAGMENTS
    # A replayed postTask is harmless: the same answer, no second escrow.
    assert task.post()["spec_hash"] == posted["spec_hash"]
    view = task.wait_status("Enrolling")
    assert len(view["election"]["ranking"]) == 3  # the three dev syncers, ticketed by the node
    syncer = task.syncer_by_rank(view, 1)
    assert view["syncer"] == task.address(syncer) and view["syncer_rank"] == 1
    assert [f["layout_hash"] for f in view["fragments"]] == ["0x" + lay.layout_hash().hex() for lay in task.layouts]

    # Wrong signer: an enrollment for trainer:0 signed by trainer:1.
    params = task.enroll_params("trainer:0")
    params["signature"] = task.enroll_params("trainer:1")["signature"]
    err = rpc_error(task.url, "tenzro_training_enrollTrainer", params)
    assert err["data"]["type"] in ("WrongSigner", "SignatureInvalid") and err["code"] in (1202, 1203)

    first = task.enroll("trainer:0")
    assert first["shard"] == 0
    assert task.enroll("trainer:0") == first  # replay: idempotent
    task.enroll("trainer:1")
    task.enroll("trainer:2")
    view = task.wait_status("Training")
    assert [t["shard"] for t in view["trainers"]] == [0, 1, 2] and view["round"] == 0

    # Round 0: a replayed submission is answered the same and counted once.
    payload = task.payload("trainer:0", 0, 0)
    params = task.submit_params("trainer:0", 0, 0, payload)
    accepted = rpc(task.url, "tenzro_training_submitOuterGradient", params)
    assert rpc(task.url, "tenzro_training_submitOuterGradient", params) == accepted
    assert task.get()["submission_counts"] == [1, 0]
    # Not enrolled: trainer:5 signs a valid payload.
    err = rpc_error(task.url, "tenzro_training_submitOuterGradient", task.submit_params("trainer:5", 0, 0, payload))
    assert err["data"]["type"] == "NotEnrolled" and err["code"] == 1306
    # Future round.
    err = rpc_error(task.url, "tenzro_training_submitOuterGradient",
                    task.submit_params("trainer:1", 1, 0, task.payload("trainer:1", 1, 0)))
    assert err["data"]["type"] == "RoundMismatch"
    # A payload for the wrong fragment is refused by the codec.
    err = rpc_error(task.url, "tenzro_training_submitOuterGradient",
                    task.submit_params("trainer:1", 0, 1, task.payload("trainer:1", 0, 0)))
    assert err["code"] == 1400
    task.submit("trainer:0", 0, 1)
    task.submit("trainer:1", 0, 0)
    task.submit("trainer:1", 0, 1)
    # Quorum (K=2) reached but trainer:2 may still submit: finalizing now is refused.
    err = rpc_error(task.url, "tenzro_training_finalizeRound", task.finalize_params(syncer, 0))
    assert err["data"]["type"] == "StragglerWindowOpen"
    task.submit("trainer:2", 0, 0)
    task.submit("trainer:2", 0, 1)
    # Wrong signer for finalize: a trainer, then a syncer that is not the elected one.
    err = rpc_error(task.url, "tenzro_training_finalizeRound", task.finalize_params("trainer:0", 0))
    assert err["data"]["type"] == "NotSyncer"
    other = task.syncer_by_rank(view, 2)
    assert rpc_error(task.url, "tenzro_training_finalizeRound", task.finalize_params(other, 0))["data"]["type"] == "NotSyncer"
    done = task.finalize(syncer, 0)
    assert done["round"] == 0 and done["status"] == "Training" and done["syncer_rank"] == 1
    assert task.finalize(syncer, 0) == done  # replay: idempotent
    # Late: round 0 is committed (the payload it accepted, sent again; another one signed for
    # round 0 would be equivocation, tests/node/test_service.py).
    err = rpc_error(task.url, "tenzro_training_submitOuterGradient", params)
    assert err["data"]["type"] == "LateSubmission" and err["code"] == 1305

    submit_all(task, 1)
    sealed = task.finalize(syncer, 1)
    assert sealed["sealed"] and sealed["status"] == "Sealed"
    view = task.get()
    assert view["status"] == "Sealed" and view["run_root"] == sealed["run_root"]
    assert [r["syncer_rank"] for r in view["round_records"]] == [1, 1]

    reply = rpc(task.url, "tenzro_training_getReceipt", {"task_id": task.task_id})
    receipt = TrainingReceipt.from_dict(reply["receipt"])
    assert verify_receipt(receipt)
    assert "0x" + receipt.run_root.hex() == view["run_root"] == reply["run_root"]
    assert [t.accepted_submissions for t in receipt.trainers] == [ROUNDS * FRAGMENTS] * 3
    assert receipt.spec.to_dict() == receipt.spec.to_dict() and receipt.task_id == task.task_id

    # The final model file hashes to the receipt's final model hash.
    import safetensors.torch

    from tenzro_training.fragments import compute_model_hash

    model_file = node.data_dir / "models" / f"{task.task_id}.safetensors"
    assert compute_model_hash(safetensors.torch.load(model_file.read_bytes())) == receipt.final_model_hash

    # What an operator's Prometheus sees (the node is shared with other tests: at least).
    m = scrape_metrics(task.url)
    assert m["tenzro_runs"][(("status", "Sealed"),)] >= 1
    assert m["tenzro_run_events_total"][(("event", "RunSealed"),)] >= 1
    assert m["tenzro_node_payload_cache_bytes"][()] >= 0 and m["tenzro_node_model_cache_runs"][()] >= 0
    assert m["tenzro_node_model_rebuilds_total"][()] >= 0 and m["tenzro_node_replayed_rounds_total"][()] >= 0
    assert m["tenzro_node_payloads_pruned_total"][()] == 0  # an archive node
    assert m["tenzro_node_submissions_accepted_total"][(("encoding", "raw"),)] >= ROUNDS * FRAGMENTS * 3
    assert m["tenzro_node_submission_bytes_total"][(("encoding", "raw"),)] > 0
    assert m["tenzro_run_events_total"][(("event", "RoundFinalized"),)] >= ROUNDS
    requests = m["tenzro_rpc_requests_total"]
    assert requests[(("code", "0"), ("method", "tenzro_training_submitOuterGradient"))] >= ROUNDS * FRAGMENTS * 3
    assert requests[(("code", "1305"), ("method", "tenzro_training_submitOuterGradient"))] >= 1  # the late one
    finalize = (("method", "tenzro_training_finalizeRound"),)
    assert m["tenzro_rpc_request_duration_seconds_count"][finalize] >= ROUNDS
    import tenzro_training

    assert m["tenzro_node_info"][(("chain_id", str(task.chain_id)), ("version", tenzro_training.__version__))] == 1


def test_invalid_requests_get_json_rpc_errors(node: NodeProcess) -> None:
    url = node.url
    err = rpc_error(url, "tenzro_training_getRun", {"task_id": "no-such-task"})
    assert err["code"] == 1301 and err["data"]["type"] == "UnknownTask" and err["data"]["task_id"] == "no-such-task"
    err = rpc_error(url, "tenzro_training_getRun", {"task_id": "bad id!"})
    assert err["code"] == -32602 and err["data"]["param"] == "task_id"
    err = rpc_error(url, "tenzro_training_getRun", ["positional"])
    assert err["code"] == -32602
    err = rpc_error(url, "tenzro_training_submitOuterGradient",
                    {"task_id": "x", "round": -1, "fragment": 0, "payload": "AA==", "signature": "0x00"})
    assert err["code"] == -32602
    err = rpc_error(url, "tenzro_training_noSuchMethod", {})
    assert err["code"] == -32601
    status, reply = post_raw(url, b'{"jsonrpc": "2.0", "id": 1, "method": ')
    assert status == 200 and reply["error"]["code"] == -32700
    # Oversized body: a JSON-RPC error object with HTTP 413, never a 500 or plain text.
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tenzro_training_getRun",
                       "params": {"task_id": "x" * 10, "pad": "A" * (MAX_BODY_BYTES + 10)}}).encode()
    status, reply = post_raw(url, body)
    assert status == 413
    assert reply["error"]["code"] == -32600 and reply["error"]["data"]["type"] == "RequestTooLarge"
    assert reply["error"]["data"]["limit"] == MAX_BODY_BYTES
    # The node is still healthy.
    assert rpc(url, "tenzro_training_listRuns", {})["offset"] == 0


def test_equivocation_slashes_the_stake(node: NodeProcess, tiny_model: TinyModel) -> None:
    task = new_task(tiny_model, node, "e2e-equivocation")
    run_to_training(task)
    task.submit("trainer:0", 0, 0)
    other = task.submit_params("trainer:0", 0, 0, task.payload("trainer:0", 0, 0, seed=1))
    err = rpc_error(task.url, "tenzro_training_submitOuterGradient", other)
    assert err["code"] == 1311 and err["data"]["type"] == "Equivocation"
    assert err["data"]["fragment"] == 0 and err["data"]["round"] == 0
    view = task.get()
    slashed = {t["address"]: t["slashed"] for t in view["trainers"]}
    assert slashed == {task.address("trainer:0"): True, task.address("trainer:1"): False, task.address("trainer:2"): False}
    assert view["status"] == "Training" and view["submission_counts"] == [0, 0]  # its submission is dropped
    # A slashed trainer cannot submit any more; the two others carry the run (K=2).
    err = rpc_error(task.url, "tenzro_training_submitOuterGradient",
                    task.submit_params("trainer:0", 0, 1, task.payload("trainer:0", 0, 1)))
    assert err["data"]["type"] == "NotEnrolled"
    syncer = task.syncer_by_rank(view, 1)
    for round_ in range(ROUNDS):
        submit_all(task, round_, ("trainer:1", "trainer:2"))
        task.finalize(syncer, round_)  # every unslashed trainer submitted: the set is closed
    receipt = TrainingReceipt.from_dict(rpc(task.url, "tenzro_training_getReceipt", {"task_id": task.task_id})["receipt"])
    assert verify_receipt(receipt)
    by_address = {"0x" + t.address.hex(): t for t in receipt.trainers}
    slashed_trainer = by_address[task.address("trainer:0").lower()]
    assert slashed_trainer.slashed and slashed_trainer.accepted_submissions == 0
    # The evidence is attested: a third party checks the slashing offline, from the node's answer.
    checked = tenzro("train", "verify-receipt", "--task-id", task.task_id, "--rpc", task.url, "--json")
    assert checked.code == 0, checked.err
    checks = {c["name"]: c for c in checked.json()["checks"]}
    assert checks["slashings"]["ok"] and checks["slashings"]["detail"].startswith("1 slashed")
    # And recomputes the run from the node's URL: the slashed trainer's dropped submission is
    # in no record, so only the other two trainers' payloads are fetched and replayed.
    checked = tenzro("train", "verify-run", "--task-id", task.task_id, "--rpc", task.url, "--json")
    assert checked.code == 0 and checked.json()["ok"], checked.out + checked.err
    payloads = {c["name"]: c["detail"] for c in checked.json()["checks"]}["payloads"]
    assert payloads.startswith(f"{2 * FRAGMENTS * ROUNDS} accepted payload(s)"), payloads


def test_cancel_refunds_the_escrow(node: NodeProcess, tiny_model: TinyModel) -> None:
    from tenzro_training.node.dev import DEV_BALANCE

    # The pool is 60% of the sponsor's dev balance: a second such task can only be escrowed if
    # the first one's escrow came back.
    pool = str(DEV_BALANCE * 6 // 10)
    first = new_task(tiny_model, node, "e2e-cancel-a", reward_pool=pool)
    first.post()
    first.wait_status("Enrolling")
    first.enroll("trainer:3")
    err = rpc_error(first.url, "tenzro_training_cancelTask", first.cancel_params("trainer:3"))
    assert err["data"]["type"] == "NotSponsor"
    second = new_task(tiny_model, node, "e2e-cancel-b", reward_pool=pool)
    err = rpc_error(second.url, "tenzro_training_postTask", second.post_params())
    assert err["data"]["type"] == "InsufficientBalance"
    cancelled = rpc(first.url, "tenzro_training_cancelTask", first.cancel_params())
    assert cancelled["status"] == "Cancelled"
    assert rpc(first.url, "tenzro_training_cancelTask", first.cancel_params())["status"] == "Cancelled"  # replay
    assert first.get()["status"] == "Cancelled"
    assert second.post()["task_id"] == "e2e-cancel-b"  # the refund made room for the same pool
    err = rpc_error(first.url, "tenzro_training_enrollTrainer", first.enroll_params("trainer:4"))
    assert err["data"]["type"] == "InvalidState"
    rpc(second.url, "tenzro_training_cancelTask", second.cancel_params())  # leave the balance for other tests


def test_failover_to_the_rank_2_syncer_run_by_the_daemon(
    node_factory: Callable[..., NodeProcess], tiny_model: TinyModel, tmp_path: Path
) -> None:
    fast = node_factory("failover", timings={"finalize_window_ms": 3000})
    task = new_task(tiny_model, fast, "e2e-failover", grace_window_ms=300)
    view = run_to_training(task)
    rank1, rank2 = task.syncer_by_rank(view, 1), task.syncer_by_rank(view, 2)
    # stdout to a file, read while the daemon runs: the run shows Sealed as soon as the node
    # commits round 1, before the daemon has its answer and says so, and a SIGINT then ends the
    # call in progress (the daemon stops at once) without the line.
    stdout_path = tmp_path / "daemon.out"

    def finalized_lines() -> list[str]:
        return [line for line in stdout_path.read_text().splitlines() if " finalized e2e-failover round " in line]

    with stdout_path.open("w") as stdout:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "tenzro_training.cli", "syncer", "run", "--key-file",
             str(fast.data_dir / "dev-accounts.json"), "--account", rank2, "--rpc", fast.url, "--poll-interval", "0.1"],
            cwd=REPO, env=_child_env(), stdout=stdout, stderr=subprocess.PIPE, text=True,
        )
    try:
        submit_all(task, 0)
        # Rank 1 stays silent: after the finalize window the node hands the run to rank 2, whose
        # daemon finalizes round 0 and then round 1.
        view = task.wait_for(lambda v: v["round"] >= 1, "round 0 finalized by the failover syncer", timeout=60)
        assert view["syncer"] == task.address(rank2) and view["syncer_rank"] == 2
        (failover,) = view["failovers"]
        assert failover["round"] == 0 and failover["from_rank"] == 1 and failover["to_rank"] == 2
        assert failover["from_syncer"] == task.address(rank1) and failover["to_syncer"] == task.address(rank2)
        # Rank 1 waking up late is no longer the syncer.
        err = rpc_error(task.url, "tenzro_training_finalizeRound", task.finalize_params(rank1, 1))
        assert err["data"]["type"] == "NotSyncer"
        submit_all(task, 1)
        view = task.wait_status("Sealed", timeout=60)
        deadline = time.monotonic() + 30
        while len(finalized_lines()) < 2 and time.monotonic() < deadline and daemon.poll() is None:
            time.sleep(0.05)
    finally:
        daemon.send_signal(signal.SIGINT)
        _, err_text = daemon.communicate(timeout=30)
    out = stdout_path.read_text()
    assert daemon.returncode == 0, err_text
    assert "Traceback" not in err_text
    assert [r["syncer_rank"] for r in view["round_records"]] == [2, 2]
    assert [r["syncer"] for r in view["round_records"]] == [task.address(rank2)] * 2
    finalized = finalized_lines()
    assert len(finalized) == 2, out
    receipt = TrainingReceipt.from_dict(rpc(task.url, "tenzro_training_getReceipt", {"task_id": task.task_id})["receipt"])
    assert verify_receipt(receipt) and ["0x" + s.hex() for s in receipt.syncers] == [task.address(rank2).lower()]
    # Rounds finalized by the failover syncer recompute like any other.
    checked = tenzro("train", "verify-run", "--task-id", task.task_id, "--rpc", task.url)
    assert checked.code == 0, checked.out + checked.err


def _kill_run_steps(task: Task, syncer_of: Callable[[], str]) -> list[Callable[[], Any]]:
    """The same calls, in the same order, for the killed run and the uninterrupted reference."""
    steps: list[Callable[[], Any]] = []
    steps += [lambda who=who, f=f: task.submit(who, 0, f) for who in TRAINERS for f in range(FRAGMENTS)]
    steps.append(lambda: task.finalize(syncer_of(), 0))
    steps += [lambda: task.submit("trainer:0", 1, 0), lambda: task.submit("trainer:0", 1, 1), lambda: task.submit("trainer:1", 1, 0)]
    return steps


def _finish_kill_run(task: Task, syncer: str) -> dict[str, Any]:
    task.submit("trainer:1", 1, 1)
    task.submit("trainer:2", 1, 0)
    task.submit("trainer:2", 1, 1)
    task.finalize(syncer, 1)
    return rpc(task.url, "tenzro_training_getReceipt", {"task_id": task.task_id})


def test_sigkill_mid_round_loses_nothing_and_seals_the_same_receipt(
    node: NodeProcess, node_factory: Callable[..., NodeProcess], tiny_model: TinyModel
) -> None:
    # The reference: an uninterrupted run on the shared node.
    ref = new_task(tiny_model, node, "e2e-kill")
    ref_view = run_to_training(ref)
    for step in _kill_run_steps(ref, lambda: ref.syncer_by_rank(ref_view, 1)):
        step()
    expected = _finish_kill_run(ref, ref.syncer_by_rank(ref_view, 1))

    # The same task on its own node, killed mid-round after some acknowledged submissions. It
    # keeps every payload and model fragment in a file of its own (docs/storage.md "Large
    # values"; the default keeps this tiny model's values in RocksDB): the receipt, the audit
    # beside the running node, the backup and the export must not see the difference.
    victim = node_factory("kill", external_value_bytes=1)
    task = new_task(tiny_model, victim, "e2e-kill")
    assert task.spec == ref.spec
    view = run_to_training(task)
    syncer = task.syncer_by_rank(view, 1)
    assert syncer == ref.syncer_by_rank(ref_view, 1)  # the election is reproducible
    for step in _kill_run_steps(task, lambda: syncer):
        step()
    before = task.get()
    assert before["round"] == 1 and before["submission_counts"] == [2, 1]
    victim.proc.send_signal(signal.SIGKILL)
    assert victim.proc.wait(timeout=30) == -signal.SIGKILL

    values = victim.data_dir / "db" / "values"
    assert len(list(values.iterdir())) >= 3  # the round-0 weights and the 3 acknowledged payloads
    restarted = node_factory("kill", data_dir=victim.data_dir, external_value_bytes=1)
    task.url = restarted.url
    after = task.get()
    for key in ("status", "round", "submission_counts", "trainers", "round_records", "model_hash", "syncer", "election"):
        assert after[key] == before[key], key
    # Acknowledged submissions survived: replays are no-ops, a different payload is equivocation.
    assert task.submit("trainer:0", 1, 0)["accepted_count"] == 2
    got = _finish_kill_run(task, syncer)
    assert receipt_without_sealed_at(got) == receipt_without_sealed_at(expected)
    assert got["run_root"] == expected["run_root"]
    # The store the killed node left behind still reproduces every committed round from the
    # checkpoint, audited read-only while the restarted node holds it.
    r = tenzro("audit", "--data-dir", str(restarted.data_dir), "--json")
    assert r.code == 0, r.out + r.err
    [audited] = r.json()["runs"]
    assert audited["ok"] and audited["status"] == "Sealed" and audited["rounds_replayed"] == audited["rounds_committed"]
    assert audited["checks"][-3:] == ["run root and receipt", "sealed record", "ended summary"]
    assert not [p for p in values.iterdir() if p.name.startswith(".reader-")]  # the audit's links are gone
    # A hot backup (SIGUSR1) of the running node: a whole data dir that audits the same.
    restarted.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while "backup written to" not in restarted.stderr() and time.monotonic() < deadline:
        time.sleep(0.1)
    [backup] = list((restarted.data_dir / "backups").iterdir())
    assert f"backup written to {backup}" in restarted.stderr() and backup.name.startswith("backup-")
    r = tenzro("audit", "--data-dir", str(backup), "--json")
    assert r.code == 0, r.out + r.err
    assert r.json()["runs"] == [audited]
    assert task.get()["status"] == "Sealed"  # the node went on serving
    # A third party recomputes the run the killed node sealed from its URL alone.
    checked = tenzro("train", "verify-run", "--task-id", "e2e-kill", "--rpc", restarted.url)
    assert checked.code == 0, checked.out + checked.err
    assert restarted.stop() == 0
    # With the node stopped and its model file gone, export-model reads the stored final weights.
    (restarted.data_dir / "models" / "e2e-kill.safetensors").unlink()
    out = restarted.data_dir.parent / "exported.safetensors"
    r = tenzro("train", "export-model", "--task-id", "e2e-kill", "--data-dir", str(restarted.data_dir), "--out", str(out), "--json")
    assert r.code == 0, r.err
    assert r.json()["model_hash"] == got["receipt"]["final_model_hash"]


def test_clean_shutdown_and_startup_failures(node_factory: Callable[..., NodeProcess], tmp_path: Path) -> None:
    first = node_factory("lifecycle")
    assert rpc(first.url, "tenzro_training_listRuns", {})["runs"] == []
    # A second node on the same data dir: the store is locked -> one line on stderr, exit 2.
    cfg = write_config(tmp_path / "second.json")
    proc = subprocess.run(node_command(first.data_dir, cfg), cwd=REPO, env=_child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "already open" in proc.stderr and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.startswith("tenzro:")]) == 1
    # SIGTERM: clean exit 0, no traceback.
    assert first.stop(signal.SIGTERM) == 0
    assert "Traceback" not in first.stderr()
    # SIGINT on a restarted node: the same.
    again = node_factory("lifecycle", data_dir=first.data_dir)
    assert again.stop(signal.SIGINT) == 0
    assert "Traceback" not in again.stderr()
    assert f"tenzro node {__version__} up: chain_id=1337" in again.stderr() and "runs=0 (none)" in again.stderr()
    assert re.search(r" p2p=off start=\d+\.\d\ds\n", again.stderr())  # what TimeoutStartSec must cover
    # SIGHUP (the terminal closed): the same, not exit 129 with the store left open. This one
    # logs JSON (--log-format json): every stderr line is one object a log collector can parse.
    with sighup_at_default_in_children():  # not ignored, even when this test runs under nohup
        third = node_factory("lifecycle", data_dir=first.data_dir, extra_args=("--log-format", "json"))
    assert third.stop(signal.SIGHUP) == 0
    logged = [json.loads(line) for line in third.stderr().splitlines()]
    assert [r["message"] for r in logged if r["logger"] == "tenzro.node"][-1] == "shutting down"
    assert any(r["message"].startswith(f"tenzro node {__version__} up: chain_id=1337") for r in logged)
    assert all(r["level"] in ("INFO", "WARNING") and r["time"].endswith("Z") and "exception" not in r for r in logged)

    # A bad config file.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"timings": {"election_window_ms": 0}}))
    proc = subprocess.run(node_command(tmp_path / "d2", bad), cwd=REPO, env=_child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "election_window_ms" in proc.stderr and "Traceback" not in proc.stderr
    bad.write_text("{not json")
    proc = subprocess.run(node_command(tmp_path / "d2", bad), cwd=REPO, env=_child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr

    # A store written by a newer schema version.
    from storage import schema
    from storage.rocks import RocksStore

    with RocksStore(first.data_dir / "db") as store:
        with store.atomic_batch() as batch:
            batch.put(schema.CF_META, schema.SCHEMA_VERSION_KEY, schema.encode_schema_version(schema.SCHEMA_VERSION + 1))
    proc = subprocess.run(node_command(first.data_dir, cfg), cwd=REPO, env=_child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "newer version" in proc.stderr and "Traceback" not in proc.stderr


def test_the_shipped_dev_example_posts_as_docs_cli_md_shows(node: NodeProcess, tmp_path: Path) -> None:
    """docs/cli.md's sponsor flow, literally, on a --dev node: example-spec, init-checkpoint on
    it, then post-task as the dev sponsor. The only example shipped before was the
    SPEC's (another sponsor, 1,024 rounds, an ipfs:// dataset no trainer reads): nothing an
    operator could post without editing it (docs probe)."""
    example = tmp_path / "dev-task.json"
    r = tenzro("train", "example-spec", "--out", str(example))
    assert r.code == 0, r.err
    spec_out = tmp_path / "spec.json"
    r = tenzro("train", "init-checkpoint", "--spec", str(example), "--out", str(tmp_path / "init.safetensors"),
               "--spec-out", str(spec_out))
    assert r.code == 0 and r.err == "", r.err  # no note: its param_count is its model's
    r = tenzro("train", "post-task", "--spec", str(spec_out), "--key-file", str(node.data_dir / "dev-accounts.json"),
               "--account", "sponsor", "--rpc", node.url, "--json")
    assert r.code == 0, r.err
    assert r.json()["task_id"] == "dev-timesfm-1"
    assert rpc(node.url, "tenzro_training_getRun", {"task_id": "dev-timesfm-1"})["status"] in ("Electing", "Enrolling")


def test_sigusr1_during_shutdown_does_not_kill_the_node(node_factory: Callable[..., NodeProcess]) -> None:
    # Backup probe: the shutdown removed SIGUSR1's handler with the stop signals, which put back
    # its default action (end the process): a backup request while the node stopped killed it
    # with signal 10 instead of a clean exit 0.
    proc = node_factory("usr1-shutdown")
    proc.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while proc.proc.poll() is None and time.monotonic() < deadline:
        try:
            proc.proc.send_signal(signal.SIGUSR1)
        except ProcessLookupError:
            break
        time.sleep(0.002)
    assert proc.proc.wait(timeout=30) == 0, proc.stderr()
    assert "Traceback" not in proc.stderr()


def test_the_node_process_tells_systemd_it_is_ready_alive_and_stopping(tmp_path: Path) -> None:
    """A real ``tenzro node`` under Type=notify and WatchdogSec=0.4 s, as systemd would start it."""
    from tests.node.test_sdnotify import read_datagrams

    name = f"tenzro-test-{secrets.token_hex(8)}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(30)
    node_dir = tmp_path / "d"
    node = start_node(node_dir, write_config(tmp_path / "c.json"), env={"NOTIFY_SOCKET": "@" + name,
                                                                         "WATCHDOG_USEC": "400000"})
    try:
        got = []
        while b"READY=1" not in b"".join(got):
            got.append(sock.recv(4096))
        assert got[:2] == [b"STATUS=opening the store", b"STATUS=reading the store's runs"]
        assert got[-1] == f"READY=1\nSTATUS=listening on {node.url.rstrip('/')}, 0 runs".encode()
        assert [sock.recv(4096) for _ in range(3)] == [b"WATCHDOG=1"] * 3  # 0.2 s apart
        assert node.stop() == 0, node.stderr()
        rest = read_datagrams(sock, 0.5)
        assert b"STOPPING=1\nSTATUS=stopping" in rest
        assert set(rest) <= {b"WATCHDOG=1", b"STOPPING=1\nSTATUS=stopping"}
    finally:
        node.stop()
        sock.close()
