"""A transport-agnostic JSON-RPC 2.0 dispatcher for the ``tenzro_training_*`` methods.

What this module is: :class:`Dispatcher`, which turns a request body into a response body
(``handle``: bytes in, bytes or ``None`` out) or a parsed request into a response object
(``handle_obj``: dict/list in, dict/list or ``None`` out). It owns JSON parsing (strict: UTF-8,
duplicate keys, NaN/Infinity and over-long integer literals are parse errors), request validation,
batch semantics, notifications, params parsing (``rpc/params.py``), the call into the
:class:`~rpc.service.TrainingService`, and mapping every failure through the one error table
(``rpc/errors.py``).

What it is NOT: HTTP (``rpc/server.py`` reads bodies, enforces size limits and picks statuses)
or thread management. The dispatcher holds no mutable state (an optional :class:`RpcMetrics`
counts requests, thread-safely), but it calls the service on the caller's thread: the server
runs ``handle`` on one worker thread so service calls never overlap.

Why not jsonrpcserver: measured here, its dispatch costs ~33 us per request even with schema
validation off (this whole dispatcher adds ~4.5 us to a bare json.loads + json.dumps of a getRun),
it answers a batch holding one malformed element with one -32600 for the whole batch, sends
exception text as error data, and would still need every check below done first. The JSON-RPC
2.0 rules fit in this module, so we implement them directly.

Batch semantics (JSON-RPC 2.0 section 6): an empty array is one -32600; every element is handled
on its own (a malformed element gets its own -32600 with id ``null``); notifications (requests
without an ``id`` member) are executed but not answered; a batch of only notifications, like a
single notification, gives ``None``. Invalid requests are always answered, even without an id.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final


from rpc.errors import (
    INVALID_REQUEST,
    PARSE_ERROR,
    InternalError,
    InvalidParams,
    InvalidRequest,
    LimitExceeded,
    MethodNotFound,
    ParseError,
    compute_error_object,
    compute_error_response,
    get_error_entry,
)
from rpc.params import (
    CancelTaskParams,
    EnrollTrainerParams,
    FinalizeRoundParams,
    GetReceiptParams,
    GetRunParams,
    ListRunsParams,
    PostTaskParams,
    SubmitOuterGradientParams,
)
from rpc.metrics import RpcMetrics
from rpc.service import TrainingService
from tenzro_training.jsontext import MAX_JSON_NESTING, compute_json_values_bound, is_json_depth_ok, serialize_json
from tenzro_training.errors import TenzroError

__all__ = [
    "DEFAULT_MAX_ANSWER_BYTES", "DEFAULT_MAX_BATCH", "DEFAULT_MAX_BATCH_SECONDS", "MAX_INT_DIGITS", "MAX_NESTING", "MAX_VALUES", "METHODS", "Dispatcher", "JsonText",
    "Method", "parse_json", "serialize_json",
]

log = logging.getLogger(__name__)

MAX_INT_DIGITS: Final = 100
"""Integer literals longer than this (sign included) are parse errors: no param needs more than
78 digits (uint256), and Python's int parsing is quadratic in the digit count."""

MAX_NESTING: Final = MAX_JSON_NESTING
"""Deepest array/object nesting accepted. Checked BEFORE json parsing: py_ecc (imported through
eth_account) raises the interpreter's recursion limit to 100000 process-wide, and json's C
scanner then overflows the C stack (segfault) on ~60000 nested brackets instead of raising
RecursionError. A spec needs < 30 levels including the envelope."""

MAX_VALUES: Final = 2_000_000
"""Most JSON values (object keys included) one body may hold, bounded before parsing by
counting separators and openers (``jsontext.compute_json_values_bound``) in any body of at
least this many bytes (a shorter one cannot hold more). Why: parsed objects cost ~80 bytes per
value; a 64 MiB body of ``{"":0},`` (~100 KB gzipped) took 2.2 GiB and 9 s of the service
thread to parse before its batch of 9.6M requests was refused (fuzzing probe, 2026-11-26).
2M values are ~160 MB at worst; a full batch of 1000 submissions holds ~16k, the largest spec
(256 KiB of JSON) ~130k."""

_REQUEST_MEMBERS: Final = frozenset({"jsonrpc", "method", "params", "id"})
_ABSENT: Final = object()


# --- strict JSON ------------------------------------------------------------------------------


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ParseError(f"duplicate object key {key[:64]!r}")
            seen.add(key)
    return obj


def _parse_int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS:
        raise ParseError(f"integer literal longer than {MAX_INT_DIGITS} characters")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to inf
        raise ParseError("number out of the finite double range")
    return value


def _reject_constant(name: str) -> Any:
    raise ParseError(f"{name} is not JSON")


_DECODER: Final = json.JSONDecoder(
    object_pairs_hook=_object_without_duplicates,
    parse_int=_parse_int,
    parse_float=_parse_float,
    parse_constant=_reject_constant,
)


def _check_nesting(raw: bytes) -> None:
    """Raise ParseError when ``raw`` could nest deeper than :data:`MAX_NESTING` (see jsontext)."""
    if not is_json_depth_ok(raw, MAX_NESTING):
        raise ParseError(f"nesting deeper than {MAX_NESTING} levels")


def parse_json(raw: bytes | str) -> Any:
    """Parse one strict JSON value; raise :class:`ParseError` for anything else.

    Bytes must be UTF-8 (no BOM). Duplicate object keys, ``NaN``/``Infinity``, numbers that
    overflow a double, integer literals over :data:`MAX_INT_DIGITS` characters, more than
    :data:`MAX_VALUES` values and nesting deeper than :data:`MAX_NESTING` are all parse errors.
    """
    if isinstance(raw, (bytes, bytearray, memoryview)):
        data = bytes(raw)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError("body is not UTF-8", exc.start) from None
    else:
        text = raw
        try:
            data = raw.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ParseError("text holds a lone surrogate", exc.start) from None
    if len(data) >= MAX_VALUES and compute_json_values_bound(data) > MAX_VALUES:
        raise ParseError(f"more than {MAX_VALUES} JSON values")
    _check_nesting(data)
    try:
        return _DECODER.decode(text)
    except ParseError:
        raise
    except json.JSONDecodeError as exc:
        # exc.msg is one of the json module's fixed phrases; it never quotes the input.
        raise ParseError(f"invalid JSON ({exc.msg})", exc.pos) from None
    except RecursionError:
        raise ParseError("nesting too deep") from None
    except (ValueError, TypeError):  # e.g. int() over the interpreter's digit limit
        raise ParseError("invalid JSON") from None


@dataclass(frozen=True, slots=True)
class JsonText:
    """A method result already serialized: compact ASCII JSON text of one value (what
    :func:`serialize_json` writes). The dispatcher puts the text into the response as it is.
    Why: getRun is polled by every trainer and syncer, and serializing its ~14 KB view was most
    of its cost; the service renders each immutable run state once (``get_run_json``)."""

    text: bytes


def _serialize_response(response: dict[str, Any]) -> bytes:
    """One response object; a :class:`JsonText` result is spliced in as it is."""
    result = response.get("result")
    if type(result) is JsonText:
        return b'{"jsonrpc":"2.0","result":' + result.text + b',"id":' + serialize_json(response["id"]) + b"}"
    return serialize_json(response)


# --- methods ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Method:
    """One JSON-RPC method: how to parse its params and how to call the service with them."""

    parse: Callable[[Mapping[str, object]], Any]
    call: Callable[[TrainingService, Any], Any]


POST_TASK: Final = "tenzro_training_postTask"

METHODS: Final[Mapping[str, Method]] = {
    POST_TASK: Method(
        PostTaskParams.parse, lambda s, p: s.post_task(p.spec, p.signature)
    ),
    "tenzro_training_listRuns": Method(
        ListRunsParams.parse, lambda s, p: s.list_runs(p.status, p.offset, p.limit)
    ),
    "tenzro_training_getRun": Method(GetRunParams.parse, lambda s, p: JsonText(s.get_run_json(p.task_id))),
    "tenzro_training_getReceipt": Method(
        GetReceiptParams.parse, lambda s, p: JsonText(s.get_receipt_json(p.task_id))
    ),
    "tenzro_training_enrollTrainer": Method(
        EnrollTrainerParams.parse,
        lambda s, p: s.enroll_trainer(p.task_id, p.did, p.address, p.stake, p.signature),
    ),
    "tenzro_training_submitOuterGradient": Method(
        SubmitOuterGradientParams.parse,
        lambda s, p: s.submit_outer_gradient(
            p.task_id, p.round, p.fragment, p.payload, p.payload_hash, p.signature
        ),
    ),
    "tenzro_training_finalizeRound": Method(
        FinalizeRoundParams.parse, lambda s, p: s.finalize_round(p.task_id, p.round, p.signature)
    ),
    "tenzro_training_cancelTask": Method(
        CancelTaskParams.parse, lambda s, p: s.cancel_task(p.task_id, p.signature)
    ),
}
"""Every method the node answers, by its exact JSON-RPC name."""


def _invalid(request_id: object, reason: str) -> dict[str, Any]:
    return compute_error_response(InvalidRequest(reason), request_id)


def _task_of(params: object) -> str:
    """The call's ``task_id`` for a log line, JSON-quoted (it is the client's text), or ``-``."""
    task_id = params.get("task_id") if type(params) is dict else None
    return json.dumps(task_id[:80]) if type(task_id) is str else "-"


def _is_valid_id(value: object) -> bool:
    kind = type(value)  # bool is not an id, and neither is a float
    return kind is str or kind is int or value is None


# --- the dispatcher ---------------------------------------------------------------------------


DEFAULT_MAX_BATCH: Final = 1000
"""Most requests one batch may hold (as geth's BatchRequestLimit). Why a cap: every element is
answered, on the one service thread, so without one a 2 MiB body of ``[1,1,...]`` drew a 180 MiB
response and ~1 GiB of memory (a 64 MiB body, tens of GiB) while every other call waited."""

DEFAULT_MAX_BATCH_SECONDS: Final = 2.0
"""Service-thread time one batch may take before its remaining elements are refused. Why: 8
clients each sending one 95 KB batch of 1000 listRuns kept every other call waiting 35 s."""

DEFAULT_MAX_ANSWER_BYTES: Final = 32 * 1024 * 1024
"""Most bytes of a batch's answer before its remaining elements are refused (LimitExceeded).
Why: an answer waits whole in the node's memory until the client reads it; 1000 listRuns of
500 runs each was a ~300 MB answer per 95 KB request, held for as long as the client did not
read it (RPC concurrency probe)."""


REFUSAL_LOG_INTERVAL_S: Final = 10.0
"""A non-public refusal of the same method and code (an unexpected exception: of the same class)
is logged at most this often."""


class Dispatcher:
    """JSON-RPC 2.0 over a :class:`~rpc.service.TrainingService`; see the module docstring."""

    __slots__ = ("_service", "_methods", "_metrics", "_max_batch", "_max_answer_bytes", "_max_batch_seconds",
                 "_refusals_logged")

    def __init__(
        self,
        service: TrainingService,
        *,
        methods: Mapping[str, Method] = METHODS,
        metrics: RpcMetrics | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
        max_batch_seconds: float = DEFAULT_MAX_BATCH_SECONDS,
    ) -> None:
        if type(max_batch) is not int or max_batch < 1:
            raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
        if type(max_answer_bytes) is not int or max_answer_bytes < 1:
            raise ValueError(f"max_answer_bytes must be a positive int, got {max_answer_bytes!r}")
        self._service = service
        self._methods = methods
        self._metrics = metrics
        self._max_batch = max_batch
        self._max_answer_bytes = max_answer_bytes
        self._refusals_logged: dict[tuple[str, int, str], tuple[float, int]] = {}  # see _log_refusal
        if type(max_batch_seconds) not in (int, float) or not 0 < max_batch_seconds < float("inf"):
            raise ValueError(f"max_batch_seconds must be a positive number, got {max_batch_seconds!r}")
        self._max_batch_seconds = max_batch_seconds

    def handle(self, raw: bytes | str, max_answer_bytes: int | None = None) -> bytes | None:
        """Answer one request body; ``None`` when nothing must be sent (notifications only).

        A batch's answer is built element by element; once it holds more than
        ``max_answer_bytes``, or the batch has held the service thread for more than
        ``max_batch_seconds``, the remaining elements are not run and each gets a
        :class:`LimitExceeded` error (notifications among them get nothing): the answer is
        bounded by that cap plus one element's answer, and one batch cannot keep every other
        call waiting for long. ``max_answer_bytes`` overrides the dispatcher's cap for this body
        (the server passes the room it holds for the answer)."""
        cap = self._max_answer_bytes if max_answer_bytes is None else max_answer_bytes
        try:
            obj = parse_json(raw)
        except ParseError as exc:
            if self._metrics is not None:
                self._metrics.record(None, PARSE_ERROR, None)
            return serialize_json(compute_error_response(exc, None))
        if type(obj) is not list:
            out = self._handle_one(obj)
            return None if out is None else self._serialize_one(out)
        refused = self._refuse_batch(obj)
        if refused is not None:
            return serialize_json(refused)
        parts: list[bytes] = []
        size = 0
        stop_at = time.perf_counter() + self._max_batch_seconds
        for request in obj:
            if size > cap:
                response = self._refuse_element(request, "batch_answer_bytes", f"the batch's answer passed {cap} bytes")
            elif time.perf_counter() > stop_at:
                response = self._refuse_element(request, "batch_seconds",
                                                f"the batch held the service for over {self._max_batch_seconds:g} s")
            else:
                response = self._handle_one(request)
            if response is not None:
                part = self._serialize_one(response)
                size += len(part) + 1
                parts.append(part)
        return b"[" + b",".join(parts) + b"]" if parts else None

    def preload(self, raw: bytes, tokens: list[object] | None = None) -> None:
        """Let the service prepare, off its thread, the postTask a single-request body holds:
        :meth:`rpc.service.Preloading.preload_post_task` (read the init checkpoint), when the
        service has it. The server calls this on a thread of its own before :meth:`handle`;
        only what ``handle`` itself would accept is passed on. Never raises: whatever is wrong
        with the body is ``handle``'s to answer."""
        preload = getattr(self._service, "preload_post_task", None)
        if preload is None:
            return
        try:
            request = parse_json(raw)
            if (type(request) is not dict or request.get("method") != POST_TASK or request.get("jsonrpc") != "2.0"
                    or not request.keys() <= _REQUEST_MEMBERS
                    or ("id" in request and not _is_valid_id(request["id"]))):
                return  # handle refuses it before the call: nothing to read
            params = request.get("params")
            if type(params) is not dict:
                return
            parsed = PostTaskParams.parse(params)
        except TenzroError:
            return
        token = preload(parsed.spec, parsed.signature)
        if token is not None and tokens is not None:
            tokens.append(token)

    def discard_preloaded(self, tokens: list[object]) -> None:
        """Drop, once the request has ended, what :meth:`preload` read for it and its post did not
        take (rpc.service.Preloading.discard_preloaded)."""
        discard = getattr(self._service, "discard_preloaded", None)
        if discard is not None:
            for token in tokens:
                discard(token)

    def handle_obj(self, obj: object) -> dict[str, Any] | list[dict[str, Any]] | None:
        """Answer one parsed request or batch; ``None`` when nothing must be sent. In process,
        so no answer-size cap: nothing waits in a socket."""
        if type(obj) is list:
            refused = self._refuse_batch(obj)
            out = refused if refused is not None else [r for r in map(self._handle_one, obj) if r is not None] or None
        else:
            out = self._handle_one(obj)
        for response in out if type(out) is list else [] if out is None else [out]:
            if type(response.get("result")) is JsonText:
                response["result"] = json.loads(response["result"].text)
        return out

    def _refuse_batch(self, batch: list[object]) -> dict[str, Any] | None:
        """The one error answering a whole batch (empty, or too many elements), else None."""
        if batch and len(batch) <= self._max_batch:
            return None
        if self._metrics is not None:
            self._metrics.record(None, INVALID_REQUEST, None)
        if not batch:
            return _invalid(None, "empty batch")
        return _invalid(None, f"batch of {len(batch)} requests; at most {self._max_batch}")  # none runs

    def _refuse_element(self, request: object, limit: str, why: str) -> dict[str, Any] | None:
        """A batch element left unrun because the batch passed one of its limits."""
        if type(request) is dict and "id" not in request:
            return None  # a notification: never answered
        request_id = request.get("id") if type(request) is dict else None
        name = request.get("method") if type(request) is dict else None
        error = LimitExceeded(limit, f"{why} before this request; it was not run")
        if self._metrics is not None:
            self._metrics.record(name if type(name) is str else None, get_error_entry(LimitExceeded).code, None)
        return compute_error_response(error, request_id if _is_valid_id(request_id) else None)

    def _handle_one(self, request: object) -> dict[str, Any] | None:
        response, name, code, seconds = self._answer_one(request)
        if self._metrics is not None:
            self._metrics.record(name, code, seconds)
        return response

    def _answer_one(self, request: object) -> tuple[dict[str, Any] | None, object, int, float | None]:
        """(response or None, the method name for metrics, outcome code, seconds in the call)."""
        if type(request) is not dict:
            return _invalid(None, "a request must be a JSON object"), None, INVALID_REQUEST, None
        request_id = request.get("id", _ABSENT)
        if request_id is not _ABSENT and not _is_valid_id(request_id):
            return _invalid(None, "id must be a string, an integer or null"), None, INVALID_REQUEST, None
        answer_id = None if request_id is _ABSENT else request_id
        if request.get("jsonrpc") != "2.0":
            return _invalid(answer_id, 'jsonrpc must be "2.0"'), None, INVALID_REQUEST, None
        name = request.get("method")
        if type(name) is not str:
            return _invalid(answer_id, "method must be a string"), None, INVALID_REQUEST, None
        if not request.keys() <= _REQUEST_MEMBERS:
            return _invalid(answer_id, "unknown request member"), None, INVALID_REQUEST, None
        params = request.get("params", _ABSENT)
        if params is not _ABSENT and type(params) is not dict and type(params) is not list:
            return _invalid(answer_id, "params must be an object or an array"), None, INVALID_REQUEST, None

        started = time.perf_counter()
        try:
            result = self._call(name, params)
        except TenzroError as exc:
            error = compute_error_object(exc)
            if not get_error_entry(type(exc)).public:
                # The client gets only the table's message (the reason may name node-local files):
                # the operator is the one who can see why, so the node says it here.
                self._log_refusal(name, error["code"], str(exc))
            elif log.isEnabledFor(logging.DEBUG):
                # The client has the whole reason; an operator asked why a trainer was refused
                # needs the run it was about (observability probe: no log line named it).
                log.debug("JSON-RPC %s refused with %d for task %s: %s", json.dumps(name[:128]), error["code"],
                          _task_of(params), json.dumps(str(error["message"])[:500]))
        except Exception as exc:
            # Unexpected: a bug or an environment fault. The client learns only that it happened.
            error = compute_error_object(InternalError())
            self._log_refusal(name, error["code"], "internal error", exc=exc)
        else:
            seconds = time.perf_counter() - started
            if request_id is _ABSENT:
                return None, name, 0, seconds
            return {"jsonrpc": "2.0", "result": result, "id": request_id}, name, 0, seconds
        seconds = time.perf_counter() - started
        if request_id is _ABSENT:
            return None, name, error["code"], seconds  # a notification's failure is not answered
        return {"jsonrpc": "2.0", "error": error, "id": request_id}, name, error["code"], seconds

    def _log_refusal(self, name: str, code: int, reason: str, *, exc: BaseException | None = None) -> None:
        """Log a non-public refusal for the operator, the same (method, code) at most once per
        ``REFUSAL_LOG_INTERVAL_S`` with the count held back: on a full disk every write call
        logged its 1700 into that disk (200 submissions, 201 lines), and a funded sponsor could
        log one line per post naming a missing checkpoint (observability probe). ``exc``: an
        unexpected exception, logged with its traceback at ERROR, at the same bounded rate (a
        client able to trigger a bug would get one traceback per request). Keys are bounded:
        the methods served times the error table's codes times the exception classes of the
        program (the class is part of the key: every unexpected exception has code -32603, and
        a client repeating one known bug kept any other bug of that method from being logged)."""
        kind = type(exc).__qualname__ if exc is not None else ""
        key = (name if name in self._methods else "unknown", code, kind)
        now = time.monotonic()
        last, held = self._refusals_logged.get(key, (-math.inf, 0))
        if now - last < REFUSAL_LOG_INTERVAL_S:
            self._refusals_logged[key] = (last, held + 1)
            return
        self._refusals_logged[key] = (now, 0)
        more = f" ({held} more like it in the last {now - last:.0f} s)" if held else ""
        if exc is not None:
            log.error("internal error in JSON-RPC method %s%s", name[:128], more, exc_info=exc)
        else:
            log.warning("JSON-RPC %s refused with %d: %s%s", name[:128], code, reason[:1000], more)

    def _call(self, name: str, params: object) -> Any:
        method = self._methods.get(name)
        if method is None:
            raise MethodNotFound(name)
        if params is _ABSENT:
            params = {}
        elif type(params) is list:
            raise InvalidParams(None, "positional params are not supported; pass an object")
        return method.call(self._service, method.parse(params))  # type: ignore[arg-type]

    @staticmethod
    def _serialize_one(response: dict[str, Any]) -> bytes:
        """One response's text; a result that is not JSON-able becomes -32603 (only its own)."""
        try:
            return _serialize_response(response)
        except (TypeError, ValueError, RecursionError):
            log.error("JSON-RPC result for id %r is not JSON-serializable", response.get("id"))
            return serialize_json(compute_error_response(InternalError(), response.get("id")))
