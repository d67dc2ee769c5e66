"""What clients can hold of the endpoint (rpc.server.ServerLimits, the dispatcher's answer cap):
each test is one attack of the RPC concurrency probe, against a real server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import pytest

from rpc.dispatcher import Dispatcher
from rpc.server import ServerLimits, _ByteBudget
from tests.rpc.conformance import FakeService, get_run
from tests.rpc.test_server import LiveServer, _split_reply


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _error(body: bytes) -> dict[str, object]:
    answer = json.loads(body)
    assert answer["jsonrpc"] == "2.0" and answer["id"] is None
    return answer["error"]  # type: ignore[no-any-return]


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for sock in held:
        sock.close()


def _health_ok(server: LiveServer) -> bool:
    status, _headers, body = server.request("GET", "/")
    return status == 200 and json.loads(body) == {"ok": True}


def test_connections_past_the_limit_are_refused_at_once(sockets: list[socket.socket]) -> None:
    """Idle connections used up the node's file descriptors; then nobody was served."""
    with LiveServer(FakeService(), limits=ServerLimits(max_connections=4)) as server:
        sockets.extend(_connect(server.port) for _ in range(4))
        time.sleep(0.2)  # accepted
        with _connect(server.port) as extra:
            status, headers, body = _split_reply(_read_all(extra))
        assert status == 503 and headers["connection"] == "close" and headers["retry-after"] == "1"
        assert _error(body)["code"] == 1800 and _error(body)["data"] == {  # type: ignore[index]
            "type": "LimitExceeded", "limit": "connections",
            "reason": "the node has as many open connections as it allows; retry later"}
        sockets.pop().close()
        time.sleep(0.2)  # the server saw it go
        assert _health_ok(server)


def test_connections_from_one_address_are_capped(sockets: list[socket.socket]) -> None:
    with LiveServer(FakeService(), limits=ServerLimits(max_connections=100, max_connections_per_ip=2)) as server:
        sockets.extend(_connect(server.port) for _ in range(2))
        time.sleep(0.2)
        with _connect(server.port) as extra:
            assert _split_reply(_read_all(extra))[0] == 503
        for sock in sockets:
            sock.close()
        sockets.clear()
        time.sleep(0.2)
        assert _health_ok(server)


@pytest.mark.parametrize("sent", [b"", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Le"])
def test_a_connection_without_a_whole_request_head_is_closed(sent: bytes) -> None:
    """Connections that never sent a byte, or sent half a head, stayed open for an hour."""
    with LiveServer(FakeService(), limits=ServerLimits(idle_timeout_s=0.3)) as server:
        with _connect(server.port) as sock:
            sock.sendall(sent)
            started = time.monotonic()
            assert _read_all(sock) == b""  # closed by the server, nothing answered
            assert time.monotonic() - started < 5


def test_a_body_that_does_not_arrive_in_time_is_a_408() -> None:
    """A body trickled a byte at a time held its connection (and its memory) indefinitely."""
    service = FakeService()
    with LiveServer(service, limits=ServerLimits(read_timeout_s=0.3)) as server:
        with _connect(server.port) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n[")
            status, _headers, body = _split_reply(_read_all(sock))
        assert status == 408 and _error(body)["code"] == -32600
        assert "not received within 0.3 s" in _error(body)["message"]  # type: ignore[operator]
        assert service.calls == [] and _health_ok(server)


def _post_from(server: LiveServer, source_ip: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
    """POST from another loopback address (another client, as far as the budget can tell)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10, source_address=(source_ip, 0))
    try:
        conn.request("POST", "/", body=body)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_request_bytes_past_a_clients_share_wait_then_get_a_503() -> None:
    """Concurrent large bodies grew the node by gigabytes: what requests hold is bounded, and
    one client (IP address) holds at most a quarter of it, so the others are still served."""
    import threading

    service = FakeService()
    service.gate = threading.Event()  # the first call holds the service thread, and its bytes
    # Budget 8000, a client's share 2000; a single call's answer room 8000 // 8 = 1000.
    limits = ServerLimits(max_inflight_bytes=8000, read_timeout_s=0.5)
    body = json.dumps(get_run(id=1)).encode().ljust(800)  # JSON may end in whitespace: 800 + 1000 held
    with LiveServer(service, max_body_bytes=4000, limits=limits) as server:
        first: list[int] = []
        hog = threading.Thread(target=lambda: first.append(server.request("POST", "/", body)[0]))
        hog.start()
        assert service.entered.wait(5)
        status, headers, answer = server.request("POST", "/", body)  # the same client: 2 x 1800 > 2000
        assert status == 503 and headers["Retry-After"] == "1" and headers["Connection"] == "close"
        assert _error(answer)["code"] == 1800 and _error(answer)["data"]["limit"] == "inflight_bytes"  # type: ignore[index]
        assert len(service.calls) == 1  # not executed
        other: list[int] = []
        beside = threading.Thread(target=lambda: other.append(_post_from(server, "127.0.0.2", body)[0]))
        beside.start()  # another client: it has its own share, and the budget has room
        time.sleep(0.2)
        assert _inflight(server) == 3600  # both held at once
        service.gate.set()
        hog.join(5)
        beside.join(5)
        assert first == [200] and other == [200]
        assert server.request("POST", "/", body)[0] == 200  # freed
        assert _inflight(server) == 0


def _inflight(server: LiveServer) -> float:
    _status, _headers, text = server.request("GET", "/metrics")
    line = next(x for x in text.decode().splitlines() if x.startswith("tenzro_rpc_inflight_bytes "))
    return float(line.split()[1])


def test_an_answer_its_client_does_not_read_is_cut_off_and_its_bytes_freed() -> None:
    """Unread answers held their bytes for as long as their connections lived: four of them
    could hold the whole budget and every other client got 503 (review of the limits)."""
    service = FakeService()
    service.result = {"blob": "x" * (8 << 20)}  # far past the socket buffers
    with LiveServer(service, limits=ServerLimits(read_timeout_s=0.5)) as server:
        with _connect(server.port) as sock:
            body = json.dumps(get_run(id=1)).encode()
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            time.sleep(0.2)
            assert _inflight(server) > 8 << 20  # the answer's bytes, while it waits to be written
            deadline = time.monotonic() + 5
            while _inflight(server) > 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _inflight(server) == 0
            got = 0
            try:
                while chunk := sock.recv(1 << 20):
                    got += len(chunk)
            except OSError:
                pass
            assert got < 8 << 20  # cut off: the server aborted the connection


def test_a_request_whose_client_hung_up_is_not_run() -> None:
    """Handlers are cancelled on disconnect: requests of clients that left do not pile up on the
    one service thread (review of the limits)."""
    import threading

    service = FakeService()
    service.gate = threading.Event()
    with LiveServer(service) as server:
        first = threading.Thread(target=lambda: server.request("POST", "/", json.dumps(get_run(id=1)).encode()))
        first.start()
        assert service.entered.wait(5)  # the service thread is busy with it
        body = json.dumps(get_run("gone", id=2)).encode()
        with _connect(server.port) as sock:  # queued behind it, then the client leaves
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            time.sleep(0.2)
        time.sleep(0.2)
        service.gate.set()
        first.join(5)
        time.sleep(0.2)
        assert [c[1]["task_id"] for c in service.calls] == ["t1"]


def test_a_running_call_keeps_its_slot_and_bytes_after_its_client_hangs_up() -> None:
    """Cancelled on hang-up, the request released its bytes and its connection slot while its
    call (or its decode) still ran, outside every bound (second review)."""
    import threading

    service = FakeService()
    service.gate = threading.Event()
    with LiveServer(service, limits=ServerLimits(max_connections_per_ip=1)) as server:
        body = json.dumps(get_run(id=1)).encode()
        with _connect(server.port) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            assert service.entered.wait(5)
        time.sleep(0.2)  # hung up while its call runs: the call still holds the address's one slot
        with _connect(server.port) as again:
            assert _split_reply(_read_all(again))[0] == 503
        service.gate.set()
        time.sleep(0.3)
        assert _inflight(server) == 0  # slot and bytes freed once the call ended
        assert len(service.calls) == 1


def test_a_batch_answer_past_its_cap_refuses_the_rest_unrun() -> None:
    """1000 listRuns of 500 runs: a ~300 MB answer per 95 KB request, held for slow readers."""
    service = FakeService()
    service.result = {"runs": ["x" * 1000]}
    dispatcher = Dispatcher(service, max_answer_bytes=2500)  # type: ignore[arg-type]
    batch = [get_run(id=i) for i in range(5)] + [{"jsonrpc": "2.0", "method": "tenzro_training_getRun",
                                                   "params": {"task_id": "n"}}]
    answer = json.loads(dispatcher.handle(json.dumps(batch).encode()) or b"")
    assert [a["id"] for a in answer] == [0, 1, 2, 3, 4]  # one per request; the notification gets none
    assert [("result" in a) for a in answer] == [True, True, True, False, False]  # 3 answers pass 2500 bytes
    assert answer[3]["error"]["code"] == 1800 and answer[3]["error"]["data"]["limit"] == "batch_answer_bytes"
    assert len(service.calls) == 3  # the refused elements never ran
    assert len(Dispatcher(service, max_answer_bytes=10**6).handle_obj(batch) or []) == 5  # type: ignore[arg-type]


def test_a_batch_that_holds_the_service_too_long_refuses_the_rest_unrun() -> None:
    """8 batches of 1000 listRuns kept every other call waiting 35 s."""
    import time as clock

    class Slow(FakeService):
        def get_run(self, task_id: str) -> object:
            clock.sleep(0.05)
            return super().get_run(task_id)

    service = Slow()
    dispatcher = Dispatcher(service, max_batch_seconds=0.12)  # type: ignore[arg-type]
    answer = json.loads(dispatcher.handle(json.dumps([get_run(id=i) for i in range(20)]).encode()) or b"")
    ran = [a for a in answer if "result" in a]
    refused = [a for a in answer if "error" in a]
    assert 2 <= len(ran) <= 5 and len(ran) + len(refused) == 20 and len(service.calls) == len(ran)
    assert refused[0]["error"]["data"]["limit"] == "batch_seconds" and refused[0]["id"] == len(ran)


def test_byte_budget_caps_each_clients_share() -> None:
    async def scenario() -> None:
        budget = _ByteBudget(400)  # a share: 100
        assert await budget.acquire(80, 1, "a") == 80
        assert await budget.acquire(30, 0.05, "a") is None  # past a's share
        blocked = asyncio.create_task(budget.acquire(30, 5, "a"))
        await asyncio.sleep(0.01)
        assert await budget.acquire(100, 0.05, "b") == 100  # b is not stuck behind a's waiter
        assert await budget.acquire(10**6, 0.05, "c") == 100  # one request takes at most a share
        budget.release(80, "a")
        assert await blocked == 30 and budget.held == 230
        for n, client in ((30, "a"), (100, "b"), (100, "c")):
            budget.release(n, client)
        assert budget.held == 0 and not budget._by_client

    asyncio.run(scenario())


def test_byte_budget_grants_in_order_and_gives_up_on_time() -> None:
    async def scenario() -> None:
        budget = _ByteBudget(400)  # one client here: its share, 100, binds
        assert await budget.acquire(60, 1) == 60
        later = asyncio.create_task(budget.acquire(50, 5))  # waits: 110 > 100
        await asyncio.sleep(0.01)
        assert await budget.acquire(10, 0.05) is None  # behind the waiter, first come first served
        budget.release(60)
        assert await later == 50 and budget.held == 50
        assert await budget.acquire(10**9, 0.05) is None  # capped to the share: waits for all of it
        budget.release(50)
        assert await budget.acquire(10**9, 0.05) == 100  # alone, it takes the whole share
        waiting = asyncio.create_task(budget.acquire(1, 5))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        budget.release(100)
        assert budget.held == 0 and not budget._waiters

    asyncio.run(scenario())


@pytest.mark.parametrize("field, value", [("max_connections", 0), ("max_connections_per_ip", 1.5),
                                          ("idle_timeout_s", 0), ("read_timeout_s", float("inf")),
                                          ("max_inflight_bytes", 0), ("max_answer_bytes", -1)])
def test_invalid_server_limits(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ServerLimits(**{field: value})  # type: ignore[arg-type]
