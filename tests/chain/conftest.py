"""Shared pieces of the on-chain tests: real sealed runs from an in-process node, compiled
contracts, and an eth-tester chain (py-evm Prague) with TRAINING_VERIFY at 0x1008.

- :func:`run_to_sealed` drives :class:`NodeService` over a :class:`MemoryStore` (the helpers of
  tests/node/conftest.py) to a Sealed run and returns its receipt, ABI bytes and store.
- :class:`Chain` wraps web3 + eth-tester: ``sealed`` is the precompile's lookup (set
  ``chain.sealed.source`` to e.g. ``sealed_lookup_from_store(run.store)``, which answers the
  stored receipt's run root and ABI digest), ``deploy``/``send``
  sign with eth-account keys and pass explicit gas (failures are mined with status 0, so callers
  assert on ``receipt.status``).
- fixtures: ``artifacts`` (session; compiled contracts), ``sealed_run`` (session; a 3-trainer
  run with unequal weights), ``chain`` (fresh per test).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from web3 import Web3

from precompile import SealedReceipt
from precompile.evm import make_web3, sealed_lookup_from_store
from storage.memory import MemoryStore
from tenzro_training import auth
from tenzro_training.node.service import NodeService
from tenzro_training.payload import compute_payload_hash
from tenzro_training.merkle import run_root
from tenzro_training.receipt import TrainingReceipt, compute_accepted_counts, compute_syncers
from tenzro_training.receipt_abi import encode_receipt
from tenzro_training.records import RoundRecord, compute_run_leaves
from tenzro_training.spec import TrainingTaskSpec
from tests.node.conftest import (
    GRACE_MS,
    SPONSOR,
    STAKE,
    SYNCERS,
    TIMINGS,
    FakeClock,
    Party,
    layouts_for,
    gradient,
    make_config,
    make_payload,
    spec_dict,
    write_checkpoint,
)

__all__ = [
    "Chain",
    "SealedRun",
    "SwitchableLookup",
    "load_build",
    "run_to_sealed",
    "trainer_party",
]

_ROOT = Path(__file__).resolve().parents[2]


def load_build() -> Any:
    """contracts/build.py as a module (contracts/ is not a Python package)."""
    spec = importlib.util.spec_from_file_location("tenzro_contracts_build", _ROOT / "contracts" / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def trainer_party(i: int) -> Party:
    return Party(hashlib.sha256(f"tenzro-chain-test/trainer/{i}".encode()).digest())


@dataclass
class SealedRun:
    task_id: str
    store: MemoryStore
    service: NodeService
    receipt: TrainingReceipt
    """As the node's getReceipt returns it (trainers in enrollment order)."""
    abi: bytes
    trainers: list[Party]
    spec: dict[str, Any]

    @property
    def run_root(self) -> bytes:
        return self.receipt.run_root


def run_to_sealed(
    tmp: Path,
    task_id: str = "run-1",
    n_trainers: int = 3,
    rounds: int = 2,
    pool: int = 1001,
    skip: Callable[[int, int], bool] = lambda trainer, round_: False,
    equivocate: int | None = None,
    equivocate_round: int = 0,
    equivocate_late: bool = False,
    spec_overrides: dict[str, Any] | None = None,
) -> SealedRun:
    """A real run to Sealed on a fresh in-process node. ``skip(i, r)`` leaves trainer i out of
    round r (unequal weights); ``equivocate=i`` makes trainer i equivocate in round
    ``equivocate_round`` (slashed; its submissions of earlier rounds stay in the transcript, so
    a later round gives a slashed trainer with a non-zero accepted count). ``equivocate_late``:
    instead, in round ``equivocate_round`` (>= 1) the trainer signs a second payload for
    fragment 0 of the round before, already finalized: slashed in ``equivocate_round``.
    ``spec_overrides``: other spec fields (the rule, the quorum)."""
    trainers = [trainer_party(i) for i in range(n_trainers)]
    genesis = ((SPONSOR.address, 10**12),) + tuple((t.address, 10_000) for t in trainers)
    clock = FakeClock()
    store = MemoryStore()
    service = NodeService(make_config(None, genesis=genesis), store, clock=clock)
    uri, sha = write_checkpoint(tmp / f"ckpt-{task_id}")
    quorum = min(2, n_trainers)
    fields: dict[str, Any] = {"task_id": task_id, "trainer_count": n_trainers, "quorum": quorum, "max_rounds": rounds,
                              "reward_pool": str(pool), **(spec_overrides or {})}
    doc = spec_dict(uri, sha, **fields)
    task = TrainingTaskSpec.from_dict(doc)
    service.post_task(doc, SPONSOR.sign(auth.PostTask(task_id=task_id, spec_hash=task.spec_hash())))
    clock.advance(TIMINGS.election_window_ms + 1)
    service.tick()
    for i, t in enumerate(trainers):
        did = f"did:tenzro:node:chain{i}"
        msg = auth.EnrollTrainer(task_id=task_id, did=did, trainer=t.address, stake=STAKE)
        service.enroll_trainer(task_id, did, t.text, STAKE, t.sign(msg))
    layouts = layouts_for()

    def submit(i: int, r: int, f: int, variant: int = 0) -> None:
        lay = layouts[f]
        data = make_payload(task_id, r, lay, gradient(i, r, f, lay.numel, variant))
        msg = auth.SubmitOuterGradient(task_id=task_id, round=r, fragment=f, payload_hash=compute_payload_hash(data))
        try:
            service.submit_outer_gradient(task_id, r, f, data, None, trainers[i].sign(msg))
        except Exception:
            if variant == 0:
                raise

    for r in range(rounds):
        for i in range(n_trainers):
            if skip(i, r):
                continue
            if equivocate == i and r >= equivocate_round:
                if r == equivocate_round and equivocate_late:
                    submit(i, r - 1, 0, variant=1)  # equivocation over a finalized round
                elif r == equivocate_round:
                    submit(i, r, 0)
                    submit(i, r, 0, variant=1)  # equivocation: slashed, out of the run
                continue
            for f in range(len(layouts)):
                submit(i, r, f)
        if any(skip(i, r) or (equivocate == i and r >= equivocate_round) for i in range(n_trainers)):
            clock.advance(GRACE_MS + 1)  # let the straggler window close
        syncer_address = service.get_run(task_id)["syncer"]
        syncer = next(s for s in SYNCERS if s.text == syncer_address)
        service.finalize_round(task_id, r, syncer.sign(auth.FinalizeRound(task_id=task_id, round=r)))
    answer = service.get_receipt(task_id)
    receipt = TrainingReceipt.from_dict(answer["receipt"])
    return SealedRun(task_id, store, service, receipt, encode_receipt(receipt), trainers, doc)


def rewritten_receipt(
    receipt: TrainingReceipt,
    *,
    spec: TrainingTaskSpec | None = None,
    edit: Callable[[RoundRecord], RoundRecord] = lambda rec: rec,
) -> TrainingReceipt:
    """``receipt`` with its spec and/or round records replaced and everything the root and the
    transcript determine recomputed (accepted counts, syncers, final model hash, run root), as
    a node forging it would: a self-consistent forgery that only the semantic rules can catch."""
    spec = receipt.spec if spec is None else spec
    transcript = tuple(edit(rec) for rec in receipt.transcript)
    counts = compute_accepted_counts(transcript)
    forged = dataclasses.replace(
        receipt, spec=spec, transcript=transcript, final_model_hash=transcript[-1].model_hash,
        trainers=tuple(dataclasses.replace(t, accepted_submissions=counts.get(t.address, 0)) for t in receipt.trainers),
        syncers=compute_syncers(transcript),
    )
    root = run_root(compute_run_leaves(spec.canonical_bytes(), transcript, forged.final_record))
    return dataclasses.replace(forged, run_root=root)


@dataclass
class SwitchableLookup:
    """The precompile's ``sealed`` view; ``source`` can be swapped while the chain runs."""

    source: Callable[[str], SealedReceipt | None] = lambda task_id: None

    def __call__(self, task_id: str) -> SealedReceipt | None:
        return self.source(task_id)

    def use_store(self, store: MemoryStore) -> None:
        self.source = sealed_lookup_from_store(store)


@dataclass
class Chain:
    w3: Web3
    sealed: SwitchableLookup
    artifacts: dict[str, Any]
    funder: str = field(init=False)

    def __post_init__(self) -> None:
        self.funder = self.w3.eth.accounts[0]

    def fund(self, address: str, wei: int = 10**20) -> None:
        tx = self.w3.eth.send_transaction({"from": self.funder, "to": address, "value": wei, "gas": 21_000})
        assert self.w3.eth.wait_for_transaction_receipt(tx).status == 1

    def deploy(self, name: str, *args: Any, key: bytes, gas: int = 5_000_000) -> Any:
        art = self.artifacts[name]
        factory = self.w3.eth.contract(abi=art.abi, bytecode=art.bytecode)
        receipt = self.send(factory.constructor(*args), key, gas)
        assert receipt.status == 1, f"deploying {name} failed"
        return self.w3.eth.contract(address=receipt.contractAddress, abi=art.abi)

    def send(self, fn: Any, key: bytes, gas: int = 3_000_000) -> Any:
        """Sign and mine one transaction; returns its receipt (status 0 when it reverted)."""
        sender = Account.from_key(key).address
        tx = fn.build_transaction(
            {
                "from": sender,
                "nonce": self.w3.eth.get_transaction_count(sender),
                "gas": gas,
                "maxFeePerGas": 2 * 10**9,
                "maxPriorityFeePerGas": 10**9,
                "chainId": self.w3.eth.chain_id,
            }
        )
        signed = Account.sign_transaction(tx, key)
        tx_hash = self.w3.eth.send_raw_transaction(signed.raw_transaction)
        return self.w3.eth.wait_for_transaction_receipt(tx_hash)

    def mine_at(self, timestamp: int) -> None:
        """Advance the chain clock (the next block's timestamp)."""
        self.w3.provider.ethereum_tester.time_travel(timestamp)


@pytest.fixture(scope="session")
def artifacts() -> dict[str, Any]:
    return load_build().compile_contracts(("TenzroRewardEscrow.sol", "TestToken.sol"))


@pytest.fixture(scope="session")
def sealed_run(tmp_path_factory: pytest.TempPathFactory) -> SealedRun:
    """3 trainers, 2 rounds, trainer 2 skips round 1: weights 4, 4, 2 (pool 1001)."""
    return run_to_sealed(tmp_path_factory.mktemp("sealed"), skip=lambda i, r: i == 2 and r == 1)


@pytest.fixture
def chain(artifacts: dict[str, Any]) -> Iterator[Chain]:
    sealed = SwitchableLookup()
    yield Chain(make_web3(sealed), sealed, artifacts)
