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
