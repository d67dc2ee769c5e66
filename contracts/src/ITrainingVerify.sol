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

/// @notice The fields of a ReceiptV1 a payout needs, decoded from the same bytes: its head words
/// for `specCanonical`, `roundRecords` and `syncers` are read as plain words (their tail offsets)
/// and never followed, so a claim does not copy the transcript (most of the receipt) into
/// memory. Same layout as ReceiptV1, so `abi.decode(receipt, (ReceiptHeadV1))` reads the same
/// values of the fields it names; TRAINING_VERIFY still checks every byte of the receipt.
struct ReceiptHeadV1 {
    uint16 version;
    string taskId;
    uint256 specCanonicalOffset;
    address sponsor;
    uint256 rewardPool;
    bytes32 runRoot;
    bytes32 finalModelHash;
    uint256 roundRecordsOffset;
    ReceiptTrainer[] trainers;
    uint256 syncersOffset;
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

    /// @notice `verify` for a receipt still in calldata: the precompile's input is built in
    /// memory with one copy of the receipt (memory gas grows with the square of its size, and a
    /// receipt can be hundreds of KB).
    function verifyCalldata(bytes32 runRoot, bytes calldata receipt) internal view returns (bool) {
        (bool ok, bytes memory out) = PRECOMPILE.staticcall(bytes.concat(runRoot, receipt));
        return ok && out.length == 1 && out[0] == 0x01;
    }

    /// @notice The receipt decoded with the pinned ABI (reverts on malformed bytes).
    function decode(bytes memory receipt) internal pure returns (ReceiptV1 memory) {
        return abi.decode(receipt, (ReceiptV1));
    }

    /// @notice What a payout reads of a receipt in calldata (see ReceiptHeadV1): reverts on
    /// malformed bytes in the fields it decodes; the others are checked by `verifyCalldata`.
    function decodeHead(bytes calldata receipt) internal pure returns (ReceiptHeadV1 memory) {
        return abi.decode(receipt, (ReceiptHeadV1));
    }
}
