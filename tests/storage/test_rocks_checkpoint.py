"""RocksStore.create_checkpoint: the consistent copy behind the node's hot backups."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import StorageError
from storage.rocks import RocksStore
from storage.schema import CF_SUBMISSIONS, CF_TRAINING_RUNS


def test_a_checkpoint_is_the_store_as_of_the_call_and_opens_on_its_own(tmp_path: Path) -> None:
    with RocksStore(tmp_path / "db") as store:
        with store.atomic_batch() as batch:
            batch.put(CF_TRAINING_RUNS, b"run", b"state")
            batch.put(CF_SUBMISSIONS, b"payload", b"\x01" * (1 << 20))  # in the memtable, not yet flushed
        store.create_checkpoint(tmp_path / "copy")
        with store.atomic_batch() as batch:  # after the checkpoint: not in it
            batch.put(CF_TRAINING_RUNS, b"later", b"x")
        with RocksStore(tmp_path / "copy") as copy:  # read-write, beside the original still open
            assert copy.get(CF_TRAINING_RUNS, b"run") == b"state"
            assert copy.get(CF_SUBMISSIONS, b"payload") == b"\x01" * (1 << 20)
            assert copy.get(CF_TRAINING_RUNS, b"later") is None
            with copy.atomic_batch() as batch:
                batch.put(CF_TRAINING_RUNS, b"copy-only", b"y")
        assert store.get(CF_TRAINING_RUNS, b"copy-only") is None  # the two are independent


def test_invalid_checkpoint_targets_and_a_closed_store(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "db")
    (tmp_path / "taken").mkdir()
    with pytest.raises(StorageError, match="already exists"):
        store.create_checkpoint(tmp_path / "taken")
    with pytest.raises(StorageError, match="failed"):
        store.create_checkpoint(tmp_path / "no" / "parent")
    store.close()
    with pytest.raises(StorageError):
        store.create_checkpoint(tmp_path / "after-close")
    assert not (tmp_path / "after-close").exists()
