"""node.model_cache: the caches' budgets and bookkeeping, driven directly (the finalize path that
uses them, and the rebuild, are in test_service.py)."""

from __future__ import annotations

import types

import pytest
import torch

from storage import schema
from storage.interface import StorageError
from storage.memory import MemoryStore
from tenzro_training.node.model_cache import ModelCache, PayloadCache
from tenzro_training.run_state import RunStatus
from tests.node.conftest import make_config

TASK = "run-1"


def test_a_payload_that_fills_the_budget_exactly_is_held(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cache = PayloadCache(MemoryStore(), make_config(tmp_path, payload_cache_bytes=10))
    cache.put(TASK, b"a" * 32, b"x" * 6)
    cache.put(TASK, b"b" * 32, b"y" * 4)  # 6 + 4 = the budget: held
    assert cache.get(TASK, b"b" * 32) == b"y" * 4 and cache.nbytes == 10
    cache.put(TASK, b"c" * 32, b"z")  # one byte over: not held
    assert cache.get(TASK, b"c" * 32) is None and cache.nbytes == 10


def test_discarding_a_run_s_last_payloads_forgets_the_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cache = PayloadCache(MemoryStore(), make_config(tmp_path, payload_cache_bytes=100))
    cache.put(TASK, b"a" * 32, b"x" * 6)
    cache.put("run-2", b"b" * 32, b"y" * 4)
    cache.discard(TASK, [b"a" * 32, b"n" * 32])
    assert len(cache) == 1 and cache.nbytes == 4
    cache.discard("run-2", [b"b" * 32])
    assert len(cache) == 0 and cache.nbytes == 0


def test_loading_a_payload_neither_held_nor_stored_fails(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = MemoryStore()
    cache = PayloadCache(store, make_config(tmp_path, payload_cache_bytes=0))
    digest = b"d" * 32
    with pytest.raises(StorageError, match="missing from the store"):
        cache.load(TASK, digest)
    with store.atomic_batch() as batch:
        batch.put(schema.CF_SUBMISSIONS, schema.payload_key(TASK, digest), b"stored")
    assert cache.load(TASK, digest) == b"stored"


def _state(n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return [torch.zeros(n)], [torch.zeros(n)]


def _model_cache(tmp_path, **config) -> ModelCache:  # type: ignore[no-untyped-def]
    store = MemoryStore()
    cfg = make_config(tmp_path, **config)
    return ModelCache(store, cfg, PayloadCache(store, cfg), None, None)  # type: ignore[arg-type]


def _run(task_id: str, status: RunStatus = RunStatus.TRAINING) -> object:
    return types.SimpleNamespace(task_id=task_id, status=status)


def test_the_model_cache_counts_a_run_remembered_again_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cache = _model_cache(tmp_path, model_cache_runs=4)
    cache.remember(_run(TASK), _state(8))  # type: ignore[arg-type]
    cache.remember(_run(TASK), _state(4))  # type: ignore[arg-type]
    assert list(cache) == [TASK] and cache.nbytes == 2 * 4 * 4
    assert cache.forget(TASK) is not None and cache.nbytes == 0


def test_the_model_cache_keeps_no_ended_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cache = _model_cache(tmp_path, model_cache_runs=4)
    for status in (RunStatus.SEALED, RunStatus.CANCELLED, RunStatus.FAILED):
        cache.remember(_run(TASK, status), _state(8))  # type: ignore[arg-type]
    assert len(cache) == 0 and cache.nbytes == 0
    cache.remember(_run(TASK), _state(8))  # type: ignore[arg-type]
    assert list(cache) == [TASK]


def test_the_model_cache_holds_at_most_model_cache_runs_least_recent_out(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cache = _model_cache(tmp_path, model_cache_runs=2, model_cache_bytes=1 << 30)
    for task_id in ("a", "b", "c"):
        cache.remember(_run(task_id), _state(8))  # type: ignore[arg-type]
    assert list(cache) == ["b", "c"] and cache.nbytes == 2 * 2 * 8 * 4
    cache.remember(_run("b"), _state(8))  # type: ignore[arg-type]  # finalized again: most recent
    cache.remember(_run("d"), _state(8))  # type: ignore[arg-type]
    assert list(cache) == ["b", "d"]


def test_a_rebuild_without_a_usable_snapshot_record_is_a_damaged_store(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tenzro_training.node.model_state import encode_round_count

    cache = _model_cache(tmp_path)
    run = types.SimpleNamespace(task_id=TASK, records=())
    with pytest.raises(StorageError, match="model snapshot record of run-1 is missing"):
        cache.rebuild(run, None)  # type: ignore[arg-type]
    with cache._store.atomic_batch() as batch:
        batch.put(schema.CF_META, schema.model_snapshot_key(TASK), encode_round_count(3))
    with pytest.raises(StorageError, match="is of round 3, after its last committed round"):
        cache.rebuild(run, None)  # type: ignore[arg-type]
    assert cache.rebuilds == 0


def test_a_rebuild_that_needs_pruned_payloads_is_refused_before_reading_weights(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tenzro_training.node.model_state import encode_round_count

    cache = _model_cache(tmp_path)
    with cache._store.atomic_batch() as batch:
        batch.put(schema.CF_META, schema.model_snapshot_key(TASK), encode_round_count(0))
        batch.put(schema.CF_META, schema.payloads_pruned_key(TASK), encode_round_count(1))
    run = types.SimpleNamespace(task_id=TASK, records=(object(),))  # round 0 would have to be replayed
    with pytest.raises(StorageError, match=r"were pruned \(prune_payloads\)"):
        cache.rebuild(run, None)  # type: ignore[arg-type]
