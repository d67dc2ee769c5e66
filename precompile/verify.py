"""TRAINING_VERIFY (address 0x...1008): the pure reference function and its gas schedule.

What this module is: :func:`training_verify`, the precompile's whole semantics as a plain
function of its input bytes and a read-only view of the chain's sealed receipts, and
:func:`compute_gas`, its gas cost. The EVM registration lives in ``precompile/evm.py``; the
pinned receipt ABI and validity rules in ``tenzro_training/receipt_abi.py`` (docs/receipt.md).

What it is NOT: it does not read storage itself (the caller passes ``sealed``), and it never
raises: a precompile that threw would abort the enclosing transaction in an implementation-
defined way, so every failure, including an unexpected one, answers ``0x00``.

Input:  runRoot (32 bytes) || receipt bytes (abi.encode(ReceiptV1)).
Output: ``0x01`` iff the receipt is VALID, its runRoot equals the given one, and the chain holds a
        sealed record for its taskId with exactly that run root AND the SHA-256 of exactly these
        receipt bytes; ``0x00`` otherwise (also for short, oversized or malformed input). The
        output is always one byte.

Why the digest: the run root does not commit every field the escrow pays by. A trainer's
``slashed`` flag (and its stake, DID, ``sealedAt``) lies outside the Merkle leaves, and the
validity rules accept either ``slashed=false, weight=count`` or ``slashed=true, weight=0`` for
any trainer. Checking only the root let anyone who claims first mark trainers slashed (the
sponsor gets the reward back as dust) or un-slash a slashed one. Requiring the bytes to be the
sealed receipt's canonical encoding (which is unique: ``decode_receipt`` accepts only the bytes
``encode_receipt`` writes) binds the WHOLE receipt to what the node sealed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from tenzro_training.receipt import TrainingReceipt
from tenzro_training.receipt_abi import (
    MAX_RECEIPT_BYTES,
    RECEIPT_DIGEST_LENGTH,
    compute_receipt_digest,
    encode_receipt,
    read_receipt_task_id,
    verify_receipt_bytes,
)
from tenzro_training.records import HASH_LENGTH

__all__ = [
    "TRAINING_VERIFY_ADDRESS",
    "GAS_BASE",
    "GAS_PER_WORD",
    "MAX_INPUT_BYTES",
    "VALID",
    "INVALID",
    "SealedLookup",
    "SealedReceipt",
    "clear_validity_memo",
    "compute_gas",
    "compute_sealed_receipt",
    "training_verify",
]

TRAINING_VERIFY_ADDRESS = bytes.fromhex("0000000000000000000000000000000000001008")
"""The precompile's 20-byte address."""

# Gas: the work is linear in the input. Every byte is hashed about three times: once as part of
# a Merkle leaf, again through the tree and the re-encoding check, and once more for the
# sealed-receipt digest that binds the bytes to the node's seal (added with that binding: one
# more full SHA-256 pass, hence +12/word, SHA256's per-word price). So 3 x 12 plus headroom for
# the ABI walk. The base covers the fixed decoding work (spec JSON parse, the final record, the
# sealed-record lookup: a state read, cf. SLOAD's 2100; the digest alone identifies the sealed
# bytes, run root included, so a native chain needs one word per task, and the base is unchanged).
GAS_BASE = 3_000
GAS_PER_WORD = 42
MAX_INPUT_BYTES = 32 + MAX_RECEIPT_BYTES
"""Longer inputs are refused (0x00) without being parsed; they still pay for their words."""

VALID = b"\x01"
INVALID = b"\x00"


@dataclass(frozen=True, slots=True)
class SealedReceipt:
    """What the chain state holds for one sealed task: enough to require that a submitted
    receipt is exactly the one the node sealed, not merely one with the same run root."""

    run_root: bytes
    """The sealed receipt's run root (32 bytes)."""
    receipt_digest: bytes
    """``receipt_abi.compute_receipt_digest`` (SHA-256) of the sealed receipt's canonical ABI
    bytes: ``encode_receipt`` of the stored receipt, the ``abi`` field getReceipt answers."""


SealedLookup = Callable[[str], "SealedReceipt | None"]
"""task_id -> the chain state's sealed record for it, or None when the chain sealed no such run."""


def compute_sealed_receipt(receipt: TrainingReceipt) -> SealedReceipt:
    """The sealed record the chain keeps for ``receipt`` (the node's stored, sealed receipt).
    EncodingError if it cannot be ABI-encoded."""
    return SealedReceipt(receipt.run_root, compute_receipt_digest(encode_receipt(receipt)))


def compute_gas(input_len: int) -> int:
    """GAS_BASE + GAS_PER_WORD * ceil(input_len / 32)."""
    if isinstance(input_len, bool) or not isinstance(input_len, int) or input_len < 0:
        raise ValueError(f"input_len must be a non-negative int, got {input_len!r}")
    return GAS_BASE + GAS_PER_WORD * (-(-input_len // 32))


def _is_sealed_as(held: object, root: bytes, body_digest: bytes) -> bool:
    """``held`` is a well-formed sealed record for exactly ``root`` and exactly the bytes whose
    digest is ``body_digest``."""
    if type(held) is not SealedReceipt:
        return False
    if type(held.run_root) is not bytes or len(held.run_root) != HASH_LENGTH or held.run_root != root:
        return False
    digest = held.receipt_digest
    if type(digest) is not bytes or len(digest) != RECEIPT_DIGEST_LENGTH:
        return False
    return digest == body_digest


VALIDITY_MEMO_ENTRIES = 256
"""Sealed receipts :func:`training_verify` remembers as valid (by run root and digest)."""

_validity: OrderedDict[tuple[bytes, bytes], bool] = OrderedDict()
"""(run root, digest) of sealed receipts that passed the rules; only passes are remembered."""
_validity_lock = threading.Lock()


def _is_valid(root: bytes, digest: bytes, body: bytes) -> bool:
    """``verify_receipt_bytes(root, body)`` is not None, a pass remembered per (root, SHA-256 of body).

    Why a memo: the validity rules are a pure function of these bytes, and the bytes that reach
    them are a sealed receipt's. A contract calling 0x1008 in a loop on one sealed receipt in
    memory pays for that memory once and the flat per-word gas per call, while the Python rules
    cost ~1 ms per 10 KB (a 64 KiB spec alone: ~70 ms); remembered, a repeat costs one SHA-256
    pass, which the per-word price covers."""
    key = (root, digest)
    with _validity_lock:
        if key in _validity:
            _validity.move_to_end(key)
            return True
    if verify_receipt_bytes(root, body) is None:
        # Not remembered: verify_receipt_bytes answers None for ANY failure, a MemoryError
        # included, and a sealed receipt is valid, so a remembered "invalid" could only be a
        # transient failure made permanent (review, 2026-11-26).
        return False
    with _validity_lock:
        _validity[key] = True
        while len(_validity) > VALIDITY_MEMO_ENTRIES:
            _validity.popitem(last=False)
    return True


def clear_validity_memo() -> None:
    """Forget every remembered validity result (benchmarks time the first call with it)."""
    with _validity_lock:
        _validity.clear()


def training_verify(data: bytes, sealed: SealedLookup) -> bytes:
    """``VALID`` or ``INVALID`` (see the module docstring). Never raises.

    The checks run cheapest first, and the answer is their conjunction, so the order changes no
    answer: the taskId from the head, the sealed record's root and digest (one SHA-256 pass),
    and only for the exact bytes the chain sealed, the validity rules. Validating first let any
    caller make the node's Python spend its whole rule set on forged megabytes for the flat
    per-word gas (contracts probe, 2026-11-26: ~3-10 Mgas/s, ~1 Mgas/s for a spec-heavy input)."""
    try:
        if not isinstance(data, (bytes, bytearray, memoryview)) or not 32 <= len(data) <= MAX_INPUT_BYTES:
            return INVALID
        data = bytes(data)
        root, body = data[:32], data[32:]
        task_id = read_receipt_task_id(body)
        # The validity rules alone leave uncommitted fields free (the slashed flag among them):
        # only the sealed record's digest pins them.
        digest = compute_receipt_digest(body)
        if not _is_sealed_as(sealed(task_id), root, digest):
            return INVALID
        return VALID if _is_valid(root, digest, body) else INVALID
    except Exception:  # noqa: BLE001 -- never let anything escape into the EVM
        return INVALID
