"""Persisted libp2p peer identity: one secp256k1 key per node or trainer, in a file of mode 0600.

What it is: load the peer key from disk, or create it atomically the first time. The peer id
derived from it stays the same across restarts, so bootstrap lists and peer scores keep working.
What it is NOT: the Tenzro account key (secp256k1, EIP-712 signatures); that one never touches
the network layer.

File format (text, one line): ``tenzro-p2p-secp256k1-v1 <64 lowercase hex digits of the 32-byte
private scalar>``. Files written before the switch, ``tenzro-p2p-ed25519-v1 <hex seed>``, still
load (same peer id as before); new keys are secp256k1.

Why secp256k1 (the key type of Ethereum's libp2p networks): gossipsub signs every message with
the peer key and every receiver verifies it, over the whole message. For a 1 MiB payload chunk
ed25519 costs ~7.4 ms to sign and ~3.9 ms to verify here (SHA-512 passes in libsodium, plus a
copy into sign||msg), secp256k1 ~0.6 ms each (SHA-256 with SHA-NI, then a 32-byte ECDSA): the
publisher also verifies its own message, so this is most of a chunk's CPU (docs/gossip.md).
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from pathlib import Path

from libp2p.crypto import ed25519, secp256k1
from libp2p.crypto.keys import KeyPair

from tenzro_training.errors import TenzroError

__all__ = ["KEY_FILE_PREFIX", "PeerKeyError", "load_or_create_peer_key"]

KEY_FILE_PREFIX = "tenzro-p2p-secp256k1-v1"
"""The prefix of keys this version creates."""
_LEGACY_ED25519_PREFIX = "tenzro-p2p-ed25519-v1"
_LINE = re.compile(rf"({KEY_FILE_PREFIX}|{_LEGACY_ED25519_PREFIX}) ([0-9a-f]{{64}})\n?")
_SECP256K1_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


class PeerKeyError(TenzroError, ValueError):
    """The peer key file is unreadable, malformed or readable by other users."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"peer key {path}: {reason}")


def _read(path: Path) -> KeyPair:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        # An identity key others can read can be impersonated: refuse rather than silently chmod.
        raise PeerKeyError(path, f"mode {stat.S_IMODE(mode):o} allows group/other access (want 600)")
    match = _LINE.fullmatch(path.read_text(encoding="ascii", errors="replace"))
    if match is None:
        raise PeerKeyError(path, f"expected one line '{KEY_FILE_PREFIX} <64 hex digits>'")
    secret = bytes.fromhex(match.group(2))
    if match.group(1) == _LEGACY_ED25519_PREFIX:
        return ed25519.create_new_key_pair(secret)
    if not 0 < int.from_bytes(secret, "big") < _SECP256K1_ORDER:
        raise PeerKeyError(path, "the secp256k1 private key is 0 or not below the group order")
    return secp256k1.create_new_key_pair(secret)


def _new_secret() -> bytes:
    while True:  # a 32-byte string is out of range with probability ~2^-128
        secret = secrets.token_bytes(32)
        if 0 < int.from_bytes(secret, "big") < _SECP256K1_ORDER:
            return secret


def load_or_create_peer_key(path: str | os.PathLike[str]) -> KeyPair:
    """The key pair stored at ``path``; a new secp256k1 one is created (mode 0600, parent dirs
    0700) if absent. PeerKeyError if the file is malformed or readable by group/other."""
    path = Path(path)
    if path.exists():
        return _read(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    secret = _new_secret()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(f"{KEY_FILE_PREFIX} {secret.hex()}\n")
            fh.flush()
            os.fsync(fh.fileno())
        # link() fails if another process created the key meanwhile: then both use that one.
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)
    return _read(path)
