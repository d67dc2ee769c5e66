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
        (KEY_FILE_PREFIX + " " + "ab" * 33, "expected one line"),
        ("tenzro-p2p-ed25519-v1 " + "11" * 33, "expected one line"),
        (KEY_FILE_PREFIX + " " + "ab" * 32 + " ", "expected one line"),
        (KEY_FILE_PREFIX + " " + "ab" * 32 + "\n\n", "expected one line"),
        (KEY_FILE_PREFIX + " " + "ab" * 32 + "\n" + KEY_FILE_PREFIX + " " + "cd" * 32 + "\n", "expected one line"),
        ("old: " + KEY_FILE_PREFIX + " " + "ab" * 32 + "\n", "expected one line"),
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


def test_a_peer_key_error_names_the_file_and_the_reason(tmp_path: Path) -> None:
    """The node and the trainer print str(error) as their one line (exit 1): it must say which
    file and why; the path and the reason are also kept apart for callers."""
    path = tmp_path / "peer.key"
    load_or_create_peer_key(path)
    path.chmod(0o640)
    with pytest.raises(PeerKeyError) as info:
        load_or_create_peer_key(path)
    reason = "mode 640 allows group/other access (chmod 600 it)"
    assert str(info.value) == f"peer key {path}: {reason}"
    assert info.value.path == path and info.value.reason == reason


def test_a_key_path_given_as_a_string_is_created_and_reloaded(tmp_path: Path) -> None:
    path = str(tmp_path / "peer.key")
    first = load_or_create_peer_key(path)
    assert _peer_id(load_or_create_peer_key(path)) == _peer_id(first)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    os.close(lock_peer_key(path))
    with pytest.raises(PeerKeyError) as info:
        lock_peer_key(str(tmp_path / "missing.key"))
    assert info.value.path == tmp_path / "missing.key"  # a Path, whatever the caller passed


def test_a_key_that_cannot_be_created_is_refused_with_the_reason(tmp_path: Path) -> None:
    """The create failure itself is reported (here: a parent that is a file), not a later
    failure to read a file that was never written."""
    (tmp_path / "plain").write_text("")
    path = tmp_path / "plain" / "peer.key"
    with pytest.raises(PeerKeyError, match="cannot create: .* is not a directory") as info:
        load_or_create_peer_key(path)
    assert info.value.path == path


def test_a_key_another_process_created_meanwhile_is_the_one_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes starting with one missing key file: the one that loses the race to create
    it uses the winner's key (one peer id), not an error and not a key of its own."""
    from libp2p.crypto import secp256k1

    from tenzro_training.keyfiles import create_private_file
    from tenzro_training.p2p import keys as keys_module

    path = tmp_path / "peer.key"
    theirs = KEY_FILE_PREFIX + " " + "11" * 32 + "\n"

    def racing(target: Path, text: str) -> None:
        create_private_file(target, theirs)  # the other process, between exists() and the create
        create_private_file(target, text)  # refused: the file exists now

    monkeypatch.setattr(keys_module, "create_private_file", racing)
    pair = load_or_create_peer_key(path)
    assert path.read_text() == theirs
    assert _peer_id(pair) == _peer_id(secp256k1.create_new_key_pair(bytes.fromhex("11" * 32)))
