"""Held-out evaluation (trainer/evaluation.py) on the real shipped corpus and the tiny model: a
model's score is evaluate() on the spec's validation windows, training changes it, and the
baselines agree with an independent numpy computation written from docs/trainer.md."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tenzro_training
from tenzro_training.spec import TrainingTaskSpec
from tenzro_training.trainer.data import (
    DatasetError,
    compute_dataset_hash,
    load_corpus,
    shard_windows,
    validation_batch,
)
from tenzro_training.trainer.evaluation import (
    BASELINE_LAST_VALUE,
    BASELINE_SEASONAL_NAIVE,
    BaselineScore,
    Evaluation,
    ModelScore,
    ValidationSet,
    check_model_state,
    compute_last_value_loss,
    compute_seasonal_naive_loss,
    evaluate_models,
    load_validation_set,
)
from tenzro_training.trainer.inner import InnerConfig, evaluate, run_inner_loop
from tenzro_training.trainer.model import StateMismatch, create_init_checkpoint
from tests.trainer.conftest import TINY_MODEL

DEV_SPEC = Path(tenzro_training.__file__).parent / "data" / "dev-task.json"
TINY_METADATA = {"context_len": 32, "horizon": 8, "patch_len": 8, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64}
SEASONS = {"co2": 52, "sunspots": 1, "nile": 1, "elnino": 12, "elec_equip": 12, "macrodata": 4}
"""Written again here from docs/trainer.md's sources table, not imported: the numpy reference
must not share the code it checks."""


def make_spec(metadata: dict[str, Any] | None = None, **changes: Any) -> TrainingTaskSpec:
    """The shipped dev spec with the tiny model (or ``metadata``) and ``changes``."""
    doc = json.loads(DEV_SPEC.read_text())
    doc["architecture"]["metadata"] = dict(TINY_METADATA if metadata is None else metadata)
    doc.update(changes)
    return TrainingTaskSpec.from_dict(doc)


def reference_windows(ref: str, context_len: int, horizon: int) -> list[tuple[str, np.ndarray]]:
    """(series name, window as float64) per held-out window: docs/trainer.md "Time split"."""
    out = []
    for series in load_corpus(ref):
        n = len(series.values)
        train_len = n - math.ceil(n * 0.2)
        for start in range(train_len - context_len, n - context_len - horizon + 1, horizon):
            if start >= 0:
                out.append((series.name, series.values[start : start + context_len + horizon].astype(np.float64)))
    return out


def reference_loss(windows: list[tuple[str, np.ndarray]], context_len: int, seasonal: bool) -> float:
    """Mean over every target of every window of the squared error, forecast and target both
    normalised by the context's mean (which cancels) and population std (std < 1e-5 -> 1); the forecast is the last context value,
    or with ``seasonal`` the value one season (of the series' source) before each target."""
    errors = []
    for name, w in windows:
        context, target = w[:context_len], w[context_len:]
        std = context.std()
        scale = 1.0 if std < 1e-5 else std
        m = SEASONS[name.split(".")[0]] if seasonal else 1
        forecast = np.array([context[context_len - m + (h % m)] for h in range(len(target))])
        errors.extend(((forecast - target) / scale) ** 2)
    return float(np.mean(errors))


@pytest.fixture(scope="module")
def spec() -> TrainingTaskSpec:
    return make_spec()


@pytest.fixture(scope="module")
def init() -> dict[str, torch.Tensor]:
    return create_init_checkpoint(TINY_MODEL, 0)


def test_a_models_score_is_evaluate_on_the_specs_validation_windows(spec: TrainingTaskSpec, init: dict) -> None:
    validation = load_validation_set(spec)
    windows = validation_batch(load_corpus(spec.dataset_ref), TINY_MODEL.context_len, TINY_MODEL.horizon)
    assert torch.equal(validation.windows, windows) and len(validation.seasons) == len(windows) == 150
    result = evaluate_models(validation, [("init", init)])
    assert result.models[0].name == "init"
    assert result.models[0].loss == evaluate(init, TINY_MODEL, windows)
    assert (result.windows, result.context_len, result.horizon) == (150, 32, 8)


def test_every_model_is_scored_on_the_device_asked_for(spec: TrainingTaskSpec, init: dict,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``evaluate-model --device`` exists for models too large to score on the CPU: the device
    must reach every model's forward pass, not be dropped on the way."""
    import tenzro_training.trainer.evaluation as evaluation

    devices = []
    real = evaluation.evaluate
    monkeypatch.setattr(evaluation, "evaluate",
                        lambda *args, **kwargs: devices.append(kwargs.get("device")) or real(*args, **kwargs))
    evaluate_models(load_validation_set(spec), [("a", init), ("b", init)], device=torch.device("cpu"))
    assert devices == [torch.device("cpu")] * 2


def test_a_trained_model_scores_below_its_init(spec: TrainingTaskSpec, init: dict) -> None:
    """Eight AdamW steps on one shard: the score must drop (it went 3.48 -> 2.97 when written)."""
    shard = shard_windows(load_corpus(spec.dataset_ref), 0, 3, TINY_MODEL.context_len, TINY_MODEL.horizon)
    trained = run_inner_loop(init, InnerConfig(inner_steps=8, lr=1e-3, batch_size=32), TINY_MODEL, shard, 0, 0).state
    result = evaluate_models(load_validation_set(spec), [("init", init), ("trained", trained)])
    before, after = (m.loss for m in result.models)
    assert after < 0.95 * before, (before, after)


def test_last_value_baseline_matches_numpy(spec: TrainingTaskSpec) -> None:
    expected = reference_loss(reference_windows(spec.dataset_ref, 32, 8), 32, seasonal=False)
    result = evaluate_models(load_validation_set(spec), [])
    last = result.baselines[0]
    assert last.name == BASELINE_LAST_VALUE and last.loss == pytest.approx(expected, rel=1e-5)
    assert last.loss == pytest.approx(1.48, abs=0.005)  # the figure docs/trainer.md quotes at context 32 / horizon 8


def test_seasonal_naive_baseline_matches_numpy_where_every_season_fits_the_context() -> None:
    """At the dev spec's context 64, co2's 52-week season fits: every window gets its series' period."""
    dev = TrainingTaskSpec.from_json(DEV_SPEC.read_text())
    validation = load_validation_set(dev)
    reference = reference_windows(dev.dataset_ref, 64, 16)
    result = evaluate_models(validation, [])
    seasonal = result.baselines[1]
    assert seasonal.name == BASELINE_SEASONAL_NAIVE and seasonal.note == ""
    assert seasonal.loss == pytest.approx(reference_loss(reference, 64, seasonal=True), rel=1e-5)
    assert result.baselines[0].loss == pytest.approx(reference_loss(reference, 64, seasonal=False), rel=1e-5)


def test_a_season_of_one_is_the_last_value_forecast(spec: TrainingTaskSpec) -> None:
    windows = load_validation_set(spec).windows
    assert compute_seasonal_naive_loss(windows, 32, [1] * len(windows)) == compute_last_value_loss(windows, 32)


def test_a_season_as_long_as_the_context_is_used() -> None:
    """A period equal to the context still leaves one value of the same phase for every target
    (the context's first ones): the baseline is computed, not refused as too long."""
    validation = load_validation_set(make_spec())
    n = len(validation.windows)
    seasonal = evaluate_models(ValidationSet(validation.model_cfg, validation.windows, (32,) * n, ("s",) * n),
                               []).baselines[1]
    w = validation.windows.double().numpy()
    context, target = w[:, :32], w[:, 32:]
    scale = context.std(axis=1, keepdims=True)
    scale[scale < 1e-5] = 1.0
    assert seasonal.note == ""
    assert seasonal.loss == pytest.approx(float(np.mean(((context[:, :8] - target) / scale) ** 2)), rel=1e-5)


def test_invalid_seasonal_naive_is_not_computed_where_it_means_nothing() -> None:
    # Context 32 is shorter than co2's 52-week season: no value one season back.
    seasonal = evaluate_models(load_validation_set(make_spec()), []).baselines[1]
    assert seasonal.loss is None and "co2's season of 52 values is longer than the context (32)" in seasonal.note
    # Yearly series only: no season at all (it would only repeat the last-value figure).
    ref = "statsmodels:nile,sunspots"
    yearly = make_spec(dataset_ref=ref, dataset_hash="0x" + compute_dataset_hash(load_corpus(ref)).hex())
    seasonal = evaluate_models(load_validation_set(yearly), []).baselines[1]
    assert seasonal.loss is None and seasonal.note == "no series of the corpus has a season"
    windows = load_validation_set(make_spec()).windows
    with pytest.raises(ValueError, match="season"):
        compute_seasonal_naive_loss(windows, 32, [33] * len(windows))
    with pytest.raises(ValueError, match="season"):  # one window's period is enough to refuse
        compute_seasonal_naive_loss(windows, 32, [1] * (len(windows) - 1) + [33])
    # One period per window: fewer would silently score only the first windows.
    with pytest.raises(ValueError, match=f"{len(windows) - 1} seasons for {len(windows)} windows"):
        compute_seasonal_naive_loss(windows, 32, [1] * (len(windows) - 1))


def test_the_note_names_the_source_whose_season_does_not_fit() -> None:
    """The note tells the sponsor which series makes the seasonal baseline meaningless: it must
    name that series' source wherever it sits in the corpus, not the corpus' first one."""
    ref = "statsmodels:nile,co2"
    spec = make_spec(dataset_ref=ref, dataset_hash="0x" + compute_dataset_hash(load_corpus(ref)).hex())
    seasonal = evaluate_models(load_validation_set(spec), []).baselines[1]
    assert seasonal.loss is None and seasonal.note == "co2's season of 52 values is longer than the context (32)"


def test_invalid_dataset_hash_is_refused(spec: TrainingTaskSpec) -> None:
    other = make_spec(dataset_hash="0x" + "11" * 32)
    with pytest.raises(DatasetError, match="the task expects 0x1111"):
        load_validation_set(other)


@pytest.mark.parametrize(("change", "named"), [
    (lambda s: s.pop("head.bias"), "missing: head.bias"),
    (lambda s: s.update(extra=torch.zeros(1)), "unexpected: extra"),
    (lambda s: s.update({"head.weight": torch.zeros(16, 32)}), "head.weight (16, 32) where the model has (8, 32)"),
])
def test_invalid_state_names_the_tensors_that_differ(spec: TrainingTaskSpec, init: dict, change: Any, named: str) -> None:
    state = dict(init)
    change(state)
    with pytest.raises(StateMismatch, match="model x does not fit the spec's architecture") as info:
        check_model_state(TINY_MODEL, state, "x")
    assert named in str(info.value)
    with pytest.raises(StateMismatch):  # checked before anything is scored
        evaluate_models(load_validation_set(spec), [("ok", init), ("x", state)])


def test_json_form_has_no_nan(spec: TrainingTaskSpec, init: dict) -> None:
    huge = {k: v * 1e30 if k.endswith("weight") else v for k, v in init.items()}
    doc = evaluate_models(load_validation_set(spec), [("huge", huge)]).to_dict()
    json.dumps(doc, allow_nan=False)
    assert doc["models"] == [{"name": "huge", "loss": None}]
    assert set(doc) == {"windows", "context_len", "horizon", "models", "baselines"}


def test_json_form_has_no_infinity() -> None:
    """JSON has no Infinity either (a loss can overflow to inf as well as to NaN): null too."""
    evaluation = Evaluation(1, 32, 8, (ModelScore("overflow", math.inf),),
                            (BaselineScore(BASELINE_LAST_VALUE, -math.inf),))
    doc = evaluation.to_dict()
    json.dumps(doc, allow_nan=False)
    assert doc["models"][0]["loss"] is None and doc["baselines"][0]["loss"] is None
