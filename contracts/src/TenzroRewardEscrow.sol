// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {Math} from "@openzeppelin/contracts/utils/math/Math.sol";
import {ReceiptHeadV1, ReceiptTrainer, TrainingVerify} from "./ITrainingVerify.sol";

/// @title TenzroRewardEscrow
/// @notice A sponsor escrows an ERC-20 reward for a training task; anyone may then claim it with
/// the run's sealed receipt, which TRAINING_VERIFY (0x1008) checks (valid, and exactly the bytes
/// the chain sealed). A claim credits each non-slashed trainer floor(amount * weight /
/// totalWeight) and the rounding dust to the sponsor; credits are paid out by `withdraw`. A
/// deposit settles exactly once: by one verified claim, or by the sponsor's refund after the
/// deadline.
/// @dev Deposits are keyed by (depositor, taskId): `depositKeyOf(sponsor, taskId)`. Keying by the
/// task id alone let anyone who saw a posted task id deposit first and lock the real sponsor out
/// forever; now a deposit by anyone else sits under its own key, and a claim reads only the
/// deposit of the receipt's sponsor. Payouts are pull payments: one payee whose transfer
/// reverts (a blacklisted address, a token hook) cannot block the others' claim. The amount held
/// is what the escrow actually received (balance difference), so a token that takes its fee out
/// of the amount cannot over-promise; and no payout may take more than it pays from the
/// escrow's balance (`TransferMismatch` otherwise), so a token that charges the sender on top
/// of the amount cannot pay one deposit's payees out of another deposit's tokens.
contract TenzroRewardEscrow is ReentrancyGuard {
    using SafeERC20 for IERC20;

    enum Status {
        None,
        Open,
        Claimed,
        Refunded
    }

    struct Deposit {
        address sponsor;
        uint64 deadline;
        Status status;
        IERC20 token;
        uint256 amount;
    }

    mapping(bytes32 depositKey => Deposit) private _deposits;
    mapping(IERC20 token => mapping(address account => uint256)) private _owed;

    event Deposited(bytes32 indexed depositKey, string taskId, address indexed sponsor, address indexed token, uint256 amount, uint64 deadline);
    event Credited(bytes32 indexed depositKey, address indexed trainer, uint256 amount);
    event Claimed(bytes32 indexed depositKey, bytes32 runRoot, uint256 paid, uint256 dust, uint256 payees);
    event Refunded(bytes32 indexed depositKey, address indexed sponsor, uint256 amount);
    event Withdrawn(address indexed account, address indexed token, uint256 amount);

    error ZeroAmount();
    error DeadlineInPast(uint64 deadline);
    error DepositExists(bytes32 depositKey);
    error NotOpen(bytes32 depositKey, Status status);
    error RootMismatch(bytes32 receiptRoot, bytes32 claimedRoot);
    error ReceiptNotVerified(bytes32 depositKey, bytes32 runRoot);
    error DeadlineNotReached(uint64 deadline);
    error NothingOwed(address token, address account);
    error TransferMismatch(address token, uint256 amount, uint256 taken);

    /// @notice The key the deposit of `sponsor` for `taskId` is stored under.
    function depositKeyOf(address sponsor, string memory taskId) public pure returns (bytes32) {
        return keccak256(abi.encode(sponsor, taskId));
    }

    function depositOf(bytes32 depositKey) external view returns (Deposit memory) {
        return _deposits[depositKey];
    }

    /// @notice What `account` can withdraw in `token` (credited by claims, not yet withdrawn).
    function owedTo(IERC20 token, address account) external view returns (uint256) {
        return _owed[token][account];
    }

    /// @notice Escrow `amount` of `token` for `taskId` under the caller's own key, refundable
    /// after `deadline` (unix s). Only a deposit by the spec's sponsor_address can be claimed.
    /// Needs an allowance.
    function deposit(string calldata taskId, IERC20 token, uint256 amount, uint64 deadline) external nonReentrant {
        if (amount == 0) revert ZeroAmount();
        if (deadline <= block.timestamp) revert DeadlineInPast(deadline);
        bytes32 key = depositKeyOf(msg.sender, taskId);
        if (_deposits[key].status != Status.None) revert DepositExists(key);
        uint256 before = token.balanceOf(address(this));
        token.safeTransferFrom(msg.sender, address(this), amount);
        uint256 received = token.balanceOf(address(this)) - before;
        if (received == 0) revert ZeroAmount();
        _deposits[key] = Deposit(msg.sender, deadline, Status.Open, token, received);
        emit Deposited(key, taskId, msg.sender, address(token), received, deadline);
    }

    /// @notice Credit the trainers of a sealed run from the deposit of the receipt's sponsor.
    /// `receipt` = abi.encode(ReceiptV1); `runRoot` its run root. Anyone may call; the payees
    /// and amounts come from the verified receipt. Transfers nothing: see `withdraw`.
    /// @dev Only the receipt's head and trainers are decoded, and the precompile's input holds
    /// the one copy of it in memory: decoding the whole transcript and copying the receipt three
    /// times cost ~19M gas for a 519 KB receipt (memory gas is quadratic); now the calldata
    /// (EIP-7623's floor) dominates. A node admits runs whose receipt fits one claim
    /// (`max_receipt_bytes`, docs/receipt.md "Receipt size").
    function claim(bytes calldata receipt, bytes32 runRoot) external nonReentrant {
        ReceiptHeadV1 memory r = TrainingVerify.decodeHead(receipt);
        bytes32 key = depositKeyOf(r.sponsor, r.taskId);
        Deposit storage d = _deposits[key];
        if (d.status != Status.Open) revert NotOpen(key, d.status);
        if (r.runRoot != runRoot) revert RootMismatch(r.runRoot, runRoot);
        if (!TrainingVerify.verifyCalldata(runRoot, receipt)) revert ReceiptNotVerified(key, runRoot);
        d.status = Status.Claimed;

        uint256 amount = d.amount;
        IERC20 token = d.token;
        ReceiptTrainer[] memory trainers = r.trainers;
        uint256 totalWeight;
        for (uint256 i; i < trainers.length; ++i) {
            if (!trainers[i].slashed) totalWeight += trainers[i].weight;
        }
        uint256 paid;
        uint256 payees;
        if (totalWeight != 0) {
            for (uint256 i; i < trainers.length; ++i) {
                ReceiptTrainer memory t = trainers[i];
                if (t.slashed || t.weight == 0) continue;
                uint256 share = Math.mulDiv(amount, t.weight, totalWeight);
                if (share == 0) continue;
                paid += share;
                ++payees;
                _owed[token][t.trainer] += share;
                emit Credited(key, t.trainer, share);
            }
        }
        uint256 dust = amount - paid;
        if (dust != 0) _owed[token][d.sponsor] += dust;
        emit Claimed(key, runRoot, paid, dust, payees);
    }

    /// @notice Pay `account` everything credited to it in `token`. Anyone may call (the tokens
    /// only ever go to `account`), so a keeper can push payouts; a transfer that reverts fails
    /// only this call and leaves the credit in place.
    function withdraw(IERC20 token, address account) external nonReentrant {
        uint256 owed = _owed[token][account];
        if (owed == 0) revert NothingOwed(address(token), account);
        _owed[token][account] = 0; // effects before interactions (and nonReentrant)
        _payOut(token, account, owed);
        emit Withdrawn(account, address(token), owed);
    }

    /// @notice Return the caller's whole deposit for `taskId` once its deadline has passed
    /// without a verified claim.
    function refund(string calldata taskId) external nonReentrant {
        bytes32 key = depositKeyOf(msg.sender, taskId);
        Deposit storage d = _deposits[key];
        if (d.status != Status.Open) revert NotOpen(key, d.status);
        if (block.timestamp <= d.deadline) revert DeadlineNotReached(d.deadline);
        d.status = Status.Refunded;
        _payOut(d.token, msg.sender, d.amount);
        emit Refunded(key, msg.sender, d.amount);
    }

    /// @dev Transfer `amount` and require the escrow's balance to drop by at most `amount`. The
    /// escrow holds many deposits in one balance per token: a token that charged the sender a fee
    /// on top of the amount would pay each payout partly out of other depositors' tokens, and the
    /// last to withdraw or refund would find the escrow short. Such a token cannot pay out (its
    /// deposits stay locked, as they would with a token that reverts), which is safer than
    /// insolvency spread over everyone else. A drop smaller than `amount` harms nobody and is
    /// allowed: share-based tokens (stETH, aTokens) round a transfer's balance change by a wei.
    function _payOut(IERC20 token, address to, uint256 amount) private {
        uint256 before = token.balanceOf(address(this));
        token.safeTransfer(to, amount);
        uint256 remaining = token.balanceOf(address(this));
        if (remaining < before && before - remaining > amount) {
            revert TransferMismatch(address(token), amount, before - remaining);
        }
    }
}
