"""Typed parsing of each ``tenzro_training_*`` method's params.

What this module is: one frozen dataclass per method holding its params in Python types (bytes
for signatures, hashes and payloads; ints for stakes, rounds and fragments), each with a
``parse(params)`` classmethod that checks the JSON object it is given and raises
:class:`rpc.errors.InvalidParams` naming the first offending param. :data:`PARAMS_BY_METHOD` maps
method names to these classes.

What it is NOT: the protocol's semantic checks. Whether a task exists, a signature recovers to the
right party, a spec is valid or a stake is high enough is the node service's business (it raises
TenzroError subclasses with their own codes). These checks are shape-only: types, ranges, lengths,
encodings, the set of names. A value that passes here can still be refused by the service.

Conventions (docs/rpc.md restates them):
- params are named (a JSON object); unknown names are rejected; an optional param given as
  ``null`` is the same as an absent one;
- ``signature``: ``0x`` + 130 hex digits (65 bytes ``r || s || v``), either case;
- ``payload_hash``: ``0x`` + 64 hex digits; ``payload``: standard base64 with padding, no
  whitespace, canonical (the unused bits of the last character are zero), not empty;
- ``stake``: a uint256 as a decimal string (no sign, no leading zeros) or a JSON integer;
- ``round`` (uint64) and ``fragment`` (uint32): JSON integers (``true`` is not an integer, and
  neither is ``1.0``).
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Self

from rpc.errors import InvalidParams

try:
    # SIMD base64 (~45x faster than binascii here: 0.06 ms vs 2.7 ms for a 1 MiB payload, which
    # is most of submitOuterGradient's cost). Same strictness with validate=True.
    from pybase64 import b64decode as _simd_b64decode
except ImportError:  # optional speed-up: binascii gives identical results
    _simd_b64decode = None

__all__ = [
    "B64_DECODERS",
    "DEFAULT_LIST_LIMIT",
    "MAX_LIST_LIMIT",
    "PARAMS_BY_METHOD",
    "RUN_STATUSES",
    "CancelTaskParams",
    "EnrollTrainerParams",
    "FinalizeRoundParams",
    "GetReceiptParams",
    "GetRunParams",
    "ListRunsParams",
    "PostTaskParams",
    "SubmitOuterGradientParams",
]

DEFAULT_LIST_LIMIT: Final = 50
MAX_LIST_LIMIT: Final = 500
MAX_OFFSET: Final = 2**53 - 1
"""listRuns' largest offset: the largest integer every JSON client reads exactly (it is echoed)."""
RUN_STATUSES: Final = frozenset(
    {"Posted", "Electing", "Enrolling", "Training", "Sealed", "Cancelled", "Failed"}
)
"""The run status wire names (SPEC.md "Roles and flow"), accepted by listRuns' ``status``."""

SIGNATURE_BYTES: Final = 65
_UINT32: Final = 2**32
_UINT64: Final = 2**64
_UINT256: Final = 2**256

# Same grammars as the TrainingTaskSpec (SPEC.md); repeated here as transport shape checks.
_TASK_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_DID = re.compile(r"did:tenzro:[a-z]{1,32}:[A-Za-z0-9._-]{1,128}")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_SIGNATURE = re.compile(r"0x[0-9a-fA-F]{130}")
_HASH32 = re.compile(r"0x[0-9a-fA-F]{64}")
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,77}")  # uint256 max has 78 digits

_B64_ALPHABET: Final = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_VALUE: Final = {c: i for i, c in enumerate(_B64_ALPHABET)}

_JSON_TYPE_NAMES: Final = {
    dict: "object", list: "array", str: "string", int: "integer", float: "number",
    bool: "boolean", type(None): "null",
}


def _kind(value: object) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def _check_names(
    params: Mapping[str, object], required: frozenset[str], allowed: frozenset[str]
) -> None:
    """Reject unknown names first (sorted, so the answer is deterministic), then missing ones."""
    if not params.keys() <= allowed:
        raise InvalidParams(min(params.keys() - allowed), "unknown param")
    if not required <= params.keys():
        raise InvalidParams(min(required - params.keys()), "missing")


# --- one check per wire type ------------------------------------------------------------------


def _task_id(value: object, name: str = "task_id") -> str:
    if type(value) is not str:
        raise InvalidParams(name, f"expected a string, got {_kind(value)}")
    if _TASK_ID.fullmatch(value) is None:
        raise InvalidParams(name, "expected 1-128 characters of [A-Za-z0-9._-]")
    return value


def _signature(value: object) -> bytes:
    if type(value) is not str:
        raise InvalidParams("signature", f"expected a string, got {_kind(value)}")
    if _SIGNATURE.fullmatch(value) is None:
        raise InvalidParams("signature", "expected 0x + 130 hex digits (65 bytes)")
    return bytes.fromhex(value[2:])


def _hash32(value: object, name: str) -> bytes:
    if type(value) is not str:
        raise InvalidParams(name, f"expected a string, got {_kind(value)}")
    if _HASH32.fullmatch(value) is None:
        raise InvalidParams(name, "expected 0x + 64 hex digits (32 bytes)")
    return bytes.fromhex(value[2:])


def _uint(value: object, name: str, limit: int) -> int:
    if type(value) is not int:  # bool is an int subclass: rejected here on purpose
        raise InvalidParams(name, f"expected an integer, got {_kind(value)}")
    if not 0 <= value < limit:
        raise InvalidParams(name, f"out of range 0..{limit - 1}")
    return value


def _stake(value: object) -> int:
    if type(value) is int:
        return _uint(value, "stake", _UINT256)
    if type(value) is not str:
        raise InvalidParams("stake", f"expected a decimal string or an integer, got {_kind(value)}")
    if _DECIMAL.fullmatch(value) is None:
        raise InvalidParams("stake", "expected a decimal string without sign or leading zeros")
    amount = int(value)
    if amount >= _UINT256:
        raise InvalidParams("stake", "out of the uint256 range")
    return amount


def _string(value: object, name: str, pattern: re.Pattern[str], what: str) -> str:
    if type(value) is not str:
        raise InvalidParams(name, f"expected a string, got {_kind(value)}")
    if pattern.fullmatch(value) is None:
        raise InvalidParams(name, f"expected {what}")
    return value


def _decode_binascii(text: str) -> bytes:
    return binascii.a2b_base64(text, strict_mode=True)


def _decode_simd(text: str) -> bytes:
    return _simd_b64decode(text, validate=True)  # type: ignore[misc]


B64_DECODERS: Final = {"binascii": _decode_binascii} | (
    {} if _simd_b64decode is None else {"pybase64": _decode_simd}
)
"""Strict base64 decoders available here (tests check they agree); the fastest one is used."""
_b64_decode: Final = _decode_binascii if _simd_b64decode is None else _decode_simd


def _payload(value: object, decode: Callable[[str], bytes] = _b64_decode) -> bytes:
    """Strict standard base64: padded, no whitespace, canonical last character, not empty."""
    if type(value) is not str:
        raise InvalidParams("payload", f"expected a base64 string, got {_kind(value)}")
    if not value:
        raise InvalidParams("payload", "empty")
    if len(value) % 4:
        raise InvalidParams("payload", "not strict base64 (length not a multiple of 4)")
    # At most two pad characters: binascii's strict mode also takes "AAAA====" (pybase64 does
    # not), and the two decoders must agree on what one payload is. Counted with endswith:
    # rstrip copied the whole string (~1.4 MB for a 1 MiB payload, ~0.05 ms) when it was padded.
    if value.endswith("==="):
        raise InvalidParams("payload", "not strict base64 (more than two '=')")
    pad = 2 if value.endswith("==") else 1 if value.endswith("=") else 0
    try:
        raw = decode(value)
    except (binascii.Error, ValueError):
        raise InvalidParams("payload", "not strict base64 (standard alphabet, padded)") from None
    # binascii accepts non-zero unused bits ("QR==" decodes like "QQ=="); one payload must have
    # one encoding, so the last data character must leave them zero.
    if pad and _B64_VALUE[value[-pad - 1]] & (0x0F if pad == 2 else 0x03):
        raise InvalidParams("payload", "non-canonical base64 (unused bits set)")
    return raw


# --- one dataclass per method -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PostTaskParams:
    """``tenzro_training_postTask{spec, signature}``."""

    spec: dict[str, Any]
    """The TrainingTaskSpec as a JSON object (validated by the service)."""
    signature: bytes
    """65-byte EIP-712 signature by ``spec.sponsor_address``."""

    _REQUIRED = frozenset({"spec", "signature"})

    @classmethod
    def parse(cls, params: Mapping[str, object]) -> PostTaskParams:
        _check_names(params, cls._REQUIRED, cls._REQUIRED)
        spec = params["spec"]
        if type(spec) is not dict:
            raise InvalidParams("spec", f"expected an object, got {_kind(spec)}")
        return cls(spec, _signature(params["signature"]))


@dataclass(frozen=True, slots=True)
class ListRunsParams:
    """``tenzro_training_listRuns{status?, offset?, limit?}``."""

    status: str | None
    """Only runs in this status (one of :data:`RUN_STATUSES`); ``None``: every run."""
    offset: int
    """Runs to skip, >= 0 (default 0)."""
    limit: int
    """At most this many runs, 1..500 (default 50)."""

    _ALLOWED = frozenset({"status", "offset", "limit"})

    @classmethod
    def parse(cls, params: Mapping[str, object]) -> ListRunsParams:
        _check_names(params, frozenset(), cls._ALLOWED)
        status = params.get("status")
        if status is not None:
            if type(status) is not str:
                raise InvalidParams("status", f"expected a string or null, got {_kind(status)}")
            if status not in RUN_STATUSES:
                raise InvalidParams("status", f"expected one of {', '.join(sorted(RUN_STATUSES))}")
        offset = params.get("offset")
        offset = 0 if offset is None else _uint(offset, "offset", MAX_OFFSET + 1)
        limit = params.get("limit")
        if limit is None:
            limit = DEFAULT_LIST_LIMIT
        elif type(limit) is not int:
            raise InvalidParams("limit", f"expected an integer, got {_kind(limit)}")
        elif not 1 <= limit <= MAX_LIST_LIMIT:
            raise InvalidParams("limit", f"out of range 1..{MAX_LIST_LIMIT}")
        return cls(status, offset, limit)


@dataclass(frozen=True, slots=True)
class _TaskIdParams:
    """Params that are exactly ``{task_id}``."""

    task_id: str

    _REQUIRED = frozenset({"task_id"})

    @classmethod
    def parse(cls, params: Mapping[str, object]) -> Self:
        _check_names(params, cls._REQUIRED, cls._REQUIRED)
        return cls(_task_id(params["task_id"]))


@dataclass(frozen=True, slots=True)
class GetRunParams(_TaskIdParams):
    """``tenzro_training_getRun{task_id}``."""


@dataclass(frozen=True, slots=True)
class GetReceiptParams(_TaskIdParams):
    """``tenzro_training_getReceipt{task_id}``."""


@dataclass(frozen=True, slots=True)
class EnrollTrainerParams:
    """``tenzro_training_enrollTrainer{task_id, did, address, stake, signature}``."""

    task_id: str
    did: str
    """``did:tenzro:<kind>:<id>``."""
    address: str
    """The trainer's address, ``0x`` + 40 hex (its EIP-55 checksum is checked by the service)."""
    stake: int
    """attoTNZO, uint256."""
    signature: bytes
    """65-byte EIP-712 signature by ``address``."""

    _REQUIRED = frozenset({"task_id", "did", "address", "stake", "signature"})

    @classmethod
    def parse(cls, params: Mapping[str, object]) -> EnrollTrainerParams:
        _check_names(params, cls._REQUIRED, cls._REQUIRED)
        return cls(
            _task_id(params["task_id"]),
            _string(params["did"], "did", _DID, "did:tenzro:<kind>:<id>"),
            _string(params["address"], "address", _ADDRESS, "0x + 40 hex digits"),
            _stake(params["stake"]),
            _signature(params["signature"]),
        )


@dataclass(frozen=True, slots=True)
class SubmitOuterGradientParams:
    """``tenzro_training_submitOuterGradient{task_id, round, fragment, payload | payload_hash,
    signature}``: exactly one of ``payload`` and ``payload_hash``."""

    task_id: str
    round: int
    """uint64."""
    fragment: int
    """uint32."""
    payload: bytes | None
    """The safetensors payload bytes, or ``None`` when only ``payload_hash`` was sent."""
    payload_hash: bytes | None
    """32-byte payload hash (payload already gossiped), or ``None`` when ``payload`` was sent."""
    signature: bytes

    _REQUIRED = frozenset({"task_id", "round", "fragment", "signature"})
    _ALLOWED = _REQUIRED | {"payload", "payload_hash"}

    @classmethod
    def parse(cls, params: Mapping[str, object]) -> SubmitOuterGradientParams:
        _check_names(params, cls._REQUIRED, cls._ALLOWED)
        task_id = _task_id(params["task_id"])
        round_ = _uint(params["round"], "round", _UINT64)
        fragment = _uint(params["fragment"], "fragment", _UINT32)
        raw_payload = params.get("payload")
        raw_hash = params.get("payload_hash")
        if (raw_payload is None) == (raw_hash is None):
            raise InvalidParams("payload", "give exactly one of payload and payload_hash")
        payload = None if raw_payload is None else _payload(raw_payload)
        payload_hash = None if raw_hash is None else _hash32(raw_hash, "payload_hash")
        return cls(task_id, round_, fragment, payload, payload_hash, _signature(params["signature"]))


@dataclass(frozen=True, slots=True)
class FinalizeRoundParams:
    """``tenzro_training_finalizeRound{task_id, round, signature}``."""

    task_id: str
    round: int
    signature: bytes
    """65-byte EIP-712 signature by the run's current syncer."""

    _REQUIRED = frozenset({"task_id", "round", "signature"})

    @classmethod
    def parse(cls, params: Mapping[str, object]) -> FinalizeRoundParams:
        _check_names(params, cls._REQUIRED, cls._REQUIRED)
        return cls(
            _task_id(params["task_id"]),
            _uint(params["round"], "round", _UINT64),
            _signature(params["signature"]),
        )


@dataclass(frozen=True, slots=True)
class CancelTaskParams:
    """``tenzro_training_cancelTask{task_id, signature}`` (extension to the seven seed methods)."""

    task_id: str
    signature: bytes
    """65-byte EIP-712 signature by the sponsor."""

    _REQUIRED = frozenset({"task_id", "signature"})

    @classmethod
    def parse(cls, params: Mapping[str, object]) -> CancelTaskParams:
        _check_names(params, cls._REQUIRED, cls._REQUIRED)
        return cls(_task_id(params["task_id"]), _signature(params["signature"]))


PARAMS_BY_METHOD: Final[Mapping[str, type]] = {
    "tenzro_training_postTask": PostTaskParams,
    "tenzro_training_listRuns": ListRunsParams,
    "tenzro_training_getRun": GetRunParams,
    "tenzro_training_getReceipt": GetReceiptParams,
    "tenzro_training_enrollTrainer": EnrollTrainerParams,
    "tenzro_training_submitOuterGradient": SubmitOuterGradientParams,
    "tenzro_training_finalizeRound": FinalizeRoundParams,
    "tenzro_training_cancelTask": CancelTaskParams,
}
