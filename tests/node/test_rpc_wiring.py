"""The NodeService behind the real JSON-RPC dispatcher: JSON in, JSON out, errors by code."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from rpc.dispatcher import Dispatcher
from rpc.service import TrainingService
from tenzro_training import auth
from tenzro_training.payload import compute_payload_hash
from tenzro_training.spec import TrainingTaskSpec

from tests.node.conftest import DIDS, SPONSOR, STAKE, STRANGER, TRAINERS, Net, initial_state, spec_dict, write_checkpoint
from tests.safetensors_files import relabel_dtype


def call(dispatcher: Dispatcher, method: str, **params: Any) -> dict[str, Any]:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": f"tenzro_training_{method}", "params": params})
    raw = dispatcher.handle(body)
    assert raw is not None
    return json.loads(raw)


def test_service_over_json_rpc(net: Net, checkpoint: tuple[str, str]) -> None:
    assert isinstance(net.service, TrainingService)
    rpc = Dispatcher(net.service)
    spec = spec_dict(*checkpoint)
    task = TrainingTaskSpec.from_dict(spec)
    sig = SPONSOR.sign(auth.PostTask(task_id=task.task_id, spec_hash=task.spec_hash()))
    posted = call(rpc, "postTask", spec=spec, signature="0x" + sig.hex())
    assert posted["result"]["status"] == "Electing"
    wrong = call(rpc, "postTask", spec=spec, signature="0x" + STRANGER.sign(auth.PostTask(task_id=task.task_id, spec_hash=task.spec_hash())).hex())
    assert wrong["error"]["data"]["type"] == "NotSponsor"
    net.elect()
    t = TRAINERS[0]
    msg = auth.EnrollTrainer(task_id=task.task_id, did=DIDS[0], trainer=t.address, stake=STAKE)
    enrolled = call(rpc, "enrollTrainer", task_id=task.task_id, did=DIDS[0], address=t.text, stake=str(STAKE),
                    signature="0x" + t.sign(msg).hex())
    assert enrolled["result"]["shard"] == 0
    for i in (1, 2):
        net.enroll(i)
    data = net.payload(0, 0, 0)
    msg2 = auth.SubmitOuterGradient(task_id=task.task_id, round=0, fragment=0, payload_hash=compute_payload_hash(data))
    submitted = call(rpc, "submitOuterGradient", task_id=task.task_id, round=0, fragment=0,
                     payload=base64.b64encode(data).decode(), signature="0x" + t.sign(msg2).hex())
    assert submitted["result"]["accepted_count"] == 1
    unknown = call(rpc, "getRun", task_id="nope")
    assert unknown["error"]["code"] == 1301
    listed = call(rpc, "listRuns")
    assert listed["result"]["total"] == 1
    view = call(rpc, "getRun", task_id=task.task_id)["result"]
    assert view["submission_counts"] == [1, 0]
    no_receipt = call(rpc, "getReceipt", task_id=task.task_id)
    assert no_receipt["error"]["data"]["type"] == "InvalidState"


def test_too_many_fragments_is_a_public_spec_error(net: Net, checkpoint: tuple[str, str]) -> None:
    """The sponsor learns which field is wrong (it was a private CheckpointError, code 1101 with
    only a fixed message, so the reason reached the node's log and not the client)."""
    rpc = Dispatcher(net.service)
    spec = spec_dict(*checkpoint)
    spec["architecture"]["fragment_count"] = 18  # the test model has 17 elements
    task = TrainingTaskSpec.from_dict(spec)
    sig = SPONSOR.sign(auth.PostTask(task_id=task.task_id, spec_hash=task.spec_hash()))
    error = call(rpc, "postTask", spec=spec, signature="0x" + sig.hex())["error"]
    assert error["code"] == 1100
    assert error["data"]["type"] == "SpecError"
    assert error["data"]["path"] == "architecture.fragment_count"
    assert "exceeds the model's 17 elements" in error["data"]["reason"]
    assert call(rpc, "listRuns")["result"]["total"] == 0


def test_a_checkpoint_torch_cannot_load_is_answered_as_a_checkpoint_error(net: Net, tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A tensor declared F8_E8M0 passes safetensors' reader and makes its torch loader raise a
    bare KeyError. The post was answered -32603 ("internal error") with a traceback logged twice,
    by the preload and by the call: any sponsor could fill the node's log. It is the sponsor's
    file, refused with the checkpoint error's code, and nothing is posted."""
    import safetensors.torch

    uri, _ = write_checkpoint(tmp_path / "bad")
    path = tmp_path / "bad" / "init.safetensors"
    w = next(iter(initial_state()))
    path.write_bytes(relabel_dtype(safetensors.torch.save({w: initial_state()[w].flatten()}), w, "F8_E8M0"))
    spec = spec_dict(uri, "0x" + hashlib.sha256(path.read_bytes()).hexdigest())
    task = TrainingTaskSpec.from_dict(spec)
    sig = SPONSOR.sign(auth.PostTask(task_id=task.task_id, spec_hash=task.spec_hash()))
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tenzro_training_postTask",
                       "params": {"spec": spec, "signature": "0x" + sig.hex()}}).encode()
    rpc = Dispatcher(net.service)
    with caplog.at_level(logging.DEBUG):
        rpc.preload(body)
        error = json.loads(rpc.handle(body) or b"")["error"]
    assert (error["code"], error["data"]["type"]) == (1101, "CheckpointError")
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []
    assert call(rpc, "listRuns")["result"]["total"] == 0


def test_the_dispatchers_preload_reaches_the_node(net: Net, checkpoint: tuple[str, str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """What the server runs on its preloading thread before a postTask: the node reads the
    checkpoint there, and the post itself does not read it again."""
    import tenzro_training.node.service as service_module
    from rpc.service import Preloading

    assert isinstance(net.service, Preloading)
    reads: list[str] = []
    real = service_module.load_init_checkpoint
    monkeypatch.setattr(service_module, "load_init_checkpoint",
                        lambda task, **kw: reads.append(task.task_id) or real(task, **kw))
    rpc = Dispatcher(net.service)
    spec = spec_dict(*checkpoint)
    task = TrainingTaskSpec.from_dict(spec)
    sig = SPONSOR.sign(auth.PostTask(task_id=task.task_id, spec_hash=task.spec_hash()))
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tenzro_training_postTask",
                       "params": {"spec": spec, "signature": "0x" + sig.hex()}}).encode()
    rpc.preload(body)
    assert reads == ["run-1"] and net.service.get_run_state("run-1") is None  # read, nothing posted
    posted = json.loads(rpc.handle(body) or b"")
    assert posted["result"]["status"] == "Electing" and reads == ["run-1"]
    for junk in (b"{", b"[]", body.replace(b'"0x', b'"0xzz', 1), b'{"method":"tenzro_training_postTask"}'):
        rpc.preload(junk)  # never raises; the call itself answers what is wrong
    assert reads == ["run-1"]


def test_a_malformed_checkpoint_uri_is_a_typed_error_not_internal(net: Net, checkpoint: tuple[str, str]) -> None:
    """A signed post whose init_checkpoint URI has an unbalanced IPv6 bracket (the spec's URI
    grammar admits it) was answered -32603 InternalError with a traceback in the node's log:
    urlsplit's ValueError escaped. It is a CheckpointError (1101) and nothing is stored."""
    rpc = Dispatcher(net.service)
    spec = spec_dict("file://[x/init.safetensors", checkpoint[1])
    task = TrainingTaskSpec.from_dict(spec)
    sig = SPONSOR.sign(auth.PostTask(task_id=task.task_id, spec_hash=task.spec_hash()))
    error = call(rpc, "postTask", spec=spec, signature="0x" + sig.hex())["error"]
    assert error == {"code": 1101, "message": "init checkpoint cannot be loaded or does not match its hash",
                     "data": {"type": "CheckpointError"}}
    assert call(rpc, "listRuns")["result"]["total"] == 0
