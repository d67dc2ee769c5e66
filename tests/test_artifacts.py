"""tenzro_training/artifacts.py: which payloads and models a node publishes, on runs driven
through the pure transitions (tests/test_run.py's Env)."""

from __future__ import annotations

import pytest

from tenzro_training.addresses import format_address
from tenzro_training.artifacts import is_payload_pruned, validate_model_request, validate_payload_request
from tenzro_training.errors import InvalidState, PayloadNotPublic, PayloadUnavailable
from tests.test_run import GRACE_MS, TRAINERS, Env


def committed_round_then_open() -> Env:
    """Round 0 committed (trainers 0-2 in both fragments), round 1 open with trainer 0's
    fragment 0 accepted."""
    env = Env()
    env.to_training()
    for i, now in enumerate((300, 310, 320)):
        for f in (0, 1):
            env.submit(i, f, now + f)
    env.finalize(400)
    env.submit(0, 0, 500)
    return env


def test_a_committed_rounds_accepted_payloads_are_public() -> None:
    env = committed_round_then_open()
    assert env.run is not None
    for i in range(3):
        for f in (0, 1):
            validate_payload_request(env.run, 0, f, TRAINERS[i])


@pytest.mark.parametrize(("round_", "fragment", "trainer", "reason"), [
    (1, 0, 0, "the round is not committed"),  # accepted in the open round: never served
    (2, 0, 0, "the round is not committed"),
    (2**64 - 1, 0, 0, "the round is not committed"),
    (-1, 0, 0, "the round is not committed"),  # never the last record, as a Python index would
    (0, 2, 0, "the run has 2 fragments"),
    (0, -1, 0, "the run has 2 fragments"),
    (0, 0, 3, "the round did not aggregate this trainer's payload"),
])
def test_invalid_payload_requests(round_: int, fragment: int, trainer: int, reason: str) -> None:
    env = committed_round_then_open()
    assert env.run is not None
    with pytest.raises(PayloadNotPublic) as info:
        validate_payload_request(env.run, round_, fragment, TRAINERS[trainer])
    assert isinstance(info.value, PayloadUnavailable)  # code 1312
    assert (info.value.round, info.value.fragment, info.value.reason) == (round_, fragment, reason)
    assert info.value.task_id == env.run.task_id


def test_a_refusal_names_the_trainer_as_an_address() -> None:
    env = committed_round_then_open()
    assert env.run is not None
    with pytest.raises(PayloadNotPublic) as info:
        validate_payload_request(env.run, 1, 0, TRAINERS[0])
    assert info.value.trainer == format_address(TRAINERS[0])  # EIP-55
    with pytest.raises(PayloadNotPublic) as info:
        validate_payload_request(env.run, 0, 0, b"\xab" * 19)  # not an address: hex as given
    assert info.value.trainer == "0x" + "ab" * 19


def test_a_trainer_a_later_round_left_out_is_public_only_where_accepted() -> None:
    """Round 1 aggregates trainers 0 and 1 only: trainer 2's round-0 payloads stay public, it
    has none in round 1."""
    env = committed_round_then_open()
    env.submit(1, 0, 510)
    env.submit(0, 1, 520)
    env.submit(1, 1, 530)  # quorum (K=2 in each fragment): the straggler window opens
    env.finalize(530 + GRACE_MS + 1)
    assert env.run is not None
    validate_model_request(env.run)  # sealed
    validate_payload_request(env.run, 0, 1, TRAINERS[2])
    validate_payload_request(env.run, 1, 1, TRAINERS[1])
    with pytest.raises(PayloadNotPublic):
        validate_payload_request(env.run, 1, 1, TRAINERS[2])


def test_only_a_sealed_run_has_a_model() -> None:
    env = committed_round_then_open()
    assert env.run is not None
    with pytest.raises(InvalidState) as info:
        validate_model_request(env.run)
    assert info.value.status == "Training"


def test_is_payload_pruned() -> None:
    assert not is_payload_pruned(None, 0)
    assert is_payload_pruned(3, 2) and not is_payload_pruned(3, 3)
    assert is_payload_pruned(2**64 - 1, 2**32)
    assert not is_payload_pruned(0, 0)
