"""The persisted peer identity: created once as secp256k1, reloaded with the same peer id, legacy
ed25519 files still accepted, and every bad file refused with PeerKeyError."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from libp2p.crypto.keys import KeyType
from libp2p.peer.id import ID

from tenzro_training.p2p.keys import KEY_FILE_PREFIX, PeerKeyError, load_or_create_peer_key, lock_peer_key

_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def _peer_id(pair) -> str:  # type: ignore[no-untyped-def]
    return ID.from_pubkey(pair.public_key).to_base58()


def test_a_new_key_is_secp256k1_private_and_stable(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "peer.key"
    first = load_or_create_peer_key(path)
    assert first.private_key.get_type() == KeyType.Secp256k1
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text().startswith(KEY_FILE_PREFIX + " ")
    again = load_or_create_peer_key(path)
    assert _peer_id(again) == _peer_id(first)
    data = os.urandom(1 << 16)
    assert again.public_key.verify(data, first.private_key.sign(data))
    assert not list(tmp_path.glob("keys/.*.tmp"))  # no temporary file left behind


def test_a_legacy_ed25519_key_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "old.key"
    path.write_text("tenzro-p2p-ed25519-v1 " + "11" * 32 + "\n")
    path.chmod(0o600)
    pair = load_or_create_peer_key(path)
    assert pair.private_key.get_type() == KeyType.Ed25519
    assert _peer_id(load_or_create_peer_key(path)) == _peer_id(pair)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "expected one line"),
        (KEY_FILE_PREFIX + " " + "ab" * 31, "expected one line"),
        (KEY_FILE_PREFIX + " " + "AB" * 32, "expected one line"),
        ("tenzro-p2p-rsa-v1 " + "ab" * 32, "expected one line"),
        (KEY_FILE_PREFIX + " " + "00" * 32, "group order"),
        (KEY_FILE_PREFIX + " " + f"{_N:064x}", "group order"),
    ],
)
def test_invalid_key_file_is_refused(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "bad.key"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(PeerKeyError, match=reason):
        load_or_create_peer_key(path)
    assert path.read_text() == text  # never rewritten


def test_invalid_key_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "peer.key"
    load_or_create_peer_key(path)
    path.chmod(0o640)
    with pytest.raises(PeerKeyError, match="group/other"):
        load_or_create_peer_key(path)


def test_a_key_in_use_by_another_host_is_refused_until_it_is_released(tmp_path: Path) -> None:
    """Two hosts with one peer key cannot be told apart by their peers: the second lock on the
    file is refused (PeerKeyError naming it), and it is free again once the first closes."""
    path = tmp_path / "peer.key"
    load_or_create_peer_key(path)
    first = lock_peer_key(path)
    try:
        with pytest.raises(PeerKeyError, match="in use by another running host") as info:
            lock_peer_key(path)
        assert str(path) in str(info.value)
    finally:
        os.close(first)
    os.close(lock_peer_key(path))
    with pytest.raises(PeerKeyError, match="cannot open it") as info:
        lock_peer_key(tmp_path / "missing.key")
    assert str(tmp_path / "missing.key") in str(info.value)
