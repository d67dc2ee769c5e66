"""Tests for the ``topk`` payload encoding (docs/payload.md "topk"): round trips in every dtype,
the one canonical byte layout, each rejection, and fuzzing (nothing but PayloadError escapes)."""

from __future__ import annotations

import json
import struct

import pytest
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenzro_training.errors import PayloadError
from tenzro_training.fragments import compute_fragment_layouts
from tenzro_training.payload import (
    PayloadDtypeError,
    PayloadFormatError,
    PayloadHeader,
    PayloadLayoutMismatch,
    PayloadMetadataMismatch,
    PayloadNonFinite,
    PayloadTrailingBytes,
    PayloadTruncated,
    PayloadValueOutOfRange,
    compute_max_payload_bytes,
    decode_payload,
    encode_payload,
    encode_topk_payload,
)

STATE = {"enc.weight": torch.zeros(40, 5), "enc.bias": torch.zeros(40), "head.weight": torch.zeros(3, 40)}
LAYOUTS = compute_fragment_layouts(STATE, 2)  # 360 values: 180 | 180
LAY = LAYOUTS[1]
MAX = 1 << 20


def header(encoding: str = "topk", **changes) -> PayloadHeader:
    fields = dict(task_id="t-1", round=3, fragment=LAY.index, encoding=encoding, layout_hash=LAY.layout_hash())
    fields.update(changes)
    return PayloadHeader(**fields)


IDX = torch.tensor([0, 7, 8, 100, 179])
VALS = torch.tensor([1.5, -0.0, 3e-3, -2.25, 65504.0])


def valid(dtype: str = "float32") -> bytes:
    return encode_topk_payload(header(), LAY, IDX, VALS, dtype)


def split(data: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def join(doc: dict, body: bytes) -> bytes:
    raw = json.dumps(doc).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def decode(data: bytes, k: int | None = 5, **kwargs):
    return decode_payload(data, LAY, max_bytes=MAX, topk_k=k, **kwargs)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_round_trip_scatters_the_cast_values_into_zeros(dtype: str) -> None:
    decoded = decode(valid(dtype), expected=header("raw"))  # expected.encoding is not compared
    flat = decoded.flat_fp32()
    want = torch.zeros(LAY.numel)
    want[IDX] = VALS.to(getattr(torch, dtype)).float()
    assert decoded.header.encoding == "topk" and decoded.dtype == dtype
    assert torch.equal(flat.view(torch.int32), want.view(torch.int32))  # -0.0 kept bit for bit


def test_the_encoder_writes_this_layout_and_safetensors_loads_it() -> None:
    data = valid("bfloat16")
    doc, body = split(data)
    assert list(doc) == ["__metadata__", "indices", "values"]
    assert doc["indices"] == {"dtype": "U32", "shape": [5], "data_offsets": [0, 20]}
    assert doc["values"] == {"dtype": "BF16", "shape": [5], "data_offsets": [20, 30]}
    assert doc["__metadata__"]["tenzro.encoding"] == "topk"
    assert struct.unpack("<5I", body[:20]) == tuple(IDX.tolist())
    assert (8 + struct.unpack("<Q", data[:8])[0]) % 8 == 0
    loaded = safetensors.torch.load(data)
    assert loaded["indices"].tolist() == IDX.tolist()
    assert valid("bfloat16") == data  # deterministic


def test_topk_payload_fits_the_raw_cap_at_the_densest_encoding() -> None:
    k = -(-LAY.numel * 5000 // 10000)
    idx = torch.arange(k)
    data = encode_topk_payload(header(), LAY, idx, torch.ones(k), "float32")
    assert len(data) <= compute_max_payload_bytes(LAY)
    assert torch.equal(decode(data, k).flat_fp32()[:k], torch.ones(k))


def test_every_value_of_a_fragment_fits_and_one_more_index_is_a_layout_mismatch() -> None:
    every = torch.arange(LAY.numel)
    data = encode_topk_payload(header(), LAY, every, torch.ones(LAY.numel))
    assert torch.equal(decode(data, LAY.numel).flat_fp32(), torch.ones(LAY.numel))
    with pytest.raises(PayloadLayoutMismatch, match=f"{LAY.numel + 1} indices into a fragment of {LAY.numel}"):
        encode_topk_payload(header(), LAY, torch.arange(LAY.numel + 1), torch.ones(LAY.numel + 1))


def test_indices_travel_as_u32_so_a_fragment_holds_at_most_2_to_the_32_values() -> None:
    fits = compute_fragment_layouts({"w": torch.empty(2**32, device="meta")}, 1)[0]
    huge = compute_fragment_layouts({"w": torch.empty(2**32 + 1, device="meta")}, 1)[0]
    last = torch.tensor([0, 2**32 - 1])
    data = encode_topk_payload(header(fragment=0, layout_hash=fits.layout_hash()), fits, last, torch.ones(2))
    assert struct.unpack("<2I", split(data)[1][:8]) == (0, 2**32 - 1)
    with pytest.raises(PayloadLayoutMismatch, match="u32 indices"):
        encode_topk_payload(header(fragment=0, layout_hash=huge.layout_hash()), huge, last, torch.ones(2))


def test_zero_values_and_empty_payloads_decode() -> None:
    data = encode_topk_payload(header(), LAY, torch.tensor([], dtype=torch.int64), torch.tensor([]), "float32")
    assert torch.equal(decode(data, 0).flat_fp32(), torch.zeros(LAY.numel))


def test_a_run_without_topk_refuses_a_topk_payload() -> None:
    with pytest.raises(PayloadMetadataMismatch, match="encoding"):
        decode(valid(), None)


def test_a_topk_run_accepts_raw_payloads() -> None:
    raw = encode_payload(header("raw"), LAY, torch.ones(LAY.numel))
    assert torch.equal(decode(raw, 5).flat_fp32(), torch.ones(LAY.numel))


def test_the_wrong_number_of_values_is_a_layout_mismatch() -> None:
    with pytest.raises(PayloadLayoutMismatch, match="sends 6 values"):
        decode(valid(), 6)
    with pytest.raises(PayloadError, match="topk_k"):
        decode(valid(), LAY.numel + 1)


@pytest.mark.parametrize("k", [-1, True, 5.0, "5"])
def test_a_topk_k_that_is_not_a_count_is_refused_before_the_payload_is_read(k: object) -> None:
    with pytest.raises(PayloadError, match=r"topk_k must be an integer in 0..180, got "):
        decode(valid(), k)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "indices, match",
    [([3, 2, 9, 10, 11], "ascending"), ([1, 1, 2, 3, 4], "ascending"), ([0, 1, 2, 3, 180], "ascending"),
     # u32: as signed 32-bit numbers these would be -5..-1, ascending, and index from the end
     ([2**32 - 5, 2**32 - 4, 2**32 - 3, 2**32 - 2, 2**32 - 1], "ascending"), ([0, 1, 2, 3, 2**31], "ascending")],
)
def test_invalid_indices_are_refused(indices: list[int], match: str) -> None:
    doc, body = split(valid())
    bad = struct.pack("<5I", *indices) + body[20:]
    with pytest.raises(PayloadFormatError, match=match):
        decode(join(doc, bad))
    with pytest.raises(PayloadFormatError, match=match):
        encode_topk_payload(header(), LAY, torch.tensor(indices), VALS)


def test_non_finite_and_out_of_range_values_name_the_tensor_at_their_index() -> None:
    doc, body = split(valid())
    nan = body[:20] + struct.pack("<5f", 1.0, 2.0, float("nan"), 4.0, 5.0)
    with pytest.raises(PayloadNonFinite) as info:
        decode(join(doc, nan))
    assert info.value.name == LAY.entries[0].name and info.value.count == 1
    assert decode(join(doc, nan), check_finite=False).flat_fp32().isnan().sum() == 1
    with pytest.raises(PayloadValueOutOfRange) as out:
        decode(valid(), max_abs=100.0)
    assert out.value.count == 1  # 65504 at index 179
    with pytest.raises(PayloadValueOutOfRange):  # the bound holds without the NaN scan too
        decode(valid(), max_abs=100.0, check_finite=False)
    assert decode(valid(), max_abs=65504.0, check_finite=False).flat_fp32()[179] == 65504.0
    with pytest.raises(PayloadNonFinite):
        encode_topk_payload(header(), LAY, IDX, torch.tensor([1.0, 2.0, 1e6, 4.0, 5.0]), "float16")


@pytest.mark.parametrize(
    "bad_at, name",
    [((3, 4), "head.weight"), ((1, 3), "enc.weight")],  # IDX[3] = 100 and IDX[4] = 179 lie in head.weight
)
def test_the_culprit_named_is_the_tensor_at_the_first_bad_values_index_not_its_position(bad_at, name: str) -> None:  # type: ignore[no-untyped-def]
    """Fragment 1 is enc.weight[140:200] (positions 0..59) then head.weight (60..179): a value's
    place in the payload (0..4) is not its place in the fragment."""
    assert [e.name for e in LAY.entries] == ["enc.weight", "head.weight"]
    too_big = VALS.clone()
    too_big[list(bad_at)] = 1e6  # beyond float16
    with pytest.raises(PayloadNonFinite) as enc:
        encode_topk_payload(header(), LAY, IDX, too_big, "float16")
    assert (enc.value.name, enc.value.count) == (name, 2)
    doc, body = split(valid())
    nan = list(VALS.tolist())
    for i in bad_at:
        nan[i] = float("nan")
    with pytest.raises(PayloadNonFinite) as dec:
        decode(join(doc, body[:20] + struct.pack("<5f", *nan)))
    assert (dec.value.name, dec.value.count) == (name, 2)
    large = [1.0] * 5
    for i in bad_at:
        large[i] = -200.0
    with pytest.raises(PayloadValueOutOfRange) as out:
        decode(join(doc, body[:20] + struct.pack("<5f", *large)), max_abs=100.0)
    assert (out.value.name, out.value.count) == (name, 2)


def test_header_edits_are_refused() -> None:
    doc, body = split(valid())
    for edit, error in [
        (lambda d: d.update({"extra": {"dtype": "F32", "shape": [0], "data_offsets": [40, 40]}}), PayloadLayoutMismatch),
        (lambda d: d["indices"].update({"dtype": "I32"}), PayloadFormatError),
        (lambda d: d["values"].update({"dtype": "F16"}), PayloadFormatError),
        (lambda d: d["values"].update({"data_offsets": [21, 41]}), PayloadFormatError),
        (lambda d: d.pop("values"), PayloadLayoutMismatch),
        (lambda d: d.update({"indices": [0, 20]}), PayloadFormatError),  # not an object at all
        (lambda d: d.update({"values": "F32"}), PayloadFormatError),
        (lambda d: d["__metadata__"].update({"tenzro.dtype": "float64"}), PayloadDtypeError),
    ]:
        changed = json.loads(json.dumps(doc))
        edit(changed)
        with pytest.raises(error):
            decode(join(changed, body))
    with pytest.raises(PayloadTruncated):
        decode(join(doc, body[:-1]))
    with pytest.raises(PayloadTrailingBytes):
        decode(join(doc, body + b"\0"))


def test_encoders_refuse_the_other_encoding_and_bad_inputs() -> None:
    with pytest.raises(PayloadFormatError, match="encode_topk_payload"):
        encode_payload(header(), LAY, torch.ones(LAY.numel))
    with pytest.raises(PayloadFormatError, match="writes encoding 'topk'"):
        encode_topk_payload(header("raw"), LAY, IDX, VALS)
    with pytest.raises(PayloadFormatError, match="integer"):
        encode_topk_payload(header(), LAY, IDX.float(), VALS)
    with pytest.raises(PayloadFormatError, match="5 values"):
        encode_topk_payload(header(), LAY, IDX, VALS[:4])
    with pytest.raises(PayloadLayoutMismatch):
        encode_topk_payload(header(), LAYOUTS[0], IDX, VALS)


@pytest.mark.parametrize(
    "args, error, match",
    [
        (("not a header", LAY, IDX, VALS), PayloadError, "needs a PayloadHeader and a FragmentLayout"),
        ((None, LAY, IDX, VALS), PayloadError, "needs a PayloadHeader and a FragmentLayout"),
        ((header(), LAY.entries, IDX, VALS), PayloadError, "needs a PayloadHeader and a FragmentLayout"),
        ((header(), LAY, IDX, VALS, "int8"), PayloadDtypeError, "'int8' is not one of"),
        ((header(), LAY, IDX, VALS, "float64"), PayloadDtypeError, "'float64' is not one of"),
        ((header(), LAY, IDX.tolist(), VALS), PayloadError, "must be tensors"),
        ((header(), LAY, IDX, VALS.tolist()), PayloadError, "must be tensors"),
        ((header(), LAY, IDX.reshape(5, 1), VALS), PayloadFormatError, "indices must be a 1-D integer tensor"),
        ((header(), LAY, torch.tensor(True), VALS[:1]), PayloadFormatError, "indices must be a 1-D integer tensor"),
        ((header(), LAY, torch.tensor([False, True]), VALS[:2]), PayloadFormatError, "1-D integer tensor, got"),
        ((header(), LAY, IDX.to(torch.complex64), VALS), PayloadFormatError, "1-D integer tensor, got"),
        ((header(), LAY, IDX, VALS.reshape(5, 1)), PayloadFormatError, "values must be a 1-D floating tensor of 5"),
        ((header(), LAY, IDX, IDX), PayloadFormatError, "values must be a 1-D floating tensor of 5"),
        ((header(), LAY, IDX, VALS[:4]), PayloadFormatError, "values must be a 1-D floating tensor of 5"),
    ],
)
def test_encode_topk_payload_refuses_bad_arguments_with_payload_errors(args, error, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        encode_topk_payload(*args)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
    edits=st.lists(st.tuples(st.integers(0, 2**12), st.integers(0, 255)), min_size=1, max_size=4),
    k=st.sampled_from([None, 4, 5, 6]),
)
def test_fuzz_mutated_topk_payloads_raise_only_payload_error(dtype: str, edits, k) -> None:
    data = bytearray(valid(dtype))
    for pos, byte in edits:
        data[pos % len(data)] = byte
    try:
        flat = decode(bytes(data), k).flat_fp32()
    except PayloadError:
        return
    assert flat.shape == (LAY.numel,) and bool(torch.isfinite(flat).all())
    assert int((flat != 0).sum()) <= 5


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["indices"].update({"data_offsets": [0.0, 20]}),
        lambda d: d["indices"].update({"shape": [5.0]}),
        lambda d: d["values"].update({"shape": [5.0]}),
        lambda d: d["indices"].update({"data_offsets": [False, 20]}),
    ],
)
def test_numbers_spelled_another_way_are_refused(edit) -> None:
    """Shapes and offsets are JSON integers, as for raw payloads: 0.0 or false for 0 was accepted
    (found by the clean-room verifier, which refused them)."""
    doc, body = split(valid())
    edit(doc)
    with pytest.raises(PayloadFormatError):
        decode(join(doc, body))


def test_true_for_a_count_of_one_is_refused() -> None:
    """k = 1: ``true`` == 1 in Python, so an == comparison took "shape": [true]."""
    data = encode_topk_payload(header(), LAY, torch.tensor([4]), torch.tensor([1.0]))
    doc, body = split(data)
    for name in ("indices", "values"):
        changed = json.loads(json.dumps(doc))
        changed[name]["shape"] = [True]
        with pytest.raises(PayloadFormatError):
            decode(join(changed, body), 1)
    assert decode(data, 1).flat_fp32()[4] == 1.0


def test_an_unknown_encoding_is_refused_by_both_encoders_alike() -> None:
    from tenzro_training.payload import PayloadUnknownEncoding

    with pytest.raises(PayloadUnknownEncoding):
        encode_topk_payload(header("dct"), LAY, IDX, VALS)
    with pytest.raises(PayloadUnknownEncoding):
        encode_payload(header("dct"), LAY, torch.ones(LAY.numel))
