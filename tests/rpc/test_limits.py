"""What clients can hold of the endpoint (rpc.server.ServerLimits, the dispatcher's answer cap):
each test is one attack of the RPC concurrency probe, against a real server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
from collections.abc import Iterator

import pytest

from rpc.dispatcher import Dispatcher
from rpc.server import ServerLimits, _ByteBudget, _answer_room
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
            reply = _read_all(extra)
        status, headers, body = _split_reply(reply)
        assert status == 503 and headers["connection"] == "close" and headers["retry-after"] == "1"
        assert reply.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        # Written by hand, before aiohttp reads: a client must be able to frame and parse it.
        assert headers["content-length"] == str(len(body)) and headers["content-type"] == "application/json"
        assert _error(body)["code"] == 1800 and _error(body)["data"] == {  # type: ignore[index]
            "type": "LimitExceeded", "limit": "connections",
            "reason": "the node has as many open connections as it allows; retry later"}
        sockets.pop().close()
        time.sleep(0.2)  # the server saw it go
        assert _health_ok(server)
        for sock in sockets:
            sock.close()
        sockets.clear()
        time.sleep(0.2)
        assert _rejected(server) == {"connection_limit": 1}  # what the operator's alert counts


def test_a_refused_connection_is_half_closed_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/rpc.md: the 503 is followed by the end of the stream at once, not only when the
    connection is aborted (_REFUSED_LINGER_S later, here far past the socket's 10 s timeout):
    a client reading to the end gets its answer without waiting."""
    import http.client

    import rpc.server

    monkeypatch.setattr(rpc.server, "_REFUSED_LINGER_S", 3600.0)
    with LiveServer(FakeService(), limits=ServerLimits(max_connections=1)) as server:
        held = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            held.request("GET", "/")
            assert held.getresponse().read()  # the one slot, kept open
            with _connect(server.port) as extra:
                assert _split_reply(_read_all(extra))[0] == 503  # a TimeoutError without the EOF
        finally:
            held.close()


def test_a_refused_connection_has_nothing_it_sends_run() -> None:
    """A connection past the cap is answered and dropped before aiohttp sees it: a request it
    sends anyway is never read, so never run (and the refused connection takes no slot)."""
    import http.client

    service = FakeService()
    refused = json.dumps(get_run("refused")).encode()
    with LiveServer(service, limits=ServerLimits(max_connections=1)) as server:
        held = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            held.request("POST", "/", json.dumps(get_run("before")).encode())
            assert held.getresponse().read()  # the one slot, kept open
            with _connect(server.port) as extra:
                extra.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(refused), refused))
                assert _split_reply(_read_all(extra))[0] == 503
                # Still open on this side: a request the server read would be queued by now
                # for the one service thread, ahead of this one.
                held.request("POST", "/", json.dumps(get_run("after")).encode())
                assert held.getresponse().read()
        finally:
            held.close()
    # The server has stopped, and with it every call it started: none was the refused one's.
    assert [params["task_id"] for _name, params in service.calls] == ["before", "after"]


def test_connections_from_one_address_are_capped(sockets: list[socket.socket]) -> None:
    with LiveServer(FakeService(), limits=ServerLimits(max_connections=100, max_connections_per_ip=2)) as server:
        sockets.extend(_connect(server.port) for _ in range(2))
        time.sleep(0.2)
        with _connect(server.port) as extra:
            assert _split_reply(_read_all(extra))[0] == 503
        sockets.pop().close()  # one slot frees, and only one: the other connection still counts
        time.sleep(0.2)
        sockets.append(_connect(server.port))
        time.sleep(0.2)
        with _connect(server.port) as extra:
            assert _split_reply(_read_all(extra))[0] == 503
        for sock in sockets:
            sock.close()
        sockets.clear()
        time.sleep(0.2)
        assert _health_ok(server)


def test_a_connection_the_server_closes_gives_its_slot_back() -> None:
    """A connection counts against its address until it closes, whichever side closes it: one
    the server ends after its answer (the client asked for Connection: close; a refusal is
    force-closed likewise) frees its slot as one its client closes does."""
    with LiveServer(FakeService(), limits=ServerLimits(max_connections_per_ip=1)) as server:
        for _ in range(3):
            deadline = time.monotonic() + 5
            while (status := server.request("GET", "/", headers={"Connection": "close"})[0]) == 503:
                assert time.monotonic() < deadline  # the previous connection's slot never came back
                time.sleep(0.05)
            assert status == 200


@pytest.mark.parametrize("sent", [b"", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Le"])
def test_a_connection_without_a_whole_request_head_is_closed(sent: bytes) -> None:
    """Connections that never sent a byte, or sent half a head, stayed open for an hour."""
    with LiveServer(FakeService(), limits=ServerLimits(idle_timeout_s=0.3)) as server:
        with _connect(server.port) as sock:
            sock.sendall(sent)
            started = time.monotonic()
            assert _read_all(sock) == b""  # closed by the server, nothing answered
            assert time.monotonic() - started < 5


@pytest.mark.parametrize("length", [1000, 600_000])  # read before its room is held, or after
def test_a_body_that_does_not_arrive_in_time_is_a_408(length: int, caplog: pytest.LogCaptureFixture) -> None:
    """A body trickled a byte at a time held its connection (and its memory) indefinitely. The
    408 is the whole answer: nothing is run for it, and nothing logged as a node failure."""
    service = FakeService()
    with LiveServer(service, limits=ServerLimits(read_timeout_s=0.3)) as server:
        with _connect(server.port) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n[" % length)
            status, _headers, body = _split_reply(_read_all(sock))
        assert status == 408 and _error(body)["code"] == -32600
        assert _error(body)["message"] == "invalid request: request body not received within 0.3 s"
        assert service.calls == [] and _health_ok(server)
        assert _rejected(server) == {"timeout": 1}
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_a_refused_client_that_keeps_its_connection_open_loses_it() -> None:
    """After a 408 the node stops writing at once and drops the connection a moment later: a
    client that sent a slow body and then holds its socket open does not keep its connection
    slot (nor have the node read what it still sends)."""
    with LiveServer(FakeService(), limits=ServerLimits(read_timeout_s=0.3, max_connections_per_ip=1)) as server:
        with _connect(server.port) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n[")
            assert _split_reply(_read_all(sock))[0] == 408  # then the server's side of it is done
            deadline = time.monotonic() + 5
            while not _health_ok(server):  # the one slot frees while this socket is still open
                assert time.monotonic() < deadline
                time.sleep(0.05)


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
        assert _error(answer)["code"] == 1800 and _error(answer)["data"] == {  # type: ignore[index]
            "type": "LimitExceeded", "limit": "inflight_bytes",
            "reason": "the node holds as many request bytes as it allows; retry later"}
        assert len(service.calls) == 1  # not executed
        assert _rejected(server) == {"busy": 1}
        other: list[int] = []
        beside = threading.Thread(target=lambda: other.append(_post_from(server, "127.0.0.2", body)[0]))
        beside.start()  # another client: it has its own share, and the budget has room
        assert _inflight_reaches(server, 3600) and _inflight(server) == 3600  # both held at once
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


def _inflight_settles_at_zero(server: LiveServer) -> bool:
    """Whether every held byte is released within 5 s: the release follows the answer's last
    write, so a client can see its answer a moment before the gauge drops."""
    deadline = time.monotonic() + 5
    while _inflight(server) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    return _inflight(server) == 0


def _inflight_reaches(server: LiveServer, at_least: int) -> bool:
    """Whether the gauge reaches ``at_least`` within 10 s. Polled: read after a fixed 0.2 s, it
    was read too early whenever a loaded machine was slower than that (an unread answer's bytes
    were, beside a mutation run)."""
    deadline = time.monotonic() + 10
    while (value := _inflight(server)) < at_least and time.monotonic() < deadline:
        time.sleep(0.01)
    return value >= at_least


def _rejected(server: LiveServer) -> dict[str, float]:
    """The requests refused so far, by reason (those counted at least once)."""
    status, _headers, text = server.request("GET", "/metrics")
    assert status == 200
    prefix = 'tenzro_rpc_rejected_bodies_total{reason="'
    counts = {}
    for line in text.decode().splitlines():
        if line.startswith(prefix):
            reason, _, value = line[len(prefix):].partition('"} ')
            counts[reason] = float(value)
    return {reason: n for reason, n in counts.items() if n}


_SINGLE_CALL = json.dumps(get_run(id=1)).encode()


@pytest.mark.parametrize("body, encoding, held", [
    (_SINGLE_CALL, None, len(_SINGLE_CALL) + (1 << 20)),  # a call's answer room: 1 MiB
    (b"[" + _SINGLE_CALL + b"]", None, len(_SINGLE_CALL) + 2 + 5000),  # a batch's: max_answer_bytes
    (_SINGLE_CALL.ljust(600_000), None, 600_000 + (1 << 20)),  # read after its room is held
    # docs/rpc.md: a plain body of up to 256 KiB is read first, so a batch that size gets a batch's room;
    # one byte more is read after its room is held, which is a single call's.
    ((b"[" + _SINGLE_CALL + b"]").ljust(256 << 10), None, (256 << 10) + 5000),
    ((b"[" + _SINGLE_CALL + b"]").ljust((256 << 10) + 1), None, (256 << 10) + 1 + (1 << 20)),
    (gzip.compress(_SINGLE_CALL, mtime=0), "gzip", len(gzip.compress(_SINGLE_CALL, mtime=0)) + (1 << 20) + (1 << 20)),
], ids=["call", "batch", "call read late", "batch of 256 KiB", "batch read late", "gzip call"])
def test_a_request_holds_its_body_and_its_answers_room_while_it_runs(body: bytes, encoding: str | None,
                                                                     held: int) -> None:
    """What the budget counts for a request is what it can make the node hold: its body, what a
    compressed one may decode to (the body limit), and room for its answer (a batch's is the
    answer cap). Counting less lets clients grow the node past the budget; more refuses them
    early (the RPC concurrency probe)."""
    import threading

    service = FakeService()
    service.gate = threading.Event()
    limits = ServerLimits(max_inflight_bytes=64 << 20, max_answer_bytes=5000)
    with LiveServer(service, max_body_bytes=1 << 20, limits=limits) as server:
        headers = {} if encoding is None else {"Content-Encoding": encoding}
        answers: list[int] = []
        call = threading.Thread(target=lambda: answers.append(server.request("POST", "/", body, headers)[0]))
        call.start()
        assert service.entered.wait(5)
        assert _inflight(server) == held
        service.gate.set()
        call.join(5)
        assert answers == [200] and _inflight_settles_at_zero(server)


def test_an_answers_room_is_its_cap_down_to_one_byte() -> None:
    """docs/rpc.md: a batch's answer room is max_answer_bytes, a single call's 1 MiB, either at
    most an eighth of the budget; so 1 byte for a cap of 1 or a budget of 8-15 bytes, and 1
    byte, not 0, below that (the room is also the dispatcher's answer cap)."""
    batch = b"[" + _SINGLE_CALL + b"]"
    assert _answer_room(ServerLimits(max_answer_bytes=1), _ByteBudget(64 << 20), batch) == 1
    assert _answer_room(ServerLimits(), _ByteBudget(15), _SINGLE_CALL) == 1
    assert _answer_room(ServerLimits(), _ByteBudget(7), _SINGLE_CALL) == 1


def test_the_budget_defaults_to_four_bodies() -> None:
    """docs/rpc.md: unless max_inflight_bytes is set, requests hold at most 4 x max_body_bytes.
    A larger default lets a node configured for small bodies grow past what its operator sized
    it for; a single call's answer room is an eighth of it (here 16000 // 8 = 2000)."""
    import threading

    service = FakeService()
    service.gate = threading.Event()
    with LiveServer(service, max_body_bytes=4000) as server:
        answers: list[int] = []
        call = threading.Thread(target=lambda: answers.append(server.request("POST", "/", _SINGLE_CALL)[0]))
        call.start()
        assert service.entered.wait(5)
        assert _inflight(server) == len(_SINGLE_CALL) + 2000
        service.gate.set()
        call.join(5)
        assert answers == [200]


def test_a_batch_past_its_clients_share_still_runs_its_first_element() -> None:
    """A batch larger than its client's share holds the whole share (alone for its client) and so
    has no room left for its answer: it still runs its first element, and refuses the rest as past
    an answer room of one byte, instead of waiting for room its client can never have."""
    service = FakeService()
    batch = json.dumps([get_run(id=i) for i in range(3)]).encode().ljust(1100)
    with LiveServer(service, max_body_bytes=4000, limits=ServerLimits(max_inflight_bytes=4000)) as server:  # share 1000
        status, _headers, body = server.request("POST", "/", batch)
    answer = json.loads(body)
    assert status == 200 and [("result" in a) for a in answer] == [True, False, False]
    assert answer[1]["error"]["data"] == {"type": "LimitExceeded", "limit": "batch_answer_bytes",
                                          "reason": "the batch's answer passed 1 bytes before this request; it was not run"}
    assert len(service.calls) == 1


def test_an_answer_its_client_does_not_read_is_cut_off_and_its_bytes_freed() -> None:
    """Unread answers held their bytes for as long as their connections lived: four of them
    could hold the whole budget and every other client got 503 (review of the limits)."""
    service = FakeService()
    service.result = {"blob": "x" * (8 << 20)}  # far past the socket buffers
    with LiveServer(service, limits=ServerLimits(read_timeout_s=0.5)) as server:
        with _connect(server.port) as sock:
            body = json.dumps(get_run(id=1)).encode()
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            assert _inflight_reaches(server, (8 << 20) + 1)  # the answer's bytes, while it waits to be written
            assert _inflight_settles_at_zero(server)
            got = 0
            try:
                while chunk := sock.recv(1 << 20):
                    got += len(chunk)
            except ConnectionResetError:
                pass
            # Cut off: the server aborted the connection (a connection only left open would end
            # this read in the socket's 10 s timeout, a TimeoutError, not here).
            assert got < 8 << 20
        assert _rejected(server) == {"timeout": 1}


def test_a_request_whose_client_hung_up_is_not_run(caplog: pytest.LogCaptureFixture) -> None:
    """Handlers are cancelled on disconnect: requests of clients that left do not pile up on the
    one service thread (review of the limits). A hang-up is no failure of the node: nothing is
    logged as an internal error for it (the cancellation is not caught as one)."""
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
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


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


def test_a_waiting_request_may_fill_the_budget_exactly() -> None:
    """Bytes given back are granted to the next waiter that fits, up to the budget's last byte:
    one that needs exactly what is left is served then, not kept waiting until it gets 503."""
    async def scenario() -> None:
        budget = _ByteBudget(400)  # a share: 100
        for client in "abcd":
            assert await budget.acquire(100, 1, client) == 100
        waiting = asyncio.create_task(budget.acquire(100, 0.5, "e"))
        await asyncio.sleep(0.01)
        budget.release(100, "d")
        assert await waiting == 100 and budget.held == 400

    asyncio.run(scenario())


def test_a_full_budget_holds_back_a_client_within_its_share() -> None:
    """The budget bounds all clients together: a client that holds nothing still waits while the
    others hold all of it, instead of being granted past the total."""
    async def scenario() -> None:
        budget = _ByteBudget(400)  # a share: 100
        for client in "abcd":
            assert await budget.acquire(100, 1, client) == 100
        waiting = asyncio.create_task(budget.acquire(10, 5, "e"))
        await asyncio.sleep(0)  # it runs up to its wait
        assert budget.held == 400 and len(budget._waiters) == 1
        budget.release(100, "d")
        assert await waiting == 10 and budget.held == 310

    asyncio.run(scenario())


def test_a_request_cancelled_as_its_bytes_are_granted_gives_them_back() -> None:
    """A client that hangs up in the moment its wait ends must not keep the bytes it was granted:
    each such race would shrink the budget for good, until every request got 503."""
    async def scenario() -> None:
        budget = _ByteBudget(400)
        assert await budget.acquire(100, 1, "a") == 100
        waiting = asyncio.create_task(budget.acquire(50, 5, "a"))
        await asyncio.sleep(0.01)  # queued behind a's share
        budget.release(100, "a")  # granted now, before the waiting task has run again
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert budget.held == 0 and not budget._by_client

    asyncio.run(scenario())


def test_a_request_granted_as_its_wait_times_out_keeps_its_bytes() -> None:
    """A request whose bytes are granted in the moment its wait times out is served with them:
    answered 503 instead, it would never give them back, and each such race would shrink the
    budget for good."""
    async def scenario() -> None:
        budget = _ByteBudget(400)
        assert await budget.acquire(100, 1, "a") == 100
        waiting = asyncio.create_task(budget.acquire(50, 0, "a"))  # its time is up at once
        await asyncio.sleep(0)  # it runs up to its wait, queued behind a's share
        budget.release(100, "a")  # granted before the timeout's cancellation reaches it
        assert await waiting == 50 and budget.held == 50

    asyncio.run(scenario())


def test_a_request_that_gives_up_lets_the_one_behind_it_in() -> None:
    """A waiter too large for what is left holds up the queue (so it is not starved); when it
    gives up, the smaller one behind it that fits is granted then, not left to time out."""
    async def scenario() -> None:
        budget = _ByteBudget(400)  # a share: 100
        for client, n in (("a", 100), ("b", 100), ("c", 100), ("d", 50)):
            assert await budget.acquire(n, 1, client) == n
        large = asyncio.create_task(budget.acquire(100, 5, "e"))  # 450 > 400: it waits
        await asyncio.sleep(0)
        small = asyncio.create_task(budget.acquire(50, 5, "f"))  # would fit, waits its turn
        await asyncio.sleep(0)
        assert budget.held == 350 and len(budget._waiters) == 2
        large.cancel()
        with pytest.raises(asyncio.CancelledError):
            await large
        assert budget.held == 400  # granted as the one ahead gave up
        assert await small == 50

    asyncio.run(scenario())


def test_a_clients_last_byte_still_counts_against_its_share() -> None:
    """A client that gives back all but one byte still holds that byte: forgetting it would let
    the client past its share by as much, once per release."""
    async def scenario() -> None:
        budget = _ByteBudget(400)  # a share: 100
        assert await budget.acquire(100, 1, "a") == 100
        budget.release(99, "a")
        assert await budget.acquire(100, 0.05, "a") is None  # 1 + 100 > 100
        assert await budget.acquire(99, 0.05, "a") == 99

    asyncio.run(scenario())


def test_the_smallest_budget_still_serves_a_request() -> None:
    """max_inflight_bytes=1 is a valid limit: a request then holds the one byte (its whole
    share) and is served, rather than waiting for room the budget can never have."""
    async def scenario() -> None:
        budget = _ByteBudget(1)
        assert await budget.acquire(10**6, 0.05, "a") == 1
        budget.release(1, "a")
        assert budget.held == 0

    asyncio.run(scenario())


def test_the_defaults_are_the_documented_ones() -> None:
    """docs/rpc.md "Resource limits" tells operators what a node allows unless configured: the
    defaults are that table."""
    assert ServerLimits() == ServerLimits(max_connections=512, max_connections_per_ip=128, idle_timeout_s=30,
                                          read_timeout_s=60, max_inflight_bytes=None, max_answer_bytes=32 << 20,
                                          max_batch_seconds=2)


@pytest.mark.parametrize("field, value", [("max_connections", 0), ("max_connections_per_ip", 1.5),
                                          ("idle_timeout_s", 0), ("read_timeout_s", float("inf")),
                                          ("max_inflight_bytes", 0), ("max_answer_bytes", -1)])
def test_invalid_server_limits(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ServerLimits(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("field, value, message", [
    ("max_connections", 0, "max_connections must be a positive int, got 0"),
    ("max_connections_per_ip", True, "max_connections_per_ip must be a positive int, got True"),
    ("max_answer_bytes", 2.0, "max_answer_bytes must be a positive int, got 2.0"),
    ("max_inflight_bytes", -5, "max_inflight_bytes must be a positive int or None, got -5"),
    ("max_inflight_bytes", "1", "max_inflight_bytes must be a positive int or None, got '1'"),
    ("idle_timeout_s", -1, "idle_timeout_s must be a positive number of seconds, got -1"),
    ("read_timeout_s", float("nan"), "read_timeout_s must be a positive number of seconds, got nan"),
    ("max_batch_seconds", "5", "max_batch_seconds must be a positive number of seconds, got '5'"),
])
def test_invalid_server_limits_name_the_field_and_the_value(field: str, value: object, message: str) -> None:
    """The operator who set the limit reads this message at the node's start: it says which
    setting is wrong, what it must be, and what was given (a bool or a string from a config file
    is no count)."""
    with pytest.raises(ValueError) as caught:
        ServerLimits(**{field: value})  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_the_smallest_limits_are_accepted() -> None:
    """A limit of 1 (one connection, one byte, an integral number of seconds) is a positive
    limit: refusing it would make the smallest configuration unusable."""
    limits = ServerLimits(max_connections=1, max_connections_per_ip=1, max_answer_bytes=1, max_inflight_bytes=1,
                          idle_timeout_s=1, read_timeout_s=1, max_batch_seconds=1)
    assert (limits.max_connections, limits.max_inflight_bytes, limits.idle_timeout_s) == (1, 1, 1)
