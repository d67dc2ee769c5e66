"""Fault injection: 2 of 8 outer gradients are adversarial; the robust rules stay near the honest mean.

Six honest trainers send g + noise (a shared direction plus their own noise); two Byzantine ones
send one of the ``Fault`` variants below, at different canonical positions. Each robust rule is
checked against a bound computed directly from the honest inputs; plain Mean is shown to break it.

Bounds (h_1..h_6 honest, mu their mean, b = 2 Byzantine inputs):
- CoordinateMedian (K = 8, b = 2 < K/2) and TrimmedMean with t >= b: every coordinate of the
  aggregate lies within [min_i h_i, max_i h_i] of that coordinate (at most b values on either side
  of the kept ones can be Byzantine), hence ||agg - mu|| <= ||spread||, spread_c = max_i |h_ic - mu_c|.
- Krum (f = 2, K = 8 > 2f + 2): it returns one whole input; against these faults that input is
  honest, so ||agg - mu|| <= max_i ||h_i - mu||. Multi-Krum (m = K - f) averages honest inputs only.
"""

from __future__ import annotations

import enum

import pytest
import torch

from tenzro_training.aggregation import AggregationRule, aggregate

K, N, BYZANTINE = 8, 4096, 2


class Fault(enum.Enum):
    SIGN_FLIP_X10 = "sign-flipped honest gradient, scaled by 10"
    HUGE_NORM = "random direction with norm 1e6 x the honest norm"
    RANDOM_NOISE = "pure Gaussian noise, 20 x the honest inputs' per-coordinate scale"
    COLLUDING = "both attackers send the same vector, pulling every coordinate one way"


def honest_inputs(gen: torch.Generator) -> torch.Tensor:
    direction = torch.randn(N, generator=gen)
    return direction + 0.3 * torch.randn(BYZANTINE * 3, N, generator=gen)


def byzantine_inputs(fault: Fault, honest: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    mu = honest.mean(0)
    if fault is Fault.SIGN_FLIP_X10:
        return -10.0 * honest[:BYZANTINE]
    if fault is Fault.HUGE_NORM:
        noise = torch.randn(BYZANTINE, N, generator=gen)
        return noise / noise.norm(dim=1, keepdim=True) * mu.norm() * 1e6
    if fault is Fault.RANDOM_NOISE:
        return 20.0 * torch.randn(BYZANTINE, N, generator=gen) * (honest.std(0) + mu.abs())
    return (mu + 50.0).expand(BYZANTINE, N).clone()


def place(honest: torch.Tensor, bad: torch.Tensor, positions: tuple[int, ...]) -> torch.Tensor:
    """The K inputs in canonical order, with the Byzantine ones at ``positions``."""
    rows, h, b = [], iter(honest), iter(bad)
    for i in range(K):
        rows.append(next(b) if i in positions else next(h))
    return torch.stack(rows)


ROBUST = [
    AggregationRule.coordinate_median(),
    AggregationRule.trimmed_mean(2500),  # t = floor(8 * 0.25) = 2 = the number of attackers
    AggregationRule.krum(2),
]
POSITIONS = [(0, 1), (3, 6), (6, 7)]


@pytest.mark.parametrize("fault", list(Fault))
@pytest.mark.parametrize("positions", POSITIONS)
def test_robust_rules_stay_within_the_honest_bound(fault: Fault, positions: tuple[int, ...]) -> None:
    # A fixed seed per case (str hashes are salted per process, so not hash()).
    gen = torch.Generator().manual_seed(list(Fault).index(fault) * 100 + POSITIONS.index(positions))
    honest = honest_inputs(gen)
    x = place(honest, byzantine_inputs(fault, honest, gen), positions)
    mu = honest.mean(0)
    spread = (honest - mu).abs().amax(0)
    lo, hi = honest.amin(0), honest.amax(0)
    worst_honest = (honest - mu).norm(dim=1).max()

    for rule in ROBUST[:2]:
        agg = aggregate(rule, x).tensor
        assert bool(((agg >= lo) & (agg <= hi)).all()), f"{rule} left the honest range"
        assert (agg - mu).norm() <= spread.norm()

    krum = aggregate(AggregationRule.krum(2), x)
    assert krum.report.selected not in positions
    assert (krum.tensor - mu).norm() <= worst_honest
    multi = aggregate(AggregationRule.krum(2), x, multi_krum_m=K - 2)
    assert set(multi.report.selected_set or ()).isdisjoint(positions)
    assert (multi.tensor - mu).norm() <= worst_honest

    # The same attack drags plain Mean far outside every bound above.
    mean = aggregate(AggregationRule.mean(), x).tensor
    assert (mean - mu).norm() > 3 * max(float(spread.norm()), float(worst_honest))


def test_without_attackers_robust_rules_are_close_to_the_mean() -> None:
    gen = torch.Generator().manual_seed(1)
    honest = honest_inputs(gen)
    x = torch.cat([honest, honest_inputs(gen)[:BYZANTINE]])  # 8 honest-looking inputs
    mu = x.mean(0)
    exact_mean = aggregate(AggregationRule.mean(), x).tensor
    assert torch.allclose(exact_mean, mu, atol=1e-6)
    for rule in ROBUST:
        agg = aggregate(rule, x).tensor
        # Noise-level distance from the mean (the honest noise has norm ~0.3 * sqrt(N)).
        assert (agg - mu).norm() < 0.5 * (x - mu).norm(dim=1).max()
