"""Shared pieces of the node service tests: keys, a tiny model, a fake clock, stores, and a
:class:`Net` that plays sponsor, trainers and syncers against one :class:`NodeService`.

The model is two tensors (17 fp32 values) split into F=2 fragments; outer gradients are small
deterministic pseudo-random vectors per (trainer, round, fragment), so every run is reproducible
and the test can recompute the expected global model with the core functions directly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from eth_account import Account

from storage import schema
from storage.interface import KVStore
from storage.memory import MemoryStore
from storage.external import EXTERNAL_VALUE_BYTES
from storage.rocks import RocksStore
from tenzro_training import auth, vrf
from tenzro_training.addresses import format_address
from tenzro_training.fragments import FragmentLayout, compute_fragment_layouts
from tenzro_training.node.config import NodeConfig, SyncerIdentity
from tenzro_training.node.service import NodeService
from tenzro_training.payload import ENCODING_RAW, PayloadHeader, compute_payload_hash, encode_payload
from tenzro_training.records import Candidate
from tenzro_training.run_state import RunTimings
from tenzro_training.trainer.model import save_checkpoint


def _key(label: str) -> bytes:
    return hashlib.sha256(f"tenzro-node-test/{label}".encode()).digest()


@dataclass(frozen=True)
class Party:
    key: bytes

    @property
    def address(self) -> bytes:
        return bytes.fromhex(Account.from_key(self.key).address[2:])

    @property
    def text(self) -> str:
        return format_address(self.address)

    def sign(self, msg: Any, chain_id: int = 1337) -> bytes:
        return auth.sign_message(msg, self.key, chain_id)


SPONSOR = Party(_key("sponsor"))
STRANGER = Party(_key("stranger"))
TRAINERS = [Party(_key(f"trainer/{i}")) for i in range(4)]
SYNCERS = [Party(_key(f"syncer/{i}")) for i in range(3)]
VRF_SECRETS = [_key(f"vrf/{i}") for i in range(3)]
DIDS = [f"did:tenzro:node:trainer{i}" for i in range(4)]
BALANCE = 10_000
SPONSOR_BALANCE = 100_000
POOL = 1001
STAKE = 50
GRACE_MS = 200
T0 = 1_700_000_000_000
TIMINGS = RunTimings(
    election_window_ms=100, enrollment_window_ms=1_000, round_timeout_ms=10_000, finalize_window_ms=500, min_stake=10
)


def initial_state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return {
        "layer.weight": torch.randn(3, 4, generator=gen),
        "layer.bias": torch.randn(5, generator=gen),
        "empty": torch.zeros(0),  # zero elements: in no fragment, still in the model hash
    }


class FakeClock:
    """Unix milliseconds under the test's control."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


def make_config(tmp: Path | None = None, **overrides: Any) -> NodeConfig:
    candidates = tuple(Candidate(s.address, vrf.public_key(v), 100 + i) for i, (s, v) in enumerate(zip(SYNCERS, VRF_SECRETS)))
    identities = tuple(SyncerIdentity(address=s.address, vrf_secret=v) for s, v in zip(SYNCERS, VRF_SECRETS))
    genesis = ((SPONSOR.address, SPONSOR_BALANCE),) + tuple((t.address, BALANCE) for t in TRAINERS) + (
        (STRANGER.address, BALANCE),
    )
    kwargs: dict[str, Any] = {
        "data_dir": tmp,
        "timings": TIMINGS,
        "candidates": candidates,
        "syncer_identities": identities,
        "genesis": genesis,
    }
    kwargs.update(overrides)
    return NodeConfig(**kwargs)


def write_checkpoint(directory: Path, state: dict[str, torch.Tensor] | None = None) -> tuple[str, str]:
    """Save the init checkpoint; returns (file URI, sha256 hex)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "init.safetensors"
    digest = save_checkpoint(initial_state() if state is None else state, path)
    return path.as_uri(), digest


def spec_dict(uri: str, sha256: str, **overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "task_id": "run-1",
        "sponsor_did": "did:tenzro:human:sponsor",
        "sponsor_address": SPONSOR.text,
        "architecture": {
            "family": "tiny",
            "param_count": 17,
            "modality": "Timeseries",
            "fragment_count": 2,
            "dtype": "fp32",
            "metadata": {"init_checkpoint": {"uri": uri, "sha256": sha256}},
        },
        "tier": "Open",
        "aggregation": "Mean",
        "trainer_count": 3,
        "quorum": 2,
        "inner_steps": 1,
        "max_rounds": 2,
        "grace_window_ms": GRACE_MS,
        "reward_pool": str(POOL),
        "dataset_ref": "ipfs://dataset",
        "dataset_hash": "0x" + "ab" * 32,
        "min_throughput": None,
        "created_at": 1_700_000_000,
    }
    doc.update(overrides)
    return doc


def layouts_for(fragment_count: int = 2) -> tuple[FragmentLayout, ...]:
    return compute_fragment_layouts(initial_state(), fragment_count)


def gradient(trainer: int, round_: int, fragment: int, numel: int, variant: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * trainer + 100 * round_ + 10 * fragment + variant)
    return (torch.randn(numel, generator=gen) * 0.1).to(torch.float32)


def make_payload(task_id: str, round_: int, layout: FragmentLayout, grad: torch.Tensor) -> bytes:
    header = PayloadHeader(task_id, round_, layout.index, ENCODING_RAW, layout.layout_hash())
    return encode_payload(header, layout, grad)


def snapshot(store: KVStore) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every key and value of every column family."""
    return {cf: list(store.iterate(cf)) for cf in schema.ALL_COLUMN_FAMILIES}


@dataclass
class Net:
    """A node plus the parties that call it. ``submit``/``finalize`` sign as the real roles."""

    service: NodeService
    clock: FakeClock
    task_id: str = "run-1"
    layouts: tuple[FragmentLayout, ...] = field(default_factory=layouts_for)

    @property
    def store(self) -> KVStore:
        return self.service._store

    def post(self, spec: dict[str, Any], signer: Party = SPONSOR) -> dict[str, Any]:
        from tenzro_training.spec import TrainingTaskSpec

        task = TrainingTaskSpec.from_dict(spec, supported_only=False)  # the node's admission is under test
        sig = signer.sign(auth.PostTask(task_id=task.task_id, spec_hash=task.spec_hash()))
        return self.service.post_task(spec, sig)

    def elect(self) -> Party:
        """Let the election window pass; return the elected syncer's signing party."""
        self.clock.advance(TIMINGS.election_window_ms + 1)
        self.service.tick()
        return self.syncer()

    def syncer(self) -> Party:
        address = self.service.get_run(self.task_id)["syncer"]
        return next(s for s in SYNCERS if s.text == address)

    def enroll(self, i: int, stake: int = STAKE, signer: Party | None = None) -> dict[str, Any]:
        t = TRAINERS[i]
        msg = auth.EnrollTrainer(task_id=self.task_id, did=DIDS[i], trainer=t.address, stake=stake)
        return self.service.enroll_trainer(self.task_id, DIDS[i], t.text, stake, (signer or t).sign(msg))

    def payload(self, i: int, round_: int, fragment: int, variant: int = 0) -> bytes:
        lay = self.layouts[fragment]
        return make_payload(self.task_id, round_, lay, gradient(i, round_, fragment, lay.numel, variant))

    def submit(self, i: int, round_: int, fragment: int, *, payload: bytes | None = None, variant: int = 0,
               hash_only: bool = False, signer: Party | None = None) -> dict[str, Any]:
        data = self.payload(i, round_, fragment, variant) if payload is None else payload
        digest = compute_payload_hash(data)
        msg = auth.SubmitOuterGradient(task_id=self.task_id, round=round_, fragment=fragment, payload_hash=digest)
        sig = (signer or TRAINERS[i]).sign(msg)
        if hash_only:
            return self.service.submit_outer_gradient(self.task_id, round_, fragment, None, digest, sig)
        return self.service.submit_outer_gradient(self.task_id, round_, fragment, data, None, sig)

    def finalize(self, round_: int, signer: Party | None = None) -> dict[str, Any]:
        sig = (signer or self.syncer()).sign(auth.FinalizeRound(task_id=self.task_id, round=round_))
        return self.service.finalize_round(self.task_id, round_, sig)

    def cancel(self, signer: Party = SPONSOR) -> dict[str, Any]:
        return self.service.cancel_task(self.task_id, signer.sign(auth.CancelTask(task_id=self.task_id)))


@pytest.fixture
def checkpoint(tmp_path: Path) -> tuple[str, str]:
    return write_checkpoint(tmp_path / "ckpt")


@pytest.fixture(params=["memory", "rocks", "rocks-files"])
def store_kind(request: pytest.FixtureRequest) -> str:
    """``rocks-files``: RocksDB with every payload and model fragment in a file of its own
    (docs/storage.md "Large values"; by default this tests' tiny values stay in their keys)."""
    return str(request.param)


def open_test_store(kind: str, path: Path) -> KVStore:
    if kind == "memory":
        return MemoryStore()
    return RocksStore(path, external_value_bytes=1 if kind == "rocks-files" else EXTERNAL_VALUE_BYTES)


@pytest.fixture
def net(store_kind: str, tmp_path: Path) -> Iterator[Net]:
    clock = FakeClock()
    store = open_test_store(store_kind, tmp_path / "db")
    config = make_config(tmp_path / "data" if store_kind != "memory" else None)
    service = NodeService(config, store, clock=clock)
    yield Net(service, clock)
    service.close()
    store.close()
