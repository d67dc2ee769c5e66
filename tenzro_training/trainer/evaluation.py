"""Scoring a task's models on its held-out windows, beside simple forecasts: what a sponsor asks
of the sealed model (``tenzro train evaluate-model``, docs/cli.md).

What this module is: :func:`load_validation_set` (the spec's model config, its corpus checked
against the spec's ``dataset_hash`` as a trainer checks it, and the held-out windows of
:func:`~.data.validation_batch` with each window's seasonal period),
:func:`compute_last_value_loss` and :func:`compute_seasonal_naive_loss` (the baselines, scored
in the model loss's normalised units), :func:`check_model_state` (a state's tensor names and
shapes against the spec's model) and :func:`evaluate_models`, which scores every state with
:func:`~.inner.evaluate` on the same windows and adds the baselines.

What it is NOT: no model file is read or parsed here (the CLI parses a model file with the
node's checkpoint parser, which refuses other dtypes, NaN and non-safetensors bytes), no
training, nothing the protocol hashes or verifies: a score is advice to the sponsor, computed on
the shipped corpus's small validation set (docs/trainer.md, "Caveats of the shipped corpus").

The unit of every number is the timesfm family's loss: per window, context and targets are
normalised with the context's mean and standard deviation (``PatchTransformer.normalise``), and
the squared error is averaged over every target of every window. A baseline forecast is turned
into those units the same way, so a model and a baseline are compared on equal terms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from tenzro_training.trainer.data import (
    get_season_length,
    get_validation_windows,
    load_corpus,
    validate_dataset_hash,
    validation_batch,
)
from tenzro_training.trainer.inner import evaluate
from tenzro_training.trainer.model import PatchTransformer, StateMismatch, compute_shape_mismatch, get_adapter

if TYPE_CHECKING:
    from tenzro_training.spec import TrainingTaskSpec

__all__ = [
    "BASELINE_LAST_VALUE",
    "BASELINE_SEASONAL_NAIVE",
    "BaselineScore",
    "Evaluation",
    "ModelScore",
    "ValidationSet",
    "check_model_state",
    "compute_last_value_loss",
    "compute_seasonal_naive_loss",
    "evaluate_models",
    "load_validation_set",
]

BASELINE_LAST_VALUE = "last_value"
"""Every target forecast as the context's last value (the naive forecast)."""
BASELINE_SEASONAL_NAIVE = "seasonal_naive"
"""Every target forecast as the context's value one season earlier (its series' period)."""


@dataclass(frozen=True, slots=True, eq=False)
class ValidationSet:
    """A spec's held-out windows and what the baselines need to know of them."""

    model_cfg: Any
    """The family config the spec describes (``context_len``, ``horizon``, ...)."""
    windows: Tensor
    """``(n, context_len + horizon)`` float32: :func:`~.data.validation_batch` of the corpus."""
    seasons: tuple[int, ...]
    """Per window (row), the seasonal period of its series (:data:`~.data.SEASON_LENGTHS`)."""
    series_names: tuple[str, ...]
    """Per window (row), the name of its series (for a baseline's note)."""


@dataclass(frozen=True, slots=True)
class ModelScore:
    """One model's validation loss."""

    name: str
    """What the caller calls the model (its file)."""
    loss: float
    """Mean normalised MSE on the validation windows."""


@dataclass(frozen=True, slots=True)
class BaselineScore:
    """One baseline forecast's validation loss, or why it was not computed."""

    name: str
    """:data:`BASELINE_LAST_VALUE` or :data:`BASELINE_SEASONAL_NAIVE`."""
    loss: float | None
    """Mean normalised MSE on the same windows; None when the baseline is not meaningful there."""
    note: str = ""
    """Why ``loss`` is None (empty otherwise)."""


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Every score of one evaluation, on one set of windows."""

    windows: int
    """Number of validation windows scored."""
    context_len: int
    """Context values per window."""
    horizon: int
    """Target values per window."""
    models: tuple[ModelScore, ...]
    """The models' scores, in the order given."""
    baselines: tuple[BaselineScore, ...]
    """Last value, then seasonal naive."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON; a loss that is not finite (finite weights can still overflow in the
        forward pass) is null, since JSON has no NaN."""

        def number(value: float | None) -> float | None:
            return value if value is not None and math.isfinite(value) else None

        return {
            "windows": self.windows,
            "context_len": self.context_len,
            "horizon": self.horizon,
            "models": [{"name": m.name, "loss": number(m.loss)} for m in self.models],
            "baselines": [{"name": b.name, "loss": number(b.loss), "note": b.note} for b in self.baselines],
        }


def load_validation_set(spec: TrainingTaskSpec) -> ValidationSet:
    """The held-out windows of ``spec``'s corpus at its model's context and horizon.

    Refuses a corpus that does not hash to ``spec.dataset_hash`` (DatasetError), as a trainer
    does before it stakes: a score on other data than the run trained on would mislead.
    """
    cfg = get_adapter(spec.architecture.family).config_from_spec(spec)
    corpus = load_corpus(spec.dataset_ref)
    validate_dataset_hash(corpus, spec.dataset_hash)
    refs = get_validation_windows(corpus, cfg.context_len, cfg.horizon)
    return ValidationSet(
        cfg,
        validation_batch(corpus, cfg.context_len, cfg.horizon),
        tuple(get_season_length(corpus[r.series]) for r in refs),
        tuple(corpus[r.series].name for r in refs),
    )


def check_model_state(model_cfg: Any, state: Mapping[str, Tensor], where: str) -> None:
    """StateMismatch, naming ``where`` and the tensors that differ, unless ``state`` holds exactly
    the tensors (names and shapes) of the model ``model_cfg`` describes. The dtype is not
    compared: the node widens fp16 and bf16 weights to fp32 exactly, and so does evaluation."""
    want = get_adapter(model_cfg.family).tensor_shapes(model_cfg)
    problem = compute_shape_mismatch({name: tuple(t.shape) for name, t in state.items()}, want)
    if problem is not None:
        raise StateMismatch(f"model {where} does not fit the spec's architecture: {problem}")


def _normalised(windows: Tensor, context_len: int) -> tuple[Tensor, Tensor]:
    """(normalised context, normalised targets), with the model's own normalisation."""
    context, target = windows[:, :context_len], windows[:, context_len:]
    x, loc, scale = PatchTransformer.normalise(context)
    return x, (target - loc) / scale


def compute_last_value_loss(windows: Tensor, context_len: int) -> float:
    """Mean normalised MSE of forecasting every target as the context's last value."""
    x, target = _normalised(windows, context_len)
    return float(F.mse_loss(x[:, -1:].expand_as(target), target))


def compute_seasonal_naive_loss(windows: Tensor, context_len: int, seasons: Sequence[int]) -> float:
    """Mean normalised MSE of the seasonal-naive forecast: target ``h`` (0-based) of a window
    whose series has period ``m`` is the context value ``m * ceil((h + 1) / m)`` steps before it,
    the latest observation of the same phase. ``m = 1`` is the last-value forecast. Every
    period must fit in the context (ValueError otherwise)."""
    horizon = windows.shape[1] - context_len
    if len(seasons) != windows.shape[0]:
        raise ValueError(f"{len(seasons)} seasons for {windows.shape[0]} windows")
    if any(not 1 <= m <= context_len for m in seasons):
        raise ValueError(f"every season must be in 1..context_len ({context_len}), got {max(seasons)}")
    x, target = _normalised(windows, context_len)
    m = torch.tensor(seasons, dtype=torch.long).unsqueeze(1)  # (n, 1)
    h = torch.arange(horizon, dtype=torch.long).unsqueeze(0)  # (1, horizon)
    back = m * torch.div(h + m, m, rounding_mode="floor")  # m * ceil((h + 1) / m)
    return float(F.mse_loss(torch.gather(x, 1, context_len + h - back), target))


def _seasonal_naive(validation: ValidationSet) -> BaselineScore:
    context_len = validation.model_cfg.context_len
    too_long = sorted({(m, name.partition(".")[0]) for m, name in zip(validation.seasons, validation.series_names)
                       if m > context_len})
    if too_long:
        m, source = too_long[-1]
        return BaselineScore(BASELINE_SEASONAL_NAIVE, None,
                             f"{source}'s season of {m} values is longer than the context ({context_len})")
    if all(m == 1 for m in validation.seasons):
        return BaselineScore(BASELINE_SEASONAL_NAIVE, None, "no series of the corpus has a season")
    return BaselineScore(BASELINE_SEASONAL_NAIVE,
                         compute_seasonal_naive_loss(validation.windows, context_len, validation.seasons))


def evaluate_models(
    validation: ValidationSet, states: Sequence[tuple[str, Mapping[str, Tensor]]], *,
    device: str | torch.device = "cpu",
) -> Evaluation:
    """Score each ``(name, state)`` with :func:`~.inner.evaluate` on ``validation``'s windows,
    and the baselines on the same windows. Every state is checked against the spec's model
    before any is scored (:func:`check_model_state`)."""
    cfg = validation.model_cfg
    for name, state in states:
        check_model_state(cfg, state, name)
    models = tuple(ModelScore(name, evaluate(state, cfg, validation.windows, device=device)) for name, state in states)
    last = BaselineScore(BASELINE_LAST_VALUE, compute_last_value_loss(validation.windows, cfg.context_len))
    return Evaluation(len(validation.windows), cfg.context_len, cfg.horizon, models,
                      (last, _seasonal_naive(validation)))
