"""Signing keys: ``--key-file`` / ``--account`` / ``TENZRO_PRIVATE_KEY`` to a secp256k1 key, its
address, EIP-712 signatures, and the client for signed calls."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from tenzro_training import auth
from tenzro_training.cli.client import RpcClient
from tenzro_training.cli.exits import CliError
from tenzro_training.cli.files import read_text
from tenzro_training.logformat import format_stderr_line


def _parse_key_hex(text: str, where: str) -> bytes:
    hex_text = text[2:] if text.startswith(("0x", "0X")) else text
    try:
        key = bytes.fromhex(hex_text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise CliError(f"{where}: signing key must be 32 bytes of hex")
    if not 0 < int.from_bytes(key, "big") < auth.SECP256K1_N:
        raise CliError(f"{where}: not a valid secp256k1 private key (must be in 1..n-1)")
    return key


def _select_account(doc: dict[str, Any], account: str | None, key_file: str) -> str:
    """The private key of one entry of a dev-accounts.json document (``--account``)."""
    accounts = doc.get("accounts")
    if not isinstance(accounts, list):
        raise CliError(f"key file {key_file}: expected a private_key or an accounts list")
    names = []
    for entry in accounts:
        if not isinstance(entry, dict):
            continue
        role, index = entry.get("role"), entry.get("index", 0)
        names.append(f"{role}:{index}")
        if account is None:
            continue
        wanted = account.lower()
        if wanted in (f"{role}:{index}".lower(), str(entry.get("address", "")).lower()) or (
            wanted == str(role).lower() and index == 0
        ):
            return str(entry.get("private_key", ""))
    if account is None:
        if len(names) == 1:  # nothing to pick from
            return _select_account(doc, names[0], key_file)
        if not names:
            raise CliError(f"key file {key_file}: its accounts list has no entries")
        shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        raise CliError(f"key file {key_file} holds {len(names)} accounts: pick one with --account ({shown})")
    raise CliError(f"no account {account!r} in {key_file} (have {', '.join(names) or 'none'})")


def load_private_key(key_file: str | None, account: str | None = None) -> bytes:
    """A 32-byte secp256k1 key from ``--key-file`` or the ``TENZRO_PRIVATE_KEY`` environment variable.

    The file holds the key as hex text, or JSON ``{"private_key": ...}``, or a dev-accounts.json
    document (``tenzro node --dev`` writes one) from which ``account`` (``trainer:3``, ``sponsor``,
    ``syncer:0`` or an address) picks the entry.
    """
    text: str | None
    if key_file:
        text = read_text(key_file, "key file").strip()
        try:
            mode = Path(key_file).stat().st_mode
        except OSError as exc:
            raise CliError(f"cannot read key file {key_file}: {exc.strerror}") from None
        from tenzro_training.keyfiles import shared_mode_problem

        problem = shared_mode_problem(mode)
        if problem is not None:  # warn, not refuse: the key works, but the operator should know
            print(format_stderr_line(f"tenzro: warning: key file {key_file}: {problem}", logging.WARNING),
                  file=sys.stderr)
        if text.startswith("{"):
            from tenzro_training.jsontext import loads_bounded

            try:
                doc = loads_bounded(text, unique_keys=True)  # two private_keys: which one was meant?
            except ValueError as exc:
                raise CliError(f"key file {key_file}: not valid JSON ({exc})") from None
            if not isinstance(doc, dict):
                raise CliError(f"key file {key_file}: expected a JSON object")
            if "private_key" in doc and "accounts" in doc:
                raise CliError(f"key file {key_file}: holds both a private_key and an accounts list; keep one")
            if "private_key" in doc:
                if account is not None:  # it used to be ignored, signing with the one key silently
                    raise CliError(f"--account needs a dev-accounts.json key file; {key_file} holds one private_key")
                text = str(doc["private_key"])
            else:
                text = _select_account(doc, account, key_file)
        elif account is not None:
            raise CliError("--account needs a dev-accounts.json key file")
    else:
        if account is not None:
            raise CliError("--account needs --key-file (a dev-accounts.json file)")
        text = os.environ.get("TENZRO_PRIVATE_KEY", "").strip()  # as a key file's text is
        if not text:
            raise CliError("no signing key: pass --key-file or set TENZRO_PRIVATE_KEY")
    return _parse_key_hex(text, key_file or "TENZRO_PRIVATE_KEY")


def load_signing_key(args: argparse.Namespace) -> bytes:
    """The key named by a command's ``--key-file``/``--account`` (or the environment)."""
    return load_private_key(getattr(args, "key_file", None), getattr(args, "account", None))


def key_address(key: bytes) -> str:
    from eth_account import Account

    return str(Account.from_key(key).address)


def sign(msg: auth.SignedMessageType, key: bytes, chain_id: int) -> str:
    return "0x" + auth.sign_message(msg, key, chain_id).hex()


def signing_client(args: argparse.Namespace, key: bytes, timeout: float = 120.0) -> RpcClient:
    """A client for calls signed with ``key``: its refusals can say when the node recovered
    another signer (a wrong --chain-id)."""
    return RpcClient(args.rpc, timeout, signer=(key_address(key), args.chain_id))
