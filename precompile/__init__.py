"""TRAINING_VERIFY, the precompile at 0x...1008 that answers whether a training receipt is valid
and is exactly the receipt the chain sealed (same run root, same bytes).

``precompile.verify`` holds the pure reference semantics and the gas schedule (no EVM imports);
``precompile.evm`` registers it in a py-evm Prague VM for eth-tester/web3 (imported on demand,
since it pulls in py-evm and web3).
"""

from precompile.verify import (
    GAS_BASE,
    GAS_PER_WORD,
    INVALID,
    MAX_INPUT_BYTES,
    TRAINING_VERIFY_ADDRESS,
    VALID,
    SealedLookup,
    SealedReceipt,
    clear_validity_memo,
    compute_gas,
    compute_sealed_receipt,
    training_verify,
)

__all__ = [
    "GAS_BASE",
    "GAS_PER_WORD",
    "INVALID",
    "MAX_INPUT_BYTES",
    "TRAINING_VERIFY_ADDRESS",
    "VALID",
    "SealedLookup",
    "SealedReceipt",
    "clear_validity_memo",
    "compute_gas",
    "compute_sealed_receipt",
    "training_verify",
]
