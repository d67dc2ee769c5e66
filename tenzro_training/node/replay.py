"""Replaying committed rounds from a node's store (a SHELL helper: it reads the store).

What this module is: loading one committed round's inputs (the stored payloads of the trainers
its record accepted, in the record's canonical order) and re-running the pure round update
(:func:`~tenzro_training.global_model.compute_round_update`) on them, checked against the
record. The node uses it to rebuild a run's model from its last snapshot
(``ModelCache.rebuild`` in :mod:`.model_cache`); ``tenzro audit`` uses it to recompute whole
runs from their initial checkpoints (:mod:`.audit`).

Why a replay is checked rather than trusted: the record is what the node signed off and third
parties verify; if the stored inputs no longer reproduce it, the store is damaged, and a model
built from it must be neither served nor stepped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from storage import schema
from storage.interface import KVStore, StorageError
from tenzro_training.addresses import Address, format_address
from tenzro_training.errors import TenzroError
from tenzro_training.global_model import (
    INLINE,
    ModelLayout,
    RecordMismatch,
    RoundBuffers,
    RoundUpdate,
    Worker,
    check_round_update,
    compute_round_update,
)
from tenzro_training.node import persistence
from tenzro_training.records import RoundRecord
from tenzro_training.run_state import RunState
from tenzro_training.spec import TrainingTaskSpec

__all__ = ["ReplayMismatch", "check_open_round", "load_round_inputs", "replay_round"]


class ReplayMismatch(StorageError):
    """A committed round, replayed from the stored payloads, does not reproduce its record
    (the core's ``check_round_update`` refused it): the store is damaged."""

    def __init__(self, task_id: str, round: int, what: str) -> None:
        self.task_id = task_id
        self.round = round
        self.what = what
        super().__init__(f"round {round} of {task_id} replayed from the store does not reproduce its committed {what}")


def load_round_inputs(
    store: KVStore, task_id: str, record: RoundRecord, load_payload: Callable[[bytes], bytes]
) -> list[list[tuple[Address, bytes]]]:
    """Per fragment, the (trainer, payload bytes) the round aggregated: for each trainer in the
    record's ``accepted`` (canonical order), its stored submission record names the payload
    hash, and ``load_payload(hash)`` returns the bytes (StorageError for anything missing)."""
    inputs = []
    for index, outcome in enumerate(record.fragments):
        subs = []
        for trainer in outcome.accepted:
            raw = store.get(schema.CF_SUBMISSIONS, schema.submission_key(task_id, record.round, index, trainer))
            if raw is None:
                raise StorageError(
                    f"the submission of {format_address(trainer)} to {task_id} round {record.round} "
                    f"fragment {index} is missing from the store"
                )
            subs.append((trainer, load_payload(persistence.decode_submission_record(raw).payload_hash)))
        inputs.append(subs)
    return inputs


def check_open_round(store: KVStore, run: RunState) -> int:
    """StorageError unless every submission the run's open round accepted has its submission
    record (naming the same payload hash) and its payload in the store; returns how many were
    checked. The batch that accepts a submission writes all three, so a miss means a damaged
    store: a MANIFEST cut short opened without error and lost the last batch's payload but not
    the run state, after which every finalize of the round failed (storage fault probe)."""
    current = run.current_round
    if current is None:
        return 0
    checked = 0
    for fragment, subs in enumerate(current.submissions):
        for sub in subs:
            where = f"{format_address(sub.trainer)} to {run.task_id} round {current.round} fragment {fragment}"
            raw = store.get(schema.CF_SUBMISSIONS, schema.submission_key(run.task_id, current.round, fragment, sub.trainer))
            if raw is None or persistence.decode_submission_record(raw).payload_hash != sub.payload_hash:
                raise StorageError(f"the accepted submission of {where} has no matching record in the store")
            if not store.holds_value(schema.CF_SUBMISSIONS, schema.payload_key(run.task_id, sub.payload_hash)):
                raise StorageError(f"the payload of the accepted submission of {where} is missing from the store")
            checked += 1
    return checked


def replay_round(
    spec: TrainingTaskSpec,
    model: ModelLayout,
    record: RoundRecord,
    inputs: Sequence[Sequence[tuple[Address, bytes]]],
    weights: Sequence[torch.Tensor],
    momentum: Sequence[torch.Tensor],
    *,
    max_payload_bytes: int,
    worker: Worker = INLINE,
    buffers: RoundBuffers | None = None,
) -> RoundUpdate:
    """Step ``weights`` and ``momentum`` IN PLACE by one committed round, as its finalize did,
    and return the update. Raises ReplayMismatch when the outcomes (aggregate, accepted,
    selected, trimmed, report hashes) or the model hash differ from ``record``, StorageError
    when a stored payload no longer decodes or aggregates; the vectors are garbage then."""
    largest = max((len(data) for subs in inputs for _, data in subs), default=0)
    try:
        update = compute_round_update(
            spec, model, record.round, inputs, weights, momentum,
            max_payload_bytes=max(largest, max_payload_bytes), worker=worker, in_place=True,
            buffers=buffers,
        )
    except TenzroError as exc:  # every stored payload was decoded when it was accepted
        raise StorageError(f"round {record.round} of {spec.task_id} cannot be replayed: {exc}") from None
    try:
        check_round_update(spec.task_id, record, update)
    except RecordMismatch as exc:  # the inputs came from the store: the store is damaged
        raise ReplayMismatch(spec.task_id, record.round, exc.what) from None
    return update
