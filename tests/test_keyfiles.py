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
