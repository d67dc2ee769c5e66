"""Tests for tenzro_training.rules: the aggregation-rule value, its JSON forms, its K arithmetic."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenzro_training.errors import AggregationError, SpecError
from tenzro_training.rules import MAX_ALPHA_BPS, MAX_JSON_SAFE_INT, AggregationRule, RuleKind

# --- values and JSON forms ----------------------------------------------------------------


def test_wire_codes_are_pinned() -> None:
    # These integers are written into round records and receipts: never renumber them.
    assert [(k.name, int(k)) for k in RuleKind] == [
        ("MEAN", 0),
        ("TRIMMED_MEAN", 1),
        ("COORDINATE_MEDIAN", 2),
        ("KRUM", 3),
    ]
    assert [k.spec_name for k in RuleKind] == ["Mean", "TrimmedMean", "CoordinateMedian", "Krum"]


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("Mean", AggregationRule.mean()),
        ({"TrimmedMean": {"alpha_bps": 2000}}, AggregationRule.trimmed_mean(2000)),
        ("CoordinateMedian", AggregationRule.coordinate_median()),
        ({"Krum": {"f": 1}}, AggregationRule.krum(1)),
        ({"TrimmedMean": {"alpha_bps": 0}}, AggregationRule(RuleKind.TRIMMED_MEAN, 0)),
        ({"TrimmedMean": {"alpha_bps": 10000}}, AggregationRule(RuleKind.TRIMMED_MEAN, 10000)),
        ({"Krum": {"f": 0}}, AggregationRule(RuleKind.KRUM, 0)),
    ],
)
def test_from_spec_and_back(value: object, rule: AggregationRule) -> None:
    parsed = AggregationRule.from_spec(value)
    assert parsed == rule
    assert parsed.to_spec() == value
    assert AggregationRule.from_spec(parsed.to_spec()) == parsed


def test_convenience_constructors() -> None:
    assert AggregationRule.mean() == AggregationRule(RuleKind.MEAN, 0)
    assert AggregationRule.trimmed_mean(1500) == AggregationRule(RuleKind.TRIMMED_MEAN, 1500)
    assert AggregationRule.coordinate_median() == AggregationRule(RuleKind.COORDINATE_MEDIAN, 0)
    assert AggregationRule.krum(2) == AggregationRule(RuleKind.KRUM, 2)


def test_wire_code_is_coerced_to_enum() -> None:
    rule = AggregationRule(1, 2500)  # type: ignore[arg-type]
    assert rule.kind is RuleKind.TRIMMED_MEAN
    assert rule == AggregationRule.trimmed_mean(2500)


def test_rule_is_frozen_and_hashable() -> None:
    rule = AggregationRule.krum(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.param = 2  # type: ignore[misc]
    assert {rule, AggregationRule.krum(1), AggregationRule.krum(2)} == {
        AggregationRule.krum(1),
        AggregationRule.krum(2),
    }


def test_to_spec_returns_fresh_object() -> None:
    rule = AggregationRule.trimmed_mean(100)
    first = rule.to_spec()
    assert isinstance(first, dict)
    first["TrimmedMean"]["alpha_bps"] = 9
    assert rule.to_spec() == {"TrimmedMean": {"alpha_bps": 100}}


# --- arithmetic against K ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alpha_bps", "k", "t"),
    [
        (2000, 6, 1),  # 1.2 -> 1
        (2500, 10, 2),  # 2.5 -> 2
        (3333, 3, 0),  # 0.9999 -> 0
        (3334, 3, 1),  # 1.0002 -> 1
        (5000, 7, 3),
        (0, 100, 0),
        (10000, 4, 4),
    ],
)
def test_trimmed_per_side_is_floor(alpha_bps: int, k: int, t: int) -> None:
    assert AggregationRule.trimmed_mean(alpha_bps).trimmed_per_side(k) == t


def test_trimmed_per_side_and_neighbours_are_zero_for_other_rules() -> None:
    for rule in (AggregationRule.mean(), AggregationRule.coordinate_median()):
        assert rule.trimmed_per_side(6) == 0
        assert rule.neighbours(6) == 0
    assert AggregationRule.krum(1).trimmed_per_side(6) == 0
    assert AggregationRule.trimmed_mean(2000).neighbours(6) == 0


def test_krum_neighbours() -> None:
    assert AggregationRule.krum(1).neighbours(5) == 2
    assert AggregationRule.krum(0).neighbours(3) == 1
    assert AggregationRule.krum(2).neighbours(10) == 6


def test_valid_quorum_fits() -> None:
    AggregationRule.mean().validate_for_quorum(1)
    AggregationRule.coordinate_median().validate_for_quorum(1)
    AggregationRule.trimmed_mean(9999).validate_for_quorum(1)  # t = 0, one value left
    AggregationRule.trimmed_mean(3000).validate_for_quorum(6)  # t = 1, four left
    AggregationRule.trimmed_mean(4999).validate_for_quorum(2)  # t = 0
    AggregationRule.krum(1).validate_for_quorum(5)
    AggregationRule.krum(0).validate_for_quorum(3)
    assert AggregationRule.krum(1).is_valid_for_quorum(5)


def test_invalid_trimmed_mean_trims_everything() -> None:
    with pytest.raises(AggregationError, match="K - 2t >= 1"):
        AggregationRule.trimmed_mean(5000).validate_for_quorum(2)
    with pytest.raises(AggregationError):
        AggregationRule.trimmed_mean(5000).validate_for_quorum(6)
    for k in (1, 2, 7, 100):
        assert not AggregationRule.trimmed_mean(10000).is_valid_for_quorum(k)


def _valid_for_every_count_brute_force(rule: AggregationRule, k: int, m: int) -> bool:
    return all(rule.is_valid_for_quorum(n) for n in range(k, m + 1))


def test_accepted_counts_agree_with_checking_every_count() -> None:
    """The two-count shortcut gives the brute-force answer over every count K..M."""
    rules = [AggregationRule.mean(), AggregationRule.coordinate_median()]
    rules += [AggregationRule.trimmed_mean(a) for a in (0, 1, 2500, 3333, 4999, 5000, 5001, 6666, 6667, 9999, 10000)]
    rules += [AggregationRule.krum(f) for f in (0, 1, 3)]
    for rule in rules:
        for k in range(1, 14):
            for m in range(k, 16):
                expected = _valid_for_every_count_brute_force(rule, k, m)
                try:
                    rule.validate_for_accepted_counts(k, m)
                    got = True
                except AggregationError:
                    got = False
                assert got == expected, (rule, k, m)


def test_invalid_trimmed_mean_at_a_straggler_count() -> None:
    """Valid at K = 3 (one value left) but not at 4 stragglers-included inputs (none left)."""
    rule = AggregationRule.trimmed_mean(5000)
    rule.validate_for_quorum(3)
    rule.validate_for_accepted_counts(3, 3)
    with pytest.raises(AggregationError, match="K=4"):
        rule.validate_for_accepted_counts(3, 4)
    AggregationRule.trimmed_mean(4999).validate_for_accepted_counts(1, 10**9)  # never trims all


def test_invalid_krum_quorum_too_small() -> None:
    with pytest.raises(AggregationError, match="K > 2f \\+ 2"):
        AggregationRule.krum(1).validate_for_quorum(4)
    with pytest.raises(AggregationError):
        AggregationRule.krum(0).validate_for_quorum(2)
    with pytest.raises(AggregationError):
        AggregationRule.krum(1).neighbours(4)
    assert not AggregationRule.krum(2).is_valid_for_quorum(6)


@pytest.mark.parametrize("k", [0, -1, True, 1.0, "6", None])
def test_invalid_quorum_value(k: object) -> None:
    rule = AggregationRule.mean()
    with pytest.raises(AggregationError):
        rule.validate_for_quorum(k)  # type: ignore[arg-type]
    with pytest.raises(AggregationError):
        rule.trimmed_per_side(k)  # type: ignore[arg-type]
    with pytest.raises(AggregationError):
        rule.neighbours(k)  # type: ignore[arg-type]


def test_from_spec_checks_quorum_when_given() -> None:
    assert AggregationRule.from_spec({"Krum": {"f": 1}}, quorum=6) == AggregationRule.krum(1)
    with pytest.raises(SpecError) as err:
        AggregationRule.from_spec({"Krum": {"f": 2}}, quorum=6)
    assert err.value.path == "aggregation"
    with pytest.raises(SpecError) as err:
        AggregationRule.from_spec({"TrimmedMean": {"alpha_bps": 5000}}, quorum=6)
    assert err.value.path == "aggregation"
    # Without a quorum only the rule's own shape is checked.
    assert AggregationRule.from_spec({"Krum": {"f": 2}}) == AggregationRule.krum(2)


def test_invalid_from_spec_quorum_zero() -> None:
    with pytest.raises(SpecError) as err:
        AggregationRule.from_spec("Mean", quorum=0)
    assert err.value.path == "aggregation"


# --- invalid JSON forms ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ("Median", "aggregation"),
        ("mean", "aggregation"),
        ("", "aggregation"),
        ("TrimmedMean", "aggregation"),  # needs its parameter
        ("Krum", "aggregation"),
        ({"Mean": {}}, "aggregation"),  # one JSON form per rule
        ({"CoordinateMedian": None}, "aggregation"),
        ({}, "aggregation"),
        ({"Krum": {"f": 1}, "Mean": None}, "aggregation"),
        ({"Bulyan": {"f": 1}}, "aggregation"),
        (None, "aggregation"),
        (0, "aggregation"),
        (["Mean"], "aggregation"),
        (True, "aggregation"),
        ({"TrimmedMean": 2000}, "aggregation.TrimmedMean"),
        ({"Krum": [1]}, "aggregation.Krum"),
        ({"TrimmedMean": {}}, "aggregation.TrimmedMean.alpha_bps"),
        ({"TrimmedMean": {"alpha_bps": 10, "beta": 1}}, "aggregation.TrimmedMean.beta"),
        ({"TrimmedMean": {"f": 1}}, "aggregation.TrimmedMean.f"),
        ({"Krum": {"alpha_bps": 1}}, "aggregation.Krum.alpha_bps"),
        ({"Krum": {}}, "aggregation.Krum.f"),
    ],
)
def test_invalid_rule_shape(value: object, path: str) -> None:
    with pytest.raises(SpecError) as err:
        AggregationRule.from_spec(value)
    assert err.value.path == path


@pytest.mark.parametrize("bad", [1.5, 2000.0, "2000", True, False, None, -1, 10001, [1]])
def test_invalid_alpha_bps(bad: object) -> None:
    with pytest.raises(SpecError) as err:
        AggregationRule.from_spec({"TrimmedMean": {"alpha_bps": bad}})
    assert err.value.path == "aggregation.TrimmedMean.alpha_bps"


@pytest.mark.parametrize("bad", [1.0, "1", True, None, -1, MAX_JSON_SAFE_INT + 1])
def test_invalid_krum_f(bad: object) -> None:
    with pytest.raises(SpecError) as err:
        AggregationRule.from_spec({"Krum": {"f": bad}})
    assert err.value.path == "aggregation.Krum.f"


def test_krum_f_bound_is_the_largest_json_safe_integer() -> None:
    # RFC 8785 writes numbers as doubles: 2**53 - 1 round-trips through the spec JSON, 2**53
    # would not. Literal values, so the bound itself is pinned (not only "the constant + 1").
    assert MAX_JSON_SAFE_INT == 2**53 - 1
    assert AggregationRule.from_spec({"Krum": {"f": 2**53 - 1}}) == AggregationRule.krum(2**53 - 1)
    for bad in (2**53, 2**53 + 1):
        with pytest.raises(SpecError) as err:
            AggregationRule.from_spec({"Krum": {"f": bad}})
        assert err.value.path == "aggregation.Krum.f"
        with pytest.raises(AggregationError):
            AggregationRule.krum(bad)


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (None, "null"),
        (True, "boolean"),
        (2.5, "number 2.5"),
        (7, "number 7"),
        ([], "array"),
        ({"Mean": 1, "Krum": 2}, "2 keys"),
        (b"Mean", "bytes"),  # not a JSON value at all: its Python type name
    ],
)
def test_invalid_rule_error_names_the_json_type(value: object, named: str) -> None:
    # The message is what a sponsor reads: it names the JSON type it got, not a Python repr.
    with pytest.raises(SpecError) as err:
        AggregationRule.from_spec(value)
    assert err.value.path == "aggregation"
    assert f"got {named}" in str(err.value)


@pytest.mark.parametrize(("body", "named"), [(None, "null"), ([1], "array"), ("f", "string")])
def test_invalid_rule_body_error_names_the_json_type(body: object, named: str) -> None:
    with pytest.raises(SpecError) as err:
        AggregationRule.from_spec({"Krum": body})
    assert err.value.path == "aggregation.Krum"
    assert f"got {named}" in str(err.value)


@pytest.mark.parametrize(
    ("kind", "param"),
    [
        (RuleKind.MEAN, 1),
        (RuleKind.COORDINATE_MEDIAN, -1),
        (RuleKind.TRIMMED_MEAN, MAX_ALPHA_BPS + 1),
        (RuleKind.TRIMMED_MEAN, -1),
        (RuleKind.KRUM, -1),
        (RuleKind.KRUM, True),
        (RuleKind.KRUM, 1.0),
        (4, 0),
        (-1, 0),
        (True, 0),
        ("Mean", 0),
    ],
)
def test_invalid_direct_construction(kind: object, param: object) -> None:
    with pytest.raises(AggregationError):
        AggregationRule(kind, param)  # type: ignore[arg-type]


# --- properties ------------------------------------------------------------------------------

_rules = st.one_of(
    st.just(AggregationRule.mean()),
    st.just(AggregationRule.coordinate_median()),
    st.integers(0, MAX_ALPHA_BPS).map(AggregationRule.trimmed_mean),
    st.integers(0, 1000).map(AggregationRule.krum),
)


@given(_rules)
def test_property_spec_form_round_trips(rule: AggregationRule) -> None:
    assert AggregationRule.from_spec(rule.to_spec()) == rule


@given(_rules, st.integers(1, 5000))
def test_property_quorum_check_matches_definition(rule: AggregationRule, k: int) -> None:
    if rule.kind is RuleKind.TRIMMED_MEAN:
        t = (k * rule.param) // 10000
        assert t * 10000 <= k * rule.param < (t + 1) * 10000
        expected = k - 2 * t >= 1
    elif rule.kind is RuleKind.KRUM:
        expected = k > 2 * rule.param + 2
    else:
        expected = True
    assert rule.is_valid_for_quorum(k) == expected
    if expected and rule.kind is RuleKind.KRUM:
        # Krum scores at least one neighbour and never more than the other K - 1 inputs.
        assert 1 <= rule.neighbours(k) <= k - 1
    if expected and rule.kind is RuleKind.TRIMMED_MEAN:
        assert k - 2 * rule.trimmed_per_side(k) >= 1


# --- Byzantine tolerance at a count -------------------------------------------------------


@pytest.mark.parametrize("rule, k, tolerated", [
    (AggregationRule.mean(), 8, 0),
    (AggregationRule.trimmed_mean(2000), 4, 0),  # the Byzantine probe's quorum: floor(0.8) = 0
    (AggregationRule.trimmed_mean(2000), 5, 1),
    (AggregationRule.trimmed_mean(1250), 8, 1),
    (AggregationRule.coordinate_median(), 1, 0),
    (AggregationRule.coordinate_median(), 2, 0),  # the median of two is their mean
    (AggregationRule.coordinate_median(), 3, 1),
    (AggregationRule.coordinate_median(), 4, 1),
    (AggregationRule.coordinate_median(), 5, 2),
    (AggregationRule.krum(1), 5, 1),
    (AggregationRule.krum(0), 3, 0),
])
def test_byzantine_tolerance(rule: AggregationRule, k: int, tolerated: int) -> None:
    assert rule.byzantine_tolerance(k) == tolerated


def test_invalid_byzantine_tolerance_where_the_rule_does_not_fit() -> None:
    with pytest.raises(AggregationError, match="Krum f=1 needs K > 2f \\+ 2"):
        AggregationRule.krum(1).byzantine_tolerance(4)


@settings(deadline=None)  # the first example imports torch
@given(st.sampled_from([AggregationRule.mean(), AggregationRule.coordinate_median()])
       | st.integers(0, 4999).map(AggregationRule.trimmed_mean), st.integers(1, 9), st.data())
def test_property_tolerance_is_what_the_coordinate_rules_withstand(rule: AggregationRule, k: int,
                                                                   data: st.DataObject) -> None:
    """``byzantine_tolerance(k)`` inputs at +1e30 leave the aggregate inside the honest values'
    range; one more takes it out (so the figure is exact, not just safe)."""
    import torch

    from tenzro_training.aggregation import aggregate

    if not rule.is_valid_for_quorum(k):
        return
    b = rule.byzantine_tolerance(k)
    honest = data.draw(st.lists(st.floats(-1, 1, width=32), min_size=k, max_size=k))
    for bad, inside in ((b, True), (b + 1, False)):
        if bad > k:
            continue
        values = torch.tensor(honest[: k - bad] + [1e30] * bad, dtype=torch.float32).reshape(k, 1)
        out = float(aggregate(rule, list(values)).tensor[0])
        within = min(honest[: k - bad], default=0.0) <= out <= max(honest[: k - bad], default=0.0)
        if inside:
            assert within, (rule, k, bad, honest, out)
        elif bad < k:  # all k Byzantine: nothing honest to stay near
            assert not within, (rule, k, bad, honest, out)


@given(st.integers(3, 10_000))
def test_property_the_suggested_alpha_trims_one_at_the_quorum(quorum: int) -> None:
    note = AggregationRule.trimmed_mean(0).describe_no_tolerance(quorum)
    assert note is not None
    least = int(note.split("alpha_bps >= ")[1].split()[0])
    assert AggregationRule.trimmed_mean(least).byzantine_tolerance(quorum) == 1
    assert AggregationRule.trimmed_mean(least - 1).byzantine_tolerance(quorum) == 0
    AggregationRule.trimmed_mean(least).validate_for_accepted_counts(quorum, quorum + 1)


def test_describe_no_tolerance() -> None:
    assert AggregationRule.coordinate_median().describe_no_tolerance(3) is None
    assert AggregationRule.krum(1).describe_no_tolerance(5) is None
    assert AggregationRule.trimmed_mean(2000).describe_no_tolerance(5) is None
    said = AggregationRule.trimmed_mean(2000).describe_no_tolerance(4)
    assert said is not None and "trims nothing" in said and "4 accepted payloads" in said
    assert "alpha_bps >= 2500" in said
    said = AggregationRule.trimmed_mean(1000).describe_no_tolerance(2)
    assert said is not None and "a quorum of 3 or more" in said
    said = AggregationRule.mean().describe_no_tolerance(8)
    assert said is not None and said.startswith("aggregation Mean tolerates no Byzantine trainer")
    said = AggregationRule.coordinate_median().describe_no_tolerance(2)
    assert said is not None and "over 2 accepted payload(s)" in said
    said = AggregationRule.krum(0).describe_no_tolerance(4)
    assert said is not None and "f=1 tolerates one" in said
