"""The clean-room verifier's payload decoding (written from docs/payload.md "Encodings" and "q8"
alone, numpy only) gives the project's decoder's bits for q8 payloads the project encodes, and
refuses what the doc refuses.

As in test_cleanroom_topk.py, this test imports the project: its encoder makes the payloads and
its decoder is the reference. Every refusal is checked on both decoders. The real run (a sealed
q8 run, the mutation controls) is in test_cleanroom_verifier.py.
"""

from __future__ import annotations

import json
import numpy as np
import pytest
import torch

from tenzro_training.compression import dequantize_q8, quantize_q8
from tenzro_training.fragments import FragmentLayout
from tenzro_training.payload import ENCODING_Q8, PayloadHeader, encode_q8_payload
from tests.conformance import cleanroom_verifier as cr
from tests.conformance.test_cleanroom_topk import ROUND, TASK, assert_both_refuse, both, cr_layout, join, layouts, split


def vector(n: int, seed: int) -> torch.Tensor:
    """Awkward values: a signed zero, a block maximum that is exactly a multiple of 127, a
    subnormal, a value half-way between two levels (round half to even), and a large one."""
    g = torch.from_numpy((np.random.default_rng(seed).standard_normal(n) * 1e-2).astype(np.float32))
    g[0], g[1], g[2], g[3] = -0.0, 1.27, 1e-40, 0.005  # 0.005 = 0.5 * scale 0.01: half-way
    g[-1] = -3e4
    return g


def q8_payload(lay: FragmentLayout, block: int, dtype: str, seed: int = 1) -> bytes:
    scales, values, _ = quantize_q8(vector(lay.numel, seed), block, dtype)
    return encode_q8_payload(PayloadHeader(TASK, ROUND, lay.index, ENCODING_Q8, lay.layout_hash()), lay, scales,
                             values, block, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("block", [1, 3, 7, 16, 64])
def test_q8_payloads_decode_to_the_projects_bits(dtype: str, block: int) -> None:
    for lay in layouts():  # 26 values each: full blocks and a short last one, or one block (64)
        data = q8_payload(lay, block, dtype, seed=lay.index)
        theirs, mine = both(data, lay, q8_block=block)
        assert np.array_equal(theirs, mine)
        scales, values, _ = quantize_q8(vector(lay.numel, lay.index), block, dtype)
        assert np.array_equal(dequantize_q8(scales, values, block).numpy().view(np.uint32), mine)


def test_a_q8_payload_of_every_level_decodes_exactly() -> None:
    """All 255 levels times a scale whose products are exact and others that round."""
    lay = layouts()[0]
    n = lay.numel
    for scale in (1.0, 0.1, 7777.7, 1e-45, 3e-39, float(np.float32(1) / np.float32(3))):  # 1e-45, 3e-39: subnormal
        levels = torch.tensor([(i % 255) - 127 for i in range(n)], dtype=torch.int8)
        data = encode_q8_payload(PayloadHeader(TASK, ROUND, lay.index, ENCODING_Q8, lay.layout_hash()), lay,
                                 torch.full((1,), scale), levels, n)
        theirs, mine = both(data, lay, q8_block=n)
        assert np.array_equal(theirs, mine)
        expected = levels.numpy().astype(np.float32) * np.float32(scale)  # one binary32 product each
        assert np.array_equal(mine, expected.view(np.uint32))
        # 8 bits times 24 are exact in binary64: multiplying there and rounding once agrees
        wide = levels.numpy().astype(np.float64) * np.float64(np.float32(scale))
        assert np.array_equal(mine, wide.astype(np.float32).view(np.uint32))


def refusals(lay: FragmentLayout, data: bytes, block: int) -> dict[str, tuple[bytes, int | None]]:
    """Payloads that docs/payload.md refuses, each with the q8_block it is decoded with."""
    header, body = split(data)
    m = header["scales"]["shape"][0]
    scales, values = header["scales"], header["values"]
    nan = np.array([np.nan], dtype="<f4").tobytes()
    minus = np.array([-1.0], dtype="<f4").tobytes()
    huge = np.array([3.4e38], dtype="<f4").tobytes()
    return {
        "q8 payload in a raw-only run": (data, None),
        "another block size": (data, block + 1),
        "a NaN scale": (join(header, nan + body[4:]), block),
        "a negative scale": (join(header, minus + body[4:]), block),
        "a scale whose products overflow": (join(header, huge + body[4:]), block),
        "a value of -128": (join(header, body[:4 * m] + b"\x80" + body[4 * m + 1:]), block),
        "a trailing byte": (join(header, body + b"\x00"), block),
        "a byte missing": (join(header, body[:-1]), block),
        "values as U8": (join({**header, "values": {**values, "dtype": "U8"}}, body), block),
        "scales in another dtype than declared": (join({**header, "scales": {**scales, "dtype": "F16"}}, body), block),
        "values before scales": (join({**header, "values": {**values, "data_offsets": [0, lay.numel]},
                                       "scales": {**scales, "data_offsets": [lay.numel, lay.numel + 4 * m]}}, body), block),
        "a third tensor": (join({**header, "extra": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}, body), block),
        "an extra key in a tensor": (join({**header, "scales": {**scales, "x": 1}}, body), block),
        "a shape spelled as floats": (join({**header, "scales": {**scales, "shape": [float(m)]}}, body), block),
    }


def test_the_cleanroom_decoder_refuses_what_the_doc_refuses() -> None:
    lay = layouts()[0]
    block = 8
    data = q8_payload(lay, block, "float32")
    assert json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["scales"]["shape"] == [-(-lay.numel // block)]
    assert_both_refuse(lay, refusals(lay, data, block), "q8_block")


def test_a_negative_zero_scale_is_accepted_by_both() -> None:
    lay = layouts()[1]
    header, body = split(q8_payload(lay, 64, "float32"))
    data = join(header, np.array([-0.0], dtype="<f4").tobytes() + body[4:])
    theirs, mine = both(data, lay, q8_block=64)
    assert np.array_equal(theirs, mine)


def test_the_mutations_change_the_decoded_vector(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controls test_cleanroom_verifier.py runs on a real q8 run differ here already."""
    lay = layouts()[1]
    ours, lh = cr_layout(lay)
    data = q8_payload(lay, 8, "bfloat16")
    good = cr.decode_payload(data, ours, task_id=TASK, rnd=ROUND, lh=lh, q8_block=8)
    for mutation in ("q8_unsigned", "q8_scale_per_tensor"):
        monkeypatch.setattr(cr, "MUTATE", mutation)
        bad = cr.decode_payload(data, ours, task_id=TASK, rnd=ROUND, lh=lh, q8_block=8)
        assert not np.array_equal(bad.view(np.uint32), good.view(np.uint32)), mutation
