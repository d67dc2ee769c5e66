"""Tests for tenzro_training.addresses: EIP-55 text form of 20-byte addresses."""

from __future__ import annotations

import pytest
from eth_utils import to_checksum_address
from hypothesis import given
from hypothesis import strategies as st

from tenzro_training.addresses import (
    AddressError,
    format_address,
    is_valid_address_bytes,
    is_valid_address_text,
    parse_address,
    validate_address_bytes,
)
from tenzro_training.errors import TenzroError

# The checksummed examples published in EIP-55 itself.
EIP55_VECTORS = [
    "0x52908400098527886E0F7030069857D2E4169EE7",
    "0x8617E340B3D01FA5F11F306F4090FD50E238070D",
    "0xde709f2102306220921060314715629080e2fb77",
    "0x27b1fdb04752bbc536007a920d24acb045561c26",
    "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",
    "0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359",
    "0xdbF03B407c01E7cD3CBea99509d93f8DDDC8C6FB",
    "0xD1220A0cf47c7B9Be7A2E6BA89F429762e7b9aDb",
]


@pytest.mark.parametrize("text", EIP55_VECTORS)
def test_eip55_vectors_round_trip(text: str) -> None:
    raw = parse_address(text)
    assert raw == bytes.fromhex(text[2:])
    assert format_address(raw) == text


@pytest.mark.parametrize("text", EIP55_VECTORS[4:])
def test_single_case_forms_carry_no_checksum_and_parse(text: str) -> None:
    raw = bytes.fromhex(text[2:])
    assert parse_address(text.lower()) == raw
    assert parse_address("0x" + text[2:].upper()) == raw


def test_format_address_all_zero() -> None:
    assert format_address(bytes(20)) == "0x" + "0" * 40


@given(st.binary(min_size=20, max_size=20))
def test_format_matches_eth_utils_and_round_trips(raw: bytes) -> None:
    text = format_address(raw)
    assert text == to_checksum_address(raw)
    assert parse_address(text) == raw
    assert is_valid_address_text(text)
    assert is_valid_address_bytes(raw)


def test_invalid_checksum_rejected() -> None:
    good = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"
    i = good.index("a", 2)  # flip the case of one letter: a wrong checksum, same bytes
    bad = good[:i] + good[i].swapcase() + good[i + 1 :]
    assert bad != good and bad.lower() == good.lower()
    with pytest.raises(AddressError) as info:
        parse_address(bad)
    assert info.value.value == bad
    assert "checksum" in info.value.reason
    assert not is_valid_address_text(bad)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0x",
        "5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",  # no 0x
        "0X5AAEB6053F3E94C9B9A09F33669435E7EF1BEAED",  # capital X prefix
        "0x5aaeb6053f3e94c9b9a09f33669435e7ef1beae",  # 39 digits
        "0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaed00",  # 42 digits
        "0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaeg",  # non-hex
        " 0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaed",  # whitespace
        "0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaed\n",
        "0x５aaeb6053f3e94c9b9a09f33669435e7ef1beae",  # full-width digit
    ],
)
def test_invalid_address_text(text: str) -> None:
    with pytest.raises(AddressError):
        parse_address(text)
    # A bool, not merely falsy: callers (and JSON views) use it as the answer itself.
    assert is_valid_address_text(text) is False


@pytest.mark.parametrize("value", [None, 0, b"\x00" * 20, bytearray(20)])
def test_invalid_parse_non_string(value: object) -> None:
    with pytest.raises(AddressError):
        parse_address(value)


@pytest.mark.parametrize("value", [b"", b"\x00" * 19, b"\x00" * 21, bytearray(20), "0x" + "00" * 20, None])
def test_invalid_address_bytes(value: object) -> None:
    assert not is_valid_address_bytes(value)
    with pytest.raises(AddressError):
        validate_address_bytes(value)
    with pytest.raises(AddressError):
        format_address(value)  # type: ignore[arg-type]


def test_address_error_is_in_the_project_tree() -> None:
    with pytest.raises(TenzroError):
        parse_address("nope")
    with pytest.raises(ValueError):
        parse_address("nope")


def test_address_errors_name_the_input_and_what_is_wrong() -> None:
    """The message is what a CLI user or an RPC client reads: it must quote the offending value
    and say why it was refused (a wrong length names the length it got)."""
    with pytest.raises(AddressError) as info:
        validate_address_bytes(b"\x00" * 19)
    assert info.value.reason == "expected 20 bytes, got 19"
    assert str(info.value) == "invalid address " + repr(b"\x00" * 19) + ": expected 20 bytes, got 19"
    with pytest.raises(AddressError) as info:
        validate_address_bytes(bytearray(20))
    assert info.value.reason == "expected 20 bytes, got bytearray"
    with pytest.raises(AddressError) as info:
        parse_address("0x12")
    assert str(info.value) == "invalid address '0x12': expected 0x followed by 40 hex digits"
