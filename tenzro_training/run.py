"""The run lifecycle: one pure transition function per rule, over (RunState, Ledger, now_ms).

What this module is: the state machine of SPEC.md "Roles and flow"::

    Posted -> Electing -> Enrolling -> Training(r = 0 .. max_rounds-1) -> Sealed
       \\________\\___________\\-> Cancelled (sponsor, before Training)
    Electing / Enrolling / Training -> Failed (nobody elected, < K trainers, round timeout,
                                              syncer ranking exhausted, < K unslashed trainers)

Every ``process_*`` function takes the current values and returns a :class:`Transition` (new run,
new ledger, the events it caused); inputs are never modified, and a rejected call raises a
:class:`~tenzro_training.errors.RunError` (or another TenzroError) and has no effect at all. The
shell stores ``run`` and the ledger changes in one atomic batch, then logs/gossips the events.

Time: every function takes ``now_ms`` explicitly; there is no clock here. Deadlines are inclusive
(a call at ``now_ms == deadline`` is in time) and a deadline fires once time is past it. Each
function first applies every deadline that is due, in order, each at its own instant (so the
outcome never depends on how often the shell ticks), then applies its rule. :func:`process_tick`
does only the first part; the shell calls it from a timer (see ``run_state.get_next_deadline_ms``)
because the deadline effects applied inside a rejected call are discarded with it. A ``now_ms``
earlier than the run's last transition is treated as that instant (clocks may step back).

Roles: the shell verifies each EIP-712 signature (``auth``) and passes the recovered signer; this
module checks that the signer holds the role the call needs (sponsor, enrolled trainer, current
syncer). docs/lifecycle.md lists every transition's preconditions, deadlines and rounding.

What it is NOT: no payload decoding, aggregation or model arithmetic (the shell computes the
FragmentOutcomes and the new model hash from ``get_accepted_submissions``), no storage, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from tenzro_training.addresses import Address, format_address
from tenzro_training.compression import PayloadEncoding
from tenzro_training.election import compute_election_seed, rank_candidates, validate_ticket
from tenzro_training.errors import (
    ElectionError,
    EncodingError,
    Equivocation,
    EnrollmentConflict,
    InvalidState,
    LateSubmission,
    NotEnrolled,
    QuorumNotReached,
    RoundMismatch,
    RunError,
    RunFull,
    SpecError,
    StakeTooLow,
    TaskExists,
    TooManyRuns,
)
from tenzro_training.ledger import (
    Ledger,
    bond_stake,
    compute_payouts,
    escrow_reward,
    refund_escrow,
    settle_run,
    slash_stake,
    unbond_stake,
)
from tenzro_training.merkle import run_root
from tenzro_training.outer import OuterConfig
from tenzro_training.records import (
    HASH_LENGTH,
    Candidate,
    FinalModelRecord,
    FragmentOutcome,
    RoundRecord,
    Ticket,
    compute_run_leaves,
)
from tenzro_training import run_events as _run_events
from tenzro_training.run_events import (
    DeadlinesExtended,
    ElectionOpened,
    EquivocationDetected,
    QuorumLost,
    QuorumReached,
    RoundFinalized,
    RoundStarted,
    RunCancelled,
    RunEvent,
    RunFailed,
    RunPosted,
    RunSealed,
    SubmissionAccepted,
    SyncerElected,
    SyncerFailover,
    TicketAccepted,
    TrainerEnrolled,
    TrainerSlashed,
    TrainingStarted,
)
from tenzro_training.receipt_abi import compute_receipt_size_bound
from tenzro_training.run_state import (
    DID_PATTERN,
    ElectionEntry,
    ElectionState,
    EnrolledTrainer,
    Failover,
    RoundState,
    RunState,
    RunStatus,
    RunTimings,
    Submission,
    compute_reward_weights,
    compute_run_view,
    get_accepted_submissions,
    get_current_syncer,
    get_next_deadline_ms,
    get_trainer,
    is_terminal,
)
from tenzro_training.spec import TrainingTaskSpec

__all__ = [
    # errors
    "InvalidRunArgument",
    "NotSponsor",
    "NotSyncer",
    "StragglerWindowOpen",
    # events (defined in run_events, re-exported)
    *_run_events.__all__,
    # state values and readers (defined in run_state, re-exported for the shell's convenience)
    "RunState",
    "RunStatus",
    "RunTimings",
    "compute_run_view",
    "get_accepted_submissions",
    # transitions
    "Transition",
    "process_post_task",
    "process_ticket",
    "process_tick",
    "process_pause",
    "process_enroll",
    "process_submission",
    "process_equivocation",
    "process_finalize",
    "process_cancel",
    "has_passed_uncommitted_deadline",
    "is_accepted_set_closed",
    "validate_open_runs",
]


# --- errors specific to the lifecycle ----------------------------------------------------------


class InvalidRunArgument(RunError):
    """A call's argument is malformed (wrong type/length, fragment out of range, bad DID,
    finalize outcomes that do not match the accepted submissions). ``field`` names it."""

    def __init__(self, task_id: str, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(task_id, f"{field}: {reason}")


class NotSponsor(RunError):
    """The signer is not the run's sponsor (postTask, cancel)."""

    def __init__(self, task_id: str, address: str, sponsor: str) -> None:
        self.address = address
        self.sponsor = sponsor
        super().__init__(task_id, f"{address} is not the sponsor {sponsor}")


class NotSyncer(RunError):
    """The signer is not the run's current syncer (finalizeRound). ``expected`` is, or None."""

    def __init__(self, task_id: str, address: str, expected: str | None) -> None:
        self.address = address
        self.expected = expected
        super().__init__(task_id, f"{address} is not the current syncer ({expected})")


class StragglerWindowOpen(RunError):
    """finalizeRound came after quorum but while stragglers may still be accepted."""

    def __init__(self, task_id: str, round_: int, straggler_deadline_ms: int) -> None:
        self.round = round_
        self.straggler_deadline_ms = straggler_deadline_ms
        super().__init__(
            task_id, f"round {round_}: the straggler window is open until {straggler_deadline_ms} ms"
        )


# --- the transition value -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Transition:
    """The result of one call: store ``run`` and ``ledger`` atomically, then publish ``events``.

    ``error`` is set only when the call WAS applied and must still be answered with an error:
    equivocation (the stake is slashed and the trainer excluded, so the new state must be stored,
    yet the submission itself is refused). Every other refusal raises instead.
    """

    run: RunState
    ledger: Ledger
    events: tuple[RunEvent, ...] = ()
    error: RunError | None = None


# --- argument checks ---------------------------------------------------------------------------


def _check_int(task_id: str, name: str, value: object, maximum: int = 2**63 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise InvalidRunArgument(task_id, name, f"expected an int in 0..{maximum}, got {value!r}")
    return value


def _check_bytes(task_id: str, name: str, value: object, length: int) -> bytes:
    if type(value) is not bytes or len(value) != length:
        raise InvalidRunArgument(task_id, name, f"expected {length} bytes, got {value!r}")
    return value


def _check_run(run: object, ledger: object) -> None:
    if not isinstance(run, RunState):
        raise InvalidRunArgument("?", "run", f"expected a RunState, got {type(run).__name__}")
    if not isinstance(ledger, Ledger):
        raise InvalidRunArgument(run.task_id, "ledger", f"expected a Ledger, got {type(ledger).__name__}")


def _effective_now(run: RunState, now_ms: object) -> int:
    now = _check_int(run.task_id, "now_ms", now_ms)
    return max(now, run.updated_at_ms)


def _addr(value: bytes) -> str:
    return format_address(value)


# --- building blocks (each returns new values) -------------------------------------------------

_Step = tuple[RunState, Ledger, list[RunEvent]]


def _end_refund(run: RunState, ledger: Ledger) -> Ledger:
    """Return the escrow to the sponsor and every remaining bond to its trainer."""
    ledger = refund_escrow(ledger, run.task_id)
    for trainer in run.trainers:
        if ledger.bond_of(run.task_id, trainer.address) is not None:
            ledger = unbond_stake(ledger, run.task_id, trainer.address)
    return ledger


def _fail(run: RunState, ledger: Ledger, at: int, reason: str) -> _Step:
    ledger = _end_refund(run, ledger)
    run = dataclasses.replace(
        run, status=RunStatus.FAILED, current_round=None, ended_at_ms=at, end_reason=reason, updated_at_ms=at
    )
    return run, ledger, [RunFailed(run.task_id, at, reason)]


def _new_round(run: RunState, index: int, at: int) -> RoundState:
    fragments = run.spec.architecture.fragment_count
    return RoundState(
        round=index,
        started_at_ms=at,
        round_deadline_ms=at + run.timings.round_timeout_ms,
        submissions=((),) * fragments,
    )


def _start_training(run: RunState, at: int) -> tuple[RunState, list[RunEvent]]:
    round0 = _new_round(run, 0, at)
    run = dataclasses.replace(run, status=RunStatus.TRAINING, current_round=round0, updated_at_ms=at)
    events: list[RunEvent] = [
        TrainingStarted(run.task_id, at, tuple(t.address for t in run.trainers)),
        RoundStarted(run.task_id, at, 0, round0.round_deadline_ms, run.model_hash),
    ]
    return run, events


def _close_election(run: RunState, ledger: Ledger, at: int) -> _Step:
    entries = run.election.entries
    ranking = rank_candidates(
        run.election.seed, [e.candidate for e in entries], [e.ticket for e in entries]
    ).entries
    election = dataclasses.replace(run.election, ranking=ranking)
    run = dataclasses.replace(run, election=election, updated_at_ms=at)
    if not ranking:
        return _fail(run, ledger, at, "election: no candidate held a valid ticket")
    deadline = at + run.timings.enrollment_window_ms
    run = dataclasses.replace(run, status=RunStatus.ENROLLING, syncer_rank=1, enrollment_deadline_ms=deadline)
    return run, ledger, [SyncerElected(run.task_id, at, ranking[0].address, len(ranking), deadline)]


def _close_enrollment(run: RunState, ledger: Ledger, at: int) -> _Step:
    enrolled = len(run.trainers)
    if enrolled < run.spec.quorum:
        reason = f"enrollment: {enrolled} trainer(s) enrolled, quorum is {run.spec.quorum}"
        return _fail(run, ledger, at, reason)
    run, events = _start_training(run, at)
    return run, ledger, events


def _failover(run: RunState, ledger: Ledger, at: int) -> _Step:
    assert run.current_round is not None and run.election.ranking is not None  # by the caller
    current = run.current_round
    ranking = run.election.ranking
    if run.syncer_rank >= len(ranking):
        reason = f"round {current.round}: every ranked syncer ({len(ranking)}) missed its finalize deadline"
        return _fail(run, ledger, at, reason)
    old, new = ranking[run.syncer_rank - 1], ranking[run.syncer_rank]
    deadline = at + run.timings.finalize_window_ms
    record = Failover(current.round, old.address, old.rank, new.address, new.rank, at)
    run = dataclasses.replace(
        run,
        syncer_rank=new.rank,
        failovers=run.failovers + (record,),
        current_round=dataclasses.replace(current, finalize_deadline_ms=deadline),
        updated_at_ms=at,
    )
    event = SyncerFailover(run.task_id, at, current.round, old.address, old.rank, new.address, new.rank, deadline)
    return run, ledger, [event]


def _apply_next_deadline(run: RunState, ledger: Ledger, now: int) -> _Step | None:
    """Apply the earliest deadline that ``now`` has passed, or return None if none has.

    Each deadline takes effect at its own instant, except that time never runs backwards within
    a run: a deadline older than the last transition (possible only when a quorum was lost after
    the round deadline) takes effect at that transition's instant.
    """
    status = run.status

    def at(deadline: int) -> int:
        return max(deadline, run.updated_at_ms)

    if status is RunStatus.POSTED:
        # The election opens at posted_at; the window was fixed at posting.
        run = dataclasses.replace(run, status=RunStatus.ELECTING)
        event = ElectionOpened(run.task_id, run.posted_at_ms, run.election.seed, run.election.deadline_ms)
        return run, ledger, [event]
    if status is RunStatus.ELECTING and now > run.election.deadline_ms:
        return _close_election(run, ledger, at(run.election.deadline_ms))
    if status is RunStatus.ENROLLING:
        deadline = run.enrollment_deadline_ms
        assert deadline is not None  # set whenever the status is Enrolling
        if now > deadline:
            return _close_enrollment(run, ledger, at(deadline))
    if status is RunStatus.TRAINING:
        current = run.current_round
        assert current is not None  # RunState guarantees it
        if current.quorum_at_ms is None and now > current.round_deadline_ms:
            reason = f"round {current.round}: quorum not reached by the round deadline"
            return _fail(run, ledger, at(current.round_deadline_ms), reason)
        if current.finalize_deadline_ms is not None and now > current.finalize_deadline_ms:
            return _failover(run, ledger, at(current.finalize_deadline_ms))
    return None


def _advance(run: RunState, ledger: Ledger, now: int) -> _Step:
    events: list[RunEvent] = []
    while True:
        step = _apply_next_deadline(run, ledger, now)
        if step is None:
            return run, ledger, events
        run, ledger, new_events = step
        events.extend(new_events)


# --- transitions -------------------------------------------------------------------------------


def process_tick(run: RunState, ledger: Ledger, now_ms: int) -> Transition:
    """Apply every deadline that ``now_ms`` has passed, in order, each at its own instant:

    Posted -> Electing (at posting); election deadline -> rank the tickets -> Enrolling, or Failed
    if nobody holds a valid ticket; enrollment deadline -> Training (round 0) if >= K enrolled,
    else Failed; round deadline without quorum -> Failed; finalize deadline -> failover to the
    next-ranked syncer with a fresh finalize window, or Failed when the ranking is exhausted.
    Failed refunds the escrow and every remaining bond.
    """
    _check_run(run, ledger)
    run, ledger, events = _advance(run, ledger, _effective_now(run, now_ms))
    return Transition(run, ledger, tuple(events))


def process_pause(run: RunState, ledger: Ledger, paused_at_ms: int, resumed_at_ms: int) -> Transition:
    """The node could not serve calls from ``paused_at_ms`` to ``resumed_at_ms`` (it was down,
    restarting or stalled): every deadline of ``run`` still pending at ``paused_at_ms`` (the
    election or enrollment window, the round, straggler and finalize deadlines) moves later by
    the pause, and the move records nothing else (one DeadlinesExtended event).

    Why: a deadline punishes whoever missed it (a failover for the syncer, failure for a round
    without quorum), and during a pause nobody could call: a 15 s node restart inside a finalize
    window failed over a healthy syncer, and a longer one failed the run (syncer probe). Order
    is kept (a deadline moves only if every later one does), so every invariant holds. No
    pause: the run unchanged, no event; no deadline pending after the ones passed were applied
    (below): no DeadlinesExtended.

    A deadline that passed before ``paused_at_ms`` does not move: it took effect at its own
    instant, while the node served, and it is applied first, as a tick at ``paused_at_ms`` would
    have. The node may have enforced it in a call (a late submission or enrollment refused, a
    failover) without committing it; moving it later reopened what the node had closed, and
    leaving it unapplied charged the pause to what follows it: round 0 begun at an enrollment
    deadline just before the pause, or the next syncer's finalize window (election probe,
    2026-11-26).
    """
    _check_run(run, ledger)
    for name, value in (("paused_at_ms", paused_at_ms), ("resumed_at_ms", resumed_at_ms)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidRunArgument(run.task_id, name, "expected non-negative integer milliseconds")
    by = resumed_at_ms - paused_at_ms
    if by <= 0 or is_terminal(run):
        return Transition(run, ledger, ())
    run, ledger, events = _advance(run, ledger, _effective_now(run, paused_at_ms))
    if is_terminal(run):
        return Transition(run, ledger, tuple(events))

    def later(deadline: int) -> int:
        return deadline + by if deadline >= paused_at_ms else deadline

    moved = run
    if run.status is RunStatus.ELECTING and run.election.deadline_ms >= paused_at_ms:
        moved = dataclasses.replace(run, election=dataclasses.replace(run.election, deadline_ms=later(run.election.deadline_ms)))
    elif run.status is RunStatus.ENROLLING and run.enrollment_deadline_ms is not None \
            and run.enrollment_deadline_ms >= paused_at_ms:
        moved = dataclasses.replace(run, enrollment_deadline_ms=later(run.enrollment_deadline_ms))
    elif run.status is RunStatus.TRAINING and run.current_round is not None:
        r = run.current_round
        pending = [d for d in (r.round_deadline_ms, r.straggler_deadline_ms, r.finalize_deadline_ms)
                   if d is not None and d >= paused_at_ms]
        if pending:
            moved = dataclasses.replace(run, current_round=dataclasses.replace(
                r,
                round_deadline_ms=later(r.round_deadline_ms),
                straggler_deadline_ms=None if r.straggler_deadline_ms is None else later(r.straggler_deadline_ms),
                finalize_deadline_ms=None if r.finalize_deadline_ms is None else later(r.finalize_deadline_ms),
            ))
    if moved is run:
        return Transition(run, ledger, tuple(events))
    moved = dataclasses.replace(moved, updated_at_ms=max(run.updated_at_ms, resumed_at_ms))
    return Transition(moved, ledger, (*events, DeadlinesExtended(run.task_id, resumed_at_ms, paused_at_ms, by)))


def validate_open_runs(
    task_id: str, sponsor: bytes, open_sponsors: Sequence[bytes], max_open_runs: int, max_open_runs_per_sponsor: int
) -> None:
    """TooManyRuns unless one more run of ``sponsor`` fits the node's limits, given the sponsors
    of the runs it holds that are not Sealed, Failed or Cancelled (``open_sponsors``). Node
    admission policy: a post costs the node a snapshot on disk and a layout in memory."""
    if len(open_sponsors) >= max_open_runs:
        raise TooManyRuns(task_id, "node", max_open_runs)
    if sum(s == sponsor for s in open_sponsors) >= max_open_runs_per_sponsor:
        raise TooManyRuns(task_id, "sponsor", max_open_runs_per_sponsor)


def process_post_task(
    spec: TrainingTaskSpec,
    signer: bytes,
    ledger: Ledger,
    now_ms: int,
    timings: RunTimings,
    initial_model_hash: bytes,
    *,
    existing: RunState | None = None,
    max_grace_window_ms: int | None = None,
    max_receipt_bytes: int | None = None,
    max_trainer_count: int | None = None,
    min_reward_pool: int | None = None,
) -> Transition:
    """Create a run in Posted and escrow ``spec.reward_pool`` from the sponsor.

    ``signer`` (recovered by the shell) must be ``spec.sponsor_address`` (NotSponsor).
    ``existing`` is the run already stored under ``spec.task_id``, if any: the same spec again
    is a harmless replay (no change), a different one raises TaskExists. The spec must be
    supported (``TrainingTaskSpec.validate_supported``), its ``grace_window_ms`` at most the
    node's ``max_grace_window_ms`` (None: no limit), the receipt its run could seal at most the
    node's ``max_receipt_bytes`` and its ``trainer_count`` at most the node's
    ``max_trainer_count`` (None: no limit; a claim carries the whole receipt and credits each
    payee, so past either the trainers could never be paid on chain), its ``reward_pool`` at least
    the node's ``min_reward_pool`` (None: no minimum; a post costs the node a snapshot, so a key
    holding nothing must not post) and its outer-optimizer overrides valid
    (SpecError); the sponsor's balance must cover the pool (ledger InsufficientBalance).
    ``initial_model_hash`` is ``fragments.compute_model_hash`` of the verified init checkpoint.
    """
    if not isinstance(spec, TrainingTaskSpec):
        raise InvalidRunArgument("?", "spec", f"expected a TrainingTaskSpec, got {type(spec).__name__}")
    task_id = spec.task_id
    if not isinstance(ledger, Ledger):
        raise InvalidRunArgument(task_id, "ledger", "expected a Ledger")
    if not isinstance(timings, RunTimings):
        raise InvalidRunArgument(task_id, "timings", "expected a RunTimings")
    signer = _check_bytes(task_id, "signer", signer, 20)
    now = _check_int(task_id, "now_ms", now_ms)
    initial = _check_bytes(task_id, "initial_model_hash", initial_model_hash, HASH_LENGTH)
    if signer != spec.sponsor_address_bytes:
        raise NotSponsor(task_id, _addr(signer), spec.sponsor_address)
    spec_hash = spec.spec_hash()
    if existing is not None:
        if isinstance(existing, RunState) and existing.spec_hash == spec_hash:
            return Transition(existing, ledger)
        raise TaskExists(task_id)
    spec.validate_supported()
    if min_reward_pool is not None and spec.reward_pool < min_reward_pool:
        raise SpecError("reward_pool", f"{spec.reward_pool} is below this node's minimum, {min_reward_pool} attoTNZO")
    if max_grace_window_ms is not None and spec.grace_window_ms > max_grace_window_ms:
        raise SpecError(
            "grace_window_ms",
            f"must be <= {max_grace_window_ms} ms on this node (its max_grace_window_ms), got {spec.grace_window_ms}",
        )
    if max_trainer_count is not None and spec.trainer_count > max_trainer_count:
        raise SpecError(
            "trainer_count",
            f"must be <= {max_trainer_count} on this node (its max_trainer_count: a claim credits every "
            f"payee in one transaction), got {spec.trainer_count}",
        )
    if max_receipt_bytes is not None:
        bound = compute_receipt_size_bound(spec)
        if bound > max_receipt_bytes:
            raise SpecError(
                "max_rounds",
                f"a run of {spec.max_rounds} rounds x {spec.architecture.fragment_count} fragments x "
                f"{spec.trainer_count} trainers can seal a receipt of {bound} bytes, above this node's "
                f"max_receipt_bytes {max_receipt_bytes} (what one claim transaction can carry): use "
                "fewer rounds, fragments or trainers, and chain tasks for a longer training",
            )
    OuterConfig.from_spec(spec)  # reject bad outer_lr / outer_momentum overrides at posting
    PayloadEncoding.from_spec(spec)  # and a bad outer_gradient_encoding
    ledger = escrow_reward(ledger, task_id, signer, spec.reward_pool)
    election = ElectionState(
        seed=compute_election_seed(task_id, spec_hash), deadline_ms=now + timings.election_window_ms
    )
    run = RunState(
        spec=spec,
        spec_hash=spec_hash,
        status=RunStatus.POSTED,
        timings=timings,
        posted_at_ms=now,
        updated_at_ms=now,
        election=election,
        initial_model_hash=initial,
        model_hash=initial,
    )
    return Transition(run, ledger, (RunPosted(task_id, now, Address(signer), spec_hash, spec.reward_pool),))


def process_ticket(run: RunState, ledger: Ledger, candidate: Candidate, ticket: Ticket, now_ms: int) -> Transition:
    """Accept a syncer candidate's election ticket while the election is open.

    ``candidate`` is the node's registration of the ticket's address (its VRF key and stake at
    this moment: the stake the ranking will use). The ticket must verify over the run's seed
    (``election.validate_ticket``: TicketRejected, an ElectionError). The same ticket again is a
    no-op; a different ticket or registration for an address that already has one, or a second
    address with the same VRF key, raises ElectionError. After the election deadline: InvalidState.
    """
    _check_run(run, ledger)
    if not isinstance(candidate, Candidate) or not isinstance(ticket, Ticket):
        raise InvalidRunArgument(run.task_id, "ticket", "expected a Candidate and a Ticket")
    now = _effective_now(run, now_ms)
    run, ledger, events = _advance(run, ledger, now)
    if run.status is not RunStatus.ELECTING:
        raise InvalidState(run.task_id, run.status.value, "accept an election ticket")
    validate_ticket(ticket, candidate, run.election.seed)
    for entry in run.election.entries:
        if entry.candidate.address == candidate.address:
            if entry.candidate == candidate and entry.ticket == ticket:
                return Transition(run, ledger, tuple(events))
            raise ElectionError(f"{_addr(candidate.address)} already has a different ticket in {run.task_id}")
        if entry.candidate.vrf_public_key == candidate.vrf_public_key:
            raise ElectionError(f"VRF key of {_addr(candidate.address)} is already used by {_addr(entry.candidate.address)}")
    entries = tuple(sorted(run.election.entries + (ElectionEntry(candidate, ticket, now),), key=lambda e: e.candidate.address))
    run = dataclasses.replace(run, election=dataclasses.replace(run.election, entries=entries), updated_at_ms=now)
    events.append(TicketAccepted(run.task_id, now, candidate.address, candidate.stake))
    return Transition(run, ledger, tuple(events))


def process_enroll(run: RunState, ledger: Ledger, trainer: bytes, did: str, stake: int, now_ms: int) -> Transition:
    """Admit a trainer (signer = ``trainer``) and bond ``stake`` from its balance.

    Checked in this order: arguments (InvalidRunArgument); a replay with the same DID and stake
    is a no-op, different ones raise EnrollmentConflict; M already enrolled -> RunFull; not
    Enrolling -> InvalidState; stake < timings.min_stake -> StakeTooLow; balance too small ->
    ledger InsufficientBalance. The trainer gets shard index = number enrolled before it. The
    M-th enrollment starts Training (round 0) at once.
    """
    _check_run(run, ledger)
    task_id = run.task_id
    trainer = _check_bytes(task_id, "trainer", trainer, 20)
    if not isinstance(did, str) or DID_PATTERN.fullmatch(did) is None:
        raise InvalidRunArgument(task_id, "did", f"expected did:tenzro:<kind>:<id>, got {did!r}")
    stake = _check_int(task_id, "stake", stake, 2**256 - 1)
    now = _effective_now(run, now_ms)
    run, ledger, events = _advance(run, ledger, now)
    known = get_trainer(run, trainer)
    if known is not None:
        if known.did == did and known.stake == stake:
            return Transition(run, ledger, tuple(events))
        raise EnrollmentConflict(task_id, _addr(trainer))
    if run.status in (RunStatus.ENROLLING, RunStatus.TRAINING) and len(run.trainers) >= run.spec.trainer_count:
        raise RunFull(task_id, run.spec.trainer_count)
    if run.status is not RunStatus.ENROLLING:
        raise InvalidState(task_id, run.status.value, "enroll a trainer")
    if stake < run.timings.min_stake:
        raise StakeTooLow(task_id, run.timings.min_stake, stake)
    ledger = bond_stake(ledger, task_id, trainer, stake)
    shard = len(run.trainers)
    enrolled = EnrolledTrainer(Address(trainer), did, stake, shard, now)
    run = dataclasses.replace(run, trainers=run.trainers + (enrolled,), updated_at_ms=now)
    events.append(TrainerEnrolled(task_id, now, Address(trainer), did, stake, shard))
    if len(run.trainers) == run.spec.trainer_count:
        run, started = _start_training(run, now)
        events.extend(started)
    return Transition(run, ledger, tuple(events))


def _check_quorum(run: RunState, current: RoundState, now: int) -> tuple[RoundState, list[RunEvent]]:
    """Set or clear the quorum instant after the accepted sets changed."""
    k = run.spec.quorum
    reached = all(len(subs) >= k for subs in current.submissions)
    if reached and current.quorum_at_ms is None:
        straggler = now + run.spec.grace_window_ms
        finalize = straggler + run.timings.finalize_window_ms
        current = dataclasses.replace(
            current, quorum_at_ms=now, straggler_deadline_ms=straggler, finalize_deadline_ms=finalize
        )
        return current, [QuorumReached(run.task_id, now, current.round, straggler, finalize)]
    if not reached and current.quorum_at_ms is not None:
        # The round deadline applies again; if it has passed, the next tick fails the run.
        current = dataclasses.replace(current, quorum_at_ms=None, straggler_deadline_ms=None, finalize_deadline_ms=None)
        return current, [QuorumLost(run.task_id, now, current.round)]
    return current, []


def _slash_equivocator(
    run: RunState, ledger: Ledger, trainer: Address, round: int, fragment: int, first: bytes, second: bytes, now: int
) -> Transition:
    task_id = run.task_id
    current = run.current_round
    assert current is not None and round <= current.round  # only called while Training
    ledger, amount = slash_stake(ledger, task_id, trainer)
    trainers = tuple(dataclasses.replace(t, slashed=True) if t.address == trainer else t for t in run.trainers)
    submissions = tuple(tuple(s for s in subs if s.trainer != trainer) for subs in current.submissions)
    current, quorum_events = _check_quorum(run, dataclasses.replace(current, submissions=submissions), now)
    run = dataclasses.replace(run, trainers=trainers, current_round=current, updated_at_ms=now)
    events: list[RunEvent] = [
        EquivocationDetected(task_id, now, round, fragment, trainer, first, second, current.round),
        TrainerSlashed(task_id, now, trainer, amount),
        *quorum_events,
    ]
    active = sum(1 for t in run.trainers if not t.slashed)
    if active < run.spec.quorum:
        run, ledger, failed = _fail(run, ledger, now, f"only {active} unslashed trainer(s) left, quorum is {run.spec.quorum}")
        events.extend(failed)
    error = Equivocation(task_id, round, fragment, _addr(trainer))
    return Transition(run, ledger, tuple(events), error)


def process_submission(
    run: RunState, ledger: Ledger, trainer: bytes, round: int, fragment: int, payload_hash: bytes, now_ms: int
) -> Transition:
    """Accept one outer gradient (signer = ``trainer``) for (round, fragment).

    Refusals, in order: bad arguments (InvalidRunArgument); not Training (InvalidState, or
    LateSubmission for a round of a Sealed run); trainer not enrolled or slashed (NotEnrolled);
    past round (LateSubmission); future round (RoundMismatch). Then: the same payload hash again
    is a no-op; a different one is equivocation (returned, not raised: ``Transition.error`` is an
    Equivocation, the stake is burned, the trainer marked slashed and its submissions of this
    round dropped; the run Fails if fewer than K unslashed trainers remain); after the straggler
    deadline: LateSubmission. Quorum is reached when every fragment has >= K accepted submissions.
    """
    _check_run(run, ledger)
    task_id = run.task_id
    trainer = Address(_check_bytes(task_id, "trainer", trainer, 20))
    round = _check_int(task_id, "round", round, 2**64 - 1)
    fragment = _check_int(task_id, "fragment", fragment, run.spec.architecture.fragment_count - 1)
    payload_hash = _check_bytes(task_id, "payload_hash", payload_hash, HASH_LENGTH)
    now = _effective_now(run, now_ms)
    run, ledger, events = _advance(run, ledger, now)
    if run.status is RunStatus.SEALED and round < len(run.records):
        raise LateSubmission(task_id, round, fragment)
    if run.status is not RunStatus.TRAINING:
        raise InvalidState(task_id, run.status.value, "submit an outer gradient")
    known = get_trainer(run, trainer)
    if known is None or known.slashed:
        raise NotEnrolled(task_id, _addr(trainer))
    current = run.current_round
    assert current is not None  # Training
    if round < current.round:
        raise LateSubmission(task_id, round, fragment)
    if round > current.round:
        raise RoundMismatch(task_id, current.round, round)
    subs = current.submissions[fragment]
    for sub in subs:
        if sub.trainer == trainer:
            if sub.payload_hash == payload_hash:
                return Transition(run, ledger, tuple(events))
            slashed = _slash_equivocator(run, ledger, trainer, round, fragment, sub.payload_hash, payload_hash, now)
            return Transition(slashed.run, slashed.ledger, tuple(events) + slashed.events, slashed.error)
    if current.straggler_deadline_ms is not None and now > current.straggler_deadline_ms:
        raise LateSubmission(task_id, round, fragment)
    new_subs = tuple(sorted(subs + (Submission(trainer, payload_hash, now),), key=lambda s: s.trainer))
    submissions = current.submissions[:fragment] + (new_subs,) + current.submissions[fragment + 1 :]
    current, quorum_events = _check_quorum(run, dataclasses.replace(current, submissions=submissions), now)
    run = dataclasses.replace(run, current_round=current, updated_at_ms=now)
    events.append(SubmissionAccepted(task_id, now, round, fragment, trainer, payload_hash))
    events.extend(quorum_events)
    return Transition(run, ledger, tuple(events))


def process_equivocation(
    run: RunState,
    ledger: Ledger,
    trainer: bytes,
    round: int,
    fragment: int,
    first_hash: bytes,
    second_hash: bytes,
    now_ms: int,
) -> Transition:
    """Apply equivocation proven outside a submission: ``trainer`` signed two different payload
    hashes for (``round``, ``fragment``) of the current round or of a finalized one (SPEC.md
    "Authentication").

    Why a separate rule: :func:`process_submission` sees equivocation only when both payloads
    are submitted in the current round. A trainer that gossips two differently signed payloads
    (or gossips one and submits another), or that signs a second payload for a round already
    finalized, has equivocated just the same; the shell verifies both signatures (for a
    finalized round, the first is the stored signature of the submission that round accepted)
    and passes the two hashes here. The effect is the submission path's, in the current round:
    stake burned, trainer marked slashed, its submissions of the current round dropped (the
    rounds already committed keep it: their records and models are final), the run Fails below
    K unslashed trainers; ``Transition.error`` is the Equivocation to answer with, and the
    ``EquivocationDetected`` event names both the evidence round and ``slashed_in_round``.

    Refusals: bad arguments or equal hashes (InvalidRunArgument); not Training (InvalidState:
    a Sealed run's stakes are already returned, a Failed or Cancelled run's refunded); not
    enrolled (NotEnrolled); a round after the current one (RoundMismatch). A trainer already
    slashed is a no-op: the same evidence may arrive twice.
    """
    _check_run(run, ledger)
    task_id = run.task_id
    trainer = Address(_check_bytes(task_id, "trainer", trainer, 20))
    round = _check_int(task_id, "round", round, 2**64 - 1)
    fragment = _check_int(task_id, "fragment", fragment, run.spec.architecture.fragment_count - 1)
    first_hash = _check_bytes(task_id, "first_hash", first_hash, HASH_LENGTH)
    second_hash = _check_bytes(task_id, "second_hash", second_hash, HASH_LENGTH)
    if first_hash == second_hash:
        raise InvalidRunArgument(task_id, "second_hash", "equals first_hash: one payload is no equivocation")
    now = _effective_now(run, now_ms)
    run, ledger, events = _advance(run, ledger, now)
    if run.status is not RunStatus.TRAINING:
        raise InvalidState(task_id, run.status.value, "apply equivocation evidence")
    known = get_trainer(run, trainer)
    if known is None:
        raise NotEnrolled(task_id, _addr(trainer))
    current = run.current_round
    assert current is not None  # Training
    if round > current.round:
        raise RoundMismatch(task_id, current.round, round)
    if known.slashed:
        return Transition(run, ledger, tuple(events))
    slashed = _slash_equivocator(run, ledger, trainer, round, fragment, first_hash, second_hash, now)
    return Transition(slashed.run, slashed.ledger, tuple(events) + slashed.events, slashed.error)


def is_accepted_set_closed(run: RunState, now_ms: int) -> bool:
    """True when the current round's accepted submissions can no longer change: quorum is
    reached and either the straggler window is over (now > straggler deadline) or every unslashed
    trainer has submitted every fragment. Only then may the round be finalized."""
    current = run.current_round
    if run.status is not RunStatus.TRAINING or current is None or current.straggler_deadline_ms is None:
        return False
    if now_ms > current.straggler_deadline_ms:
        return True
    active = {t.address for t in run.trainers if not t.slashed}
    return all({s.trainer for s in subs} >= active for subs in current.submissions)


def has_passed_uncommitted_deadline(run: RunState, now_ms: int, since_ms: int | None) -> bool:
    """True when a call judged at ``now_ms`` may rest on a deadline of ``run`` that passed after
    ``since_ms`` (None: ever) and that no committed transition records: a transition due
    (``get_next_deadline_ms`` passed; the call applies it, and whatever it leads to, without
    committing anything when it refuses) or the straggler deadline, which closes the accepted
    set without a transition.

    Why: a shell that restarts counts the time since it last recorded serving as a pause
    (:func:`process_pause`), and a deadline still pending at that instant moves later. A refusal
    that rests on such a deadline (a late submission or enrollment, a finalize after a failover)
    must hold after a restart, so the shell records the instant of that refusal; any other
    refusal rests on committed state, which a restart keeps (election probe, 2026-11-26)."""
    at = _effective_now(run, now_ms)
    due = get_next_deadline_ms(run)
    if due is not None and at > due:
        return True
    current = run.current_round
    if run.status is not RunStatus.TRAINING or current is None or current.straggler_deadline_ms is None:
        return False
    straggler = current.straggler_deadline_ms
    return at > straggler and (since_ms is None or straggler >= since_ms)


def _seal(run: RunState, ledger: Ledger, records: tuple[RoundRecord, ...], model_hash: bytes, now: int) -> _Step:
    task_id = run.task_id
    final = FinalModelRecord(task_id, len(records), model_hash)
    root = run_root(compute_run_leaves(run.spec.canonical_bytes(), records, final))
    slashed = {t.address for t in run.trainers if t.slashed}
    weights = {a: w for a, w in compute_reward_weights(run, records).items() if a not in slashed}
    escrow = ledger.escrow_of(task_id)
    assert escrow is not None  # escrowed at posting, released only when the run ends
    payouts, remainder = compute_payouts(escrow.amount, weights)
    ledger = settle_run(ledger, task_id, payouts, run.sponsor)
    for trainer in run.trainers:
        if not trainer.slashed:
            ledger = unbond_stake(ledger, task_id, trainer.address)
    run = dataclasses.replace(
        run, status=RunStatus.SEALED, records=records, model_hash=model_hash, current_round=None,
        final_record=final, run_root=root, ended_at_ms=now, updated_at_ms=now,
    )
    event = RunSealed(task_id, now, root, final.final_model_hash, tuple(sorted(payouts.items())), remainder)
    return run, ledger, [event]


def process_finalize(
    run: RunState,
    ledger: Ledger,
    signer: bytes,
    round: int,
    outcomes: Sequence[FragmentOutcome],
    new_model_hash: bytes,
    now_ms: int,
) -> Transition:
    """Commit the current round (signer = the current syncer) and start the next, or seal.

    ``outcomes`` has one FragmentOutcome per fragment whose ``accepted`` is exactly the trainers
    of ``get_accepted_submissions(run, i)`` (all of them, >= K, canonical order) and whose
    selected/trimmed fit the task's rule; ``new_model_hash`` is the global model hash after the
    outer step. Refusals, in order: bad arguments (InvalidRunArgument); a round already committed
    (identical call: no-op; otherwise RoundMismatch); not Training (InvalidState); signer is not
    the current syncer (NotSyncer); a future round (RoundMismatch); a fragment below K
    (QuorumNotReached); accepted set still open (StragglerWindowOpen); outcomes that do not match
    (InvalidRunArgument). At max_rounds the run is sealed: FinalModelRecord, run root, payouts
    pro rata to aggregated submissions over all rounds (slashed trainers get nothing; the floor
    remainder goes to the sponsor) and every unslashed bond returned.
    """
    _check_run(run, ledger)
    task_id = run.task_id
    signer = Address(_check_bytes(task_id, "signer", signer, 20))
    round = _check_int(task_id, "round", round, 2**64 - 1)
    if isinstance(outcomes, (str, bytes)) or not isinstance(outcomes, Sequence):
        raise InvalidRunArgument(task_id, "outcomes", "expected a sequence of FragmentOutcome")
    outcomes = tuple(outcomes)
    for i, outcome in enumerate(outcomes):
        if not isinstance(outcome, FragmentOutcome):
            raise InvalidRunArgument(task_id, f"outcomes[{i}]", f"expected a FragmentOutcome, got {type(outcome).__name__}")
    new_model_hash = _check_bytes(task_id, "new_model_hash", new_model_hash, HASH_LENGTH)
    now = _effective_now(run, now_ms)
    run, ledger, events = _advance(run, ledger, now)
    if round < len(run.records):
        committed = run.records[round]
        if committed.syncer == signer and committed.fragments == outcomes and committed.model_hash == new_model_hash:
            return Transition(run, ledger, tuple(events))
        raise RoundMismatch(task_id, run.round, round)
    if run.status is not RunStatus.TRAINING:
        raise InvalidState(task_id, run.status.value, "finalize a round")
    syncer = get_current_syncer(run)
    if signer != syncer:
        raise NotSyncer(task_id, _addr(signer), None if syncer is None else _addr(syncer))
    current = run.current_round
    assert current is not None  # Training
    if round != current.round:
        raise RoundMismatch(task_id, current.round, round)
    counts = tuple(len(subs) for subs in current.submissions)
    if min(counts) < run.spec.quorum:
        raise QuorumNotReached(task_id, round, counts, run.spec.quorum)
    if not is_accepted_set_closed(run, now):
        assert current.straggler_deadline_ms is not None  # quorum reached
        raise StragglerWindowOpen(task_id, round, current.straggler_deadline_ms)
    if len(outcomes) != len(counts):
        raise InvalidRunArgument(task_id, "outcomes", f"expected {len(counts)} fragment outcomes, got {len(outcomes)}")
    for i, (outcome, subs) in enumerate(zip(outcomes, current.submissions)):
        expected = tuple(s.trainer for s in subs)
        if outcome.accepted != expected:
            raise InvalidRunArgument(
                task_id, f"outcomes[{i}].accepted", "must be exactly the accepted trainers, in canonical order"
            )
    rule = run.spec.aggregation
    try:
        record = RoundRecord(task_id, round, signer, run.syncer_rank, rule.kind, rule.param, outcomes, new_model_hash)
    except EncodingError as exc:
        raise InvalidRunArgument(task_id, "outcomes", str(exc)) from None
    events.append(RoundFinalized(task_id, now, round, signer, run.syncer_rank, new_model_hash))
    records = run.records + (record,)
    if len(records) == run.spec.max_rounds:
        run, ledger, sealed = _seal(run, ledger, records, new_model_hash, now)
        events.extend(sealed)
        return Transition(run, ledger, tuple(events))
    nxt = _new_round(run, round + 1, now)
    run = dataclasses.replace(run, records=records, model_hash=new_model_hash, current_round=nxt, updated_at_ms=now)
    events.append(RoundStarted(task_id, now, nxt.round, nxt.round_deadline_ms, new_model_hash))
    return Transition(run, ledger, tuple(events))


def process_cancel(run: RunState, ledger: Ledger, signer: bytes, now_ms: int) -> Transition:
    """The sponsor cancels a run that has not started training: escrow and bonds are refunded.

    NotSponsor for anyone else; InvalidState once Training started or the run ended (a repeated
    cancel of a Cancelled run is a no-op).
    """
    _check_run(run, ledger)
    task_id = run.task_id
    signer = _check_bytes(task_id, "signer", signer, 20)
    now = _effective_now(run, now_ms)
    run, ledger, events = _advance(run, ledger, now)
    if signer != run.sponsor:
        raise NotSponsor(task_id, _addr(signer), run.spec.sponsor_address)
    if run.status is RunStatus.CANCELLED:
        return Transition(run, ledger, tuple(events))
    if run.status not in (RunStatus.POSTED, RunStatus.ELECTING, RunStatus.ENROLLING):
        raise InvalidState(task_id, run.status.value, "cancel")
    ledger = _end_refund(run, ledger)
    run = dataclasses.replace(
        run, status=RunStatus.CANCELLED, ended_at_ms=now, end_reason="cancelled by the sponsor", updated_at_ms=now
    )
    events.append(RunCancelled(task_id, now))
    return Transition(run, ledger, tuple(events))
