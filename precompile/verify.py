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
        sealed receipt for its taskId with exactly that run root; ``0x00`` otherwise (also for
        short, oversized or malformed input). The output is always one byte.
"""

from __future__ import annotations

from collections.abc import Callable

from tenzro_training.receipt_abi import MAX_RECEIPT_BYTES, verify_receipt_bytes

__all__ = [
    "TRAINING_VERIFY_ADDRESS",
    "GAS_BASE",
    "GAS_PER_WORD",
    "MAX_INPUT_BYTES",
    "VALID",
    "INVALID",
    "SealedLookup",
    "compute_gas",
    "training_verify",
]

TRAINING_VERIFY_ADDRESS = bytes.fromhex("0000000000000000000000000000000000001008")
"""The precompile's 20-byte address."""

# Gas: the work is linear in the input. Every byte is hashed about twice (once as part of a
# Merkle leaf, and again through the tree and the re-encoding check), so the per-word price is
# twice SHA256's 12, plus headroom for the ABI walk; the base covers the fixed decoding work
# (spec JSON parse, the final record, the sealed-receipt lookup: a state read, cf. SLOAD's 2100).
GAS_BASE = 3_000
GAS_PER_WORD = 30
MAX_INPUT_BYTES = 32 + MAX_RECEIPT_BYTES
"""Longer inputs are refused (0x00) without being parsed; they still pay for their words."""

VALID = b"\x01"
INVALID = b"\x00"

SealedLookup = Callable[[str], "bytes | None"]
"""task_id -> the run root of the sealed receipt the chain state holds for it, or None."""


def compute_gas(input_len: int) -> int:
    """GAS_BASE + GAS_PER_WORD * ceil(input_len / 32)."""
    if isinstance(input_len, bool) or not isinstance(input_len, int) or input_len < 0:
        raise ValueError(f"input_len must be a non-negative int, got {input_len!r}")
    return GAS_BASE + GAS_PER_WORD * (-(-input_len // 32))


def training_verify(data: bytes, sealed: SealedLookup) -> bytes:
    """``VALID`` or ``INVALID`` (see the module docstring). Never raises."""
    try:
        if not isinstance(data, (bytes, bytearray, memoryview)) or not 32 <= len(data) <= MAX_INPUT_BYTES:
            return INVALID
        data = bytes(data)
        root, body = data[:32], data[32:]
        receipt = verify_receipt_bytes(root, body)
        if receipt is None:
            return INVALID
        held = sealed(receipt.task_id)
        if type(held) is not bytes or held != root:
            return INVALID
        return VALID
    except Exception:  # noqa: BLE001 -- never let anything escape into the EVM
        return INVALID
