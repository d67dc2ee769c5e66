"""The RocksDB :class:`~storage.interface.KVStore`, through rocksdict in raw mode.

One RocksDB database per data directory, one column family per entry of
:data:`storage.schema.ALL_COLUMN_FAMILIES`. A batch is one RocksDB ``WriteBatch`` carrying
column-family handles, so a multi-family state transition is applied atomically; the write-ahead
log is always on, and ``sync=True`` fsyncs it before each batch is acknowledged.

It is NOT the key layout (:mod:`storage.schema`) and holds no protocol logic.

rocksdict facts this module is built around (measured, see the shared dependency notes):

- Raw mode only (``Options(raw_mode=True)``): pickle mode would unpickle stored bytes. Every open
  passes explicit raw Options and every column family that exists on disk (RocksDB refuses to
  open a database without all of its families).
- ``ReadOptions(raw_mode=True)`` raises: plain ``ReadOptions()`` is used for iterators.
- ``close()`` does not release the database (nor its LOCK) while column-family views, handles
  or iterators are alive, so the store tracks its cursors and drops every reference first.
- RocksDB takes an exclusive LOCK file: a second read-write opener of a directory fails, in this
  process or another; that failure becomes a :class:`~storage.interface.StorageError`.
- The published wheels build RocksDB without SSE4.2: the CRC32C of every byte through the
  write-ahead log is table-driven (~0.9 GB/s). So values of
  :data:`storage.schema.EXTERNAL_VALUE_KEYSPACES` of at least ``external_value_bytes`` go to
  files of their own (:mod:`storage.external`), a reference under the key.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import rocksdict

from storage import schema
from storage.external import (
    DIRECTORY,
    EXTERNAL_VALUE_BYTES,
    MAX_FILE_KEY_BYTES,
    REF_MAGIC,
    ExternalFile,
    ExternalValues,
    decode_ref,
    encode_ref,
)
from tenzro_training.filelock import try_lock_directory
from storage.interface import (
    WAL_RECOVERY_MODES,
    BatchOp,
    KVStore,
    Operation,
    SchemaVersionError,
    StorageError,
    StoreLocked,
)

__all__ = ["EXTERNAL_VALUE_BYTES", "RocksStore"]

_DEFAULT_CF = "default"  # RocksDB always has it; the schema never uses it


MAX_TOTAL_WAL_BYTES = 256 << 20
"""Write-ahead log kept before RocksDB flushes the column families that pin its oldest file.
Without a cap (RocksDB's default is 4 x the memtables of every family, ~4.6 GB here) the
families that are written a little and never fill a memtable (``meta``'s liveness stamp every
second, ``accounts``) held every log file: a running node kept 1.19 GB of WAL for 9.6 MB of data,
and a restart after a crash replayed all of it (soak probe). It bounds that replay too."""


_PIN_ATTEMPTS = 5
"""Read-only opens tried before giving up on pinning a view's files (a writer replacing
values faster than a reader can link them)."""
_READER_SWEEP_S = 60.0
"""How often a writer removing files also removes the links of readers that died."""


def _may_be_external(cf: str, key: bytes) -> bool:
    """Whether ``cf[key]`` may hold a reference: an external keyspace, and a key short enough
    for a file's header (a longer key's value is always in the key, whatever its bytes)."""
    return len(key) <= MAX_FILE_KEY_BYTES and schema.is_external_keyspace(cf, key)


def _raw_options(
    *, create: bool = False, wal_recovery: str = "strict", max_total_wal_bytes: int = MAX_TOTAL_WAL_BYTES
) -> rocksdict.Options:
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(create)
    # Open creates families only for a brand-new database; in an existing one they are created
    # explicitly, after the schema-version check (a newer store must not be touched).
    options.create_missing_column_families(create)
    # An acknowledged batch is whole in the WAL, so only the unacknowledged tail can be torn
    # by a crash (dropped as a whole: no half batch); see WAL_RECOVERY_MODES.
    if wal_recovery == "strict":
        options.set_wal_recovery_mode(rocksdict.DBRecoveryMode.tolerate_corrupted_tail_records())
    else:
        options.set_wal_recovery_mode(rocksdict.DBRecoveryMode.point_in_time())
    options.set_keep_log_file_num(4)
    options.set_max_total_wal_size(max_total_wal_bytes)
    return options


def _prefix_upper_bound(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: unbounded)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes((stripped[-1] + 1,))


class _Cursor:
    """A prefix scan over one RocksDB iterator. The store can release it on close."""

    __slots__ = ("__weakref__", "_iterator", "_prefix", "_read_options", "_resolve", "_values")

    def __init__(self, iterator: Any, read_options: Any, prefix: bytes, *, values: bool = True,
                 resolve: Callable[[bytes, bytes], bytes] | None = None) -> None:
        self._iterator: Any = iterator
        # rocksdict does not copy the iterate-upper-bound out of ReadOptions: the iterator reads
        # it from there, so the options must live as long as the iterator (measured: dropping
        # them ends prefix scans after one key).
        self._read_options: Any = read_options
        self._prefix = prefix
        self._values = values  # False: keys only, every value reads as b"" (never copied out)
        self._resolve = resolve  # (key, stored value) -> value, for a family with external values

    def __iter__(self) -> _Cursor:
        return self

    def __next__(self) -> tuple[bytes, bytes]:
        iterator = self._iterator
        if iterator is None:
            raise StopIteration
        if not iterator.valid():
            self.release()
            try:
                iterator.status()
            except Exception as error:  # rocksdict raises a bare Exception on I/O errors
                raise StorageError(f"iteration failed: {error}") from error
            raise StopIteration
        key = iterator.key()
        if not key.startswith(self._prefix):
            self.release()
            raise StopIteration
        value = iterator.value() if self._values else b""
        iterator.next()
        if self._resolve is not None and self._values:
            value = self._resolve(key, value)
        return key, value

    @property
    def resolves(self) -> bool:
        """Whether this cursor is live and may read value files."""
        return self._iterator is not None and self._resolve is not None and self._values

    def release(self) -> None:
        self._iterator = None
        self._read_options = None


def _largest_last(ops: list[Operation]) -> list[Operation]:
    """``ops`` with the PUT of the largest value moved to the end, where no other operation in
    the batch names its key (the order of writes to distinct keys does not change what one
    atomic batch does; to the same key it does, so such a batch keeps its order).

    Why: a RocksDB WriteBatch is one buffer grown by doubling. A 1 MiB payload followed by its
    ~100-byte submission record grew it to 2 MiB, copying the payload once more and faulting
    in fresh pages: 0.36 ms to build the batch of a 1 MiB submission against 0.11 ms with the
    payload last (2026-11-27, 2-core machine), of ~1.9 ms that RocksDB adds to one."""
    largest = max(range(len(ops)), key=lambda i: -1 if ops[i][3] is None else len(ops[i][3]))
    if largest == len(ops) - 1 or ops[largest][0] is not BatchOp.PUT:
        return ops
    target = ops[largest][1:3]
    if any(op[1:3] == target for i, op in enumerate(ops) if i != largest):
        return ops
    return [*ops[:largest], *ops[largest + 1:], ops[largest]]


class RocksStore(KVStore):
    """A durable store in the RocksDB directory ``path``.

    ``sync``: fsync the WAL before a batch is acknowledged (survives power loss). Without it a
    batch is acknowledged once it is in the WAL in the OS's page cache: it survives the process
    being killed, not the machine losing power. The WAL is never disabled.
    ``create``: create the directory's database if it does not exist; with False a missing store
    is a StorageError.
    ``max_total_wal_bytes``: the write-ahead log RocksDB keeps before it flushes the families
    that hold its oldest file (:data:`MAX_TOTAL_WAL_BYTES`).
    ``upgrade_schema``: with False, an older store of an upgradable version opens without its
    version key being rewritten; :meth:`upgrade_schema_version` writes it, once the opener has
    accepted the store (a node refused for its config had left the store marked for a version
    the old code refuses: upgrade probe).
    ``read_only``: open an existing store for reading only (RocksDB's read-only mode: it takes
    no LOCK, so it works beside the node that has the store open, and sees the data as of the
    open); every batch is a StorageError and nothing on disk changes, not even an upgradable
    schema version. For audits (``tenzro audit``).
    ``external_value_bytes``: a value of :data:`storage.schema.EXTERNAL_VALUE_KEYSPACES` this
    long or longer is kept in a file of ``<path>/values/`` (:mod:`storage.external`), written
    before the batch that puts its reference and removed after the batch that replaces or
    deletes it; a read-write open removes the files no key names (left by a crash between
    the two). With ``sync`` the files and their directory are fsynced before the batch.

    Opening checks the schema version in :data:`storage.schema.CF_META`: a new store gets the
    current one; a different one raises :class:`~storage.interface.SchemaVersionError` naming
    both; a directory holding data but no version raises StorageError.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        sync: bool = False,
        create: bool = True,
        read_only: bool = False,
        wal_recovery: str = "strict",
        max_total_wal_bytes: int = MAX_TOTAL_WAL_BYTES,
        upgrade_schema: bool = True,
        external_value_bytes: int = EXTERNAL_VALUE_BYTES,
    ) -> None:
        super().__init__(schema.ALL_COLUMN_FAMILIES)
        if external_value_bytes < 1:
            raise ValueError(f"external_value_bytes must be at least 1, got {external_value_bytes}")
        self._external_value_bytes = int(external_value_bytes)
        self._max_total_wal_bytes = int(max_total_wal_bytes)
        self._upgrade_schema = bool(upgrade_schema)
        self._found_version: int | None = None  # an upgradable older version, not yet rewritten
        if wal_recovery not in WAL_RECOVERY_MODES:
            raise ValueError(f"wal_recovery must be one of {WAL_RECOVERY_MODES}, got {wal_recovery!r}")
        self._wal_recovery = wal_recovery
        self._path = os.fspath(path)
        self._sync = bool(sync)
        self._external = ExternalValues(os.path.join(self._path, DIRECTORY), sync=self._sync)
        self._unneeded: list[bytes] = []  # replaced value files, removed once no iterator reads them
        # Between reading a reference and opening its file, and between creating an iterator
        # and registering it, no file may be removed (reads and batches may come from several
        # threads): this lock covers both, and the removal's bookkeeping.
        self._files_lock = threading.Lock()
        self._batch_lock = threading.Lock()
        self._readers_swept = time.monotonic()
        self._read_only = bool(read_only)
        self._db: Any = None
        self._views: dict[str, Any] = {}
        self._handles: dict[str, Any] = {}
        self._cursors: weakref.WeakSet[_Cursor] = weakref.WeakSet()
        self._dir_lock: int | None = None  # a descriptor of the directory, flock'ed while open
        self._write_options = rocksdict.WriteOptions()
        self._write_options.sync = self._sync
        self._write_options.disable_wal = False
        try:
            self._open(create and not self._read_only)
        except BaseException:
            self._closed = True
            try:
                self._release()
            except StorageError:  # the open's own error is the one to report
                pass
            raise

    def __repr__(self) -> str:
        mode = ", read_only=True" if self._read_only else ""
        return f"RocksStore({self._path!r}, sync={self._sync}{mode}, closed={self.closed})"

    @property
    def path(self) -> str:
        return self._path

    @property
    def sync(self) -> bool:
        return self._sync

    # -- opening -----------------------------------------------------------------------

    def _open(self, create: bool) -> None:
        if not self._read_only:
            self._open_once(create)
            return
        # A read-only view must find every file it names pinned (storage.external): linked
        # before the open, or after it if written in between. A file the writer removed in
        # that window is not there to link: the view is too old, so open a newer one.
        # After the last try the view is kept: a file that is simply missing (lost) must fail
        # the reads that need it, not every read of the store.
        for attempt in range(_PIN_ATTEMPTS):
            self._external.pin()
            self._open_once(create)
            self._external.pin()
            if attempt == _PIN_ATTEMPTS - 1 or not self._external.has_files():
                return
            if all(self._external.is_pinned(name) for name in self._referenced_files()):
                return
            self._release()

    def _referenced_files(self) -> set[bytes]:
        """The names of every value file a reference in this view names."""
        return {
            ref[0]
            for cf, prefix in schema.EXTERNAL_VALUE_KEYSPACES
            for _, value in self._cursor(cf, prefix, prefix, values=True, resolve=False)
            if (ref := decode_ref(value)) is not None
        }

    def _open_once(self, create: bool) -> None:
        path = self._path
        if os.path.exists(path) and not os.path.isdir(path):
            raise StorageError(f"store path {path!r} exists and is not a directory")
        exists = os.path.exists(os.path.join(path, "CURRENT"))
        if not exists and not create:
            raise StorageError(f"no store at {path!r} (opened with create=False)")
        if not self._read_only:
            self._lock_directory()
        if exists:
            on_disk = self._list_families()
            families = [name for name in on_disk if name != _DEFAULT_CF]
        else:
            # A new database gets every family in the same open (one MANIFEST write instead of
            # one per family); it has no data and no version yet, so _check_schema initialises it.
            on_disk = [_DEFAULT_CF, *schema.ALL_COLUMN_FAMILIES]
            families = list(schema.ALL_COLUMN_FAMILIES)
        try:
            self._db = rocksdict.Rdict(
                path,
                _raw_options(create=not exists, wal_recovery=self._wal_recovery,
                             max_total_wal_bytes=self._max_total_wal_bytes),
                column_families={name: _raw_options() for name in families},
                access_type=rocksdict.AccessType.read_only() if self._read_only else rocksdict.AccessType.read_write(),
            )
        except Exception as error:  # rocksdict raises bare Exception for RocksDB statuses
            raise self._open_error(error) from error
        for name in on_disk:
            if name in self._cf_set:
                self._attach(name)
        self._check_schema(on_disk)
        if not self._read_only:
            self._external.create_directory()
            self._external.remove_dead_readers()
            self._sweep_external()

    def _sweep_external(self) -> None:
        """Remove the value files that no key names: written by a batch that never committed
        (the process died between them) or replaced by one whose removals a crash cut short.
        A file is kept exactly when its key holds a reference to it; the header names the key,
        so only a file cut short before its header end needs a scan of the references."""
        unreadable: list[bytes] = []
        for found in self._external.scan():
            if isinstance(found, bytes):
                unreadable.append(found)
            elif not self._names_file(found):
                self._external.remove([found.name])
        if unreadable:
            referenced = self._referenced_files()
            self._external.remove([name for name in unreadable if name not in referenced])

    def _names_file(self, found: ExternalFile) -> bool:
        if found.cf not in self._views or not _may_be_external(found.cf, found.key):
            return False
        stored = self._raw_get(found.cf, found.key)
        ref = decode_ref(stored) if stored is not None else None
        return ref is not None and ref[0] == found.name

    def _lock_directory(self) -> None:
        """Take an exclusive flock on the directory itself, beside RocksDB's LOCK file. Why:
        RocksDB's lock lives on a file, and a deleted ``LOCK`` let a second read-write node open
        the same store; the two then overwrote each other's MANIFEST and lost acknowledged
        writes or left the store unopenable (found by the storage fault probe). A lock on the
        directory's own descriptor cannot be removed with the directory in place."""
        try:
            fd = try_lock_directory(self._path)
        except OSError as error:
            raise StorageError(f"cannot open store directory {self._path!r}: {error.strerror or error}") from None
        if fd is None:
            raise StoreLocked(
                f"store at {self._path!r} is already open (its directory is locked by another process "
                f"or another opener in this process); only one read-write opener at a time"
            )
        self._dir_lock = fd

    def _list_families(self) -> list[str]:
        try:
            return list(rocksdict.Rdict.list_cf(self._path, _raw_options()))
        except Exception as error:
            raise self._open_error(error) from error

    def _open_error(self, error: Exception) -> StorageError:
        message = str(error)
        # RocksDB: "IO error: While lock file: <path>/LOCK: Resource temporarily unavailable".
        # Not any "lock": a damaged store says "Corruption: block checksum mismatch".
        if "lock file" in message.lower() or "/LOCK" in message:
            return StoreLocked(
                f"store at {self._path!r} is already open (RocksDB LOCK is held by another "
                f"process or another opener in this process); only one read-write opener "
                f"at a time: {message}"
            )
        # The WAL reader says only "Corruption: checksum mismatch"; table and MANIFEST damage
        # name their file.
        wal = "Corruption" in message and ".sst" not in message and "MANIFEST" not in message
        if wal and self._wal_recovery == "strict":
            return StorageError(
                f"cannot open store at {self._path!r}: its write-ahead log is damaged before its end, and "
                f"opening it would drop every batch written after the damage: {message}. Restore the "
                f"store from a backup, or, to open it anyway and lose those batches, set "
                f'"wal_recovery": "point_in_time" in the node config (docs/storage.md)'
            )
        return StorageError(f"cannot open store at {self._path!r}: {message}")

    def _attach(self, name: str) -> None:
        self._views[name] = self._db.get_column_family(name)
        self._handles[name] = self._db.get_column_family_handle(name)

    def _check_schema(self, on_disk: list[str]) -> None:
        raw = None
        if schema.CF_META in self._views:
            raw = self._views[schema.CF_META].get(schema.SCHEMA_VERSION_KEY)
        if raw is not None:
            found = schema.decode_schema_version(raw)
            if found != schema.SCHEMA_VERSION and found not in schema.UPGRADABLE_SCHEMA_VERSIONS:
                raise SchemaVersionError(self._path, found, schema.SCHEMA_VERSION)
            missing = [name for name in schema.ALL_COLUMN_FAMILIES if name not in self._views]
            if missing:
                raise StorageError(
                    f"store at {self._path!r} has schema version {found} but lacks column "
                    f"families {missing}: it is damaged"
                )
            if found != schema.SCHEMA_VERSION and not self._read_only:
                if self._upgrade_schema:
                    self._write_schema_version()  # an upgradable version: its data is read as it is
                else:
                    self._found_version = found  # the opener marks it once it has accepted the store
            return
        if self._read_only:
            raise StorageError(f"store at {self._path!r} has no schema version: nothing to read "
                               f"(not a tenzro-training store, or a damaged one)")
        # No version: a brand-new database, or one whose creation was interrupted before the
        # version was written (families are created first). Anything with data is foreign.
        for name in on_disk:
            attached = name in self._views
            view = self._views[name] if attached else self._db.get_column_family(name)
            try:
                has_data = any(True for _ in view.keys())
            finally:
                if not attached:
                    view.close()
            if has_data:
                raise StorageError(
                    f"store at {self._path!r} holds data (in column family {name!r}) but no "
                    f"schema version: it is not a tenzro-training store, or a damaged one (a store's "
                    f"version is written first; the storage fault probe lost it by cutting a MANIFEST short)"
                )
        for name in schema.ALL_COLUMN_FAMILIES:
            if name not in self._views:
                try:
                    self._db.create_column_family(name, _raw_options())
                except Exception as error:
                    raise StorageError(f"cannot create column family {name!r}: {error}") from error
                self._attach(name)
        self._write_schema_version()

    def upgrade_schema_version(self) -> int | None:
        self._check_open()
        found, self._found_version = self._found_version, None
        if found is not None:
            self._write_schema_version()
        return found

    def _write_schema_version(self) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        batch.put(
            schema.SCHEMA_VERSION_KEY,
            schema.encode_schema_version(schema.SCHEMA_VERSION),
            self._handles[schema.CF_META],
        )
        initial = rocksdict.WriteOptions()
        initial.sync = True  # a store's identity is written durably whatever the data policy
        self._write(batch, initial)

    # -- KVStore primitives ------------------------------------------------------------

    def _raw_get(self, cf: str, key: bytes) -> bytes | None:
        try:
            value: bytes | None = self._views[cf].get(key)
        except Exception as error:
            raise StorageError(f"read from {cf!r} failed: {error}") from error
        return value

    def _get(self, cf: str, key: bytes) -> bytes | None:
        if not _may_be_external(cf, key):
            return self._raw_get(cf, key)
        with self._files_lock:  # the file stays until it is open (see __init__)
            value = self._raw_get(cf, key)
            ref = decode_ref(value) if value is not None else None
            if ref is None:
                return value
            opened = self._external.open(cf, key, ref[0])
        return self._external.read_opened(opened, cf, key, ref[1])

    def _contains(self, cf: str, key: bytes) -> bool:
        return self._raw_get(cf, key) is not None  # a reference is enough: no file read

    def _holds_value(self, cf: str, key: bytes) -> bool:
        stored = self._raw_get(cf, key)
        if stored is None:
            return False
        ref = decode_ref(stored) if _may_be_external(cf, key) else None
        return ref is None or self._external.holds(cf, key, *ref)

    def _resolve(self, cf: str, key: bytes, stored: bytes) -> bytes:
        """The value behind ``stored``: the file's when it is a reference."""
        ref = decode_ref(stored)
        if ref is None:
            return stored
        return self._external.read(cf, key, *ref)

    def _iterate(self, cf: str, prefix: bytes, seek: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self._cursor(cf, prefix, seek, values=True)

    def _iterate_keys(self, cf: str, prefix: bytes) -> Iterator[bytes]:
        return (key for key, _ in self._cursor(cf, prefix, prefix, values=False))

    def _cursor(self, cf: str, prefix: bytes, seek: bytes, *, values: bool, resolve: bool = True) -> _Cursor:
        read_options = rocksdict.ReadOptions()
        upper = _prefix_upper_bound(prefix)
        if upper is not None:
            read_options.set_iterate_upper_bound(upper)
        external = resolve and any(cf == family for family, _ in schema.EXTERNAL_VALUE_KEYSPACES)
        with self._files_lock:  # registered before any removal can miss it (see __init__)
            # The RocksDB iterator reads a consistent view as of its creation, which is now.
            iterator = self._views[cf].iter(read_options)
            cursor = _Cursor(iterator, read_options, prefix, values=values, resolve=(
                (lambda key, stored: self._resolve(cf, key, stored) if _may_be_external(cf, key) else stored)
                if external else None
            ))
            self._cursors.add(cursor)
        iterator.seek(seek)
        return cursor

    def _apply_batch(self, ops: list[Operation]) -> None:
        if self._read_only:
            raise StorageError(f"store at {self._path!r} is open read-only")
        if not ops:
            return
        # One batch at a time: two threads replacing one key would both read its old
        # reference, and one new file would be left to the next open's sweep.
        with self._batch_lock:
            ops, replaced = self._separate(ops)
            batch = rocksdict.WriteBatch(raw_mode=True)
            for op, cf, key, value in _largest_last(ops):
                if op is BatchOp.DELETE:
                    batch.delete(key, self._handles[cf])
                else:
                    batch.put(key, value, self._handles[cf])
            # A failed write leaves the files it would have named: RocksDB may still replay a
            # batch whose log write failed after it was appended, and the next open's sweep
            # removes them if no key names them.
            self._write(batch, self._write_options)
            self._remove_files(replaced)

    def _remove_files(self, names: list[bytes]) -> None:
        """Remove replaced value files, unless an iterator that may still read them is live:
        its view is fixed when it is created, so the files it names wait (until a later batch
        finds no such iterator, or the close).

        Without ``sync`` the batch that replaced them is in the page cache only, while an
        unlink reaches the disk's journal within seconds: a power loss could keep the removal
        and lose the batch, and the store would reopen naming a file that is gone. So the
        write-ahead log is synced first (one fsync per batch that replaces or deletes large
        values: a model snapshot, a seal, a pruning; never a fresh submission's)."""
        with self._files_lock:
            self._unneeded += names
            if not self._unneeded or any(c.resolves for c in list(self._cursors)):
                return
            unneeded, self._unneeded = self._unneeded, []
        if not self._log_synced_for_removal():
            # The batch is written and stays acknowledged: its files wait for a later sync
            # (or the next open's sweep). A failing disk fails the next write anyway.
            with self._files_lock:
                self._unneeded += unneeded
            return
        self._external.remove(unneeded)
        if time.monotonic() - self._readers_swept > _READER_SWEEP_S:
            self._readers_swept = time.monotonic()
            self._external.remove_dead_readers()

    def _log_synced_for_removal(self) -> bool:
        """Whether the batches written so far are durable, so that the files they replaced may
        be removed (:meth:`_remove_files`): with ``sync`` they are; without it the log is
        synced here, and False means that failed."""
        if self._sync:
            return True
        try:
            self._db.flush_wal(True)
        except Exception:
            return False
        return True

    def _separate(self, ops: list[Operation]) -> tuple[list[Operation], list[bytes]]:
        """``ops`` with each large value of an external keyspace written to its file and put as
        a reference, and the files of the values this batch replaces or deletes (to remove
        once it is written). Only the last operation on such a key is kept: the one that
        decides its value, so no file is written for a value the batch itself replaces."""
        last = {(cf, key): i for i, (_, cf, key, _) in enumerate(ops) if _may_be_external(cf, key)}
        if not last:
            return ops, []
        separated: list[Operation] = []
        written: list[bytes] = []
        replaced: list[bytes] = []
        durable = False
        try:
            for i, (op, cf, key, value) in enumerate(ops):
                index = last.get((cf, key))
                if index is None:
                    separated.append((op, cf, key, value))
                    continue
                if index != i:
                    continue
                stored = self._raw_get(cf, key)
                ref = decode_ref(stored) if stored is not None else None
                if ref is not None:
                    replaced.append(ref[0])
                if value is not None and (len(value) >= self._external_value_bytes or value.startswith(REF_MAGIC)):
                    # A value replacing another is made durable before the batch even without
                    # sync: a replaced file is removed once the batch is (and a replaced value
                    # in the key is gone with it), and a power loss must not take both (review,
                    # 2026-11-27). A fresh value is not.
                    name = self._external.write(cf, key, value, durable=stored is not None)
                    written.append(name)
                    durable |= stored is not None
                    value = encode_ref(name, len(value))
                separated.append((op, cf, key, value))
            if written:
                self._external.sync_directory(force=durable)
        except BaseException:
            self._external.remove(written)
            raise
        return separated, replaced

    def create_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Write a consistent copy of the store as it is now to the directory ``path`` (which
        must not exist; its parent must): RocksDB's checkpoint, its SST files hard-linked when
        ``path`` is on the store's filesystem (so it costs little disk until compaction replaces
        them) and copied otherwise. The copy opens as a store of its own, read-write or
        read-only. Why: a plain copy of a store being written can catch a compaction's new files
        without their MANIFEST (docs/node.md "Backups and restores"); a checkpoint is taken by
        the opener itself, between its writes. StorageError on any failure; a partial ``path``
        may be left, for the caller to remove."""
        self._check_open()
        target = os.fspath(path)
        if os.path.lexists(target):
            raise StorageError(f"checkpoint of {self._path!r}: {target!r} already exists")
        try:
            rocksdict.Checkpoint(self._db).create_checkpoint(target)
        except Exception as error:
            raise StorageError(f"checkpoint of {self._path!r} to {target!r} failed: {error}") from error
        self._external.link_into(os.path.join(target, DIRECTORY))

    def _write(self, batch: Any, options: Any) -> None:
        try:
            self._db.write(batch, options)
        except Exception as error:
            raise StorageError(f"write to {self._path!r} failed: {error}") from error

    def _close(self) -> None:
        self._release()

    def _release(self) -> None:
        """Drop every cursor, view and handle, then close the database (releasing its LOCK)."""
        for cursor in list(self._cursors):
            cursor.release()
        self._cursors = weakref.WeakSet()
        unneeded, self._unneeded = self._unneeded, []
        if unneeded and self._db is not None and not self._log_synced_for_removal():
            unneeded = []  # left for the next open's sweep
        self._external.remove(unneeded)
        self._external.release_cached()
        self._external.unpin()
        views, self._views = self._views, {}
        self._handles = {}
        # After a failed write (a full disk) every close below raises RocksDB's kept error
        # ("Writer has previous error"), a bare Exception: each still runs, the directory lock
        # is released last, and the first error is reported as a StorageError.
        errors: list[Exception] = []
        for view in views.values():
            try:
                view.close()
            except Exception as error:
                errors.append(error)
        del views
        db, self._db = self._db, None
        try:
            if db is not None:
                db.close()
        except Exception as error:
            errors.append(error)
        lock, self._dir_lock = self._dir_lock, None
        if lock is not None:
            os.close(lock)  # releases the flock, after the database (and its LOCK) is closed
        if errors:
            raise StorageError(f"closing {self._path!r} failed: {errors[0]}")
