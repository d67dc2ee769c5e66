// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

/// @notice One trainer as a receipt lists it (canonical = strictly ascending address order).
/// `weight` = accepted submissions over the transcript, 0 when slashed.
struct ReceiptTrainer {
    address trainer;
    uint256 weight;
    uint256 stake;
    string did;
    bool slashed;
}

/// @notice The pinned receipt ABI (docs/receipt.md): receipt bytes = abi.encode(ReceiptV1).
struct ReceiptV1 {
    uint16 version;
    string taskId;
    bytes specCanonical;
    address sponsor;
    uint256 rewardPool;
    bytes32 runRoot;
    bytes32 finalModelHash;
    bytes[] roundRecords;
    ReceiptTrainer[] trainers;
    address[] syncers;
    uint64 sealedAt;
}

/// @title TrainingVerify
/// @notice Calls the TRAINING_VERIFY precompile at 0x...1008. Input: runRoot (32 bytes) ||
/// receipt bytes; output: 0x01 iff the receipt is valid, its run root is `runRoot`, and the
/// chain's sealed record of that task holds that root and the SHA-256 of exactly these receipt
/// bytes (so every field, the uncommitted `slashed`/stake/DID/sealedAt included, is the one the
/// node sealed); 0x00 otherwise. The address has no code, so only a low-level staticcall reaches it.
library TrainingVerify {
    address internal constant PRECOMPILE = address(0x1008);

    /// @return True only for a successful call that returned exactly the byte 0x01.
    function verify(bytes32 runRoot, bytes memory receipt) internal view returns (bool) {
        (bool ok, bytes memory out) = PRECOMPILE.staticcall(abi.encodePacked(runRoot, receipt));
        return ok && out.length == 1 && out[0] == 0x01;
    }

    /// @notice The receipt decoded with the pinned ABI (reverts on malformed bytes).
    function decode(bytes memory receipt) internal pure returns (ReceiptV1 memory) {
        return abi.decode(receipt, (ReceiptV1));
    }
}
