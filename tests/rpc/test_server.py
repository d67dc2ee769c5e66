"""The aiohttp endpoint: the conformance suite over real HTTP, plus HTTP-only behaviour.

pytest-asyncio is not used: :class:`LiveServer` runs the server's event loop in a background
thread and the tests talk to it with the standard library's blocking HTTP client.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import inspect
import json
import random
import socket
import threading
import time
import tracemalloc
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpc import server as server_module
from rpc.server import RunningServer, create_app, run_server, start_server
from tests.rpc.conformance import FakeService, RpcConformance, get_run, req

SMALL_LIMIT = 4096


class LiveServer:
    """``start_server`` on 127.0.0.1:0 in its own thread and event loop."""

    def __init__(self, service: FakeService, **options: Any) -> None:
        self.service = service
        self.options = options
        self.port = 0
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # surfaced by __enter__
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await start_server(self.service, "127.0.0.1", 0, **self.options)
        self.port = server.port
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await server.close()

    def __enter__(self) -> LiveServer:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *_exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def request(
        self, method: str, path: str = "/", body: bytes | Iterable[bytes] | None = None,
        headers: dict[str, str] | None = None, **kwargs: Any,
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {}, **kwargs)
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def post(self, body: bytes, content_type: str | None = "application/json") -> tuple[int, bytes]:
        headers = {} if content_type is None else {"Content-Type": content_type}
        status, _headers, data = self.request("POST", "/", body, headers)
        return status, data


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    with LiveServer(FakeService(), max_body_bytes=SMALL_LIMIT * 256) as server:
        yield server


class TestServerConformance(RpcConformance):
    @pytest.fixture
    def service(self, live: LiveServer) -> FakeService:
        live.service.reset()
        self._live = live
        return live.service

    def call_raw(self, raw: bytes) -> Any:
        status, body = self._live.post(raw)
        if status == 204:
            assert body == b""
            return None
        assert status == 200, (status, body[:200])
        return json.loads(body)


# -- HTTP-only behaviour ------------------------------------------------------------------------


@pytest.fixture
def small() -> Iterator[LiveServer]:
    with LiveServer(FakeService(), max_body_bytes=SMALL_LIMIT) as server:
        yield server


def _too_large_error(status: int, body: bytes) -> None:
    assert status == 413
    answer = json.loads(body)
    assert answer["id"] is None and answer["jsonrpc"] == "2.0"
    assert answer["error"]["code"] == -32600
    assert answer["error"]["data"]["type"] == "RequestTooLarge"
    assert answer["error"]["data"]["limit"] == SMALL_LIMIT


def test_health(live: LiveServer) -> None:
    status, headers, body = live.request("GET", "/")
    assert status == 200 and json.loads(body) == {"ok": True}
    assert headers["Content-Type"].split(";")[0] == "application/json"


def test_health_answers_503_with_the_checks_reason() -> None:
    """A node whose store refuses writes (a full disk: RocksDB keeps the error until reopened)
    answered {"ok": true} (storage fault probe); the check's fixed reason now makes it a 503."""
    failure: list[str] = []
    with LiveServer(FakeService(), health_check=lambda: failure[0] if failure else None) as server:
        assert server.request("GET", "/")[0] == 200
        failure.append("storage_write_failed")
        status, headers, body = server.request("GET", "/")
        assert status == 503 and json.loads(body) == {"ok": False, "error": "storage_write_failed"}
        assert headers["Content-Type"].split(";")[0] == "application/json"


def test_a_failing_health_check_is_an_internal_error_not_a_500() -> None:
    """The check is the caller's code: if it raises, the answer is still JSON-RPC (-32603 with a
    200, as for any failure of the node), without the exception's text."""
    def check() -> str | None:
        raise RuntimeError("/var/secret")

    with LiveServer(FakeService(), health_check=check) as server:
        status, _headers, body = server.request("GET", "/")
    assert status == 200 and json.loads(body)["error"]["code"] == -32603 and b"secret" not in body


def test_notifications_get_204(live: LiveServer) -> None:
    live.service.reset()
    note = req("tenzro_training_getRun", {"task_id": "t1"}, id=...)
    assert live.post(json.dumps(note).encode()) == (204, b"")
    assert live.post(json.dumps([note, note]).encode()) == (204, b"")
    assert len(live.service.calls) == 3


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "application/json; charset=utf-8", "garbage"])
def test_content_type_is_lenient(live: LiveServer, content_type: str | None) -> None:
    """docs/rpc.md: POST / takes any Content-Type, and answers application/json."""
    live.service.reset()
    headers = {} if content_type is None else {"Content-Type": content_type}
    status, answer_headers, body = live.request("POST", "/", json.dumps(get_run()).encode(), headers)
    assert status == 200 and json.loads(body)["result"]["task_id"] == "t1"
    assert answer_headers.get("Content-Type", "").split(";")[0] == "application/json"


def test_invalid_body_over_limit_by_content_length(small: LiveServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", small.port, timeout=10)
    try:
        # Announce a huge body, send only a little: the answer must come without reading it all.
        conn.putrequest("POST", "/")
        conn.putheader("Content-Length", str(10**9))
        conn.endheaders(b"[" * 100)
        response = conn.getresponse()
        _too_large_error(response.status, response.read())
        assert response.getheader("Connection", "").lower() == "close"
    finally:
        conn.close()
    assert small.service.calls == []


def test_invalid_body_over_limit_chunked(small: LiveServer) -> None:
    chunks = [b" " * 1024] * 8  # 8 KiB of whitespace, no Content-Length
    status, _headers, body = small.request("POST", "/", iter(chunks), encode_chunked=True)
    _too_large_error(status, body)
    metrics = small.request("GET", "/metrics")[2].decode().splitlines()
    assert 'tenzro_rpc_rejected_bodies_total{reason="too_large"} 1' in metrics  # counted as one cut off by its length


def test_body_at_limit_is_accepted(small: LiveServer) -> None:
    raw = json.dumps(get_run()).encode()
    raw += b" " * (SMALL_LIMIT - len(raw))
    assert len(raw) == SMALL_LIMIT
    assert small.post(raw)[0] == 200
    status, _headers, body = small.request("POST", "/", iter([raw[:100], raw[100:]]), encode_chunked=True)
    assert status == 200 and json.loads(body)["result"]["task_id"] == "t1"
    _too_large_error(*small.post(raw + b" "))


def test_invalid_garbage_never_gives_500(small: LiveServer) -> None:
    rng = random.Random(1234)
    bodies = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(40)]
    bodies += [b"\x00" * 100, b"{" * 3000, b'"' * 999, b"[1," * 1000, b"null", b"[]", b"{}"]
    for body in bodies:
        status, data = small.post(body, "application/octet-stream")
        assert status == 200, (status, body[:50])
        answer = json.loads(data)
        answer = answer[0] if isinstance(answer, list) else answer
        assert answer["error"]["code"] in (-32700, -32600)
    status, _h, data = small.request("GET", "/")
    assert status == 200 and json.loads(data) == {"ok": True}


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/nope", 404), ("POST", "/rpc", 404), ("PUT", "/", 405), ("DELETE", "/", 405),
])
def test_invalid_http_route_gets_json_error(small: LiveServer, method: str, path: str, status: int) -> None:
    got, headers, body = small.request(method, path, b"{}")
    assert got == status
    error = json.loads(body)["error"]
    assert error["code"] == -32600 and error["data"]["status"] == status
    if status == 405:
        assert "POST" in headers["Allow"]


@pytest.mark.parametrize(("method", "path", "status", "reason", "exception"), [
    ("GET", "/nope", 404, "not found", "HTTPNotFound"),
    ("PUT", "/", 405, "method not allowed", "HTTPMethodNotAllowed"),
])
def test_invalid_http_route_answer_is_a_whole_json_rpc_error(
    small: LiveServer, method: str, path: str, status: int, reason: str, exception: str,
) -> None:
    """A client library reads any answer of the node as a JSON-RPC response: an HTTP error that
    is not one (no "jsonrpc", no "id", a message or a data type missing) fails it in its parser,
    not as the error it is."""
    _got, headers, body = small.request(method, path, b"{}")
    assert headers["Content-Type"].startswith("application/json")
    assert json.loads(body) == {"jsonrpc": "2.0", "id": None, "error": {
        "code": -32600, "message": reason, "data": {"type": exception, "status": status}}}


def test_unexpected_service_error_is_200_internal_error(small: LiveServer) -> None:
    small.service.error = RuntimeError("/var/secret")
    status, body = small.post(json.dumps(get_run()).encode())
    assert status == 200
    assert json.loads(body)["error"]["code"] == -32603 and b"secret" not in body


def test_service_calls_are_serialized_and_loop_stays_responsive(small: LiveServer) -> None:
    service = small.service
    service.gate = threading.Event()
    answers: list[tuple[int, bytes]] = []

    def call(i: int) -> None:
        answers.append(small.post(json.dumps(get_run(f"t{i}", id=i)).encode()))

    workers = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for worker in workers:
        worker.start()
    assert service.entered.wait(10)
    # A call is blocked inside the service; the event loop still answers health checks.
    status, _h, body = small.request("GET", "/")
    assert status == 200 and json.loads(body) == {"ok": True}
    assert service.active == 1
    service.gate.set()
    for worker in workers:
        worker.join(10)
    assert sorted(json.loads(b)["id"] for _, b in answers) == list(range(6))
    assert service.max_active == 1
    assert len(service.calls) == 6


def test_run_server_serves_until_stopped_with_shared_executor() -> None:
    service = FakeService()
    executor = ThreadPoolExecutor(max_workers=1)
    started: list[RunningServer] = []
    results: dict[str, Any] = {}

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(run_server(
            service, "127.0.0.1", 0, executor=executor, stop=stop, on_started=started.append,
        ))
        while not started:
            await asyncio.sleep(0.01)
        port = started[0].port

        def client() -> Any:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("POST", "/", json.dumps(get_run()).encode())
            return json.loads(conn.getresponse().read())

        results["answer"] = await asyncio.to_thread(client)
        stop.set()
        await asyncio.wait_for(task, 10)

    try:
        asyncio.run(main())
        assert results["answer"]["result"]["task_id"] == "t1"
        assert started[0].url == f"http://127.0.0.1:{started[0].port}/"
        # The caller's executor was not shut down by the server.
        assert executor.submit(lambda: 42).result(5) == 42
    finally:
        executor.shutdown()


def test_run_server_gives_back_the_threads_it_started_when_stopped() -> None:
    """The node CLI stops its endpoint and goes on (closing the store, the p2p host): the
    endpoint's own service, decoder and preloading threads must have ended by then, not linger
    with a call (or a post's checkpoint read) still running against a store being closed."""
    before = set(threading.enumerate())
    started: list[RunningServer] = []

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(run_server(FakeService(), "127.0.0.1", 0, stop=stop, on_started=started.append))
        while not started:
            await asyncio.sleep(0.01)

        def client() -> None:
            post = req("tenzro_training_postTask", {"spec": {"task_id": "t"}, "signature": "0x" + "11" * 65})
            for body, headers in ((json.dumps(get_run()).encode(), {}),
                                  (_gzip(_listing()), {"Content-Encoding": "gzip"}),
                                  (json.dumps(post).encode(), {})):  # read ahead on the preloading thread
                conn = http.client.HTTPConnection("127.0.0.1", started[0].port, timeout=10)
                conn.request("POST", "/", body, headers)
                assert conn.getresponse().status == 200
                conn.close()

        await asyncio.to_thread(client)
        stop.set()
        await asyncio.wait_for(task, 10)

    asyncio.run(main())
    assert [t.name for t in set(threading.enumerate()) - before if t.name.startswith("tenzro-rpc")] == []


def test_the_default_body_limit_is_64_mib() -> None:
    """docs/rpc.md: a 64 MiB body holds the largest payload a trainer submits; past it the
    answer is the 413 a client can act on (checked by its Content-Length, nothing read)."""
    with LiveServer(FakeService()) as server:
        status, _headers, body = server.request("POST", "/", headers={"Content-Length": str((64 << 20) + 1)})
        error = json.loads(body)["error"]
        assert status == 413 and error["data"]["type"] == "RequestTooLarge" and error["data"]["limit"] == 64 << 20


def test_the_default_address_is_the_documented_one() -> None:
    """docs/rpc.md: the node answers at http://127.0.0.1:8545/ unless told otherwise: on the
    loopback address, not reachable from other machines unless its operator opens it."""
    for serve in (start_server, run_server):
        parameters = inspect.signature(serve).parameters
        assert (parameters["host"].default, parameters["port"].default) == ("127.0.0.1", 8545)


def test_run_server_cancellation_shuts_down_cleanly() -> None:
    service = FakeService()
    started: list[RunningServer] = []

    async def main() -> bool:
        task = asyncio.create_task(run_server(service, "127.0.0.1", 0, on_started=started.append))
        while not started:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return True

    assert asyncio.run(main())
    with pytest.raises(OSError):
        conn = http.client.HTTPConnection("127.0.0.1", started[0].port, timeout=2)
        conn.request("GET", "/")
        conn.getresponse()


def test_a_port_in_use_fails_the_start() -> None:
    """A node whose RPC port is taken (another node on the machine) must fail at its start with
    the bind's error, not run on without its endpoint while reporting one."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            asyncio.run(start_server(FakeService(), "127.0.0.1", taken.getsockname()[1]))


@pytest.mark.parametrize("limit", [0, -1, 1.5, "64"])
def test_invalid_max_body_bytes(limit: object) -> None:
    """The operator reads this at the node's start: it names the setting, what it must be, and
    what was given (a string from a config file is no count)."""
    with pytest.raises(ValueError) as caught:
        create_app(FakeService(), max_body_bytes=limit)  # type: ignore[arg-type]
    assert str(caught.value) == f"max_body_bytes must be a positive int, got {limit!r}"


def _raw_exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _raw_reply(port: int, data: bytes) -> bytes:
    """Send ``data`` and read until the server closes (without half-closing first: aiohttp drops
    a connection whose client already shut its side down before the answer is written)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _split_reply(reply: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


@pytest.mark.parametrize(
    "request_bytes",
    [
        # broken chunked framing: a chunk size that is not hex
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n[1,2]\r\nzz\r\n",
        # two Content-Length headers, Content-Length with chunked, a negative length
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n[]",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n[]",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -2\r\n\r\n[]",
        # a header line far over aiohttp's limit
        b"POST / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\nContent-Length: 2\r\n\r\n[]",
    ],
)
def test_invalid_http_framing_gets_a_json_rpc_400_without_parser_text(small: LiveServer, request_bytes: bytes,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """aiohttp rejects these before any application code runs; its own answer was text/plain
    with the parser's exception text (echoing the client's bytes). Never a 500, never text.
    The parser's text goes to the node's log instead (aiohttp's own record of the error)."""
    status, headers, body = _split_reply(_raw_reply(small.port, request_bytes))
    assert 400 <= status < 500 and headers["content-type"].startswith("application/json"), (status, body[:200])
    reply = json.loads(body)
    assert reply["id"] is None and reply["error"] == {
        "code": -32600, "message": "invalid request: malformed HTTP request",
        "data": {"type": "InvalidRequest", "reason": "malformed HTTP request"}}
    assert small.request("GET", "/")[0] == 200
    metrics = small.request("GET", "/metrics")[2].decode().splitlines()
    assert 'tenzro_rpc_rejected_bodies_total{reason="unreadable"} 1' in metrics  # the documented label for it
    assert [r.exc_info is not None for r in caplog.records
            if r.name == "aiohttp.server" and r.getMessage().startswith("Error handling request")] == [True]


def test_invalid_truncated_body_gets_no_500(small: LiveServer) -> None:
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    reply = _raw_exchange(small.port, head + b'{"jsonrpc":')
    assert b" 500 " not in reply
    status, _h, body = small.request("GET", "/")
    assert status == 200


LARGE = 600_000  # over rpc.server.SMALL_BODY_BYTES: read into one buffer of its Content-Length


def _padded(obj: Any, size: int = LARGE, lead: bytes = b"") -> bytes:
    raw = lead + json.dumps(obj).encode()
    return raw + b" " * (size - len(raw))


def test_a_large_body_is_read_whole_in_any_slices(live: LiveServer) -> None:
    """Bodies over SMALL_BODY_BYTES go through the server's own read (one buffer of their
    length): a call, a batch after leading whitespace (its answer is a list), and the same call
    arriving in odd slices over several writes all get the answers a small body gets."""
    live.service.reset()
    status, body = live.post(_padded(get_run()))
    assert status == 200 and json.loads(body)["result"]["task_id"] == "t1"
    status, body = live.post(_padded([get_run(), get_run()], lead=b" \r\n\t"))
    assert status == 200 and [a["result"]["task_id"] for a in json.loads(body)] == ["t1", "t1"]
    raw = _padded(get_run())
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(raw))
        for start, end in ((0, 1), (1, 70_000), (70_000, 70_001), (70_001, 333_333), (333_333, len(raw))):
            sock.sendall(raw[start:end])
            time.sleep(0.01)
        reply = b""
        while b"\r\n\r\n" not in reply or len(reply.partition(b"\r\n\r\n")[2]) < int(
                _split_reply(reply)[1].get("content-length", "1")):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    status, _headers, answer = _split_reply(reply)
    assert status == 200 and json.loads(answer)["result"]["task_id"] == "t1"
    assert [name for name, _ in live.service.calls] == ["get_run"] * 4


def test_invalid_large_body_shorter_than_its_length_runs_nothing(live: LiveServer) -> None:
    live.service.reset()
    raw = _padded(get_run())
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (len(raw) + 1000)
    reply = _raw_exchange(live.port, head + raw)
    assert b" 500 " not in reply
    assert live.service.calls == []
    assert live.post(json.dumps(get_run()).encode())[0] == 200


def test_a_large_body_head_alone_allocates_nothing_for_its_length(live: LiveServer) -> None:
    """A head claiming a large body, with none of it sent, costs the node no buffer of that
    length: a client could otherwise have it allocate (and zero-fill) max_body_bytes per head."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
            time.sleep(0.5)  # the handler is waiting for the body by now
            grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 300_000, grown


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=12).map(lambda b: b.replace(b"\x00", b" ")) | st.sampled_from(
    [b"", b" ", b"\x0b\x0c[", b"\t\n\r {", b"  x", b"\xa0["]))
def test_first_byte_is_lstrip_without_the_copy(body: bytes) -> None:
    expected = body.lstrip()[:1]
    assert server_module._first_byte(body) == expected


# --- Content-Encoding ------------------------------------------------------------------------------


def _listing() -> bytes:
    return json.dumps(req("tenzro_training_listRuns", {}, 1)).encode()


def _gzip(data: bytes) -> bytes:
    """gzip with a fixed header time: the same bytes in every process, so the parametrized
    test ids are too (pytest-xdist workers must collect the same tests)."""
    return gzip.compress(data, mtime=0)


def _deflate(data: bytes, wbits: int, level: int = -1) -> bytes:
    enc = zlib.compressobj(level, wbits=wbits)
    return enc.compress(data) + enc.flush()


def _raw_stored_block(data: bytes) -> bytes:
    """``data`` as one final stored raw-DEFLATE block whose padding bits are not all zero (they are
    ignored, RFC 1951 3.2.4). For a 145-byte block its first two bytes pass the zlib header's
    check (0x0991 % 31 == 0), but 0x09 names no zlib compression method (CM = 8, the low nibble):
    a valid raw body the node must not take for a zlib one."""
    n = len(data)
    return bytes([0x09]) + n.to_bytes(2, "little") + (n ^ 0xFFFF).to_bytes(2, "little") + data


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("gzip", _gzip(_listing())),
        ("x-gzip", _gzip(_listing())),
        ("GZip", _gzip(_listing())),
        ("deflate", _deflate(_listing(), zlib.MAX_WBITS)),  # RFC 9110 deflate: zlib format
        ("deflate", _deflate(_listing(), -zlib.MAX_WBITS)),  # raw DEFLATE, as some clients send
        ("deflate", _raw_stored_block(_listing().ljust(145))),  # raw, though its first 2 bytes pass the check
        ("identity", _listing()),
    ],
)
def test_encoded_bodies_are_decoded(live: LiveServer, encoding: str, body: bytes) -> None:
    status, _headers, data = live.request("POST", "/", body, {"Content-Encoding": encoding})
    assert status == 200 and "result" in json.loads(data)


def test_compressed_bodies_are_decoded_two_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/rpc.md: compressed bodies are decoded on two threads of their own. Two clients' decodes
    run at once (one slow decode does not stall the next), and no more (each may decode to
    ~100 MB). Decoding is held shut here until three requests have had time to start theirs."""
    gate = threading.Event()
    entered: list[str] = []
    decode = server_module._decode_body

    def held(*args: Any) -> bytes:
        entered.append(threading.current_thread().name)
        gate.wait(10)
        return decode(*args)

    monkeypatch.setattr(server_module, "_decode_body", held)
    body = _gzip(_listing())
    limits = server_module.ServerLimits(max_inflight_bytes=64 << 20)  # room for the three at once
    with LiveServer(FakeService(), max_body_bytes=SMALL_LIMIT, limits=limits) as server, ThreadPoolExecutor(3) as pool:
        calls = [pool.submit(server.request, "POST", "/", body, {"Content-Encoding": "gzip"}) for _ in range(3)]
        try:
            deadline = time.monotonic() + 5
            while len(entered) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)  # a third decode, if it could start, would have started by now
            assert len(entered) == 2
        finally:
            gate.set()
        assert [call.result()[0] for call in calls] == [200] * 3


def test_a_gzip_body_may_refer_back_the_whole_window(live: LiveServer) -> None:
    """A gzip stream may repeat bytes from up to 32 KiB back (gzip, and zlib's default writer, use
    the whole window): a body whose repeats lie 24 KiB apart must decode, not be refused as
    unreadable by a decoder with a smaller window."""
    request_id = random.Random(0).randbytes(12 << 10).hex()  # 24 KiB that does not repeat itself
    call = req("tenzro_training_listRuns", {}, request_id)
    body = _gzip(json.dumps([call, call]).encode())
    status, _headers, data = live.request("POST", "/", body, {"Content-Encoding": "gzip"})
    assert status == 200 and [("result" in a, a["id"] == request_id) for a in json.loads(data)] == [(True, True)] * 2


@pytest.mark.parametrize(
    "body",
    [
        _gzip(_listing())[:-8],  # cut before its CRC-32 and size trailer: was executed
        _gzip(_listing())[:-1],
        _gzip(_listing())[:-12],  # was a 200 with a -32700
        _gzip(_listing()) + b"x",  # trailing bytes
        _gzip(_listing())[:-8] + b"\0\0\0\0" + _gzip(_listing())[-4:],  # bad CRC
        zlib.compress(_listing()),  # a zlib stream ("deflate") is no gzip member
        b"",
        b"0123456789",
    ],
)
def test_invalid_gzip_body_is_a_json_400_and_not_executed(body: bytes) -> None:
    with LiveServer(FakeService()) as server:
        status, _headers, data = server.request("POST", "/", body, {"Content-Encoding": "gzip"})
        error = json.loads(data)["error"]
        assert status == 400 and error["code"] == -32600
        assert error["data"] == {"type": "InvalidRequest", "reason": "request body could not be read"}
        assert server.service.calls == []
        metrics = server.request("GET", "/metrics")[2].decode().splitlines()
        assert 'tenzro_rpc_rejected_bodies_total{reason="unreadable"} 1' in metrics  # cut, trailing or corrupt alike


def test_an_answered_call_leaves_its_connection_for_the_next(caplog: pytest.LogCaptureFixture) -> None:
    """Clients keep their connection open between calls: after an answer the connection serves the
    next request, and nothing is logged as a failure of the node."""
    with LiveServer(FakeService()) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            for call_id in (1, 2):
                conn.request("POST", "/", json.dumps(req("tenzro_training_listRuns", {}, call_id)).encode())
                response = conn.getresponse()
                assert response.status == 200 and json.loads(response.read())["id"] == call_id
        finally:
            conn.close()
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, gzip", "gzip,identity", "bogus"])
def test_unsupported_content_encoding_is_a_json_415(encoding: str) -> None:
    """aiohttp answered br/zstd with a text/plain 400 naming the Python package to install. The
    connection closes with it: the body it refused is not read to find the next request."""
    with LiveServer(FakeService()) as server:
        status, headers, data = server.request("POST", "/", b"xx", {"Content-Encoding": encoding})
        assert status == 415 and headers["Content-Type"].startswith("application/json")
        assert headers["Connection"] == "close"
        error = json.loads(data)["error"]
        assert error["code"] == -32600 and error["data"] == {"type": "InvalidRequest", "reason": "unsupported Content-Encoding"}
        assert server.service.calls == []
        metrics = server.request("GET", "/metrics")[2].decode().splitlines()
        assert 'tenzro_rpc_rejected_bodies_total{reason="unsupported_encoding"} 1' in metrics  # what the operator sees


def test_a_gzip_bomb_is_a_413(small: LiveServer) -> None:
    bomb = _gzip(b" " * (SMALL_LIMIT * 64))  # ~256 KiB of whitespace in a few hundred bytes
    assert len(bomb) < SMALL_LIMIT
    status, _headers, data = small.request("POST", "/", bomb, {"Content-Encoding": "gzip"})
    assert status == 413 and json.loads(data)["error"]["data"]["type"] == "RequestTooLarge"
    metrics = small.request("GET", "/metrics")[2].decode().splitlines()
    assert 'tenzro_rpc_rejected_bodies_total{reason="too_large"} 1' in metrics  # counted as any 413


def test_an_app_serves_no_artifacts_unless_asked() -> None:
    """Serving artifacts is opt-in (a node's config): an app of a service that has none is
    created as before, not refused for lacking them."""
    assert create_app(FakeService()) is not None


def test_the_smallest_body_limit_is_accepted() -> None:
    """The check refuses what its message says ("a positive int") and nothing more: a limit of
    1 is a valid, if tiny, configuration."""
    assert create_app(FakeService(), max_body_bytes=1) is not None


@pytest.mark.parametrize("encoding, level", [("gzip", -1), ("deflate", -1), ("raw-deflate", 1)])
def test_a_compressed_body_is_held_to_the_limit_it_decodes_to(small: LiveServer, encoding: str, level: int) -> None:
    """The limit binds what the node parses, not what came over the wire: a body that decodes
    to exactly the limit is served as a plain one of that size is, a byte more is a 413 (not a
    400 that would tell its client the body was broken). Raw DEFLATE at level 1 is the case where
    the decoder, stopped a byte past the limit, has used up all of the body without reaching the
    stream's end: still a 413, not taken for a body cut short."""
    raw = json.dumps(get_run()).encode()
    raw += b" " * (SMALL_LIMIT - len(raw))

    def encode(data: bytes) -> bytes:
        if encoding == "gzip":
            return _gzip(data)
        return _deflate(data, zlib.MAX_WBITS if encoding == "deflate" else -zlib.MAX_WBITS, level)

    headers = {"Content-Encoding": "deflate" if encoding == "raw-deflate" else encoding}
    status, _headers, body = small.request("POST", "/", encode(raw), headers)
    assert status == 200 and json.loads(body)["result"]["task_id"] == "t1"
    status, _headers, body = small.request("POST", "/", encode(raw + b" "), headers)
    _too_large_error(status, body)


class PreloadingService(FakeService):
    """A FakeService whose postTask preparation (the node reads the init checkpoint there)
    blocks until released, recording the thread it ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.preload_gate = threading.Event()
        self.preload_entered = threading.Event()
        self.preloads: list[tuple[dict[str, Any], bytes, str]] = []

    def preload_post_task(self, spec: dict[str, Any], signature: bytes) -> None:
        self.preloads.append((spec, signature, threading.current_thread().name))
        self.preload_entered.set()
        self.preload_gate.wait(timeout=10)


def test_a_posts_checkpoint_read_does_not_hold_the_service_thread() -> None:
    """postTask read and hashed its init checkpoint (up to max_checkpoint_bytes) on the one
    service thread: every other call, and every deadline, waited for it. The server now shows a
    single postTask to the service's preload_post_task on a thread of its own first."""
    service = PreloadingService()
    post = req("tenzro_training_postTask", {"spec": {"task_id": "t"}, "signature": "0x" + "11" * 65})
    with LiveServer(service) as server:
        answers: list[tuple[int, bytes]] = []
        poster = threading.Thread(target=lambda: answers.append(server.post(json.dumps(post).encode())))
        poster.start()
        assert service.preload_entered.wait(10)
        # The post's preparation is blocked: a getRun is answered meanwhile, by the service.
        status, body = server.post(json.dumps(get_run("other")).encode())
        assert status == 200 and json.loads(body)["result"]["task_id"] == "other"
        assert [name for name, _ in service.calls] == ["get_run"]
        service.preload_gate.set()
        poster.join(10)
        assert answers and json.loads(answers[0][1])["result"]["method"] == "post_task"
        assert [name for name, _ in service.calls] == ["get_run", "post_task"]
        ((spec, signature, thread),) = service.preloads
        assert spec == {"task_id": "t"} and signature == b"\x11" * 65 and thread.startswith("tenzro-rpc-preload")
        # Only a single, well-formed postTask is shown to it: not a batch, not another method,
        # not params the dispatcher refuses (each still answered as before).
        for other in ([post], get_run("t"), req("tenzro_training_postTask", {"spec": [], "signature": "0x11"}),
                      {**post, "jsonrpc": "1.0"}):
            assert server.post(json.dumps(other).encode())[0] == 200
        assert len(service.preloads) == 1


def test_posts_are_read_ahead_one_at_a_time() -> None:
    """docs/node.md: a post's checkpoint is read on the preloading thread, one post at a time
    (each read may hold a whole checkpoint): a second post waits for the first's read rather
    than get a second thread beside it."""
    service = PreloadingService()
    body = json.dumps(req("tenzro_training_postTask", {"spec": {"task_id": "t"}, "signature": "0x" + "11" * 65})).encode()
    before = set(threading.enumerate())

    def inflight(server: LiveServer) -> float:
        text = server.request("GET", "/metrics")[2].decode()
        return float(next(x for x in text.splitlines() if x.startswith("tenzro_rpc_inflight_bytes ")).split()[1])

    with LiveServer(service) as server:
        posters = [threading.Thread(target=server.post, args=(body,)) for _ in range(2)]
        posters[0].start()
        assert service.preload_entered.wait(10)
        room = inflight(server)  # the first post's
        posters[1].start()
        # The second post is handed to the preloading executor in the event-loop step in which it
        # takes its room, so once the gauge shows both, both were submitted.
        deadline = time.monotonic() + 10
        while inflight(server) < 2 * room and time.monotonic() < deadline:
            time.sleep(0.01)
        assert inflight(server) == 2 * room
        preloading = [t.name for t in set(threading.enumerate()) - before if t.name.startswith("tenzro-rpc-preload")]
        service.preload_gate.set()
        for poster in posters:
            poster.join(10)
    assert len(preloading) == 1 and len(service.preloads) == 2


@pytest.mark.parametrize(("size", "preloaded"), [(server_module.SMALL_BODY_BYTES, 1),
                                                 (server_module.SMALL_BODY_BYTES + 1, 0)])
def test_a_post_up_to_the_small_body_size_is_read_ahead(size: int, preloaded: int) -> None:
    """Every post a sponsor sends (a spec is a few KB) has its checkpoint read off the service
    thread, up to the size the server reads before it holds room; a larger body is still run,
    only without the read-ahead."""
    service = PreloadingService()
    service.preload_gate.set()
    post = req("tenzro_training_postTask", {"spec": {"task_id": "t"}, "signature": "0x" + "11" * 65})
    with LiveServer(service) as server:
        status, body = server.post(json.dumps(post).encode().ljust(size))
        assert status == 200 and json.loads(body)["result"]["method"] == "post_task"
    assert len(service.preloads) == preloaded


class TokenService(PreloadingService):
    def __init__(self) -> None:
        super().__init__()
        self.discarded: list[object] = []

    def preload_post_task(self, spec: dict[str, Any], signature: bytes) -> object:
        super().preload_post_task(spec, signature)
        return ("token", len(self.preloads))

    def discard_preloaded(self, token: object) -> None:
        self.discarded.append(token)


def test_what_was_read_ahead_is_dropped_when_its_request_ends() -> None:
    """A post whose client hung up during the read, or that the dispatcher refused, left its model
    (or its error) waiting for a post that never came."""
    import socket

    service = TokenService()
    post = req("tenzro_training_postTask", {"spec": {"task_id": "t"}, "signature": "0x" + "11" * 65})
    with LiveServer(service) as server:
        body = json.dumps(post).encode()
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body)
        assert service.preload_entered.wait(10)
        s.close()  # the client gives up while its checkpoint is read
        time.sleep(0.3)
        service.preload_gate.set()
        deadline = time.monotonic() + 10
        while not service.discarded and time.monotonic() < deadline:
            time.sleep(0.02)
        assert service.discarded == [("token", 1)] and service.calls == []  # dropped; the post never ran
        assert server.post(body)[0] == 200 and service.discarded[-1] == ("token", 2)
        assert server.post(json.dumps({**post, "id": 1.5}).encode())[0] == 200  # -32600: not read at all
        assert len(service.preloads) == 2
