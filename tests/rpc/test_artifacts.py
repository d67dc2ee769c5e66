"""rpc/artifacts.py's pure pieces: path segment parsing, the status table, the digest cache of
served files, and the budget rule for answers read before their size was known. The routes
themselves run against a real node in tests/node/test_artifacts_http.py."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rpc.artifacts import get_artifact_status, parse_index, parse_trainer
from rpc.errors import InternalError, LimitExceeded
from rpc.metrics import Registry
from rpc.server import ServerLimits, _ByteBudget, create_app
from rpc.service import CheckpointArtifact, ModelArtifact, PayloadArtifact
from storage.interface import StorageError
from tenzro_training.errors import CheckpointError, InvalidState, PayloadNotPublic, PayloadPruned, UnknownTask
from tenzro_training.run import InvalidRunArgument
from tests.rpc.conformance import FakeService
from tests.rpc.test_server import LiveServer


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("7", 7), ("18446744073709551615", 2**64 - 1)])
def test_parse_index(text: str, value: int) -> None:
    assert parse_index("t", "round", text, 2**64 - 1) == value


@pytest.mark.parametrize("text", ["", "00", "01", "-1", "+1", "1.0", "1e3", " 1", "\u0661", "18446744073709551616",
                                  "9" * 40])
def test_invalid_parse_index(text: str) -> None:
    with pytest.raises(InvalidRunArgument) as info:
        parse_index("t", "round", text, 2**64 - 1)
    assert info.value.field == "round"


def test_invalid_segments_are_not_echoed() -> None:
    with pytest.raises(InvalidRunArgument) as info:
        parse_index("t", "round", "/etc/passwd", 9)
    assert "etc" not in str(info.value)


def test_parse_trainer_any_case() -> None:
    raw = bytes(range(20))
    assert parse_trainer("t", "0x" + raw.hex()) == raw == parse_trainer("t", "0x" + raw.hex().upper())


@pytest.mark.parametrize("text", ["", "0x", "0x" + "00" * 19, "0x" + "00" * 21, "00" * 20 + "00", "0X" + "00" * 20,
                                  "0x" + "zz" * 20])
def test_invalid_parse_trainer(text: str) -> None:
    with pytest.raises(InvalidRunArgument) as info:
        parse_trainer("t", text)
    assert info.value.field == "trainer"


@pytest.mark.parametrize(("exc", "status", "outcome"), [
    (InvalidRunArgument("t", "round", "x"), 400, "malformed"),
    (UnknownTask("t"), 404, "unknown_task"),
    (InvalidState("t", "Training", "x"), 409, "invalid_state"),
    (PayloadNotPublic("t", 1, 0, "0x00", "x"), 404, "unavailable"),
    (PayloadPruned("t", "0x00", 1), 410, "pruned"),  # before its parent's 404
    (CheckpointError("", "x"), 404, "checkpoint_error"),
    (LimitExceeded("inflight_bytes", "x"), 503, "busy"),
    (StorageError("/var/lib/x"), 503, "failed"),
    (InternalError(), 503, "failed"),
    (RuntimeError("bug"), 503, "failed"),  # never a 500
])
def test_get_artifact_status(exc: BaseException, status: int, outcome: str) -> None:
    assert get_artifact_status(exc) == (status, outcome)


def test_try_take_fits_the_budget_and_the_clients_share() -> None:
    async def main() -> None:
        budget = _ByteBudget(400)  # share 100
        assert await budget.acquire(10, 1, "a") == 10
        assert budget.try_take(90, "a", 10)  # 100: within the share
        budget.release(90, "a")
        assert budget.try_take(300, "a", 10)  # past the share, but alone for its client
        assert await budget.acquire(10, 1, "b") == 10
        assert not budget.try_take(81, "b", 10)  # past the whole budget: refused, nothing held
        assert budget.held == 320
        budget.release(300, "a")
        assert await budget.acquire(10, 1, "a") == 10  # a second request of client "a"
        assert not budget.try_take(81, "a", 10)  # past the share with another request of its own
        assert budget.held == 30
        assert budget.try_take(80, "a", 10)  # up to the share exactly, with it
        assert budget.held == 110

    asyncio.run(main())


def test_invalid_serving_artifacts_of_a_service_that_has_none() -> None:
    with pytest.raises(TypeError):
        create_app(FakeService(), serve_artifacts=True)


class FakeArtifacts(FakeService):
    """The conformance suite's fake service, with one run whose checkpoint is ``path``."""

    def __init__(self, path: Path, sha256: bytes) -> None:
        super().__init__()
        self.checkpoint = CheckpointArtifact(path=path, sha256=sha256, max_bytes=1 << 30)

    def get_payload_artifact(self, task_id: str, round: int, fragment: int, trainer: bytes) -> PayloadArtifact:
        raise UnknownTask(task_id)

    def get_model_artifact(self, task_id: str) -> ModelArtifact:
        raise UnknownTask(task_id)

    def export_final_model(self, task_id: str) -> bytes:
        raise UnknownTask(task_id)

    def get_checkpoint_artifact(self, task_id: str) -> CheckpointArtifact:
        if task_id != "big":
            raise UnknownTask(task_id)
        return self.checkpoint


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_a_client_that_hangs_up_mid_stream_leaves_nothing_held(tmp_path: Path) -> None:
    """A checkpoint far larger than the socket buffers, its client gone after the first bytes:
    the budget room and the file's descriptor are released, and the request is counted."""
    data = os.urandom(64 << 20)
    path = tmp_path / "big.safetensors"
    path.write_bytes(data)
    registry = Registry()
    with LiveServer(FakeArtifacts(path, hashlib.sha256(data).digest()), serve_artifacts=True,  # type: ignore[arg-type]
                    metrics=registry) as live:
        status, _h, body = live.request("GET", "/artifacts/v1/runs/big/checkpoint")
        assert status == 200 and body == data
        before = _open_fds()
        with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
            sock.sendall(b"GET /artifacts/v1/runs/big/checkpoint HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset
        deadline = time.monotonic() + 10
        text = ""
        while time.monotonic() < deadline:
            text = registry.render().decode()
            if 'kind="checkpoint",outcome="aborted"} 1' in text:
                break
            time.sleep(0.05)
        assert 'kind="checkpoint",outcome="aborted"} 1' in text
        assert 'kind="checkpoint",outcome="served"} 1' in text
        assert "tenzro_rpc_inflight_bytes 0" in text
        assert _open_fds() <= before


class BigPayloads(FakeArtifacts):
    """Every payload request of run "big" answers the same ``data`` (counted)."""

    def __init__(self, path: Path, data: bytes) -> None:
        super().__init__(path, hashlib.sha256(b"").digest())
        self.data = data
        self.payload_calls = 0

    def get_payload_artifact(self, task_id: str, round: int, fragment: int, trainer: bytes) -> PayloadArtifact:
        self.payload_calls += 1
        return PayloadArtifact(payload_hash=hashlib.sha256(self.data).digest(), data=self.data)


def _hold_hashing(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Holds the artifact routes' SHA-256 until the returned event is set: a test can then act
    while downloads wait for their hash (what they hold in the byte budget meanwhile)."""
    import rpc.artifacts as artifacts

    gate = threading.Event()
    real = artifacts._sha256

    def held_sha256(data: bytes) -> bytes:
        gate.wait(30)
        return real(data)

    monkeypatch.setattr(artifacts, "_sha256", held_sha256)
    return gate


def test_payloads_read_past_the_budget_are_refused_before_they_are_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A payload is in memory once the service read it: it must count in the byte budget then,
    not after it waited its turn on the two hashing threads (busy with other downloads), or
    many concurrent requests pile up payloads the budget never saw. Hashing is held shut here:
    of 5 concurrent 8 MiB payloads (budget 64 MiB, a client's share 16 MiB: two fit), those past
    the share are answered 503 while the first ones still wait for their hash."""
    import threading

    from rpc.server import ServerLimits

    gate = _hold_hashing(monkeypatch)
    service = BigPayloads(tmp_path / "none", os.urandom(8 << 20))
    path = "/artifacts/v1/runs/big/payloads/0/0/0x" + "11" * 20
    results: list[int] = []
    with LiveServer(service, serve_artifacts=True,  # type: ignore[arg-type]
                    limits=ServerLimits(max_inflight_bytes=64 << 20)) as live:
        def get() -> None:
            status, _h, _b = live.request("GET", path)
            results.append(status)

        threads = [threading.Thread(target=get) for _ in range(5)]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and len(results) < 3:
                time.sleep(0.05)
            time.sleep(0.5)
            answered_while_hashing_held = sorted(results)
            assert service.payload_calls == 5
        finally:
            gate.set()
            for t in threads:
                t.join(30)
    assert len(answered_while_hashing_held) >= 3 and set(answered_while_hashing_held) == {503}
    assert sorted(results) == [200] * (5 - len(answered_while_hashing_held)) + answered_while_hashing_held


# --- one run "r" with every artifact the test sets (mutation campaign 5, part C) -------------------


MODEL_HASH = b"\x07" * 32


class Run(FakeArtifacts):
    """Run "r": its one payload, its model (a file, or built from the "store") and its
    checkpoint, as the test sets them; the calls the routes make are recorded."""

    def __init__(self, tmp_path: Path, payload: bytes = b"payload") -> None:
        ckpt = tmp_path / "init.safetensors"
        ckpt.write_bytes(b"checkpoint")
        super().__init__(ckpt, hashlib.sha256(b"checkpoint").digest())
        self.payload = PayloadArtifact(payload_hash=hashlib.sha256(payload).digest(), data=payload)
        self.payload_calls: list[tuple[int, int, bytes]] = []
        self.model_path: Path | None = None
        self.model_bytes = b"model built from the store"
        self.exports = 0

    def get_payload_artifact(self, task_id: str, round: int, fragment: int, trainer: bytes) -> PayloadArtifact:
        if task_id != "r":
            raise UnknownTask(task_id)
        self.payload_calls.append((round, fragment, trainer))
        return self.payload

    def get_model_artifact(self, task_id: str) -> ModelArtifact:
        if task_id != "r":
            raise UnknownTask(task_id)
        return ModelArtifact(final_model_hash=MODEL_HASH, path=self.model_path)

    def export_final_model(self, task_id: str) -> bytes:
        self.exports += 1
        return self.model_bytes

    def get_checkpoint_artifact(self, task_id: str) -> CheckpointArtifact:
        if task_id != "r":
            raise UnknownTask(task_id)
        return self.checkpoint


PAYLOAD = "/artifacts/v1/runs/r/payloads/0/0/0x" + "11" * 20


def _error(body: bytes) -> dict[str, object]:
    return dict(json.loads(body)["error"])


def _fds_on(path: Path) -> int:
    """Descriptors of this process open on the file ``path`` (its real path)."""
    target, count = str(path.resolve()), 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{name}") == target
        except OSError:
            pass  # closed meanwhile
    return count


def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()


def test_route_segments_at_their_largest_reach_the_service(tmp_path: Path) -> None:
    """A 128-character task id, round 2^64 - 1 and fragment 2^32 - 1 are valid: the service is
    asked; one more character is no route at all."""
    run = Run(tmp_path)
    with LiveServer(run, serve_artifacts=True) as live:  # type: ignore[arg-type]
        status, _h, body = live.request("GET", "/artifacts/v1/runs/" + "a" * 128 + "/checkpoint")
        assert status == 404 and _error(body)["code"] == 1301  # UnknownTask: the service was asked
        status, _h, body = live.request("GET", "/artifacts/v1/runs/" + "a" * 129 + "/checkpoint")
        assert status == 404 and _error(body)["code"] == -32600  # no route
        for round_, fragment in ((2**64 - 1, 2**32 - 1), (2**32, 0)):
            status, _h, body = live.request("GET", f"/artifacts/v1/runs/r/payloads/{round_}/{fragment}/0x" + "11" * 20)
            assert status == 200 and body == b"payload"
    assert run.payload_calls == [(2**64 - 1, 2**32 - 1, b"\x11" * 20), (2**32, 0, b"\x11" * 20)]


def test_if_none_match_in_every_form_a_cache_sends_is_a_304(tmp_path: Path) -> None:
    """RFC 9110 If-None-Match: a list, with or without spaces, weak tags, ``*``. The 304 keeps
    the ETag and Cache-Control (a cache refreshes its entry from them) and is counted."""
    run = Run(tmp_path)
    etag = '"' + hashlib.sha256(b"payload").hexdigest() + '"'
    registry = Registry()
    with LiveServer(run, serve_artifacts=True, metrics=registry) as live:  # type: ignore[arg-type]
        for value in (f'"other", {etag}', f'"other",{etag}', f"W/{etag}", "*"):
            status, headers, body = live.request("GET", PAYLOAD, headers={"If-None-Match": value})
            assert (status, body) == (304, b""), value
            assert headers["ETag"] == etag and headers["Cache-Control"] == "public, max-age=31536000, immutable"
        status, _h, body = live.request("GET", PAYLOAD, headers={"If-None-Match": '"other"'})
        assert status == 200 and body == b"payload"
    text = registry.render().decode()
    assert 'kind="payload",outcome="not_modified"} 4' in text and 'kind="payload",outcome="served"} 1' in text


def test_metric_series_exist_at_zero_before_any_request(tmp_path: Path) -> None:
    registry = Registry()
    with LiveServer(Run(tmp_path), serve_artifacts=True, metrics=registry):  # type: ignore[arg-type]
        text = registry.render().decode()
    for kind in ("payload", "model", "checkpoint"):
        for outcome in ("served", "pruned", "busy", "failed", "aborted"):
            assert f'tenzro_rpc_artifact_requests_total{{kind="{kind}",outcome="{outcome}"}} 0' in text


def test_invalid_a_stored_payload_that_does_not_hash_to_its_key(tmp_path: Path) -> None:
    """A damaged store is a 503 that says nothing of it, never the wrong bytes under the signed
    hash; the room the payload took in the budget is given back."""
    run = Run(tmp_path, payload=b"x" * 1500)
    run.payload = PayloadArtifact(payload_hash=hashlib.sha256(b"other").digest(), data=b"x" * 1500)
    registry = Registry()
    with LiveServer(run, serve_artifacts=True, metrics=registry,  # type: ignore[arg-type]
                    limits=ServerLimits(max_inflight_bytes=8192)) as live:
        status, headers, body = live.request("GET", PAYLOAD)
        assert status == 503 and headers["Retry-After"] == "1"
        assert json.loads(body)["error"] == {"code": 1700, "message": "storage error", "data": {"type": "StorageError"}}
        _wait_for(lambda: "tenzro_rpc_inflight_bytes 0" in registry.render().decode())
    assert 'kind="payload",outcome="failed"} 1' in registry.render().decode()


def test_answers_held_in_memory_count_at_their_size_until_sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request holds its room (an eighth of the budget, at most 1 MiB) from the start; a
    payload or a built model larger than that holds its whole size while it waits for its hash
    and until it is sent; all of it is given back after."""
    import threading

    gate = _hold_hashing(monkeypatch)
    run = Run(tmp_path)
    registry = Registry()

    def held() -> int:
        line = [x for x in registry.render().decode().splitlines() if x.startswith("tenzro_rpc_inflight_bytes ")]
        return int(float(line[0].split()[1]))

    with LiveServer(run, serve_artifacts=True, metrics=registry,  # type: ignore[arg-type]
                    limits=ServerLimits(max_inflight_bytes=8192)) as live:
        for data, path, expected in ((b"p" * 10, PAYLOAD, 1024), (b"p" * 1500, PAYLOAD, 1500),
                                     (b"m" * 1500, "/artifacts/v1/runs/r/model", 1500)):
            run.payload = PayloadArtifact(payload_hash=hashlib.sha256(data).digest(), data=data)
            run.model_bytes = data
            gate.clear()
            got: list[tuple[int, bytes]] = []
            thread = threading.Thread(target=lambda p=path: got.append(live.request("GET", p)[::2]))
            thread.start()
            try:
                _wait_for(lambda e=expected: held() == e)  # the room first, then the excess once read
            finally:
                gate.set()
                thread.join(30)
            assert got == [(200, data)]
            _wait_for(lambda: held() == 0)
    assert run.exports == 1


def test_a_model_file_is_streamed_from_disk_and_a_symlink_in_its_place_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The written model file is sent as is (no rebuild from the store); a symlink where it
    should be is not opened (it could point anywhere): the model is built from the store; a
    file that cannot be hashed is a 503 that leaves no descriptor open."""
    from storage.files import FileDigests, NotReadable

    run = Run(tmp_path)
    model = tmp_path / "model.safetensors"
    model.write_bytes(b"the model file")
    with LiveServer(run, serve_artifacts=True) as live:  # type: ignore[arg-type]
        run.model_path = model
        status, headers, body = live.request("GET", "/artifacts/v1/runs/r/model")
        assert (status, body, run.exports) == (200, b"the model file", 0)
        assert headers["X-Tenzro-Model-Hash"] == "0x" + MODEL_HASH.hex()
        secret = tmp_path / "secret"
        secret.write_bytes(b"not the model")
        link = tmp_path / "link.safetensors"
        link.symlink_to(secret)
        run.model_path = link
        status, _h, body = live.request("GET", "/artifacts/v1/runs/r/model")
        assert (status, body, run.exports) == (200, b"model built from the store", 1)

        def unreadable(self: FileDigests, fd: int, info: os.stat_result, max_bytes: int | None = None) -> bytes:
            raise NotReadable("cannot read: Input/output error")

        run.model_path = model
        monkeypatch.setattr(FileDigests, "digest", unreadable)
        status, _h, body = live.request("GET", "/artifacts/v1/runs/r/model")
        assert status == 503 and _error(body)["data"] == {"type": "InternalError"}
        assert _fds_on(model) == 0


def test_invalid_checkpoints_over_the_limit_or_behind_a_symlink_are_not_served(tmp_path: Path) -> None:
    """The spec's hash is not enough: a checkpoint over max_checkpoint_bytes, or a symlink in its
    place, is refused like a changed one (404, private), and no refusal leaves a descriptor open."""
    import dataclasses

    run = Run(tmp_path)
    good = run.checkpoint
    link = tmp_path / "link.safetensors"
    link.symlink_to(good.path)
    with LiveServer(run, serve_artifacts=True) as live:  # type: ignore[arg-type]
        for refused in (dataclasses.replace(good, max_bytes=len(b"checkpoint") - 1),
                        dataclasses.replace(good, path=link),
                        dataclasses.replace(good, sha256=hashlib.sha256(b"another").digest())):
            run.checkpoint = refused
            status, _h, body = live.request("GET", "/artifacts/v1/runs/r/checkpoint")
            assert status == 404 and json.loads(body)["error"] == {
                "code": 1101, "message": "init checkpoint cannot be loaded or does not match its hash",
                "data": {"type": "CheckpointError"}}
        assert _fds_on(good.path) == 0
        run.checkpoint = dataclasses.replace(good, max_bytes=len(b"checkpoint"))
        status, _h, body = live.request("GET", "/artifacts/v1/runs/r/checkpoint")
        assert (status, body) == (200, b"checkpoint")


def test_answers_a_byte_past_a_write_chunk_are_sent_whole(tmp_path: Path) -> None:
    from rpc.server import _WRITE_CHUNK

    data = os.urandom(_WRITE_CHUNK + 1)
    run = Run(tmp_path, payload=data)
    run.checkpoint.path.write_bytes(data)
    run.checkpoint = CheckpointArtifact(path=run.checkpoint.path, sha256=hashlib.sha256(data).digest(),
                                        max_bytes=1 << 30)
    with LiveServer(run, serve_artifacts=True) as live:  # type: ignore[arg-type]
        for path in (PAYLOAD, "/artifacts/v1/runs/r/checkpoint"):
            status, _h, body = live.request("GET", path)
            assert status == 200 and body == data, path


def _read_all(port: int, path: str) -> tuple[int, str, bytes | BaseException]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        try:
            return response.status, response.getheader("Content-Length", ""), response.read()
        except (http.client.IncompleteRead, ConnectionError) as exc:
            return response.status, response.getheader("Content-Length", ""), exc
    finally:
        conn.close()


def test_a_file_that_changes_size_after_its_hash_is_never_sent_past_its_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint grows after it was checked: exactly the checked length is sent. It shrinks:
    the length announced cannot be met, so the connection is cut (the client sees a short body,
    not a hang) and the request counted aborted."""
    import rpc.artifacts as artifacts
    from rpc.server import _WRITE_CHUNK

    data = os.urandom(2 * _WRITE_CHUNK + 10)
    run = Run(tmp_path)
    path = run.checkpoint.path
    run.checkpoint = CheckpointArtifact(path=path, sha256=hashlib.sha256(data).digest(), max_bytes=1 << 30)
    real = artifacts._open_checkpoint
    change: list[Callable[[], None]] = []

    def open_then_change(*args: object) -> tuple[int, int]:
        opened = real(*args)  # type: ignore[arg-type]
        change.pop()()
        return opened

    monkeypatch.setattr(artifacts, "_open_checkpoint", open_then_change)
    registry = Registry()
    with LiveServer(run, serve_artifacts=True, metrics=registry) as live:  # type: ignore[arg-type]
        path.write_bytes(data)
        change.append(lambda: path.write_bytes(data + b"more"))
        assert _read_all(live.port, "/artifacts/v1/runs/r/checkpoint") == (200, str(len(data)), data)
        path.write_bytes(data)
        change.append(lambda: os.truncate(path, _WRITE_CHUNK))
        status, length, got = _read_all(live.port, "/artifacts/v1/runs/r/checkpoint")
        assert (status, length) == (200, str(len(data))) and isinstance(got, BaseException)
        _wait_for(lambda: 'kind="checkpoint",outcome="aborted"} 1' in registry.render().decode())
    assert 'kind="checkpoint",outcome="served"} 1' in registry.render().decode()


def test_a_request_cancelled_while_its_file_opens_closes_the_descriptor() -> None:
    """A client that hangs up while its file is being opened on the file threads: the open
    cannot be stopped, so the request waits for it and closes what it opened."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from rpc.artifacts import _open_off_loop

    entered, gate = threading.Event(), threading.Event()
    opened: list[int] = []

    def slow_open() -> tuple[int, None]:
        entered.set()
        gate.wait(30)
        opened.append(os.open(os.devnull, os.O_RDONLY))
        return opened[0], None

    async def main() -> None:
        task = asyncio.ensure_future(_open_off_loop(files, slow_open))
        while not entered.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        for _ in range(5):
            await asyncio.sleep(0)
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    with ThreadPoolExecutor(max_workers=1) as files:
        asyncio.run(main())
    with pytest.raises(OSError):
        os.fstat(opened[0])  # closed


def test_the_file_threads_stop_with_the_server(tmp_path: Path) -> None:
    import threading

    with LiveServer(Run(tmp_path), serve_artifacts=True) as live:  # type: ignore[arg-type]
        assert live.request("GET", "/artifacts/v1/runs/r/checkpoint")[0] == 200
        assert any(t.name.startswith("tenzro-rpc-artifacts") for t in threading.enumerate())
    _wait_for(lambda: not any(t.name.startswith("tenzro-rpc-artifacts") for t in threading.enumerate()))


def test_busy_refusals_are_counted_and_only_failures_are_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A request that finds the budget full past read_timeout_s is a counted 503 busy, not a
    warning (any client can cause it); a bug in the service is a 503 logged with its traceback;
    a 404 is logged not at all."""
    import threading

    gate = _hold_hashing(monkeypatch)
    run = Run(tmp_path, payload=b"p" * 64)  # the whole budget below, once read
    registry = Registry()
    caplog.set_level("WARNING", logger="rpc.artifacts")

    def inflight() -> str:
        return [x for x in registry.render().decode().splitlines() if x.startswith("tenzro_rpc_inflight_bytes ")][0]

    with LiveServer(run, serve_artifacts=True, metrics=registry,  # type: ignore[arg-type]
                    limits=ServerLimits(max_inflight_bytes=64, read_timeout_s=0.2)) as live:
        first: list[int] = []
        thread = threading.Thread(target=lambda: first.append(live.request("GET", PAYLOAD)[0]))
        thread.start()
        try:
            _wait_for(lambda: inflight().split()[1] in ("64", "64.0"))
            status, _h, body = live.request("GET", "/artifacts/v1/runs/r/checkpoint")
            assert status == 503 and _error(body)["code"] == 1800
        finally:
            gate.set()
            thread.join(30)
        assert first == [200]
        run.payload = PayloadArtifact(payload_hash=hashlib.sha256(b"p" * 65).digest(), data=b"p" * 65)  # past the whole budget
        status, _h, body = live.request("GET", PAYLOAD)
        assert status == 503 and _error(body)["code"] == 1800
        assert live.request("GET", "/artifacts/v1/runs/nope/checkpoint")[0] == 404

        def broken(task_id: str, round: int, fragment: int, trainer: bytes) -> PayloadArtifact:
            raise RuntimeError("a bug")

        run.get_payload_artifact = broken  # type: ignore[method-assign]
        assert live.request("GET", PAYLOAD)[0] == 503
    text = registry.render().decode()
    assert 'kind="checkpoint",outcome="busy"} 1' in text and 'kind="payload",outcome="busy"} 1' in text
    assert 'kind="payload",outcome="failed"} 1' in text
    records = [r for r in caplog.records if r.name == "rpc.artifacts"]
    assert len(records) == 1 and "answered 503" in records[0].getMessage()
    assert records[0].exc_info and records[0].exc_info[0] is RuntimeError  # the traceback of the bug


def test_a_model_whose_hash_fails_gives_its_room_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rpc.artifacts as artifacts

    def failing_sha256(data: bytes) -> bytes:
        raise MemoryError("no room to hash")

    monkeypatch.setattr(artifacts, "_sha256", failing_sha256)
    run = Run(tmp_path)
    run.model_bytes = b"m" * 1500  # past the request's room: it takes the excess from the budget
    registry = Registry()
    with LiveServer(run, serve_artifacts=True, metrics=registry,  # type: ignore[arg-type]
                    limits=ServerLimits(max_inflight_bytes=8192)) as live:
        status, _h, body = live.request("GET", "/artifacts/v1/runs/r/model")
        assert status == 503 and _error(body)["data"] == {"type": "InternalError"}
        _wait_for(lambda: "tenzro_rpc_inflight_bytes 0" in registry.render().decode())
