"""The inputs of the determinism test vectors (``tests/vectors/determinism.json``), made with
numpy and hashlib alone: the project's tests and the clean-room verifier's test both build them
here, and a third party can too, without torch (whose random generators' float paths may differ
between CPUs and versions)."""

from __future__ import annotations

import hashlib

import numpy as np

DOMAIN = b"tenzro/train/test-vectors/v1"


def make_vector(label: str, n: int) -> np.ndarray:
    """n float32 values from SHAKE-256(DOMAIN || label): a 24-bit mantissa scaled by 2^e, e in
    [-30, 9], exact in float64 and so exact once cast to float32 (24 significant bits at most).
    Planted: zeros of both signs, float32 subnormals, and values repeated across inputs (ties for
    the median, the trim and Krum's distances)."""
    words = np.frombuffer(hashlib.shake_256(DOMAIN + label.encode()).digest(8 * n), dtype="<u4").reshape(n, 2)
    mantissa = (words[:, 0] & 0xFFFFFF).astype(np.float64) / float(1 << 24) - 0.5
    exponent = (words[:, 1] % 40).astype(np.float64) - 30.0
    out = np.ldexp(mantissa, exponent.astype(np.int64)).astype(np.float32)
    if n >= 16:
        out[0], out[1] = np.float32(0.0), np.float32(-0.0)
        out[2], out[3] = np.float32(1e-40), np.float32(-3e-42)  # float32 subnormals
        out[4::97] = np.float32(0.25)  # the same value in every input at these places
    return out


def round_to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (to nearest, ties to even) and widened back exactly:
    what a bf16 payload of them carries. Finite inputs only."""
    bits = values.astype("<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype("<u4").view("<f4").astype(np.float32)
