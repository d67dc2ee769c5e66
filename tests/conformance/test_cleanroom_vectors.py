"""The clean-room verifier's arithmetic (written from docs/aggregation.md and docs/lifecycle.md
alone, numpy only) reproduces the published determinism vectors: what docs/aggregation.md
promises, that a third party reproduces every aggregate with numpy, checked on the vectors'
edge cases (zeros of both signs, subnormals, ties, 1M-value fragments, bf16 and fp16 inputs).

Nothing here imports the project: the inputs come from ``tests/vectors/inputs.py`` (numpy and
hashlib) and the expected digests from ``tests/vectors/determinism.json``. Multi-Krum, the model
hash and the round updates are not covered (the verifier does not implement Multi-Krum; the
model hash and round updates go through its run checks in test_cleanroom_verifier.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from tests.conformance import cleanroom_verifier as cr
from tests.vectors.inputs import make_vector, round_to_bfloat16

VECTORS = json.loads((Path(__file__).parent.parent / "vectors" / "determinism.json").read_text())["vectors"]
K = 8
RULES = {
    "Mean": "Mean",
    "TrimmedMean-1250": {"TrimmedMean": {"alpha_bps": 1250}},
    "CoordinateMedian": "CoordinateMedian",
    "Krum-2": {"Krum": {"f": 2}},
}


def _digest(values: np.ndarray) -> str:
    return hashlib.sha256(values.astype("<f4").tobytes()).hexdigest()


def _inputs(n: int) -> list[np.ndarray]:
    grads = [make_vector(f"grad/{n}/{i}", n) for i in range(K)]
    # Input 0 arrives as bf16 and input 1 as fp16 (widened to fp32 exactly: payload.md).
    return [round_to_bfloat16(grads[0]), grads[1].astype(np.float16).astype(np.float32), *grads[2:]]


@pytest.mark.parametrize("n", [1, 4099, (1 << 20) + 3])
def test_the_cleanroom_arithmetic_reproduces_the_vectors(n: int) -> None:
    xs = _inputs(n)
    for name, rule in RULES.items():
        out = cr.aggregate(rule, xs)
        assert _digest(out.values) == VECTORS[f"aggregate/{name}/{n}"], name
        assert hashlib.sha256(cr.report_bytes(rule, K, out)).hexdigest() == VECTORS[f"report/{name}/{n}"], name
    for k in (3, 7):
        assert _digest(cr.aggregate("Mean", xs[:k]).values) == VECTORS[f"aggregate/Mean-K{k}/{n}"]
    w, m = make_vector(f"weights/{n}", n), make_vector(f"momentum/{n}", n)
    new_w, new_m = cr.outer_step(w, m, cr.aggregate("Mean", xs).values, np.float32(0.7), np.float32(0.9))
    assert _digest(new_w) == VECTORS[f"outer_step/weights/{n}"]
    assert _digest(new_m) == VECTORS[f"outer_step/momentum/{n}"]


def test_a_deviation_from_the_docs_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison can fail: the verifier's own mutation control (Mean as numpy.mean, another
    summation order) misses the vectors."""
    monkeypatch.setattr(cr, "MUTATE", "numpy_mean")
    xs = _inputs(4099)
    assert _digest(cr.aggregate("Mean", xs[:7]).values) != VECTORS["aggregate/Mean-K7/4099"]


def test_the_cleanroom_median_of_a_negative_subnormal_and_a_zero_is_plus_zero() -> None:
    """docs/aggregation.md had the + 0.0 of an even-K median before the rounding to float32, and
    the verifier followed it: the midpoint of -2^-149 and 0 is -2^-150, which rounds to -0.0, so
    the result kept a sign the implementation ("Zeros": +0.0 for a zero result) does not (docs
    audit). The sign is in the bits a round record hashes."""
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    columns = [  # the two middle values of 8, then what the median must be
        (-tiny, np.float32(0.0), np.float32(0.0)),
        (-tiny, np.float32(-0.0), np.float32(0.0)),
        (np.float32(-0.0), np.float32(-0.0), np.float32(0.0)),
        (-tiny, -tiny, -tiny),
        (np.float32(-1.0), tiny, np.float32(-0.5)),
    ]
    xs = [np.full(len(columns), v, dtype=np.float32) for v in (-4.0, -3.0, -2.0)]
    xs += [np.array([c[0] for c in columns], np.float32), np.array([c[1] for c in columns], np.float32)]
    xs += [np.full(len(columns), v, dtype=np.float32) for v in (2.0, 3.0, 4.0)]
    got = cr.aggregate("CoordinateMedian", xs).values
    want = np.array([c[2] for c in columns], np.float32)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
