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
