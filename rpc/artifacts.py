"""Run artifacts over HTTP: the ``GET /artifacts/v1/runs/{task_id}/...`` routes of the JSON-RPC
server (docs/rpc.md "Run artifacts over HTTP").

What this module is: :func:`add_artifact_routes` (registered by ``rpc.server.create_app`` when
asked to serve artifacts), the three handlers, the parsing of their path segments
(:func:`parse_index`, :func:`parse_trainer`), the exception -> HTTP status table
(:func:`get_artifact_status`). Files are opened and their digests remembered by
``storage.files`` (``open_regular_file``, ``FILE_DIGESTS``, shared with the node's posts).

What it is NOT: the rule of which payloads are public (``tenzro_training.artifacts``) or where
anything is stored: the service (``rpc.service.ArtifactSource``) answers that on its one thread.

Threads, as for JSON-RPC calls: every service call (run lookup, store reads) runs on the server's
one service executor, one at a time, since the service's in-memory state is not thread-safe.
Hashing and reading files and payloads runs on two threads of this module's own (a checkpoint of
gigabytes takes seconds to hash: on the service thread it would hold every other call and the
clock tick; on the event loop it would stall every connection). Memory: an answer held in memory
(a payload, a model built from the store) counts in the server's in-flight byte budget like any
answer until it is written; a file is streamed in 1 MiB chunks and holds one chunk of it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Final, TypeVar

from aiohttp import web

from rpc.dispatcher import serialize_json
from rpc.errors import InternalError, LimitExceeded, compute_error_response
from rpc.metrics import Counter, Registry
from rpc.server import (
    _WRITE_CHUNK,
    SINGLE_ANSWER_BYTES,
    ServerLimits,
    _ByteBudget,
    _client_ip,
    _run_to_end,
)
from rpc.service import ArtifactSource
from storage.files import FILE_DIGESTS, FileDigests, NotReadable, open_regular_file
from storage.interface import StorageError
from tenzro_training.errors import (
    CheckpointError,
    InvalidState,
    PayloadPruned,
    PayloadUnavailable,
    TenzroError,
    UnknownTask,
)
from tenzro_training.run import InvalidRunArgument

__all__ = [
    "ARTIFACT_KINDS",
    "ARTIFACT_OUTCOMES",
    "PREFIX",
    "add_artifact_routes",
    "get_artifact_status",
    "parse_index",
    "parse_trainer",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

PREFIX: Final = "/artifacts/v1/runs/"
_TASK: Final = "{task_id:[A-Za-z0-9._-]{1,128}}"
"""The spec's task id grammar, in the route: an id outside it (``a%2Fb``) names no resource and
gets the server's 404 for an unknown path. Matched against the percent-decoded segment, so "."
and ".." (also as ``%2E%2E``) are plain ids: aiohttp does not fold dot segments of the request
line, and nothing here builds a path from a task id (the service looks it up in its tables)."""

ARTIFACT_KINDS: Final = ("payload", "model", "checkpoint")
ARTIFACT_OUTCOMES: Final = ("served", "not_modified", "malformed", "unknown_task", "invalid_state", "unavailable",
                            "pruned", "checkpoint_error", "busy", "failed", "aborted")

_IMMUTABLE: Final = "public, max-age=31536000, immutable"
_OCTETS: Final = "application/octet-stream"
_U64_MAX: Final = 2**64 - 1
_U32_MAX: Final = 2**32 - 1
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,19}")
_TRAINER = re.compile(r"0x[0-9a-fA-F]{40}")


# --- pure pieces --------------------------------------------------------------------------------


def parse_index(task_id: str, name: str, text: str, maximum: int) -> int:
    """A round or fragment path segment: canonical decimal (no sign, no leading zero: one URL per
    artifact, so caches hold each once) in ``0..maximum``; InvalidRunArgument otherwise (the
    segment itself is not echoed: it is client text)."""
    if _DECIMAL.fullmatch(text) is None or int(text) > maximum:
        raise InvalidRunArgument(task_id, name, f"expected a decimal integer in 0..{maximum}")
    return int(text)


def parse_trainer(task_id: str, text: str) -> bytes:
    """A trainer path segment: ``0x`` + 40 hex digits in any case (no EIP-55 check: a URL is not
    typed by hand), as 20 bytes; InvalidRunArgument otherwise."""
    if _TRAINER.fullmatch(text) is None:
        raise InvalidRunArgument(task_id, "trainer", "expected 0x + 40 hex digits")
    return bytes.fromhex(text[2:])


_STATUS: Final[tuple[tuple[type[BaseException], int, str], ...]] = (
    (InvalidRunArgument, 400, "malformed"),
    (UnknownTask, 404, "unknown_task"),
    (InvalidState, 409, "invalid_state"),
    (PayloadPruned, 410, "pruned"),
    (PayloadUnavailable, 404, "unavailable"),
    (CheckpointError, 404, "checkpoint_error"),
    (LimitExceeded, 503, "busy"),
)
"""First match wins (PayloadPruned before its parent). Anything else, a damaged store
(StorageError) or a bug, is 503 ``failed``: never a 500, and never a 200 whose body a careless
client could take for the artifact."""


def get_artifact_status(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and metric outcome answering ``exc``."""
    for kind, status, outcome in _STATUS:
        if isinstance(exc, kind):
            return status, outcome
    return 503, "failed"


def _etag(digest: bytes) -> str:
    return f'"{digest.hex()}"'


def _is_cached(if_none_match: str | None, digest: bytes) -> bool:
    """Whether an ``If-None-Match`` names this digest's ETag (or ``*``): the client holds it."""
    if not if_none_match:
        return False
    tags = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
    return "*" in tags or _etag(digest) in tags


# --- files ----------------------------------------------------------------------------------------


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


async def _open_off_loop(files: Executor, fn: Callable[..., tuple[int, T]], *args: object) -> tuple[int, T]:
    """``fn(*args)``, which opens a file and returns its descriptor first, on ``files``. As
    ``rpc.server._run_to_end`` (a request cancelled while the open runs waits for it), but a
    descriptor opened for a request that is gone is closed, not leaked."""
    job = files.submit(fn, *args)
    done = asyncio.wrap_future(job)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        if not job.cancel():
            await asyncio.wait({done})
            if not done.cancelled() and done.exception() is None:
                os.close(done.result()[0])
        raise


# --- the routes -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Answer:
    """A 200's headers and body: ``data`` in memory, or ``size`` bytes of the open file ``fd``."""

    digest: bytes
    headers: dict[str, str]
    data: bytes | None = None
    fd: int | None = None
    size: int = 0
    taken: int = 0
    """Budget bytes taken for ``data`` beyond the request's initial room (released with it)."""


@dataclass(slots=True)
class _Context:
    source: ArtifactSource
    executor: Executor
    """The service's one thread."""
    files: ThreadPoolExecutor
    """Hashing and reading (payload digests, files)."""
    budget: _ByteBudget
    limits: ServerLimits
    requests: Counter
    digests: FileDigests = field(default_factory=lambda: FILE_DIGESTS)
    """Checked digests of files (the process's, which a post of the checkpoint filled already)."""
    checkpoint_warned_at: float = -1e9
    """When the last "checkpoint not served" warning was logged (monotonic s)."""
    checkpoint_unlogged: int = 0
    """Such refusals since that line, not logged one by one."""


_CONTEXT: Final = web.AppKey("rpc_artifacts", _Context)

Produce = Callable[[web.Request, _Context, int, object], Awaitable[_Answer]]


def _error_response(exc: BaseException) -> web.Response:
    status, _outcome = get_artifact_status(exc)
    body = compute_error_response(exc if isinstance(exc, TenzroError) else InternalError(), None)
    response = web.Response(body=serialize_json(body), status=status, content_type="application/json")
    # An error may not last (the round commits, the file comes back): no cache keeps it.
    response.headers["Cache-Control"] = "no-store"
    if status == 503:
        response.headers["Retry-After"] = "1"
    return response


async def _serve(request: web.Request, kind: str, produce: Produce) -> web.StreamResponse:
    """Hold a single answer's room in the budget, produce the answer, write it; every failure
    is a JSON-RPC-shaped error with its status (``get_artifact_status``)."""
    ctx = request.app[_CONTEXT]
    client = _client_ip(request.transport)
    room = max(1, min(SINGLE_ANSWER_BYTES, ctx.budget.total // 8))
    held = await ctx.budget.acquire(room, ctx.limits.read_timeout_s, client)
    if held is None:
        ctx.requests.inc(kind, "busy")
        return _error_response(LimitExceeded("inflight_bytes", "the node holds as many request bytes as it allows; "
                                                               "retry later"))
    answer: _Answer | None = None
    try:
        try:
            answer = await produce(request, ctx, held, client)
        except Exception as exc:  # noqa: BLE001 - every failure is answered, none is a 500
            status, outcome = get_artifact_status(exc)
            if status == 503 and outcome != "busy":
                log.warning("artifact %s %s answered 503: %s", kind, request.path, exc,
                            exc_info=not isinstance(exc, TenzroError))
            ctx.requests.inc(kind, outcome)
            return _error_response(exc)
        if _is_cached(request.headers.get("If-None-Match"), answer.digest):
            ctx.requests.inc(kind, "not_modified")
            kept = {k: v for k, v in answer.headers.items() if k in ("ETag", "Cache-Control")}
            return web.Response(status=304, headers=kept)
        response, outcome = await _write(request, ctx, answer)
        ctx.requests.inc(kind, outcome)
        return response
    except asyncio.CancelledError:  # the client hung up (aiohttp cancels its handler)
        ctx.requests.inc(kind, "aborted")
        raise
    finally:
        if answer is not None:
            if answer.fd is not None:
                os.close(answer.fd)
            if answer.taken:
                ctx.budget.release(answer.taken, client)
        ctx.budget.release(held, client)


async def _write(request: web.Request, ctx: _Context, answer: _Answer) -> tuple[web.StreamResponse, str]:
    """Write ``answer`` (nothing of the body for HEAD) here, not after the handler returns, so
    its bytes stay counted until they left; each step within ``read_timeout_s``: a client that
    stops reading is cut off, as for JSON-RPC answers. The response and the metric outcome."""
    timeout = ctx.limits.read_timeout_s
    size = len(answer.data) if answer.data is not None else answer.size
    response = web.StreamResponse(headers=answer.headers)
    response.content_length = size
    try:
        async with asyncio.timeout(timeout):
            await response.prepare(request)
        if request.method != "HEAD":
            if answer.data is not None:
                view = memoryview(answer.data)
                for start in range(0, size, _WRITE_CHUNK):
                    async with asyncio.timeout(timeout):
                        await response.write(view[start:start + _WRITE_CHUNK])
            else:
                assert answer.fd is not None  # an _Answer holds data or a file
                for start in range(0, size, _WRITE_CHUNK):
                    chunk = await _run_to_end(ctx.files, os.pread, answer.fd, min(_WRITE_CHUNK, size - start), start)
                    if not chunk:  # the file shrank after it was hashed: the length sent cannot be met
                        raise ConnectionResetError("artifact file shrank while it was sent")
                    async with asyncio.timeout(timeout):
                        await response.write(chunk)
        async with asyncio.timeout(timeout):
            await response.write_eof()
    except (TimeoutError, ConnectionError, OSError):
        if request.transport is not None:
            request.transport.abort()
        return response, "aborted"
    return response, "served"


def _hash_headers(name: str, value: bytes, digest: bytes) -> dict[str, str]:
    return {"Content-Type": _OCTETS, name: "0x" + value.hex(), "ETag": _etag(digest), "Cache-Control": _IMMUTABLE}


def _in_memory(ctx: _Context, data: bytes, held: int, client: object) -> int:
    """Take budget room for an answer held in memory beyond the request's ``held`` room, or
    refuse it (LimitExceeded, 503): its size was known only once read, and unlike a getRun's
    excess (a few MB at most) a payload or a model may be large enough that clients asking for
    many at once would grow the node past its budget."""
    excess = len(data) - held
    if excess <= 0:
        return 0
    if not ctx.budget.try_take(excess, client, held):
        raise LimitExceeded("inflight_bytes", "the node holds as many answer bytes as it allows; retry later")
    return excess


async def _produce_payload(request: web.Request, ctx: _Context, held: int, client: object) -> _Answer:
    info = request.match_info
    task_id = info["task_id"]
    round_ = parse_index(task_id, "round", info["round"], _U64_MAX)
    fragment = parse_index(task_id, "fragment", info["fragment"], _U32_MAX)
    trainer = parse_trainer(task_id, info["trainer"])
    artifact = await _run_to_end(ctx.executor, ctx.source.get_payload_artifact, task_id, round_, fragment, trainer)
    # Counted (or refused) as soon as it is in memory, before it waits for a hashing thread:
    # those two threads may be busy streaming files, and payloads queued there would otherwise
    # pile up outside the budget.
    taken = _in_memory(ctx, artifact.data, held, client)
    try:
        digest = await _run_to_end(ctx.files, _sha256, artifact.data)
        if digest != artifact.payload_hash:
            raise StorageError(f"the stored payload {artifact.payload_hash.hex()} of {task_id} does not hash to its key")
    except BaseException:
        if taken:
            ctx.budget.release(taken, client)
        raise
    headers = _hash_headers("X-Tenzro-Payload-Hash", digest, digest)
    return _Answer(digest=digest, headers=headers, data=artifact.data, taken=taken)


async def _produce_model(request: web.Request, ctx: _Context, held: int, client: object) -> _Answer:
    task_id = request.match_info["task_id"]
    artifact = await _run_to_end(ctx.executor, ctx.source.get_model_artifact, task_id)
    if artifact.path is not None:
        try:
            fd, info = await _open_off_loop(ctx.files, partial(open_regular_file, follow_symlinks=False), artifact.path)
        except NotReadable:
            pass  # not written yet (the node retries a failed write): built from the store below
        else:
            try:
                digest = await _run_to_end(ctx.files, ctx.digests.digest, fd, info)
            except BaseException:
                os.close(fd)
                raise
            headers = _hash_headers("X-Tenzro-Model-Hash", artifact.final_model_hash, digest)
            return _Answer(digest=digest, headers=headers, fd=fd, size=info.st_size)
    data = await _run_to_end(ctx.executor, ctx.source.export_final_model, task_id)
    taken = _in_memory(ctx, data, held, client)  # before the hash, as for a payload
    try:
        digest = await _run_to_end(ctx.files, _sha256, data)
    except BaseException:
        if taken:
            ctx.budget.release(taken, client)
        raise
    headers = _hash_headers("X-Tenzro-Model-Hash", artifact.final_model_hash, digest)
    return _Answer(digest=digest, headers=headers, data=data, taken=taken)


def _open_checkpoint(ctx: _Context, path: Path, expected: bytes, max_bytes: int) -> tuple[int, int]:
    """The open checkpoint and its size, once it hashes to ``expected`` (CheckpointError,
    private: its reason is logged, never sent)."""
    try:
        fd, info = open_regular_file(path, follow_symlinks=False)
    except NotReadable as exc:
        raise CheckpointError("", exc.reason) from None
    try:
        try:
            digest = ctx.digests.digest(fd, info, max_bytes)
        except NotReadable as exc:
            raise CheckpointError("", exc.reason) from None
        if digest != expected:
            raise CheckpointError("", f"sha256 is now 0x{digest.hex()}, the spec says 0x{expected.hex()}")
        return fd, info.st_size
    except BaseException:
        os.close(fd)
        raise


CHECKPOINT_WARNING_INTERVAL_S: Final = 10.0
"""At most one "checkpoint not served" warning per this many seconds (the refusals are all
counted in the metric): any client can GET a broken checkpoint in a loop, and one WARNING line
per request would let it flood the node's log."""


def _warn_checkpoint(ctx: _Context, task_id: str, reason: str) -> None:
    """Log why a checkpoint is not served (the operator must learn it: the client is told
    nothing), once per CHECKPOINT_WARNING_INTERVAL_S, saying how many went unlogged since."""
    now = time.monotonic()
    if now - ctx.checkpoint_warned_at < CHECKPOINT_WARNING_INTERVAL_S:
        ctx.checkpoint_unlogged += 1
        return
    more = f" ({ctx.checkpoint_unlogged} more refusals since the last such line)" if ctx.checkpoint_unlogged else ""
    log.warning("the init checkpoint of %s is not served: %s%s", task_id, reason, more)
    ctx.checkpoint_warned_at, ctx.checkpoint_unlogged = now, 0


async def _produce_checkpoint(request: web.Request, ctx: _Context, held: int, client: object) -> _Answer:
    task_id = request.match_info["task_id"]
    artifact = await _run_to_end(ctx.executor, ctx.source.get_checkpoint_artifact, task_id)
    try:
        fd, size = await _open_off_loop(ctx.files, _open_checkpoint, ctx, artifact.path, artifact.sha256,
                                        artifact.max_bytes)
    except CheckpointError as exc:
        _warn_checkpoint(ctx, task_id, exc.reason)
        raise
    headers = _hash_headers("X-Tenzro-Checkpoint-Sha256", artifact.sha256, artifact.sha256)
    return _Answer(digest=artifact.sha256, headers=headers, fd=fd, size=size)


async def _payload(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "payload", _produce_payload)


async def _model(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "model", _produce_model)


async def _checkpoint(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "checkpoint", _produce_checkpoint)


def add_artifact_routes(app: web.Application, source: ArtifactSource, registry: Registry, *, executor: Executor,
                        budget: _ByteBudget, limits: ServerLimits) -> None:
    """Register the three GET routes (aiohttp adds HEAD) on ``app``, their metric, and the
    threads that hash and read (shut down on the app's cleanup)."""
    if not isinstance(source, ArtifactSource):
        raise TypeError(f"serving artifacts needs an rpc.service.ArtifactSource, got {type(source).__name__}")
    requests = registry.counter(
        "tenzro_rpc_artifact_requests_total",
        "GET/HEAD /artifacts/v1 requests by kind (payload, model, checkpoint) and outcome: served, not_modified "
        "(304), malformed (400), unknown_task (404), invalid_state (409), unavailable (404), pruned (410), "
        "checkpoint_error (404), busy (503), failed (503: a damaged store or a bug, logged), aborted (the client "
        "went away or stopped reading).",
        ("kind", "outcome"),
    ).declare(*((k, o) for k in ARTIFACT_KINDS for o in ARTIFACT_OUTCOMES))
    files = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tenzro-rpc-artifacts")
    app[_CONTEXT] = _Context(source=source, executor=executor, files=files, budget=budget, limits=limits,
                             requests=requests)

    async def _stop(_app: web.Application) -> None:
        await asyncio.to_thread(files.shutdown, True)

    app.on_cleanup.append(_stop)
    base = PREFIX + _TASK
    app.router.add_get(base + "/payloads/{round}/{fragment}/{trainer}", _payload)
    app.router.add_get(base + "/model", _model)
    app.router.add_get(base + "/checkpoint", _checkpoint)
