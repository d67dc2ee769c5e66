"""p2p/signing.py against py-libp2p 0.8.1's own construction and check of pubsub signatures:
the same signed bytes for any message, the same signatures, the same verdicts."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from libp2p.crypto import ed25519, secp256k1
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX, signature_validator

from tenzro_training.p2p.signing import compute_signed_bytes, compute_signing_digest, sign_message, signature_verifies

SECP = secp256k1.create_new_key_pair(bytes(range(1, 33)))
ED = ed25519.create_new_key_pair(bytes(range(32)))
KEYS = {"secp256k1": SECP, "ed25519": ED}


def reference_signed_bytes(msg: rpc_pb2.Message) -> bytes:
    """What py-libp2p signs and verifies (Pubsub.publish, validators.signature_validator)."""
    plain = rpc_pb2.Message(data=msg.data, topicIDs=msg.topicIDs, from_id=msg.from_id, seqno=msg.seqno)
    return PUBSUB_SIGNING_PREFIX.encode() + plain.SerializeToString()


def signed(pair: Any, data: bytes = b"payload", topics: tuple[str, ...] = ("tenzro/training/1.0.0",),
           seqno: bytes = (7).to_bytes(8, "big")) -> rpc_pb2.Message:
    from_id = ID.from_pubkey(pair.public_key).to_bytes()
    signature = sign_message(pair.private_key, from_id, data, seqno, topics)
    return rpc_pb2.Message(from_id=from_id, data=data, seqno=seqno, topicIDs=list(topics),
                           key=pair.public_key.serialize(), signature=signature)


@settings(max_examples=300, deadline=None)
@given(
    from_id=st.binary(max_size=80),
    data=st.one_of(st.binary(max_size=300), st.integers(0, 70_000).map(lambda n: b"\xab" * n)),
    seqno=st.binary(max_size=20),
    topics=st.lists(st.text(max_size=200), max_size=4),
)
def test_the_signed_bytes_are_py_libp2ps_for_any_message(from_id: bytes, data: bytes, seqno: bytes, topics: list[str]) -> None:
    """Lengths past one varint byte (128, 16384) included, empty fields included (proto2: set
    fields are written even when empty), unknown fields and key/signature left out."""
    msg = rpc_pb2.Message(from_id=from_id, data=data, seqno=seqno, topicIDs=topics, signature=b"s", key=b"k")
    expected = reference_signed_bytes(msg)
    assert compute_signed_bytes(msg) == expected
    assert compute_signing_digest(msg) == hashlib.sha256(expected).digest()


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_signatures_are_the_ones_py_libp2p_makes_and_it_accepts_them(kind: str) -> None:
    pair = KEYS[kind]
    for data in (b"", b"x", bytes(range(256)) * 5000):
        msg = signed(pair, data)
        assert msg.signature == pair.private_key.sign(reference_signed_bytes(msg))  # deterministic schemes
        assert signature_validator(msg) and signature_verifies(msg)


def _data(msg: rpc_pb2.Message) -> None:
    msg.data = msg.data + b"!"


def _topic(msg: rpc_pb2.Message) -> None:
    msg.topicIDs[0] = "other"


def _seqno(msg: rpc_pb2.Message) -> None:
    msg.seqno = (8).to_bytes(8, "big")


def _from(msg: rpc_pb2.Message) -> None:
    msg.from_id = ID.from_pubkey(ED.public_key if msg.from_id != ID.from_pubkey(ED.public_key).to_bytes()
                                 else SECP.public_key).to_bytes()


def _no_signature(msg: rpc_pb2.Message) -> None:
    msg.ClearField("signature")


def _garbage_signature(msg: rpc_pb2.Message) -> None:
    msg.signature = b"\x30\x02\x01\x01"


def _hashed_id_without_key(msg: rpc_pb2.Message) -> None:
    msg.from_id = ID.from_pubkey(SECP.public_key).to_bytes()[:2] + b"\x00" * 32  # not an identity multihash
    msg.ClearField("key")


def _key_that_does_not_decode(msg: rpc_pb2.Message) -> None:
    msg.from_id = b"\x12\x20" + b"\x01" * 32  # a sha256 multihash: the key must come with the message
    msg.key = b"\x08\x02\x12\x03abc"


@pytest.mark.parametrize("kind", sorted(KEYS))
@pytest.mark.parametrize("spoil", [_data, _topic, _seqno, _from, _no_signature, _garbage_signature,
                                   _hashed_id_without_key, _key_that_does_not_decode])
def test_every_spoiled_message_is_refused_as_py_libp2p_refuses_it(kind: str, spoil: Callable[[rpc_pb2.Message], None]) -> None:
    msg = signed(KEYS[kind])
    spoil(msg)
    try:
        theirs = bool(signature_validator(msg))
    except Exception:  # py-libp2p raises on a key that does not decode: a refusal all the same
        theirs = False
    assert theirs is False and signature_verifies(msg) is False


@pytest.mark.parametrize("size", [127, 128, 129, 255, 256, 16_383, 16_384, 16_385])
def test_the_signed_bytes_are_py_libp2ps_at_every_varint_length_boundary(size: int) -> None:
    """A field length of 128 takes two varint bytes and 16,384 three: one byte off there and
    no signature this host makes or checks agrees with py-libp2p's."""
    msg = rpc_pb2.Message(from_id=b"\x01" * size, data=b"\xab" * size, seqno=b"\x02" * size,
                          topicIDs=["t" * size], signature=b"s", key=b"k")
    assert compute_signed_bytes(msg) == reference_signed_bytes(msg)


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_a_key_the_peer_id_embeds_is_used_whatever_key_the_message_carries(kind: str) -> None:
    """secp256k1 and ed25519 peer ids embed their key: a message without the key field, or
    with another peer's key in it, is checked against the embedded key, as py-libp2p checks it."""
    for other_key in (None, KEYS["ed25519" if kind == "secp256k1" else "secp256k1"].public_key.serialize()):
        msg = signed(KEYS[kind])
        if other_key is None:
            msg.ClearField("key")
        else:
            msg.key = other_key
        assert signature_validator(msg) and signature_verifies(msg)


def test_a_key_too_large_for_the_peer_id_is_taken_from_the_message() -> None:
    """An RSA peer id is a hash of the key: the message carries the key, which must hash to the
    id; without it, or with a key of another id, it is refused, as py-libp2p refuses it."""
    from libp2p.crypto import rsa

    pair = rsa.create_new_key_pair(bits=1024)
    msg = signed(pair)
    assert ID(msg.from_id).extract_public_key() is None  # (a hashed id, not an embedded key)
    assert signature_validator(msg) and signature_verifies(msg)
    msg.key = SECP.public_key.serialize()
    assert not signature_validator(msg) and signature_verifies(msg) is False
    msg.ClearField("key")
    assert not signature_validator(msg) and signature_verifies(msg) is False
