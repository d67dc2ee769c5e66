"""Tests for tenzro_training.spec: strict parsing, canonical bytes (RFC 8785) and the spec hash."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import pickle
from pathlib import Path
from typing import Any

import pytest
from eth_utils import to_checksum_address
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tenzro_training
from tenzro_training.errors import SpecError
from tenzro_training.rules import AggregationRule, RuleKind
from tenzro_training.spec import (
    MAX_CANONICAL_BYTES,
    MAX_METADATA_DEPTH,
    MAX_SPEC_JSON_BYTES,
    Architecture,
    DType,
    FrozenJsonObject,
    InitCheckpoint,
    Modality,
    Tier,
    TrainingTaskSpec,
)

EXAMPLE_PATH = Path(tenzro_training.__file__).parent / "data" / "timesfm-200m-task.json"
SAFE = 2**53 - 1
ADDRESS = "0x7E5F4552091A69125d5DfCb7b8C2659029395Bdf"  # EIP-55 form of the key-1 address
DATASET_HASH = "0xc2f1668a50e34ace913b8adcf1b00576cc1a2954ace03326735f5a31a49c4081"

# The shipped example's canonical bytes, written out by hand from RFC 8785: keys sorted
# (all ASCII here, so UTF-16 order is byte order), no whitespace, strings as-is, integers
# in plain decimal, null for min_throughput.
EXAMPLE_CANONICAL = (
    b'{"aggregation":"Mean",'
    b'"architecture":{"dtype":"bf16","family":"timesfm","fragment_count":12,'
    b'"metadata":{"context_len":2048,"horizon":128},"modality":"Timeseries",'
    b'"param_count":200000000},'
    b'"created_at":1761350400,'
    b'"dataset_hash":"' + DATASET_HASH.encode() + b'",'
    b'"dataset_ref":"ipfs://QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG",'
    b'"grace_window_ms":30000,"inner_steps":24,"max_rounds":1024,"min_throughput":null,'
    b'"quorum":6,"reward_pool":"1000000000000000000000",'
    b'"sponsor_address":"' + ADDRESS.encode() + b'",'
    b'"sponsor_did":"did:tenzro:human:01JSQ3N2K8Z7X4V6B9C1D5E0FA",'
    b'"task_id":"train-2026-04-25-timesfm-200m","tier":"Open","trainer_count":8}'
)


def example_text() -> str:
    return EXAMPLE_PATH.read_text(encoding="utf-8")


def example() -> dict[str, Any]:
    """A fresh, mutable copy of the shipped example as plain JSON values."""
    return json.loads(example_text())


def with_value(path: str, value: object) -> dict[str, Any]:
    """The example with one (possibly nested, dot-separated) field set."""
    doc = example()
    *parents, last = path.split(".")
    node = doc
    for name in parents:
        node = node[name]
    node[last] = value
    return doc


def without(path: str) -> dict[str, Any]:
    doc = example()
    *parents, last = path.split(".")
    node = doc
    for name in parents:
        node = node[name]
    del node[last]
    return doc


def spec_error(obj: object, **kwargs: Any) -> SpecError:
    """Parse ``obj`` (text, bytes or a decoded dict) and return the SpecError it raises."""
    with pytest.raises(SpecError) as err:
        if isinstance(obj, (str, bytes)):
            TrainingTaskSpec.from_json(obj, **kwargs)
        else:
            TrainingTaskSpec.from_dict(obj, **kwargs)
    return err.value


def assert_rejected(obj: object, path: str, **kwargs: Any) -> SpecError:
    """Both entry points reject ``obj`` with the same path (dicts are also tried as JSON)."""
    err = spec_error(obj, **kwargs)
    assert err.path == path, f"expected path {path!r}, got {err.path!r}: {err}"
    if isinstance(obj, dict):
        as_json = spec_error(json.dumps(obj, allow_nan=True), **kwargs)
        assert as_json.path == path
    return err


# --- the shipped example ---------------------------------------------------------------------


def test_shipped_example_parses() -> None:
    spec = TrainingTaskSpec.from_json(EXAMPLE_PATH.read_bytes())
    assert spec.task_id == "train-2026-04-25-timesfm-200m"
    assert spec.sponsor_address == ADDRESS
    assert spec.architecture == Architecture(
        family="timesfm",
        param_count=200_000_000,
        modality=Modality.TIMESERIES,
        fragment_count=12,
        dtype=DType.BF16,
        metadata={"context_len": 2048, "horizon": 128},
    )
    assert spec.tier is Tier.OPEN
    assert spec.aggregation_rule == AggregationRule.mean()
    assert (spec.trainer_count, spec.quorum, spec.inner_steps) == (8, 6, 24)
    assert (spec.max_rounds, spec.grace_window_ms) == (1024, 30000)
    assert spec.reward_pool == 10**21
    assert spec.min_throughput is None
    assert spec.created_at == 1761350400
    assert spec.init_checkpoint() is None


def test_example_canonical_bytes_match_hand_derivation() -> None:
    spec = TrainingTaskSpec.from_json(example_text())
    assert spec.canonical_bytes() == EXAMPLE_CANONICAL
    assert spec.to_json() == EXAMPLE_CANONICAL.decode()


def test_example_spec_hash_is_sha256_of_canonical_bytes() -> None:
    spec = TrainingTaskSpec.from_json(example_text())
    digest = spec.spec_hash()
    assert len(digest) == 32
    assert digest == hashlib.sha256(EXAMPLE_CANONICAL).digest()
    # Pinned so that any change to the canonical form shows up as a failing test.
    assert digest.hex() == "b4e13204e791b3987cf86ef84338812cd5b0921364bb1be21d392c655ef3a105"


def test_spec_hash_ignores_whitespace_key_order_and_spelling() -> None:
    base = TrainingTaskSpec.from_json(example_text())
    doc = example()
    reordered = dict(reversed(list(doc.items())))
    reordered["architecture"] = dict(reversed(list(doc["architecture"].items())))
    reordered["sponsor_address"] = ADDRESS.lower()
    reordered["dataset_hash"] = "0x" + DATASET_HASH[2:].upper()
    text = json.dumps(reordered, indent=4, ensure_ascii=True)
    other = TrainingTaskSpec.from_json(text.encode("utf-8"))
    assert other == base
    assert other.canonical_bytes() == base.canonical_bytes()
    assert other.spec_hash() == base.spec_hash()


def test_spec_hash_changes_with_any_field() -> None:
    base = TrainingTaskSpec.from_json(example_text()).spec_hash()
    changed = [
        with_value("quorum", 5),
        with_value("architecture.metadata", {"context_len": 2048, "horizon": 64}),
        with_value("reward_pool", "1000000000000000000001"),
        with_value("aggregation", "CoordinateMedian"),
    ]
    hashes = {TrainingTaskSpec.from_dict(doc).spec_hash() for doc in changed}
    assert base not in hashes and len(hashes) == len(changed)


# --- RFC 8785 ------------------------------------------------------------------------------

# Metadata from RFC 8785 section 3.2.3 (sorting) and 3.2.2 (strings, numbers), as JSON text.
RFC_METADATA_JSON = r"""{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis",
  "numbers": [333333333.33333329, 4.50, 2e-3, 0.000000000000000000000000001,
              -0.0, 1.0, -1e-7, 9007199254740991, 1E-6, 100],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/"
}"""

# Derived by hand from the RFC's rules:
# - keys sorted by UTF-16 code units: "\r" (000D) < "1" (0031) < "numbers" < "string" <
#   U+0080 < U+00F6 < U+20AC < U+1F600 (as D83D DE00) < U+FB33. Note the emoji sorts BEFORE
#   U+FB33 although its code point is larger: that is the UTF-16 rule.
# - strings: only '"', '\\' and controls < 0x20 are escaped; \n, \r use their short forms,
#   other controls \u00XX in lowercase hex; "/" and all non-ASCII are written raw as UTF-8.
# - numbers: ECMAScript Number-to-String: shortest round-trip digits, exponent only below
#   1e-6 (or from 1e21), no "+", no trailing ".0"; -0 is "0".
RFC_METADATA_CANONICAL = (
    b'{"\\r":"Carriage Return",'
    b'"1":"One",'
    b'"numbers":[333333333.3333333,4.5,0.002,1e-27,0,1,-1e-7,9007199254740991,0.000001,100],'
    b'"string":"\xe2\x82\xac$\\u000f\\nA\'B\\"\\\\\\\\\\"/",'
    b'"\xc2\x80":"Control",'
    b'"\xc3\xb6":"Latin Small Letter O With Diaeresis",'
    b'"\xe2\x82\xac":"Euro Sign",'
    b'"\xf0\x9f\x98\x80":"Emoji: Grinning Face",'
    b'"\xef\xac\xb3":"Hebrew Letter Dalet With Dagesh"}'
)


def test_rfc8785_canonical_bytes_by_hand() -> None:
    text = example_text().replace(
        '{ "context_len": 2048, "horizon": 128 }', RFC_METADATA_JSON
    )
    assert text != example_text()
    spec = TrainingTaskSpec.from_json(text)
    expected = EXAMPLE_CANONICAL.replace(
        b'{"context_len":2048,"horizon":128}', RFC_METADATA_CANONICAL
    )
    assert spec.canonical_bytes() == expected
    assert spec.spec_hash() == hashlib.sha256(expected).digest()
    # Reparsing the canonical form is a fixed point.
    again = TrainingTaskSpec.from_json(spec.canonical_bytes())
    assert again == spec and again.canonical_bytes() == expected
    # Numbers are held in one normal form: integral doubles became ints, -0.0 became 0.
    numbers = spec.architecture.metadata["numbers"]
    assert numbers[4] == 0 and type(numbers[4]) is int
    assert numbers[5] == 1 and type(numbers[5]) is int
    assert type(numbers[0]) is float


def test_metadata_number_normal_form() -> None:
    spec = TrainingTaskSpec.from_dict(
        with_value("architecture.metadata", {"a": 2.0, "b": -0.0, "c": 0.5, "d": SAFE})
    )
    assert spec.architecture.metadata == {"a": 2, "b": 0, "c": 0.5, "d": SAFE}
    assert [type(v) for v in spec.architecture.metadata.values()] == [int, int, float, int]
    assert b'"metadata":{"a":2,"b":0,"c":0.5,"d":9007199254740991}' in spec.canonical_bytes()


# --- round trips ---------------------------------------------------------------------------


def test_round_trips() -> None:
    spec = TrainingTaskSpec.from_dict(
        with_value(
            "architecture.metadata",
            {
                "init_checkpoint": {"uri": "file:///m.st", "sha256": DATASET_HASH},
                "x": [1, 0.25, None, True, {"y": "\u00e9\U0001f600"}],
            },
        )
    )
    assert TrainingTaskSpec.from_json(spec.to_json()) == spec
    assert TrainingTaskSpec.from_dict(spec.to_dict()) == spec
    assert TrainingTaskSpec.from_json(spec.to_json(indent=2)) == spec
    assert TrainingTaskSpec.from_json(spec.to_json()).canonical_bytes() == spec.canonical_bytes()
    assert json.loads(spec.to_json()) == spec.to_dict()


@pytest.mark.parametrize(
    "rule",
    ["Mean", "CoordinateMedian", {"TrimmedMean": {"alpha_bps": 1666}}, {"Krum": {"f": 1}}],
)
def test_every_rule_form_round_trips_in_a_spec(rule: object) -> None:
    spec = TrainingTaskSpec.from_dict(with_value("aggregation", rule))
    assert spec.to_dict()["aggregation"] == rule
    assert TrainingTaskSpec.from_json(spec.to_json()) == spec


def test_min_throughput_forms() -> None:
    for value, stored in [(None, None), (0, 0.0), (7, 7.0), (12.5, 12.5), (-0.0, 0.0)]:
        spec = TrainingTaskSpec.from_dict(with_value("min_throughput", value))
        assert spec.min_throughput == stored
        assert TrainingTaskSpec.from_json(spec.to_json()) == spec
    spec = TrainingTaskSpec.from_dict(with_value("min_throughput", 12.5))
    assert b'"min_throughput":12.5' in spec.canonical_bytes()
    spec = TrainingTaskSpec.from_dict(with_value("min_throughput", 7))
    assert b'"min_throughput":7,' in spec.canonical_bytes()


def test_to_dict_is_a_fresh_copy() -> None:
    spec = TrainingTaskSpec.from_json(example_text())
    first = spec.to_dict()
    first["architecture"]["metadata"]["horizon"] = 1
    first["quorum"] = 1
    assert spec.to_dict() == example()
    assert spec.canonical_bytes() == EXAMPLE_CANONICAL


def test_spec_is_frozen_and_hashable() -> None:
    spec = TrainingTaskSpec.from_json(example_text())
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.quorum = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.architecture.metadata["horizon"] = 1  # type: ignore[index]
    twin = TrainingTaskSpec.from_dict(example())
    assert twin == spec and hash(twin) == hash(spec)
    assert len({spec, twin, TrainingTaskSpec.from_dict(with_value("quorum", 5))}) == 2
    assert hash(spec.architecture) == hash(twin.architecture)


def test_spec_survives_pickle_and_deepcopy() -> None:
    spec = TrainingTaskSpec.from_dict(with_value("architecture.metadata.x", {"y": [1, {"z": 0.5}]}))
    for clone in (copy.deepcopy(spec), pickle.loads(pickle.dumps(spec))):
        assert clone == spec
        assert clone.canonical_bytes() == spec.canonical_bytes()
        assert hash(clone) == hash(spec)
    metadata = spec.architecture.metadata
    assert isinstance(metadata, FrozenJsonObject)
    assert metadata["x"] == {"y": (1, {"z": 0.5})}
    assert hash(metadata) == hash(FrozenJsonObject(dict(metadata)))


def test_metadata_input_is_copied() -> None:
    metadata: dict[str, Any] = {"layers": [1, 2]}
    spec = TrainingTaskSpec.from_dict(with_value("architecture.metadata", metadata))
    metadata["layers"].append(3)
    metadata["new"] = 1
    assert spec.architecture.metadata == {"layers": (1, 2)}


def test_metadata_keys_are_in_sorted_order_at_every_depth() -> None:
    """A run's view put the sponsor's key order while its spec came from the post and sorted
    order once read back from the store: getRun's bytes changed across a restart."""
    given = {"z": 1, "a": {"y": [{"q": 1, "b": 2}], "c": None}, "m": "x"}
    spec = TrainingTaskSpec.from_dict(with_value("architecture.metadata", given))
    metadata = spec.architecture.metadata
    assert list(metadata) == ["a", "m", "z"] and list(metadata["a"]) == ["c", "y"]
    assert list(metadata["a"]["y"][0]) == ["b", "q"]
    assert list(spec.to_dict()["architecture"]["metadata"]) == ["a", "m", "z"]
    reordered = TrainingTaskSpec.from_dict(with_value("architecture.metadata", dict(reversed(given.items()))))
    assert reordered.spec_hash() == spec.spec_hash() and reordered == spec


def test_direct_construction_validates_and_normalizes() -> None:
    spec = TrainingTaskSpec.from_json(example_text())
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    fields.update(sponsor_address=ADDRESS.upper().replace("0X", "0x"), tier="Open")
    built = TrainingTaskSpec(**fields)
    assert built == spec and built.sponsor_address == ADDRESS and built.tier is Tier.OPEN
    with pytest.raises(SpecError) as err:
        dataclasses.replace(spec, quorum=9)
    assert err.value.path == "quorum"
    with pytest.raises(SpecError) as err:
        dataclasses.replace(spec, aggregation=AggregationRule.krum(2))
    assert err.value.path == "aggregation"
    with pytest.raises(SpecError) as err:
        dataclasses.replace(spec, architecture={"family": "timesfm"})
    assert err.value.path == "architecture"
    with pytest.raises(SpecError) as err:
        dataclasses.replace(spec, aggregation="Mean")
    assert err.value.path == "aggregation"
    with pytest.raises(SpecError) as err:
        dataclasses.replace(spec, reward_pool="10")
    assert err.value.path == "reward_pool"


def test_byte_helpers() -> None:
    spec = TrainingTaskSpec.from_json(example_text())
    assert spec.sponsor_address_bytes == bytes.fromhex("7e5f4552091a69125d5dfcb7b8c2659029395bdf")
    assert spec.dataset_hash_bytes == bytes.fromhex(DATASET_HASH[2:])
    assert DType.BF16.itemsize == 2 and DType.FP16.itemsize == 2 and DType.FP32.itemsize == 4


def test_boundary_values_accepted() -> None:
    doc = example()
    doc.update(
        task_id="A" * 128,
        sponsor_did="did:tenzro:" + "k" * 32 + ":" + "i" * 128,
        trainer_count=SAFE,
        quorum=1,
        inner_steps=SAFE,
        max_rounds=SAFE,
        grace_window_ms=0,
        reward_pool=str(2**256 - 1),
        created_at=0,
        min_throughput=0,
        dataset_ref="x:" + "y" * 2046,
    )
    doc["architecture"].update(param_count=SAFE, fragment_count=SAFE, metadata={})
    spec = TrainingTaskSpec.from_dict(doc)
    assert spec.reward_pool == 2**256 - 1
    assert TrainingTaskSpec.from_json(spec.to_json()) == spec
    assert TrainingTaskSpec.from_dict(with_value("reward_pool", "0")).reward_pool == 0
    assert TrainingTaskSpec.from_dict(with_value("quorum", 8)).quorum == 8


# --- sponsor address -----------------------------------------------------------------------


def test_sponsor_address_spellings_share_one_canonical_form() -> None:
    forms = [ADDRESS, ADDRESS.lower(), "0x" + ADDRESS[2:].upper()]
    specs = [TrainingTaskSpec.from_dict(with_value("sponsor_address", a)) for a in forms]
    assert {s.sponsor_address for s in specs} == {ADDRESS}
    assert len({s.spec_hash() for s in specs}) == 1


@pytest.mark.parametrize(
    "bad",
    [
        "0x7E5F4552091A69125d5DfCb7b8C2659029395BdF",  # mixed case, wrong checksum
        "0x7e5F4552091a69125d5dfcb7b8c2659029395bdf",
        "7E5F4552091A69125d5DfCb7b8C2659029395Bdf",  # no prefix
        "0X7E5F4552091A69125D5DFCB7B8C2659029395BDF",
        "0x7e5f4552091a69125d5dfcb7b8c2659029395bd",  # 39 digits
        "0x7e5f4552091a69125d5dfcb7b8c2659029395bdf0",  # 41 digits
        "0x7e5f4552091a69125d5dfcb7b8c2659029395bdg",
        "0x7e5f4552091a69125d5dfcb7b8c2659029395bdf\n",
        "",
        1234,
        None,
    ],
)
def test_invalid_sponsor_address(bad: object) -> None:
    assert_rejected(with_value("sponsor_address", bad), "sponsor_address")


# --- field-by-field invalid cases --------------------------------------------------------

TOP_FIELDS = list(example())
ARCH_FIELDS = list(example()["architecture"])
INT_FIELDS = [
    ("trainer_count", 1), ("quorum", 1), ("inner_steps", 1), ("max_rounds", 1),
    ("grace_window_ms", 0), ("created_at", 0),
    ("architecture.param_count", 1), ("architecture.fragment_count", 1),
]  # fmt: skip


def test_fields_are_exactly_the_seeds() -> None:
    assert TOP_FIELDS == [
        "task_id", "sponsor_did", "sponsor_address", "architecture", "tier", "aggregation",
        "trainer_count", "quorum", "inner_steps", "max_rounds", "grace_window_ms", "reward_pool",
        "dataset_ref", "dataset_hash", "min_throughput", "created_at",
    ]  # fmt: skip
    assert ARCH_FIELDS == [
        "family", "param_count", "modality", "fragment_count", "dtype", "metadata",
    ]  # fmt: skip
    assert [f.name for f in dataclasses.fields(TrainingTaskSpec)] == TOP_FIELDS
    assert [f.name for f in dataclasses.fields(Architecture)] == ARCH_FIELDS


@pytest.mark.parametrize("name", TOP_FIELDS)
def test_invalid_missing_field(name: str) -> None:
    err = assert_rejected(without(name), name)
    assert "missing" in err.reason


@pytest.mark.parametrize("name", ARCH_FIELDS)
def test_invalid_missing_architecture_field(name: str) -> None:
    assert_rejected(without(f"architecture.{name}"), f"architecture.{name}")


def test_invalid_unknown_field() -> None:
    err = assert_rejected(with_value("priority", 1), "priority")
    assert "unknown" in err.reason
    assert_rejected(with_value("Task_ID", "x"), "Task_ID")


def test_invalid_unknown_architecture_field() -> None:
    assert_rejected(with_value("architecture.layers", 12), "architecture.layers")


def test_unknown_metadata_fields_are_accepted() -> None:
    spec = TrainingTaskSpec.from_dict(with_value("architecture.metadata.anything", {"goes": [1]}))
    assert spec.architecture.metadata["anything"] == {"goes": (1,)}


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ('"quorum": 6,', "quorum"),
        ('"dtype": "bf16",', "architecture.dtype"),
        ('"horizon": 128', "architecture.metadata.horizon"),
    ],
)
def test_invalid_duplicate_key(text: str, path: str) -> None:
    member = text.rstrip(",")
    doubled = example_text().replace(member, f"{member}, {member}", 1)
    assert doubled.count(member) == 2
    json.loads(doubled)  # the stdlib would silently keep the last value
    err = assert_rejected(doubled, path)
    assert "duplicate" in err.reason


def test_invalid_duplicate_key_nested_in_metadata_array() -> None:
    text = example_text().replace(
        '{ "context_len": 2048, "horizon": 128 }', '{"layers": [{"d": 1}, {"d": 1, "d": 2}]}'
    )
    assert_rejected(text, "architecture.metadata.layers[1].d")


@pytest.mark.parametrize(("path", "minimum"), INT_FIELDS)
def test_invalid_boolean_as_integer(path: str, minimum: int) -> None:
    assert_rejected(with_value(path, True), path)
    assert_rejected(with_value(path, False), path)


@pytest.mark.parametrize(("path", "minimum"), INT_FIELDS)
def test_invalid_non_integer(path: str, minimum: int) -> None:
    for bad in (6.0, 6.5, "6", None, [6], {"n": 6}):
        assert_rejected(with_value(path, bad), path)


@pytest.mark.parametrize(("path", "minimum"), INT_FIELDS)
def test_invalid_integer_below_minimum(path: str, minimum: int) -> None:
    assert_rejected(with_value(path, minimum - 1), path)


@pytest.mark.parametrize(("path", "minimum"), INT_FIELDS)
def test_invalid_integer_beyond_json_safe_range(path: str, minimum: int) -> None:
    err = assert_rejected(with_value(path, 2**53), path)
    assert "2^53-1" in err.reason


def test_invalid_quorum_exceeds_trainer_count() -> None:
    assert_rejected(with_value("quorum", 9), "quorum")
    doc = example()
    doc.update(trainer_count=3, quorum=4)
    assert_rejected(doc, "quorum")


@pytest.mark.parametrize(
    "bad", ["", "A" * 129, "has space", "a/b", "caf\u00e9", "task\n", "x:y", 7, None]
)
def test_invalid_task_id(bad: object) -> None:
    assert_rejected(with_value("task_id", bad), "task_id")


@pytest.mark.parametrize(
    "bad",
    [
        "did:tenzro:Human:01J",
        "did:tenzro:human:",
        "did:tenzro::01J",
        "did:tenzro:human:01J:extra",
        "did:tenzro:hum4n:01J",
        "did:key:z6Mkabc",
        "DID:tenzro:human:01J",
        "did:tenzro:human:" + "a" * 129,
        "did:tenzro:" + "k" * 33 + ":a",
        "did:tenzro:human:01 J",
        "did:tenzro:human:01J\n",
        "",
        42,
    ],
)
def test_invalid_sponsor_did(bad: object) -> None:
    assert_rejected(with_value("sponsor_did", bad), "sponsor_did")


@pytest.mark.parametrize("bad", ["", "TimesFM", "times fm", "-timesfm", "a" * 65, 3, None])
def test_invalid_family(bad: object) -> None:
    assert_rejected(with_value("architecture.family", bad), "architecture.family")


@pytest.mark.parametrize("bad", ["timeseries", "TIMESERIES", "Audio", "", 0, None])
def test_invalid_modality_value(bad: object) -> None:
    assert_rejected(with_value("architecture.modality", bad), "architecture.modality")


@pytest.mark.parametrize("bad", ["BF16", "int8", "float32", "", None, 16])
def test_invalid_dtype(bad: object) -> None:
    assert_rejected(with_value("architecture.dtype", bad), "architecture.dtype")


@pytest.mark.parametrize("bad", ["open", "Closed", "", None, 0])
def test_invalid_tier_value(bad: object) -> None:
    assert_rejected(with_value("tier", bad), "tier")


@pytest.mark.parametrize("modality", ["Language", "Vision", "Multimodal"])
def test_invalid_unsupported_modality(modality: str) -> None:
    err = assert_rejected(with_value("architecture.modality", modality), "architecture.modality")
    assert err.reason == f"modality {modality} is not supported yet"
    # The type system knows it; only the gate rejects it.
    spec = TrainingTaskSpec.from_dict(
        with_value("architecture.modality", modality), supported_only=False
    )
    assert spec.architecture.modality is Modality(modality)


@pytest.mark.parametrize("tier", ["Verified", "Confidential"])
def test_invalid_unsupported_tier(tier: str) -> None:
    err = assert_rejected(with_value("tier", tier), "tier")
    assert err.reason == f"tier {tier} is not supported yet"
    spec = TrainingTaskSpec.from_json(json.dumps(with_value("tier", tier)), supported_only=False)
    assert spec.tier is Tier(tier)
    with pytest.raises(SpecError):
        spec.validate_supported()


@pytest.mark.parametrize(
    ("rule", "path"),
    [
        ("Average", "aggregation"),
        ({"Krum": {"f": 2}}, "aggregation"),  # K = 6 needs K > 2f + 2
        ({"TrimmedMean": {"alpha_bps": 5000}}, "aggregation"),  # trims all 6
        ({"TrimmedMean": {"alpha_bps": 10001}}, "aggregation.TrimmedMean.alpha_bps"),
        ({"TrimmedMean": {"alpha_bps": -1}}, "aggregation.TrimmedMean.alpha_bps"),
        ({"TrimmedMean": {"alpha_bps": True}}, "aggregation.TrimmedMean.alpha_bps"),
        ({"TrimmedMean": {"alpha_bps": 1, "x": 1}}, "aggregation.TrimmedMean.x"),
        ({"Krum": {"f": 1.0}}, "aggregation.Krum.f"),
        ({"Mean": {}}, "aggregation"),
        (None, "aggregation"),
    ],
)
def test_invalid_aggregation(rule: object, path: str) -> None:
    assert_rejected(with_value("aggregation", rule), path)


def test_aggregation_is_checked_against_the_specs_quorum() -> None:
    doc = with_value("aggregation", {"Krum": {"f": 2}})
    doc["quorum"] = 7
    assert TrainingTaskSpec.from_dict(doc).aggregation_rule == AggregationRule.krum(2)
    assert TrainingTaskSpec.from_dict(doc).aggregation_rule.kind is RuleKind.KRUM


def test_invalid_rule_undefined_at_a_larger_accepted_count() -> None:
    """alpha_bps 5000 keeps one value of K = 7 but none of 8: a round that accepts the 8th
    trainer's straggling submission could never be finalized, so the node refuses the spec."""
    doc = with_value("aggregation", {"TrimmedMean": {"alpha_bps": 5000}})
    doc["quorum"] = 7
    err = assert_rejected(doc, "aggregation")
    assert "every accepted count from quorum 7 to trainer_count 8" in err.reason
    # The value itself is well formed: stored runs and sealed receipts holding it still load.
    spec = TrainingTaskSpec.from_dict(doc, supported_only=False)
    assert spec.aggregation_rule == AggregationRule.trimmed_mean(5000)
    doc["trainer_count"] = 7
    assert TrainingTaskSpec.from_dict(doc).quorum == 7  # K = M = 7: every round aggregates 7


@pytest.mark.parametrize(
    "bad",
    [
        1000,  # a JSON number would pass through a double
        10**21,
        "-1",
        "+1",
        "01",
        "00",
        "1e21",
        "1.0",
        " 1",
        "1 ",
        "0x10",
        "",
        "\uff11",  # fullwidth digit one
        str(2**256),
        "9" * 79,
        None,
        True,
    ],
)
def test_invalid_reward_pool(bad: object) -> None:
    assert_rejected(with_value("reward_pool", bad), "reward_pool")


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "no-scheme",
        "ipfs://has space",
        "ipfs://caf\u00e9",
        "1pfs://x",
        "ipfs:",
        "x:" + "y" * 2047,
        5,
    ],
)
def test_invalid_dataset_ref(bad: object) -> None:
    assert_rejected(with_value("dataset_ref", bad), "dataset_ref")


def test_dataset_hash_is_stored_lowercase() -> None:
    spec = TrainingTaskSpec.from_dict(with_value("dataset_hash", "0x" + DATASET_HASH[2:].upper()))
    assert spec.dataset_hash == DATASET_HASH


@pytest.mark.parametrize(
    "bad",
    [
        DATASET_HASH[:-1],
        DATASET_HASH + "0",
        DATASET_HASH[2:],
        "0X" + DATASET_HASH[2:],
        DATASET_HASH[:-1] + "g",
        DATASET_HASH + "\n",
        "",
        None,
        123,
    ],
)
def test_invalid_dataset_hash(bad: object) -> None:
    assert_rejected(with_value("dataset_hash", bad), "dataset_hash")


@pytest.mark.parametrize("bad", [-1, -0.5, "1", True, [], {}])
def test_invalid_min_throughput(bad: object) -> None:
    assert_rejected(with_value("min_throughput", bad), "min_throughput")


def test_invalid_min_throughput_not_finite() -> None:
    for bad in (math.inf, -math.inf, math.nan):
        err = spec_error(with_value("min_throughput", bad))
        assert err.path == "min_throughput"
    # 1e400 parses as a float infinity
    text = example_text().replace('"min_throughput": null', '"min_throughput": 1e400')
    assert_rejected(text, "min_throughput")
    assert_rejected(with_value("min_throughput", 2.0**53), "min_throughput")


# --- metadata -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [[], "ctx", None, 1])
def test_invalid_metadata_not_an_object(bad: object) -> None:
    assert_rejected(with_value("architecture.metadata", bad), "architecture.metadata")


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (math.nan, "architecture.metadata.x"),
        (math.inf, "architecture.metadata.x"),
        ([1, -math.inf], "architecture.metadata.x[1]"),
        (2**53, "architecture.metadata.x"),
        (-(2**53), "architecture.metadata.x"),
        (1e20, "architecture.metadata.x"),  # integral double beyond 2^53-1
        ({"y": {"z": b"bytes"}}, "architecture.metadata.x.y.z"),
        ({1: "int key"}, "architecture.metadata.x"),
        ("\ud800", "architecture.metadata.x"),
        ({"\udfff": 1}, "architecture.metadata.x.\udfff"),
        ({1, 2}, "architecture.metadata.x"),
    ],
)
def test_invalid_metadata_value(value: object, path: str) -> None:
    err = spec_error(with_value("architecture.metadata.x", value))
    assert err.path == path


def test_invalid_metadata_from_json_text() -> None:
    meta = '{ "context_len": 2048, "horizon": 128 }'
    cases = [
        ('{"a": 9007199254740992}', "architecture.metadata.a"),
        ('{"a": [1e400]}', "architecture.metadata.a[0]"),
        ('{"a": "\\ud800"}', "architecture.metadata.a"),
        ('{"\\udc00": 1}', "architecture.metadata.\udc00"),
    ]
    for replacement, path in cases:
        assert_rejected(example_text().replace(meta, replacement), path)


def test_invalid_metadata_too_deep() -> None:
    ok: Any = 1
    for _ in range(MAX_METADATA_DEPTH - 1):
        ok = [ok]
    TrainingTaskSpec.from_dict(with_value("architecture.metadata", {"a": ok}))
    err = spec_error(with_value("architecture.metadata", {"a": [ok]}))
    assert err.path == "architecture.metadata.a" + "[0]" * (MAX_METADATA_DEPTH - 1)
    assert "deeper" in err.reason


def test_invalid_canonical_form_too_large() -> None:
    err = spec_error(with_value("architecture.metadata", {"blob": "x" * MAX_CANONICAL_BYTES}))
    assert err.path == ""


# --- init checkpoint -------------------------------------------------------------------------

CKPT = "architecture.metadata.init_checkpoint"


def test_init_checkpoint_accessor() -> None:
    ckpt = {"uri": "file:///var/lib/tenzro/timesfm-init.safetensors", "sha256": DATASET_HASH}
    spec = TrainingTaskSpec.from_dict(with_value(CKPT, ckpt))
    got = spec.init_checkpoint()
    assert got == InitCheckpoint(uri=ckpt["uri"], sha256=DATASET_HASH)
    assert got is not None and got.sha256_bytes == bytes.fromhex(DATASET_HASH[2:])
    assert spec.architecture.init_checkpoint() == got


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ("file:///x", CKPT),
        (None, CKPT),
        ({"sha256": DATASET_HASH}, CKPT + ".uri"),
        ({"uri": "file:///x"}, CKPT + ".sha256"),
        (
            {"uri": "file:///x", "sha256": DATASET_HASH, "size": 1},
            CKPT + ".size",
        ),
        ({"uri": "file:///a b", "sha256": DATASET_HASH}, CKPT + ".uri"),
        ({"uri": "/no/scheme", "sha256": DATASET_HASH}, CKPT + ".uri"),
        ({"uri": 1, "sha256": DATASET_HASH}, CKPT + ".uri"),
        (
            {"uri": "file:///x", "sha256": "0x" + DATASET_HASH[2:].upper()},
            CKPT + ".sha256",
        ),
        ({"uri": "file:///x", "sha256": DATASET_HASH[2:]}, CKPT + ".sha256"),
        ({"uri": "file:///x", "sha256": DATASET_HASH[:-2]}, CKPT + ".sha256"),
    ],
)
def test_invalid_init_checkpoint(value: object, path: str) -> None:
    assert_rejected(with_value(CKPT, value), path)


# --- document-level invalid cases ----------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        "null",
        '"spec"',
        "{} {}",
        "\ufeff{}",
        "{'task_id': 'x'}",
        '{"a": NaN}',
        '{"a": Infinity}',
        '{"a": -Infinity}',
        '{"a": 1' + "0" * 5000 + "}",
        "[" * 100_000 + "]" * 100_000,
    ],
)
def test_invalid_json_document(text: str) -> None:
    assert spec_error(text).path == ""


def test_invalid_integer_too_long_for_the_decoder_is_reported_as_invalid_json() -> None:
    """Python's int() digit limit stops the decoder inside a well-formed object: the sponsor
    is told the JSON is invalid, not that the document is not an object."""
    text = example_text().replace('"created_at": ', '"created_at": 1' + "0" * 5000 + ", \"x\": ", 1)
    assert text != example_text()
    err = spec_error(text)
    assert err.path == "" and "invalid JSON" in str(err)


def test_invalid_example_with_trailing_garbage() -> None:
    assert spec_error(example_text() + "x").path == ""


def test_invalid_bytes_not_utf8() -> None:
    raw = example_text().replace("timesfm", "times\u00e9fm").encode("latin-1")
    assert spec_error(raw).path == ""
    assert spec_error(example_text().encode("utf-16")).path == ""


def test_invalid_input_too_large() -> None:
    text = example_text() + " " * MAX_SPEC_JSON_BYTES
    assert spec_error(text).path == ""
    assert spec_error(text.encode()).path == ""


def test_invalid_input_type() -> None:
    with pytest.raises(SpecError) as err:
        TrainingTaskSpec.from_json(12)  # type: ignore[arg-type]
    assert err.value.path == ""
    for bad in (None, [], ["spec"], 5):
        assert spec_error(bad).path == ""


# --- property: random valid specs round-trip ----------------------------------------------

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-SAFE, SAFE),
    st.floats(min_value=-1e15, max_value=1e15, allow_nan=False, allow_infinity=False),
    st.floats(min_value=-1e-3, max_value=1e-3, allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
_json_value = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _rule_for(k: int) -> st.SearchStrategy[object]:
    options: list[st.SearchStrategy[object]] = [st.just("Mean"), st.just("CoordinateMedian")]
    # Largest alpha with K - 2 floor(K alpha / 10000) >= 1 is floor((K - 1) / 2) trimmed per side.
    max_alpha = min(10000, (((k - 1) // 2 + 1) * 10000 - 1) // k)
    options.append(st.integers(0, max_alpha).map(lambda a: {"TrimmedMean": {"alpha_bps": a}}))
    if k >= 3:
        options.append(st.integers(0, (k - 3) // 2).map(lambda f: {"Krum": {"f": f}}))
    return st.one_of(options)


DID_REGEX = r"did:tenzro:[a-z]{1,32}:[A-Za-z0-9._-]{1,128}"
URI_REGEX = r"[a-z][a-z0-9+.-]{0,8}:[\x21-\x7e]{1,60}"


@st.composite
def valid_spec_dicts(draw: st.DrawFn) -> dict[str, Any]:
    m = draw(st.integers(1, 64))
    k = draw(st.integers(1, m))
    digits = draw(st.binary(min_size=20, max_size=20)).hex()
    spellings = ["0x" + digits, "0x" + digits.upper(), to_checksum_address("0x" + digits)]
    return {
        "task_id": draw(st.from_regex(r"[A-Za-z0-9._-]{1,128}", fullmatch=True)),
        "sponsor_did": draw(st.from_regex(DID_REGEX, fullmatch=True)),
        "sponsor_address": draw(st.sampled_from(spellings)),
        "architecture": {
            "family": draw(st.from_regex(r"[a-z0-9][a-z0-9._-]{0,63}", fullmatch=True)),
            "param_count": draw(st.integers(1, SAFE)),
            "modality": draw(st.sampled_from([m.value for m in Modality])),
            "fragment_count": draw(st.integers(1, 4096)),
            "dtype": draw(st.sampled_from([d.value for d in DType])),
            "metadata": draw(st.dictionaries(st.text(max_size=10), _json_value, max_size=5)),
        },
        "tier": draw(st.sampled_from([t.value for t in Tier])),
        "aggregation": draw(_rule_for(k)),
        "trainer_count": m,
        "quorum": k,
        "inner_steps": draw(st.integers(1, SAFE)),
        "max_rounds": draw(st.integers(1, SAFE)),
        "grace_window_ms": draw(st.integers(0, SAFE)),
        "reward_pool": str(draw(st.integers(0, 2**256 - 1))),
        "dataset_ref": draw(st.from_regex(URI_REGEX, fullmatch=True)),
        "dataset_hash": "0x" + draw(st.binary(min_size=32, max_size=32)).hex(),
        "min_throughput": draw(
            st.none() | st.integers(0, SAFE) | st.floats(0, 1e12, allow_nan=False)
        ),
        "created_at": draw(st.integers(0, 2**40)),
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_spec_dicts())
def test_property_valid_specs_round_trip(doc: dict[str, Any]) -> None:
    spec = TrainingTaskSpec.from_dict(copy.deepcopy(doc), supported_only=False)
    canonical = spec.canonical_bytes()
    again = TrainingTaskSpec.from_json(spec.to_json(), supported_only=False)
    assert again == spec
    assert again.canonical_bytes() == canonical
    assert again.spec_hash() == spec.spec_hash() == hashlib.sha256(canonical).digest()
    # Any spelling of the same document gives the same value and bytes.
    assert TrainingTaskSpec.from_json(json.dumps(doc), supported_only=False) == spec
    pretty = spec.to_json(indent=1)
    from_pretty = TrainingTaskSpec.from_json(pretty.encode(), supported_only=False)
    assert from_pretty.canonical_bytes() == canonical
    assert TrainingTaskSpec.from_dict(spec.to_dict(), supported_only=False) == spec
    assert json.loads(canonical) == spec.to_dict()
