"""The JSON-RPC error table: every exception class the node can raise -> one stable error code.

What this module is: the transport's own errors (:class:`RpcError` and the five JSON-RPC 2.0
standard errors), :data:`ERROR_TABLE` (exception class -> code, message policy) and
:func:`compute_error_object`, which turns any exception into the spec's ``{code, message, data}``
object. ``docs/rpc.md`` lists every code; a test checks the two agree.

What it is NOT: the dispatcher (``rpc/dispatcher.py`` decides *when* an error is answered) or the
place where errors are raised (the protocol core, the ledger, storage and the node service raise
their own).

Lookup walks the exception's MRO, so a subclass that is not in the table (``PayloadNonFinite``,
``AmountOutOfRange``, a new ``RunError`` leaf) answers with its nearest listed ancestor's code;
``data.type`` always names the exception's own class. Any exception outside the ``TenzroError``
tree is an internal error: code -32603, message ``"internal error"``, ``data.type``
``"InternalError"``. Its text is never sent (the dispatcher logs it with the traceback).

``data`` holds ``type`` plus the exception's *safe public attributes*: instance attributes not
starting with ``_`` whose values are ints, bools, finite floats, short strings, short byte strings (sent as ``0x``
hex) or short int sequences. Strings that look like filesystem paths or file URIs are dropped, and
classes whose attributes or text may carry node-local paths (storage errors, CheckpointError) send
neither. Ints outside the IEEE-754 safe range (|n| > 2**53 - 1) are sent as decimal strings so a
JavaScript client cannot silently round an attoTNZO amount.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from storage.interface import KeyFormatError, SchemaVersionError, StorageError
from tenzro_training.run import InvalidRunArgument, NotSponsor, NotSyncer, StragglerWindowOpen
from tenzro_training.addresses import AddressError
from tenzro_training.auth import AuthError, MalformedMessage, SignatureInvalid, WrongSigner
from tenzro_training.errors import (
    AggregationError,
    CheckpointError,
    ElectionError,
    EncodingError,
    EnrollmentConflict,
    Equivocation,
    FragmentError,
    GossipIgnore,
    GossipReject,
    InvalidState,
    LateSubmission,
    MerkleError,
    NotEnrolled,
    PayloadError,
    PayloadUnavailable,
    QuorumNotReached,
    RoundMismatch,
    RunError,
    RunFull,
    SpecError,
    StakeTooLow,
    TooManyRuns,
    TaskExists,
    TenzroError,
    UnknownTask,
    VRFError,
)
from tenzro_training.ledger import (
    BondNotFound,
    EscrowExists,
    EscrowNotFound,
    InsufficientBalance,
    InsufficientEscrow,
    InvalidLedgerInput,
    LedgerError,
    SponsorMismatch,
    SupplyOverflow,
)

__all__ = [
    "ERROR_TABLE",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "ErrorEntry",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "LimitExceeded",
    "MethodNotFound",
    "ParseError",
    "RequestTooLarge",
    "RpcError",
    "compute_error_object",
    "compute_error_response",
    "get_codes",
    "get_error_entry",
]

# JSON-RPC 2.0 section 5.1 standard codes.
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603

MAX_MESSAGE_CHARS: Final = 512
"""Longer exception texts are cut (they may quote client input back)."""
MAX_DATA_STR_CHARS: Final = 256
MAX_DATA_BYTES: Final = 128
MAX_DATA_SEQUENCE: Final = 256
SAFE_INT: Final = 2**53 - 1

# A string that names a node-local file: absolute POSIX path, home path, Windows drive, file URI.
_PATH_LIKE = re.compile(r"^(?:/|~|[A-Za-z]:[\\/]|file:)", re.IGNORECASE)


# --- the transport's own errors -------------------------------------------------------------


class RpcError(TenzroError):
    """Root of the errors the JSON-RPC transport itself raises."""


class ParseError(RpcError, ValueError):
    """The body is not one JSON value we accept: invalid JSON, not UTF-8, a duplicate object
    key, NaN/Infinity, a non-finite number or an integer literal longer than the limit.
    ``reason`` says which; ``position`` is the character offset where it was found, if known."""

    def __init__(self, reason: str, position: int | None = None) -> None:
        self.reason = reason
        self.position = position
        where = f" at character {position}" if position is not None else ""
        super().__init__(f"parse error: {reason}{where}")


class InvalidRequest(RpcError, ValueError):
    """A request object is not a valid JSON-RPC 2.0 request; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"invalid request: {reason}")


class RequestTooLarge(InvalidRequest):
    """The HTTP body exceeds the server's limit of ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"request body exceeds {limit} bytes")


class MethodNotFound(RpcError, LookupError):
    """No method named ``method`` (cut to 128 characters)."""

    def __init__(self, method: str) -> None:
        self.method = method[:128]
        super().__init__(f"method not found: {self.method}")


class InvalidParams(RpcError, ValueError):
    """A method's params are invalid. ``param`` names the offending one (``None`` when the
    params as a whole are wrong, e.g. positional); ``reason`` says what is wrong."""

    def __init__(self, param: str | None, reason: str) -> None:
        self.param = None if param is None else param[:64]
        self.reason = reason
        where = f"{self.param}: " if self.param is not None else ""
        super().__init__(f"invalid params: {where}{reason}")


class LimitExceeded(RpcError):
    """The node refused work it could not take on without breaking one of its resource limits;
    ``limit`` names which (``inflight_bytes``: request bodies being read, decoded, queued or
    answered; ``batch_answer_bytes``: a batch's answer so far). Nothing was executed for the
    request (or batch element) refused: retry later, or send a smaller batch."""

    def __init__(self, limit: str, reason: str) -> None:
        self.limit = limit
        self.reason = reason
        super().__init__(f"limit exceeded ({limit}): {reason}")


class InternalError(RpcError):
    """Stand-in for an unexpected exception: its text and type are never sent."""

    def __init__(self) -> None:
        super().__init__("internal error")


# --- the table ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ErrorEntry:
    """How one exception class (and its unlisted subclasses) is answered."""

    exc_type: type[BaseException]
    """The class this row maps; subclasses fall back to it through the MRO."""
    code: int
    """The stable JSON-RPC error code."""
    message: str
    """Sent as ``message`` when the text is not public (or empty)."""
    public: bool = True
    """True: ``str(exc)`` is sent as the message and safe attributes go into ``data``. False for
    classes whose text or attributes may name node-local paths or other internals."""


def _e(exc_type: type[BaseException], code: int, message: str, public: bool = True) -> ErrorEntry:
    return ErrorEntry(exc_type, code, message, public)


# Codes are stable: never renumber a row, only append. Application codes are positive, grouped by
# family in blocks of 100, so they can never collide with JSON-RPC's reserved -32768..-32000.
ERROR_TABLE: Final[tuple[ErrorEntry, ...]] = (
    # JSON-RPC 2.0 standard errors.
    _e(ParseError, PARSE_ERROR, "parse error"),
    _e(InvalidRequest, INVALID_REQUEST, "invalid request"),
    _e(MethodNotFound, METHOD_NOT_FOUND, "method not found"),
    _e(InvalidParams, INVALID_PARAMS, "invalid params"),
    _e(InternalError, INTERNAL_ERROR, "internal error", public=False),
    # Any other TenzroError (e.g. a new class not yet listed): a generic application error. Its
    # text is not sent because nobody has reviewed it for internals yet.
    _e(TenzroError, 1000, "request failed", public=False),
    # Task specs, addresses, checkpoints.
    _e(SpecError, 1100, "invalid task spec"),
    _e(CheckpointError, 1101, "init checkpoint cannot be loaded or does not match its hash",
       public=False),  # its uri and reason may name node-local files
    _e(AddressError, 1102, "invalid address"),
    # Authentication (EIP-712 signatures).
    _e(AuthError, 1200, "authentication failed"),
    _e(MalformedMessage, 1201, "malformed signed message"),
    _e(SignatureInvalid, 1202, "invalid signature"),
    _e(WrongSigner, 1203, "signed by the wrong key"),
    # Run lifecycle.
    _e(RunError, 1300, "call not valid for the run's state"),
    _e(UnknownTask, 1301, "unknown task"),
    _e(TaskExists, 1302, "task already exists"),
    _e(InvalidState, 1303, "invalid state for this call"),
    _e(RoundMismatch, 1304, "round mismatch"),
    _e(LateSubmission, 1305, "late submission"),
    _e(NotEnrolled, 1306, "not enrolled"),
    _e(EnrollmentConflict, 1307, "enrollment conflict"),
    _e(RunFull, 1308, "run is full"),
    _e(StakeTooLow, 1309, "stake too low"),
    _e(QuorumNotReached, 1310, "quorum not reached"),
    _e(Equivocation, 1311, "equivocation"),
    _e(PayloadUnavailable, 1312, "payload unavailable"),
    _e(InvalidRunArgument, 1313, "invalid run argument"),
    _e(NotSponsor, 1314, "not the sponsor"),
    _e(NotSyncer, 1315, "not the current syncer"),
    _e(StragglerWindowOpen, 1316, "straggler window still open"),
    _e(TooManyRuns, 1317, "too many open runs"),
    # Payloads, fragments, records, aggregation.
    _e(PayloadError, 1400, "invalid payload"),
    _e(FragmentError, 1401, "invalid fragmentation"),
    _e(EncodingError, 1402, "invalid encoding"),
    _e(AggregationError, 1403, "aggregation failed"),
    # Election, VRF, Merkle, gossip.
    _e(VRFError, 1500, "invalid VRF input"),
    _e(ElectionError, 1501, "invalid election input"),
    _e(MerkleError, 1502, "invalid Merkle input"),
    _e(GossipReject, 1503, "gossip message rejected"),
    _e(GossipIgnore, 1504, "gossip message ignored"),
    # Ledger (attoTNZO balances, escrow, stakes).
    _e(LedgerError, 1600, "ledger operation failed"),
    _e(InvalidLedgerInput, 1601, "invalid ledger input"),
    _e(SupplyOverflow, 1602, "supply overflow"),
    _e(InsufficientBalance, 1603, "insufficient balance"),
    _e(InsufficientEscrow, 1604, "insufficient escrow"),
    _e(EscrowNotFound, 1605, "escrow not found"),
    _e(EscrowExists, 1606, "escrow exists"),
    _e(SponsorMismatch, 1607, "sponsor mismatch"),
    _e(BondNotFound, 1608, "bond not found"),
    # Storage: node-side faults; their texts name data directories, so only the type is sent.
    _e(StorageError, 1700, "storage error", public=False),
    _e(SchemaVersionError, 1701, "storage schema version not supported", public=False),
    _e(KeyFormatError, 1702, "storage key format error", public=False),
    # Node resource limits (the request was not executed; retry later or send less).
    _e(LimitExceeded, 1800, "limit exceeded"),
)

_BY_TYPE: Final[dict[type[BaseException], ErrorEntry]] = {e.exc_type: e for e in ERROR_TABLE}
if len(_BY_TYPE) != len(ERROR_TABLE) or len({e.code for e in ERROR_TABLE}) != len(ERROR_TABLE):
    raise RuntimeError("rpc.errors.ERROR_TABLE lists a class or a code twice")

_INTERNAL: Final = _BY_TYPE[InternalError]
# Memo of the MRO walk per concrete class (bounded by the number of exception classes).
_resolved: dict[type[BaseException], ErrorEntry] = {}


def get_error_entry(exc_type: type[BaseException]) -> ErrorEntry:
    """The table row answering ``exc_type``: its own, its nearest listed ancestor's, or the
    internal-error row for classes outside the TenzroError tree."""
    entry = _resolved.get(exc_type)
    if entry is None:
        entry = next((_BY_TYPE[k] for k in exc_type.__mro__ if k in _BY_TYPE), _INTERNAL)
        _resolved[exc_type] = entry
    return entry


def _safe_int(value: int) -> int | str:
    return value if -SAFE_INT <= value <= SAFE_INT else str(value)


def _safe_value(value: object) -> object:
    """The JSON form of one attribute value, or ``None`` when it must not be sent."""
    kind = type(value)
    if kind is bool:
        return value
    if kind is int:
        return _safe_int(value)  # type: ignore[arg-type]
    if kind is float:  # a finite bound such as PayloadValueOutOfRange.limit (JSON has no NaN/inf)
        return value if math.isfinite(value) else None  # type: ignore[arg-type]
    if kind is str:
        text: str = value  # type: ignore[assignment]
        if len(text) > MAX_DATA_STR_CHARS or _PATH_LIKE.match(text):
            return None
        return text
    if kind is bytes:
        raw: bytes = value  # type: ignore[assignment]
        return "0x" + raw.hex() if len(raw) <= MAX_DATA_BYTES else None
    if kind in (tuple, list):
        items: tuple[Any, ...] | list[Any] = value  # type: ignore[assignment]
        if len(items) <= MAX_DATA_SEQUENCE and all(type(i) is int for i in items):
            return [_safe_int(i) for i in items]
    return None


def _compute_data(exc: BaseException) -> dict[str, object]:
    data: dict[str, object] = {"type": type(exc).__name__}
    for name, value in vars(exc).items():
        if name.startswith("_") or name == "type":
            continue
        safe = _safe_value(value)
        if safe is not None:
            data[name] = safe
    return data


def compute_error_object(exc: BaseException) -> dict[str, Any]:
    """The JSON-RPC error object ``{code, message, data}`` for ``exc`` (any exception).

    Never raises and never includes the text, attributes or class name of an exception outside
    the TenzroError tree, nor of a table row marked not public.
    """
    entry = get_error_entry(type(exc))
    if entry is _INTERNAL or not entry.public:
        name = "InternalError" if entry is _INTERNAL else type(exc).__name__
        return {"code": entry.code, "message": entry.message, "data": {"type": name}}
    try:
        message = str(exc)[:MAX_MESSAGE_CHARS] or entry.message
        data = _compute_data(exc)
    except Exception:  # a broken __str__ or __dict__ in some subclass: fall back to the row
        message, data = entry.message, {"type": type(exc).__name__}
    return {"code": entry.code, "message": message, "data": data}


def compute_error_response(exc: BaseException, request_id: object) -> dict[str, Any]:
    """A complete JSON-RPC error response for ``exc`` answering ``request_id``."""
    return {"jsonrpc": "2.0", "error": compute_error_object(exc), "id": request_id}


def get_codes() -> Mapping[str, int]:
    """Class name -> code for every row (used by docs and tests)."""
    return {e.exc_type.__name__: e.code for e in ERROR_TABLE}
