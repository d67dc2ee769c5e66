"""RFC 6962 Merkle tree hashing (SHA-256) and the run root that commits a training run.

What this module is: the Merkle Tree Hash (MTH) of RFC 6962 section 2.1, its audit paths
(inclusion proofs) and their verification, and the domain-separated ``run_root`` of SPEC.md
"Merkle commitments". Leaves are opaque byte strings; which bytes a run commits (the spec's
canonical JSON, ABI-encoded round records, the final record) is decided in ``records.py``.

What it is NOT: a persistent or incremental log (no consistency proofs, no storage), and it does
not decide what goes into a run. It does no I/O.

Tree shape (RFC 6962 section 2.1): for n > 1 leaves the tree splits at k, the largest power of two
strictly smaller than n: MTH(D[n]) = SHA-256(0x01 || MTH(D[0:k]) || MTH(D[k:n])); a single leaf
hashes to SHA-256(0x00 || leaf); the empty tree hashes to SHA-256(b""). This module computes the
same tree bottom-up: pair adjacent nodes left to right on each level and carry an unpaired last
node up unchanged. Both descriptions give the same tree because RFC 6962 trees are left-complete
(every left subtree is a perfect power-of-two tree), so the work is exactly n leaf hashes plus
n - 1 interior hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from tenzro_training.errors import MerkleError

__all__ = [
    "HASH_SIZE",
    "RUN_ROOT_DOMAIN",
    "EMPTY_ROOT",
    "leaf_hash",
    "node_hash",
    "merkle_root",
    "inclusion_proof",
    "inclusion_proofs",
    "verify_inclusion",
    "run_root",
]

HASH_SIZE = 32
"""Bytes in every tree hash (SHA-256)."""

RUN_ROOT_DOMAIN = b"tenzro/train/run-root/v1"
"""Prefix hashed in front of MTH(leaves) so a run root can never be mistaken for a bare tree hash."""

EMPTY_ROOT = hashlib.sha256(b"").digest()
"""MTH of the empty tree: SHA-256 of the empty string (RFC 6962 section 2.1)."""

_LEAF_PREFIX = b"\x00"
_NODE_PREFIX = b"\x01"


def _require_bytes(value: object, what: str) -> bytes:
    # bytearray/memoryview are accepted and copied: a caller mutating its buffer later must not
    # change a hash we already computed from it.
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise MerkleError(f"{what} must be bytes, got {type(value).__name__}")


def _require_hash(value: object, what: str) -> bytes:
    b = _require_bytes(value, what)
    if len(b) != HASH_SIZE:
        raise MerkleError(f"{what} must be {HASH_SIZE} bytes, got {len(b)}")
    return b


def _require_index(value: object, what: str) -> int:
    # bool is an int subclass; True as an index is a bug at the call site, not a leaf position.
    if not isinstance(value, int) or isinstance(value, bool):
        raise MerkleError(f"{what} must be an int, got {type(value).__name__}")
    return value


def leaf_hash(leaf: bytes) -> bytes:
    """SHA-256(0x00 || leaf): the hash of one leaf (RFC 6962 section 2.1)."""
    return hashlib.sha256(_LEAF_PREFIX + _require_bytes(leaf, "leaf")).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right): the hash of an interior node over two 32-byte child hashes."""
    return hashlib.sha256(
        _NODE_PREFIX + _require_hash(left, "left") + _require_hash(right, "right")
    ).digest()


def _next_level(level: list[bytes]) -> list[bytes]:
    """Hash adjacent pairs; an unpaired last node moves up unchanged (left-complete tree)."""
    sha256 = hashlib.sha256
    up = [sha256(_NODE_PREFIX + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
    if len(level) % 2:
        up.append(level[-1])
    return up


def _leaf_level(leaves: Sequence[bytes]) -> list[bytes]:
    if isinstance(leaves, (bytes, bytearray, memoryview, str)):
        # A bare bytes object is a Sequence of ints: refuse it rather than hash each byte.
        raise MerkleError("leaves must be a sequence of byte strings, not a single byte string")
    return [leaf_hash(leaf) for leaf in leaves]


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """MTH(leaves): the RFC 6962 Merkle Tree Hash of ``leaves`` in order (O(n) hashing)."""
    level = _leaf_level(leaves)
    if not level:
        return EMPTY_ROOT
    while len(level) > 1:
        level = _next_level(level)
    return level[0]


def _tree_levels(leaves: Sequence[bytes]) -> list[list[bytes]]:
    """Every level of the tree, leaf hashes first, root last (one list per level)."""
    levels = [_leaf_level(leaves)]
    while len(levels[-1]) > 1:
        levels.append(_next_level(levels[-1]))
    return levels


def _path_from_levels(levels: list[list[bytes]], index: int) -> list[bytes]:
    path: list[bytes] = []
    for level in levels[:-1]:
        sibling = index ^ 1
        # A node with no sibling on this level is the unpaired last node: it moves up unchanged
        # and contributes nothing to the path (RFC 6962's recursion skips it the same way).
        if sibling < len(level):
            path.append(level[sibling])
        index >>= 1
    return path


def inclusion_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """The RFC 6962 audit path PATH(index, D[n]) for leaf ``index``: sibling hashes, leaf upwards.

    Raises MerkleError when ``index`` is not in ``range(len(leaves))``.
    """
    index = _require_index(index, "index")
    levels = _tree_levels(leaves)
    if not 0 <= index < len(levels[0]):
        raise MerkleError(f"index {index} out of range for a tree of {len(levels[0])} leaves")
    return _path_from_levels(levels, index)


def inclusion_proofs(leaves: Sequence[bytes]) -> list[list[bytes]]:
    """The audit path of every leaf, in leaf order, hashing the tree once (O(n log n) output)."""
    levels = _tree_levels(leaves)
    return [_path_from_levels(levels, i) for i in range(len(levels[0]))]


def _root_from_path(leaf_digest: bytes, index: int, size: int, proof: Sequence[bytes]) -> bytes | None:
    """Fold an audit path into the root it implies, or None if the path has the wrong shape.

    This is RFC 9162 section 2.1.3.2 (the verification algorithm for RFC 6962 audit paths):
    ``fn`` walks the leaf's position up the tree and ``sn`` the last position on each level.
    When ``fn`` is a right child, or is the last node of its level (so its subtree is the right
    part of a split), the sibling is on the left; the inner loop then climbs past the levels where
    the node was carried up unpaired. The path is well formed only if it ends exactly at the root
    (``sn == 0``) with no hashes left over.
    """
    fn, sn = index, size - 1
    r = leaf_digest
    for p in proof:
        if sn == 0:
            return None  # more hashes than levels
        if fn & 1 or fn == sn:
            r = hashlib.sha256(_NODE_PREFIX + p + r).digest()
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = hashlib.sha256(_NODE_PREFIX + r + p).digest()
        fn >>= 1
        sn >>= 1
    if sn != 0:
        return None  # fewer hashes than levels
    return r


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """True iff ``proof`` shows that ``leaf`` is leaf number ``index`` of a ``size``-leaf tree with ``root``.

    ``leaf`` is the raw leaf (it is hashed here). Never raises: any malformed argument (wrong
    types, hashes that are not 32 bytes, index not below size) is simply not a valid proof.
    """
    try:
        leaf_digest = leaf_hash(leaf)
        index = _require_index(index, "index")
        size = _require_index(size, "size")
        root = _require_hash(root, "root")
        if isinstance(proof, (bytes, bytearray, memoryview, str)):
            return False
        path = [_require_hash(p, "proof element") for p in proof]
    except (MerkleError, TypeError):
        return False
    if not 0 <= index < size:
        return False
    implied = _root_from_path(leaf_digest, index, size, path)
    return implied is not None and implied == root


def run_root(leaves: Sequence[bytes]) -> bytes:
    """SHA-256(b"tenzro/train/run-root/v1" || MTH(leaves)): the on-chain commitment to a run."""
    return hashlib.sha256(RUN_ROOT_DOMAIN + merkle_root(leaves)).digest()
