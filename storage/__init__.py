"""The storage shell: the node's key-value store (RocksDB, or memory for tests).

- :mod:`storage.interface`: the :class:`KVStore` interface, atomic batches, storage errors.
- :mod:`storage.schema`: every column family and key format, and the schema version.
- :mod:`storage.memory`: :class:`MemoryStore`, volatile.
- :mod:`storage.rocks`: :class:`RocksStore`, RocksDB through rocksdict.

This package is a shell around the pure protocol core: it stores bytes and knows nothing of the
protocol's rules. Durability semantics and the key table are in ``docs/storage.md``.
"""

from __future__ import annotations

import os

from storage.interface import (
    AtomicBatch,
    KeyFormatError,
    KVStore,
    SchemaVersionError,
    StorageError,
)
from storage.external import EXTERNAL_VALUE_BYTES
from storage.memory import MemoryStore

__all__ = [
    "AtomicBatch",
    "KVStore",
    "KeyFormatError",
    "MemoryStore",
    "SchemaVersionError",
    "StorageError",
    "open_store",
]


def open_store(
    path: str | os.PathLike[str] | None,
    *,
    sync: bool = False,
    create: bool = True,
    read_only: bool = False,
    wal_recovery: str = "strict",
    upgrade_schema: bool = True,
    external_value_bytes: int = EXTERNAL_VALUE_BYTES,
) -> KVStore:
    """Open the node's store: a :class:`~storage.rocks.RocksStore` in directory ``path``, or a
    fresh :class:`MemoryStore` when ``path`` is None (the other arguments then do nothing).
    ``read_only``: an existing store, read beside whoever has it open (RocksStore).
    ``wal_recovery``: one of :data:`storage.interface.WAL_RECOVERY_MODES`.
    ``upgrade_schema``, ``external_value_bytes``: see :class:`~storage.rocks.RocksStore`."""
    if path is None:
        return MemoryStore()
    # Imported here so that using the memory store never loads the RocksDB extension.
    from storage.rocks import RocksStore

    return RocksStore(path, sync=sync, create=create, read_only=read_only, wal_recovery=wal_recovery,
                      upgrade_schema=upgrade_schema, external_value_bytes=external_value_bytes)
