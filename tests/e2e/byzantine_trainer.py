"""A Byzantine ``tenzro trainer run``: the real trainer process, except that every outer gradient
it computes is replaced by ``TENZRO_BYZANTINE_VALUE`` in every value just before it is encoded,
signed and published. Its payloads are well formed and validly signed, so the node accepts them:
the attacker the aggregation rules exist for, not one the node's checks stop.

``python -m tests.e2e.byzantine_trainer trainer run ...`` takes the ``tenzro`` command's arguments.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

import tenzro_training.trainer.inner as inner
from tenzro_training.console import main

VALUE = float(os.environ["TENZRO_BYZANTINE_VALUE"])
_honest = inner.compute_outer_gradients


def _poisoned_outer_gradients(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
    return [torch.full_like(g, VALUE) for g in _honest(*args, **kwargs)]


inner.compute_outer_gradients = _poisoned_outer_gradients  # the trainer imports it at each round

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
