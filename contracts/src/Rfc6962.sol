// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

/// @title Rfc6962
/// @notice RFC 6962 Merkle tree hashing over SHA-256 (precompile 0x02) and the Tenzro run root,
///         bit-for-bit the same as tenzro_training/merkle.py.
/// @dev What this is: leaf/node hashes, the Merkle Tree Hash (MTH) of a list of leaf hashes,
///      the audit-path fold of RFC 9162 section 2.1.3.2, and
///      runRoot = sha256("tenzro/train/run-root/v1" || MTH).
///      What it is NOT: a log (no consistency proofs) and it does not decide what the leaves are.
library Rfc6962 {
    bytes internal constant RUN_ROOT_DOMAIN = "tenzro/train/run-root/v1";

    /// @notice sha256(0x00 || leaf).
    function leafHash(bytes memory leaf) internal pure returns (bytes32) {
        return sha256(abi.encodePacked(bytes1(0x00), leaf));
    }

    /// @notice sha256(0x01 || left || right).
    function nodeHash(bytes32 left, bytes32 right) internal pure returns (bytes32) {
        return sha256(abi.encodePacked(bytes1(0x01), left, right));
    }

    /// @notice sha256("tenzro/train/run-root/v1" || mth).
    function runRootOf(bytes32 mth) internal pure returns (bytes32) {
        return sha256(abi.encodePacked(RUN_ROOT_DOMAIN, mth));
    }

    /// @notice MTH over already-hashed leaves. Overwrites `level` (it is the scratch space).
    /// @dev Bottom-up: pair adjacent nodes left to right, carry an unpaired last node up
    ///      unchanged. RFC 6962 trees are left-complete, so this equals the recursive split at
    ///      the largest power of two < n. The empty tree hashes to sha256("").
    function rootOfLeafHashes(bytes32[] memory level) internal pure returns (bytes32) {
        uint256 n = level.length;
        if (n == 0) return sha256("");
        while (n > 1) {
            uint256 half = n >> 1;
            for (uint256 i = 0; i < half; ++i) {
                level[i] = nodeHash(level[2 * i], level[2 * i + 1]);
            }
            if (n & 1 == 1) {
                level[half] = level[n - 1];
                n = half + 1;
            } else {
                n = half;
            }
        }
        return level[0];
    }

    /// @notice The root an audit path implies for leaf `index` of a `size`-leaf tree.
    /// @return ok false when the path has the wrong shape (too many or too few hashes) or
    ///         index >= size; root the implied MTH when ok.
    function rootFromPath(bytes32 leafDigest, uint256 index, uint256 size, bytes32[] memory proof)
        internal
        pure
        returns (bool ok, bytes32 root)
    {
        if (index >= size) return (false, bytes32(0));
        uint256 fn = index;
        uint256 sn = size - 1;
        bytes32 r = leafDigest;
        for (uint256 i = 0; i < proof.length; ++i) {
            if (sn == 0) return (false, bytes32(0)); // more hashes than levels
            if (fn & 1 == 1 || fn == sn) {
                r = nodeHash(proof[i], r);
                // Climb past the levels where this node was carried up unpaired.
                while (fn & 1 == 0 && fn != 0) {
                    fn >>= 1;
                    sn >>= 1;
                }
            } else {
                r = nodeHash(r, proof[i]);
            }
            fn >>= 1;
            sn >>= 1;
        }
        if (sn != 0) return (false, bytes32(0)); // fewer hashes than levels
        return (true, r);
    }

    /// @notice True iff `proof` shows `leaf` is leaf `index` of a `size`-leaf tree whose
    ///         run root (domain-prefixed MTH) is `runRoot`.
    function verifyInclusionInRunRoot(
        bytes32 runRoot,
        bytes memory leaf,
        uint256 index,
        uint256 size,
        bytes32[] memory proof
    ) internal pure returns (bool) {
        (bool ok, bytes32 mth) = rootFromPath(leafHash(leaf), index, size, proof);
        return ok && runRootOf(mth) == runRoot;
    }
}
