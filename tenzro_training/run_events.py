"""The events a run lifecycle transition emits: small frozen values for the node to log and gossip.

What this module is: one dataclass per thing that can happen to a run (posted, election opened,
ticket accepted, syncer elected, trainer enrolled, training/round started, submission accepted,
quorum reached/lost, equivocation detected, trainer slashed, syncer failover, round finalized,
run sealed/cancelled/failed), each with ``task_id``, ``at_ms`` and the facts a listener needs,
and a uniform ``to_dict()`` JSON form ``{"type": <class name>, ...}``.

What it is NOT: state (events are derived, never read back by the lifecycle; ``run_state``
holds the state) and not the rules (``run.py`` decides when each is emitted). No I/O.
``tenzro_training.run`` re-exports every name here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tenzro_training.addresses import Address, format_address

__all__ = [
    "RunEvent",
    "RunPosted",
    "ElectionOpened",
    "TicketAccepted",
    "SyncerElected",
    "TrainerEnrolled",
    "TrainingStarted",
    "RoundStarted",
    "SubmissionAccepted",
    "QuorumReached",
    "QuorumLost",
    "EquivocationDetected",
    "TrainerSlashed",
    "SyncerFailover",
    "DeadlinesExtended",
    "RoundFinalized",
    "RunSealed",
    "RunCancelled",
    "RunFailed",
]


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return format_address(value) if len(value) == 20 else "0x" + value.hex()
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        # JSON numbers above 2^53 lose precision in many readers: amounts travel as strings.
        return value if abs(value) < 2**53 else str(value)
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    raise TypeError(f"unexpected event field type {type(value).__name__}")  # a bug, not input


@dataclass(frozen=True, slots=True)
class RunEvent:
    """Something that happened to a run, for the node to log and gossip. Not part of the state."""

    task_id: str
    at_ms: int
    """The instant it happened (a deadline for time-driven events)."""

    def to_dict(self) -> dict[str, Any]:
        """``{"type": <class name>, <field>: <JSON value>, ...}`` (20-byte values as EIP-55)."""
        out: dict[str, Any] = {"type": type(self).__name__}
        for f in dataclasses.fields(self):
            out[f.name] = _json_value(getattr(self, f.name))
        return out


@dataclass(frozen=True, slots=True)
class RunPosted(RunEvent):
    sponsor: Address
    spec_hash: bytes
    reward_pool: int


@dataclass(frozen=True, slots=True)
class ElectionOpened(RunEvent):
    """The node should now ticket its own syncer identities over ``seed``."""

    seed: bytes
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class TicketAccepted(RunEvent):
    candidate: Address
    stake: int


@dataclass(frozen=True, slots=True)
class SyncerElected(RunEvent):
    syncer: Address
    ranked: int
    """How many candidates are ranked (1 + possible failovers)."""
    enrollment_deadline_ms: int


@dataclass(frozen=True, slots=True)
class TrainerEnrolled(RunEvent):
    trainer: Address
    did: str
    stake: int
    shard_index: int


@dataclass(frozen=True, slots=True)
class TrainingStarted(RunEvent):
    trainers: tuple[Address, ...]
    """Enrolled trainers; a trainer's position is its shard index."""


@dataclass(frozen=True, slots=True)
class RoundStarted(RunEvent):
    round: int
    round_deadline_ms: int
    model_hash: bytes
    """The global model every trainer starts this round from."""


@dataclass(frozen=True, slots=True)
class SubmissionAccepted(RunEvent):
    round: int
    fragment: int
    trainer: Address
    payload_hash: bytes


@dataclass(frozen=True, slots=True)
class QuorumReached(RunEvent):
    round: int
    straggler_deadline_ms: int
    finalize_deadline_ms: int


@dataclass(frozen=True, slots=True)
class QuorumLost(RunEvent):
    """A slashed trainer's submissions were dropped and some fragment fell below K again."""

    round: int


@dataclass(frozen=True, slots=True)
class EquivocationDetected(RunEvent):
    """Evidence: one trainer, one (round, fragment), two payload hashes. The shell stores both
    signed messages under this key."""

    round: int
    fragment: int
    trainer: Address
    first_payload_hash: bytes
    second_payload_hash: bytes
    slashed_in_round: int
    """The round that was current when the slashing took effect: ``round`` itself, or a later
    one when the evidence names a round already finalized (receipt_check's ``slashings`` check
    needs it: the trainer stays accepted in the rounds committed before it)."""


@dataclass(frozen=True, slots=True)
class TrainerSlashed(RunEvent):
    trainer: Address
    amount: int
    """attoTNZO burned."""


@dataclass(frozen=True, slots=True)
class SyncerFailover(RunEvent):
    round: int
    from_syncer: Address
    from_rank: int
    to_syncer: Address
    to_rank: int
    finalize_deadline_ms: int
    """The new syncer's deadline."""


@dataclass(frozen=True, slots=True)
class DeadlinesExtended(RunEvent):
    """The node could not serve calls from ``paused_at_ms`` to ``at_ms`` (down, restarting,
    stalled): every deadline of the run still pending at ``paused_at_ms`` moved ``by_ms`` later."""

    paused_at_ms: int
    by_ms: int


@dataclass(frozen=True, slots=True)
class RoundFinalized(RunEvent):
    round: int
    syncer: Address
    syncer_rank: int
    model_hash: bytes


@dataclass(frozen=True, slots=True)
class RunSealed(RunEvent):
    run_root: bytes
    final_model_hash: bytes
    payouts: tuple[tuple[Address, int], ...]
    """(trainer, attoTNZO) ascending by address; unslashed trainers only."""
    remainder: int
    """What went back to the sponsor (rounding remainder, or the pool if nothing was accepted)."""


@dataclass(frozen=True, slots=True)
class RunCancelled(RunEvent):
    pass


@dataclass(frozen=True, slots=True)
class RunFailed(RunEvent):
    reason: str
