"""Runs under each Byzantine-robust rule produce the documented FragmentOutcome fields.

M = K = 3 (Krum needs K > 2f + 2). Per fragment the outcome is compared with the aggregation
module applied directly to the same gradients in canonical (address) order: aggregate hash,
``selected`` (Krum's index, else 0), ``trimmed`` (TrimmedMean's per-side count, else 0) and the
report hash; the stored full report (Krum scores included) hashes to the outcome's report hash.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tenzro_training.aggregation import aggregate
from tenzro_training.fragments import compute_aggregate_hash
from tenzro_training.rules import AggregationRule

from tests.node.conftest import TRAINERS, Net, gradient, layouts_for, make_payload, spec_dict
from tests.node.test_service import canonical

OUTLIER = canonical((0, 1, 2))[0]  # canonical index 0 sends a gradient 50x too large


def grad(i: int, round_: int, fragment: int) -> torch.Tensor:
    g = gradient(i, round_, fragment, layouts_for()[fragment].numel)
    return g * 50 if i == OUTLIER else g


def play_round(net: Net, round_: int) -> dict[str, Any]:
    for i in range(3):
        for f, lay in enumerate(layouts_for()):
            net.submit(i, round_, f, payload=make_payload(net.task_id, round_, lay, grad(i, round_, f)))
    return net.finalize(round_)


def expected_outcome(rule: AggregationRule, round_: int, fragment: int) -> dict[str, Any]:
    lay = layouts_for()[fragment]
    order = canonical((0, 1, 2))
    result = aggregate(rule, [grad(i, round_, fragment) for i in order])
    report = result.report
    return {
        "aggregate_hash": "0x" + compute_aggregate_hash(lay, result.tensor).hex(),
        "accepted": [TRAINERS[i].text for i in order],
        "selected": report.selected if report.selected is not None else 0,
        "trimmed": report.trimmed_per_side,
        "report_hash": "0x" + report.report_hash().hex(),
    }


@pytest.mark.parametrize(
    ("aggregation", "trimmed"),
    [({"Krum": {"f": 0}}, 0), ("CoordinateMedian", 0), ({"TrimmedMean": {"alpha_bps": 5000}}, 1), ("Mean", 0)],
)
def test_rule_outcomes(net: Net, checkpoint: tuple[str, str], aggregation: Any, trimmed: int) -> None:
    spec = spec_dict(*checkpoint, aggregation=aggregation, quorum=3)
    rule = AggregationRule.from_spec(aggregation)
    net.post(spec)
    net.elect()
    for i in range(3):
        net.enroll(i)
    for round_ in range(2):
        result = play_round(net, round_)
        for fragment, outcome in enumerate(result["fragments"]):
            assert outcome == expected_outcome(rule, round_, fragment)
            assert outcome["trimmed"] == trimmed
        reports = net.service.get_round_reports(net.task_id, round_)
        assert [f["report_hash"] for f in reports["fragments"]] == [o["report_hash"] for o in result["fragments"]]
        for fragment, entry in enumerate(reports["fragments"]):
            report = entry["report"]
            assert report["k"] == 3 and report["trimmed_per_side"] == trimmed
            if "Krum" in str(aggregation):
                assert len(report["scores"]) == 3
                assert report["selected"] != 0  # never the outlier
                assert report["selected"] == result["fragments"][fragment]["selected"]
            else:
                assert report["scores"] is None and report["selected"] is None
    run = net.service.get_run(net.task_id)
    assert run["status"] == "Sealed"
    assert [r["rule_param"] for r in run["round_records"]] == [rule.param, rule.param]


def test_invalid_round_reports_request(net: Net, checkpoint: tuple[str, str]) -> None:
    from tenzro_training.run import InvalidRunArgument

    net.post(spec_dict(*checkpoint))
    with pytest.raises(InvalidRunArgument):
        net.service.get_round_reports(net.task_id, 0)
