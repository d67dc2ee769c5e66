"""The storage schema: every column family name, every key format, the schema version.

This is the only module that builds or parses keys. Code that stores something asks this module
for the key, so a change of layout is a change here (and a new :data:`SCHEMA_VERSION`), never a
string formatted somewhere else. The table of families and keys is in ``docs/storage.md``.

It is NOT the value encodings (run state, receipts, payloads are encoded by the modules that own
those records) and it does no I/O.

Key layout rules (they are what makes prefix iteration correct):

- A task_id inside a composite key is length-prefixed (one byte, then its UTF-8 bytes), so the
  prefix built for task ``"a"`` can never match a key of task ``"ab"``.
- Integers are unsigned big-endian with a fixed width (round and fragment: 4 bytes), so byte
  order is numeric order: iterating a prefix visits rounds and fragments in ascending order.
- Trainer addresses are the raw 20 bytes, so iterating one (task, round, fragment) visits the
  trainers in ascending address-byte order, which is the protocol's canonical order.
- Single-task keys (``training_runs``, ``training_receipts``) are the bare UTF-8 task_id, so
  iterating those families lists runs in task_id byte order.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Final

from storage.interface import KeyFormatError, StorageError

__all__ = [
    "ALL_COLUMN_FAMILIES",
    "CF_ACCOUNTS",
    "CF_EVIDENCE",
    "CF_LEDGER",
    "LEDGER_SUPPLY_KEY",
    "bond_key",
    "escrow_key",
    "parse_bond_key",
    "parse_escrow_key",
    "CF_META",
    "CF_MODEL_STATE",
    "CF_SUBMISSIONS",
    "CF_TRAINING_RECEIPTS",
    "CF_TRAINING_RUNS",
    "MODEL_FINAL",
    "MODEL_KINDS",
    "MODEL_MOMENTUM",
    "MODEL_WEIGHTS",
    "SCHEMA_VERSION",
    "SCHEMA_VERSION_KEY",
    "SEALED_RECORDS_SINCE",
    "UPGRADABLE_SCHEMA_VERSIONS",
    "EvidenceKey",
    "ModelKey",
    "SubmissionKey",
    "account_key",
    "decode_schema_version",
    "encode_schema_version",
    "evidence_key",
    "evidence_prefix",
    "model_key",
    "model_prefix",
    "parse_account_key",
    "parse_evidence_key",
    "parse_model_key",
    "parse_receipt_key",
    "parse_run_key",
    "parse_submission_key",
    "receipt_key",
    "run_key",
    "submission_key",
    "submission_prefix",
    "task_prefix",
]

# --- column families ----------------------------------------------------------------------

CF_TRAINING_RUNS: Final = "training_runs"
"""Run state, keyed by :func:`run_key`."""
CF_TRAINING_RECEIPTS: Final = "training_receipts"
"""Sealed TrainingReceipts, keyed by :func:`receipt_key`."""
CF_ACCOUNTS: Final = "accounts"
"""Balances, stakes and nonces per address, keyed by :func:`account_key`."""
CF_SUBMISSIONS: Final = "submissions"
"""Accepted outer-gradient submissions, keyed by :func:`submission_key`."""
CF_MODEL_STATE: Final = "model_state"
"""The global model a node holds per run: weights, outer momentum, final weights, per fragment;
keyed by :func:`model_key`."""
CF_EVIDENCE: Final = "evidence"
"""Equivocation evidence, keyed by :func:`evidence_key`."""
CF_LEDGER: Final = "ledger"
"""TNZO ledger entries other than balances: escrows (:func:`escrow_key`), bonds
(:func:`bond_key`) and the supply counters (:data:`LEDGER_SUPPLY_KEY`)."""
CF_META: Final = "meta"
"""Store metadata: the schema version (:data:`SCHEMA_VERSION_KEY`)."""

ALL_COLUMN_FAMILIES: Final[tuple[str, ...]] = (
    CF_TRAINING_RUNS,
    CF_TRAINING_RECEIPTS,
    CF_ACCOUNTS,
    CF_SUBMISSIONS,
    CF_MODEL_STATE,
    CF_EVIDENCE,
    CF_LEDGER,
    CF_META,
)

# --- schema version -----------------------------------------------------------------------

SCHEMA_VERSION: Final = 6
"""Version of the layout in this module. Bump it on any incompatible change of a family, a key
format or a value encoding stored here; a store with a newer version refuses to open.

History: 1, the first layout, kept every run's current weights and momentum in
:data:`CF_MODEL_STATE`. 2 keeps them as of the run's model snapshot
(:func:`model_snapshot_key`) and the node replays the rounds after it; a version-1 store is
read as version 2 (a run without a snapshot record has its snapshot at its current round,
which is what version 1 stored). 3 adds each sealed run's :func:`sealed_record_key` (its run
root and receipt digest, what TRAINING_VERIFY's lookup reads), written with the seal; the node
writes the missing ones of an older store at startup. 4 keeps each committed round record under
its own :func:`round_record_key` and the run's value without them (``record_count`` in their
place): up to 3 the value held every record and every transition rewrote it whole, so a run's
writes grew with the square of its rounds (soak probe: 1.19 GB of log for 600 rounds of a
tiny model, submissions 10x slower by the end). A version-3 value (``records`` inline) is read as
it is and written in the new form by the run's next transition. 5 stores no momentum in a
round-0 snapshot (the one a post writes): it is zero before any round, and a post wrote those
4 bytes per parameter through the WAL on the service thread; a version-4 store's stored zeros
are not read. 6 keeps large values of :data:`EXTERNAL_VALUE_KEYSPACES` (payloads, model
fragments) in files beside the database, a reference under their key (:mod:`storage.external`);
a version-5 store's values in the keys themselves are read as they are. Older stores are marked
6 when opened, see :data:`UPGRADABLE_SCHEMA_VERSIONS`."""
SEALED_RECORDS_SINCE: Final = 3
"""The first schema version whose stores hold a sealed record for every sealed run."""
UPGRADABLE_SCHEMA_VERSIONS: Final = frozenset({1, 2, 3, 4, 5})
"""Older versions whose data this code reads as it is: opening such a store rewrites its version
key to :data:`SCHEMA_VERSION` (code that only knows the old version then refuses it, as it must:
version 1 code would take snapshot weights for current ones, version 2 code would seal runs
without the record the precompile looks up, version 3 code would read a run without its
records, version 4 code would find no momentum for a run whose latest snapshot is its
round-0 one: up to ``model_snapshot_rounds`` - 1 committed rounds, or ended before its first
snapshot after round 0, version 5 code would take a reference for a payload or a fragment)."""
SCHEMA_VERSION_KEY: Final = b"schema_version"
"""Key in :data:`CF_META`; the value is the version as an unsigned 32-bit big-endian integer."""

_U32 = struct.Struct(">I")
_U32_MAX: Final = 2**32 - 1


def encode_schema_version(version: int) -> bytes:
    """The stored form of a schema version: 4 bytes, big-endian."""
    return _u32("schema version", version)


def decode_schema_version(raw: bytes) -> int:
    """Parse the stored schema version; StorageError if it is not 4 bytes."""
    if not isinstance(raw, bytes) or len(raw) != _U32.size:
        raise StorageError(f"stored schema version is malformed: {raw!r} (expected 4 bytes)")
    return int(_U32.unpack(raw)[0])


# --- field encoders -----------------------------------------------------------------------

# The SPEC's task_id alphabet: 1-128 characters of [A-Za-z0-9._-]. Being ASCII, its UTF-8 form is
# at most 128 bytes, which fits the one-byte length prefix.
_TASK_ID_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")
_ADDRESS_LEN: Final = 20

MODEL_WEIGHTS: Final = b"w"
"""Model kind: the global weights of a fragment as of the run's model snapshot
(:func:`model_snapshot_key`)."""
MODEL_MOMENTUM: Final = b"m"
"""Model kind: the outer optimizer's (Nesterov) momentum buffer of a fragment, as of the run's
model snapshot."""
MODEL_FINAL: Final = b"f"
"""Model kind: the final weights of a fragment, written when the run is sealed."""
MODEL_KINDS: Final = frozenset({MODEL_WEIGHTS, MODEL_MOMENTUM, MODEL_FINAL})


def _task_bytes(task_id: str) -> bytes:
    if not isinstance(task_id, str) or _TASK_ID_RE.fullmatch(task_id) is None:
        raise KeyFormatError(
            f"task_id must be 1-128 characters of [A-Za-z0-9._-], got {task_id!r}", task_id
        )
    return task_id.encode("ascii")


def _task_field(task_id: str) -> bytes:
    raw = _task_bytes(task_id)
    return bytes((len(raw),)) + raw


def _u32(name: str, value: int) -> bytes:
    # bool is an int subclass; a True round is a bug upstream, not round 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise KeyFormatError(f"{name} must be an int, got {type(value).__name__}", value)
    if not 0 <= value <= _U32_MAX:
        raise KeyFormatError(f"{name} must be in [0, 2**32 - 1], got {value}", value)
    return _U32.pack(value)


def _address(name: str, value: bytes) -> bytes:
    if not isinstance(value, bytes) or len(value) != _ADDRESS_LEN:
        raise KeyFormatError(f"{name} must be 20 raw bytes, got {value!r}", value)
    return value


def _model_kind(kind: bytes) -> bytes:
    if not isinstance(kind, bytes) or kind not in MODEL_KINDS:
        raise KeyFormatError(f"model kind must be one of b'w', b'm', b'f', got {kind!r}", kind)
    return kind


# --- key builders -------------------------------------------------------------------------


def run_key(task_id: str) -> bytes:
    """Key of a run in :data:`CF_TRAINING_RUNS`: the task_id's UTF-8 bytes."""
    return _task_bytes(task_id)


def receipt_key(task_id: str) -> bytes:
    """Key of a sealed receipt in :data:`CF_TRAINING_RECEIPTS`: the task_id's UTF-8 bytes."""
    return _task_bytes(task_id)


def account_key(address: bytes) -> bytes:
    """Key of an account in :data:`CF_ACCOUNTS`: the 20-byte address."""
    return _address("address", address)


LEDGER_SUPPLY_KEY: Final = b"s"
"""Key in :data:`CF_LEDGER` of the supply counters: minted u256 BE || burned u256 BE."""


def escrow_key(task_id: str) -> bytes:
    """Key of a task's reward escrow in :data:`CF_LEDGER`: b"e" || len(task_id) u8 || task_id."""
    return b"e" + _task_field(task_id)


def bond_key(task_id: str, trainer: bytes) -> bytes:
    """Key of a trainer's bonded stake in :data:`CF_LEDGER`: b"b" || len u8 || task_id || trainer."""
    return b"b" + _task_field(task_id) + _address("trainer", trainer)


def parse_bond_key(key: bytes) -> tuple[str, bytes]:
    """The (task_id, trainer) of a :func:`bond_key`."""
    if not isinstance(key, bytes) or len(key) < 2 + _ADDRESS_LEN or key[:1] != b"b":
        raise KeyFormatError(f"not a bond key: {key!r}", key)
    task_id, rest = _split_task_field(key[1:], "bond")
    return task_id, _address("bond trainer", rest)


def parse_escrow_key(key: bytes) -> str:
    """The task_id of an :func:`escrow_key`."""
    if not isinstance(key, bytes) or key[:1] != b"e":
        raise KeyFormatError(f"not an escrow key: {key!r}", key)
    task_id, rest = _split_task_field(key[1:], "escrow")
    if rest:
        raise KeyFormatError(f"trailing bytes in escrow key: {key!r}", key)
    return task_id


def task_prefix(task_id: str) -> bytes:
    """Prefix of every composite key of one task (submissions, model state, evidence)."""
    return _task_field(task_id)


def submission_key(task_id: str, round: int, fragment: int, trainer: bytes) -> bytes:
    """Key in :data:`CF_SUBMISSIONS`: len(task_id) u8 || task_id || round u32 || fragment u32
    || trainer (20 bytes)."""
    return (
        _task_field(task_id)
        + _u32("round", round)
        + _u32("fragment", fragment)
        + _address("trainer", trainer)
    )


def submission_prefix(task_id: str, round: int, fragment: int | None = None) -> bytes:
    """Prefix of every submission of one round, or of one (round, fragment) when given."""
    prefix = _task_field(task_id) + _u32("round", round)
    if fragment is not None:
        prefix += _u32("fragment", fragment)
    return prefix


def model_key(task_id: str, kind: bytes, fragment: int) -> bytes:
    """Key in :data:`CF_MODEL_STATE`: len(task_id) u8 || task_id || kind (1 byte: w, m or f)
    || fragment u32."""
    return _task_field(task_id) + _model_kind(kind) + _u32("fragment", fragment)


def model_prefix(task_id: str, kind: bytes | None = None) -> bytes:
    """Prefix of one task's model state, or of one kind of it (fragments in order)."""
    prefix = _task_field(task_id)
    if kind is not None:
        prefix += _model_kind(kind)
    return prefix


def evidence_key(task_id: str, round: int, fragment: int, trainer: bytes) -> bytes:
    """Key in :data:`CF_EVIDENCE`: the same layout as :func:`submission_key`."""
    return submission_key(task_id, round, fragment, trainer)


def evidence_prefix(task_id: str, round: int, fragment: int | None = None) -> bytes:
    """Prefix of the evidence of one round, or of one (round, fragment) when given."""
    return submission_prefix(task_id, round, fragment)


# --- key parsers --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SubmissionKey:
    """A parsed :func:`submission_key`."""

    task_id: str
    """The run's task_id."""
    round: int
    """Round index, from 0."""
    fragment: int
    """Fragment index, from 0."""
    trainer: bytes
    """The submitting trainer's 20-byte address."""


@dataclass(frozen=True, slots=True)
class EvidenceKey:
    """A parsed :func:`evidence_key`."""

    task_id: str
    """The run's task_id."""
    round: int
    """Round of the equivocation."""
    fragment: int
    """Fragment of the equivocation."""
    trainer: bytes
    """The equivocating trainer's 20-byte address."""


@dataclass(frozen=True, slots=True)
class ModelKey:
    """A parsed :func:`model_key`."""

    task_id: str
    """The run's task_id."""
    kind: bytes
    """:data:`MODEL_WEIGHTS`, :data:`MODEL_MOMENTUM` or :data:`MODEL_FINAL`."""
    fragment: int
    """Fragment index, from 0."""


def _parse_task_bare(key: bytes, what: str) -> str:
    if not isinstance(key, bytes):
        raise KeyFormatError(f"{what} key must be bytes, got {type(key).__name__}", key)
    try:
        task_id = key.decode("ascii")
    except UnicodeDecodeError:
        raise KeyFormatError(f"{what} key is not a task_id: {key!r}", key) from None
    if _TASK_ID_RE.fullmatch(task_id) is None:
        raise KeyFormatError(f"{what} key is not a task_id: {key!r}", key)
    return task_id


def _split_task_field(key: bytes, what: str) -> tuple[str, bytes]:
    """Split a composite key into its task_id and the rest."""
    if not isinstance(key, bytes) or len(key) < 1:
        raise KeyFormatError(f"{what} key is empty or not bytes: {key!r}", key)
    length = key[0]
    if len(key) < 1 + length:
        raise KeyFormatError(f"{what} key is truncated inside its task_id: {key!r}", key)
    return _parse_task_bare(key[1 : 1 + length], what), key[1 + length :]


def parse_run_key(key: bytes) -> str:
    """The task_id of a :func:`run_key`."""
    return _parse_task_bare(key, "run")


def parse_receipt_key(key: bytes) -> str:
    """The task_id of a :func:`receipt_key`."""
    return _parse_task_bare(key, "receipt")


def parse_account_key(key: bytes) -> bytes:
    """The address of an :func:`account_key`."""
    try:
        return _address("account key", key)
    except KeyFormatError:
        raise KeyFormatError(f"account key must be 20 bytes, got {key!r}", key) from None


def _parse_round_fragment_trainer(key: bytes, what: str) -> tuple[str, int, int, bytes]:
    task_id, rest = _split_task_field(key, what)
    if len(rest) != 4 + 4 + _ADDRESS_LEN:
        raise KeyFormatError(
            f"{what} key has {len(rest)} bytes after its task_id, expected 28: {key!r}", key
        )
    round_, fragment = struct.unpack(">II", rest[:8])
    return task_id, round_, fragment, rest[8:]


def parse_submission_key(key: bytes) -> SubmissionKey:
    """Parse a :func:`submission_key`; KeyFormatError if it is not one."""
    return SubmissionKey(*_parse_round_fragment_trainer(key, "submission"))


def parse_evidence_key(key: bytes) -> EvidenceKey:
    """Parse an :func:`evidence_key`; KeyFormatError if it is not one."""
    return EvidenceKey(*_parse_round_fragment_trainer(key, "evidence"))


def parse_model_key(key: bytes) -> ModelKey:
    """Parse a :func:`model_key`; KeyFormatError if it is not one."""
    task_id, rest = _split_task_field(key, "model")
    if len(rest) != 1 + 4:
        raise KeyFormatError(
            f"model key has {len(rest)} bytes after its task_id, expected 5: {key!r}", key
        )
    kind = rest[:1]
    if kind not in MODEL_KINDS:
        raise KeyFormatError(f"model key has unknown kind {kind!r}: {key!r}", key)
    return ModelKey(task_id, kind, int(_U32.unpack(rest[1:])[0]))


# --- node service records (appended for tenzro_training.node) -------------------------------
#
# Three kinds of node-side values that the families above have no key for. They live in
# existing families behind a first byte that no existing key of that family can start with, so
# the key formats above (and their parsers) are unchanged (they needed no schema version bump).

__all__ += [
    "NODE_ALIVE_KEY",
    "NODE_CHAIN_ID_KEY",
    "NODE_GENESIS_KEY",
    "PAYLOAD_KEY_MARK",
    "TASK_RECORD_MARK",
    "payload_key",
    "payload_prefix",
    "parse_payload_key",
    "tensor_specs_key",
    "round_reports_key",
    "round_reports_prefix",
]

PAYLOAD_KEY_MARK: Final = b"\x00"
"""First byte of a payload key in :data:`CF_SUBMISSIONS`. A submission key starts with the
task_id's length (1..128), never 0, so payload keys and submission keys cannot collide and a
``task_prefix`` scan never meets a payload."""
_PAYLOAD_HASH_LEN: Final = 32

NODE_GENESIS_KEY: Final = b"node.genesis"
"""Key in :data:`CF_META`: present once the genesis balances were credited (value: the node's
record of what was credited)."""
NODE_CHAIN_ID_KEY: Final = b"node.chain_id"
"""Key in :data:`CF_META`: the chain id (u256 big-endian) every signature in the store was
checked under, written with the genesis (or at the first start of an older store); a node
configured with another chain id refuses to open the store. Offline tools do not touch it."""
NODE_ALIVE_KEY: Final = b"node.alive_ms"
"""Key in :data:`CF_META`: the last instant (u64 big-endian wall-clock ms) the node was seen
serving, written about once a second; a restart moves deadlines later by the time since
(``run.process_pause``)."""
TASK_RECORD_MARK: Final = b"T"
"""First byte of per-task node records in :data:`CF_META` (distinct from ``schema_version``,
``node.genesis`` and ``node.alive_ms``)."""
_TENSOR_SPECS_KIND: Final = b"s"
_ROUND_REPORTS_KIND: Final = b"r"


def payload_key(task_id: str, payload_hash: bytes) -> bytes:
    """Key of an outer-gradient payload's bytes in :data:`CF_SUBMISSIONS`:
    0x00 || len(task_id) u8 || task_id || payload hash (32 bytes). Payloads are stored once per
    (task, hash), whether they came inline with a submission or over gossip."""
    if not isinstance(payload_hash, bytes) or len(payload_hash) != _PAYLOAD_HASH_LEN:
        raise KeyFormatError(f"payload hash must be 32 raw bytes, got {payload_hash!r}", payload_hash)
    return PAYLOAD_KEY_MARK + _task_field(task_id) + payload_hash


def payload_prefix(task_id: str) -> bytes:
    """Prefix of every payload key of one task."""
    return PAYLOAD_KEY_MARK + _task_field(task_id)


def parse_payload_key(key: bytes) -> tuple[str, bytes]:
    """The (task_id, payload_hash) of a :func:`payload_key`."""
    if not isinstance(key, bytes) or key[:1] != PAYLOAD_KEY_MARK:
        raise KeyFormatError(f"not a payload key: {key!r}", key)
    task_id, rest = _split_task_field(key[1:], "payload")
    if len(rest) != _PAYLOAD_HASH_LEN:
        raise KeyFormatError(f"payload key has {len(rest)} bytes after its task_id, expected 32", key)
    return task_id, rest


def tensor_specs_key(task_id: str) -> bytes:
    """Key in :data:`CF_META` of a run's global-model tensor list (names, shapes, dtypes: what
    the fragment layouts and the model hash are computed from): b"T" || lp(task_id) || b"s"."""
    return _task_record_prefix(task_id, _TENSOR_SPECS_KIND)


def _task_record_prefix(task_id: str, kind: bytes) -> bytes:
    """b"T" || lp(task_id) || kind: the prefix of one kind of per-task record in CF_META."""
    return TASK_RECORD_MARK + _task_field(task_id) + kind


def _task_round_key(task_id: str, kind: bytes, round: int) -> bytes:
    """b"T" || lp(task_id) || kind || round u32: a per-task, per-round record in CF_META."""
    return _task_record_prefix(task_id, kind) + _u32("round", round)


def _parse_task_round_key(key: bytes, kind: bytes, what: str) -> tuple[str, int]:
    """The (task_id, round) of a :func:`_task_round_key` of ``kind``; KeyFormatError otherwise."""
    if not isinstance(key, bytes) or key[:1] != TASK_RECORD_MARK:
        raise KeyFormatError(f"not a {what} key: {key!r}", key)
    task_id, rest = _split_task_field(key[1:], what)
    if len(rest) != 1 + 4 or rest[:1] != kind:
        raise KeyFormatError(f"not a {what} key: {key!r}", key)
    return task_id, int(_U32.unpack(rest[1:])[0])


def round_reports_key(task_id: str, round: int) -> bytes:
    """Key in :data:`CF_META` of one finalized round's aggregation reports (one per fragment):
    b"T" || lp(task_id) || b"r" || round u32."""
    return _task_round_key(task_id, _ROUND_REPORTS_KIND, round)


def round_reports_prefix(task_id: str) -> bytes:
    """Prefix of every round-report key of one task (rounds in ascending order)."""
    return _task_record_prefix(task_id, _ROUND_REPORTS_KIND)


# --- finalize signatures (appended for the offline receipt verifier) -------------------------
#
# The syncer's FinalizeRound signature of each finalized round, so a sealed run's receipt can be
# shown with every signature behind it (docs/receipt.md "Offline verification"). Another per-task
# record kind in CF_META behind TASK_RECORD_MARK: no existing key changes (no schema version bump).

__all__ += ["finalize_signature_key", "finalize_signature_prefix", "parse_finalize_signature_key"]

_FINALIZE_SIGNATURE_KIND: Final = b"f"


def finalize_signature_key(task_id: str, round: int) -> bytes:
    """Key in :data:`CF_META` of a finalized round's syncer signature record:
    b"T" || lp(task_id) || b"f" || round u32."""
    return _task_round_key(task_id, _FINALIZE_SIGNATURE_KIND, round)


def finalize_signature_prefix(task_id: str) -> bytes:
    """Prefix of every finalize-signature key of one task (rounds in ascending order)."""
    return _task_record_prefix(task_id, _FINALIZE_SIGNATURE_KIND)


def parse_finalize_signature_key(key: bytes) -> tuple[str, int]:
    """The (task_id, round) of a :func:`finalize_signature_key`; KeyFormatError otherwise."""
    return _parse_task_round_key(key, _FINALIZE_SIGNATURE_KIND, "finalize-signature")


# --- round records (schema version 4) -----------------------------------------------------------
#
# A committed round's RoundRecord, written once, with the finalize that commits it; the run's
# value in CF_TRAINING_RUNS holds only the count. Appending a record is then O(1), not a rewrite
# of every record before it.

__all__ += ["parse_round_record_key", "round_record_key", "round_record_prefix"]

_ROUND_RECORD_KIND: Final = b"c"


def round_record_key(task_id: str, round: int) -> bytes:
    """Key in :data:`CF_META` of one committed round's record (``RoundRecord.to_dict()`` as
    deterministic JSON): b"T" || lp(task_id) || b"c" || round u32."""
    return _task_round_key(task_id, _ROUND_RECORD_KIND, round)


def round_record_prefix(task_id: str) -> bytes:
    """Prefix of every round-record key of one task (rounds in ascending order)."""
    return _task_record_prefix(task_id, _ROUND_RECORD_KIND)


def parse_round_record_key(key: bytes) -> tuple[str, int]:
    """The (task_id, round) of a :func:`round_record_key`; KeyFormatError otherwise."""
    return _parse_task_round_key(key, _ROUND_RECORD_KIND, "round-record")


# --- values kept in files (schema version 6) ---------------------------------------------------

__all__ += ["EXTERNAL_VALUE_KEYSPACES", "is_external_keyspace"]

EXTERNAL_VALUE_KEYSPACES: Final[tuple[tuple[str, bytes], ...]] = (
    (CF_SUBMISSIONS, PAYLOAD_KEY_MARK),
    (CF_MODEL_STATE, b""),
)
"""(column family, key prefix) pairs whose large values the RocksDB store keeps in files, a
reference under the key (:mod:`storage.external`): the outer-gradient payloads and the model
fragments (weights, momentum, final), megabytes each, written once and read whole. Only these:
a reference is told from a value by its first bytes, which no value stored here by an older
version can begin with (``storage.external.REF_MAGIC``), and nothing else is large."""


def is_external_keyspace(cf: str, key: bytes) -> bool:
    """Whether ``cf[key]`` is in :data:`EXTERNAL_VALUE_KEYSPACES`."""
    return any(cf == family and key.startswith(prefix) for family, prefix in EXTERNAL_VALUE_KEYSPACES)


# --- model snapshots (schema version 2) -------------------------------------------------------
#
# Which round the stored weights and momentum of a run are the state before: the node writes
# them every ``model_snapshot_rounds`` rounds, not every round, and rebuilds the current state by
# replaying the committed rounds after the snapshot from their stored payloads.

__all__ += ["PAYLOADS_PRUNED_ALL", "model_snapshot_key", "payloads_pruned_key"]

_MODEL_SNAPSHOT_KIND: Final = b"n"
_PAYLOADS_PRUNED_KIND: Final = b"p"
PAYLOADS_PRUNED_ALL: Final = 2**64 - 1
"""The :func:`payloads_pruned_key` value once every payload of a run is deleted (it ended)."""


def model_snapshot_key(task_id: str) -> bytes:
    """Key in :data:`CF_META` of a run's model snapshot record (the count of rounds applied to
    the stored :data:`MODEL_WEIGHTS` and :data:`MODEL_MOMENTUM`): b"T" || lp(task_id) || b"n"."""
    return _task_record_prefix(task_id, _MODEL_SNAPSHOT_KIND)


def payloads_pruned_key(task_id: str) -> bytes:
    """Key in :data:`CF_META` of a run's pruning record (``prune_payloads``): the payloads of its
    rounds before this one (u64; :data:`PAYLOADS_PRUNED_ALL`: every payload) were deleted on
    purpose. Absent: none were. b"T" || lp(task_id) || b"p"."""
    return _task_record_prefix(task_id, _PAYLOADS_PRUNED_KIND)


# --- sealed records (schema version 3) ----------------------------------------------------------
#
# What the chain state holds for a sealed run (SPEC "TRAINING_VERIFY"): its run root and the
# SHA-256 of its receipt's canonical ABI bytes, written in the sealing batch, so the
# precompile's lookup is one small read instead of decoding and re-encoding a receipt of up to
# megabytes on every call (unpriced work an attacker could repeat for the precompile's base gas).

__all__ += ["sealed_record_key"]

_SEALED_RECORD_KIND: Final = b"v"


def sealed_record_key(task_id: str) -> bytes:
    """Key in :data:`CF_META` of a sealed run's record (run root || receipt digest, 64 bytes):
    b"T" || lp(task_id) || b"v"."""
    return _task_record_prefix(task_id, _SEALED_RECORD_KIND)


# --- ended-run summaries ------------------------------------------------------------------------
#
# An ended run's listRuns entry, written in the batch that ends it, so a node's start reads one
# small value per ended run instead of decoding the run and all its round records (which made a
# start's time and peak memory grow with every round the node ever held).

__all__ += ["ended_summary_key"]

_ENDED_SUMMARY_KIND: Final = b"e"


def ended_summary_key(task_id: str) -> bytes:
    """Key in :data:`CF_META` of an ended run's summary (its listRuns entry, JSON):
    b"T" || lp(task_id) || b"e". Absent for an open run, and for a run that ended under a version
    that did not write it (the next start writes it)."""
    return _task_record_prefix(task_id, _ENDED_SUMMARY_KIND)
