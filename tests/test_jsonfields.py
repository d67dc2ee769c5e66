"""The strict JSON field decoders shared by run state, receipts and attestations."""

from __future__ import annotations

import pytest

from tenzro_training.errors import EncodingError
from tenzro_training.jsonfields import (
    decode_address,
    decode_amount,
    decode_array,
    decode_hex,
    decode_int,
    decode_object,
    encode_hex,
)


def test_round_trips() -> None:
    assert decode_hex("h", encode_hex(b"\x01\xab"), 2) == b"\x01\xab"
    assert decode_amount("a", "0") == 0 and decode_amount("a", str(2**256 - 1)) == 2**256 - 1
    assert decode_address("x", "0x" + "ab" * 20) == bytes.fromhex("ab" * 20)
    assert decode_object("o", {"a": 1, "b": 2}, ("b", "a")) == {"a": 1, "b": 2}
    assert decode_array("l", [1]) == [1]
    assert decode_int("i", 5, 5) == 5 and decode_int("i", -1, 5, minimum=-1) == -1


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: decode_hex("x.h", "0xAB", 1), "x.h: expected 0x \\+ 2 lowercase"),
        (lambda: decode_hex("x.h", "0xab", 2), "x.h: expected 0x \\+ 4"),
        (lambda: decode_hex("x.h", "0xabcd", 1), "x.h: expected 0x \\+ 2"),  # too long is not a prefix match
        (lambda: decode_hex("x.h", 5, 1), "x.h: expected 0x"),  # not a bare TypeError from len()
        (lambda: decode_hex("x.h", b"0xab", 1), "x.h: expected 0x"),
        (lambda: decode_address("x.addr", "0x12"), "x.addr: "),
        (lambda: decode_amount("x.a", "\u0661\u0662"), "x.a: expected a decimal string"),  # Arabic-Indic digits int() takes
        (lambda: decode_amount("x.a", "01"), "x.a: expected a decimal string"),
        (lambda: decode_amount("x.a", str(2**256)), "x.a: exceeds uint256"),
        (lambda: decode_amount("x.a", "9" * 79), "x.a: expected a decimal string of a uint256"),
        (lambda: decode_amount("x.a", "1" * 4301), "x.a: expected a decimal string"),  # int() raised a bare ValueError
        (lambda: decode_object("x.o", {"a": 1}, ("a", "b")), r"x.o: expected an object with exactly the fields \['a', 'b'\]"),
        (lambda: decode_object("x.o", {"a": 1, "b": 2, "c": 3}, ("a", "b")), "x.o: expected an object"),
        (lambda: decode_object("x.o", [("a", 1)], ("a",)), "x.o: expected an object"),
        (lambda: decode_array("x.l", (1,)), "x.l: expected an array, got tuple"),
        (lambda: decode_int("x.i", True, 5), r"x.i: expected an int in 0..5, got True"),
        (lambda: decode_int("x.i", 6, 5), r"x.i: expected an int in 0..5, got 6"),
        (lambda: decode_int("x.i", 0, 5, minimum=1), r"x.i: expected an int in 1..5, got 0"),
        (lambda: decode_int("x.i", 1.0, 5), r"x.i: expected an int"),
    ],
)
def test_invalid_values_name_their_path(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(EncodingError, match=message):
        call()
