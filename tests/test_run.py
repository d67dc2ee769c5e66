"""The run lifecycle state machine, driven purely through its transition functions.

The scenario is M=3 trainers, K=2, F=2 fragments, 2 rounds, Mean. FragmentOutcomes and model
hashes are fakes (hashes of labels): this tests the state machine, not aggregation. After EVERY
transition the helper ``Env.apply`` checks that the run survives to_dict -> JSON -> from_dict
unchanged and that the ledger conserves supply (only slashing burns).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

import pytest

from tenzro_training import vrf
from tenzro_training.election import make_ticket
from tenzro_training.errors import (
    ElectionError,
    EnrollmentConflict,
    Equivocation,
    InvalidState,
    LateSubmission,
    NotEnrolled,
    QuorumNotReached,
    RoundMismatch,
    RunFull,
    SpecError,
    StakeTooLow,
    TaskExists,
    TenzroError,
)
from tenzro_training.ledger import InsufficientBalance, Ledger, credit
from tenzro_training.merkle import run_root
from tenzro_training.records import Candidate, FragmentOutcome, Ticket, compute_run_leaves
from tenzro_training.run import (
    EquivocationDetected,
    DeadlinesExtended,
    InvalidRunArgument,
    NotSponsor,
    NotSyncer,
    QuorumLost,
    QuorumReached,
    RunFailed,
    RunSealed,
    StragglerWindowOpen,
    SyncerFailover,
    TrainerSlashed,
    Transition,
    has_passed_uncommitted_deadline,
    is_accepted_set_closed,
    process_cancel,
    process_enroll,
    process_pause,
    process_finalize,
    process_post_task,
    process_equivocation,
    process_submission,
    process_tick,
    process_ticket,
)
from tenzro_training.run_state import (
    RunState,
    RunStatus,
    RunTimings,
    compute_run_view,
    get_accepted_payload_hashes,
    get_accepted_submissions,
    get_current_syncer,
    get_next_deadline_ms,
    get_submission_counts,
)
from tenzro_training.spec import TrainingTaskSpec

# --- fixtures (plain helpers; other test_run_* files import these non-test names) --------------

SPONSOR = bytes.fromhex("5a" * 20)
OTHER = bytes.fromhex("77" * 20)
TRAINERS = [bytes([0x10 + i]) * 20 for i in range(4)]
DIDS = [f"did:tenzro:node:trainer{i}" for i in range(4)]
SYNCER_SECRETS = [bytes([0xA0 + i]) * 32 for i in range(3)]
SYNCERS = [bytes([0xC0 + i]) * 20 for i in range(3)]
POOL = 1001
STAKE = 50
BALANCE = 1_000
TIMINGS = RunTimings(
    election_window_ms=100, enrollment_window_ms=1_000, round_timeout_ms=10_000, finalize_window_ms=500, min_stake=10
)
INITIAL_MODEL = hashlib.sha256(b"initial model").digest()
GRACE_MS = 1_000


def h(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def make_spec(**overrides: Any) -> TrainingTaskSpec:
    doc: dict[str, Any] = {
        "task_id": "run-test",
        "sponsor_did": "did:tenzro:human:sponsor",
        "sponsor_address": "0x" + SPONSOR.hex(),
        "architecture": {
            "family": "tiny",
            "param_count": 10,
            "modality": "Timeseries",
            "fragment_count": 2,
            "dtype": "fp32",
            "metadata": {},
        },
        "tier": "Open",
        "aggregation": "Mean",
        "trainer_count": 3,
        "quorum": 2,
        "inner_steps": 1,
        "max_rounds": 2,
        "grace_window_ms": GRACE_MS,
        "reward_pool": str(POOL),
        "dataset_ref": "ipfs://dataset",
        "dataset_hash": "0x" + "ab" * 32,
        "min_throughput": None,
        "created_at": 1_700_000_000,
    }
    arch_keys = {"fragment_count", "metadata"}
    for key, value in overrides.items():
        if key in arch_keys:
            doc["architecture"][key] = value
        else:
            doc[key] = value
    return TrainingTaskSpec.from_dict(doc)


def funded_ledger() -> Ledger:
    ledger = credit(Ledger(), SPONSOR, 10_000)
    for t in TRAINERS:
        ledger = credit(ledger, t, BALANCE)
    return credit(ledger, OTHER, BALANCE)


def candidate(i: int, stake: int = 100) -> Candidate:
    return Candidate(SYNCERS[i], vrf.public_key(SYNCER_SECRETS[i]), stake)


def ticket(i: int, seed: bytes) -> Ticket:
    return make_ticket(SYNCER_SECRETS[i], SYNCERS[i], seed)


def payload(trainer: bytes, round_: int, fragment: int, variant: int = 0) -> bytes:
    return h(f"{trainer.hex()}/{round_}/{fragment}/{variant}")


def outcomes_for(run: RunState, label: str = "agg") -> list[FragmentOutcome]:
    result = []
    for f in range(run.spec.architecture.fragment_count):
        accepted = tuple(a for a, _ in get_accepted_submissions(run, f))
        result.append(FragmentOutcome(h(f"{label}/{run.round}/{f}"), accepted, 0, 0, h(f"report/{run.round}/{f}")))
    return result


def model_after(round_: int) -> bytes:
    return h(f"model after round {round_}")


def assert_round_trip(run: RunState) -> None:
    encoded = json.dumps(run.to_dict(), sort_keys=True)
    back = RunState.from_dict(json.loads(encoded))
    assert back == run
    assert json.dumps(back.to_dict(), sort_keys=True) == encoded


class Env:
    """A run + ledger driven through transitions, with invariant checks after each one."""

    def __init__(self, ledger: Ledger | None = None) -> None:
        self.ledger = funded_ledger() if ledger is None else ledger
        self.supply = self.ledger.total_supply()
        self.run: RunState | None = None
        self.events: list[Any] = []

    def apply(self, fn: Callable[..., Transition], *args: Any) -> Transition:
        before_run = None if self.run is None else self.run.to_dict()
        before_ledger = self.ledger
        try:
            t = fn(*args) if fn is process_post_task else fn(self.run, self.ledger, *args)
        except TenzroError:
            # A refused call changes nothing: the inputs are untouched.
            assert self.ledger == before_ledger
            assert self.run is None or self.run.to_dict() == before_run
            raise
        self.run, self.ledger = t.run, t.ledger
        self.events.extend(t.events)
        assert_round_trip(self.run)
        assert self.ledger.total_supply() == self.supply - self.ledger.burned
        return t

    def post(self, now: int = 0, spec: TrainingTaskSpec | None = None) -> Transition:
        return self.apply(process_post_task, spec or make_spec(), SPONSOR, self.ledger, now, TIMINGS, INITIAL_MODEL)

    def elect(self, syncers: tuple[int, ...] = (0, 1)) -> None:
        assert self.run is not None
        for i in syncers:
            self.apply(process_ticket, candidate(i), ticket(i, self.run.election.seed), 10 + i)
        self.apply(process_tick, TIMINGS.election_window_ms + 1)
        assert self.run.status is RunStatus.ENROLLING

    def enroll(self, i: int, now: int, stake: int = STAKE) -> Transition:
        return self.apply(process_enroll, TRAINERS[i], DIDS[i], stake, now)

    def submit(self, i: int, fragment: int, now: int, variant: int = 0, round_: int | None = None) -> Transition:
        assert self.run is not None
        r = self.run.round if round_ is None else round_
        return self.apply(process_submission, TRAINERS[i], r, fragment, payload(TRAINERS[i], r, fragment, variant), now)

    def finalize(self, now: int, signer: bytes | None = None) -> Transition:
        assert self.run is not None
        syncer = get_current_syncer(self.run) if signer is None else signer
        r = self.run.round
        return self.apply(process_finalize, syncer, r, outcomes_for(self.run), model_after(r), now)

    def to_training(self) -> None:
        self.post()
        self.elect()
        for i, now in enumerate((200, 210, 220)):
            self.enroll(i, now)
        assert self.run is not None and self.run.status is RunStatus.TRAINING


def ranked(env: Env) -> list[bytes]:
    assert env.run is not None and env.run.election.ranking is not None
    return [e.address for e in env.run.election.ranking]


# --- the whole run -------------------------------------------------------------------------


def test_whole_run_m3_k2_f2_two_rounds_seals_and_pays() -> None:
    env = Env()
    env.post(now=0)
    assert env.run.status is RunStatus.POSTED
    assert env.ledger.escrow_of("run-test").amount == POOL
    assert env.ledger.balance_of(SPONSOR) == 10_000 - POOL

    env.elect()
    assert env.run.enrollment_deadline_ms == TIMINGS.election_window_ms + TIMINGS.enrollment_window_ms
    assert env.run.syncer_rank == 1 and set(ranked(env)) == {SYNCERS[0], SYNCERS[1]}

    env.enroll(0, 200)
    env.enroll(1, 210)
    assert env.run.status is RunStatus.ENROLLING
    t = env.enroll(2, 220)  # the M-th enrollment starts round 0 immediately
    assert env.run.status is RunStatus.TRAINING and env.run.round == 0
    assert [tr.shard_index for tr in env.run.trainers] == [0, 1, 2]
    assert env.run.current_round.round_deadline_ms == 220 + TIMINGS.round_timeout_ms
    assert {type(e).__name__ for e in t.events} >= {"TrainerEnrolled", "TrainingStarted", "RoundStarted"}
    for i in range(3):
        assert env.ledger.bond_of("run-test", TRAINERS[i]) == STAKE

    # Round 0: quorum when EVERY fragment has K=2; the third trainer is a straggler in time.
    env.submit(0, 0, 300)
    env.submit(1, 0, 310)
    assert env.run.current_round.quorum_at_ms is None  # fragment 1 still has 0
    env.submit(0, 1, 320)
    t = env.submit(1, 1, 330)
    assert any(isinstance(e, QuorumReached) for e in t.events)
    cur = env.run.current_round
    assert cur.quorum_at_ms == 330
    assert cur.straggler_deadline_ms == 330 + GRACE_MS
    assert cur.finalize_deadline_ms == 330 + GRACE_MS + TIMINGS.finalize_window_ms
    assert not is_accepted_set_closed(env.run, 400)
    env.submit(2, 0, 400)
    env.submit(2, 1, 410)
    assert get_submission_counts(env.run) == (3, 3)
    # Every unslashed trainer submitted every fragment: the set cannot change, finalize early.
    assert is_accepted_set_closed(env.run, 410)
    assert [a for a, _ in get_accepted_submissions(env.run, 0)] == sorted(TRAINERS[:3])
    assert get_accepted_payload_hashes(env.run) == {h for f in (0, 1) for _, h in get_accepted_submissions(env.run, f)}
    assert len(get_accepted_payload_hashes(env.run)) == 6
    t = env.finalize(420)
    assert get_accepted_payload_hashes(env.run) == frozenset()  # round 1 has none yet
    assert env.run.round == 1 and env.run.model_hash == model_after(0)
    assert len(env.run.records) == 1 and env.run.records[0].syncer == ranked(env)[0]

    # Round 1: only trainers 0 and 1; the syncer must wait for the straggler window.
    for f in (0, 1):
        env.submit(0, f, 500)
        env.submit(1, f, 510)
    with pytest.raises(StragglerWindowOpen):
        env.finalize(510 + GRACE_MS)  # deadline is inclusive: still open
    t = env.finalize(510 + GRACE_MS + 1)
    assert env.run.status is RunStatus.SEALED
    sealed = [e for e in t.events if isinstance(e, RunSealed)][0]

    # The run root is the Merkle commitment of spec + both records + final record.
    leaves = compute_run_leaves(env.run.spec.canonical_bytes(), env.run.records, env.run.final_record)
    assert env.run.run_root == run_root(leaves) == sealed.run_root
    assert env.run.final_record.rounds == 2 and env.run.final_record.final_model_hash == model_after(1)

    # Payouts: weights = aggregated submissions over all rounds: 4, 4, 2 of 10.
    expected = {TRAINERS[0]: POOL * 4 // 10, TRAINERS[1]: POOL * 4 // 10, TRAINERS[2]: POOL * 2 // 10}
    assert dict(sealed.payouts) == expected
    assert sealed.remainder == POOL - sum(expected.values()) == 1
    for i in range(3):
        assert env.ledger.balance_of(TRAINERS[i]) == BALANCE + expected[TRAINERS[i]]  # stake returned
        assert env.ledger.bond_of("run-test", TRAINERS[i]) is None
    assert env.ledger.balance_of(SPONSOR) == 10_000 - POOL + 1
    assert env.ledger.escrow_of("run-test") is None
    assert env.ledger.total_supply() == env.supply and env.ledger.burned == 0
    assert get_next_deadline_ms(env.run) is None

    view = compute_run_view(env.run, 10_000)
    assert view["status"] == "Sealed" and view["round"] == 2
    assert view["run_root"] == "0x" + env.run.run_root.hex()
    assert [t["shard"] for t in view["trainers"]] == [0, 1, 2]
    assert len(view["round_records"]) == 2 and view["round_records"][0]["model_hash"] == "0x" + model_after(0).hex()
    json.dumps(view)  # JSON-able


def test_view_while_training_shows_counts_deadlines_and_election() -> None:
    env = Env()
    env.to_training()
    env.submit(0, 0, 300)
    view = compute_run_view(env.run, 301)
    assert view["status"] == "Training"
    assert view["submission_counts"] == [1, 0]
    assert view["syncer"] == json.loads(json.dumps(view))["syncer"]
    assert view["syncer_rank"] == 1
    assert len(view["election"]["tickets"]) == 2 and len(view["election"]["ranking"]) == 2
    assert view["round_deadline_ms"] == 220 + TIMINGS.round_timeout_ms
    assert view["tick_due"] is False
    assert compute_run_view(env.run, 220 + TIMINGS.round_timeout_ms + 1)["tick_due"] is True
    # The served spec is the posted one: it hashes to the view's spec_hash.
    from tenzro_training.spec import TrainingTaskSpec

    served = TrainingTaskSpec.from_dict(json.loads(json.dumps(view["spec"])))
    assert served == env.run.spec and "0x" + served.spec_hash().hex() == view["spec_hash"]


# --- named invalid cases ------------------------------------------------------------------------


def test_invalid_post_by_non_sponsor() -> None:
    env = Env()
    with pytest.raises(NotSponsor):
        env.apply(process_post_task, make_spec(), OTHER, env.ledger, 0, TIMINGS, INITIAL_MODEL)


def test_invalid_post_without_funds() -> None:
    env = Env(credit(Ledger(), SPONSOR, POOL - 1))
    with pytest.raises(InsufficientBalance):
        env.post()


def test_invalid_post_bad_outer_override() -> None:
    env = Env()
    with pytest.raises(TenzroError):
        env.post(spec=make_spec(metadata={"outer_lr": -1}))


def test_invalid_post_grace_window_above_the_nodes_limit() -> None:
    env = Env()
    with pytest.raises(SpecError) as info:
        process_post_task(make_spec(), SPONSOR, env.ledger, 0, TIMINGS, INITIAL_MODEL, max_grace_window_ms=GRACE_MS - 1)
    assert info.value.path == "grace_window_ms"
    t = process_post_task(make_spec(), SPONSOR, env.ledger, 0, TIMINGS, INITIAL_MODEL, max_grace_window_ms=GRACE_MS)
    assert t.run.status is RunStatus.POSTED


def test_invalid_post_receipt_bound_above_the_nodes_limit() -> None:
    """A run whose receipt could outgrow what a claim carries is refused at posting: its
    trainers could never be paid on chain (found by the contracts review)."""
    from tenzro_training.receipt_abi import compute_receipt_size_bound

    env = Env()
    spec = make_spec()
    bound = compute_receipt_size_bound(spec)
    with pytest.raises(SpecError) as info:
        process_post_task(spec, SPONSOR, env.ledger, 0, TIMINGS, INITIAL_MODEL, max_receipt_bytes=bound - 1)
    assert info.value.path == "max_rounds"
    assert f"receipt of {bound} bytes" in info.value.reason and "chain tasks" in info.value.reason
    t = process_post_task(spec, SPONSOR, env.ledger, 0, TIMINGS, INITIAL_MODEL, max_receipt_bytes=bound)
    assert t.run.status is RunStatus.POSTED


def test_invalid_post_trainer_count_above_the_nodes_limit() -> None:
    """One claim credits every payee (~36K gas each): past ~900 trainers no claim fits a block
    whatever the receipt's size (found by the second contracts review)."""
    env = Env()
    spec = make_spec()
    with pytest.raises(SpecError) as info:
        process_post_task(spec, SPONSOR, env.ledger, 0, TIMINGS, INITIAL_MODEL, max_trainer_count=spec.trainer_count - 1)
    assert info.value.path == "trainer_count" and "max_trainer_count" in info.value.reason
    t = process_post_task(spec, SPONSOR, env.ledger, 0, TIMINGS, INITIAL_MODEL, max_trainer_count=spec.trainer_count)
    assert t.run.status is RunStatus.POSTED


def test_invalid_post_rule_undefined_for_a_straggler_count() -> None:
    """The value loads (a stored run or a sealed receipt may hold it), but no new run starts."""
    doc = make_spec(trainer_count=4, quorum=3).to_dict()
    doc["aggregation"] = {"TrimmedMean": {"alpha_bps": 5000}}
    spec = TrainingTaskSpec.from_dict(doc, supported_only=False)
    env = Env()
    with pytest.raises(SpecError) as info:
        env.apply(process_post_task, spec, SPONSOR, env.ledger, 0, TIMINGS, INITIAL_MODEL)
    assert info.value.path == "aggregation"


def test_invalid_post_different_spec_under_same_task_id() -> None:
    env = Env()
    env.post()
    first = env.run
    with pytest.raises(TaskExists):
        process_post_task(make_spec(max_rounds=3), SPONSOR, env.ledger, 5, TIMINGS, INITIAL_MODEL, existing=first)
    replay = process_post_task(make_spec(), SPONSOR, env.ledger, 5, TIMINGS, INITIAL_MODEL, existing=first)
    assert replay.run is first and replay.ledger is env.ledger and replay.events == ()


def test_invalid_ticket_after_election_window() -> None:
    env = Env()
    env.post()
    with pytest.raises(InvalidState):
        env.apply(process_ticket, candidate(0), ticket(0, env.run.election.seed), TIMINGS.election_window_ms + 1)


def test_invalid_ticket_bad_proof_and_conflicts() -> None:
    env = Env()
    env.post()
    seed = env.run.election.seed
    forged = Ticket(SYNCERS[0], candidate(0).vrf_public_key, ticket(1, seed).proof)
    with pytest.raises(ElectionError):
        env.apply(process_ticket, candidate(0), forged, 5)
    with pytest.raises(ElectionError):  # wrong seed
        env.apply(process_ticket, candidate(0), ticket(0, h("other seed")), 5)
    env.apply(process_ticket, candidate(0), ticket(0, seed), 5)
    replay = env.apply(process_ticket, candidate(0), ticket(0, seed), 6)
    assert replay.events == ()
    with pytest.raises(ElectionError):  # same address, different registration
        env.apply(process_ticket, candidate(0, stake=5), ticket(0, seed), 7)
    with pytest.raises(ElectionError):  # another address reusing the VRF key
        twin = Candidate(SYNCERS[2], candidate(0).vrf_public_key, 100)
        env.apply(process_ticket, twin, Ticket(SYNCERS[2], twin.vrf_public_key, ticket(0, seed).proof), 8)


def test_invalid_enroll_before_election_closed() -> None:
    env = Env()
    env.post()
    with pytest.raises(InvalidState):
        env.enroll(0, 50)


def test_invalid_enroll_full() -> None:
    env = Env()
    env.to_training()
    with pytest.raises(RunFull):
        env.enroll(3, 300)


def test_invalid_enroll_low_stake() -> None:
    env = Env()
    env.post()
    env.elect()
    with pytest.raises(StakeTooLow) as info:
        env.enroll(0, 200, stake=TIMINGS.min_stake - 1)
    assert info.value.minimum == TIMINGS.min_stake and info.value.got == TIMINGS.min_stake - 1


def test_invalid_enroll_conflict_and_idempotent_replay() -> None:
    env = Env()
    env.post()
    env.elect()
    env.enroll(0, 200)
    before = env.run
    replay = env.enroll(0, 250)
    assert replay.run == before and replay.events == ()
    with pytest.raises(EnrollmentConflict):
        env.enroll(0, 260, stake=STAKE + 1)
    with pytest.raises(EnrollmentConflict):
        env.apply(process_enroll, TRAINERS[0], "did:tenzro:node:someone-else", STAKE, 260)


def test_invalid_enroll_bad_arguments() -> None:
    env = Env()
    env.post()
    env.elect()
    for args in (
        (TRAINERS[0][:19], DIDS[0], STAKE, 200),
        (TRAINERS[0], "did:web:example.com", STAKE, 200),
        (TRAINERS[0], DIDS[0], -1, 200),
        (TRAINERS[0], DIDS[0], True, 200),
        (TRAINERS[0], DIDS[0], STAKE, -5),
    ):
        with pytest.raises(InvalidRunArgument):
            env.apply(process_enroll, *args)


def test_invalid_enroll_after_training_started_with_fewer_than_m() -> None:
    env = Env()
    env.post()
    env.elect()
    env.enroll(0, 200)
    env.enroll(1, 210)
    env.apply(process_tick, 100 + TIMINGS.enrollment_window_ms + 1)
    assert env.run.status is RunStatus.TRAINING and len(env.run.trainers) == 2
    with pytest.raises(InvalidState):
        env.enroll(2, 1200)


def test_invalid_submission_not_enrolled() -> None:
    env = Env()
    env.to_training()
    with pytest.raises(NotEnrolled):
        env.apply(process_submission, TRAINERS[3], 0, 0, h("x"), 300)


def test_invalid_submission_wrong_round() -> None:
    env = Env()
    env.to_training()
    with pytest.raises(RoundMismatch) as info:
        env.submit(0, 0, 300, round_=1)
    assert info.value.expected == 0 and info.value.got == 1


def test_invalid_submission_late_after_straggler_window() -> None:
    env = _round_0_at_quorum()
    env.submit(2, 0, 310 + GRACE_MS)  # at the deadline: in time
    with pytest.raises(LateSubmission):
        env.submit(2, 1, 310 + GRACE_MS + 1)


def play_to_sealed(env: Env, *, with_failover: bool = False) -> Env:
    """A run in training, round 0 (every trainer) and round 1 (trainers 0 and 2) finalized: Sealed.
    ``with_failover``: round 1's syncer misses its window and the next-ranked one finalizes."""
    for f in (0, 1):
        for i in range(3):
            env.submit(i, f, 300)
    env.finalize(400)
    for f in (0, 1):
        env.submit(0, f, 500)
        env.submit(2, f, 510)
    now = 510 + GRACE_MS + 1
    if with_failover:
        assert env.run is not None and env.run.current_round is not None
        deadline = env.run.current_round.finalize_deadline_ms
        assert deadline is not None
        env.apply(process_tick, deadline + 1)
        now = deadline + 1
    env.finalize(now)
    return env


def _round_0_at_quorum() -> Env:
    """A run in training whose round 0 has quorum: trainers 0 and 1 submitted both fragments
    (quorum at 310; trainer 2 absent)."""
    env = Env()
    env.to_training()
    for f in (0, 1):
        env.submit(0, f, 300)
        env.submit(1, f, 310)
    return env


def _round_0_finalized() -> Env:
    """``_round_0_at_quorum`` with round 0 finalized once its straggler window closed."""
    env = _round_0_at_quorum()
    env.finalize(310 + GRACE_MS + 1)
    return env


def test_invalid_submission_late_for_finalized_round() -> None:
    env = _round_0_finalized()
    with pytest.raises(LateSubmission):
        env.submit(2, 0, 2000, round_=0)


def test_invalid_submission_after_the_run_ended_names_the_right_refusal() -> None:
    # Sealed: a round it committed is LateSubmission; any other round (from max_rounds on)
    # is InvalidState, the run no longer trains. Ended without that round: InvalidState too.
    env = Env()
    env.to_training()
    for r in range(2):
        for f in (0, 1):
            env.submit(0, f, 300 + 10_000 * r)
            env.submit(1, f, 310 + 10_000 * r)
        env.finalize(310 + 10_000 * r + GRACE_MS + 1)
    assert env.run.status is RunStatus.SEALED and len(env.run.records) == 2
    for r in (0, 1):
        with pytest.raises(LateSubmission):
            env.submit(2, 0, 50_000, round_=r)
    for r in (2, 3):
        with pytest.raises(InvalidState):
            env.submit(2, 0, 50_000, round_=r)

    failed = _round_0_finalized()
    failed.apply(process_tick, 10**9)  # round 1 never reached quorum
    assert failed.run.status is RunStatus.FAILED and len(failed.run.records) == 1
    with pytest.raises(InvalidState):
        failed.submit(2, 0, 10**9, round_=0)


def test_invalid_submission_of_a_past_round_by_a_stranger_is_not_enrolled() -> None:
    # Who may submit is checked before the round: a stranger learns nothing about the rounds.
    env = _round_0_finalized()
    with pytest.raises(NotEnrolled):
        env.apply(process_submission, TRAINERS[3], 0, 0, h("x"), 2000)


def test_invalid_submission_bad_fragment_and_hash() -> None:
    env = Env()
    env.to_training()
    with pytest.raises(InvalidRunArgument):
        env.apply(process_submission, TRAINERS[0], 0, 2, h("x"), 300)
    with pytest.raises(InvalidRunArgument):
        env.apply(process_submission, TRAINERS[0], 0, 0, b"short", 300)


def test_invalid_submission_before_training() -> None:
    env = Env()
    env.post()
    env.elect()
    env.enroll(0, 200)
    with pytest.raises(InvalidState):
        env.submit(0, 0, 210, round_=0)


def test_submission_replay_is_a_no_op() -> None:
    env = Env()
    env.to_training()
    env.submit(0, 0, 300)
    before = env.run
    t = env.submit(0, 0, 301)
    assert t.run == before and t.events == () and t.error is None


def test_accepted_set_is_open_before_quorum_and_outside_training() -> None:
    # The node's getRun view asks this of every run, whatever its state: it answers, never raises.
    env = Env()
    env.post()
    assert not is_accepted_set_closed(env.run, 10**9)  # Posted: no round at all
    env.elect()
    assert not is_accepted_set_closed(env.run, 10**9)  # Enrolling
    for i, now in enumerate((200, 210, 220)):
        env.enroll(i, now)
    for f in (0, 1):
        env.submit(0, f, 300)
    assert env.run.current_round.straggler_deadline_ms is None  # below quorum: no window yet
    assert not is_accepted_set_closed(env.run, 10**9)
    env.submit(1, 0, 310)
    env.submit(1, 1, 320)
    assert not is_accepted_set_closed(env.run, 320 + GRACE_MS)  # quorum, window open (inclusive)
    assert is_accepted_set_closed(env.run, 320 + GRACE_MS + 1)
    env.finalize(320 + GRACE_MS + 1)
    env.apply(process_tick, 10**9)  # round 1 times out: Failed
    assert env.run.status is RunStatus.FAILED and env.run.current_round is None
    assert not is_accepted_set_closed(env.run, 10**9)


def test_invalid_cancel_after_training_started() -> None:
    env = Env()
    env.to_training()
    with pytest.raises(InvalidState):
        env.apply(process_cancel, SPONSOR, 300)


def test_invalid_cancel_by_non_sponsor() -> None:
    env = Env()
    env.post()
    with pytest.raises(NotSponsor):
        env.apply(process_cancel, OTHER, 5)


def test_invalid_finalize_before_quorum() -> None:
    env = Env()
    env.to_training()
    env.submit(0, 0, 300)
    env.submit(1, 0, 300)
    env.submit(0, 1, 300)
    with pytest.raises(QuorumNotReached) as info:
        env.finalize(400)
    assert info.value.counts == (2, 1) and info.value.quorum == 2


def test_invalid_finalize_by_non_syncer() -> None:
    env = Env()
    env.to_training()
    for f in (0, 1):
        for i in range(3):
            env.submit(i, f, 300)
    not_syncer = ranked(env)[1]
    with pytest.raises(NotSyncer):
        env.finalize(400, signer=not_syncer)
    with pytest.raises(NotSyncer):
        env.finalize(400, signer=TRAINERS[0])


def test_invalid_finalize_wrong_round_and_outcomes() -> None:
    env = Env()
    env.to_training()
    for f in (0, 1):
        for i in range(3):
            env.submit(i, f, 300)
    syncer = get_current_syncer(env.run)
    good = outcomes_for(env.run)
    with pytest.raises(RoundMismatch):
        env.apply(process_finalize, syncer, 1, good, model_after(0), 400)
    with pytest.raises(InvalidRunArgument):  # one fragment missing
        env.apply(process_finalize, syncer, 0, good[:1], model_after(0), 400)
    partial = FragmentOutcome(good[0].aggregate_hash, good[0].accepted[:2], 0, 0, good[0].report_hash)
    with pytest.raises(InvalidRunArgument):  # aggregates only K of the 3 accepted
        env.apply(process_finalize, syncer, 0, [partial, good[1]], model_after(0), 400)
    with pytest.raises(InvalidRunArgument):  # Mean has no Krum selection
        bad = FragmentOutcome(good[0].aggregate_hash, good[0].accepted, 1, 0, good[0].report_hash)
        env.apply(process_finalize, syncer, 0, [bad, good[1]], model_after(0), 400)
    with pytest.raises(InvalidRunArgument):
        env.apply(process_finalize, syncer, 0, good, b"\x00" * 31, 400)


def test_finalize_replay_is_a_no_op_and_other_past_round_is_rejected() -> None:
    env = Env()
    env.to_training()
    for f in (0, 1):
        for i in range(3):
            env.submit(i, f, 300)
    syncer = get_current_syncer(env.run)
    outcomes = outcomes_for(env.run)
    env.apply(process_finalize, syncer, 0, outcomes, model_after(0), 400)
    after = env.run
    replay = env.apply(process_finalize, syncer, 0, outcomes, model_after(0), 401)
    assert replay.run == after and replay.events == ()
    with pytest.raises(RoundMismatch):
        env.apply(process_finalize, syncer, 0, outcomes, h("another model"), 401)


# --- equivocation -------------------------------------------------------------------------------


def test_equivocation_slashes_excludes_and_keeps_evidence() -> None:
    env = Env()
    env.to_training()
    env.submit(0, 0, 300)
    env.submit(0, 1, 300)
    env.submit(1, 0, 310)
    env.submit(2, 1, 310)
    env.submit(2, 0, 320)
    assert env.run.current_round.quorum_at_ms == 310
    first = payload(TRAINERS[2], 0, 0, 0)
    t = env.submit(2, 0, 330, variant=1)
    assert isinstance(t.error, Equivocation) and t.error.round == 0 and t.error.fragment == 0
    evidence = [e for e in t.events if isinstance(e, EquivocationDetected)][0]
    assert evidence.trainer == TRAINERS[2]
    assert (evidence.first_payload_hash, evidence.second_payload_hash) == (first, payload(TRAINERS[2], 0, 0, 1))
    slash = [e for e in t.events if isinstance(e, TrainerSlashed)][0]
    assert slash.amount == STAKE
    # Stake burned, trainer marked, its submissions of this round dropped everywhere.
    assert env.ledger.burned == STAKE and env.ledger.bond_of("run-test", TRAINERS[2]) is None
    assert env.ledger.total_supply() == env.supply - STAKE
    assert env.run.trainers[2].slashed
    assert [a for a, _ in get_accepted_submissions(env.run, 0)] == [TRAINERS[0], TRAINERS[1]]
    assert [a for a, _ in get_accepted_submissions(env.run, 1)] == [TRAINERS[0]]
    # Fragment 1 fell below K: the quorum is lost again.
    assert any(isinstance(e, QuorumLost) for e in t.events)
    assert env.run.current_round.quorum_at_ms is None
    with pytest.raises(NotEnrolled):
        env.submit(2, 1, 340, variant=2)
    env.submit(1, 1, 350)
    assert env.run.current_round.quorum_at_ms == 350
    # Two unslashed trainers have submitted everything: finalize without waiting.
    env.finalize(360)
    assert TRAINERS[2] not in env.run.records[0].fragments[0].accepted
    # Round 1 and sealing: the slashed trainer gets no payout and no stake back.
    for f in (0, 1):
        env.submit(0, f, 400)
        env.submit(1, f, 400)
    t = env.finalize(401)
    sealed = [e for e in t.events if isinstance(e, RunSealed)][0]
    assert dict(sealed.payouts) == {TRAINERS[0]: POOL // 2, TRAINERS[1]: POOL // 2}
    assert env.ledger.balance_of(TRAINERS[2]) == BALANCE - STAKE
    assert env.ledger.total_supply() == env.supply - STAKE


def test_equivocation_leaving_fewer_than_k_fails_the_run_and_refunds() -> None:
    env = Env()
    env.post()
    env.elect()
    env.enroll(0, 200)
    env.enroll(1, 210)
    env.apply(process_tick, 1101)  # K=2 enrolled: training with two trainers
    env.submit(0, 0, 1200)
    t = env.submit(0, 0, 1201, variant=1)
    assert isinstance(t.error, Equivocation)
    assert env.run.status is RunStatus.FAILED
    assert env.ledger.escrow_of("run-test") is None and env.ledger.balance_of(SPONSOR) == 10_000
    assert env.ledger.balance_of(TRAINERS[1]) == BALANCE
    assert env.ledger.balance_of(TRAINERS[0]) == BALANCE - STAKE


def test_equivocation_proven_outside_submissions_slashes_like_a_submission() -> None:
    """process_equivocation: two signed hashes the shell saw (gossip) but not both submitted."""
    env = Env()
    env.to_training()
    env.submit(1, 0, 300)
    env.submit(2, 0, 300)
    env.submit(1, 1, 305)
    env.submit(2, 1, 306)
    assert env.run.current_round.quorum_at_ms == 306
    first, second = payload(TRAINERS[2], 0, 1, 0), payload(TRAINERS[2], 0, 1, 1)
    t = env.apply(process_equivocation, TRAINERS[2], 0, 1, first, second, 310)
    assert isinstance(t.error, Equivocation) and (t.error.round, t.error.fragment) == (0, 1)
    detected = [e for e in t.events if isinstance(e, EquivocationDetected)]
    assert [(e.trainer, e.fragment, e.first_payload_hash, e.second_payload_hash) for e in detected] == [
        (TRAINERS[2], 1, first, second)
    ]
    assert env.ledger.burned == STAKE and env.run.trainers[2].slashed
    assert [a for a, _ in get_accepted_submissions(env.run, 0)] == [TRAINERS[1]]  # all its fragments dropped
    assert env.run.current_round.quorum_at_ms is None and any(isinstance(e, QuorumLost) for e in t.events)
    # The same evidence again (or any other of this trainer): a no-op, nothing burned twice.
    t = env.apply(process_equivocation, TRAINERS[2], 0, 1, first, second, 320)
    assert t.error is None and t.events == () and env.ledger.burned == STAKE


def test_equivocation_over_a_finalized_round_slashes_in_the_current_round() -> None:
    """Evidence naming a committed round slashes now: the record keeps the trainer's inputs,
    the current round drops them, the event names both rounds."""
    env = Env()
    env.to_training()
    for i in (0, 1, 2):
        for f in (0, 1):
            env.submit(i, f, 300 + i)
    env.finalize(302 + GRACE_MS + 1)
    committed = env.run.records[0]
    now = 302 + GRACE_MS + 10
    for f in (0, 1):
        env.submit(2, f, now)
    first, second = payload(TRAINERS[2], 0, 1, 0), payload(TRAINERS[2], 0, 1, 1)
    t = env.apply(process_equivocation, TRAINERS[2], 0, 1, first, second, now + 1)
    assert isinstance(t.error, Equivocation) and (t.error.round, t.error.fragment) == (0, 1)
    (detected,) = [e for e in t.events if isinstance(e, EquivocationDetected)]
    assert (detected.round, detected.slashed_in_round, detected.fragment) == (0, 1, 1)
    assert env.ledger.burned == STAKE and env.run.trainers[2].slashed
    assert env.run.records[0] == committed and TRAINERS[2] in committed.fragments[1].accepted
    assert all(not subs for subs in env.run.current_round.submissions)  # its round-1 inputs dropped


def test_invalid_equivocation_evidence_is_refused_without_effect() -> None:
    env = Env()
    env.post()
    a, b = payload(TRAINERS[0], 0, 0, 0), payload(TRAINERS[0], 0, 0, 1)
    with pytest.raises(InvalidState):  # not Training yet
        env.apply(process_equivocation, TRAINERS[0], 0, 0, a, b, 10)
    env.elect()
    for i, now in enumerate((200, 210, 220)):
        env.enroll(i, now)
    with pytest.raises(InvalidRunArgument):  # one payload is no equivocation
        env.apply(process_equivocation, TRAINERS[0], 0, 0, a, a, 300)
    with pytest.raises(InvalidRunArgument):
        env.apply(process_equivocation, TRAINERS[0], 0, 2, a, b, 300)  # fragment out of range
    with pytest.raises(InvalidRunArgument):
        env.apply(process_equivocation, TRAINERS[0], 0, 0, a[:31], b, 300)
    with pytest.raises(NotEnrolled):
        env.apply(process_equivocation, h("stranger")[:20], 0, 0, a, b, 300)
    with pytest.raises(RoundMismatch):
        env.apply(process_equivocation, TRAINERS[0], 1, 0, a, b, 300)
    assert env.ledger.burned == 0 and not any(t.slashed for t in env.run.trainers)


# --- failover -----------------------------------------------------------------------------------


def test_failover_after_finalize_deadline_moves_to_rank_2_and_is_recorded() -> None:
    env = _round_0_at_quorum()
    deadline = env.run.current_round.finalize_deadline_ms
    assert deadline == 310 + GRACE_MS + TIMINGS.finalize_window_ms
    first, second = ranked(env)
    env.apply(process_tick, deadline)  # inclusive: rank 1 still in time
    assert env.run.syncer_rank == 1
    t = env.apply(process_tick, deadline + 1)
    failover = [e for e in t.events if isinstance(e, SyncerFailover)][0]
    assert (failover.from_syncer, failover.to_syncer, failover.to_rank) == (first, second, 2)
    assert env.run.syncer_rank == 2 and get_current_syncer(env.run) == second
    assert len(env.run.failovers) == 1
    record = env.run.failovers[0]
    assert (record.round, record.from_syncer, record.to_syncer, record.at_ms) == (0, first, second, deadline)
    assert env.run.current_round.finalize_deadline_ms == deadline + TIMINGS.finalize_window_ms
    with pytest.raises(NotSyncer):
        env.finalize(deadline + 2, signer=first)
    env.finalize(deadline + 2)
    assert env.run.records[0].syncer == second and env.run.records[0].syncer_rank == 2
    view = compute_run_view(env.run, deadline + 3)
    assert view["failovers"][0]["to_rank"] == 2


def test_failover_applies_even_when_the_late_syncer_calls_without_a_tick() -> None:
    env = _round_0_at_quorum()
    first = ranked(env)[0]
    late = env.run.current_round.finalize_deadline_ms + 1
    with pytest.raises(NotSyncer):
        env.finalize(late, signer=first)
    assert env.run.syncer_rank == 1  # the refused call stored nothing


def test_a_pause_moves_pending_deadlines_and_spares_the_healthy_syncer() -> None:
    """Syncer probe: a 15 s node restart inside the finalize window failed the run over every
    ranked syncer, none of whom could call while the node was down."""
    env = _round_0_at_quorum()
    r = env.run.current_round
    deadlines = (r.round_deadline_ms, r.straggler_deadline_ms, r.finalize_deadline_ms)
    paused_at, resumed_at = r.straggler_deadline_ms - 100, 10**6  # down across both windows
    t = env.apply(process_pause, paused_at, resumed_at)
    by = resumed_at - paused_at
    (event,) = t.events
    assert isinstance(event, DeadlinesExtended) and (event.at_ms, event.paused_at_ms, event.by_ms) == (resumed_at, paused_at, by)
    r = env.run.current_round
    assert (r.round_deadline_ms, r.straggler_deadline_ms, r.finalize_deadline_ms) == tuple(d + by for d in deadlines)
    assert r.quorum_at_ms == 310 + 0 and env.run.updated_at_ms == resumed_at  # an instant, not a deadline
    env.apply(process_tick, resumed_at + 1)
    assert env.run.syncer_rank == 1 and env.run.status is RunStatus.TRAINING  # no failover, no failure
    env.finalize(r.straggler_deadline_ms + 1)  # the elected syncer, in time; the straggler got its window back
    assert env.run.records[0].syncer_rank == 1


def test_a_pause_moves_only_deadlines_still_pending() -> None:
    env = Env()
    env.post()
    for i in (0, 1):
        env.apply(process_ticket, candidate(i), ticket(i, env.run.election.seed), 10 + i)
    old = env.run.election.deadline_ms
    t = env.apply(process_pause, old, old + 5000)  # inclusive: still pending at the pause
    assert env.run.election.deadline_ms == old + 5000 and len(t.events) == 1
    env.apply(process_tick, old + 1)
    assert env.run.status is RunStatus.ELECTING  # the window is still open
    env.apply(process_tick, old + 5001)
    assert env.run.status is RunStatus.ENROLLING
    enrollment = env.run.enrollment_deadline_ms
    env.apply(process_pause, enrollment - 10, enrollment + 990)
    assert env.run.enrollment_deadline_ms == enrollment + 1000


def test_a_deadline_passed_before_the_pause_takes_effect_at_its_instant_and_what_follows_moves() -> None:
    """Election probe (2026-11-26): a deadline the node enforced in a call (a late submission,
    enrollment or finalize refused) before any tick committed it used to move later at a
    restart, reopening what was closed; left unapplied instead, the pause was charged to what
    follows it. It takes effect at its own instant, as a tick at the pause would have, and the
    deadlines it opens move by the pause."""
    def elected(env: Env) -> int:
        env.post()
        for i in (0, 1):
            env.apply(process_ticket, candidate(i), ticket(i, env.run.election.seed), 10 + i)
        return env.run.election.deadline_ms

    reference = Env()
    old = elected(reference)
    reference.apply(process_tick, old + 1)
    opened = reference.run.enrollment_deadline_ms  # what a tick just after the election gives

    env = Env()
    assert elected(env) == old
    t = env.apply(process_pause, old + 1, old + 5000)
    assert env.run.status is RunStatus.ENROLLING  # the election closed at its deadline
    assert env.run.enrollment_deadline_ms == opened + 4999  # the window it opened moved by the pause
    assert isinstance(t.events[-1], DeadlinesExtended) and len(t.events) > 1

    env = Env()
    env.to_training()
    deadline = env.run.current_round.round_deadline_ms  # no quorum
    t = env.apply(process_pause, deadline + 1, deadline + 10_000)
    assert env.run.status is RunStatus.FAILED and env.run.ended_at_ms == deadline  # at its instant
    assert not any(isinstance(e, DeadlinesExtended) for e in t.events)  # nothing was pending


def test_a_refusal_rests_on_a_passed_uncommitted_deadline_only_when_one_is_due_or_the_straggler_window_closed() -> None:
    """What the node records the instant of at a refusal (docs/lifecycle.md "Time"): a call that
    may have been judged on a deadline a restart would otherwise move later."""
    env = _round_0_at_quorum()
    r = env.run.current_round
    straggler, finalize = r.straggler_deadline_ms, r.finalize_deadline_ms
    assert not has_passed_uncommitted_deadline(env.run, straggler, None)  # inclusive: still open
    assert has_passed_uncommitted_deadline(env.run, straggler + 1, None)
    assert has_passed_uncommitted_deadline(env.run, straggler + 1, straggler)  # passed after that write
    assert not has_passed_uncommitted_deadline(env.run, straggler + 1, straggler + 1)  # before it: kept anyway
    assert has_passed_uncommitted_deadline(env.run, finalize + 1, finalize + 1)  # a failover due, not committed
    env = Env()
    env.to_training()  # no submission: only the round deadline is pending
    deadline = env.run.current_round.round_deadline_ms
    assert not has_passed_uncommitted_deadline(env.run, deadline, None)
    assert has_passed_uncommitted_deadline(env.run, deadline + 1, deadline + 1)
    env.apply(process_tick, deadline + 1)  # committed: the run failed, nothing is pending
    assert not has_passed_uncommitted_deadline(env.run, deadline + 5, None)


def test_a_pause_starting_at_a_round_deadline_still_moves_it() -> None:
    # Deadlines are inclusive: at paused_at == deadline a call would still have been in time.
    env = Env()
    env.to_training()
    deadline = env.run.current_round.round_deadline_ms  # no quorum: the only pending deadline
    t = env.apply(process_pause, deadline, deadline + 5000)
    assert env.run.current_round.round_deadline_ms == deadline + 5000 and len(t.events) == 1
    env.apply(process_tick, deadline + 1)
    assert env.run.status is RunStatus.TRAINING  # the round did not time out during the pause

    env = _round_0_at_quorum()
    r = env.run.current_round
    finalize = r.finalize_deadline_ms  # the round and straggler deadlines are already past
    env.apply(process_pause, finalize, finalize + 5000)
    r = env.run.current_round
    assert r.finalize_deadline_ms == finalize + 5000
    env.apply(process_tick, finalize + 1)
    assert env.run.syncer_rank == 1  # no failover


def test_a_pause_of_no_time_changes_nothing() -> None:
    env = Env()
    env.to_training()
    before = env.run
    assert env.apply(process_pause, 5_000, 5_000).events == ()  # no time passed
    assert env.run is before
    with pytest.raises(InvalidRunArgument):
        env.apply(process_pause, -1, 5)


def test_ranking_exhausted_fails_and_refunds() -> None:
    env = Env()
    env.post()
    env.elect(syncers=(0,))
    for i, now in enumerate((200, 210, 220)):
        env.enroll(i, now)
    for f in (0, 1):
        env.submit(0, f, 300)
        env.submit(1, f, 310)
    t = env.apply(process_tick, 10**6)
    assert env.run.status is RunStatus.FAILED
    assert "missed its finalize deadline" in [e for e in t.events if isinstance(e, RunFailed)][0].reason
    assert env.ledger.balance_of(SPONSOR) == 10_000
    assert all(env.ledger.balance_of(t) == BALANCE for t in TRAINERS)


# --- failures and cancellation ------------------------------------------------------------------


def test_enrollment_deadline_with_fewer_than_k_fails_and_refunds_everything() -> None:
    env = Env()
    env.post()
    env.elect()
    env.enroll(0, 200)
    assert env.ledger.balance_of(TRAINERS[0]) == BALANCE - STAKE
    deadline = env.run.enrollment_deadline_ms
    env.apply(process_tick, deadline)
    assert env.run.status is RunStatus.ENROLLING
    t = env.apply(process_tick, deadline + 1)
    assert env.run.status is RunStatus.FAILED and env.run.ended_at_ms == deadline
    assert "1 trainer(s) enrolled" in env.run.end_reason
    assert [type(e).__name__ for e in t.events] == ["RunFailed"]
    assert env.ledger.balance_of(SPONSOR) == 10_000
    assert env.ledger.balance_of(TRAINERS[0]) == BALANCE
    assert env.ledger.escrow_of("run-test") is None and not list(env.ledger.bonds_of("run-test"))
    assert env.ledger == funded_ledger()


def test_election_without_tickets_fails_and_refunds() -> None:
    env = Env()
    env.post()
    env.apply(process_tick, TIMINGS.election_window_ms + 1)
    assert env.run.status is RunStatus.FAILED and env.run.election.ranking == ()
    assert env.ledger == funded_ledger()


def test_round_timeout_without_quorum_fails_and_refunds() -> None:
    env = Env()
    env.to_training()
    env.submit(0, 0, 300)
    deadline = env.run.current_round.round_deadline_ms
    with pytest.raises(InvalidState):  # the submission would come after the run failed
        env.submit(1, 0, deadline + 1)
    env.apply(process_tick, deadline + 1)
    assert env.run.status is RunStatus.FAILED and env.run.ended_at_ms == deadline
    assert env.ledger == funded_ledger()


def test_cancel_before_training_refunds_escrow_and_bonds() -> None:
    env = Env()
    env.post()
    env.elect()
    env.enroll(0, 200)
    env.enroll(1, 210)
    t = env.apply(process_cancel, SPONSOR, 300)
    assert env.run.status is RunStatus.CANCELLED and [type(e).__name__ for e in t.events] == ["RunCancelled"]
    assert env.ledger == funded_ledger()
    again = env.apply(process_cancel, SPONSOR, 301)
    assert again.run == t.run and again.events == ()
    with pytest.raises(InvalidState):
        env.enroll(2, 302)


def test_cancel_right_after_posting() -> None:
    env = Env()
    env.post()
    env.apply(process_cancel, SPONSOR, 0)
    assert env.run.status is RunStatus.CANCELLED and env.ledger == funded_ledger()


# --- time handling ------------------------------------------------------------------------------


def test_deadlines_apply_in_order_regardless_of_tick_granularity() -> None:
    one_jump, fine = Env(), Env()
    for env in (one_jump, fine):
        env.post()
        env.apply(process_ticket, candidate(0), ticket(0, env.run.election.seed), 10)
    one_jump.apply(process_tick, 50_000)
    for now in range(0, 50_001, 37):
        fine.apply(process_tick, now)
    fine.apply(process_tick, 50_000)
    assert one_jump.run == fine.run and one_jump.ledger == fine.ledger
    assert one_jump.run.status is RunStatus.FAILED  # election closed, then nobody enrolled
    assert [type(e).__name__ for e in one_jump.events] == [type(e).__name__ for e in fine.events]


def test_clock_stepping_back_is_treated_as_the_last_instant() -> None:
    env = Env()
    env.to_training()
    env.submit(0, 0, 500)
    t = env.submit(1, 0, 100)  # earlier than the last transition
    assert t.run.current_round.submissions[0][1].accepted_at_ms == 500
    assert env.run.updated_at_ms == 500


def test_event_dicts_are_json() -> None:
    env = Env()
    env.to_training()
    for e in env.events:
        d = e.to_dict()
        assert d["type"] == type(e).__name__ and d["task_id"] == "run-test"
        json.dumps(d)


def test_lifecycle_events_carry_each_fact_under_its_own_name() -> None:
    """Events are built positionally, then logged and gossiped by field name: each field must
    hold what its name says (two deadlines, an address and a stake, a seed and a deadline)."""
    from tenzro_training.run import ElectionOpened, RoundStarted, RunPosted, SyncerElected, TicketAccepted

    env = Env()
    env.post(now=0)
    env.elect()
    for i, now in enumerate((200, 210, 220)):
        env.enroll(i, now)
    for f in (0, 1):
        env.submit(0, f, 300)
        env.submit(1, f, 330)
    run = env.run
    assert run is not None
    by_type: dict[str, list[Any]] = {}
    for e in env.events:
        by_type.setdefault(type(e).__name__, []).append(e)
    (posted,) = by_type["RunPosted"]
    assert isinstance(posted, RunPosted)
    assert (posted.sponsor, posted.spec_hash, posted.reward_pool) == (SPONSOR, run.spec.spec_hash(), POOL)
    (opened,) = by_type["ElectionOpened"]
    assert isinstance(opened, ElectionOpened)
    assert (opened.seed, opened.deadline_ms) == (run.election.seed, TIMINGS.election_window_ms)
    tickets = by_type["TicketAccepted"]
    assert all(isinstance(t, TicketAccepted) for t in tickets)
    assert [(t.candidate, t.stake) for t in tickets] == [(SYNCERS[0], 100), (SYNCERS[1], 100)]
    (elected,) = by_type["SyncerElected"]
    assert isinstance(elected, SyncerElected)
    assert (elected.syncer, elected.ranked, elected.enrollment_deadline_ms) == (
        ranked(env)[0], 2, TIMINGS.election_window_ms + TIMINGS.enrollment_window_ms)
    (started,) = by_type["RoundStarted"]
    assert isinstance(started, RoundStarted)
    assert (started.round, started.round_deadline_ms, started.model_hash) == (
        0, 220 + TIMINGS.round_timeout_ms, INITIAL_MODEL)
    (quorum,) = by_type["QuorumReached"]
    assert (quorum.round, quorum.straggler_deadline_ms, quorum.finalize_deadline_ms) == (
        0, 330 + GRACE_MS, 330 + GRACE_MS + TIMINGS.finalize_window_ms)


def test_event_dicts_send_hashes_as_0x_hex_and_unsafe_integers_as_strings() -> None:
    """Many JSON readers round integers past 2^53: those travel as decimal strings, the largest
    safe one (2^53 - 1) as a number; 32-byte hashes as 0x hex, 20-byte addresses in EIP-55."""
    from tenzro_training.addresses import format_address

    sealed = RunSealed("t", 2**53 - 1, h("root"), h("model"), ((TRAINERS[0], 2**53),), 2**53 - 1)
    assert sealed.to_dict() == {
        "type": "RunSealed", "task_id": "t", "at_ms": 2**53 - 1, "run_root": "0x" + h("root").hex(),
        "final_model_hash": "0x" + h("model").hex(), "payouts": [[format_address(TRAINERS[0]), str(2**53)]],
        "remainder": 2**53 - 1,
    }


def test_invalid_event_field_of_a_type_without_a_json_form() -> None:
    """A field type to_dict does not define is a bug in the event, refused rather than logged as is."""
    with pytest.raises(TypeError, match="unexpected event field type float"):
        RunFailed("t", 0, 1.5).to_dict()  # type: ignore[arg-type]


def test_invalid_from_dict_rejects_tampered_state() -> None:
    env = Env()
    env.to_training()
    good = env.run.to_dict()
    from tenzro_training.errors import EncodingError

    for mutate in (
        lambda d: d.update(status="Sealed"),
        lambda d: d.update(spec_hash="0x" + "00" * 32),
        lambda d: d["trainers"][0].update(shard_index=5),
        lambda d: d.update(version=2),
        lambda d: d.update(extra=1),
        lambda d: d["current_round"].update(round=1),
        lambda d: d["trainers"][0].update(stake=50),
    ):
        bad = json.loads(json.dumps(good))
        mutate(bad)
        with pytest.raises(EncodingError):
            RunState.from_dict(bad)


def test_run_state_dict_is_version_1_and_reads_no_other() -> None:
    """Stored runs carry ``"version": 1``; a node must keep reading what it wrote before."""
    from tenzro_training.errors import EncodingError
    from tenzro_training.run_state import RUN_STATE_VERSION

    env = Env()
    env.to_training()
    good = json.loads(json.dumps(env.run.to_dict()))
    assert RUN_STATE_VERSION == 1 and good["version"] == 1
    assert RunState.from_dict(good) == env.run
    for version in (0, 2, "1", 1.5, True, 1.0):  # true == 1.0 == 1 in Python: refused as not integers
        with pytest.raises(EncodingError, match="version"):
            RunState.from_dict({**good, "version": version})


def test_invalid_run_state_amount_of_2_to_the_256() -> None:
    """Stakes, scores and min_stake are uint256: 2**256 - 1 reads back, 2**256 is an EncodingError
    (not an ElectionError from a Candidate built of it) wherever it stands."""
    from tenzro_training.errors import EncodingError

    env = Env()
    env.to_training()
    good = json.loads(json.dumps(env.run.to_dict()))
    places = (
        lambda d, v: d["timings"].update(min_stake=v),
        lambda d, v: d["trainers"][0].update(stake=v),
        lambda d, v: d["election"]["entries"][0].update(stake=v),
    )
    for place in places:
        largest = json.loads(json.dumps(good))
        place(largest, str(2**256 - 1))
        RunState.from_dict(largest)
        too_large = json.loads(json.dumps(good))
        place(too_large, str(2**256))
        with pytest.raises(EncodingError, match="uint256"):
            RunState.from_dict(too_large)


def test_invalid_timings_out_of_range() -> None:
    from tenzro_training.errors import EncodingError

    RunTimings(election_window_ms=1, enrollment_window_ms=2**63 - 1, min_stake=2**256 - 1)
    bad = [
        {"election_window_ms": 0},
        {"enrollment_window_ms": -1},
        {"round_timeout_ms": 2**63},
        {"finalize_window_ms": 0},
        {"min_stake": -1},
        {"min_stake": 2**256},
    ]
    for fields in bad:
        with pytest.raises(EncodingError, match="expected"):
            RunTimings(**fields)


def test_invalid_run_state_that_breaks_its_election_or_seal_invariants() -> None:
    from tenzro_training.errors import EncodingError

    env = Env()
    env.to_training()
    good = json.loads(json.dumps(env.run.to_dict()))
    assert len(good["election"]["ranking"]) == 2 and good["syncer_rank"] == 1
    for mutate, what in (
        (lambda d: d.update(syncer_rank=3), "syncer_rank"),  # only 2 candidates are ranked
        (lambda d: d["election"]["ranking"][0].update(rank=2), "ranks must be 1, 2, 3"),
        (lambda d: d["election"].update(ranking=d["election"]["ranking"][::-1]), "ranks must be 1, 2, 3"),
    ):
        bad = json.loads(json.dumps(good))
        mutate(bad)
        with pytest.raises(EncodingError, match=what):
            RunState.from_dict(bad)
    ok = json.loads(json.dumps(good))
    ok["syncer_rank"] = 2  # after one failover: the second-ranked candidate
    assert RunState.from_dict(ok).syncer_rank == 2
    # A Sealed run's final record must be a FinalModelRecord, not just present.
    play_to_sealed(env)
    assert env.run.status is RunStatus.SEALED
    from dataclasses import replace

    from tenzro_training.run_state import final_record_to_dict

    assert env.run.final_record is not None
    for not_a_record in (final_record_to_dict(env.run.final_record), env.run.run_root, "final"):
        with pytest.raises(EncodingError, match="final_record"):
            replace(env.run, final_record=not_a_record)


def test_invalid_fragment_index_of_get_accepted_submissions() -> None:
    from tenzro_training.errors import EncodingError

    env = Env()
    env.post()
    with pytest.raises(EncodingError, match="fragment must be"):
        get_accepted_submissions(env.run, 2)  # checked even before Training
    assert get_accepted_submissions(env.run, 1) == ()
    env.elect()
    for i, now in enumerate((200, 210, 220)):
        env.enroll(i, now)
    env.submit(0, 1, 300)
    assert [a for a, _ in get_accepted_submissions(env.run, 1)] == [TRAINERS[0]]
    for fragment in (-1, 2, True, 1.0, "1"):  # -1 would silently read the last fragment
        with pytest.raises(EncodingError, match="fragment must be"):
            get_accepted_submissions(env.run, fragment)  # type: ignore[arg-type]


def test_post_task_pool_minimum_and_open_run_limits_are_core_rules() -> None:
    """The node's admission policy for postTask (malicious-participant probe, stop 20) as pure
    functions: a pool below the node's minimum is a SpecError; open runs are bounded per node
    and per sponsor."""
    from tenzro_training.errors import SpecError, TooManyRuns
    from tenzro_training.run import validate_open_runs

    env = Env()
    spec = make_spec()
    with pytest.raises(SpecError) as info:
        process_post_task(spec, SPONSOR, env.ledger, 0, TIMINGS, INITIAL_MODEL, min_reward_pool=POOL + 1)
    assert info.value.path == "reward_pool"
    process_post_task(spec, SPONSOR, env.ledger, 0, TIMINGS, INITIAL_MODEL, min_reward_pool=POOL)
    other = OTHER
    validate_open_runs("t", SPONSOR, [SPONSOR, other], 3, 2)
    with pytest.raises(TooManyRuns, match="of this sponsor"):
        validate_open_runs("t", SPONSOR, [SPONSOR, SPONSOR, other], 4, 2)
    with pytest.raises(TooManyRuns) as full:
        validate_open_runs("t", other, [SPONSOR, other, other], 3, 5)
    assert (full.value.scope, full.value.limit) == ("node", 3)
