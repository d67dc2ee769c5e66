"""NodeService conformance: the same behaviour on the in-memory store and on RocksDB.

Every test here runs twice (``store_kind`` = memory, rocks) through the ``net`` fixture. A run
is M=3 trainers, K=2, F=2 fragments, 2 rounds, signed with real eth-account keys, on a fake
clock. Refusals are checked against a snapshot of every column family: a refused call must
leave the store byte-for-byte unchanged, except where the protocol says otherwise
(equivocation).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from storage import schema
from storage.interface import KVStore, StorageError
from tenzro_training import auth
from tenzro_training.aggregation import aggregate
from tenzro_training.auth import WrongSigner
from tenzro_training.errors import (
    CheckpointError,
    Equivocation,
    InvalidState,
    LateSubmission,
    NotEnrolled,
    PayloadError,
    PayloadUnavailable,
    QuorumNotReached,
    RoundMismatch,
    RunFull,
    SpecError,
    TaskExists,
    UnknownTask,
)
from tenzro_training.fragments import compute_model_hash, gather_fragment, scatter_fragment
from tenzro_training.ledger import InsufficientBalance, Ledger
from tenzro_training.node import persistence
from tenzro_training.node.config import DEFAULT_MAX_GRACE_WINDOW_MS
from tenzro_training.node.model_state import decode_round_count
from tenzro_training.node.replay import ReplayMismatch
from tenzro_training.node.service import NodeService
from tenzro_training.outer import OuterConfig, apply_outer_step
from tenzro_training.payload import (
    PayloadLayoutMismatch,
    PayloadMetadataMismatch,
    PayloadValueOutOfRange,
    compute_payload_hash,
)
from tenzro_training.receipt import TrainingReceipt, verify_receipt, verify_receipt_root
from tenzro_training.receipt_check import check_receipt_document
from tenzro_training.run import NotSponsor, NotSyncer, RunEvent, StragglerWindowOpen
from tenzro_training.run_events import DeadlinesExtended, EquivocationDetected, RunSealed, SyncerFailover, TrainerSlashed
from tenzro_training.spec import TrainingTaskSpec

from tests.node.conftest import (
    BALANCE,
    GRACE_MS,
    POOL,
    SPONSOR,
    SPONSOR_BALANCE,
    STAKE,
    STRANGER,
    SYNCERS,
    TIMINGS,
    T0,
    TRAINERS,
    VRF_SECRETS,
    FakeClock,
    Net,
    Party,
    gradient,
    initial_state,
    layouts_for,
    make_config,
    make_payload,
    open_test_store,
    snapshot,
    spec_dict,
)


def stored_ledger(net: Net) -> Ledger:
    ledger = persistence.load_ledger_entries(net.store.iterate(schema.CF_ACCOUNTS), net.store.iterate(schema.CF_LEDGER))
    assert ledger is not None
    return ledger


def check_ledger(net: Net) -> Ledger:
    """The stored ledger equals the service's, conserves supply and minted the genesis."""
    ledger = stored_ledger(net)
    assert ledger == net.service._ledger
    assert ledger.total_supply() == ledger.minted - ledger.burned
    assert ledger.minted == SPONSOR_BALANCE + 5 * BALANCE
    return ledger


def start(net: Net, checkpoint: tuple[str, str], n_trainers: int = 3, **spec: Any) -> dict[str, Any]:
    result = net.post(spec_dict(*checkpoint, **spec))
    net.elect()
    for i in range(n_trainers):
        net.enroll(i)
    return result


def count_payload_reads(monkeypatch: pytest.MonkeyPatch, store: KVStore) -> list[bytes]:
    """The payload keys ``store.get`` is asked for from now on (until ``monkeypatch.undo()``)."""
    reads: list[bytes] = []
    real_get = store.get

    def counting_get(cf: str, key: bytes) -> bytes | None:
        if cf == schema.CF_SUBMISSIONS and key[:1] == schema.PAYLOAD_KEY_MARK:
            reads.append(key)
        return real_get(cf, key)

    monkeypatch.setattr(store, "get", counting_get)
    return reads


def play_round(net: Net, round_: int, trainers: tuple[int, ...] = (0, 1, 2)) -> dict[str, Any]:
    for i in trainers:
        for f in range(2):
            net.submit(i, round_, f)
    return net.finalize(round_)


def canonical(trainers: tuple[int, ...]) -> list[int]:
    return sorted(trainers, key=lambda i: TRAINERS[i].address)


def reference_model(spec: dict[str, Any], rounds: int, trainers: tuple[int, ...] = (0, 1, 2)) -> dict[str, torch.Tensor]:
    """The global model recomputed with the core functions alone, from the known gradients."""
    task = TrainingTaskSpec.from_dict(spec)
    cfg = OuterConfig.from_spec(task)
    state = initial_state()
    layouts = layouts_for()
    weights = [gather_fragment(state, lay) for lay in layouts]
    momentum = [torch.zeros_like(w) for w in weights]
    for r in range(rounds):
        for f, lay in enumerate(layouts):
            grads = [gradient(i, r, f, lay.numel) for i in canonical(trainers)]
            agg = aggregate(task.aggregation, grads).tensor
            weights[f], momentum[f] = apply_outer_step(weights[f], momentum[f], agg, cfg)
    for lay, w in zip(layouts, weights):
        scatter_fragment(state, lay, w)
    return state


class TestWholeRun:
    def test_run_to_sealed(self, net: Net, checkpoint: tuple[str, str]) -> None:
        events: list[RunEvent] = []
        net.service.on_event = events.append
        spec = spec_dict(*checkpoint)
        posted = start(net, checkpoint)
        assert posted["status"] == "Electing"
        state0 = initial_state()
        assert posted["initial_model_hash"] == "0x" + compute_model_hash(state0).hex()
        first = play_round(net, 0)
        assert first["status"] == "Training" and first["next_round"] == 1 and not first["sealed"]
        check_ledger(net)
        last = play_round(net, 1)
        assert last["sealed"] and last["status"] == "Sealed"

        # The receipt verifies, and its final model hash is the independently computed one.
        answer = net.service.get_receipt(net.task_id)
        receipt = TrainingReceipt.from_dict(answer["receipt"])
        assert verify_receipt_root(receipt) and verify_receipt(receipt)
        assert answer["run_root"] == "0x" + receipt.run_root.hex() == last["run_root"]
        expected = reference_model(spec, 2)
        assert receipt.final_model_hash == compute_model_hash(expected)
        assert [t.accepted_submissions for t in receipt.trainers] == [4, 4, 4]

        # Payouts: equal weights, floor(1001 * 4 / 12) = 333 each, remainder 2 to the sponsor;
        # every stake is returned; nothing was burned.
        ledger = check_ledger(net)
        for t in TRAINERS[:3]:
            assert ledger.balance_of(t.address) == BALANCE + 333
        assert ledger.balance_of(SPONSOR.address) == SPONSOR_BALANCE - POOL + 2
        assert ledger.burned == 0 and not ledger.escrows and not ledger.bonds
        sealed = [e for e in events if isinstance(e, RunSealed)]
        assert len(sealed) == 1 and sealed[0].remainder == 2

        # The exported final model loads and hashes to the receipt's final model hash.
        data = net.service.export_final_model(net.task_id)
        model = safetensors.torch.load(data)
        assert compute_model_hash(model) == receipt.final_model_hash
        for name, tensor in expected.items():
            assert torch.equal(model[name], tensor)
        if net.service._config.data_dir is not None:
            path = net.service.final_model_path(net.task_id)
            assert path == net.service._config.data_dir / "models" / "run-1.safetensors"
            assert path.read_bytes() == data

        view = net.service.get_run(net.task_id)
        assert view["status"] == "Sealed" and view["has_receipt"] is True
        assert len(view["round_records"]) == 2 and view["run_root"] == last["run_root"]

    def test_a_model_file_that_cannot_be_written_is_retried_not_fatal(
        self, checkpoint: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """A full disk at the seal (the batch committed, the file not written) was retried only
        at the next start, and one at startup stopped the node with a traceback (storage fault
        probe). Both now log once (not once per retry: the disk stays full for a while) and tick
        retries every 30 s (docs/node.md)."""
        import errno

        import tenzro_training.node.model_files as model_files_module

        real_write = model_files_module.write_file_atomically
        full = {"on": True}
        tries: list[Any] = []

        def write(path: Any, data: bytes, **kw: Any) -> None:
            tries.append(path)
            if full["on"]:
                raise OSError(errno.ENOSPC, "No space left on device")
            real_write(path, data, **kw)

        monkeypatch.setattr(model_files_module, "write_file_atomically", write)
        caplog.set_level(logging.INFO, logger="tenzro.node")

        def logged(text: str) -> int:
            return sum(text in r.getMessage() for r in caplog.records)

        clock = FakeClock()
        store = open_test_store("rocks", tmp_path / "db")
        net = Net(NodeService(make_config(tmp_path / "data"), store, clock=clock), clock)
        start(net, checkpoint)
        for r in range(2):
            play_round(net, r)
        path = net.service.final_model_path(net.task_id)
        assert net.service.get_run(net.task_id)["status"] == "Sealed" and not path.exists()
        assert logged("cannot write the final model file of run-1") == 1
        net.service.close()
        # A restart on the still full disk: the node starts.
        net = Net(NodeService(make_config(tmp_path / "data"), store, clock=clock), clock)
        assert not path.exists()
        assert logged("cannot write the final model file of run-1") == 2  # this node's first try
        net.service.tick()  # a retry, still on a full disk: not logged again
        assert logged("cannot write the final model file of run-1") == 2
        full["on"] = False
        net.service.tick()  # within the retry interval: not yet
        clock.advance(29_999)
        net.service.tick()
        assert not path.exists()
        clock.advance(1)
        net.service.tick()
        assert path.read_bytes() == net.service.export_final_model(net.task_id)
        assert logged("wrote the final model file of run-1") == 1
        written = len(tries)
        clock.advance(model_files_module.MODEL_FILE_RETRY_MS)
        net.service.tick()  # written: no longer retried
        assert len(tries) == written
        net.service.close()
        store.close()

    def test_a_failed_store_write_is_reported_until_restart(self, net: Net, checkpoint: tuple[str, str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
        """The health check reads storage_failure: RocksDB refuses every write after one failed
        (a full disk) until the store is reopened."""
        start(net, checkpoint)
        assert net.service.storage_failure is None

        def refuse() -> Any:
            raise StorageError("write failed: IO error: No space left on device")

        monkeypatch.setattr(net.store, "atomic_batch", refuse)
        with pytest.raises(StorageError):
            net.submit(0, 0, 0)
        assert "No space left" in (net.service.storage_failure or "")
        assert net.service.get_run(net.task_id)["submission_counts"] == [0, 0]  # nothing half-applied

    def test_a_finalize_that_fails_after_stepping_leaves_no_half_stepped_model(
        self, net: Net, checkpoint: tuple[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Finalize steps the model in place (the committed state of the previous round is kept in
        memory between finalizes); a failure after the step must not leak into the retry."""
        from storage.interface import StorageError

        spec = spec_dict(*checkpoint)
        start(net, checkpoint)
        play_round(net, 0)
        for i in (0, 1, 2):
            for f in range(2):
                net.submit(i, 1, f)
        before = snapshot(net.store)

        def disk_full(ops: object) -> None:
            raise StorageError("no space left on device")

        monkeypatch.setattr(net.service, "_write", disk_full)
        with pytest.raises(StorageError):
            net.finalize(1)
        monkeypatch.undo()
        assert snapshot(net.store) == before and net.service.get_run(net.task_id)["round"] == 1
        # The failed call's FinalizeRound signature is not served for a round the store lacks.
        assert net.service.get_finalize_signature(net.task_id, 1) is None
        last = net.finalize(1)
        assert net.service.get_finalize_signature(net.task_id, 1) is not None
        assert last["sealed"]
        receipt = TrainingReceipt.from_dict(net.service.get_receipt(net.task_id)["receipt"])
        assert receipt.final_model_hash == compute_model_hash(reference_model(spec, 2))

    def test_the_model_cache_changes_no_bit(self, checkpoint: tuple[str, str]) -> None:
        """model_cache_runs=0 (every finalize decodes the store's state) seals the same model."""
        from storage.memory import MemoryStore
        from tests.node.conftest import FakeClock, make_config

        spec = spec_dict(*checkpoint)
        hashes = []
        for cache_runs in (0, 2):
            clock = FakeClock()
            other = Net(NodeService(make_config(model_cache_runs=cache_runs), MemoryStore(), clock=clock), clock)
            start(other, checkpoint)
            play_round(other, 0)
            assert len(other.service._model_cache) == min(cache_runs, 1)
            assert play_round(other, 1)["sealed"] and not other.service._model_cache
            receipt = TrainingReceipt.from_dict(other.service.get_receipt(other.task_id)["receipt"])
            hashes.append(receipt.final_model_hash)
            other.service.close()
        assert hashes[0] == hashes[1] == compute_model_hash(reference_model(spec, 2))

    def test_get_run_view(self, net: Net, checkpoint: tuple[str, str]) -> None:
        start(net, checkpoint)
        net.submit(0, 0, 1)
        view = net.service.get_run(net.task_id)
        layouts = layouts_for()
        assert [f["layout_hash"] for f in view["fragments"]] == ["0x" + lay.layout_hash().hex() for lay in layouts]
        assert [f["numel"] for f in view["fragments"]] == [9, 8]
        assert view["fragments"][0]["entries"][0] == {
            "name": "layer.bias", "shape": [5], "dtype": "float32", "start": 0, "stop": 5,
        }
        assert view["submission_counts"] == [0, 1]
        assert view["syncer"] == net.syncer().text and view["syncer_rank"] == 1
        assert len(view["election"]["tickets"]) == 3 and len(view["election"]["ranking"]) == 3
        assert view["has_receipt"] is False and view["status"] == "Training"
        json.dumps(view)  # JSON-able as the transport needs

    def test_get_run_json_is_the_view_of_every_state(self, net: Net, checkpoint: tuple[str, str]) -> None:
        """getRun's JSON text (the state part rendered once per run state) is exactly get_run's
        view: after every transition, and with the clock moved but the state unchanged."""

        def check() -> dict[str, Any]:
            view = net.service.get_run(net.task_id)
            assert json.loads(net.service.get_run_json(net.task_id)) == view
            return view

        net.post(spec_dict(*checkpoint))
        assert check()["status"] == "Electing"  # post_task ticks once
        net.elect()
        check()
        for i in range(3):
            net.enroll(i)
            assert len(check()["trainers"]) == i + 1
        net.submit(0, 0, 1)
        before = check()
        assert before["submission_counts"] == [0, 1]
        net.clock.advance(5)  # the same state, a later clock
        after = check()
        assert after["now_ms"] == before["now_ms"] + 5
        assert {k: v for k, v in after.items() if k != "now_ms"} == {k: v for k, v in before.items() if k != "now_ms"}
        rounds = before["max_rounds"]
        import tenzro_training.node.service as service_module

        rendered: list[int] = []
        real = service_module.round_record_to_dict

        def counting(record: Any) -> Any:
            rendered.append(record.round)
            return real(record)

        service_module.round_record_to_dict = counting  # type: ignore[assignment]
        try:
            for r in range(rounds):
                play_round(net, r)
                view = check()
                assert len(view["round_records"]) == r + 1
        finally:
            service_module.round_record_to_dict = real  # type: ignore[assignment]
        assert view["status"] == "Sealed" and view["has_receipt"] is True
        # Each committed record is rendered twice in all: for finalizeRound's answer and once for
        # getRun's text, not again for every later run state (review).
        assert sorted(rendered) == sorted([*range(rounds), *range(rounds)])

    def test_get_run_json_answers_each_run_past_its_cache(
        self, net: Net, checkpoint: tuple[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import tenzro_training.node.service as service_module

        monkeypatch.setattr(service_module, "RUN_JSON_CACHE_RUNS", 1)
        net.post(spec_dict(*checkpoint))
        net.post(spec_dict(*checkpoint, task_id="run-2", reward_pool="1"))
        for task_id in ("run-1", "run-2", "run-1", "run-2"):
            assert json.loads(net.service.get_run_json(task_id)) == net.service.get_run(task_id)
            assert json.loads(net.service.get_run_json(task_id))["task_id"] == task_id
        assert len(net.service._run_json) == 1

    def test_get_run_serves_what_a_trainer_needs_to_check_the_model_hash(self, net: Net,
                                                                        checkpoint: tuple[str, str]) -> None:
        """The zero-element tensor is in no fragment but has a record in the model hash: getRun
        lists it apart, and a trainer that rebuilds the model from the view gets the committed hash."""
        from tenzro_training.cli.layouts import compute_layouts_from_view
        from tenzro_training.fragments import gather_fragment
        from tenzro_training.global_model import ModelLayout, compute_state_model_hash
        from tenzro_training.trainer.process import compute_model_layout_from_view

        start(net, checkpoint)
        view = json.loads(json.dumps(net.service.get_run(net.task_id)))  # as it crosses the wire
        assert view["empty_tensors"] == [{"name": "empty", "shape": [0]}]
        layouts = compute_layouts_from_view(view)
        weights = [gather_fragment(initial_state(), lay) for lay in layouts]
        model = compute_model_layout_from_view(view, layouts)
        assert "0x" + compute_state_model_hash(model, weights).hex() == view["model_hash"]
        without = ModelLayout.from_views(layouts)  # what trainers rebuilt before empty_tensors
        assert "0x" + compute_state_model_hash(without, weights).hex() != view["model_hash"]

    def test_list_runs_is_ordered_paged_and_filtered(self, net: Net, checkpoint: tuple[str, str]) -> None:
        for task_id in ("b-run", "a-run", "c-run"):
            net.post(spec_dict(*checkpoint, task_id=task_id, reward_pool="10"))
        net.task_id = "b-run"
        net.cancel()
        page = net.service.list_runs(None, 0, 2)
        assert page["total"] == 3 and [r["task_id"] for r in page["runs"]] == ["a-run", "b-run"]
        assert [r["task_id"] for r in net.service.list_runs(None, 2, 50)["runs"]] == ["c-run"]
        cancelled = net.service.list_runs("Cancelled", 0, 50)
        assert cancelled["total"] == 1 and cancelled["runs"][0]["status"] == "Cancelled"
        assert net.service.list_runs("Sealed", 0, 50) == {"runs": [], "total": 0, "offset": 0, "limit": 50}


class TestRefusals:
    """Each refused call leaves every column family byte-for-byte unchanged."""

    def test_invalid_post_task_wrong_signer(self, net: Net, checkpoint: tuple[str, str]) -> None:
        before = snapshot(net.store)
        with pytest.raises(NotSponsor):
            net.post(spec_dict(*checkpoint), signer=STRANGER)
        assert snapshot(net.store) == before

    def test_invalid_post_task_bad_checkpoint_hash(self, net: Net, checkpoint: tuple[str, str]) -> None:
        before = snapshot(net.store)
        with pytest.raises(CheckpointError):
            net.post(spec_dict(checkpoint[0], "0x" + "00" * 32))
        assert snapshot(net.store) == before

    def test_invalid_post_task_missing_checkpoint_file(self, net: Net, tmp_path: Path, checkpoint: tuple[str, str]) -> None:
        before = snapshot(net.store)
        with pytest.raises(CheckpointError):
            net.post(spec_dict((tmp_path / "nope.safetensors").as_uri(), checkpoint[1]))
        assert snapshot(net.store) == before

    def test_invalid_post_task_too_many_fragments(self, net: Net, checkpoint: tuple[str, str]) -> None:
        spec = spec_dict(*checkpoint)
        spec["architecture"]["fragment_count"] = 18  # the model has 17 elements
        before = snapshot(net.store)
        with pytest.raises(SpecError) as info:  # public: the sponsor is told which field and why
            net.post(spec)
        assert info.value.path == "architecture.fragment_count"
        assert "fragment_count 18 exceeds the model's 17 elements" in info.value.reason
        assert snapshot(net.store) == before

    def test_invalid_post_task_without_init_checkpoint(self, net: Net, checkpoint: tuple[str, str]) -> None:
        spec = spec_dict(*checkpoint)
        spec["architecture"]["metadata"] = {}
        before = snapshot(net.store)
        with pytest.raises(SpecError):
            net.post(spec)
        assert snapshot(net.store) == before

    def test_invalid_post_task_receipt_above_the_nodes_limit(self, net: Net, checkpoint: tuple[str, str]) -> None:
        from tenzro_training.node.config import DEFAULT_MAX_RECEIPT_BYTES

        spec = spec_dict(*checkpoint, max_rounds=10_000)  # 2 fragments x 3 trainers: ~9 MB
        before = snapshot(net.store)
        with pytest.raises(SpecError) as info:
            net.post(spec)
        assert info.value.path == "max_rounds" and f"max_receipt_bytes {DEFAULT_MAX_RECEIPT_BYTES}" in info.value.reason
        assert snapshot(net.store) == before

    def test_invalid_post_task_trainer_count_above_the_nodes_limit(self, net: Net, checkpoint: tuple[str, str]) -> None:
        spec = spec_dict(*checkpoint, trainer_count=257, quorum=2)
        before = snapshot(net.store)
        with pytest.raises(SpecError) as info:
            net.post(spec)
        assert info.value.path == "trainer_count" and "<= 256" in info.value.reason
        assert snapshot(net.store) == before

    def test_invalid_post_task_grace_window_above_the_nodes_limit(self, net: Net, checkpoint: tuple[str, str]) -> None:
        cap = DEFAULT_MAX_GRACE_WINDOW_MS  # make_config keeps the default
        before = snapshot(net.store)
        with pytest.raises(SpecError) as info:
            net.post(spec_dict(*checkpoint, grace_window_ms=cap + 1))
        assert info.value.path == "grace_window_ms" and str(cap) in info.value.reason
        assert snapshot(net.store) == before
        assert net.post(spec_dict(*checkpoint, grace_window_ms=cap))["task_id"] == "run-1"  # the limit itself is fine

    def test_invalid_post_task_rule_undefined_for_a_straggler_count(
        self, net: Net, checkpoint: tuple[str, str]
    ) -> None:
        """K = 3 of M = 4 with alpha 5000: a round that accepts all 4 trims every value."""
        spec = spec_dict(*checkpoint, trainer_count=4, quorum=3, aggregation={"TrimmedMean": {"alpha_bps": 5000}})
        before = snapshot(net.store)
        with pytest.raises(SpecError) as info:
            net.post(spec)
        assert info.value.path == "aggregation" and "trainer_count 4" in info.value.reason
        assert snapshot(net.store) == before

    def test_invalid_post_task_pool_above_balance(self, net: Net, checkpoint: tuple[str, str]) -> None:
        before = snapshot(net.store)
        with pytest.raises(InsufficientBalance):
            net.post(spec_dict(*checkpoint, reward_pool=str(SPONSOR_BALANCE + 1)))
        assert snapshot(net.store) == before

    def test_post_task_replay_is_idempotent(self, net: Net, checkpoint: tuple[str, str]) -> None:
        first = net.post(spec_dict(*checkpoint))
        before = snapshot(net.store)
        assert net.post(spec_dict(*checkpoint)) == first
        assert snapshot(net.store) == before
        with pytest.raises(TaskExists):
            net.post(spec_dict(*checkpoint, reward_pool="7"))
        assert snapshot(net.store) == before

    def test_invalid_unknown_task(self, net: Net) -> None:
        before = snapshot(net.store)
        with pytest.raises(UnknownTask):
            net.service.get_run("nope")
        with pytest.raises(UnknownTask):
            net.enroll(0)
        with pytest.raises(UnknownTask):
            net.submit(0, 0, 0)
        with pytest.raises(UnknownTask):
            net.service.get_receipt("run-1")
        assert snapshot(net.store) == before

    def test_invalid_enroll_wrong_signer(self, net: Net, checkpoint: tuple[str, str]) -> None:
        net.post(spec_dict(*checkpoint))
        net.elect()
        before = snapshot(net.store)
        with pytest.raises(WrongSigner):
            net.enroll(0, signer=STRANGER)
        assert snapshot(net.store) == before

    def test_invalid_submit_by_stranger(self, net: Net, checkpoint: tuple[str, str]) -> None:
        start(net, checkpoint)
        before = snapshot(net.store)
        with pytest.raises(NotEnrolled):
            net.submit(0, 0, 0, signer=STRANGER)
        assert snapshot(net.store) == before

    def test_invalid_late_submission(self, net: Net, checkpoint: tuple[str, str]) -> None:
        start(net, checkpoint)
        play_round(net, 0)
        before = snapshot(net.store)
        with pytest.raises(LateSubmission):  # the payload round 0 accepted (another one: equivocation)
            net.submit(0, 0, 0)
        with pytest.raises(LateSubmission):
            net.submit(0, 0, 1, hash_only=True)
        with pytest.raises(RoundMismatch):
            net.submit(0, 2, 0)
        assert snapshot(net.store) == before

    def test_invalid_payload_layout_mismatch(self, net: Net, checkpoint: tuple[str, str]) -> None:
        start(net, checkpoint)
        before = snapshot(net.store)
        other = net.payload(0, 0, 1)  # a valid payload of fragment 1, submitted as fragment 0
        with pytest.raises(PayloadLayoutMismatch):
            net.submit(0, 0, 0, payload=other)
        with pytest.raises(PayloadMetadataMismatch):  # the header names round 1
            net.submit(0, 0, 0, payload=net.payload(0, 1, 0))
        with pytest.raises(PayloadError):
            net.submit(0, 0, 0, payload=b"\x00" * 40)
        assert snapshot(net.store) == before

    def test_invalid_huge_finite_values_are_refused_at_admission(self, net: Net, checkpoint: tuple[str, str]) -> None:
        """float32 max passes every finiteness check but overflows a Mean or the outer step:
        before max_gradient_abs, one trainer sending it made a round no syncer could finalize,
        and the run failed with that trainer's stake refunded."""
        start(net, checkpoint)
        lay = net.layouts[0]
        before = snapshot(net.store)
        for value in (3.4028234663852886e38, -2e6):
            flat = gradient(0, 0, 0, lay.numel)
            flat[lay.numel // 2] = value
            bad = make_payload(net.task_id, 0, lay, flat)
            with pytest.raises(PayloadValueOutOfRange) as info:
                net.submit(0, 0, 0, payload=bad)
            assert info.value.count == 1 and info.value.limit == 1e6
            with pytest.raises(PayloadValueOutOfRange):  # nor held from gossip
                net.service.store_payload(net.task_id, bad)
        assert snapshot(net.store) == before
        edge = gradient(0, 0, 0, lay.numel)
        edge[0] = -1e6  # at the bound: accepted
        net.submit(0, 0, 0, payload=make_payload(net.task_id, 0, lay, edge))
        for i in (1, 2):
            for f in range(2):
                net.submit(i, 0, f)
        net.submit(0, 0, 1)
        assert net.finalize(0)["round"] == 0

    def test_invalid_hash_only_submission_without_bytes(self, net: Net, checkpoint: tuple[str, str]) -> None:
        start(net, checkpoint)
        before = snapshot(net.store)
        with pytest.raises(PayloadUnavailable):
            net.submit(0, 0, 0, hash_only=True)
        assert snapshot(net.store) == before

    def test_hash_only_submission_of_a_gossiped_payload(self, net: Net, checkpoint: tuple[str, str]) -> None:
        start(net, checkpoint)
        data = net.payload(1, 0, 1)
        assert net.service.store_payload(net.task_id, data) == compute_payload_hash(data)
        before = snapshot(net.store)
        assert net.service.store_payload(net.task_id, data) == compute_payload_hash(data)  # no-op
        assert snapshot(net.store) == before
        result = net.submit(1, 0, 1, hash_only=True)
        assert result["accepted_count"] == 1
        with pytest.raises(PayloadLayoutMismatch):
            net.service.store_payload(net.task_id, net.payload(1, 1, 0))  # not this round

    def gossip(self, net: Net, i: int, data: bytes, fragment: int, signer: Any = None) -> bytes:
        """Hand ``data`` to store_payload as the bridge does: with trainer i's chunk signature."""
        digest = compute_payload_hash(data)
        round_ = net.service.get_run(net.task_id)["round"]
        msg = auth.SubmitOuterGradient(task_id=net.task_id, round=round_, fragment=fragment, payload_hash=digest)
        sig = (signer or TRAINERS[i]).sign(msg)
        return net.service.store_payload(net.task_id, data, signer=(TRAINERS[i].address, fragment, sig))

    def check_gossip_equivocation(self, net: Net, first: bytes, second: bytes, events: list[RunEvent]) -> None:
        """Trainer 1 equivocated on fragment 1 of round 0 with ``first`` then ``second``:
        slashed as on the submission path, both signed messages stored as evidence."""
        raw = net.store.get(schema.CF_EVIDENCE, schema.evidence_key(net.task_id, 0, 1, TRAINERS[1].address))
        assert raw is not None
        evidence = json.loads(raw)
        assert evidence["trainer"] == TRAINERS[1].text
        hashes = [m["typed_data"]["message"]["payloadHash"] for m in evidence["messages"]]
        assert hashes == ["0x" + compute_payload_hash(d).hex() for d in (first, second)]
        for message in evidence["messages"]:
            msg = auth.SubmitOuterGradient(task_id=net.task_id, round=0, fragment=1,
                                           payload_hash=bytes.fromhex(message["typed_data"]["message"]["payloadHash"][2:]))
            assert auth.recover_signer(msg, bytes.fromhex(message["signature"][2:])) == TRAINERS[1].text
        ledger = check_ledger(net)
        assert ledger.burned == STAKE and ledger.bond_of(net.task_id, TRAINERS[1].address) is None
        assert [type(e) for e in events] == [EquivocationDetected, TrainerSlashed]
        view = net.service.get_run(net.task_id)
        assert [t["slashed"] for t in view["trainers"]] == [False, True, False]
        assert not net.store.contains(schema.CF_SUBMISSIONS, schema.payload_key(net.task_id, compute_payload_hash(second)))

    def test_second_gossiped_payload_of_one_trainer_is_equivocation(self, net: Net,
                                                                     checkpoint: tuple[str, str]) -> None:
        """SPEC: two different payloads signed by one trainer for one (task, round, fragment)
        are equivocation. Before, a second gossiped one was only refused (HeldPayloadConflict):
        a trainer could sign two payloads, gossip both, and keep its stake."""
        start(net, checkpoint)
        first, second = net.payload(1, 0, 1), net.payload(1, 0, 1, variant=1)
        assert self.gossip(net, 1, first, 1) == compute_payload_hash(first)
        before = snapshot(net.store)
        assert self.gossip(net, 1, first, 1) == compute_payload_hash(first)  # a replay: a no-op
        assert snapshot(net.store) == before
        self.gossip(net, 2, net.payload(2, 0, 1), 1)  # another trainer: its own
        self.gossip(net, 1, net.payload(1, 0, 0), 0)  # another fragment: its own
        events: list[RunEvent] = []
        net.service.on_event = events.append
        with pytest.raises(Equivocation):
            self.gossip(net, 1, second, 1)
        self.check_gossip_equivocation(net, first, second, events)
        before = snapshot(net.store)
        with pytest.raises(NotEnrolled):  # slashed: nothing of it is held any more
            self.gossip(net, 1, net.payload(1, 0, 1, variant=2), 1)
        with pytest.raises(NotEnrolled):
            net.submit(1, 0, 1, hash_only=True)
        assert snapshot(net.store) == before
        play_round(net, 0, trainers=(0, 2))
        # Round 1: the bound starts afresh (round 0's entries are dropped).
        self.gossip(net, 2, net.payload(2, 1, 1), 1)
        assert list(net.service._gossip_held) == [net.task_id]
        assert all(r == 1 for r, _, _ in net.service._gossip_held[net.task_id])

    def test_gossiped_then_submitted_different_payload_is_equivocation(self, net: Net,
                                                                       checkpoint: tuple[str, str]) -> None:
        start(net, checkpoint)
        first, second = net.payload(1, 0, 1), net.payload(1, 0, 1, variant=1)
        self.gossip(net, 1, first, 1)
        events: list[RunEvent] = []
        net.service.on_event = events.append
        with pytest.raises(Equivocation):
            net.submit(1, 0, 1, variant=1)
        self.check_gossip_equivocation(net, first, second, events)

    def test_submitted_then_gossiped_different_payload_is_equivocation(self, net: Net,
                                                                       checkpoint: tuple[str, str]) -> None:
        start(net, checkpoint)
        first, second = net.payload(1, 0, 1), net.payload(1, 0, 1, variant=1)
        net.submit(1, 0, 1)
        self.gossip(net, 1, first, 1)  # the submitted payload, gossiped too: fine
        assert net.service.get_run(net.task_id)["submission_counts"] == [0, 1]
        events: list[RunEvent] = []
        net.service.on_event = events.append
        with pytest.raises(Equivocation):
            self.gossip(net, 1, second, 1)
        self.check_gossip_equivocation(net, first, second, events)
        assert net.service.get_run(net.task_id)["submission_counts"] == [0, 0]  # its submission dropped

    def test_invalid_gossiped_payload_signature_refused_without_effect(self, net: Net,
                                                                       checkpoint: tuple[str, str]) -> None:
        """store_payload checks the chunks' signature itself: it may become slashing evidence."""
        from tenzro_training.auth import SignatureInvalid
        from tenzro_training.run import InvalidRunArgument

        start(net, checkpoint)
        net.submit(1, 0, 1)
        before = snapshot(net.store)
        second = net.payload(1, 0, 1, variant=1)
        with pytest.raises(WrongSigner):  # signed by trainer 2 in trainer 1's name
            self.gossip(net, 1, second, 1, signer=TRAINERS[2])
        digest = compute_payload_hash(second)
        with pytest.raises(SignatureInvalid):
            net.service.store_payload(net.task_id, second, signer=(TRAINERS[1].address, 1, b"\x00" * 65))
        with pytest.raises(InvalidRunArgument):
            net.service.store_payload(net.task_id, second, signer=(TRAINERS[1].address, 2, b"\x00" * 65))
        stranger_sig = STRANGER.sign(auth.SubmitOuterGradient(task_id=net.task_id, round=0, fragment=1,
                                                              payload_hash=digest))
        with pytest.raises(NotEnrolled):
            net.service.store_payload(net.task_id, second, signer=(STRANGER.address, 1, stranger_sig))
        with pytest.raises(PayloadError):  # signed for fragment 0, but a fragment-1 payload
            self.gossip(net, 2, net.payload(2, 0, 1), 0)
        assert snapshot(net.store) == before
        assert [t["slashed"] for t in net.service.get_run(net.task_id)["trainers"]] == [False, False, False]

    def test_invalid_finalize_refusals(self, net: Net, checkpoint: tuple[str, str]) -> None:
        start(net, checkpoint)
        syncer = net.syncer()
        other = next(s for s in SYNCERS if s != syncer)
        before = snapshot(net.store)
        with pytest.raises(QuorumNotReached):
            net.finalize(0)
        assert snapshot(net.store) == before
        for i in (0, 1):
            for f in (0, 1):
                net.submit(i, 0, f)
        before = snapshot(net.store)
        with pytest.raises(NotSyncer):
            net.finalize(0, signer=other)
        with pytest.raises(StragglerWindowOpen):  # trainer 2 may still submit
            net.finalize(0)
        with pytest.raises(RoundMismatch):
            net.finalize(1)
        assert snapshot(net.store) == before
        net.clock.advance(GRACE_MS + 1)
        result = net.finalize(0)
        assert [len(f["accepted"]) for f in result["fragments"]] == [2, 2]
        before = snapshot(net.store)
        assert net.finalize(0) == result  # an identical replay of a committed round
        with pytest.raises(RoundMismatch):
            net.finalize(0, signer=other)
        assert snapshot(net.store) == before

    def test_invalid_cancel_by_stranger_and_after_training(self, net: Net, checkpoint: tuple[str, str]) -> None:
        start(net, checkpoint)
        before = snapshot(net.store)
        with pytest.raises(NotSponsor):
            net.cancel(signer=STRANGER)
        with pytest.raises(InvalidState):
            net.cancel()
        with pytest.raises(InvalidState):
            net.service.get_receipt(net.task_id)
        assert snapshot(net.store) == before


class TestProtocolEffects:
    def test_equivocation_slashes_and_stores_evidence(self, net: Net, checkpoint: tuple[str, str]) -> None:
        start(net, checkpoint)
        net.submit(0, 0, 0)
        net.submit(0, 0, 1)
        net.submit(1, 0, 0)
        held = net.service._payload_cache.nbytes
        events: list[RunEvent] = []
        net.service.on_event = events.append
        with pytest.raises(Equivocation):
            net.submit(0, 0, 0, variant=1)
        # Both of the slashed trainer's accepted payloads left the cache; the other's stayed.
        assert net.service._payload_cache.nbytes == held - len(net.payload(0, 0, 0)) - len(net.payload(0, 0, 1)) > 0
        raw = net.store.get(schema.CF_EVIDENCE, schema.evidence_key(net.task_id, 0, 0, TRAINERS[0].address))
        assert raw is not None
        evidence = json.loads(raw)
        hashes = [m["typed_data"]["message"]["payloadHash"] for m in evidence["messages"]]
        assert hashes == ["0x" + compute_payload_hash(net.payload(0, 0, 0, v)).hex() for v in (0, 1)]
        for message in evidence["messages"]:  # both signatures recover to the trainer
            msg = auth.SubmitOuterGradient(
                task_id=net.task_id, round=0, fragment=0, payload_hash=bytes.fromhex(message["typed_data"]["message"]["payloadHash"][2:])
            )
            assert auth.recover_signer(msg, bytes.fromhex(message["signature"][2:])) == TRAINERS[0].text
        ledger = check_ledger(net)
        assert ledger.burned == STAKE and ledger.bond_of(net.task_id, TRAINERS[0].address) is None
        assert [type(e) for e in events] == [EquivocationDetected, TrainerSlashed]
        view = net.service.get_run(net.task_id)
        assert [t["slashed"] for t in view["trainers"]] == [True, False, False]
        assert view["submission_counts"] == [1, 0] and view["status"] == "Training"
        before = snapshot(net.store)
        with pytest.raises(NotEnrolled):  # a slashed trainer is out
            net.submit(0, 0, 1)
        assert snapshot(net.store) == before
        # The run goes on with the two others; the slashed trainer gets nothing back.
        play_round(net, 0, trainers=(1, 2))
        play_round(net, 1, trainers=(1, 2))
        ledger = check_ledger(net)
        assert ledger.balance_of(TRAINERS[0].address) == BALANCE - STAKE
        assert ledger.balance_of(TRAINERS[1].address) == BALANCE + POOL // 2

    def test_equivocation_over_a_finalized_round_slashes_now(self, net: Net, checkpoint: tuple[str, str]) -> None:
        start(net, checkpoint)
        play_round(net, 0)
        committed = net.service.get_run(net.task_id)["round_records"][0]
        net.submit(1, 1, 0)
        with pytest.raises(Equivocation):  # signs a second payload for round 0, already finalized
            net.submit(1, 0, 0, variant=1, hash_only=True)
        culprit = TRAINERS[1].address
        raw = net.store.get(schema.CF_EVIDENCE, schema.evidence_key(net.task_id, 0, 0, culprit))
        assert raw is not None and json.loads(raw)["slashed_in_round"] == 1
        ledger = check_ledger(net)
        assert ledger.burned == STAKE and ledger.bond_of(net.task_id, culprit) is None
        view = net.service.get_run(net.task_id)
        assert [t["slashed"] for t in view["trainers"]] == [False, True, False]
        assert view["submission_counts"] == [0, 0]  # its round-1 input is dropped
        assert view["round_records"][0] == committed  # round 0 keeps it: committed is final
        before = snapshot(net.store)
        with pytest.raises(NotEnrolled):  # out of the run, evidence or not
            net.submit(1, 0, 0, variant=2, hash_only=True)
        assert snapshot(net.store) == before
        play_round(net, 1, trainers=(0, 2))
        document = json.loads(json.dumps(net.service.get_receipt(net.task_id)))
        assert check_receipt_document(document).ok
        assert [(s["round"], s["slashed_in_round"]) for s in document["attestations"]["slashings"]] == [(0, 1)]
        ledger = check_ledger(net)
        assert ledger.balance_of(culprit) == BALANCE - STAKE
        assert ledger.balance_of(TRAINERS[0].address) == BALANCE + POOL // 2

    def test_cancellation_refunds(self, net: Net, checkpoint: tuple[str, str]) -> None:
        net.post(spec_dict(*checkpoint))
        net.elect()
        net.enroll(0)
        ledger = check_ledger(net)
        assert ledger.balance_of(SPONSOR.address) == SPONSOR_BALANCE - POOL
        assert ledger.balance_of(TRAINERS[0].address) == BALANCE - STAKE
        assert net.cancel()["status"] == "Cancelled"
        ledger = check_ledger(net)
        assert ledger.balance_of(SPONSOR.address) == SPONSOR_BALANCE
        assert ledger.balance_of(TRAINERS[0].address) == BALANCE
        assert net.store.get(schema.CF_LEDGER, schema.escrow_key(net.task_id)) is None
        before = snapshot(net.store)
        assert net.cancel()["status"] == "Cancelled"  # a repeated cancel is a no-op
        assert snapshot(net.store) == before

    def test_enrollment_shortfall_fails_and_refunds(self, net: Net, checkpoint: tuple[str, str]) -> None:
        net.post(spec_dict(*checkpoint))
        net.elect()
        net.enroll(0)
        assert net.service.next_deadline_ms() == net.service._runs[net.task_id].enrollment_deadline_ms
        net.clock.advance(TIMINGS.enrollment_window_ms + 1)
        events = net.service.tick()
        assert [type(e).__name__ for e in events] == ["RunFailed"]
        assert net.service.get_run(net.task_id)["status"] == "Failed"
        assert net.service.next_deadline_ms() is None
        ledger = check_ledger(net)
        assert ledger.balance_of(SPONSOR.address) == SPONSOR_BALANCE
        assert ledger.balance_of(TRAINERS[0].address) == BALANCE
        before = snapshot(net.store)
        assert net.service.tick() == ()
        assert snapshot(net.store) == before

    def test_failover_after_the_finalize_window(self, net: Net, checkpoint: tuple[str, str]) -> None:
        start(net, checkpoint)
        first = net.syncer()
        for i in (0, 1):
            for f in (0, 1):
                net.submit(i, 0, f)
        run = net.service._runs[net.task_id]
        assert run.current_round is not None and run.current_round.finalize_deadline_ms is not None
        deadline = run.current_round.finalize_deadline_ms
        assert net.service.next_deadline_ms() == deadline
        net.clock.now = deadline  # inclusive: the first syncer is still in time, but does not act
        assert net.service.tick() == ()
        net.clock.now = deadline + 1
        events = net.service.tick()
        assert [type(e) for e in events] == [SyncerFailover]
        second = net.syncer()
        assert second != first and net.service.get_run(net.task_id)["syncer_rank"] == 2
        before = snapshot(net.store)
        with pytest.raises(NotSyncer):
            net.finalize(0, signer=first)
        assert snapshot(net.store) == before
        result = net.finalize(0, signer=second)
        assert result["syncer"] == second.text and result["syncer_rank"] == 2

    def test_failover_applies_inside_a_call_without_a_tick(self, net: Net, checkpoint: tuple[str, str]) -> None:
        start(net, checkpoint)
        first = net.syncer()
        for i in (0, 1):
            for f in (0, 1):
                net.submit(i, 0, f)
        run = net.service._runs[net.task_id]
        assert run.current_round is not None and run.current_round.finalize_deadline_ms is not None
        net.clock.now = run.current_round.finalize_deadline_ms + 1
        ranking = net.service.get_run(net.task_id)["election"]["ranking"]
        second = next(s for s in SYNCERS if s.text == ranking[1]["address"])
        result = net.finalize(0, signer=second)
        assert result["syncer_rank"] == 2 and second != first


# --- pauses: time the node could not serve (syncer probe, 2026-11-26) -------------------------------


def test_a_stall_moves_deadlines_instead_of_failing_over_the_syncer(net: Net, checkpoint: tuple[str, str]) -> None:
    """SIGSTOP (or a VM freeze) across the finalize window: the first call after it used to
    fail the elected syncer over, though nobody could call during the stall."""
    events: list[object] = []
    net.service.on_event = events.append
    start(net, checkpoint)
    assert net.service.start_clock() == ()  # a fresh store: nothing was down
    first = net.syncer()
    for i in (0, 1, 2):
        for f in (0, 1):
            net.submit(i, 0, f)
    deadline = net.service._runs[net.task_id].current_round.finalize_deadline_ms
    net.clock.now = deadline + 20_000  # the node served nothing meanwhile
    result = net.finalize(0, signer=first)  # the first call after the stall: the elected syncer's
    assert result["syncer"] == first.text and result["syncer_rank"] == 1
    extended = [e for e in events if isinstance(e, DeadlinesExtended)]
    assert len(extended) == 1 and extended[0].by_ms > 20_000 and not any(isinstance(e, SyncerFailover) for e in events)


def _clocked_at_quorum(checkpoint: tuple[str, str], store: object = None, **clocks: object) -> tuple[NodeService, Net]:
    """A service with its pause detection on (``start_clock``), the given fake clocks, and round
    0 of a run at quorum (trainers 0 and 1 submitted both fragments): the finalize window runs."""
    from storage.memory import MemoryStore
    from tests.node.conftest import FakeClock, make_config

    clock = FakeClock()
    service = NodeService(make_config(None), MemoryStore() if store is None else store, clock=clock, **clocks)
    net = Net(service, clock)
    start(net, checkpoint)
    service.start_clock()
    for i in (0, 1):
        for f in (0, 1):
            net.submit(i, 0, f)
    return service, net


def test_a_busy_node_is_not_a_paused_one(tmp_path: Path, checkpoint: tuple[str, str]) -> None:
    """A gap the process spent computing (a client's huge body to parse, an expensive batch on
    the one service thread) is the node being busy: were it a pause, any client could push
    every run's deadlines back, again and again (review of the pause change)."""
    cpu = [0.0]
    service, net = _clocked_at_quorum(checkpoint, cpu_clock=lambda: cpu[0])
    clock = net.clock
    gap = service._runs[net.task_id].current_round.finalize_deadline_ms + 20_000 - clock.now
    clock.now += gap
    cpu[0] += gap / 1000  # the whole gap on the CPU
    kinds = [type(e).__name__ for e in service.tick()]
    assert kinds[0] == "SyncerFailover" and "DeadlinesExtended" not in kinds
    service.close()


def test_a_wall_clock_step_is_not_a_pause(tmp_path: Path, checkpoint: tuple[str, str]) -> None:
    """Pauses are measured on a clock that counts stopped and suspended time but not steps of the
    wall clock (ops probe: a wall clock set back a day and then corrected moved every deadline a
    day later). The correction of a set-back moves nothing; a real stop (both clocks advance)
    still does, and so does a forward step past the highest offset seen (a VM frozen with its
    clocks)."""
    elapsed = [10_000]
    service, net = _clocked_at_quorum(checkpoint, cpu_clock=lambda: 0.0, elapsed_clock=lambda: elapsed[0])
    clock = net.clock
    events: list[object] = []
    service.on_event = events.append
    before = service._runs[net.task_id].current_round
    clock.now += 100 - 86_400_000  # 100 ms on, the wall clock is set back a day: nothing
    elapsed[0] += 100
    service.tick()
    clock.now += 86_400_000 + 100  # corrected: a step forward, not a pause
    elapsed[0] += 100
    service.tick()
    assert not any(isinstance(e, DeadlinesExtended) for e in events)
    assert service._runs[net.task_id].current_round.finalize_deadline_ms == before.finalize_deadline_ms
    clock.now += 20_000  # stopped for 20 s: both clocks advance
    elapsed[0] += 20_000
    service.tick()
    (event,) = [e for e in events if isinstance(e, DeadlinesExtended)]
    assert event.by_ms == 20_000
    assert service._runs[net.task_id].current_round.finalize_deadline_ms == before.finalize_deadline_ms + 20_000
    # A VM frozen with its clocks, then stepped forward by NTP: the elapsed clock did not move,
    # and no set-back is being corrected: still a pause (the review's case).
    clock.now += 30_000
    elapsed[0] += 50
    service.tick()
    assert [e.by_ms for e in events if isinstance(e, DeadlinesExtended)] == [20_000, 30_000]
    # Set back 10 s, then within one gap corrected AND stopped for 20 s: only the 20 s count.
    clock.now -= 10_000
    elapsed[0] += 50
    service.tick()
    clock.now += 10_000 + 20_000
    elapsed[0] += 20_000
    service.tick()
    assert [e.by_ms for e in events if isinstance(e, DeadlinesExtended)] == [20_000, 30_000, 20_000]
    # Stopped 20 s while the clock was set back 10 s, corrected later: the stop counts whole,
    # the correction not at all (it had shortened the pause to 10 s: review).
    clock.now += 20_000 - 10_000
    elapsed[0] += 20_000
    service.tick()
    clock.now += 10_000 + 100
    elapsed[0] += 100
    service.tick()
    assert [e.by_ms for e in events if isinstance(e, DeadlinesExtended)] == [20_000, 30_000, 20_000, 20_000]
    service.close()


def test_a_node_started_on_a_clock_still_behind_counts_only_its_downtime(checkpoint: tuple[str, str]) -> None:
    """Started before time sync on a clock a day behind, then stepped right by NTP: the step up
    to the last instant served is a correction; only the real downtime (60 s) is a pause (it was
    the whole day: review; with a dead RTC, decades)."""
    from storage import schema
    from storage.memory import MemoryStore
    from tests.node.conftest import make_config

    store, elapsed = MemoryStore(), [10_000]
    service, net = _clocked_at_quorum(checkpoint, store, cpu_clock=lambda: 0.0, elapsed_clock=lambda: elapsed[0])
    clock = net.clock
    service.close()
    alive = int.from_bytes(store.get(schema.CF_META, schema.NODE_ALIVE_KEY), "big")
    clock.now = alive + 60_000 - 86_400_000  # down 60 s; the clock comes back a day behind
    elapsed[0] = 5_000  # a new boot
    events: list[object] = []
    again = NodeService(make_config(None), store, clock=clock, cpu_clock=lambda: 0.0, elapsed_clock=lambda: elapsed[0])
    again.on_event = events.append
    assert again.start_clock() == ()  # behind the last instant served: nothing can be measured yet
    clock.now += 86_400_000 + 100  # NTP steps it right, 100 ms later
    elapsed[0] += 100
    again.tick()
    assert [e.by_ms for e in events if isinstance(e, DeadlinesExtended)] == [60_100]
    again.close()

def test_without_the_clock_started_a_jump_is_time_passing(net: Net, checkpoint: tuple[str, str]) -> None:
    """Services driven by a hand-set clock (these tests) see no pauses: deadlines fire as set."""
    start(net, checkpoint)
    for i in (0, 1):
        for f in (0, 1):
            net.submit(i, 0, f)
    net.clock.now = net.service._runs[net.task_id].current_round.finalize_deadline_ms + 20_000
    kinds = [type(e).__name__ for e in net.service.tick()]  # every ranked syncer missed its window
    assert kinds[0] == "SyncerFailover" and kinds[-1] == "RunFailed" and "DeadlinesExtended" not in kinds


class Restartable:
    """A node service that a test stops and starts again on the same store, its clock set by the
    test: a restart is the service closed (the RocksDB store closed and reopened) and a new one
    started at ``now``, as ``tenzro node`` does (``start_clock`` first)."""

    def __init__(self, store_kind: str, tmp_path: Path) -> None:
        self._kind, self._path = store_kind, tmp_path / "db"
        self.clock = FakeClock()
        self.store = open_test_store(store_kind, self._path)
        self.config = make_config(tmp_path / "data" if store_kind != "memory" else None)
        self.net = Net(NodeService(self.config, self.store, clock=self.clock), self.clock)

    @property
    def service(self) -> NodeService:
        return self.net.service

    def run(self) -> Any:
        return self.service._runs[self.net.task_id]

    def restart(self, now: int) -> tuple[Any, ...]:
        """Stop, then start again at ``now``; returns ``start_clock``'s events."""
        self.service.close()
        if self._kind != "memory":
            self.store.close()
            self.store = open_test_store(self._kind, self._path)
        self.clock.now = now
        self.net = Net(NodeService(self.config, self.store, clock=self.clock), self.clock)
        return self.service.start_clock()

    def at_quorum(self, checkpoint: tuple[str, str]) -> Party:
        """A run started, the clock turned on, trainers 0 and 1 in for round 0 (quorum: the
        straggler and finalize windows run); returns the elected syncer."""
        start(self.net, checkpoint)
        self.service.start_clock()
        for i in (0, 1):
            for f in (0, 1):
                self.net.submit(i, 0, f)
        return self.net.syncer()

    def close(self) -> None:
        self.service.close()
        self.store.close()


def test_a_payload_whose_file_was_lost_is_stored_again_when_it_arrives_again(
        tmp_path: Path, checkpoint: tuple[str, str]) -> None:
    """A power loss without sync_writes can keep a payload's reference and lose its file
    (docs/storage.md "Large values"): the next copy off the wire repairs it."""
    clock = FakeClock()
    store = open_test_store("rocks-files", tmp_path / "db")
    service = NodeService(make_config(tmp_path / "data"), store, clock=clock)
    try:
        net = Net(service, clock)
        start(net, checkpoint)
        data = net.payload(1, 0, 1)
        digest = service.store_payload(net.task_id, data)
        key = schema.payload_key(net.task_id, digest)
        stored = store._raw_get(schema.CF_SUBMISSIONS, key)  # type: ignore[attr-defined]
        (tmp_path / "db" / "values" / stored[19:35].hex()).unlink()
        assert store.contains(schema.CF_SUBMISSIONS, key) and not store.holds_value(schema.CF_SUBMISSIONS, key)
        assert service.store_payload(net.task_id, data) == digest
        assert store.holds_value(schema.CF_SUBMISSIONS, key) and store.get(schema.CF_SUBMISSIONS, key) == data
    finally:
        service.close()
        store.close()


def test_a_restart_counts_the_time_down_as_a_pause(store_kind: str, tmp_path: Path, checkpoint: tuple[str, str]) -> None:
    node = Restartable(store_kind, tmp_path)
    first = node.at_quorum(checkpoint)
    down_at = node.clock.now
    before = node.run().current_round
    (event,) = node.restart(before.finalize_deadline_ms + 60_000)  # down across the whole window, then back
    assert isinstance(event, DeadlinesExtended) and event.paused_at_ms == down_at
    assert node.run().current_round.finalize_deadline_ms == before.finalize_deadline_ms + event.by_ms
    assert node.service.tick() == ()  # nothing is due: no failover
    node.net.submit(2, 0, 0)
    node.net.submit(2, 0, 1)  # the straggler got its window back too
    assert node.net.finalize(0, signer=first)["syncer_rank"] == 1
    node.close()


def test_a_restart_does_not_reopen_a_straggler_window_the_node_closed(
    store_kind: str, tmp_path: Path, checkpoint: tuple[str, str]
) -> None:
    """Election probe (2026-11-26): a straggler submission refused (LateSubmission) just after
    the straggler deadline was ACCEPTED after a restart (SIGTERM or SIGKILL) within a second:
    the pause was measured from the last ``node.alive_ms`` write (about once a second), before
    the deadline, so the closed window moved later and reopened; the same signed call then
    changed the round's accepted set and payouts, and the syncer's finalize was refused."""
    node = Restartable(store_kind, tmp_path)
    first = node.at_quorum(checkpoint)
    straggler = node.run().current_round.straggler_deadline_ms
    node.clock.now = straggler + 50  # well within a second of the last alive write
    with pytest.raises(LateSubmission):
        node.net.submit(2, 0, 0)
    assert node.service.get_run(node.net.task_id)["accepted_set_closed"] is True
    node.restart(straggler + 60_000)  # down for a minute, then back
    assert node.run().current_round.straggler_deadline_ms == straggler  # it had passed
    with pytest.raises(LateSubmission):
        node.net.submit(2, 0, 0)  # refused before the restart: refused after it
    assert node.service.get_run(node.net.task_id)["submission_counts"] == [2, 2]
    assert node.net.finalize(0, signer=first)["syncer_rank"] == 1
    node.close()


def test_a_restart_does_not_give_a_failed_over_syncer_its_round_back(
    store_kind: str, tmp_path: Path, checkpoint: tuple[str, str]
) -> None:
    """Election probe (2026-11-26): the elected syncer's finalize just after its finalize
    deadline, before a tick committed the failover, is refused (NotSyncer: the call applies the
    due failover); a restart within a second then moved that passed deadline later (the pause
    counted from the last alive write) and the same signed call was accepted at rank 1."""
    node = Restartable(store_kind, tmp_path)
    start(node.net, checkpoint)
    for i in (0, 1, 2):
        for f in (0, 1):
            node.net.submit(i, 0, f)  # the accepted set is closed: the finalize window runs
    first = node.net.syncer()
    deadline = node.run().current_round.finalize_deadline_ms
    node.clock.now = deadline - 300
    node.service.start_clock()  # the last alive write: 300 ms before the deadline
    node.clock.now = deadline + 1
    with pytest.raises(NotSyncer):
        node.net.finalize(0, signer=first)
    events = node.restart(deadline + 60_000)
    # The failover took effect at its deadline, before the pause, once; the next syncer's window
    # then moved later by the pause: the downtime is not charged to it (it was, until process_pause
    # applied the deadlines passed before the pause first: a minute down failed over again).
    assert sum(isinstance(e, SyncerFailover) for e in events) == 1
    with pytest.raises(NotSyncer):
        node.net.finalize(0, signer=first)  # refused before the restart: refused after it
    second = node.net.syncer()
    assert second != first
    assert not any(isinstance(e, SyncerFailover) for e in node.service.tick())
    assert node.net.finalize(0, signer=second)["syncer_rank"] == 2
    node.close()


@pytest.mark.parametrize("call", ["enroll", "cancel"])
def test_a_restart_does_not_reopen_an_enrollment_the_node_found_over(
    store_kind: str, tmp_path: Path, checkpoint: tuple[str, str], call: str
) -> None:
    """The election probe's class of bug, for the other refusals a passed deadline decides: an
    enrollment or a cancellation refused because the enrollment deadline had passed (the call's
    own tick started training) was accepted after a restart within a second, which moved that
    deadline later: a trainer enrolled (stake locked) after being told no, a run the sponsor
    was told had started cancelled and refunded."""
    node = Restartable(store_kind, tmp_path)
    start(node.net, checkpoint, n_trainers=2)  # quorum 2 of 3: training starts at the deadline
    deadline = node.run().enrollment_deadline_ms
    assert deadline is not None
    node.clock.now = deadline - 300
    node.service.start_clock()  # the last alive write: 300 ms before the deadline
    node.clock.now = deadline + 50
    attempt = (lambda: node.net.enroll(2)) if call == "enroll" else (lambda: node.net.cancel())
    with pytest.raises(InvalidState):
        attempt()
    node.restart(deadline + 60_000)  # down for a minute, then back
    assert node.run().status.value == "Training"  # begun at the deadline, before the pause
    with pytest.raises(InvalidState):
        attempt()  # refused before the restart: refused after it
    view = node.service.get_run(node.net.task_id)
    assert view["status"] == "Training" and len(view["trainers"]) == 2
    assert node.service.tick() == ()  # round 0's deadline moved by the pause: nothing is due
    node.close()


def test_a_refusal_resting_on_no_passed_deadline_writes_nothing(
    store_kind: str, tmp_path: Path, checkpoint: tuple[str, str]
) -> None:
    """Review (2026-11-26): the alive instant was written at EVERY refused state-changing call,
    one store batch per call and per ms (an fsync each with ``sync_writes``), and a refusal
    needs no funds: a stranger's cancel or an unfunded key's enrollment is signed for free. Only
    a refusal that may rest on a deadline passed since the last write and not yet committed
    needs the write; the others rest on committed state, which a restart keeps."""
    from tests.node.conftest import FakeClock, make_config, open_test_store

    clock = FakeClock()
    store = open_test_store(store_kind, tmp_path / "db")
    config = make_config(tmp_path / "data" if store_kind != "memory" else None)
    service = NodeService(config, store, clock=clock)
    net = Net(service, clock)
    start(net, checkpoint)  # the third enrollment started Training: committed; the round deadline is 10 s away
    service.start_clock()
    alive_writes = []
    real_write = service._write

    def counting_write(ops):  # type: ignore[no-untyped-def]
        alive_writes.extend(op for op in ops if op[2] == schema.NODE_ALIVE_KEY)
        return real_write(ops)

    service._write = counting_write  # type: ignore[method-assign]
    for _ in range(100):
        clock.advance(1)
        with pytest.raises(NotSponsor):
            net.cancel(signer=STRANGER)
        with pytest.raises(RunFull):
            net.enroll(3)  # an unfunded key would do as well
    assert alive_writes == []
    # A refusal that rests on a deadline this call applied still writes (once per ms).
    clock.now = service._runs[net.task_id].current_round.round_deadline_ms + 1
    with pytest.raises(InvalidState):
        net.cancel()
    assert len(alive_writes) == 1
    service.close()
    store.close()


def test_service_requires_a_node_config(tmp_path: Path) -> None:
    from storage.memory import MemoryStore

    with pytest.raises(TypeError):
        NodeService({}, MemoryStore())  # type: ignore[arg-type]


def test_gossip_ticket_from_an_unregistered_candidate(net: Net, checkpoint: tuple[str, str]) -> None:
    from tenzro_training.election import TicketRejected, make_ticket

    net.post(spec_dict(*checkpoint))
    seed = net.service._runs[net.task_id].election.seed
    before = snapshot(net.store)
    with pytest.raises(TicketRejected):
        net.service.submit_ticket(net.task_id, make_ticket(b"\x05" * 32, STRANGER.address, seed))
    assert snapshot(net.store) == before


def test_a_remote_candidates_gossiped_ticket_is_stored_ranked_and_survives_a_restart(
    tmp_path: Path, checkpoint: tuple[str, str]
) -> None:
    """A registered candidate whose VRF secret this node does not hold tickets over gossip
    (submit_ticket): its ticket is stored with the run, the same ticket again changes nothing, it
    is ranked at the election's close like the node's own, and one after the close is refused."""
    from storage.rocks import RocksStore
    from tenzro_training.election import make_ticket
    from tenzro_training.errors import InvalidState
    from tenzro_training.node.config import SyncerIdentity

    remote = 2  # registered (make_config's candidates) but not one of this node's identities
    local = tuple(SyncerIdentity(address=s.address, vrf_secret=v) for s, v in zip(SYNCERS[:remote], VRF_SECRETS[:remote]))
    clock = FakeClock()
    store = RocksStore(tmp_path / "db")
    service = NodeService(make_config(tmp_path / "data", syncer_identities=local), store, clock=clock)
    net = Net(service, clock)
    net.post(spec_dict(*checkpoint))
    own = {t["address"] for t in service.get_run(net.task_id)["election"]["tickets"]}
    assert own == {s.text for s in SYNCERS[:remote]}  # the node tickets its own identities only
    seed = service._runs[net.task_id].election.seed
    ticket = make_ticket(VRF_SECRETS[remote], SYNCERS[remote].address, seed)
    clock.advance(10)
    service.submit_ticket(net.task_id, ticket)
    tickets = {t["address"]: t for t in service.get_run(net.task_id)["election"]["tickets"]}
    assert set(tickets) == {s.text for s in SYNCERS}
    assert tickets[SYNCERS[remote].text]["stake"] == str(100 + remote)
    assert tickets[SYNCERS[remote].text]["received_at_ms"] == T0 + 10
    before = snapshot(store)
    service.submit_ticket(net.task_id, ticket)  # a gossip relay delivers it again
    assert snapshot(store) == before
    service.close()
    store.close()

    store = RocksStore(tmp_path / "db")  # the ticket was committed, not just held in memory
    service = NodeService(make_config(tmp_path / "data", syncer_identities=local), store, clock=clock)
    net = Net(service, clock)
    net.elect()
    ranking = service.get_run(net.task_id)["election"]["ranking"]
    assert sorted(r["address"] for r in ranking) == sorted(s.text for s in SYNCERS)
    with pytest.raises(InvalidState):
        service.submit_ticket(net.task_id, ticket)
    service.close()
    store.close()


def test_submit_with_payload_from_another_task(net: Net, checkpoint: tuple[str, str]) -> None:
    start(net, checkpoint)
    lay = layouts_for()[0]
    foreign = make_payload("other-task", 0, lay, gradient(0, 0, 0, lay.numel))
    before = snapshot(net.store)
    with pytest.raises(PayloadMetadataMismatch):
        net.submit(0, 0, 0, payload=foreign)
    assert snapshot(net.store) == before


class TestModelReplay:
    """The store holds the model only every ``model_snapshot_rounds`` rounds; the rest is
    replayed from stored payloads and checked against the committed records."""

    ROUNDS = 5

    @staticmethod
    def open(store: Any, clock: FakeClock, **config: Any) -> Net:
        return Net(NodeService(make_config(**config), store, clock=clock), clock)

    @pytest.mark.parametrize(("cache_runs", "snapshot_rounds"), [(0, 1), (0, 2), (0, 8), (2, 2), (2, 8)])
    def test_every_cache_and_snapshot_setting_seals_the_same_model(
        self, checkpoint: tuple[str, str], cache_runs: int, snapshot_rounds: int
    ) -> None:
        from storage.memory import MemoryStore

        spec = spec_dict(*checkpoint, max_rounds=self.ROUNDS)
        net = self.open(MemoryStore(), FakeClock(), model_cache_runs=cache_runs, model_snapshot_rounds=snapshot_rounds)
        start(net, checkpoint, max_rounds=self.ROUNDS)
        for r in range(self.ROUNDS):
            result = play_round(net, r)
            stored = decode_round_count(net.store.get(schema.CF_META, schema.model_snapshot_key(net.task_id)))
            if not result["sealed"]:
                # Written every snapshot_rounds rounds, never otherwise.
                assert stored == (r + 1) // snapshot_rounds * snapshot_rounds
                assert len(net.service._model_cache) == min(cache_runs, 1)
        receipt = TrainingReceipt.from_dict(net.service.get_receipt(net.task_id)["receipt"])
        assert receipt.final_model_hash == compute_model_hash(reference_model(spec, self.ROUNDS))
        net.service.close()

    def test_a_restarted_node_replays_to_the_committed_model(
        self, store_kind: str, tmp_path: Path, checkpoint: tuple[str, str]
    ) -> None:
        """After a restart (nothing cached) getGlobalWeights and the next finalize rebuild the
        model from the snapshot and the stored rounds after it: the same bits as never stopping."""
        spec = spec_dict(*checkpoint, max_rounds=self.ROUNDS)
        clock = FakeClock()
        store = open_test_store(store_kind, tmp_path / "db")
        net = self.open(store, clock, model_snapshot_rounds=2)
        start(net, checkpoint, max_rounds=self.ROUNDS)
        for r in range(3):
            play_round(net, r)
        _, _, before = net.service.get_global_weights(net.task_id)
        net.service.close()
        if store_kind != "memory":
            store.close()
            store = open_test_store(store_kind, tmp_path / "db")
        net = self.open(store, clock, model_snapshot_rounds=2)
        assert not net.service._model_cache
        round_, model_hash, after = net.service.get_global_weights(net.task_id)
        assert round_ == 3 and model_hash == net.service.get_run_state(net.task_id).model_hash
        assert all(torch.equal(a, b) for a, b in zip(before, after))
        # Snapshot of round 2, round 2 replayed; the rebuilt state is cached for the next finalize.
        # The replay computed a round: its scratch (every aggregate plus the step's) is kept.
        sizes = [lay.numel for lay in net.service._model(net.task_id).layouts]
        assert net.service.cache_stats() == {
            "model_cache_runs": 1, "model_cache_bytes": 8 * sum(sizes), "payload_cache_bytes": 0,
            "model_rebuilds": 1, "replayed_rounds": 1,
            "payloads_pruned": 0, "round_buffer_bytes": 4 * (sum(sizes) + max(sizes)),
        }
        for r in range(3, self.ROUNDS):
            play_round(net, r)
        receipt = TrainingReceipt.from_dict(net.service.get_receipt(net.task_id)["receipt"])
        assert receipt.final_model_hash == compute_model_hash(reference_model(spec, self.ROUNDS))
        net.service.close()
        store.close()

    @pytest.mark.parametrize("budget_runs", [0, 2, 3])
    def test_the_cache_holds_the_runs_its_byte_budget_allows_and_never_fewer_than_two(
        self, checkpoint: tuple[str, str], budget_runs: int
    ) -> None:
        """model_cache_bytes bounds the cache, but never below 2 runs (the cache held 2 runs
        whatever their size before the budget; with the budget alone two large runs evicted each
        other and every finalize replayed: review). With 5 runs on a node and 2 cached, nearly
        every finalize had rebuilt its model (multi-run probe)."""
        from storage.memory import MemoryStore

        one_run = 8 * sum(lay.numel for lay in layouts_for())
        net = self.open(MemoryStore(), FakeClock(), model_cache_bytes=budget_runs * one_run)
        runs = ("run-1", "run-2", "run-3")
        for task_id in runs:
            net.task_id = task_id
            start(net, checkpoint, task_id=task_id, max_rounds=self.ROUNDS)
        for task_id in runs:
            net.task_id = task_id
            play_round(net, 0)
        held = list(runs) if budget_runs == 3 else ["run-2", "run-3"]
        assert list(net.service._model_cache) == held
        assert net.service.cache_stats()["model_cache_bytes"] == len(held) * one_run
        rebuilds = net.service.cache_stats()["model_rebuilds"]
        net.task_id = "run-1"
        play_round(net, 1)  # rebuilt only when it was evicted
        assert net.service.cache_stats()["model_rebuilds"] == rebuilds + (budget_runs < 3)
        assert net.service.cache_stats()["model_cache_bytes"] == len(net.service._model_cache) * one_run
        net.service.close()

    @pytest.mark.parametrize("tampered", ["another payload", "not a payload"])
    def test_a_tampered_payload_is_found_not_trusted(self, checkpoint: tuple[str, str], tampered: str) -> None:
        """A stored payload that no longer reproduces its round's committed record, or no longer
        decodes at all, stops the rebuild with StorageError; nothing is stepped or served from it."""
        from storage.memory import MemoryStore

        store = MemoryStore()
        net = self.open(store, FakeClock(), model_cache_runs=0, model_snapshot_rounds=8)
        start(net, checkpoint, max_rounds=self.ROUNDS)
        play_round(net, 0)
        for i in (0, 1, 2):
            for f in range(2):
                net.submit(i, 1, f)
        digest = compute_payload_hash(net.payload(0, 0, 1))
        key = schema.payload_key(net.task_id, digest)
        if tampered == "another payload":
            other = net.payload(0, 0, 1, variant=1)  # a valid payload of the same round, other values
        else:
            other = b"not a payload"
        with store.atomic_batch() as batch:
            batch.put(schema.CF_SUBMISSIONS, key, other)
        before = snapshot(store)
        if tampered == "another payload":
            with pytest.raises(ReplayMismatch, match="round 0 of run-1 .*does not reproduce its committed fragment outcomes") as info:
                net.service.get_global_weights(net.task_id)
            assert (info.value.task_id, info.value.round, info.value.what) == ("run-1", 0, "fragment outcomes")
        else:
            with pytest.raises(StorageError, match="round 0 of run-1 cannot be replayed: "):
                net.service.get_global_weights(net.task_id)
        with pytest.raises(StorageError, match="does not reproduce|cannot be replayed"):
            net.finalize(1)
        assert snapshot(store) == before and net.service.get_run(net.task_id)["round"] == 1

    def test_a_tampered_snapshot_is_found_not_trusted(self, checkpoint: tuple[str, str]) -> None:
        from storage.memory import MemoryStore

        store = MemoryStore()
        net = self.open(store, FakeClock(), model_cache_runs=0, model_snapshot_rounds=1)
        start(net, checkpoint, max_rounds=self.ROUNDS)
        play_round(net, 0)
        key = schema.model_key(net.task_id, schema.MODEL_WEIGHTS, 0)
        raw = bytearray(store.get(schema.CF_MODEL_STATE, key))
        raw[0] ^= 1
        with store.atomic_batch() as batch:
            batch.put(schema.CF_MODEL_STATE, key, bytes(raw))
        with pytest.raises(StorageError, match=r"snapshot of run-1 \(round 1\) does not hash"):
            net.service.get_global_weights(net.task_id)

    def test_a_schema_1_run_gets_its_snapshot_recorded_at_startup(self, checkpoint: tuple[str, str],
                                                                   caplog: pytest.LogCaptureFixture) -> None:
        """Schema 1 stored the current state and no snapshot record; the node records one at its
        current round before it finalizes anything, so later rounds replay from the right base
        (and says so: a migration an operator can find in the log)."""
        from storage.memory import MemoryStore

        spec = spec_dict(*checkpoint, max_rounds=self.ROUNDS)
        store, clock = MemoryStore(), FakeClock()
        net = self.open(store, clock, model_snapshot_rounds=1)  # state written every round, as schema 1 did
        start(net, checkpoint, max_rounds=self.ROUNDS)
        play_round(net, 0)
        play_round(net, 1)
        net.service.close()
        with store.atomic_batch() as batch:
            batch.delete(schema.CF_META, schema.model_snapshot_key(net.task_id))
        with caplog.at_level(logging.INFO, logger="tenzro.node"):
            net = self.open(store, clock, model_cache_runs=0, model_snapshot_rounds=8)
        assert "recording model snapshots of 1 run(s) from a schema-1 store" in [r.getMessage() for r in caplog.records]
        assert decode_round_count(store.get(schema.CF_META, schema.model_snapshot_key(net.task_id))) == 2
        for r in range(2, self.ROUNDS):
            play_round(net, r)
        receipt = TrainingReceipt.from_dict(net.service.get_receipt(net.task_id)["receipt"])
        assert receipt.final_model_hash == compute_model_hash(reference_model(spec, self.ROUNDS))

    def test_an_older_store_gets_its_sealed_records_written_at_startup(self, checkpoint: tuple[str, str],
                                                                       caplog: pytest.LogCaptureFixture) -> None:
        """Schema 3 writes each sealed run's record (run root || receipt digest, TRAINING_VERIFY's
        lookup) in the sealing batch; a store sealed by an older version gets it at startup, and
        the operator's log says so (a one-time rewrite of their store)."""
        from precompile.verify import compute_sealed_receipt
        from storage.memory import MemoryStore
        from tenzro_training.node.persistence import decode_sealed_record

        store, clock = MemoryStore(), FakeClock()
        net = self.open(store, clock)
        start(net, checkpoint, max_rounds=2)
        play_round(net, 0)
        key = schema.sealed_record_key(net.task_id)
        assert store.get(schema.CF_META, key) is None  # not sealed yet
        play_round(net, 1)
        receipt = TrainingReceipt.from_dict(net.service.get_receipt(net.task_id)["receipt"])
        expected = compute_sealed_receipt(receipt)
        assert decode_sealed_record(store.get(schema.CF_META, key)) == (expected.run_root, expected.receipt_digest)
        net.service.close()
        written = store.get(schema.CF_META, key)
        with store.atomic_batch() as batch:  # as an older version left it: no summary either
            batch.delete(schema.CF_META, key)
            batch.delete(schema.CF_META, schema.ended_summary_key(net.task_id))
        with caplog.at_level(logging.INFO, logger="tenzro.node"):
            self.open(store, clock).service.close()
        assert store.get(schema.CF_META, key) == written
        assert "recording the sealed records of 1 run(s) from an older store" in [r.getMessage() for r in caplog.records]

    @pytest.mark.parametrize("budget", [0, 10**9])
    def test_finalize_reads_cached_payloads_not_the_store(
        self, checkpoint: tuple[str, str], monkeypatch: pytest.MonkeyPatch, budget: int
    ) -> None:
        """Accepted payloads (inline and gossip-held) stay in memory until their round is
        finalized, within payload_cache_bytes; the sealed model is the same either way."""
        from storage.memory import MemoryStore

        spec = spec_dict(*checkpoint)
        store = MemoryStore()
        net = self.open(store, FakeClock(), payload_cache_bytes=budget)
        start(net, checkpoint)
        for i in (0, 1, 2):
            for f in range(2):
                if i == 2:
                    net.service.store_payload(net.task_id, net.payload(i, 0, f))
                    net.submit(i, 0, f, hash_only=True)
                else:
                    net.submit(i, 0, f)
        held = net.service._payload_cache.nbytes
        assert held == (sum(len(net.payload(i, 0, f)) for i in (0, 1, 2) for f in range(2)) if budget else 0)
        reads = count_payload_reads(monkeypatch, store)
        net.finalize(0)
        assert len(reads) == (0 if budget else 6)
        assert net.service._payload_cache.nbytes == 0 and not net.service._payload_cache
        monkeypatch.undo()
        play_round(net, 1)
        receipt = TrainingReceipt.from_dict(net.service.get_receipt(net.task_id)["receipt"])
        assert receipt.final_model_hash == compute_model_hash(reference_model(spec, 2))

    @pytest.mark.parametrize("budget", [0, 10**9])
    def test_an_inline_submission_never_reads_the_store_for_its_payload(
        self, checkpoint: tuple[str, str], monkeypatch: pytest.MonkeyPatch, store_kind: str, tmp_path: Path, budget: int
    ) -> None:
        """The payload is in the call: a store read to learn whether the same bytes are stored
        already cost a RocksDB miss per submission (~0.5-0.9 ms with ~1 MiB values, a data block
        each). The bytes are written again instead; the key is their hash, so a copy submitted
        by a second trainer is stored once and the round still finalizes from it."""
        store = open_test_store(store_kind, tmp_path / "db")
        data_dir = tmp_path / "data" if store_kind != "memory" else None
        clock = FakeClock()
        net = Net(NodeService(make_config(data_dir, payload_cache_bytes=budget), store, clock=clock), clock)
        start(net, checkpoint)
        reads = count_payload_reads(monkeypatch, store)
        for f in range(2):
            net.submit(0, 0, f)
            net.submit(1, 0, f, payload=net.payload(0, 0, f))  # a copy of trainer 0's payload
            net.submit(2, 0, f)
        assert reads == []
        monkeypatch.undo()
        assert len(list(store.keys(schema.CF_SUBMISSIONS, schema.payload_prefix(net.task_id)))) == 4
        net.finalize(0)
        assert net.service.get_run(net.task_id)["round"] == 1
        net.service.close()
        store.close()


    def test_finalize_skips_the_input_scan_its_acceptance_did_and_a_replay_does_not(
        self, checkpoint: tuple[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Every accepted payload's values were checked (finite, within max_gradient_abs) when
        it was accepted, so the finalize does not read them all again for NaN/Inf (~48 ms of
        a 12.6M-parameter finalize). A replay of stored payloads scans them, and both reach
        the same model."""
        from storage.memory import MemoryStore
        from tenzro_training import aggregation

        spec = spec_dict(*checkpoint)
        store, clock = MemoryStore(), FakeClock()
        net = self.open(store, clock, model_snapshot_rounds=8)
        start(net, checkpoint, max_rounds=self.ROUNDS)
        scanned: list[int] = []
        real_validate = aggregation._validate_finite

        def counting_validate(rows: Any) -> None:
            scanned.append(len(rows))
            real_validate(rows)

        monkeypatch.setattr(aggregation, "_validate_finite", counting_validate)
        play_round(net, 0)
        play_round(net, 1)
        assert scanned == []
        net.service.close()
        restarted = self.open(store, clock)
        round_, model_hash, _ = restarted.service.get_global_weights(net.task_id)  # nothing cached: a replay
        assert scanned == [3, 3, 3, 3]  # 2 rounds x 2 fragments, 3 inputs each
        assert round_ == 2 and model_hash == compute_model_hash(reference_model(spec, 2))
        restarted.service.close()


class TestPayloadPruning:
    """prune_payloads: the store keeps only the payloads a rebuild from the latest snapshot needs."""

    @staticmethod
    def payload_keys(net: Net) -> list[bytes]:
        return list(net.store.keys(schema.CF_SUBMISSIONS, schema.payload_prefix(net.task_id)))

    @staticmethod
    def pruned(net: Net) -> int | None:
        raw = net.store.get(schema.CF_META, schema.payloads_pruned_key(net.task_id))
        return None if raw is None else decode_round_count(raw)

    def test_payloads_go_with_each_snapshot_and_at_the_end(
        self, store_kind: str, tmp_path: Path, checkpoint: tuple[str, str]
    ) -> None:
        """Snapshots every 2 rounds, no model cache (every finalize rebuilds from the snapshot and
        the kept payloads), a restart in between: the same model as an archive node."""
        rounds = 5
        spec = spec_dict(*checkpoint, max_rounds=rounds)
        clock = FakeClock()
        store = open_test_store(store_kind, tmp_path / "db")
        config = {"prune_payloads": True, "model_snapshot_rounds": 2, "model_cache_runs": 0}
        net = TestModelReplay.open(store, clock, **config)
        start(net, checkpoint, max_rounds=rounds)
        play_round(net, 0)
        assert len(self.payload_keys(net)) == 6 and self.pruned(net) is None
        play_round(net, 1)  # snapshot of round 2: rounds 0 and 1 no longer needed
        assert self.payload_keys(net) == [] and self.pruned(net) == 2
        play_round(net, 2)
        assert len(self.payload_keys(net)) == 6
        net.service.close()
        if store_kind != "memory":
            store.close()
            store = open_test_store(store_kind, tmp_path / "db")
        net = TestModelReplay.open(store, clock, **config)
        for r in (3, 4):
            play_round(net, r)
        assert self.payload_keys(net) == [] and self.pruned(net) == schema.PAYLOADS_PRUNED_ALL
        # The submission records (hashes, signatures) stay: the receipt's attestations need them.
        assert len(list(net.store.keys(schema.CF_SUBMISSIONS, schema.task_prefix(net.task_id)))) == rounds * 6
        receipt = TrainingReceipt.from_dict(net.service.get_receipt(net.task_id)["receipt"])
        assert receipt.final_model_hash == compute_model_hash(reference_model(spec, rounds))
        assert net.service.cache_stats()["replayed_rounds"] == 1  # round 3's finalize replayed round 2
        assert net.service.cache_stats()["payloads_pruned"] == 12 + 6  # since the restart: rounds 2-3, then round 4
        net.service.close()
        store.close()

    def test_a_failed_run_keeps_no_payload(self, checkpoint: tuple[str, str]) -> None:
        from storage.memory import MemoryStore

        net = TestModelReplay.open(MemoryStore(), FakeClock(), prune_payloads=True)
        start(net, checkpoint)
        net.submit(0, 0, 0)
        net.service.store_payload(net.task_id, net.payload(1, 0, 1))  # held from gossip, never submitted
        assert len(self.payload_keys(net)) == 2
        net.clock.advance(TIMINGS.round_timeout_ms + GRACE_MS + 1)
        net.service.tick()
        assert net.service.get_run(net.task_id)["status"] == "Failed"
        assert self.payload_keys(net) == [] and self.pruned(net) == schema.PAYLOADS_PRUNED_ALL
        assert net.service._payload_cache.nbytes == 0 and net.service.cache_stats()["payloads_pruned"] == 2

    def test_an_archive_node_keeps_every_payload(self, checkpoint: tuple[str, str]) -> None:
        from storage.memory import MemoryStore

        net = TestModelReplay.open(MemoryStore(), FakeClock(), model_snapshot_rounds=1)
        start(net, checkpoint)
        play_round(net, 0)
        play_round(net, 1)
        assert len(self.payload_keys(net)) == 12 and self.pruned(net) is None


class TestEndedRuns:
    """An ended run leaves memory once ENDED_RUNS_CACHED more recent ones ended (soak probe:
    every run ever held stayed decoded in memory, ~1.3 KB per committed round), and every answer
    about it stays what it was: it is read back from the store."""

    @staticmethod
    def _answers(service: NodeService, task_id: str) -> dict[str, Any]:
        run = service._lookup(task_id)
        assert run is not None
        clock, now = service._clock, service._clock.now  # type: ignore[attr-defined]
        clock.now = 2_000_000_000_000  # type: ignore[attr-defined]  # the views' clock fields alike
        out: dict[str, Any] = {"run": service.get_run(task_id), "json": service.get_run_json(task_id)}
        clock.now = now  # type: ignore[attr-defined]
        if run.status.value == "Sealed":
            out["receipt"] = service.get_receipt(task_id)
            out["reports"] = [service.get_round_reports(task_id, r) for r in range(len(run.records))]
            out["signatures"] = [service.get_finalize_signature(task_id, r) for r in range(len(run.records))]
            out["model"] = service.export_final_model(task_id)
        return out

    def test_evicted_runs_answer_as_before_and_a_replay_writes_nothing(
        self, net: Net, checkpoint: tuple[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        import tenzro_training.node.service as service_module

        monkeypatch.setattr(service_module, "ENDED_RUNS_CACHED", 1)
        service = net.service
        start(net, checkpoint)
        play_round(net, 0)
        syncer = net.syncer()
        play_round(net, 1)
        sealed = self._answers(service, "run-1")
        assert all(sig is not None for sig in sealed["signatures"])
        assert service.get_run_state("run-1") is not None  # the most recently ended run is cached
        net.task_id = "run-2"
        net.post(spec_dict(*checkpoint, task_id="run-2"))
        net.cancel()
        cancelled = self._answers(service, "run-2")
        net.task_id = "run-3"
        start(net, checkpoint, task_id="run-3")
        listed = service.list_runs(None, 0, 10)

        # run-2 ended last: run-1 is out of memory, run-3 (open) is in the open table.
        assert set(service._runs) == {"run-3"} and list(service._ended_cache) == ["run-2"]
        assert service.get_run_state("run-1") is None and "run-1" not in service._finalize_signatures
        assert [r["status"] for r in listed["runs"]] == ["Sealed", "Cancelled", "Training"]
        assert service.list_runs("Sealed", 0, 10)["runs"] == listed["runs"][:1]
        assert service.count_runs_by_status() == {"Sealed": 1, "Cancelled": 1, "Training": 1}

        # Read back from the store: the same answers, and a replay of the sealing finalize or of
        # the post answers as the first call did and writes nothing.
        assert self._answers(service, "run-1") == sealed
        before = snapshot(net.store)
        net.task_id = "run-1"
        replay = service.finalize_round("run-1", 1, syncer.sign(auth.FinalizeRound(task_id="run-1", round=1)))
        assert replay["sealed"] and replay["run_root"] == sealed["receipt"]["run_root"]
        assert net.post(spec_dict(*checkpoint))["status"] == "Sealed"
        assert snapshot(net.store) == before
        assert self._answers(service, "run-2") == cancelled
        assert service.list_runs(None, 0, 10) == listed

        # A restart holds only the open run, and answers the same.
        config, store = service._config, net.store
        service.close()
        if config.data_dir is not None:
            store.close()
            store = open_test_store("rocks", tmp_path / "db")
        again = NodeService(config, store, clock=net.clock)
        try:
            assert set(again._runs) == {"run-3"} and again.list_runs(None, 0, 10) == listed
            assert self._answers(again, "run-1") == sealed and self._answers(again, "run-2") == cancelled
        finally:
            again.close()
            store.close()

    def test_a_start_reads_ended_runs_summaries_not_the_runs(
        self, checkpoint: tuple[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A start decoded every run with all its round records before setting the ended ones
        aside: its time and peak memory grew with every round the node ever held (review). An
        ended run's listRuns entry is now written with it (schema.ended_summary_key) and a start
        reads that alone; a run that ended under a version that wrote none is decoded once and
        gets its summary then."""
        from storage.memory import MemoryStore

        store, clock = MemoryStore(), FakeClock()
        net = Net(NodeService(make_config(None), store, clock=clock), clock)
        start(net, checkpoint)
        play_round(net, 0)
        play_round(net, 1)
        net.task_id = "run-2"
        net.post(spec_dict(*checkpoint, task_id="run-2"))
        net.cancel()
        net.task_id = "run-3"
        net.post(spec_dict(*checkpoint, task_id="run-3"))
        listed = net.service.list_runs(None, 0, 10)
        sealed = self._answers(net.service, "run-1")
        net.service.close()
        decoded: list[str] = []
        real = persistence.decode_run
        monkeypatch.setattr(persistence, "decode_run", lambda raw, records: decoded.append(real(raw, records).task_id)
                            or real(raw, records))

        def restart() -> NodeService:
            decoded.clear()
            return NodeService(make_config(None), store, clock=clock)

        again = restart()
        assert decoded == ["run-3"] and set(again._runs) == {"run-3"} and again.list_runs(None, 0, 10) == listed
        assert self._answers(again, "run-1") == sealed and decoded == ["run-3", "run-1"]  # read back when named
        again.close()
        before = snapshot(store)
        with store.atomic_batch() as batch:  # as a version without summaries left them
            for task_id in ("run-1", "run-2"):
                batch.delete(schema.CF_META, schema.ended_summary_key(task_id))
        upgraded = restart()
        assert decoded == ["run-1", "run-2", "run-3"] and upgraded.list_runs(None, 0, 10) == listed
        upgraded.close()
        assert snapshot(store) == before  # the summaries are back, the same bytes
        restart().close()
        assert decoded == ["run-3"]
        with store.atomic_batch() as batch:
            batch.put(schema.CF_META, schema.ended_summary_key("run-2"), b'{"version":1,"entry":{}}')
        with pytest.raises(StorageError, match="the stored summary of the ended run run-2 is damaged"):
            restart()
        # A summary on an open run would set it aside as ended, its deadlines never ticked (review).
        entry = dict(listed["runs"][1], task_id="run-3")
        with store.atomic_batch() as batch:
            batch.put(schema.CF_META, schema.ended_summary_key("run-2"), persistence.encode_ended_summary(listed["runs"][1]))
            batch.put(schema.CF_META, schema.ended_summary_key("run-3"), persistence.encode_ended_summary(entry))
        with pytest.raises(StorageError, match="the summary of run-3 says Cancelled, its run does not"):
            restart()

    def test_a_damaged_ended_run_refuses_no_start_and_an_unreadable_one_is_named(
        self, checkpoint: tuple[str, str], tmp_path: Path
    ) -> None:
        """docs/node.md "Runs in memory": a damaged ended run no longer refuses a start, a call
        naming it answers StorageError. Soak probe on a real node: with its model file also
        missing, the start rewrote the file from the run, which it read back then, and refused
        to start on the run's StorageError; and an ended run whose value is not JSON refused
        the start with "stored run state is not valid JSON", naming no run."""
        from storage.rocks import RocksStore

        db, data = tmp_path / "db", tmp_path / "data"
        store, clock = RocksStore(db), FakeClock()
        net = Net(NodeService(make_config(data), store, clock=clock), clock)
        start(net, checkpoint)
        play_round(net, 0)
        play_round(net, 1)
        listed = net.service.list_runs(None, 0, 10)
        model_file = net.service.final_model_path("run-1")
        net.service.close()
        with store.atomic_batch() as batch:  # a lost round record
            batch.delete(schema.CF_META, schema.round_record_key("run-1", 1))
        model_file.unlink()
        again = NodeService(make_config(data), store, clock=clock)
        try:
            assert again.list_runs(None, 0, 10) == listed and not model_file.exists()
            with pytest.raises(StorageError, match="names 2 round record"):
                again.get_run("run-1")
        finally:
            again.close()
        with store.atomic_batch() as batch:  # an undecodable value
            batch.put(schema.CF_TRAINING_RUNS, schema.run_key("run-1"), b"{garbage")
        with pytest.raises(StorageError, match="run-1"):
            NodeService(make_config(data), store, clock=clock)
        store.close()


# --- the service's own checks, caches and bookkeeping (fifth mutation campaign) ---------------------


def _memory_net(**config: Any) -> Net:
    from storage.memory import MemoryStore

    clock = FakeClock()
    return Net(NodeService(make_config(None, **config), MemoryStore(), clock=clock), clock)


def count_batches(monkeypatch: pytest.MonkeyPatch, store: KVStore) -> list[int]:
    """One entry per ``store.atomic_batch()`` opened from now on (until ``monkeypatch.undo()``)."""
    opened: list[int] = []
    real = store.atomic_batch

    def counting() -> Any:
        opened.append(1)
        return real()

    monkeypatch.setattr(store, "atomic_batch", counting)
    return opened


class TestServiceBookkeeping:
    def test_a_closed_service_refuses_every_call(self, checkpoint: tuple[str, str]) -> None:
        net = _memory_net()
        start(net, checkpoint)
        net.service.close()
        before = snapshot(net.store)
        for call in (lambda: net.service.get_run(net.task_id), lambda: net.service.tick(),
                     lambda: net.submit(0, 0, 0), lambda: net.post(spec_dict(*checkpoint, task_id="run-2")),
                     lambda: net.service.list_runs(None, 0, 10)):
            with pytest.raises(StorageError, match="closed"):
                call()
        assert snapshot(net.store) == before

    def test_a_clock_before_the_epoch_is_refused(self) -> None:
        from storage.memory import MemoryStore

        with pytest.raises(TypeError, match="non-negative"):
            NodeService(make_config(None), MemoryStore(), clock=lambda: -1).tick()
        assert NodeService(make_config(None), MemoryStore(), clock=lambda: 0).tick() == ()

    def test_a_failing_event_listener_does_not_fail_the_committed_call(self, checkpoint: tuple[str, str]) -> None:
        net = _memory_net()

        def listener(event: RunEvent) -> None:
            raise RuntimeError("a listener's bug")

        net.service.on_event = listener
        assert net.post(spec_dict(*checkpoint))["status"] == "Electing"
        assert net.store.get(schema.CF_TRAINING_RUNS, schema.run_key(net.task_id)) is not None

    def test_a_replayed_call_writes_no_batch(self, checkpoint: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
        """docs/node.md: a replayed call answers like the original and writes nothing (with
        sync_writes every batch is an fsync)."""
        net = _memory_net()
        start(net, checkpoint)
        play_round(net, 0)
        opened = count_batches(monkeypatch, net.store)
        net.enroll(1)  # the same enrollment again
        net.finalize(0)  # the committed round again
        assert opened == []
        monkeypatch.undo()
        net.task_id = "run-2"
        net.post(spec_dict(*checkpoint, task_id="run-2"))
        net.cancel()
        opened = count_batches(monkeypatch, net.store)
        assert net.cancel()["status"] == "Cancelled"  # the same cancel again
        assert opened == []

    def test_an_ended_run_keeps_none_of_an_open_runs_state_and_an_evicted_one_none_of_its_views(
        self, checkpoint: tuple[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Per-run memory is bounded (soak probe): an ended run leaves the open-run tables and the
        model cache at once, and its rendered views once it leaves the cache of ended runs."""
        import tenzro_training.node.service as service_module

        monkeypatch.setattr(service_module, "ENDED_RUNS_CACHED", 1)
        net = _memory_net()
        service = net.service
        net.post(spec_dict(*checkpoint))
        service.get_run_json("run-1")  # layout views, the rendered state and records
        assert "run-1" in list(service._model_cache)  # round 0's model, for the first finalize
        net.cancel()
        assert "run-1" not in service._runs and "run-1" not in service._stored_runs
        assert list(service._model_cache) == [] and service.cache_stats()["model_cache_bytes"] == 0
        assert "run-1" not in service._models  # no round records: nothing needs its layout now
        service.get_run_json("run-1")
        service._model("run-1")  # asked for again (a view, an artifact): read back and held
        assert "run-1" in service._models
        net.task_id = "run-2"
        net.post(spec_dict(*checkpoint, task_id="run-2"))
        net.cancel()  # run-1 leaves the cache of ended runs
        assert list(service._ended_cache) == ["run-2"]
        for table in (service._models, service._layout_views, service._run_json, service._records_json):
            assert "run-1" not in table
        assert json.loads(service.get_run_json("run-1"))["status"] == "Cancelled"  # read back when asked

    def test_the_cache_of_ended_runs_keeps_the_ones_used_last(
        self, checkpoint: tuple[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import tenzro_training.node.service as service_module

        monkeypatch.setattr(service_module, "ENDED_RUNS_CACHED", 2)
        net = _memory_net()
        for task_id in ("run-a", "run-b", "run-c"):
            net.task_id = task_id
            net.post(spec_dict(*checkpoint, task_id=task_id))
        for task_id in ("run-a", "run-b"):
            net.task_id = task_id
            net.cancel()
        net.service.get_run("run-a")  # used again: now the most recent
        net.task_id = "run-c"
        net.cancel()
        assert list(net.service._ended_cache) == ["run-a", "run-c"]

    def test_an_ended_run_missing_from_the_store_is_a_storage_error_naming_it(self, checkpoint: tuple[str, str]) -> None:
        from storage.memory import MemoryStore

        store, clock = MemoryStore(), FakeClock()
        net = Net(NodeService(make_config(None), store, clock=clock), clock)
        net.post(spec_dict(*checkpoint))
        net.cancel()
        net.service.close()
        again = NodeService(make_config(None), store, clock=clock)  # the ended run is not read at start
        with store.atomic_batch() as batch:
            batch.delete(schema.CF_TRAINING_RUNS, schema.run_key("run-1"))
        with pytest.raises(StorageError, match="the ended run run-1 is missing from the store"):
            again.get_run("run-1")
        again.close()

    def test_a_missing_tensor_list_is_a_storage_error_naming_the_run(self, checkpoint: tuple[str, str]) -> None:
        from storage.memory import MemoryStore

        store, clock = MemoryStore(), FakeClock()
        net = Net(NodeService(make_config(None), store, clock=clock), clock)
        net.post(spec_dict(*checkpoint))
        net.service.close()
        with store.atomic_batch() as batch:
            batch.delete(schema.CF_META, schema.tensor_specs_key("run-1"))
        again = NodeService(make_config(None), store, clock=clock)
        with pytest.raises(StorageError, match="the tensor list of run 'run-1' is missing"):
            again.get_run("run-1")
        again.close()

    def test_runs_are_counted_once_while_one_ends(self, checkpoint: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
        """GET /metrics counts from other threads: a scrape while a run moves from the open table
        to the ended one (it is in both for a moment) counts it once, under its new status."""
        net = _memory_net()
        net.post(spec_dict(*checkpoint))
        seen: list[dict[str, int]] = []
        real = net.service._cache_ended

        def scrape_meanwhile(*args: Any) -> None:
            seen.append(net.service.count_runs_by_status())
            real(*args)

        monkeypatch.setattr(net.service, "_cache_ended", scrape_meanwhile)
        net.cancel()
        assert seen == [{"Cancelled": 1}]

    def test_the_first_finalize_of_a_posted_run_steps_its_model_without_a_rebuild(self, checkpoint: tuple[str, str]) -> None:
        """The post keeps its fp32 model in the cache: round 0's finalize does not read the
        snapshot it just wrote back from the store."""
        net = _memory_net()
        start(net, checkpoint)
        play_round(net, 0)
        assert net.service.cache_stats()["model_rebuilds"] == 0

    def test_the_global_weights_are_copies_the_next_finalize_does_not_step(self, checkpoint: tuple[str, str]) -> None:
        """The gossip bridge encodes them on another thread while the next finalize steps the
        cached state in place."""
        net = _memory_net()
        start(net, checkpoint, max_rounds=3)
        play_round(net, 0)
        round_, _, weights = net.service.get_global_weights(net.task_id)
        kept = [w.clone() for w in weights]
        play_round(net, 1)
        assert round_ == 1 and all(torch.equal(w, k) for w, k in zip(weights, kept))
        weights[0].fill_(7.0)  # nor does the caller's use reach the cache
        assert not torch.equal(net.service.get_global_weights(net.task_id)[2][0], weights[0])

    def test_the_final_model_of_an_unsealed_run_is_refused(self, checkpoint: tuple[str, str]) -> None:
        net = _memory_net()
        start(net, checkpoint)
        with pytest.raises(InvalidState):
            net.service.export_final_model(net.task_id)


class TestServiceAnswers:
    def test_a_replayed_post_answers_its_posting_instant(self, checkpoint: tuple[str, str]) -> None:
        net = _memory_net()
        first = net.post(spec_dict(*checkpoint))
        net.elect()
        net.enroll(0)  # the run's state moved on since the post
        again = net.post(spec_dict(*checkpoint))
        assert again["posted_at_ms"] == first["posted_at_ms"] == T0
        assert again["election_deadline_ms"] == first["election_deadline_ms"]
        assert again["status"] == "Enrolling"

    def test_each_enrolled_trainer_is_told_its_shard(self, checkpoint: tuple[str, str]) -> None:
        net = _memory_net()
        net.post(spec_dict(*checkpoint))
        net.elect()
        assert [net.enroll(i)["shard"] for i in range(3)] == [0, 1, 2]

    def test_a_submission_answers_whether_its_round_reached_quorum(self, checkpoint: tuple[str, str]) -> None:
        net = _memory_net()
        start(net, checkpoint)  # quorum 2 of 3, on every fragment
        answers = [net.submit(i, 0, f)["quorum_reached"] for i in (0, 1) for f in range(2)]
        assert answers == [False, False, False, True]
        assert net.submit(2, 0, 0)["quorum_reached"] is True

    def test_the_sealing_finalize_names_no_next_round(self, checkpoint: tuple[str, str]) -> None:
        net = _memory_net()
        start(net, checkpoint)
        assert play_round(net, 0)["next_round"] == 1
        last = play_round(net, 1)
        assert last["sealed"] and last["next_round"] is None

    def test_list_runs_refuses_a_negative_offset_and_an_empty_page(self, checkpoint: tuple[str, str]) -> None:
        from tenzro_training.run import InvalidRunArgument

        net = _memory_net()
        net.post(spec_dict(*checkpoint))
        with pytest.raises(InvalidRunArgument, match="offset"):
            net.service.list_runs(None, -1, 10)
        with pytest.raises(InvalidRunArgument, match="limit"):
            net.service.list_runs(None, 0, 0)
        assert net.service.list_runs(None, 0, 1)["total"] == 1

    def test_round_reports_only_of_finalized_rounds(self, checkpoint: tuple[str, str]) -> None:
        from tenzro_training.run import InvalidRunArgument

        net = _memory_net()
        start(net, checkpoint)
        with pytest.raises(InvalidRunArgument, match="not a finalized round"):
            net.service.get_round_reports(net.task_id, 0)  # the open round
        play_round(net, 0)
        play_round(net, 1)
        assert net.service.get_round_reports(net.task_id, 1)["round"] == 1
        for bad in (2, True, -1):
            with pytest.raises(InvalidRunArgument, match="not a finalized round"):
                net.service.get_round_reports(net.task_id, bad)  # type: ignore[arg-type]

    def test_get_run_json_keeps_the_runs_asked_for_last(self, checkpoint: tuple[str, str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
        import tenzro_training.node.service as service_module

        monkeypatch.setattr(service_module, "RUN_JSON_CACHE_RUNS", 2)
        net = _memory_net()
        net.post(spec_dict(*checkpoint, task_id="run-1", reward_pool="10"))
        net.task_id = "run-2"
        start(net, checkpoint, task_id="run-2", reward_pool="10")
        play_round(net, 0)
        net.post(spec_dict(*checkpoint, task_id="run-3", reward_pool="10"))
        for task_id in ("run-1", "run-2", "run-1"):
            net.service.get_run_json(task_id)
        assert "run-2" in net.service._records_json  # its rendered round record
        net.service.get_run_json("run-3")
        assert list(net.service._run_json) == ["run-1", "run-3"]
        assert "run-2" not in net.service._records_json  # dropped with its state part
        assert json.loads(net.service.get_run_json("run-2")) == net.service.get_run("run-2")

    def test_get_receipt_json_keeps_the_receipts_asked_for_last_within_its_budget(
        self, checkpoint: tuple[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import tenzro_training.node.service as service_module

        net = _memory_net()
        runs = ("run-1", "run-2", "run-3")
        for task_id in runs:
            net.task_id = task_id
            start(net, checkpoint, task_id=task_id, max_rounds=1)
            play_round(net, 0)
        sizes = {t: len(serialize(net.service.get_receipt(t))) for t in runs}
        monkeypatch.setattr(service_module, "RECEIPT_JSON_CACHE_BYTES", sizes["run-1"] + sizes["run-3"])
        for task_id in ("run-1", "run-2", "run-1", "run-3"):
            assert json.loads(net.service.get_receipt_json(task_id)) == json.loads(serialize(net.service.get_receipt(task_id)))
        assert list(net.service._receipt_json) == ["run-1", "run-3"]
        assert net.service._receipt_json_bytes == sizes["run-1"] + sizes["run-3"]
        # One receipt above the whole budget is still answered, and kept alone.
        monkeypatch.setattr(service_module, "RECEIPT_JSON_CACHE_BYTES", 1)
        assert json.loads(net.service.get_receipt_json("run-2"))["run_root"].startswith("0x")
        assert list(net.service._receipt_json) == ["run-2"] and net.service._receipt_json_bytes == sizes["run-2"]


def serialize(value: Any) -> bytes:
    from tenzro_training.jsontext import serialize_json

    return serialize_json(value)


class TestServiceTime:
    def test_next_deadline_is_the_earliest_of_every_run(self, checkpoint: tuple[str, str]) -> None:
        net = _memory_net()
        net.post(spec_dict(*checkpoint))
        net.clock.advance(50)
        net.post(spec_dict(*checkpoint, task_id="run-2"))
        assert net.service.next_deadline_ms() == T0 + TIMINGS.election_window_ms

    def test_a_posted_run_opens_its_election_at_the_first_tick(self, checkpoint: tuple[str, str]) -> None:
        """docs/node.md: tick applies a Posted run at once (its deadline is its posting instant)."""
        from tenzro_training.run_events import ElectionOpened

        net = _memory_net(syncer_identities=())  # no own ticket moves it on at the post
        assert net.post(spec_dict(*checkpoint))["status"] == "Posted"
        assert [type(e) for e in net.service.tick()] == [ElectionOpened]
        assert net.service.get_run(net.task_id)["status"] == "Electing"

    def test_identities_configured_during_an_election_ticket_at_the_next_tick(self, checkpoint: tuple[str, str]) -> None:
        """A node restarted with syncer identities while a run's election is open tickets them at
        its next tick, before any deadline is due, and reports the tickets as events."""
        from storage.memory import MemoryStore
        from tenzro_training.run_events import TicketAccepted

        store, clock = MemoryStore(), FakeClock()
        bare = NodeService(make_config(None, syncer_identities=()), store, clock=clock)
        Net(bare, clock).post(spec_dict(*checkpoint))
        bare.tick()
        assert bare.get_run("run-1")["status"] == "Electing" and bare.get_run("run-1")["election"]["tickets"] == []
        bare.close()
        clock.advance(10)  # still within the election window
        service = NodeService(make_config(None), store, clock=clock)
        events = service.tick()
        assert [type(e) for e in events] == [TicketAccepted] * 3
        assert {t["address"] for t in service.get_run("run-1")["election"]["tickets"]} == {s.text for s in SYNCERS}
        service.close()

    def test_an_own_ticket_the_core_refuses_is_logged_once_and_forgotten_with_its_run(
        self, checkpoint: tuple[str, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A refused own ticket is not retried at every tick (the tick runs every 100 ms), and
        what the node remembers of it goes when its run ends; an identity whose candidate has
        no stake is not even tried."""
        import logging

        import tenzro_training.node.service as service_module
        from tenzro_training.errors import ElectionError

        real = service_module.process_ticket

        def refuse_first(run: Any, ledger: Any, candidate: Any, ticket: Any, now: int) -> Any:
            if candidate.address == SYNCERS[0].address:
                raise ElectionError("refused for the test")
            return real(run, ledger, candidate, ticket, now)

        monkeypatch.setattr(service_module, "process_ticket", refuse_first)
        net = _memory_net()
        with caplog.at_level(logging.WARNING, logger="tenzro.node"):
            net.post(spec_dict(*checkpoint))
            net.post(spec_dict(*checkpoint, task_id="run-2"))
            for _ in range(3):
                net.clock.advance(10)
                net.service.tick()
        assert len([r for r in caplog.records if "cannot ticket" in r.getMessage()]) == 2  # once per run
        failed = {("run-1", SYNCERS[0].address), ("run-2", SYNCERS[0].address)}
        assert net.service._ticket_failures == failed
        net.cancel()
        assert net.service._ticket_failures == {("run-2", SYNCERS[0].address)}

        from tenzro_training.records import Candidate

        monkeypatch.undo()
        caplog.clear()
        candidates = make_config().candidates
        unstaked = (*candidates[:2], Candidate(candidates[2].address, candidates[2].vrf_public_key, 0))
        other = _memory_net(candidates=unstaked)
        with caplog.at_level(logging.WARNING, logger="tenzro.node"):
            other.post(spec_dict(*checkpoint))
        assert not [r for r in caplog.records if "cannot ticket" in r.getMessage()]
        assert other.service._ticket_failures == set()
        assert len(other.service.get_run(other.task_id)["election"]["tickets"]) == 2

    def test_tick_goes_on_past_a_run_whose_tick_fails(self, checkpoint: tuple[str, str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
        import tenzro_training.node.service as service_module
        from tenzro_training.run import InvalidRunArgument

        net = _memory_net()
        net.post(spec_dict(*checkpoint, task_id="run-a"))
        net.post(spec_dict(*checkpoint, task_id="run-b"))
        real = service_module.process_tick

        def broken_a(run: Any, ledger: Any, now: int) -> Any:
            if run.task_id == "run-a":
                raise InvalidRunArgument("run-a", "state", "broken for the test")
            return real(run, ledger, now)

        monkeypatch.setattr(service_module, "process_tick", broken_a)
        net.clock.advance(TIMINGS.election_window_ms + 1)
        net.service.tick()
        assert net.service.get_run("run-b")["status"] == "Enrolling"
        assert net.service.get_run("run-a")["status"] == "Electing"

    def test_a_replayed_finalize_commits_the_deadline_it_applies(self, checkpoint: tuple[str, str]) -> None:
        """A replay of a committed round's finalize answers the run's state after the call; a
        deadline that call applied (here round 1's timeout, which fails the run) is committed
        with it, as any call's."""
        net = _memory_net()
        start(net, checkpoint)
        first = play_round(net, 0)
        events: list[RunEvent] = []
        net.service.on_event = events.append
        net.clock.advance(TIMINGS.round_timeout_ms + GRACE_MS + 1)
        again = net.finalize(0)
        assert again["status"] == "Failed" and again["model_hash"] == first["model_hash"]
        assert net.service.get_run(net.task_id)["status"] == "Failed"
        assert [type(e).__name__ for e in events] == ["RunFailed"]
        raw = net.store.get(schema.CF_TRAINING_RUNS, schema.run_key(net.task_id))
        assert raw is not None and json.loads(raw)["status"] == "Failed"

    def test_a_clock_set_back_does_not_reopen_a_closed_accepted_set(self, checkpoint: tuple[str, str]) -> None:
        """The accepted set closes at an instant the run has committed past (here a failover):
        a wall clock set back behind it neither reopens it in the view nor blocks the finalize."""
        net = _memory_net()
        start(net, checkpoint)
        for i in (0, 1):
            for f in (0, 1):
                net.submit(i, 0, f)
        current = net.service._runs[net.task_id].current_round
        straggler = current.straggler_deadline_ms
        net.clock.now = current.finalize_deadline_ms + 1
        assert [type(e) for e in net.service.tick()] == [SyncerFailover]  # committed after the straggler deadline
        net.clock.now = straggler - 1  # the wall clock set back
        assert net.service.get_run(net.task_id)["accepted_set_closed"] is True
        result = net.finalize(0)
        assert result["syncer_rank"] == 2 and [len(f["accepted"]) for f in result["fragments"]] == [2, 2]

    def test_a_ticket_refused_after_its_election_closed_stays_refused_after_a_restart(
        self, checkpoint: tuple[str, str]
    ) -> None:
        """The election probe's class of bug for gossiped tickets: a ticket refused because the
        election deadline had passed (no tick had committed it) was accepted after a restart
        within a second, which moved that deadline later by the downtime."""
        from storage.memory import MemoryStore
        from tenzro_training.election import make_ticket
        from tenzro_training.node.config import SyncerIdentity

        local = tuple(SyncerIdentity(address=s.address, vrf_secret=v) for s, v in zip(SYNCERS[:2], VRF_SECRETS[:2]))
        store, clock = MemoryStore(), FakeClock()
        service = NodeService(make_config(None, syncer_identities=local), store, clock=clock)
        Net(service, clock).post(spec_dict(*checkpoint))
        run = service._runs["run-1"]
        deadline = run.election.deadline_ms
        ticket = make_ticket(VRF_SECRETS[2], SYNCERS[2].address, run.election.seed)
        clock.now = deadline - 300
        service.start_clock()  # the last alive write: 300 ms before the deadline
        clock.now = deadline + 50
        with pytest.raises(InvalidState):
            service.submit_ticket("run-1", ticket)
        service.close()
        clock.now = deadline + 60_000
        again = NodeService(make_config(None, syncer_identities=local), store, clock=clock)
        again.start_clock()
        with pytest.raises(InvalidState):
            again.submit_ticket("run-1", ticket)  # refused before the restart: refused after it
        assert len(again.get_run("run-1")["election"]["tickets"]) == 2
        again.close()

    def test_a_pause_without_a_liveness_stamp_starts_at_the_newest_run_update(self, checkpoint: tuple[str, str]) -> None:
        """A store from before the liveness stamp: the newest run update is the lower bound of
        the instant the node last served, so the pause counts from there."""
        from storage.memory import MemoryStore

        store, clock = MemoryStore(), FakeClock()
        net = Net(NodeService(make_config(None), store, clock=clock), clock)
        net.post(spec_dict(*checkpoint))
        clock.advance(50)
        net.post(spec_dict(*checkpoint, task_id="run-2"))
        net.service.close()
        assert store.get(schema.CF_META, schema.NODE_ALIVE_KEY) is None  # its clock was never started
        clock.now = T0 + 60_000
        again = NodeService(make_config(None), store, clock=clock)
        events = again.start_clock()
        assert [(type(e), e.paused_at_ms, e.by_ms) for e in events] == [(DeadlinesExtended, T0 + 50, 60_000 - 50)] * 2
        again.close()

    def test_a_failed_liveness_write_does_not_fail_the_call(self, checkpoint: tuple[str, str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
        """The periodic alive write is the node's own bookkeeping: when the store refuses it the
        call is served and the health check reports the failure."""
        from storage.memory import MemoryStore

        clock = FakeClock()
        service = NodeService(make_config(None), MemoryStore(), clock=clock, cpu_clock=lambda: clock.now / 1000)
        Net(service, clock).post(spec_dict(*checkpoint))
        service.start_clock()

        def refuse() -> Any:
            raise StorageError("write failed: IO error: No space left on device")

        monkeypatch.setattr(service._store, "atomic_batch", refuse)
        clock.advance(2_000)  # past ALIVE_WRITE_MS: the call writes the alive instant first
        assert service.get_run("run-1")["task_id"] == "run-1"
        assert "No space left" in (service.storage_failure or "")

    def test_refusals_resting_on_a_passed_deadline_write_the_alive_instant_once_per_ms(
        self, checkpoint: tuple[str, str]
    ) -> None:
        from storage.memory import MemoryStore

        clock = FakeClock()
        service = NodeService(make_config(None), MemoryStore(), clock=clock, cpu_clock=lambda: clock.now / 1000)
        net = Net(service, clock)
        start(net, checkpoint)
        service.start_clock()
        writes: list[int] = []
        real_write = service._write

        def counting_write(ops: Any) -> None:
            writes.extend(int.from_bytes(op[3], "big") for op in ops if op[2] == schema.NODE_ALIVE_KEY)
            real_write(ops)

        service._write = counting_write  # type: ignore[method-assign]
        deadline = service._runs[net.task_id].current_round.round_deadline_ms
        clock.now = deadline + 1  # the round timed out; no tick committed it
        with pytest.raises(InvalidState):
            net.cancel()
        clock.now = deadline + 2
        for _ in range(3):
            with pytest.raises(InvalidState):
                net.cancel()
        assert writes == [deadline + 1, deadline + 2]


def _gossip(net: Net, i: int, data: bytes, fragment: Any, signer: Party | None = None) -> bytes:
    """store_payload as the gossip bridge calls it, with trainer i's chunk signature."""
    digest = compute_payload_hash(data)
    round_ = net.service.get_run(net.task_id)["round"]
    msg = auth.SubmitOuterGradient(task_id=net.task_id, round=round_, fragment=int(fragment), payload_hash=digest)
    sig = (signer or TRAINERS[i]).sign(msg)
    return net.service.store_payload(net.task_id, data, signer=(TRAINERS[i].address, fragment, sig))


class TestServicePayloads:
    def test_a_hash_only_submission_of_a_gossiped_payload_reads_no_payload_from_the_store(
        self, checkpoint: tuple[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The gossiped bytes are held in memory from store_payload on; neither the submission
        naming them nor the finalize reads them back."""
        net = _memory_net()
        start(net, checkpoint)
        for i in (0, 1, 2):
            for f in range(2):
                _gossip(net, i, net.payload(i, 0, f), f)
        reads = count_payload_reads(monkeypatch, net.store)
        for i in (0, 1, 2):
            for f in range(2):
                assert net.submit(i, 0, f, hash_only=True)["payload_hash"].startswith("0x")
        net.finalize(0)
        assert reads == []

    def test_an_equivocating_submission_stores_its_evidence_under_its_fragment(self, checkpoint: tuple[str, str]) -> None:
        net = _memory_net()
        start(net, checkpoint)
        net.submit(0, 0, 1)
        with pytest.raises(Equivocation):
            net.submit(0, 0, 1, variant=1)
        culprit = TRAINERS[0].address
        raw = net.store.get(schema.CF_EVIDENCE, schema.evidence_key(net.task_id, 0, 1, culprit))
        assert raw is not None and json.loads(raw)["trainer"] == TRAINERS[0].text
        assert net.store.get(schema.CF_EVIDENCE, schema.evidence_key(net.task_id, 0, 0, culprit)) is None

    def test_a_gossiped_payload_different_from_the_submitted_one_is_equivocation(self, checkpoint: tuple[str, str]) -> None:
        """The trainer's accepted submission is the first signed payload even when its bytes never
        came over gossip (the existing test gossips them first)."""
        net = _memory_net()
        start(net, checkpoint)
        net.submit(2, 0, 1)  # another trainer's submission of the same fragment
        net.submit(1, 0, 1)
        second = net.payload(1, 0, 1, variant=1)
        with pytest.raises(Equivocation):
            _gossip(net, 1, second, 1)
        raw = net.store.get(schema.CF_EVIDENCE, schema.evidence_key(net.task_id, 0, 1, TRAINERS[1].address))
        assert raw is not None
        hashes = [m["typed_data"]["message"]["payloadHash"] for m in json.loads(raw)["messages"]]
        assert hashes == ["0x" + compute_payload_hash(d).hex() for d in (net.payload(1, 0, 1), second)]
        assert [t["slashed"] for t in net.service.get_run(net.task_id)["trainers"]] == [False, True, False]

    def test_a_submission_record_that_differs_from_the_accepted_one_is_a_damaged_store_not_evidence(
        self, checkpoint: tuple[str, str]
    ) -> None:
        net = _memory_net()
        start(net, checkpoint)
        net.submit(1, 0, 1)
        key = schema.submission_key(net.task_id, 0, 1, TRAINERS[1].address)
        record = persistence.decode_submission_record(net.store.get(schema.CF_SUBMISSIONS, key))
        with net.store.atomic_batch() as batch:
            batch.put(schema.CF_SUBMISSIONS, key, persistence.encode_submission_record(
                persistence.SubmissionRecord(b"\x01" * 32, record.signature)))
        before = snapshot(net.store)
        with pytest.raises(StorageError, match="submission record .* is missing or differs"):
            _gossip(net, 1, net.payload(1, 0, 1, variant=1), 1)
        assert snapshot(net.store) == before
        assert [t["slashed"] for t in net.service.get_run(net.task_id)["trainers"]] == [False, False, False]

    def test_a_gossiped_fragment_index_must_be_a_plain_integer(self, checkpoint: tuple[str, str]) -> None:
        from tenzro_training.run import InvalidRunArgument

        net = _memory_net()
        start(net, checkpoint)
        before = snapshot(net.store)
        with pytest.raises(InvalidRunArgument, match="fragment"):
            _gossip(net, 1, net.payload(1, 0, 1), True)
        assert snapshot(net.store) == before and not net.service._gossip_held

    def test_an_oversized_payload_is_refused_before_its_signature_is_checked(self, checkpoint: tuple[str, str]) -> None:
        from tenzro_training.payload import PayloadTooLarge

        data = make_payload("run-1", 0, layouts_for()[0], gradient(0, 0, 0, layouts_for()[0].numel))
        net = _memory_net(max_payload_bytes=len(data) - 1)
        start(net, checkpoint)
        before = snapshot(net.store)
        with pytest.raises(PayloadTooLarge):
            net.service.submit_outer_gradient(net.task_id, 0, 0, data, None, b"\x00" * 65)
        with pytest.raises(PayloadTooLarge):
            net.service.store_payload(net.task_id, data, signer=(TRAINERS[0].address, 0, b"\x00" * 65))
        assert snapshot(net.store) == before

    def test_payloads_accepted_under_a_larger_limit_still_finalize_after_it_was_lowered(
        self, checkpoint: tuple[str, str]
    ) -> None:
        """max_payload_bytes bounds what the node accepts from now on; payloads it accepted and
        committed before a restart with a lower limit are still the round's inputs."""
        from storage.memory import MemoryStore

        spec = spec_dict(*checkpoint)
        store, clock = MemoryStore(), FakeClock()
        net = Net(NodeService(make_config(None), store, clock=clock), clock)
        start(net, checkpoint)
        for i in (0, 1, 2):
            for f in range(2):
                net.submit(i, 0, f)
        net.service.close()
        smallest = min(len(net.payload(i, 0, f)) for i in (0, 1, 2) for f in range(2))
        net = Net(NodeService(make_config(None, max_payload_bytes=smallest - 1), store, clock=clock), clock)
        assert net.finalize(0)["next_round"] == 1
        _, model_hash, _ = net.service.get_global_weights(net.task_id)
        expected = reference_model(spec, 1)
        assert model_hash == compute_model_hash(expected)
        net.service.close()

    def test_a_finalize_of_a_later_round_is_a_round_mismatch_once_the_set_closed(self, checkpoint: tuple[str, str]) -> None:
        net = _memory_net()
        start(net, checkpoint)
        for i in (0, 1, 2):
            for f in range(2):
                net.submit(i, 0, f)  # all M in: the accepted set is closed
        assert net.service.get_run(net.task_id)["accepted_set_closed"] is True
        before = snapshot(net.store)
        with pytest.raises(RoundMismatch):
            net.finalize(1)
        assert snapshot(net.store) == before
        assert net.finalize(0)["round"] == 0
