"""Ethereum-style account addresses: the 20-byte value and its EIP-55 text form.

Inside the core an address is always the raw 20-byte ``bytes`` value (the :data:`Address` newtype);
text appears only at the edges (JSON-RPC, CLI, EIP-712 messages). This module converts between the
two and validates both:

- :func:`parse_address` reads ``0x`` + 40 hex digits. All-lowercase and all-uppercase hex carry no
  checksum and are accepted as is; mixed case is an EIP-55 checksum and must be correct, so that a
  mistyped address is caught before it receives funds.
- :func:`format_address` writes the EIP-55 checksummed form.

It is NOT a key module: deriving an address from a public key is eth-account's job (see ``auth``).
Pure core: no I/O.
"""

from __future__ import annotations

import functools
import re
from typing import NewType

from eth_hash.auto import keccak

from tenzro_training.errors import TenzroError

__all__ = [
    "ADDRESS_LENGTH",
    "Address",
    "AddressError",
    "format_address",
    "is_valid_address_bytes",
    "is_valid_address_text",
    "parse_address",
    "validate_address_bytes",
]

ADDRESS_LENGTH = 20
"""An address is the last 20 bytes of keccak256(uncompressed public key)."""

Address = NewType("Address", bytes)
"""A 20-byte account address (raw bytes, never text)."""

_ADDRESS_TEXT = re.compile(r"0x[0-9a-fA-F]{40}")


class AddressError(TenzroError, ValueError):
    """An address is malformed: wrong type or length, not hex, or a failed EIP-55 checksum.

    ``value`` is the offending input (as given), ``reason`` says what is wrong with it.
    """

    def __init__(self, value: object, reason: str) -> None:
        self.value = value
        self.reason = reason
        super().__init__(f"invalid address {value!r}: {reason}")


def is_valid_address_bytes(value: object) -> bool:
    """True if ``value`` is a 20-byte ``bytes`` object."""
    return type(value) is bytes and len(value) == ADDRESS_LENGTH


def validate_address_bytes(value: object) -> Address:
    """Return ``value`` as an :data:`Address` or raise :class:`AddressError`.

    Only ``bytes`` is accepted (not ``bytearray`` or ``str``): addresses are used as mapping keys,
    so they must be immutable and of one type, or equal addresses could land under two keys.
    """
    if type(value) is not bytes:
        raise AddressError(value, f"expected 20 bytes, got {type(value).__name__}")
    if len(value) != ADDRESS_LENGTH:
        raise AddressError(value, f"expected 20 bytes, got {len(value)}")
    return Address(value)


@functools.lru_cache(maxsize=1 << 16)
def _compute_checksummed_hex(raw: bytes) -> str:
    # Cached: a node formats the same few hundred addresses into every JSON view, and the
    # keccak + per-character pass was ~70% of a getRun. The function is pure and raw is bytes.
    # EIP-55: hash the lowercase hex text; a letter is uppercased where the corresponding
    # nibble of the hash is >= 8.
    lower = raw.hex()
    digest = keccak(lower.encode("ascii")).hex()
    return "".join(c.upper() if c.isalpha() and int(h, 16) >= 8 else c for c, h in zip(lower, digest))


def format_address(value: bytes) -> str:
    """The EIP-55 checksummed text form (``0x`` + 40 hex digits) of a 20-byte address."""
    raw = validate_address_bytes(value)
    return "0x" + _compute_checksummed_hex(raw)


def parse_address(text: object) -> Address:
    """Parse ``0x`` + 40 hex digits into a 20-byte :data:`Address`.

    Mixed-case input must carry a correct EIP-55 checksum; single-case input is accepted as is
    (it carries no checksum, by EIP-55's own rule).
    """
    if not isinstance(text, str):
        raise AddressError(text, f"expected a string, got {type(text).__name__}")
    if _ADDRESS_TEXT.fullmatch(text) is None:
        raise AddressError(text, "expected 0x followed by 40 hex digits")
    digits = text[2:]
    raw = bytes.fromhex(digits)
    if digits != digits.lower() and digits != digits.upper():
        if digits != _compute_checksummed_hex(raw):
            raise AddressError(text, "EIP-55 checksum mismatch")
    return Address(raw)


def is_valid_address_text(text: object) -> bool:
    """True if :func:`parse_address` would accept ``text``."""
    try:
        parse_address(text)
    except AddressError:
        return False
    return True
