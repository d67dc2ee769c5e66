"""RocksStore under real failure: SIGKILL mid-stream, newer schema versions, a held LOCK.

The crash test runs a real writer process that acknowledges each atomic batch on stdout only
after the batch call returned, kills it with SIGKILL while it is writing, reopens the directory
and checks the two durability promises: every acknowledged batch is fully present, and no batch
is half-applied (the three families it spans agree key for key).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import rocksdict

from storage import SchemaVersionError, StorageError
from storage.interface import StoreLocked
from storage.rocks import RocksStore
from storage.schema import (
    CF_ACCOUNTS,
    CF_META,
    CF_SUBMISSIONS,
    CF_TRAINING_RECEIPTS,
    CF_TRAINING_RUNS,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    UPGRADABLE_SCHEMA_VERSIONS,
    encode_schema_version,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
FAMILIES = (CF_TRAINING_RUNS, CF_TRAINING_RECEIPTS, CF_SUBMISSIONS)
LAST_KEY = b"~last"  # sorts after every 8-byte sequence key written below

# Batch n puts key n (8 bytes, big-endian) into three families and moves a counter; every 16th
# batch carries 1 MiB values so that a kill often lands inside a large write. argv: path, sync
# ("1"/"0"), first sequence number.
WRITER = r"""
import sys
from storage.rocks import RocksStore
families = ("training_runs", "training_receipts", "submissions")
store = RocksStore(sys.argv[1], sync=sys.argv[2] == "1")
for seq in range(int(sys.argv[3]), 10**9):
    key = seq.to_bytes(8, "big")
    value = key + (b"\x5a" * (1 << 20) if seq % 16 == 15 else b"\x5a" * 512)
    with store.atomic_batch() as batch:
        for cf in families:
            batch.put(cf, key, value + cf.encode())
        batch.put("training_runs", b"~last", key)
    sys.stdout.write(f"{seq}\n")
    sys.stdout.flush()
"""

HOLDER = r"""
import sys
from storage.rocks import RocksStore
store = RocksStore(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
store.close()
"""


def spawn(code: str, *args: str, stdin: int | None = None) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO_ROOT,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def run_and_kill(path: Path, sync: bool, first: int, delay_s: float) -> int:
    """Run the writer from sequence ``first``, let it acknowledge a few batches, keep writing
    for ``delay_s`` more without our reading, then SIGKILL it. Return the highest acknowledged
    sequence number (None if none)."""
    proc = spawn(WRITER, str(path), "1" if sync else "0", str(first))
    assert proc.stdout is not None
    for _ in range(8):  # the writer is up and writing
        if not proc.stdout.readline():
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"writer died early: {err.decode()}")
    # The writer runs on unobserved (its stdout pipe has room), so the kill lands at an
    # arbitrary point: often inside a batch, sometimes between one and its acknowledgement.
    time.sleep(delay_s)
    os.kill(proc.pid, signal.SIGKILL)
    rest, _ = proc.communicate()
    assert proc.returncode == -signal.SIGKILL  # killed mid-stream, not finished
    # Lines printed before the kill are acknowledgements too; a torn last line is not.
    complete = [int(line) for line in rest.decode().split("\n")[:-1]]
    return complete[-1] if complete else first + 7


def check_store(path: Path, acked: int) -> int:
    """Assert the durability promises; return how many batches the store holds."""
    with RocksStore(path, create=False) as store:
        contents = {cf: dict(store.iterate(cf)) for cf in FAMILIES}
    last = contents[CF_TRAINING_RUNS].pop(LAST_KEY)
    key_sets = [sorted(contents[cf]) for cf in FAMILIES]
    # No half batch: the three families hold exactly the same keys ...
    assert key_sets[0] == key_sets[1] == key_sets[2]
    applied = [int.from_bytes(k, "big") for k in key_sets[0]]
    # ... a gap-free run 0..n of whole batches whose counter points at the last one ...
    assert applied == list(range(len(applied)))
    assert int.from_bytes(last, "big") == applied[-1]
    # ... covering every batch the writer acknowledged.
    assert applied[-1] >= acked
    for cf in FAMILIES:
        for key, value in contents[cf].items():
            seq = int.from_bytes(key, "big")
            size = (1 << 20) if seq % 16 == 15 else 512
            assert value == key + b"\x5a" * size + cf.encode()
    return len(applied)


@pytest.mark.parametrize("sync", [False, True], ids=["wal", "wal+fsync"])
def test_sigkill_keeps_every_acknowledged_batch_and_no_half_batch(
    tmp_path: Path, sync: bool
) -> None:
    # Several kill/reopen cycles on one store, each resuming where the store stands.
    # (Measured while writing this test: with batches applied one put at a time instead of as
    # one WriteBatch, 7 kills in 10 left a half batch behind; with RocksStore, none.)
    path = tmp_path / "db"
    delays = random.Random(int(sync)).sample([0.0, 0.005, 0.01, 0.02, 0.03, 0.04], 3)
    held = 0
    for delay_s in delays:
        acked = run_and_kill(path, sync, held, delay_s)
        held = check_store(path, acked)


# --- schema version -----------------------------------------------------------------------


def write_version(path: Path, version_bytes: bytes) -> None:
    with RocksStore(path) as store:
        with store.atomic_batch() as batch:
            batch.put(CF_TRAINING_RUNS, b"run", b"state")
            batch.put(CF_META, SCHEMA_VERSION_KEY, version_bytes)


def test_invalid_newer_schema_version_refuses_to_open(tmp_path: Path) -> None:
    path = tmp_path / "db"
    write_version(path, encode_schema_version(SCHEMA_VERSION + 1))
    with pytest.raises(SchemaVersionError) as info:
        RocksStore(path)
    error = info.value
    assert (error.found, error.supported) == (SCHEMA_VERSION + 1, SCHEMA_VERSION)
    assert error.path == str(path)  # which data directory, for a tool opening several
    message = str(error)
    assert f"schema version {SCHEMA_VERSION + 1}" in message
    assert f"supports version {SCHEMA_VERSION}" in message
    assert "newer" in message
    # Refusing wrote nothing and released the directory: a raw opener sees the newer version.
    assert read_raw_version(path) == encode_schema_version(SCHEMA_VERSION + 1)


def open_raw(path: Path) -> rocksdict.Rdict:
    """The store at ``path`` opened read-write by rocksdict itself, as any RocksDB tool would."""
    options = rocksdict.Options(raw_mode=True)
    families = {
        name: rocksdict.Options(raw_mode=True)
        for name in rocksdict.Rdict.list_cf(str(path), options)
        if name != "default"
    }
    return rocksdict.Rdict(str(path), options, column_families=families)


def read_raw_version(path: Path) -> bytes | None:
    raw = open_raw(path)
    meta = raw.get_column_family(CF_META)
    version: bytes | None = meta.get(SCHEMA_VERSION_KEY)
    meta.close()
    raw.close()
    return version


def test_invalid_newer_store_with_unknown_family_still_reports_the_version(
    tmp_path: Path,
) -> None:
    # A newer version may add families; the error must still be about the version.
    path = tmp_path / "db"
    write_version(path, encode_schema_version(SCHEMA_VERSION + 5))
    options = rocksdict.Options(raw_mode=True)
    families = {
        name: rocksdict.Options(raw_mode=True)
        for name in rocksdict.Rdict.list_cf(str(path), options)
        if name != "default"
    }
    raw = rocksdict.Rdict(str(path), options, column_families=families)
    raw.create_column_family("from_the_future", rocksdict.Options(raw_mode=True))
    raw.close()
    del raw
    with pytest.raises(SchemaVersionError, match=f"schema version {SCHEMA_VERSION + 5}"):
        RocksStore(path)


def test_invalid_older_schema_version_refuses_to_open(tmp_path: Path) -> None:
    path = tmp_path / "db"
    write_version(path, encode_schema_version(0))
    with pytest.raises(SchemaVersionError, match="no migration") as info:
        RocksStore(path)
    assert info.value.found == 0
    # export-model and the node's startup report a store they cannot open by catching StorageError.
    assert isinstance(info.value, StorageError)


def test_upgradable_schema_version_opens_and_is_marked_current(tmp_path: Path) -> None:
    """A version-1 to -5 store is read as it is and rewritten as the current version, so code
    that only knows the old version refuses it afterwards instead of misreading its model state
    (1), sealing runs without their sealed record (2), reading runs without their round
    records (3), finding no momentum for a run at round 0 (4) or taking a file reference for a
    payload (5). With upgrade_schema=False (the node) it is rewritten only when the opener says."""
    assert UPGRADABLE_SCHEMA_VERSIONS == {1, 2, 3, 4, 5} and SCHEMA_VERSION == 6
    for old in (1, 2, 3, 4, 5):
        path = tmp_path / f"db{old}"
        write_version(path, encode_schema_version(old))
        with RocksStore(path, upgrade_schema=False) as store:
            assert store.get(CF_TRAINING_RUNS, b"run") == b"state"  # the data is untouched
        assert read_raw_version(path) == encode_schema_version(old)
        with RocksStore(path, upgrade_schema=False) as store:
            assert store.upgrade_schema_version() == old and store.upgrade_schema_version() is None
        assert read_raw_version(path) == encode_schema_version(SCHEMA_VERSION)
        write_version(path, encode_schema_version(old))
        with RocksStore(path) as store:
            assert store.get(CF_TRAINING_RUNS, b"run") == b"state"
            assert store.upgrade_schema_version() is None  # already rewritten at the open
        assert read_raw_version(path) == encode_schema_version(SCHEMA_VERSION)


class WriteHook:
    """A store's rocksdict handle with its ``write(batch, options)`` replaced."""

    def __init__(self, db: Any, write: Any) -> None:
        self._db, self.write = db, write

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_the_schema_version_is_written_durably_even_without_sync(tmp_path: Path) -> None:
    """The version says which code may read a store: an upgrade's rewrite lost to a power loss
    leaves a store the old code misreads, and a store that lost it reads as a foreign database.
    So it is fsynced whatever the store's sync policy."""
    path = tmp_path / "db"
    write_version(path, encode_schema_version(5))
    with RocksStore(path, upgrade_schema=False) as store:
        real = store._db
        synced: list[bool] = []

        def write(batch: Any, options: Any) -> None:
            synced.append(options.sync)
            real.write(batch, options)

        store._db = WriteHook(real, write)
        try:
            assert not store.sync and store.upgrade_schema_version() == 5
        finally:
            store._db = real
    assert synced == [True]
    assert read_raw_version(path) == encode_schema_version(SCHEMA_VERSION)


def test_invalid_malformed_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "db"
    write_version(path, b"\x01")
    with pytest.raises(StorageError, match="malformed"):
        RocksStore(path)


def test_invalid_foreign_database_without_version(tmp_path: Path) -> None:
    path = tmp_path / "db"
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    raw = rocksdict.Rdict(str(path), options)
    raw[b"someone else's"] = b"data"
    raw.close()
    del raw
    with pytest.raises(StorageError, match="not a tenzro-training store"):
        RocksStore(path)


def test_interrupted_creation_without_version_is_completed(tmp_path: Path) -> None:
    # Families are created before the version is written; a crash in between leaves empty
    # families and no version, which must open as a new store.
    path = tmp_path / "db"
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    raw = rocksdict.Rdict(str(path), options)
    raw.create_column_family(CF_TRAINING_RUNS, rocksdict.Options(raw_mode=True))
    raw.close()
    del raw
    with RocksStore(path) as store:
        assert store.get(CF_META, SCHEMA_VERSION_KEY) == encode_schema_version(SCHEMA_VERSION)
        with store.atomic_batch() as batch:
            batch.put(CF_ACCOUNTS, b"a", b"1")
    with RocksStore(path, create=False) as store:
        assert store.get(CF_ACCOUNTS, b"a") == b"1"


def test_invalid_versioned_store_missing_a_family(tmp_path: Path) -> None:
    """A store with its version holds every family of that version: one without a family was
    damaged (or edited), and opening it would fail the first read of that family instead."""
    path = tmp_path / "db"
    write_version(path, encode_schema_version(SCHEMA_VERSION))
    raw = open_raw(path)
    raw.drop_column_family(CF_ACCOUNTS)
    raw.close()
    del raw
    with pytest.raises(StorageError, match=r"has schema version \d+ but lacks column families \['accounts'\]: it is damaged"):
        RocksStore(path)


def test_invalid_interrupted_creation_that_cannot_be_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Completing an interrupted creation creates the missing families: when RocksDB refuses (a
    full disk) the open is a StorageError naming the family, and the directory is released."""
    path = tmp_path / "db"
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    rocksdict.Rdict(str(path), options).close()
    real = rocksdict.Rdict

    class RefusingFamilies:
        list_cf = staticmethod(real.list_cf)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._db = real(*args, **kwargs)

        def create_column_family(self, name: str, options: Any) -> None:
            raise Exception("IO error: No space left on device")

        def __getattr__(self, name: str) -> Any:
            return getattr(self._db, name)

    monkeypatch.setattr(rocksdict, "Rdict", RefusingFamilies)
    with pytest.raises(StorageError, match="cannot create column family '.*': IO error: No space left on device"):
        RocksStore(path)
    monkeypatch.undo()
    with RocksStore(path) as store:
        assert store.get(CF_META, SCHEMA_VERSION_KEY) == encode_schema_version(SCHEMA_VERSION)


def test_same_version_reopens_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "db"
    for round_ in range(3):
        with RocksStore(path) as store:
            assert store.get(CF_META, SCHEMA_VERSION_KEY) == encode_schema_version(SCHEMA_VERSION)
            with store.atomic_batch() as batch:
                batch.put(CF_TRAINING_RUNS, b"opened", str(round_).encode())
    with RocksStore(path) as store:
        assert store.get(CF_TRAINING_RUNS, b"opened") == b"2"


# --- one read-write opener ----------------------------------------------------------------


def test_invalid_second_opener_in_process(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with RocksStore(path) as first:
        with first.atomic_batch() as batch:
            batch.put(CF_TRAINING_RUNS, b"k", b"v")
        with pytest.raises(StorageError, match="already open"):
            RocksStore(path)
        # The failed opener did not disturb the holder.
        assert first.get(CF_TRAINING_RUNS, b"k") == b"v"
        with first.atomic_batch() as batch:
            batch.put(CF_TRAINING_RUNS, b"k2", b"v2")
    with RocksStore(path) as again:
        assert again.get(CF_TRAINING_RUNS, b"k2") == b"v2"


def test_invalid_store_held_by_another_rocksdb_opener_is_reported_as_locked(tmp_path: Path) -> None:
    """An opener that takes RocksDB's LOCK but not the directory's (a RocksDB tool, a node from
    before the directory lock) is found by RocksDB: that is StoreLocked too, which the node
    reports as "already open" rather than as a damaged store."""
    path = tmp_path / "db"
    RocksStore(path).close()
    raw = open_raw(path)
    try:
        with pytest.raises(StoreLocked, match="RocksDB LOCK is held"):
            RocksStore(path)
    finally:
        raw.close()
    with RocksStore(path) as store:  # the failed open left nothing held
        assert store.get(CF_META, SCHEMA_VERSION_KEY) is not None


def test_invalid_second_opener_after_the_lock_file_is_deleted(tmp_path: Path) -> None:
    """RocksDB's lock is a file: with ``LOCK`` deleted a second read-write node got in, and the
    two overwrote each other's MANIFEST (acknowledged writes lost, or a store that no longer
    opened; storage fault probe). The directory itself is locked too. (Within one process
    RocksDB also remembers its locked files, so the holder is another process.)"""
    path = tmp_path / "db"
    holder = spawn(HOLDER, str(path), stdin=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline() == b"ready\n"
        (path / "LOCK").unlink()
        with pytest.raises(StoreLocked, match="already open"):
            RocksStore(path)
        with RocksStore(path, read_only=True) as reader:  # readers take no lock
            assert reader.get(CF_META, SCHEMA_VERSION_KEY) is not None
    finally:
        holder.stdin.write(b"done\n")
        holder.stdin.flush()
        holder.communicate(timeout=30)
    assert holder.returncode == 0
    with RocksStore(path) as store:  # released with the holder
        assert store.get(CF_META, SCHEMA_VERSION_KEY) is not None


WAL_WRITER = r"""
import sys
from storage.rocks import RocksStore
store = RocksStore(sys.argv[1])
for i in range(200):
    with store.atomic_batch() as batch:
        batch.put("training_runs", i.to_bytes(8, "big"), b"v" * 2000)
print("written", flush=True)
sys.stdin.readline()
"""


def test_invalid_wal_damaged_before_its_end_refuses_the_open(tmp_path: Path) -> None:
    """Point-in-time recovery stopped at the first damaged record and dropped every later batch
    silently (64 flipped bytes early in a log emptied a store of a sealed run; storage fault
    probe). A strict open refuses and says what the operator can do; point_in_time, chosen
    explicitly, recovers the batches before the damage. (A torn tail still opens: the SIGKILL
    tests above.)"""
    path = tmp_path / "db"
    writer = spawn(WAL_WRITER, str(path), stdin=subprocess.PIPE)
    assert writer.stdout is not None and writer.stdout.readline() == b"written\n"
    writer.kill()  # every batch is still only in the write-ahead log
    writer.communicate(timeout=30)
    (log,) = path.glob("*.log")
    data = bytearray(log.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    log.write_bytes(bytes(data))
    for mode in ({}, {"read_only": True}):
        with pytest.raises(StorageError, match="write-ahead log is damaged before its end") as info:
            RocksStore(path, create=False, **mode)
        assert '"wal_recovery": "point_in_time"' in str(info.value)
    with RocksStore(path, create=False, wal_recovery="point_in_time") as store:
        kept = [int.from_bytes(k, "big") for k, _ in store.iterate(CF_TRAINING_RUNS)]
    assert kept == list(range(len(kept))) and 0 < len(kept) < 200
    with pytest.raises(ValueError, match="wal_recovery"):
        RocksStore(path, wal_recovery="lenient")


def test_invalid_store_directory_that_cannot_be_made_is_a_storage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StorageError, match="cannot open store directory"):
        RocksStore(tmp_path / "file" / "db")  # its parent is a file


def test_a_close_that_fails_is_a_storage_error_and_still_releases_the_store(tmp_path: Path) -> None:
    """After a failed write (a full disk) RocksDB's close raises "Writer has previous error":
    it was a bare Exception and a traceback at the node's shutdown (storage fault probe)."""
    path = tmp_path / "db"
    store = RocksStore(path)
    real = store._db

    class FailingClose:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def close(self) -> None:
            real.close()
            raise Exception("IO error: Writer has previous error.")

    store._db = FailingClose()
    with pytest.raises(StorageError, match="closing .* failed: IO error: Writer has previous error"):
        store.close()
    with RocksStore(path) as again:  # the directory lock went with it
        assert again.get(CF_META, SCHEMA_VERSION_KEY) is not None


def test_a_read_that_fails_is_a_storage_error_naming_its_family(tmp_path: Path) -> None:
    """rocksdict raises a bare Exception when RocksDB cannot read a block (a damaged table):
    callers handle StorageError only, and the operator needs the family that failed."""
    with RocksStore(tmp_path / "db") as store:
        real = store._views[CF_TRAINING_RUNS]

        class FailingGet:
            def get(self, key: bytes) -> bytes:
                raise Exception("Corruption: block checksum mismatch")

        store._views[CF_TRAINING_RUNS] = FailingGet()
        try:
            with pytest.raises(StorageError, match="read from 'training_runs' failed: Corruption: block checksum"):
                store.get(CF_TRAINING_RUNS, b"run")
        finally:
            store._views[CF_TRAINING_RUNS] = real


def test_an_iteration_that_fails_is_a_storage_error_not_its_end(tmp_path: Path) -> None:
    """A RocksDB iterator that meets a read error stops as it stops after the last key; only its
    status tells them apart. A scan cut short by a damaged block must not read as "no more keys"
    (a run without its later round records, a pruning that misses payloads)."""
    with RocksStore(tmp_path / "db") as store:
        real = store._views[CF_TRAINING_RUNS]

        class FailedIterator:
            def seek(self, key: bytes) -> None:
                pass

            def valid(self) -> bool:
                return False

            def status(self) -> None:
                raise Exception("Corruption: block checksum mismatch")

        class FailingView:
            def iter(self, options: Any) -> FailedIterator:
                return FailedIterator()

        store._views[CF_TRAINING_RUNS] = FailingView()
        try:
            with pytest.raises(StorageError, match="iteration failed: Corruption: block checksum mismatch"):
                list(store.iterate(CF_TRAINING_RUNS))
        finally:
            store._views[CF_TRAINING_RUNS] = real


def test_a_write_that_fails_is_a_storage_error_not_an_acknowledgement(tmp_path: Path) -> None:
    """A batch is acknowledged only once it is written: RocksDB's refusal (a full disk; a bare
    Exception from rocksdict) must reach the caller, which then reports no transition done."""
    with RocksStore(tmp_path / "db") as store:
        real = store._db

        def refuse(batch: Any, options: Any) -> None:
            raise Exception("IO error: No space left on device")

        store._db = WriteHook(real, refuse)
        try:
            with pytest.raises(StorageError, match="write to .* failed: IO error: No space left on device"):
                with store.atomic_batch() as batch:
                    batch.put(CF_TRAINING_RUNS, b"run", b"state")
        finally:
            store._db = real
        assert store.get(CF_TRAINING_RUNS, b"run") is None


def test_invalid_damaged_store_is_not_reported_as_already_open(tmp_path: Path) -> None:
    """RocksDB's "Corruption: block checksum mismatch" holds the letters "lock": it was reported
    as another process holding the LOCK, which sends an operator after the wrong problem."""
    path = tmp_path / "db"
    with RocksStore(path) as store:
        with store.atomic_batch() as batch:
            for i in range(2000):
                batch.put(CF_TRAINING_RUNS, b"k%d" % i, b"v" * 100)
    tables = list(path.glob("*.sst"))
    assert tables  # written at open/close (WAL recovery flushes them)
    for table in tables:
        data = bytearray(table.read_bytes())
        for i in range(100, len(data) - 100, 7):
            data[i] ^= 0xFF
        table.write_bytes(bytes(data))
    with pytest.raises(StorageError) as info:
        RocksStore(path)
    assert "Corruption" in str(info.value) and "already open" not in str(info.value)
    assert str(info.value).startswith(f"cannot open store at {str(path)!r}")
    # Nor as a damaged write-ahead log: point_in_time recovery would not open it either.
    assert "write-ahead log" not in str(info.value) and "point_in_time" not in str(info.value)


def test_invalid_second_opener_in_another_process(tmp_path: Path) -> None:
    path = tmp_path / "db"
    holder = spawn(HOLDER, str(path), stdin=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline() == b"ready\n"
        with pytest.raises(StorageError, match="already open"):
            RocksStore(path)
    finally:
        holder.stdin.write(b"done\n")
        holder.stdin.flush()
        holder.communicate(timeout=30)
    assert holder.returncode == 0
    with RocksStore(path) as store:
        assert store.get(CF_META, SCHEMA_VERSION_KEY) is not None


def _log_bytes(path: Path) -> int:
    """Bytes of the log files in ``path``; one RocksDB deletes between the listing and its stat
    counts as gone (a clean-clone CI run failed on that race with FileNotFoundError)."""
    total = 0
    for log in path.glob("*.log"):
        try:
            total += log.stat().st_size
        except FileNotFoundError:
            pass
    return total


@pytest.mark.parametrize("cap", [4 << 20, 0])
def test_the_write_ahead_log_is_bounded_by_flushing_what_pins_it(tmp_path: Path, cap: int) -> None:
    """Large batches to one family and a few bytes to another, as a node writes run states and
    its liveness stamp: with the cap, RocksDB flushes the small family and drops old log files;
    without it (0: RocksDB's own default, ~4.6 GB here) every log file was kept (soak probe:
    1.19 GB of WAL on a running node for 9.6 MB of data)."""
    value = os.urandom(200 << 10)
    with RocksStore(tmp_path / "db", max_total_wal_bytes=cap) as store:
        for i in range(200):  # 40 MB of log
            with store.atomic_batch() as batch:
                batch.put(CF_TRAINING_RUNS, b"run", value)
                batch.put(CF_META, b"alive", i.to_bytes(8, "big"))
        deadline = time.monotonic() + 30  # the flush, and the deletion of old logs, run in the background
        while True:
            logs = _log_bytes(tmp_path / "db")
            if cap == 0 or logs < 3 * cap or time.monotonic() > deadline:
                break
            # RocksDB checks the cap when it is written to, and skips the check while the oldest
            # log's flush is still running: on a loaded machine (a full suite beside another
            # job) the last big batches left 12.7 MB of logs and no write came after to check
            # again. A node writes its liveness stamp about once a second; so does this loop.
            with store.atomic_batch() as batch:
                batch.put(CF_META, b"alive", time.monotonic_ns().to_bytes(8, "big"))
            time.sleep(0.05)
    if cap == 0:
        assert logs > 35 << 20
    else:
        assert logs < 3 * cap


def _db_options(path: Path) -> dict[str, str]:
    """The DBOptions of the newest OPTIONS file RocksDB wrote in ``path`` (it writes one per open)."""
    newest = max(path.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    section = newest.read_text().split("[DBOptions]")[1].split("[")[0]
    return dict(line.strip().split("=", 1) for line in section.splitlines() if "=" in line)


def test_the_options_rocksdb_runs_with_are_the_documented_ones(tmp_path: Path) -> None:
    """What docs/storage.md promises an operator: a WAL damaged before its end refuses the open
    unless point_in_time is chosen, the log is capped at 256 MiB (a restart after a crash replays
    no more), and four info logs are kept."""
    path = tmp_path / "db"
    RocksStore(path).close()
    options = _db_options(path)
    assert options["wal_recovery_mode"] == "kTolerateCorruptedTailRecords"
    assert options["max_total_wal_size"] == str(256 << 20)
    assert options["keep_log_file_num"] == "4"
    RocksStore(path, create=False, wal_recovery="point_in_time", max_total_wal_bytes=1 << 20).close()
    options = _db_options(path)
    assert options["wal_recovery_mode"] == "kPointInTimeRecovery"
    assert options["max_total_wal_size"] == str(1 << 20)
