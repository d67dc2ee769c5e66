"""The pinned receipt ABI: round trip, canonical trainer order, strict decoding, and validity
(every field class tampered, re-encoded canonically so only the rule under test can catch it)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import eth_abi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenzro_training.errors import EncodingError
from tenzro_training.receipt import ReceiptTrainer, TrainingReceipt, compute_receipt, verify_receipt
from tenzro_training.receipt_abi import (
    MAX_RECEIPT_BYTES,
    RECEIPT_ABI_TYPE,
    RECEIPT_DIGEST_LENGTH,
    _abi_value,
    compute_receipt_digest,
    decode_receipt,
    encode_receipt,
    read_receipt_task_id,
    verify_receipt_bytes,
)
from tenzro_training.records import decode_round_record, encode_round_record
from tests.test_receipt import sealed_env


@pytest.fixture(scope="module")
def receipt() -> TrainingReceipt:
    return compute_receipt(sealed_env().run)


@pytest.fixture(scope="module")
def data(receipt: TrainingReceipt) -> bytes:
    return encode_receipt(receipt)


def by_address(r: TrainingReceipt) -> TrainingReceipt:
    return dataclasses.replace(r, trainers=tuple(sorted(r.trainers, key=lambda t: t.address)))


def reencode(r: TrainingReceipt, mutate: Callable[[list[Any]], None]) -> bytes:
    """The receipt's ABI value with ``mutate`` applied to its field list, canonically encoded."""
    fields = list(_abi_value(r))
    fields[7] = list(fields[7])
    fields[8] = [list(t) for t in fields[8]]
    fields[9] = list(fields[9])
    mutate(fields)
    fields[8] = [tuple(t) for t in fields[8]]
    return eth_abi.encode([RECEIPT_ABI_TYPE], [tuple(fields)])


def test_round_trip(receipt: TrainingReceipt, data: bytes) -> None:
    assert reencode(receipt, lambda f: None) == data
    decoded = decode_receipt(data)
    assert decoded == by_address(receipt)
    assert encode_receipt(decoded) == data
    assert verify_receipt_bytes(receipt.run_root, data) == by_address(receipt)


def test_layout_is_one_top_level_tuple(receipt: TrainingReceipt, data: bytes) -> None:
    # abi.encode(ReceiptV1): one offset word (0x20) to the tuple, then version 1 in its head.
    assert int.from_bytes(data[:32], "big") == 32
    assert int.from_bytes(data[32:64], "big") == 1
    (value,) = eth_abi.decode([RECEIPT_ABI_TYPE], data)
    assert value[1] == receipt.task_id and value[2] == receipt.spec.canonical_bytes()
    assert value[5] == receipt.run_root and value[6] == receipt.final_model_hash
    assert [decode_round_record(x) for x in value[7]] == list(receipt.transcript)


def test_trainers_are_written_in_canonical_address_order(receipt: TrainingReceipt, data: bytes) -> None:
    shuffled = dataclasses.replace(receipt, trainers=tuple(reversed(receipt.trainers)))
    assert encode_receipt(shuffled) == data
    (value,) = eth_abi.decode([RECEIPT_ABI_TYPE], data)
    addresses = [bytes.fromhex(t[0][2:]) for t in value[8]]  # eth_abi gives checksummed text
    assert addresses == sorted(addresses) and len(set(addresses)) == len(addresses)
    assert [t[1] for t in value[8]] == [t.reward_weight for t in by_address(receipt).trainers]


def test_slashed_trainer_is_written_with_weight_zero_and_restored(receipt: TrainingReceipt) -> None:
    victim = receipt.trainers[0]
    assert victim.accepted_submissions > 0
    slashed = dataclasses.replace(
        receipt, trainers=(dataclasses.replace(victim, slashed=True),) + receipt.trainers[1:]
    )
    raw = encode_receipt(slashed)
    (value,) = eth_abi.decode([RECEIPT_ABI_TYPE], raw)
    row = next(t for t in value[8] if bytes.fromhex(t[0][2:]) == victim.address)
    assert row[1] == 0 and row[4] is True
    decoded = decode_receipt(raw)
    assert decoded == by_address(slashed)  # accepted_submissions restored from the transcript
    assert verify_receipt_bytes(receipt.run_root, raw) is not None


def test_invalid_encode_of_a_non_receipt() -> None:
    with pytest.raises(EncodingError):
        encode_receipt("receipt")  # type: ignore[arg-type]


def test_invalid_encode_with_duplicate_trainer(receipt: TrainingReceipt) -> None:
    dup = dataclasses.replace(receipt, trainers=receipt.trainers + receipt.trainers[:1])
    with pytest.raises(EncodingError):
        encode_receipt(dup)


# --- strict decoding: malformed bytes are EncodingError ---------------------------------------


def _set(i: int, value: Any) -> Callable[[list[Any]], None]:
    def mutate(f: list[Any]) -> None:
        f[i] = value

    return mutate


def _trainer(j: int, k: int, value: Any) -> Callable[[list[Any]], None]:
    def mutate(f: list[Any]) -> None:
        f[8][j][k] = value

    return mutate


def _swap_trainers(f: list[Any]) -> None:
    f[8][0], f[8][1] = f[8][1], f[8][0]


def _dup_trainer(f: list[Any]) -> None:
    f[8].insert(1, list(f[8][0]))


def _bad_record(f: list[Any]) -> None:
    f[7][0] = f[7][0] + b"\x00" * 32


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_set(0, 2), r"^receipt version 2 is not supported \(only 1\)$"),  # an operator must upgrade
        (_set(1, "other-task"), r"^taskId 'other-task' differs from the spec's 'run-test'$"),
        (_set(3, b"\x99" * 20), r"^sponsor differs from the spec's sponsor_address$"),
        (_set(4, 12345), r"^rewardPool 12345 differs from the spec's 1001$"),
        (_trainer(0, 4, True), r"^trainers\[0\] is slashed but has weight 4 \(must be 0\)$"),
        (_trainer(0, 3, "not-a-did"), r"did"),
        (_swap_trainers, r"^trainers\[1\] is out of canonical \(strictly ascending address\) order$"),
        # A repeated address is out of the STRICT order, not merely caught by the re-encoding.
        (_dup_trainer, r"^trainers\[1\] is out of canonical \(strictly ascending address\) order$"),
        (_bad_record, r"unexpected bytes after the record"),
    ],
    ids=["version", "task_id", "sponsor", "reward_pool", "slashed_weight", "did", "order", "duplicate", "record"],
)
def test_invalid_field_rejected_by_decode(receipt: TrainingReceipt, mutate: Callable[[list[Any]], None],
                                          message: str) -> None:
    """Each refusal says which field is wrong: the message is all the author of another encoder
    gets."""
    raw = reencode(receipt, mutate)
    with pytest.raises(EncodingError, match=message):
        decode_receipt(raw)
    assert verify_receipt_bytes(receipt.run_root, raw) is None


@pytest.mark.parametrize(("weight", "valid"), [(2**64 - 1, True), (2**64, False)])
def test_a_weight_must_fit_uint64(receipt: TrainingReceipt, weight: int, valid: bool) -> None:
    """The ABI word is uint256 but a weight is an accepted-submission count, uint64 everywhere
    else (the JSON receipt, the Solidity verifier): 2**64 must be refused, 2**64 - 1 not."""
    raw = reencode(receipt, _trainer(0, 1, weight))
    if valid:
        assert max(t.accepted_submissions for t in decode_receipt(raw).trainers) == weight
    else:
        with pytest.raises(EncodingError, match=r"^trainers\[0\] weight 18446744073709551616 does not fit uint64$"):
            decode_receipt(raw)


def test_invalid_spec_bytes(receipt: TrainingReceipt) -> None:
    canonical = receipt.spec.canonical_bytes()
    for spec_bytes in (canonical + b" ", b"{}", b"\xff", canonical.replace(b'"', b"'", 1), b""):
        raw = reencode(receipt, _set(2, spec_bytes))
        with pytest.raises(EncodingError):
            decode_receipt(raw)


def test_invalid_non_canonical_layouts(data: bytes) -> None:
    bad = [
        data[:-1],  # truncated
        data + b"\x00" * 32,  # trailing word
        b"",
        data[:32],
        (64).to_bytes(32, "big") + data[32:],  # top-level offset moved
        data[:32] + (1).to_bytes(32, "big")[:31] + b"\x02" + data[64:],  # version 2
        data[:32] + b"\x01" + data[33:],  # non-zero padding in the version word
    ]
    for raw in bad:
        with pytest.raises(EncodingError):
            decode_receipt(raw)
    with pytest.raises(EncodingError):
        decode_receipt(b"\x00" * (MAX_RECEIPT_BYTES + 1))
    with pytest.raises(EncodingError):
        decode_receipt("0x00")  # type: ignore[arg-type]


def test_the_size_cap_is_4_mib_inclusive() -> None:
    """The precompile and the Solidity verifier cap their input at the same 4 MiB: a receipt of
    exactly that size must reach the decoder here too, or a receipt one side accepts would be
    refused by the other."""
    with pytest.raises(EncodingError, match=r"^receipt of 4194305 bytes exceeds 4194304$"):
        decode_receipt(b"\x00" * (4 * 1024 * 1024 + 1))
    with pytest.raises(EncodingError) as info:
        decode_receipt(b"\x00" * (4 * 1024 * 1024))
    assert "exceeds" not in str(info.value)  # refused by the layout, not by the cap


def test_a_spec_this_node_cannot_run_still_decodes(receipt: TrainingReceipt) -> None:
    """Starting a run is gated on what this node supports; reading a receipt is not: a receipt
    another node sealed for a tier this one does not run yet must still decode (to be verified
    or refused on its merits)."""
    from tenzro_training.spec import Tier, TrainingTaskSpec

    doc = receipt.spec.to_dict()
    doc["tier"] = "Verified"
    other = dataclasses.replace(receipt, spec=TrainingTaskSpec.from_dict(doc, supported_only=False))
    decoded = decode_receipt(encode_receipt(other))
    assert decoded.spec.tier is Tier.VERIFIED and decoded == by_address(other)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (lambda d: d[:32] + b"\x01" + d[33:], r"^value at byte 32 does not fit uint16$"),
        (lambda d: d[:384], r"^truncated receipt: word at byte 384 runs past the end \(384 bytes\)$"),
    ],
    ids=["version_overflow", "cut_at_a_tail"],
)
def test_decode_errors_say_what_is_wrong_and_where(data: bytes, raw: Callable[[bytes], bytes], message: str) -> None:
    """The message is all the author of another encoder (Solidity, Rust) gets when their bytes
    are refused: it must say what is wrong and name the offending byte."""
    with pytest.raises(EncodingError, match=message):
        decode_receipt(raw(data))


def test_read_task_id_from_the_head_alone(receipt: TrainingReceipt, data: bytes) -> None:
    assert read_receipt_task_id(data) == receipt.task_id
    # Only the head and the taskId are read: the rest may be anything (TRAINING_VERIFY looks
    # the seal up with it before it decodes the rest).
    tail_at = 32 + 11 * 32 + 32 + -(-len(receipt.task_id.encode()) // 32) * 32
    assert read_receipt_task_id(data[:tail_at]) == receipt.task_id
    assert read_receipt_task_id(data[:tail_at] + b"\xff" * 64) == receipt.task_id
    bad = [
        b"",
        data[:32],
        data[: tail_at - 1],  # the string's padding cut
        (64).to_bytes(32, "big") + data[32:],  # top-level offset moved
        data[:64] + (11 * 32 + 32).to_bytes(32, "big") + data[96:],  # taskId offset moved
        data[:tail_at - 1] + b"\x01" + data[tail_at:],  # non-zero padding after the taskId
    ]
    for raw in bad:
        with pytest.raises(EncodingError):
            read_receipt_task_id(raw)
    with pytest.raises(EncodingError):
        read_receipt_task_id("0x00")  # type: ignore[arg-type]


@pytest.mark.parametrize("length", [32, 64])
def test_read_task_id_of_a_whole_number_of_words_ending_the_input(receipt: TrainingReceipt, length: int) -> None:
    """A task id of 32 or 64 bytes has no padding: when the input ends right after it (as the
    head-only read allows), its last byte is the input's last byte and must still be read."""
    task_id = "t" * length
    raw = reencode(receipt, _set(1, task_id))
    tail_at = 32 + 11 * 32 + 32 + length
    assert read_receipt_task_id(raw[:tail_at]) == task_id
    with pytest.raises(EncodingError, match=r"^truncated receipt: string of"):
        read_receipt_task_id(raw[: tail_at - 1])
    with pytest.raises(EncodingError, match=r"^truncated receipt: word at byte 384 runs past the end \(384 bytes\)$"):
        read_receipt_task_id(raw[:384])  # cut where the taskId's length word starts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_read_task_id_agrees_with_decode_on_mutants(data: bytes, draw: st.DataObject) -> None:
    """The head read raises nothing but EncodingError, and whenever the full decoder accepts
    bytes, it names the same task."""
    raw = bytearray(data)
    for _ in range(draw.draw(st.integers(0, 3))):
        at = draw.draw(st.integers(0, 14 * 32))  # the head, the taskId and its neighbours
        raw[at] = draw.draw(st.integers(0, 255))
    raw = raw[: draw.draw(st.sampled_from([len(raw), draw.draw(st.integers(0, len(raw)))]))]
    try:
        head: str | None = read_receipt_task_id(bytes(raw))
    except EncodingError:
        head = None
    try:
        decoded = decode_receipt(bytes(raw))
    except EncodingError:
        return
    assert head == decoded.task_id


def test_invalid_aliased_offsets_do_not_amplify(receipt: TrainingReceipt) -> None:
    # Two round-record offsets pointing at the same bytes: eth_abi would decode it, we refuse.
    raw = bytearray(encode_receipt(receipt))
    (value,) = eth_abi.decode([RECEIPT_ABI_TYPE], bytes(raw))
    assert len(value[7]) >= 2
    tuple_start = 32
    records_at = tuple_start + int.from_bytes(raw[tuple_start + 7 * 32 : tuple_start + 8 * 32], "big")
    first_offset = raw[records_at + 32 : records_at + 64]
    raw[records_at + 64 : records_at + 96] = first_offset
    with pytest.raises(EncodingError):
        decode_receipt(bytes(raw))


# --- validity: well-formed but wrong receipts are not verified ---------------------------------


def _drop_last_round(f: list[Any]) -> None:
    f[7].pop()


def _swap_rounds(f: list[Any]) -> None:
    f[7][0], f[7][1] = f[7][1], f[7][0]


def _tamper_round(receipt: TrainingReceipt, **changes: Any) -> Callable[[list[Any]], None]:
    def mutate(f: list[Any]) -> None:
        rec = dataclasses.replace(receipt.transcript[0], **changes)
        f[7][0] = encode_round_record(rec)

    return mutate


def _weight_plus_one(f: list[Any]) -> None:
    f[8][0][1] += 1


def _drop_trainer(f: list[Any]) -> None:
    f[8].pop(0)


def _change_syncers(f: list[Any]) -> None:
    f[9] = f[9] + [b"\x42" * 20]


@pytest.mark.parametrize(
    "make",
    [
        lambda r: _set(5, b"\x00" * 32),  # run root
        lambda r: _set(6, b"\x11" * 32),  # final model hash
        lambda r: _drop_last_round,
        lambda r: _swap_rounds,
        lambda r: _tamper_round(r, model_hash=b"\x22" * 32),
        lambda r: _tamper_round(r, syncer_rank=9),
        lambda r: _weight_plus_one,
        lambda r: _drop_trainer,  # accepted address missing from trainers
        lambda r: _change_syncers,
        lambda r: _set(9, []),
    ],
    ids=["run_root", "final_model_hash", "drop_round", "swap_rounds", "round_model_hash", "round_rank",
         "weight", "missing_trainer", "extra_syncer", "no_syncers"],
)
def test_invalid_receipt_not_verified(receipt: TrainingReceipt, make: Any) -> None:
    raw = reencode(receipt, make(receipt))
    assert verify_receipt_bytes(receipt.run_root, raw) is None
    try:  # whatever it decodes to, it is not a valid receipt under its own root either
        decoded = decode_receipt(raw)
    except EncodingError:
        return
    assert verify_receipt_bytes(decoded.run_root, raw) is None
    assert not verify_receipt(decoded)


def test_invalid_claimed_root(receipt: TrainingReceipt, data: bytes) -> None:
    for claimed in (b"\x00" * 32, receipt.run_root[:31], receipt.run_root + b"\x00", bytearray(receipt.run_root), None):
        assert verify_receipt_bytes(claimed, data) is None  # type: ignore[arg-type]


def test_uncommitted_fields_are_informational(receipt: TrainingReceipt) -> None:
    # stake, DID and sealedAt are not leaves of the run root: a receipt differing only there is
    # still VALID by the rules. Validity is therefore not enough to pay by: TRAINING_VERIFY also
    # requires the bytes' digest to be the sealed record's (tests/chain/test_sealed_binding.py),
    # and every such edit changes the digest. Documented in docs/receipt.md.
    first = by_address(receipt).trainers[0]
    for mutate in (_trainer(0, 2, 7), _trainer(0, 2, first.stake + 1), _trainer(0, 3, "did:tenzro:node:other"),
                   _set(10, 1)):
        edited = reencode(receipt, mutate)
        assert verify_receipt_bytes(receipt.run_root, edited) is not None
        if edited != encode_receipt(receipt):
            assert compute_receipt_digest(edited) != compute_receipt_digest(encode_receipt(receipt))


def test_receipt_digest_is_sha256_of_the_bytes(data: bytes) -> None:
    assert compute_receipt_digest(data) == hashlib.sha256(data).digest()
    assert compute_receipt_digest(bytearray(data)) == compute_receipt_digest(memoryview(data))
    assert len(compute_receipt_digest(b"")) == RECEIPT_DIGEST_LENGTH == 32
    with pytest.raises(EncodingError, match=r"^receipt must be bytes, got str$"):  # hex text is not the receipt
        compute_receipt_digest("0x00")  # type: ignore[arg-type]


def test_extra_zero_weight_trainer_is_valid(receipt: TrainingReceipt) -> None:
    # An enrolled trainer whose every submission was rejected has weight 0; the rules allow it.
    extra = ReceiptTrainer("did:tenzro:node:idle", b"\xff" * 20, 1, 0, False)
    r = dataclasses.replace(receipt, trainers=receipt.trainers + (extra,))
    assert verify_receipt_bytes(receipt.run_root, encode_receipt(r)) is not None


# --- never raises -----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=2048))
def test_random_bytes_never_verify(blob: bytes) -> None:
    assert verify_receipt_bytes(b"\x00" * 32, blob) is None
    try:
        decode_receipt(blob)
    except EncodingError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_mutated_receipts_never_raise_and_rarely_verify(receipt: TrainingReceipt, data: bytes, draw: st.DataObject) -> None:
    raw = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 4))):
        pos = draw.draw(st.integers(0, len(raw) - 1))
        raw[pos] = draw.draw(st.integers(0, 255))
    raw_b = bytes(raw)
    result = verify_receipt_bytes(receipt.run_root, raw_b)
    if raw_b != data and result is not None:
        # Only uncommitted fields (stake, DID, sealedAt) can change and still verify.
        assert result.transcript == receipt.transcript and result.run_root == receipt.run_root
        assert [(t.address, t.reward_weight) for t in result.trainers] == [
            (t.address, t.reward_weight) for t in by_address(receipt).trainers
        ]
    try:
        decode_receipt(raw_b)
    except EncodingError:
        pass


# --- sizes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("rounds", "fragments", "trainers"), [(1, 1, 1), (3, 2, 3), (4, 5, 7), (2, 12, 8)])
def test_size_formulas_equal_the_encoder_and_bound_every_receipt(rounds: int, fragments: int, trainers: int) -> None:
    from tenzro_training.receipt_abi import (
        compute_receipt_size, compute_receipt_size_bound, compute_round_record_size,
    )
    from tests.synthetic_receipts import synthetic_receipt, synthetic_spec

    spec = synthetic_spec(rounds, fragments, trainers)
    for worst in (False, True):
        r = synthetic_receipt(spec, worst_case=worst)
        assert verify_receipt(r)  # a valid receipt, root and weights included
        leaves = [encode_round_record(rec) for rec in r.transcript]
        for rec, leaf in zip(r.transcript, leaves):
            assert compute_round_record_size(len(r.task_id), [len(f.accepted) for f in rec.fragments]) == len(leaf)
        size = compute_receipt_size(len(r.task_id), len(spec.canonical_bytes()), [len(x) for x in leaves],
                                    [len(t.did) for t in r.trainers], len(r.syncers))
        assert size == len(encode_receipt(r))
        bound = compute_receipt_size_bound(spec)
        # The bound is reached exactly by the worst case, and never exceeded.
        assert (size == bound) if worst else (size < bound)


def test_size_bound_of_a_real_sealed_receipt(receipt: TrainingReceipt) -> None:
    from tenzro_training.receipt_abi import compute_receipt_size_bound

    assert len(encode_receipt(receipt)) <= compute_receipt_size_bound(receipt.spec)


def test_invalid_size_bound_of_a_non_spec() -> None:
    from tenzro_training.receipt_abi import compute_receipt_size_bound

    with pytest.raises(EncodingError, match=r"^compute_receipt_size_bound needs a TrainingTaskSpec, got dict$"):
        compute_receipt_size_bound({"max_rounds": 1})  # type: ignore[arg-type]
