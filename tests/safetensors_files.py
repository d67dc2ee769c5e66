"""Hand-edited safetensors files, for the tests of what each reader of untrusted safetensors
bytes refuses (init checkpoints, error-feedback state, trainer checkpoints)."""

from __future__ import annotations

import json


def relabel_dtype(data: bytes, name: str, dtype: str, elements_per_fp32: int = 4) -> bytes:
    """``data`` with its 1-D float32 tensor ``name`` declared as ``dtype``, the rest untouched.

    The shape is scaled so that the same bytes stay covered (4 elements per float32 for a
    one-byte dtype such as F8_E8M0, 8 for a 4-bit one such as F4): still a well-formed file that
    safetensors' reader accepts, so what is tested is the step after it (its torch loader has no
    dtype for F4, F6_* and F8_E8M0 and raises a bare KeyError)."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    (length,) = header[name]["shape"]
    header[name] = header[name] | {"dtype": dtype, "shape": [length * elements_per_fp32]}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + n :]
