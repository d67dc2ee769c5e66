"""Recompute a node's runs from their stored inputs and compare with what it committed.

What this module is: ``tenzro audit``'s work, a SHELL over a store opened read-only (it can
run beside the node that has the store open). For each run it starts from the initial
checkpoint the spec names (its SHA-256 and the committed initial model hash checked), replays
every committed round from the stored payloads with the same pure round update a finalize runs
(:mod:`.replay`), and checks, round by round: the fragment outcomes and model hash of the round
record, the stored aggregation reports, the stored model snapshot when the replay reaches its
round; for a sealed run, the stored final weights, the run root and the stored receipt; for an
ended run, its stored summary (what a node's start reads of it instead of the run). A node
with ``prune_payloads`` deleted the payloads before its last snapshot (the replay starts from the
snapshot, hash-checked) or, once the run ended, all of them (nothing is replayed; a sealed run's
final weights are checked against its final model hash).

Why: aggregates, model hashes and run roots must be reproducible bit for bit from stored
inputs, because third parties verify them; an operator should be able to show that their node's
store still does, and find out when it does not, without trusting the node process. A node's
own rebuild (``ModelCache.rebuild`` in :mod:`.model_cache`) checks the rounds after its last
snapshot; this checks everything from the checkpoint on.

What it is NOT: a verifier of signatures or elections (``tenzro train verify-receipt`` checks
those, offline, from a receipt document).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from storage import schema
from storage.interface import KVStore, StorageError
from tenzro_training.errors import TenzroError
from tenzro_training.global_model import (
    INLINE,
    ModelLayout,
    RoundBuffers,
    Worker,
    compute_initial_model,
    compute_state_model_hash,
)
from tenzro_training.node import persistence
from tenzro_training.node.checkpoint import load_init_checkpoint
from tenzro_training.node.config import DEFAULT_MAX_CHECKPOINT_BYTES, DEFAULT_MAX_PAYLOAD_BYTES
from tenzro_training.node.model_state import (
    decode_model_layout,
    decode_round_count,
    load_model_fragments,
    load_snapshot_momentum,
)
from tenzro_training.node.replay import check_open_round, load_round_inputs, replay_round
from tenzro_training.node.run_store import check_ended_summary, load_run
from tenzro_training.receipt import compute_receipt
from tenzro_training.run_state import RunState, RunStatus

__all__ = ["RunAudit", "audit_run", "audit_store"]


@dataclass(frozen=True)
class RunAudit:
    """The outcome of auditing one run."""

    task_id: str
    status: str
    rounds_committed: int
    rounds_replayed: int
    """Rounds recomputed and found equal to their records (all of them when ``ok``)."""
    checks: tuple[str, ...] = ()
    """What was found equal, in order (e.g. ``snapshot of round 8``, ``receipt``)."""
    problem: str | None = None
    """The first difference or failure; the audit of a run stops there (later rounds build on
    the model it could not reproduce)."""

    @property
    def ok(self) -> bool:
        return self.problem is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id, "status": self.status, "ok": self.ok,
            "rounds_committed": self.rounds_committed, "rounds_replayed": self.rounds_replayed,
            "checks": list(self.checks), "problem": self.problem,
        }


@dataclass
class _Progress:
    replayed: int = 0
    checks: list[str] = field(default_factory=list)


def audit_store(
    store: KVStore,
    task_ids: Sequence[str] | None = None,
    *,
    allowed_dirs: Sequence[Path] = (),
    max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> list[RunAudit]:
    """Audit ``task_ids`` (default: every run in the store, in task_id order). The round
    replays hash each round's aggregates on a second thread, as the node's finalize does."""
    if task_ids is None:
        task_ids = [schema.parse_run_key(key) for key in store.keys(schema.CF_TRAINING_RUNS)]
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tenzro-audit") as worker:
        return [
            audit_run(store, task_id, allowed_dirs=allowed_dirs, max_checkpoint_bytes=max_checkpoint_bytes,
                      max_payload_bytes=max_payload_bytes, worker=worker)
            for task_id in task_ids
        ]


def audit_run(
    store: KVStore,
    task_id: str,
    *,
    allowed_dirs: Sequence[Path] = (),
    max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    worker: Worker = INLINE,
) -> RunAudit:
    """Audit one run (see the module docstring). Never raises for what it finds: a missing run,
    an unreadable checkpoint or a damaged store are the result's ``problem``."""
    try:
        run = load_run(store, task_id)
    except TenzroError as exc:
        return RunAudit(task_id, "unknown", 0, 0, problem=str(exc))
    if run is None:
        return RunAudit(task_id, "unknown", 0, 0, problem="no such run in the store")
    progress = _Progress()
    try:
        _audit(store, run, progress, allowed_dirs, max_checkpoint_bytes, max_payload_bytes, worker)
        if check_ended_summary(store, run):
            progress.checks.append("ended summary")
        problem = None
    except TenzroError as exc:
        problem = str(exc)
    return RunAudit(task_id, run.status.value, len(run.records), progress.replayed, tuple(progress.checks), problem)


def _audit(
    store: KVStore, run: RunState, progress: _Progress, allowed_dirs: Sequence[Path], max_checkpoint_bytes: int,
    max_payload_bytes: int, worker: Worker,
) -> None:
    task_id = run.task_id
    raw = store.get(schema.CF_META, schema.tensor_specs_key(task_id))
    if raw is None:
        raise StorageError(f"the tensor list of {task_id} is missing")
    model = decode_model_layout(raw, run.spec.architecture.fragment_count)
    state = load_init_checkpoint(run.spec, allowed_dirs=allowed_dirs, max_bytes=max_checkpoint_bytes)
    initial = compute_initial_model(state, run.spec.architecture.fragment_count)
    del state
    if initial.model != model:
        raise StorageError(f"the stored tensor list of {task_id} differs from its initial checkpoint's")
    if initial.model_hash != run.initial_model_hash:
        raise StorageError(f"the initial checkpoint of {task_id} does not hash to the committed initial model hash")
    progress.checks.append("initial model")
    snapshot_raw = store.get(schema.CF_META, schema.model_snapshot_key(task_id))
    snapshot = decode_round_count(snapshot_raw) if snapshot_raw is not None else None
    pruned_raw = store.get(schema.CF_META, schema.payloads_pruned_key(task_id))
    pruned = decode_round_count(pruned_raw) if pruned_raw is not None else 0
    if pruned == 0:
        start = 0
        weights = list(initial.weights)
        momentum = [torch.zeros_like(w) for w in weights]
        if snapshot == 0:
            _check_snapshot(store, task_id, model, 0, weights, momentum, progress)
    elif pruned == schema.PAYLOADS_PRUNED_ALL or snapshot is None or snapshot < pruned:
        # Every payload is gone (the run ended under prune_payloads): no round can be replayed;
        # a sealed run's final weights must still hash to its committed model hash.
        progress.checks.append("payloads pruned: no round replayed")
        if run.status is RunStatus.SEALED:
            final = load_model_fragments(store, task_id, schema.MODEL_FINAL, model)
            if compute_state_model_hash(model, final) != run.model_hash:
                raise StorageError(f"the stored final weights of {task_id} do not hash to its final model hash")
            progress.checks.append("final weights hash")
            _check_receipt(store, run, progress)
        return
    else:
        # Payloads before the snapshot were pruned: start from the snapshot, hash-checked.
        start = snapshot
        if start > len(run.records):
            raise StorageError(f"the model snapshot of {task_id} is of round {start}, after its last committed round")
        weights = load_model_fragments(store, task_id, schema.MODEL_WEIGHTS, model)
        momentum = load_snapshot_momentum(store, task_id, model, start)
        if compute_state_model_hash(model, weights) != run.records[start - 1].model_hash:
            raise StorageError(f"the stored model snapshot of {task_id} (round {start}) does not hash to its committed hash")
        progress.checks.append(f"snapshot of round {start} (payloads before it pruned)")

    def load_payload(digest: bytes) -> bytes:
        data = store.get(schema.CF_SUBMISSIONS, schema.payload_key(task_id, digest))
        if data is None:
            raise StorageError(f"accepted payload 0x{digest.hex()} of {task_id} is missing from the store")
        return data

    buffers = RoundBuffers()
    for record in run.records[start:]:
        inputs = load_round_inputs(store, task_id, record, load_payload)
        # As the node's finalize: what the store holds was accepted under the node's own
        # max_payload_bytes, which may be above this audit's (a larger node config).
        largest = max((len(data) for subs in inputs for _, data in subs), default=0)
        update = replay_round(run.spec, model, record, inputs, weights, momentum,
                              max_payload_bytes=max(largest, max_payload_bytes), worker=worker, buffers=buffers)
        stored = store.get(schema.CF_META, schema.round_reports_key(task_id, record.round))
        if stored != persistence.encode_round_reports([r.canonical_bytes() for r in update.reports]):
            raise StorageError(f"the stored aggregation reports of {task_id} round {record.round} differ from the replay's")
        progress.replayed += 1
        if snapshot == record.round + 1 and snapshot > start:
            _check_snapshot(store, task_id, model, snapshot, weights, momentum, progress)
    if run.current_round is not None:
        checked = check_open_round(store, run)
        progress.checks.append(f"open round {run.current_round.round}: {checked} accepted submission(s) stored")
    if run.status is RunStatus.SEALED:
        final = load_model_fragments(store, task_id, schema.MODEL_FINAL, model)
        if not all(torch.equal(a, b) for a, b in zip(final, weights)):
            raise StorageError(f"the stored final weights of {task_id} differ from the replayed model")
        progress.checks.append("final weights")
        _check_receipt(store, run, progress)


def _check_receipt(store: KVStore, run: RunState, progress: _Progress) -> None:
    task_id = run.task_id
    receipt = compute_receipt(run)
    if receipt.run_root != run.run_root:
        raise StorageError(f"the run root of {task_id} does not recompute from its records")
    stored_receipt = store.get(schema.CF_TRAINING_RECEIPTS, schema.receipt_key(task_id))
    if stored_receipt != persistence.encode_receipt(receipt):
        raise StorageError(f"the stored receipt of {task_id} differs from the one its records give")
    progress.checks.append("run root and receipt")
    # What TRAINING_VERIFY pays against: a wrong record would refuse every honest claim (or,
    # with another receipt's digest, accept that one). A store older than schema 3 has none
    # until a node opens it (and writes it); the audit opens stores read-only.
    record = store.get(schema.CF_META, schema.sealed_record_key(task_id))
    if record is None and _stored_schema_version(store) < schema.SEALED_RECORDS_SINCE:
        return
    if record != persistence.encode_sealed_record(receipt):
        raise StorageError(f"the sealed record of {task_id} (TRAINING_VERIFY's lookup) differs from its receipt's")
    progress.checks.append("sealed record")


def _stored_schema_version(store: KVStore) -> int:
    raw = store.get(schema.CF_META, schema.SCHEMA_VERSION_KEY)
    return schema.SCHEMA_VERSION if raw is None else schema.decode_schema_version(raw)


def _check_snapshot(
    store: KVStore, task_id: str, model: ModelLayout, rounds: int, weights: list[torch.Tensor],
    momentum: list[torch.Tensor], progress: _Progress,
) -> None:
    stored_w = load_model_fragments(store, task_id, schema.MODEL_WEIGHTS, model)
    stored_m = load_snapshot_momentum(store, task_id, model, rounds)
    same = all(torch.equal(a, b) for a, b in zip(stored_w, weights)) and all(
        torch.equal(a, b) for a, b in zip(stored_m, momentum)
    )
    if not same:
        raise StorageError(f"the stored model snapshot of {task_id} (round {rounds}) differs from the replayed model")
    progress.checks.append(f"snapshot of round {rounds}")
