"""The TrainingTaskSpec: the sponsor's description of a training run, its JSON form and its hash.

A spec is posted by a sponsor, referenced by trainers, committed as the first leaf of the run's
Merkle tree and carried verbatim in the final receipt (SPEC.md "TrainingTaskSpec"). This module is
the only place that turns spec JSON into a value: it parses strictly (unknown, missing or
duplicate fields, booleans posing as integers and integers beyond 2^53-1 are all rejected),
normalizes the few fields that have more than one spelling (the sponsor address becomes its
EIP-55 checksum form, the dataset hash lowercase hex), and derives the canonical bytes
(RFC 8785 JCS) and ``spec_hash`` = SHA-256(canonical bytes). The hash is over the *canonical*
form, not over the bytes a sponsor sent.

It is NOT the run lifecycle (whether a spec may be posted now, escrow, enrollment), NOT the
aggregation math (``rules.py`` holds the rule value, the aggregators live elsewhere) and does no
I/O: the node, not this module, fetches and verifies the init checkpoint a spec points to.

Every error is a :class:`~tenzro_training.errors.SpecError` whose ``path`` names the field, e.g.
``"architecture.fragment_count"`` or ``"architecture.metadata.layers[2]"``; ``""`` is the
document as a whole.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Union

import rfc8785
from eth_utils import is_checksum_address, to_checksum_address

from tenzro_training.jsontext import MAX_JSON_NESTING, is_json_depth_ok
from tenzro_training.errors import AggregationError, SpecError
from tenzro_training.rules import MAX_JSON_SAFE_INT, AggregationRule

__all__ = [
    "Architecture",
    "DType",
    "FrozenJsonObject",
    "InitCheckpoint",
    "JsonValue",
    "MAX_CANONICAL_BYTES",
    "MAX_JSON_SAFE_INT",
    "MAX_METADATA_DEPTH",
    "MAX_SPEC_JSON_BYTES",
    "Modality",
    "SUPPORTED_MODALITIES",
    "SUPPORTED_TIERS",
    "Tier",
    "TrainingTaskSpec",
]

# --- protocol constants (a node that changed them would disagree with its peers) --------------

MAX_SPEC_JSON_BYTES = 256 * 1024
"""Largest spec JSON text ``from_json`` reads (UTF-8 bytes, whitespace included)."""
MAX_CANONICAL_BYTES = 64 * 1024
"""Largest canonical form: it is a Merkle leaf and travels inside every receipt."""
MAX_METADATA_DEPTH = 16
"""Deepest nesting of objects/arrays inside ``architecture.metadata`` (metadata itself is 1)."""
MAX_UINT256 = 2**256 - 1
MAX_URI_CHARS = 2048

JsonValue = Union[None, bool, int, float, str, tuple["JsonValue", ...], "FrozenJsonObject"]
"""A frozen JSON value: objects are FrozenJsonObject, arrays are tuples."""


class FrozenJsonObject(Mapping[str, "JsonValue"]):
    """A read-only JSON object: hashable, picklable, equal to any mapping with the same items.

    Used for ``architecture.metadata`` so that a frozen spec is frozen all the way down.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, JsonValue] | None = None) -> None:
        # Callers outside this module should go through a spec, which validates the values.
        self._items: dict[str, JsonValue] = dict(items or {})

    def __getitem__(self, key: str) -> JsonValue:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"FrozenJsonObject({self._items!r})"

    def __reduce__(self) -> tuple[type[FrozenJsonObject], tuple[dict[str, JsonValue]]]:
        return (FrozenJsonObject, (self._items,))


# Grammars, pinned. re.fullmatch is used everywhere so a trailing newline never slips through.
_TASK_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
# did:tenzro:<kind>:<id>; kind names the identity class (the seed shows "human").
_DID = re.compile(r"did:tenzro:[a-z]{1,32}:[A-Za-z0-9._-]{1,128}")
_FAMILY = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_HASH32 = re.compile(r"0x[0-9a-fA-F]{64}")
_HASH32_LOWER = re.compile(r"0x[0-9a-f]{64}")
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
# RFC 3986 scheme, then printable ASCII without spaces: a URI, not a free-form string.
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[\x21-\x7e]+")


class Modality(enum.StrEnum):
    """What kind of data the model consumes."""

    TIMESERIES = "Timeseries"
    LANGUAGE = "Language"
    VISION = "Vision"
    MULTIMODAL = "Multimodal"


class Tier(enum.StrEnum):
    """The trust tier a run asks for (Verified and Confidential need attestation: Phase 2)."""

    OPEN = "Open"
    VERIFIED = "Verified"
    CONFIDENTIAL = "Confidential"


class DType(enum.StrEnum):
    """The sponsor's declared weight dtype: part of the spec (and its hash) for trainers and the
    record. The node holds, steps and hashes the global model in fp32 whatever it says (the
    checkpoint is widened first; docs/node.md "Init checkpoints")."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return 4 if self is DType.FP32 else 2


SUPPORTED_MODALITIES: frozenset[Modality] = frozenset({Modality.TIMESERIES})
"""Modalities ``from_json`` accepts today; the others parse in the type system only."""
SUPPORTED_TIERS: frozenset[Tier] = frozenset({Tier.OPEN})
"""Tiers ``from_json`` accepts today."""

_SPEC_FIELDS = (
    "task_id", "sponsor_did", "sponsor_address", "architecture", "tier", "aggregation",
    "trainer_count", "quorum", "inner_steps", "max_rounds", "grace_window_ms", "reward_pool",
    "dataset_ref", "dataset_hash", "min_throughput", "created_at",
)  # fmt: skip
_ARCHITECTURE_FIELDS = ("family", "param_count", "modality", "fragment_count", "dtype", "metadata")
_INIT_CHECKPOINT_FIELDS = ("uri", "sha256")


# --- small validators, each raising SpecError(path, ...) ------------------------------------


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return f"a {type(value).__name__}"


def _validate_int(path: str, value: object, minimum: int) -> int:
    # bool is an int subclass in Python; true/false are not numbers in JSON.
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(path, f"must be an integer, got {_describe(value)}")
    if value < minimum:
        raise SpecError(path, f"must be >= {minimum}, got {value}")
    if value > MAX_JSON_SAFE_INT:
        # RFC 8785 writes numbers as IEEE doubles: a larger integer would change value.
        raise SpecError(path, f"must be <= 2^53-1 (JSON-safe integer), got {value}")
    return int(value)


def _validate_str(path: str, value: object) -> str:
    if not isinstance(value, str):
        raise SpecError(path, f"must be a string, got {_describe(value)}")
    return _validate_unicode(path, value)


def _validate_unicode(path: str, value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate ("\ud800" escape) has no UTF-8 form, hence no canonical bytes.
        raise SpecError(path, "contains a lone surrogate (not valid Unicode)") from None
    return str(value)


def _validate_match(path: str, value: object, pattern: re.Pattern[str], what: str) -> str:
    text = _validate_str(path, value)
    if pattern.fullmatch(text) is None:
        raise SpecError(path, f"must be {what}, got {text[:80]!r}")
    return text


def _validate_uri(path: str, value: object) -> str:
    text = _validate_match(path, value, _URI, "a URI (scheme:rest, printable ASCII, no spaces)")
    if len(text) > MAX_URI_CHARS:
        raise SpecError(path, f"must be at most {MAX_URI_CHARS} characters, got {len(text)}")
    return text


def _validate_enum(path: str, value: object, enum_type: type[enum.StrEnum]) -> Any:
    if isinstance(value, enum_type):
        return value
    # Only exact members by value: "timeseries" or "TIMESERIES" are not the same spec.
    if isinstance(value, str) and not isinstance(value, enum.Enum):
        for member in enum_type:
            if member.value == value:
                return member
    options = " | ".join(m.value for m in enum_type)
    shown = repr(value) if isinstance(value, str) else _describe(value)
    raise SpecError(path, f"must be one of {options}, got {shown}")


def _validate_address(path: str, value: object) -> str:
    text = _validate_match(path, value, _ADDRESS, "0x followed by 40 hex digits")
    digits = text[2:]
    if digits != digits.lower() and digits != digits.upper() and not is_checksum_address(text):
        # Mixed case is an EIP-55 checksum claim; a wrong one is most likely a typo.
        raise SpecError(path, "mixed-case address fails its EIP-55 checksum")
    return str(to_checksum_address(text))


def _validate_number(path: str, value: object) -> int | float:
    """A JSON number as JCS sees it: a finite IEEE double, stored in one normal form.

    An integral value is stored as ``int`` (JCS writes 1.0 as ``1``, which parses back as an
    integer), so it must be JSON-safe; ``-0.0`` becomes ``0``. Other floats stay floats.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(path, f"must be a number, got {_describe(value)}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SpecError(path, f"must be finite, got {value!r}")
        if not value.is_integer():
            return float(value)
        if abs(value) > MAX_JSON_SAFE_INT:
            raise SpecError(path, f"integral value {value!r} exceeds 2^53-1 (JSON-safe range)")
        return int(value)
    if abs(value) > MAX_JSON_SAFE_INT:
        raise SpecError(path, f"integer {value} exceeds 2^53-1 (JSON-safe range)")
    return int(value)


def _freeze_json(path: str, value: object, depth: int) -> JsonValue:
    """Validate a metadata value and return a deep, read-only copy in normal form."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return _validate_number(path, value)
    if isinstance(value, str):
        return _validate_unicode(path, value)
    if isinstance(value, (list, tuple, Mapping)) and depth > MAX_METADATA_DEPTH:
        raise SpecError(path, f"nested deeper than {MAX_METADATA_DEPTH} levels")
    if isinstance(value, (list, tuple)):
        return tuple(_freeze_json(f"{path}[{i}]", v, depth + 1) for i, v in enumerate(value))
    if isinstance(value, Mapping):
        out: dict[str, JsonValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise SpecError(path, f"object keys must be strings, got {_describe(key)}")
            child = f"{path}.{key}"
            _validate_unicode(child, key)
            out[str(key)] = _freeze_json(child, item, depth + 1)
        # Keys in sorted order: a run's view serializes alike whether its spec came from the
        # sponsor's post or from the store (whose encoding sorts keys), before and after a restart.
        return FrozenJsonObject(dict(sorted(out.items())))
    raise SpecError(path, f"must be a JSON value, got {_describe(value)}")


def _thaw_json(value: JsonValue) -> Any:
    """The plain-JSON (dict/list) copy of a frozen value."""
    if isinstance(value, tuple):
        return [_thaw_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _thaw_json(v) for k, v in value.items()}
    return value


def _check_fields(path: str, obj: object, fields: tuple[str, ...]) -> Mapping[str, Any]:
    prefix = f"{path}." if path else ""
    if not isinstance(obj, Mapping):
        raise SpecError(path, f"must be a JSON object, got {_describe(obj)}")
    for key in obj:
        if key not in fields:
            shown = key if isinstance(key, str) else repr(key)
            raise SpecError(f"{prefix}{shown}", "unknown field")
    for name in fields:
        if name not in obj:
            raise SpecError(f"{prefix}{name}", "missing field")
    return obj


# --- value types ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InitCheckpoint:
    """Where the run's initial global model lives: ``architecture.metadata.init_checkpoint``."""

    uri: str
    """Where the node fetches the safetensors checkpoint from (e.g. ``file:///...``)."""
    sha256: str
    """SHA-256 of the checkpoint file's bytes: ``0x`` + 64 lowercase hex digits."""

    def __post_init__(self) -> None:
        base = "architecture.metadata.init_checkpoint"
        _validate_uri(f"{base}.uri", self.uri)
        # Metadata is hashed verbatim, so only the one canonical spelling is accepted here.
        what = "0x + 64 lowercase hex digits"
        _validate_match(f"{base}.sha256", self.sha256, _HASH32_LOWER, what)

    @property
    def sha256_bytes(self) -> bytes:
        """The 32-byte digest, to compare with ``hashlib.sha256(data).digest()``."""
        return bytes.fromhex(self.sha256[2:])

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> InitCheckpoint | None:
        """Read ``init_checkpoint`` out of an architecture's metadata (None when absent)."""
        if "init_checkpoint" not in metadata:
            return None
        path = "architecture.metadata.init_checkpoint"
        obj = _check_fields(path, metadata["init_checkpoint"], _INIT_CHECKPOINT_FIELDS)
        return cls(uri=obj["uri"], sha256=obj["sha256"])


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """The model a run trains: its family, size, data modality, fragmenting and dtype."""

    family: str
    """Model family the trainers' adapter is chosen by, e.g. ``"timesfm"`` (``[a-z0-9._-]``)."""
    param_count: int
    """Number of trainable parameters the sponsor declares (>= 1)."""
    modality: Modality
    """What data the model consumes; only Timeseries is accepted by ``from_json`` today."""
    fragment_count: int
    """F: how many fragments the model's tensors are split into (>= 1)."""
    dtype: DType
    """The declared weight dtype (:class:`DType`; the node's global model is fp32 regardless)."""
    metadata: FrozenJsonObject
    """Family-specific settings (free-form JSON object, stored read-only and hashed verbatim;
    any mapping may be passed in, a deep read-only copy is kept).
    ``init_checkpoint``, when present, must be ``{"uri": str, "sha256": "0x" + 64 hex}``."""

    def __post_init__(self) -> None:
        p = "architecture"
        _validate_match(f"{p}.family", self.family, _FAMILY, "1-64 chars of [a-z0-9._-]")
        _validate_int(f"{p}.param_count", self.param_count, 1)
        modality = _validate_enum(f"{p}.modality", self.modality, Modality)
        object.__setattr__(self, "modality", modality)
        _validate_int(f"{p}.fragment_count", self.fragment_count, 1)
        object.__setattr__(self, "dtype", _validate_enum(f"{p}.dtype", self.dtype, DType))
        if not isinstance(self.metadata, Mapping):
            got = _describe(self.metadata)
            raise SpecError(f"{p}.metadata", f"must be a JSON object, got {got}")
        object.__setattr__(self, "metadata", _freeze_json(f"{p}.metadata", self.metadata, 1))
        InitCheckpoint.from_metadata(self.metadata)  # validates its shape when present

    def __hash__(self) -> int:
        return hash(rfc8785.dumps(self.to_dict()))

    def init_checkpoint(self) -> InitCheckpoint | None:
        """The initial-model reference in ``metadata.init_checkpoint``, or None if absent."""
        return InitCheckpoint.from_metadata(self.metadata)

    @classmethod
    def from_dict(cls, obj: object) -> Architecture:
        """Parse the ``architecture`` JSON object (already decoded)."""
        fields = _check_fields("architecture", obj, _ARCHITECTURE_FIELDS)
        return cls(**{name: fields[name] for name in _ARCHITECTURE_FIELDS})

    def to_dict(self) -> dict[str, Any]:
        """A fresh plain-JSON dict (enums as strings, metadata as dicts and lists)."""
        return {
            "family": self.family,
            "param_count": self.param_count,
            "modality": self.modality.value,
            "fragment_count": self.fragment_count,
            "dtype": self.dtype.value,
            "metadata": _thaw_json(self.metadata),
        }


@dataclass(frozen=True, kw_only=True)
class TrainingTaskSpec:
    """A sponsor's training task, validated and in canonical form.

    Construct it with :meth:`from_json` / :meth:`from_dict` at a trust boundary; the
    constructor validates too (so an invalid spec cannot exist) but does not apply the
    "not supported yet" gate on modality and tier.
    """

    task_id: str
    """Unique run identifier: 1-128 chars of ``[A-Za-z0-9._-]``."""
    sponsor_did: str
    """Sponsor identity ``did:tenzro:<kind>:<id>``.

    kind is ``[a-z]{1,32}``, id is ``[A-Za-z0-9._-]{1,128}``."""
    sponsor_address: str
    """Account that escrows the reward and signs postTask; stored in EIP-55 checksum form."""
    architecture: Architecture
    """The model being trained."""
    tier: Tier
    """Trust tier; only Open is accepted by ``from_json`` today."""
    aggregation: AggregationRule
    """Rule applied per fragment over the K accepted outer gradients; fits ``quorum``."""
    trainer_count: int
    """M: how many trainers are admitted (>= 1)."""
    quorum: int
    """K: accepted outer gradients needed to finalize a round (1 <= K <= M)."""
    inner_steps: int
    """H: inner optimizer steps each trainer runs per round (>= 1)."""
    max_rounds: int
    """Outer rounds before the run is sealed (>= 1)."""
    grace_window_ms: int
    """Straggler tolerance after quorum is reached, in milliseconds (>= 0)."""
    reward_pool: int
    """Escrowed reward in attoTNZO (uint256); a decimal string in JSON."""
    dataset_ref: str
    """Where trainers get the dataset (a URI, e.g. ``ipfs://...``, at most 2048 chars)."""
    dataset_hash: str
    """Commitment to the dataset: ``0x`` + 64 hex digits, stored lowercase."""
    min_throughput: float | None
    """Minimum trainer throughput the sponsor asks for (finite, >= 0), or None for no minimum.
    Its unit is the model family adapter's (e.g. samples per second)."""
    created_at: int
    """When the sponsor created the spec, unix seconds (>= 0)."""

    def __post_init__(self) -> None:
        # Checked in field order so the first error reported is deterministic.
        _validate_match("task_id", self.task_id, _TASK_ID, "1-128 chars of [A-Za-z0-9._-]")
        _validate_match("sponsor_did", self.sponsor_did, _DID, "did:tenzro:<kind>:<id>")
        object.__setattr__(
            self, "sponsor_address", _validate_address("sponsor_address", self.sponsor_address)
        )
        if not isinstance(self.architecture, Architecture):
            got = _describe(self.architecture)
            raise SpecError("architecture", f"must be an Architecture, got {got}")
        object.__setattr__(self, "tier", _validate_enum("tier", self.tier, Tier))
        if not isinstance(self.aggregation, AggregationRule):
            got = _describe(self.aggregation)
            raise SpecError("aggregation", f"must be an AggregationRule, got {got}")
        m = _validate_int("trainer_count", self.trainer_count, 1)
        k = _validate_int("quorum", self.quorum, 1)
        if k > m:
            raise SpecError("quorum", f"must be <= trainer_count ({m}), got {k}")
        try:
            self.aggregation.validate_for_quorum(k)
        except AggregationError as exc:
            raise SpecError("aggregation", str(exc)) from None
        _validate_int("inner_steps", self.inner_steps, 1)
        _validate_int("max_rounds", self.max_rounds, 1)
        _validate_int("grace_window_ms", self.grace_window_ms, 0)
        if isinstance(self.reward_pool, bool) or not isinstance(self.reward_pool, int):
            got = _describe(self.reward_pool)
            raise SpecError("reward_pool", f"must be an integer amount, got {got}")
        if not 0 <= self.reward_pool <= MAX_UINT256:
            raise SpecError("reward_pool", f"must be in uint256 range, got {self.reward_pool}")
        _validate_uri("dataset_ref", self.dataset_ref)
        digest = _validate_match("dataset_hash", self.dataset_hash, _HASH32, "0x + 64 hex digits")
        object.__setattr__(self, "dataset_hash", digest.lower())
        if self.min_throughput is not None:
            value = _validate_number("min_throughput", self.min_throughput)
            if value < 0:
                raise SpecError("min_throughput", f"must be >= 0, got {value!r}")
            object.__setattr__(self, "min_throughput", float(value))
        _validate_int("created_at", self.created_at, 0)
        size = len(self.canonical_bytes())
        if size > MAX_CANONICAL_BYTES:
            limit = MAX_CANONICAL_BYTES
            raise SpecError("", f"canonical form is {size} bytes; the limit is {limit}")

    # --- parsing ------------------------------------------------------------------------------

    @classmethod
    def from_json(cls, text: str | bytes, *, supported_only: bool = True) -> TrainingTaskSpec:
        """Parse spec JSON strictly (see the module docstring); bytes must be UTF-8.

        ``supported_only=False`` lets modalities and tiers that are not supported yet through
        (for tooling and tests); a node accepting a task must leave it True.
        """
        parsed = _decode_json(text)
        return cls.from_dict(_unpair("", parsed), supported_only=supported_only)

    @classmethod
    def from_dict(cls, obj: object, *, supported_only: bool = True) -> TrainingTaskSpec:
        """Build a spec from decoded JSON (dicts, lists, str, int, float, bool, None)."""
        fields = _check_fields("", obj, _SPEC_FIELDS)
        architecture = Architecture.from_dict(fields["architecture"])
        aggregation = AggregationRule.from_spec(fields["aggregation"])
        reward_pool = _parse_uint256("reward_pool", fields["reward_pool"])
        values = {name: fields[name] for name in _SPEC_FIELDS}
        values.update(architecture=architecture, aggregation=aggregation, reward_pool=reward_pool)
        spec = cls(**values)
        if supported_only:
            spec.validate_supported()
        return spec

    def validate_supported(self) -> None:
        """Raise SpecError if a node must not start the spec as a run.

        That is: a modality or tier this node cannot run yet, or an aggregation rule that is
        defined at the quorum but not at some larger accepted count up to trainer_count, which
        would leave any round that accepts a straggler unfinalizable. This is an admission check
        (postTask, a trainer deciding to stake), not a validity rule of the value: specs stored
        or sealed before it existed still load and verify.
        """
        modality = self.architecture.modality
        if modality not in SUPPORTED_MODALITIES:
            message = f"modality {modality.value} is not supported yet"
            raise SpecError("architecture.modality", message)
        if self.tier not in SUPPORTED_TIERS:
            raise SpecError("tier", f"tier {self.tier.value} is not supported yet")
        try:
            self.aggregation.validate_for_accepted_counts(self.quorum, self.trainer_count)
        except AggregationError as exc:
            raise SpecError(
                "aggregation",
                f"must be defined for every accepted count from quorum {self.quorum} to "
                f"trainer_count {self.trainer_count}: {exc}",
            ) from None

    # --- serializing --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A fresh plain-JSON dict in field order; ``from_dict`` inverts it exactly."""
        return {
            "task_id": self.task_id,
            "sponsor_did": self.sponsor_did,
            "sponsor_address": self.sponsor_address,
            "architecture": self.architecture.to_dict(),
            "tier": self.tier.value,
            "aggregation": self.aggregation.to_spec(),
            "trainer_count": self.trainer_count,
            "quorum": self.quorum,
            "inner_steps": self.inner_steps,
            "max_rounds": self.max_rounds,
            "grace_window_ms": self.grace_window_ms,
            "reward_pool": str(self.reward_pool),
            "dataset_ref": self.dataset_ref,
            "dataset_hash": self.dataset_hash,
            "min_throughput": self.min_throughput,
            "created_at": self.created_at,
        }

    def to_json(self, *, indent: int | None = None) -> str:
        """The canonical JSON text; with ``indent``, a readable (non-canonical) rendering."""
        if indent is None:
            return self.canonical_bytes().decode("utf-8")
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False, allow_nan=False)

    def canonical_bytes(self) -> bytes:
        """RFC 8785 (JCS) bytes of ``to_dict()``: the Merkle leaf and the hash preimage."""
        return self._canonical

    def spec_hash(self) -> bytes:
        """SHA-256 of the canonical bytes (32 bytes)."""
        return hashlib.sha256(self._canonical).digest()

    @cached_property
    def _canonical(self) -> bytes:
        # Computed once: a frozen spec cannot change (cached_property bypasses __setattr__).
        try:
            return rfc8785.dumps(self.to_dict())
        except rfc8785.CanonicalizationError as exc:  # unreachable for a validated spec
            raise SpecError("", f"cannot canonicalize: {exc}") from None

    def __hash__(self) -> int:
        return hash(self._canonical)

    # --- convenience --------------------------------------------------------------------------

    @property
    def aggregation_rule(self) -> AggregationRule:
        """The aggregation rule (same object as ``aggregation``)."""
        return self.aggregation

    def init_checkpoint(self) -> InitCheckpoint | None:
        """The initial-model reference in ``architecture.metadata.init_checkpoint``, or None."""
        return self.architecture.init_checkpoint()

    @property
    def sponsor_address_bytes(self) -> bytes:
        """The sponsor address as 20 raw bytes (for ABI encoding and signature checks)."""
        return bytes.fromhex(self.sponsor_address[2:])

    @property
    def dataset_hash_bytes(self) -> bytes:
        """The dataset hash as 32 raw bytes."""
        return bytes.fromhex(self.dataset_hash[2:])


# --- JSON decoding helpers ----------------------------------------------------------------


def _decode_json(text: object) -> object:
    """Decode spec JSON text (str, or UTF-8 bytes) with objects kept as ``_Pairs``."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        raw = bytes(text)
        try:
            decoded = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = f"{exc.reason} at byte {exc.start}"
            raise SpecError("", f"spec JSON is not valid UTF-8 ({reason})") from None
    elif isinstance(text, str):
        decoded = text
        try:
            raw = text.encode("utf-8")
        except UnicodeEncodeError:
            raise SpecError("", "spec JSON text contains a lone surrogate") from None
    else:
        raise SpecError("", f"spec JSON must be str or bytes, got {type(text).__name__}")
    if len(raw) > MAX_SPEC_JSON_BYTES:
        limit = MAX_SPEC_JSON_BYTES
        raise SpecError("", f"spec JSON is {len(raw)} bytes; the limit is {limit}")
    if not is_json_depth_ok(raw):
        raise SpecError("", f"spec JSON nests deeper than {MAX_JSON_NESTING} levels")
    try:
        return json.loads(decoded, object_pairs_hook=_Pairs, parse_constant=_reject_constant)
    except SpecError:
        raise
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise SpecError("", f"invalid JSON: {exc.msg} ({where})") from None
    except (ValueError, RecursionError) as exc:
        # Python's int() digit limit, or nesting too deep for the decoder.
        raise SpecError("", f"invalid JSON: {exc}") from None


class _Pairs(list):  # type: ignore[type-arg]
    """A JSON object as decoded key/value pairs, kept as pairs so duplicates can be seen."""


def _reject_constant(name: str) -> None:
    raise SpecError("", f"invalid JSON: {name} is not a JSON number")


def _unpair(path: str, value: object) -> object:
    """Turn decoded ``_Pairs`` into dicts, rejecting duplicate keys with their path."""
    if isinstance(value, _Pairs):
        prefix = f"{path}." if path else ""
        out: dict[str, object] = {}
        for key, item in value:
            child = f"{prefix}{key}"
            if key in out:
                # Two values for one key: parsers disagree on which wins, so neither does.
                raise SpecError(child, "duplicate key")
            out[key] = _unpair(child, item)
        return out
    if isinstance(value, list):
        return [_unpair(f"{path}[{i}]", item) for i, item in enumerate(value)]
    return value


def _parse_uint256(path: str, value: object) -> int:
    if not isinstance(value, str):
        # A JSON number would pass through a double and lose precision above 2^53.
        raise SpecError(path, f"must be a decimal string (uint256), got {_describe(value)}")
    if _DECIMAL.fullmatch(value) is None:
        what = "decimal digits without sign, exponent or leading zeros"
        raise SpecError(path, f"must be {what}, got {value[:80]!r}")
    if len(value) > 78:  # 2^256 - 1 has 78 digits; also keeps int() far from its digit limit
        raise SpecError(path, "exceeds uint256")
    amount = int(value)
    if amount > MAX_UINT256:
        raise SpecError(path, "exceeds uint256")
    return amount
