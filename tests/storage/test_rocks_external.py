"""RocksStore's large values in files (storage.external): where they go, what a crash leaves,
what the next open removes, and what a damaged or missing file reads as."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from storage import StorageError
from storage.external import DIRECTORY, FILE_MAGIC, MAX_FILE_KEY_BYTES, REF_MAGIC, REF_SIZE, decode_ref, encode_ref
from storage.rocks import EXTERNAL_VALUE_BYTES, RocksStore
from storage.schema import CF_MODEL_STATE, CF_SUBMISSIONS, CF_TRAINING_RUNS, model_key, payload_key

ROOT = Path(__file__).resolve().parents[2]
PAYLOAD = payload_key("task-1", b"\x11" * 32)
FRAGMENT = model_key("task-1", b"w", 0)
BIG = os.urandom(EXTERNAL_VALUE_BYTES)


def files(path: Path) -> list[str]:
    """The store's value files and any other entry of its ``values/``, less readers' links."""
    directory = path / DIRECTORY
    return sorted(e for e in os.listdir(directory) if not e.startswith(".reader-")) if directory.exists() else []


def put(store: RocksStore, cf: str, key: bytes, value: bytes) -> None:
    with store.atomic_batch() as batch:
        batch.put(cf, key, value)


def stored_ref(store: RocksStore, cf: str, key: bytes) -> tuple[bytes, int] | None:
    raw = store._raw_get(cf, key)
    return None if raw is None else decode_ref(raw)


def test_a_large_value_of_an_external_keyspace_goes_to_a_file(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        put(store, CF_MODEL_STATE, FRAGMENT, BIG[::-1])
        ref = stored_ref(store, CF_SUBMISSIONS, PAYLOAD)
        assert ref is not None and ref[1] == len(BIG)
        assert len(store._raw_get(CF_SUBMISSIONS, PAYLOAD) or b"") == REF_SIZE
        assert store.get(CF_SUBMISSIONS, PAYLOAD) == BIG
        assert store.get(CF_MODEL_STATE, FRAGMENT) == BIG[::-1]
        assert store.contains(CF_SUBMISSIONS, PAYLOAD)
        assert list(store.iterate(CF_SUBMISSIONS)) == [(PAYLOAD, BIG)]
        assert list(store.keys(CF_MODEL_STATE)) == [FRAGMENT]
        assert len(files(path)) == 2 and ref[0].hex() in files(path)
        data = (path / DIRECTORY / ref[0].hex()).read_bytes()
        assert data.startswith(FILE_MAGIC) and data.endswith(BIG)
    with RocksStore(path, read_only=True) as store:  # and after a reopen, beside nothing
        assert store.get(CF_SUBMISSIONS, PAYLOAD) == BIG
    assert len(files(path)) == 2


def test_small_values_and_other_families_stay_in_the_key(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG[:EXTERNAL_VALUE_BYTES - 1])
        put(store, CF_TRAINING_RUNS, b"run", BIG)  # large, but no external keyspace
        put(store, CF_SUBMISSIONS, b"\x01not-a-payload-key", BIG)
        assert store._raw_get(CF_SUBMISSIONS, PAYLOAD) == BIG[:EXTERNAL_VALUE_BYTES - 1]
        assert store._raw_get(CF_TRAINING_RUNS, b"run") == BIG
        assert store.get(CF_SUBMISSIONS, b"\x01not-a-payload-key") == BIG
    assert files(path) == []


@pytest.mark.parametrize("value", [REF_MAGIC, REF_MAGIC + b"\x00" * (REF_SIZE - len(REF_MAGIC)), REF_MAGIC + b"x"])
def test_a_small_value_that_looks_like_a_reference_is_stored_in_a_file(tmp_path: Path, value: bytes) -> None:
    # Otherwise a caller's bytes could read back as another value, or as a missing file.
    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, value)
        assert store.get(CF_SUBMISSIONS, PAYLOAD) == value
        assert stored_ref(store, CF_SUBMISSIONS, PAYLOAD) is not None
    assert len(files(path)) == 1


def test_replacing_or_deleting_a_value_removes_its_file_after_the_batch(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        (first,) = files(path)
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG[::-1])
        (second,) = files(path)
        assert second != first and store.get(CF_SUBMISSIONS, PAYLOAD) == BIG[::-1]
        put(store, CF_SUBMISSIONS, PAYLOAD, b"small")  # a small value replaces the file too
        assert files(path) == [] and store.get(CF_SUBMISSIONS, PAYLOAD) == b"small"
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        with store.atomic_batch() as batch:
            batch.delete(CF_SUBMISSIONS, PAYLOAD)
        assert files(path) == [] and store.get(CF_SUBMISSIONS, PAYLOAD) is None


def test_only_a_live_iterator_that_reads_value_files_holds_back_their_removal(tmp_path: Path) -> None:
    """A replaced file waits only for an iterator whose view may still read it: a scan of a family
    without files, or of keys only, must not hold the files of every later batch back (a node
    iterating its runs while it stores model snapshots would keep every old one on disk)."""
    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        put(store, CF_TRAINING_RUNS, b"run", b"state")
        runs = store.iterate(CF_TRAINING_RUNS)
        keys = store.keys(CF_SUBMISSIONS)
        assert next(runs) == (b"run", b"state") and next(keys) == PAYLOAD  # both live
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG[::-1])
        ref = stored_ref(store, CF_SUBMISSIONS, PAYLOAD)
        assert ref is not None and files(path) == [ref[0].hex()]


def test_files_held_back_for_a_live_iterator_are_removed_at_the_close(tmp_path: Path) -> None:
    """A replaced file that waited for an iterator goes with the close: left behind, it would be
    linked and kept by every reader (``tenzro audit``) opened before the next read-write open."""
    path = tmp_path / "db"
    store = RocksStore(path)
    put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
    reading = store.iterate(CF_SUBMISSIONS)
    assert next(reading) == (PAYLOAD, BIG)  # live: its view may still read the old file
    put(store, CF_SUBMISSIONS, PAYLOAD, BIG[::-1])
    ref = stored_ref(store, CF_SUBMISSIONS, PAYLOAD)
    assert ref is not None and len(files(path)) == 2
    store.close()
    assert files(path) == [ref[0].hex()]


def test_only_the_last_operation_on_a_key_in_a_batch_writes_a_file(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with RocksStore(path) as store:
        with store.atomic_batch() as batch:
            batch.put(CF_SUBMISSIONS, PAYLOAD, BIG)
            batch.delete(CF_SUBMISSIONS, PAYLOAD)
            batch.put(CF_SUBMISSIONS, PAYLOAD, BIG[::-1])
            batch.put(CF_MODEL_STATE, FRAGMENT, BIG)
            batch.delete(CF_MODEL_STATE, FRAGMENT)
        assert store.get(CF_SUBMISSIONS, PAYLOAD) == BIG[::-1]
        assert store.get(CF_MODEL_STATE, FRAGMENT) is None
        assert len(files(path)) == 1


def test_a_batch_abandoned_or_failing_to_write_its_file_leaves_nothing(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "db"
    with RocksStore(path) as store:
        with pytest.raises(RuntimeError), store.atomic_batch() as batch:
            batch.put(CF_SUBMISSIONS, PAYLOAD, BIG)
            raise RuntimeError("abandoned")
        assert files(path) == []
        calls = 0
        real_writev = os.writev

        def full_disk(fd: int, buffers: list[memoryview]) -> int:
            nonlocal calls
            calls += 1
            if calls == 2:  # the second file of the batch
                raise OSError(28, "No space left on device")
            return real_writev(fd, buffers)

        monkeypatch.setattr(os, "writev", full_disk)
        with pytest.raises(StorageError, match="No space left on device"), store.atomic_batch() as batch:
            batch.put(CF_TRAINING_RUNS, b"run", b"state")
            batch.put(CF_SUBMISSIONS, PAYLOAD, BIG)
            batch.put(CF_MODEL_STATE, FRAGMENT, BIG)
        monkeypatch.undo()
        assert files(path) == []  # the first file is removed again
        assert store.get(CF_TRAINING_RUNS, b"run") is None and store.get(CF_SUBMISSIONS, PAYLOAD) is None


def test_short_writes_are_continued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_writev = os.writev
    monkeypatch.setattr(os, "writev", lambda fd, buffers: real_writev(fd, [buffers[0][:1000]]))
    with RocksStore(tmp_path / "db") as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        monkeypatch.undo()
        assert store.get(CF_SUBMISSIONS, PAYLOAD) == BIG


def test_an_open_removes_the_files_no_key_names_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        put(store, CF_MODEL_STATE, FRAGMENT, BIG)
        kept = set(files(path))
        # What a writer killed between its files and its batch leaves: a whole file, one cut
        # short inside its header, an empty one; and a file whose key names another file. And
        # one whose header names a key that never holds a reference (its family has no files),
        # though its value reads like one.
        orphan = store._external.write(CF_SUBMISSIONS, payload_key("task-2", b"\x22" * 32), BIG)
        stale = store._external.write(CF_SUBMISSIONS, PAYLOAD, BIG)
        like_a_ref = encode_ref(store._external.write(CF_TRAINING_RUNS, b"run", BIG), len(BIG))
        put(store, CF_TRAINING_RUNS, b"run", like_a_ref)
        (path / DIRECTORY / ("ab" * 16)).write_bytes(FILE_MAGIC + b"\x0b")
        (path / DIRECTORY / ("cd" * 16)).write_bytes(b"")
        (path / DIRECTORY / "not-a-value-file").write_bytes(b"left alone")
        assert orphan.hex() in files(path) and stale.hex() in files(path)
    with RocksStore(path, read_only=True):  # a reader removes nothing
        assert len(files(path)) == 8
    with RocksStore(path) as store:
        assert set(files(path)) == kept | {"not-a-value-file"}
        assert store.get(CF_SUBMISSIONS, PAYLOAD) == BIG and store.get(CF_MODEL_STATE, FRAGMENT) == BIG
        assert store.get(CF_TRAINING_RUNS, b"run") == like_a_ref


def test_a_file_cut_short_in_its_header_but_named_by_its_key_is_kept(tmp_path: Path) -> None:
    # Only a scan of the references can tell; the value then reads as damaged, not as missing.
    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        (name,) = files(path)
    (path / DIRECTORY / name).write_bytes(FILE_MAGIC)
    (path / DIRECTORY / ("ef" * 16)).write_bytes(FILE_MAGIC)
    with RocksStore(path) as store:
        assert files(path) == [name]
        with pytest.raises(StorageError, match="damaged"):
            store.get(CF_SUBMISSIONS, PAYLOAD)


@pytest.mark.parametrize("damage", ["truncate", "extend", "other_key", "missing"])
def test_a_damaged_or_missing_file_is_a_storage_error(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        put(store, CF_MODEL_STATE, FRAGMENT, BIG)
        ref = stored_ref(store, CF_SUBMISSIONS, PAYLOAD)
        other = stored_ref(store, CF_MODEL_STATE, FRAGMENT)
        assert ref is not None and other is not None
        target = path / DIRECTORY / ref[0].hex()
        if damage == "truncate":
            target.write_bytes(target.read_bytes()[:-1])
        elif damage == "extend":
            target.write_bytes(target.read_bytes() + b"\x00")
        elif damage == "other_key":
            target.write_bytes((path / DIRECTORY / other[0].hex()).read_bytes())
        else:
            target.unlink()
        # A stat tells a missing file, or one of another size (here the other key's, whose
        # header is of another length; one of the same size is told only by a read).
        assert not store.holds_value(CF_SUBMISSIONS, PAYLOAD)
        message = {"truncate": "damaged", "extend": "damaged", "other_key": "another key", "missing": "missing"}[damage]
        with pytest.raises(StorageError, match=message):
            store.get(CF_SUBMISSIONS, PAYLOAD)
        with pytest.raises(StorageError, match=message):
            list(store.iterate(CF_SUBMISSIONS))
        assert store.contains(CF_SUBMISSIONS, PAYLOAD)  # the key is there; its value is not
        assert list(store.keys(CF_SUBMISSIONS)) == [PAYLOAD]  # keys only (a pruning): no value file read
        assert store.get(CF_MODEL_STATE, FRAGMENT) == BIG


def test_a_value_stored_in_its_key_by_an_older_store_still_reads(tmp_path: Path) -> None:
    # Schema version 5 kept every value in its key: that is a store whose threshold is never met.
    path = tmp_path / "db"
    with RocksStore(path, external_value_bytes=1 << 40) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
    with RocksStore(path) as store:
        assert store.get(CF_SUBMISSIONS, PAYLOAD) == BIG and files(path) == []
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG[::-1])
        assert store.get(CF_SUBMISSIONS, PAYLOAD) == BIG[::-1] and len(files(path)) == 1


def test_a_checkpoint_carries_the_files_and_outlives_the_store_removing_them(tmp_path: Path) -> None:
    path, copy = tmp_path / "db", tmp_path / "copy"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        store.create_checkpoint(copy)
        with store.atomic_batch() as batch:
            batch.delete(CF_SUBMISSIONS, PAYLOAD)
        assert files(path) == []
    assert len(files(copy)) == 1
    assert (copy / DIRECTORY / files(copy)[0]).stat().st_nlink == 1  # its own link now
    with RocksStore(copy, read_only=True) as store:
        assert store.get(CF_SUBMISSIONS, PAYLOAD) == BIG
    with RocksStore(copy) as store:
        assert store.get(CF_SUBMISSIONS, PAYLOAD) == BIG


def test_sync_store_fsyncs_the_file_and_its_directory_before_the_batch(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    with RocksStore(tmp_path / "db", sync=True) as store:
        monkeypatch.setattr(os, "fsync", fsync)
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        monkeypatch.undo()
        (name,) = files(tmp_path / "db")
    assert synced == [str(tmp_path / "db" / DIRECTORY / name), str(tmp_path / "db" / DIRECTORY)]


_KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[1])
    from storage.rocks import RocksStore
    from storage.schema import CF_SUBMISSIONS, CF_TRAINING_RUNS, payload_key
    store = RocksStore(sys.argv[2])
    value = bytes(range(256)) * 1024
    with store.atomic_batch() as batch:  # acknowledged
        batch.put(CF_SUBMISSIONS, payload_key("task-1", b"\\x11" * 32), value)
    die = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
    if sys.argv[3] == "before-batch":  # the files are written, the batch is not
        store._write = die
    else:  # the batch is written, the file it deleted the key of is not removed
        store._remove_files = die
    with store.atomic_batch() as batch:
        batch.put(CF_TRAINING_RUNS, b"run", b"state")
        batch.put(CF_SUBMISSIONS, payload_key("task-2", b"\\x22" * 32), value)
        batch.delete(CF_SUBMISSIONS, payload_key("task-1", b"\\x11" * 32))
""")


@pytest.mark.parametrize("when", ["before-batch", "before-removal"])
def test_a_writer_killed_between_its_files_and_its_batch_loses_nothing_acknowledged(tmp_path: Path, when: str) -> None:
    path = tmp_path / "db"
    result = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(ROOT), str(path), when], capture_output=True)
    assert result.returncode == -signal.SIGKILL, result.stderr.decode()
    value = bytes(range(256)) * 1024
    assert len(files(path)) == 2
    with RocksStore(path) as store:
        first = store.get(CF_SUBMISSIONS, payload_key("task-1", b"\x11" * 32))
        second = store.get(CF_SUBMISSIONS, payload_key("task-2", b"\x22" * 32))
        # Both left 2 files; the open removed the one no key names.
        if when == "before-batch":  # the second batch never happened
            assert first == value and second is None and store.get(CF_TRAINING_RUNS, b"run") is None
        else:
            assert first is None and second == value and store.get(CF_TRAINING_RUNS, b"run") == b"state"
        assert len(files(path)) == 1


def test_invalid_threshold(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="external_value_bytes"):
        RocksStore(tmp_path / "db", external_value_bytes=0)
    assert not (tmp_path / "db").exists()


def test_a_reader_beside_the_writer_keeps_reading_the_values_of_its_view(tmp_path: Path) -> None:
    # The writer replaces a model fragment (a snapshot) and deletes a payload (pruning) while a
    # read-only opener (an audit) holds a view from before: the view's files stay readable.
    path = tmp_path / "db"
    with RocksStore(path) as writer:
        put(writer, CF_SUBMISSIONS, PAYLOAD, BIG)
        put(writer, CF_MODEL_STATE, FRAGMENT, BIG)
        reader = RocksStore(path, read_only=True)
        try:
            with writer.atomic_batch() as batch:
                batch.delete(CF_SUBMISSIONS, PAYLOAD)
                batch.put(CF_MODEL_STATE, FRAGMENT, BIG[::-1])
            assert len(files(path)) == 1  # the writer removed the two old files
            assert reader.get(CF_SUBMISSIONS, PAYLOAD) == BIG
            assert reader.get(CF_MODEL_STATE, FRAGMENT) == BIG
            assert list(reader.iterate(CF_MODEL_STATE)) == [(FRAGMENT, BIG)]
            (pinned,) = [e for e in os.listdir(path / DIRECTORY) if e.startswith(".reader-")]
        finally:
            reader.close()
        assert not (path / DIRECTORY / pinned).exists()  # the close removes its links
        assert writer.get(CF_MODEL_STATE, FRAGMENT) == BIG[::-1]


_KILLED_READER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[1])
    from storage.rocks import RocksStore
    store = RocksStore(sys.argv[2], read_only=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_read_write_open_removes_the_links_of_readers_that_were_killed(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
    result = subprocess.run([sys.executable, "-c", _KILLED_READER, str(ROOT), str(path)], capture_output=True)
    assert result.returncode == -signal.SIGKILL, result.stderr.decode()
    (dead,) = [e for e in os.listdir(path / DIRECTORY) if e.startswith(".reader-")]
    live = RocksStore(path, read_only=True)  # this process is alive: its links stay
    try:
        with RocksStore(path) as store:
            readers = [e for e in os.listdir(path / DIRECTORY) if e.startswith(".reader-")]
            assert dead not in readers and len(readers) == 1
            assert store.get(CF_SUBMISSIONS, PAYLOAD) == BIG
            assert live.get(CF_SUBMISSIONS, PAYLOAD) == BIG
    finally:
        live.close()


class _RecordingDb:
    """The store's rocksdict handle, recording ``flush_wal`` calls into ``events``."""

    def __init__(self, db: object, events: list[str]) -> None:
        self._db, self._events = db, events

    def flush_wal(self, sync: bool) -> None:
        self._events.append(f"flush_wal({sync})")
        self._db.flush_wal(sync)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._db, name)


def test_without_sync_the_log_is_synced_before_a_replaced_file_is_removed(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # An unlink reaches the journal within seconds, an unsynced log record may not: a power loss
    # in between would reopen the store at a state naming a removed file (review, 2026-11-27).
    events: list[str] = []
    real_unlink = os.unlink
    monkeypatch.setattr(os, "unlink", lambda path, *a, **k: (events.append(f"unlink {os.path.basename(path)}"),
                                                             real_unlink(path, *a, **k))[1])
    with RocksStore(tmp_path / "db") as store:
        store._db = _RecordingDb(store._db, events)
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        put(store, CF_MODEL_STATE, FRAGMENT, BIG)
        assert events == []  # a fresh value removes nothing and syncs nothing
        (old,) = [name for name in files(tmp_path / "db") if stored_ref(store, CF_SUBMISSIONS, PAYLOAD)[0].hex() == name]  # type: ignore[index]
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG[::-1])
        assert events == ["flush_wal(True)", f"unlink {old}"]
        store._db = store._db._db


def test_a_file_written_between_a_readers_listing_and_its_open_is_pinned_too(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from storage.external import ExternalValues

    path = tmp_path / "db"
    with RocksStore(path) as writer:
        put(writer, CF_MODEL_STATE, FRAGMENT, BIG)
        real_pin = ExternalValues.pin
        calls = 0

        def pin(self: ExternalValues) -> None:
            nonlocal calls
            real_pin(self)
            calls += 1
            if calls == 1:  # a snapshot lands between the reader's listing and its open
                put(writer, CF_MODEL_STATE, FRAGMENT, BIG[::-1])

        monkeypatch.setattr(ExternalValues, "pin", pin)
        with RocksStore(path, read_only=True) as reader:
            monkeypatch.undo()
            put(writer, CF_MODEL_STATE, FRAGMENT, BIG)  # the next snapshot, during the audit
            assert reader.get(CF_MODEL_STATE, FRAGMENT) == BIG[::-1]


def test_a_reader_retries_an_open_whose_view_names_a_file_it_could_not_pin(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # A file the writer removed between the reader's open and its second listing cannot be
    # linked: that view is dropped and a newer one opened, a bounded number of times.
    from storage.external import ExternalValues

    path = tmp_path / "db"
    with RocksStore(path) as writer:
        put(writer, CF_MODEL_STATE, FRAGMENT, BIG)
    opens, answers = 0, iter([False, False, True])
    real_open = RocksStore._open_once

    def open_once(self: RocksStore, create: bool) -> None:
        nonlocal opens
        opens += 1
        real_open(self, create)

    monkeypatch.setattr(RocksStore, "_open_once", open_once)
    monkeypatch.setattr(ExternalValues, "is_pinned", lambda self, name: next(answers))
    with RocksStore(path, read_only=True) as reader:
        assert opens == 3 and reader.get(CF_MODEL_STATE, FRAGMENT) == BIG
    assert [e for e in os.listdir(path / DIRECTORY) if e.startswith(".reader-")] == []  # dropped views' too
    # Never pinned (a file simply lost looks the same): the fifth view is kept, and only the
    # reads that need the missing file fail.
    opens = 0
    monkeypatch.setattr(ExternalValues, "is_pinned", lambda self, name: False)
    with RocksStore(path, read_only=True) as reader:
        assert opens == 5 and reader.get(CF_MODEL_STATE, FRAGMENT) == BIG
    assert [e for e in os.listdir(path / DIRECTORY) if e.startswith(".reader-")] == []


def test_a_lost_file_fails_the_reads_that_need_it_not_the_open(tmp_path: Path) -> None:
    path = tmp_path / "db"
    other = model_key("task-2", b"w", 0)
    with RocksStore(path) as store:
        put(store, CF_MODEL_STATE, FRAGMENT, BIG)
        put(store, CF_MODEL_STATE, other, BIG[::-1])
        lost = stored_ref(store, CF_MODEL_STATE, FRAGMENT)
    assert lost is not None
    (path / DIRECTORY / lost[0].hex()).unlink()
    with RocksStore(path, read_only=True) as reader:
        assert reader.get(CF_MODEL_STATE, other) == BIG[::-1]
        with pytest.raises(StorageError, match="missing"):
            reader.get(CF_MODEL_STATE, FRAGMENT)


def test_reads_beside_a_writer_thread_never_meet_a_removed_file(tmp_path: Path) -> None:
    import threading
    import time

    with RocksStore(tmp_path / "db", external_value_bytes=1) as store:
        put(store, CF_MODEL_STATE, FRAGMENT, b"v0")
        stop = time.monotonic() + 1.5
        errors: list[BaseException] = []

        def write() -> None:
            i = 0
            while time.monotonic() < stop:
                i += 1
                put(store, CF_MODEL_STATE, FRAGMENT, b"v%d" % i)

        def read() -> None:
            try:
                while time.monotonic() < stop:
                    for _ in range(20):
                        assert (store.get(CF_MODEL_STATE, FRAGMENT) or b"").startswith(b"v")
                    for _, value in store.iterate(CF_MODEL_STATE):
                        assert value.startswith(b"v")
            except BaseException as error:  # reported below
                errors.append(error)

        threads = [threading.Thread(target=write), threading.Thread(target=read)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []


def test_a_key_too_long_for_a_file_header_keeps_its_value(tmp_path: Path) -> None:
    key = PAYLOAD + b"k" * 70_000
    like_a_ref = REF_MAGIC + bytes(REF_SIZE - len(REF_MAGIC))
    with RocksStore(tmp_path / "db") as store:
        put(store, CF_SUBMISSIONS, key, BIG)
        assert store.get(CF_SUBMISSIONS, key) == BIG and store._raw_get(CF_SUBMISSIONS, key) == BIG
        put(store, CF_SUBMISSIONS, key, like_a_ref)  # in the key, so never read as a reference
        assert store.get(CF_SUBMISSIONS, key) == like_a_ref
        assert list(store.iterate(CF_SUBMISSIONS)) == [(key, like_a_ref)]
    assert files(tmp_path / "db") == []


def test_a_key_as_long_as_a_file_header_holds_still_puts_its_value_in_a_file(tmp_path: Path) -> None:
    """The limit is the header's (a 16-bit key length): a key of exactly that length fits, and
    its large value must not go through the write-ahead log."""
    key = PAYLOAD + b"k" * (MAX_FILE_KEY_BYTES - len(PAYLOAD))
    with RocksStore(tmp_path / "db") as store:
        put(store, CF_SUBMISSIONS, key, BIG)
        ref = stored_ref(store, CF_SUBMISSIONS, key)
        assert ref is not None and files(tmp_path / "db") == [ref[0].hex()]
        assert store.get(CF_SUBMISSIONS, key) == BIG and list(store.iterate(CF_SUBMISSIONS)) == [(key, BIG)]


def test_a_writer_removes_the_links_of_dead_readers_as_it_goes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import storage.rocks

    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        result = subprocess.run([sys.executable, "-c", _KILLED_READER, str(ROOT), str(path)], capture_output=True)
        assert result.returncode == -signal.SIGKILL, result.stderr.decode()
        assert any(e.startswith(".reader-") for e in os.listdir(path / DIRECTORY))
        monkeypatch.setattr(storage.rocks, "_READER_SWEEP_S", 0.0)
        with store.atomic_batch() as batch:
            batch.delete(CF_SUBMISSIONS, PAYLOAD)
        assert os.listdir(path / DIRECTORY) == []  # the payload's file and the dead reader's link


def test_a_reader_refused_links_or_its_directory_reads_the_files_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An auditor that is not the node's user may have no write access to values/, or
    # fs.protected_hardlinks refuses its links to the node's files: the audit still opens,
    # without the guarantee against removals.
    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)

    def refuse(*args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", refuse)
    with RocksStore(path, read_only=True) as reader:
        assert reader.get(CF_SUBMISSIONS, PAYLOAD) == BIG
        assert [e for e in os.listdir(path / DIRECTORY) if e.startswith(".reader-")] == []
    monkeypatch.undo()
    monkeypatch.setattr(os, "mkdir", refuse)  # no write access to values/ at all
    with RocksStore(path, read_only=True) as reader:
        assert reader.get(CF_SUBMISSIONS, PAYLOAD) == BIG


def test_a_failing_log_sync_keeps_the_batch_and_the_replaced_file(tmp_path: Path) -> None:
    # The batch is written by then: it must not read as failed, and the file it replaced must
    # stay until a sync succeeds (a later batch) or the next open sweeps it.
    class FailingSync(_RecordingDb):
        def flush_wal(self, sync: bool) -> None:
            raise Exception("IO error: sync failed")

    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        real = store._db
        store._db = FailingSync(real, [])
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG[::-1])  # no error
        assert store.get(CF_SUBMISSIONS, PAYLOAD) == BIG[::-1] and len(files(path)) == 2
        store._db = real
        put(store, CF_MODEL_STATE, FRAGMENT, BIG)
        with store.atomic_batch() as batch:
            batch.delete(CF_MODEL_STATE, FRAGMENT)
        assert len(files(path)) == 1  # both replaced files went with the next sync


_SLEEPING_READER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from storage.rocks import RocksStore
    store = RocksStore(sys.argv[2], read_only=True)
    print("open", flush=True)
    time.sleep(60)
""")


def test_a_reader_counts_as_alive_while_it_holds_its_lock_whatever_its_pid_says(tmp_path: Path) -> None:
    # A reader in another PID namespace (a container) has a pid this process cannot see: the
    # writer must judge it by its lock, not by its pid (review, 2026-11-27).
    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        reader = subprocess.Popen([sys.executable, "-c", _SLEEPING_READER, str(ROOT), str(path)], stdout=subprocess.PIPE)
        try:
            assert reader.stdout is not None and reader.stdout.readline() == b"open\n"
            (mine,) = [e for e in os.listdir(path / DIRECTORY) if e.startswith(".reader-")]
            foreign = path / DIRECTORY / ".reader-999999999-feedbeef"
            os.rename(path / DIRECTORY / mine, foreign)  # as a pid of another namespace reads here
            store._external.remove_dead_readers()
            assert foreign.exists()
        finally:
            reader.kill()
            reader.wait()
        store._external.remove_dead_readers()
        assert not foreign.exists()


def test_without_sync_a_replacing_value_is_durable_before_its_batch_and_a_fresh_one_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its batch removes the value it replaces: a power loss must not take both (review).
    events: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        events.append("fsync " + os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    class Recording(_RecordingDb):
        def write(self, *args: object) -> None:
            self._events.append("write")
            self._db.write(*args)  # type: ignore[attr-defined]

    with RocksStore(tmp_path / "db") as store:
        store._db = Recording(store._db, events)
        monkeypatch.setattr(os, "fsync", fsync)
        put(store, CF_MODEL_STATE, FRAGMENT, BIG)
        assert events == ["write"]
        events.clear()
        put(store, CF_MODEL_STATE, FRAGMENT, BIG[::-1])
        new = stored_ref(store, CF_MODEL_STATE, FRAGMENT)
        assert new is not None
        assert events[:3] == [f"fsync {new[0].hex()}", f"fsync {DIRECTORY}", "write"]
        assert events[3] == "flush_wal(True)"
        events.clear()
        put(store, CF_SUBMISSIONS, PAYLOAD, b"small")  # a value in its key, replaced by a file
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        new = stored_ref(store, CF_SUBMISSIONS, PAYLOAD)
        assert new is not None and events == ["write", f"fsync {new[0].hex()}", f"fsync {DIRECTORY}", "write"]
        monkeypatch.undo()
        store._db = store._db._db


def test_a_checkpoint_makes_its_value_files_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    with RocksStore(tmp_path / "db") as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        put(store, CF_MODEL_STATE, FRAGMENT, BIG)
        monkeypatch.setattr(os, "fsync", fsync)
        store.create_checkpoint(tmp_path / "copy")
        monkeypatch.undo()
    assert set(files(tmp_path / "db")) <= set(synced)


# --- the page cache: written files are dropped from it once written back ---------------------------


def _open_fds_under(directory: Path) -> int:
    """How many of this process's file descriptors are open on a file in ``directory``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory) + os.sep)
        except OSError:
            pass  # the descriptor listdir itself used
    return count


def _resident_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache (mincore(2) over a shared read-only mapping)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vector = ctypes.create_string_buffer(pages)
            assert libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
            return sum(b & 1 for b in vector.raw)
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


def _filesystem_of(path: Path) -> str:
    """The type of the filesystem ``path`` is on (the longest mount point above it)."""
    best, kind = "", ""
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            point = fields[1].replace("\\040", " ")
            if str(path).startswith(point.rstrip("/") + "/") and len(point) > len(best):
                best, kind = point, fields[2]
    return kind


def test_each_written_file_is_advised_out_of_the_page_cache_now_and_again_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import storage.external as external
    from storage.external import DROP_LAG

    advised: list[str] = []
    real = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        assert (offset, length, advice) == (0, 0, os.POSIX_FADV_DONTNEED)
        advised.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd, offset, length, advice)

    monkeypatch.setattr(external, "_FADVISE", spy)
    path = tmp_path / "db"
    names = []
    with RocksStore(path) as store:
        for i in range(DROP_LAG + 3):
            put(store, CF_SUBMISSIONS, payload_key("task-1", bytes([i]) * 32), BIG)
            ref = stored_ref(store, CF_SUBMISSIONS, payload_key("task-1", bytes([i]) * 32))
            assert ref is not None
            names.append(ref[0].hex())
        # The first three were asked twice (DROP_LAG files later) and closed; the rest once,
        # and they stay open until then (on the store's dropping thread: waited for).
        expected = [2] * 3 + [1] * DROP_LAG
        deadline = time.monotonic() + 10
        while (([advised.count(n) for n in names], _open_fds_under(path / DIRECTORY)) != (expected, DROP_LAG)
               and time.monotonic() < deadline):
            time.sleep(0.01)
        assert [advised.count(n) for n in names] == expected
        assert _open_fds_under(path / DIRECTORY) == DROP_LAG
        assert store.get(CF_SUBMISSIONS, payload_key("task-1", b"\x00" * 32)) == BIG
    assert [advised.count(n) for n in names] == [2] * len(names)  # the close asks for the rest
    assert _open_fds_under(path / DIRECTORY) == 0


def test_files_no_longer_in_the_page_cache_read_back_whole(tmp_path: Path) -> None:
    if _filesystem_of(tmp_path) in ("tmpfs", "ramfs", ""):
        pytest.skip(f"{tmp_path} is on a filesystem whose pages are its only copy ({_filesystem_of(tmp_path)!r})")
    from storage.external import DROP_LAG

    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_MODEL_STATE, FRAGMENT, BIG)
        put(store, CF_MODEL_STATE, FRAGMENT, BIG[::-1])  # replacing: fsynced, so dropped at once
        ref = stored_ref(store, CF_MODEL_STATE, FRAGMENT)
        assert ref is not None
        deadline = time.monotonic() + 10
        while _resident_pages(path / DIRECTORY / ref[0].hex()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _resident_pages(path / DIRECTORY / ref[0].hex()) == 0
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)  # fresh: its writeback started, pages kept for now
        payload = stored_ref(store, CF_SUBMISSIONS, PAYLOAD)
        assert payload is not None
        os.sync()  # written back; the next ask, DROP_LAG files later, drops it
        for i in range(DROP_LAG):
            put(store, CF_SUBMISSIONS, payload_key("task-2", bytes([i]) * 32), BIG[:EXTERNAL_VALUE_BYTES])
        deadline = time.monotonic() + 10  # the store's dropping thread asks
        while _resident_pages(path / DIRECTORY / payload[0].hex()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _resident_pages(path / DIRECTORY / payload[0].hex()) == 0
        assert store.get(CF_MODEL_STATE, FRAGMENT) == BIG[::-1]
        assert store.get(CF_SUBMISSIONS, PAYLOAD) == BIG


def test_a_filesystem_refusing_the_advice_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import storage.external as external

    def refuse(fd: int, offset: int, length: int, advice: int) -> None:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(external, "_FADVISE", refuse)
    path = tmp_path / "db"
    with RocksStore(path) as store:
        for i in range(12):
            put(store, CF_SUBMISSIONS, payload_key("task-1", bytes([i]) * 32), BIG)
        assert store.get(CF_SUBMISSIONS, payload_key("task-1", b"\x05" * 32)) == BIG
    assert _open_fds_under(path / DIRECTORY) == 0
    with RocksStore(path, read_only=True) as store:
        assert len(list(store.keys(CF_SUBMISSIONS))) == 12


def test_value_files_held_for_the_cache_are_closed_when_their_owner_is_dropped_unclosed(tmp_path: Path) -> None:
    import gc

    from storage.external import ExternalValues

    directory = tmp_path / "values"
    values = ExternalValues(str(directory), sync=False)
    values.create_directory()
    for i in range(3):
        values.write(CF_SUBMISSIONS, payload_key("task-1", bytes([i]) * 32), BIG)
    assert _open_fds_under(directory) == 3  # handed to the dropping thread, held
    thread = values._dropper._thread  # type: ignore[union-attr]
    del values
    gc.collect()
    assert _open_fds_under(directory) == 0
    assert not thread.is_alive()


def test_a_writer_closes_its_files_itself_past_the_dropping_threads_backlog(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import storage.external as external

    gate = threading.Event()
    real = external.advise

    def slow(fd: int) -> None:  # the dropping thread stalls on its first file
        if threading.current_thread().name == "tenzro-value-files":
            gate.wait(10)
        real(fd)

    monkeypatch.setattr(external, "MAX_DROP_BACKLOG", 4)
    monkeypatch.setattr(external, "advise", slow)
    directory = tmp_path / "values"
    values = external.ExternalValues(str(directory), sync=False)
    values.create_directory()
    try:
        values.write(CF_SUBMISSIONS, payload_key("task-1", b"\xff" * 32), BIG[:1000])
        deadline = time.monotonic() + 10
        while not values._dropper._queue.empty() and time.monotonic() < deadline:  # type: ignore[union-attr]
            time.sleep(0.001)  # until the thread has taken it, and stalls
        for i in range(11):
            values.write(CF_SUBMISSIONS, payload_key("task-1", bytes([i]) * 32), BIG[:1000])
        # One taken by the stalled thread, 4 waiting: the writer closed the other 7 itself.
        assert _open_fds_under(directory) == 1 + 4
    finally:
        gate.set()
        values.release_cached()
    assert _open_fds_under(directory) == 0


def _write_some(values: object, count: int) -> None:
    for i in range(count):
        values.write(CF_SUBMISSIONS, payload_key("task-1", bytes([i]) * 32), BIG[:1000])  # type: ignore[attr-defined]


def test_without_posix_fadvise_each_file_is_closed_at_once_and_no_thread_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import storage.external as external

    monkeypatch.setattr(external, "_FADVISE", None)  # macOS has none
    values = external.ExternalValues(str(tmp_path / "values"), sync=False)
    values.create_directory()
    _write_some(values, 80)  # more than DROP_LAG + MAX_DROP_BACKLOG
    assert values._dropper is None
    assert _open_fds_under(tmp_path / "values") == 0


def test_a_write_racing_the_close_closes_its_own_file(tmp_path: Path) -> None:
    from storage.external import ExternalValues

    values = ExternalValues(str(tmp_path / "values"), sync=False)
    values.create_directory()
    _write_some(values, 3)
    values.release_cached()
    _write_some(values, 3)  # after the close's release: no new thread to hold them
    assert values._dropper is None
    assert _open_fds_under(tmp_path / "values") == 0


def test_a_thread_that_cannot_start_costs_the_cache_not_the_write(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import storage.external as external

    def refuse() -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(external, "_Dropper", refuse)
    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        assert store.get(CF_SUBMISSIONS, PAYLOAD) == BIG
        assert _open_fds_under(path / DIRECTORY) == 0


def test_the_dropping_thread_outlives_an_unexpected_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import storage.external as external

    real = external.advise
    failed: list[int] = []

    def fail_once(fd: int) -> None:
        if not failed and threading.current_thread().name == "tenzro-value-files":
            failed.append(fd)
            raise ValueError("unexpected")
        real(fd)

    monkeypatch.setattr(external, "advise", fail_once)
    values = external.ExternalValues(str(tmp_path / "values"), sync=False)
    values.create_directory()
    _write_some(values, 12)
    values.release_cached()
    assert failed and _open_fds_under(tmp_path / "values") == 0


def test_entries_not_named_as_value_files_are_left_alone(tmp_path: Path) -> None:
    # Only 32 lowercase hex digits name a value file: an open neither removes nor reads
    # anything else in values/ (another name's bytes.fromhex would fail the open), and a
    # checkpoint does not copy it.
    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        (name,) = files(path)
    whole = (path / DIRECTORY / name).read_bytes()
    strays = ["ab" * 17, "AB" * 16, "g" * 32, name[:-1]]
    for stray in strays:
        (path / DIRECTORY / stray).write_bytes(whole)
    (path / DIRECTORY / ("12" * 16)).mkdir()  # named like a file, but cannot be opened as one
    (path / DIRECTORY / "other-directory").mkdir()  # not a reader's: no lock to judge it by
    with RocksStore(path) as store:
        assert files(path) == sorted([name, "12" * 16, "other-directory", *strays])
        assert store.get(CF_SUBMISSIONS, PAYLOAD) == BIG
        (path / DIRECTORY / ("12" * 16)).rmdir()
        store.create_checkpoint(tmp_path / "copy")
    assert files(tmp_path / "copy") == [name]


def test_a_value_of_a_references_size_without_its_magic_stays_in_the_key(tmp_path: Path) -> None:
    value = b"\x00" * REF_SIZE
    with RocksStore(tmp_path / "db") as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, value)
        assert store._raw_get(CF_SUBMISSIONS, PAYLOAD) == value
        assert store.get(CF_SUBMISSIONS, PAYLOAD) == value
    assert files(tmp_path / "db") == []


def test_decode_ref_reads_only_a_whole_reference() -> None:
    ref = encode_ref(b"\x11" * 16, 12345)
    assert len(ref) == REF_SIZE and decode_ref(ref) == (b"\x11" * 16, 12345)
    assert decode_ref(ref + b"\x00") is None
    assert decode_ref(ref[:-1]) is None
    assert decode_ref(REF_MAGIC + b"x") is None
    assert decode_ref(b"\x00" + ref[1:]) is None


def test_the_scan_names_the_files_whose_header_does_not_read(tmp_path: Path) -> None:
    from storage.external import ExternalFile, ExternalValues

    values = ExternalValues(str(tmp_path / "values"), sync=False)
    values.create_directory()
    whole = values.write(CF_SUBMISSIONS, PAYLOAD, b"value")
    header = FILE_MAGIC + bytes((len(CF_SUBMISSIONS),)) + CF_SUBMISSIONS.encode()
    cut = {
        "01" * 16: b"TZXV\x00\x02\x00\x00" + header[len(FILE_MAGIC):] + b"\x00\x01k",  # not the magic
        "02" * 16: header + b"\x00",  # cut inside the key's length
        "03" * 16: header + b"\x00\x05abc",  # cut inside the key
        "04" * 16: FILE_MAGIC + b"\x0b" + b"subm",  # cut inside the family's name
    }
    for entry, data in cut.items():
        (tmp_path / "values" / entry).write_bytes(data)
    found = list(values.scan())
    assert found == sorted([ExternalFile(whole, CF_SUBMISSIONS, PAYLOAD), *map(bytes.fromhex, cut)],
                           key=lambda f: f.hex() if isinstance(f, bytes) else f.name.hex())
    values.release_cached()


def test_create_directory_refuses_a_file_in_its_place_and_syncs_its_parent(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import storage.external as external

    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StorageError, match="exists and is not a directory"):
        external.ExternalValues(str(tmp_path / "file"), sync=True).create_directory()
    synced: list[str] = []
    monkeypatch.setattr(external, "fsync_directory", synced.append)
    external.ExternalValues(str(tmp_path / "values"), sync=True).create_directory()
    external.ExternalValues(str(tmp_path / "values"), sync=True).create_directory()  # there already
    external.ExternalValues(str(tmp_path / "other"), sync=False).create_directory()
    assert synced == [str(tmp_path)]


def test_a_write_that_writes_nothing_is_a_storage_error_and_leaves_no_file(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from storage.external import ExternalValues

    values = ExternalValues(str(tmp_path / "values"), sync=False)
    values.create_directory()
    monkeypatch.setattr(os, "writev", lambda fd, buffers: 0)
    with pytest.raises(StorageError, match="write returned 0"):
        values.write(CF_SUBMISSIONS, PAYLOAD, b"value")
    assert os.listdir(tmp_path / "values") == []


def test_a_reader_whose_links_were_removed_reads_the_files_in_place(tmp_path: Path) -> None:
    # A writer that took the reader for dead removed its links: the files still there read.
    import shutil

    path = tmp_path / "db"
    with RocksStore(path) as writer:
        put(writer, CF_SUBMISSIONS, PAYLOAD, BIG)
        with RocksStore(path, read_only=True) as reader:
            (pinned,) = [e for e in os.listdir(path / DIRECTORY) if e.startswith(".reader-")]
            shutil.rmtree(path / DIRECTORY / pinned)
            assert reader.holds_value(CF_SUBMISSIONS, PAYLOAD)
            assert reader.get(CF_SUBMISSIONS, PAYLOAD) == BIG


def test_a_read_only_open_of_a_store_without_its_values_directory(tmp_path: Path) -> None:
    # A store an older version wrote has no values/: a reader has nothing to pin, and no error.
    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_TRAINING_RUNS, b"run", b"small")
    (path / DIRECTORY).rmdir()
    with RocksStore(path, read_only=True) as reader:
        assert reader.get(CF_TRAINING_RUNS, b"run") == b"small"
    assert not (path / DIRECTORY).exists()


def test_a_reader_that_cannot_pin_fails_its_open_and_leaves_nothing_behind(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import fcntl

    from storage.external import ExternalValues

    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        (name,) = files(path)

    def too_many_links(*args: object) -> None:
        raise OSError(errno.EMLINK, "Too many links")

    monkeypatch.setattr(os, "link", too_many_links)
    with pytest.raises(StorageError, match="cannot pin the value files of a read-only open in .*Too many links"):
        RocksStore(path, read_only=True)
    assert os.listdir(path / DIRECTORY) == [name]
    values = ExternalValues(str(path / DIRECTORY), sync=False)
    with pytest.raises(StorageError, match="Too many links"):
        values.pin()  # itself, not only the store's close, removes what it made
    assert os.listdir(path / DIRECTORY) == [name] and not values.has_files()
    monkeypatch.undo()
    monkeypatch.setattr(fcntl, "flock", too_many_links)
    with pytest.raises(StorageError, match="cannot pin the value files of a read-only open"):
        RocksStore(path, read_only=True)
    assert os.listdir(path / DIRECTORY) == [name]
    monkeypatch.undo()
    with RocksStore(path, read_only=True) as reader:
        assert reader.get(CF_SUBMISSIONS, PAYLOAD) == BIG
    assert os.listdir(path / DIRECTORY) == [name] and _open_fds_under(path / DIRECTORY) == 0  # its lock closed


def test_a_writer_open_removes_old_pinning_and_lockless_reader_directories(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)
        (name,) = files(path)
    old, new, lockless = (path / DIRECTORY / e for e in (".pinning-1-aa", ".pinning-2-bb", ".reader-3-cc"))
    for directory in (old, new, lockless):
        directory.mkdir()
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))  # a reader that died making it
    with RocksStore(path) as store:
        assert sorted(os.listdir(path / DIRECTORY)) == [".pinning-2-bb", name]  # one making it now stays
        assert store.get(CF_SUBMISSIONS, PAYLOAD) == BIG


def test_value_files_edge_cases_of_a_missing_or_odd_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import storage.external as external

    missing = external.ExternalValues(str(tmp_path / "none"), sync=False)
    assert list(missing.scan()) == []
    missing.remove([b"\x00" * 16])  # already gone: skipped
    synced: list[str] = []
    monkeypatch.setattr(external, "fsync_directory", synced.append)
    missing.link_into(str(tmp_path / "copy"))  # a checkpoint of a store with no value file
    assert os.listdir(tmp_path / "copy") == [] and synced == [str(tmp_path / "copy"), str(tmp_path)]
    values = external.ExternalValues(str(tmp_path / "values"), sync=False)
    values.create_directory()
    (tmp_path / "values" / ("ab" * 16)).mkdir()
    with pytest.raises(StorageError, match="cannot read value file .*Is a directory"):
        values.read(CF_SUBMISSIONS, PAYLOAD, b"\xab" * 16, 1)


def test_a_file_removed_between_a_listing_and_its_link_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The writer removed it meanwhile: a reader's pin and a checkpoint go on without it.
    path = tmp_path / "db"
    with RocksStore(path) as store:
        put(store, CF_SUBMISSIONS, PAYLOAD, BIG)

    def gone(*args: object) -> None:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(os, "link", gone)
    with RocksStore(path, read_only=True) as reader:  # the view it keeps reads the file in place
        assert reader.get(CF_SUBMISSIONS, PAYLOAD) == BIG
    with RocksStore(path) as store:
        store.create_checkpoint(tmp_path / "copy")
    assert files(tmp_path / "copy") == []
