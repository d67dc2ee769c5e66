"""JSON-RPC conformance suite, run against every transport.

:class:`RpcConformance` holds every protocol-level case (JSON-RPC 2.0 rules, params, the error
table). A transport joins by subclassing it and implementing :meth:`RpcConformance.call_raw`
(send these bytes, return the parsed JSON answer or ``None`` when nothing came back) and the
``service`` fixture. ``tests/rpc/test_dispatcher.py`` runs it in process, ``test_server.py``
against a live aiohttp server.

:class:`FakeService` is a scriptable :class:`rpc.service.TrainingService`: it records calls,
echoes its (JSON-ified) arguments, or raises / returns what a test sets.
"""

from __future__ import annotations

import base64
import json
import threading
from typing import Any

import pytest

from rpc.errors import (
    ERROR_TABLE,
    InternalError,
    InvalidParams,
    InvalidRequest,
    LimitExceeded,
    MethodNotFound,
    ParseError,
    RequestTooLarge,
)
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
    TaskExists,
    TenzroError,
    UnknownTask,
    VRFError,
    TooManyRuns,
)
from tenzro_training.jsontext import serialize_json
from tenzro_training.ledger import (
    AmountOutOfRange,
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
from tenzro_training.payload import PayloadNonFinite, PayloadTooLarge, PayloadValueOutOfRange

_ECHO = object()

SIG_HEX = "0x" + "ab" * 64 + "1b"
SIG = bytes.fromhex(SIG_HEX[2:])
HASH_HEX = "0x" + "cd" * 32
ADDR = "0x" + "12" * 20
DID = "did:tenzro:trainer:alice"
PAYLOAD = bytes(range(256)) * 4 + b"\x01"  # 1025 bytes: the base64 ends in "=="
PAYLOAD_B64 = base64.b64encode(PAYLOAD).decode()
SPEC = {"task_id": "t1", "min_throughput": 1.5, "architecture": {"metadata": {"k": [1, 2]}}}


def _jsonable(value: object) -> object:
    return "0x" + value.hex() if isinstance(value, bytes) else value


class FakeService:
    """A TrainingService double. Not thread-safe by design: the transport must serialize calls,
    and ``max_active`` shows whether it did."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.error: BaseException | None = None
        self.result: object = _ECHO
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.active = 0
        self.max_active = 0
        self._count_lock = threading.Lock()

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    def _call(self, name: str, **kwargs: Any) -> Any:
        with self._count_lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            self.calls.append((name, kwargs))
            self.entered.set()
            if self.gate is not None:
                self.gate.wait(timeout=10)
            if self.error is not None:
                raise self.error
            if self.result is not _ECHO:
                return self.result
            return {"method": name, **{k: _jsonable(v) for k, v in kwargs.items()}}
        finally:
            with self._count_lock:
                self.active -= 1

    def post_task(self, spec: dict[str, Any], signature: bytes) -> Any:
        return self._call("post_task", spec=spec, signature=signature)

    def list_runs(self, status: str | None, offset: int, limit: int) -> Any:
        return self._call("list_runs", status=status, offset=offset, limit=limit)

    def get_run(self, task_id: str) -> Any:
        return self._call("get_run", task_id=task_id)

    def get_run_json(self, task_id: str) -> bytes:
        return serialize_json(self.get_run(task_id))  # a non-JSON result raises: -32603, as a node's would

    def get_receipt(self, task_id: str) -> Any:
        return self._call("get_receipt", task_id=task_id)

    def get_receipt_json(self, task_id: str) -> bytes:
        return serialize_json(self.get_receipt(task_id))

    def enroll_trainer(
        self, task_id: str, did: str, address: str, stake: int, signature: bytes
    ) -> Any:
        return self._call(
            "enroll_trainer", task_id=task_id, did=did, address=address, stake=stake,
            signature=signature,
        )

    def submit_outer_gradient(
        self, task_id: str, round: int, fragment: int, payload: bytes | None,
        payload_hash: bytes | None, signature: bytes,
    ) -> Any:
        return self._call(
            "submit_outer_gradient", task_id=task_id, round=round, fragment=fragment,
            payload=payload, payload_hash=payload_hash, signature=signature,
        )

    def finalize_round(self, task_id: str, round: int, signature: bytes) -> Any:
        return self._call("finalize_round", task_id=task_id, round=round, signature=signature)

    def cancel_task(self, task_id: str, signature: bytes) -> Any:
        return self._call("cancel_task", task_id=task_id, signature=signature)


def req(method: str, params: object = None, id: object = 1, **extra: Any) -> dict[str, Any]:
    """A request object; ``params=None`` leaves params out, ``id=...`` (Ellipsis) leaves id out."""
    out: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        out["params"] = params
    if id is not ...:
        out["id"] = id
    out.update(extra)
    return out


def get_run(task_id: object = "t1", id: object = 1) -> dict[str, Any]:
    return req("tenzro_training_getRun", {"task_id": task_id}, id)


def submit_params(**override: object) -> dict[str, object]:
    params: dict[str, object] = {
        "task_id": "t1", "round": 3, "fragment": 7, "payload": PAYLOAD_B64, "signature": SIG_HEX,
    }
    params.update(override)
    return {k: v for k, v in params.items() if v is not ...}


def enroll_params(**override: object) -> dict[str, object]:
    params: dict[str, object] = {
        "task_id": "t1", "did": DID, "address": ADDR, "stake": "1000", "signature": SIG_HEX,
    }
    params.update(override)
    return {k: v for k, v in params.items() if v is not ...}


class _NewRunError(RunError):
    """A RunError leaf not in the table: must fall back to RunError's code."""

    def __init__(self) -> None:
        self.detail = 7
        super().__init__("t1", "something new")


# (exception raised by the service, expected code, expected data (exact unless ``subset``)).
ERROR_SAMPLES: list[tuple[BaseException, int, dict[str, Any]]] = [
    (ParseError("x", 3), -32700, {"type": "ParseError", "reason": "x", "position": 3}),
    (InvalidRequest("why"), -32600, {"type": "InvalidRequest", "reason": "why"}),
    (RequestTooLarge(10), -32600, {"type": "RequestTooLarge", "reason": "request body exceeds 10 bytes", "limit": 10}),
    (MethodNotFound("m"), -32601, {"type": "MethodNotFound", "method": "m"}),
    (InvalidParams("p", "r"), -32602, {"type": "InvalidParams", "param": "p", "reason": "r"}),
    (InternalError(), -32603, {"type": "InternalError"}),
    (TenzroError("new /var/secret"), 1000, {"type": "TenzroError"}),
    (SpecError("architecture.dtype", "bad"), 1100,
     {"type": "SpecError", "path": "architecture.dtype", "reason": "bad"}),
    (CheckpointError("file:///var/secret/ckpt", "cannot open /var/secret/ckpt"), 1101,
     {"type": "CheckpointError"}),
    (AddressError("0xzz", "not hex"), 1102, {"type": "AddressError", "value": "0xzz", "reason": "not hex"}),
    (AuthError("no"), 1200, {"type": "AuthError"}),
    (MalformedMessage("stake", "too big"), 1201, {"type": "MalformedMessage", "field": "stake", "reason": "too big"}),
    (SignatureInvalid("high s"), 1202, {"type": "SignatureInvalid", "reason": "high s"}),
    (WrongSigner(ADDR, "0x" + "34" * 20), 1203,
     {"type": "WrongSigner", "expected": ADDR, "actual": "0x" + "34" * 20}),
    (RunError("t1", "x"), 1300, {"type": "RunError", "task_id": "t1"}),
    (_NewRunError(), 1300, {"type": "_NewRunError", "task_id": "t1", "detail": 7}),
    (UnknownTask("t1"), 1301, {"type": "UnknownTask", "task_id": "t1"}),
    (TaskExists("t1"), 1302, {"type": "TaskExists", "task_id": "t1"}),
    (InvalidState("t1", "Training", "enroll"), 1303,
     {"type": "InvalidState", "task_id": "t1", "status": "Training", "action": "enroll"}),
    (RoundMismatch("t1", 3, 2), 1304, {"type": "RoundMismatch", "task_id": "t1", "expected": 3, "got": 2}),
    (LateSubmission("t1", 2, 5), 1305, {"type": "LateSubmission", "task_id": "t1", "round": 2, "fragment": 5}),
    (NotEnrolled("t1", ADDR), 1306, {"type": "NotEnrolled", "task_id": "t1", "address": ADDR}),
    (EnrollmentConflict("t1", ADDR), 1307, {"type": "EnrollmentConflict", "task_id": "t1", "address": ADDR}),
    (RunFull("t1", 8), 1308, {"type": "RunFull", "task_id": "t1", "trainer_count": 8}),
    (StakeTooLow("t1", 10**20, 5), 1309,
     {"type": "StakeTooLow", "task_id": "t1", "minimum": "100000000000000000000", "got": 5}),
    (QuorumNotReached("t1", 1, (6, 5), 6), 1310,
     {"type": "QuorumNotReached", "task_id": "t1", "round": 1, "counts": [6, 5], "quorum": 6}),
    (Equivocation("t1", 1, 2, ADDR), 1311,
     {"type": "Equivocation", "task_id": "t1", "round": 1, "fragment": 2, "address": ADDR}),
    (PayloadUnavailable("t1", HASH_HEX), 1312,
     {"type": "PayloadUnavailable", "task_id": "t1", "payload_hash": HASH_HEX}),
    (InvalidRunArgument("t1", "outcomes", "bad"), 1313,
     {"type": "InvalidRunArgument", "task_id": "t1", "field": "outcomes", "reason": "bad"}),
    (NotSponsor("t1", "0xabc", "0xdef"), 1314,
     {"type": "NotSponsor", "task_id": "t1", "address": "0xabc", "sponsor": "0xdef"}),
    (NotSyncer("t1", "0xabc", "0xdef"), 1315,
     {"type": "NotSyncer", "task_id": "t1", "address": "0xabc", "expected": "0xdef"}),
    (StragglerWindowOpen("t1", 2, 1000), 1316,
     {"type": "StragglerWindowOpen", "task_id": "t1", "round": 2, "straggler_deadline_ms": 1000}),
    (TooManyRuns("t1", "sponsor", 64), 1317, {"type": "TooManyRuns", "task_id": "t1", "scope": "sponsor", "limit": 64}),
    (PayloadError("bad"), 1400, {"type": "PayloadError"}),
    (PayloadNonFinite("w", 3), 1400, {"type": "PayloadNonFinite", "name": "w", "count": 3}),
    (PayloadValueOutOfRange("w", 2, 1e6), 1400, {"type": "PayloadValueOutOfRange", "name": "w", "count": 2, "limit": 1e6}),
    (PayloadValueOutOfRange("w", 2, float("inf")), 1400, {"type": "PayloadValueOutOfRange", "name": "w", "count": 2}),
    (PayloadTooLarge("payload", 11, 10), 1400,
     {"type": "PayloadTooLarge", "what": "payload", "size": 11, "limit": 10}),
    (FragmentError("f"), 1401, {"type": "FragmentError"}),
    (EncodingError("e"), 1402, {"type": "EncodingError"}),
    (AggregationError("a"), 1403, {"type": "AggregationError"}),
    (VRFError("v"), 1500, {"type": "VRFError"}),
    (ElectionError("e"), 1501, {"type": "ElectionError"}),
    (MerkleError("m"), 1502, {"type": "MerkleError"}),
    (GossipReject("g"), 1503, {"type": "GossipReject"}),
    (GossipIgnore("g"), 1504, {"type": "GossipIgnore"}),
    (LedgerError("l"), 1600, {"type": "LedgerError"}),
    (InvalidLedgerInput("amount", "bad"), 1601, {"type": "InvalidLedgerInput", "field": "amount", "reason": "bad"}),
    (AmountOutOfRange("stake", -1), 1601,
     {"type": "AmountOutOfRange", "field": "stake", "value": -1, "reason": "-1 is not a uint256 int"}),
    (SupplyOverflow(2**255, 2**255), 1602,
     {"type": "SupplyOverflow", "minted": str(2**255), "amount": str(2**255)}),
    (InsufficientBalance(b"\x11" * 20, 10, 5), 1603,
     {"type": "InsufficientBalance", "address": "0x" + "11" * 20, "needed": 10, "available": 5}),
    (InsufficientEscrow("t1", 10, 5), 1604, {"type": "InsufficientEscrow", "task_id": "t1", "needed": 10, "available": 5}),
    (EscrowNotFound("t1"), 1605, {"type": "EscrowNotFound", "task_id": "t1"}),
    (EscrowExists("t1"), 1606, {"type": "EscrowExists", "task_id": "t1"}),
    (SponsorMismatch("t1", b"\x01" * 20, b"\x02" * 20), 1607,
     {"type": "SponsorMismatch", "task_id": "t1", "expected": "0x" + "01" * 20, "actual": "0x" + "02" * 20}),
    (BondNotFound("t1", b"\x03" * 20), 1608, {"type": "BondNotFound", "task_id": "t1", "trainer": "0x" + "03" * 20}),
    (StorageError("cannot lock /var/secret/db"), 1700, {"type": "StorageError"}),
    (SchemaVersionError("/var/secret/db", 3, 1), 1701, {"type": "SchemaVersionError"}),
    (KeyFormatError("bad key under /var/secret", b"k"), 1702, {"type": "KeyFormatError"}),
    (LimitExceeded("inflight_bytes", "busy"), 1800, {"type": "LimitExceeded", "limit": "inflight_bytes", "reason": "busy"}),
]

# Exceptions outside the TenzroError tree: all must look the same on the wire.
UNEXPECTED = [
    RuntimeError("boom /var/secret/file.py line 3"),
    KeyError("secret"),
    ValueError("secret value"),
    ZeroDivisionError("division by zero secret"),
    OSError(2, "No such file", "/var/secret/x"),
]

INTERNAL = {"code": -32603, "message": "internal error", "data": {"type": "InternalError"}}

# (params for submitOuterGradient, the param the error must name)
BAD_SUBMIT_PARAMS: list[tuple[dict[str, object], str | None]] = [
    (submit_params(task_id=...), "task_id"),
    (submit_params(round=...), "round"),
    (submit_params(signature=...), "signature"),
    (submit_params(extra=1), "extra"),
    (submit_params(task_id=5), "task_id"),
    (submit_params(task_id=""), "task_id"),
    (submit_params(task_id="a" * 129), "task_id"),
    (submit_params(task_id="bad id"), "task_id"),
    (submit_params(round=True), "round"),
    (submit_params(round=1.0), "round"),
    (submit_params(round="1"), "round"),
    (submit_params(round=-1), "round"),
    (submit_params(round=2**64), "round"),
    (submit_params(fragment=2**32), "fragment"),
    (submit_params(fragment=None), "fragment"),
    (submit_params(payload=...), "payload"),
    (submit_params(payload_hash=HASH_HEX), "payload"),
    (submit_params(payload=None, payload_hash=None), "payload"),
    (submit_params(payload=""), "payload"),
    (submit_params(payload=PAYLOAD_B64.rstrip("=")), "payload"),
    (submit_params(payload=PAYLOAD_B64[:-3] + "R=="), "payload"),
    (submit_params(payload=PAYLOAD_B64[:8] + "\n" + PAYLOAD_B64[8:]), "payload"),
    (submit_params(payload=PAYLOAD_B64.replace("+", "-").replace("/", "_")), "payload"),
    (submit_params(payload="QUJD=QUJD"), "payload"),
    (submit_params(payload="é"), "payload"),
    (submit_params(payload=[1]), "payload"),
    (submit_params(payload=..., payload_hash="0x" + "cd" * 31), "payload_hash"),
    (submit_params(payload=..., payload_hash="cd" * 32), "payload_hash"),
    (submit_params(payload=..., payload_hash="0x" + "zz" * 32), "payload_hash"),
    (submit_params(signature="0x" + "ab" * 64), "signature"),
    (submit_params(signature="0x" + "ab" * 66), "signature"),
    (submit_params(signature="ab" * 65), "signature"),
    (submit_params(signature="0x" + "g" * 130), "signature"),
    (submit_params(signature=None), "signature"),
]

BAD_ENROLL_PARAMS: list[tuple[dict[str, object], str]] = [
    (enroll_params(stake="-1"), "stake"),
    (enroll_params(stake="01"), "stake"),
    (enroll_params(stake="1.5"), "stake"),
    (enroll_params(stake=" 1"), "stake"),
    (enroll_params(stake="0x10"), "stake"),
    (enroll_params(stake=str(2**256)), "stake"),
    (enroll_params(stake=2**256), "stake"),
    (enroll_params(stake=-1), "stake"),
    (enroll_params(stake=1.0), "stake"),
    (enroll_params(stake=True), "stake"),
    (enroll_params(stake=None), "stake"),
    (enroll_params(did="alice"), "did"),
    (enroll_params(did="did:tenzro:Trainer:alice"), "did"),
    (enroll_params(did=1), "did"),
    (enroll_params(address="0x" + "12" * 19), "address"),
    (enroll_params(address="12" * 20), "address"),
    (enroll_params(address=None), "address"),
    (enroll_params(did=...), "did"),
]

BAD_OTHER_PARAMS: list[tuple[str, dict[str, object], str]] = [
    ("tenzro_training_postTask", {"spec": [], "signature": SIG_HEX}, "spec"),
    ("tenzro_training_postTask", {"spec": "{}", "signature": SIG_HEX}, "spec"),
    ("tenzro_training_postTask", {"spec": None, "signature": SIG_HEX}, "spec"),
    ("tenzro_training_postTask", {"signature": SIG_HEX}, "spec"),
    ("tenzro_training_postTask", {"spec": SPEC}, "signature"),
    ("tenzro_training_listRuns", {"status": "training"}, "status"),
    ("tenzro_training_listRuns", {"status": 1}, "status"),
    ("tenzro_training_listRuns", {"offset": -1}, "offset"),
    ("tenzro_training_listRuns", {"offset": "0"}, "offset"),
    ("tenzro_training_listRuns", {"offset": 2**53}, "offset"),  # echoed: beyond what JSON clients read exactly
    ("tenzro_training_listRuns", {"limit": 0}, "limit"),
    ("tenzro_training_listRuns", {"limit": 501}, "limit"),
    ("tenzro_training_listRuns", {"limit": False}, "limit"),
    ("tenzro_training_listRuns", {"page": 1}, "page"),
    ("tenzro_training_getRun", {}, "task_id"),
    ("tenzro_training_getRun", {"task_id": None}, "task_id"),
    ("tenzro_training_getRun", {"task_id": "t1", "verbose": True}, "verbose"),
    ("tenzro_training_getReceipt", {"task_id": ["t1"]}, "task_id"),
    ("tenzro_training_finalizeRound", {"task_id": "t1", "round": "0", "signature": SIG_HEX}, "round"),
    ("tenzro_training_finalizeRound", {"task_id": "t1", "signature": SIG_HEX}, "round"),
    ("tenzro_training_cancelTask", {"task_id": "t1"}, "signature"),
    ("tenzro_training_cancelTask", {"task_id": "t1", "signature": SIG_HEX, "reason": "x"}, "reason"),
]

# Requests that are not valid JSON-RPC 2.0 request objects, and the id the answer must carry.
INVALID_REQUESTS: list[tuple[object, object]] = [
    (1, None),
    ("tenzro_training_getRun", None),
    (None, None),
    (True, None),
    ({}, None),
    ({"jsonrpc": "2.0", "id": 1}, 1),
    ({"method": "tenzro_training_getRun", "params": {"task_id": "t1"}, "id": 1}, 1),
    ({"jsonrpc": "1.0", "method": "tenzro_training_getRun", "id": "a"}, "a"),
    ({"jsonrpc": 2.0, "method": "tenzro_training_getRun", "id": 1}, 1),
    ({"jsonrpc": "2.0", "method": 1, "params": "bar", "id": 1}, 1),
    ({"jsonrpc": "2.0", "method": None, "id": 1}, 1),
    (req("tenzro_training_getRun", "t1"), 1),
    (req("tenzro_training_getRun", 5), 1),
    (req("tenzro_training_getRun", {"task_id": "t1"}, id=1.5), None),
    (req("tenzro_training_getRun", {"task_id": "t1"}, id=1.0), None),
    (req("tenzro_training_getRun", {"task_id": "t1"}, id=True), None),
    (req("tenzro_training_getRun", {"task_id": "t1"}, id={"a": 1}), None),
    (req("tenzro_training_getRun", {"task_id": "t1"}, id=[1]), None),
    (req("tenzro_training_getRun", {"task_id": "t1"}, extra=1), 1),
    # Invalid requests are answered even without an id.
    ({"jsonrpc": "2.0", "method": 5}, None),
]

PARSE_ERRORS: list[bytes] = [
    b"",
    b"   ",
    b'{"jsonrpc": "2.0", "method": "tenzro_training_getRun"',
    b"{'jsonrpc': '2.0'}",
    b'{"jsonrpc":"2.0","method":"tenzro_training_getRun","params":{"task_id":"t1"},"id":1}xyz',
    b"\xff\xfe{}",
    b"\xef\xbb\xbf{}",  # a UTF-8 BOM
    b'{"a": NaN}',
    b'{"a": Infinity}',
    b'{"a": -Infinity}',
    b'{"a": 1e400}',
    b"[" + b"1" * 101 + b"]",
    b"[" * 100_000,
    b"[" * 129 + b"]" * 129,
    b'{"a":' * 100_000,
    b'{"jsonrpc":"2.0","jsonrpc":"2.0","method":"tenzro_training_getRun","params":{"task_id":"t1"},"id":1}',
    b'{"jsonrpc":"2.0","method":"tenzro_training_getRun","params":{"task_id":"t1","task_id":"t2"},"id":1}',
    b'{"jsonrpc":"2.0","method":"tenzro_training_postTask","params":{"spec":{"a":{"b":1,"b":1}},'
    b'"signature":"' + SIG_HEX.encode() + b'"},"id":1}',
    b'[{"jsonrpc":"2.0","method":"tenzro_training_getRun","params":{"task_id":"t1"},"id":1},'
    b'{"id":2,"id":3}]',
]


class RpcConformance:
    """Transport-independent JSON-RPC contract. Subclasses provide ``call_raw`` and a ``service``
    fixture yielding a fresh (or reset) :class:`FakeService` wired to the transport."""

    def call_raw(self, raw: bytes) -> Any:
        """Send ``raw``; return the parsed JSON answer, or ``None`` if nothing was answered."""
        raise NotImplementedError

    def call(self, obj: object) -> Any:
        return self.call_raw(json.dumps(obj).encode())

    def error_of(self, answer: Any, code: int, request_id: object = 1) -> dict[str, Any]:
        assert isinstance(answer, dict), answer
        assert answer.get("jsonrpc") == "2.0"
        assert "result" not in answer
        assert answer["id"] == request_id and type(answer["id"]) is type(request_id)
        error = answer["error"]
        assert set(error) == {"code", "message", "data"}
        assert error["code"] == code, error
        assert type(error["message"]) is str and error["message"]
        assert type(error["data"]) is dict and type(error["data"].get("type")) is str
        return error

    # -- success paths: each method, values reach the service in Python types -----------------

    def test_get_run(self, service: FakeService) -> None:
        answer = self.call(get_run("t1", id=7))
        assert answer == {"jsonrpc": "2.0", "result": {"method": "get_run", "task_id": "t1"}, "id": 7}
        assert service.calls == [("get_run", {"task_id": "t1"})]

    def test_get_receipt(self, service: FakeService) -> None:
        answer = self.call(req("tenzro_training_getReceipt", {"task_id": "a.B-9_z"}, "x"))
        assert answer["result"] == {"method": "get_receipt", "task_id": "a.B-9_z"}
        assert answer["id"] == "x"

    def test_post_task(self, service: FakeService) -> None:
        answer = self.call(req("tenzro_training_postTask", {"spec": SPEC, "signature": SIG_HEX}))
        assert answer["result"]["spec"] == SPEC
        assert service.calls == [("post_task", {"spec": SPEC, "signature": SIG})]

    def test_list_runs_defaults(self, service: FakeService) -> None:
        for params in (None, {}, {"status": None, "offset": None, "limit": None}):
            service.calls.clear()
            self.call(req("tenzro_training_listRuns", params))
            assert service.calls == [("list_runs", {"status": None, "offset": 0, "limit": 50})]

    def test_list_runs_all_params(self, service: FakeService) -> None:
        self.call(req("tenzro_training_listRuns", {"status": "Training", "offset": 10, "limit": 500}))
        assert service.calls == [("list_runs", {"status": "Training", "offset": 10, "limit": 500})]

    @pytest.mark.parametrize("stake", ["0", "1000", str(2**256 - 1), 0, 1000, 2**256 - 1])
    def test_enroll_trainer_stake_forms(self, service: FakeService, stake: object) -> None:
        answer = self.call(req("tenzro_training_enrollTrainer", enroll_params(stake=stake)))
        assert "result" in answer, answer
        name, kwargs = service.calls[0]
        assert name == "enroll_trainer"
        assert kwargs == {"task_id": "t1", "did": DID, "address": ADDR, "stake": int(stake),
                          "signature": SIG}
        assert type(kwargs["stake"]) is int

    def test_submit_with_payload(self, service: FakeService) -> None:
        self.call(req("tenzro_training_submitOuterGradient", submit_params()))
        assert service.calls == [("submit_outer_gradient", {
            "task_id": "t1", "round": 3, "fragment": 7, "payload": PAYLOAD, "payload_hash": None,
            "signature": SIG,
        })]

    @pytest.mark.parametrize("payload", [b"A", b"AB", b"ABC", b"\xff" * 7])
    def test_submit_payload_padding_forms(self, service: FakeService, payload: bytes) -> None:
        text = base64.b64encode(payload).decode()
        self.call(req("tenzro_training_submitOuterGradient", submit_params(payload=text)))
        assert service.calls[0][1]["payload"] == payload

    def test_submit_with_payload_hash(self, service: FakeService) -> None:
        params = submit_params(payload=None, payload_hash=HASH_HEX.upper().replace("0X", "0x"))
        self.call(req("tenzro_training_submitOuterGradient", params))
        kwargs = service.calls[0][1]
        assert kwargs["payload"] is None and kwargs["payload_hash"] == bytes.fromhex("cd" * 32)

    def test_submit_uint_bounds(self, service: FakeService) -> None:
        params = submit_params(round=2**64 - 1, fragment=2**32 - 1)
        self.call(req("tenzro_training_submitOuterGradient", params))
        assert service.calls[0][1]["round"] == 2**64 - 1
        assert service.calls[0][1]["fragment"] == 2**32 - 1

    def test_finalize_round(self, service: FakeService) -> None:
        self.call(req("tenzro_training_finalizeRound", {"task_id": "t1", "round": 0, "signature": SIG_HEX}))
        assert service.calls == [("finalize_round", {"task_id": "t1", "round": 0, "signature": SIG})]

    def test_cancel_task(self, service: FakeService) -> None:
        self.call(req("tenzro_training_cancelTask", {"task_id": "t1", "signature": SIG_HEX}))
        assert service.calls == [("cancel_task", {"task_id": "t1", "signature": SIG})]

    def test_ids_are_echoed_exactly(self, service: FakeService) -> None:
        for request_id in ("abc", "", 0, -5, 2**53 + 1, 10**40, None):
            answer = self.call(get_run(id=request_id))
            assert answer["id"] == request_id and type(answer["id"]) is type(request_id)
            assert "result" in answer

    def test_result_is_passed_through(self, service: FakeService) -> None:
        service.result = {"runs": [{"task_id": "t1", "stake": str(10**30)}], "total": 1, "x": None}
        answer = self.call(req("tenzro_training_listRuns"))
        assert answer["result"] == service.result

    # -- parse errors ---------------------------------------------------------------------------

    @pytest.mark.parametrize("raw", PARSE_ERRORS, ids=lambda r: repr(r[:40]))
    def test_invalid_parse_error(self, service: FakeService, raw: bytes) -> None:
        error = self.error_of(self.call_raw(raw), -32700, None)
        assert error["data"]["type"] == "ParseError"
        assert service.calls == []

    def test_invalid_duplicate_key_names_the_key(self, service: FakeService) -> None:
        raw = b'{"jsonrpc":"2.0","method":"x","id":1,"id":2}'
        error = self.error_of(self.call_raw(raw), -32700, None)
        assert "'id'" in error["data"]["reason"]

    def test_transport_survives_deep_nesting(self, service: FakeService) -> None:
        self.error_of(self.call_raw(b"[" * 200_000 + b"]" * 200_000), -32700, None)
        assert "result" in self.call(get_run())

    def test_nesting_at_the_limit_parses(self, service: FakeService) -> None:
        spec = {"a": 1}
        for _ in range(120):
            spec = {"n": spec}
        answer = self.call(req("tenzro_training_postTask", {"spec": spec, "signature": SIG_HEX}))
        assert answer["result"]["spec"] == spec

    def test_brackets_inside_strings_do_not_count(self, service: FakeService) -> None:
        spec = {"s": "[" * 1000 + "{" * 1000, "t": ["\\\"[[[", "]"]}
        answer = self.call(req("tenzro_training_postTask", {"spec": spec, "signature": SIG_HEX}))
        assert answer["result"]["spec"] == spec

    def test_big_integers_are_exact(self, service: FakeService) -> None:
        stake = 2**256 - 1  # 78 digits, far beyond a double
        raw = json.dumps(req("tenzro_training_enrollTrainer", enroll_params(stake=stake))).encode()
        assert str(stake).encode() in raw
        self.call_raw(raw)
        assert service.calls[0][1]["stake"] == stake

    # -- invalid requests -------------------------------------------------------------------------

    @pytest.mark.parametrize(("request_obj", "answer_id"), INVALID_REQUESTS, ids=repr)
    def test_invalid_request(self, service: FakeService, request_obj: object, answer_id: object) -> None:
        error = self.error_of(self.call(request_obj), -32600, answer_id)
        assert error["data"]["type"] == "InvalidRequest"
        assert service.calls == []

    def test_invalid_empty_batch(self, service: FakeService) -> None:
        answer = self.call([])
        assert not isinstance(answer, list)  # one error object, not an array
        self.error_of(answer, -32600, None)

    def test_invalid_unknown_method(self, service: FakeService) -> None:
        for name in ("tenzro_training_getrun", "eth_call", "rpc.discover", "", "get_run"):
            error = self.error_of(self.call(req(name, {"task_id": "t1"})), -32601)
            assert error["data"] == {"type": "MethodNotFound", "method": name}
        assert service.calls == []

    def test_invalid_unknown_method_name_is_cut(self, service: FakeService) -> None:
        error = self.error_of(self.call(req("m" * 10_000)), -32601)
        assert len(error["data"]["method"]) == 128

    @pytest.mark.parametrize("params", [[], ["t1"], [{"task_id": "t1"}]])
    def test_invalid_positional_params(self, service: FakeService, params: list[object]) -> None:
        error = self.error_of(self.call(req("tenzro_training_getRun", params)), -32602)
        assert error["data"]["type"] == "InvalidParams"
        assert "param" not in error["data"]
        assert service.calls == []

    @pytest.mark.parametrize(("params", "param"), BAD_SUBMIT_PARAMS, ids=lambda v: repr(v)[:60])
    def test_invalid_submit_params(self, service: FakeService, params: dict[str, object], param: str) -> None:
        error = self.error_of(self.call(req("tenzro_training_submitOuterGradient", params)), -32602)
        assert error["data"]["type"] == "InvalidParams"
        assert error["data"]["param"] == param
        assert type(error["data"]["reason"]) is str
        assert service.calls == []

    @pytest.mark.parametrize(("params", "param"), BAD_ENROLL_PARAMS, ids=lambda v: repr(v)[:60])
    def test_invalid_enroll_params(self, service: FakeService, params: dict[str, object], param: str) -> None:
        error = self.error_of(self.call(req("tenzro_training_enrollTrainer", params)), -32602)
        assert error["data"]["param"] == param
        assert service.calls == []

    @pytest.mark.parametrize(("method", "params", "param"), BAD_OTHER_PARAMS, ids=lambda v: repr(v)[:50])
    def test_invalid_params(self, service: FakeService, method: str, params: dict[str, object], param: str) -> None:
        error = self.error_of(self.call(req(method, params)), -32602)
        assert error["data"]["param"] == param
        assert service.calls == []

    def test_invalid_params_unknown_name_is_cut(self, service: FakeService) -> None:
        params = {"task_id": "t1", "x" * 5000: 1}
        error = self.error_of(self.call(req("tenzro_training_getRun", params)), -32602)
        assert error["data"]["param"] == "x" * 64

    # -- batches and notifications --------------------------------------------------------------

    def test_batch_mixed_valid_and_malformed(self, service: FakeService) -> None:
        answer = self.call([
            get_run("a", id=1),
            1,
            req("tenzro_training_getRun", {"task_id": "n"}, id=...),  # notification
            {"foo": "boo"},
            req("nope", id=5),
            get_run("bad id", id=6),
            get_run("b", id="seven"),
        ])
        assert isinstance(answer, list) and len(answer) == 6
        assert answer[0] == {"jsonrpc": "2.0", "result": {"method": "get_run", "task_id": "a"}, "id": 1}
        self.error_of(answer[1], -32600, None)
        self.error_of(answer[2], -32600, None)
        self.error_of(answer[3], -32601, 5)
        assert self.error_of(answer[4], -32602, 6)["data"]["param"] == "task_id"
        assert answer[5]["result"]["task_id"] == "b" and answer[5]["id"] == "seven"
        assert [c[1]["task_id"] for c in service.calls] == ["a", "n", "b"]

    def test_batch_of_invalid_values(self, service: FakeService) -> None:
        answer = self.call([1, 2, 3])
        assert isinstance(answer, list) and len(answer) == 3
        for item in answer:
            self.error_of(item, -32600, None)

    def test_batch_element_errors_are_independent(self, service: FakeService) -> None:
        service.error = UnknownTask("t1")
        answer = self.call([get_run(id=1), get_run(id=2)])
        assert [self.error_of(a, 1301, i)["data"]["task_id"] for a, i in zip(answer, (1, 2))] == ["t1", "t1"]

    def test_nested_batch_is_invalid(self, service: FakeService) -> None:
        answer = self.call([[get_run()]])
        assert isinstance(answer, list) and len(answer) == 1
        self.error_of(answer[0], -32600, None)

    def test_notification_gets_no_answer_but_runs(self, service: FakeService) -> None:
        assert self.call(req("tenzro_training_getRun", {"task_id": "t1"}, id=...)) is None
        assert service.calls == [("get_run", {"task_id": "t1"})]

    def test_failing_notifications_get_no_answer(self, service: FakeService) -> None:
        assert self.call(req("nope", id=...)) is None
        assert self.call(req("tenzro_training_getRun", {"task_id": 1}, id=...)) is None
        assert self.call(req("tenzro_training_getRun", ["t1"], id=...)) is None
        service.error = RuntimeError("secret")
        assert self.call(req("tenzro_training_getRun", {"task_id": "t1"}, id=...)) is None

    def test_all_notification_batch_gets_no_answer(self, service: FakeService) -> None:
        batch = [req("tenzro_training_getRun", {"task_id": f"t{i}"}, id=...) for i in range(3)]
        assert self.call(batch) is None
        assert [c[1]["task_id"] for c in service.calls] == ["t0", "t1", "t2"]

    def test_null_id_is_a_request_not_a_notification(self, service: FakeService) -> None:
        answer = self.call(get_run(id=None))
        assert answer["id"] is None and "result" in answer

    def test_batch_order_and_size(self, service: FakeService) -> None:
        answer = self.call([get_run(f"t{i}", id=i) for i in range(200)])
        assert [a["id"] for a in answer] == list(range(200))
        assert [a["result"]["task_id"] for a in answer] == [f"t{i}" for i in range(200)]

    # -- the error table --------------------------------------------------------------------------

    @pytest.mark.parametrize(("exc", "code", "data"), ERROR_SAMPLES, ids=lambda v: type(v).__name__)
    def test_application_error(self, service: FakeService, exc: BaseException, code: int, data: dict[str, Any]) -> None:
        service.error = exc
        error = self.error_of(self.call(get_run()), code)
        assert error["data"] == data
        if "secret" in str(exc):
            assert "secret" not in json.dumps(error)

    def test_every_table_row_has_a_sample(self) -> None:
        sampled = {type(exc) for exc, _, _ in ERROR_SAMPLES}
        missing = [row.exc_type.__name__ for row in ERROR_TABLE if row.exc_type not in sampled]
        assert missing == []

    @pytest.mark.parametrize("exc", UNEXPECTED, ids=lambda e: type(e).__name__)
    def test_invalid_unexpected_exception_is_internal_error(self, service: FakeService, exc: Exception) -> None:
        service.error = exc
        raw_answer = self.call(get_run(id=9))
        assert raw_answer == {"jsonrpc": "2.0", "error": INTERNAL, "id": 9}
        text = json.dumps(raw_answer)
        for leak in ("secret", "Traceback", ".py", type(exc).__name__):
            assert leak not in text

    @pytest.mark.parametrize("result", [
        {"bytes": b"\x00"}, {"nan": float("nan")}, {"inf": float("inf")}, {"obj": object()}, {1, 2},
    ], ids=["bytes", "nan", "inf", "object", "set"])  # (repr of an object() differs per process: xdist)
    def test_invalid_unserializable_result_is_internal_error(self, service: FakeService, result: object) -> None:
        service.result = result
        assert self.call(get_run(id=4)) == {"jsonrpc": "2.0", "error": INTERNAL, "id": 4}

    def test_unserializable_result_spoils_only_its_batch_element(self, service: FakeService) -> None:
        service.result = {"b": b"x"}
        answer = self.call([get_run(id=1), req("nope", id=2)])
        assert answer[0] == {"jsonrpc": "2.0", "error": INTERNAL, "id": 1}
        self.error_of(answer[1], -32601, 2)
