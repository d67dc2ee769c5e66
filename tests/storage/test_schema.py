"""Key formats of storage/schema.py: exact bytes, round trips, prefix isolation, ordering."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage import schema
from storage.interface import KeyFormatError, StorageError
from storage.schema import (
    MODEL_FINAL,
    MODEL_MOMENTUM,
    MODEL_WEIGHTS,
    EvidenceKey,
    ModelKey,
    SubmissionKey,
)
from tenzro_training.errors import TenzroError

TRAINER = bytes(range(20))
task_ids = st.from_regex(r"[A-Za-z0-9._-]{1,128}", fullmatch=True)
u32s = st.integers(min_value=0, max_value=2**32 - 1)
addresses = st.binary(min_size=20, max_size=20)
kinds = st.sampled_from([MODEL_WEIGHTS, MODEL_MOMENTUM, MODEL_FINAL])


# --- fixed vectors (the table in docs/storage.md) ------------------------------------------


def test_column_family_names() -> None:
    assert schema.ALL_COLUMN_FAMILIES == (
        "training_runs",
        "training_receipts",
        "accounts",
        "submissions",
        "model_state",
        "evidence",
        "ledger",
        "meta",
    )
    assert schema.CF_TRAINING_RUNS == "training_runs"
    assert schema.CF_TRAINING_RECEIPTS == "training_receipts"
    assert len(set(schema.ALL_COLUMN_FAMILIES)) == len(schema.ALL_COLUMN_FAMILIES)
    assert "default" not in schema.ALL_COLUMN_FAMILIES


def test_schema_version_encoding() -> None:
    assert schema.SCHEMA_VERSION == 6 and schema.UPGRADABLE_SCHEMA_VERSIONS == frozenset({1, 2, 3, 4, 5})
    assert schema.SCHEMA_VERSION_KEY == b"schema_version"
    assert schema.encode_schema_version(1) == b"\x00\x00\x00\x01"
    assert schema.encode_schema_version(0x01020304) == b"\x01\x02\x03\x04"
    assert schema.decode_schema_version(b"\x00\x00\x01\x00") == 256


def test_key_vectors() -> None:
    assert schema.run_key("task-1") == b"task-1"
    assert schema.receipt_key("a.B_9") == b"a.B_9"
    assert schema.account_key(TRAINER) == TRAINER
    assert schema.task_prefix("ab") == b"\x02ab"
    # docs/storage.md's example row for round_record_key (schema 4).
    assert schema.round_record_key("ab", 1) == bytes.fromhex("5402616263" "00000001")
    assert schema.round_record_prefix("ab") == b"T\x02abc"
    assert schema.parse_round_record_key(schema.round_record_key("ab", 7)) == ("ab", 7)
    for bad in (b"T\x02abr\x00\x00\x00\x01", b"T\x02abc\x00\x00\x01", b"X\x02abc\x00\x00\x00\x01"):
        with pytest.raises(schema.KeyFormatError):
            schema.parse_round_record_key(bad)
    assert schema.submission_key("ab", 1, 2, TRAINER) == (
        b"\x02ab" + b"\x00\x00\x00\x01" + b"\x00\x00\x00\x02" + TRAINER
    )
    assert schema.submission_prefix("ab", 1) == b"\x02ab\x00\x00\x00\x01"
    assert schema.submission_prefix("ab", 1, 2) == b"\x02ab\x00\x00\x00\x01\x00\x00\x00\x02"
    assert schema.evidence_key("ab", 1, 2, TRAINER) == schema.submission_key("ab", 1, 2, TRAINER)
    assert schema.evidence_prefix("ab", 7) == schema.submission_prefix("ab", 7)
    assert schema.model_key("ab", MODEL_MOMENTUM, 3) == b"\x02abm\x00\x00\x00\x03"
    assert schema.model_key("ab", MODEL_WEIGHTS, 0) == b"\x02abw\x00\x00\x00\x00"
    assert schema.model_key("ab", MODEL_FINAL, 2**32 - 1) == b"\x02abf\xff\xff\xff\xff"
    assert schema.model_prefix("ab") == b"\x02ab"
    assert schema.model_prefix("ab", MODEL_FINAL) == b"\x02abf"
    long_id = "x" * 128
    assert schema.task_prefix(long_id) == b"\x80" + long_id.encode()


# --- round trips --------------------------------------------------------------------------


@given(task_ids)
def test_single_task_keys_round_trip(task_id: str) -> None:
    assert schema.parse_run_key(schema.run_key(task_id)) == task_id
    assert schema.parse_receipt_key(schema.receipt_key(task_id)) == task_id


@given(addresses)
def test_account_key_round_trips(address: bytes) -> None:
    assert schema.parse_account_key(schema.account_key(address)) == address


@given(task_ids, u32s, u32s, addresses)
def test_submission_and_evidence_keys_round_trip(
    task_id: str, round_: int, fragment: int, trainer: bytes
) -> None:
    key = schema.submission_key(task_id, round_, fragment, trainer)
    assert schema.parse_submission_key(key) == SubmissionKey(task_id, round_, fragment, trainer)
    assert key.startswith(schema.task_prefix(task_id))
    assert key.startswith(schema.submission_prefix(task_id, round_))
    assert key.startswith(schema.submission_prefix(task_id, round_, fragment))
    evidence = schema.evidence_key(task_id, round_, fragment, trainer)
    assert schema.parse_evidence_key(evidence) == EvidenceKey(task_id, round_, fragment, trainer)


@given(task_ids, kinds, u32s)
def test_model_key_round_trips(task_id: str, kind: bytes, fragment: int) -> None:
    key = schema.model_key(task_id, kind, fragment)
    assert schema.parse_model_key(key) == ModelKey(task_id, kind, fragment)
    assert key.startswith(schema.model_prefix(task_id))
    assert key.startswith(schema.model_prefix(task_id, kind))


# --- prefix isolation and ordering --------------------------------------------------------


@given(task_ids, task_ids, u32s, u32s, addresses)
def test_prefixes_of_different_tasks_never_collide(
    a: str, b: str, round_: int, fragment: int, trainer: bytes
) -> None:
    if a == b:
        return
    key_b = schema.submission_key(b, round_, fragment, trainer)
    assert not key_b.startswith(schema.task_prefix(a))
    assert not key_b.startswith(schema.submission_prefix(a, round_))
    assert not schema.model_key(b, MODEL_WEIGHTS, fragment).startswith(schema.model_prefix(a))


def test_prefix_isolation_for_a_task_id_that_prefixes_another() -> None:
    # The case the length prefix exists for: "a" is a string prefix of "ab".
    key = schema.submission_key("ab", 0, 0, TRAINER)
    assert not key.startswith(schema.task_prefix("a"))
    assert not key.startswith(schema.submission_prefix("a", 0))


@given(task_ids, u32s, u32s)
def test_other_rounds_and_fragments_fall_outside_a_prefix(
    task_id: str, round_: int, fragment: int
) -> None:
    prefix = schema.submission_prefix(task_id, round_, fragment)
    other_round = schema.submission_key(task_id, (round_ + 1) % 2**32, fragment, TRAINER)
    other_fragment = schema.submission_key(task_id, round_, (fragment + 1) % 2**32, TRAINER)
    assert not other_round.startswith(prefix)
    assert not other_fragment.startswith(prefix)


@given(task_ids, st.lists(st.tuples(u32s, u32s, addresses), min_size=2, max_size=20))
def test_byte_order_is_numeric_then_canonical_trainer_order(
    task_id: str, entries: list[tuple[int, int, bytes]]
) -> None:
    keys = [schema.submission_key(task_id, r, f, t) for r, f, t in entries]
    by_bytes = [
        (parsed.round, parsed.fragment, parsed.trainer)
        for parsed in map(schema.parse_submission_key, sorted(keys))
    ]
    assert by_bytes == sorted(entries)


@given(task_ids, st.lists(st.tuples(kinds, u32s), min_size=2, max_size=20))
def test_model_keys_order_by_kind_then_fragment(
    task_id: str, entries: list[tuple[bytes, int]]
) -> None:
    keys = sorted(schema.model_key(task_id, k, f) for k, f in entries)
    parsed = [(m.kind, m.fragment) for m in map(schema.parse_model_key, keys)]
    assert parsed == sorted(entries)


# --- invalid inputs -----------------------------------------------------------------------

BAD_TASK_IDS = ["", "x" * 129, "a/b", "a b", "é", "a\x00", "tâche", b"abc", None, 7]


@pytest.mark.parametrize("task_id", BAD_TASK_IDS)
def test_invalid_task_id(task_id: object) -> None:
    builders = [
        lambda: schema.run_key(task_id),  # type: ignore[arg-type]
        lambda: schema.receipt_key(task_id),  # type: ignore[arg-type]
        lambda: schema.task_prefix(task_id),  # type: ignore[arg-type]
        lambda: schema.submission_key(task_id, 0, 0, TRAINER),  # type: ignore[arg-type]
        lambda: schema.submission_prefix(task_id, 0),  # type: ignore[arg-type]
        lambda: schema.model_key(task_id, MODEL_WEIGHTS, 0),  # type: ignore[arg-type]
        lambda: schema.evidence_key(task_id, 0, 0, TRAINER),  # type: ignore[arg-type]
    ]
    for build in builders:
        with pytest.raises(KeyFormatError) as info:
            build()
        assert info.value.value == task_id


@pytest.mark.parametrize("number", [-1, 2**32, 2**64, True, 1.0, "1"])
def test_invalid_round_or_fragment(number: object) -> None:
    with pytest.raises(KeyFormatError):
        schema.submission_key("t", number, 0, TRAINER)  # type: ignore[arg-type]
    with pytest.raises(KeyFormatError):
        schema.submission_key("t", 0, number, TRAINER)  # type: ignore[arg-type]
    with pytest.raises(KeyFormatError):
        schema.submission_prefix("t", number)  # type: ignore[arg-type]
    with pytest.raises(KeyFormatError):
        schema.submission_prefix("t", 0, number)  # type: ignore[arg-type]
    with pytest.raises(KeyFormatError):
        schema.model_key("t", MODEL_WEIGHTS, number)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "address", [b"", bytes(19), bytes(21), "0x" + "00" * 20, bytearray(20), None]
)
def test_invalid_address(address: object) -> None:
    with pytest.raises(KeyFormatError):
        schema.account_key(address)  # type: ignore[arg-type]
    with pytest.raises(KeyFormatError):
        schema.submission_key("t", 0, 0, address)  # type: ignore[arg-type]
    with pytest.raises(KeyFormatError):
        schema.evidence_key("t", 0, 0, address)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", [b"x", b"W", b"", b"ww", "w", [b"w"]])
def test_invalid_model_kind(kind: object) -> None:
    with pytest.raises(KeyFormatError):
        schema.model_key("t", kind, 0)  # type: ignore[arg-type]
    with pytest.raises(KeyFormatError):
        schema.model_prefix("t", kind)  # type: ignore[arg-type]


def test_invalid_missing_required_numbers_and_kind() -> None:
    # None means "no narrowing" only where a parameter is optional (a prefix's last part).
    with pytest.raises(KeyFormatError):
        schema.submission_key("t", None, 0, TRAINER)  # type: ignore[arg-type]
    with pytest.raises(KeyFormatError):
        schema.submission_key("t", 0, None, TRAINER)  # type: ignore[arg-type]
    with pytest.raises(KeyFormatError):
        schema.submission_prefix("t", None)  # type: ignore[arg-type]
    with pytest.raises(KeyFormatError):
        schema.model_key("t", None, 0)  # type: ignore[arg-type]
    with pytest.raises(KeyFormatError):
        schema.model_key("t", MODEL_WEIGHTS, None)  # type: ignore[arg-type]
    assert schema.submission_prefix("t", 0, None) == schema.submission_prefix("t", 0)
    assert schema.model_prefix("t", None) == schema.task_prefix("t")


GOOD_SUBMISSION = schema.submission_key("ab", 1, 2, TRAINER)
GOOD_MODEL = schema.model_key("ab", MODEL_WEIGHTS, 2)


@pytest.mark.parametrize(
    "key",
    [
        b"",
        GOOD_SUBMISSION[:-1],  # truncated trainer
        GOOD_SUBMISSION + b"\x00",  # trailing byte
        b"\x05ab",  # length byte claims more than there is
        b"\x00" + GOOD_SUBMISSION[1:],  # empty task_id
        b"\x02a/" + GOOD_SUBMISSION[3:],  # task_id outside the alphabet
        b"\x02\xc3\xa9" + GOOD_SUBMISSION[3:],  # non-ASCII task_id
        "text",
    ],
)
def test_invalid_submission_and_evidence_keys(key: object) -> None:
    with pytest.raises(KeyFormatError):
        schema.parse_submission_key(key)  # type: ignore[arg-type]
    with pytest.raises(KeyFormatError):
        schema.parse_evidence_key(key)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "key",
    [b"", GOOD_MODEL[:-1], GOOD_MODEL + b"\x00", GOOD_MODEL.replace(b"w", b"q", 1), b"\x09ab"],
)
def test_invalid_model_keys(key: bytes) -> None:
    with pytest.raises(KeyFormatError):
        schema.parse_model_key(key)


@pytest.mark.parametrize("key", [b"", b"a/b", b"\xff", b"x" * 129, "text"])
def test_invalid_run_and_receipt_keys(key: object) -> None:
    with pytest.raises(KeyFormatError):
        schema.parse_run_key(key)  # type: ignore[arg-type]
    with pytest.raises(KeyFormatError):
        schema.parse_receipt_key(key)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", [b"", bytes(19), bytes(21), "0x00"])
def test_invalid_account_keys(key: object) -> None:
    with pytest.raises(KeyFormatError):
        schema.parse_account_key(key)  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", [b"", b"\x01", b"\x00\x00\x00\x00\x01", "1", None])
def test_invalid_schema_version_bytes(raw: object) -> None:
    with pytest.raises(StorageError):
        schema.decode_schema_version(raw)  # type: ignore[arg-type]


@pytest.mark.parametrize("version", [-1, 2**32])
def test_invalid_schema_version_number(version: int) -> None:
    with pytest.raises(KeyFormatError):
        schema.encode_schema_version(version)


def test_key_format_error_is_in_the_tree() -> None:
    error = KeyFormatError("bad", 3)
    assert isinstance(error, StorageError)
    assert isinstance(error, TenzroError)
    assert isinstance(error, ValueError)
    assert error.value == 3


def test_ledger_keys_round_trip() -> None:
    assert schema.parse_escrow_key(schema.escrow_key("task-1")) == "task-1"
    assert schema.parse_bond_key(schema.bond_key("task-1", TRAINER)) == ("task-1", TRAINER)
    # Escrow, bond and supply keys never collide: their first byte differs.
    assert {schema.escrow_key("s")[:1], schema.bond_key("s", TRAINER)[:1], schema.LEDGER_SUPPLY_KEY[:1]} == {b"e", b"b", b"s"}


@pytest.mark.parametrize("key", [b"", b"x", b"e", b"e\x05ab", b"e\x01a\x00", b"b\x01a" + b"\x00" * 19])
def test_invalid_ledger_keys(key: bytes) -> None:
    with pytest.raises(KeyFormatError):
        if key[:1] == b"b":
            schema.parse_bond_key(key)
        else:
            schema.parse_escrow_key(key)


# --- node service records (payloads, tensor specs, round reports, genesis flag) ------------


def test_node_record_key_vectors() -> None:
    digest = bytes(range(32))
    assert schema.payload_key("ab", digest) == b"\x00\x02ab" + digest
    assert schema.payload_prefix("ab") == b"\x00\x02ab"
    assert schema.tensor_specs_key("ab") == b"T\x02abs"
    assert schema.round_reports_key("ab", 3) == b"T\x02abr\x00\x00\x00\x03"
    assert schema.round_reports_prefix("ab") == b"T\x02abr"
    assert schema.NODE_GENESIS_KEY == b"node.genesis"
    # CF_META's keys stay apart from each other.
    meta = {schema.SCHEMA_VERSION_KEY, schema.NODE_GENESIS_KEY, schema.tensor_specs_key("ab")}
    assert len({k[:1] for k in meta}) == 3


@given(task_ids, st.binary(min_size=32, max_size=32), u32s, addresses)
def test_payload_keys_round_trip_and_never_meet_submission_keys(
    task_id: str, digest: bytes, round_: int, trainer: bytes
) -> None:
    key = schema.payload_key(task_id, digest)
    assert schema.parse_payload_key(key) == (task_id, digest)
    assert key.startswith(schema.payload_prefix(task_id))
    assert not key.startswith(schema.task_prefix(task_id))
    assert not schema.submission_key(task_id, round_, 0, trainer).startswith(schema.payload_prefix(task_id))
    assert schema.round_reports_key(task_id, round_).startswith(schema.round_reports_prefix(task_id))


def test_invalid_node_record_keys() -> None:
    with pytest.raises(KeyFormatError):
        schema.payload_key("ab", b"\x01" * 31)
    with pytest.raises(KeyFormatError):
        schema.payload_key("a/b", b"\x01" * 32)
    with pytest.raises(KeyFormatError):
        schema.parse_payload_key(schema.submission_key("ab", 0, 0, TRAINER))
    with pytest.raises(KeyFormatError):
        schema.parse_payload_key(schema.payload_key("ab", b"\x01" * 32) + b"x")
    with pytest.raises(KeyFormatError):
        schema.round_reports_key("ab", 2**32)
    with pytest.raises(KeyFormatError):
        schema.tensor_specs_key("")


# --- finalize signatures ------------------------------------------------------------------


def test_finalize_signature_key_vectors() -> None:
    assert schema.finalize_signature_key("ab", 3) == b"T\x02abf\x00\x00\x00\x03"
    assert schema.model_snapshot_key("ab") == b"T\x02abn"
    assert schema.payloads_pruned_key("ab") == b"T\x02abp"
    assert schema.sealed_record_key("ab") == b"T\x02abv"
    kinds = [schema.tensor_specs_key, schema.model_snapshot_key, schema.payloads_pruned_key, schema.sealed_record_key]
    assert len({make("ab") for make in kinds}) == len(kinds)
    assert schema.finalize_signature_prefix("ab") == b"T\x02abf"
    # Distinct from the other per-task records of CF_META.
    others = {schema.tensor_specs_key("ab"), schema.round_reports_key("ab", 3), schema.round_reports_prefix("ab")}
    assert not any(k.startswith(schema.finalize_signature_prefix("ab")) for k in others)


@given(task_ids, u32s, u32s)
def test_finalize_signature_keys_round_trip_and_order(task_id: str, a: int, b: int) -> None:
    key_a, key_b = schema.finalize_signature_key(task_id, a), schema.finalize_signature_key(task_id, b)
    assert schema.parse_finalize_signature_key(key_a) == (task_id, a)
    assert key_a.startswith(schema.finalize_signature_prefix(task_id))
    assert (key_a < key_b) == (a < b)  # byte order is round order
    assert not key_a.startswith(schema.round_reports_prefix(task_id))


def test_invalid_finalize_signature_keys() -> None:
    with pytest.raises(KeyFormatError):
        schema.finalize_signature_key("ab", 2**32)
    with pytest.raises(KeyFormatError):
        schema.finalize_signature_key("a/b", 0)
    with pytest.raises(KeyFormatError):
        schema.parse_finalize_signature_key(schema.round_reports_key("ab", 0))
    with pytest.raises(KeyFormatError):
        schema.parse_finalize_signature_key(schema.finalize_signature_key("ab", 0) + b"x")
    with pytest.raises(KeyFormatError):
        schema.parse_finalize_signature_key(b"")


@pytest.mark.parametrize("mark", [b"\x00", b"S", b"U", b"t", b"e", b"b"])
def test_invalid_finalize_signature_key_with_another_first_byte(mark: bytes) -> None:
    key = schema.finalize_signature_key("ab", 7)
    assert schema.parse_finalize_signature_key(key) == ("ab", 7)
    with pytest.raises(KeyFormatError, match="not a finalize-signature key"):
        schema.parse_finalize_signature_key(mark + key[1:])


@pytest.mark.parametrize("key", ["T\x02abf\x00\x00\x00\x07", bytearray(b"T\x02abf\x00\x00\x00\x07"), None])
def test_invalid_finalize_signature_key_that_is_not_bytes(key: object) -> None:
    with pytest.raises(KeyFormatError):
        schema.parse_finalize_signature_key(key)  # type: ignore[arg-type]
