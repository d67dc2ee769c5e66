"""``tenzro train verify-run`` and ``export-model`` without ``--data-dir``, against a small aiohttp
server that serves a REAL sealed run (an in-process node over a MemoryStore) per the artifact
routes of docs/cli.md: JSON-RPC getReceipt/getRun on ``POST /``, the payloads, checkpoint and
model on ``GET /artifacts/v1/runs/...``. Faults are switched in per path: an error status with a
JSON-RPC-shaped body (404, 410), garbage, an oversized body, a stall; and a node that is not there."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from storage import schema
from tenzro_training import cli
from tenzro_training.cli import artifacts as cli_artifacts, client as cli_client
from tenzro_training.receipt_check import CHECK_NAMES
from tenzro_training.run_replay import RUN_CHECK_NAMES
from tenzro_training.spec import TrainingTaskSpec
from tests.chain.conftest import SealedRun, run_to_sealed

Fault = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_body(code: int, message: str, kind: str) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message,
                                                                 "data": {"type": kind}}}).encode()


def answer(status: int, body: bytes) -> Fault:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, body=body, content_type="application/json" if status != 200 else
                            "application/octet-stream")
    return handler


class ArtifactNode:
    """The run's node, in a thread: what the node serves per the contract, unless ``faults``
    names the request's path (or ``"*"``)."""

    def __init__(self, run: SealedRun, checkpoint: bytes) -> None:
        self.run = run
        self.checkpoint = checkpoint
        self.faults: dict[str, Fault] = {}
        self.receipt: dict[str, Any] | None = None
        """getReceipt's answer, when not the node's own."""
        self.rpc_errors: dict[str, dict[str, Any]] = {}
        """The JSON-RPC error object answered to a method, instead of its result."""
        self.paths: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/", self._rpc)
        app.router.add_get("/artifacts/v1/runs/{task_id}/{rest:.*}", self._artifact)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _rpc(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["method"] in self.rpc_errors:
            return web.json_response({"jsonrpc": "2.0", "id": body["id"], "error": self.rpc_errors[body["method"]]})
        if body["method"] == "tenzro_training_getReceipt" and self.receipt is not None:
            return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": self.receipt})
        method = {"tenzro_training_getReceipt": self.run.service.get_receipt,
                  "tenzro_training_getRun": self.run.service.get_run}[body["method"]]
        result = json.loads(json.dumps(method(body["params"]["task_id"])))
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": result})

    def payload_hash(self, round_: int, fragment: int, trainer: str) -> bytes | None:
        receipt = self.run.service.get_receipt(self.run.task_id)
        for r in receipt["attestations"]["rounds"]:
            for s in r["submissions"]:
                if (r["round"], s["fragment"], s["trainer"].lower()) == (round_, fragment, trainer.lower()):
                    return bytes.fromhex(s["payload_hash"][2:])
        return None

    async def _artifact(self, request: web.Request) -> web.StreamResponse:
        path = request.raw_path
        self.paths.append(path)
        fault = self.faults.get(path) or self.faults.get("*")
        if fault is not None:
            return await fault(request)
        if request.match_info["task_id"] != self.run.task_id:
            return web.Response(status=404, body=error_body(1301, "unknown task", "UnknownTask"))
        parts = request.match_info["rest"].split("/")
        if parts == ["model"]:
            return web.Response(body=self.run.service.export_final_model(self.run.task_id))
        if parts == ["checkpoint"]:
            return web.Response(body=self.checkpoint)
        if parts[0] == "payloads" and len(parts) == 4:
            digest = self.payload_hash(int(parts[1]), int(parts[2]), parts[3])
            if digest is not None:
                data = self.run.store.get(schema.CF_SUBMISSIONS, schema.payload_key(self.run.task_id, digest))
                assert data is not None
                return web.Response(body=data, headers={"X-Tenzro-Payload-Hash": "0x" + digest.hex()})
        return web.Response(status=404, body=error_body(1312, "payload unavailable", "PayloadUnavailable"))


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> tuple[SealedRun, bytes]:
    run = run_to_sealed(tmp_path_factory.mktemp("run"))
    ref = TrainingTaskSpec.from_dict(run.spec).init_checkpoint()
    assert ref is not None
    return run, Path(ref.uri.removeprefix("file://")).read_bytes()


@pytest.fixture
def node(sealed: tuple[SealedRun, bytes]) -> Iterator[ArtifactNode]:
    server = ArtifactNode(*sealed)
    yield server
    server.close()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def verify(node: ArtifactNode, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, list[str], str]:
    code, out, err = run(capsys, "train", "verify-run", "--task-id", node.run.task_id, "--rpc", node.url, *extra)
    return code, out.splitlines(), err


def statuses(lines: list[str]) -> dict[str, str]:
    return {line.split()[1]: line.split()[0] for line in lines}


def payload_path(node: ArtifactNode, round_: int, fragment: int) -> tuple[str, str]:
    """The path of the first accepted trainer's payload of (round, fragment), and its address."""
    trainer = node.run.receipt.transcript[round_].fragments[fragment].accepted[0]
    return f"/artifacts/v1/runs/{node.run.task_id}/payloads/{round_}/{fragment}/0x{trainer.hex()}", "0x" + trainer.hex()


def test_verify_run_recomputes_a_sealed_run(node: ArtifactNode, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, err = verify(node, capsys)
    assert code == cli.EXIT_OK, err
    assert [line.split()[1] for line in lines] == ["task_id", *CHECK_NAMES, *RUN_CHECK_NAMES]
    assert all(line.startswith("ok    ") for line in lines)
    assert err == ""  # no progress lines when stderr is not a terminal
    prefix = f"/artifacts/v1/runs/{node.run.task_id}/"
    assert node.paths[0] == prefix + "checkpoint" and node.paths[-1] == prefix + "model"
    assert sum("/payloads/" in p for p in node.paths) == 12  # every accepted payload, once


def test_verify_run_json(node: ArtifactNode, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = verify(node, capsys, "--json")
    report = json.loads("\n".join(lines))
    assert code == 0 and report["ok"] is True and report["skipped"] == []
    assert [c["name"] for c in report["checks"]] == ["task_id", *CHECK_NAMES, *RUN_CHECK_NAMES]


def test_invalid_pruned_payload_is_a_failed_check(node: ArtifactNode, capsys: pytest.CaptureFixture[str]) -> None:
    path, trainer = payload_path(node, 1, 1)
    node.faults[path] = answer(410, error_body(1312, "payload unavailable", "PayloadUnavailable"))
    code, lines, err = verify(node, capsys)
    assert code == cli.EXIT_RPC_ERROR
    assert statuses(lines) == {**{n: "ok" for n in ["task_id", *CHECK_NAMES]}, "spec": "ok", "checkpoint": "ok",
                               "initial_model": "ok", "payloads": "FAIL", "rounds": "skip",
                               "final_model_hash": "skip", "model_file": "skip"}
    failed = next(line for line in lines if line.startswith("FAIL"))
    assert f"round 1 fragment 1 trainer {trainer.lower()}" in failed.lower()
    assert ("the node pruned the payload (HTTP 410, error 1312 PayloadUnavailable: payload unavailable): "
            "the run cannot be verified from this node") in failed
    assert err == "tenzro: run verification failed: payloads\n"


def test_a_busy_node_is_asked_again(
    node: ArtifactNode, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 503 (the node's byte budget full, Retry-After) says "later", not "this run is wrong":
    the download is retried; only a node busy past BUSY_RETRIES is a failed check."""
    monkeypatch.setattr(cli_artifacts, "BUSY_RETRY_S", 0.0)
    monkeypatch.setattr(cli_artifacts, "BUSY_RETRIES", 3)
    path, _ = payload_path(node, 1, 0)
    busy = answer(503, error_body(1800, "limit exceeded", "LimitExceeded"))
    left = [2]

    async def busy_twice(request: web.Request) -> web.StreamResponse:
        left[0] -= 1
        if left[0] == 0:
            del node.faults[path]
        return await busy(request)

    node.faults[path] = busy_twice
    code, lines, err = verify(node, capsys)
    assert code == cli.EXIT_OK, lines
    assert node.paths.count(path) == 3  # two 503s, then the payload
    node.paths.clear()
    node.faults[path] = busy
    code, lines, err = verify(node, capsys)
    assert code == cli.EXIT_RPC_ERROR and node.paths.count(path) == 4  # the first ask and 3 retries
    assert "the payload: HTTP 503, error 1800 LimitExceeded" in next(line for line in lines if line.startswith("FAIL"))


@pytest.mark.parametrize("downloads", ["1", "8"])
def test_parallel_downloads_give_the_same_verdict(
    node: ArtifactNode, capsys: pytest.CaptureFixture[str], downloads: str
) -> None:
    code, lines, _ = verify(node, capsys, "--downloads", downloads)
    assert code == cli.EXIT_OK and all(line.startswith("ok    ") for line in lines)
    assert sum("/payloads/" in p for p in node.paths) == 12
    # Two bad payloads: the one first in the record's order is named, however the downloads ran.
    first, _ = payload_path(node, 0, 0)
    later, _ = payload_path(node, 0, 1)
    node.faults[first] = answer(410, error_body(1312, "payload unavailable", "PayloadUnavailable"))
    node.faults[later] = answer(200, b"garbage")
    code, lines, _ = verify(node, capsys, "--downloads", downloads)
    failed = next(line for line in lines if line.startswith("FAIL"))
    assert code == cli.EXIT_RPC_ERROR and "round 0 fragment 0 trainer" in failed and "HTTP 410" in failed


@pytest.mark.parametrize("value", ["0", "33", "x", "+4"])
def test_invalid_downloads_flag(capsys: pytest.CaptureFixture[str], value: str) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "verify-run", "--task-id", "t", "--downloads", value])
    assert exc.value.code == 2 and f"expected a whole number in 1..32, got {value!r}" in capsys.readouterr().err


@pytest.mark.parametrize(("fault", "expected"), [
    (answer(404, error_body(1312, "payload unavailable", "PayloadUnavailable")),
     "the node does not serve the payload (HTTP 404, error 1312 PayloadUnavailable: payload unavailable)"),
    (answer(404, b"<html>not found</html>"), "the node does not serve the payload (HTTP 404)"),
    (answer(200, b"garbage, not a payload"), "the bytes served hash to 0x"),
    (answer(200, b"\0" * (4 << 20)), "the payload: the node sent more than"),
    (answer(500, b"{}"), "the payload: HTTP 500"),
])
def test_invalid_payload_answers(
    node: ArtifactNode, capsys: pytest.CaptureFixture[str], fault: Fault, expected: str
) -> None:
    path, _ = payload_path(node, 0, 0)
    node.faults[path] = fault
    code, lines, _ = verify(node, capsys)
    assert code == cli.EXIT_RPC_ERROR
    failed = [line for line in lines if line.startswith("FAIL")]
    assert len(failed) == 1 and failed[0].split()[1] == "payloads" and expected in failed[0], failed


def test_invalid_oversized_payload_is_not_read_whole(node: ArtifactNode, capsys: pytest.CaptureFixture[str]) -> None:
    """The bound comes from the fragment's layout (a few KiB here): a node streaming 256 MiB is
    cut off after it, not buffered."""
    sent: list[int] = []

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        try:
            for _ in range(4096):
                await response.write(b"\0" * (64 << 10))
                sent.append(1)
        except (ConnectionError, RuntimeError):
            pass
        return response

    path, _ = payload_path(node, 0, 0)
    node.faults[path] = endless
    code, lines, _ = verify(node, capsys)
    assert code == cli.EXIT_RPC_ERROR and "the node sent more than" in next(x for x in lines if x.startswith("FAIL"))
    assert len(sent) < 4096


def test_invalid_wrong_checkpoint_and_a_local_one(
    node: ArtifactNode, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    prefix = f"/artifacts/v1/runs/{node.run.task_id}/"
    node.faults[prefix + "checkpoint"] = answer(200, node.checkpoint + b"\0")
    code, lines, _ = verify(node, capsys)
    assert code == cli.EXIT_RPC_ERROR and statuses(lines)["checkpoint"] == "FAIL"
    assert statuses(lines)["initial_model"] == "skip"
    # --checkpoint FILE: the sponsor's own copy; the node's is not asked for.
    local = tmp_path / "init.safetensors"
    local.write_bytes(node.checkpoint)
    node.paths.clear()
    code, lines, err = verify(node, capsys, "--checkpoint", str(local))
    assert code == cli.EXIT_OK, err
    assert prefix + "checkpoint" not in node.paths
    # An unreadable one is bad local input.
    code, lines, err = verify(node, capsys, "--checkpoint", str(tmp_path / "missing"))
    assert code == cli.EXIT_USAGE and err.startswith(f"tenzro: cannot read checkpoint {tmp_path / 'missing'}")


def test_invalid_tampered_model_file(node: ArtifactNode, capsys: pytest.CaptureFixture[str]) -> None:
    model = bytearray(node.run.service.export_final_model(node.run.task_id))
    model[-1] ^= 1
    node.faults[f"/artifacts/v1/runs/{node.run.task_id}/model"] = answer(200, bytes(model))
    code, lines, err = verify(node, capsys)
    assert code == cli.EXIT_RPC_ERROR and err == "tenzro: run verification failed: model_file\n"
    assert statuses(lines)["final_model_hash"] == "ok" and statuses(lines)["model_file"] == "FAIL"


def test_invalid_unreachable_node_exits_3(node: ArtifactNode, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = run(capsys, "train", "verify-run", "--task-id", "run-1", "--rpc", f"http://127.0.0.1:{port}/")
    assert code == cli.EXIT_UNREACHABLE and out == "" and err.startswith("tenzro: cannot reach node at")


def test_invalid_a_download_that_stalls_exits_3(node: ArtifactNode, capsys: pytest.CaptureFixture[str]) -> None:
    async def stall(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.Response(body=b"late")

    path, _ = payload_path(node, 1, 0)
    node.faults[path] = stall
    code, lines, err = verify(node, capsys, "--timeout", "0.5")
    assert code == cli.EXIT_UNREACHABLE and lines == []
    assert err == f"tenzro: node at {node.url} did not finish its answer within 0.5 s\n"


def test_invalid_refused_get_run_is_a_failed_spec_check(node: ArtifactNode, capsys: pytest.CaptureFixture[str]) -> None:
    """A node that serves the receipt but refuses getRun has said something about the run (it
    will not show what the receipt commits): a failed check, reported with the other checks,
    not a transport failure that prints none of them."""
    node.rpc_errors["tenzro_training_getRun"] = {"code": 1301, "message": "unknown task", "data": {"type": "UnknownTask"}}
    code, lines, err = verify(node, capsys)
    assert code == cli.EXIT_RPC_ERROR and err == "tenzro: run verification failed: spec\n"
    assert statuses(lines)["spec"] == "FAIL" and all(statuses(lines)[n] == "ok" for n in ["task_id", *CHECK_NAMES])
    assert "no getRun answer: error 1301 UnknownTask: unknown task" in next(x for x in lines if x.startswith("FAIL"))


@pytest.mark.parametrize("artifact", ["checkpoint", "payload", "model"])
def test_invalid_redirected_download_exits_3(
    node: ArtifactNode, capsys: pytest.CaptureFixture[str], artifact: str
) -> None:
    """A redirect is not followed (it would send the request elsewhere): it says nothing about
    the run, so verify-run stops with the transport's exit status 3 whichever artifact it
    met, rather than reporting a failed check of a run it could not read."""
    path = payload_path(node, 0, 0)[0] if artifact == "payload" else f"/artifacts/v1/runs/{node.run.task_id}/{artifact}"
    node.faults[path] = answer(302, b"")
    code, lines, err = verify(node, capsys)
    assert code == cli.EXIT_UNREACHABLE and lines == []
    assert err == f"tenzro: node at {node.url} answered HTTP 302 (a redirect, which is not followed: pass the URL it names as --rpc)\n"


def test_fetch_artifact_reads_the_whole_body_up_to_its_bound_and_no_further(node: ArtifactNode) -> None:
    """An artifact (a payload, a checkpoint, the model) is read whole up to the most it can be,
    however much larger than an error's body that is; one byte more is refused rather than cut
    (a cut file would fail its hash check as if the node had served wrong bytes). An error's
    body is read up to its own bound, whatever the artifact's, to say what the node refused."""
    from tenzro_training.errors import ArtifactUnavailable

    body = bytes(range(256)) * 400  # 100 KiB: more than an error body is read
    node.faults["*"] = answer(200, body)
    client = cli_client.RpcClient(node.url)
    assert client.fetch_artifact("artifacts/v1/runs/t/model", len(body)) == body
    with pytest.raises(ArtifactUnavailable) as info:
        client.fetch_artifact("artifacts/v1/runs/t/model", len(body) - 1)
    assert info.value.reason == f"the node sent more than {len(body) - 1} bytes, the most it can be"
    node.faults["*"] = answer(404, error_body(1301, "unknown task", "UnknownTask"))
    with pytest.raises(ArtifactUnavailable) as info:
        client.fetch_artifact("artifacts/v1/runs/t/model", 16)
    assert (info.value.reason, info.value.status) == ("HTTP 404, error 1301 UnknownTask: unknown task", 404)
    # A JSON body that is not an error object adds nothing to the status.
    node.faults["*"] = answer(500, b"{}")
    with pytest.raises(ArtifactUnavailable, match=r"^HTTP 500$"):
        client.fetch_artifact("artifacts/v1/runs/t/model", 16)
    # A data type that is not a name is not shown as the error's name.
    node.faults["*"] = answer(410, error_body(1312, "pruned", 7))  # type: ignore[arg-type]
    with pytest.raises(ArtifactUnavailable, match=r"^HTTP 410, error 1312: pruned$"):
        client.fetch_artifact("artifacts/v1/runs/t/model", 16)


def test_invalid_artifact_whose_last_byte_comes_late_is_still_one_too_many(node: ArtifactNode) -> None:
    """The read stops only past the bound: a node that sends exactly the most an artifact can
    be, then (after a pause) one byte more, sent too much, and a read that stopped at the
    bound would have taken its first bytes for the whole file."""
    from tenzro_training.errors import ArtifactUnavailable

    async def one_byte_late(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = 11
        await response.prepare(request)
        await response.write(b"0123456789")
        await asyncio.sleep(0.2)  # the client has read the first ten bytes by now
        await response.write(b"!")
        return response

    node.faults["*"] = one_byte_late
    with pytest.raises(ArtifactUnavailable, match="the node sent more than 10 bytes"):
        cli_client.RpcClient(node.url).fetch_artifact("artifacts/v1/runs/t/model", 10)


def test_progress_goes_to_a_terminal(
    node: ArtifactNode, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    code, _, err = verify(node, capsys)
    assert code == 0 and err == "tenzro: verify-run: 1/2 rounds replayed\ntenzro: verify-run: 2/2 rounds replayed\n"


def test_artifact_paths_encode_the_task_id() -> None:
    assert cli_artifacts.artifact_path("run-1", "payloads", 0, 1, "0xab") == "artifacts/v1/runs/run-1/payloads/0/1/0xab"
    assert cli_artifacts.artifact_path(".", "model") == "artifacts/v1/runs/%2E/model"
    assert cli_artifacts.artifact_path("..", "model") == "artifacts/v1/runs/%2E%2E/model"
    import urllib.parse

    # Relative to --rpc: the root of a bare node URL, under a proxy's prefix.
    assert urllib.parse.urljoin("http://h:8545", cli_artifacts.artifact_path("..", "model")) == "http://h:8545/artifacts/v1/runs/%2E%2E/model"
    assert urllib.parse.urljoin("http://p/node1/", "artifacts/v1/runs/x/model") == "http://p/node1/artifacts/v1/runs/x/model"


# --- export-model without --data-dir ---------------------------------------------------------------


def test_export_model_from_the_node(node: ArtifactNode, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "final.safetensors"
    code, stdout, err = run(capsys, "train", "export-model", "--task-id", node.run.task_id, "--rpc", node.url,
                            "--out", str(out), "--json")
    assert code == 0, err
    expected = node.run.service.export_final_model(node.run.task_id)
    assert out.read_bytes() == expected
    assert json.loads(stdout) == {"task_id": node.run.task_id, "out": str(out), "bytes": len(expected),
                                  "model_hash": "0x" + node.run.receipt.final_model_hash.hex(), "receipt_checked": True}


@pytest.mark.parametrize("change", ["weights", "garbage", "gone"])
def test_invalid_export_model_of_a_tampered_file_writes_nothing(
    node: ArtifactNode, capsys: pytest.CaptureFixture[str], tmp_path: Path, change: str
) -> None:
    model = bytearray(node.run.service.export_final_model(node.run.task_id))
    model[-1] ^= 1
    node.faults[f"/artifacts/v1/runs/{node.run.task_id}/model"] = {
        "weights": answer(200, bytes(model)),
        "garbage": answer(200, b"not safetensors"),
        "gone": answer(404, error_body(1301, "unknown task", "UnknownTask")),
    }[change]
    out = tmp_path / "final.safetensors"
    out.write_bytes(b"the previous file")
    code, stdout, err = run(capsys, "train", "export-model", "--task-id", node.run.task_id, "--rpc", node.url,
                            "--out", str(out))
    assert code == cli.EXIT_RPC_ERROR and stdout == ""
    assert out.read_bytes() == b"the previous file" and [p.name for p in tmp_path.iterdir()] == ["final.safetensors"]
    assert err.count("\n") == 1 and err.startswith("tenzro: ")
    assert {"weights": "hashes to 0x", "garbage": "is not a readable model",
            "gone": "the node does not serve the final model file (HTTP 404"}[change] in err


def test_invalid_export_model_of_a_redirected_model_exits_3(
    node: ArtifactNode, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A redirected download is the transport's failure (exit 3, try another URL), not a
    verdict that the node's model is wrong (exit 1)."""
    node.faults[f"/artifacts/v1/runs/{node.run.task_id}/model"] = answer(302, b"")
    out = tmp_path / "final.safetensors"
    code, stdout, err = run(capsys, "train", "export-model", "--task-id", node.run.task_id, "--rpc", node.url,
                            "--out", str(out))
    assert code == cli.EXIT_UNREACHABLE and stdout == "" and not out.exists()
    assert err.startswith(f"tenzro: node at {node.url} answered HTTP 302 (a redirect") and err.count("\n") == 1


def test_invalid_export_model_refuses_a_receipt_that_fails(
    node: ArtifactNode, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    receipt = json.loads(json.dumps(node.run.service.get_receipt(node.run.task_id)))
    sig = receipt["attestations"]["rounds"][0]["finalize_signature"]
    receipt["attestations"]["rounds"][0]["finalize_signature"] = sig[:-4] + ("00" if sig[-4:-2] != "00" else "11") + sig[-2:]
    node.receipt = receipt
    out = tmp_path / "final.safetensors"
    code, _, err = run(capsys, "train", "export-model", "--task-id", node.run.task_id, "--rpc", node.url, "--out", str(out))
    assert code == cli.EXIT_RPC_ERROR and not out.exists()
    assert err == (f"tenzro: the node's receipt of {node.run.task_id} fails verification "
                   "(finalize_signatures: see verify-receipt)\n")
    assert node.paths == []  # nothing downloaded


def test_invalid_export_model_of_the_right_weights_in_another_file_writes_nothing(
    node: ArtifactNode, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The weights hash to the receipt's, but the file's labels (which evaluate-model reads back
    to say which run a file is of) are another run's. The sponsor gets the exact file of the
    receipt (the bytes a data dir's export writes) or nothing."""
    import safetensors.torch

    state = safetensors.torch.load(node.run.service.export_final_model(node.run.task_id))
    metadata = {"format": "pt", "tenzro.task_id": "another-run", "tenzro.model_hash": "0x" + "00" * 32,
                "tenzro.run_root": "0x" + "00" * 32}
    node.faults[f"/artifacts/v1/runs/{node.run.task_id}/model"] = answer(200, safetensors.torch.save(state, metadata))
    out = tmp_path / "final.safetensors"
    out.write_bytes(b"the previous file")
    code, stdout, err = run(capsys, "train", "export-model", "--task-id", node.run.task_id, "--rpc", node.url,
                            "--out", str(out))
    assert code == cli.EXIT_RPC_ERROR and stdout == "", err
    assert out.read_bytes() == b"the previous file"
    assert "is not the sealed model's file" in err


@pytest.mark.parametrize(("rpc", "url"), [
    ("http://host:8545", "http://host:8545/artifacts/v1/runs/t/model"),
    ("http://host:8545/", "http://host:8545/artifacts/v1/runs/t/model"),
    ("https://proxy/node1/", "https://proxy/node1/artifacts/v1/runs/t/model"),
    # Without the trailing slash JSON-RPC still goes to /node1: the artifacts must too, not to
    # the proxy's root (another node, or none).
    ("https://proxy/node1", "https://proxy/node1/artifacts/v1/runs/t/model"),
    ("https://provider/v1?key=k", "https://provider/v1/artifacts/v1/runs/t/model?key=k"),
])
def test_artifact_urls_are_under_the_rpc_url(rpc: str, url: str) -> None:
    assert cli_client.compute_artifact_url(rpc, cli_artifacts.artifact_path("t", "model")) == url
