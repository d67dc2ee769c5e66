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
