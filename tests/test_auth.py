"""Tests for tenzro_training.auth: EIP-712 messages, strict signature recovery, signer checks."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from eth_account import Account
from eth_hash.auto import keccak
from hypothesis import given, settings
from hypothesis import strategies as st

from tenzro_training.addresses import format_address, parse_address
from tenzro_training import auth
from tenzro_training.auth import (
    DEFAULT_CHAIN_ID,
    SECP256K1_N,
    AuthError,
    CancelTask,
    EnrollTrainer,
    FinalizeRound,
    MalformedMessage,
    PostTask,
    RequestModel,
    SignatureInvalid,
    SubmitOuterGradient,
    WrongSigner,
    compute_canonical_signature,
    compute_digest,
    recover_signer,
    recover_signer_address,
    sign_message,
    validate_signer,
)
from tenzro_training.errors import TenzroError

KEY_A = bytes.fromhex("46" * 32)  # the private key of EIP-155's worked example
KEY_B = bytes.fromhex("11" * 32)
ADDR_A = Account.from_key(KEY_A).address
ADDR_B = Account.from_key(KEY_B).address
TASK = "train-2026-04-25-timesfm-200m"


def sample_messages() -> list[Any]:
    return [
        PostTask(task_id=TASK, spec_hash=bytes(range(32))),
        EnrollTrainer(task_id=TASK, did="did:tenzro:machine:abc", trainer=parse_address(ADDR_A), stake=10**20),
        SubmitOuterGradient(task_id=TASK, round=12, fragment=3, payload_hash=b"\xab" * 32),
        FinalizeRound(task_id=TASK, round=12),
        CancelTask(task_id=TASK),
        RequestModel(task_id=TASK, requester=parse_address(ADDR_B), round=12, nonce=2**63 + 5),
    ]


MESSAGES = sample_messages()
IDS = [type(m).__name__ for m in MESSAGES]


# --- an independent EIP-712 encoder, written from the EIP's definitions --------------------
# It shares no code with auth.py or eth-account's typed-data encoder, so agreement between the
# two pins the encoding (type strings, field order, value encoding) that Solidity must reproduce.

TYPE_STRINGS = {
    "PostTask": "PostTask(string taskId,bytes32 specHash)",
    "EnrollTrainer": "EnrollTrainer(string taskId,string did,address trainer,uint256 stake)",
    "SubmitOuterGradient": "SubmitOuterGradient(string taskId,uint64 round,uint32 fragment,bytes32 payloadHash)",
    "FinalizeRound": "FinalizeRound(string taskId,uint64 round)",
    "CancelTask": "CancelTask(string taskId)",
    "RequestModel": "RequestModel(string taskId,address requester,uint64 round,uint64 nonce)",
}


def _word(value: int) -> bytes:
    return value.to_bytes(32, "big")


def _hand_struct_hash(msg: Any) -> bytes:
    name = type(msg).__name__
    enc = keccak(TYPE_STRINGS[name].encode())
    enc += keccak(msg.task_id.encode())
    if isinstance(msg, PostTask):
        enc += msg.spec_hash
    elif isinstance(msg, EnrollTrainer):
        enc += keccak(msg.did.encode()) + bytes(12) + msg.trainer + _word(msg.stake)
    elif isinstance(msg, SubmitOuterGradient):
        enc += _word(msg.round) + _word(msg.fragment) + msg.payload_hash
    elif isinstance(msg, FinalizeRound):
        enc += _word(msg.round)
    elif isinstance(msg, RequestModel):
        enc += bytes(12) + msg.requester + _word(msg.round) + _word(msg.nonce)
    return keccak(enc)


def _hand_domain_separator(chain_id: int) -> bytes:
    type_hash = keccak(b"EIP712Domain(string name,string version,uint256 chainId)")
    return keccak(type_hash + keccak(b"Tenzro Train") + keccak(b"1") + _word(chain_id))


def _hand_digest(msg: Any, chain_id: int) -> bytes:
    return keccak(b"\x19\x01" + _hand_domain_separator(chain_id) + _hand_struct_hash(msg))


# --- encoding ------------------------------------------------------------------------------


@pytest.mark.parametrize("msg", MESSAGES, ids=IDS)
@pytest.mark.parametrize("chain_id", [1, DEFAULT_CHAIN_ID, 2**256 - 1])
def test_digest_matches_independent_encoder(msg: Any, chain_id: int) -> None:
    assert compute_digest(msg, chain_id) == _hand_digest(msg, chain_id)


@pytest.mark.parametrize("msg", MESSAGES, ids=IDS)
def test_eip712_type_strings(msg: Any) -> None:
    assert type(msg).eip712_type() == TYPE_STRINGS[type(msg).__name__]


# The values published in docs/auth.md for Solidity/Rust implementers.
DOC_TYPE_HASHES = {
    "PostTask": "50edf58d7ea9a900dbf27ca4cc31d475e1ac56425826cb58768233151ceff31a",
    "EnrollTrainer": "aa62e6e861558195fc63a5a4626b4dd72a705835d65c143671c1d6dd1642adb0",
    "SubmitOuterGradient": "06524bad63a4762dd7aaa18563030e0c24cdd27100584a68d31a04b64b888f54",
    "FinalizeRound": "4ea781a1ad977b3f7028047b90d28bc75e637820c2cc62f308558d2947b32175",
    "CancelTask": "4e782b7e0eaa8004c6322e61847167e1f09d0b3e56e8ffde1554d6594a01ff33",
    "RequestModel": "f19276604d058544aa24b09e25f8170116c3043806f74d973f313486b1ddb27d",
}


def test_documented_type_hashes_and_domain_separator() -> None:
    for msg in MESSAGES:
        assert keccak(type(msg).eip712_type().encode()).hex() == DOC_TYPE_HASHES[type(msg).__name__]
    assert (
        _hand_domain_separator(1337).hex()
        == "8406afb1c3687b10a42bf8bd96f804df0bae77147693782a445aa949dddab906"
    )
    # eth-account puts the domain separator in the SignableMessage header.
    from tenzro_training.auth import compute_signable

    assert compute_signable(MESSAGES[0], 1337).header == _hand_domain_separator(1337)


@pytest.mark.parametrize("msg", MESSAGES, ids=IDS)
def test_typed_data_shape_is_json_and_has_no_verifying_contract(msg: Any) -> None:
    data = msg.typed_data(4242)
    assert json.loads(json.dumps(data)) == data  # JSON-serializable, as wallets need
    assert data["domain"] == {"name": "Tenzro Train", "version": "1", "chainId": 4242}
    assert [f["name"] for f in data["types"]["EIP712Domain"]] == ["name", "version", "chainId"]
    assert data["primaryType"] == type(msg).__name__
    assert set(data["types"]) == {"EIP712Domain", type(msg).__name__}
    assert data["message"]["taskId"] == TASK


def test_typed_data_value_forms() -> None:
    data = MESSAGES[1].typed_data()
    assert data["message"]["trainer"] == ADDR_A  # EIP-55 text
    assert data["message"]["stake"] == 10**20
    assert MESSAGES[0].typed_data()["message"]["specHash"] == "0x" + bytes(range(32)).hex()
    assert data["domain"]["chainId"] == DEFAULT_CHAIN_ID == 1337


# Golden vector: pins the whole pipeline (domain, type, encoding, RFC 6979 signing) so it cannot
# drift silently. Computed once with this module; the digest is also checked by the hand encoder.
GOLDEN_MSG = SubmitOuterGradient(task_id=TASK, round=12, fragment=3, payload_hash=b"\xab" * 32)
GOLDEN_DIGEST = "10e23b15183b84f66dccefdfcec6d1664a7ee29eb4f26ec6fc0324f139330014"
GOLDEN_SIGNATURE = (
    "0bbc58cc558672eaa2e60cb4a7657ec5fd23ece4f8dba62ee92b21b08acb59bb"
    "0657aa96e78d9f72b08985fe150124df57311119324e2c075565e81db18c0166"
    "1b"
)


def test_golden_vector() -> None:
    assert ADDR_A == "0x9d8A62f656a8d1615C1294fd71e9CFb3E4855A4F"
    assert compute_digest(GOLDEN_MSG, 1337).hex() == GOLDEN_DIGEST
    assert _hand_digest(GOLDEN_MSG, 1337).hex() == GOLDEN_DIGEST
    signature = sign_message(GOLDEN_MSG, KEY_A, 1337)
    assert signature.hex() == GOLDEN_SIGNATURE
    assert recover_signer(GOLDEN_MSG, bytes.fromhex(GOLDEN_SIGNATURE), 1337) == ADDR_A


# --- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("msg", MESSAGES, ids=IDS)
def test_round_trip_every_message_type(msg: Any) -> None:
    signature = sign_message(msg, KEY_A)
    assert type(signature) is bytes and len(signature) == 65
    assert signature[64] in (27, 28)
    assert recover_signer(msg, signature) == ADDR_A
    validate_signer(msg, signature, ADDR_A)
    validate_signer(msg, signature, ADDR_A.lower())
    validate_signer(msg, signature, "0x" + ADDR_A[2:].upper())
    validate_signer(msg, signature, parse_address(ADDR_A))


@pytest.mark.parametrize("msg", MESSAGES, ids=IDS)
def test_wallet_signature_is_accepted(msg: Any) -> None:
    # A wallet signs the typed_data dict with eth_signTypedData_v4; eth-account's own entry point
    # for that must produce the very same signature.
    wallet = Account.sign_typed_data(KEY_B, full_message=msg.typed_data(DEFAULT_CHAIN_ID))
    assert bytes(wallet.signature) == sign_message(msg, KEY_B)
    validate_signer(msg, bytes(wallet.signature), ADDR_B)


@settings(max_examples=25, deadline=None)
@given(
    task_id=st.text(min_size=1, max_size=40),
    rnd=st.integers(0, 2**64 - 1),
    fragment=st.integers(0, 2**32 - 1),
    payload_hash=st.binary(min_size=32, max_size=32),
    key=st.integers(1, SECP256K1_N - 1),
)
def test_round_trip_property(task_id: str, rnd: int, fragment: int, payload_hash: bytes, key: int) -> None:
    msg = SubmitOuterGradient(task_id=task_id, round=rnd, fragment=fragment, payload_hash=payload_hash)
    private_key = key.to_bytes(32, "big")
    signature = sign_message(msg, private_key)
    assert compute_digest(msg) == _hand_digest(msg, DEFAULT_CHAIN_ID)
    assert recover_signer(msg, signature) == Account.from_key(private_key).address
    assert int.from_bytes(signature[32:64], "big") <= SECP256K1_N // 2


# --- wrong signer, tampering, replay -------------------------------------------------------


@pytest.mark.parametrize("msg", MESSAGES, ids=IDS)
def test_invalid_wrong_signer(msg: Any) -> None:
    signature = sign_message(msg, KEY_B)
    with pytest.raises(WrongSigner) as info:
        validate_signer(msg, signature, ADDR_A)
    assert info.value.expected == ADDR_A
    assert info.value.actual == ADDR_B
    assert isinstance(info.value, AuthError) and isinstance(info.value, TenzroError)


def _tampered(msg: Any) -> list[Any]:
    """One copy of msg per field, with that field changed."""
    out = []
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        if isinstance(value, str):
            new: Any = value + "x"
        elif isinstance(value, bytes):
            new = bytes([value[0] ^ 1]) + value[1:]
        else:
            new = value + 1
        out.append(dataclasses.replace(msg, **{f.name: new}))
    return out


@pytest.mark.parametrize("msg", MESSAGES, ids=IDS)
def test_invalid_tampered_field_recovers_another_signer(msg: Any) -> None:
    signature = sign_message(msg, KEY_A)
    tampered = _tampered(msg)
    assert len(tampered) == len(dataclasses.fields(msg))
    for other in tampered:
        assert other != msg
        assert compute_digest(other) != compute_digest(msg)
        try:
            recovered = recover_signer(other, signature)
        except SignatureInvalid:
            continue  # also a rejection; what matters is it is never ADDR_A
        assert recovered != ADDR_A
        with pytest.raises(WrongSigner):
            validate_signer(other, signature, ADDR_A)


def test_invalid_cross_message_type_replay() -> None:
    # FinalizeRound(t, 12) and a PostTask are different types: a signature does not transfer.
    finalize = FinalizeRound(task_id=TASK, round=12)
    cancel = CancelTask(task_id=TASK)
    signature = sign_message(cancel, KEY_A)
    with pytest.raises((WrongSigner, SignatureInvalid)):
        validate_signer(finalize, signature, ADDR_A)


@pytest.mark.parametrize("msg", MESSAGES, ids=IDS)
def test_invalid_cross_chain_replay(msg: Any) -> None:
    signature = sign_message(msg, KEY_A, chain_id=1)
    validate_signer(msg, signature, ADDR_A, chain_id=1)
    assert compute_digest(msg, 1) != compute_digest(msg, 1337)
    with pytest.raises((WrongSigner, SignatureInvalid)):
        validate_signer(msg, signature, ADDR_A, chain_id=1337)


# --- malformed signatures ------------------------------------------------------------------


GOOD = sign_message(MESSAGES[3], KEY_A)


def _parts(signature: bytes) -> tuple[int, int, int]:
    return int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:64], "big"), signature[64]


def _join(r: int, s: int, v: int) -> bytes:
    return r.to_bytes(32, "big") + s.to_bytes(32, "big") + bytes([v])


@pytest.mark.parametrize("length", [0, 1, 64, 66, 130])
def test_invalid_signature_length(length: int) -> None:
    signature = (GOOD * 3)[:length]
    with pytest.raises(SignatureInvalid) as info:
        recover_signer(MESSAGES[3], signature)
    assert "65 bytes" in info.value.reason


@pytest.mark.parametrize("value", [None, "0x" + GOOD.hex(), GOOD.hex(), 12345, list(GOOD)])
def test_invalid_signature_type(value: object) -> None:
    with pytest.raises(SignatureInvalid):
        recover_signer(MESSAGES[3], value)  # type: ignore[arg-type]


def test_bytearray_signature_accepted() -> None:
    assert recover_signer(MESSAGES[3], bytearray(GOOD)) == ADDR_A


@pytest.mark.parametrize("v", [0, 1, 2, 26, 29, 35, 36, 255])
def test_invalid_signature_v(v: int) -> None:
    # Decision: only 27/28 (what ecrecover and OpenZeppelin accept). 0/1 are rejected, not
    # normalized, so each signature has one byte form; clients use compute_canonical_signature.
    r, s, _ = _parts(GOOD)
    with pytest.raises(SignatureInvalid) as info:
        recover_signer(MESSAGES[3], _join(r, s, v))
    assert "v must be 27 or 28" in info.value.reason


def test_invalid_high_s_rejected() -> None:
    r, s, v = _parts(GOOD)
    assert s <= SECP256K1_N // 2
    malleable = _join(r, SECP256K1_N - s, 55 - v)  # the other valid ECDSA signature
    with pytest.raises(SignatureInvalid) as info:
        recover_signer(MESSAGES[3], malleable)
    assert "high s" in info.value.reason
    # ... and it really was the same signer's signature: normalizing gives back the original.
    assert compute_canonical_signature(malleable) == GOOD


@pytest.mark.parametrize(
    ("r", "s"),
    [(0, 1), (1, 0), (SECP256K1_N, 1), (1, SECP256K1_N), (2**256 - 1, 1), (1, 2**256 - 1)],
)
def test_invalid_signature_r_s_out_of_range(r: int, s: int) -> None:
    with pytest.raises(SignatureInvalid):
        recover_signer(MESSAGES[3], _join(r, s, 27))


def test_invalid_signature_unrecoverable_r() -> None:
    # x = 5 is not the x-coordinate of any secp256k1 point (5^3 + 7 = 132 is a non-residue mod p).
    _, s, v = _parts(GOOD)
    with pytest.raises(SignatureInvalid) as info:
        recover_signer(MESSAGES[3], _join(5, s, v))
    assert "not recoverable" in info.value.reason


def test_boundary_s_equal_half_order_accepted() -> None:
    # s == n // 2 is the largest low s; it must pass the range checks (it may recover to anyone).
    r, _, v = _parts(GOOD)
    recovered = recover_signer(MESSAGES[3], _join(r, SECP256K1_N // 2, v))
    assert recovered != ADDR_A and parse_address(recovered)


@pytest.mark.parametrize(("r", "s"), [(1, 1), (1, 5), (2, 1)])
def test_boundary_r_and_s_equal_one_accepted(r: int, s: int) -> None:
    # 1 is the smallest valid r and s (ecrecover's range is 1..n-1): it must pass the range
    # checks. x = 1 and x = 2 are x-coordinates of curve points, so these recover to somebody.
    for v in (27, 28):
        recovered = recover_signer(MESSAGES[3], _join(r, s, v))
        assert recovered != ADDR_A and parse_address(recovered)


def test_compute_canonical_signature_maps_v_0_1() -> None:
    r, s, v = _parts(GOOD)
    assert compute_canonical_signature(_join(r, s, v - 27)) == GOOD
    assert compute_canonical_signature(GOOD) == GOOD


@pytest.mark.parametrize("bad", [b"", GOOD[:64], GOOD + b"\x00", GOOD[:64] + b"\x1d", GOOD[:32] + bytes(32) + b"\x1b"])
def test_invalid_compute_canonical_signature(bad: bytes) -> None:
    with pytest.raises(SignatureInvalid):
        compute_canonical_signature(bad)


# --- malformed messages --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("factory", "field"),
    [
        (lambda: PostTask(task_id=1, spec_hash=bytes(32)), "task_id"),  # type: ignore[arg-type]
        (lambda: PostTask(task_id=TASK, spec_hash=bytes(31)), "spec_hash"),  # eth-account would pad it
        (lambda: PostTask(task_id=TASK, spec_hash=bytes(33)), "spec_hash"),
        (lambda: PostTask(task_id=TASK, spec_hash="0x" + "00" * 32), "spec_hash"),  # type: ignore[arg-type]
        (lambda: EnrollTrainer(task_id=TASK, did=None, trainer=bytes(20), stake=1), "did"),  # type: ignore[arg-type]
        (lambda: EnrollTrainer(task_id=TASK, did="d", trainer=bytes(19), stake=1), "trainer"),
        (lambda: EnrollTrainer(task_id=TASK, did="d", trainer=ADDR_A, stake=1), "trainer"),  # type: ignore[arg-type]
        (lambda: EnrollTrainer(task_id=TASK, did="d", trainer=bytes(20), stake=2**256), "stake"),
        (lambda: EnrollTrainer(task_id=TASK, did="d", trainer=bytes(20), stake=-1), "stake"),
        (lambda: EnrollTrainer(task_id=TASK, did="d", trainer=bytes(20), stake=1.0), "stake"),  # type: ignore[arg-type]
        (lambda: SubmitOuterGradient(task_id=TASK, round=2**64, fragment=0, payload_hash=bytes(32)), "round"),
        (lambda: SubmitOuterGradient(task_id=TASK, round=0, fragment=2**32, payload_hash=bytes(32)), "fragment"),
        (lambda: SubmitOuterGradient(task_id=TASK, round=True, fragment=0, payload_hash=bytes(32)), "round"),
        (lambda: FinalizeRound(task_id=TASK, round=-1), "round"),
        (lambda: CancelTask(task_id=b"t"), "task_id"),  # type: ignore[arg-type]
    ],
)
def test_invalid_message_fields(factory: Any, field: str) -> None:
    with pytest.raises(MalformedMessage) as info:
        factory()
    assert info.value.field == field


def test_uint_bounds_accepted() -> None:
    SubmitOuterGradient(task_id=TASK, round=2**64 - 1, fragment=2**32 - 1, payload_hash=bytes(32))
    EnrollTrainer(task_id=TASK, did="d", trainer=bytes(20), stake=2**256 - 1)


@pytest.mark.parametrize("chain_id", [0, -1, 2**256, True, "1337", None])
def test_invalid_chain_id(chain_id: object) -> None:
    with pytest.raises(MalformedMessage) as info:
        compute_digest(MESSAGES[0], chain_id)  # type: ignore[arg-type]
    assert info.value.field == "chain_id"
    with pytest.raises(MalformedMessage):
        recover_signer(MESSAGES[0], GOOD, chain_id)  # type: ignore[arg-type]


def test_invalid_not_a_message() -> None:
    with pytest.raises(MalformedMessage):
        compute_digest({"taskId": TASK})  # type: ignore[arg-type]


def test_messages_are_frozen_and_hashable() -> None:
    msg = FinalizeRound(task_id=TASK, round=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.round = 2  # type: ignore[misc]
    assert {msg, FinalizeRound(task_id=TASK, round=1)} == {msg}


def test_validate_signer_rejects_malformed_expected_address() -> None:
    from tenzro_training.addresses import AddressError

    with pytest.raises(AddressError):
        validate_signer(MESSAGES[3], GOOD, "0xnot-an-address")
    with pytest.raises(AddressError):
        validate_signer(MESSAGES[3], GOOD, bytes(19))


@settings(max_examples=40, deadline=None)
@given(key=st.binary(min_size=32, max_size=32), index=st.integers(min_value=0, max_value=len(MESSAGES) - 1))
def test_recover_signer_address_is_the_signer_and_agrees_with_eth_account(key: bytes, index: int) -> None:
    """The bytes route (what the node uses) against eth-account's own, independent one: the
    signer's address for its signature, and the same *other* address for a tampered message."""
    secret = int.from_bytes(key, "big")
    if not 1 <= secret < SECP256K1_N:
        return
    msg = MESSAGES[index]
    signature = sign_message(msg, key)
    assert recover_signer_address(msg, signature) == parse_address(Account.from_key(key).address)
    v, r, s = signature[64], int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:64], "big")
    for other in _tampered(msg):
        try:
            ours = recover_signer_address(other, signature)
        except SignatureInvalid:
            continue
        assert ours == parse_address(Account._recover_hash(compute_digest(other), vrs=(v, r, s)))
        assert recover_signer(other, signature) == format_address(ours)


@pytest.mark.parametrize(
    "signature",
    [b"", bytes(64), GOOD[:64] + bytes([29]), _join(5, _parts(GOOD)[1], _parts(GOOD)[2]),
     _join(_parts(GOOD)[0], SECP256K1_N - _parts(GOOD)[1], 55 - _parts(GOOD)[2]), _join(0, 1, 27)],
    ids=["empty", "short", "v29", "unrecoverable-r", "high-s", "r-zero"],
)
def test_recover_signer_address_refuses_what_recover_signer_refuses(signature: bytes) -> None:
    with pytest.raises(SignatureInvalid) as text_error:
        recover_signer(MESSAGES[3], signature)
    with pytest.raises(SignatureInvalid) as bytes_error:
        recover_signer_address(MESSAGES[3], signature)
    assert bytes_error.value.reason == text_error.value.reason


def test_format_of_recovered_address_is_eip55() -> None:
    recovered = recover_signer(MESSAGES[3], GOOD)
    assert recovered == format_address(parse_address(recovered))


@given(
    task_id=st.text(min_size=1, max_size=40),
    round_=st.integers(min_value=0, max_value=2**64 - 1),
    fragment=st.integers(min_value=0, max_value=2**32 - 1),
    payload_hash=st.binary(min_size=32, max_size=32),
    stake=st.integers(min_value=0, max_value=2**256 - 1),
    trainer=st.binary(min_size=20, max_size=20),
    chain_id=st.integers(min_value=1, max_value=2**64),
)
def test_direct_digest_equals_eth_account_encoder(task_id, round_, fragment, payload_hash, stake, trainer, chain_id) -> None:
    """compute_digest is a hand-written fast path; eth-account's general encoder is the reference."""
    from eth_hash.auto import keccak as _keccak

    msgs = [
        auth.PostTask(task_id=task_id, spec_hash=payload_hash),
        auth.EnrollTrainer(task_id=task_id, did="did:tenzro:machine:x", trainer=trainer, stake=stake),
        auth.SubmitOuterGradient(task_id=task_id, round=round_, fragment=fragment, payload_hash=payload_hash),
        auth.FinalizeRound(task_id=task_id, round=round_),
        auth.CancelTask(task_id=task_id),
    ]
    for msg in msgs:
        signable = auth.compute_signable(msg, chain_id)
        reference = _keccak(b"\x19" + bytes(signable.version) + signable.header + signable.body)
        assert auth.compute_digest(msg, chain_id) == reference
