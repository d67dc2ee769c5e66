"""Valid receipts of any shape, built directly from records (no node run): for the size bound
and for claiming receipts as large as a node's ``max_receipt_bytes`` allows, which a real run
would take minutes to produce. Every receipt built here passes ``receipt.verify_receipt``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tenzro_training.merkle import run_root
from tenzro_training.receipt import ReceiptTrainer, TrainingReceipt, compute_accepted_counts, compute_syncers
from tenzro_training.receipt_abi import MAX_DID_BYTES
from tenzro_training.records import FinalModelRecord, FragmentOutcome, RoundRecord, compute_run_leaves
from tenzro_training.rules import RuleKind
from tenzro_training.spec import TrainingTaskSpec

EXAMPLE_SPEC: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[1] / "tenzro_training" / "data" / "timesfm-200m-task.json").read_text()
)


def _h(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def synthetic_spec(rounds: int, fragments: int, trainers: int, **changes: Any) -> TrainingTaskSpec:
    """The example spec (Mean) with this shape; ``changes`` override top-level fields."""
    doc = json.loads(json.dumps(EXAMPLE_SPEC))
    doc.update(max_rounds=rounds, trainer_count=trainers, quorum=min(trainers, 2), **changes)
    doc["architecture"]["fragment_count"] = fragments
    return TrainingTaskSpec.from_dict(doc)


def synthetic_receipt(spec: TrainingTaskSpec, *, worst_case: bool = False) -> TrainingReceipt:
    """A sealed-looking receipt of ``spec`` (Mean). ``worst_case``: every round accepts every
    trainer in every fragment, every DID is as long as the grammar allows and every round has its
    own syncer, the receipt ``compute_receipt_size_bound`` describes; otherwise the accepted sets
    rotate between the quorum and all trainers, with short DIDs and one syncer."""
    m, k = spec.trainer_count, spec.quorum
    addresses = sorted(hashlib.sha256(f"synthetic-trainer/{i}".encode()).digest()[:20] for i in range(m))
    records = []
    for r in range(spec.max_rounds):
        outcomes = []
        for f in range(spec.architecture.fragment_count):
            size = m if worst_case else k + (r + f) % (m - k + 1)
            accepted = tuple(sorted(addresses[(r + f + j) % m] for j in range(size)))
            outcomes.append(FragmentOutcome(_h(f"agg/{r}/{f}"), accepted, 0, 0, _h(f"report/{r}/{f}")))
        syncer = hashlib.sha256(f"synthetic-syncer/{r if worst_case else 0}".encode()).digest()[:20]
        records.append(RoundRecord(spec.task_id, r, syncer, 1, RuleKind.MEAN, 0, tuple(outcomes), _h(f"model/{r}")))
    transcript = tuple(records)
    counts = compute_accepted_counts(transcript)
    def did(i: int) -> str:
        if not worst_case:
            return f"did:tenzro:node:t{i}"
        suffix = f"t{i:05d}"
        return f"did:tenzro:{'k' * 32}:" + "x" * (MAX_DID_BYTES - len("did:tenzro:") - 33 - len(suffix)) + suffix

    trainers = tuple(ReceiptTrainer(did(i), a, 10**18, counts[a], False) for i, a in enumerate(addresses))
    final_hash = _h(f"model/{spec.max_rounds - 1}")
    final = FinalModelRecord(spec.task_id, spec.max_rounds, final_hash)
    root = run_root(compute_run_leaves(spec.canonical_bytes(), transcript, final))
    return TrainingReceipt(spec.task_id, spec, root, final_hash, transcript, trainers, compute_syncers(transcript),
                           1_761_400_000)
