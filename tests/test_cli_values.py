"""tenzro_training.cli.values: the argparse types (a bad value refused at parse time, with its
bounds in the message) and attoTNZO amounts."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import pytest

from tenzro_training.cli import values
from tenzro_training.cli.exits import EXIT_USAGE, CliError


@pytest.mark.parametrize(("parse", "text", "expected"), [
    (values.chain_id, "1", 1),
    (values.chain_id, str(2**256 - 1), 2**256 - 1),
    (values.checkpoint_bytes, "1", 1),
    (values.checkpoint_bytes, str(2**50), 2**50),
    (values.downloads, "1", 1),
    (values.downloads, "32", 32),
    (values.seconds, "0.5", 0.5),
    (values.seconds, "1e9", 1e9),
    (values.seed, "0", 0),
    (values.seed, str(2**63 - 1), 2**63 - 1),
    (values.file_path, " a ", " a "),
    (values.dir_path, ".", "."),
])
def test_values_at_their_bounds_parse(parse: Callable[[str], Any], text: str, expected: Any) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(("parse", "text", "message"), [
    (values.chain_id, "0", "a chain id is 1..2^256-1, got 0"),
    (values.chain_id, str(2**256), f"a chain id is 1..2^256-1, got {2**256}"),
    (values.chain_id, "0x10", "expected a decimal chain id, got '0x10'"),
    (values.checkpoint_bytes, "0", "expected a decimal byte count in 1..2^50, got '0'"),
    (values.checkpoint_bytes, str(2**50 + 1), f"expected a decimal byte count in 1..2^50, got '{2**50 + 1}'"),
    (values.checkpoint_bytes, "+5", "expected a decimal byte count in 1..2^50, got '+5'"),
    (values.downloads, "0", "expected a whole number in 1..32, got '0'"),
    (values.downloads, "33", "expected a whole number in 1..32, got '33'"),
    (values.downloads, "\u0663", "expected a whole number in 1..32, got '\u0663'"),  # an Arabic-Indic 3
    (values.seconds, "0", "expected a positive number of seconds, got '0'"),
    (values.seconds, "-1", "expected a positive number of seconds, got '-1'"),
    (values.seconds, "inf", "expected a positive number of seconds, got 'inf'"),
    (values.seconds, "nan", "expected a positive number of seconds, got 'nan'"),
    (values.seconds, "soon", "expected a number of seconds, got 'soon'"),
    (values.seed, str(2**63), f"expected an integer in [0, 2**63), got '{2**63}'"),
    (values.seed, "-1", "expected an integer in [0, 2**63), got '-1'"),
    (values.seed, "\u0663", "expected an integer in [0, 2**63), got '\u0663'"),
    (values.file_path, "", "expected a file path, got an empty string"),
    (values.file_path, " \t", "expected a file path, got an empty string"),
    (values.dir_path, "", "expected a directory path, got an empty string"),
    (values.dir_path, "  ", "expected a directory path, got an empty string"),
])
def test_invalid_values_are_refused_with_their_bounds(parse: Callable[[str], Any], text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        parse(text)
    assert str(info.value) == message


@pytest.mark.parametrize(("text", "expected"), [("0", 0), ("1", 1), (str(2**256 - 1), 2**256 - 1)])
def test_parse_amount(text: str, expected: int) -> None:
    assert values.parse_amount(text, "--stake") == expected


@pytest.mark.parametrize(("text", "message"), [
    ("01", "--stake must be a decimal integer (attoTNZO)"),
    ("00", "--stake must be a decimal integer (attoTNZO)"),
    ("", "--stake must be a decimal integer (attoTNZO)"),
    ("-1", "--stake must be a decimal integer (attoTNZO)"),
    ("\u0661\u0662", "--stake must be a decimal integer (attoTNZO)"),
    (str(2**256), "--stake exceeds uint256"),
    ("9" * 78, "--stake exceeds uint256"),
    ("1" * 79, "--stake exceeds uint256"),
    ("1" * 5000, "--stake exceeds uint256"),
])
def test_invalid_amounts(text: str, message: str) -> None:
    with pytest.raises(CliError) as info:
        values.parse_amount(text, "--stake")
    assert str(info.value) == message and info.value.exit_code == EXIT_USAGE
