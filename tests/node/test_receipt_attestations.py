"""The node's side of offline verification: finalize signatures persisted in the round's batch and
reloaded on restart; getReceipt's "attestations" pass receipt_check, failover included."""

from __future__ import annotations

from pathlib import Path

from storage import schema
from storage.rocks import RocksStore
from tenzro_training import auth
from tenzro_training.node import persistence
from tenzro_training.node.service import NodeService
from tenzro_training.receipt_check import check_receipt_document
from tests.node.conftest import FakeClock, Net, make_config, snapshot, spec_dict, write_checkpoint


def _start(net: Net, checkpoint: tuple[str, str]) -> None:
    net.post(spec_dict(*checkpoint))
    net.elect()
    for i in range(3):
        net.enroll(i)


def _submit_all(net: Net, round_: int) -> None:
    for i in range(3):
        for f in range(2):
            net.submit(i, round_, f)


def test_finalize_signature_is_written_with_the_round(net: Net, checkpoint: tuple[str, str]) -> None:
    _start(net, checkpoint)
    _submit_all(net, 0)
    syncer = net.syncer()
    signature = syncer.sign(auth.FinalizeRound(task_id=net.task_id, round=0))
    assert net.store.get(schema.CF_META, schema.finalize_signature_key(net.task_id, 0)) is None
    net.service.finalize_round(net.task_id, 0, signature)
    raw = net.store.get(schema.CF_META, schema.finalize_signature_key(net.task_id, 0))
    assert raw is not None
    assert persistence.decode_finalize_record(raw) == persistence.FinalizeRecord(syncer.address, signature)
    assert net.service.get_finalize_signature(net.task_id, 0) == signature
    # An identical replay writes nothing (the stored signature stays the first one).
    before = snapshot(net.store)
    net.service.finalize_round(net.task_id, 0, signature)
    assert snapshot(net.store) == before


def test_failover_run_attestations_pass_every_check(net: Net, checkpoint: tuple[str, str]) -> None:
    _start(net, checkpoint)
    first = net.syncer()
    _submit_all(net, 0)
    run = net.service.get_run_state(net.task_id)
    assert run is not None and run.current_round is not None and run.current_round.finalize_deadline_ms is not None
    net.clock.now = run.current_round.finalize_deadline_ms + 1
    net.service.tick()  # the first syncer missed its deadline: rank 2 takes over
    second = net.syncer()
    assert second != first
    net.finalize(0)
    _submit_all(net, 1)
    net.finalize(1)
    doc = net.service.get_receipt(net.task_id)
    assert [r["syncer_rank"] for r in doc["receipt"]["transcript"]] == [2, 2]
    result = check_receipt_document(doc)
    assert result.ok, result.checks
    assert [r["syncer"] for r in doc["attestations"]["rounds"]] == [second.text, second.text]


def test_finalize_signatures_survive_a_restart(tmp_path: Path) -> None:
    uri, sha = write_checkpoint(tmp_path / "ckpt")
    clock = FakeClock()
    store = RocksStore(tmp_path / "db")
    service = NodeService(make_config(tmp_path / "data"), store, clock=clock)
    net = Net(service, clock)
    _start(net, (uri, sha))
    for r in range(2):
        _submit_all(net, r)
        net.finalize(r)
    before = service.get_receipt(net.task_id)
    signatures = [service.get_finalize_signature(net.task_id, r) for r in range(2)]
    service.close()
    store.close()

    store = RocksStore(tmp_path / "db")
    try:
        restarted = NodeService(make_config(tmp_path / "data"), store, clock=clock)
        assert [restarted.get_finalize_signature(net.task_id, r) for r in range(2)] == signatures
        assert None not in signatures
        after = restarted.get_receipt(net.task_id)
        assert after == before
        assert check_receipt_document(after).ok
    finally:
        store.close()
