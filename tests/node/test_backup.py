"""Hot backups (node/backup.py, NodeService.backup): a whole data dir, or nothing."""

from __future__ import annotations

import errno
import stat
from pathlib import Path

import pytest

from storage import StorageError
from storage.memory import MemoryStore
from storage.rocks import RocksStore
from tenzro_training.node import backup as backup_module
from tenzro_training.node.audit import audit_store
from tenzro_training.node.backup import PARTIAL_SUFFIX, compute_backup_name, write_backup
from tenzro_training.node.service import NodeService
from tests.node.conftest import FakeClock, Net, make_config
from tests.node.test_service import play_round, start


def test_backup_names_sort_by_time() -> None:
    assert compute_backup_name(1_700_000_000_123) == "backup-20231114T221320.123Z"
    names = [compute_backup_name(ms) for ms in (999, 1_000, 61_000, 1_700_000_000_000)]
    assert names == sorted(names)


def test_a_backup_of_a_running_node_is_a_data_dir_that_audits_and_starts(
    tmp_path: Path, checkpoint: tuple[str, str]
) -> None:
    clock = FakeClock()
    store = RocksStore(tmp_path / "data" / "db")
    config = make_config(tmp_path / "data")
    service = NodeService(config, store, clock=clock)
    net = Net(service, clock)
    start(net, checkpoint)
    play_round(net, 0)
    play_round(net, 1)  # sealed
    backup = service.backup(tmp_path / "data" / "backups")
    assert backup.parent == tmp_path / "data" / "backups" and backup.name == compute_backup_name(clock.now)
    assert sorted(p.name for p in backup.iterdir()) == ["db"]
    with RocksStore(backup / "db", read_only=True) as copy:
        [audited] = audit_store(copy, None)
    assert audited.ok and audited.status == "Sealed", audited.problem
    view = service.get_run(net.task_id)
    service.close()
    store.close()
    copy_config = make_config(tmp_path / "copy")  # the backup, started as a node of its own
    with RocksStore(backup / "db") as copy:
        again = NodeService(copy_config, copy, clock=clock)
        assert again.get_run(net.task_id) == view
        again.close()


def test_invalid_backups_leave_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(StorageError, match="in memory"):
        write_backup(MemoryStore(), tmp_path / "backups", 1_000)
    assert not (tmp_path / "backups").exists()
    with RocksStore(tmp_path / "db") as store:
        first = write_backup(store, tmp_path / "backups", 1_000)
        with pytest.raises(StorageError, match="already exists"):
            write_backup(store, tmp_path / "backups", 1_000)  # the same instant
        (tmp_path / "file").write_bytes(b"")
        with pytest.raises(StorageError, match=f"cannot create backup directory {tmp_path / 'file'}: File exists"):
            write_backup(store, tmp_path / "file", 2_000)  # the root is a file, named as such

        def fail(path: object) -> None:
            Path(str(path)).mkdir()
            (Path(str(path)) / "CURRENT").write_bytes(b"half")  # a checkpoint that died midway
            raise StorageError("disk full")

        monkeypatch.setattr(store, "create_checkpoint", fail)
        with pytest.raises(StorageError, match="disk full"):
            write_backup(store, tmp_path / "backups", 3_000)
    assert [p.name for p in (tmp_path / "backups").iterdir()] == [first.name]  # no .partial left
    assert not any(p.name.endswith(PARTIAL_SUFFIX) for p in (tmp_path / "backups").iterdir())


def test_a_backup_is_private_to_its_owner_and_its_rename_is_made_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backup holds every balance and payload of the node: only the node's user may read it.
    Its rename from ``.partial`` is made durable by an fsync of the directory holding it, or a
    power loss could leave a whole backup under a name that says it is not one."""
    real_fsync = backup_module.fsync_directory
    synced: list[Path] = []

    def fsync(path: Path) -> None:
        synced.append(Path(path))
        real_fsync(path)

    monkeypatch.setattr(backup_module, "fsync_directory", fsync)
    root = tmp_path / "backups"
    with RocksStore(tmp_path / "db") as store:
        backup = write_backup(store, root, 1_000)
    assert synced == [root]
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and stat.S_IMODE(backup.stat().st_mode) == 0o700


def test_a_backup_whose_rename_cannot_be_made_durable_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failing disk at the last step is reported as the backup failing (a StorageError, which
    the node logs as "backup failed: ..." and goes on serving), not as an error of the cleanup
    of a ``.partial`` directory that the rename already took away."""
    def fail(path: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(backup_module, "fsync_directory", fail)
    with RocksStore(tmp_path / "db") as store:
        with pytest.raises(StorageError, match="cannot write backup .*: Input/output error"):
            write_backup(store, tmp_path / "backups", 1_000)
    assert not any(p.name.endswith(PARTIAL_SUFFIX) for p in (tmp_path / "backups").iterdir())
