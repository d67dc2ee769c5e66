"""Persisted libp2p peer identity: one ed25519 key per node or trainer, in a file of mode 0600.

What it is: load the peer key from disk, or create it atomically the first time. The peer id
derived from it stays the same across restarts, so bootstrap lists and peer scores keep working.
What it is NOT: the Tenzro account key (secp256k1, EIP-712 signatures); that one never touches
the network layer.

File format (text, one line): ``tenzro-p2p-ed25519-v1 <64 lowercase hex digits of the 32-byte seed>``.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from pathlib import Path

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair

from tenzro_training.errors import TenzroError

__all__ = ["KEY_FILE_PREFIX", "PeerKeyError", "load_or_create_peer_key"]

KEY_FILE_PREFIX = "tenzro-p2p-ed25519-v1"
_LINE = re.compile(rf"{KEY_FILE_PREFIX} ([0-9a-f]{{64}})\n?")


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
    return create_new_key_pair(bytes.fromhex(match.group(1)))


def load_or_create_peer_key(path: str | os.PathLike[str]) -> KeyPair:
    """The ed25519 key pair stored at ``path``; created (mode 0600, parent dirs 0700) if absent."""
    path = Path(path)
    if path.exists():
        return _read(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    seed = secrets.token_bytes(32)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(f"{KEY_FILE_PREFIX} {seed.hex()}\n")
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
