"""Restart and crash: everything reloads from RocksDB, and a node killed at any moment continues
exactly where its last acknowledged call left it.

The same scripted run (post, elect, enroll 3, two rounds of 3 trainers x 2 fragments, finalize)
is played with a fixed clock per step. Every step is safe to replay (the protocol makes replays
no-ops), so a restarted driver simply plays the script again from the top.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from storage.memory import MemoryStore
from storage.rocks import RocksStore
from tenzro_training.errors import LateSubmission
from tenzro_training.node.service import NodeService

from tests.node.conftest import T0, FakeClock, Net, make_config, snapshot, spec_dict, write_checkpoint

REPO = Path(__file__).resolve().parents[2]


def script() -> list[tuple[Any, ...]]:
    steps: list[tuple[Any, ...]] = [("post",), ("elect",)] + [("enroll", i) for i in range(3)]
    for r in range(2):
        steps += [("submit", i, r, f) for i in range(3) for f in range(2)]
        steps.append(("finalize", r))
    return steps


def play(net: Net, spec: dict[str, Any], k: int, step: tuple[Any, ...]) -> None:
    """Step ``k`` at its fixed instant (after the 100 ms election window from step 1 on)."""
    net.clock.now = T0 + 10 * k + (101 if k >= 1 else 0)
    kind = step[0]
    if kind == "post":
        net.post(spec)
    elif kind == "elect":
        net.service.tick()
    elif kind == "enroll":
        net.enroll(step[1])
    elif kind == "submit":
        try:
            net.submit(step[1], step[2], step[3])
        except LateSubmission:
            pass  # only a replay after a restart: that round is already finalized
    else:
        net.finalize(step[1])


def make_net(store: Any, data_dir: Path | None) -> Net:
    clock = FakeClock()
    return Net(NodeService(make_config(data_dir), store, clock=clock), clock)


def uninterrupted(spec: dict[str, Any]) -> tuple[Net, MemoryStore]:
    store = MemoryStore()
    net = make_net(store, None)
    for k, step in enumerate(script()):
        play(net, spec, k, step)
    return net, store


def test_restart_mid_round_continues_exactly(tmp_path: Path) -> None:
    spec = spec_dict(*write_checkpoint(tmp_path / "ckpt"))
    reference, reference_store = uninterrupted(spec)
    steps = script()
    stop = steps.index(("submit", 1, 0, 1)) + 1  # mid-round 0: two of three trainers in
    store = RocksStore(tmp_path / "db")
    net = make_net(store, tmp_path / "data")
    for k in range(stop):
        play(net, spec, k, steps[k])
    before = net.service.get_run(net.task_id)
    net.service.close()
    store.close()

    store = RocksStore(tmp_path / "db")
    net = make_net(store, tmp_path / "data")
    reloaded = net.service.get_run(net.task_id)
    assert {k: v for k, v in reloaded.items() if k not in ("now_ms", "tick_due")} == {
        k: v for k, v in before.items() if k not in ("now_ms", "tick_due")
    }
    for k in range(stop, len(steps)):
        play(net, spec, k, steps[k])
    receipt = net.service.get_receipt(net.task_id)
    assert receipt == reference.service.get_receipt(reference.task_id)
    assert net.service.export_final_model(net.task_id) == reference.service.export_final_model(reference.task_id)
    # Not only the answers: every stored byte equals the uninterrupted in-memory node's.
    assert snapshot(store) == snapshot(reference_store)
    assert net.service._ledger == reference.service._ledger
    net.service.close()
    store.close()


def test_missing_model_file_is_regenerated_and_stale_temporaries_removed_at_start(tmp_path: Path) -> None:
    spec = spec_dict(*write_checkpoint(tmp_path / "ckpt"))
    store = RocksStore(tmp_path / "db")
    net = make_net(store, tmp_path / "data")
    for k, step in enumerate(script()):
        play(net, spec, k, step)
    path = net.service.final_model_path(net.task_id)
    data = path.read_bytes()
    net.service.close()
    store.close()
    path.unlink()
    # What a SIGKILL between write_file_atomically's write and its rename leaves behind.
    stale = path.parent / f".{path.name}.k1ll3d.tmp"
    stale.write_bytes(data)
    store = RocksStore(tmp_path / "db")
    net = make_net(store, tmp_path / "data")
    assert path.read_bytes() == data
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # the stale one is gone
    path.unlink()
    assert net.service.final_model_path(net.task_id).read_bytes() == data  # also on demand
    net.service.close()
    store.close()


_CHILD = """
import json, sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from storage.rocks import RocksStore
from tests.node.test_restart import make_net, play, script
from tests.node.conftest import spec_dict
spec = spec_dict({uri!r}, {sha!r})
store = RocksStore(Path({db!r}))
net = make_net(store, Path({data!r}))
for k, step in enumerate(script()):
    play(net, spec, k, step)
    print("ack", k, flush=True)
print("done", json.dumps(net.service.get_receipt(net.task_id)), flush=True)
"""


def test_sigkill_at_any_moment_then_restart(tmp_path: Path) -> None:
    uri, sha = write_checkpoint(tmp_path / "ckpt")
    spec = spec_dict(uri, sha)
    reference, reference_store = uninterrupted(spec)
    code = _CHILD.format(repo=str(REPO), uri=uri, sha=sha, db=str(tmp_path / "db"), data=str(tmp_path / "data"))
    rng = random.Random(20240501)
    total = len(script())
    for _ in range(2):
        target = rng.randrange(total)
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("ack") and int(line.split()[1]) >= target:
                break
        # Somewhere inside the next call (or between calls): SIGKILL, no cleanup at all.
        proc.kill()
        proc.wait(timeout=30)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    done = [line for line in result.stdout.splitlines() if line.startswith("done ")]
    assert json.loads(done[0][5:]) == reference.service.get_receipt(reference.task_id)
    store = RocksStore(tmp_path / "db")
    try:
        assert snapshot(store) == snapshot(reference_store)
    finally:
        store.close()
    model = tmp_path / "data" / "models" / "run-1.safetensors"
    assert model.read_bytes() == reference.service.export_final_model(reference.task_id)


@pytest.mark.parametrize("kind", ["memory", "rocks"])
def test_reopen_keeps_genesis_once(tmp_path: Path, kind: str) -> None:
    """The genesis is credited when the store is new and never again."""
    if kind == "memory":
        store = MemoryStore()
        first = make_net(store, None)
        second = make_net(store, None)
        assert second.service._ledger == first.service._ledger
        return
    store = RocksStore(tmp_path / "db")
    first = make_net(store, None)
    minted = first.service._ledger.minted
    store.close()
    store = RocksStore(tmp_path / "db")
    second = make_net(store, None)
    assert second.service._ledger.minted == minted == first.service._ledger.minted
    store.close()


@pytest.mark.parametrize("kind", ["memory", "rocks"])
def test_reopen_refuses_another_genesis_or_chain_id(tmp_path: Path, kind: str) -> None:
    """A store is bound to the genesis and chain id it was created with (ops probe: a first start
    that failed after creating the store fixed its genesis for good, and the corrected config ran
    on the old balances with a warning; a changed chain id was taken silently and every stored
    signature stopped verifying). Both are now refused, nothing written; no genesis configured
    and the same chain id open as before."""
    from dataclasses import replace

    from storage import schema
    from storage.interface import StorageError

    store = MemoryStore() if kind == "memory" else RocksStore(tmp_path / "db")
    config = make_config(None)
    NodeService(config, store, clock=FakeClock()).close()
    assert store.get(schema.CF_META, schema.NODE_CHAIN_ID_KEY) == config.chain_id.to_bytes(32, "big")
    before = snapshot(store)
    richer = replace(config, genesis=((config.genesis[0][0], config.genesis[0][1] + 1), *config.genesis[1:]))
    with pytest.raises(StorageError, match="genesis differs"):
        NodeService(richer, store, clock=FakeClock())
    with pytest.raises(StorageError, match=f"created for chain id {config.chain_id} .* the config says 5"):
        NodeService(replace(config, chain_id=5), store, clock=FakeClock())
    assert snapshot(store) == before
    NodeService(replace(config, genesis=()), store, clock=FakeClock()).close()
    if kind == "rocks":  # what the node writes is on disk
        store.close()
        store = RocksStore(tmp_path / "db")
    # A store from before the chain id was recorded gets it at its first start.
    with store.atomic_batch() as batch:
        batch.delete(schema.CF_META, schema.NODE_CHAIN_ID_KEY)
    chain5 = replace(config, chain_id=5)
    NodeService(chain5, store, clock=FakeClock()).close()
    assert store.get(schema.CF_META, schema.NODE_CHAIN_ID_KEY) == (5).to_bytes(32, "big")
    with pytest.raises(StorageError, match="set `chain_id` to 5"):
        NodeService(config, store, clock=FakeClock())
    # Any chain id a config accepts (below 2**256) is recorded; it had overflowed a u64 (review).
    if kind == "rocks":
        store.close()
    huge = replace(config, chain_id=2**64 + 7)
    fresh = MemoryStore()
    NodeService(huge, fresh, clock=FakeClock()).close()
    assert fresh.get(schema.CF_META, schema.NODE_CHAIN_ID_KEY) == (2**64 + 7).to_bytes(32, "big")
    # The order of the configured genesis accounts does not matter.
    NodeService(replace(huge, genesis=tuple(reversed(huge.genesis))), fresh, clock=FakeClock()).close()


def test_a_genesis_record_without_the_ledger_it_created_is_refused() -> None:
    """A store whose genesis was recorded but whose ledger is gone (a lost column family) must not
    start as a new chain with the genesis credited again: it is refused as damaged."""
    from storage import schema
    from storage.interface import StorageError

    store = MemoryStore()
    config = make_config(None)
    NodeService(config, store, clock=FakeClock()).close()
    with store.atomic_batch() as batch:
        for cf in (schema.CF_ACCOUNTS, schema.CF_LEDGER):
            for key in list(store.keys(cf)):
                batch.delete(cf, key)
    with pytest.raises(StorageError, match="^the genesis record exists but the ledger's supply counters do not$"):
        NodeService(config, store, clock=FakeClock())


@pytest.mark.parametrize("accounts", [2, 3])
def test_a_refused_genesis_is_shown_as_the_store_has_it(accounts: int) -> None:
    """The refusal shows the store's genesis, its first two accounts in full (and "..." only when
    there are more), so the operator can configure the genesis the store was created with."""
    from dataclasses import replace

    from storage.interface import StorageError
    from tenzro_training.addresses import format_address

    genesis = tuple((bytes([0xA0 + i]) * 20, 10**18 + i) for i in range(accounts))
    config = replace(make_config(None), genesis=genesis)
    store = MemoryStore()
    NodeService(config, store, clock=FakeClock()).close()
    first = f"{format_address(genesis[0][0])}={10**18}, {format_address(genesis[1][0])}={10**18 + 1}"
    with pytest.raises(StorageError) as info:
        NodeService(replace(config, genesis=genesis[:1]), store, clock=FakeClock())
    assert str(info.value).startswith(f"the configured genesis differs from the one this store was created with "
                                      f"({accounts} account(s): {first}{', ...' if accounts > 2 else ''}): ")


def _older_store_with_a_submission(tmp_path: Path, checkpoint: tuple[str, str]) -> tuple[RocksStore, Any]:
    """A RocksDB store a node on chain 1337 ran a submission into, then stripped of what stores
    from before the chain id and the liveness stamp were recorded lack."""
    from storage import schema
    from tests.node.test_service import start

    store = RocksStore(tmp_path / "db")
    config = make_config(None)
    clock = FakeClock()
    net = Net(NodeService(config, store, clock=clock), clock)
    start(net, checkpoint)
    net.submit(0, 0, 0)
    net.service.close()
    with store.atomic_batch() as batch:
        batch.delete(schema.CF_META, schema.NODE_CHAIN_ID_KEY)
        batch.delete(schema.CF_META, schema.NODE_ALIVE_KEY)
    return store, config


def test_a_store_with_ledger_entries_or_runs_but_no_genesis_record_is_refused(
    tmp_path: Path, checkpoint: tuple[str, str]
) -> None:
    """Without its genesis record a store that holds balances, or only runs, is damaged: taken as a
    new store, it would be credited the configured genesis on top of what it holds."""
    from storage import schema
    from storage.interface import StorageError

    store, config = _older_store_with_a_submission(tmp_path, checkpoint)
    with store.atomic_batch() as batch:
        batch.delete(schema.CF_META, schema.NODE_GENESIS_KEY)
    refusal = "^the store holds ledger entries or runs but no genesis record: it is damaged$"
    with pytest.raises(StorageError, match=refusal):
        NodeService(config, store, clock=FakeClock())
    with store.atomic_batch() as batch:
        for cf in (schema.CF_ACCOUNTS, schema.CF_LEDGER):
            for key in list(store.keys(cf)):
                batch.delete(cf, key)
    with pytest.raises(StorageError, match=refusal):  # runs alone
        NodeService(config, store, clock=FakeClock())
    store.close()


def test_an_older_store_is_bound_only_to_a_chain_id_its_signatures_verify_under(
    tmp_path: Path, checkpoint: tuple[str, str]
) -> None:
    """The first start on a store from before the chain id was recorded had recorded whatever the
    config said: a forgotten --config on a custom chain broke every receipt of the store for
    good, and the right config was then refused (upgrade probe)."""
    from dataclasses import replace

    from storage import schema
    from storage.interface import StorageError

    store, config = _older_store_with_a_submission(tmp_path, checkpoint)
    with store:
        before = snapshot(store)
        with pytest.raises(StorageError, match="the config says chain id 5, but the signatures this store holds were made "
                                               "under another one .* run-1 round 0 does not verify"):
            NodeService(replace(config, chain_id=5), store, clock=FakeClock())
        assert snapshot(store) == before  # nothing recorded
        NodeService(config, store, clock=FakeClock()).close()
        assert store.get(schema.CF_META, schema.NODE_CHAIN_ID_KEY) == config.chain_id.to_bytes(32, "big")


def test_every_run_of_an_older_store_is_checked_against_the_chain_id(tmp_path: Path, checkpoint: tuple[str, str]) -> None:
    """A chain id changed between two runs of an older store (a misconfigured restart before the
    binding existed): the first submission in key order alone had decided (review)."""
    from dataclasses import replace

    from storage import schema
    from storage.interface import StorageError
    from tenzro_training import auth
    from tenzro_training.node import persistence
    from tests.node.conftest import TRAINERS

    store, config = _older_store_with_a_submission(tmp_path, checkpoint)
    with store:
        run_1 = store.get(schema.CF_TRAINING_RUNS, schema.run_key("run-1"))
        digest = b"\x07" * 32
        msg = auth.SubmitOuterGradient(task_id="run-2", round=0, fragment=0, payload_hash=digest)
        with store.atomic_batch() as batch:  # a second run whose submission was signed on chain 5
            batch.put(schema.CF_TRAINING_RUNS, schema.run_key("run-2"), run_1 or b"")
            batch.put(schema.CF_SUBMISSIONS, schema.submission_key("run-2", 0, 0, TRAINERS[0].address),
                      persistence.encode_submission_record(persistence.SubmissionRecord(digest, TRAINERS[0].sign(msg, chain_id=5))))
        before = snapshot(store)
        with pytest.raises(StorageError, match="run-2 round 0 does not verify under it"):
            NodeService(config, store, clock=FakeClock())
        with pytest.raises(StorageError, match="run-1 round 0 does not verify under it"):
            NodeService(replace(config, chain_id=5), store, clock=FakeClock())
        assert snapshot(store) == before


def test_the_downtime_of_an_upgrade_from_a_store_without_a_liveness_stamp_is_a_pause(
    tmp_path: Path, checkpoint: tuple[str, str]
) -> None:
    """Stores from before the node stamped when it last served: the upgrade's downtime had counted
    against the runs (a posted run failed its enrollment at the upgrade's first tick: upgrade
    probe). The newest run update stands in for the stamp."""
    store, config = _older_store_with_a_submission(tmp_path, checkpoint)
    with store:
        clock = FakeClock(T0 + 10**9)  # far past every deadline of the run
        service = NodeService(config, store, clock=clock)
        events = service.start_clock()
        assert [type(e).__name__ for e in events] == ["DeadlinesExtended"]
        service.tick()
        assert service.get_run("run-1")["status"] == "Training"
        service.close()


def test_a_refused_start_leaves_an_older_store_at_its_version(tmp_path: Path, checkpoint: tuple[str, str]) -> None:
    """Opening marked an upgradable store for this version before the node's checks ran, so a
    start refused for its config left the store unreadable by the version it came from
    (upgrade probe). The node marks it once it has accepted the store, and says so."""
    import logging
    from dataclasses import replace

    from storage import schema
    from storage.interface import StorageError

    store, config = _older_store_with_a_submission(tmp_path, checkpoint)
    with store.atomic_batch() as batch:
        batch.put(schema.CF_META, schema.SCHEMA_VERSION_KEY, schema.encode_schema_version(2))
    store.close()
    with RocksStore(tmp_path / "db", upgrade_schema=False) as store:
        with pytest.raises(StorageError, match="signatures this store holds"):
            NodeService(replace(config, chain_id=5), store, clock=FakeClock())
        assert store.get(schema.CF_META, schema.SCHEMA_VERSION_KEY) == schema.encode_schema_version(2)
    # Offline tools read it read-only (node.run_store): they never mark it either.
    from tenzro_training.node.run_store import load_run

    with RocksStore(tmp_path / "db", read_only=True) as store:
        assert load_run(store, "run-1") is not None
    with RocksStore(tmp_path / "db", upgrade_schema=False) as store:
        assert store.get(schema.CF_META, schema.SCHEMA_VERSION_KEY) == schema.encode_schema_version(2)
    with RocksStore(tmp_path / "db", upgrade_schema=False) as store:
        logger = logging.getLogger("tenzro.node")
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        logger.addHandler(handler)
        try:
            NodeService(config, store, clock=FakeClock()).close()
        finally:
            logger.removeHandler(handler)
        assert store.get(schema.CF_META, schema.SCHEMA_VERSION_KEY) == schema.encode_schema_version(schema.SCHEMA_VERSION)
        assert store.upgrade_schema_version() is None  # once
    assert any(f"store upgraded from schema version 2 to {schema.SCHEMA_VERSION}" in r.getMessage() for r in records)


def test_a_damaged_older_store_refused_at_start_is_not_marked(tmp_path: Path, checkpoint: tuple[str, str]) -> None:
    """The schema mark had come before the checks of the stored finalize records and receipts:
    a damaged older store those refused was left marked for this version, which the old version
    then refused too (review). It now comes after every read."""
    from storage import schema
    from storage.interface import StorageError
    from tests.node.test_service import play_round, start

    store = RocksStore(tmp_path / "db")
    config = make_config(None)
    clock = FakeClock()
    net = Net(NodeService(config, store, clock=clock), clock)
    start(net, checkpoint)
    for r in range(net.service.get_run("run-1")["max_rounds"]):
        play_round(net, r)
    net.service.close()
    with store.atomic_batch() as batch:  # a version-3 store that lost a sealed run's receipt
        batch.put(schema.CF_META, schema.SCHEMA_VERSION_KEY, schema.encode_schema_version(3))
        batch.delete(schema.CF_META, schema.ended_summary_key("run-1"))  # (no version-3 node wrote one)
        batch.delete(schema.CF_META, schema.sealed_record_key("run-1"))
        batch.delete(schema.CF_TRAINING_RECEIPTS, schema.receipt_key("run-1"))
    store.close()
    with RocksStore(tmp_path / "db", upgrade_schema=False) as store:
        with pytest.raises(StorageError, match="the sealed run run-1 has no stored receipt"):
            NodeService(config, store, clock=FakeClock())
        assert store.get(schema.CF_META, schema.SCHEMA_VERSION_KEY) == schema.encode_schema_version(3)


def _post_round_0(store: Any, checkpoint: tuple[str, str]) -> tuple[Net, Any]:
    from tests.node.test_service import start

    config = make_config(None)
    clock = FakeClock()
    net = Net(NodeService(config, store, clock=clock), clock)
    start(net, checkpoint)
    return net, config


def test_a_round_0_snapshot_holds_no_momentum_and_a_version_4_stores_momentum_is_not_read(
    tmp_path: Path, checkpoint: tuple[str, str]
) -> None:
    """Schema 5: a post's snapshot holds the weights alone (the momentum is zero before any round;
    a post wrote 4 bytes of zeros per parameter through the WAL on the service thread). A node
    restarted before round 0's finalize rebuilds the model with zero momentum, and a version-4
    store, which held those zeros, is upgraded without its stored round-0 momentum being read
    (garbage of the right size stands in for it here): round 0 commits the same model as a node
    that never stopped."""
    import torch

    from storage import schema
    from tenzro_training.node.model_state import encode_fragment
    from tests.node.test_service import play_round

    reference, _ = _post_round_0(MemoryStore(), checkpoint)
    expected = play_round(reference, 0)
    store = RocksStore(tmp_path / "db")
    net, config = _post_round_0(store, checkpoint)
    weights = [store.get(schema.CF_MODEL_STATE, schema.model_key("run-1", schema.MODEL_WEIGHTS, f)) for f in range(2)]
    momentum_keys = [schema.model_key("run-1", schema.MODEL_MOMENTUM, f) for f in range(2)]
    assert all(w is not None for w in weights)
    assert [store.get(schema.CF_MODEL_STATE, k) for k in momentum_keys] == [None, None]
    for i in range(3):
        for f in range(2):
            net.submit(i, 0, f)
    net.service.close()
    with store.atomic_batch() as batch:
        batch.put(schema.CF_META, schema.SCHEMA_VERSION_KEY, schema.encode_schema_version(4))
        for key, w in zip(momentum_keys, weights):
            batch.put(schema.CF_MODEL_STATE, key, encode_fragment(torch.full((len(w) // 4,), 7.0)))
    store.close()
    with RocksStore(tmp_path / "db", upgrade_schema=False) as store:
        again = Net(NodeService(config, store, clock=net.clock), net.clock)
        result = again.finalize(0)
        assert again.service.cache_stats()["model_rebuilds"] == 1  # from the stored round-0 snapshot
        assert result["model_hash"] == expected["model_hash"]
        assert again.service.get_run("run-1")["model_hash"] == reference.service.get_run("run-1")["model_hash"]
        assert store.get(schema.CF_META, schema.SCHEMA_VERSION_KEY) == schema.encode_schema_version(schema.SCHEMA_VERSION)
        again.service.close()
