"""Safetensors bytes from anyone (a sponsor's init checkpoint, a checkpoint or model file handed
to the CLI, a trainer's saved error-feedback state): the one parse of them, and the one error
for every way the library refuses them.

Why a module of its own: the library raises more than ``SafetensorError``. Its torch loader
raises a bare KeyError for a dtype its reader accepts and torch lacks (F4, F6_E2M3, F6_E3M2,
F8_E8M0 in safetensors 0.8), and ValueError, RuntimeError or TypeError for other malformed
input. Each reader kept its own list of these, and the KeyError escaped both lists: a sponsor's
postTask was answered -32603 with a logged traceback (stop 42).
"""

from __future__ import annotations

import safetensors.torch
import torch
from safetensors import SafetensorError

__all__ = ["TensorFileError", "load_tensors"]


class TensorFileError(ValueError):
    """The bytes are not a safetensors file this process can load; ``str()`` says why (the
    library's text). Callers turn it into their own typed error at once."""


def load_tensors(data: bytes) -> dict[str, torch.Tensor]:
    """The tensors of safetensors ``data`` (nothing in it is executed: no pickle)."""
    try:
        return dict(safetensors.torch.load(data))
    except (SafetensorError, ValueError, RuntimeError, TypeError, KeyError) as exc:
        raise TensorFileError(str(exc)) from None
