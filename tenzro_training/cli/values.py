"""Values typed on the command line: the argparse types (a bad value is refused at parse time,
exit 2, not when it is first used, perhaps hours later) and attoTNZO amounts."""

from __future__ import annotations

import argparse

from tenzro_training.cli.exits import CliError


def chain_id(text: str) -> int:
    """argparse type: an EIP-712 chain id (1..2^256-1), refused at parse time (exit 2) rather
    than when the first signature is made or checked, perhaps hours later."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a decimal chain id, got {text!r}") from None
    if not 0 < value < 2**256:
        raise argparse.ArgumentTypeError(f"a chain id is 1..2^256-1, got {text}")
    return value


def checkpoint_bytes(text: str) -> int:
    """argparse type: a size in bytes within the node config's max_checkpoint_bytes bounds."""
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 2**50:
        raise argparse.ArgumentTypeError(f"expected a decimal byte count in 1..2^50, got {text!r}")
    return int(text)


def downloads(text: str) -> int:
    """argparse type: how many downloads verify-run keeps in flight (1..32: a node counts each
    connection against its per-IP cap, docs/rpc.md "Resource limits")."""
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 32:
        raise argparse.ArgumentTypeError(f"expected a whole number in 1..32, got {text!r}")
    return int(text)


def seconds(text: str) -> float:
    """argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def file_path(text: str) -> str:
    """argparse type: a non-empty file path (``""`` would name the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a file path, got an empty string")
    return text


def seed(text: str) -> int:
    """argparse type: a weights seed, a decimal integer in [0, 2**63)."""
    if not (text.isascii() and text.isdigit()) or int(text) >= 2**63:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**63), got {text!r}")
    return int(text)


def dir_path(text: str) -> str:
    """argparse type: a non-empty directory path (``""`` would silently mean the current one)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a directory path, got an empty string")
    return text


def parse_amount(text: str, flag: str) -> int:
    # ASCII digits only: str.isdigit() also accepts "²" (int() then raises) and other scripts' digits.
    if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0"):
        raise CliError(f"{flag} must be a decimal integer (attoTNZO)")
    if len(text) > 78:  # 2^256 has 78 digits; int() of 4301+ digits raised a traceback (CLI probe)
        raise CliError(f"{flag} exceeds uint256")
    value = int(text)
    if value >= 2**256:
        raise CliError(f"{flag} exceeds uint256")
    return value
