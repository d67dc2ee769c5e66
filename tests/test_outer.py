"""Tests for tenzro_training.outer: the fp32 outer Nesterov SGD step.

Two references:
- a numpy float32 re-statement of the six documented steps: must agree BIT FOR BIT;
- torch.optim.SGD(nesterov=True): the momentum buffer must agree exactly; the weights within
  4 float32 epsilons of the operands' magnitude per step, because PyTorch's CPU kernels may fuse
  a multiply and an add into one FMA (one rounding where the protocol specifies two).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tenzro_training.errors import AggregationError, SpecError, TenzroError
from tenzro_training.outer import (
    apply_outer_step_,
    OuterConfig,
    OuterStepError,
    apply_outer_step,
    compute_initial_momentum,
)
from tenzro_training.spec import TrainingTaskSpec

EPS32 = float(np.finfo(np.float32).eps)


def numpy_reference(w: np.ndarray, b: np.ndarray, g: np.ndarray, lr: float, mu: float) -> tuple[np.ndarray, np.ndarray]:
    lr32, mu32 = np.float32(lr), np.float32(mu)
    m = np.multiply(mu32, b, dtype=np.float32)
    nb = np.add(m, g, dtype=np.float32)
    n = np.multiply(mu32, nb, dtype=np.float32)
    d = np.add(g, n, dtype=np.float32)
    s = np.multiply(lr32, d, dtype=np.float32)
    return np.subtract(w, s, dtype=np.float32), nb


def random_vectors(seed: int, n: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, generator=gen)
    # Gradients over many magnitudes, so cancellation and subnormal-ish ranges are exercised.
    grads = [
        torch.randn(n, generator=gen) * torch.pow(10.0, torch.randint(-6, 3, (n,), generator=gen).float())
        for _ in range(5)
    ]
    return w, grads


def bits(t: torch.Tensor | np.ndarray) -> np.ndarray:
    arr = t.numpy() if isinstance(t, torch.Tensor) else t
    return arr.view(np.uint32)


# --- config ---------------------------------------------------------------------------------


def test_defaults_are_the_spec_phase1_values() -> None:
    cfg = OuterConfig()
    assert cfg.lr == 0.7 and cfg.momentum == 0.9
    assert cfg.to_dict() == {"lr": 0.7, "momentum": 0.9}


def _spec_with_metadata(metadata: dict) -> TrainingTaskSpec:
    return TrainingTaskSpec.from_dict(
        {
            "task_id": "outer-test",
            "sponsor_did": "did:tenzro:human:alice",
            "sponsor_address": "0x" + "11" * 20,
            "architecture": {
                "family": "tiny",
                "param_count": 10,
                "modality": "Timeseries",
                "fragment_count": 2,
                "dtype": "fp32",
                "metadata": metadata,
            },
            "tier": "Open",
            "aggregation": "Mean",
            "trainer_count": 3,
            "quorum": 2,
            "inner_steps": 1,
            "max_rounds": 2,
            "grace_window_ms": 0,
            "reward_pool": "100",
            "dataset_ref": "ipfs://x",
            "dataset_hash": "0x" + "00" * 32,
            "min_throughput": None,
            "created_at": 0,
        }
    )


def test_from_spec_uses_defaults_without_overrides() -> None:
    assert OuterConfig.from_spec(_spec_with_metadata({})) == OuterConfig()


def test_from_spec_honours_metadata_overrides() -> None:
    cfg = OuterConfig.from_spec(_spec_with_metadata({"outer_lr": 1, "outer_momentum": 0.5}))
    assert cfg == OuterConfig(lr=1.0, momentum=0.5)
    assert isinstance(cfg.lr, float)
    only_mu = OuterConfig.from_spec(_spec_with_metadata({"outer_momentum": 0}))
    assert only_mu == OuterConfig(lr=0.7, momentum=0.0)


@pytest.mark.parametrize(
    ("metadata", "path"),
    [
        ({"outer_lr": 0}, "architecture.metadata.outer_lr"),
        ({"outer_lr": -0.1}, "architecture.metadata.outer_lr"),
        ({"outer_lr": "0.7"}, "architecture.metadata.outer_lr"),
        ({"outer_lr": True}, "architecture.metadata.outer_lr"),
        ({"outer_lr": None}, "architecture.metadata.outer_lr"),
        ({"outer_lr": 1e-50}, "architecture.metadata.outer_lr"),
        ({"outer_lr": 1e39}, "architecture.metadata.outer_lr"),
        ({"outer_momentum": 1}, "architecture.metadata.outer_momentum"),
        ({"outer_momentum": -0.01}, "architecture.metadata.outer_momentum"),
        ({"outer_momentum": 0.99999999}, "architecture.metadata.outer_momentum"),
        ({"outer_momentum": [0.9]}, "architecture.metadata.outer_momentum"),
    ],
)
def test_invalid_metadata_override(metadata: dict, path: str) -> None:
    with pytest.raises(SpecError) as info:
        OuterConfig.from_metadata(metadata)
    assert info.value.path == path


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_invalid_non_finite_hyperparameters(value: float) -> None:
    with pytest.raises(SpecError):
        OuterConfig(lr=value)
    with pytest.raises(SpecError):
        OuterConfig(momentum=value)


# --- the step -------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [OuterConfig(), OuterConfig(lr=1.0, momentum=0.0), OuterConfig(lr=0.05, momentum=0.5)])
def test_matches_numpy_reference_bitwise_over_several_rounds(cfg: OuterConfig) -> None:
    w, grads = random_vectors(1, 4099)
    b = compute_initial_momentum(w.numel())
    wn, bn = w.numpy().copy(), np.zeros(w.numel(), np.float32)
    for g in grads:
        w, b = apply_outer_step(w, b, g, cfg)
        wn, bn = numpy_reference(wn, bn, g.numpy(), cfg.lr, cfg.momentum)
        assert np.array_equal(bits(w), bits(wn))
        assert np.array_equal(bits(b), bits(bn))


@settings(max_examples=60, deadline=None)
@given(
    data=hnp.arrays(
        np.float32,
        st.tuples(st.just(3), st.integers(0, 40)),
        elements=st.floats(-1e6, 1e6, width=32, allow_subnormal=True),
    ),
    lr=st.floats(1e-4, 2.0),
    mu=st.floats(0.0, 0.99),
)
def test_property_numpy_reference_bitwise(data: np.ndarray, lr: float, mu: float) -> None:
    cfg = OuterConfig(lr=lr, momentum=mu)
    w, b, g = (torch.from_numpy(row.copy()) for row in data)
    new_w, new_b = apply_outer_step(w, b, g, cfg)
    ref_w, ref_b = numpy_reference(data[0], data[1], data[2], cfg.lr, cfg.momentum)
    assert np.array_equal(bits(new_w), bits(ref_w))
    assert np.array_equal(bits(new_b), bits(ref_b))
    # In place (the node's path), with and without a (larger, dirty) scratch: the same bits.
    for scratch in (None, torch.full((w.numel() + 3,), float("nan"))):
        iw, ib = w.clone(), b.clone()
        apply_outer_step_(iw, ib, g, cfg, scratch=scratch)
        assert np.array_equal(bits(iw), bits(ref_w)) and np.array_equal(bits(ib), bits(ref_b))


def test_matches_torch_sgd_nesterov_within_fma_tolerance() -> None:
    w0, grads = random_vectors(2, 20011)
    param = torch.nn.Parameter(w0.clone())
    opt = torch.optim.SGD([param], lr=0.7, momentum=0.9, nesterov=True)
    cfg = OuterConfig()
    w, b = w0.clone(), compute_initial_momentum(w0.numel())
    for g in grads:
        # Start each step from the same state so the tolerance is per step, not accumulated.
        param.data.copy_(w)
        if "momentum_buffer" in opt.state[param]:
            opt.state[param]["momentum_buffer"].copy_(b)
        param.grad = g.clone()
        opt.step()
        new_w, new_b = apply_outer_step(w, b, g, cfg)
        torch_b = opt.state[param]["momentum_buffer"]
        assert torch.equal(new_b, torch_b), "momentum buffers must agree exactly"
        scale = w.abs() + 0.7 * (g.abs() + 0.9 * new_b.abs())
        err = (param.detach() - new_w).abs()
        assert bool((err <= 4 * EPS32 * scale).all()), float((err / (EPS32 * scale)).max())
        w, b = new_w, new_b


def test_first_step_from_zero_momentum_is_plain_nesterov() -> None:
    cfg = OuterConfig(lr=0.5, momentum=0.5)
    w = torch.tensor([1.0, 2.0, -3.0])
    g = torch.tensor([0.5, -1.0, 2.0])
    new_w, new_b = apply_outer_step(w, compute_initial_momentum(3), g, cfg)
    # b' = g; w' = w - lr * (g + mu * g) = w - 0.75 g (exact in binary).
    assert torch.equal(new_b, g)
    assert torch.equal(new_w, torch.tensor([0.625, 2.75, -4.5]))


def test_inputs_are_not_mutated() -> None:
    w, grads = random_vectors(3, 257)
    b = torch.randn(257)
    copies = (w.clone(), b.clone(), grads[0].clone())
    new_w, new_b = apply_outer_step(w, b, grads[0], OuterConfig())
    assert torch.equal(w, copies[0]) and torch.equal(b, copies[1]) and torch.equal(grads[0], copies[2])
    assert new_w.data_ptr() not in {w.data_ptr(), b.data_ptr(), grads[0].data_ptr()}
    assert new_b.data_ptr() not in {w.data_ptr(), b.data_ptr(), grads[0].data_ptr()}


def test_bit_identical_across_thread_counts_and_repeats() -> None:
    w, grads = random_vectors(4, 1 << 18)
    b = torch.randn(w.numel())
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 1, 2):
            torch.set_num_threads(threads)
            results.append(apply_outer_step(w, b, grads[1], OuterConfig()))
    finally:
        torch.set_num_threads(before)
    for new_w, new_b in results[1:]:
        assert torch.equal(bits_t(new_w), bits_t(results[0][0]))
        assert torch.equal(bits_t(new_b), bits_t(results[0][1]))


def bits_t(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def test_non_contiguous_inputs_give_the_same_result() -> None:
    w, grads = random_vectors(5, 200)
    base = torch.stack([w, grads[0], grads[1]], dim=1)  # columns are strided views
    strided = apply_outer_step(base[:, 0], base[:, 1], base[:, 2], OuterConfig())
    dense = apply_outer_step(w.clone(), grads[0].clone(), grads[1].clone(), OuterConfig())
    assert torch.equal(bits_t(strided[0]), bits_t(dense[0]))
    assert torch.equal(bits_t(strided[1]), bits_t(dense[1]))


def test_invalid_in_place_buffers() -> None:
    cfg = OuterConfig()
    w, b, g = torch.ones(4), torch.zeros(4), torch.ones(4)
    for scratch in (torch.zeros(3), torch.zeros(8)[::2], torch.zeros(4, dtype=torch.float64)):
        with pytest.raises(OuterStepError):
            apply_outer_step_(w, b, g, cfg, scratch=scratch)
    with pytest.raises(OuterStepError, match="different buffers"):
        apply_outer_step_(w, w, g, cfg)
    with pytest.raises(OuterStepError, match="share no memory"):
        apply_outer_step_(w, b, w, cfg)
    with pytest.raises(OuterStepError, match="contiguous"):
        apply_outer_step_(torch.ones(8)[::2], b, g, cfg)
    big = torch.full((2,), 3e38)
    with pytest.raises(OuterStepError, match="non-finite"):
        apply_outer_step_(-big, torch.zeros(2), big, OuterConfig(lr=1.0, momentum=0.9))


def test_empty_fragment_is_allowed() -> None:
    empty = torch.zeros(0)
    new_w, new_b = apply_outer_step(empty, empty, empty, OuterConfig())
    assert new_w.numel() == 0 and new_b.numel() == 0
    # ...and so is its initial momentum buffer: zero elements is a length, not an error.
    b0 = compute_initial_momentum(0)
    assert b0.shape == (0,) and b0.dtype == torch.float32


@pytest.mark.parametrize(
    ("w", "b", "g"),
    [
        (torch.zeros(3, dtype=torch.float64), torch.zeros(3), torch.zeros(3)),
        (torch.zeros(3), torch.zeros(3, dtype=torch.bfloat16), torch.zeros(3)),
        (torch.zeros(3), torch.zeros(3), torch.zeros(4)),
        (torch.zeros(3), torch.zeros(2), torch.zeros(3)),
        (torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2, 2)),
        (torch.tensor(1.0), torch.tensor(1.0), torch.tensor(1.0)),
        (np.zeros(3, np.float32), torch.zeros(3), torch.zeros(3)),
        ([0.0, 0.0], torch.zeros(2), torch.zeros(2)),
    ],
)
def test_invalid_tensors(w: object, b: object, g: object) -> None:
    with pytest.raises(OuterStepError) as info:
        apply_outer_step(w, b, g, OuterConfig())  # type: ignore[arg-type]
    assert isinstance(info.value, AggregationError) and isinstance(info.value, TenzroError)


def test_invalid_config_type() -> None:
    with pytest.raises(OuterStepError):
        apply_outer_step(torch.zeros(1), torch.zeros(1), torch.zeros(1), {"lr": 0.7})  # type: ignore[arg-type]


def test_invalid_overflow_to_infinity_is_rejected() -> None:
    big = torch.full((2,), 3e38)
    with pytest.raises(OuterStepError):
        apply_outer_step(-big, torch.zeros(2), big, OuterConfig(lr=1.0, momentum=0.9))


def test_invalid_length() -> None:
    with pytest.raises(OuterStepError):
        compute_initial_momentum(-1)
    assert torch.equal(compute_initial_momentum(4), torch.zeros(4))
    assert compute_initial_momentum(4).dtype == torch.float32
