"""Compressed runs with REAL OS processes on 127.0.0.1: a ``tenzro node --dev`` with gossip on,
the syncer daemon and three ``tenzro trainer run`` processes carry a Mean run whose spec selects
``{"topk": {"density_bps": 1000}}``, or ``{"q8": {"block_size": 64}}``, to Sealed. Every trainer
sends compressed payloads with error feedback (10% of each fragment's values; or every value as
an int8 with a scale per 64), the node accepts and aggregates them, and a third party's
``verify-run`` recomputes every committed value from the stored payloads. Trainer 2 stops after
round 0 and is restarted: it resumes its error feedback from its state directory. Trainer 1 runs
``--device auto``: on a GPU machine, one run mixes CPU and GPU trainers."""

from __future__ import annotations

import json
import struct
import urllib.request
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tenzro_training.compression import PayloadEncoding
from tenzro_training.receipt import TrainingReceipt, verify_receipt
from tests.e2e.conftest import Child, TinyModel, rpc, start_gossip_run, tenzro

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 120.0
ENCODINGS = {
    "topk": ({"topk": {"density_bps": 1000}}, "topk 10%"),
    "q8": ({"q8": {"block_size": 64}}, "q8 (blocks of 64)"),
}


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_a_compressed_run_seals_and_verifies(tmp_path: Path, tiny_model: TinyModel, name: str) -> None:
    encoding, described = ENCODINGS[name]
    children: list[Child] = []
    node, task, trainers = start_gossip_run(tmp_path, tiny_model, f"{name}-run", children,
                                            metadata={"outer_gradient_encoding": encoding},
                                            devices=("cpu", "auto", "cpu"), trainer_args=((), (), ("--rounds", "1")))
    try:
        # Trainer 2 trains round 0 only and is restarted: it resumes its error feedback from disk.
        assert trainers[2].wait(RUN_TIMEOUT_S) == 0, f"{trainers[2].name}:\n{trainers[2].err()[-4000:]}"
        assert "stopping after 1 rounds" in trainers[2].out()
        assert trainers[2].argv[-2:] == ["--rounds", "1"]
        restarted = Child("trainer2-restart", trainers[2].argv[:-2], tmp_path)  # the same command, every round
        children.append(restarted)
        for child in (trainers[0], trainers[1], restarted):
            assert child.wait(RUN_TIMEOUT_S) == 0, f"{child.name}:\n{child.out()}\n{child.err()[-4000:]}"
        for child in (*trainers, restarted):
            assert (f"outer gradients sent as {described} of each fragment, with error feedback decayed by 0.95 "
                    "each round" in child.out())
        assert "error feedback resumed from round 0's saved state" in restarted.out(), restarted.out()
        assert "round 1 submitted 2 fragments" in restarted.out()
        # Sealed: nothing of the run is left in the trainers' state directories.
        assert not list((tmp_path / "tenzro-trainer-state").glob("task-*/*/feedback-round-*"))
        assert not list((tmp_path / "tenzro-trainer-state").glob("task-*/*/round-*.payload"))
        # Trainer 1 runs --device auto: the GPU where there is one (docs/trainer.md, GPU check).
        assert f"inner loop on {'cuda' if torch.cuda.is_available() else 'cpu'}" in trainers[1].out()

        view = task.get()
        assert view["status"] == "Sealed" and len(view["round_records"]) == 2
        receipt = TrainingReceipt.from_dict(rpc(node.url, "tenzro_training_getReceipt", {"task_id": task.task_id})["receipt"])
        assert verify_receipt(receipt)
        assert sorted(t.accepted_submissions for t in receipt.trainers) == [4, 4, 4]

        # What travelled: topk payloads of exactly k values, or q8 payloads of a byte per value
        # and a scale per 64, a fraction of the raw size.
        ks = PayloadEncoding.from_json(encoding).kept_per_fragment(task.layouts)
        for record in view["round_records"]:
            for f, fragment in enumerate(record["fragments"]):
                for trainer in fragment["accepted"]:
                    url = f"{node.url.rstrip('/')}/artifacts/v1/runs/{task.task_id}/payloads/{record['round']}/{f}/{trainer}"
                    with urllib.request.urlopen(url, timeout=30) as answer:
                        data = answer.read()
                    n = struct.unpack("<Q", data[:8])[0]
                    header = json.loads(data[8 : 8 + n])
                    assert header["__metadata__"]["tenzro.encoding"] == name
                    if name == "topk":
                        assert header["indices"]["shape"] == [ks[f]]
                    else:
                        numel = task.layouts[f].numel
                        assert header["values"] == {"dtype": "I8", "shape": [numel],
                                                    "data_offsets": [4 * -(-numel // 64), 4 * -(-numel // 64) + numel]}
                    assert len(data) < 8 + n + 4 * task.layouts[f].numel // 3

        # The model moved, and a third party recomputes it all from the node's URL.
        initial = load_file(str(tiny_model.checkpoint))
        final = load_file(str(node.data_dir / "models" / f"{task.task_id}.safetensors"))
        moved = max(float((final[name].float() - initial[name].float()).abs().max()) for name in initial)
        assert 0 < moved < 1.0, moved
        checked = tenzro("train", "verify-run", "--task-id", task.task_id, "--rpc", node.url, "--json")
        assert checked.code == 0 and checked.json()["ok"], checked.out + checked.err
    finally:
        for child in children:
            child.stop()
        assert node.stop() == 0, node.stderr()[-4000:]
        for child in children:
            assert "Traceback" not in child.err(), f"{child.name}:\n{child.err()[-4000:]}"
