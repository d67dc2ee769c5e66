"""RocksStore(read_only=True): the audit's view of a store a node may have open."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import StorageError
from storage.rocks import RocksStore
from storage.schema import CF_META, CF_TRAINING_RUNS, SCHEMA_VERSION_KEY, encode_schema_version


def test_read_only_reads_beside_a_writer_and_never_writes(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with RocksStore(path) as writer:
        with writer.atomic_batch() as batch:
            batch.put(CF_TRAINING_RUNS, b"run", b"state")
        # The writer holds the LOCK; a read-only opener does not need it.
        with RocksStore(path, read_only=True) as reader:
            assert reader.get(CF_TRAINING_RUNS, b"run") == b"state"
            assert list(reader.iterate(CF_TRAINING_RUNS)) == [(b"run", b"state")]
            with pytest.raises(StorageError, match="read-only"):
                with reader.atomic_batch() as batch:
                    batch.put(CF_TRAINING_RUNS, b"other", b"x")
            assert "read_only=True" in repr(reader)
        with writer.atomic_batch() as batch:  # the writer is unaffected
            batch.put(CF_TRAINING_RUNS, b"after", b"y")
    with RocksStore(path) as again:
        assert again.get(CF_TRAINING_RUNS, b"other") is None and again.get(CF_TRAINING_RUNS, b"after") == b"y"


def test_read_only_needs_an_existing_store(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="no store"):
        RocksStore(tmp_path / "missing", read_only=True)
    assert not (tmp_path / "missing" / "CURRENT").exists()


def test_read_only_leaves_an_upgradable_version_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with RocksStore(path) as store:
        with store.atomic_batch() as batch:
            batch.put(CF_META, SCHEMA_VERSION_KEY, encode_schema_version(1))
    with RocksStore(path, read_only=True) as reader:
        assert reader.get(CF_META, SCHEMA_VERSION_KEY) == encode_schema_version(1)
    with RocksStore(path, read_only=True) as reader:
        assert reader.get(CF_META, SCHEMA_VERSION_KEY) == encode_schema_version(1)
