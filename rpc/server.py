"""The node's JSON-RPC HTTP endpoint: aiohttp around :class:`rpc.dispatcher.Dispatcher`.

What this module is: :func:`create_app` (the aiohttp application), :func:`start_server` (bind it,
get the port back) and :func:`run_server` (the node CLI's serve-until-stopped helper).

What it is NOT: JSON-RPC logic. The handler only reads the body, hands it to the dispatcher and
writes the bytes back; params, errors and batches are the dispatcher's.

HTTP behaviour:
- ``POST /`` with any content type: the JSON-RPC body. 200 with a JSON body, or 204 (no body)
  when the request held only notifications.
- ``GET /``: ``{"ok": true}`` (health), or 503 ``{"ok": false, "error": <reason>}`` while the
  ``health_check`` given to :func:`create_app` names one (the node: ``storage_write_failed``,
  docs/node.md "Storage failures", or ``service_stalled``). ``GET /metrics``: Prometheus text (``rpc/metrics.py``;
  the names are listed in docs/node.md "Metrics"). Other paths/methods: 404/405 with a
  JSON-RPC-shaped error body (code -32600, ``data.type`` ``"HTTPNotFound"``...).
- ``GET /artifacts/v1/runs/...`` (with ``serve_artifacts``): a committed round's payloads, a
  sealed run's final model, a run's init checkpoint (``rpc/artifacts.py``).
- A body over ``max_body_bytes`` (default 64 MiB): 413 with a JSON-RPC error (-32600, data.type
  ``"RequestTooLarge"``, ``data.limit``). ``Content-Length`` is checked before reading; a body
  streamed without it is cut off as soon as it passes the limit. The connection is then closed
  after aiohttp's lingering read (what the client still sends is read and dropped, for at most
  10 s), so the client reads the 413 rather than a reset. ``client_max_size`` is set to the
  same limit on purpose (aiohttp's default of 1 MiB would answer larger bodies with a
  plain-text 413 outside our control).
- Resource limits (:class:`ServerLimits`, docs/rpc.md "Resource limits"): connection caps,
  idle and read timeouts, a byte budget for bodies and answers, batch caps.
- ``Content-Encoding``: ``gzip``/``x-gzip`` and ``deflate`` (zlib-wrapped or raw) are decoded
  here, not by aiohttp (``auto_decompress`` is off): the stream must end exactly at its end
  (aiohttp accepted a gzip body cut before its CRC/size trailer) and the decoded body is held to
  the same limit (413). Another encoding is 415 with a JSON-RPC error.
- A request aiohttp cannot parse (broken chunked framing, conflicting lengths, oversized
  headers) is answered by :func:`start_server`'s handler with a JSON-RPC -32600 and its 4xx
  status, not aiohttp's plain-text message (which echoes the parser's exception text).
- Never a 500: a middleware turns any exception into a JSON-RPC -32603 (logged, text not sent).

Threading: the dispatcher (JSON parse, params, the service call) runs on ONE worker thread, so
the service sees one call at a time and the event loop stays free to accept and answer other
connections (health checks keep answering during a long finalizeRound). Pass ``executor`` to
share that one thread with other callers of the service (gossip handlers, timers). A single
postTask request is first shown to the service on a preloading thread of its own
(:class:`rpc.service.Preloading`: the node reads and hashes the init checkpoint there), so that
reading a large checkpoint does not hold that one thread.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import zlib
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from aiohttp.web_request import BaseRequest

from rpc.dispatcher import (
    DEFAULT_MAX_ANSWER_BYTES,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_BATCH_SECONDS,
    METHODS,
    POST_TASK,
    Dispatcher,
    serialize_json,
)
from rpc.errors import (
    INVALID_REQUEST,
    InternalError,
    InvalidRequest,
    LimitExceeded,
    RequestTooLarge,
    compute_error_response,
)
from rpc.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from rpc.metrics import Counter, Registry, RpcMetrics
from rpc.service import TrainingService

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_PORT",
    "RunningServer",
    "ServerLimits",
    "create_app",
    "run_server",
    "start_server",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8545
DEFAULT_MAX_BODY_BYTES: Final = 64 * 1024 * 1024
"""A 64 MiB body holds a ~48 MiB base64 payload, far above one fragment's outer gradient."""
SMALL_BODY_BYTES: Final = 256 * 1024
"""Plain bodies up to this size (every read, and batches of them) are read before they take
budget room, so that their answer's room can fit what they are (a batch or a single call)."""
SINGLE_ANSWER_BYTES: Final = 1024 * 1024
"""Room held for the answer of a single call, and of a batch whose body is over
``SMALL_BODY_BYTES`` (batched submissions, whose answers are small): most answers are a few KB,
a long run's getRun ~100 KB; a larger answer takes its excess without waiting."""
_WRITE_CHUNK: Final = 1024 * 1024
"""An answer is written in chunks of this size, each within ``read_timeout_s``."""


_DISPATCHER: Final = web.AppKey("rpc_dispatcher", Dispatcher)
_EXECUTOR: Final = web.AppKey("rpc_executor", Executor)
_DECODER: Final = web.AppKey("rpc_decoder", Executor)
_PRELOADER: Final = web.AppKey("rpc_preloader", Executor)
_POST_TASK: Final = POST_TASK.encode("ascii")
_LEADING_SPACE: Final = re.compile(rb"[ \t\n\r\x0b\x0c]*")
"""What ``bytes.lstrip()`` strips: ASCII whitespace."""
_MAX_BODY: Final = web.AppKey("rpc_max_body_bytes", int)
_METRICS: Final = web.AppKey("rpc_metrics", Registry)
_REJECTED: Final = web.AppKey("rpc_rejected_bodies", Counter)
_HEALTH_CHECK: Final = web.AppKey("rpc_health_check", object)  # Callable[[], str | None] | None
_JSON: Final = "application/json"
_HEALTH: Final = serialize_json({"ok": True})


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLimits:
    """What clients can hold of the node: connections, time and memory. Each bound answers an
    attack the RPC concurrency probe ran on a real node (docs/rpc.md "Resource limits"): idle
    or byte-at-a-time connections that used up its file descriptors (then nobody was served and
    every failed accept logged a traceback), concurrent large or gzip-bomb bodies that grew it
    by gigabytes, and batch answers of ~300 MB held for clients that never read them."""

    max_connections: int = 512
    """Open connections at once; one more is answered 503 and closed. Below the usual soft
    limit of 1024 open files, which the store and the p2p host share."""
    max_connections_per_ip: int = 128
    """Open connections from one IP address (all clients behind one proxy count as one)."""
    idle_timeout_s: float = 30.0
    """A connection that has not sent a whole request head this long after it opened, or after
    its previous answer, is closed (idle keep-alive, a head sent a byte at a time)."""
    read_timeout_s: float = 60.0
    """A request body must arrive whole within this long (408 otherwise); also the longest a
    request waits for ``max_inflight_bytes`` to free up before it gets 503."""
    max_inflight_bytes: int | None = None
    """Bytes held for requests, all together: bodies being read, decoded (a compressed body
    holds room for its decoded limit) and queued for the service thread, and answers not yet
    written to their clients. None: 4 x ``max_body_bytes``."""
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES
    """A batch's answer past this many bytes refuses its remaining elements (LimitExceeded)."""
    max_batch_seconds: float = DEFAULT_MAX_BATCH_SECONDS
    """A batch that has held the service thread this long refuses its remaining elements."""

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_connections_per_ip", "max_answer_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.max_inflight_bytes is not None and (type(self.max_inflight_bytes) is not int
                                                    or self.max_inflight_bytes < 1):
            raise ValueError(f"max_inflight_bytes must be a positive int or None, got {self.max_inflight_bytes!r}")
        for name in ("idle_timeout_s", "read_timeout_s", "max_batch_seconds"):
            value = getattr(self, name)
            if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


class _ByteBudget:
    """Bytes that requests hold, granted first come first served up to ``total``, and at most a
    quarter of it to one client (IP address): one client holding its share does not stall the
    others. A request larger than its client's share takes the whole share (it is alone for
    its client then), so none waits forever."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.share = max(1, total // 4)
        self.held = 0
        self._by_client: dict[object, int] = {}
        self._waiters: deque[tuple[int, object, asyncio.Future[None]]] = deque()

    def _fits(self, n: int, client: object) -> bool:
        return self.held + n <= self.total and self._by_client.get(client, 0) + n <= self.share

    async def acquire(self, wanted: int, timeout: float, client: object = None) -> int | None:
        """Hold up to ``wanted`` bytes (at most the client's share) for ``client``; the bytes
        held, or None when they did not free up within ``timeout`` seconds."""
        n = min(wanted, self.share)
        if not self._waiters and self._fits(n, client):
            self._hold(n, client)
            return n
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, client, granted)
        self._waiters.append(entry)
        self._grant()  # it may fit now: the waiters ahead may be blocked only by their own shares
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(granted)
            return n
        except BaseException as exc:
            if granted.done() and not granted.cancelled():  # granted just as it gave up
                if isinstance(exc, TimeoutError):
                    return n
                self.release(n, client)
                raise
            granted.cancel()
            try:
                self._waiters.remove(entry)
            except ValueError:
                pass
            self._grant()  # a request behind this one may fit now
            if isinstance(exc, TimeoutError):
                return None
            raise

    def _hold(self, n: int, client: object) -> None:
        self.held += n
        self._by_client[client] = self._by_client.get(client, 0) + n

    def take(self, n: int, client: object = None) -> None:
        """Hold ``n`` more bytes without waiting (an answer larger than the room it held)."""
        self._hold(n, client)

    def try_take(self, n: int, client: object, own: int) -> bool:
        """Hold ``n`` more bytes for a request of ``client`` that already holds ``own``, if they
        fit now: within the whole budget, and within the client's share unless the request is
        alone for its client (as :meth:`acquire` lets one request past the share). For an
        answer whose size was known only once it was read (a run artifact, rpc/artifacts.py),
        which must not take its excess unasked as a getRun's does: a payload may be 64 MiB."""
        if self.held + n > self.total:
            return False
        mine = self._by_client.get(client, 0)
        if mine + n > self.share and mine > own:
            return False
        self._hold(n, client)
        return True

    def release(self, n: int, client: object = None) -> None:
        self.held -= n
        left = self._by_client.get(client, 0) - n
        if left > 0:
            self._by_client[client] = left
        else:
            self._by_client.pop(client, None)
        self._grant()

    def _grant(self) -> None:
        """Grant waiters in order. One blocked only by its own client's share is passed over,
        with its client's later ones (it waits for its own client's requests, not the others');
        one that does not fit the whole budget stops the queue, so a large request is not
        starved by smaller ones."""
        passed: set[object] = set()
        for entry in list(self._waiters):
            n, client, granted = entry
            if granted.done():  # gave up
                self._waiters.remove(entry)
                continue
            if client in passed:
                continue
            if self.held + n > self.total:
                return
            if self._by_client.get(client, 0) + n > self.share:
                passed.add(client)
                continue
            self._waiters.remove(entry)
            self._hold(n, client)
            granted.set_result(None)


_LIMITS: Final = web.AppKey("rpc_limits", ServerLimits)
_BUDGET: Final = web.AppKey("rpc_budget", _ByteBudget)


def _json_response(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=serialize_json(body), status=status, content_type=_JSON)


def _count_rejected(app: web.Application, reason: str) -> None:
    app[_REJECTED].inc(reason)


def _too_large(limit: int) -> web.Response:
    response = _json_response(compute_error_response(RequestTooLarge(limit), None), status=413)
    response.force_close()  # closed once aiohttp's lingering read (<= 10 s, bytes dropped) ends
    return response


def _refused(app: web.Application, reason: str, message: str, status: int) -> web.Response:
    _count_rejected(app, reason)
    response = _json_response(compute_error_response(InvalidRequest(message), None), status=status)
    response.force_close()
    return response


async def _answer_and_close(request: web.Request, response: web.Response) -> web.Response:
    """Write ``response``, half-close, and abort the connection ``_REFUSED_LINGER_S`` later.
    Without this aiohttp would linger up to 10 s reading (and discarding) the rest of a body,
    which a client too slow to send it must not be given; closed at once with its bytes
    unread, the kernel would send a reset that can reach the client before the answer."""
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionError:
        pass  # the client went away first
    _half_close(request.transport)
    return response


def _half_close(transport: asyncio.BaseTransport | None) -> None:
    """Stop writing now (the client reads what was sent, then EOF); abort a moment later."""
    if transport is None or transport.is_closing():
        return
    writer = cast(asyncio.Transport, transport)
    if writer.can_write_eof():
        writer.write_eof()
    asyncio.get_running_loop().call_later(_REFUSED_LINGER_S, writer.abort)


class _BodyError(Exception):
    """Why a Content-Encoding body was refused: ``reason`` (the rejected-bodies metric label)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_GZIP: Final = ("gzip", "x-gzip")
_IDENTITY: Final = ("", "identity")


def _decode_body(raw: bytes, encoding: str, limit: int) -> bytes:
    """The body under its ``Content-Encoding`` (one of gzip/x-gzip/deflate/identity), at most
    ``limit`` bytes decoded; _BodyError("too_large" | "unreadable" | "unsupported_encoding").

    A stream must end exactly where the body does: a gzip member cut before its CRC-32/size
    trailer, or followed by anything, is unreadable (zlib reports both: ``eof``, ``unused_data``)."""
    if encoding in _GZIP:
        wbits = 16 + zlib.MAX_WBITS
    elif encoding == "deflate":
        # RFC 9110 "deflate" is the zlib format; some clients send raw DEFLATE. A zlib header is
        # CM = 8 in the low nibble of the first byte and a 16-bit check divisible by 31.
        wrapped = len(raw) >= 2 and raw[0] & 0x0F == 8 and int.from_bytes(raw[:2], "big") % 31 == 0
        wbits = zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS
    else:
        raise _BodyError("unsupported_encoding")
    decoder = zlib.decompressobj(wbits)
    try:
        body = decoder.decompress(raw, limit + 1)
    except zlib.error:
        raise _BodyError("unreadable") from None
    if len(body) > limit or decoder.unconsumed_tail:
        raise _BodyError("too_large")
    if not decoder.eof or decoder.unused_data:
        raise _BodyError("unreadable")
    return body


@web.middleware
async def _catch_all(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every answer is JSON: HTTP errors keep their status, anything else is a logged -32603."""
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        _count_rejected(request.app, "too_large")
        return _too_large(request.app[_MAX_BODY])
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects and the like are not errors
        error = {
            "code": INVALID_REQUEST,
            "message": exc.reason.lower(),
            "data": {"type": type(exc).__name__, "status": exc.status},
        }
        response = _json_response({"jsonrpc": "2.0", "error": error, "id": None}, exc.status)
        for name in ("Allow",):  # keep the header a 405 must carry
            if name in exc.headers:
                response.headers[name] = exc.headers[name]
        return response
    except Exception:
        log.exception("internal error in the JSON-RPC HTTP handler")
        return _json_response(compute_error_response(InternalError(), None))


async def _post(request: web.Request) -> web.StreamResponse:
    app = request.app
    limit = app[_MAX_BODY]
    limits, budget = app[_LIMITS], app[_BUDGET]
    if request.content_length is not None and request.content_length > limit:
        _count_rejected(app, "too_large")
        return _too_large(limit)
    encodings = request.headers.getall("Content-Encoding", [])
    encoding = encodings[0].strip().lower() if len(encodings) == 1 else "" if not encodings else ","
    if encoding not in _IDENTITY + _GZIP + ("deflate",):
        # Before reading: one of gzip/x-gzip/deflate/identity, once (no stacked codings).
        return _refused(app, "unsupported_encoding", "unsupported Content-Encoding", 415)
    client = _client_ip(request.transport)
    small = encoding in _IDENTITY and request.content_length is not None and request.content_length <= SMALL_BODY_BYTES
    if small:
        # Most calls (getRun, enroll, finalize, hash-only submissions): the body is read first,
        # outside the budget (a few KB, bounded by the connection caps), so that a request that
        # sends only its head holds no room, and the answer's room fits the body it answers.
        body = await _read_body(request)
        if isinstance(body, web.StreamResponse):
            return body
        room = len(body) + _answer_room(limits, budget, body)
    else:
        # Room, taken at once before anything is read (a request never holds some while it
        # waits for more: two waiting that way would wait for each other): the body (its
        # length, or the limit when it comes chunked), what a compressed one decodes to, and
        # a single call's answer (a batch this large gets that much answer: submissions).
        body = None
        wanted = limit if request.content_length is None else request.content_length
        room = wanted + (0 if encoding in _IDENTITY else limit) + _answer_room(limits, budget, b"")
    hold = [await budget.acquire(room, limits.read_timeout_s, client)]
    if hold[0] is None:
        return _busy(app)  # nothing run
    try:
        return await _answer(request, encoding, body, hold, client)
    finally:
        budget.release(hold[0], client)


def _client_ip(transport: asyncio.BaseTransport | None) -> object:
    """The client's IP address, what the connection caps and the budget's shares count by
    (the peer name as it is when it is not an address pair; None when unknown)."""
    peer = transport.get_extra_info("peername") if transport is not None else None
    return peer[0] if isinstance(peer, tuple) and peer else peer


async def _read_body(request: web.Request) -> bytes | web.StreamResponse:
    """The whole body within ``read_timeout_s``, or the answer refusing it (408, 400)."""
    app = request.app
    limits = app[_LIMITS]
    length = request.content_length
    try:
        async with asyncio.timeout(limits.read_timeout_s):
            if length is not None and length > SMALL_BODY_BYTES:  # within the limit: _post checked
                return await _read_exactly(request, length)
            return await request.read()  # bounded by client_max_size == limit, with or without a length
    except TimeoutError:
        refused = _refused(app, "timeout", f"request body not received within {limits.read_timeout_s:g} s", 408)
        return await _answer_and_close(request, refused)
    except (HttpProcessingError, RequestPayloadError, ConnectionError):
        # Broken chunked framing, a body shorter than its Content-Length, a client that went
        # away (RequestPayloadError is no HttpProcessingError).
        log.debug("JSON-RPC request body could not be read", exc_info=True)
        return _refused(app, "unreadable", "request body could not be read", 400)


async def _read_exactly(request: web.Request, length: int) -> bytes:
    """A body of this Content-Length: its chunks as they come, joined once at the end.

    Why: ``request.read()`` grows a bytearray chunk by chunk (copying it as it grows) and then
    copies it into bytes, all of it holding the GIL that the service thread needs: ~9% of a
    1 MiB submission's GIL time in the node (2026-11-27). Joining copies each byte once. Not a
    buffer of the whole length made up front: a client that sends a head claiming 64 MiB and
    nothing more would have the node zero-fill 64 MiB for it. A body that ends short raises
    RequestPayloadError (as aiohttp's own read does); one longer than its length cannot arrive
    (aiohttp's parser frames it by the header)."""
    payload = request.content
    raise_limits = getattr(payload, "set_read_chunk_size", None)  # aiohttp >= 3.13: what read() does
    if raise_limits is not None:
        raise_limits(length)  # the transport is not paused every 128 KiB while the body comes in
    chunks: list[bytes] = []
    received = 0
    while True:
        chunk, _ = await payload.readchunk()
        if not chunk:
            if payload.at_eof():
                break
            continue
        received += len(chunk)
        if received > length:
            raise RequestPayloadError("request body longer than its Content-Length")
        chunks.append(chunk)
    if received != length:
        raise RequestPayloadError("request body shorter than its Content-Length")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _busy(app: web.Application) -> web.Response:
    """503 LimitExceeded(inflight_bytes): nothing of the request was run. The connection closes
    after aiohttp has read (and dropped) the unread body, so the client reads this answer
    instead of a connection reset."""
    _count_rejected(app, "busy")
    error = LimitExceeded("inflight_bytes", "the node holds as many request bytes as it allows; retry later")
    response = _json_response(compute_error_response(error, None), status=503)
    response.headers["Retry-After"] = "1"
    response.force_close()
    return response


def _first_byte(body: bytes) -> bytes:
    """``body.lstrip()[:1]`` without copying the body (``lstrip`` copies a body that starts
    with whitespace)."""
    at = _LEADING_SPACE.match(body).end()  # type: ignore[union-attr]  # "*" always matches
    return body[at : at + 1]


def _answer_room(limits: ServerLimits, budget: _ByteBudget, body: bytes) -> int:
    """Room held for the answer to ``body``, and so its batch answer's cap: a batch's is
    ``max_answer_bytes``, a single call's ``SINGLE_ANSWER_BYTES`` (a larger single answer, a
    huge getRun, takes its excess without waiting); either at most an eighth of the budget, so
    a few answers waiting on clients that do not read them cannot hold all of it."""
    batch = _first_byte(body) == b"["
    return max(1, min(limits.max_answer_bytes if batch else SINGLE_ANSWER_BYTES, budget.total // 8))


async def _run_to_end(executor: Executor, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on ``executor``. If the request is cancelled (its client hung up), a job
    not started yet never runs, and one already running is waited for before the cancellation
    goes on: its memory and its service call stay this request's, counted in the budget and
    the connection caps, until it ends."""
    job = executor.submit(fn, *args)
    done = asyncio.wrap_future(job)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        if not job.cancel():
            await asyncio.wait({done})
        raise


async def _answer(request: web.Request, encoding: str, body: bytes | None, hold: list[int | None],
                  client: object) -> web.StreamResponse:
    """Read (unless done), decode and dispatch the body, and write the answer. ``hold[0]``: the
    bytes of the budget this request holds (kept current: the caller releases them)."""
    app = request.app
    limit = app[_MAX_BODY]
    limits, budget = app[_LIMITS], app[_BUDGET]
    if body is None:
        read = await _read_body(request)
        if isinstance(read, web.StreamResponse):
            return read
        body = read
    if encoding not in _IDENTITY:
        try:
            body = await _run_to_end(app[_DECODER], _decode_body, body, encoding, limit)  # up to ~100 MB of zlib
        except _BodyError as exc:
            if exc.reason == "too_large":
                _count_rejected(app, "too_large")
                return _too_large(limit)
            return _refused(app, exc.reason, "request body could not be read", 400)
    held = hold[0]
    assert held is not None
    answer_room = max(1, min(held - len(body), _answer_room(limits, budget, body)))
    preloaded: list[object] = []
    try:
        if len(body) <= SMALL_BODY_BYTES and _first_byte(body) == b"{" and _POST_TASK in body:
            # A post's checkpoint is read and hashed on the preloading thread, not the service's.
            await _run_to_end(app[_PRELOADER], app[_DISPATCHER].preload, body, preloaded)
        answer = await _run_to_end(app[_EXECUTOR], app[_DISPATCHER].handle, body, answer_room)
    finally:
        # What was read for this request and its post did not take (a hang-up, a refusal).
        if preloaded:
            app[_DISPATCHER].discard_preloaded(preloaded)
    del body
    if answer is None:
        return web.Response(status=204)
    if len(answer) > held:  # a single answer past its room (a huge getRun): taken unasked
        budget.take(len(answer) - held, client)
    else:
        budget.release(held - len(answer), client)
    hold[0] = len(answer)
    # Written here, not after the handler returns, so the answer's bytes stay counted until it
    # has left the node. A client that reads slower than one chunk per read_timeout_s is cut
    # off (a slow link still gets a large answer; one that stopped reading does not hold it).
    response = web.StreamResponse(headers={"Content-Type": _JSON})
    response.content_length = len(answer)
    try:
        async with asyncio.timeout(limits.read_timeout_s):
            await response.prepare(request)
        view = memoryview(answer)
        for start in range(0, len(answer), _WRITE_CHUNK):
            async with asyncio.timeout(limits.read_timeout_s):
                await response.write(view[start:start + _WRITE_CHUNK])
        async with asyncio.timeout(limits.read_timeout_s):
            await response.write_eof()
    except TimeoutError:
        if request.transport is not None:
            request.transport.abort()
        _count_rejected(app, "timeout")
    except ConnectionError:
        pass  # the client went away; aiohttp drops the connection quietly
    return response


async def _health(request: web.Request) -> web.StreamResponse:
    check = request.app[_HEALTH_CHECK]
    failure = None if check is None else check()
    if failure is None:
        return web.Response(body=_HEALTH, content_type=_JSON)
    return _json_response({"ok": False, "error": failure}, status=503)


async def _metrics(request: web.Request) -> web.StreamResponse:
    response = web.Response(body=request.app[_METRICS].render())
    response.headers["Content-Type"] = METRICS_CONTENT_TYPE  # the version parameter is part of the format
    return response


def create_app(
    service: TrainingService,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_batch: int = DEFAULT_MAX_BATCH,
    executor: Executor | None = None,
    metrics: Registry | None = None,
    health_check: Callable[[], str | None] | None = None,
    limits: ServerLimits | None = None,
    serve_artifacts: bool = False,
) -> web.Application:
    """The aiohttp application serving JSON-RPC for ``service`` at ``/``.

    ``executor``: where the dispatcher runs; it must run one job at a time (a
    ``ThreadPoolExecutor(max_workers=1)``) and is then NOT shut down by the app. Without it the
    app creates its own single-thread executor and shuts it down on cleanup.
    ``max_batch``: most requests a JSON-RPC batch may hold (a larger one is one -32600).
    ``metrics``: the registry ``GET /metrics`` renders, to which the app adds the JSON-RPC
    request metrics (a fresh one when omitted); the node adds its own to the same registry.
    ``health_check``: called by ``GET /`` on the event loop (it must be quick and thread-safe);
    a returned reason (a fixed token, never exception text) makes the answer a 503.
    ``limits``: the time and memory bounds (:class:`ServerLimits`; its connection bounds take
    effect only under :func:`start_server`, which owns the connections).
    ``serve_artifacts``: also serve the run artifacts under ``/artifacts/v1`` (``rpc/artifacts.py``;
    ``service`` must then be an :class:`rpc.service.ArtifactSource`); off, those paths are 404
    like any unknown one.
    """
    if type(max_body_bytes) is not int or max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be a positive int, got {max_body_bytes!r}")
    limits = ServerLimits() if limits is None else limits
    registry = Registry() if metrics is None else metrics
    # auto_decompress off: _post decodes Content-Encoding itself, strictly (see _decode_body);
    # handler_args reach every runner's request handlers, start_server's or a test client's.
    app = web.Application(
        client_max_size=max_body_bytes, middlewares=[_catch_all], handler_args={"auto_decompress": False}
    )
    app[_DISPATCHER] = Dispatcher(service, metrics=RpcMetrics(registry, METHODS), max_batch=max_batch,
                                  max_answer_bytes=limits.max_answer_bytes, max_batch_seconds=limits.max_batch_seconds)
    app[_METRICS] = registry
    app[_REJECTED] = registry.counter(
        "tenzro_rpc_rejected_bodies_total",
        "HTTP requests refused before JSON-RPC parsing: too_large (413), unreadable (400: body or "
        "HTTP framing), unsupported_encoding (415), timeout (408: body not received in time), busy "
        "(503: in-flight bytes at their limit), connection_limit (503: connection refused at once).",
        ("reason",),
    ).declare(*((r,) for r in ("too_large", "unreadable", "unsupported_encoding", "timeout", "busy",
                                "connection_limit")))
    budget = _ByteBudget(4 * max_body_bytes if limits.max_inflight_bytes is None else limits.max_inflight_bytes)
    registry.gauge_callback(
        "tenzro_rpc_inflight_bytes", "Bytes held for JSON-RPC requests being read, decoded, queued or answered, and for "
        "artifact downloads (GET /artifacts/v1) being answered.",
        lambda: {(): float(budget.held)},
    )
    app[_LIMITS] = limits
    app[_BUDGET] = budget
    app[_MAX_BODY] = max_body_bytes
    app[_HEALTH_CHECK] = health_check
    # Compressed bodies are decoded on two threads of their own: on the default executor (up
    # to 32 threads on a large machine) clients could run that many ~100 MB decodes at once.
    decoder = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tenzro-rpc-decode")
    app[_DECODER] = decoder
    # postTask's init checkpoint is read on one thread of its own (Dispatcher.preload): one post
    # at a time, and never on the service thread or the decoders'.
    preloader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tenzro-rpc-preload")
    app[_PRELOADER] = preloader

    async def _stop_decoder(_app: web.Application) -> None:
        await asyncio.to_thread(decoder.shutdown, True)
        await asyncio.to_thread(preloader.shutdown, True)

    app.on_cleanup.append(_stop_decoder)
    if executor is None:
        owned = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tenzro-rpc")
        app[_EXECUTOR] = owned

        async def _shutdown(_app: web.Application) -> None:
            # Waits for an in-flight service call to finish, off the event loop.
            await asyncio.to_thread(owned.shutdown, True)

        app.on_cleanup.append(_shutdown)
    else:
        app[_EXECUTOR] = executor
    app.router.add_post("/", _post)
    app.router.add_get("/", _health)
    app.router.add_get("/metrics", _metrics)
    if serve_artifacts:
        # Imported here: rpc.artifacts builds on this module's budget and helpers.
        from rpc.artifacts import add_artifact_routes

        add_artifact_routes(app, service, registry, executor=app[_EXECUTOR], budget=budget, limits=limits)
    return app


@dataclass(frozen=True, slots=True)
class RunningServer:
    """A bound, serving endpoint; ``close()`` stops it gracefully."""

    runner: web.AppRunner
    host: str
    port: int
    """The bound port (the real one when 0 was asked for)."""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    async def close(self) -> None:
        """Stop accepting, let in-flight requests finish, release the executor. Idempotent."""
        await self.runner.cleanup()


def _json_error_server(rejected: Counter, limits: ServerLimits) -> type[web.Server]:
    """An aiohttp ``Server`` that refuses connections past ``limits``' connection bounds (a 503
    with a JSON-RPC error, then closed), and whose connections answer a request aiohttp itself cannot parse
    (broken chunked framing, conflicting Content-Length, oversized headers: before any
    application code runs) with a JSON-RPC error instead of aiohttp's text/plain 400, whose body
    is the parser's exception text and echoes the client's bytes.

    Why this shape: aiohttp has no public hook for those answers; ``RequestHandler.handle_error``
    is the method that writes them, and the handler class is chosen by ``Server.__call__``.
    start_server swaps the runner's server to this subclass, which swaps each new connection's
    handler to a subclass overriding ``handle_error`` (same slots, so the swap is exact).
    tests/rpc/test_server.py checks the answers, so an aiohttp change that bypasses this fails
    there."""

    per_ip: dict[object, int] = {}
    ip_of: dict[RequestHandler, object] = {}

    class JsonErrorHandler(RequestHandler):
        __slots__ = ()

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            ip = _client_ip(transport)
            if len(ip_of) >= limits.max_connections or per_ip.get(ip, 0) >= limits.max_connections_per_ip:
                # Refused before aiohttp sees it (no request task, nothing read): descriptors
                # and memory stay bounded whatever clients hold open; asyncio closes the
                # socket once the answer is out.
                rejected.inc("connection_limit")
                cast(asyncio.Transport, transport).write(_CONNECTION_REFUSED)
                # Half-closed, aborted a moment later: closed at once with the client's request
                # unread, the kernel sends a reset, which can reach the client before the
                # answer does (then it reads "connection reset", not 1800).
                _half_close(transport)
                return
            ip_of[self] = ip
            per_ip[ip] = per_ip.get(ip, 0) + 1
            super().connection_made(transport)

        def handle_error(
            self, request: BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
        ) -> web.StreamResponse:
            # aiohttp's own logging, and its ConnectionError when a response already went out.
            super().handle_error(request, status, exc, message)
            if 400 <= status < 500:
                rejected.inc("unreadable")
                response = _json_response(compute_error_response(InvalidRequest("malformed HTTP request"), None), status)
            else:  # never a 500 (a handler timeout or failure)
                response = _json_response(compute_error_response(InternalError(), None))
            response.force_close()
            return response

    class JsonErrorServer(web.Server):
        def __call__(self) -> RequestHandler:
            handler = super().__call__()
            handler.__class__ = JsonErrorHandler
            return handler

        def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
            super().connection_lost(handler, exc)
            if handler not in ip_of:
                return
            # Counted until its request task is done, as aiohttp counts it: a client that sends
            # an expensive request and hangs up must not open a fresh slot while that request
            # still runs (handlers are cancelled on disconnect, but a service call already on
            # the worker thread finishes).
            task = handler._task_handler
            if task is not None and not task.done():
                task.add_done_callback(lambda _task: forget(handler))
            else:
                forget(handler)

    def forget(handler: RequestHandler) -> None:
        if handler not in ip_of:
            return
        ip = ip_of.pop(handler)
        left = per_ip[ip] - 1
        if left:
            per_ip[ip] = left
        else:
            del per_ip[ip]

    return JsonErrorServer


def _http_answer(status: str, body: bytes) -> bytes:
    """A whole HTTP/1.1 answer that closes its connection (written before aiohttp reads)."""
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {_JSON}\r\nContent-Length: {len(body)}\r\n"
            f"Retry-After: 1\r\nConnection: close\r\n\r\n")
    return head.encode("ascii") + body


_REFUSED_LINGER_S: Final = 1.0
"""How long a refused connection stays half-closed before it is aborted."""

_CONNECTION_REFUSED: Final = _http_answer("503 Service Unavailable", serialize_json(compute_error_response(
    LimitExceeded("connections", "the node has as many open connections as it allows; retry later"), None)))


async def start_server(
    service: TrainingService,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_batch: int = DEFAULT_MAX_BATCH,
    executor: Executor | None = None,
    shutdown_timeout: float = 10.0,
    metrics: Registry | None = None,
    health_check: Callable[[], str | None] | None = None,
    limits: ServerLimits | None = None,
    serve_artifacts: bool = False,
) -> RunningServer:
    """Bind and start serving; ``port=0`` picks a free port (read it from the result)."""
    limits = ServerLimits() if limits is None else limits
    app = create_app(service, max_body_bytes=max_body_bytes, max_batch=max_batch, executor=executor, metrics=metrics,
                     health_check=health_check, limits=limits, serve_artifacts=serve_artifacts)
    # keepalive_timeout is aiohttp's idle close: armed when a connection opens and after each
    # answer, it closes a connection still waiting for a whole request head (aiohttp's default,
    # 3630 s, let idle and byte-at-a-time connections pile up).
    # handler_cancellation: a client that hangs up cancels its request (a budget wait, a call
    # still queued for the worker thread), so abandoned requests do not pile up.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout,
                           keepalive_timeout=limits.idle_timeout_s, handler_cancellation=True)
    await runner.setup()
    assert runner.server is not None  # set up
    runner.server.__class__ = _json_error_server(app[_REJECTED], limits)
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_port = port
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            bound_port = int(address[1])
            break
    log.info("JSON-RPC listening on http://%s:%d/", host, bound_port)
    return RunningServer(runner, host, bound_port)


async def run_server(
    service: TrainingService,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    executor: Executor | None = None,
    stop: asyncio.Event | None = None,
    on_started: Callable[[RunningServer], None] | None = None,
) -> None:
    """Serve until ``stop`` is set or the task is cancelled (Ctrl-C under ``asyncio.run``), then
    shut down cleanly: stop accepting, finish in-flight requests, release the executor."""
    server = await start_server(
        service, host, port, max_body_bytes=max_body_bytes, executor=executor
    )
    try:
        if on_started is not None:
            on_started(server)
        await (stop if stop is not None else asyncio.Event()).wait()
    finally:
        await server.close()
        log.info("JSON-RPC server on %s stopped", server.url)
