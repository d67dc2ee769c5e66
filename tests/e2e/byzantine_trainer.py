"""A Byzantine ``tenzro trainer run``: the real trainer process, except that every outer gradient
it computes is replaced just before it is encoded, signed and published. Its payloads are well
formed and validly signed, so the node accepts them: the attacker the aggregation rules exist
for, not one the node's checks stop.

``TENZRO_BYZANTINE_ATTACK`` picks the replacement, ``TENZRO_BYZANTINE_VALUE`` its size:

- ``const`` (the default): every value is VALUE (``tests/e2e/test_byzantine_run.py``: 1e6, the
  node's default ``max_gradient_abs``);
- ``signflip``: -VALUE times the honest gradient;
- ``noise``: Gaussian values of standard deviation VALUE, seeded per round and fragment.

``python -m tests.e2e.byzantine_trainer trainer run ...`` takes the ``tenzro`` command's arguments
(``scripts/probe_byzantine.py`` runs it too).
"""

from __future__ import annotations

import itertools
import os
import sys
from typing import Any

import torch

import tenzro_training.trainer.inner as inner
from tenzro_training.console import main

ATTACK = os.environ.get("TENZRO_BYZANTINE_ATTACK", "const")
VALUE = float(os.environ["TENZRO_BYZANTINE_VALUE"])
_honest = inner.compute_outer_gradients
_rounds = itertools.count()


def _poison(g: torch.Tensor, round_: int, fragment: int) -> torch.Tensor:
    if ATTACK == "const":
        return torch.full_like(g, VALUE)
    if ATTACK == "signflip":
        return (-VALUE * g).contiguous()
    if ATTACK == "noise":
        gen = torch.Generator().manual_seed(1000 * round_ + fragment)
        return torch.randn(g.shape, generator=gen, dtype=g.dtype) * VALUE
    raise SystemExit(f"TENZRO_BYZANTINE_ATTACK must be const, signflip or noise, not {ATTACK!r}")


def _poisoned_outer_gradients(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
    round_ = next(_rounds)
    return [_poison(g, round_, f) for f, g in enumerate(_honest(*args, **kwargs))]


inner.compute_outer_gradients = _poisoned_outer_gradients  # the trainer imports it at each round

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
