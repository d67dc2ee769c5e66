"""Which run artifacts a node publishes: the rules behind ``/artifacts/v1`` (docs/rpc.md "Run
artifacts over HTTP"), as pure functions of a run's state.

What this module is: :func:`validate_payload_request` (is the payload of ``(round, fragment,
trainer)`` public: a committed round whose record accepted that trainer for that fragment),
:func:`validate_model_request` (only a Sealed run has a final model) and
:func:`is_payload_pruned` (did the node's pruning record delete a round's payloads).

What it is NOT: reading the store or files (``node/artifacts.py``) or HTTP (``rpc/artifacts.py``).
A third party can apply the same rules to a getRun view: they say which bytes a node is
obliged to serve for a run to be recomputable from its URL alone.

Why open rounds are never served: until a round's record is committed, its accepted payloads
are the answers of trainers still competing for the round's reward; serving them would let a
trainer submit a copy of another's outer gradient (or a blend of them) without training. Once
the record is committed, the accepted set is closed and the payloads are the public inputs of a
public aggregate.
"""

from __future__ import annotations

from tenzro_training.addresses import format_address
from tenzro_training.errors import InvalidState, PayloadNotPublic
from tenzro_training.run_state import RunState, RunStatus

__all__ = ["is_payload_pruned", "validate_model_request", "validate_payload_request"]


def validate_payload_request(run: RunState, round: int, fragment: int, trainer: bytes) -> None:
    """PayloadNotPublic unless ``round`` is committed (``round < len(run.records)``),
    ``fragment`` is one of its fragments and ``trainer`` (20 bytes) is in that fragment's
    ``accepted``. Submissions a round refused, or that came after its accepted set closed, are
    not inputs of any aggregate and are not served either."""
    who = format_address(trainer) if len(trainer) == 20 else "0x" + trainer.hex()
    if not 0 <= round < len(run.records):
        raise PayloadNotPublic(run.task_id, round, fragment, who, "the round is not committed")
    record = run.records[round]
    if not 0 <= fragment < len(record.fragments):
        raise PayloadNotPublic(run.task_id, round, fragment, who,
                               f"the run has {len(record.fragments)} fragments")
    if trainer not in record.fragments[fragment].accepted:
        raise PayloadNotPublic(run.task_id, round, fragment, who, "the round did not aggregate this trainer's payload")


def validate_model_request(run: RunState) -> None:
    """InvalidState unless the run is Sealed: before, there is no final model; a Cancelled or
    Failed run never has one."""
    if run.status is not RunStatus.SEALED:
        raise InvalidState(run.task_id, run.status.value, "serve the final model")


def is_payload_pruned(pruned_before: int | None, round: int) -> bool:
    """Whether the payloads of ``round`` were deleted on purpose, given the run's pruning record
    (``schema.payloads_pruned_key``: the payloads of rounds before this count were deleted;
    2^64 - 1 once all were; None when the node never pruned the run)."""
    return pruned_before is not None and round < pruned_before
