"""Tests for tenzro_training.payload: the OuterGradient safetensors codec.

Valid payloads round-trip in every dtype and interoperate with the safetensors library; every
rejection in docs/payload.md has a test_invalid_* case built by editing a valid payload's bytes;
hypothesis fuzzing checks that nothing but PayloadError ever escapes the decoder.
"""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenzro_training.errors import PayloadError
from tenzro_training.fragments import compute_fragment_layouts, gather_fragment
from tenzro_training.payload import (
    PayloadDtypeError,
    PayloadFormatError,
    PayloadHeader,
    PayloadLayoutMismatch,
    PayloadMetadataMismatch,
    PayloadNonFinite,
    PayloadTooLarge,
    PayloadTrailingBytes,
    PayloadTruncated,
    PayloadUnknownEncoding,
    compute_max_header_bytes,
    compute_max_payload_bytes,
    compute_payload_hash,
    compute_payload_tensor_name,
    decode_payload,
    encode_payload,
)

MAX = 1 << 20
TASK = "ts-demo.v1_run-7"


def model() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return {
        "enc.weight": torch.randn(3, 5, generator=gen),
        "enc.bias": torch.randn(3, generator=gen),
        "head.weight": torch.randn(2, 3, generator=gen).to(torch.bfloat16),
        "norm.scale": torch.randn((), generator=gen).to(torch.float16),
    }


LAYOUTS = compute_fragment_layouts(model(), 3)
# 25 elements cut 9 | 8 | 8. Fragment 0: enc.bias (whole) + enc.weight[0:6];
# fragment 1: enc.weight[6:14]; fragment 2: enc.weight[14:15] + head.weight + norm.scale (whole).


def header_for(index: int = 0, **changes) -> PayloadHeader:
    fields = dict(task_id=TASK, round=12, fragment=index, encoding="raw",
                  layout_hash=LAYOUTS[index].layout_hash())
    fields.update(changes)
    return PayloadHeader(**fields)


def valid(index: int = 0, dtype: str = "float32") -> bytes:
    return encode_payload(header_for(index), LAYOUTS[index], model(), dtype)


def split(data: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def join(doc: dict | str | bytes, body: bytes) -> bytes:
    text = doc if isinstance(doc, (str, bytes)) else json.dumps(doc)
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw + body


def decode(data, index: int = 0, **kwargs):
    kwargs.setdefault("max_bytes", MAX)
    return decode_payload(data, LAYOUTS[index], **kwargs)


# --- valid payloads -------------------------------------------------------------------------


@pytest.mark.parametrize("index", [0, 1, 2])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_round_trip(index: int, dtype: str) -> None:
    layout = LAYOUTS[index]
    data = encode_payload(header_for(index), layout, model(), dtype)
    decoded = decode(data, index, expected=header_for(index))
    want = gather_fragment(model(), layout).to(getattr(torch, dtype)).to(torch.float32)
    flat = decoded.flat_fp32()
    assert decoded.header == header_for(index) and decoded.dtype == dtype
    assert flat.dtype == torch.float32 and flat.shape == (layout.numel,)
    assert torch.equal(flat.view(torch.int32), want.view(torch.int32))  # bit-exact after the cast


def test_round_trip_from_flat_vector_is_bit_exact_fp32() -> None:
    layout = LAYOUTS[1]
    flat = torch.tensor([1.0, -0.0, 1e-45, -3.4028234663852886e38, 0.1, 2.5, -7.0, 1e-38])
    decoded = decode(encode_payload(header_for(1), layout, flat), 1)
    assert torch.equal(decoded.flat_fp32().view(torch.int32), flat.view(torch.int32))


def test_fp16_and_bf16_widen_exactly() -> None:
    layout = LAYOUTS[1]
    flat = torch.tensor([65504.0, -6.103515625e-05, 5.960464477539063e-08, -0.0, 1.0, 0.5, 3.0, -65504.0])
    decoded = decode(encode_payload(header_for(1), layout, flat, "float16"), 1)
    assert decoded.flat_fp32().tolist() == flat.tolist()
    flat_bf = torch.tensor([3.3895313892515355e38, 9.183549615799121e-41, -1.0, 0.0078125, 2.0, -256.0, 1.0, -0.0])
    decoded = decode(encode_payload(header_for(1), layout, flat_bf, "bfloat16"), 1)
    assert decoded.flat_fp32().tolist() == flat_bf.tolist()


def test_format_names_shapes_and_metadata() -> None:
    doc, body = split(valid(2, "bfloat16"))
    layout = LAYOUTS[2]
    assert [compute_payload_tensor_name(e) for e in layout.entries] == [
        "enc.weight#14:15", "head.weight", "norm.scale"]
    assert doc["__metadata__"] == {
        "tenzro.version": "1", "tenzro.task_id": TASK, "tenzro.round": "12", "tenzro.fragment": "2",
        "tenzro.encoding": "raw", "tenzro.dtype": "bfloat16",
        "tenzro.layout_hash": "0x" + layout.layout_hash().hex(),
    }
    assert doc["enc.weight#14:15"] == {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}
    assert doc["head.weight"] == {"dtype": "BF16", "shape": [2, 3], "data_offsets": [2, 14]}
    assert doc["norm.scale"] == {"dtype": "BF16", "shape": [], "data_offsets": [14, 16]}
    assert len(body) == 16
    assert struct.unpack("<Q", valid(2)[:8])[0] % 8 == 0


def test_encoding_is_deterministic_and_hash_is_sha256() -> None:
    a, b = valid(0), encode_payload(header_for(0), LAYOUTS[0], dict(reversed(list(model().items()))))
    assert a == b
    assert compute_payload_hash(a) == hashlib.sha256(a).digest()
    assert compute_payload_hash(memoryview(a)) == compute_payload_hash(bytearray(a))


def test_safetensors_library_reads_our_payloads() -> None:
    data = valid(0, "float16")
    loaded = safetensors.torch.load(data)
    assert set(loaded) == {"enc.bias", "enc.weight#0:6"}
    assert loaded["enc.bias"].dtype == torch.float16 and loaded["enc.bias"].shape == (3,)
    assert torch.equal(loaded["enc.bias"], model()["enc.bias"].to(torch.float16))


def test_payloads_written_by_the_safetensors_library_decode() -> None:
    layout, state = LAYOUTS[2], model()
    flat = gather_fragment(state, layout)
    tensors = {
        "enc.weight#14:15": flat[0:1].to(torch.bfloat16),
        "head.weight": state["head.weight"],
        "norm.scale": flat[7].reshape(()).to(torch.bfloat16),
    }
    meta = {
        "tenzro.version": "1", "tenzro.task_id": TASK, "tenzro.round": "12", "tenzro.fragment": "2",
        "tenzro.encoding": "raw", "tenzro.dtype": "bfloat16",
        "tenzro.layout_hash": "0x" + layout.layout_hash().hex(),
    }
    data = safetensors.torch.save(tensors, metadata=meta)
    decoded = decode(data, 2, expected=header_for(2))
    assert torch.equal(decoded.flat_fp32(), flat.to(torch.bfloat16).float())


def test_decode_accepts_memoryview_and_bytearray() -> None:
    data = valid(1)
    for form in (bytearray(data), memoryview(data), memoryview(bytearray(data))):
        assert torch.equal(decode(form, 1).flat_fp32(), decode(data, 1).flat_fp32())


def test_allowed_dtypes() -> None:
    assert decode(valid(0, "bfloat16"), allowed_dtypes={"bfloat16"}).dtype == "bfloat16"
    with pytest.raises(PayloadDtypeError):
        decode(valid(0, "bfloat16"), allowed_dtypes={"float32"})


def test_max_header_bytes_leaves_room_for_real_headers() -> None:
    for index in range(3):
        data = valid(index)
        assert struct.unpack("<Q", data[:8])[0] * 4 < compute_max_header_bytes(LAYOUTS[index])


def test_max_payload_bytes_bounds_every_dtype() -> None:
    for index in range(3):
        cap = compute_max_payload_bytes(LAYOUTS[index])
        assert all(len(valid(index, dtype)) <= cap for dtype in ("float32", "float16", "bfloat16"))
        assert decode(valid(index), index, max_bytes=cap).dtype == "float32"  # accepted under that bound


# --- invalid payloads -----------------------------------------------------------------------


@pytest.mark.parametrize("cut", [0, 1, 7, 8, 9, 50, "header-1", "header", "header+1", "end-4", "end-1"])
def test_invalid_truncated(cut) -> None:
    data = valid(0)
    n = struct.unpack("<Q", data[:8])[0]
    if isinstance(cut, str):
        cut = {"header-1": 8 + n - 1, "header": 8 + n, "header+1": 8 + n + 1,
               "end-4": len(data) - 4, "end-1": len(data) - 1}[cut]
    with pytest.raises(PayloadTruncated):
        decode(data[:cut])


def test_invalid_header_length_past_end() -> None:
    data = valid(0)
    n = struct.unpack("<Q", data[:8])[0]
    with pytest.raises(PayloadTruncated, match="header declares"):
        decode(struct.pack("<Q", len(data) - 8 + 1) + data[8:])
    with pytest.raises(PayloadTruncated):
        decode(struct.pack("<Q", n + 100) + data[8 : 8 + n])


def test_invalid_oversized() -> None:
    data = valid(0)
    assert decode(data, max_bytes=len(data)).header == header_for(0)
    with pytest.raises(PayloadTooLarge) as info:
        decode(data, max_bytes=len(data) - 1)
    assert (info.value.what, info.value.size, info.value.limit) == ("payload", len(data), len(data) - 1)


@pytest.mark.parametrize("length", [2**64 - 1, 2**63, 2**40])
def test_invalid_header_length_beyond_the_bytes_present(length) -> None:
    """A file that is not safetensors (its first 8 bytes a huge length) is truncated, not "too
    large" (what a random file was called before)."""
    data = valid(0)
    with pytest.raises(PayloadTruncated, match=f"header declares {length} bytes"):
        decode(struct.pack("<Q", length) + data[8:], max_bytes=len(data) + 8)
    with pytest.raises(PayloadTruncated):  # any 4 KiB file whose first 8 bytes are not a small length
        decode(bytes(range(256)) * 16, max_bytes=4096)


def test_header_and_payload_caps_follow_the_documented_formula() -> None:
    # docs/payload.md: 4096 + per entry (256 + 6 * (UTF-8 name length + 42) + 32 * ndim); a
    # receiver sizes its buffers by these numbers, so they are pinned as literals.
    # Fragment 0: enc.bias (3,), enc.weight (3, 5)[0:6].
    assert compute_max_header_bytes(LAYOUTS[0]) == 4096 + (256 + 6 * (8 + 42) + 32) + (256 + 6 * (10 + 42) + 64) == 5316
    # Fragment 2: enc.weight (3, 5)[14:15], head.weight (2, 3), norm.scale () -- a scalar has ndim 0.
    assert compute_max_header_bytes(LAYOUTS[2]) == 5934
    # Length prefix + header cap + the data in float32.
    assert compute_max_payload_bytes(LAYOUTS[0]) == 8 + 5316 + 4 * 9
    assert compute_max_payload_bytes(LAYOUTS[1]) == 8 + 4728 + 4 * 8


def test_invalid_header_length_above_the_cap_with_the_bytes_present() -> None:
    data = valid(0)
    cap = compute_max_header_bytes(LAYOUTS[0])
    data = data + b" " * (cap + 1)
    with pytest.raises(PayloadTooLarge) as info:
        decode(struct.pack("<Q", cap + 1) + data[8:], max_bytes=len(data) + 8)
    assert info.value.what == "header" and info.value.limit == cap


def test_invalid_duplicate_tensor_names_in_json_header() -> None:
    doc, body = split(valid(0))
    text = json.dumps(doc)
    entry = json.dumps(doc["enc.bias"])
    dup = text[:-1] + ', "enc.bias": ' + entry + "}"
    with pytest.raises(PayloadFormatError, match="duplicate key"):
        decode(join(dup, body))


def test_invalid_duplicate_metadata_keys() -> None:
    doc, body = split(valid(0))
    text = json.dumps(doc).replace('"tenzro.round": "12"', '"tenzro.round": "12", "tenzro.round": "13"')
    with pytest.raises(PayloadFormatError, match="duplicate key"):
        decode(join(text, body))


def test_invalid_missing_tensor() -> None:
    doc, body = split(valid(0))
    size = doc["enc.bias"]["data_offsets"][1]
    del doc["enc.bias"]
    doc["enc.weight#0:6"]["data_offsets"] = [0, 24]
    with pytest.raises(PayloadLayoutMismatch, match="missing"):
        decode(join(doc, body[size:]))


def test_invalid_extra_tensor() -> None:
    doc, body = split(valid(0))
    end = len(body)
    doc["enc.bias#0:1"] = {"dtype": "F32", "shape": [1], "data_offsets": [end, end + 4]}
    with pytest.raises(PayloadLayoutMismatch, match="unexpected"):
        decode(join(doc, body + b"\x00" * 4))


def test_invalid_renamed_tensor() -> None:
    doc, body = split(valid(0))
    doc["enc.weight#0:7"] = doc.pop("enc.weight#0:6")
    with pytest.raises(PayloadLayoutMismatch):
        decode(join(doc, body))


@pytest.mark.parametrize("shape", [[1, 3], [3, 1], [4], [], [2]])
def test_invalid_wrong_shape(shape) -> None:
    doc, body = split(valid(0))
    doc["enc.bias"]["shape"] = shape
    with pytest.raises(PayloadLayoutMismatch, match="shape"):
        decode(join(doc, body))


def test_invalid_wrong_shape_of_whole_tensor_sent_flat() -> None:
    doc, body = split(valid(2))
    doc["head.weight"]["shape"] = [6]
    with pytest.raises(PayloadLayoutMismatch, match="shape"):
        decode(join(doc, body), 2)


@pytest.mark.parametrize("dtype", ["F16", "BF16", "F64", "I32", "U8", 4, None])
def test_invalid_wrong_dtype(dtype) -> None:
    doc, body = split(valid(0))  # declared float32
    doc["enc.bias"]["dtype"] = dtype
    with pytest.raises(PayloadDtypeError):
        decode(join(doc, body))


def test_invalid_wrong_declared_dtype() -> None:
    doc, body = split(valid(0))
    doc["__metadata__"]["tenzro.dtype"] = "float16"
    with pytest.raises(PayloadDtypeError):
        decode(join(doc, body))
    doc["__metadata__"]["tenzro.dtype"] = "float64"
    with pytest.raises(PayloadDtypeError):
        decode(join(doc, body))


def _with_value(dtype: str, value: float, position: int = 2) -> bytes:
    """A valid payload of fragment 1 (8 values) with one value replaced at the byte level."""
    data = encode_payload(header_for(1), LAYOUTS[1], torch.ones(8), dtype)
    item = {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
    raw = torch.tensor([value], dtype=getattr(torch, dtype)).view(torch.uint8).numpy().tobytes()
    start = len(data) - 8 * item + position * item
    return data[:start] + raw + data[start + item :]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_invalid_nan(dtype) -> None:
    with pytest.raises(PayloadNonFinite) as info:
        decode(_with_value(dtype, float("nan")), 1)
    assert info.value.count == 1 and info.value.name == "enc.weight"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_invalid_pos_inf(dtype) -> None:
    with pytest.raises(PayloadNonFinite):
        decode(_with_value(dtype, float("inf"), 6), 1)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_invalid_neg_inf(dtype) -> None:
    with pytest.raises(PayloadNonFinite):
        decode(_with_value(dtype, float("-inf"), 0), 1)


def test_invalid_nan_bit_pattern_variants() -> None:
    data = valid(1)
    for pattern in (b"\x01\x00\x80\x7f", b"\xff\xff\xff\xff", b"\x00\x00\xc0\xff"):  # sNaN, -qNaN...
        with pytest.raises(PayloadNonFinite):
            decode(data[:-4] + pattern, 1)


def test_invalid_encode_non_finite_or_overflowing_values() -> None:
    flat = torch.ones(8)
    flat[3] = float("nan")
    with pytest.raises(PayloadNonFinite):
        encode_payload(header_for(1), LAYOUTS[1], flat)
    with pytest.raises(PayloadNonFinite):  # 70000 overflows fp16 to +Inf
        encode_payload(header_for(1), LAYOUTS[1], torch.full((8,), 70000.0), "float16")


def test_invalid_overlapping_offsets() -> None:
    doc, body = split(valid(0))  # enc.bias [0,12], enc.weight#0:6 [12,36]
    doc["enc.weight#0:6"]["data_offsets"] = [8, 32]
    with pytest.raises(PayloadFormatError, match="overlaps"):
        decode(join(doc, body[:32]))
    doc["enc.weight#0:6"]["data_offsets"] = [0, 24]  # both start at 0
    with pytest.raises(PayloadFormatError, match="overlaps"):
        decode(join(doc, body[:24]))


def test_invalid_hole_between_tensors() -> None:
    doc, body = split(valid(0))
    doc["enc.weight#0:6"]["data_offsets"] = [16, 40]
    with pytest.raises(PayloadFormatError, match="hole"):
        decode(join(doc, body[:12] + b"\x00" * 4 + body[12:]))


@pytest.mark.parametrize(
    "offsets", [[12, 24], [12, 40], [36, 12], [12], [12, 36, 40], [-4, 12], [12.0, 36], "12:36", None]
)
def test_invalid_data_offsets(offsets) -> None:
    doc, body = split(valid(0))
    doc["enc.weight#0:6"]["data_offsets"] = offsets
    with pytest.raises(PayloadFormatError):
        decode(join(doc, body))


def test_invalid_offsets_past_end() -> None:
    doc, body = split(valid(0))
    doc["enc.bias"]["data_offsets"] = [24, 36]
    doc["enc.weight#0:6"]["data_offsets"] = [0, 24]
    assert decode(join(doc, body[24:] + body[:24])).dtype == "float32"  # any data order is fine
    with pytest.raises(PayloadTruncated):
        decode(join(doc, body[:-4]))


@pytest.mark.parametrize(
    "field,value",
    [("task_id", "other-task"), ("round", 13), ("fragment", 1), ("layout_hash", b"\x11" * 32)],
)
def test_invalid_metadata_mismatch_with_expected(field, value) -> None:
    with pytest.raises(PayloadMetadataMismatch) as info:
        decode(valid(0), expected=header_for(0, **{field: value}))
    assert info.value.field == field and info.value.expected == value


@pytest.mark.parametrize(
    "key,value",
    [("tenzro.fragment", "1"), ("tenzro.layout_hash", "0x" + "ab" * 32)],
)
def test_invalid_metadata_mismatch_with_layout(key, value) -> None:
    doc, body = split(valid(0))
    doc["__metadata__"][key] = value
    with pytest.raises(PayloadLayoutMismatch):
        decode(join(doc, body))


def test_invalid_payload_for_another_fragment() -> None:
    with pytest.raises(PayloadLayoutMismatch):
        decode(valid(1), 0)


@pytest.mark.parametrize(
    "key,value",
    [
        ("tenzro.round", "012"), ("tenzro.round", "-1"), ("tenzro.round", "1e3"), ("tenzro.round", " 1"),
        ("tenzro.round", "18446744073709551616"), ("tenzro.fragment", "0x0"), ("tenzro.fragment", ""),
        ("tenzro.layout_hash", "AB" * 32), ("tenzro.layout_hash", "0x" + "AB" * 32), ("tenzro.layout_hash", "0x12"),
        ("tenzro.task_id", ""), ("tenzro.task_id", "a/b"), ("tenzro.task_id", "x" * 129),
        ("tenzro.version", "2"), ("tenzro.round", 12),
    ],
)
def test_invalid_metadata_values(key, value) -> None:
    doc, body = split(valid(0))
    doc["__metadata__"][key] = value
    with pytest.raises(PayloadFormatError):
        decode(join(doc, body))


def test_invalid_metadata_keys() -> None:
    doc, body = split(valid(0))
    doc["__metadata__"]["tenzro.extra"] = "1"
    with pytest.raises(PayloadFormatError, match="unknown"):
        decode(join(doc, body))
    doc, body = split(valid(0))
    del doc["__metadata__"]["tenzro.task_id"]
    with pytest.raises(PayloadFormatError, match="missing"):
        decode(join(doc, body))
    doc, body = split(valid(0))
    del doc["__metadata__"]
    with pytest.raises(PayloadFormatError, match="__metadata__"):
        decode(join(doc, body))


@pytest.mark.parametrize("encoding", ["dct-topk", "RAW", "int8", "Q8", ""])
def test_invalid_unknown_encoding(encoding) -> None:
    doc, body = split(valid(0))
    doc["__metadata__"]["tenzro.encoding"] = encoding
    with pytest.raises(PayloadUnknownEncoding):
        decode(join(doc, body))
    if encoding:
        with pytest.raises(PayloadUnknownEncoding):
            encode_payload(header_for(0, encoding=encoding), LAYOUTS[0], model())


@pytest.mark.parametrize(
    "text",
    [b"not json at all", b"{\"a\": 1", b"{'__metadata__': {}}", b"\xff\xfe{}", b"{\"a\":NaN}",
     b"{\"a\":Infinity}", b"[1, 2]", b" {}", b"{}", b"{\"a\":" + b"[" * 2000 + b"]" * 2000 + b"}", b"{\"a\":1}garbage",
     b"{\"x\":" + b"9" * 5000 + b"}"],
)
def test_invalid_non_json_header(text) -> None:
    _, body = split(valid(0))
    with pytest.raises(PayloadFormatError):
        decode(join(text, body))


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_invalid_non_json_constant_is_a_format_error_wherever_it_stands(constant: str) -> None:
    # Python's json reads these; the header parser refuses them outright, so a constant never
    # reaches a field check (as a tensor dtype it would otherwise be an "unsupported dtype").
    doc, body = split(valid(0))
    text = json.dumps(doc).replace('"dtype": "F32"', f'"dtype": {constant}', 1)
    assert constant in text
    with pytest.raises(PayloadFormatError, match="non-JSON constant"):
        decode(join(text, body))


def test_invalid_tensor_entry_fields() -> None:
    for mutate in (
        lambda info: info.pop("dtype"),
        lambda info: info.update(extra=1),
        lambda info: info.update(shape=[3.0]),
        lambda info: info.update(shape=[True, 3]),
        lambda info: info.update(shape="3"),
    ):
        doc, body = split(valid(0))
        mutate(doc["enc.bias"])
        with pytest.raises(PayloadError):
            decode(join(doc, body))
    doc, body = split(valid(0))
    doc["enc.bias"] = [1, 2]
    with pytest.raises(PayloadFormatError):
        decode(join(doc, body))


@pytest.mark.parametrize("extra", [b"\x00", b" ", b"\x00" * 4, b"trailing garbage"])
def test_invalid_trailing_bytes(extra) -> None:
    with pytest.raises(PayloadTrailingBytes):
        decode(valid(0) + extra)


@pytest.mark.parametrize("data", ["a string", None, 12, [1, 2], memoryview(b"\x00" * 32)[::2]])
def test_invalid_payload_type(data) -> None:
    with pytest.raises(PayloadError):
        decode(data)


def test_invalid_decode_arguments() -> None:
    with pytest.raises(PayloadError):
        decode_payload(valid(0), LAYOUTS[0], max_bytes=-1)
    with pytest.raises(PayloadError):
        decode_payload(valid(0), LAYOUTS[0], max_bytes=None)
    with pytest.raises(PayloadError):
        decode_payload(valid(0), "layout", max_bytes=MAX)
    with pytest.raises(PayloadError):
        decode_payload(valid(0), LAYOUTS[0], max_bytes=MAX, expected={"task_id": TASK})


def test_invalid_payload_above_a_zero_byte_limit_is_too_large() -> None:
    # 0 is a valid (if useless) limit: every payload exceeds it, it is not a bad argument.
    data = valid(0)
    with pytest.raises(PayloadTooLarge) as info:
        decode_payload(data, LAYOUTS[0], max_bytes=0)
    assert (info.value.what, info.value.size, info.value.limit) == ("payload", len(data), 0)
    with pytest.raises(PayloadTruncated):  # no bytes at all: within the limit, then too short
        decode_payload(b"", LAYOUTS[0], max_bytes=0)


def test_invalid_encode_arguments() -> None:
    with pytest.raises(PayloadLayoutMismatch):
        encode_payload(header_for(0), LAYOUTS[1], model())  # header for fragment 0
    with pytest.raises(PayloadLayoutMismatch):
        encode_payload(header_for(1, layout_hash=b"\x00" * 32), LAYOUTS[1], model())
    with pytest.raises(PayloadLayoutMismatch):
        encode_payload(header_for(1), LAYOUTS[1], torch.zeros(9))
    with pytest.raises(PayloadLayoutMismatch):
        encode_payload(header_for(1), LAYOUTS[1], {"enc.weight": torch.zeros(12)})
    with pytest.raises(PayloadDtypeError):
        encode_payload(header_for(1), LAYOUTS[1], model(), "float64")
    with pytest.raises(PayloadError):
        encode_payload(header_for(1), LAYOUTS[1], [0.0] * 8)


@pytest.mark.parametrize(
    "changes",
    [{"task_id": ""}, {"task_id": "a b"}, {"round": -1}, {"round": 2**64}, {"round": True},
     {"fragment": "0"}, {"encoding": ""}, {"layout_hash": b"\x00" * 31}, {"layout_hash": "00" * 32}],
)
def test_invalid_header_values(changes) -> None:
    with pytest.raises(PayloadError):
        header_for(0, **changes)


# --- fuzzing --------------------------------------------------------------------------------


def _decode_or_payload_error(data: bytes, index: int = 0) -> None:
    try:
        decoded = decode(data, index)
    except PayloadError:
        return
    assert decoded.flat_fp32().shape == (LAYOUTS[index].numel,)
    assert bool(torch.isfinite(decoded.flat_fp32()).all())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=600))
def test_fuzz_random_bytes_raise_only_payload_error(data) -> None:
    _decode_or_payload_error(data)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400))
def test_fuzz_random_bytes_behind_a_plausible_length_prefix(data) -> None:
    _decode_or_payload_error(struct.pack("<Q", len(data)) + data)
    _decode_or_payload_error(struct.pack("<Q", max(len(data) - 8, 0)) + data)


VALID = {(i, d): valid(i, d) for i in range(3) for d in ("float32", "float16", "bfloat16")}


@settings(max_examples=400, deadline=None)
@given(
    which=st.sampled_from(sorted(VALID)),
    edits=st.lists(
        st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]),
                  st.integers(0, 2**16), st.integers(0, 255)),
        min_size=1, max_size=4,
    ),
)
def test_fuzz_mutated_valid_payloads_raise_only_payload_error(which, edits) -> None:
    data = bytearray(VALID[which])
    for op, pos, byte in edits:
        if not data:
            break
        pos %= len(data)
        if op == "flip":
            data[pos] ^= 1 << (byte % 8)
        elif op == "set":
            data[pos] = byte
        elif op == "insert":
            data.insert(pos, byte)
        elif op == "delete":
            del data[pos]
        else:
            del data[pos:]
    _decode_or_payload_error(bytes(data), which[0])


json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    which=st.sampled_from(sorted(VALID)),
    path=st.lists(st.integers(0, 20), min_size=1, max_size=3),
    value=json_value,
)
def test_fuzz_mutated_json_headers_raise_only_payload_error(which, path, value) -> None:
    doc, body = split(VALID[which])
    # Replace one field, chosen by walking ``path`` through the header's nested objects.
    node = doc
    for step in path:
        keys = sorted(node)
        key = keys[step % len(keys)]
        if isinstance(node[key], dict) and node[key] and step % 2 == 0:
            node = node[key]
            continue
        node[key] = value
        break
    _decode_or_payload_error(join(doc, body), which[0])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_zero_copy_decode_equals_copying_decode(dtype: str) -> None:
    """zero_copy=True gives a view for float32 payloads and a copy otherwise; values are identical."""
    import numpy as np

    from tenzro_training.fragments import compute_fragment_layouts
    from tenzro_training.payload import PayloadHeader, decode_payload, encode_payload

    state = {"a": torch.randn(3, 5), "b": torch.randn(7), "c": torch.randn(2, 2)}
    for layout in compute_fragment_layouts(state, 2):
        header = PayloadHeader("t", 0, layout.index, "raw", layout.layout_hash())
        data = encode_payload(header, layout, torch.randn(layout.numel), dtype=dtype)
        copied = decode_payload(data, layout, max_bytes=1 << 20).flat_fp32()
        viewed = decode_payload(data, layout, max_bytes=1 << 20, zero_copy=True).flat_fp32()
        assert torch.equal(copied, viewed)
        shares = np.shares_memory(viewed.numpy(), np.frombuffer(data, dtype=np.uint8))
        assert shares == (dtype == "float32")


def test_a_remembered_header_is_still_checked_against_each_call() -> None:
    """Header checks are memoized per (header bytes, layout): a payload whose header was already
    accepted must still fail everything that depends on the call or on the data after it."""
    data = valid(0)
    first = decode_payload(data, LAYOUTS[0], expected=header_for(0), max_bytes=MAX)
    again = decode_payload(data, LAYOUTS[0], expected=header_for(0), max_bytes=MAX)  # a cache hit
    assert again.header == first.header and torch.equal(again.flat_fp32(), first.flat_fp32())
    with pytest.raises(PayloadMetadataMismatch):
        decode_payload(data, LAYOUTS[0], expected=header_for(0, round=13), max_bytes=MAX)
    with pytest.raises(PayloadDtypeError):
        decode_payload(data, LAYOUTS[0], max_bytes=MAX, allowed_dtypes={"float16"})
    with pytest.raises(PayloadTruncated):
        decode_payload(data[:-4], LAYOUTS[0], max_bytes=MAX)
    with pytest.raises(PayloadTrailingBytes):
        decode_payload(data + bytes(4), LAYOUTS[0], max_bytes=MAX)
    with pytest.raises(PayloadError):
        decode_payload(data, LAYOUTS[1], max_bytes=MAX)  # same header bytes, another layout
    with pytest.raises(PayloadTooLarge):
        decode_payload(data, LAYOUTS[0], max_bytes=len(data) - 1)
    # The values are read from each call's own bytes, never from a remembered payload.
    n = struct.unpack("<Q", data[:8])[0]
    body = bytearray(data[8 + n :])
    body[:4] = struct.pack("<f", 42.0)  # encode_payload lays the flat vector out in order
    patched = data[: 8 + n] + bytes(body)  # byte-identical header: a hit
    assert first.flat_fp32()[0] != 42.0
    assert decode_payload(patched, LAYOUTS[0], max_bytes=MAX).flat_fp32()[0] == 42.0


def test_a_refused_header_is_refused_every_time() -> None:
    doc, body = split(valid(0))
    doc["__metadata__"]["tenzro.round"] = "012"  # not canonical
    bad = join(doc, body)
    for _ in range(3):
        with pytest.raises(PayloadFormatError, match="canonical"):
            decode_payload(bad, LAYOUTS[0], max_bytes=MAX)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_max_abs_bounds_every_value(dtype: str) -> None:
    from tenzro_training.payload import PayloadValueOutOfRange

    layout = LAYOUTS[2]
    flat = torch.zeros(layout.numel)
    flat[-1] = -1000.0  # the last element: norm.scale
    data = encode_payload(header_for(2), layout, flat, dtype)
    assert decode_payload(data, layout, max_bytes=MAX, max_abs=1000.0).flat_fp32()[-1] == -1000.0
    with pytest.raises(PayloadValueOutOfRange) as info:
        decode_payload(data, layout, max_bytes=MAX, max_abs=999.0)
    assert (info.value.name, info.value.count, info.value.limit) == ("norm.scale", 1, 999.0)
    decode_payload(data, layout, max_bytes=MAX)  # no bound: accepted
    # A non-finite value is still named as such, bound or not.
    doc, body = split(data)
    nan = bytearray(body)
    nan[:4 if dtype == "float32" else 2] = b"\xff" * (4 if dtype == "float32" else 2)
    with pytest.raises(PayloadNonFinite):
        decode_payload(join(doc, bytes(nan)), layout, max_bytes=MAX, max_abs=1.0)
    # Skipping the finiteness scan (check_finite=False) does not skip the bound.
    with pytest.raises(PayloadValueOutOfRange):
        decode_payload(data, layout, max_bytes=MAX, max_abs=999.0, check_finite=False)
    assert decode_payload(data, layout, max_bytes=MAX, max_abs=1000.0, check_finite=False).flat_fp32()[-1] == -1000.0
