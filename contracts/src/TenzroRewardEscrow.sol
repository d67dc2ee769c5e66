// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {Math} from "@openzeppelin/contracts/utils/math/Math.sol";
import {ReceiptV1, ReceiptTrainer, TrainingVerify} from "./ITrainingVerify.sol";

/// @title TenzroRewardEscrow
/// @notice A sponsor escrows an ERC-20 reward for a training task; anyone may then claim it with
/// the run's sealed receipt, which TRAINING_VERIFY (0x1008) checks. Each non-slashed trainer is
/// paid floor(amount * weight / totalWeight); the rounding dust returns to the sponsor. A task
/// settles exactly once: by one verified claim, or by the sponsor's refund after the deadline.
/// @dev Deposits are keyed by keccak256(bytes(taskId)). The amount held is what the escrow
/// actually received (balance difference), so fee-on-transfer tokens cannot over-promise.
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

    mapping(bytes32 taskKey => Deposit) private _deposits;

    event Deposited(bytes32 indexed taskKey, string taskId, address indexed sponsor, address indexed token, uint256 amount, uint64 deadline);
    event Paid(bytes32 indexed taskKey, address indexed trainer, uint256 amount);
    event Claimed(bytes32 indexed taskKey, bytes32 runRoot, uint256 paid, uint256 dust, uint256 payees);
    event Refunded(bytes32 indexed taskKey, address indexed sponsor, uint256 amount);

    error ZeroAmount();
    error DeadlineInPast(uint64 deadline);
    error DepositExists(bytes32 taskKey);
    error NotOpen(bytes32 taskKey, Status status);
    error SponsorMismatch(address receiptSponsor, address depositSponsor);
    error RootMismatch(bytes32 receiptRoot, bytes32 claimedRoot);
    error ReceiptNotVerified(bytes32 taskKey, bytes32 runRoot);
    error NotSponsor(address caller);
    error DeadlineNotReached(uint64 deadline);

    /// @notice The key a task's deposit is stored under.
    function taskKeyOf(string memory taskId) public pure returns (bytes32) {
        return keccak256(bytes(taskId));
    }

    function depositOf(bytes32 taskKey) external view returns (Deposit memory) {
        return _deposits[taskKey];
    }

    /// @notice Escrow `amount` of `token` for `taskId`, refundable after `deadline` (unix s).
    /// The caller must be the spec's sponsor_address for a claim to match. Needs an allowance.
    function deposit(string calldata taskId, IERC20 token, uint256 amount, uint64 deadline) external nonReentrant {
        if (amount == 0) revert ZeroAmount();
        if (deadline <= block.timestamp) revert DeadlineInPast(deadline);
        bytes32 key = taskKeyOf(taskId);
        if (_deposits[key].status != Status.None) revert DepositExists(key);
        uint256 before = token.balanceOf(address(this));
        token.safeTransferFrom(msg.sender, address(this), amount);
        uint256 received = token.balanceOf(address(this)) - before;
        if (received == 0) revert ZeroAmount();
        _deposits[key] = Deposit(msg.sender, deadline, Status.Open, token, received);
        emit Deposited(key, taskId, msg.sender, address(token), received, deadline);
    }

    /// @notice Pay the trainers of a sealed run. `receipt` = abi.encode(ReceiptV1); `runRoot`
    /// its run root. Anyone may call; the payees and amounts come from the verified receipt.
    function claim(bytes calldata receipt, bytes32 runRoot) external nonReentrant {
        ReceiptV1 memory r = TrainingVerify.decode(receipt);
        bytes32 key = taskKeyOf(r.taskId);
        Deposit storage d = _deposits[key];
        if (d.status != Status.Open) revert NotOpen(key, d.status);
        if (r.sponsor != d.sponsor) revert SponsorMismatch(r.sponsor, d.sponsor);
        if (r.runRoot != runRoot) revert RootMismatch(r.runRoot, runRoot);
        if (!TrainingVerify.verify(runRoot, receipt)) revert ReceiptNotVerified(key, runRoot);
        d.status = Status.Claimed; // effects before interactions (and nonReentrant)

        uint256 amount = d.amount;
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
                d.token.safeTransfer(t.trainer, share);
                emit Paid(key, t.trainer, share);
            }
        }
        uint256 dust = amount - paid;
        if (dust != 0) d.token.safeTransfer(d.sponsor, dust);
        emit Claimed(key, runRoot, paid, dust, payees);
    }

    /// @notice Return the whole deposit to its sponsor once the deadline has passed without a
    /// verified claim.
    function refund(string calldata taskId) external nonReentrant {
        bytes32 key = taskKeyOf(taskId);
        Deposit storage d = _deposits[key];
        if (d.status != Status.Open) revert NotOpen(key, d.status);
        if (msg.sender != d.sponsor) revert NotSponsor(msg.sender);
        if (block.timestamp <= d.deadline) revert DeadlineNotReached(d.deadline);
        d.status = Status.Refunded;
        d.token.safeTransfer(d.sponsor, d.amount);
        emit Refunded(key, d.sponsor, d.amount);
    }
}
