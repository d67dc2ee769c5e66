"""Reading a run back from the store: its value in ``training_runs`` and, since schema version
4, its committed round records under their own keys in ``meta``.

What this module is: the two reads every opener of a store shares (the node service at start,
``tenzro audit``, tests): :func:`read_round_records` and :func:`load_run`. The encodings are
:mod:`.persistence`'s; the writes are :func:`.persistence.compute_transition_ops`'.

What it is NOT: a cache or a writer.
"""

from __future__ import annotations

from storage import schema
from storage.interface import KVStore, StorageError
from tenzro_training.node import persistence
from tenzro_training.run_state import RunState

__all__ = ["load_run", "read_round_records"]


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
