"""Offline verification of a sealed run: a receipt re-checked against everything signed behind it.

What this module is: the checks of ``tenzro train verify-receipt`` (docs/receipt.md "Offline
verification"). A node's ``getReceipt`` answers the receipt and its ``attestations``: the
election (seed, every ticket with its candidate's registration, the ranking) and, per round, the
syncer's FinalizeRound signature and every accepted trainer's SubmitOuterGradient signature.
:func:`check_receipt` recomputes what a third party can recompute from those and returns one
named :class:`CheckResult` per rule:

- ``chain_id``: the attestations were made for the chain the verifier names;
- ``abi`` (when the ABI bytes are given): they are exactly ``receipt_abi.encode_receipt`` of the
  receipt and ``receipt_abi.verify_receipt_bytes`` accepts them;
- ``run_root``: the run root recomputed from the spec, the transcript and the final model record
  (and equal to the claimed root, when one is given);
- ``round_records``: spec.max_rounds records, each decoding from its own leaf to itself, with
  round == index, the receipt's task_id, the spec's rule and fragment count; the last model hash
  is the final one;
- ``trainer_weights`` and ``syncer_list``: the receipt's per-trainer counts and syncer list are
  the transcript's;
- ``election_seed``: the stored seed is ``election.compute_election_seed(task_id, spec_hash)``;
- ``tickets``: every ticket verifies (``election.validate_ticket``) over that seed;
- ``ranking``: ``election.rank_candidates`` over the tickets gives exactly the stored ranking;
- ``round_syncers``: each round's syncer is the recomputed ranking's entry at its syncer_rank;
- ``finalize_signatures``: each round's FinalizeRound signature recovers to that syncer;
- ``submission_signatures``: every accepted trainer of every fragment has a SubmitOuterGradient
  signature recovering to it (and every attested submission verifies), and every attested
  submission is among its fragment's accepted unless its trainer was slashed by that round;
- ``slashings``: every trainer the receipt marks slashed is backed by equivocation evidence (two
  different payload hashes it signed for one round and fragment, both signatures recovering to
  it), no evidence names a trainer left unslashed, and no round from the one its slashing took
  effect in (``slashed_in_round``: the evidence round, or later for a conflict over a finalized
  round, whose record must then have accepted the first of the two hashes) on accepted any of
  its submissions.

What it does NOT establish: the candidates' registrations and stakes (the node's configuration,
not committed by anything a verifier holds), the trainers' DIDs and stakes (vouched for by the
node's sealed record, as for TRAINING_VERIFY), that no OTHER trainer equivocated unseen (only a
node that saw both payloads can tell), or that a payload hash is the aggregated gradient (that
needs the payloads). It does no I/O; the CLI fetches or reads the document.

Every function here takes untrusted input and never raises: malformed input is a failed check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tenzro_training.jsonfields import (
    decode_address,
    decode_amount,
    decode_array,
    decode_hex,
    decode_int,
    decode_object,
    encode_hex,
)
from tenzro_training import auth
from tenzro_training.addresses import Address, format_address
from tenzro_training.election import RankedCandidate, compute_election_seed, rank_candidates, validate_ticket
from tenzro_training.errors import EncodingError, TenzroError
from tenzro_training.merkle import run_root as compute_run_root
from tenzro_training.receipt import TrainingReceipt, compute_accepted_counts, compute_syncers, find_rule_violation
from tenzro_training.receipt_abi import encode_receipt, verify_receipt_bytes
from tenzro_training.records import (
    Candidate,
    Ticket,
    compute_run_leaves,
    decode_round_record,
    encode_round_record,
)
from tenzro_training.run_state import ranked_candidate_from_dict, ranked_candidate_to_dict

__all__ = [
    "ATTESTATIONS_VERSION",
    "CHECK_NAMES",
    "AttestedTicket",
    "ElectionAttestation",
    "SubmissionAttestation",
    "RoundAttestation",
    "SlashingAttestation",
    "Attestations",
    "CheckResult",
    "ReceiptCheck",
    "check_receipt",
    "check_receipt_document",
]

ATTESTATIONS_VERSION = 3
"""Written as ``"version"`` by :meth:`Attestations.to_dict`. Older documents are still read:
version 2 (slashings without ``"slashed_in_round"``, which is then the evidence round: nodes
of that version slashed only in the current round) and version 1 (no ``"slashings"``, attesting
no slashing evidence)."""

CHECK_NAMES = (
    "chain_id",
    "abi",
    "run_root",
    "round_records",
    "trainer_weights",
    "syncer_list",
    "election_seed",
    "tickets",
    "ranking",
    "round_syncers",
    "finalize_signatures",
    "submission_signatures",
    "slashings",
)
"""Every check, in the order :func:`check_receipt` runs them (``abi`` only when bytes are given)."""

_U256 = 2**256


# --- JSON helpers (strict: EncodingError on anything unexpected) -------------------------------


def _fail(path: str, reason: str) -> EncodingError:
    return EncodingError(f"attestations {path}: {reason}")


def _obj(path: str, value: object, keys: tuple[str, ...]) -> Mapping[str, Any]:
    return decode_object(f"attestations {path}", value, keys)


def _arr(path: str, value: object) -> list[Any]:
    return decode_array(f"attestations {path}", value)


def _int(path: str, value: object, maximum: int = 2**64 - 1, minimum: int = 0) -> int:
    return decode_int(f"attestations {path}", value, maximum, minimum)


def _unhex(path: str, value: object, length: int) -> bytes:
    return decode_hex(f"attestations {path}", value, length)


def _unaddress(path: str, value: object) -> Address:
    return decode_address(f"attestations {path}", value)


def _unamount(path: str, value: object) -> int:
    return decode_amount(f"attestations {path}", value)


def _hex(value: bytes) -> str:
    return encode_hex(value)


# --- the attestations --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AttestedTicket:
    """One election ticket as the node accepted it, with the registration it was checked against."""

    candidate: Candidate
    """The registered candidate: address, VRF public key, stake."""
    proof: bytes
    """Its 80-byte ECVRF proof over the election seed."""

    @property
    def ticket(self) -> Ticket:
        """The ticket itself (the node binds a ticket to its candidate's address and key)."""
        return Ticket(self.candidate.address, self.candidate.vrf_public_key, self.proof)

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": format_address(self.candidate.address),
            "vrf_public_key": _hex(self.candidate.vrf_public_key),
            "stake": str(self.candidate.stake),
            "proof": _hex(self.proof),
        }

    @classmethod
    def from_dict(cls, obj: object, path: str) -> AttestedTicket:
        d = _obj(path, obj, ("address", "vrf_public_key", "stake", "proof"))
        try:
            candidate = Candidate(
                _unaddress(f"{path}.address", d["address"]),
                _unhex(f"{path}.vrf_public_key", d["vrf_public_key"], 32),
                _unamount(f"{path}.stake", d["stake"]),
            )
        except EncodingError:
            raise
        except TenzroError as exc:
            raise _fail(path, str(exc)) from None
        return cls(candidate, _unhex(f"{path}.proof", d["proof"], 80))


@dataclass(frozen=True, slots=True)
class ElectionAttestation:
    """The run's syncer election as the node closed it."""

    seed: bytes
    """The stored 32-byte election seed."""
    tickets: tuple[AttestedTicket, ...]
    """Every ticket the node accepted, ascending by candidate address."""
    ranking: tuple[RankedCandidate, ...]
    """The stored ranking, rank 1 first (what the node's failover followed)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": _hex(self.seed),
            "tickets": [t.to_dict() for t in self.tickets],
            "ranking": [ranked_candidate_to_dict(r) for r in self.ranking],
        }

    @classmethod
    def from_dict(cls, obj: object) -> ElectionAttestation:
        d = _obj("election", obj, ("seed", "tickets", "ranking"))
        tickets = tuple(
            AttestedTicket.from_dict(t, f"election.tickets[{i}]") for i, t in enumerate(_arr("election.tickets", d["tickets"]))
        )
        ranking = []
        for i, r in enumerate(_arr("election.ranking", d["ranking"])):
            try:
                ranking.append(ranked_candidate_from_dict(r, f"election.ranking[{i}]"))
            except TenzroError as exc:
                raise _fail(f"election.ranking[{i}]", str(exc)) from None
        return cls(_unhex("election.seed", d["seed"], 32), tickets, tuple(ranking))


@dataclass(frozen=True, slots=True)
class SubmissionAttestation:
    """One accepted submission: the signed SubmitOuterGradient(task, round, fragment, payload_hash)."""

    trainer: Address
    """The trainer the node recovered the signature to."""
    fragment: int
    """Fragment index."""
    payload_hash: bytes
    """SHA-256 of the payload the trainer signed."""
    signature: bytes
    """The trainer's 65-byte EIP-712 signature."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "trainer": format_address(self.trainer),
            "fragment": self.fragment,
            "payload_hash": _hex(self.payload_hash),
            "signature": _hex(self.signature),
        }

    @classmethod
    def from_dict(cls, obj: object, path: str) -> SubmissionAttestation:
        d = _obj(path, obj, ("trainer", "fragment", "payload_hash", "signature"))
        return cls(
            _unaddress(f"{path}.trainer", d["trainer"]),
            _int(f"{path}.fragment", d["fragment"], 2**32 - 1),
            _unhex(f"{path}.payload_hash", d["payload_hash"], 32),
            _unhex(f"{path}.signature", d["signature"], 65),
        )


@dataclass(frozen=True, slots=True)
class RoundAttestation:
    """The signatures behind one finalized round."""

    round: int
    """Round index."""
    syncer: Address
    """The syncer the node recovered the FinalizeRound signature to."""
    finalize_signature: bytes | None
    """The syncer's 65-byte FinalizeRound(task, round) signature; None if the node did not keep
    it (a store written before signatures were persisted): the check then fails."""
    submissions: tuple[SubmissionAttestation, ...]
    """Every submission the node accepted in the round, by (fragment, trainer address)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "syncer": format_address(self.syncer),
            "finalize_signature": None if self.finalize_signature is None else _hex(self.finalize_signature),
            "submissions": [s.to_dict() for s in self.submissions],
        }

    @classmethod
    def from_dict(cls, obj: object, path: str) -> RoundAttestation:
        d = _obj(path, obj, ("round", "syncer", "finalize_signature", "submissions"))
        signature = d["finalize_signature"]
        return cls(
            _int(f"{path}.round", d["round"]),
            _unaddress(f"{path}.syncer", d["syncer"]),
            None if signature is None else _unhex(f"{path}.finalize_signature", signature, 65),
            tuple(
                SubmissionAttestation.from_dict(s, f"{path}.submissions[{i}]")
                for i, s in enumerate(_arr(f"{path}.submissions", d["submissions"]))
            ),
        )


@dataclass(frozen=True, slots=True)
class SlashingAttestation:
    """The equivocation evidence a trainer was slashed on: two different payload hashes it
    signed (EIP-712 SubmitOuterGradient) for one round and fragment."""

    trainer: Address
    """The slashed trainer."""
    round: int
    """The round both messages name."""
    fragment: int
    """The fragment both messages name."""
    payload_hashes: tuple[bytes, bytes]
    """The first payload hash the node held, then the conflicting one."""
    signatures: tuple[bytes | None, bytes]
    """The trainer's signature of each; the first is None only if the node lost its record (a
    damaged store): the check then fails."""
    slashed_in_round: int
    """The round that was current when the node applied the slashing: ``round``, or a later
    round when the conflicting message named a round already finalized. The rounds committed
    before it keep the trainer's accepted submissions; none from it on may accept one."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "trainer": format_address(self.trainer),
            "round": self.round,
            "fragment": self.fragment,
            "payloads": [
                {"payload_hash": _hex(h), "signature": None if sig is None else _hex(sig)}
                for h, sig in zip(self.payload_hashes, self.signatures)
            ],
            "slashed_in_round": self.slashed_in_round,
        }

    @classmethod
    def from_dict(cls, obj: object, path: str, version: int = ATTESTATIONS_VERSION) -> SlashingAttestation:
        """Strict parse of :meth:`to_dict` output; ``version`` 2 entries have no
        ``"slashed_in_round"`` (it is then ``round``)."""
        keys = ("trainer", "round", "fragment", "payloads") + (("slashed_in_round",) if version >= 3 else ())
        d = _obj(path, obj, keys)
        payloads = _arr(f"{path}.payloads", d["payloads"])
        if len(payloads) != 2:
            raise _fail(f"{path}.payloads", f"expected 2 signed payload hashes, got {len(payloads)}")
        hashes, signatures = [], []
        for i, p in enumerate(payloads):
            entry = _obj(f"{path}.payloads[{i}]", p, ("payload_hash", "signature"))
            hashes.append(_unhex(f"{path}.payloads[{i}].payload_hash", entry["payload_hash"], 32))
            sig = entry["signature"]
            signatures.append(None if sig is None and i == 0 else _unhex(f"{path}.payloads[{i}].signature", sig, 65))
        second = signatures[1]
        assert second is not None  # only the first may be None
        round_ = _int(f"{path}.round", d["round"])
        return cls(
            _unaddress(f"{path}.trainer", d["trainer"]),
            round_,
            _int(f"{path}.fragment", d["fragment"], 2**32 - 1),
            (hashes[0], hashes[1]),
            (signatures[0], second),
            _int(f"{path}.slashed_in_round", d["slashed_in_round"]) if version >= 3 else round_,
        )


@dataclass(frozen=True, slots=True)
class Attestations:
    """Everything signed behind a receipt (getReceipt's ``"attestations"``)."""

    chain_id: int
    """The EIP-712 chain id every signature was made for."""
    election: ElectionAttestation
    """The syncer election."""
    rounds: tuple[RoundAttestation, ...]
    """One entry per finalized round, round 0 first."""
    slashings: tuple[SlashingAttestation, ...] = ()
    """The evidence behind every slashed trainer, by (round, fragment, trainer)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": ATTESTATIONS_VERSION,
            "chain_id": self.chain_id,
            "election": self.election.to_dict(),
            "rounds": [r.to_dict() for r in self.rounds],
            "slashings": [s.to_dict() for s in self.slashings],
        }

    @classmethod
    def from_dict(cls, obj: object) -> Attestations:
        """Strict parse of :meth:`to_dict` output (or of an older version, see
        :data:`ATTESTATIONS_VERSION`); EncodingError (a TenzroError) when malformed."""
        version = obj.get("version") if isinstance(obj, Mapping) else None
        if type(version) is not int or version not in (1, 2, ATTESTATIONS_VERSION):
            raise _fail("version", f"unsupported version {version!r}")
        keys = ("version", "chain_id", "election", "rounds") + (("slashings",) if version >= 2 else ())
        d = _obj("", obj, keys)
        slashings = _arr("slashings", d["slashings"]) if version >= 2 else []
        return cls(
            _int("chain_id", d["chain_id"], _U256 - 1, minimum=1),
            ElectionAttestation.from_dict(d["election"]),
            tuple(RoundAttestation.from_dict(r, f"rounds[{i}]") for i, r in enumerate(_arr("rounds", d["rounds"]))),
            tuple(SlashingAttestation.from_dict(s, f"slashings[{i}]", version) for i, s in enumerate(slashings)),
        )


# --- results -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One named check."""

    name: str
    """One of :data:`CHECK_NAMES`, or ``"decode"`` when the document itself is malformed."""
    ok: bool
    """True iff the check passed."""
    detail: str
    """What was checked, or the first thing that failed."""


@dataclass(frozen=True, slots=True)
class ReceiptCheck:
    """Every check of one receipt, in order."""

    checks: tuple[CheckResult, ...]
    """The results, in :data:`CHECK_NAMES` order (after ``task_id`` when the caller named the
    run it asked for: :func:`check_receipt_document`)."""

    @property
    def ok(self) -> bool:
        """True iff there is at least one check and every one passed."""
        return bool(self.checks) and all(c.ok for c in self.checks)

    def get(self, name: str) -> CheckResult | None:
        """The result of the check called ``name`` (None if it did not run)."""
        return next((c for c in self.checks if c.name == name), None)

    @property
    def failed(self) -> tuple[str, ...]:
        """The names of the failed checks, in order."""
        return tuple(c.name for c in self.checks if not c.ok)


class _Failed(Exception):
    """A check's first failure (internal: becomes a CheckResult)."""


def _require(condition: bool, detail: str) -> None:
    if not condition:
        raise _Failed(detail)


def _recovers_to(msg: auth.SignedMessageType, signature: bytes, expected: Address, chain_id: int) -> str | None:
    """None if ``signature`` over ``msg`` recovers to ``expected``; else why not."""
    try:
        signer = auth.recover_signer_address(msg, signature, chain_id)
    except TenzroError as exc:
        return f"invalid signature ({exc})"
    if signer != expected:
        return f"signed by {format_address(signer)}, not {format_address(expected)}"
    return None


# --- the checks --------------------------------------------------------------------------------


def _check_chain_id(attestations: Attestations, chain_id: int) -> str:
    _require(
        attestations.chain_id == chain_id,
        f"the attestations are for chain {attestations.chain_id}, verifying for chain {chain_id}",
    )
    return f"chain {chain_id}"


def _check_abi(receipt: TrainingReceipt, abi: bytes) -> str:
    _require(encode_receipt(receipt) == abi, "the ABI bytes are not the encoding of this receipt")
    _require(verify_receipt_bytes(receipt.run_root, abi) is not None, "verify_receipt_bytes rejects the ABI bytes")
    return f"{len(abi)} bytes, valid ReceiptV1"


def _check_run_root(receipt: TrainingReceipt, claimed: bytes | None) -> str:
    leaves = compute_run_leaves(receipt.spec.canonical_bytes(), receipt.transcript, receipt.final_record)
    root = compute_run_root(leaves)
    _require(root == receipt.run_root, f"recomputed {_hex(root)}, the receipt says {_hex(receipt.run_root)}")
    _require(claimed is None or claimed == root, f"the claimed root {_hex(claimed or b'')} differs from {_hex(root)}")
    return f"{_hex(root)} over {len(leaves)} leaves"


def _check_round_records(receipt: TrainingReceipt) -> str:
    spec = receipt.spec
    transcript = receipt.transcript
    _require(len(transcript) == spec.max_rounds, f"{len(transcript)} round records, max_rounds is {spec.max_rounds}")
    for i, record in enumerate(transcript):
        where = f"round record {i}"
        try:
            decoded = decode_round_record(encode_round_record(record))
        except TenzroError as exc:
            raise _Failed(f"{where} does not decode: {exc}") from None
        _require(decoded == record, f"{where} does not decode to itself")
        _require(record.round == i, f"{where} says round {record.round}")
        _require(record.task_id == receipt.task_id, f"{where} is for task {record.task_id!r}")
    # The spec's rule and fragment count, K..M accepted per fragment (a node that dropped honest
    # inputs from the record, and so from the payouts, fails here).
    violation = find_rule_violation(spec, transcript)
    _require(violation is None, violation or "")
    _require(
        not transcript or transcript[-1].model_hash == receipt.final_model_hash,
        "the last round's model hash is not the final model hash",
    )
    return f"{len(transcript)} rounds, rule {spec.aggregation.to_spec()}, last model hash = final"


def _check_trainer_weights(receipt: TrainingReceipt) -> str:
    counts = compute_accepted_counts(receipt.transcript)
    addresses = [t.address for t in receipt.trainers]
    _require(len(set(addresses)) == len(addresses), "a trainer is listed twice")
    unknown = sorted(set(counts) - set(addresses))
    _require(not unknown, f"{format_address(unknown[0]) if unknown else ''} was accepted but is not a trainer")
    for t in receipt.trainers:
        count = counts.get(t.address, 0)
        _require(
            t.accepted_submissions == count,
            f"{format_address(t.address)} claims {t.accepted_submissions} accepted submissions, the transcript has {count}",
        )
    return f"{len(addresses)} trainers, weights = transcript counts"


def _check_syncer_list(receipt: TrainingReceipt) -> str:
    _require(receipt.syncers == compute_syncers(receipt.transcript), "the syncers are not the transcript's")
    return f"{len(receipt.syncers)} syncer(s)"


def _expected_seed(receipt: TrainingReceipt) -> bytes:
    return compute_election_seed(receipt.task_id, receipt.spec.spec_hash())


def _check_election_seed(receipt: TrainingReceipt, attestations: Attestations) -> str:
    seed = _expected_seed(receipt)
    _require(attestations.election.seed == seed, f"stored seed {_hex(attestations.election.seed)}, expected {_hex(seed)}")
    return _hex(seed)


def _check_tickets(receipt: TrainingReceipt, attestations: Attestations) -> str:
    seed = _expected_seed(receipt)
    tickets = attestations.election.tickets
    _require(bool(tickets), "no tickets")
    for t in tickets:
        try:
            validate_ticket(t.ticket, t.candidate, seed)
        except TenzroError as exc:
            raise _Failed(f"ticket of {format_address(t.candidate.address)}: {exc}") from None
    return f"{len(tickets)} ticket(s) verify over the seed"


def _recompute_ranking(receipt: TrainingReceipt, attestations: Attestations) -> tuple[RankedCandidate, ...]:
    tickets = attestations.election.tickets
    return rank_candidates(_expected_seed(receipt), [t.candidate for t in tickets], [t.ticket for t in tickets]).entries


def _check_ranking(receipt: TrainingReceipt, attestations: Attestations) -> str:
    ranking = _recompute_ranking(receipt, attestations)
    stored = attestations.election.ranking
    _require(bool(ranking), "no candidate holds a valid ticket")
    _require(len(ranking) == len(stored), f"{len(ranking)} candidates rank, {len(stored)} are stored")
    for mine, theirs in zip(ranking, stored):
        _require(mine == theirs, f"rank {mine.rank}: recomputed {format_address(mine.address)}, stored differs")
    return " > ".join(format_address(r.address) for r in ranking)


def _check_round_syncers(receipt: TrainingReceipt, attestations: Attestations) -> str:
    ranking = _recompute_ranking(receipt, attestations)
    previous = 1
    for record in receipt.transcript:
        rank = record.syncer_rank
        # Failover only moves down the ranking; a syncer it passed over never comes back.
        _require(rank >= previous, f"round {record.round}: syncer_rank {rank} after rank {previous}")
        previous = rank
        _require(rank <= len(ranking), f"round {record.round}: syncer_rank {rank} but only {len(ranking)} ranked")
        expected = ranking[rank - 1].address
        _require(
            record.syncer == expected,
            f"round {record.round}: syncer {format_address(record.syncer)} is not rank {rank} ({format_address(expected)})",
        )
    return f"{len(receipt.transcript)} rounds finalized by their ranked syncer"


def _check_round_list(receipt: TrainingReceipt, attestations: Attestations) -> None:
    rounds = attestations.rounds
    _require(len(rounds) == len(receipt.transcript), f"{len(rounds)} attested rounds, {len(receipt.transcript)} records")
    for i, att in enumerate(rounds):
        _require(att.round == i, f"attested round {i} says round {att.round}")


def _check_finalize_signatures(receipt: TrainingReceipt, attestations: Attestations, chain_id: int) -> str:
    _check_round_list(receipt, attestations)
    for record, att in zip(receipt.transcript, attestations.rounds):
        where = f"round {record.round}"
        _require(att.syncer == record.syncer, f"{where}: attested syncer differs from the record's")
        signature = att.finalize_signature
        if signature is None:
            raise _Failed(f"{where}: no finalize signature kept")
        why = _recovers_to(auth.FinalizeRound(task_id=receipt.task_id, round=record.round), signature, record.syncer, chain_id)
        _require(why is None, f"{where}: finalize signature {why}")
    return f"{len(attestations.rounds)} FinalizeRound signature(s) recover to the round's syncer"


def _check_submission_signatures(receipt: TrainingReceipt, attestations: Attestations, chain_id: int) -> str:
    _check_round_list(receipt, attestations)
    slashed = {t.address for t in receipt.trainers if t.slashed}
    # A slashed trainer's signed submissions may be missing from the records from its slashing
    # on (dropped with it), never before; without evidence, from round 0 (the slashings check
    # fails that receipt anyway).
    slashed_from = _earliest_slashing(attestations)
    checked = 0
    for record, att in zip(receipt.transcript, attestations.rounds):
        by_key: dict[tuple[int, bytes], SubmissionAttestation] = {}
        for sub in att.submissions:
            key = (sub.fragment, sub.trainer)
            _require(key not in by_key, f"round {record.round} fragment {sub.fragment}: "
                     f"{format_address(sub.trainer)} is attested twice")
            by_key[key] = sub
            msg = auth.SubmitOuterGradient(
                task_id=receipt.task_id, round=record.round, fragment=sub.fragment, payload_hash=sub.payload_hash
            )
            why = _recovers_to(msg, sub.signature, sub.trainer, chain_id)
            _require(why is None, f"round {record.round} fragment {sub.fragment}: submission {why}")
        for fragment, outcome in enumerate(record.fragments):
            for trainer in outcome.accepted:
                _require(
                    (fragment, trainer) in by_key,
                    f"round {record.round} fragment {fragment}: no submission signature of {format_address(trainer)}",
                )
                checked += 1
        # Every submission the node stored for the round was an input of its finalize, unless
        # its trainer was slashed by then: one left out was dropped from the record and the payouts.
        for fragment, trainer in by_key:
            _require(
                (trainer in slashed and record.round >= slashed_from.get(trainer, 0))
                or (fragment < len(record.fragments) and trainer in record.fragments[fragment].accepted),
                f"round {record.round} fragment {fragment}: the signed submission of {format_address(trainer)} "
                "is not among the accepted",
            )
    return f"{checked} accepted submission(s) signed by their trainer"


def _earliest_slashing(attestations: Attestations) -> dict[bytes, int]:
    """Per trainer, the earliest ``slashed_in_round`` its attested evidence claims."""
    earliest: dict[bytes, int] = {}
    for att in attestations.slashings:
        earliest[att.trainer] = min(att.slashed_in_round, earliest.get(att.trainer, att.slashed_in_round))
    return earliest


def _check_slashings(receipt: TrainingReceipt, attestations: Attestations, chain_id: int) -> str:
    slashed = {t.address for t in receipt.trainers if t.slashed}
    fragments = receipt.spec.architecture.fragment_count
    for att in attestations.slashings:
        who = format_address(att.trainer)
        where = f"evidence against {who} (round {att.round} fragment {att.fragment})"
        _require(att.trainer in slashed, f"{where}: the receipt does not mark {who} slashed")
        _require(att.round <= att.slashed_in_round, f"{where}: slashed in round {att.slashed_in_round}, "
                 "before the round it names")
        _require(att.slashed_in_round < len(receipt.transcript),
                 f"{where}: slashed in round {att.slashed_in_round}, the run has {len(receipt.transcript)} rounds")
        _require(att.fragment < fragments, f"{where}: the run has {fragments} fragments")
        first, second = att.payload_hashes
        _require(first != second, f"{where}: both messages sign the same payload hash")
        for payload_hash, signature in zip(att.payload_hashes, att.signatures):
            if signature is None:
                raise _Failed(f"{where}: the node kept no signature for {_hex(payload_hash)}")
            msg = auth.SubmitOuterGradient(
                task_id=receipt.task_id, round=att.round, fragment=att.fragment, payload_hash=payload_hash
            )
            why = _recovers_to(msg, signature, att.trainer, chain_id)
            _require(why is None, f"{where}: {_hex(payload_hash)} {why}")
        if att.slashed_in_round > att.round:
            # Applied after its round was finalized: the node slashes late only a conflict with
            # the payload that round ACCEPTED from the trainer (its stored signed record), so
            # the record and the round's attested submissions must show that first hash. Else a
            # node could postdate a slashing to keep an equivocator as an input meanwhile.
            record = receipt.transcript[att.round]
            attested = {
                (s.fragment, s.trainer): s.payload_hash
                for r in attestations.rounds if r.round == att.round for s in r.submissions
            }
            _require(
                att.fragment < len(record.fragments)
                and att.trainer in record.fragments[att.fragment].accepted
                and attested.get((att.fragment, att.trainer)) == first,
                f"{where}: slashed in round {att.slashed_in_round}, after its round, but round {att.round} "
                f"did not accept {_hex(first)} from {who}",
            )
    slashed_at = _earliest_slashing(attestations)  # every entry was checked above
    unproven = sorted(slashed - set(slashed_at))
    _require(not unproven, f"{format_address(unproven[0]) if unproven else ''} is marked slashed without evidence")
    for trainer, round_ in slashed_at.items():
        for record in receipt.transcript[round_:]:
            for fragment, outcome in enumerate(record.fragments):
                _require(
                    trainer not in outcome.accepted,
                    f"round {record.round} fragment {fragment} accepted {format_address(trainer)}, "
                    f"slashed in round {round_}",
                )
    return f"{len(slashed)} slashed trainer(s), each on signed equivocation evidence"


def _run(name: str, fn: Any, *args: Any) -> CheckResult:
    try:
        return CheckResult(name, True, fn(*args))
    except _Failed as exc:
        return CheckResult(name, False, str(exc))
    except Exception as exc:  # noqa: BLE001 -- a check over untrusted input: any failure is "failed"
        return CheckResult(name, False, f"{type(exc).__name__}: {exc}")


def check_receipt(
    receipt: TrainingReceipt,
    attestations: Attestations,
    chain_id: int,
    *,
    abi: bytes | None = None,
    claimed_root: bytes | None = None,
) -> ReceiptCheck:
    """Run every check (module docstring) of ``receipt`` against ``attestations``, verifying
    signatures for ``chain_id``; ``abi`` (the receipt's ABI bytes) and ``claimed_root`` are
    checked when given. Never raises: wrong types fail the checks they reach."""
    if not isinstance(receipt, TrainingReceipt) or not isinstance(attestations, Attestations):
        return ReceiptCheck((CheckResult("decode", False, "expected a TrainingReceipt and Attestations"),))
    if isinstance(chain_id, bool) or not isinstance(chain_id, int):
        return ReceiptCheck((CheckResult("chain_id", False, f"chain id must be an int, got {chain_id!r}"),))
    checks = [_run("chain_id", _check_chain_id, attestations, chain_id)]
    if abi is not None:
        checks.append(_run("abi", _check_abi, receipt, abi))
    checks += [
        _run("run_root", _check_run_root, receipt, claimed_root),
        _run("round_records", _check_round_records, receipt),
        _run("trainer_weights", _check_trainer_weights, receipt),
        _run("syncer_list", _check_syncer_list, receipt),
        _run("election_seed", _check_election_seed, receipt, attestations),
        _run("tickets", _check_tickets, receipt, attestations),
        _run("ranking", _check_ranking, receipt, attestations),
        _run("round_syncers", _check_round_syncers, receipt, attestations),
        _run("finalize_signatures", _check_finalize_signatures, receipt, attestations, chain_id),
        _run("submission_signatures", _check_submission_signatures, receipt, attestations, chain_id),
        _run("slashings", _check_slashings, receipt, attestations, chain_id),
    ]
    return ReceiptCheck(tuple(checks))


def check_receipt_document(
    document: object, chain_id: int | None = None, *, task_id: str | None = None
) -> ReceiptCheck:
    """:func:`check_receipt` over a getReceipt result (``{"receipt", "run_root", "abi",
    "attestations"}``, what ``tenzro train get-receipt --out`` writes). ``chain_id`` None means
    the attestations' own chain id. A malformed document is one failed ``decode`` check.

    ``task_id``, when given, is the run the caller asked for: a ``task_id`` check comes first.
    Why: a receipt is self-consistent whoever serves it, so a node answering getReceipt of run A
    with run B's valid receipt passed every other check (CLI probe, 2026-11-26)."""
    try:
        if not isinstance(document, Mapping):
            raise EncodingError("expected a JSON object (a getReceipt result)")
        missing = [k for k in ("receipt", "attestations") if k not in document]
        if missing:
            raise EncodingError(f"missing {', '.join(missing)} (written by a node without attestations?)")
        receipt = TrainingReceipt.from_dict(document["receipt"])
        attestations = Attestations.from_dict(document["attestations"])
        abi = None
        if document.get("abi") is not None:
            text = document["abi"]
            if not isinstance(text, str) or not text.startswith("0x"):
                raise EncodingError("abi must be 0x-hex")
            try:
                abi = bytes.fromhex(text[2:])
            except ValueError:
                raise EncodingError("abi is not hex") from None
        claimed = None
        if document.get("run_root") is not None:
            claimed = _unhex("run_root", document["run_root"], 32)
    except Exception as exc:  # noqa: BLE001 -- untrusted document: any failure is a failed decode
        return ReceiptCheck((CheckResult("decode", False, f"{type(exc).__name__}: {exc}"),))
    chosen = attestations.chain_id if chain_id is None else chain_id
    result = check_receipt(receipt, attestations, chosen, abi=abi, claimed_root=claimed)
    if task_id is None:
        return result
    asked = CheckResult("task_id", receipt.task_id == task_id,
                        task_id if receipt.task_id == task_id else f"the receipt is of {receipt.task_id!r}, not {task_id!r}")
    return ReceiptCheck((asked, *result.checks))
