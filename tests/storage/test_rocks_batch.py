"""RocksStore's batch order (storage/rocks.py ``_largest_last``): the largest value goes into the
RocksDB WriteBatch last, which changes no outcome of an atomic batch."""

from __future__ import annotations

from pathlib import Path

from storage.interface import BatchOp, Operation
from storage.rocks import RocksStore, _largest_last
from storage.schema import CF_META, CF_SUBMISSIONS, CF_TRAINING_RUNS

BIG = b"p" * (1 << 20)


def test_the_largest_put_moves_to_the_end_and_nothing_else_moves() -> None:
    ops: list[Operation] = [
        (BatchOp.PUT, CF_TRAINING_RUNS, b"run", b"r" * 3000),
        (BatchOp.DELETE, CF_META, b"old", None),
        (BatchOp.PUT, CF_SUBMISSIONS, b"payload", BIG),
        (BatchOp.PUT, CF_SUBMISSIONS, b"record", b"s" * 100),
    ]
    assert _largest_last(ops) == [ops[0], ops[1], ops[3], ops[2]]
    assert _largest_last(ops[:3] + [ops[3]])[-1] == ops[2]
    in_place = [ops[3], ops[2]]
    assert _largest_last(in_place) is in_place  # already last
    deletes_only: list[Operation] = [(BatchOp.DELETE, CF_META, b"a", None), (BatchOp.DELETE, CF_META, b"b", None)]
    assert _largest_last(deletes_only) == deletes_only


def test_a_batch_writing_the_largest_values_key_twice_keeps_its_order() -> None:
    """Last write wins within one batch: moving the large write after a later one to the same
    key would change which value the key holds."""
    ops: list[Operation] = [
        (BatchOp.PUT, CF_SUBMISSIONS, b"k", BIG),
        (BatchOp.PUT, CF_SUBMISSIONS, b"k", b"small"),
    ]
    assert _largest_last(ops) == ops
    deleted: list[Operation] = [(BatchOp.PUT, CF_SUBMISSIONS, b"k", BIG), (BatchOp.DELETE, CF_SUBMISSIONS, b"k", None)]
    assert _largest_last(deleted) == deleted
    other_family: list[Operation] = [(BatchOp.PUT, CF_SUBMISSIONS, b"k", BIG), (BatchOp.PUT, CF_META, b"k", b"x")]
    assert _largest_last(other_family) == [other_family[1], other_family[0]]  # another key: it moves


def test_a_real_store_applies_reordered_and_kept_batches_as_written(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "db")
    try:
        with store.atomic_batch() as batch:
            batch.put(CF_SUBMISSIONS, b"payload", BIG)
            batch.put(CF_SUBMISSIONS, b"record", b"s")
            batch.put(CF_TRAINING_RUNS, b"run", b"r")
        with store.atomic_batch() as batch:
            batch.put(CF_SUBMISSIONS, b"twice", BIG)
            batch.put(CF_SUBMISSIONS, b"twice", b"last")
            batch.put(CF_SUBMISSIONS, b"gone", BIG)
            batch.delete(CF_SUBMISSIONS, b"gone")
        assert store.get(CF_SUBMISSIONS, b"payload") == BIG
        assert store.get(CF_SUBMISSIONS, b"record") == b"s" and store.get(CF_TRAINING_RUNS, b"run") == b"r"
        assert store.get(CF_SUBMISSIONS, b"twice") == b"last"
        assert store.get(CF_SUBMISSIONS, b"gone") is None
    finally:
        store.close()
