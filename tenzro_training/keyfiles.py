"""Secret files on disk: an operator's account keys and syncer VRF secrets.

What it is: :func:`create_private_file` (owner-only, never overwrites: a key lost to an
accidental second ``keys new`` is stake lost) and :func:`read_private_file` (refuses a file that
group or other users can read: a VRF secret others can read lets them win elections as you), and
the JSON documents ``tenzro keys`` writes (:func:`new_account_document`,
:func:`new_vrf_document`, :func:`parse_vrf_document`).

The libp2p peer key (``p2p/keys.py``) keeps its own one-line format but is written and read
through these two functions. What it is NOT: the dev accounts file (``node/dev.py``, rewritten
at each dev start). A shell module: it does file I/O.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import Any

from tenzro_training import vrf
from tenzro_training.addresses import format_address, parse_address
from tenzro_training.errors import TenzroError
from tenzro_training.jsontext import loads_bounded

__all__ = [
    "KeyFileError",
    "create_private_file",
    "is_secp256k1_secret",
    "new_account_document",
    "new_secp256k1_secret",
    "new_vrf_document",
    "parse_vrf_document",
    "read_private_file",
    "shared_mode_problem",
]

_SECP256K1_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


class KeyFileError(TenzroError, ValueError):
    """A secret file cannot be written or read safely, or does not hold what it should."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def create_private_file(path: Path | str, text: str) -> None:
    """Write ``text`` to a NEW file readable by its owner only (0600), durably: a temp file is
    written and fsynced, then hard-linked into place, which fails if ``path`` exists (also when
    another process created it meanwhile), so an existing key is never replaced."""
    path = Path(path)
    if path.exists():
        raise KeyFileError(path, "already exists; refusing to overwrite a key")
    try:
        _make_private_dirs(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise KeyFileError(path, f"cannot create: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, path)
    except FileExistsError:
        raise KeyFileError(path, "already exists; refusing to overwrite a key") from None
    except OSError as exc:
        raise KeyFileError(path, f"cannot write: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


def _make_private_dirs(path: Path) -> None:
    """Create every missing parent directory of ``path`` 0700 (``mkdir(parents=True, mode=...)``
    applies the mode to the last one only, the others get the umask's 0755)."""
    missing = []
    for d in path.parents:
        if d.exists():
            if not d.is_dir():  # mkdir would say only "File exists"
                raise KeyFileError(path, f"cannot create: {d} is not a directory")
            break
        missing.append(d)
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)


def shared_mode_problem(mode: int) -> str | None:
    """Why a secret file with ``st_mode`` ``mode`` is not private (group or other users have
    any access), or None when only its owner has. The one spelling of that rule."""
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"mode {stat.S_IMODE(mode):o} allows group/other access (chmod 600 it)"
    return None


def read_private_file(path: Path | str) -> str:
    """The text of a secret file that only its owner can access (mode 0600 or stricter)."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise KeyFileError(path, "not a regular file")
        problem = shared_mode_problem(mode)
        if problem is not None:
            # Refuse rather than chmod: the secret may already have leaked; the operator decides.
            raise KeyFileError(path, problem)
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KeyFileError(path, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise KeyFileError(path, "not UTF-8 text") from None


def is_secp256k1_secret(secret: bytes) -> bool:
    """A valid secp256k1 private scalar: 32 bytes, 0 < value < the group order."""
    return len(secret) == 32 and 0 < int.from_bytes(secret, "big") < _SECP256K1_ORDER


def new_secp256k1_secret() -> bytes:
    """A fresh secp256k1 private scalar from the OS CSPRNG."""
    while True:  # a 32-byte string is out of range with probability ~2^-128
        secret = secrets.token_bytes(32)
        if is_secp256k1_secret(secret):
            return secret


def new_account_document() -> dict[str, str]:
    """A fresh secp256k1 account key: ``{"address": EIP-55, "private_key": "0x..."}`` (the JSON
    form every ``--key-file`` option reads)."""
    from eth_account import Account

    key = new_secp256k1_secret()
    return {"address": str(Account.from_key(key).address), "private_key": "0x" + key.hex()}


def new_vrf_document(address: str) -> dict[str, str]:
    """A fresh ECVRF secret for the syncer candidate ``address``:
    ``{"address", "vrf_public_key", "vrf_secret"}``; the public key is what the candidates list
    registers, the secret stays in this file."""
    canonical = format_address(parse_address(address))
    secret = secrets.token_bytes(32)  # any 32 bytes are an RFC 8032 secret (a seed)
    return {"address": canonical, "vrf_public_key": "0x" + vrf.public_key(secret).hex(), "vrf_secret": "0x" + secret.hex()}


def parse_vrf_document(path: Path | str, text: str, address: bytes) -> bytes:
    """The 32-byte VRF secret in a file ``tenzro keys new-vrf`` wrote (JSON, its ``address``
    must be ``address``), or in a file holding only the secret as hex."""
    body = text.strip()
    if body.startswith("{"):
        try:
            doc: Any = loads_bounded(body)
        except ValueError:
            raise KeyFileError(path, "not valid JSON") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("vrf_secret"), str):
            raise KeyFileError(path, 'expected a JSON object with a "vrf_secret"')
        if "address" in doc:
            try:
                named = parse_address(doc["address"])
            except (TenzroError, TypeError, ValueError):
                raise KeyFileError(path, "its address is not a valid address") from None
            if named != address:
                raise KeyFileError(path, f"holds the VRF secret of {format_address(named)}, not {format_address(address)}")
        body = doc["vrf_secret"]
    hex_text = body[2:] if body.startswith(("0x", "0X")) else body
    try:
        secret = bytes.fromhex(hex_text)
    except ValueError:
        raise KeyFileError(path, "the VRF secret is not hex") from None
    if len(secret) != 32:
        raise KeyFileError(path, f"the VRF secret must be 32 bytes, got {len(secret)}")
    return secret
