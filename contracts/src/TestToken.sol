// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";

/// @title TestToken
/// @notice A plain ERC-20 with an open mint, for tests and benchmarks only.
contract TestToken is ERC20 {
    constructor(string memory name_, string memory symbol_) ERC20(name_, symbol_) {}

    function mint(address to, uint256 amount) external {
        _mint(to, amount);
    }
}

/// @title BlockingTestToken
/// @notice TestToken whose transfers to a blocked address revert (as a stablecoin's blacklist
/// does), for the escrow's fault-injection tests only. Anyone may block anyone.
contract BlockingTestToken is TestToken {
    mapping(address account => bool) public blocked;

    error Blocked(address account);

    constructor(string memory name_, string memory symbol_) TestToken(name_, symbol_) {}

    function setBlocked(address account, bool value) external {
        blocked[account] = value;
    }

    function _update(address from, address to, uint256 value) internal override {
        if (blocked[to]) revert Blocked(to);
        super._update(from, to, value);
    }
}

/// @title SurchargeTestToken
/// @notice TestToken that charges the sender 1% ON TOP of every transfer (burned), so a
/// transfer of `value` costs the sender `value + value / 100`, for the escrow's tests only.
contract SurchargeTestToken is TestToken {
    constructor(string memory name_, string memory symbol_) TestToken(name_, symbol_) {}

    function _update(address from, address to, uint256 value) internal override {
        super._update(from, to, value);
        if (from != address(0) && to != address(0)) super._update(from, address(0), value / 100);
    }
}

/// @title RoundingTestToken
/// @notice TestToken whose transfers move one unit less than asked (as share-based tokens such
/// as stETH round a transfer down), for the escrow's tests only.
contract RoundingTestToken is TestToken {
    constructor(string memory name_, string memory symbol_) TestToken(name_, symbol_) {}

    function _update(address from, address to, uint256 value) internal override {
        if (from != address(0) && to != address(0) && value > 0) value -= 1;
        super._update(from, to, value);
    }
}
