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
from pathlib import Path

from libp2p.crypto import ed25519, secp256k1
from libp2p.crypto.keys import KeyPair

from tenzro_training.errors import TenzroError
from tenzro_training.filelock import try_lock_exclusive
from tenzro_training.keyfiles import (
    KeyFileError,
    create_private_file,
    is_secp256k1_secret,
    new_secp256k1_secret,
    read_private_file,
)

__all__ = ["KEY_FILE_PREFIX", "PeerKeyError", "load_or_create_peer_key", "lock_peer_key"]

KEY_FILE_PREFIX = "tenzro-p2p-secp256k1-v1"
"""The prefix of keys this version creates."""
_LEGACY_ED25519_PREFIX = "tenzro-p2p-ed25519-v1"
_LINE = re.compile(rf"({KEY_FILE_PREFIX}|{_LEGACY_ED25519_PREFIX}) ([0-9a-f]{{64}})\n?")


class PeerKeyError(TenzroError, ValueError):
    """The peer key file is unreadable, malformed or readable by other users."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"peer key {path}: {reason}")


def _read(path: Path) -> KeyPair:
    try:
        # An identity key others can read can be impersonated: refused rather than silently chmod.
        text = read_private_file(path)
    except KeyFileError as exc:
        raise PeerKeyError(path, exc.reason) from None
    match = _LINE.fullmatch(text)
    if match is None:
        raise PeerKeyError(path, f"expected one line '{KEY_FILE_PREFIX} <64 hex digits>'")
    secret = bytes.fromhex(match.group(2))
    if match.group(1) == _LEGACY_ED25519_PREFIX:
        return ed25519.create_new_key_pair(secret)
    if not is_secp256k1_secret(secret):
        raise PeerKeyError(path, "the secp256k1 private key is 0 or not below the group order")
    return secp256k1.create_new_key_pair(secret)


def load_or_create_peer_key(path: str | os.PathLike[str]) -> KeyPair:
    """The key pair stored at ``path``; a new secp256k1 one is created (mode 0600, parent dirs
    0700) if absent. PeerKeyError if the file is malformed or readable by group/other."""
    path = Path(path)
    if not path.exists():
        try:
            create_private_file(path, f"{KEY_FILE_PREFIX} {new_secp256k1_secret().hex()}\n")
        except KeyFileError as exc:
            if not path.exists():
                raise PeerKeyError(path, exc.reason) from None
            # Another process created the key meanwhile: both use that one.
    return _read(path)


def lock_peer_key(path: str | os.PathLike[str]) -> int:
    """Claim the key at ``path`` for one host: a descriptor holding an exclusive flock on the
    file (close it to release; the kernel does when the process dies). PeerKeyError when another
    process, or another host of this one, holds it.

    Why: peers address a host by the peer id its key gives, so two hosts started with one key
    (two trainers pointed at one ``--p2p-key``, a node started twice by a supervisor) cannot be
    told apart: which of them a dial, a message or a model answer reaches is undefined, and each
    sees its peers come and go. The second one now stops at start, before it stakes anything."""
    path = Path(path)
    try:
        fd = try_lock_exclusive(path)
    except OSError as exc:
        raise PeerKeyError(path, f"cannot open it: {exc.strerror or exc}") from None
    if fd is None:
        raise PeerKeyError(path, "in use by another running host (a peer identity can be used by one host at a "
                                 "time; give each node and trainer its own key file)")
    return fd
