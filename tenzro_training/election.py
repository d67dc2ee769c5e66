"""Stake-weighted VRF syncer election: the seed, tickets, scores and the failover ranking.

What this module is: the rules of SPEC.md "VRF syncer election". Every registered candidate
proves its ECVRF (RFC 9381, ``vrf.py``) over a per-run seed; the node verifies every ticket and
ranks the candidates that hold a valid one. The whole ranking is a stake-weighted random
permutation (an exponential race, Efraimidis-Spirakis): candidate i draws
u_i = (int(beta_i[0:32]) + 1) / 2^256 in (0, 1] from its VRF output and gets the key
-log2(u_i) / stake_i; the lowest key ranks first. Rank 1 wins with probability stake_i / total
stake, and each later rank is a stake-weighted draw among the rest (a Plackett-Luce order),
which is exactly the failover order SPEC.md asks for.

Everything consensus-relevant is integer arithmetic that Solidity or Rust reproduce bit for bit:
-log2(u) is a 64-fractional-bit fixed-point value computed by repeated squaring
(``compute_log2_fixed``), and keys are compared as rationals by cross-multiplication, never
divided. docs/election.md specifies the algorithm for other implementations.

What it is NOT: it does not collect tickets (gossip does), decide when the election window
closes, hold keys, or know about runs; it does no I/O.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from tenzro_training import vrf
from tenzro_training.addresses import Address
from tenzro_training.errors import ElectionError, VRFError
from tenzro_training.records import Candidate, Ticket, is_valid_task_id

__all__ = [
    "ELECTION_DOMAIN",
    "SEED_LENGTH",
    "SCORE_FRACTION_BITS",
    "LOG2_MANTISSA_BITS",
    "MAX_SCORE",
    "ExclusionReason",
    "TicketRejected",
    "Exclusion",
    "RankedCandidate",
    "Ranking",
    "compute_election_seed",
    "make_ticket",
    "validate_ticket",
    "is_valid_ticket",
    "compute_log2_fixed",
    "compute_ticket_score",
    "compute_rank_order",
    "rank_candidates",
]

ELECTION_DOMAIN = b"tenzro/train/syncer-election/v1"
"""Domain prefix of the election seed."""
SEED_LENGTH = 32
SCORE_FRACTION_BITS = 64
"""Fractional bits of the fixed-point -log2(u) score."""
LOG2_MANTISSA_BITS = 127
"""Fractional bits of the normalised mantissa while squaring; 127 keeps M*M below 2^256."""
MAX_SCORE = 256 << SCORE_FRACTION_BITS
"""The largest score: u = 2^-256 (the first 32 bytes of beta all zero)."""

_BETA_LENGTH = 64
_MAX_LOG2_INPUT = 1 << 256


class ExclusionReason(enum.StrEnum):
    """Why a ticket was not used, or a registered candidate was not ranked."""

    NO_TICKET = "no-ticket"
    """A registered candidate with stake had no ticket at all."""
    ZERO_STAKE = "zero-stake"
    """The candidate is registered with stake 0 (its tickets are not even verified)."""
    UNREGISTERED = "unregistered"
    """The ticket's address is not a registered candidate."""
    KEY_MISMATCH = "key-mismatch"
    """The ticket's VRF public key is not the one registered for its address."""
    INVALID_PROOF = "invalid-proof"
    """The proof does not verify (RFC 9381) under the registered key over the seed."""
    DUPLICATE_TICKET = "duplicate-ticket"
    """Another valid ticket of the same candidate was used (the one with the smallest proof bytes)."""


class TicketRejected(ElectionError):
    """A ticket is not valid for the candidate and seed; ``reason`` says why."""

    def __init__(self, address: bytes, reason: ExclusionReason, detail: str = "") -> None:
        self.address = address
        self.reason = reason
        text = f"ticket for 0x{address.hex()} rejected: {reason.value}"
        super().__init__(f"{text} ({detail})" if detail else text)


@dataclass(frozen=True, slots=True)
class Exclusion:
    """One ticket that was not used, or one registered candidate that was not ranked."""

    address: Address
    """The ticket's (or candidate's) 20-byte address."""
    reason: ExclusionReason
    """Why it is excluded."""
    proof: bytes | None
    """The excluded ticket's 80-byte proof; None for a candidate with no ticket at all."""


@dataclass(frozen=True, slots=True)
class RankedCandidate:
    """One ranked candidate: everything a third party needs to re-check its place."""

    rank: int
    """1 = the elected syncer, 2 = first failover, and so on."""
    address: Address
    """The candidate's 20-byte address."""
    vrf_public_key: bytes
    """Its registered 32-byte VRF public key."""
    stake: int
    """Its stake in attoTNZO (> 0)."""
    proof: bytes
    """The 80-byte VRF proof its rank was computed from."""
    beta: bytes
    """The 64-byte VRF output of that proof."""
    score: int
    """L = compute_ticket_score(beta): floor-rounded 2^64 * -log2(u); its key is score / stake."""


@dataclass(frozen=True, slots=True)
class Ranking:
    """The election result: ranked candidates in failover order, and what was left out."""

    seed: bytes
    """The 32-byte election seed every ticket proves."""
    entries: tuple[RankedCandidate, ...]
    """Candidates with a valid ticket and stake > 0, best (lowest key) first."""
    excluded: tuple[Exclusion, ...]
    """Every unused ticket and every registered candidate without one, sorted by
    (address, reason, proof)."""

    def syncer(self, failover: int = 0) -> Address:
        """The address at rank 1 + ``failover``; ElectionError when the ranking is exhausted."""
        if isinstance(failover, bool) or not isinstance(failover, int) or failover < 0:
            raise ElectionError(f"failover must be an int >= 0, got {failover!r}")
        if failover >= len(self.entries):
            raise ElectionError(
                f"no syncer at rank {failover + 1}: only {len(self.entries)} candidates are ranked"
            )
        return self.entries[failover].address

    def get_rank(self, address: bytes) -> int | None:
        """The rank (1-based) of ``address``, or None if it is not ranked."""
        for entry in self.entries:
            if entry.address == address:
                return entry.rank
        return None


# --- seed and tickets -------------------------------------------------------------------------


def compute_election_seed(task_id: str, spec_hash: bytes) -> bytes:
    """SHA-256(b"tenzro/train/syncer-election/v1" || task_id (UTF-8) || spec_hash).

    The concatenation needs no length prefix: the domain is a constant and spec_hash is always
    exactly 32 bytes at the end, so the task_id bytes are whatever lies between the two.
    """
    if not is_valid_task_id(task_id):
        raise ElectionError(f"task_id must be 1-128 chars of [A-Za-z0-9._-], got {task_id!r}")
    if type(spec_hash) is not bytes or len(spec_hash) != 32:
        raise ElectionError("spec_hash must be 32 bytes")
    return hashlib.sha256(ELECTION_DOMAIN + task_id.encode("utf-8") + spec_hash).digest()


def _check_seed(seed: object) -> bytes:
    if type(seed) is not bytes or len(seed) != SEED_LENGTH:
        raise ElectionError(f"election seed must be {SEED_LENGTH} bytes")
    return seed


def make_ticket(secret: bytes, address: bytes, seed: bytes) -> Ticket:
    """Prove the seed with a candidate's 32-byte VRF secret: the ticket it gossips."""
    seed = _check_seed(seed)
    try:
        public = vrf.public_key(secret)
        proof = vrf.prove(secret, seed)
    except VRFError as exc:
        raise ElectionError(f"cannot make a ticket: {exc}") from exc
    return Ticket(Address(address), public, proof)


def validate_ticket(ticket: Ticket, candidate: Candidate, seed: bytes) -> bytes:
    """Return the ticket's 64-byte VRF output, or raise TicketRejected (an ElectionError).

    A ticket is valid when it names the candidate's address and registered VRF key, the
    candidate's stake is positive, and the proof verifies (RFC 9381) over the seed.
    """
    seed = _check_seed(seed)
    if not isinstance(ticket, Ticket) or not isinstance(candidate, Candidate):
        raise ElectionError("validate_ticket needs a Ticket and a Candidate")
    if ticket.address != candidate.address:
        raise TicketRejected(ticket.address, ExclusionReason.UNREGISTERED, "address differs from the candidate's")
    if ticket.vrf_public_key != candidate.vrf_public_key:
        raise TicketRejected(ticket.address, ExclusionReason.KEY_MISMATCH)
    if candidate.stake == 0:
        raise TicketRejected(ticket.address, ExclusionReason.ZERO_STAKE)
    try:
        return vrf.verify(candidate.vrf_public_key, seed, ticket.proof)
    except VRFError as exc:
        raise TicketRejected(ticket.address, ExclusionReason.INVALID_PROOF, str(exc)) from None


def is_valid_ticket(ticket: Ticket, candidate: Candidate, seed: bytes) -> bool:
    """Predicate form of ``validate_ticket``; never raises."""
    try:
        validate_ticket(ticket, candidate, seed)
    except ElectionError:
        return False
    return True


# --- integer score --------------------------------------------------------------------------


def compute_log2_fixed(n: int) -> int:
    """log2(n) in fixed point with 64 fractional bits, for integers 1 <= n <= 2^256.

    Integer part: e = bit_length(n) - 1. Fraction: normalise n to a mantissa M with 127
    fractional bits (2^127 <= M < 2^128; bits below are floor-truncated), then 64 times: square
    M and floor back to 127 fractional bits; if M >= 2^128 the next fraction bit is 1 and M is
    halved (floor). Every step rounds down, so the result never exceeds 2^64 * log2(n); the
    truncation error roughly doubles with each squaring and stays below about 2^-61 in log2
    units after 64 steps (docs/election.md). Against 120-digit decimal logarithms on tens of
    thousands of inputs it equals floor(2^64 * log2(n)) every time. The definition for
    consensus is this algorithm itself, not the real logarithm.
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= _MAX_LOG2_INPUT:
        raise ElectionError(f"compute_log2_fixed needs an int in 1..2^256, got {n!r}")
    p = LOG2_MANTISSA_BITS
    e = n.bit_length() - 1
    m = n >> (e - p) if e >= p else n << (p - e)
    two = 1 << (p + 1)
    result = e << SCORE_FRACTION_BITS
    for bit in range(SCORE_FRACTION_BITS - 1, -1, -1):
        m = (m * m) >> p
        if m >= two:
            m >>= 1
            result |= 1 << bit
    return result


def compute_ticket_score(beta: bytes) -> int:
    """L = 256 * 2^64 - compute_log2_fixed(int(beta[0:32]) + 1): about 2^64 * -log2(u).

    u = (int(beta[0:32], big-endian) + 1) / 2^256 is uniform on (0, 1]; -log2(u) / stake is the
    candidate's exponential-race key. 0 <= L <= 256 * 2^64.
    """
    if type(beta) is not bytes or len(beta) != _BETA_LENGTH:
        raise ElectionError(f"beta must be {_BETA_LENGTH} bytes")
    n = int.from_bytes(beta[:32], "big") + 1
    return MAX_SCORE - compute_log2_fixed(n)


def _compare(a: tuple[bytes, int, bytes, int], b: tuple[bytes, int, bytes, int]) -> int:
    """Order two (address, stake, beta, score) items: key score/stake ascending, then beta, then address."""
    a_address, a_stake, a_beta, a_score = a
    b_address, b_stake, b_beta, b_score = b
    # a.score / a.stake < b.score / b.stake  <=>  a.score * b.stake < b.score * a.stake (stakes > 0)
    lhs, rhs = a_score * b_stake, b_score * a_stake
    if lhs != rhs:
        return -1 if lhs < rhs else 1
    if a_beta != b_beta:
        return -1 if a_beta < b_beta else 1
    if a_address != b_address:
        return -1 if a_address < b_address else 1
    return 0


def compute_rank_order(items: Sequence[tuple[bytes, int, bytes]]) -> list[int]:
    """Indices of ``(address, stake, beta)`` items in rank order (best first); no VRF involved.

    Keys compare exactly as rationals L_i / stake_i by cross-multiplication; equal keys fall back
    to beta bytes ascending, then address bytes ascending. Stakes must be positive.
    """
    scored = []
    for address, stake, beta in items:
        if isinstance(stake, bool) or not isinstance(stake, int) or stake <= 0:
            raise ElectionError(f"ranked stakes must be positive ints, got {stake!r}")
        scored.append((address, stake, beta, compute_ticket_score(beta)))
    order = sorted(range(len(scored)), key=functools.cmp_to_key(lambda i, j: _compare(scored[i], scored[j])))
    return order


# --- the election -----------------------------------------------------------------------------


def _check_candidates(candidates: Sequence[Candidate]) -> dict[bytes, Candidate]:
    by_address: dict[bytes, Candidate] = {}
    keys: set[bytes] = set()
    for candidate in candidates:
        if not isinstance(candidate, Candidate):
            raise ElectionError(f"candidates must be Candidate values, got {type(candidate).__name__}")
        if candidate.address in by_address:
            raise ElectionError(f"duplicate candidate address 0x{candidate.address.hex()}")
        # One VRF key behind two addresses would give them the same beta: correlated draws that
        # are no longer a stake-weighted race.
        if candidate.vrf_public_key in keys:
            raise ElectionError(f"duplicate candidate VRF key {candidate.vrf_public_key.hex()}")
        by_address[candidate.address] = candidate
        keys.add(candidate.vrf_public_key)
    return by_address


def rank_candidates(seed: bytes, candidates: Sequence[Candidate], tickets: Sequence[Ticket]) -> Ranking:
    """Verify every ticket and rank the candidates holding a valid one (stake > 0).

    The result depends only on the seed, the candidate set and the multiset of tickets, never on
    their order. A candidate is ranked iff at least one of its tickets is valid: a ticket anyone
    could forge (an invalid proof, a wrong key) can never knock out an honest candidate. If a
    candidate has several valid tickets (ECVRF proofs of one key and seed may differ, their beta
    cannot), the one with the smallest proof bytes is used and the others are excluded as
    duplicates. Raises ElectionError for a malformed seed, a non-Candidate/Ticket value, or two
    candidates sharing an address or a VRF key.
    """
    seed = _check_seed(seed)
    by_address = _check_candidates(candidates)
    for ticket in tickets:
        if not isinstance(ticket, Ticket):
            raise ElectionError(f"tickets must be Ticket values, got {type(ticket).__name__}")

    excluded: list[Exclusion] = []
    valid: dict[bytes, list[tuple[bytes, bytes]]] = {}  # address -> [(proof, beta)]
    has_ticket: set[bytes] = set()
    for ticket in sorted(tickets, key=lambda t: (t.address, t.vrf_public_key, t.proof)):
        has_ticket.add(ticket.address)
        candidate = by_address.get(ticket.address)
        if candidate is None:
            excluded.append(Exclusion(ticket.address, ExclusionReason.UNREGISTERED, ticket.proof))
            continue
        try:
            beta = validate_ticket(ticket, candidate, seed)
        except TicketRejected as exc:
            excluded.append(Exclusion(ticket.address, exc.reason, ticket.proof))
            continue
        valid.setdefault(ticket.address, []).append((ticket.proof, beta))

    chosen: list[tuple[Candidate, bytes, bytes]] = []  # (candidate, proof, beta)
    for address, candidate in by_address.items():
        if address in valid:
            first, *others = sorted(valid[address])
            chosen.append((candidate, *first))
            excluded.extend(Exclusion(address, ExclusionReason.DUPLICATE_TICKET, p) for p, _ in others)
        elif address not in has_ticket:
            reason = ExclusionReason.ZERO_STAKE if candidate.stake == 0 else ExclusionReason.NO_TICKET
            excluded.append(Exclusion(address, reason, None))

    order = compute_rank_order([(c.address, c.stake, beta) for c, _, beta in chosen])
    entries = tuple(
        RankedCandidate(
            rank=rank,
            address=chosen[i][0].address,
            vrf_public_key=chosen[i][0].vrf_public_key,
            stake=chosen[i][0].stake,
            proof=chosen[i][1],
            beta=chosen[i][2],
            score=compute_ticket_score(chosen[i][2]),
        )
        for rank, i in enumerate(order, start=1)
    )
    excluded.sort(key=lambda x: (x.address, x.reason.value, x.proof or b""))
    return Ranking(seed=seed, entries=entries, excluded=tuple(excluded))

