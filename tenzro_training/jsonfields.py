"""Strict decoders for the JSON forms of bytes, addresses and amounts (pure core).

Every JSON view in the project writes hashes, keys and signatures as ``0x`` + lowercase hex,
addresses as EIP-55 text and uint256 amounts as canonical decimal strings; these are the one set
of parsers for reading them back (run state, receipts, attestations), so a value has exactly one
accepted spelling everywhere. ``path`` names the field in the EncodingError.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tenzro_training.addresses import Address, AddressError, parse_address
from tenzro_training.errors import EncodingError

__all__ = [
    "decode_address",
    "decode_amount",
    "decode_array",
    "decode_hex",
    "decode_int",
    "decode_object",
    "encode_hex",
]

_LOWER_HEX = re.compile(r"0x[0-9a-f]*")
_U256 = 2**256


def encode_hex(value: bytes) -> str:
    """``0x`` + lowercase hex."""
    return "0x" + value.hex()


def decode_hex(path: str, value: object, length: int) -> bytes:
    """Exactly ``length`` bytes written as ``0x`` + lowercase hex; EncodingError otherwise."""
    if not isinstance(value, str) or len(value) != 2 + 2 * length or _LOWER_HEX.fullmatch(value) is None:
        raise EncodingError(f"{path}: expected 0x + {2 * length} lowercase hex digits, got {value!r:.80}")
    return bytes.fromhex(value[2:])


def decode_address(path: str, value: object) -> Address:
    """A 20-byte address from its text (mixed case must be a valid EIP-55 checksum)."""
    try:
        return parse_address(value)
    except AddressError as exc:
        raise EncodingError(f"{path}: {exc.reason}") from None


def decode_amount(path: str, value: object) -> int:
    """A uint256 written as a canonical decimal string (no sign, no leading zeros)."""
    # uint256 has at most 78 digits: checked before int(), which refuses over 4300 digits with
    # a bare ValueError (fuzzing probe, 2026-11-26).
    if (not isinstance(value, str) or not value.isascii() or not value.isdigit() or (len(value) > 1 and value[0] == "0")
            or len(value) > 78):
        raise EncodingError(f"{path}: expected a decimal string of a uint256, got {value!r:.80}")
    amount = int(value)
    if amount >= _U256:
        raise EncodingError(f"{path}: exceeds uint256")
    return amount


def decode_object(path: str, value: object, keys: tuple[str, ...]) -> Mapping[str, Any]:
    """A JSON object with exactly the fields ``keys`` (no missing, no extra)."""
    if not isinstance(value, Mapping) or set(value) != set(keys):
        raise EncodingError(f"{path}: expected an object with exactly the fields {list(keys)}")
    return value


def decode_array(path: str, value: object) -> list[Any]:
    """A JSON array."""
    if not isinstance(value, list):
        raise EncodingError(f"{path}: expected an array, got {type(value).__name__}")
    return value


def decode_int(path: str, value: object, maximum: int, minimum: int = 0) -> int:
    """An integer (not a bool) in ``minimum..maximum``."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise EncodingError(f"{path}: expected an int in {minimum}..{maximum}, got {value!r}")
    return value
