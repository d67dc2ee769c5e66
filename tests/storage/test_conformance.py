"""Conformance suite for :class:`storage.interface.KVStore`.

:class:`KVStoreConformance` holds the contract's tests; the ``store`` fixture runs them against
every implementation (the memory store and RocksDB in a temporary directory). A new
implementation joins by adding one entry to ``IMPLEMENTATIONS``. Reopen tests need durability
and run against RocksDB only (``TestRocksReopen``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storage import MemoryStore, StorageError, open_store
from storage.interface import KVStore
from storage.rocks import RocksStore
from storage.schema import (
    ALL_COLUMN_FAMILIES,
    CF_ACCOUNTS,
    CF_EVIDENCE,
    CF_META,
    CF_MODEL_STATE,
    CF_SUBMISSIONS,
    CF_TRAINING_RECEIPTS,
    CF_TRAINING_RUNS,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    encode_schema_version,
)

Factory = Callable[[Path], KVStore]
IMPLEMENTATIONS: dict[str, Factory] = {
    "memory": lambda _tmp: MemoryStore(),
    "rocks": lambda tmp: RocksStore(tmp / "db"),
    # Every value of the external keyspaces (payload keys, model state) in a file of its own.
    "rocks-files": lambda tmp: RocksStore(tmp / "db", external_value_bytes=1),
}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KVStore]:
    opened = IMPLEMENTATIONS[request.param](tmp_path)
    try:
        yield opened
    finally:
        opened.close()


def put(store: KVStore, cf: str, key: bytes, value: bytes) -> None:
    with store.atomic_batch() as batch:
        batch.put(cf, key, value)


class KVStoreConformance:
    """The KVStore contract (storage/interface.py), implementation-independent."""

    # -- reads and writes -------------------------------------------------------------

    def test_put_get_delete(self, store: KVStore) -> None:
        assert store.get(CF_TRAINING_RUNS, b"run") is None
        assert not store.contains(CF_TRAINING_RUNS, b"run")
        put(store, CF_TRAINING_RUNS, b"run", b"state-1")
        assert store.get(CF_TRAINING_RUNS, b"run") == b"state-1"
        assert store.contains(CF_TRAINING_RUNS, b"run")
        put(store, CF_TRAINING_RUNS, b"run", b"state-2")
        assert store.get(CF_TRAINING_RUNS, b"run") == b"state-2"
        with store.atomic_batch() as batch:
            batch.delete(CF_TRAINING_RUNS, b"run")
        assert store.get(CF_TRAINING_RUNS, b"run") is None
        assert not store.contains(CF_TRAINING_RUNS, b"run")

    @pytest.mark.parametrize("cf, key", [(CF_TRAINING_RUNS, b"run"), (CF_SUBMISSIONS, b"\x00payload"), (CF_MODEL_STATE, b"w")])
    def test_holds_value_is_contains_for_an_intact_store(self, store: KVStore, cf: str, key: bytes) -> None:
        assert store.holds_value(cf, key) is False and store.contains(cf, key) is False  # bools, as typed
        put(store, cf, key, b"value" * 100)
        assert store.holds_value(cf, key) and store.contains(cf, key)
        with store.atomic_batch() as batch:
            batch.delete(cf, key)
        assert not store.holds_value(cf, key)

    def test_delete_absent_key_is_not_an_error(self, store: KVStore) -> None:
        with store.atomic_batch() as batch:
            batch.delete(CF_ACCOUNTS, b"never-written")
        assert store.get(CF_ACCOUNTS, b"never-written") is None

    def test_families_are_separate(self, store: KVStore) -> None:
        put(store, CF_TRAINING_RUNS, b"k", b"run")
        put(store, CF_TRAINING_RECEIPTS, b"k", b"receipt")
        assert store.get(CF_TRAINING_RUNS, b"k") == b"run"
        assert store.get(CF_TRAINING_RECEIPTS, b"k") == b"receipt"
        assert store.get(CF_ACCOUNTS, b"k") is None

    def test_empty_key_and_empty_value(self, store: KVStore) -> None:
        put(store, CF_ACCOUNTS, b"", b"empty key")
        put(store, CF_ACCOUNTS, b"empty value", b"")
        assert store.get(CF_ACCOUNTS, b"") == b"empty key"
        assert store.get(CF_ACCOUNTS, b"empty value") == b""
        assert store.contains(CF_ACCOUNTS, b"empty value")
        assert list(store.iterate(CF_ACCOUNTS)) == [(b"", b"empty key"), (b"empty value", b"")]

    def test_binary_keys_and_values_round_trip(self, store: KVStore) -> None:
        key = bytes(range(256))
        value = bytes(reversed(range(256))) * 3
        put(store, CF_SUBMISSIONS, key, value)
        assert store.get(CF_SUBMISSIONS, key) == value

    def test_large_value_16_mib(self, store: KVStore) -> None:
        value = random.Random(7).randbytes(16 * 1024 * 1024)
        put(store, CF_TRAINING_RUNS, b"big", value)
        got = store.get(CF_TRAINING_RUNS, b"big")
        assert got is not None and len(got) == len(value) and got == value
        assert [k for k, _ in store.iterate(CF_TRAINING_RUNS)] == [b"big"]

    def test_new_store_holds_schema_version(self, store: KVStore) -> None:
        assert store.column_families == ALL_COLUMN_FAMILIES
        assert store.get(CF_META, SCHEMA_VERSION_KEY) == encode_schema_version(SCHEMA_VERSION)

    # -- atomic batches ---------------------------------------------------------------

    def test_cross_family_batch_applies_together(self, store: KVStore) -> None:
        put(store, CF_ACCOUNTS, b"old", b"x")
        with store.atomic_batch() as batch:
            batch.put(CF_TRAINING_RUNS, b"t", b"run")
            batch.put(CF_TRAINING_RECEIPTS, b"t", b"receipt")
            batch.put(CF_SUBMISSIONS, b"t/0", b"sub")
            batch.delete(CF_ACCOUNTS, b"old")
            assert len(batch) == 4
            # Buffered, not yet visible to readers.
            assert store.get(CF_TRAINING_RUNS, b"t") is None
            assert store.get(CF_ACCOUNTS, b"old") == b"x"
        assert batch.committed
        assert store.get(CF_TRAINING_RUNS, b"t") == b"run"
        assert store.get(CF_TRAINING_RECEIPTS, b"t") == b"receipt"
        assert store.get(CF_SUBMISSIONS, b"t/0") == b"sub"
        assert store.get(CF_ACCOUNTS, b"old") is None

    def test_invalid_exception_inside_batch_applies_nothing(self, store: KVStore) -> None:
        put(store, CF_TRAINING_RUNS, b"t", b"before")

        class Boom(Exception):
            pass

        with pytest.raises(Boom):
            with store.atomic_batch() as batch:
                batch.put(CF_TRAINING_RUNS, b"t", b"after")
                batch.put(CF_TRAINING_RECEIPTS, b"t", b"receipt")
                batch.delete(CF_TRAINING_RUNS, b"t")
                raise Boom
        assert not batch.committed
        assert store.get(CF_TRAINING_RUNS, b"t") == b"before"
        assert store.get(CF_TRAINING_RECEIPTS, b"t") is None
        with pytest.raises(StorageError):
            batch.commit()

    def test_invalid_bad_operation_inside_batch_applies_nothing(self, store: KVStore) -> None:
        with pytest.raises(TypeError):
            with store.atomic_batch() as batch:
                batch.put(CF_TRAINING_RUNS, b"good", b"1")
                batch.put(CF_TRAINING_RUNS, "bad", b"2")  # type: ignore[arg-type]
        assert store.get(CF_TRAINING_RUNS, b"good") is None

    def test_later_operation_on_a_key_wins(self, store: KVStore) -> None:
        put(store, CF_ACCOUNTS, b"c", b"old")
        with store.atomic_batch() as batch:
            batch.put(CF_ACCOUNTS, b"a", b"1")
            batch.delete(CF_ACCOUNTS, b"a")
            batch.delete(CF_ACCOUNTS, b"b")
            batch.put(CF_ACCOUNTS, b"b", b"2")
            batch.put(CF_ACCOUNTS, b"c", b"first")
            batch.put(CF_ACCOUNTS, b"c", b"second")
        assert store.get(CF_ACCOUNTS, b"a") is None
        assert store.get(CF_ACCOUNTS, b"b") == b"2"
        assert store.get(CF_ACCOUNTS, b"c") == b"second"

    def test_empty_batch_commits(self, store: KVStore) -> None:
        with store.atomic_batch() as batch:
            pass
        assert batch.committed and len(batch) == 0

    def test_explicit_commit_without_with(self, store: KVStore) -> None:
        batch = store.atomic_batch()
        batch.put(CF_TRAINING_RUNS, b"k", b"v")
        assert store.get(CF_TRAINING_RUNS, b"k") is None and len(batch) == 1
        batch.commit()
        assert store.get(CF_TRAINING_RUNS, b"k") == b"v"
        assert len(batch) == 0  # a committed batch holds no values (they can be megabytes)

    def test_invalid_double_commit(self, store: KVStore) -> None:
        with store.atomic_batch() as batch:
            batch.put(CF_TRAINING_RUNS, b"k", b"v")
        with pytest.raises(StorageError):
            batch.commit()
        with pytest.raises(StorageError):
            with batch:
                pass
        with pytest.raises(StorageError):
            batch.put(CF_TRAINING_RUNS, b"k2", b"v")
        with pytest.raises(StorageError):
            batch.delete(CF_TRAINING_RUNS, b"k")
        assert store.get(CF_TRAINING_RUNS, b"k") == b"v"
        assert store.get(CF_TRAINING_RUNS, b"k2") is None

    def test_invalid_commit_after_explicit_commit(self, store: KVStore) -> None:
        batch = store.atomic_batch()
        batch.put(CF_TRAINING_RUNS, b"k", b"v")
        batch.commit()
        with pytest.raises(StorageError):
            batch.commit()
        with pytest.raises(StorageError):  # discarding cannot undo a written batch
            batch.discard()
        assert store.get(CF_TRAINING_RUNS, b"k") == b"v"

    def test_invalid_batch_whose_write_failed_is_finished(self, store: KVStore, monkeypatch: pytest.MonkeyPatch) -> None:
        """A write that failed applied nothing, and the batch must not be reused to retry it:
        the caller cannot tell what a retried batch would hold. Whatever stopped the write,
        even a KeyboardInterrupt, the batch is finished."""

        def interrupted(ops: object) -> None:
            raise KeyboardInterrupt

        batch = store.atomic_batch()
        batch.put(CF_TRAINING_RUNS, b"k", b"v")
        monkeypatch.setattr(store, "_apply_batch", interrupted)
        with pytest.raises(KeyboardInterrupt):
            batch.commit()
        monkeypatch.undo()
        for again in (lambda: batch.put(CF_TRAINING_RUNS, b"k2", b"v"), batch.commit, batch.discard):
            with pytest.raises(StorageError, match="already finished"):
                again()
        assert store.get(CF_TRAINING_RUNS, b"k") is None and store.get(CF_TRAINING_RUNS, b"k2") is None

    def test_invalid_commit_after_discard(self, store: KVStore) -> None:
        batch = store.atomic_batch()
        batch.put(CF_TRAINING_RUNS, b"k", b"v")
        batch.discard()
        assert len(batch) == 0  # the dropped values are released
        with pytest.raises(StorageError):
            batch.commit()
        assert store.get(CF_TRAINING_RUNS, b"k") is None

    def test_batch_mutation_after_put_does_not_leak(self, store: KVStore) -> None:
        # Only immutable bytes are accepted, so what was put is what is committed.
        with pytest.raises(TypeError):
            with store.atomic_batch() as batch:
                batch.put(CF_TRAINING_RUNS, b"k", bytearray(b"mutable"))  # type: ignore[arg-type]
        assert store.get(CF_TRAINING_RUNS, b"k") is None

    # -- iteration --------------------------------------------------------------------

    def test_prefix_iteration_is_bounded_and_ordered(self, store: KVStore) -> None:
        inside = [b"ab", b"ab\x00", b"ab\x00\x01", b"ab\x01", b"ab\x7f", b"ab\x80", b"ab\xff\xff"]
        outside = [b"", b"a", b"aa\xff", b"ac", b"ac\x00", b"b", b"\xff"]
        keys = inside + outside
        random.Random(1).shuffle(keys)
        with store.atomic_batch() as batch:
            for key in keys:
                batch.put(CF_SUBMISSIONS, key, b"v:" + key)
        assert list(store.iterate(CF_SUBMISSIONS, b"ab")) == [(k, b"v:" + k) for k in inside]
        assert [k for k, _ in store.iterate(CF_SUBMISSIONS)] == sorted(keys)
        assert list(store.iterate(CF_SUBMISSIONS, b"zz")) == []
        # keys(): the same keys, same order, values never read.
        assert list(store.keys(CF_SUBMISSIONS, b"ab")) == inside
        assert list(store.keys(CF_SUBMISSIONS)) == sorted(keys)
        assert list(store.keys(CF_SUBMISSIONS, b"zz")) == []

    def test_keys_view_and_errors(self, store: KVStore) -> None:
        with store.atomic_batch() as batch:
            batch.put(CF_EVIDENCE, b"k1", b"x" * 1000)
        keys = store.keys(CF_EVIDENCE)
        with store.atomic_batch() as batch:  # committed after keys() was called: not seen
            batch.put(CF_EVIDENCE, b"k2", b"y")
        assert list(keys) == [b"k1"]
        with pytest.raises(StorageError):
            store.keys("nope")
        with pytest.raises(TypeError):
            store.keys(CF_EVIDENCE, "k")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.keys(CF_EVIDENCE, bytearray(b"k"))  # type: ignore[arg-type]

    def test_prefix_of_all_ff_bytes(self, store: KVStore) -> None:
        keys = [b"\xfe", b"\xfe\xff", b"\xff", b"\xff\x00", b"\xff\xff", b"\xff\xff\xff"]
        with store.atomic_batch() as batch:
            for key in keys:
                batch.put(CF_EVIDENCE, key, key)
        assert [k for k, _ in store.iterate(CF_EVIDENCE, b"\xff")] == keys[2:]
        assert [k for k, _ in store.iterate(CF_EVIDENCE, b"\xff\xff")] == keys[4:]

    def test_numeric_order_is_byte_order_for_big_endian_keys(self, store: KVStore) -> None:
        numbers = [0, 1, 2, 255, 256, 65535, 65536, 2**31, 2**32 - 1]
        with store.atomic_batch() as batch:
            for n in reversed(numbers):
                batch.put(CF_SUBMISSIONS, b"r" + n.to_bytes(4, "big"), b"")
        got = [int.from_bytes(k[1:], "big") for k, _ in store.iterate(CF_SUBMISSIONS, b"r")]
        assert got == numbers

    def test_iterate_start_key(self, store: KVStore) -> None:
        keys = [b"o9", b"p1", b"p3", b"p5", b"q0"]  # o9: a key between a start before the prefix and the prefix
        with store.atomic_batch() as batch:
            for key in keys:
                batch.put(CF_ACCOUNTS, key, key)

        def scan(prefix: bytes, start: bytes | None) -> list[bytes]:
            return [k for k, _ in store.iterate(CF_ACCOUNTS, prefix, start)]

        assert scan(b"p", b"p3") == [b"p3", b"p5"]  # inclusive
        assert scan(b"p", b"p2") == [b"p3", b"p5"]  # between keys
        assert scan(b"p", b"a") == [b"p1", b"p3", b"p5"]  # before the prefix
        assert scan(b"p", b"p6") == []  # past the last key of the prefix
        assert scan(b"p", b"q") == []  # past the prefix
        assert scan(b"", b"p4") == [b"p5", b"q0"]
        assert scan(b"", None) == keys

    @pytest.mark.parametrize("cf, prefix", [(CF_TRAINING_RUNS, b"k"), (CF_SUBMISSIONS, b"\x00k"), (CF_MODEL_STATE, b"k")])
    def test_iteration_view_is_fixed_when_called(self, store: KVStore, cf: str, prefix: bytes) -> None:
        # The last two are external keyspaces: with RocksDB their values may live in files,
        # which a replacing batch must not remove from under a live iterator.
        with store.atomic_batch() as batch:
            for i in range(5):
                batch.put(cf, prefix + b"%d" % i, b"old")
        iterator = store.iterate(cf, prefix)
        first = next(iterator)
        with store.atomic_batch() as batch:
            batch.put(cf, prefix + b"3", b"new")
            batch.delete(cf, prefix + b"4")
            batch.put(cf, prefix + b"5", b"new")
        rest = list(iterator)
        assert [first, *rest] == [(prefix + b"%d" % i, b"old") for i in range(5)]
        assert [v for _, v in store.iterate(cf, prefix)] == [
            b"old", b"old", b"old", b"new", b"new"
        ]

    def test_writes_during_iteration_are_allowed(self, store: KVStore) -> None:
        with store.atomic_batch() as batch:
            for i in range(10):
                batch.put(CF_SUBMISSIONS, b"s%02d" % i, b"")
        for key, _ in store.iterate(CF_SUBMISSIONS, b"s"):
            with store.atomic_batch() as batch:
                batch.delete(CF_SUBMISSIONS, key)
        assert list(store.iterate(CF_SUBMISSIONS)) == []

    def test_random_batches_match_a_reference_model(self, store: KVStore) -> None:
        rng = random.Random(2024)
        families = (CF_TRAINING_RUNS, CF_SUBMISSIONS, CF_ACCOUNTS, CF_MODEL_STATE)
        model: dict[str, dict[bytes, bytes]] = {cf: {} for cf in families}
        for _ in range(60):
            staged = {cf: dict(values) for cf, values in model.items()}
            fail = rng.random() < 0.2
            try:
                with store.atomic_batch() as batch:
                    for _ in range(rng.randrange(1, 12)):
                        cf = rng.choice(families)
                        key = bytes(rng.choice(b"ab\x00\xff") for _ in range(rng.randrange(0, 4)))
                        if rng.random() < 0.7:
                            value = rng.randbytes(rng.randrange(0, 16))
                            batch.put(cf, key, value)
                            staged[cf][key] = value
                        else:
                            batch.delete(cf, key)
                            staged[cf].pop(key, None)
                    if fail:
                        raise RuntimeError("abandon this batch")
            except RuntimeError:
                pass
            if not fail:
                model = staged
            for cf in families:
                assert list(store.iterate(cf)) == sorted(model[cf].items())
            prefix = bytes(rng.choice(b"ab\x00\xff") for _ in range(rng.randrange(0, 3)))
            cf = rng.choice(families)
            expected = sorted((k, v) for k, v in model[cf].items() if k.startswith(prefix))
            assert list(store.iterate(cf, prefix)) == expected

    # -- argument checking ------------------------------------------------------------

    @pytest.mark.parametrize("bad", ["text", bytearray(b"x"), memoryview(b"x"), 1, None])
    def test_invalid_non_bytes_key(self, store: KVStore, bad: object) -> None:
        with pytest.raises(TypeError):
            store.get(CF_ACCOUNTS, bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.contains(CF_ACCOUNTS, bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.holds_value(CF_ACCOUNTS, bad)  # type: ignore[arg-type]
        with store.atomic_batch() as batch:
            with pytest.raises(TypeError):
                batch.put(CF_ACCOUNTS, bad, b"v")  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                batch.delete(CF_ACCOUNTS, bad)  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                batch.put(CF_ACCOUNTS, b"k", bad)  # type: ignore[arg-type]
        assert len(batch) == 0
        assert list(store.iterate(CF_ACCOUNTS)) == []

    @pytest.mark.parametrize("bad", ["text", bytearray(b"x"), 1])
    def test_invalid_non_bytes_prefix_or_start(self, store: KVStore, bad: object) -> None:
        with pytest.raises(TypeError):
            store.iterate(CF_ACCOUNTS, bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.iterate(CF_ACCOUNTS, b"", bad)  # type: ignore[arg-type]

    @pytest.mark.parametrize("bad", ["default", "nope", "", "TRAINING_RUNS", b"meta", None, ["meta"]])
    def test_invalid_unknown_column_family(self, store: KVStore, bad: object) -> None:
        with pytest.raises(StorageError):
            store.get(bad, b"k")  # type: ignore[arg-type]
        with pytest.raises(StorageError):
            store.contains(bad, b"k")  # type: ignore[arg-type]
        with pytest.raises(StorageError):
            store.holds_value(bad, b"k")  # type: ignore[arg-type]
        with pytest.raises(StorageError):
            store.iterate(bad)  # type: ignore[arg-type]
        with store.atomic_batch() as batch:
            with pytest.raises(StorageError):
                batch.put(bad, b"k", b"v")  # type: ignore[arg-type]
            with pytest.raises(StorageError):
                batch.delete(bad, b"k")  # type: ignore[arg-type]
        assert len(batch) == 0

    # -- closing ----------------------------------------------------------------------

    def test_invalid_use_after_close(self, store: KVStore) -> None:
        put(store, CF_TRAINING_RUNS, b"k", b"v")
        put(store, CF_TRAINING_RUNS, b"k3", b"v")
        started = store.iterate(CF_TRAINING_RUNS)
        assert next(started) == (b"k", b"v")
        pending = store.atomic_batch()
        pending.put(CF_TRAINING_RUNS, b"k2", b"v")
        unused = store.atomic_batch()
        live = store.iterate(CF_TRAINING_RUNS)
        live_keys = store.keys(CF_TRAINING_RUNS)
        store.close()
        store.close()  # idempotent
        assert store.closed
        with pytest.raises(StorageError):
            store.get(CF_TRAINING_RUNS, b"k")
        with pytest.raises(StorageError):
            store.contains(CF_TRAINING_RUNS, b"k")
        with pytest.raises(StorageError):
            store.holds_value(CF_TRAINING_RUNS, b"k")
        with pytest.raises(StorageError):
            store.iterate(CF_TRAINING_RUNS)
        with pytest.raises(StorageError):
            store.atomic_batch()
        with pytest.raises(StorageError):
            pending.commit()
        with pytest.raises(StorageError):
            list(live)
        with pytest.raises(StorageError):  # a started iteration stops at the close, not at its end
            next(started)
        with pytest.raises(StorageError):
            store.keys(CF_TRAINING_RUNS)
        with pytest.raises(StorageError):
            store.upgrade_schema_version()
        with pytest.raises(StorageError):  # not an early end, as if the data ended
            list(live_keys)
        ran = []
        with pytest.raises(StorageError):
            with unused:
                ran.append(True)
        assert ran == []  # refused at the ``with``, before the block did its work

    def test_store_is_a_context_manager(self, store: KVStore) -> None:
        with store as entered:
            assert entered is store
            put(store, CF_TRAINING_RUNS, b"k", b"v")
        assert store.closed


class TestKVStoreConformance(KVStoreConformance):
    """Runs the suite against every entry of IMPLEMENTATIONS (see the ``store`` fixture)."""


class TestRocksReopen:
    """Durability across close/reopen: RocksDB only, the memory store does not persist."""

    def test_reopen_persists_every_family(self, tmp_path: Path) -> None:
        path = tmp_path / "db"
        with RocksStore(path) as store:
            with store.atomic_batch() as batch:
                for cf in ALL_COLUMN_FAMILIES:
                    if cf != CF_META:
                        batch.put(cf, b"key", cf.encode())
                        batch.put(cf, b"gone", b"x")
            with store.atomic_batch() as batch:
                batch.delete(CF_TRAINING_RUNS, b"gone")
        with RocksStore(path, create=False) as store:
            for cf in ALL_COLUMN_FAMILIES:
                if cf != CF_META:
                    assert store.get(cf, b"key") == cf.encode()
            assert store.get(CF_TRAINING_RUNS, b"gone") is None
            assert store.get(CF_ACCOUNTS, b"gone") == b"x"
            assert store.get(CF_META, SCHEMA_VERSION_KEY) == encode_schema_version(SCHEMA_VERSION)

    def test_reopen_persists_large_value(self, tmp_path: Path) -> None:
        value = random.Random(3).randbytes(16 * 1024 * 1024)
        with RocksStore(tmp_path / "db") as store:
            put(store, CF_TRAINING_RECEIPTS, b"big", value)
        with RocksStore(tmp_path / "db") as store:
            assert store.get(CF_TRAINING_RECEIPTS, b"big") == value

    def test_close_releases_the_database_despite_live_iterators(self, tmp_path: Path) -> None:
        path = tmp_path / "db"
        store = RocksStore(path)
        put(store, CF_SUBMISSIONS, b"a", b"1")
        put(store, CF_SUBMISSIONS, b"b", b"2")
        started = store.iterate(CF_SUBMISSIONS)
        next(started)
        unstarted = store.iterate(CF_SUBMISSIONS)
        store.close()
        # Only a real close releases RocksDB's LOCK; a second opener proves it.
        with RocksStore(path) as again:
            assert again.get(CF_SUBMISSIONS, b"b") == b"2"
        with pytest.raises(StorageError):
            next(started)
        with pytest.raises(StorageError):
            next(unstarted)

    def test_sync_store_round_trips(self, tmp_path: Path) -> None:
        with RocksStore(tmp_path / "db", sync=True) as store:
            assert store.sync and store.path == str(tmp_path / "db")
            put(store, CF_ACCOUNTS, b"a", b"1")
        with RocksStore(tmp_path / "db") as store:
            assert not store.sync
            assert store.get(CF_ACCOUNTS, b"a") == b"1"

    def test_invalid_missing_store_with_create_false(self, tmp_path: Path) -> None:
        with pytest.raises(StorageError, match="no store"):
            RocksStore(tmp_path / "absent", create=False)
        assert not (tmp_path / "absent").exists()

    def test_invalid_path_is_a_file(self, tmp_path: Path) -> None:
        (tmp_path / "file").write_bytes(b"not a database")
        with pytest.raises(StorageError, match="not a directory"):
            RocksStore(tmp_path / "file")


class TestOpenStore:
    def test_none_gives_a_memory_store(self) -> None:
        with open_store(None) as store:
            assert isinstance(store, MemoryStore)

    def test_path_gives_a_rocks_store(self, tmp_path: Path) -> None:
        with open_store(tmp_path / "db", sync=True) as store:
            assert isinstance(store, RocksStore) and store.sync
            put(store, CF_TRAINING_RUNS, b"k", b"v")
        with open_store(str(tmp_path / "db"), create=False) as store:
            assert store.get(CF_TRAINING_RUNS, b"k") == b"v"
