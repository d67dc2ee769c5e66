"""TRAINING_VERIFY registered in a real EVM: py-evm's Prague VM with one more precompile.

What this module is: :func:`make_vm_class` (a Prague computation subclass whose precompile map
adds ``0x...1008`` -> :func:`precompile.verify.training_verify`, with the State and VM subclasses
around it), :func:`make_tester_backend` / :func:`make_web3` for eth-tester and web3, and
:func:`sealed_lookup_from_store`, the ``sealed`` view wired to a node's store: per task, the
sealed record the node wrote with the seal (the receipt's run root and the SHA-256 of its
canonical ABI bytes).

What it is NOT: the verification rules (``precompile.verify`` / ``tenzro_training.receipt_abi``)
or a production client integration. The lookup is a Python callable captured per VM class, so
two backends can answer for two different chains in one process.

Failure behaviour: input that does not verify returns the single byte 0x00 with the call
SUCCEEDING (Solidity decides what to do with it); only running out of gas fails the call, as for
every precompile. No Python exception escapes into py-evm: ``training_verify`` catches all.
"""

from __future__ import annotations

try:  # py-evm and eth-tester come with the `evm` extra, not with a plain install (the node needs neither)
    from eth.abc import ComputationAPI
    from eth.vm.forks.prague import PragueVM
    from eth.vm.forks.prague.computation import PragueComputation
    from eth.vm.forks.prague.state import PragueState
    from eth_tester import EthereumTester, PyEVMBackend
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(
        f"precompile.evm needs py-evm and eth-tester ({exc.name} is missing): pip install 'tenzro-training[evm]'",
        name=exc.name,
    ) from None
from eth_utils import to_canonical_address
from web3 import EthereumTesterProvider, Web3

from precompile.verify import (
    TRAINING_VERIFY_ADDRESS,
    SealedLookup,
    SealedReceipt,
    compute_gas,
    training_verify,
)
from storage import schema
from storage.interface import KVStore
from tenzro_training.node import persistence

__all__ = ["make_vm_class", "make_tester_backend", "make_web3", "sealed_lookup_from_store"]


def make_vm_class(sealed: SealedLookup) -> type[PragueVM]:
    """A PragueVM subclass whose computations know TRAINING_VERIFY, answering from ``sealed``."""

    def _training_verify(computation: ComputationAPI) -> ComputationAPI:
        data = bytes(computation.msg.data)
        # Charged before any work: an out-of-gas call fails like every other precompile's.
        computation.consume_gas(compute_gas(len(data)), reason="TRAINING_VERIFY precompile")
        computation.output = training_verify(data, sealed)
        return computation

    precompiles = dict(PragueComputation.get_precompiles())
    precompiles[to_canonical_address(TRAINING_VERIFY_ADDRESS)] = _training_verify

    computation = type("TenzroPragueComputation", (PragueComputation,), {"_precompiles": precompiles})
    state = type("TenzroPragueState", (PragueState,), {"computation_class": computation})
    return type("TenzroPragueVM", (PragueVM,), {"_state_class": state})


def make_tester_backend(sealed: SealedLookup) -> PyEVMBackend:
    """An eth-tester py-evm backend (10 funded accounts, Prague from genesis) with TRAINING_VERIFY."""
    return PyEVMBackend(vm_configuration=((0, make_vm_class(sealed)),))


def make_web3(sealed: SealedLookup) -> Web3:
    """A web3 instance over :func:`make_tester_backend`."""
    return Web3(EthereumTesterProvider(EthereumTester(make_tester_backend(sealed))))


def sealed_lookup_from_store(store: KVStore) -> SealedLookup:
    """The ``sealed`` view of a node's storage: the :class:`SealedReceipt` (run root and digest of
    the canonical ABI bytes, the same bytes getReceipt's ``abi`` answers) the node wrote with the
    seal (``schema.sealed_record_key``), or None. Read-only: one ``get`` of 64 bytes per call,
    whatever the receipt's size, as the precompile's base gas prices it (recomputing the digest
    from a stored receipt of megabytes on every call was unpriced work anyone could repeat). An
    unreadable record counts as none."""

    def lookup(task_id: str) -> SealedReceipt | None:
        try:
            raw = store.get(schema.CF_META, schema.sealed_record_key(task_id))
            if raw is None:
                return None
            run_root, digest = persistence.decode_sealed_record(raw)
            return SealedReceipt(run_root, digest)
        except Exception:  # noqa: BLE001 -- a bad task id or record means "not sealed"
            return None

    return lookup
