"""Reading a run back from the store: its value in ``training_runs`` and, since schema version
4, its committed round records under their own keys in ``meta``.

What this module is: the reads every opener of a store shares (the node service at start,
``tenzro audit``, ``tenzro train export-model``, tests): :func:`read_round_records`,
:func:`load_run`, :func:`read_model_layout` and :func:`read_final_model_file`, which work on a
store opened read-only; and :func:`check_ended_summary`, the audit's check of an ended run's
stored summary against the run (``run_state.compute_run_list_entry``). The encodings are
:mod:`.persistence`'s and :mod:`.model_state`'s; the writes are
:func:`.persistence.compute_transition_ops`'.

What it is NOT: a cache or a writer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from storage import schema
from storage.interface import KVStore, StorageError
from tenzro_training.errors import InvalidState, UnknownTask
from tenzro_training.global_model import (
    ModelLayout,
    compute_final_model_file_bytes,
    compute_state_model_hash,
)
from tenzro_training.node import persistence
from tenzro_training.node.model_state import decode_model_layout, load_model_fragments
from tenzro_training.run_state import RunState, RunStatus, compute_run_list_entry, is_terminal

__all__ = [
    "check_ended_summary",
    "compute_final_model_file",
    "load_run",
    "read_final_model_file",
    "read_model_layout",
    "read_round_records",
    "read_sealed_run",
]


def read_round_records(store: KVStore, task_id: str) -> list[tuple[int, bytes]]:
    """``(round, value)`` of every round record stored for ``task_id``, in round order (a
    version-3 run has none: its records are inline in its value)."""
    out = []
    for key, raw in store.iterate(schema.CF_META, schema.round_record_prefix(task_id)):
        owner, round = schema.parse_round_record_key(key)
        if owner != task_id:  # a prefix of another task's id cannot match: the id is length-prefixed
            raise StorageError(f"round record key {key!r} is not {task_id!r}'s")
        out.append((round, raw))
    return out


def load_run(store: KVStore, task_id: str) -> RunState | None:
    """The stored run ``task_id`` with its round records, or None if the store has no such run."""
    raw = store.get(schema.CF_TRAINING_RUNS, schema.run_key(task_id))
    if raw is None:
        return None
    return persistence.decode_run(raw, read_round_records(store, task_id))


def check_ended_summary(store: KVStore, run: RunState) -> bool:
    """StorageError unless the stored summary of ``run``, if any, is its listRuns entry: a node's
    start trusts it instead of decoding the run (listRuns, metrics, model file restore, pruning),
    so a summary on an open run sets that run aside for good and a wrong one is served as it is.
    True when a summary was found and checked; False for none (an open run, or one ended under a
    version that wrote none: the next start writes it)."""
    raw = store.get(schema.CF_META, schema.ended_summary_key(run.task_id))
    if raw is None:
        return False
    if not is_terminal(run):
        raise StorageError(f"{run.task_id} is {run.status.value}, yet the store holds an ended-run summary of it "
                           f"(a node's start would set it aside as ended)")
    if persistence.decode_ended_summary(raw, run.task_id) != compute_run_list_entry(run):
        raise StorageError(f"the stored summary of the ended run {run.task_id} (what listRuns and a node's start "
                           f"read) differs from the run")
    return True


def read_model_layout(store: KVStore, run: RunState) -> ModelLayout:
    """The run's global-model layout, from its stored tensor list."""
    raw = store.get(schema.CF_META, schema.tensor_specs_key(run.task_id))
    if raw is None:
        raise StorageError(f"the tensor list of run {run.task_id!r} is missing")
    return decode_model_layout(raw, run.spec.architecture.fragment_count)


def compute_final_model_file(run: RunState, model: ModelLayout, fragments: Sequence[torch.Tensor]) -> bytes:
    """The safetensors bytes of a sealed run's final global model (fp32, docs/node.md's layout),
    after checking that ``fragments`` hash to the receipt's final_model_hash. InvalidState for a
    run that is not Sealed; StorageError for weights that do not hash right."""
    _check_sealed(run)
    assert run.final_record is not None and run.run_root is not None
    final_hash = run.final_record.final_model_hash
    if compute_state_model_hash(model, fragments) != final_hash:
        raise StorageError(f"the stored final model of {run.task_id} does not hash to its final_model_hash")
    return compute_final_model_file_bytes(run.task_id, final_hash, run.run_root, model, fragments)


def _check_sealed(run: RunState) -> None:
    if run.status is not RunStatus.SEALED or run.final_record is None or run.run_root is None:
        raise InvalidState(run.task_id, run.status.value, "export the final model")


def read_sealed_run(store: KVStore, task_id: str) -> RunState:
    """The stored run ``task_id``, which must be Sealed (its final record and run root set):
    UnknownTask if there is no such run, InvalidState if it is not sealed."""
    run = load_run(store, task_id)
    if run is None:
        raise UnknownTask(task_id)
    _check_sealed(run)
    return run


def read_final_model_file(store: KVStore, task_id: str) -> bytes:
    """:func:`compute_final_model_file` from the store alone (no node service, nothing written:
    ``tenzro train export-model`` opens the store read-only). UnknownTask if there is no such run."""
    run = read_sealed_run(store, task_id)
    model = read_model_layout(store, run)
    return compute_final_model_file(run, model, load_model_fragments(store, task_id, schema.MODEL_FINAL, model))
