"""An in-memory :class:`~storage.interface.KVStore`: one dict and one sorted key list per family.

For tests and for a node run without a data directory. It honours the whole interface contract
(atomic batches, ordered prefix iteration over a snapshot, bytes-only keys) and is checked by the
same conformance suite as the RocksDB store.

It is NOT durable: everything is gone when the process ends or the store is closed.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from typing import cast

from storage import schema
from storage.interface import BatchOp, KVStore, Operation

__all__ = ["MemoryStore"]


class _Family:
    """One column family: values by key, plus the keys kept sorted for range scans."""

    __slots__ = ("keys", "values")

    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}
        self.keys: list[bytes] = []

    def put(self, key: bytes, value: bytes) -> None:
        if key not in self.values:
            bisect.insort(self.keys, key)
        self.values[key] = value

    def delete(self, key: bytes) -> None:
        if self.values.pop(key, None) is not None:
            del self.keys[bisect.bisect_left(self.keys, key)]


class MemoryStore(KVStore):
    """A volatile store with every family of :data:`storage.schema.ALL_COLUMN_FAMILIES`.

    A new store already holds the schema version in :data:`storage.schema.CF_META`, as a new
    RocksDB store does, so code that reads it sees the same thing on both.
    """

    def __init__(self) -> None:
        super().__init__(schema.ALL_COLUMN_FAMILIES)
        # Reads and commits take the lock so that a reader on another thread never sees half of
        # a batch (the interface promises a batch's effects only after commit, all together).
        self._lock = threading.RLock()
        self._families = {cf: _Family() for cf in schema.ALL_COLUMN_FAMILIES}
        self._families[schema.CF_META].put(
            schema.SCHEMA_VERSION_KEY, schema.encode_schema_version(schema.SCHEMA_VERSION)
        )

    def __repr__(self) -> str:
        return f"MemoryStore(closed={self.closed})"

    def _get(self, cf: str, key: bytes) -> bytes | None:
        with self._lock:
            return self._families[cf].values.get(key)

    def _iterate(self, cf: str, prefix: bytes, seek: bytes) -> Iterator[tuple[bytes, bytes]]:
        with self._lock:
            family = self._families[cf]
            snapshot: list[tuple[bytes, bytes]] = []
            index = bisect.bisect_left(family.keys, seek)
            while index < len(family.keys) and family.keys[index].startswith(prefix):
                key = family.keys[index]
                snapshot.append((key, family.values[key]))
                index += 1
        return iter(snapshot)

    def _apply_batch(self, ops: list[Operation]) -> None:
        with self._lock:
            for op, cf, key, value in ops:
                if op is BatchOp.DELETE:
                    self._families[cf].delete(key)
                else:
                    self._families[cf].put(key, cast(bytes, value))

    def _close(self) -> None:
        with self._lock:
            self._families = {}
