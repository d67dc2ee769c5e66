"""The project's one exception tree.

Every error the project raises on purpose derives from :class:`TenzroError`. Leaves carry the
offending values as attributes so callers (the JSON-RPC error table, the CLI) can report them
without parsing messages. Errors about untrusted input are also ``ValueError`` so that generic
callers that only know the standard library still classify them correctly.

This module is part of the pure core: it imports nothing.
"""

from __future__ import annotations


class TenzroError(Exception):
    """Root of every error raised by tenzro_training, rpc, storage and precompile."""


# --- pure protocol core -------------------------------------------------------------------


class SpecError(TenzroError, ValueError):
    """A TrainingTaskSpec (or part of one) is malformed; ``path`` names the field."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.reason = message
        super().__init__(f"{path}: {message}" if path else message)


class VRFError(TenzroError, ValueError):
    """An ECVRF key, proof or input is invalid (wrong length, not on curve, fails to verify)."""


class MerkleError(TenzroError, ValueError):
    """A Merkle tree operation got impossible arguments (index out of range, bad hash length)."""


class ElectionError(TenzroError, ValueError):
    """A syncer election input is invalid (bad candidate, stake, ticket or seed)."""


class EncodingError(TenzroError, ValueError):
    """A record's byte encoding is malformed (cannot be decoded, or fields out of range)."""


class FragmentError(TenzroError, ValueError):
    """A checkpoint cannot be split into fragments as asked (bad count, empty model, ...)."""


class PayloadError(TenzroError, ValueError):
    """An OuterGradient payload is malformed: truncated, oversized, wrong layout, NaN/Inf, ..."""


class AggregationError(TenzroError, ValueError):
    """An aggregation rule or its inputs are invalid (K too small for the rule, shape mismatch)."""


class GossipReject(TenzroError):
    """A gossip message is invalid: drop it and penalise the peer that forwarded it."""


class GossipIgnore(TenzroError):
    """A gossip message is not useful now (duplicate, stale): drop it without penalty."""


# --- run lifecycle (raised by the pure transition functions in tenzro_training.run) -------


class RunError(TenzroError, ValueError):
    """A call is not valid for the run's current state. ``task_id`` names the run."""

    def __init__(self, task_id: str, message: str) -> None:
        self.task_id = task_id
        super().__init__(f"{task_id}: {message}")


class UnknownTask(RunError):
    """No run with this task_id exists."""

    def __init__(self, task_id: str) -> None:
        super().__init__(task_id, "unknown task")


class TaskExists(RunError):
    """A different spec was already posted under this task_id."""

    def __init__(self, task_id: str) -> None:
        super().__init__(task_id, "a different spec is already posted under this task_id")


class InvalidState(RunError):
    """The action is not allowed in the run's current status (e.g. enroll after training started)."""

    def __init__(self, task_id: str, status: str, action: str) -> None:
        self.status = status
        self.action = action
        super().__init__(task_id, f"cannot {action} while the run is {status}")


class RoundMismatch(RunError):
    """The call names a round other than the run's current one (and is not a harmless replay)."""

    def __init__(self, task_id: str, expected: int, got: int) -> None:
        self.expected = expected
        self.got = got
        super().__init__(task_id, f"current round is {expected}, call names round {got}")


class LateSubmission(RunError):
    """The submission's round is already finalized, or its straggler window has closed."""

    def __init__(self, task_id: str, round_: int, fragment: int) -> None:
        self.round = round_
        self.fragment = fragment
        super().__init__(task_id, f"submission for round {round_} fragment {fragment} is late")


class NotEnrolled(RunError):
    """The signer is not an enrolled (and unslashed) trainer of this run."""

    def __init__(self, task_id: str, address: str) -> None:
        self.address = address
        super().__init__(task_id, f"{address} is not an enrolled trainer")


class EnrollmentConflict(RunError):
    """The trainer already enrolled with different parameters (DID or stake)."""

    def __init__(self, task_id: str, address: str) -> None:
        self.address = address
        super().__init__(task_id, f"{address} already enrolled with different parameters")


class RunFull(RunError):
    """The run already admitted trainer_count trainers."""

    def __init__(self, task_id: str, trainer_count: int) -> None:
        self.trainer_count = trainer_count
        super().__init__(task_id, f"run is full ({trainer_count} trainers)")


class TooManyRuns(RunError):
    """postTask would open more runs than the node admits (``scope``: ``node`` or ``sponsor``)."""

    def __init__(self, task_id: str, scope: str, limit: int) -> None:
        self.scope = scope
        self.limit = limit
        super().__init__(task_id, f"the node holds {limit} open runs{' of this sponsor' if scope == 'sponsor' else ''}, "
                                  "its limit: post again when one has ended")


class StakeTooLow(RunError):
    """The offered stake is below the node's configured minimum."""

    def __init__(self, task_id: str, minimum: int, got: int) -> None:
        self.minimum = minimum
        self.got = got
        super().__init__(task_id, f"stake {got} is below the minimum {minimum}")


class QuorumNotReached(RunError):
    """finalizeRound was called before every fragment had >= K accepted submissions."""

    def __init__(self, task_id: str, round_: int, counts: tuple[int, ...], quorum: int) -> None:
        self.round = round_
        self.counts = counts
        self.quorum = quorum
        super().__init__(task_id, f"round {round_}: per-fragment accepted counts {list(counts)} < quorum {quorum}")


class Equivocation(RunError):
    """A trainer signed two different payloads for one (task, round, fragment); evidence kept, stake slashed."""

    def __init__(self, task_id: str, round_: int, fragment: int, address: str) -> None:
        self.round = round_
        self.fragment = fragment
        self.address = address
        super().__init__(task_id, f"equivocation by {address} in round {round_} fragment {fragment}: stake slashed")


class PayloadUnavailable(RunError):
    """A submission referenced a payload hash whose bytes the node does not hold (yet)."""

    def __init__(self, task_id: str, payload_hash: str) -> None:
        self.payload_hash = payload_hash
        super().__init__(task_id, f"payload {payload_hash} is not available")


class PayloadNotPublic(PayloadUnavailable):
    """A committed round's payload was asked for that the node does not publish: the round is not
    committed yet (its payloads would let a trainer copy another's work before the round
    closes), the fragment is out of range, or the trainer is not among those the round's record
    accepted for it. ``reason`` says which."""

    def __init__(self, task_id: str, round_: int, fragment: int, trainer: str, reason: str) -> None:
        self.round = round_
        self.fragment = fragment
        self.trainer = trainer
        self.reason = reason
        RunError.__init__(self, task_id, f"the payload of {trainer} for round {round_} fragment {fragment} is not "
                          f"published: {reason}")


class PayloadPruned(PayloadUnavailable):
    """The payload of a committed round was deleted on purpose (the node's ``prune_payloads``);
    its hash, in the submission record, still stands."""

    def __init__(self, task_id: str, payload_hash: str, round_: int) -> None:
        self.payload_hash = payload_hash
        self.round = round_
        RunError.__init__(self, task_id, f"payload {payload_hash} of round {round_} was deleted (prune_payloads)")


class CheckpointError(TenzroError, ValueError):
    """The initial checkpoint named by the spec cannot be loaded or does not match its hash."""

    def __init__(self, uri: str, reason: str) -> None:
        self.uri = uri
        self.reason = reason
        super().__init__(f"init checkpoint {uri}: {reason}")


# --- verifiers (raised by the sources a third party's replay reads: tenzro train verify-run) --


class ArtifactUnavailable(TenzroError):
    """A run artifact a verifier needs (an accepted payload, the init checkpoint, the final
    model file, the run's view) could not be had from where it was asked: the node refused it
    (an HTTP error status: 404 not served, 410 pruned), or sent more bytes than the artifact
    can legitimately be. A failed check of the run, not a transport failure: ``status`` is the
    HTTP status the node answered (None when none applies)."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        self.reason = reason
        self.status = status
        super().__init__(reason)
