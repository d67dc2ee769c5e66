"""Tests for tenzro_training.merkle: RFC 6962 tree hashing, audit paths, run roots.

The contract is RFC 6962 section 2.1. Two independent checks pin it:
- the published certificate-transparency test tree (8 leaves "", 00, 10, 2021, 3031, 40414243,
  5051525354555657, 606162636465666768696a6b6c6d6e6f) with its roots for sizes 0..8 and audit
  paths, as used by certificate-transparency and transparency-dev/merkle (proof/verify_test.go);
- a slow recursive reference written straight from the RFC's definitions of MTH and PATH,
  compared for every tree size 0..300.
"""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenzro_training.errors import MerkleError
from tenzro_training.merkle import (
    EMPTY_ROOT,
    inclusion_proof,
    inclusion_proofs,
    leaf_hash,
    merkle_root,
    node_hash,
    run_root,
    verify_inclusion,
)

# --- RFC 6962 reference, written from the RFC text (deliberately naive) -----------------------


def ref_mth(d: list[bytes]) -> bytes:
    n = len(d)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return hashlib.sha256(b"\x00" + d[0]).digest()
    k = 1
    while k * 2 < n:
        k *= 2
    return hashlib.sha256(b"\x01" + ref_mth(d[:k]) + ref_mth(d[k:])).digest()


def ref_path(m: int, d: list[bytes]) -> list[bytes]:
    n = len(d)
    if n == 1:
        return []
    k = 1
    while k * 2 < n:
        k *= 2
    if m < k:
        return ref_path(m, d[:k]) + [ref_mth(d[k:])]
    return ref_path(m - k, d[k:]) + [ref_mth(d[:k])]


def ref_sides(m: int, n: int) -> list[str]:
    """Which side each PATH(m, D[n]) element sits on, leaf upwards: the proof's shape."""
    if n == 1:
        return []
    k = 1
    while k * 2 < n:
        k *= 2
    if m < k:
        return ref_sides(m, k) + ["right"]
    return ref_sides(m - k, n - k) + ["left"]


# --- published vectors (certificate-transparency test tree) -----------------------------------

CT_LEAVES = [
    bytes.fromhex(h)
    for h in [
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ]
]
# CT_ROOTS[n] = MTH(CT_LEAVES[:n]).
CT_ROOTS = [
    bytes.fromhex(h)
    for h in [
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    ]
]
# (index (0-based), tree size, audit path)
CT_PATHS = [
    (0, 1, []),
    (
        0,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        5,
        8,
        [
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (
        1,
        5,
        [
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
]

SOME_HASH = bytes.fromhex("abacaba000000000000000000000000000000000000000000060061e00123456")


@pytest.mark.parametrize("size", range(len(CT_ROOTS)))
def test_ct_vector_roots(size: int) -> None:
    assert merkle_root(CT_LEAVES[:size]) == CT_ROOTS[size]


@pytest.mark.parametrize(("index", "size", "path"), CT_PATHS)
def test_ct_vector_audit_paths(index: int, size: int, path: list[str]) -> None:
    expected = [bytes.fromhex(h) for h in path]
    leaves = CT_LEAVES[:size]
    assert inclusion_proof(leaves, index) == expected
    assert verify_inclusion(leaves[index], index, size, expected, CT_ROOTS[size])


def test_empty_tree_is_sha256_of_empty_string() -> None:
    assert merkle_root([]) == EMPTY_ROOT == hashlib.sha256(b"").digest()


def test_leaf_and_node_prefixes() -> None:
    assert leaf_hash(b"abc") == hashlib.sha256(b"\x00abc").digest()
    a, b = hashlib.sha256(b"a").digest(), hashlib.sha256(b"b").digest()
    assert node_hash(a, b) == hashlib.sha256(b"\x01" + a + b).digest()
    # The 0x00/0x01 prefixes make a 64-byte leaf differ from the node over its two halves.
    assert leaf_hash(a + b) != node_hash(a, b)


def test_run_root_is_domain_separated_mth() -> None:
    leaves = CT_LEAVES
    assert run_root(leaves) == hashlib.sha256(b"tenzro/train/run-root/v1" + CT_ROOTS[8]).digest()
    assert run_root(leaves) != merkle_root(leaves)
    assert run_root([]) == hashlib.sha256(b"tenzro/train/run-root/v1" + EMPTY_ROOT).digest()


def test_root_sensitive_to_order_and_content() -> None:
    leaves = [b"a", b"b", b"c"]
    assert merkle_root(leaves) != merkle_root([b"b", b"a", b"c"])
    assert merkle_root(leaves) != merkle_root([b"a", b"b", b"d"])
    assert merkle_root(leaves) != merkle_root(leaves + [b""])


# --- every size 0..300 against the reference --------------------------------------------------

MAX_SIZE = 300
POOL = [i.to_bytes(2, "big") + hashlib.sha256(i.to_bytes(4, "big")).digest()[: i % 40] for i in range(MAX_SIZE)]
REF_ROOTS = [ref_mth(POOL[:n]) for n in range(MAX_SIZE + 1)]


def test_every_size_root_matches_reference() -> None:
    for n in range(MAX_SIZE + 1):
        assert merkle_root(POOL[:n]) == REF_ROOTS[n], n


def test_every_index_of_every_size_proves_and_verifies() -> None:
    """For all n in 1..300 and every index: the path verifies and has the RFC's shape.

    The full recursive PATH reference costs O(n) hashes per proof (45,000 proofs would take
    tens of seconds), so it is compared element by element on every index of trees up to 64
    leaves and on edge and middle indices of larger ones; every other proof is checked for
    length against the reference shape and for verification against the reference root.
    ``inclusion_proofs`` (all paths at once) must agree with ``inclusion_proof`` (one path).
    """
    for n in range(1, MAX_SIZE + 1):
        leaves = POOL[:n]
        root = REF_ROOTS[n]
        proofs = inclusion_proofs(leaves)
        assert len(proofs) == n
        for i, proof in enumerate(proofs):
            if n <= 64 or i in (0, 1, n // 2, n - 2, n - 1):
                assert proof == ref_path(i, leaves), (n, i)
                assert proof == inclusion_proof(leaves, i), (n, i)
            else:
                assert len(proof) == len(ref_sides(i, n)), (n, i)
            assert verify_inclusion(leaves[i], i, n, proof, root), (n, i)
    assert inclusion_proofs([]) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=48), max_size=MAX_SIZE))
def test_property_root_matches_reference(leaves: list[bytes]) -> None:
    assert merkle_root(leaves) == ref_mth(leaves)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=1, max_value=MAX_SIZE), st.data())
def test_property_wrong_leaf_index_size_or_root_fails(n: int, data: st.DataObject) -> None:
    leaves = POOL[:n]
    root = REF_ROOTS[n]
    i = data.draw(st.integers(min_value=0, max_value=n - 1), label="index")
    proof = inclusion_proof(leaves, i)
    assert verify_inclusion(leaves[i], i, n, proof, root)

    # wrong leaf
    other = data.draw(st.binary(max_size=48).filter(lambda b: b != leaves[i]), label="leaf")
    assert not verify_inclusion(other, i, n, proof, root)
    # wrong index (any other index, including out of range)
    j = data.draw(st.integers(min_value=-2, max_value=n + 2).filter(lambda j: j != i), label="j")
    # (Within one tree the shape of a path determines the leaf position, and POOL has no
    # duplicate leaves, so every other index must fail.)
    assert not verify_inclusion(leaves[i], j, n, proof, root)
    # wrong size: RFC 6962 roots do not commit to the size, only to the tree's shape. A size
    # whose audit path for this index has the same shape folds the same hashes the same way, so
    # it verifies too; every size with a different shape must fail.
    m = data.draw(st.integers(min_value=0, max_value=2 * MAX_SIZE).filter(lambda m: m != n), label="m")
    same_shape = i < m and ref_sides(i, m) == ref_sides(i, n)
    assert verify_inclusion(leaves[i], i, m, proof, root) is same_shape
    assert not verify_inclusion(leaves[i], i, 2 * n, proof, root) or ref_sides(i, 2 * n) == ref_sides(i, n)
    if n > 1:
        assert not verify_inclusion(leaves[i], i, n // 2, proof, root) or (
            i < n // 2 and ref_sides(i, n // 2) == ref_sides(i, n)
        )
    # wrong root
    bad_root = data.draw(st.binary(min_size=32, max_size=32).filter(lambda r: r != root), label="root")
    assert not verify_inclusion(leaves[i], i, n, proof, bad_root)
    # tampered proof: flip one bit in one element, drop one, add one
    if proof:
        k = data.draw(st.integers(min_value=0, max_value=len(proof) - 1), label="k")
        bit = data.draw(st.integers(min_value=0, max_value=255), label="bit")
        flipped = bytearray(proof[k])
        flipped[bit // 8] ^= 1 << (bit % 8)
        assert not verify_inclusion(leaves[i], i, n, proof[:k] + [bytes(flipped)] + proof[k + 1 :], root)
        assert not verify_inclusion(leaves[i], i, n, proof[:-1], root)
        assert not verify_inclusion(leaves[i], i, n, proof[1:], root)
    assert not verify_inclusion(leaves[i], i, n, proof + [SOME_HASH], root)
    assert not verify_inclusion(leaves[i], i, n, [SOME_HASH] + proof, root)


def test_pool_has_no_duplicate_leaves() -> None:
    # The wrong-index property relies on distinct leaves.
    assert len(set(POOL)) == len(POOL)


# --- invalid inputs ---------------------------------------------------------------------------


@pytest.mark.parametrize("index", [-1, 3, 4, 100])
def test_invalid_inclusion_proof_index_out_of_range(index: int) -> None:
    with pytest.raises(MerkleError):
        inclusion_proof([b"a", b"b", b"c"], index)


def test_invalid_inclusion_proof_on_empty_tree() -> None:
    with pytest.raises(MerkleError):
        inclusion_proof([], 0)


@pytest.mark.parametrize("index", [True, 1.0, "0", None])
def test_invalid_inclusion_proof_index_type(index: object) -> None:
    with pytest.raises(MerkleError):
        inclusion_proof([b"a", b"b"], index)  # type: ignore[arg-type]


def test_invalid_leaf_types() -> None:
    with pytest.raises(MerkleError):
        merkle_root([b"a", "b"])  # type: ignore[list-item]
    with pytest.raises(MerkleError):
        merkle_root(b"abc")  # a bare byte string is not a list of leaves
    with pytest.raises(MerkleError):
        leaf_hash(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("leaves", [b"", bytearray(), memoryview(b""), ""])
def test_invalid_empty_byte_string_is_not_an_empty_tree(leaves: object) -> None:
    # Iterating a non-empty byte string yields ints, which leaf_hash refuses anyway; only the
    # explicit check refuses an EMPTY one instead of answering EMPTY_ROOT for "no leaves".
    with pytest.raises(MerkleError):
        merkle_root(leaves)  # type: ignore[arg-type]
    with pytest.raises(MerkleError):
        inclusion_proofs(leaves)  # type: ignore[arg-type]


def test_invalid_node_hash_lengths() -> None:
    with pytest.raises(MerkleError):
        node_hash(b"\x00" * 31, b"\x00" * 32)
    with pytest.raises(MerkleError):
        node_hash(b"\x00" * 32, b"\x00" * 33)


def test_invalid_verify_arguments_return_false_never_raise() -> None:
    leaves = CT_LEAVES
    root = CT_ROOTS[8]
    proof = inclusion_proof(leaves, 3)
    assert verify_inclusion(leaves[3], 3, 8, proof, root)
    bad_calls = [
        (leaves[3], 3, 8, proof, root[:31]),  # short root
        (leaves[3], 3, 8, proof + [b""], root),  # empty proof element
        (leaves[3], 3, 8, [p[:31] for p in proof], root),  # short elements
        (leaves[3], 3, 8, None, root),  # not a sequence
        (leaves[3], 3, 8, b"".join(proof), root),  # concatenated bytes
        (leaves[3], 3, 8, [1, 2, 3], root),  # not bytes
        (None, 3, 8, proof, root),
        ("x", 3, 8, proof, root),
        (leaves[3], True, 8, proof, root),
        (leaves[3], "3", 8, proof, root),
        (leaves[3], 3, 8.0, proof, root),
        (leaves[3], -1, 8, proof, root),
        (leaves[3], 8, 8, proof, root),
        (leaves[3], 0, 0, [], EMPTY_ROOT),  # nothing is included in the empty tree
        (leaves[3], 2**70, 2**71, proof, root),
    ]
    for args in bad_calls:
        assert verify_inclusion(*args) is False, args  # type: ignore[arg-type]


def test_single_leaf_tree() -> None:
    root = merkle_root([b"data"])
    assert root == leaf_hash(b"data")
    assert inclusion_proof([b"data"], 0) == []
    assert verify_inclusion(b"data", 0, 1, [], root)
    assert not verify_inclusion(b"data", 0, 1, [root], root)
    assert not verify_inclusion(b"other", 0, 1, [], root)
