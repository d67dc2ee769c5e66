"""Tests for tenzro_training.aggregation: every rule against a slow, obvious numpy reference.

The references below work one coordinate (or one block) at a time with numpy scalars and Python
integers, straight from the arithmetic docs/aggregation.md pins; the fast kernels must match them
bit for bit (compared as integer bit patterns, so -0.0 != +0.0 and no tolerance hides anything).
"""

from __future__ import annotations

import hashlib
import json
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tenzro_training import _selection, aggregation
from tenzro_training.aggregation import (
    AggregationOverflowError,
    AggregationReport,
    AggregationRule,
    NonFiniteInputError,
    aggregate,
    compute_krum_distances,
    compute_krum_scores,
    compute_krum_selection,
)
from tenzro_training.errors import AggregationError
from tenzro_training.records import FragmentOutcome
from tenzro_training.rules import RuleKind

F32 = np.float32
F64 = np.float64

# --- slow, obvious references ---------------------------------------------------------------


def to_numpy32(x: torch.Tensor) -> np.ndarray:
    """Exact float32 copy of an input (bfloat16 and float16 convert exactly)."""
    return x.detach().to(torch.float32).reshape(-1).numpy().copy()


def plus_zero(v: np.float32) -> np.float32:
    return F32(v + F32(0.0))


def ref_mean(cols: list[np.ndarray]) -> np.ndarray:
    k = len(cols)
    out = np.empty(cols[0].shape, dtype=F32)
    with np.errstate(over="ignore"):  # an overflow to inf is the answer (see ref_trimmed_mean)
        for c in range(out.size):
            acc = cols[0][c]
            for row in cols[1:]:
                acc = F32(acc + row[c])
            out[c] = F32(acc / F32(k))
    return out


def ref_median(cols: list[np.ndarray]) -> np.ndarray:
    k = len(cols)
    out = np.empty(cols[0].shape, dtype=F32)
    for c in range(out.size):
        v = sorted(row[c] for row in cols)
        if k % 2:
            out[c] = plus_zero(v[k // 2])
        else:
            # The exact midpoint (a rational number), rounded once to float32.
            mid = (Fraction(float(v[k // 2 - 1])) + Fraction(float(v[k // 2]))) / 2
            out[c] = plus_zero(round_to_f32(mid))
    return out


def round_to_f32(q: Fraction) -> np.float32:
    """The float32 nearest to the rational q, ties to even (q within the float32 range)."""
    guess = F32(float(q))
    candidates = {guess, np.nextafter(guess, F32(np.inf)), np.nextafter(guess, F32(-np.inf))}
    finite = [c for c in candidates if np.isfinite(c)]
    best = min(abs(Fraction(float(c)) - q) for c in finite)
    nearest = [c for c in finite if abs(Fraction(float(c)) - q) == best]
    nearest.sort(key=lambda c: int(np.array(c, dtype=F32).view(np.int32)) & 1)  # even mantissa first
    return F32(nearest[0])


def ref_trimmed_mean(cols: list[np.ndarray], t: int) -> np.ndarray:
    k = len(cols)
    out = np.empty(cols[0].shape, dtype=F32)
    for c in range(out.size):
        kept = sorted(row[c] for row in cols)[t : k - t]
        acc = kept[0]
        # A float32 sum that overflows to inf is the reference's answer (check_against then
        # expects AggregationOverflowError), not a numpy warning in the test run.
        with np.errstate(over="ignore"):
            for v in kept[1:]:
                acc = F32(acc + v)
            out[c] = plus_zero(F32(acc / F32(k - 2 * t)))
    return out


def ref_block_exponent(block: np.ndarray) -> int:
    """e with |x| < 2^e for all x in the block: the float32 exponent field E minus 126."""
    m = float(np.max(np.abs(block))) if block.size else 0.0
    if m == 0.0:
        return -126
    return max(math.frexp(m)[1], -126)  # subnormals share E = 0, i.e. e = -126


def ref_rounded_ints(block: np.ndarray) -> tuple[list[int], int]:
    """The block row as integers q with x ~= q * 2^g, g = e - 22, rounded to nearest even."""
    g = ref_block_exponent(block) - 22
    return [int(np.rint(math.ldexp(float(x), -g))) for x in block], g


def ref_krum_distances(cols: list[np.ndarray]) -> list[list[float]]:
    k = len(cols)
    n = cols[0].size
    b = _selection.GRAM_BLOCK
    nblocks = max(1, -(-n // b))
    grams = []
    for blk in range(nblocks):
        parts = [ref_rounded_ints(row[blk * b : (blk + 1) * b]) for row in cols]
        g = [[0.0] * k for _ in range(k)]
        for i in range(k):
            for j in range(k):
                exact = sum(p * q for p, q in zip(parts[i][0], parts[j][0]))  # Python int: exact
                assert abs(exact) <= 2**53  # the bound that makes any BLAS order exact
                g[i][j] = math.ldexp(float(exact), parts[i][1] + parts[j][1]) + 0.0
        grams.append(g)
    size = 1
    while size < len(grams):
        size *= 2
    grams += [[[0.0] * k for _ in range(k)] for _ in range(size - len(grams))]
    while len(grams) > 1:
        half = len(grams) // 2
        grams = [[[grams[p][i][j] + grams[p + half][i][j] for j in range(k)] for i in range(k)] for p in range(half)]
    gram = grams[0]
    dist = []
    for i in range(k):
        row = []
        for j in range(k):
            d = (gram[i][i] + gram[j][j]) - 2.0 * gram[i][j]
            row.append(d if d > 0.0 else 0.0)
        dist.append(row)
    return dist


def ref_krum(cols: list[np.ndarray], f: int, m: int | None) -> tuple[np.ndarray, int, tuple[int, ...], tuple[float, ...]]:
    k = len(cols)
    dist = ref_krum_distances(cols)
    scores = []
    for i in range(k):
        total = 0.0
        for d in sorted(dist[i][j] for j in range(k) if j != i)[: k - f - 2]:
            total += d
        scores.append(total)
    order = sorted(range(k), key=lambda i: (scores[i], i))
    chosen = tuple(sorted(order[: m or 1]))
    out = cols[order[0]].copy() if m is None else ref_mean([cols[i] for i in chosen])
    return out, order[0], chosen, tuple(scores)


def bits(a: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().reshape(-1).numpy()
    return np.ascontiguousarray(a, dtype=F32).view(np.int32)


# --- input strategies -------------------------------------------------------------------------

# A few values that collide often (ties, signed zeros), plus arbitrary finite float32 values.
_TIE_VALUES = [-2.0, -1.0, -0.0, 0.0, 0.5, 1.0, 3.0]
_values = st.one_of(
    st.sampled_from(_TIE_VALUES),
    st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True),
    st.floats(min_value=-1e3, max_value=1e3, width=32),
)
_dtypes = st.sampled_from([torch.float32, torch.float32, torch.bfloat16, torch.float16])


@st.composite
def stacks(draw: st.DrawFn, min_k: int = 1, max_k: int = 9, max_n: int = 24) -> torch.Tensor:
    k = draw(st.integers(min_k, max_k))
    n = draw(st.integers(0, max_n))
    dtype = draw(_dtypes)
    flat = draw(st.lists(_values, min_size=k * n, max_size=k * n))
    x = torch.tensor(flat, dtype=torch.float32).reshape(k, n)
    x = x.to(dtype)
    assume(bool(torch.isfinite(x).all()))  # float16 overflows large float32 values to inf
    return x


def columns(x: torch.Tensor) -> list[np.ndarray]:
    return [to_numpy32(row) for row in x.unbind(0)]


def check_against(rule: AggregationRule, x: torch.Tensor, want: np.ndarray) -> aggregation.AggregationResult | None:
    """Aggregate and compare bitwise; a non-finite reference must be an overflow error."""
    if not np.all(np.isfinite(want)):
        with pytest.raises(AggregationOverflowError):
            aggregate(rule, x)
        with pytest.raises(AggregationOverflowError):  # the result's check is never skipped
            aggregate(rule, x, inputs_checked=True)
        return None
    result = aggregate(rule, x)
    assert result.tensor.dtype == torch.float32
    assert result.tensor.shape == x.shape[1:]
    assert np.array_equal(bits(result.tensor), bits(want))
    assert_same_into_out(rule, x, result)
    return result


def assert_same_into_out(rule: AggregationRule, x: torch.Tensor, result: aggregation.AggregationResult,
                         multi_krum_m: int | None = None) -> None:
    """``out=`` (a buffer full of garbage from an earlier use) gives the same bits and report,
    as a view of that buffer; so does ``inputs_checked=True`` (finite inputs: only the scan of
    the inputs is skipped)."""
    out = torch.full((x[0].numel(),), float("nan"))
    into = aggregate(rule, x, multi_krum_m=multi_krum_m, out=out)
    assert into.tensor.data_ptr() == out.data_ptr() and into.tensor.shape == result.tensor.shape
    assert np.array_equal(bits(into.tensor), bits(result.tensor))
    assert into.report == result.report
    checked = aggregate(rule, x, multi_krum_m=multi_krum_m, inputs_checked=True)
    assert np.array_equal(bits(checked.tensor), bits(result.tensor))
    assert checked.report == result.report


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- rules against the references -----------------------------------------------------------


@SETTINGS
@given(stacks())
def test_mean_matches_reference(x: torch.Tensor) -> None:
    result = check_against(AggregationRule.mean(), x, ref_mean(columns(x)))
    if result is not None:
        assert result.report == AggregationReport(AggregationRule.mean(), x.shape[0], 0, None, None, None)


@SETTINGS
@given(stacks())
def test_coordinate_median_matches_reference(x: torch.Tensor) -> None:
    check_against(AggregationRule.coordinate_median(), x, ref_median(columns(x)))


@SETTINGS
@given(stacks(), st.integers(0, 10_000))
def test_trimmed_mean_matches_reference(x: torch.Tensor, alpha_bps: int) -> None:
    rule = AggregationRule.trimmed_mean(alpha_bps)
    k = x.shape[0]
    assume(rule.is_valid_for_quorum(k))
    t = rule.trimmed_per_side(k)
    result = check_against(rule, x, ref_trimmed_mean(columns(x), t))
    if result is not None:
        assert result.report.trimmed_per_side == t == (k * alpha_bps) // 10_000


@SETTINGS
@given(stacks(min_k=3, max_k=9, max_n=20), st.integers(0, 3), st.data())
def test_krum_matches_reference(x: torch.Tensor, f: int, data: st.DataObject) -> None:
    k = x.shape[0]
    rule = AggregationRule.krum(f)
    assume(rule.is_valid_for_quorum(k))
    m = data.draw(st.one_of(st.none(), st.integers(1, k - f)))
    want, selected, chosen, scores = ref_krum(columns(x), f, m)
    if not np.all(np.isfinite(want)):
        with pytest.raises(AggregationOverflowError):
            aggregate(rule, x, multi_krum_m=m)
        return
    result = aggregate(rule, x, multi_krum_m=m)
    assert np.array_equal(bits(result.tensor), bits(want))
    assert_same_into_out(rule, x, result, m)
    assert result.report.selected == selected
    assert result.report.selected_set == (None if m is None else chosen)
    assert result.report.scores == scores
    assert [struct_bits(s) for s in result.report.scores] == [struct_bits(s) for s in scores]


def struct_bits(v: float) -> int:
    return int(np.float64(v).view(np.int64))


def test_krum_distances_match_reference_across_blocks_and_scales() -> None:
    # 3 blocks (the last one partial) with very different magnitudes per block and per row.
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(5, 1300, generator=gen)
    x[:, :512] *= 1e-30
    x[1, 512:1024] *= 1e20
    x[2, 1024:] = torch.tensor(1e-44)  # subnormal
    x[3, 700:900] = 0.0
    got = compute_krum_distances(list(x.unbind(0)))
    want = ref_krum_distances(columns(x))
    assert [list(r) for r in got] == want
    assert all(got[i][i] == 0.0 for i in range(5))
    assert all(got[i][j] == got[j][i] for i in range(5) for j in range(5))


def test_even_midpoint_is_exact_and_cannot_overflow() -> None:
    big = torch.finfo(torch.float32).max
    x = torch.tensor([[big, -big, 1e-45, 3.0], [big, big, 3e-45, 4.0]])
    out = aggregate(AggregationRule.coordinate_median(), x).tensor
    # round32((a + b) / 2) exactly: max, 0, 2e-45 (= 2 * min subnormal, exact), 3.5
    assert out.tolist() == [big, 0.0, pytest.approx(2.8e-45, rel=0.01), 3.5]
    assert bits(out)[2] == 2
    assert bits(out)[1] == 0  # +0.0, not -0.0


# --- explicit cases ---------------------------------------------------------------------------


def test_k_equals_one_returns_the_input() -> None:
    x = torch.tensor([[1.5, -0.0, -3.25, 7.0]])
    assert bits(aggregate(AggregationRule.mean(), x).tensor).tolist() == bits(x[0]).tolist()
    for rule in (AggregationRule.coordinate_median(), AggregationRule.trimmed_mean(4999)):
        out = aggregate(rule, x).tensor
        assert out.tolist() == [1.5, 0.0, -3.25, 7.0]
        assert bits(out)[1] == 0  # the order-statistic rules return +0.0 for zeros


def test_ties_and_even_k() -> None:
    x = torch.tensor([[1.0, 2.0], [1.0, -1.0], [3.0, 2.0], [1.0, 2.0]])
    assert aggregate(AggregationRule.coordinate_median(), x).tensor.tolist() == [1.0, 2.0]
    assert aggregate(AggregationRule.trimmed_mean(2500), x).tensor.tolist() == [1.0, 2.0]
    assert aggregate(AggregationRule.mean(), x).tensor.tolist() == [1.5, 1.25]


def test_krum_selects_lowest_index_on_ties() -> None:
    x = torch.tensor([[5.0, 5.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [9.0, -9.0]])
    result = aggregate(AggregationRule.krum(1), x)
    assert result.report.selected == 1
    assert result.report.scores[1] == result.report.scores[2] == result.report.scores[3] == 0.0
    assert result.tensor.tolist() == [1.0, 1.0]
    multi = aggregate(AggregationRule.krum(1), x, multi_krum_m=3)
    assert multi.report.selected == 1 and multi.report.selected_set == (1, 2, 3)


def test_krum_returns_a_fresh_float32_copy() -> None:
    x = [torch.tensor([float(i), 2.0 * i]) for i in range(5)]
    result = aggregate(AggregationRule.krum(0), x)
    chosen = result.report.selected
    result.tensor.add_(100.0)
    assert x[chosen].tolist() == [float(chosen), 2.0 * chosen]
    half = [t.to(torch.bfloat16) for t in x]
    assert aggregate(AggregationRule.krum(0), half).tensor.dtype == torch.float32


def test_list_and_stacked_inputs_agree_and_shape_is_kept() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 3, 5, 7, generator=gen)
    for rule in (
        AggregationRule.mean(),
        AggregationRule.coordinate_median(),
        AggregationRule.trimmed_mean(2000),
        AggregationRule.krum(1),
    ):
        a = aggregate(rule, x)
        b = aggregate(rule, list(x.unbind(0)))
        c = aggregate(rule, [t.transpose(0, 2).contiguous().transpose(0, 2) for t in x])  # strided
        assert a.tensor.shape == (3, 5, 7)
        assert torch.equal(a.tensor, b.tensor) and torch.equal(a.tensor, c.tensor)
        assert a.report == b.report == c.report


def test_empty_fragment_is_allowed() -> None:
    x = torch.empty(5, 0)
    for rule in (AggregationRule.mean(), AggregationRule.coordinate_median(), AggregationRule.krum(1)):
        out = aggregate(rule, x)
        assert out.tensor.shape == (0,)
    assert aggregate(AggregationRule.krum(1), x).report.scores == (0.0,) * 5


def test_mixed_input_dtypes_convert_exactly() -> None:
    x32 = torch.tensor([[1.0, -2.5], [0.125, 3.0], [-7.0, 0.5]])
    mixed = [x32[0], x32[1].to(torch.bfloat16), x32[2].to(torch.float16)]
    for rule in (AggregationRule.mean(), AggregationRule.coordinate_median(), AggregationRule.trimmed_mean(3400)):
        assert torch.equal(aggregate(rule, mixed).tensor, aggregate(rule, x32).tensor)


# --- determinism: threads and chunking --------------------------------------------------------


def _workload() -> torch.Tensor:
    gen = torch.Generator().manual_seed(11)
    k, n = 8, 300_001  # spans several chunks and Gram blocks, with ragged tails
    honest = torch.randn(n, generator=gen)
    x = honest + 0.1 * torch.randn(k, n, generator=gen)
    x[:, ::97] = 0.0
    x[3, ::89] = -0.0
    x[5] *= 1e4
    return x


RULES = [
    (AggregationRule.mean(), None),
    (AggregationRule.coordinate_median(), None),
    (AggregationRule.trimmed_mean(1250), None),
    (AggregationRule.krum(2), None),
    (AggregationRule.krum(2), 3),
]


def test_bit_identical_with_one_and_two_threads() -> None:
    x = _workload()
    before = torch.get_num_threads()
    try:
        results = {}
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results[threads] = [aggregate(rule, x, multi_krum_m=m) for rule, m in RULES]
    finally:
        torch.set_num_threads(before)
    for one, two in zip(results[1], results[2]):
        assert torch.equal(bits_t(one.tensor), bits_t(two.tensor))
        assert one.report.canonical_bytes() == two.report.canonical_bytes()


def bits_t(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def test_chunk_size_does_not_change_results(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(7, 5000, generator=gen)
    x[2, 1000:1300] *= 1e6
    baseline = [aggregate(rule, x, multi_krum_m=m) for rule, m in RULES]
    # Tiny chunks: many chunk boundaries, ragged tails, Gram blocks split across chunks.
    def tiny(rows: int, itemsize: int, budget: int = 0, align: int = 4096) -> int:
        return 1024 if align == _selection.GRAM_BLOCK else 1100

    monkeypatch.setattr(_selection, "compute_chunk_size", tiny)
    small = [aggregate(rule, x, multi_krum_m=m) for rule, m in RULES]
    for a, b in zip(baseline, small):
        assert torch.equal(bits_t(a.tensor), bits_t(b.tensor))
        assert a.report == b.report


def test_multi_chunk_results_match_vectorised_reference() -> None:
    x = _workload()[:, :70_000]
    cols = x.numpy()
    s = np.sort(cols, axis=0)
    mean = cols[0].copy()
    for row in cols[1:]:
        mean = mean + row
    mean = mean / F32(8)
    median = ((s[3].astype(F64) + s[4]) * 0.5).astype(F32) + F32(0)
    trimmed = s[1] + s[2]
    for row in s[3:7]:
        trimmed = trimmed + row
    trimmed = trimmed / F32(6) + F32(0)
    for rule, want in (
        (AggregationRule.mean(), mean),
        (AggregationRule.coordinate_median(), median),
        (AggregationRule.trimmed_mean(1250), trimmed),
    ):
        assert np.array_equal(bits(aggregate(rule, x).tensor), bits(want))


# --- the comparator networks ---------------------------------------------------------------------


@pytest.mark.parametrize("k", range(1, 13))
def test_sorting_network_sorts_every_zero_one_input(k: int) -> None:
    # 0-1 principle: a comparator network sorts all inputs iff it sorts all 0/1 inputs.
    network = _selection.compute_sorting_network(k)
    assert all(lo < hi < k for lo, hi in network)
    for word in range(2**k):
        v = [(word >> i) & 1 for i in range(k)]
        for lo, hi in network:
            if v[lo] > v[hi]:
                v[lo], v[hi] = v[hi], v[lo]
        assert v == sorted(v)


def test_sorting_network_sizes_are_batchers() -> None:
    assert [len(_selection.compute_sorting_network(k)) for k in (2, 4, 6, 8, 16, 32)] == [1, 5, 12, 19, 63, 191]


@given(st.integers(1, 20), st.data())
def test_pruned_network_yields_the_wanted_order_statistics(k: int, data: st.DataObject) -> None:
    wanted = tuple(sorted(data.draw(st.sets(st.integers(0, k - 1), min_size=1))))
    values = data.draw(st.lists(st.integers(-5, 5), min_size=k, max_size=k))
    v: list[int | None] = list(values)
    for lo, hi, need_lo, need_hi in _selection.compute_pruned_network(k, wanted):
        a, b = v[lo], v[hi]
        assert a is not None and b is not None  # a pruned network only reads live wires
        v[lo] = min(a, b) if need_lo else None
        v[hi] = max(a, b) if need_hi else None
    assert [v[i] for i in wanted] == [sorted(values)[i] for i in wanted]


def test_median_network_is_pruned() -> None:
    full = len(_selection.compute_sorting_network(8))
    pruned = _selection.compute_pruned_network(8, (3, 4))
    assert len(pruned) < full
    assert sum(c.need_lo + c.need_hi for c in pruned) < 2 * full


# --- the report ---------------------------------------------------------------------------------


def test_report_canonical_bytes_golden() -> None:
    report = AggregationReport(AggregationRule.krum(1), 5, 0, 2, None, (1.0, 0.5, 0.25, 3.0, 1e300))
    want = (
        b'{"domain":"tenzro/train/aggregation-report/v1","k":5,"rule":{"Krum":{"f":1}},'
        b'"scores":["0x3ff0000000000000","0x3fe0000000000000","0x3fd0000000000000",'
        b'"0x4008000000000000","0x7e37e43c8800759c"],"selected":2,"selected_set":null,'
        b'"trimmed_per_side":0}'
    )
    assert report.canonical_bytes() == want
    assert report.report_hash() == hashlib.sha256(want).digest()
    parsed = json.loads(want)
    assert parsed["rule"] == AggregationRule.krum(1).to_spec()


def test_report_fields_per_rule_and_round_record_fit() -> None:
    x = _workload()[:, :2000]
    for rule, m in RULES:
        report = aggregate(rule, x, multi_krum_m=m).report
        assert report.rule == rule and report.k == 8
        assert report.trimmed_per_side == rule.trimmed_per_side(8)
        is_krum = rule.kind is RuleKind.KRUM
        assert (report.selected is not None) == is_krum
        assert (report.scores is not None) == is_krum
        assert (report.selected_set is not None) == (m is not None)
        assert len(report.report_hash()) == 32
        # The round record's FragmentOutcome takes these fields as they are.
        outcome = FragmentOutcome(
            hashlib.sha256(b"agg").digest(),
            tuple(bytes([i]) * 20 for i in range(1, 9)),
            report.selected or 0,
            report.trimmed_per_side,
            report.report_hash(),
        )
        assert outcome.trimmed == report.trimmed_per_side
    reports = {aggregate(rule, x, multi_krum_m=m).report.report_hash() for rule, m in RULES}
    assert len(reports) == len(RULES)


def test_report_is_frozen() -> None:
    report = aggregate(AggregationRule.mean(), torch.ones(2, 3)).report
    with pytest.raises(AttributeError):
        report.k = 3  # type: ignore[misc]


def test_krum_helpers_compose() -> None:
    d = [[0.0, 1.0, 4.0], [1.0, 0.0, 1.0], [4.0, 1.0, 0.0]]
    assert compute_krum_scores(d, 1) == (1.0, 1.0, 1.0)
    assert compute_krum_scores(d, 2) == (5.0, 2.0, 5.0)
    assert compute_krum_selection((5.0, 2.0, 5.0)) == (1,)
    assert compute_krum_selection((5.0, 2.0, 5.0), 2) == (0, 1)


def test_rule_types_are_reexported() -> None:
    assert aggregation.AggregationRule is AggregationRule
    assert aggregation.RuleKind is RuleKind


# --- invalid inputs --------------------------------------------------------------------------


def test_invalid_no_inputs() -> None:
    with pytest.raises(AggregationError, match="at least one"):
        aggregate(AggregationRule.mean(), [])
    with pytest.raises(AggregationError):
        aggregate(AggregationRule.mean(), torch.empty(0, 4))


def test_invalid_out_is_refused_before_anything_is_written() -> None:
    x = [torch.arange(6, dtype=torch.float32).reshape(2, 3) + i for i in range(3)]
    stacked = torch.stack(x)
    cases = [
        (torch.zeros(6, dtype=torch.float64), "float32"),
        (torch.zeros(6, dtype=torch.float16), "float32"),
        (torch.zeros(5), "6 elements"),
        (torch.zeros(7), "6 elements"),
        (torch.zeros(12)[::2], "contiguous"),
        (x[1].reshape(-1), "overlaps input 1"),  # the output would be read while written
        (stacked.reshape(-1)[4:10], "overlaps input 0"),  # partial overlap with a stacked input
        ([0.0] * 6, "float32"),
    ]
    for out, message in cases:
        before = [t.clone() for t in x]
        inputs = stacked if "input 0" in message else x
        with pytest.raises(AggregationError, match=message):
            aggregate(AggregationRule.mean(), inputs, out=out)  # type: ignore[arg-type]
        assert all(torch.equal(a, b) for a, b in zip(x, before))
    # Adjacent (not overlapping) memory is fine.
    backing = torch.zeros(12)
    row = backing[:6]
    row.copy_(x[0].reshape(-1))
    assert torch.equal(aggregate(AggregationRule.mean(), [row], out=backing[6:]).tensor, x[0].reshape(-1))
    # ... on either side: an input right after the output's last float32 is no overlap either.
    backing = torch.zeros(12)
    row = backing[6:]
    row.copy_(x[1].reshape(-1))
    assert torch.equal(aggregate(AggregationRule.mean(), [row], out=backing[:6]).tensor, x[1].reshape(-1))


def test_invalid_shape_mismatch() -> None:
    with pytest.raises(AggregationError, match="shape"):
        aggregate(AggregationRule.mean(), [torch.zeros(3), torch.zeros(4)])
    with pytest.raises(AggregationError, match="shape"):
        aggregate(AggregationRule.mean(), [torch.zeros(2, 3), torch.zeros(3, 2)])


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.bool, torch.complex64])
def test_invalid_dtype(dtype: torch.dtype) -> None:
    with pytest.raises(AggregationError, match="dtype"):
        aggregate(AggregationRule.mean(), [torch.zeros(3, dtype=dtype)] * 2)


def test_invalid_sparse_input() -> None:
    # float32 on the CPU, so only the layout check can refuse it.
    with pytest.raises(AggregationError, match="dense"):
        aggregate(AggregationRule.mean(), [torch.zeros(3).to_sparse(), torch.zeros(3).to_sparse()])
    with pytest.raises(AggregationError, match="dense"):
        aggregate(AggregationRule.mean(), [torch.zeros(3), torch.zeros(3).to_sparse()])


def test_invalid_non_cpu_input() -> None:
    # The "meta" device exists in every torch build (no accelerator needed).
    with pytest.raises(AggregationError, match="CPU"):
        aggregate(AggregationRule.mean(), [torch.zeros(3, device="meta")] * 2)
    with pytest.raises(AggregationError, match="input 1 is on meta"):
        aggregate(AggregationRule.coordinate_median(), [torch.zeros(3), torch.zeros(3, device="meta")])


def test_invalid_input_containers() -> None:
    with pytest.raises(AggregationError):
        aggregate(AggregationRule.mean(), [torch.zeros(3), [1.0, 2.0, 3.0]])  # type: ignore[list-item]
    with pytest.raises(AggregationError):
        aggregate(AggregationRule.mean(), torch.tensor(1.0))
    with pytest.raises(AggregationError):
        aggregate(AggregationRule.mean(), "abc")  # type: ignore[arg-type]
    with pytest.raises(AggregationError):
        aggregate("Mean", [torch.zeros(3)])  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_invalid_non_finite_input(bad: float, dtype: torch.dtype) -> None:
    x = torch.zeros(5, 10, dtype=dtype)
    x[3, 7] = bad
    for rule in (AggregationRule.mean(), AggregationRule.coordinate_median(), AggregationRule.krum(1)):
        with pytest.raises(NonFiniteInputError) as err:
            aggregate(rule, x)
        assert err.value.index == 3


def test_large_finite_bfloat16_is_not_mistaken_for_inf() -> None:
    big = torch.finfo(torch.bfloat16).max
    x = torch.full((3, 4), big, dtype=torch.bfloat16)
    out = aggregate(AggregationRule.coordinate_median(), x).tensor
    assert out.tolist() == [float(big)] * 4


def test_invalid_rule_does_not_fit_k() -> None:
    with pytest.raises(AggregationError, match="TrimmedMean"):
        aggregate(AggregationRule.trimmed_mean(5000), torch.zeros(2, 3))
    with pytest.raises(AggregationError, match="Krum"):
        aggregate(AggregationRule.krum(1), torch.zeros(4, 3))
    with pytest.raises(AggregationError, match="Krum"):
        aggregate(AggregationRule.krum(0), torch.zeros(2, 3))


@pytest.mark.parametrize("m", [0, 5, -1, True, 1.0])
def test_invalid_multi_krum_m(m: object) -> None:
    with pytest.raises(AggregationError, match="multi_krum_m"):
        aggregate(AggregationRule.krum(1), torch.zeros(5, 3), multi_krum_m=m)  # type: ignore[arg-type]


def test_invalid_multi_krum_m_for_other_rules() -> None:
    with pytest.raises(AggregationError, match="Krum only"):
        aggregate(AggregationRule.mean(), torch.zeros(5, 3), multi_krum_m=2)


def test_invalid_mean_overflow_is_reported() -> None:
    big = torch.finfo(torch.float32).max
    with pytest.raises(AggregationOverflowError):
        aggregate(AggregationRule.mean(), torch.full((3, 2), big))
    # The same inputs have a finite median.
    assert aggregate(AggregationRule.coordinate_median(), torch.full((3, 2), big)).tensor.tolist() == [big, big]


def test_median_midpoint_rounding_to_zero_is_plus_zero() -> None:
    """Regression (found by hypothesis): the midpoint of -min_subnormal and -0.0 rounds to -0.0
    in float32; the pinned result is +0.0, so the sign fix must come after the final rounding."""
    tiny = float(np.float32(-1.401298464324817e-45))
    x = torch.full((8, 3), -2.0)
    x[:, 1] = torch.tensor([-2.0, -2.0, -2.0, tiny, -0.0, -0.0, -0.0, -0.0])
    out = aggregate(AggregationRule.coordinate_median(), x).tensor
    assert out[1].item() == 0.0 and not bool(torch.signbit(out[1]))
    ref = ref_median([to_numpy32(row) for row in x])
    assert np.array_equal(out.numpy().view(np.int32), ref.view(np.int32))


def test_trimmed_mean_keeping_one_value_returns_it_widened_with_positive_zero() -> None:
    """K - 2t = 1 (alpha 5000 bps, K odd): docs/aggregation.md says the result is the one kept
    value, widened to float32, plus +0.0; no division rounds it."""
    x = torch.tensor([[3.0, -0.0, 1e-3], [1.0, -0.0, 3e-3], [2.0, -0.0, 2e-3]], dtype=torch.float16)
    out = aggregate(AggregationRule.trimmed_mean(5000), x).tensor
    assert out.dtype == torch.float32
    assert out.tolist() == [2.0, 0.0, float(torch.tensor(2e-3, dtype=torch.float16))]
    assert math.copysign(1.0, float(out[1])) == 1.0
