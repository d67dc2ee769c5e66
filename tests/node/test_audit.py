"""``tenzro audit`` (node/audit.py): whole runs recomputed from the checkpoint and the stored
payloads, on a real RocksDB store opened read-only beside the service that writes it."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from storage import schema
from storage.interface import StorageError
from storage.rocks import RocksStore
from tenzro_training import cli
from tenzro_training.node import persistence
from tenzro_training.node.audit import audit_run, audit_store
from tenzro_training.node.run_store import load_run
from tenzro_training.node.service import NodeService
from tests.node.conftest import FakeClock, Net, make_config, spec_dict
from tests.node.test_service import play_round, start

ROUNDS = 5


@dataclass
class Node:
    """A node data dir with one sealed run (snapshots every 2 rounds) and one still training;
    the service keeps the store open (read-write) until ``stop``."""

    data: Path
    service: NodeService
    store: RocksStore

    def stop(self) -> None:
        if not self.store.closed:
            self.service.close()
            self.store.close()

    def tamper(self, cf: str, key: bytes, change: Callable[[bytes], bytes] | bytes) -> None:
        """Rewrite one stored value (after ``stop``: a read-write opener needs the LOCK)."""
        self.stop()
        with RocksStore(self.data / "db") as store:
            raw = store.get(cf, key)
            assert raw is not None
            value = change(raw) if callable(change) else change
            with store.atomic_batch() as batch:
                batch.put(cf, key, value)

    def audit(self, task_id: str) -> dict[str, object]:
        with RocksStore(self.data / "db", read_only=True) as store:
            return audit_run(store, task_id).to_dict()


def make_node(data: Path, checkpoint: tuple[str, str], *, training_rounds: int = 2, **config: object) -> Node:
    node_config = make_config(data, model_snapshot_rounds=2, **config)
    store = RocksStore(data / "db", external_value_bytes=node_config.external_value_bytes)
    clock = FakeClock()
    service = NodeService(node_config, store, clock=clock)
    sealed = Net(service, clock)
    start(sealed, checkpoint, max_rounds=ROUNDS)
    for r in range(ROUNDS):
        play_round(sealed, r)
    training = Net(service, clock, task_id="run-2")
    training.post(spec_dict(*checkpoint, task_id="run-2", max_rounds=ROUNDS))
    training.elect()
    for i in range(3):
        training.enroll(i)
    for r in range(training_rounds):
        play_round(training, r)
    training.submit(0, training_rounds, 0)  # the open round holds accepted submissions too
    training.submit(1, training_rounds, 1)
    return Node(data, service, store)


@pytest.fixture
def node(tmp_path: Path, checkpoint: tuple[str, str]) -> Iterator[Node]:
    running = make_node(tmp_path / "node", checkpoint)
    yield running
    running.stop()


def test_a_sealed_and_a_training_run_reproduce_bit_for_bit(node: Node) -> None:
    with RocksStore(node.data / "db", read_only=True) as store:  # beside the running service
        sealed, training = (a.to_dict() for a in audit_store(store))
    assert sealed == {
        "task_id": "run-1", "status": "Sealed", "ok": True, "rounds_committed": 5, "rounds_replayed": 5,
        "checks": ["initial model", "snapshot of round 4", "final weights", "run root and receipt", "sealed record",
                   "ended summary"], "problem": None,
    }
    assert training["ok"] and training["status"] == "Training" and training["rounds_replayed"] == 2
    assert training["checks"] == ["initial model", "snapshot of round 2", "open round 2: 2 accepted submission(s) stored"]


def test_a_pruned_store_is_audited_from_what_it_kept(tmp_path: Path, checkpoint: tuple[str, str]) -> None:
    """prune_payloads: the sealed run kept no payload (its final weights are checked against its
    final model hash, its receipt against its records); the open run is replayed from its
    hash-checked snapshot."""
    node = make_node(tmp_path / "node", checkpoint, training_rounds=3, prune_payloads=True)
    try:
        sealed, training = (node.audit(t) for t in ("run-1", "run-2"))
    finally:
        node.stop()
    assert sealed["ok"] and sealed["rounds_replayed"] == 0
    assert sealed["checks"] == ["initial model", "payloads pruned: no round replayed", "final weights hash",
                                "run root and receipt", "sealed record", "ended summary"]
    assert training["ok"] and training["rounds_committed"] == 3 and training["rounds_replayed"] == 1
    assert training["checks"] == ["initial model", "snapshot of round 2 (payloads before it pruned)",
                                  "open round 3: 2 accepted submission(s) stored"]
    node.tamper(schema.CF_MODEL_STATE, schema.model_key("run-1", schema.MODEL_FINAL, 1), flip_last_byte)
    assert "final weights of run-1 do not hash to its final model hash" in str(node.audit("run-1")["problem"])
    node.tamper(schema.CF_MODEL_STATE, schema.model_key("run-2", schema.MODEL_WEIGHTS, 0), flip_last_byte)
    assert "snapshot of run-2 (round 2) does not hash" in str(node.audit("run-2")["problem"])


def test_turning_prune_payloads_on_prunes_the_runs_that_already_ended(tmp_path: Path, checkpoint: tuple[str, str],
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """An archive node restarted with prune_payloads: the sealed run gets the pruning its end
    would have done (before, nothing ever deleted its payloads: ops probe); the open run keeps
    its payloads until its next snapshot; the audit still passes on both."""
    node = make_node(tmp_path / "node", checkpoint, training_rounds=3)
    assert node.service.cache_stats()["payloads_pruned"] == 0  # an archive node prunes nothing
    node.stop()

    def payloads(store: RocksStore, task_id: str) -> int:
        return sum(1 for _ in store.keys(schema.CF_SUBMISSIONS, schema.payload_prefix(task_id)))

    with RocksStore(node.data / "db") as store:
        kept = payloads(store, "run-1"), payloads(store, "run-2")
        assert kept[0] > 0 and kept[1] > 0
        service = NodeService(make_config(node.data, model_snapshot_rounds=2, prune_payloads=True), store,
                              clock=FakeClock())
        assert service.cache_stats()["payloads_pruned"] == kept[0]
        service.close()
        assert (payloads(store, "run-1"), payloads(store, "run-2")) == (0, kept[1])
        assert store.get(schema.CF_META, schema.payloads_pruned_key("run-1")) == (2**64 - 1).to_bytes(8, "big")
        with caplog.at_level(logging.INFO, logger="tenzro.node"):
            again = NodeService(make_config(node.data, model_snapshot_rounds=2, prune_payloads=True), store,
                                clock=FakeClock())
        assert again.cache_stats()["payloads_pruned"] == 0  # once: no second pass over a pruned run
        assert not [r for r in caplog.records if r.getMessage().startswith("pruned the ")]
        again.close()
    sealed, training = (node.audit(t) for t in ("run-1", "run-2"))
    assert sealed["ok"] and "payloads pruned: no round replayed" in sealed["checks"]
    assert training["ok"] and training["rounds_replayed"] == 3  # its payloads are all there: replayed from round 0

def flip_last_byte(raw: bytes) -> bytes:
    return raw[:-1] + bytes([raw[-1] ^ 1])


class TestFindsDamage:
    """Each kind of damage is found and named, and the audit stops at the first."""

    def test_a_payload(self, node: Node) -> None:
        with RocksStore(node.data / "db", read_only=True) as store:
            key = next(k for k, _ in store.iterate(schema.CF_SUBMISSIONS, schema.payload_prefix("run-1")))
        node.tamper(schema.CF_SUBMISSIONS, key, flip_last_byte)
        result = node.audit("run-1")
        assert not result["ok"] and result["rounds_replayed"] < 5
        assert "does not reproduce its committed fragment outcomes" in str(result["problem"])

    def test_the_aggregation_reports(self, node: Node) -> None:
        node.tamper(schema.CF_META, schema.round_reports_key("run-1", 3), b"[]")
        result = node.audit("run-1")
        assert result["rounds_replayed"] == 3 and "aggregation reports of run-1 round 3" in str(result["problem"])

    def test_the_snapshot(self, node: Node) -> None:
        node.tamper(schema.CF_MODEL_STATE, schema.model_key("run-1", schema.MODEL_MOMENTUM, 1), flip_last_byte)
        assert "model snapshot of run-1 (round 4) differs" in str(node.audit("run-1")["problem"])

    def test_the_final_weights(self, node: Node, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """Found by the audit, and never exported as the run's model: with its model file gone,
        export-model rebuilds the file from these weights and must refuse them."""
        node.tamper(schema.CF_MODEL_STATE, schema.model_key("run-1", schema.MODEL_FINAL, 0), flip_last_byte)
        assert "final weights of run-1 differ" in str(node.audit("run-1")["problem"])
        (node.data / "models" / "run-1.safetensors").unlink()
        out = tmp_path / "final.safetensors"
        code = cli.main(["train", "export-model", "--task-id", "run-1", "--data-dir", str(node.data), "--out", str(out)])
        assert code == cli.EXIT_RPC_ERROR and not out.exists()
        assert "the stored final model of run-1 does not hash to its final_model_hash" in capsys.readouterr().err

    def test_the_receipt(self, node: Node) -> None:
        def edit(raw: bytes) -> bytes:
            doc = json.loads(raw)
            doc["trainers"][0]["accepted_submissions"] += 1
            return json.dumps(doc).encode()

        node.tamper(schema.CF_TRAINING_RECEIPTS, schema.receipt_key("run-1"), edit)
        assert "stored receipt of run-1 differs" in str(node.audit("run-1")["problem"])

    def test_the_ended_summary(self, node: Node) -> None:
        """A node's start reads an ended run's summary instead of the run (listRuns, metrics, model
        file restore, pruning): one that disagrees with its run was served as it was and passed the
        audit, and one on an open run set that run aside for good (review)."""
        key = schema.ended_summary_key("run-1")
        node.tamper(schema.CF_META, key, lambda raw: raw.replace(b'"Sealed"', b'"Failed"'))
        assert "the stored summary of the ended run run-1 (what listRuns" in str(node.audit("run-1")["problem"])
        with RocksStore(node.data / "db") as store:
            raw = store.get(schema.CF_META, key)
            with store.atomic_batch() as batch:
                batch.put(schema.CF_META, schema.ended_summary_key("run-2"), raw.replace(b"run-1", b"run-2"))
        assert "run-2 is Training, yet the store holds an ended-run summary" in str(node.audit("run-2")["problem"])

    def test_the_sealed_record(self, node: Node) -> None:
        """TRAINING_VERIFY pays against the sealed record: one that no longer matches the receipt
        (here: another run's) is found even though the receipt itself is intact."""
        with RocksStore(node.data / "db", read_only=True) as store:
            assert store.get(schema.CF_META, schema.sealed_record_key("run-1")) is not None
        node.tamper(schema.CF_META, schema.sealed_record_key("run-1"), flip_last_byte)
        result = node.audit("run-1")
        assert not result["ok"] and "run root and receipt" in result["checks"]  # type: ignore[operator]
        assert "the sealed record of run-1 (TRAINING_VERIFY's lookup) differs" in str(result["problem"])

    def test_a_committed_rounds_missing_payload(self, node: Node) -> None:
        """A payload a committed round aggregated is gone: the replay stops at that round and
        names the missing payload (not a decode error or a crash)."""
        node.stop()
        with RocksStore(node.data / "db") as store:
            _, raw = next(iter(store.iterate(schema.CF_SUBMISSIONS, schema.submission_prefix("run-1", 3))))
            sub = persistence.decode_submission_record(raw)
            with store.atomic_batch() as batch:
                batch.delete(schema.CF_SUBMISSIONS, schema.payload_key("run-1", sub.payload_hash))
        result = node.audit("run-1")
        assert not result["ok"] and result["rounds_replayed"] == 3
        assert f"accepted payload 0x{sub.payload_hash.hex()} of run-1 is missing" in str(result["problem"])

    def test_a_missing_checkpoint(self, node: Node, checkpoint: tuple[str, str]) -> None:
        Path(checkpoint[0].removeprefix("file://")).unlink()
        result = node.audit("run-1")
        assert not result["ok"] and result["rounds_replayed"] == 0 and "init.safetensors" in str(result["problem"])

    def test_an_open_rounds_missing_payload_and_the_node_refuses_to_start(self, node: Node) -> None:
        """A MANIFEST cut short opened without error and lost the last batch's payload but not
        the run state that accepted it; every finalize of the round then failed, and the audit
        passed (storage fault probe). Both the audit and the node's startup now find it."""
        view = node.service.get_run("run-2")
        node.stop()
        with RocksStore(node.data / "db") as store:
            run = load_run(store, "run-2")
            assert run is not None
            sub = run.current_round.submissions[1][0]  # type: ignore[union-attr]
            with store.atomic_batch() as batch:
                batch.delete(schema.CF_SUBMISSIONS, schema.payload_key("run-2", sub.payload_hash))
        assert view["submission_counts"][1] == 1
        result = node.audit("run-2")
        assert not result["ok"] and "payload of the accepted submission" in str(result["problem"])
        with RocksStore(node.data / "db") as store:
            with pytest.raises(StorageError, match="the store is damaged: the payload of the accepted submission"):
                NodeService(make_config(node.data), store)

    @pytest.mark.parametrize("damage", ["missing", "another payload"])
    def test_an_open_rounds_submission_record(self, node: Node, damage: str) -> None:
        """The batch that accepts a submission writes its record beside its payload: a record
        lost, or naming another payload than the run accepted, leaves the round's finalize
        without the bytes it committed to, as a lost payload does."""
        node.stop()
        with RocksStore(node.data / "db") as store:
            run = load_run(store, "run-2")
            assert run is not None and run.current_round is not None
            sub = run.current_round.submissions[1][0]
            key = schema.submission_key("run-2", run.current_round.round, 1, sub.trainer)
            raw = store.get(schema.CF_SUBMISSIONS, key)
            assert raw is not None and sub.payload_hash in raw
            with store.atomic_batch() as batch:
                if damage == "missing":
                    batch.delete(schema.CF_SUBMISSIONS, key)
                else:
                    batch.put(schema.CF_SUBMISSIONS, key, raw.replace(sub.payload_hash, b"\x07" * 32))
        result = node.audit("run-2")
        assert not result["ok"] and "has no matching record" in str(result["problem"])
        with RocksStore(node.data / "db") as store:
            with pytest.raises(StorageError, match="the store is damaged: the accepted submission .* no matching record"):
                NodeService(make_config(node.data), store)

    def test_an_unknown_run(self, node: Node) -> None:
        assert node.audit("nope") == {
            "task_id": "nope", "status": "unknown", "ok": False, "rounds_committed": 0, "rounds_replayed": 0,
            "checks": [], "problem": "no such run in the store",
        }

    def test_a_run_state_that_does_not_decode(self, node: Node) -> None:
        """A run the store cannot even decode is a result like any other (the audit of the other
        runs goes on), with nothing counted as committed or reproduced."""
        node.tamper(schema.CF_TRAINING_RUNS, schema.run_key("run-2"), b"{")
        result = node.audit("run-2")
        assert (result["status"], result["ok"], result["rounds_committed"], result["rounds_replayed"]) == (
            "unknown", False, 0, 0)
        assert result["checks"] == [] and "not valid JSON" in str(result["problem"])

    def test_the_tensor_list(self, node: Node) -> None:
        """The stored tensor list is what every stored fragment is decoded by: one that is not the
        checkpoint's is named as such, before anything is decoded with it."""
        def rename(raw: bytes) -> bytes:
            doc = json.loads(raw)
            doc["tensors"][0][0] = "renamed"
            return json.dumps(doc).encode()

        node.tamper(schema.CF_META, schema.tensor_specs_key("run-2"), rename)
        result = node.audit("run-2")
        assert result["checks"] == [] and result["rounds_replayed"] == 0
        assert result["problem"] == "the stored tensor list of run-2 differs from its initial checkpoint's"

    def test_the_committed_initial_model_hash(self, node: Node) -> None:
        """The initial model hash is the first link of the run root: a checkpoint that no longer
        hashes to it (here the commitment changed) is found before any round is replayed."""
        def rehash(raw: bytes) -> bytes:
            doc = json.loads(raw)
            doc["initial_model_hash"] = "0x" + "00" * 32
            return json.dumps(doc).encode()

        node.tamper(schema.CF_TRAINING_RUNS, schema.run_key("run-2"), rehash)
        result = node.audit("run-2")
        assert result["checks"] == [] and result["rounds_replayed"] == 0
        assert result["problem"] == "the initial checkpoint of run-2 does not hash to the committed initial model hash"


def test_a_lost_value_file_is_found_by_the_audit_and_by_the_startup(tmp_path: Path, checkpoint: tuple[str, str]) -> None:
    """Payloads kept in files (docs/storage.md "Large values"): a file lost while its reference
    stayed (a power loss without sync_writes) is damage the audit names and a node's startup
    refuses, as a payload missing from the store itself is."""
    node = make_node(tmp_path / "node", checkpoint, external_value_bytes=1)
    node.stop()
    values = node.data / "db" / "values"
    with RocksStore(node.data / "db", read_only=True) as store:
        run = load_run(store, "run-2")
        assert run is not None and run.current_round is not None
        open_sub = run.current_round.submissions[1][0]
        _, raw = next(iter(store.iterate(schema.CF_SUBMISSIONS, schema.submission_prefix("run-1", 3))))
        committed = persistence.decode_submission_record(raw).payload_hash
        names = {digest: store._raw_get(schema.CF_SUBMISSIONS, schema.payload_key(task, digest))[19:35].hex()  # type: ignore[index]
                 for task, digest in (("run-2", open_sub.payload_hash), ("run-1", committed))}
    for name in names.values():
        (values / name).unlink()
    result = node.audit("run-1")
    assert not result["ok"] and result["rounds_replayed"] == 3 and "is missing" in str(result["problem"])
    result = node.audit("run-2")
    assert not result["ok"] and "payload of the accepted submission" in str(result["problem"])
    with RocksStore(node.data / "db") as store:
        with pytest.raises(StorageError, match="the store is damaged: the payload of the accepted submission"):
            NodeService(make_config(node.data), store)


def test_a_run_before_its_second_snapshot_is_checked_against_the_first(tmp_path: Path, checkpoint: tuple[str, str]) -> None:
    """The snapshot of round 0, written when the run is posted, is what a node rebuilds the model
    from until the next snapshot: the audit compares it with the replay too."""
    node = make_node(tmp_path / "node", checkpoint, training_rounds=1)
    try:
        training = node.audit("run-2")
    finally:
        node.stop()
    assert training["ok"] and training["rounds_replayed"] == 1
    assert training["checks"] == ["initial model", "snapshot of round 0", "open round 1: 2 accepted submission(s) stored"]


def test_a_pruned_run_replays_from_a_snapshot_of_its_last_committed_round(tmp_path: Path,
                                                                           checkpoint: tuple[str, str]) -> None:
    """Under prune_payloads an open run is replayed from its snapshot: one of the round just
    committed leaves no round to replay and is no damage, while a snapshot record naming a round
    after the last committed one is (its weights are no committed model)."""
    from tenzro_training.node.model_state import encode_round_count

    node = make_node(tmp_path / "node", checkpoint, training_rounds=2, prune_payloads=True)
    try:
        training = node.audit("run-2")
    finally:
        node.stop()
    assert training["ok"] and (training["rounds_committed"], training["rounds_replayed"]) == (2, 0)
    assert training["checks"] == ["initial model", "snapshot of round 2 (payloads before it pruned)",
                                  "open round 2: 2 accepted submission(s) stored"]
    node.tamper(schema.CF_META, schema.model_snapshot_key("run-2"), encode_round_count(3))
    assert node.audit("run-2")["problem"] == "the model snapshot of run-2 is of round 3, after its last committed round"


def test_a_store_from_before_sealed_records_is_audited_without_one(node: Node) -> None:
    """A store older than schema 3 has no sealed record (TRAINING_VERIFY's lookup) until a node
    opens it, and the audit opens stores read-only: there the absence is no damage, but a record
    the store does hold is still checked; from schema 3 on, a missing record is damage."""
    node.stop()

    def rewrite(version: int, *, drop_record: bool = False) -> None:
        with RocksStore(node.data / "db", upgrade_schema=False) as store:
            with store.atomic_batch() as batch:
                batch.put(schema.CF_META, schema.SCHEMA_VERSION_KEY, schema.encode_schema_version(version))
                if drop_record:
                    batch.delete(schema.CF_META, schema.sealed_record_key("run-1"))

    rewrite(2)
    assert node.audit("run-1")["checks"][-3:] == ["run root and receipt", "sealed record", "ended summary"]
    rewrite(2, drop_record=True)
    result = node.audit("run-1")
    assert result["ok"] and result["checks"][-2:] == ["run root and receipt", "ended summary"]
    rewrite(schema.SEALED_RECORDS_SINCE)
    result = node.audit("run-1")
    assert not result["ok"] and "the sealed record of run-1 (TRAINING_VERIFY's lookup) differs" in str(result["problem"])


def test_cli(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    data_dir = node.data
    assert cli.main(["audit", "--data-dir", str(data_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and [r["task_id"] for r in out["runs"]] == ["run-1", "run-2"]
    assert cli.main(["audit", "--data-dir", str(data_dir), "--task-id", "run-2"]) == 0
    out = capsys.readouterr().out
    assert "run-2: Training, 2/2 rounds reproduced; equal: initial model, snapshot of round 2" in out
    assert out.count("\n") == 1 and "run-1" not in out  # only the run asked for
    node.tamper(schema.CF_META, schema.round_reports_key("run-2", 0), b"[]")
    assert cli.main(["audit", "--data-dir", str(data_dir)]) == 1
    captured = capsys.readouterr()
    assert "run-2: Training, 0/2 rounds reproduced; PROBLEM:" in captured.out
    assert "tenzro: audit found problems in 1 run(s): run-2" in captured.err
    assert cli.main(["audit", "--data-dir", str(data_dir.parent / "nowhere")]) == 2
    assert "not a node data directory" in capsys.readouterr().err


def test_cli_refuses_a_db_that_is_not_a_store_and_creates_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The audit only reads a node's store: a db/ holding none is one line, exit 2, and no
    store is created there (which a later node start would take for its own)."""
    (tmp_path / "db").mkdir()
    assert cli.main(["audit", "--data-dir", str(tmp_path)]) == cli.EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("tenzro: ") and captured.err.count("\n") == 1
    assert list((tmp_path / "db").iterdir()) == []


def test_the_audit_takes_the_nodes_limits(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    """A node whose config raised max_checkpoint_bytes or max_payload_bytes holds runs the
    default limits refuse: --max-checkpoint-bytes gives the node's, and stored payloads replay
    whatever their size, as the node's finalize does (the audit had always used the defaults:
    docs probe)."""
    node.stop()
    with RocksStore(node.data / "db", read_only=True) as store:
        assert all(a.ok for a in audit_store(store, max_payload_bytes=1))
        [small] = audit_store(store, ["run-1"], max_checkpoint_bytes=16)
    assert not small.ok and "16" in str(small.problem)
    assert cli.main(["audit", "--data-dir", str(node.data), "--task-id", "run-1", "--max-checkpoint-bytes", "16"]) == 1
    assert "run-1: Sealed, 0/5 rounds reproduced; PROBLEM:" in capsys.readouterr().out
    assert cli.main(["audit", "--data-dir", str(node.data), "--max-checkpoint-bytes", str(1 << 30)]) == 0
    for bad in ("0", "-1", "1e9", str(2**50 + 1)):
        with pytest.raises(SystemExit) as exited:  # argparse's usage error
            cli.main(["audit", "--data-dir", str(node.data), "--max-checkpoint-bytes", bad])
        assert exited.value.code == 2 and "expected a decimal byte count in 1..2^50" in capsys.readouterr().err


def test_export_model_reads_the_store_read_only_beside_the_node_and_writes_nothing(
    node: Node, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Without the model file, export-model had built a node service over the store: refused
    while the node ran (its lock), and on a stopped node's older store it marked the store for
    this version, which the old version then refused (upgrade probe). It now reads the store
    read-only, beside the running node too, and writes nothing."""
    from tests.node.conftest import snapshot

    (node.data / "models" / "run-1.safetensors").unlink()
    final = node.service.get_receipt("run-1")["receipt"]["final_model_hash"]
    out = tmp_path / "final.safetensors"
    argv = ["train", "export-model", "--task-id", "run-1", "--data-dir", str(node.data), "--out", str(out), "--json"]
    assert cli.main(argv) == 0  # beside the running service, which holds the store's lock
    assert json.loads(capsys.readouterr().out)["model_hash"] == final
    node.stop()
    with RocksStore(node.data / "db") as store:
        with store.atomic_batch() as batch:
            batch.put(schema.CF_META, schema.SCHEMA_VERSION_KEY, schema.encode_schema_version(2))
        before = snapshot(store)
    out.unlink()
    assert cli.main(argv) == 0 and json.loads(capsys.readouterr().out)["model_hash"] == final
    with RocksStore(node.data / "db", upgrade_schema=False) as store:
        assert snapshot(store) == before  # still version 2, nothing added
    assert cli.main([*argv[:3], "run-2", *argv[4:]]) == 1
    assert "cannot export run-2: run-2: cannot export the final model while the run is Training" in capsys.readouterr().err


def test_export_model_refuses_a_model_file_that_is_not_the_stored_runs(
    node: Node, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A model file in D/models is the node's copy of the store's final weights: the docs said it
    was checked against the run's final_model_hash, but only --check-receipt compared anything,
    so a damaged file was exported as the run's model (docs audit). Now exit 1, nothing written;
    with the damaged file removed, the store's weights are exported."""
    import safetensors.torch

    final = node.service.get_receipt("run-1")["receipt"]["final_model_hash"]
    out = tmp_path / "final.safetensors"
    argv = ["train", "export-model", "--task-id", "run-1", "--data-dir", str(node.data), "--out", str(out), "--json"]
    assert cli.main(argv) == 0 and json.loads(capsys.readouterr().out)["model_hash"] == final  # the file, checked
    out.unlink()
    model_file = node.data / "models" / "run-1.safetensors"
    model = safetensors.torch.load(model_file.read_bytes())
    model_file.write_bytes(safetensors.torch.save({name: t * 2 for name, t in model.items()}))
    assert cli.main(argv) == cli.EXIT_RPC_ERROR
    captured = capsys.readouterr()
    assert captured.out == "" and f"the run's final_model_hash is {final}: not written" in captured.err
    assert captured.err.count("\n") == 1 and not out.exists()
    model_file.unlink()
    assert cli.main(argv) == 0 and json.loads(capsys.readouterr().out)["model_hash"] == final


def test_export_model_refuses_a_model_file_of_a_run_the_store_has_not_sealed(
    node: Node, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A file in D/models is exported only as the copy of a sealed run's final weights: one
    named after a run the store holds as still training (copied there, or left by another
    store) has no final_model_hash to be checked against, so it is refused (exit 1, the
    store's reason), and nothing is written."""
    models = node.data / "models"
    (models / "run-2.safetensors").write_bytes((models / "run-1.safetensors").read_bytes())
    out = tmp_path / "final.safetensors"
    code = cli.main(["train", "export-model", "--task-id", "run-2", "--data-dir", str(node.data), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == cli.EXIT_RPC_ERROR and captured.out == "" and not out.exists()
    assert captured.err.startswith("tenzro: cannot export run-2: ") and captured.err.count("\n") == 1


@pytest.mark.parametrize("with_file", [True, False], ids=["model file", "store only"])
def test_export_model_refuses_a_run_the_store_does_not_hold(
    node: Node, capsys: pytest.CaptureFixture[str], tmp_path: Path, with_file: bool
) -> None:
    """A task id the store never held (a typo, another node's run, a file copied in) is refused
    as unknown, one line and exit 1, whether or not a model file bears its name."""
    models = node.data / "models"
    if with_file:
        (models / "run-9.safetensors").write_bytes((models / "run-1.safetensors").read_bytes())
    out = tmp_path / "final.safetensors"
    code = cli.main(["train", "export-model", "--task-id", "run-9", "--data-dir", str(node.data), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == cli.EXIT_RPC_ERROR and captured.out == "" and not out.exists()
    assert captured.err.startswith("tenzro: cannot export run-9: ") and "unknown task" in captured.err
    assert captured.err.count("\n") == 1


def test_export_model_names_a_missing_tensor_list(node: Node, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Rebuilt from the store, the model file needs the run's tensor list: a store that lost it
    is named as such, not as an undecodable value."""
    node.stop()
    with RocksStore(node.data / "db") as store:
        with store.atomic_batch() as batch:
            batch.delete(schema.CF_META, schema.tensor_specs_key("run-1"))
    (node.data / "models" / "run-1.safetensors").unlink()
    out = tmp_path / "final.safetensors"
    code = cli.main(["train", "export-model", "--task-id", "run-1", "--data-dir", str(node.data), "--out", str(out)])
    assert code == cli.EXIT_RPC_ERROR and not out.exists()
    assert "the tensor list of run 'run-1' is missing" in capsys.readouterr().err


def test_export_model_check_receipt_refuses_a_receipt_or_a_model_that_does_not_hold(
    node: Node, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--check-receipt: the node's receipt of the run must pass the offline verification and name
    the exported model's hash; otherwise exit 1 and nothing is written."""
    import safetensors.torch
    import torch

    from tests.test_cli_unit import FakeNode

    receipt = json.loads(json.dumps(node.service.get_receipt("run-1")))
    fake = FakeNode()
    try:
        out = tmp_path / "final.safetensors"
        argv = ["train", "export-model", "--task-id", "run-1", "--data-dir", str(node.data), "--out", str(out),
                "--check-receipt", "--rpc", fake.url, "--json"]
        fake.replies["tenzro_training_getReceipt"] = receipt
        assert cli.main(argv) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["receipt_checked"] is True and result["model_hash"] == receipt["receipt"]["final_model_hash"]
        assert fake.calls == [("tenzro_training_getReceipt", {"task_id": "run-1"})]
        out.unlink()

        forged = json.loads(json.dumps(receipt))
        forged["receipt"]["final_model_hash"] = "0x" + "11" * 32  # no longer the run root's
        fake.replies["tenzro_training_getReceipt"] = forged
        assert cli.main(argv) == cli.EXIT_RPC_ERROR
        assert "the node's receipt of run-1 fails verification" in capsys.readouterr().err
        assert not out.exists()

        fake.replies["tenzro_training_getReceipt"] = receipt
        # A data dir of the model file alone (no store to check it against): the receipt catches it.
        model = safetensors.torch.load((node.data / "models" / "run-1.safetensors").read_bytes())
        model = {name: t + 1 for name, t in model.items()} if model else {"x": torch.ones(1)}
        (tmp_path / "copy" / "models").mkdir(parents=True)
        (tmp_path / "copy" / "models" / "run-1.safetensors").write_bytes(safetensors.torch.save(model))
        argv[5] = str(tmp_path / "copy")
        assert cli.main(argv) == cli.EXIT_RPC_ERROR
        assert f"differs from the receipt's {receipt['receipt']['final_model_hash']}" in capsys.readouterr().err
        assert not out.exists()
    finally:
        fake.close()


def test_get_receipt_is_rendered_once_per_sealed_run(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each getReceipt had rebuilt the ABI and every attestation: ~1 s and 3.1 MB for a 600-round
    run, on the service thread, for anyone who asks (soak probe). A sealed receipt never changes,
    so the answer is rendered once and kept (bounded in bytes)."""
    from collections import OrderedDict

    from tenzro_training.errors import InvalidState
    from tenzro_training.jsontext import serialize_json
    from tenzro_training.node import service as service_module

    service = node.service
    first = service.get_receipt_json("run-1")
    assert json.loads(first) == json.loads(serialize_json(service.get_receipt("run-1")))
    monkeypatch.setattr(service, "_attestations", lambda run: pytest.fail("rendered again"))
    assert service.get_receipt_json("run-1") is first
    with pytest.raises(InvalidState, match="cannot issue a receipt while the run is Training"):
        service.get_receipt_json("run-2")  # no receipt: nothing kept
    assert list(service._receipt_json) == ["run-1"]
    # Bounded in bytes, least recently asked for out first; the one just rendered always stays.
    monkeypatch.setattr(service_module, "RECEIPT_JSON_CACHE_BYTES", len(first))
    service._receipt_json = OrderedDict([("old", b"x" * 10), *service._receipt_json.items()])
    service._receipt_json_bytes += 10
    del service._receipt_json["run-1"]
    service._receipt_json_bytes -= len(first)
    monkeypatch.undo()
    monkeypatch.setattr(service_module, "RECEIPT_JSON_CACHE_BYTES", len(first))
    assert service.get_receipt_json("run-1") == first
    assert list(service._receipt_json) == ["run-1"] and service._receipt_json_bytes == len(first)
