"""rpc/artifacts.py's pure pieces: path segment parsing, the status table, the digest cache of
served files, and the budget rule for answers read before their size was known. The routes
themselves run against a real node in tests/node/test_artifacts_http.py."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import struct
import time
from pathlib import Path

import pytest

from rpc.artifacts import get_artifact_status, parse_index, parse_trainer
from rpc.errors import InternalError, LimitExceeded
from rpc.metrics import Registry
from rpc.server import _ByteBudget, create_app
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


def test_payloads_read_past_the_budget_are_refused_before_they_are_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A payload is in memory once the service read it: it must count in the byte budget then,
    not after it waited its turn on the two hashing threads (busy with other downloads), or
    many concurrent requests pile up payloads the budget never saw. Hashing is held shut here:
    of 5 concurrent 8 MiB payloads (budget 64 MiB, a client's share 16 MiB: two fit), those past
    the share are answered 503 while the first ones still wait for their hash."""
    import threading

    import rpc.artifacts as artifacts
    from rpc.server import ServerLimits

    gate = threading.Event()
    real = artifacts._sha256

    def held_sha256(data: bytes) -> bytes:
        gate.wait(30)
        return real(data)

    monkeypatch.setattr(artifacts, "_sha256", held_sha256)
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
