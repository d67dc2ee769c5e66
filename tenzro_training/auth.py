"""EIP-712 authentication of state-changing JSON-RPC calls.

Every state-changing call names the party it acts for and carries that party's secp256k1
signature over an EIP-712 typed-data message (SPEC.md "Authentication"):

============================ ============================================= =========================
message                      fields                                        who must sign
============================ ============================================= =========================
PostTask                     taskId string, specHash bytes32               spec.sponsor_address
EnrollTrainer                taskId string, did string, trainer address,   ``trainer``
                             stake uint256
SubmitOuterGradient          taskId string, round uint64, fragment uint32, an enrolled trainer
                             payloadHash bytes32
FinalizeRound                taskId string, round uint64                   the run's current syncer
CancelTask                   taskId string                                 the sponsor
============================ ============================================= =========================

The domain is ``{name: "Tenzro Train", version: "1", chainId}`` with no ``verifyingContract``:
these are node-level messages, not calls into a contract. ``chainId`` is the node's configured
chain id (default :data:`DEFAULT_CHAIN_ID`), so a signature made for one network does not
authenticate on another.

Signatures are 65 bytes ``r || s || v`` and are checked strictly, the way OpenZeppelin's ECDSA
library and the ``ecrecover`` precompile check them, so that one signed message has exactly one
valid byte string (stored evidence can then be compared by bytes):

- ``v`` must be 27 or 28. Signers that produce 0/1 (some hardware wallets) or a high ``s`` can be
  brought into this form with :func:`compute_canonical_signature` before sending;
- ``1 <= r < n`` and ``1 <= s <= n/2`` (EIP-2 low-s rule) where ``n`` is the secp256k1 order.

This module is NOT the policy: which address must have signed which call (the sponsor, an
enrolled trainer, the current syncer) is decided by the caller, which passes the expected address
to :func:`validate_signer`. Pure core: no I/O.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Union

from eth_account import Account
from eth_account.messages import SignableMessage, encode_typed_data
from eth_hash.auto import keccak
from eth_keys import keys as eth_keys
from eth_keys.exceptions import BadSignature, ValidationError

from tenzro_training.addresses import (
    Address,
    AddressError,
    format_address,
    parse_address,
    validate_address_bytes,
)
from tenzro_training.errors import TenzroError

__all__ = [
    "AuthError",
    "CancelTask",
    "DEFAULT_CHAIN_ID",
    "DOMAIN_NAME",
    "DOMAIN_VERSION",
    "EnrollTrainer",
    "FinalizeRound",
    "MalformedMessage",
    "PostTask",
    "RequestModel",
    "SECP256K1_N",
    "SIGNATURE_LENGTH",
    "SignatureInvalid",
    "SignedMessageType",
    "SubmitOuterGradient",
    "WrongSigner",
    "compute_canonical_signature",
    "compute_digest",
    "compute_signable",
    "recover_signer",
    "recover_signer_address",
    "sign_message",
    "validate_signer",
]

DOMAIN_NAME = "Tenzro Train"
DOMAIN_VERSION = "1"
DEFAULT_CHAIN_ID = 1337
"""The chain id a node uses unless configured otherwise (the usual local development id)."""

SIGNATURE_LENGTH = 65
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
"""Order of the secp256k1 group; a valid ``s`` is at most ``SECP256K1_N // 2``."""

_UINT_BITS = {"uint32": 32, "uint64": 64, "uint256": 256}

_DOMAIN_TYPE = (
    {"name": "name", "type": "string"},
    {"name": "version", "type": "string"},
    {"name": "chainId", "type": "uint256"},
)


# --- errors ---------------------------------------------------------------------------------


class AuthError(TenzroError, ValueError):
    """A signed call cannot be authenticated."""


class MalformedMessage(AuthError):
    """A message field has the wrong type or is out of its EIP-712 type's range.

    ``field`` names the offending field (the Python attribute), ``reason`` says what is wrong.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class SignatureInvalid(AuthError):
    """A signature is malformed or does not recover to any key; ``reason`` says which check failed."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"invalid signature: {reason}")


class WrongSigner(AuthError):
    """A well-formed signature recovers to someone other than the party the call acts for.

    ``expected`` and ``actual`` are EIP-55 address strings.
    """

    def __init__(self, expected: str, actual: str) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(f"signed by {actual}, expected {expected}")


# --- field checks ---------------------------------------------------------------------------


def _check_str(field: str, value: object) -> None:
    if type(value) is not str:
        raise MalformedMessage(field, f"expected str, got {type(value).__name__}")


def _check_bytes32(field: str, value: object) -> None:
    # eth-account silently right-pads a short bytes32 value, so the length is checked here:
    # otherwise two different inputs would sign the same digest.
    if type(value) is not bytes or len(value) != 32:
        raise MalformedMessage(field, "expected 32 bytes")


def _check_uint(field: str, value: object, bits: int) -> None:
    if type(value) is not int:  # bool is an int subclass and is rejected here on purpose
        raise MalformedMessage(field, f"expected int, got {type(value).__name__}")
    if not 0 <= value < (1 << bits):
        raise MalformedMessage(field, f"{value} is outside uint{bits}")


def _check_address(field: str, value: object) -> None:
    try:
        validate_address_bytes(value)
    except AddressError as exc:
        raise MalformedMessage(field, exc.reason) from None


def _validate_chain_id(chain_id: object) -> int:
    if type(chain_id) is not int or not 0 < chain_id < (1 << 256):
        raise MalformedMessage("chain_id", f"expected a positive uint256, got {chain_id!r}")
    return chain_id


# --- messages -------------------------------------------------------------------------------


class _TypedMessage:
    """Shared EIP-712 plumbing. Subclasses list their fields once, in ``_FIELDS``.

    ``_FIELDS`` is ``(eip712_name, eip712_type, attribute)`` in the order the EIP-712 type string
    lists them; that order is part of the type hash, so it must never change within version "1".
    """

    __slots__ = ()

    PRIMARY_TYPE: ClassVar[str]
    _FIELDS: ClassVar[tuple[tuple[str, str, str], ...]]

    def __post_init__(self) -> None:
        for _, kind, attr in self._FIELDS:
            value = getattr(self, attr)
            if kind == "string":
                _check_str(attr, value)
            elif kind == "bytes32":
                _check_bytes32(attr, value)
            elif kind == "address":
                _check_address(attr, value)
            else:
                _check_uint(attr, value, _UINT_BITS[kind])

    @classmethod
    def eip712_type(cls) -> str:
        """The EIP-712 ``encodeType`` string, e.g. ``FinalizeRound(string taskId,uint64 round)``."""
        return f"{cls.PRIMARY_TYPE}({','.join(f'{kind} {name}' for name, kind, _ in cls._FIELDS)})"

    def _message_values(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, kind, attr in self._FIELDS:
            value = getattr(self, attr)
            if kind == "bytes32":
                value = "0x" + value.hex()
            elif kind == "address":
                value = format_address(value)
            values[name] = value
        return values

    def typed_data(self, chain_id: int = DEFAULT_CHAIN_ID) -> dict[str, Any]:
        """The full EIP-712 typed-data dict (``eth_signTypedData_v4`` shape, JSON-serializable).

        bytes32 values are ``0x`` hex strings and addresses EIP-55 strings, as wallets expect.
        """
        return {
            "types": {
                "EIP712Domain": [dict(entry) for entry in _DOMAIN_TYPE],
                self.PRIMARY_TYPE: [{"name": name, "type": kind} for name, kind, _ in self._FIELDS],
            },
            "primaryType": self.PRIMARY_TYPE,
            "domain": {
                "name": DOMAIN_NAME,
                "version": DOMAIN_VERSION,
                "chainId": _validate_chain_id(chain_id),
            },
            "message": self._message_values(),
        }


@dataclass(frozen=True, slots=True)
class PostTask(_TypedMessage):
    """A sponsor posts a task. Must be signed by the spec's ``sponsor_address``."""

    PRIMARY_TYPE: ClassVar[str] = "PostTask"
    _FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("taskId", "string", "task_id"),
        ("specHash", "bytes32", "spec_hash"),
    )

    task_id: str
    """The spec's task_id."""
    spec_hash: bytes
    """SHA-256 of the spec's RFC 8785 canonical bytes (32 bytes): binds every spec field."""


@dataclass(frozen=True, slots=True)
class EnrollTrainer(_TypedMessage):
    """A trainer enrolls into a run. Must be signed by ``trainer`` itself."""

    PRIMARY_TYPE: ClassVar[str] = "EnrollTrainer"
    _FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("taskId", "string", "task_id"),
        ("did", "string", "did"),
        ("trainer", "address", "trainer"),
        ("stake", "uint256", "stake"),
    )

    task_id: str
    """The run being joined."""
    did: str
    """The trainer's DID (``did:tenzro:<kind>:<id>``); its syntax is checked by the caller."""
    trainer: bytes
    """The trainer's 20-byte address: the account whose stake is bonded and who is paid."""
    stake: int
    """Stake to bond, in attoTNZO (uint256)."""


@dataclass(frozen=True, slots=True)
class SubmitOuterGradient(_TypedMessage):
    """A trainer submits one fragment's outer gradient. Must be signed by an enrolled trainer.

    Two different ``payload_hash`` values signed by one trainer for the same (task, round,
    fragment) are equivocation evidence: both messages and signatures are what gets stored.
    """

    PRIMARY_TYPE: ClassVar[str] = "SubmitOuterGradient"
    _FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("taskId", "string", "task_id"),
        ("round", "uint64", "round"),
        ("fragment", "uint32", "fragment"),
        ("payloadHash", "bytes32", "payload_hash"),
    )

    task_id: str
    round: int
    """Round index (uint64)."""
    fragment: int
    """Fragment index (uint32)."""
    payload_hash: bytes
    """SHA-256 of the safetensors payload bytes (32 bytes)."""


@dataclass(frozen=True, slots=True)
class FinalizeRound(_TypedMessage):
    """The syncer finalizes a round. Must be signed by the run's current syncer."""

    PRIMARY_TYPE: ClassVar[str] = "FinalizeRound"
    _FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("taskId", "string", "task_id"),
        ("round", "uint64", "round"),
    )

    task_id: str
    round: int
    """The round being finalized (uint64); naming it makes a replay in a later round useless."""


@dataclass(frozen=True, slots=True)
class CancelTask(_TypedMessage):
    """A sponsor cancels a run before training starts. Must be signed by the sponsor."""

    PRIMARY_TYPE: ClassVar[str] = "CancelTask"
    _FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (("taskId", "string", "task_id"),)

    task_id: str


@dataclass(frozen=True, slots=True)
class RequestModel(_TypedMessage):
    """A trainer asks the node (over gossip, ``ModelRequest`` version 2) for the current global
    model. Signed by ``requester``, so nobody can forge a request in another trainer's name; the
    nonce makes each request distinct. A signed request is public once relayed, so a node
    answers it only during its ``round`` (gossip.validate_model_request_gossip): a replay is
    good until the round ends. Changes no state."""

    PRIMARY_TYPE: ClassVar[str] = "RequestModel"
    _FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("taskId", "string", "task_id"),
        ("requester", "address", "requester"),
        ("round", "uint64", "round"),
        ("nonce", "uint64", "nonce"),
    )

    task_id: str
    requester: bytes
    """The requesting trainer's 20-byte address (the signer)."""
    round: int
    """The round the requester believes is current (uint64)."""
    nonce: int
    """Random uint64 (uint64)."""


SignedMessageType = Union[PostTask, EnrollTrainer, SubmitOuterGradient, FinalizeRound, CancelTask, RequestModel]
"""Every message type a state-changing call or a signed gossip message is signed over."""

_MESSAGE_TYPES = (PostTask, EnrollTrainer, SubmitOuterGradient, FinalizeRound, CancelTask, RequestModel)


# --- digest, signing, recovery --------------------------------------------------------------


def compute_signable(msg: SignedMessageType, chain_id: int = DEFAULT_CHAIN_ID) -> SignableMessage:
    """The EIP-191 version-0x01 signable form (``0x1901 || domainSeparator || hashStruct``)."""
    if not isinstance(msg, _MESSAGE_TYPES):
        raise MalformedMessage("msg", f"not a signed message type: {type(msg).__name__}")
    return encode_typed_data(full_message=msg.typed_data(chain_id))


def compute_digest(msg: SignedMessageType, chain_id: int = DEFAULT_CHAIN_ID) -> bytes:
    """The 32-byte EIP-712 digest that is signed: keccak256(0x1901 || domainSeparator || hashStruct).

    Computed directly from the EIP-712 rules for our fixed, flat message types (string ->
    keccak of its UTF-8, bytes32 as is, address left-padded, uint big-endian in 32 bytes), with
    the type hashes and the domain separator cached: eth-account's general ``encode_typed_data``
    costs ~0.6 ms a call, which was a tenth of a 1 MiB submitOuterGradient. A test checks this
    against eth-account's encoder for every type (``compute_signable``). Exposed so that other
    implementations (Solidity, Rust) can be checked against it.
    """
    if not isinstance(msg, _MESSAGE_TYPES):
        raise MalformedMessage("msg", f"not a signed message type: {type(msg).__name__}")
    words = [_type_hash(type(msg))]
    for _, kind, attr in msg._FIELDS:
        value = getattr(msg, attr)
        if kind == "string":
            words.append(keccak(value.encode("utf-8")))
        elif kind == "bytes32":
            words.append(value)
        elif kind == "address":
            words.append(bytes(12) + value)
        else:
            words.append(value.to_bytes(32, "big"))
    return keccak(b"\x19\x01" + _domain_separator(_validate_chain_id(chain_id)) + keccak(b"".join(words)))


@functools.lru_cache(maxsize=None)
def _type_hash(cls: type) -> bytes:
    return keccak(cls.eip712_type().encode("ascii"))


@functools.lru_cache(maxsize=64)
def _domain_separator(chain_id: int) -> bytes:
    domain_type = "EIP712Domain(" + ",".join(f"{d['type']} {d['name']}" for d in _DOMAIN_TYPE) + ")"
    return keccak(
        keccak(domain_type.encode("ascii"))
        + keccak(DOMAIN_NAME.encode("utf-8"))
        + keccak(DOMAIN_VERSION.encode("utf-8"))
        + chain_id.to_bytes(32, "big")
    )


def _split_signature(signature: object) -> tuple[int, int, int]:
    """Parse and strictly check ``r || s || v``; return ``(v, r, s)`` with v in {27, 28}."""
    if not isinstance(signature, (bytes, bytearray)):
        raise SignatureInvalid(f"expected bytes, got {type(signature).__name__}")
    if len(signature) != SIGNATURE_LENGTH:
        raise SignatureInvalid(f"expected {SIGNATURE_LENGTH} bytes, got {len(signature)}")
    r = int.from_bytes(signature[0:32], "big")
    s = int.from_bytes(signature[32:64], "big")
    v = signature[64]
    if v not in (27, 28):
        raise SignatureInvalid(f"v must be 27 or 28, got {v}")
    if not 1 <= r < SECP256K1_N:
        raise SignatureInvalid("r out of range")
    if not 1 <= s < SECP256K1_N:
        raise SignatureInvalid("s out of range")
    if s > SECP256K1_N // 2:
        # EIP-2: (r, n - s) with the other v is a second valid signature of the same message;
        # accepting only the low half makes the signature bytes unique.
        raise SignatureInvalid("high s (malleable signature)")
    return v, r, s


def compute_canonical_signature(signature: bytes) -> bytes:
    """Bring a 65-byte signature into the only form :func:`recover_signer` accepts.

    Maps ``v`` 0/1 to 27/28 and a high ``s`` to ``n - s`` (flipping ``v``), which recovers to the
    same signer. For clients whose signer does not emit canonical signatures; the node itself
    never normalizes, it rejects.
    """
    if not isinstance(signature, (bytes, bytearray)) or len(signature) != SIGNATURE_LENGTH:
        raise SignatureInvalid(f"expected {SIGNATURE_LENGTH} bytes")
    r = int.from_bytes(signature[0:32], "big")
    s = int.from_bytes(signature[32:64], "big")
    v = signature[64]
    if v in (0, 1):
        v += 27
    if v not in (27, 28):
        raise SignatureInvalid(f"v must be 0, 1, 27 or 28, got {v}")
    if not 1 <= s < SECP256K1_N:
        raise SignatureInvalid("s out of range")
    if s > SECP256K1_N // 2:
        s = SECP256K1_N - s
        v = 55 - v  # 27 <-> 28
    return r.to_bytes(32, "big") + s.to_bytes(32, "big") + bytes([v])


def sign_message(msg: SignedMessageType, private_key: Any, chain_id: int = DEFAULT_CHAIN_ID) -> bytes:
    """Sign ``msg`` for ``chain_id``; returns the canonical 65-byte ``r || s || v`` (v in 27/28).

    ``private_key`` is anything eth-account accepts (32 bytes, 0x hex string, eth_keys key).
    For clients and tests; the node never holds users' keys.
    """
    signed = Account.sign_message(compute_signable(msg, chain_id), private_key)
    # eth-account already emits low-s (RFC 6979 via libsecp256k1 / eth_keys); normalizing anyway
    # keeps this function's output valid even if a backend ever changes.
    return compute_canonical_signature(bytes(signed.signature))


def recover_signer(msg: SignedMessageType, signature: bytes, chain_id: int = DEFAULT_CHAIN_ID) -> str:
    """The EIP-55 address whose key signed ``msg`` for ``chain_id``.

    Raises :class:`SignatureInvalid` on a malformed or non-canonical signature, or one from which
    no public key can be recovered. A well-formed signature over different data (another field
    value, another chain id) recovers to some *other* address: callers must compare with
    :func:`validate_signer`.
    """
    return format_address(recover_signer_address(msg, signature, chain_id))


def recover_signer_address(msg: SignedMessageType, signature: bytes, chain_id: int = DEFAULT_CHAIN_ID) -> Address:
    """:func:`recover_signer` as the address's 20 bytes, with the same checks and errors.

    What the node compares and stores. Why it exists: going through the EIP-55 text (eth-account's
    ``_recover_hash``, then parsing the text back) costs two more Keccak-256 and the checksum
    formatting: ~0.11 ms per recovery against ~0.05 ms for the bytes (2026-11-27, 2-core VM)."""
    v, r, s = _split_signature(signature)
    digest = compute_digest(msg, chain_id)
    try:
        public_key = eth_keys.Signature(vrs=(v - 27, r, s)).recover_public_key_from_msg_hash(digest)
    except (BadSignature, ValidationError) as exc:
        # r passed the range check but is not the x-coordinate of a curve point (or the point
        # recovers to infinity): there is no signer.
        raise SignatureInvalid(f"public key not recoverable ({type(exc).__name__})") from None
    return Address(public_key.to_canonical_address())


def _expected_address_bytes(expected_address: object) -> Address:
    if isinstance(expected_address, str):
        return parse_address(expected_address)
    return validate_address_bytes(expected_address)


def validate_signer(
    msg: SignedMessageType,
    signature: bytes,
    expected_address: Union[str, bytes],
    chain_id: int = DEFAULT_CHAIN_ID,
) -> None:
    """Raise unless ``signature`` is a canonical signature of ``msg`` by ``expected_address``.

    ``expected_address`` is 20 bytes or address text (any case; mixed case must be a valid EIP-55
    checksum). Addresses are compared as bytes, so letter case never matters.
    Raises :class:`SignatureInvalid` or :class:`WrongSigner` (carrying both addresses).
    """
    expected = _expected_address_bytes(expected_address)
    actual = recover_signer_address(msg, signature, chain_id)
    if actual != expected:
        raise WrongSigner(expected=format_address(expected), actual=format_address(actual))
