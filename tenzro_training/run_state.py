"""The state of one training run: frozen values, their lossless JSON form, and read-only helpers.

What this module is: the :class:`RunState` value that the lifecycle transitions in
:mod:`tenzro_training.run` take and return, the values it is made of (node timings, the election,
enrolled trainers, the current round's submissions, failovers), ``to_dict``/``from_dict`` so the
node can store a run as JSON and read it back bit for bit, the JSON view served by
``tenzro_training_getRun`` (:func:`compute_run_view`), and ``get_*`` readers.

What it is NOT: the rules (which call may change what, deadlines, payouts: ``run.py``), storage
(the node writes ``to_dict()`` into ``training_runs``) or a clock (times are arguments). No I/O.

JSON conventions (``to_dict``): byte strings as ``0x`` + lowercase hex; addresses in EIP-55 form;
attoTNZO amounts (uint256) as decimal strings; milliseconds and counters as JSON integers;
absent values as ``null``. ``from_dict(to_dict(x)) == x`` for every state, and ``to_dict`` of equal
states gives equal dicts (every list is in a canonical order, never in arrival order).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tenzro_training.jsonfields import decode_address, decode_amount, decode_hex
from tenzro_training.addresses import Address, format_address
from tenzro_training.election import RankedCandidate
from tenzro_training.errors import EncodingError, TenzroError
from tenzro_training.records import (
    HASH_LENGTH,
    Candidate,
    FinalModelRecord,
    FragmentOutcome,
    RoundRecord,
    Ticket,
)
from tenzro_training.spec import TrainingTaskSpec

__all__ = [
    "RUN_STATE_VERSION",
    "TERMINAL_STATUSES",
    "DID_PATTERN",
    "RunStatus",
    "RunTimings",
    "ElectionEntry",
    "ranked_candidate_to_dict",
    "ranked_candidate_from_dict",
    "ElectionState",
    "EnrolledTrainer",
    "Submission",
    "RoundState",
    "Failover",
    "RunState",
    "round_record_to_dict",
    "round_record_from_dict",
    "final_record_to_dict",
    "final_record_from_dict",
    "compute_run_list_entry",
    "compute_run_view",
    "compute_run_view_clock",
    "compute_run_view_static",
    "compute_reward_weights",
    "get_accepted_payload_hashes",
    "get_accepted_submissions",
    "get_submission_counts",
    "get_trainer",
    "get_current_syncer",
    "get_next_deadline_ms",
    "is_terminal",
]

RUN_STATE_VERSION = 1
"""Written as ``"version"`` by ``RunState.to_dict``; ``from_dict`` reads only this version."""

DID_PATTERN = re.compile(r"did:tenzro:[a-z]{1,32}:[A-Za-z0-9._-]{1,128}")
"""A trainer or sponsor DID: ``did:tenzro:<kind>:<id>`` (the TrainingTaskSpec grammar)."""

_U256 = 2**256
_MAX_MS = 2**63 - 1  # an int64 of milliseconds: far beyond any clock, storable anywhere


class RunStatus(enum.StrEnum):
    """Where a run is in its lifecycle (SPEC.md "Roles and flow"); the value is the wire name."""

    POSTED = "Posted"
    ELECTING = "Electing"
    ENROLLING = "Enrolling"
    TRAINING = "Training"
    SEALED = "Sealed"
    CANCELLED = "Cancelled"
    FAILED = "Failed"


_TERMINAL = frozenset({RunStatus.SEALED, RunStatus.CANCELLED, RunStatus.FAILED})
TERMINAL_STATUSES: frozenset[RunStatus] = _TERMINAL
"""The statuses a run ends in; nothing changes it once it is in one."""


# --- field checks ---------------------------------------------------------------------------


def _fail(path: str, reason: str) -> EncodingError:
    return EncodingError(f"run state {path}: {reason}")


def _int(path: str, value: object, minimum: int = 0, maximum: int = _MAX_MS) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(path, f"expected an int, got {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise _fail(path, f"expected {minimum}..{maximum}, got {value}")
    return value


def _opt_int(path: str, value: object) -> int | None:
    return None if value is None else _int(path, value)


def _bytes(path: str, value: object, length: int) -> bytes:
    if type(value) is not bytes or len(value) != length:
        raise _fail(path, f"expected {length} bytes, got {value!r}")
    return value


def _did(path: str, value: object) -> str:
    if not isinstance(value, str) or DID_PATTERN.fullmatch(value) is None:
        raise _fail(path, f"expected did:tenzro:<kind>:<id>, got {value!r}")
    return value


def _tuple(path: str, value: object, cls: type) -> tuple[Any, ...]:
    if isinstance(value, list):
        value = tuple(value)
    if not isinstance(value, tuple):
        raise _fail(path, f"expected a tuple, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, cls):
            raise _fail(f"{path}[{i}]", f"expected {cls.__name__}, got {type(item).__name__}")
    return value


# JSON helpers: the reading side raises EncodingError naming the path of the bad value.


def _hex(value: bytes) -> str:
    return "0x" + value.hex()


def _opt_hex(value: bytes | None) -> str | None:
    return None if value is None else _hex(value)


def _unhex(path: str, value: object, length: int) -> bytes:
    return decode_hex(f"run state {path}", value, length)


def _opt_unhex(path: str, value: object, length: int) -> bytes | None:
    return None if value is None else _unhex(path, value, length)


def _unaddress(path: str, value: object) -> Address:
    return decode_address(f"run state {path}", value)


def _amount_str(value: int) -> str:
    return str(value)


def _unamount(path: str, value: object) -> int:
    return decode_amount(f"run state {path}", value)


def _obj(path: str, value: object, keys: Sequence[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(path, f"expected an object, got {type(value).__name__}")
    if set(value) != set(keys):
        missing = sorted(set(keys) - set(value))
        extra = sorted(str(k) for k in set(value) - set(keys))
        raise _fail(path, f"fields differ: missing {missing}, unexpected {extra}")
    return value


def _list(path: str, value: object) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(path, f"expected an array, got {type(value).__name__}")
    return value


# --- configuration --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTimings:
    """Node-level deadlines and limits, copied into every run when it is posted.

    A run keeps the timings it was posted under, so changing the node's configuration never
    moves the deadlines of a run already in flight. The defaults suit a development node.
    """

    election_window_ms: int = 5_000
    """From posting until the election closes (tickets after it are refused)."""
    enrollment_window_ms: int = 300_000
    """From the election deadline until enrollment closes (Training if >= K enrolled, else Failed)."""
    round_timeout_ms: int = 3_600_000
    """From a round's start: every fragment must reach K accepted submissions by then, or the run Fails."""
    finalize_window_ms: int = 60_000
    """After the straggler window closes, how long the current syncer has to finalize before the
    next-ranked candidate takes over (and again after each failover)."""
    min_stake: int = 0
    """Smallest stake (attoTNZO) a trainer may bond to enroll."""

    def __post_init__(self) -> None:
        for name in ("election_window_ms", "enrollment_window_ms", "round_timeout_ms", "finalize_window_ms"):
            _int(f"timings.{name}", getattr(self, name), minimum=1)
        _int("timings.min_stake", self.min_stake, maximum=_U256 - 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "election_window_ms": self.election_window_ms,
            "enrollment_window_ms": self.enrollment_window_ms,
            "round_timeout_ms": self.round_timeout_ms,
            "finalize_window_ms": self.finalize_window_ms,
            "min_stake": _amount_str(self.min_stake),
        }

    @classmethod
    def from_dict(cls, obj: object) -> RunTimings:
        keys = ("election_window_ms", "enrollment_window_ms", "round_timeout_ms", "finalize_window_ms", "min_stake")
        d = _obj("timings", obj, keys)
        return cls(
            election_window_ms=d["election_window_ms"],
            enrollment_window_ms=d["enrollment_window_ms"],
            round_timeout_ms=d["round_timeout_ms"],
            finalize_window_ms=d["finalize_window_ms"],
            min_stake=_unamount("timings.min_stake", d["min_stake"]),
        )


# --- election ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ElectionEntry:
    """A candidate's ticket as received (the candidate's registration is bound at that moment)."""

    candidate: Candidate
    """The registered candidate (address, VRF key, stake) the ticket is for."""
    ticket: Ticket
    """Its VRF proof over the election seed (verified when received)."""
    received_at_ms: int
    """When the node accepted the ticket."""

    def __post_init__(self) -> None:
        if not isinstance(self.candidate, Candidate) or not isinstance(self.ticket, Ticket):
            raise _fail("election entry", "expected a Candidate and a Ticket")
        _int("election entry received_at_ms", self.received_at_ms)

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": format_address(self.candidate.address),
            "vrf_public_key": _hex(self.candidate.vrf_public_key),
            "stake": _amount_str(self.candidate.stake),
            "proof": _hex(self.ticket.proof),
            "received_at_ms": self.received_at_ms,
        }

    @classmethod
    def from_dict(cls, obj: object, path: str) -> ElectionEntry:
        d = _obj(path, obj, ("address", "vrf_public_key", "stake", "proof", "received_at_ms"))
        address = _unaddress(f"{path}.address", d["address"])
        key = _unhex(f"{path}.vrf_public_key", d["vrf_public_key"], 32)
        stake = _unamount(f"{path}.stake", d["stake"])
        proof = _unhex(f"{path}.proof", d["proof"], 80)
        return cls(Candidate(address, key, stake), Ticket(address, key, proof), d["received_at_ms"])


def ranked_candidate_to_dict(entry: RankedCandidate) -> dict[str, Any]:
    """JSON form of one ranking line (everything a third party needs to re-check its place)."""
    return {
        "rank": entry.rank,
        "address": format_address(entry.address),
        "vrf_public_key": _hex(entry.vrf_public_key),
        "stake": _amount_str(entry.stake),
        "proof": _hex(entry.proof),
        "beta": _hex(entry.beta),
        "score": _amount_str(entry.score),
    }


def ranked_candidate_from_dict(obj: object, path: str) -> RankedCandidate:
    """Inverse of :func:`ranked_candidate_to_dict`."""
    d = _obj(path, obj, ("rank", "address", "vrf_public_key", "stake", "proof", "beta", "score"))
    return RankedCandidate(
        rank=_int(f"{path}.rank", d["rank"], minimum=1),
        address=_unaddress(f"{path}.address", d["address"]),
        vrf_public_key=_unhex(f"{path}.vrf_public_key", d["vrf_public_key"], 32),
        stake=_unamount(f"{path}.stake", d["stake"]),
        proof=_unhex(f"{path}.proof", d["proof"], 80),
        beta=_unhex(f"{path}.beta", d["beta"], 64),
        score=_unamount(f"{path}.score", d["score"]),
    )


@dataclass(frozen=True, slots=True)
class ElectionState:
    """The syncer election of one run: seed, window, tickets received and (once closed) the ranking."""

    seed: bytes
    """SHA-256(b"tenzro/train/syncer-election/v1" || task_id || spec_hash)."""
    deadline_ms: int
    """Last instant a ticket is accepted; the election closes when time passes it."""
    entries: tuple[ElectionEntry, ...] = ()
    """Accepted tickets, ascending by candidate address (one per candidate)."""
    ranking: tuple[RankedCandidate, ...] | None = None
    """None while open; after closing, ``election.rank_candidates(seed, candidates, tickets)``
    entries in rank order (empty if nobody held a valid ticket; the run then Failed)."""

    def __post_init__(self) -> None:
        _bytes("election.seed", self.seed, HASH_LENGTH)
        _int("election.deadline_ms", self.deadline_ms)
        entries = _tuple("election.entries", self.entries, ElectionEntry)
        addresses = [e.candidate.address for e in entries]
        if addresses != sorted(set(addresses)):
            raise _fail("election.entries", "must be strictly ascending by candidate address")
        # election.rank_candidates refuses two candidates sharing a VRF key; so must we.
        if len({e.candidate.vrf_public_key for e in entries}) != len(entries):
            raise _fail("election.entries", "two candidates share a VRF public key")
        object.__setattr__(self, "entries", entries)
        if self.ranking is not None:
            ranking = _tuple("election.ranking", self.ranking, RankedCandidate)
            if [r.rank for r in ranking] != list(range(1, len(ranking) + 1)):
                raise _fail("election.ranking", "ranks must be 1, 2, 3, ... in order")
            object.__setattr__(self, "ranking", ranking)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": _hex(self.seed),
            "deadline_ms": self.deadline_ms,
            "entries": [e.to_dict() for e in self.entries],
            "ranking": None if self.ranking is None else [ranked_candidate_to_dict(r) for r in self.ranking],
        }

    @classmethod
    def from_dict(cls, obj: object) -> ElectionState:
        d = _obj("election", obj, ("seed", "deadline_ms", "entries", "ranking"))
        entries = tuple(
            ElectionEntry.from_dict(e, f"election.entries[{i}]") for i, e in enumerate(_list("election.entries", d["entries"]))
        )
        ranking = None
        if d["ranking"] is not None:
            ranking = tuple(
                ranked_candidate_from_dict(r, f"election.ranking[{i}]")
                for i, r in enumerate(_list("election.ranking", d["ranking"]))
            )
        return cls(_unhex("election.seed", d["seed"], HASH_LENGTH), d["deadline_ms"], entries, ranking)


# --- trainers and submissions -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EnrolledTrainer:
    """A trainer admitted to the run."""

    address: Address
    """Its account: signs its calls, holds the bond, receives the payout."""
    did: str
    """Its DID (``did:tenzro:<kind>:<id>``)."""
    stake: int
    """attoTNZO bonded at enrollment (burned if slashed, returned at the end otherwise)."""
    shard_index: int
    """Which data shard it trains on: its 0-based enrollment order."""
    enrolled_at_ms: int
    """When the enrollment was accepted."""
    slashed: bool = False
    """True once it equivocated: its stake is burned, it is excluded from rounds and payouts."""

    def __post_init__(self) -> None:
        _bytes("trainer.address", self.address, 20)
        _did("trainer.did", self.did)
        _int("trainer.stake", self.stake, maximum=_U256 - 1)
        _int("trainer.shard_index", self.shard_index)
        _int("trainer.enrolled_at_ms", self.enrolled_at_ms)
        if not isinstance(self.slashed, bool):
            raise _fail("trainer.slashed", "expected a bool")

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": format_address(self.address),
            "did": self.did,
            "stake": _amount_str(self.stake),
            "shard_index": self.shard_index,
            "enrolled_at_ms": self.enrolled_at_ms,
            "slashed": self.slashed,
        }

    @classmethod
    def from_dict(cls, obj: object, path: str) -> EnrolledTrainer:
        d = _obj(path, obj, ("address", "did", "stake", "shard_index", "enrolled_at_ms", "slashed"))
        return cls(
            _unaddress(f"{path}.address", d["address"]),
            d["did"],
            _unamount(f"{path}.stake", d["stake"]),
            d["shard_index"],
            d["enrolled_at_ms"],
            d["slashed"],
        )


@dataclass(frozen=True, slots=True)
class Submission:
    """One accepted outer-gradient submission of the current round."""

    trainer: Address
    """Who submitted (an enrolled, unslashed trainer)."""
    payload_hash: bytes
    """SHA-256 of the safetensors payload (the bytes the shell stores and aggregates)."""
    accepted_at_ms: int
    """When it was accepted."""

    def __post_init__(self) -> None:
        _bytes("submission.trainer", self.trainer, 20)
        _bytes("submission.payload_hash", self.payload_hash, HASH_LENGTH)
        _int("submission.accepted_at_ms", self.accepted_at_ms)

    def to_dict(self) -> dict[str, Any]:
        return {
            "trainer": format_address(self.trainer),
            "payload_hash": _hex(self.payload_hash),
            "accepted_at_ms": self.accepted_at_ms,
        }

    @classmethod
    def from_dict(cls, obj: object, path: str) -> Submission:
        d = _obj(path, obj, ("trainer", "payload_hash", "accepted_at_ms"))
        return cls(
            _unaddress(f"{path}.trainer", d["trainer"]),
            _unhex(f"{path}.payload_hash", d["payload_hash"], HASH_LENGTH),
            d["accepted_at_ms"],
        )


@dataclass(frozen=True, slots=True)
class RoundState:
    """The round in progress: its submissions per fragment and its deadlines."""

    round: int
    """0-based round index."""
    started_at_ms: int
    """When the round opened (training start, or the previous round's finalization)."""
    round_deadline_ms: int
    """Quorum must be reached by this instant, or the run Fails."""
    submissions: tuple[tuple[Submission, ...], ...]
    """One tuple per fragment (index order), each ascending by trainer address."""
    quorum_at_ms: int | None = None
    """When every fragment first had >= K accepted submissions (None until then)."""
    straggler_deadline_ms: int | None = None
    """quorum_at_ms + grace_window_ms: last instant a straggler's submission is accepted."""
    finalize_deadline_ms: int | None = None
    """Last instant the current syncer may finalize before failover."""

    def __post_init__(self) -> None:
        _int("round.round", self.round)
        _int("round.started_at_ms", self.started_at_ms)
        _int("round.round_deadline_ms", self.round_deadline_ms)
        per_fragment = _tuple("round.submissions", self.submissions, tuple)
        for i, subs in enumerate(per_fragment):
            _tuple(f"round.submissions[{i}]", subs, Submission)
            trainers = [s.trainer for s in subs]
            if trainers != sorted(set(trainers)):
                raise _fail(f"round.submissions[{i}]", "must be strictly ascending by trainer")
        object.__setattr__(self, "submissions", per_fragment)
        deadlines = (self.quorum_at_ms, self.straggler_deadline_ms, self.finalize_deadline_ms)
        for name, value in zip(("quorum_at_ms", "straggler_deadline_ms", "finalize_deadline_ms"), deadlines):
            _opt_int(f"round.{name}", value)
        if len({d is None for d in deadlines}) != 1:
            raise _fail("round", "quorum_at_ms, straggler and finalize deadlines are set together")

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "started_at_ms": self.started_at_ms,
            "round_deadline_ms": self.round_deadline_ms,
            "submissions": [[s.to_dict() for s in subs] for subs in self.submissions],
            "quorum_at_ms": self.quorum_at_ms,
            "straggler_deadline_ms": self.straggler_deadline_ms,
            "finalize_deadline_ms": self.finalize_deadline_ms,
        }

    @classmethod
    def from_dict(cls, obj: object) -> RoundState:
        keys = (
            "round", "started_at_ms", "round_deadline_ms", "submissions",
            "quorum_at_ms", "straggler_deadline_ms", "finalize_deadline_ms",
        )
        d = _obj("round", obj, keys)
        submissions = tuple(
            tuple(
                Submission.from_dict(s, f"round.submissions[{i}][{j}]")
                for j, s in enumerate(_list(f"round.submissions[{i}]", subs))
            )
            for i, subs in enumerate(_list("round.submissions", d["submissions"]))
        )
        return cls(
            d["round"], d["started_at_ms"], d["round_deadline_ms"], submissions,
            d["quorum_at_ms"], d["straggler_deadline_ms"], d["finalize_deadline_ms"],
        )


@dataclass(frozen=True, slots=True)
class Failover:
    """One syncer hand-over: the syncer at ``from_rank`` missed its finalize deadline."""

    round: int
    """The round that was not finalized in time."""
    from_syncer: Address
    from_rank: int
    to_syncer: Address
    to_rank: int
    at_ms: int
    """The missed finalize deadline (the hand-over takes effect right after it)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "from_syncer": format_address(self.from_syncer),
            "from_rank": self.from_rank,
            "to_syncer": format_address(self.to_syncer),
            "to_rank": self.to_rank,
            "at_ms": self.at_ms,
        }

    @classmethod
    def from_dict(cls, obj: object, path: str) -> Failover:
        d = _obj(path, obj, ("round", "from_syncer", "from_rank", "to_syncer", "to_rank", "at_ms"))
        return cls(
            _int(f"{path}.round", d["round"]),
            _unaddress(f"{path}.from_syncer", d["from_syncer"]),
            _int(f"{path}.from_rank", d["from_rank"], minimum=1),
            _unaddress(f"{path}.to_syncer", d["to_syncer"]),
            _int(f"{path}.to_rank", d["to_rank"], minimum=1),
            _int(f"{path}.at_ms", d["at_ms"]),
        )


# --- committed records as JSON ----------------------------------------------------------------


def round_record_to_dict(record: RoundRecord) -> dict[str, Any]:
    """JSON form of a RoundRecord (hex hashes, EIP-55 addresses, the rule by its wire code)."""
    return {
        "task_id": record.task_id,
        "round": record.round,
        "syncer": format_address(record.syncer),
        "syncer_rank": record.syncer_rank,
        "rule_kind": int(record.rule_kind),
        "rule_param": record.rule_param,
        "fragments": [
            {
                "aggregate_hash": _hex(f.aggregate_hash),
                "accepted": [format_address(a) for a in f.accepted],
                "selected": f.selected,
                "trimmed": f.trimmed,
                "report_hash": _hex(f.report_hash),
            }
            for f in record.fragments
        ],
        "model_hash": _hex(record.model_hash),
    }


def round_record_from_dict(obj: object, path: str = "round_record") -> RoundRecord:
    """Inverse of :func:`round_record_to_dict`; raises EncodingError on any malformed field."""
    keys = ("task_id", "round", "syncer", "syncer_rank", "rule_kind", "rule_param", "fragments", "model_hash")
    d = _obj(path, obj, keys)
    fragments = []
    for i, f in enumerate(_list(f"{path}.fragments", d["fragments"])):
        p = f"{path}.fragments[{i}]"
        fd = _obj(p, f, ("aggregate_hash", "accepted", "selected", "trimmed", "report_hash"))
        accepted = tuple(
            _unaddress(f"{p}.accepted[{j}]", a) for j, a in enumerate(_list(f"{p}.accepted", fd["accepted"]))
        )
        fragments.append(
            FragmentOutcome(
                _unhex(f"{p}.aggregate_hash", fd["aggregate_hash"], HASH_LENGTH),
                accepted,
                fd["selected"],
                fd["trimmed"],
                _unhex(f"{p}.report_hash", fd["report_hash"], HASH_LENGTH),
            )
        )
    return RoundRecord(
        d["task_id"],
        d["round"],
        _unaddress(f"{path}.syncer", d["syncer"]),
        d["syncer_rank"],
        d["rule_kind"],
        d["rule_param"],
        tuple(fragments),
        _unhex(f"{path}.model_hash", d["model_hash"], HASH_LENGTH),
    )


def final_record_to_dict(record: FinalModelRecord) -> dict[str, Any]:
    """JSON form of a FinalModelRecord."""
    return {"task_id": record.task_id, "rounds": record.rounds, "final_model_hash": _hex(record.final_model_hash)}


def final_record_from_dict(obj: object, path: str = "final_record") -> FinalModelRecord:
    """Inverse of :func:`final_record_to_dict`."""
    d = _obj(path, obj, ("task_id", "rounds", "final_model_hash"))
    return FinalModelRecord(d["task_id"], d["rounds"], _unhex(f"{path}.final_model_hash", d["final_model_hash"], HASH_LENGTH))


# --- the run ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RunState:
    """Everything the node knows about one run. Built only by ``run.process_*`` and ``from_dict``."""

    spec: TrainingTaskSpec
    """The posted spec (committed verbatim as leaf 0 of the run root)."""
    spec_hash: bytes
    """SHA-256 of the spec's canonical bytes."""
    status: RunStatus
    timings: RunTimings
    """The node timings in force when the run was posted."""
    posted_at_ms: int
    updated_at_ms: int
    """Time of the last applied transition; calls with an earlier ``now_ms`` are treated as at it."""
    election: ElectionState
    syncer_rank: int = 0
    """1-based rank of the current syncer in ``election.ranking``; 0 until the election closes."""
    failovers: tuple[Failover, ...] = ()
    """Every syncer hand-over, in order."""
    trainers: tuple[EnrolledTrainer, ...] = ()
    """Enrolled trainers in enrollment order (``trainers[i].shard_index == i``)."""
    enrollment_deadline_ms: int | None = None
    """Set when the election closes: election deadline + enrollment window."""
    current_round: RoundState | None = None
    """The round in progress while Training; None otherwise."""
    records: tuple[RoundRecord, ...] = ()
    """Committed round records, round 0 first."""
    initial_model_hash: bytes
    """Hash of the init checkpoint's global model (as fragments.compute_model_hash computes it)."""
    model_hash: bytes
    """Hash of the current global model (initial, then after each finalized round)."""
    final_record: FinalModelRecord | None = None
    """Set when Sealed."""
    run_root: bytes | None = None
    """Set when Sealed: merkle.run_root over records.compute_run_leaves."""
    ended_at_ms: int | None = None
    """When the run reached Sealed, Cancelled or Failed."""
    end_reason: str | None = None
    """Why it Failed or was Cancelled (human-readable), None otherwise."""

    def __post_init__(self) -> None:
        if not isinstance(self.spec, TrainingTaskSpec):
            raise _fail("spec", "expected a TrainingTaskSpec")
        if self.spec_hash != self.spec.spec_hash():
            raise _fail("spec_hash", "does not match the spec")
        object.__setattr__(self, "status", RunStatus(self.status))
        if not isinstance(self.timings, RunTimings) or not isinstance(self.election, ElectionState):
            raise _fail("timings/election", "wrong type")
        _int("posted_at_ms", self.posted_at_ms)
        _int("updated_at_ms", self.updated_at_ms, minimum=self.posted_at_ms)
        _int("syncer_rank", self.syncer_rank)
        ranked = 0 if self.election.ranking is None else len(self.election.ranking)
        if self.syncer_rank > ranked:
            raise _fail("syncer_rank", f"{self.syncer_rank} exceeds the {ranked} ranked candidates")
        object.__setattr__(self, "failovers", _tuple("failovers", self.failovers, Failover))
        trainers = _tuple("trainers", self.trainers, EnrolledTrainer)
        if [t.shard_index for t in trainers] != list(range(len(trainers))):
            raise _fail("trainers", "shard indices must be 0, 1, 2, ... in enrollment order")
        if len({t.address for t in trainers}) != len(trainers):
            raise _fail("trainers", "an address is enrolled twice")
        if len(trainers) > self.spec.trainer_count:
            raise _fail("trainers", "more trainers than trainer_count")
        object.__setattr__(self, "trainers", trainers)
        _opt_int("enrollment_deadline_ms", self.enrollment_deadline_ms)
        if self.status in (RunStatus.ENROLLING, RunStatus.TRAINING, RunStatus.SEALED) and (
            self.enrollment_deadline_ms is None or self.syncer_rank < 1
        ):
            raise _fail("status", f"a run that is {self.status.value} has an enrollment deadline and a syncer")
        if self.current_round is not None:
            if not isinstance(self.current_round, RoundState):
                raise _fail("current_round", "expected a RoundState")
            if len(self.current_round.submissions) != self.spec.architecture.fragment_count:
                raise _fail("current_round.submissions", "one tuple per fragment expected")
            if self.current_round.round != len(self.records):
                raise _fail("current_round.round", "must equal the number of committed records")
        object.__setattr__(self, "records", _tuple("records", self.records, RoundRecord))
        _bytes("initial_model_hash", self.initial_model_hash, HASH_LENGTH)
        _bytes("model_hash", self.model_hash, HASH_LENGTH)
        if self.final_record is not None and not isinstance(self.final_record, FinalModelRecord):
            raise _fail("final_record", "expected a FinalModelRecord")
        if self.run_root is not None:
            _bytes("run_root", self.run_root, HASH_LENGTH)
        if (self.status is RunStatus.SEALED) != (self.final_record is not None and self.run_root is not None):
            raise _fail("status", "a Sealed run, and only a Sealed run, has a final record and a run root")
        if (self.status is RunStatus.TRAINING) != (self.current_round is not None):
            raise _fail("status", "a Training run, and only a Training run, has a current round")
        _opt_int("ended_at_ms", self.ended_at_ms)
        if (self.status in _TERMINAL) != (self.ended_at_ms is not None):
            raise _fail("ended_at_ms", "set exactly when the run has ended")
        if self.end_reason is not None and not isinstance(self.end_reason, str):
            raise _fail("end_reason", "expected a string or null")

    # --- convenience --------------------------------------------------------------------------

    @property
    def task_id(self) -> str:
        return self.spec.task_id

    @property
    def sponsor(self) -> Address:
        """The sponsor's 20-byte address."""
        return Address(self.spec.sponsor_address_bytes)

    @property
    def round(self) -> int:
        """The round in progress, or (when not Training) the number of finalized rounds."""
        return self.current_round.round if self.current_round is not None else len(self.records)

    # --- JSON ---------------------------------------------------------------------------------

    def to_dict(self, *, records: bool = True) -> dict[str, Any]:
        """Lossless, deterministic JSON-able form (see the module docstring for conventions).
        ``records=False`` leaves the round records out (the node stores each once, on its own:
        converting them all for every transition made a transition's cost grow with the run)."""
        out = {
            "version": RUN_STATE_VERSION,
            "spec": self.spec.to_dict(),
            "spec_hash": _hex(self.spec_hash),
            "status": self.status.value,
            "timings": self.timings.to_dict(),
            "posted_at_ms": self.posted_at_ms,
            "updated_at_ms": self.updated_at_ms,
            "election": self.election.to_dict(),
            "syncer_rank": self.syncer_rank,
            "failovers": [f.to_dict() for f in self.failovers],
            "trainers": [t.to_dict() for t in self.trainers],
            "enrollment_deadline_ms": self.enrollment_deadline_ms,
            "current_round": None if self.current_round is None else self.current_round.to_dict(),
            "records": [round_record_to_dict(r) for r in self.records] if records else None,
            "initial_model_hash": _hex(self.initial_model_hash),
            "model_hash": _hex(self.model_hash),
            "final_record": None if self.final_record is None else final_record_to_dict(self.final_record),
            "run_root": _opt_hex(self.run_root),
            "ended_at_ms": self.ended_at_ms,
            "end_reason": self.end_reason,
        }
        if not records:
            del out["records"]
        return out

    @classmethod
    def from_dict(cls, obj: object) -> RunState:
        """Rebuild a run from ``to_dict()`` output; EncodingError (a TenzroError) if it is malformed."""
        keys = (
            "version", "spec", "spec_hash", "status", "timings", "posted_at_ms", "updated_at_ms",
            "election", "syncer_rank", "failovers", "trainers", "enrollment_deadline_ms",
            "current_round", "records", "initial_model_hash", "model_hash", "final_record",
            "run_root", "ended_at_ms", "end_reason",
        )
        d = _obj("", obj, keys)
        if type(d["version"]) is not int or d["version"] != RUN_STATE_VERSION:  # true == 1.0 == 1
            raise _fail("version", f"unsupported version {d['version']!r}")
        try:
            # A stored run was accepted under the then-supported set; do not re-gate it.
            spec = TrainingTaskSpec.from_dict(d["spec"], supported_only=False)
            status = RunStatus(d["status"])
        except (TenzroError, ValueError) as exc:
            raise _fail("spec/status", str(exc)) from None
        try:
            return cls(
                spec=spec,
                spec_hash=_unhex("spec_hash", d["spec_hash"], HASH_LENGTH),
                status=status,
                timings=RunTimings.from_dict(d["timings"]),
                posted_at_ms=d["posted_at_ms"],
                updated_at_ms=d["updated_at_ms"],
                election=ElectionState.from_dict(d["election"]),
                syncer_rank=d["syncer_rank"],
                failovers=tuple(Failover.from_dict(f, f"failovers[{i}]") for i, f in enumerate(_list("failovers", d["failovers"]))),
                trainers=tuple(
                    EnrolledTrainer.from_dict(t, f"trainers[{i}]") for i, t in enumerate(_list("trainers", d["trainers"]))
                ),
                enrollment_deadline_ms=d["enrollment_deadline_ms"],
                current_round=None if d["current_round"] is None else RoundState.from_dict(d["current_round"]),
                records=tuple(
                    round_record_from_dict(r, f"records[{i}]") for i, r in enumerate(_list("records", d["records"]))
                ),
                initial_model_hash=_unhex("initial_model_hash", d["initial_model_hash"], HASH_LENGTH),
                model_hash=_unhex("model_hash", d["model_hash"], HASH_LENGTH),
                final_record=None if d["final_record"] is None else final_record_from_dict(d["final_record"]),
                run_root=_opt_unhex("run_root", d["run_root"], HASH_LENGTH),
                ended_at_ms=d["ended_at_ms"],
                end_reason=d["end_reason"],
            )
        except EncodingError:
            raise
        except (TenzroError, ValueError, TypeError) as exc:
            raise _fail("", str(exc)) from None


# --- readers -----------------------------------------------------------------------------------


def is_terminal(run: RunState) -> bool:
    """True once the run is Sealed, Cancelled or Failed (nothing can change it any more)."""
    return run.status in _TERMINAL


def get_trainer(run: RunState, address: bytes) -> EnrolledTrainer | None:
    """The enrolled trainer with this address (slashed or not), or None."""
    for trainer in run.trainers:
        if trainer.address == address:
            return trainer
    return None


def get_current_syncer(run: RunState) -> Address | None:
    """The address allowed to finalize now: ranking[syncer_rank - 1]; None before the election closes."""
    if run.election.ranking is None or run.syncer_rank == 0:
        return None
    return run.election.ranking[run.syncer_rank - 1].address


def get_accepted_submissions(run: RunState, fragment: int) -> tuple[tuple[Address, bytes], ...]:
    """The current round's accepted (trainer, payload_hash) pairs for ``fragment``, ascending by
    trainer address: exactly the inputs, in canonical order, that finalization must aggregate.

    Empty when the run is not Training. Raises EncodingError for a fragment index out of range.
    """
    if isinstance(fragment, bool) or not isinstance(fragment, int) or not 0 <= fragment < run.spec.architecture.fragment_count:
        raise EncodingError(f"fragment must be an int in 0..{run.spec.architecture.fragment_count - 1}, got {fragment!r}")
    if run.current_round is None:
        return ()
    return tuple((s.trainer, s.payload_hash) for s in run.current_round.submissions[fragment])


def get_accepted_payload_hashes(run: RunState) -> frozenset[bytes]:
    """The payload hashes the current round's accepted submissions name, over every fragment
    (empty when not Training): what that round's finalize will read."""
    if run.current_round is None:
        return frozenset()
    return frozenset(s.payload_hash for subs in run.current_round.submissions for s in subs)


def get_submission_counts(run: RunState) -> tuple[int, ...]:
    """Accepted submissions per fragment in the current round (all zeros when not Training)."""
    if run.current_round is None:
        return (0,) * run.spec.architecture.fragment_count
    return tuple(len(subs) for subs in run.current_round.submissions)


def compute_reward_weights(run: RunState, records: Sequence[RoundRecord] | None = None) -> dict[Address, int]:
    """Reward weight per enrolled trainer: how many of its submissions were aggregated, over all
    committed rounds and fragments (``records``, default ``run.records``); 0 for a slashed
    trainer (it forfeits its reward).

    Every enrolled trainer has an entry (zeros included), in enrollment order.
    """
    counts = {t.address: 0 for t in run.trainers}
    for record in run.records if records is None else records:
        for outcome in record.fragments:
            for address in outcome.accepted:
                if address in counts:
                    counts[address] += 1
    for trainer in run.trainers:
        if trainer.slashed:
            counts[trainer.address] = 0
    return counts


def get_next_deadline_ms(run: RunState) -> int | None:
    """The next instant at which time alone changes the run (``process_tick`` acts once the clock
    passes it), or None if nothing is pending. A shell can sleep until just after it."""
    status = run.status
    if status is RunStatus.POSTED:
        return run.posted_at_ms
    if status is RunStatus.ELECTING:
        return run.election.deadline_ms
    if status is RunStatus.ENROLLING:
        return run.enrollment_deadline_ms
    if status is RunStatus.TRAINING and run.current_round is not None:
        r = run.current_round
        return r.round_deadline_ms if r.quorum_at_ms is None else r.finalize_deadline_ms
    return None


def compute_run_view(run: RunState, now_ms: int) -> dict[str, Any]:
    """The JSON object ``tenzro_training_getRun`` returns (addresses EIP-55, hashes 0x-hex,
    amounts decimal strings): :func:`compute_run_view_static` plus
    :func:`compute_run_view_clock`. ``now_ms`` only feeds the clock fields: the view describes
    the stored state, so a shell should tick before rendering it."""
    return {**compute_run_view_static(run), **compute_run_view_clock(run, now_ms)}


def compute_run_view_clock(run: RunState, now_ms: int) -> dict[str, Any]:
    """The fields of the view that depend on the clock: ``now_ms`` and the informative
    ``tick_due`` (a deadline has passed, or the run is Posted and awaits its first tick)."""
    next_deadline = get_next_deadline_ms(run)
    return {
        "now_ms": now_ms,
        "tick_due": next_deadline is not None and (now_ms > next_deadline or run.status is RunStatus.POSTED),
    }


def compute_run_list_entry(run: RunState) -> dict[str, Any]:
    """The run's listRuns entry. A node also stores an ended run's (its summary), which is all a
    node's start reads of that run, so the entry holds nothing the clock changes once it ended."""
    syncer = get_current_syncer(run)
    return {
        "task_id": run.task_id,
        "status": run.status.value,
        "round": run.round,
        "max_rounds": run.spec.max_rounds,
        "spec_hash": _hex(run.spec_hash),
        "sponsor": run.spec.sponsor_address,
        "syncer": None if syncer is None else format_address(syncer),
        "posted_at_ms": run.posted_at_ms,
        "updated_at_ms": run.updated_at_ms,
        "next_deadline_ms": get_next_deadline_ms(run),
    }


def compute_run_view_static(run: RunState, *, round_records: bool = True) -> dict[str, Any]:
    """The fields of the view that depend on ``run`` alone. Why separate: a run state is
    immutable, so a shell that answers many polls of one state (trainers and syncers poll
    getRun) can render this part once per state and add only the clock fields per call.
    ``round_records=False`` leaves out ``round_records``, which only ever grows: a shell can
    render each record once and add them itself."""
    syncer = get_current_syncer(run)
    r = run.current_round
    next_deadline = get_next_deadline_ms(run)
    view: dict[str, Any] = {
        "task_id": run.task_id,
        "spec_hash": _hex(run.spec_hash),
        # The whole spec: a trainer needs its model, dataset and inner-loop settings, and checks
        # them against spec_hash (which the receipt commits) rather than trusting the node.
        "spec": run.spec.to_dict(),
        "status": run.status.value,
        "round": run.round,
        "max_rounds": run.spec.max_rounds,
        "fragment_count": run.spec.architecture.fragment_count,
        "trainer_count": run.spec.trainer_count,
        "quorum": run.spec.quorum,
        "sponsor": run.spec.sponsor_address,
        "reward_pool": _amount_str(run.spec.reward_pool),
        "posted_at_ms": run.posted_at_ms,
        "updated_at_ms": run.updated_at_ms,
        "next_deadline_ms": next_deadline,
        "election": {
            "seed": _hex(run.election.seed),
            "deadline_ms": run.election.deadline_ms,
            "tickets": [e.to_dict() for e in run.election.entries],
            "ranking": None if run.election.ranking is None else [ranked_candidate_to_dict(x) for x in run.election.ranking],
        },
        "syncer": None if syncer is None else format_address(syncer),
        "syncer_rank": run.syncer_rank,
        "failovers": [f.to_dict() for f in run.failovers],
        "enrollment_deadline_ms": run.enrollment_deadline_ms,
        "trainers": [
            {
                "address": format_address(t.address),
                "did": t.did,
                "stake": _amount_str(t.stake),
                "shard": t.shard_index,
                "enrolled_at_ms": t.enrolled_at_ms,
                "slashed": t.slashed,
            }
            for t in run.trainers
        ],
        "submission_counts": list(get_submission_counts(run)),
        "round_started_at_ms": None if r is None else r.started_at_ms,
        "round_deadline_ms": None if r is None else r.round_deadline_ms,
        "quorum_at_ms": None if r is None else r.quorum_at_ms,
        "straggler_deadline_ms": None if r is None else r.straggler_deadline_ms,
        "finalize_deadline_ms": None if r is None else r.finalize_deadline_ms,
        "initial_model_hash": _hex(run.initial_model_hash),
        "model_hash": _hex(run.model_hash),
        "round_records": [round_record_to_dict(x) for x in run.records] if round_records else None,
        "final_record": None if run.final_record is None else final_record_to_dict(run.final_record),
        "run_root": _opt_hex(run.run_root),
        "ended_at_ms": run.ended_at_ms,
        "end_reason": run.end_reason,
    }
    if not round_records:
        del view["round_records"]
    return view
