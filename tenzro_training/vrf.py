"""ECVRF-EDWARDS25519-SHA512-TAI, the verifiable random function of RFC 9381 (suite 0x03).

What this module is: the VRF that syncer-election tickets are made of. A candidate holding a
32-byte Ed25519 secret proves ``pi = prove(secret, seed)`` (80 bytes: Gamma || c || s); anyone
holding its public key checks ``beta = verify(public, seed, pi)`` (64 bytes) and gets the same
pseudorandom output the prover got. It follows RFC 9381 sections 5.1-5.5 step by step:
key derivation per RFC 8032 section 5.1.5, encode_to_curve by try-and-increment (5.4.1.1),
nonce generation per RFC 8032 (5.4.2.2), challenge generation (5.4.3), proof decoding
(5.4.4), public-key validation (5.4.5, validate_key = TRUE), cofactor 8. It reproduces the
RFC's appendix B.3 vectors byte for byte.

What it is NOT: it holds no keys, keeps no state, does no I/O, and knows nothing about stakes,
seeds or ranking (that is ``election.py``). It implements no other ECVRF suite.

Curve arithmetic is libsodium's (through PyNaCl): point addition, subtraction and scalar
multiplication, and the mod-L scalar operations the prover applies to its secret. No field
arithmetic is written here. Python does only what libsodium does not do the RFC's way:
- RFC 8032 point decoding rejects a y >= p and an x = 0 with the sign bit set; libsodium's
  point decoding silently accepts both, so ``_decode_point`` checks them first (integer
  comparisons on the encoding, no field arithmetic).
- libsodium's scalar multiplication refuses any point outside the prime-order subgroup, but
  RFC 9381 verification multiplies points that may lie outside it: a public key with a torsion
  component (only small-order keys are invalid) and a Gamma with one (any decodable point is
  accepted). ``_mul_any`` splits such a point into its prime-order part (via 8^-1 mod L) and
  its torsion part (a few additions), so this module accepts exactly the proofs RFC 9381
  accepts: a Rust, Solidity or C verifier that follows the RFC ranks the same tickets.
  Such a Gamma does not change beta, which hashes 8 * Gamma.
"""

from __future__ import annotations

import hashlib
import hmac

from nacl import bindings as _sodium
from nacl.exceptions import CryptoError as _CryptoError

from tenzro_training.errors import VRFError

__all__ = [
    "OUTPUT_LEN",
    "PROOF_LEN",
    "PUBLIC_KEY_LEN",
    "SECRET_KEY_LEN",
    "SUITE_STRING",
    "is_valid_proof",
    "proof_to_hash",
    "prove",
    "public_key",
    "validate_public_key",
    "verify",
]

# --- suite parameters (RFC 9381 section 5.5, ECVRF-EDWARDS25519-SHA512-TAI) ----------------

SUITE_STRING = b"\x03"
SECRET_KEY_LEN = 32
PUBLIC_KEY_LEN = 32
_PT_LEN = 32  # ptLen: an encoded point
_C_LEN = 16  # cLen: the challenge
_Q_LEN = 32  # qLen: an encoded scalar
PROOF_LEN = _PT_LEN + _C_LEN + _Q_LEN  # 80
OUTPUT_LEN = 64  # SHA-512

_P = 2**255 - 19  # field prime (RFC 8032 section 5.1)
_L = 2**252 + 27742317777372353535851937790883648493  # prime order q of the base point
_COFACTOR = 8
_INV_COFACTOR = pow(_COFACTOR, -1, _L)
_IDENTITY = (1).to_bytes(_PT_LEN, "little")  # the neutral element (0, 1)
_Y_MASK = (1 << 255) - 1

# Domain separators (RFC 9381 sections 5.2, 5.4.1.1, 5.4.3).
_ENCODE_TO_CURVE_FRONT = b"\x01"
_ENCODE_TO_CURVE_BACK = b"\x00"
_CHALLENGE_FRONT = b"\x02"
_CHALLENGE_BACK = b"\x00"
_PROOF_TO_HASH_FRONT = b"\x03"
_PROOF_TO_HASH_BACK = b"\x00"
_TAI_MAX_TRIES = 256  # ctr is one octet (int_to_string(ctr, 1))


# --- byte and hash helpers ---------------------------------------------------------------


def _require_bytes(value: object, name: str, length: int | None = None) -> bytes:
    """``value`` as bytes; VRFError if it is not bytes-like or has the wrong length."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise VRFError(f"{name} must be bytes, not {type(value).__name__}")
    data = bytes(value)
    if length is not None and len(data) != length:
        raise VRFError(f"{name} must be {length} bytes, got {len(data)}")
    return data


def _sha512(*parts: bytes) -> bytes:
    return hashlib.sha512(b"".join(parts)).digest()


def _scalar_bytes(n: int) -> bytes:
    """int_to_string(n, qLen) for 0 <= n < L: 32 bytes, little-endian (RFC 8032 section 5.1.2)."""
    return n.to_bytes(_Q_LEN, "little")


def _is_zero(data: bytes) -> bool:
    return not any(data)


# --- points (libsodium does the arithmetic) ----------------------------------------------


def _is_canonical_encoding(data: bytes) -> bool:
    """RFC 8032 section 5.1.3's canonicity rules: y < p, and no sign bit set when x = 0.

    x = 0 exactly when y = 1 or y = p - 1 (from x^2 = (y^2 - 1) / (d y^2 + 1)), so both rules are
    integer comparisons on the encoding.
    """
    y = int.from_bytes(data, "little") & _Y_MASK
    if y >= _P:
        return False
    return not (data[31] >> 7 and y in (1, _P - 1))


def _decode_point(data: bytes) -> bytes | None:
    """RFC 8032 section 5.1.3 decoding (RFC 9381 string_to_point): the canonical encoding, or None.

    libsodium reduces a y >= p modulo p and ignores the sign bit when x = 0; RFC 8032 rejects
    both, and so must we, or encode_to_curve and proof decoding would differ from the RFC on
    those inputs. Whether x^2 has a square root is left to libsodium: adding the identity
    decodes the point and checks it is on the curve, without the prime-order subgroup check.
    """
    if len(data) != _PT_LEN or not _is_canonical_encoding(data):
        return None
    try:
        reencoded = _sodium.crypto_core_ed25519_add(data, _IDENTITY)
    except _CryptoError:
        return None  # x^2 = u/v has no square root: not a curve point
    # libsodium always encodes canonically, so a canonical input comes back unchanged; this is a
    # second, independent guard behind _is_canonical_encoding.
    if reencoded != data:
        return None
    return data


def _add(p: bytes, q: bytes) -> bytes:
    # crypto_core_ed25519_add only requires on-curve inputs (any subgroup, identity included).
    return _sodium.crypto_core_ed25519_add(p, q)


def _sub(p: bytes, q: bytes) -> bytes:
    return _sodium.crypto_core_ed25519_sub(p, q)


def _times_cofactor(point: bytes) -> bytes:
    """8 * point by three doublings; works for any curve point, unlike libsodium's scalarmult."""
    for _ in range(3):
        point = _add(point, point)
    return point


def _mul_base(scalar: bytes) -> bytes:
    """scalar * B for a 32-byte scalar < L (libsodium refuses 0; its product is the identity)."""
    if _is_zero(scalar):
        return _IDENTITY
    return _sodium.crypto_scalarmult_ed25519_base_noclamp(scalar)


def _mul_subgroup(scalar: bytes, point: bytes) -> bytes:
    """scalar * point for a 32-byte scalar < L and a point in the prime-order subgroup."""
    if _is_zero(scalar) or point == _IDENTITY:
        return _IDENTITY
    return _sodium.crypto_scalarmult_ed25519_noclamp(scalar, point)


def _mul_any(n: int, point: bytes) -> bytes:
    """n * point for any decoded curve point, including points with a torsion component.

    point = A + T with A in the order-L subgroup and 8 * T = identity. A = 8^-1 * (8 * point)
    (mod L), T = point - A, and n * point = (n mod L) * A + (n mod 8) * T. Only public values
    (c, s, a public key, Gamma) ever come through here, so its variable time is harmless.
    """
    prime_part = _mul_subgroup(_scalar_bytes(_INV_COFACTOR), _times_cofactor(point))
    torsion_part = _sub(point, prime_part)
    result = _mul_subgroup(_scalar_bytes(n % _L), prime_part)
    for _ in range(n % _COFACTOR):
        result = _add(result, torsion_part)
    return result


# --- RFC 9381 building blocks ------------------------------------------------------------


def _expand_secret(secret: bytes) -> tuple[bytes, bytes]:
    """RFC 8032 section 5.1.5: (x mod L as 32 bytes, the second half of SHA-512(secret)).

    The clamped scalar and its reduction mod L give the same multiples of B and of H (both
    have order L), so the reduced form is what libsodium's mod-L operations take.
    """
    digest = _sha512(secret)
    clamped = bytearray(digest[:32])
    clamped[0] &= 248
    clamped[31] &= 127
    clamped[31] |= 64
    x = _sodium.crypto_core_ed25519_scalar_reduce(bytes(clamped) + bytes(32))
    return x, digest[32:]


def _encode_to_curve_tai(salt: bytes, alpha: bytes) -> bytes:
    """ECVRF_encode_to_curve_try_and_increment (RFC 9381 section 5.4.1.1); salt = PK_string.

    Candidates are the first 32 bytes of each hash, decoded strictly; most lie outside the
    prime-order subgroup, so the cofactor is cleared with additions, not libsodium's scalarmult.
    """
    for ctr in range(_TAI_MAX_TRIES):
        hash_string = _sha512(
            SUITE_STRING, _ENCODE_TO_CURVE_FRONT, salt, alpha, bytes([ctr]), _ENCODE_TO_CURVE_BACK
        )
        candidate = _decode_point(hash_string[:_PT_LEN])
        if candidate is None:
            continue
        h = _times_cofactor(candidate)
        if h != _IDENTITY:
            return h
    # Each try fails with probability about 9/16: reaching this is a 2^-200 event, and the RFC
    # defines no output for it (int_to_string(256, 1) does not exist).
    raise VRFError("encode_to_curve found no point within 256 tries")


def _challenge(*points: bytes) -> bytes:
    """ECVRF_challenge_generation (RFC 9381 section 5.4.3) over (Y, H, Gamma, U, V): c_string."""
    digest = _sha512(SUITE_STRING, _CHALLENGE_FRONT, *points, _CHALLENGE_BACK)
    return digest[:_C_LEN]


def _decode_proof(proof: bytes) -> tuple[bytes, bytes, bytes]:
    """ECVRF_decode_proof (RFC 9381 section 5.4.4): (Gamma, c_string, s_string), or VRFError."""
    if len(proof) != PROOF_LEN:
        raise VRFError(f"proof must be {PROOF_LEN} bytes, got {len(proof)}")
    gamma = _decode_point(proof[:_PT_LEN])
    if gamma is None:
        raise VRFError("proof Gamma is not a valid point encoding")
    c_string = proof[_PT_LEN : _PT_LEN + _C_LEN]
    s_string = proof[_PT_LEN + _C_LEN :]
    if int.from_bytes(s_string, "little") >= _L:
        raise VRFError("proof scalar s is not canonical (s >= L)")
    return gamma, c_string, s_string


def _decode_public_key(public: bytes) -> bytes:
    """string_to_point plus ECVRF_validate_key (RFC 9381 section 5.4.5): Y, or VRFError."""
    point = _decode_point(public)
    if point is None:
        raise VRFError("public key is not a valid point encoding")
    if _times_cofactor(point) == _IDENTITY:
        raise VRFError("public key is a point of small order")
    return point


def _beta(gamma: bytes) -> bytes:
    """The hash step of ECVRF_proof_to_hash (RFC 9381 section 5.2)."""
    return _sha512(SUITE_STRING, _PROOF_TO_HASH_FRONT, _times_cofactor(gamma), _PROOF_TO_HASH_BACK)


# --- public API --------------------------------------------------------------------------


def public_key(secret: bytes) -> bytes:
    """The 32-byte public key Y = x * B of a 32-byte secret (RFC 8032 key derivation).

    It is the same key Ed25519 derives from that secret (seed).
    """
    secret = _require_bytes(secret, "secret", SECRET_KEY_LEN)
    x, _ = _expand_secret(secret)
    return _mul_base(x)


def validate_public_key(public: bytes) -> None:
    """Raise VRFError unless ``public`` is a 32-byte key RFC 9381 verification accepts.

    That is: a canonical RFC 8032 point encoding whose point is not of small order. Keys with a
    torsion component (not in the prime-order subgroup, not small order) pass, as in the RFC.
    """
    _decode_public_key(_require_bytes(public, "public key", PUBLIC_KEY_LEN))


def prove(secret: bytes, alpha: bytes) -> bytes:
    """ECVRF_prove (RFC 9381 section 5.1): the 80-byte proof Gamma || c || s of ``alpha``.

    Deterministic: the nonce is derived from the secret and H. Operations on the secret scalar
    and the nonce are libsodium's (constant-time); only hashing and slicing happen in Python.
    """
    secret = _require_bytes(secret, "secret", SECRET_KEY_LEN)
    alpha = _require_bytes(alpha, "alpha")
    x, nonce_prefix = _expand_secret(secret)
    y = _mul_base(x)
    h = _encode_to_curve_tai(y, alpha)
    gamma = _mul_subgroup(x, h)
    # ECVRF_nonce_generation_RFC8032 (section 5.4.2.2):
    # k = SHA-512(SHA-512(SK)[32:64] || h_string) mod L
    k = _sodium.crypto_core_ed25519_scalar_reduce(_sha512(nonce_prefix, h))
    c_string = _challenge(y, h, gamma, _mul_base(k), _mul_subgroup(k, h))
    c_scalar = c_string + bytes(_Q_LEN - _C_LEN)  # string_to_int(c) as a 32-byte scalar
    s_string = _sodium.crypto_core_ed25519_scalar_add(
        k, _sodium.crypto_core_ed25519_scalar_mul(c_scalar, x)
    )
    return gamma + c_string + s_string


def proof_to_hash(proof: bytes) -> bytes:
    """ECVRF_proof_to_hash (RFC 9381 section 5.2): the 64-byte output beta of ``proof``.

    It checks only the proof's encoding (length, Gamma decodes, s < L), NOT that the proof is
    valid for any key or input: use ``verify`` on anything received from someone else.
    """
    gamma, _, _ = _decode_proof(_require_bytes(proof, "proof"))
    return _beta(gamma)


def verify(public: bytes, alpha: bytes, proof: bytes) -> bytes:
    """ECVRF_verify (RFC 9381 section 5.3, validate_key = TRUE): beta, or VRFError.

    Raises VRFError for any wrong type or length, a public key that does not decode or has
    small order, a proof that does not decode (Gamma, s >= L), and a proof that fails the check.
    """
    public = _require_bytes(public, "public key", PUBLIC_KEY_LEN)
    alpha = _require_bytes(alpha, "alpha")
    proof = _require_bytes(proof, "proof")
    y = _decode_public_key(public)
    gamma, c_string, s_string = _decode_proof(proof)
    h = _encode_to_curve_tai(public, alpha)
    c = int.from_bytes(c_string, "little")
    u = _sub(_mul_base(s_string), _mul_any(c, y))  # U = s*B - c*Y
    v = _sub(_mul_subgroup(s_string, h), _mul_any(c, gamma))  # V = s*H - c*Gamma
    if not hmac.compare_digest(_challenge(y, h, gamma, u, v), c_string):
        raise VRFError("proof does not verify for this public key and input")
    return _beta(gamma)


def is_valid_proof(public: object, alpha: object, proof: object) -> bool:
    """True if ``verify(public, alpha, proof)`` succeeds; never raises."""
    try:
        verify(public, alpha, proof)  # type: ignore[arg-type]
    except VRFError:
        return False
    return True
