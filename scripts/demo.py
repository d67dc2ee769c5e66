"""End-to-end demo on the embedded default: a real node, a real run, real data, a verified receipt.

What it does (and prints as it goes):
1. starts a real ``tenzro node --dev`` process (RocksDB in a temp dir, JSON-RPC on a free port);
2. creates a small TimesFM-class patch transformer's initial checkpoint and a task spec whose
   dataset is real timeseries shipped inside statsmodels (co2, sunspots, nile, elnino, ...);
3. the dev sponsor posts the task over JSON-RPC (EIP-712 signed; the pool is escrowed); the node
   runs the RFC 9381 VRF syncer election over its dev syncer candidates;
4. three dev trainers enroll, and for every round each runs H inner AdamW steps on its own data
   shard and submits one signed outer gradient per fragment;
5. the elected syncer finalizes each round; the node aggregates with the task's rule and applies
   the outer Nesterov step. The trainers independently recompute the new global model from the
   same payloads and check its hash against the one the node committed;
6. after the last round the node seals a TrainingReceipt; the demo recomputes the Merkle run root
   from the receipt, proves one round record's inclusion, and shows the payouts and validation loss;
7. a third party (``tenzro train verify-run``, no key, no data dir) recomputes the whole run from
   the node's URL: the receipt's signatures, then every round from the downloaded signed payloads.

Run it with ``scripts/demo`` (which installs what it needs first).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tenzro_training import auth
from tenzro_training.addresses import parse_address
from tenzro_training.cli.client import RpcClient
from tenzro_training.global_model import compute_full_state, compute_initial_model, compute_round_update
from tenzro_training.merkle import inclusion_proof, merkle_root, run_root, verify_inclusion
from tenzro_training.outer import compute_initial_momentum
from tenzro_training.payload import compute_payload_hash
from tenzro_training.receipt import TrainingReceipt
from tenzro_training.records import compute_run_leaves
from tenzro_training.spec import TrainingTaskSpec
from tenzro_training.trainer.data import (
    DEFAULT_DATASET_REF,
    compute_dataset_hash,
    load_corpus,
    shard_windows,
    validation_batch,
)
from tenzro_training.trainer import TrainerError
from tenzro_training.trainer.inner import (
    InnerConfig,
    compute_outer_gradients,
    evaluate,
    make_payloads,
    resolve_device,
    run_inner_loop,
)
from tenzro_training.trainer.model import PatchTransformerConfig, create_init_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parent.parent


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_node(data_dir: Path, port: int) -> subprocess.Popen[str]:
    config = data_dir / "node-config.json"
    # Short windows so the demo runs in seconds; a production node uses minutes.
    config.write_text(json.dumps({"timings": {"election_window_ms": 500, "enrollment_window_ms": 60_000,
                                              "round_timeout_ms": 600_000, "finalize_window_ms": 60_000,
                                              "min_stake": "0"}}))
    cmd = [sys.executable, "-m", "tenzro_training.cli", "node", "--dev", "--data-dir", str(data_dir),
           "--rpc-port", str(port), "--config", str(config)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"node exited early (status {proc.wait()})")
        if "listening" in line:
            say(line.strip())
            return proc
    raise SystemExit("node did not start within 60 s")


def wait_status(client: RpcClient, task_id: str, wanted: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.call("tenzro_training_getRun", {"task_id": task_id})
        if run["status"] == wanted:
            return run
        time.sleep(0.1)
    raise SystemExit(f"run did not reach {wanted} within {timeout} s")


def sign(msg: auth.SignedMessageType, key: str, chain_id: int) -> str:
    return "0x" + auth.sign_message(msg, bytes.fromhex(key[2:]), chain_id).hex()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inner-steps", type=int, default=16)
    ap.add_argument("--keep", action="store_true", help="keep the node's data dir")
    ap.add_argument("--device", default="cpu",
                    help="where the trainers' inner loops run: cpu (default: the printed hashes are reproducible), "
                         "cuda, cuda:N, mps or auto")
    args = ap.parse_args()
    try:
        resolve_device(args.device)  # before the node starts: a missing GPU is a one-line error
    except TrainerError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    torch.manual_seed(0)

    work = Path(tempfile.mkdtemp(prefix="tenzro-demo-"))
    data_dir = work / "node"
    data_dir.mkdir()
    port = free_port()
    node = start_node(data_dir, port)
    client = RpcClient(f"http://127.0.0.1:{port}")
    try:
        return run_demo(client, data_dir, work, args)
    finally:
        node.terminate()
        node.wait(timeout=30)
        say(f"node stopped (exit {node.returncode}); data dir {data_dir}" + ("" if args.keep else " removed"))
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)


def run_demo(client: RpcClient, data_dir: Path, work: Path, args: argparse.Namespace) -> int:
    accounts = json.loads((data_dir / "dev-accounts.json").read_text())
    chain_id = int(accounts["chain_id"])
    by_role: dict[str, list[dict[str, Any]]] = {}
    for acct in accounts["accounts"]:
        by_role.setdefault(acct["role"], []).append(acct)
    sponsor, trainers, syncers = by_role["sponsor"][0], by_role["trainer"][:3], by_role["syncer"]

    # --- the model and the data ------------------------------------------------------------
    model_cfg = PatchTransformerConfig(context_len=64, horizon=16, patch_len=16, d_model=32, n_layers=2, n_heads=4, d_ff=64)
    init_state = create_init_checkpoint(model_cfg, seed=0)
    ckpt_path = work / "init.safetensors"
    ckpt_sha = save_checkpoint(init_state, ckpt_path)
    corpus = load_corpus(DEFAULT_DATASET_REF)
    params = sum(t.numel() for t in init_state.values())
    say(f"model: TimesFM-class patch transformer, {params} parameters; data: {len(corpus)} real series "
        f"({sum(s.values.size for s in corpus)} points) from {DEFAULT_DATASET_REF}")

    template = json.loads((ROOT / "tenzro_training/data/timesfm-200m-task.json").read_text())
    template.update(
        task_id=f"demo-timesfm-{int(time.time())}",
        sponsor_address=sponsor["address"],
        trainer_count=3, quorum=2, inner_steps=args.inner_steps, max_rounds=args.rounds,
        grace_window_ms=200, reward_pool=str(10**21), aggregation="CoordinateMedian",
        dataset_ref=DEFAULT_DATASET_REF, dataset_hash="0x" + compute_dataset_hash(corpus).hex(),
        created_at=int(time.time()),
    )
    template["architecture"].update(
        param_count=params, fragment_count=4, dtype="fp32",
        metadata={"context_len": 64, "horizon": 16, "patch_len": 16, "d_model": 32, "n_layers": 2,
                  "n_heads": 4, "d_ff": 64, "inner_lr": 0.001,
                  "init_checkpoint": {"uri": ckpt_path.as_uri(), "sha256": ckpt_sha}},
    )
    spec = TrainingTaskSpec.from_dict(template)
    task_id = spec.task_id

    # --- sponsor posts; the node elects a syncer ---------------------------------------------
    sig = sign(auth.PostTask(task_id=task_id, spec_hash=spec.spec_hash()), sponsor["private_key"], chain_id)
    posted = client.call("tenzro_training_postTask", {"spec": spec.to_dict(), "signature": sig})
    say(f"sponsor {sponsor['address']} posted {task_id} (spec hash {posted['spec_hash']}); "
        f"reward pool {spec.reward_pool} attoTNZO escrowed")
    run = wait_status(client, task_id, "Enrolling")
    say(f"VRF election over {len(run['election']['ranking'])} candidates: syncer {run['syncer']} "
        f"(rank order {[e['address'][:10] for e in run['election']['ranking']]})")
    syncer_key = next(s["private_key"] for s in syncers if s["address"].lower() == run["syncer"].lower())

    # --- trainers enroll ------------------------------------------------------------------------
    stake = 10**20
    for i, t in enumerate(trainers):
        did = f"did:tenzro:machine:demo-trainer-{i}"
        msg = auth.EnrollTrainer(task_id=task_id, did=did, trainer=parse_address(t["address"]), stake=stake)
        client.call("tenzro_training_enrollTrainer", {"task_id": task_id, "did": did, "address": t["address"],
                                                      "stake": str(stake), "signature": sign(msg, t["private_key"], chain_id)})
    run = wait_status(client, task_id, "Training")
    shard_of = {t["address"].lower(): t["shard"] for t in run["trainers"]}
    say(f"3 trainers enrolled with {stake} attoTNZO stake each; training started")

    # --- rounds ---------------------------------------------------------------------------------
    # Trainers hold the same global model as the node: the init checkpoint (fp32), split into the
    # spec's F fragments by the one deterministic layout function, updated each round by the same
    # pure round update the node runs (tenzro_training.global_model).
    model = compute_initial_model({k: v.float() for k, v in init_state.items()}, spec.architecture.fragment_count)
    assert "0x" + model.model_hash.hex() == run["initial_model_hash"], "trainer and node disagree on the init model"
    layouts, weights = model.model.layouts, list(model.weights)
    momentum = [compute_initial_momentum(lay.numel) for lay in layouts]
    inner_cfg = InnerConfig.from_spec(spec, batch_size=16)
    shards = {a: shard_windows(corpus, s, 3, 64, 16) for a, s in shard_of.items()}
    val = validation_batch(corpus, 64, 16)
    global_state = compute_full_state(model.model, weights)
    loss0 = evaluate(global_state, model_cfg, val)
    say(f"validation MSE of the initial model: {loss0:.4f}")
    for r in range(spec.max_rounds):
        payloads: dict[bytes, list[bytes]] = {}
        # The trainers run side by side in a real run; here one after another, so every one
        # trains first and then all submit: submitting as each finishes would let the first K
        # open the grace window (200 ms) while the last one is still training, and the node
        # would rightly refuse it as late.
        for t in trainers:
            addr = t["address"].lower()
            result = run_inner_loop(global_state, inner_cfg, model_cfg, shards[addr], r, shard_of[addr],
                                    device=args.device)
            grads = compute_outer_gradients(global_state, result.state, layouts)
            payloads[parse_address(t["address"])] = make_payloads(task_id, r, layouts, grads, "float32")
        for t in trainers:
            for f, payload in enumerate(payloads[parse_address(t["address"])]):
                msg = auth.SubmitOuterGradient(task_id=task_id, round=r, fragment=f, payload_hash=compute_payload_hash(payload))
                client.call("tenzro_training_submitOuterGradient", {
                    "task_id": task_id, "round": r, "fragment": f,
                    "payload": base64.b64encode(payload).decode(), "signature": sign(msg, t["private_key"], chain_id)})
        fin = client.call("tenzro_training_finalizeRound", {
            "task_id": task_id, "round": r, "signature": sign(auth.FinalizeRound(task_id=task_id, round=r), syncer_key, chain_id)})
        # Every trainer recomputes the new global model from the same inputs and checks the hash.
        order = sorted(payloads)
        inputs = [[(a, payloads[a][f]) for a in order] for f in range(len(layouts))]
        update = compute_round_update(spec, model.model, r, inputs, weights, momentum, max_payload_bytes=1 << 26)
        weights, momentum = list(update.weights), list(update.momentum)
        global_state = compute_full_state(model.model, weights)
        local_hash = "0x" + update.model_hash.hex()
        ok = "matches" if local_hash == fin["model_hash"] else "DOES NOT MATCH"
        say(f"round {r}: 3 trainers x {len(layouts)} fragments submitted; syncer finalized; "
            f"global model {fin['model_hash'][:18]}... ({ok} the trainers' own recomputation); "
            f"validation MSE {evaluate(global_state, model_cfg, val):.4f}")
        if local_hash != fin["model_hash"]:
            return 1

    # --- the sealed receipt ---------------------------------------------------------------------
    rec = client.call("tenzro_training_getReceipt", {"task_id": task_id})
    receipt = TrainingReceipt.from_dict(rec["receipt"])
    leaves = compute_run_leaves(receipt.spec.canonical_bytes(), receipt.transcript, receipt.final_record)
    root = run_root(leaves)
    say(f"sealed: run root {receipt.run_root.hex()}; recomputed from the receipt: "
        f"{'equal' if root == receipt.run_root else 'DIFFERENT'}")
    proof = inclusion_proof(leaves, 1)
    say(f"round 0's record is leaf 1 of {len(leaves)}; its RFC 6962 audit path ({len(proof)} hashes) verifies: "
        f"{verify_inclusion(leaves[1], 1, len(leaves), proof, merkle_root(leaves))}")
    for t in receipt.trainers:
        say(f"  trainer {t.address.hex()[:10]}... accepted submissions {t.accepted_submissions}")
    final = client.call("tenzro_training_getRun", {"task_id": task_id})
    say(f"final model hash {receipt.final_model_hash.hex()}; validation MSE {loss0:.4f} -> "
        f"{evaluate(global_state, model_cfg, val):.4f} after {spec.max_rounds} DiLoCo rounds; status {final['status']}")

    # --- a third party recomputes the run from the node's URL alone ---------------------------
    # No key, no data dir: the receipt, the checkpoint, every signed payload and the final model
    # come from the node's RPC port, each checked against a committed hash (docs/cli.md).
    checked = subprocess.run(
        [sys.executable, "-m", "tenzro_training.cli", "train", "verify-run", "--task-id", task_id,
         "--rpc", client.url, "--json"], capture_output=True, text=True, timeout=300)
    try:
        report = json.loads(checked.stdout)
    except ValueError:
        report = {"ok": False, "checks": []}
    passed = [c["name"] for c in report["checks"] if c["ok"]]
    failed = [c["name"] for c in report["checks"] if not c["ok"]]
    say(f"verify-run (a third party, from the node's URL alone): {len(passed)} checks ok"
        + (f", FAILED: {', '.join(failed) or checked.stderr.strip()}" if not report["ok"] else
           f", {len(receipt.transcript)} rounds recomputed from the signed payloads, final model file byte-identical"))
    return 0 if root == receipt.run_root and report["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
