"""The outer optimizer of a DiLoCo round: Nesterov-momentum SGD over the aggregated outer gradient.

After the node has aggregated each fragment's accepted outer gradients (``aggregation``) it
applies one outer step to the global model it holds. Per fragment, with ``w`` the global
weights, ``b`` the momentum buffer kept between rounds (zeros before round 0), ``g`` the
aggregated outer gradient (start-of-round weights minus trainer weights, SPEC.md "Fragments"),
``lr`` and ``mu`` the outer learning rate and momentum, the step is, elementwise in float32::

    1. m  = mu * b        (rounded to fp32)
    2. b' = m + g         (rounded to fp32)   -> the new momentum buffer
    3. n  = mu * b'       (rounded to fp32)
    4. d  = g + n         (rounded to fp32)
    5. s  = lr * d        (rounded to fp32)
    6. w' = w - s         (rounded to fp32)   -> the new weights

``lr`` and ``mu`` are the spec's ``architecture.metadata.outer_lr`` and ``outer_momentum`` when
it sets them, else 0.7 and 0.9 (:meth:`OuterConfig.from_spec`): a verifier recomputing the step
must read them from the spec. They are first rounded to float32 (so 0.7 is
0.699999988079071044921875). Every step is one IEEE-754 binary32 operation with
round-to-nearest-even and no fused multiply-add,
so any implementation (numpy, Rust, another torch build) reproduces the result bit for bit,
independent of thread count. This is PyTorch's ``SGD(momentum=mu, nesterov=True, dampening=0,
weight_decay=0)`` update, except that PyTorch may fuse steps 3-4 and 5-6 into FMAs on CPUs that
have them; its weights then differ from ours by at most about 2 float32 ulps of the operands per
step (the momentum buffer is identical). PyTorch's first step sets the buffer to a copy of ``g``
rather than ``0 * mu + g``; the two differ only in the sign of a zero.

What this module is NOT: the aggregation (``aggregation``), the inner AdamW loop (the trainer),
or storage of the momentum buffer (the node keeps one per fragment next to the global model).
Pure core: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tenzro_training.fragments import is_all_finite
from tenzro_training.errors import AggregationError, SpecError

if TYPE_CHECKING:
    from tenzro_training.spec import TrainingTaskSpec

__all__ = [
    "DEFAULT_OUTER_LR",
    "DEFAULT_OUTER_MOMENTUM",
    "LR_METADATA_KEY",
    "MOMENTUM_METADATA_KEY",
    "OuterConfig",
    "OuterStepError",
    "apply_outer_step",
    "apply_outer_step_",
    "compute_initial_momentum",
]

DEFAULT_OUTER_LR = 0.7
"""SPEC.md phase-1 default outer learning rate."""
DEFAULT_OUTER_MOMENTUM = 0.9
"""SPEC.md phase-1 default outer (Nesterov) momentum."""
LR_METADATA_KEY = "outer_lr"
"""``architecture.metadata`` key a sponsor may set to override the outer learning rate."""
MOMENTUM_METADATA_KEY = "outer_momentum"
"""``architecture.metadata`` key a sponsor may set to override the outer momentum."""

_METADATA_PATH = "architecture.metadata"


class OuterStepError(AggregationError):
    """The outer step cannot be applied: bad tensors (dtype, rank, length) or a non-finite result."""


def _as_float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (as a Python float)."""
    return float(torch.tensor(value, dtype=torch.float32))


def _validate_hyperparameter(path: str, value: object, *, lower: float, lower_inclusive: bool) -> float:
    # bool is an int subclass; `true` is not a learning rate.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(path, f"must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise SpecError(path, f"must be finite, got {number!r}")
    if number < lower or (number == lower and not lower_inclusive):
        relation = ">=" if lower_inclusive else ">"
        raise SpecError(path, f"must be {relation} {lower}, got {number!r}")
    return number


@dataclass(frozen=True, slots=True, kw_only=True)
class OuterConfig:
    """Outer Nesterov SGD hyperparameters (validated on construction; raises SpecError)."""

    lr: float = DEFAULT_OUTER_LR
    """Outer learning rate: finite, > 0. Applied as float32."""
    momentum: float = DEFAULT_OUTER_MOMENTUM
    """Nesterov momentum: finite, 0 <= momentum < 1. Applied as float32."""

    def __post_init__(self) -> None:
        lr = _validate_hyperparameter(f"{_METADATA_PATH}.{LR_METADATA_KEY}", self.lr, lower=0.0, lower_inclusive=False)
        mu = _validate_hyperparameter(
            f"{_METADATA_PATH}.{MOMENTUM_METADATA_KEY}", self.momentum, lower=0.0, lower_inclusive=True
        )
        if mu >= 1.0:
            raise SpecError(f"{_METADATA_PATH}.{MOMENTUM_METADATA_KEY}", f"must be < 1, got {mu!r}")
        # Also reject values that are unusable once rounded to float32 (lr = 1e-50 becomes 0.0f,
        # lr = 1e39 becomes inf, momentum = 0.99999999 becomes 1.0f): the fp32 value is applied.
        lr32 = _as_float32(lr)
        if not (math.isfinite(lr32) and lr32 > 0.0):
            raise SpecError(f"{_METADATA_PATH}.{LR_METADATA_KEY}", f"{lr!r} is not a positive finite float32")
        if _as_float32(mu) >= 1.0:
            raise SpecError(f"{_METADATA_PATH}.{MOMENTUM_METADATA_KEY}", f"{mu!r} rounds to 1.0 in float32")
        object.__setattr__(self, "lr", lr)
        object.__setattr__(self, "momentum", mu)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> OuterConfig:
        """Defaults, overridden by ``outer_lr`` / ``outer_momentum`` when the metadata has them."""
        kwargs: dict[str, Any] = {}
        if LR_METADATA_KEY in metadata:
            kwargs["lr"] = metadata[LR_METADATA_KEY]
        if MOMENTUM_METADATA_KEY in metadata:
            kwargs["momentum"] = metadata[MOMENTUM_METADATA_KEY]
        return cls(**kwargs)

    @classmethod
    def from_spec(cls, spec: TrainingTaskSpec) -> OuterConfig:
        """The task's outer optimizer: defaults unless ``architecture.metadata`` overrides them."""
        return cls.from_metadata(spec.architecture.metadata)

    def to_dict(self) -> dict[str, float]:
        """JSON view (the Python floats as configured, before float32 rounding)."""
        return {"lr": self.lr, "momentum": self.momentum}


def _validate_vector(name: str, value: object, length: int | None) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise OuterStepError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype != torch.float32:
        raise OuterStepError(f"{name} must be float32, got {value.dtype}")
    if value.dim() != 1:
        raise OuterStepError(f"{name} must be 1-D, got shape {tuple(value.shape)}")
    if value.device.type != "cpu":
        # Other devices may fuse or reorder arithmetic; the reference result is the CPU one.
        raise OuterStepError(f"{name} must be on the CPU, got {value.device}")
    if length is not None and value.numel() != length:
        raise OuterStepError(f"{name} has {value.numel()} elements, expected {length}")
    return value


def compute_initial_momentum(length: int) -> torch.Tensor:
    """The momentum buffer of a fragment before its first outer step: ``length`` float32 zeros."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise OuterStepError(f"length must be an int >= 0, got {length!r}")
    return torch.zeros(length, dtype=torch.float32)


def apply_outer_step(
    weights: torch.Tensor,
    momentum_buf: torch.Tensor,
    outer_grad: torch.Tensor,
    cfg: OuterConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One outer Nesterov SGD step on one fragment; returns ``(new_weights, new_momentum)``.

    All three inputs are 1-D float32 CPU tensors of one length; none is modified (the results are
    fresh tensors). The arithmetic is the six steps of the module docstring, one correctly
    rounded float32 operation each. Raises :class:`OuterStepError` on a bad input or when a result
    is not finite (an aggregate so large that the step overflows must not poison the model).
    """
    w, b, g = _validate_step_inputs(weights, momentum_buf, outer_grad, cfg)
    new_w, new_b = torch.empty_like(w), torch.empty_like(b)
    _step_into(new_w, new_b, w, b, g, cfg, torch.empty_like(w))
    return new_w, new_b


def apply_outer_step_(
    weights: torch.Tensor,
    momentum_buf: torch.Tensor,
    outer_grad: torch.Tensor,
    cfg: OuterConfig,
    *,
    scratch: torch.Tensor | None = None,
) -> None:
    """:func:`apply_outer_step` with the results written over ``weights`` and ``momentum_buf``
    (bit for bit the same values: the same six operations, only their destinations differ).

    For a caller that owns the buffers and discards them on error, like the node's finalize,
    which holds its own copy of the committed state: it saves the three model-sized allocations
    per fragment whose page faults were a large share of a finalize. ``scratch``, a
    contiguous float32 CPU tensor of at least ``weights.numel()`` elements, holds the step
    (reuse one across fragments); without it one is allocated. On :class:`OuterStepError` from a
    non-finite result the buffers hold that result: do not keep them.
    """
    w, b, g = _validate_step_inputs(weights, momentum_buf, outer_grad, cfg)
    if w.numel() == 0:
        return  # nothing to write (and empty tensors may share a null data pointer)
    if scratch is None:
        step = torch.empty_like(w)
    else:
        scratch = _validate_vector("scratch", scratch, None)
        if scratch.numel() < w.numel() or not scratch.is_contiguous():
            raise OuterStepError(f"scratch must be contiguous with >= {w.numel()} elements")
        step = scratch[: w.numel()]
    for name, t in (("weights", w), ("momentum_buf", b)):
        if not t.is_contiguous() or t.data_ptr() in (g.data_ptr(), step.data_ptr()):
            raise OuterStepError(f"{name} must be contiguous and share no memory with the gradient or scratch")
    if w.data_ptr() == b.data_ptr():
        raise OuterStepError("weights and momentum_buf must be different buffers")
    _step_into(w, b, w, b, g, cfg, step)


def _validate_step_inputs(
    weights: object, momentum_buf: object, outer_grad: object, cfg: object
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not isinstance(cfg, OuterConfig):
        raise OuterStepError(f"cfg must be an OuterConfig, got {type(cfg).__name__}")
    w = _validate_vector("weights", weights, None)
    b = _validate_vector("momentum_buf", momentum_buf, w.numel())
    g = _validate_vector("outer_grad", outer_grad, w.numel())
    return w, b, g


def _step_into(
    new_w: torch.Tensor, new_b: torch.Tensor, w: torch.Tensor, b: torch.Tensor, g: torch.Tensor,
    cfg: OuterConfig, step: torch.Tensor,
) -> None:
    """The six steps, results into ``new_w``/``new_b`` (which may be ``w``/``b``: each op reads an
    element before it writes the same element, so aliasing changes no value)."""
    lr = torch.tensor(cfg.lr, dtype=torch.float32)
    mu = torch.tensor(cfg.momentum, dtype=torch.float32)
    # One op per step, never `alpha=` or addcmul: each is one rounding, no FMA.
    torch.mul(b, mu, out=new_b)  # 1
    new_b.add_(g)  # 2
    torch.mul(new_b, mu, out=step)  # 3
    step.add_(g)  # 4: n + g == g + n exactly (IEEE addition commutes)
    step.mul_(lr)  # 5
    torch.sub(w, step, out=new_w)  # 6
    if not is_all_finite(new_w) or not is_all_finite(new_b):
        raise OuterStepError("outer step produced a non-finite weight or momentum value")
