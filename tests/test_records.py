"""Tests for tenzro_training.records: committed record values and their ABI leaf encodings.

The encodings are a cross-language contract (Solidity ``abi.decode``), so they are pinned three
ways: golden vectors written out word by word, agreement with the general ``eth_abi`` decoder on
random records, and strict rejection of every byte string that is not exactly a canonical
encoding (truncations, trailing bytes, dirty padding, moved offsets, random garbage).
"""

from __future__ import annotations

import hashlib
import json

import eth_abi
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tenzro_training.errors import ElectionError, EncodingError
from tenzro_training.merkle import run_root
from tenzro_training.records import (
    FINAL_MODEL_RECORD_ABI_TYPES,
    ROUND_RECORD_ABI_TYPES,
    Candidate,
    FinalModelRecord,
    FragmentOutcome,
    RoundRecord,
    Ticket,
    compute_run_leaves,
    decode_final_model_record,
    decode_round_record,
    encode_final_model_record,
    encode_round_record,
    is_valid_task_id,
)
from tenzro_training.rules import AggregationRule, RuleKind


def h(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def addr(i: int) -> bytes:
    return bytes([i]) * 20


TASK = "train-2026-04-25-timesfm-200m"

# --- golden vectors ---------------------------------------------------------------------------

GOLDEN_ROUND = RoundRecord(
    task_id=TASK,
    round=12,
    syncer=addr(0xAB),
    syncer_rank=2,
    rule_kind=RuleKind.KRUM,
    rule_param=1,
    fragments=(
        FragmentOutcome(h("agg-0"), (addr(1), addr(2), addr(3), addr(4), addr(5)), 3, 0, h("report-0")),
        FragmentOutcome(h("agg-1"), (addr(2), addr(3), addr(4), addr(5), addr(6), addr(7)), 0, 0, h("report-1")),
    ),
    model_hash=h("model-12"),
)
# Word by word (offsets in hex); "->" marks ABI offsets, relative to the start of the enclosing
# tuple (head) or, inside the fragment array, to the word after the array length.
GOLDEN_ROUND_WORDS = [
    "0000000000000000000000000000000000000000000000000000000000000001",  # 000 kind = 1 (round)
    "0000000000000000000000000000000000000000000000000000000000000001",  # 020 version = 1
    "0000000000000000000000000000000000000000000000000000000000000140",  # 040 -> task_id at 0x140
    "000000000000000000000000000000000000000000000000000000000000000c",  # 060 round = 12
    "000000000000000000000000abababababababababababababababababababab",  # 080 syncer
    "0000000000000000000000000000000000000000000000000000000000000002",  # 0a0 syncer_rank = 2
    "0000000000000000000000000000000000000000000000000000000000000003",  # 0c0 rule_kind = 3 (Krum)
    "0000000000000000000000000000000000000000000000000000000000000001",  # 0e0 rule_param f = 1
    "0000000000000000000000000000000000000000000000000000000000000180",  # 100 -> fragments at 0x180
    "9a2eb13d703a2e68d52bc6e9c491612d4f56de3f3747f118f64c39f3a42dafb5",  # 120 model_hash
    "000000000000000000000000000000000000000000000000000000000000001d",  # 140 task_id length 29
    "747261696e2d323032362d30342d32352d74696d6573666d2d3230306d000000",  # 160 task_id bytes, padded
    "0000000000000000000000000000000000000000000000000000000000000002",  # 180 2 fragments
    "0000000000000000000000000000000000000000000000000000000000000040",  # 1a0 -> fragment 0 at 0x1a0+0x40
    "00000000000000000000000000000000000000000000000000000000000001a0",  # 1c0 -> fragment 1 at 0x1a0+0x1a0
    "39981b3d3c72ae8ea5887b61be053c5ca3d4874a3fc0adb6ab3f888eef7c3096",  # 1e0 f0 aggregate_hash
    "00000000000000000000000000000000000000000000000000000000000000a0",  # 200 f0 -> accepted at +0xa0
    "0000000000000000000000000000000000000000000000000000000000000003",  # 220 f0 selected = 3
    "0000000000000000000000000000000000000000000000000000000000000000",  # 240 f0 trimmed = 0
    "cf0cb4dc850101c69dd4012e470ed71ee051f8bdb2f6af0687190b78c7622634",  # 260 f0 report_hash
    "0000000000000000000000000000000000000000000000000000000000000005",  # 280 f0 5 accepted
    "0000000000000000000000000101010101010101010101010101010101010101",  # 2a0
    "0000000000000000000000000202020202020202020202020202020202020202",  # 2c0
    "0000000000000000000000000303030303030303030303030303030303030303",  # 2e0
    "0000000000000000000000000404040404040404040404040404040404040404",  # 300
    "0000000000000000000000000505050505050505050505050505050505050505",  # 320
    "7bbbe1102f13b064b0101002a33992d39f9cbf533d242f87c06f31ca3a4ee856",  # 340 f1 aggregate_hash
    "00000000000000000000000000000000000000000000000000000000000000a0",  # 360 f1 -> accepted at +0xa0
    "0000000000000000000000000000000000000000000000000000000000000000",  # 380 f1 selected = 0
    "0000000000000000000000000000000000000000000000000000000000000000",  # 3a0 f1 trimmed = 0
    "8f6decfb25303bbe670581f55c846b5a24109568fa487e446bca3144b0bffc6a",  # 3c0 f1 report_hash
    "0000000000000000000000000000000000000000000000000000000000000006",  # 3e0 f1 6 accepted
    "0000000000000000000000000202020202020202020202020202020202020202",  # 400
    "0000000000000000000000000303030303030303030303030303030303030303",  # 420
    "0000000000000000000000000404040404040404040404040404040404040404",  # 440
    "0000000000000000000000000505050505050505050505050505050505050505",  # 460
    "0000000000000000000000000606060606060606060606060606060606060606",  # 480
    "0000000000000000000000000707070707070707070707070707070707070707",  # 4a0
]
GOLDEN_ROUND_BYTES = bytes.fromhex("".join(GOLDEN_ROUND_WORDS))

GOLDEN_FINAL = FinalModelRecord(TASK, 1024, h("final"))
GOLDEN_FINAL_WORDS = [
    "0000000000000000000000000000000000000000000000000000000000000002",  # 00 kind = 2 (final model)
    "0000000000000000000000000000000000000000000000000000000000000001",  # 20 version = 1
    "00000000000000000000000000000000000000000000000000000000000000a0",  # 40 -> task_id at 0xa0
    "0000000000000000000000000000000000000000000000000000000000000400",  # 60 rounds = 1024
    "2443630b4620165c8b173e7265e17526fe2787ae594364dd6d839ad58f2fc007",  # 80 final_model_hash
    "000000000000000000000000000000000000000000000000000000000000001d",  # a0 task_id length 29
    "747261696e2d323032362d30342d32352d74696d6573666d2d3230306d000000",  # c0 task_id bytes, padded
]
GOLDEN_FINAL_BYTES = bytes.fromhex("".join(GOLDEN_FINAL_WORDS))


def test_golden_hashes_are_what_the_comments_say() -> None:
    assert GOLDEN_ROUND_WORDS[9] == h("model-12").hex()
    assert GOLDEN_FINAL_WORDS[4] == h("final").hex()


def test_golden_round_record_encoding() -> None:
    assert encode_round_record(GOLDEN_ROUND) == GOLDEN_ROUND_BYTES
    assert decode_round_record(GOLDEN_ROUND_BYTES) == GOLDEN_ROUND


def test_golden_final_model_record_encoding() -> None:
    assert encode_final_model_record(GOLDEN_FINAL) == GOLDEN_FINAL_BYTES
    assert decode_final_model_record(GOLDEN_FINAL_BYTES) == GOLDEN_FINAL


def test_golden_decodes_with_a_general_abi_decoder() -> None:
    """What Solidity's abi.decode(leaf, (uint8, uint16, string, ...)) would return."""
    kind, version, task_id, rnd, syncer, rank, rule_kind, rule_param, frags, model = eth_abi.decode(
        ROUND_RECORD_ABI_TYPES, GOLDEN_ROUND_BYTES
    )
    assert (kind, version, task_id, rnd, rank, rule_kind, rule_param) == (1, 1, TASK, 12, 2, 3, 1)
    assert bytes.fromhex(syncer[2:]) == addr(0xAB)
    assert model == h("model-12")
    assert frags[0][0] == h("agg-0") and frags[0][2:] == (3, 0, h("report-0"))
    assert [bytes.fromhex(a[2:]) for a in frags[1][1]] == [addr(i) for i in range(2, 8)]
    assert eth_abi.decode(FINAL_MODEL_RECORD_ABI_TYPES, GOLDEN_FINAL_BYTES) == (2, 1, TASK, 1024, h("final"))


# --- hypothesis strategies --------------------------------------------------------------------

task_ids = st.from_regex(r"[A-Za-z0-9._-]{1,128}", fullmatch=True)
hashes = st.binary(min_size=32, max_size=32)
addresses = st.binary(min_size=20, max_size=20)


@st.composite
def rules(draw: st.DrawFn) -> AggregationRule:
    kind = draw(st.sampled_from(list(RuleKind)))
    if kind is RuleKind.TRIMMED_MEAN:
        return AggregationRule.trimmed_mean(draw(st.integers(0, 10_000)))
    if kind is RuleKind.KRUM:
        return AggregationRule.krum(draw(st.integers(0, 3)))
    return AggregationRule(kind)


@st.composite
def outcomes(draw: st.DrawFn, rule: AggregationRule) -> FragmentOutcome:
    k = draw(st.integers(1, 12))
    assume(rule.is_valid_for_quorum(k))
    accepted = tuple(sorted(draw(st.sets(addresses, min_size=k, max_size=k))))
    selected = draw(st.integers(0, k - 1)) if rule.kind is RuleKind.KRUM else 0
    return FragmentOutcome(draw(hashes), accepted, selected, rule.trimmed_per_side(k), draw(hashes))


@st.composite
def round_records(draw: st.DrawFn) -> RoundRecord:
    rule = draw(rules())
    frags = tuple(draw(st.lists(outcomes(rule), min_size=1, max_size=4)))
    return RoundRecord(
        task_id=draw(task_ids),
        round=draw(st.integers(0, 2**64 - 1)),
        syncer=draw(addresses),
        syncer_rank=draw(st.integers(1, 2**32 - 1)),
        rule_kind=rule.kind,
        rule_param=rule.param,
        fragments=frags,
        model_hash=draw(hashes),
    )


final_records = st.builds(FinalModelRecord, task_ids, st.integers(0, 2**64 - 1), hashes)


@settings(max_examples=200, deadline=None)
@given(round_records())
def test_property_round_record_round_trip(record: RoundRecord) -> None:
    encoded = encode_round_record(record)
    assert decode_round_record(encoded) == record
    assert len(encoded) % 32 == 0 and encoded[:31] == bytes(31)
    # A general ABI decoder (as Solidity's) reads the same fields.
    decoded = eth_abi.decode(ROUND_RECORD_ABI_TYPES, encoded)
    assert decoded[2] == record.task_id and decoded[3] == record.round
    assert [f[0] for f in decoded[8]] == [f.aggregate_hash for f in record.fragments]
    assert [tuple(bytes.fromhex(a[2:]) for a in f[1]) for f in decoded[8]] == [
        f.accepted for f in record.fragments
    ]
    # ... and the general encoder agrees byte for byte.
    assert eth_abi.encode(ROUND_RECORD_ABI_TYPES, decoded) == encoded


@settings(max_examples=200, deadline=None)
@given(final_records)
def test_property_final_record_round_trip(record: FinalModelRecord) -> None:
    encoded = encode_final_model_record(record)
    assert decode_final_model_record(encoded) == record
    assert eth_abi.decode(FINAL_MODEL_RECORD_ABI_TYPES, encoded) == (
        2, 1, record.task_id, record.rounds, record.final_model_hash,
    )


@settings(max_examples=200, deadline=None)
@given(round_records(), st.data())
def test_property_any_byte_change_is_rejected_or_is_another_canonical_record(
    record: RoundRecord, data: st.DataObject
) -> None:
    encoded = bytearray(encode_round_record(record))
    pos = data.draw(st.integers(0, len(encoded) - 1), label="pos")
    encoded[pos] ^= data.draw(st.integers(1, 255), label="xor")
    mutated = bytes(encoded)
    try:
        other = decode_round_record(mutated)
    except EncodingError:
        return
    # Changing a value byte (a hash, an address, a small integer) can give another valid record;
    # it must then be canonical and different.
    assert other != record
    assert encode_round_record(other) == mutated


# --- invalid encodings ------------------------------------------------------------------------


def test_invalid_every_truncation_of_round_record() -> None:
    for n in range(len(GOLDEN_ROUND_BYTES)):
        with pytest.raises(EncodingError):
            decode_round_record(GOLDEN_ROUND_BYTES[:n])


def test_invalid_every_truncation_of_final_record() -> None:
    for n in range(len(GOLDEN_FINAL_BYTES)):
        with pytest.raises(EncodingError):
            decode_final_model_record(GOLDEN_FINAL_BYTES[:n])


@pytest.mark.parametrize("suffix", [b"\x00", bytes(32), b"\x01" * 32])
def test_invalid_trailing_bytes(suffix: bytes) -> None:
    # eth_abi itself ignores trailing bytes: the strict decoder must not.
    assert eth_abi.decode(FINAL_MODEL_RECORD_ABI_TYPES, GOLDEN_FINAL_BYTES + bytes(32))[1] == 1
    with pytest.raises(EncodingError):
        decode_round_record(GOLDEN_ROUND_BYTES + suffix)
    with pytest.raises(EncodingError):
        decode_final_model_record(GOLDEN_FINAL_BYTES + suffix)


def _words(b: bytes) -> list[bytes]:
    return [b[i : i + 32] for i in range(0, len(b), 32)]


def test_invalid_moved_string_offset_is_non_canonical() -> None:
    """The same record with the task_id one word further on: valid ABI, not canonical."""
    words = _words(GOLDEN_FINAL_BYTES)
    words[2] = (0xC0).to_bytes(32, "big")
    moved = b"".join(words[:5] + [bytes(32)] + words[5:])
    assert eth_abi.decode(FINAL_MODEL_RECORD_ABI_TYPES, moved) == eth_abi.decode(
        FINAL_MODEL_RECORD_ABI_TYPES, GOLDEN_FINAL_BYTES
    )
    with pytest.raises(EncodingError, match="non-canonical"):
        decode_final_model_record(moved)


def test_invalid_aliased_fragment_offsets() -> None:
    """Two fragment offsets pointing at one tuple decode in eth_abi but are not canonical."""
    words = _words(GOLDEN_ROUND_BYTES)
    words[0x1C0 // 32] = words[0x1A0 // 32]  # fragment 1 -> fragment 0's tuple
    aliased = b"".join(words)
    decoded = eth_abi.decode(ROUND_RECORD_ABI_TYPES, aliased)
    assert decoded[8][0] == decoded[8][1]
    with pytest.raises(EncodingError, match="non-canonical"):
        decode_round_record(aliased)


@pytest.mark.parametrize(
    ("word", "byte"),
    [
        (0, 0),  # kind high byte
        (1, 29),  # version above uint16
        (3, 0),  # round above uint64
        (4, 0),  # syncer address padding
        (5, 27),  # syncer_rank above uint32
        (6, 30),  # rule_kind above uint8
        (7, 27),  # rule_param above uint32
        (0x2A0 // 32, 5),  # accepted address padding
        (0x220 // 32, 0),  # selected above uint32
    ],
)
def test_invalid_dirty_padding(word: int, byte: int) -> None:
    b = bytearray(GOLDEN_ROUND_BYTES)
    b[word * 32 + byte] ^= 0x01
    with pytest.raises(EncodingError):
        decode_round_record(bytes(b))


def test_invalid_dirty_string_padding() -> None:
    b = bytearray(GOLDEN_FINAL_BYTES)
    b[-1] = 0x41
    with pytest.raises(EncodingError):
        decode_final_model_record(bytes(b))


@pytest.mark.parametrize(
    "length", [0, 30, 2**64, 2**256 - 1]
)
def test_invalid_string_length(length: int) -> None:
    words = _words(GOLDEN_FINAL_BYTES)
    words[5] = length.to_bytes(32, "big")
    with pytest.raises(EncodingError):
        decode_final_model_record(b"".join(words))


@pytest.mark.parametrize("count", [0, 3, 10**9, 2**255])
def test_invalid_fragment_count(count: int) -> None:
    words = _words(GOLDEN_ROUND_BYTES)
    words[0x180 // 32] = count.to_bytes(32, "big")
    with pytest.raises(EncodingError):
        decode_round_record(b"".join(words))


@pytest.mark.parametrize("count", [0, 4, 6, 10**9, 2**255])
def test_invalid_accepted_count(count: int) -> None:
    words = _words(GOLDEN_ROUND_BYTES)
    words[0x280 // 32] = count.to_bytes(32, "big")
    with pytest.raises(EncodingError):
        decode_round_record(b"".join(words))


def test_invalid_kind_and_version() -> None:
    with pytest.raises(EncodingError, match="kind"):
        decode_round_record(GOLDEN_FINAL_BYTES)
    with pytest.raises(EncodingError, match="kind"):
        decode_final_model_record(GOLDEN_ROUND_BYTES)
    b = bytearray(GOLDEN_FINAL_BYTES)
    b[63] = 2
    with pytest.raises(EncodingError, match="version"):
        decode_final_model_record(bytes(b))


def test_invalid_non_ascii_task_id() -> None:
    b = bytearray(GOLDEN_FINAL_BYTES)
    b[0xC0] = 0xFF
    with pytest.raises(EncodingError):
        decode_final_model_record(bytes(b))
    b[0xC0] = ord("/")
    with pytest.raises(EncodingError):
        decode_final_model_record(bytes(b))


def test_invalid_unsorted_accepted_in_encoding() -> None:
    words = _words(GOLDEN_ROUND_BYTES)
    i = 0x2A0 // 32
    words[i], words[i + 1] = words[i + 1], words[i]
    with pytest.raises(EncodingError, match="ascending"):
        decode_round_record(b"".join(words))


@pytest.mark.parametrize("blob", [b"", b"{}", b"\x00" * 31, bytes(64), b"\xff" * 320, "text", None, 5])
def test_invalid_garbage(blob: object) -> None:
    with pytest.raises(EncodingError):
        decode_round_record(blob)  # type: ignore[arg-type]
    with pytest.raises(EncodingError):
        decode_final_model_record(blob)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1600))
def test_property_random_bytes_are_rejected(blob: bytes) -> None:
    with pytest.raises(EncodingError):
        decode_round_record(blob)
    with pytest.raises(EncodingError):
        decode_final_model_record(blob)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_property_random_words_after_valid_header_are_rejected(data: st.DataObject) -> None:
    """Garbage that gets past the kind/version check still never decodes (nor crashes)."""
    n = data.draw(st.integers(0, 40), label="words")
    body = b"".join(
        data.draw(st.sampled_from([bytes(32), (0x140).to_bytes(32, "big"), b"\xff" * 32, h(str(i))]))
        for i in range(n)
    )
    for kind, decode in ((1, decode_round_record), (2, decode_final_model_record)):
        blob = kind.to_bytes(32, "big") + (1).to_bytes(32, "big") + body
        try:
            record = decode(blob)
        except EncodingError:
            continue
        encoder = encode_round_record if kind == 1 else encode_final_model_record
        assert encoder(record) == blob  # type: ignore[operator]


# --- invalid values (rejected at construction, hence never encoded) ------------------------


def _outcome(**changes: object) -> FragmentOutcome:
    fields = dict(
        aggregate_hash=h("a"), accepted=(addr(1), addr(2), addr(3)), selected=0, trimmed=0, report_hash=h("r")
    )
    fields.update(changes)
    return FragmentOutcome(**fields)  # type: ignore[arg-type]


def _round(**changes: object) -> RoundRecord:
    fields = dict(
        task_id="t", round=0, syncer=addr(9), syncer_rank=1, rule_kind=RuleKind.MEAN, rule_param=0,
        fragments=(_outcome(),), model_hash=h("m"),
    )
    fields.update(changes)
    return RoundRecord(**fields)  # type: ignore[arg-type]


def test_valid_helpers_build() -> None:
    assert decode_round_record(encode_round_record(_round())) == _round()
    # lists are normalised to tuples (hashable, immutable)
    r = _round(fragments=[_outcome(accepted=[addr(1), addr(2)])])
    assert isinstance(r.fragments, tuple) and isinstance(r.fragments[0].accepted, tuple)
    assert _round(rule_kind=2).rule_kind is RuleKind.COORDINATE_MEDIAN


@pytest.mark.parametrize(
    "changes",
    [
        {"aggregate_hash": b"\x00" * 31},
        {"report_hash": bytearray(32)},
        {"accepted": ()},
        {"accepted": (addr(2), addr(1))},
        {"accepted": (addr(1), addr(1))},
        {"accepted": (b"\x01" * 19,)},
        {"accepted": ("0x" + "01" * 20,)},
        {"accepted": {addr(1)}},
        {"selected": -1},
        {"selected": 2**32},
        {"trimmed": True},
    ],
)
def test_invalid_fragment_outcome(changes: dict[str, object]) -> None:
    with pytest.raises(EncodingError):
        _outcome(**changes)


@pytest.mark.parametrize(
    "changes",
    [
        {"task_id": ""},
        {"task_id": "a" * 129},
        {"task_id": "a/b"},
        {"task_id": "tâche"},
        {"task_id": b"t"},
        {"round": -1},
        {"round": 2**64},
        {"syncer": addr(1)[:19]},
        {"syncer_rank": 0},
        {"syncer_rank": 2**32},
        {"rule_kind": 4},
        {"rule_kind": 256},
        {"rule_param": 1},  # Mean takes no parameter
        {"model_hash": h("m") + b"\x00"},
        {"fragments": ()},
        {"fragments": (None,)},
        # rule/outcome consistency
        {"fragments": (_outcome(selected=1),)},  # selected only for Krum
        {"rule_kind": RuleKind.KRUM, "rule_param": 0, "fragments": (_outcome(selected=3),)},  # >= K
        {"rule_kind": RuleKind.KRUM, "rule_param": 1},  # K=3 <= 2f+2
        {"rule_kind": RuleKind.TRIMMED_MEAN, "rule_param": 3400},  # trims 1 per side, outcome says 0
        {"rule_kind": RuleKind.TRIMMED_MEAN, "rule_param": 5000},  # K=3 trims 1, recorded trimmed=0
        {"rule_kind": RuleKind.TRIMMED_MEAN, "rule_param": 10_000, "fragments": (_outcome(trimmed=3),)},
        {"rule_kind": RuleKind.MEAN, "fragments": (_outcome(trimmed=1),)},
        {"rule_kind": RuleKind.TRIMMED_MEAN, "rule_param": 2**32},
    ],
)
def test_invalid_round_record(changes: dict[str, object]) -> None:
    with pytest.raises(EncodingError):
        _round(**changes)


def test_trimmed_mean_consistent_outcome_is_accepted() -> None:
    r = _round(rule_kind=RuleKind.TRIMMED_MEAN, rule_param=3400, fragments=(_outcome(trimmed=1),))
    assert decode_round_record(encode_round_record(r)) == r


@pytest.mark.parametrize(
    "changes", [{"task_id": "x y"}, {"rounds": -1}, {"rounds": 2**64}, {"final_model_hash": b""}]
)
def test_invalid_final_record(changes: dict[str, object]) -> None:
    fields: dict[str, object] = dict(task_id="t", rounds=1, final_model_hash=h("f"))
    fields.update(changes)
    with pytest.raises(EncodingError):
        FinalModelRecord(**fields)  # type: ignore[arg-type]


def test_invalid_encode_arguments() -> None:
    with pytest.raises(EncodingError):
        encode_round_record(GOLDEN_FINAL)  # type: ignore[arg-type]
    with pytest.raises(EncodingError):
        encode_final_model_record(GOLDEN_ROUND)  # type: ignore[arg-type]
    # A value forced past the frozen dataclass is caught when encoded.
    forced = _round()
    object.__setattr__(forced, "round", 2**64)
    with pytest.raises(EncodingError):
        encode_round_record(forced)


def test_task_id_rule() -> None:
    assert is_valid_task_id("a") and is_valid_task_id("A-z_0.9" * 18 + "ab")
    assert not is_valid_task_id("a" * 129) and not is_valid_task_id("") and not is_valid_task_id(None)


# --- election value types ---------------------------------------------------------------------


def test_candidate_and_ticket_values() -> None:
    c = Candidate(addr(1), b"\x02" * 32, 10**21)
    assert c.stake == 10**21
    Candidate(addr(1), b"\x02" * 32, 0)  # registered, never ranked
    Candidate(addr(1), b"\x02" * 32, 2**256 - 1)
    Ticket(addr(1), b"\x02" * 32, b"\x03" * 80)


@pytest.mark.parametrize(
    "args",
    [
        (addr(1)[:19], b"\x02" * 32, 1),
        (addr(1), b"\x02" * 31, 1),
        (addr(1), b"\x02" * 32, -1),
        (addr(1), b"\x02" * 32, 2**256),
        (addr(1), b"\x02" * 32, 1.0),
        (addr(1), b"\x02" * 32, True),
        ("0x" + "01" * 20, b"\x02" * 32, 1),
    ],
)
def test_invalid_candidate(args: tuple[object, ...]) -> None:
    with pytest.raises(ElectionError):
        Candidate(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "args",
    [
        (addr(1), b"\x02" * 32, b"\x03" * 79),
        (addr(1), b"\x02" * 32, b"\x03" * 81),
        (addr(1), b"\x02" * 33, b"\x03" * 80),
        (addr(1), b"\x02" * 32, bytearray(80)),
    ],
)
def test_invalid_ticket(args: tuple[object, ...]) -> None:
    with pytest.raises(ElectionError):
        Ticket(*args)  # type: ignore[arg-type]


# --- run leaves -------------------------------------------------------------------------------

SPEC = json.dumps({"aggregation": "Mean", "task_id": "t"}, separators=(",", ":")).encode()


def _rounds(n: int) -> list[RoundRecord]:
    return [_round(round=i, model_hash=h(f"m{i}")) for i in range(n)]


def test_run_leaves_order_and_domain_separation() -> None:
    rounds = _rounds(3)
    final = FinalModelRecord("t", 3, h("final"))
    leaves = compute_run_leaves(SPEC, rounds, final)
    assert leaves[0] == SPEC
    assert leaves[1:4] == [encode_round_record(r) for r in rounds]
    assert leaves[4] == encode_final_model_record(final)
    assert leaves[0][:1] == b"{" and all(leaf[:31] == bytes(31) for leaf in leaves[1:])
    assert compute_run_leaves(SPEC, rounds, None) == leaves[:4]
    assert compute_run_leaves(SPEC, [], None) == [SPEC]
    assert compute_run_leaves(SPEC, [], FinalModelRecord("t", 0, h("f")))[1][31] == 2
    assert run_root(leaves) != run_root(leaves[:4])


@pytest.mark.parametrize(
    ("spec", "rounds", "final"),
    [
        (b"[]", [], None),  # not an object
        (b" {}", [], None),  # not canonical bytes
        (b'{"task_id":"t"', [], None),  # not JSON
        (b'{"task_id":5}', [], None),
        ("{}", [], None),
        (SPEC, [_round(round=1)], None),  # rounds must start at 0
        (SPEC, [_round(round=0), _round(round=0)], None),
        (SPEC, [_round(round=0, task_id="u")], None),
        (SPEC, _rounds(2), FinalModelRecord("t", 3, h("f"))),  # count mismatch
        (SPEC, _rounds(2), FinalModelRecord("u", 2, h("f"))),
        (SPEC, [GOLDEN_FINAL], None),
        (SPEC, _rounds(1), _rounds(1)[0]),
        (SPEC, b"xx", None),
    ],
)
def test_invalid_run_leaves(spec: object, rounds: object, final: object) -> None:
    with pytest.raises(EncodingError):
        compute_run_leaves(spec, rounds, final)  # type: ignore[arg-type]
