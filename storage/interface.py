"""The storage interface: a column-family key-value store with atomic batches.

This module declares what every store offers (:class:`KVStore`), the one way to write
(:class:`AtomicBatch`, obtained from :meth:`KVStore.atomic_batch`) and the storage errors.
Implementations: :class:`storage.memory.MemoryStore` (tests, embedded runs without a data
directory) and :class:`storage.rocks.RocksStore` (RocksDB through rocksdict). The conformance
suite in ``tests/storage/test_conformance.py`` runs the same tests against both.

It is NOT the key layout (that is :mod:`storage.schema`, the only module that builds keys) and it
holds no protocol rules: a store moves opaque bytes and knows nothing of runs or rounds.

Contract, in one place:

- Keys and values are ``bytes`` (a ``bytes`` subclass is accepted; ``bytearray``, ``memoryview``
  and ``str`` are not: TypeError). The empty key and the empty value are allowed.
- Every read and write names a column family from the store's fixed list
  (:data:`storage.schema.ALL_COLUMN_FAMILIES`); any other name is a :class:`StorageError`.
- Reads: :meth:`KVStore.get`, :meth:`KVStore.contains`, :meth:`KVStore.iterate` (and
  :meth:`KVStore.keys`, its keys without the values). ``iterate`` yields
  ``(key, value)`` pairs in ascending unsigned byte order, only keys that start with ``prefix``,
  beginning at the first key ``>= start``. The view is fixed when ``iterate`` is called: batches
  committed while the iterator is being consumed are not seen by it.
- Writes go only through ``with store.atomic_batch() as batch: batch.put(...); batch.delete(...)``.
  Operations are buffered; when the block exits normally they are applied all together, in the
  order they were made (a later operation on the same key wins); if the block raises, nothing is
  applied and the exception propagates. Reads made inside the block do not see the buffered
  operations. When ``__exit__`` returns, the batch is written (for RocksDB: in the WAL, fsynced if
  the store was opened with ``sync=True``): that is the acknowledgement.
- A batch commits at most once: entering it again, writing to it after it finished, or calling
  :meth:`AtomicBatch.commit` a second time raise :class:`StorageError`.
- After :meth:`KVStore.close` every operation raises :class:`StorageError`; ``close`` is idempotent.
  Stores are context managers that close on exit.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Iterator
from types import TracebackType
from typing import Final, TypeVar

from tenzro_training.errors import TenzroError

__all__ = [
    "AtomicBatch",
    "BatchOp",
    "KVStore",
    "Operation",
    "KeyFormatError",
    "SchemaVersionError",
    "StorageError",
    "StoreLocked",
    "WAL_RECOVERY_MODES",
]


_T = TypeVar("_T")


WAL_RECOVERY_MODES: Final = ("strict", "point_in_time")
"""How an open replays the write-ahead log (``RocksStore(wal_recovery=...)``, node config
``wal_recovery``):

- ``strict`` (default): a record torn at the very end of a log (the batch being written when the
  process died, never acknowledged) is dropped; damage anywhere else refuses the open. Until
  2026-11-25 the store opened in point-in-time mode, which stops at the first damaged record
  and silently drops every later batch: 64 flipped bytes early in a log emptied a store of a
  sealed run and its receipt, and the audit had nothing left to check (storage fault probe).
- ``point_in_time``: the operator's choice for a store refused as above (e.g. after a power loss
  with ``sync=False``): recover every batch before the damage, drop the rest.
"""


# --- errors -------------------------------------------------------------------------------


class StorageError(TenzroError):
    """A store cannot do what was asked: unknown column family, closed store, locked or
    unreadable data directory, a batch used twice, a failed write."""


class StoreLocked(StorageError):
    """Another opener holds the data directory (RocksDB's LOCK): a running node, usually. Its
    own type so that a tool reading beside a node can say that rather than the lock's text."""


class SchemaVersionError(StorageError):
    """The data directory was written with a schema version this code cannot read.

    ``found`` is the version stored in the directory, ``supported`` the one this code writes.
    """

    def __init__(self, path: str, found: int, supported: int) -> None:
        self.path = path
        self.found = found
        self.supported = supported
        if found > supported:
            why = "it was written by a newer version of tenzro-training; upgrade this node"
        else:
            why = "it is older than this code and no migration from it exists"
        super().__init__(
            f"store at {path!r} has schema version {found}, this code supports version "
            f"{supported}: {why}"
        )


class KeyFormatError(StorageError, ValueError):
    """A key cannot be built from these values, or stored bytes do not parse as a key of the
    expected kind. ``value`` is the offending input."""

    def __init__(self, message: str, value: object = None) -> None:
        self.value = value
        super().__init__(message)


# --- batches ------------------------------------------------------------------------------


class BatchOp(enum.Enum):
    PUT = "put"
    DELETE = "delete"


# A buffered operation: (op, column family, key, value); value is None for DELETE.
Operation = tuple[BatchOp, str, bytes, bytes | None]


class _BatchState(enum.Enum):
    NEW = "new"
    OPEN = "open"  # inside its ``with`` block
    COMMITTED = "committed"
    DISCARDED = "discarded"
    FAILED = "failed"  # the store refused the write; nothing from it is visible


def validate_bytes(what: str, value: object) -> bytes:
    """Return ``value`` if it is bytes; raise TypeError naming ``what`` otherwise."""
    # bytearray/memoryview are refused on purpose: they are mutable, so a buffered batch could
    # change between put() and commit().
    if not isinstance(value, bytes):
        raise TypeError(f"{what} must be bytes, got {type(value).__name__}")
    return value


class AtomicBatch:
    """Buffered puts and deletes across column families, applied all-or-nothing.

    Obtain one with :meth:`KVStore.atomic_batch` and use it as a context manager. Arguments are
    checked when an operation is added (TypeError, StorageError), so a bad call fails at its own
    line and not at commit.
    """

    __slots__ = ("_ops", "_state", "_store")

    def __init__(self, store: KVStore) -> None:
        self._store = store
        self._ops: list[Operation] = []
        self._state = _BatchState.NEW

    def __len__(self) -> int:
        """Number of buffered operations."""
        return len(self._ops)

    @property
    def committed(self) -> bool:
        return self._state is _BatchState.COMMITTED

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        """Buffer ``cf[key] = value``."""
        self._check_writable()
        self._store._check_cf(cf)
        key, value = validate_bytes("key", key), validate_bytes("value", value)
        self._ops.append((BatchOp.PUT, cf, key, value))

    def delete(self, cf: str, key: bytes) -> None:
        """Buffer the removal of ``cf[key]`` (deleting an absent key is not an error)."""
        self._check_writable()
        self._store._check_cf(cf)
        self._ops.append((BatchOp.DELETE, cf, validate_bytes("key", key), None))

    def commit(self) -> None:
        """Apply every buffered operation atomically and return once the write is done.

        ``with`` calls this on a normal exit; call it directly only for a batch used without
        ``with``. A batch commits once.
        """
        if self._state in (_BatchState.COMMITTED, _BatchState.DISCARDED, _BatchState.FAILED):
            raise StorageError(f"batch already finished ({self._state.value}); create a new one")
        ops, self._ops = self._ops, []
        try:
            self._store._check_open()
            self._store._apply_batch(ops)
        except BaseException:
            self._state = _BatchState.FAILED
            raise
        self._state = _BatchState.COMMITTED

    def discard(self) -> None:
        """Drop every buffered operation; the batch cannot be used afterwards."""
        if self._state in (_BatchState.COMMITTED, _BatchState.FAILED):
            raise StorageError(f"batch already finished ({self._state.value})")
        self._ops = []
        self._state = _BatchState.DISCARDED

    def __enter__(self) -> AtomicBatch:
        if self._state is not _BatchState.NEW:
            raise StorageError(f"batch cannot be entered twice (it is {self._state.value})")
        self._store._check_open()
        self._state = _BatchState.OPEN
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._state is not _BatchState.OPEN:
            return  # committed or discarded explicitly inside the block
        if exc_type is not None:
            self.discard()
            return  # the exception propagates
        self.commit()

    def _check_writable(self) -> None:
        if self._state not in (_BatchState.NEW, _BatchState.OPEN):
            raise StorageError(f"batch already finished ({self._state.value}); create a new one")


# --- the store ----------------------------------------------------------------------------


class KVStore(abc.ABC):
    """A key-value store with a fixed set of column families (see the module docstring).

    Subclasses implement the ``_``-prefixed primitives; argument checking, the closed state and
    batch bookkeeping live here so every implementation behaves the same.
    """

    def __init__(self, column_families: tuple[str, ...]) -> None:
        self._column_families: Final = tuple(column_families)
        self._cf_set: Final = frozenset(column_families)
        self._closed = False

    # -- public API ---------------------------------------------------------------------

    @property
    def column_families(self) -> tuple[str, ...]:
        """The column families this store accepts, in schema order."""
        return self._column_families

    @property
    def closed(self) -> bool:
        return self._closed

    def get(self, cf: str, key: bytes) -> bytes | None:
        """The value stored under ``key`` in ``cf``, or None."""
        self._check_open()
        self._check_cf(cf)
        return self._get(cf, validate_bytes("key", key))

    def contains(self, cf: str, key: bytes) -> bool:
        """Whether ``key`` is present in ``cf``."""
        self._check_open()
        self._check_cf(cf)
        return self._contains(cf, validate_bytes("key", key))

    def holds_value(self, cf: str, key: bytes) -> bool:
        """Whether ``key`` is present in ``cf`` with a value a get can return, checked without
        reading the value: :meth:`contains`, and for a value a store keeps outside the key (the
        RocksDB store's value files) that its file is there at its size. What a startup check
        of many megabyte values wants (``node.replay.check_open_round``)."""
        self._check_open()
        self._check_cf(cf)
        return self._holds_value(cf, validate_bytes("key", key))

    def iterate(
        self, cf: str, prefix: bytes = b"", start: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs of ``cf`` whose key starts with ``prefix``, ascending by key
        bytes, from the first key ``>= start`` (the prefix's first key when ``start`` is None
        or sorts before the prefix). The view is taken now, not when iteration begins."""
        self._check_open()
        self._check_cf(cf)
        validate_bytes("prefix", prefix)
        if start is not None:
            validate_bytes("start", start)
        seek = prefix if start is None or start < prefix else start
        return self._guard_closed(self._iterate(cf, prefix, seek))

    def keys(self, cf: str, prefix: bytes = b"") -> Iterator[bytes]:
        """The keys :meth:`iterate` would yield for ``prefix``, without reading their values
        (what deleting a range needs: a payload scan that read values would copy megabytes
        per key). Same order and view rules as :meth:`iterate`."""
        self._check_open()
        self._check_cf(cf)
        validate_bytes("prefix", prefix)
        return self._guard_closed(self._iterate_keys(cf, prefix))

    def upgrade_schema_version(self) -> int | None:
        """Mark a store opened with ``upgrade_schema=False`` (RocksStore) at an older, upgradable
        schema version as the current one, and return the version it had; None when there is
        nothing to upgrade (or, as here, no versions at all)."""
        self._check_open()
        return None

    def atomic_batch(self) -> AtomicBatch:
        """A new, empty batch for this store (see :class:`AtomicBatch`)."""
        self._check_open()
        return AtomicBatch(self)

    def close(self) -> None:
        """Release the store. Idempotent; later operations raise StorageError."""
        if self._closed:
            return
        self._closed = True
        self._close()

    def __enter__(self) -> KVStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _guard_closed(self, inner: Iterator[_T]) -> Iterator[_T]:
        # An iterator outliving close() must fail loudly, not end early as if the data ended.
        for item in inner:
            if self._closed:
                raise StorageError("store was closed during iteration")
            yield item
        if self._closed:
            raise StorageError("store was closed during iteration")

    # -- primitives for implementations ------------------------------------------------

    @abc.abstractmethod
    def _get(self, cf: str, key: bytes) -> bytes | None: ...

    def _contains(self, cf: str, key: bytes) -> bool:
        return self._get(cf, key) is not None

    def _holds_value(self, cf: str, key: bytes) -> bool:
        return self._contains(cf, key)

    @abc.abstractmethod
    def _iterate(self, cf: str, prefix: bytes, seek: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Snapshot ``cf`` now; yield pairs from ``seek`` while keys start with ``prefix``.
        ``seek >= prefix`` is guaranteed by the caller."""

    def _iterate_keys(self, cf: str, prefix: bytes) -> Iterator[bytes]:
        """Keys of :meth:`_iterate` from ``prefix``; override where values cost a copy."""
        return (key for key, _ in self._iterate(cf, prefix, prefix))

    @abc.abstractmethod
    def _apply_batch(self, ops: list[Operation]) -> None:
        """Apply ``ops`` all-or-nothing and return only once they are written. Raise
        StorageError (and apply nothing) if the write fails."""

    @abc.abstractmethod
    def _close(self) -> None: ...

    # -- shared checks -----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("store is closed")

    def _check_cf(self, cf: str) -> None:
        if not isinstance(cf, str) or cf not in self._cf_set:
            raise StorageError(
                f"unknown column family {cf!r}; known: {', '.join(self._column_families)}"
            )
