"""Run artifacts over HTTP against a real NodeService on both stores, through a real aiohttp
server (``start_server(serve_artifacts=True)`` on a free port): what a third party downloads to
recompute a sealed run hashes to what the receipt commits to, and nothing else is given out.

The service is driven from the test thread only between requests (the server calls it on its
own executor while a request runs), so the two never overlap.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch

from rpc.errors import get_codes
from rpc.metrics import Registry
from rpc.server import ServerLimits
from storage import schema
from tenzro_training.fragments import compute_model_hash
from tenzro_training.node.service import NodeService
from tests.node.conftest import TRAINERS, FakeClock, Net, make_config, open_test_store, spec_dict
from tests.node.test_service import play_round, start
from tests.rpc.test_server import LiveServer

CODES = get_codes()
RUNS = "/artifacts/v1/runs/"


def serve(service: NodeService, **options: Any) -> LiveServer:
    options.setdefault("serve_artifacts", True)
    return LiveServer(service, **options)  # type: ignore[arg-type]


def error_of(status: int, headers: dict[str, str], body: bytes, expected_status: int, code: int) -> dict[str, Any]:
    assert status == expected_status, (status, body[:300])
    answer = json.loads(body)
    assert answer["jsonrpc"] == "2.0" and answer["id"] is None
    assert answer["error"]["code"] == code, answer
    assert headers["Content-Type"].startswith("application/json")
    assert headers.get("Cache-Control") == "no-store"  # an open round's 404 must not be cached
    return dict(answer["error"])


def payload_path(task_id: str, round_: int, fragment: int, trainer: str) -> str:
    return f"{RUNS}{task_id}/payloads/{round_}/{fragment}/{trainer}"


def accepted_submissions(net: Net) -> list[tuple[int, int, str, str]]:
    """(round, fragment, trainer, payload hash) of every submission the committed rounds
    aggregated: the receipt's attestations, kept where the round record accepted them."""
    attestations = net.service.get_receipt(net.task_id)["attestations"]
    records = net.service.get_run(net.task_id)["round_records"]
    out = []
    for rnd in attestations["rounds"]:
        fragments = records[rnd["round"]]["fragments"]
        for sub in rnd["submissions"]:
            if sub["trainer"] in fragments[sub["fragment"]]["accepted"]:
                out.append((rnd["round"], sub["fragment"], sub["trainer"], sub["payload_hash"]))
    return out


@pytest.fixture
def sealed(net: Net, checkpoint: tuple[str, str]) -> Net:
    start(net, checkpoint)
    play_round(net, 0)
    assert play_round(net, 1)["sealed"]
    return net


def test_every_accepted_payload_is_served_and_hashes_to_its_attestation(sealed: Net) -> None:
    subs = accepted_submissions(sealed)
    assert len(subs) == 2 * 2 * 3  # rounds x fragments x trainers: none left out
    registry = Registry()
    with serve(sealed.service, metrics=registry) as live:
        for round_, fragment, trainer, payload_hash in subs:
            # Any case of the address names the same payload.
            for text in (trainer, trainer.lower(), "0x" + trainer[2:].upper()):
                status, headers, body = live.request("GET", payload_path(sealed.task_id, round_, fragment, text))
                assert status == 200, body[:300]
                digest = hashlib.sha256(body).hexdigest()
                assert "0x" + digest == payload_hash
                assert headers["X-Tenzro-Payload-Hash"] == payload_hash
                assert headers["ETag"] == f'"{digest}"'
                assert headers["Cache-Control"] == "public, max-age=31536000, immutable"
                assert headers["Content-Type"] == "application/octet-stream"
                key = schema.payload_key(sealed.task_id, bytes.fromhex(digest))
                assert body == sealed.store.get(schema.CF_SUBMISSIONS, key)
    text = registry.render().decode()
    assert 'tenzro_rpc_artifact_requests_total{kind="payload",outcome="served"} 36' in text


def test_the_model_route_serves_the_exported_file(sealed: Net) -> None:
    service = sealed.service
    expected = service.export_final_model(sealed.task_id)
    final_hash = service.get_receipt(sealed.task_id)["receipt"]["final_model_hash"]
    with serve(service) as live:
        status, headers, body = live.request("GET", f"{RUNS}{sealed.task_id}/model")
        assert status == 200
        assert body == expected
        assert "0x" + compute_model_hash(safetensors.torch.load(body)).hex() == final_hash
        assert headers["X-Tenzro-Model-Hash"] == final_hash
        assert headers["ETag"] == f'"{hashlib.sha256(body).hexdigest()}"'
        assert headers["Cache-Control"] == "public, max-age=31536000, immutable"
        if service._config.data_dir is not None:
            # The file on disk was streamed; gone (a write the node retries), the same bytes
            # come from the store.
            path = service._config.data_dir / "models" / f"{sealed.task_id}.safetensors"
            assert path.read_bytes() == body
            path.unlink()
            status, headers2, again = live.request("GET", f"{RUNS}{sealed.task_id}/model")
            assert status == 200 and again == expected and headers2["ETag"] == headers["ETag"]
            assert not path.exists()  # a GET writes nothing
        # HEAD: the same headers, no body.
        status, head, nothing = live.request("HEAD", f"{RUNS}{sealed.task_id}/model")
        assert status == 200 and nothing == b""
        assert head["Content-Length"] == str(len(expected)) and head["ETag"] == headers["ETag"]
        # A cache that holds it revalidates for nothing.
        status, _h, nothing = live.request("GET", f"{RUNS}{sealed.task_id}/model",
                                           headers={"If-None-Match": headers["ETag"]})
        assert status == 304 and nothing == b""


def test_the_checkpoint_route_serves_the_specs_file(net: Net, checkpoint: tuple[str, str]) -> None:
    start(net, checkpoint)
    uri, sha = checkpoint
    path = Path(uri.removeprefix("file://"))
    with serve(net.service) as live:
        for method in ("GET", "HEAD"):
            status, headers, body = live.request(method, f"{RUNS}{net.task_id}/checkpoint")
            assert status == 200
            assert headers["X-Tenzro-Checkpoint-Sha256"] == sha and headers["ETag"] == f'"{sha[2:]}"'
            assert headers["Content-Length"] == str(path.stat().st_size)
            if method == "GET":
                assert "0x" + hashlib.sha256(body).hexdigest() == sha and body == path.read_bytes()
        # Changed on disk: never served under the spec's hash, and nothing says where it is.
        path.write_bytes(path.read_bytes() + b" ")
        status, headers, body = live.request("GET", f"{RUNS}{net.task_id}/checkpoint")
        error = error_of(status, headers, body, 404, CODES["CheckpointError"])
        assert error["data"] == {"type": "CheckpointError"} and str(path.parent).encode() not in body
        path.unlink()
        status, headers, body = live.request("GET", f"{RUNS}{net.task_id}/checkpoint")
        error_of(status, headers, body, 404, CODES["CheckpointError"])
        assert b"/" not in json.loads(body)["error"]["message"].encode()


def test_invalid_a_refused_checkpoint_is_logged_once_per_interval(
    net: Net, checkpoint: tuple[str, str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any client can GET a broken checkpoint in a loop: the node logs one warning per interval
    (saying how many it did not log), not one per request."""
    import rpc.artifacts

    start(net, checkpoint)
    path = Path(checkpoint[0].removeprefix("file://"))
    path.write_bytes(path.read_bytes() + b" ")
    caplog.set_level("WARNING", logger="rpc.artifacts")

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "is not served" in r.getMessage()]

    with serve(net.service) as live:
        for _ in range(3):
            status, headers, body = live.request("GET", f"{RUNS}{net.task_id}/checkpoint")
            error_of(status, headers, body, 404, CODES["CheckpointError"])
        assert len(warnings()) == 1 and "sha256 is now" in warnings()[0]
        assert "more refusals" not in warnings()[0]  # none held back before the first line
        monkeypatch.setattr(rpc.artifacts, "CHECKPOINT_WARNING_INTERVAL_S", 0.0)
        live.request("GET", f"{RUNS}{net.task_id}/checkpoint")
        assert len(warnings()) == 2 and warnings()[1].endswith("(2 more refusals since the last such line)")
        live.request("GET", f"{RUNS}{net.task_id}/checkpoint")  # the count restarts after each line
        assert len(warnings()) == 3 and "more refusals" not in warnings()[2]


def test_invalid_an_open_rounds_payload_is_never_served(net: Net, checkpoint: tuple[str, str]) -> None:
    start(net, checkpoint)
    play_round(net, 0)
    net.submit(0, 1, 0)  # stored and accepted into the open round 1
    trainer = TRAINERS[0].text
    digest = hashlib.sha256(net.payload(0, 1, 0)).digest()
    assert net.store.get(schema.CF_SUBMISSIONS, schema.payload_key(net.task_id, digest)) is not None
    with serve(net.service) as live:
        status, headers, body = live.request("GET", payload_path(net.task_id, 1, 0, trainer))
        error = error_of(status, headers, body, 404, CODES["PayloadUnavailable"])
        assert error["data"]["type"] == "PayloadNotPublic" and digest.hex() not in body.decode()
        # Round 0 is committed: its payloads are public while the run goes on.
        status, _h, body = live.request("GET", payload_path(net.task_id, 0, 0, trainer))
        assert status == 200 and hashlib.sha256(body).digest() == hashlib.sha256(net.payload(0, 0, 0)).digest()
        # A trainer the round did not aggregate, a fragment past the run's.
        for path in (payload_path(net.task_id, 0, 0, TRAINERS[3].text), payload_path(net.task_id, 0, 2, trainer),
                     payload_path(net.task_id, 99, 0, trainer)):
            status, headers, body = live.request("GET", path)
            error = error_of(status, headers, body, 404, CODES["PayloadUnavailable"])
            assert error["data"]["type"] == "PayloadNotPublic"
        # Not sealed: no model yet.
        status, headers, body = live.request("GET", f"{RUNS}{net.task_id}/model")
        error = error_of(status, headers, body, 409, CODES["InvalidState"])
        assert error["data"]["status"] == "Training"


def test_invalid_unknown_task_and_malformed_segments(sealed: Net) -> None:
    trainer = TRAINERS[0].text
    with serve(sealed.service) as live:
        for path in (f"{RUNS}nope/model", f"{RUNS}nope/checkpoint", payload_path("nope", 0, 0, trainer)):
            status, headers, body = live.request("GET", path)
            assert error_of(status, headers, body, 404, CODES["UnknownTask"])["data"]["task_id"] == "nope"
        for rnd, frag, who, field in (("x", "0", trainer, "round"), ("01", "0", trainer, "round"),
                                      ("-1", "0", trainer, "round"), (str(2**64), "0", trainer, "round"),
                                      ("0", str(2**32), trainer, "fragment"), ("0", "1.0", trainer, "fragment"),
                                      ("0", "0", trainer[:-1], "trainer"), ("0", "0", trainer[2:] + "00", "trainer"),
                                      ("0", "0", "0x" + "g" * 40, "trainer")):
            status, headers, body = live.request("GET", f"{RUNS}{sealed.task_id}/payloads/{rnd}/{frag}/{who}")
            error = error_of(status, headers, body, 400, CODES["InvalidRunArgument"])
            assert error["data"]["field"] == field


def test_invalid_dot_task_ids_name_runs_and_traverse_nothing(net: Net, checkpoint: tuple[str, str]) -> None:
    """"." and ".." are valid task ids: they name their runs, raw or percent-encoded, and a
    request for them never reaches another path (the "run-1" run, the server's other routes)."""
    for task_id in (".", ".."):
        net.post(spec_dict(*checkpoint, task_id=task_id))
    expected = Path(checkpoint[0].removeprefix("file://")).read_bytes()
    with serve(net.service) as live:
        for segment in (".", "..", "%2E", "%2e%2E"):
            status, _h, body = live.request("GET", f"{RUNS}{segment}/checkpoint")
            assert status == 200 and body == expected
            status, headers, body = live.request("GET", f"{RUNS}{segment}/model")
            assert error_of(status, headers, body, 409, CODES["InvalidState"])["data"]["task_id"] in (".", "..")
        # No run "run-1" here: its id in a dotted path is not found through "..".
        status, headers, body = live.request("GET", f"{RUNS}../../runs/run-1/model")
        assert status == 404 and json.loads(body)["error"]["code"] == -32600
        # An id outside the grammar ("a/b" once decoded) is no resource: 404 as an unknown path,
        # and the id is not echoed.
        status, _h, body = live.request("GET", f"{RUNS}%2Fetc%2Fpasswd/model")
        assert status == 404 and b"etc" not in body


def test_invalid_switched_off_the_paths_are_unknown(sealed: Net) -> None:
    with serve(sealed.service, serve_artifacts=False) as live:
        for path in (f"{RUNS}{sealed.task_id}/model", f"{RUNS}{sealed.task_id}/checkpoint",
                     payload_path(sealed.task_id, 0, 0, TRAINERS[0].text)):
            status, _h, body = live.request("GET", path)
            error = json.loads(body)["error"]
            assert status == 404 and error["code"] == -32600 and error["data"]["type"] == "HTTPNotFound"


def test_invalid_pruned_payloads_are_gone(store_kind: str, tmp_path: Path, checkpoint: tuple[str, str]) -> None:
    store = open_test_store(store_kind, tmp_path / "db")
    config = make_config(tmp_path / "data" if store_kind != "memory" else None, prune_payloads=True)
    service = NodeService(config, store, clock=FakeClock())
    try:
        net = Net(service, service._clock)  # type: ignore[arg-type]
        start(net, checkpoint)
        play_round(net, 0)
        assert play_round(net, 1)["sealed"]
        with serve(service) as live:
            for round_, fragment, trainer, payload_hash in accepted_submissions(net):
                status, headers, body = live.request("GET", payload_path(net.task_id, round_, fragment, trainer))
                error = error_of(status, headers, body, 410, CODES["PayloadUnavailable"])
                assert error["data"]["type"] == "PayloadPruned" and error["data"]["payload_hash"] == payload_hash
            # The model is still served: it is derived from the final weights, which stay.
            status, _h, body = live.request("GET", f"{RUNS}{net.task_id}/model")
            assert status == 200 and body == service.export_final_model(net.task_id)
    finally:
        service.close()
        store.close()


def test_invalid_an_answer_past_the_byte_budget_is_refused_not_held(sealed: Net) -> None:
    """A payload's size is known once read: one that does not fit the in-flight budget is a
    503 LimitExceeded (nothing held), not an answer taken past the node's memory bound."""
    registry = Registry()
    trainer = TRAINERS[0].text
    with serve(sealed.service, metrics=registry, limits=ServerLimits(max_inflight_bytes=64)) as live:
        status, headers, body = live.request("GET", payload_path(sealed.task_id, 0, 0, trainer))
        error = error_of(status, headers, body, 503, CODES["LimitExceeded"])
        assert error["data"]["limit"] == "inflight_bytes" and headers["Retry-After"] == "1"
        assert 'kind="payload",outcome="busy"} 1' in registry.render().decode()
        assert 'tenzro_rpc_inflight_bytes 0' in registry.render().decode()  # all released


@pytest.fixture
def missing_payload(sealed: Net) -> Iterator[tuple[Net, str]]:
    """A committed round's payload deleted behind the node's back (not pruned): a damaged store."""
    round_, fragment, trainer, payload_hash = accepted_submissions(sealed)[0]
    with sealed.store.atomic_batch() as batch:
        batch.delete(schema.CF_SUBMISSIONS, schema.payload_key(sealed.task_id, bytes.fromhex(payload_hash[2:])))
    yield sealed, payload_path(sealed.task_id, round_, fragment, trainer)


def test_invalid_a_damaged_store_is_a_503_without_its_text(missing_payload: tuple[Net, str]) -> None:
    net, path = missing_payload
    with serve(net.service) as live:
        status, headers, body = live.request("GET", path)
        error = error_of(status, headers, body, 503, CODES["StorageError"])
        assert error == {"code": CODES["StorageError"], "message": "storage error", "data": {"type": "StorageError"}}
    assert os.sep not in error["message"]
