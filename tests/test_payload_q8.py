"""Tests for the ``q8`` encoding (docs/payload.md "q8"): the task's value (parsing, limits), the
trainer's quantiser with error feedback, and the payload codec (round trips in every scale
dtype, the one canonical byte layout, each rejection, and fuzzing: nothing but PayloadError
escapes)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenzro_training.compression import (
    MAX_Q8_BLOCK,
    MIN_Q8_BLOCK,
    CompressionError,
    ErrorFeedback,
    PayloadEncoding,
    describe_sparse_cost,
    dequantize_q8,
    quantize_q8,
)
from tenzro_training.errors import PayloadError, SpecError
from tenzro_training.payload import (
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
    encode_q8_payload,
)
from tenzro_training.rules import AggregationRule
from tests.test_payload_topk import LAY, LAYOUTS, join, split  # 360 values: 180 | 180

BLOCK = 16  # 180 values: 11 full blocks and one of 4
MAX = 1 << 20
Q8 = PayloadEncoding.from_json({"q8": {"block_size": BLOCK}})


def header(encoding: str = "q8", **changes: object) -> PayloadHeader:
    fields: dict[str, object] = dict(task_id="t-1", round=3, fragment=LAY.index, encoding=encoding,
                                     layout_hash=LAY.layout_hash())
    fields.update(changes)
    return PayloadHeader(**fields)  # type: ignore[arg-type]


def gradient(seed: int = 0, n: int = LAY.numel) -> torch.Tensor:
    return torch.from_numpy((np.random.default_rng(seed).standard_normal(n) * 1e-3).astype(np.float32))


def valid(dtype: str = "float32", seed: int = 0) -> bytes:
    scales, values, _ = quantize_q8(gradient(seed), BLOCK, dtype)
    return encode_q8_payload(header(), LAY, scales, values, BLOCK, dtype)


def decode(data: bytes, block: int | None = BLOCK, **kwargs: object) -> torch.Tensor:
    return decode_payload(data, LAY, max_bytes=MAX, q8_block=block, **kwargs).flat_fp32()  # type: ignore[arg-type]


# --- the encoding value ---------------------------------------------------------------------


def test_q8_parses_describes_and_round_trips() -> None:
    assert Q8.name == "q8" and Q8.block_size == BLOCK and not Q8.is_sparse and Q8.has_feedback
    assert Q8.to_json() == {"q8": {"block_size": BLOCK}} and Q8.describe() == "q8 (blocks of 16)"
    assert Q8.kept(100) is None and Q8.decode_options(LAY) == {"q8_block": BLOCK}
    assert Q8.decay == 0.95  # the default, as for topk
    decayed = PayloadEncoding.from_json({"q8": {"block_size": 256, "feedback_decay": 1}})
    assert decayed.decay == 1 and decayed.to_json() == {"q8": {"block_size": 256, "feedback_decay": 1}}
    assert PayloadEncoding.from_json(decayed.to_json()) == decayed
    assert PayloadEncoding().decode_options(LAY) == {} and not PayloadEncoding().has_feedback
    topk = PayloadEncoding.from_json({"topk": {"density_bps": 2500}})
    assert topk.decode_options(LAY) == {"topk_k": 45} and topk.has_feedback


@pytest.mark.parametrize(("value", "path"), [
    ("q8", "architecture.metadata.outer_gradient_encoding"),
    ({"q8": {}}, "architecture.metadata.outer_gradient_encoding.q8"),
    ({"q8": 64}, "architecture.metadata.outer_gradient_encoding.q8"),
    ({"q8": {"block_size": MIN_Q8_BLOCK - 1}}, "architecture.metadata.outer_gradient_encoding.q8.block_size"),
    ({"q8": {"block_size": MAX_Q8_BLOCK + 1}}, "architecture.metadata.outer_gradient_encoding.q8.block_size"),
    ({"q8": {"block_size": 64.5}}, "architecture.metadata.outer_gradient_encoding.q8.block_size"),
    ({"q8": {"block_size": True}}, "architecture.metadata.outer_gradient_encoding.q8.block_size"),
    ({"q8": {"block_size": 64, "density_bps": 10}}, "architecture.metadata.outer_gradient_encoding.q8"),
    ({"q8": {"block_size": 64, "feedback_decay": 1.01}}, "architecture.metadata.outer_gradient_encoding.q8.feedback_decay"),
    ({"q8": {"block_size": 64, "feedback_decay": None}}, "architecture.metadata.outer_gradient_encoding.q8.feedback_decay"),
    ({"q8": {"block_size": 64}, "topk": {"density_bps": 1}}, "architecture.metadata.outer_gradient_encoding"),
])
def test_bad_q8_values_are_spec_errors_naming_the_field(value: object, path: str) -> None:
    with pytest.raises(SpecError) as info:
        PayloadEncoding.from_json(value)
    assert info.value.path == path


def test_the_constructor_keeps_each_encodings_parameter_to_itself() -> None:
    for bad in [dict(name="q8"), dict(name="q8", block_size=64, density_bps=10), dict(name="topk", density_bps=10,
                block_size=64), dict(name="raw", block_size=64)]:
        with pytest.raises(SpecError):
            PayloadEncoding(**bad)  # type: ignore[arg-type]


def test_q8_inputs_are_dense_so_no_rule_is_warned_about() -> None:
    for rule in ("Mean", "CoordinateMedian", {"TrimmedMean": {"alpha_bps": 2500}}, {"Krum": {"f": 1}}):
        assert describe_sparse_cost(Q8, AggregationRule.from_spec(rule)) is None


# --- the quantiser ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_quantize_sends_what_the_decoder_reads_and_keeps_the_rest(dtype: str) -> None:
    g = gradient(1)
    scales, values, residual = quantize_q8(g, BLOCK, dtype)
    assert scales.dtype == {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    assert values.dtype == torch.int8 and int(values.min()) >= -127 and int(values.max()) <= 127
    assert scales.numel() == 12 and values.numel() == LAY.numel
    sent = decode(encode_q8_payload(header(), LAY, scales, values, BLOCK, dtype))
    assert torch.equal(sent, dequantize_q8(scales, values, BLOCK))
    assert torch.equal(residual, g - sent)
    # each block's largest magnitude is sent as +-127 levels of its scale (fp32: exactly its level)
    rows = torch.nn.functional.pad(g, (0, 12 * BLOCK - LAY.numel)).view(12, BLOCK)
    assert torch.equal(values.abs().view(-1)[: 11 * BLOCK].view(11, BLOCK).amax(dim=1).to(torch.int64),
                       torch.full((11,), 127))
    if dtype == "float32":  # no scale rounding: every value within half a level
        assert bool((residual.abs() <= scales.repeat_interleave(BLOCK)[: LAY.numel] / 2 * (1 + 1e-6)).all())
    assert float(residual.abs().max()) < float(rows.abs().max()) / 64


def test_a_zero_block_sends_zeros_and_a_zero_scale() -> None:
    g = gradient(2)
    g[:BLOCK] = 0.0
    g[BLOCK] = -0.0
    scales, values, residual = quantize_q8(g, BLOCK, "float32")
    assert float(scales[0]) == 0.0 and not bool(values[:BLOCK].any())
    assert torch.equal(residual[:BLOCK], torch.zeros(BLOCK))


def test_a_block_below_the_scale_dtypes_range_is_sent_as_zeros_and_kept() -> None:
    """1e-6 / 127 underflows to a zero fp16 scale: the block goes out as zeros and stays whole
    in the residual (bf16, with fp32's range, still sends it)."""
    g = torch.full((BLOCK,), 1e-6)
    g[0] = -1e-6
    scales, values, residual = quantize_q8(g, BLOCK, "float16")
    assert float(scales[0]) == 0.0 and not bool(values.any()) and torch.equal(residual, g)
    scales, values, residual = quantize_q8(g, BLOCK, "bfloat16")
    assert float(scales[0]) > 0 and int(values.abs().min()) == 127


def test_a_level_half_way_rounds_to_even() -> None:
    g = torch.zeros(BLOCK)
    g[0], g[1], g[2] = 1.27, 0.005, 0.015  # scale 0.01: 0.5 -> 0 and 1.5 -> 2 levels (as fp32 allows)
    scales, values, _ = quantize_q8(g, BLOCK, "float32")
    expected = torch.round(g / scales.float()[0])
    assert torch.equal(values.to(torch.float32), expected)


def test_quantize_refuses_bad_inputs_and_overflowing_scales() -> None:
    with pytest.raises(CompressionError, match="NaN or Inf"):
        quantize_q8(torch.tensor([1.0, float("nan")]), BLOCK, "float32")
    with pytest.raises(CompressionError, match="1-D float32"):
        quantize_q8(torch.zeros(4, dtype=torch.float64), BLOCK, "float32")
    for block in (0, -1, True, 2.0):
        with pytest.raises(CompressionError, match="block size"):
            quantize_q8(torch.zeros(4), block, "float32")  # type: ignore[arg-type]
    with pytest.raises(CompressionError, match="dtype"):
        quantize_q8(torch.zeros(4), BLOCK, "int8")
    with pytest.raises(CompressionError, match="overflows float16"):  # 1e7 / 127 > 65504
        quantize_q8(torch.tensor([1e7, 1.0]), BLOCK, "float16")


def test_error_feedback_conserves_the_gradient_under_q8() -> None:
    """With decay 1, what was sent over the rounds plus the residual is what was computed."""
    enc = PayloadEncoding.from_json({"q8": {"block_size": BLOCK, "feedback_decay": 1}})
    fb = ErrorFeedback(LAYOUTS, enc)
    total = [torch.zeros(lay.numel, dtype=torch.float64) for lay in LAYOUTS]
    sent = [torch.zeros(lay.numel, dtype=torch.float64) for lay in LAYOUTS]
    for r in range(6):
        grads = [gradient(10 * r + f, lay.numel) for f, lay in enumerate(LAYOUTS)]
        for f, ((scales, values), g) in enumerate(zip(fb.compress(grads, "bfloat16"), grads)):
            total[f] += g.double()
            sent[f] += dequantize_q8(scales, values, BLOCK).double()
    for f, residual in enumerate(fb._residual):
        assert residual is not None
        assert torch.allclose(sent[f] + residual.double(), total[f], atol=1e-9, rtol=0)


def test_q8_feedback_restores_and_saves_its_dense_sent_values() -> None:
    fb = ErrorFeedback(LAYOUTS, Q8)
    grads = [gradient(f, lay.numel) for f, lay in enumerate(LAYOUTS)]
    parts = fb.compress(grads, "float16")
    before = [r.clone() for r in fb._residual if r is not None]
    data = fb.to_bytes({"task_id": "t"})
    assert "sent_indices.0" not in safetensors.torch.load(data)
    again, metadata = ErrorFeedback.from_bytes(LAYOUTS, Q8, data)
    assert metadata["task_id"] == "t"
    assert fb.restore_unsent([1]) == 1 and fb.restore_unsent([1]) == 0  # once
    assert again.restore_unsent([1]) == 1
    restored = fb._residual[1]
    assert restored is not None
    assert torch.equal(restored, before[1] + dequantize_q8(*parts[1], BLOCK))
    assert torch.equal(restored, again._residual[1])  # type: ignore[arg-type]
    assert torch.equal(fb._residual[0], before[0])  # type: ignore[arg-type]
    # a q8 state is not a topk task's, nor a q8 state of another block size
    with pytest.raises(CompressionError, match="saved for encoding"):
        ErrorFeedback.from_bytes(LAYOUTS, PayloadEncoding.from_json({"topk": {"density_bps": 100}}), data)
    with pytest.raises(CompressionError, match="saved for encoding"):
        ErrorFeedback.from_bytes(LAYOUTS, PayloadEncoding.from_json({"q8": {"block_size": 32}}), data)


def test_a_q8_state_with_indices_or_a_short_sent_vector_is_refused() -> None:
    fb = ErrorFeedback(LAYOUTS, Q8)
    fb.compress([gradient(f, lay.numel) for f, lay in enumerate(LAYOUTS)], "float32")
    tensors = dict(safetensors.torch.load(fb.to_bytes({})))
    metadata = json.loads(fb.to_bytes({})[8 : 8 + struct.unpack("<Q", fb.to_bytes({})[:8])[0]])["__metadata__"]
    with_indices = {**tensors, "sent_indices.0": torch.arange(3)}
    with pytest.raises(CompressionError, match="q8 sends no indices"):
        ErrorFeedback.from_bytes(LAYOUTS, Q8, safetensors.torch.save(with_indices, metadata=metadata))
    short = {**tensors, "sent_values.1": tensors["sent_values.1"][:-1].clone()}
    with pytest.raises(CompressionError, match=r"sent_values.1 must be finite float32 \[180\]"):
        ErrorFeedback.from_bytes(LAYOUTS, Q8, safetensors.torch.save(short, metadata=metadata))


# --- the payload codec ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_round_trip_in_every_scale_dtype_and_the_canonical_layout(dtype: str) -> None:
    data = valid(dtype)
    doc, body = split(data)
    itemsize = 4 if dtype == "float32" else 2
    assert doc["scales"] == {"dtype": {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}[dtype],
                             "shape": [12], "data_offsets": [0, 12 * itemsize]}
    assert doc["values"] == {"dtype": "I8", "shape": [180], "data_offsets": [12 * itemsize, 12 * itemsize + 180]}
    assert doc["__metadata__"]["tenzro.encoding"] == "q8" and doc["__metadata__"]["tenzro.dtype"] == dtype
    assert len(body) == 12 * itemsize + 180 and (8 + len(json.dumps(doc))) <= len(data)
    assert data == valid(dtype)  # the same inputs give the same bytes
    loaded = safetensors.torch.load(data)  # an ordinary safetensors file
    assert torch.equal(decode(data), dequantize_q8(loaded["scales"], loaded["values"], BLOCK))
    assert len(body) < len(split(encode_payload(header("raw"), LAY, gradient(0), "float32"))[1]) / 3
    assert len(data) <= compute_max_payload_bytes(LAY)


def test_decoding_needs_the_runs_block_size() -> None:
    data = valid()
    with pytest.raises(PayloadMetadataMismatch, match="expected 'raw'") as info:
        decode(data, block=None)
    assert info.value.field == "encoding"
    with pytest.raises(PayloadMetadataMismatch, match="expected 'raw, topk'"):
        decode_payload(data, LAY, max_bytes=MAX, topk_k=3)
    with pytest.raises(PayloadLayoutMismatch, match="blocks of 32"):
        decode(data, block=32)
    for bad in (0, -3, True, "16"):
        with pytest.raises(PayloadError, match="block size"):
            decode(data, block=bad)  # type: ignore[arg-type]


def test_each_malformed_q8_payload_is_a_typed_error() -> None:
    data = valid()
    doc, body = split(data)
    scales, values = doc["scales"], doc["values"]
    f32 = lambda x: np.array([x], dtype="<f4").tobytes()  # noqa: E731
    cases: list[tuple[bytes, type[PayloadError], str]] = [
        (join(doc, f32(float("nan")) + body[4:]), PayloadNonFinite, f"in tensor '{LAY.entries[0].name}'"),
        (join(doc, f32(float("inf")) + body[4:]), PayloadNonFinite, ""),
        (join(doc, f32(-1e-3) + body[4:]), PayloadFormatError, "negative"),
        (join(doc, body[:48] + b"\x80" + body[49:]), PayloadFormatError, "-127..127"),
        (join(doc, f32(3e38) + body[4:]), PayloadNonFinite, ""),  # 127 * 3e38 overflows
        (join(doc, f32(1e5) + body[4:]), PayloadValueOutOfRange, ""),  # 127 * 1e5 > max_abs
        (join(doc, body + b"\x00"), PayloadTrailingBytes, ""),
        (join(doc, body[:-1]), PayloadTruncated, ""),
        (join({**doc, "values": {**values, "dtype": "U8"}}, body), PayloadFormatError, "must be"),
        (join({**doc, "values": {**values, "shape": [179]}}, body), PayloadLayoutMismatch, "blocks of 16"),
        (join({**doc, "scales": {**scales, "shape": [12.0]}}, body), PayloadFormatError, "must be"),
        (join({**doc, "scales": {**scales, "x": 0}}, body), PayloadFormatError, "must be"),
        (join({k: v for k, v in doc.items() if k != "scales"}, body), PayloadLayoutMismatch, "exactly the tensors"),
        (join({**doc, "indices": scales}, body), PayloadLayoutMismatch, "exactly the tensors"),
    ]
    for bad, error, text in cases:
        with pytest.raises(error, match=text or None):
            decode(bad, max_abs=1e6)


def test_encode_q8_refuses_what_the_decoder_would() -> None:
    scales, values, _ = quantize_q8(gradient(), BLOCK, "float32")
    with pytest.raises(PayloadFormatError, match="writes encoding 'q8'"):
        encode_q8_payload(header("topk"), LAY, scales, values, BLOCK)
    with pytest.raises(PayloadFormatError, match="encode_q8_payload"):
        encode_payload(header(), LAY, gradient(), "float32")
    with pytest.raises(PayloadLayoutMismatch, match="12 values"):
        encode_q8_payload(header(), LAY, scales[:-1], values, BLOCK)
    with pytest.raises(PayloadLayoutMismatch, match="int8"):
        encode_q8_payload(header(), LAY, scales, values.to(torch.int16), BLOCK)
    with pytest.raises(PayloadFormatError, match="-127..127"):
        encode_q8_payload(header(), LAY, scales, torch.full_like(values, -128), BLOCK)
    with pytest.raises(PayloadFormatError, match="negative"):
        encode_q8_payload(header(), LAY, -scales - 1, values, BLOCK)
    with pytest.raises(PayloadNonFinite):
        encode_q8_payload(header(), LAY, torch.full_like(scales, float("inf")), values, BLOCK)
    with pytest.raises(PayloadNonFinite):  # cast to fp16: 1e6 overflows
        encode_q8_payload(header(), LAY, torch.full_like(scales, 1e6), values, BLOCK, "float16")
    with pytest.raises(PayloadError, match="block size"):
        encode_q8_payload(header(), LAY, scales, values, 0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=0, max_size=64), st.integers(min_value=0, max_value=400), st.sampled_from(
    ["float32", "bfloat16", "float16"]))
def test_edited_q8_payloads_only_ever_raise_payload_errors(patch: bytes, at: int, dtype: str) -> None:
    data = bytearray(valid(dtype))
    at = min(at, len(data))
    data[at : at + len(patch)] = patch
    try:
        flat = decode(bytes(data), max_abs=1e6)
    except PayloadError:
        return
    assert flat.numel() == LAY.numel and bool(torch.isfinite(flat).all()) and float(flat.abs().max()) <= 1e6
