"""tenzro_training.keyfiles: owner-only secret files that are never overwritten, and the key
documents ``tenzro keys`` writes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from eth_account import Account

from tenzro_training import vrf
from tenzro_training.addresses import parse_address
from tenzro_training.keyfiles import (
    KeyFileError,
    create_private_file,
    new_account_document,
    new_vrf_document,
    parse_vrf_document,
    read_private_file,
)


def test_create_private_file_makes_every_new_parent_private(tmp_path: Path) -> None:
    """mkdir(parents=True, mode=0o700) left the intermediate directories at 0755."""
    import os
    import stat

    create_private_file(tmp_path / "a" / "b" / "c.key", "secret\n")
    for d in (tmp_path / "a", tmp_path / "a" / "b"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d


def test_invalid_key_path_under_a_file_says_so(tmp_path: Path) -> None:
    (tmp_path / "existing.key").write_text("x")
    with pytest.raises(KeyFileError, match="existing.key is not a directory"):
        create_private_file(tmp_path / "existing.key" / "sub" / "new.key", "secret\n")


def test_create_private_file_is_owner_only_and_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "a.json"
    old_umask = os.umask(0)  # even a permissive umask gives 0600
    try:
        create_private_file(path, "secret\n")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and read_private_file(path) == "secret\n"
    with pytest.raises(KeyFileError, match="refusing to overwrite"):
        create_private_file(path, "other\n")
    assert path.read_text() == "secret\n"
    assert [p.name for p in path.parent.iterdir()] == ["a.json"]  # no temp file left behind


def test_invalid_private_files(tmp_path: Path) -> None:
    open_file = tmp_path / "open"
    open_file.write_text("x")
    open_file.chmod(0o640)
    with pytest.raises(KeyFileError, match="mode 640 allows group/other access"):
        read_private_file(open_file)
    with pytest.raises(KeyFileError, match="cannot read"):
        read_private_file(tmp_path / "missing")
    with pytest.raises(KeyFileError, match="not a regular file"):
        read_private_file(tmp_path)
    with pytest.raises(KeyFileError, match="cannot create"):
        create_private_file(open_file / "below-a-file", "x")
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00key")
    binary.chmod(0o600)
    with pytest.raises(KeyFileError, match="not UTF-8 text"):
        read_private_file(binary)


def test_new_account_document_is_a_usable_key() -> None:
    a, b = new_account_document(), new_account_document()
    assert a["private_key"] != b["private_key"]
    assert Account.from_key(a["private_key"]).address == a["address"]


def test_new_vrf_document_round_trips(tmp_path: Path) -> None:
    address = "0x" + "ab" * 20
    doc = new_vrf_document(address)
    secret = parse_vrf_document("f", json.dumps(doc), parse_address(address))
    assert "0x" + vrf.public_key(secret).hex() == doc["vrf_public_key"]
    assert doc["address"] == "0x" + "ab" * 20 or doc["address"].lower() == address
    assert new_vrf_document(address)["vrf_secret"] != doc["vrf_secret"]
    proof = vrf.prove(secret, b"alpha")
    assert vrf.is_valid_proof(bytes.fromhex(doc["vrf_public_key"][2:]), b"alpha", proof)


def test_a_key_created_meanwhile_by_another_process_is_never_replaced(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The temp file is fsynced, then hard-linked into place: a link fails where a rename would
    have replaced the key another process created between the check and the link."""
    path = tmp_path / "a.json"
    real_fsync = os.fsync
    synced: list[int] = []

    def fsync_then_race(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)
        path.write_text("other\n")

    monkeypatch.setattr(os, "fsync", fsync_then_race)
    with pytest.raises(KeyFileError) as info:
        create_private_file(path, "secret\n")
    assert str(info.value) == f"{path}: already exists; refusing to overwrite a key"
    assert synced and path.read_text() == "other\n" and [p.name for p in tmp_path.iterdir()] == ["a.json"]
    monkeypatch.undo()
    with pytest.raises(KeyFileError) as info:
        create_private_file(path, "secret\n")
    assert str(info.value) == f"{path}: already exists; refusing to overwrite a key"


def test_invalid_temp_file_in_the_way_is_refused_not_followed(tmp_path: Path) -> None:
    """A symlink planted at the temp file's name would have sent the secret to its target."""
    victim = tmp_path / "victim"
    victim.write_text("victim's text\n")
    path = tmp_path / "a.json"
    (tmp_path / f".a.json.{os.getpid()}.tmp").symlink_to(victim)
    with pytest.raises(KeyFileError, match="a.json: cannot create: File exists"):
        create_private_file(path, "secret\n")
    assert victim.read_text() == "victim's text\n" and not path.exists()


@pytest.mark.parametrize("mode", [0o604, 0o602, 0o601, 0o620, 0o610, 0o660])
def test_invalid_private_file_modes_any_group_or_other_bit(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "key"
    path.write_text("x")
    path.chmod(mode)
    with pytest.raises(KeyFileError) as info:
        read_private_file(path)
    assert info.value.reason == f"mode {mode:o} allows group/other access (chmod 600 it)"


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700])
def test_owner_only_modes_read(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "key"
    path.write_text("x")
    path.chmod(mode)
    assert read_private_file(path) == "x"


def test_is_secp256k1_secret_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    from tenzro_training import keyfiles

    order = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    assert keyfiles.is_secp256k1_secret((1).to_bytes(32, "big"))
    assert keyfiles.is_secp256k1_secret((order - 1).to_bytes(32, "big"))
    assert not keyfiles.is_secp256k1_secret(bytes(32))
    assert not keyfiles.is_secp256k1_secret(order.to_bytes(32, "big"))
    assert not keyfiles.is_secp256k1_secret((1).to_bytes(31, "big"))
    assert not keyfiles.is_secp256k1_secret((1).to_bytes(33, "big"))
    drawn = iter([order.to_bytes(32, "big"), bytes(32), b"\x07" * 32])
    monkeypatch.setattr(keyfiles.secrets, "token_bytes", lambda n: next(drawn))
    assert keyfiles.new_secp256k1_secret() == b"\x07" * 32  # out-of-range draws are drawn again


def test_key_documents_name_canonical_hex() -> None:
    doc = new_account_document()
    assert doc["private_key"].startswith("0x") and len(doc["private_key"]) == 66
    vrf_doc = new_vrf_document("0x" + "ab" * 20)
    assert vrf_doc["address"] == "0xABaBaBaBABabABabAbAbABAbABabababaBaBABaB"  # EIP-55
    assert vrf_doc["vrf_public_key"].startswith("0x") and vrf_doc["vrf_secret"].startswith("0x")


def test_parse_vrf_document_accepts_its_spellings() -> None:
    address = parse_address("0x" + "ab" * 20)
    secret = bytes(range(32))
    doc = {"address": "0x" + "ab" * 20, "vrf_secret": "0x" + secret.hex()}
    assert parse_vrf_document("f", "\n  " + json.dumps(doc) + "\n", address) == secret
    assert parse_vrf_document("f", json.dumps({"vrf_secret": secret.hex()}), address) == secret  # no address
    assert parse_vrf_document("f", "0X" + secret.hex().upper() + "\n", address) == secret
    assert parse_vrf_document("f", secret.hex(), address) == secret


@pytest.mark.parametrize(("text", "reason"), [
    ("{not json", "not valid JSON"),
    ('{"vrf_secret": 5}', 'expected a JSON object with a "vrf_secret"'),
    ('{"secret": "00"}', 'expected a JSON object with a "vrf_secret"'),
    ('{"address": 5, "vrf_secret": "00"}', "its address is not a valid address"),
    ('{"address": "0x' + "cd" * 20 + '", "vrf_secret": "00"}',
     "holds the VRF secret of 0xCdCDCdCdcdcdcdCdcDcDCdcDcDCdCdcdCdcDCDcD, not 0xABaBaBaBABabABabAbAbABAbABabababaBaBABaB"),
    ("zz" * 32, "the VRF secret is not hex"),
    ("0x" + "11" * 31, "the VRF secret must be 32 bytes, got 31"),
    ("0x" + "11" * 33, "the VRF secret must be 32 bytes, got 33"),
])
def test_invalid_vrf_documents(text: str, reason: str) -> None:
    with pytest.raises(KeyFileError) as info:
        parse_vrf_document("vrf.json", text, parse_address("0x" + "ab" * 20))
    assert info.value.reason == reason and str(info.value) == f"vrf.json: {reason}"
