"""Tests for tenzro_training.trainer.inner: determinism, outer gradients, payloads and a real
learning check (a few DiLoCo rounds on three shards of the real corpus lower validation loss)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import tenzro_training
from tenzro_training.fragments import compute_fragment_layouts, compute_model_hash, gather_fragment
from tenzro_training.payload import PayloadHeader, PayloadLayoutMismatch, decode_payload
from tenzro_training.spec import TrainingTaskSpec
from tenzro_training.trainer import TrainerError
from tenzro_training.trainer.data import Shard, load_corpus, validation_batch
from tenzro_training.trainer.inner import (
    PAYLOAD_DTYPES,
    InnerConfig,
    InnerLoopDiverged,
    apply_global_fragments,
    compute_inner_seed,
    compute_outer_gradients,
    evaluate,
    make_payloads,
    resolve_device,
    run_inner_loop,
)
from tenzro_training.trainer.model import PatchTransformerConfig, create_init_checkpoint
from tests.trainer.conftest import TINY_MODEL

MODEL = TINY_MODEL
FAST = InnerConfig(inner_steps=5, lr=1e-3, batch_size=16, seed=3)
F = 4


def bits(t: torch.Tensor) -> np.ndarray:
    return t.numpy().view(np.uint32)


# --- config ---------------------------------------------------------------------------------


def test_inner_config_defaults_are_phase1() -> None:
    cfg = InnerConfig()
    assert (cfg.inner_steps, cfg.lr) == (24, 3e-4)
    assert cfg.betas == (0.9, 0.95) and cfg.grad_clip == 1.0


def test_inner_config_from_spec() -> None:
    doc = json.loads((Path(tenzro_training.__file__).parent / "data" / "timesfm-200m-task.json").read_text())
    spec = TrainingTaskSpec.from_dict(doc)
    assert InnerConfig.from_spec(spec).inner_steps == 24 and InnerConfig.from_spec(spec).lr == 3e-4
    doc["architecture"]["metadata"]["inner_lr"] = 0.001
    doc["inner_steps"] = 7
    cfg = InnerConfig.from_spec(TrainingTaskSpec.from_dict(doc), batch_size=8)
    assert (cfg.inner_steps, cfg.lr, cfg.batch_size) == (7, 0.001, 8)


@pytest.mark.parametrize(
    "changes",
    [{"inner_steps": 0}, {"batch_size": True}, {"lr": 0.0}, {"lr": float("nan")}, {"weight_decay": -1.0},
     {"betas": (0.9,)}, {"betas": (0.9, 1.0)}, {"seed": -1}, {"grad_clip": 0.0}, {"grad_clip": float("inf")}],
)
def test_invalid_inner_config(changes: dict) -> None:
    with pytest.raises(TrainerError):
        InnerConfig(**changes)


def test_inner_seed_separates_rounds_and_shards() -> None:
    seeds = {compute_inner_seed(0, r, s) for r in range(4) for s in range(4)}
    assert len(seeds) == 16 and all(0 <= x < 2**63 for x in seeds)
    assert compute_inner_seed(1, 0, 0) != compute_inner_seed(0, 0, 0)


# --- the inner loop -------------------------------------------------------------------------


def test_inner_loop_stops_between_steps_when_asked(init: dict, shards: list[Shard]) -> None:
    """A trainer told to stop (SIGTERM) finished the whole inner loop first (trainer restart
    probe); should_stop is asked before every step."""
    from tenzro_training.trainer.inner import InnerLoopStopped

    asked: list[int] = []

    def should_stop() -> bool:
        asked.append(1)
        return len(asked) > 2

    with pytest.raises(InnerLoopStopped, match=f"before inner step 2 of {FAST.inner_steps}"):
        run_inner_loop(init, FAST, MODEL, shards[1], 2, 1, should_stop=should_stop)
    assert len(asked) == 3
    never = run_inner_loop(init, FAST, MODEL, shards[1], 2, 1, should_stop=lambda: False)
    assert never.losses == run_inner_loop(init, FAST, MODEL, shards[1], 2, 1).losses


def test_inner_loop_is_deterministic(init: dict, shards: list[Shard]) -> None:
    layouts = compute_fragment_layouts(init, F)
    rng_before = torch.get_rng_state()
    snapshot = {k: v.clone() for k, v in init.items()}
    a = run_inner_loop(init, FAST, MODEL, shards[1], 2, 1)
    b = run_inner_loop(init, FAST, MODEL, shards[1], 2, 1)
    ga, gb = compute_outer_gradients(init, a.state, layouts), compute_outer_gradients(init, b.state, layouts)
    assert all(np.array_equal(bits(x), bits(y)) for x, y in zip(ga, gb))
    assert a.losses == b.losses and len(a.losses) == FAST.inner_steps
    assert a.train_loss == sum(a.losses) / FAST.inner_steps
    # The caller's RNG and the global weights are untouched.
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert all(torch.equal(init[k], snapshot[k]) for k in init)
    # Another round or another shard trains on other batches.
    other_round = run_inner_loop(init, FAST, MODEL, shards[1], 3, 1)
    other_shard = run_inner_loop(init, FAST, MODEL, shards[2], 2, 2)
    h = compute_model_hash(a.state)
    assert compute_model_hash(other_round.state) != h and compute_model_hash(other_shard.state) != h


def test_inner_loop_on_an_explicit_cpu_device_is_the_same_bits(init: dict, shards: list[Shard]) -> None:
    default = run_inner_loop(init, FAST, MODEL, shards[0], 1, 0)
    for device in ("cpu", "CPU", torch.device("cpu"), "auto" if not torch.cuda.is_available() else "cpu"):
        res = run_inner_loop(init, FAST, MODEL, shards[0], 1, 0, device=device)
        assert res.losses == default.losses
        assert compute_model_hash(res.state) == compute_model_hash(default.state)
        assert all(t.device.type == "cpu" for t in res.state.values())
    val = validation_batch(load_corpus(), MODEL.context_len, MODEL.horizon)[:8]
    assert evaluate(default.state, MODEL, val, device="cpu") == evaluate(default.state, MODEL, val)


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" Cpu ") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto") in (torch.device("cpu"), torch.device("mps"))


@pytest.mark.parametrize("name", ["gpu", "", "cuda:x", "meta", "xla:0", 7])
def test_invalid_device_names(name: object) -> None:
    with pytest.raises(TrainerError, match="device"):
        resolve_device(name)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_invalid_cuda_device_without_cuda(init: dict, shards: list[Shard]) -> None:
    for name in ("cuda", "cuda:0", "CUDA:1"):
        with pytest.raises(TrainerError, match="no CUDA device"):
            resolve_device(name)
    with pytest.raises(TrainerError, match="no CUDA device"):
        run_inner_loop(init, FAST, MODEL, shards[0], 0, 0, device="cuda")


def test_auto_prefers_cuda_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(TrainerError, match="only 2 CUDA device"):
        resolve_device("cuda:2")


def test_inner_loop_with_dropout_is_deterministic(init: dict, shards: list[Shard]) -> None:
    cfg = PatchTransformerConfig(**{**{f: getattr(MODEL, f) for f in MODEL.__slots__}, "dropout": 0.2})
    a = run_inner_loop(init, FAST, cfg, shards[0], 0, 0)
    b = run_inner_loop(init, FAST, cfg, shards[0], 0, 0)
    assert compute_model_hash(a.state) == compute_model_hash(b.state)
    assert compute_model_hash(a.state) != compute_model_hash(run_inner_loop(init, FAST, MODEL, shards[0], 0, 0).state)


def test_outer_gradient_is_start_minus_end_exactly(init: dict, shards: list[Shard]) -> None:
    layouts = compute_fragment_layouts(init, F)
    res = run_inner_loop(init, FAST, MODEL, shards[0], 0, 0)
    grads = compute_outer_gradients(init, res.state, layouts)
    assert [g.numel() for g in grads] == [lay.numel for lay in layouts]
    start = np.concatenate([init[k].numpy().reshape(-1) for k in sorted(init)])
    end = np.concatenate([res.state[k].numpy().reshape(-1) for k in sorted(init)])
    want = np.subtract(start, end, dtype=np.float32)
    got = torch.cat(grads).numpy()
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.abs(got).max() > 0  # the weights did move


def test_outer_gradient_from_bf16_global(init: dict, shards: list[Shard]) -> None:
    start = {k: v.to(torch.bfloat16) for k, v in init.items()}
    layouts = compute_fragment_layouts(start, F)
    res = run_inner_loop(start, FAST, MODEL, shards[0], 0, 0)
    grads = compute_outer_gradients(start, res.state, layouts)
    want = torch.cat([start[k].float().reshape(-1) - res.state[k].reshape(-1) for k in sorted(start)])
    assert torch.equal(torch.cat(grads), want)


def test_optimizer_state_carries_over(init: dict, shards: list[Shard]) -> None:
    first = run_inner_loop(init, FAST, MODEL, shards[0], 0, 0)
    fresh = run_inner_loop(first.state, FAST, MODEL, shards[0], 1, 0)
    carried = run_inner_loop(first.state, FAST, MODEL, shards[0], 1, 0, optimizer_state=first.optimizer_state)
    assert compute_model_hash(carried.state) != compute_model_hash(fresh.state)
    steps = [float(s["step"]) for s in carried.optimizer_state["state"].values()]
    assert steps and all(x == 2 * FAST.inner_steps for x in steps)
    # The given state is copied, not updated in place: reusing it gives the same result.
    assert all(float(s["step"]) == FAST.inner_steps for s in first.optimizer_state["state"].values())
    again = run_inner_loop(first.state, FAST, MODEL, shards[0], 1, 0, optimizer_state=first.optimizer_state)
    assert compute_model_hash(again.state) == compute_model_hash(carried.state)


def test_a_taken_optimizer_state_is_used_without_a_copy_and_gives_the_same_bits(init: dict, shards: list[Shard]) -> None:
    """``take_optimizer_state``: the trainer process hands each round's moments to the next
    without a second copy on the device; the result must be the copying call's, bit for bit."""
    first = run_inner_loop(init, FAST, MODEL, shards[0], 0, 0)
    copied = run_inner_loop(first.state, FAST, MODEL, shards[0], 1, 0, optimizer_state=first.optimizer_state)
    given = first.optimizer_state["state"]
    moments = {i: s["exp_avg"] for i, s in given.items()}
    before = {i: m.clone() for i, m in moments.items()}
    taken = run_inner_loop(first.state, FAST, MODEL, shards[0], 1, 0, optimizer_state=first.optimizer_state,
                           take_optimizer_state=True)
    assert compute_model_hash(taken.state) == compute_model_hash(copied.state)
    # The very tensors given are the result's, updated in place (no copy was made).
    assert all(taken.optimizer_state["state"][i]["exp_avg"] is m for i, m in moments.items())
    assert any(not torch.equal(m, before[i]) for i, m in moments.items())


def test_invalid_inner_loop_inputs(init: dict, shards: list[Shard]) -> None:
    with pytest.raises(TrainerError):
        run_inner_loop(init, FAST, MODEL, shards[0], 0, 1)  # index differs from the shard's
    with pytest.raises(TrainerError):
        run_inner_loop(init, FAST, MODEL, shards[0], -1, 0)
    with pytest.raises(TrainerError):
        run_inner_loop({k: v for k, v in init.items() if k != "head.bias"}, FAST, MODEL, shards[0], 0, 0)


def test_invalid_diverged_loss_raises(init: dict, shards: list[Shard]) -> None:
    poisoned = dict(init) | {"head.bias": torch.full_like(init["head.bias"], float("nan"))}
    with pytest.raises(InnerLoopDiverged) as info:
        run_inner_loop(poisoned, FAST, MODEL, shards[0], 0, 0)
    assert info.value.step == 0


# --- payloads and global fragments ----------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_payloads_decode_against_the_layouts(init: dict, shards: list[Shard], dtype: str) -> None:
    layouts = compute_fragment_layouts(init, F)
    grads = compute_outer_gradients(init, run_inner_loop(init, FAST, MODEL, shards[0], 5, 0).state, layouts)
    payloads = make_payloads("task-1", 5, layouts, grads, dtype)
    assert len(payloads) == F
    for lay, grad, data in zip(layouts, grads, payloads):
        expected = PayloadHeader("task-1", 5, lay.index, "raw", lay.layout_hash())
        decoded = decode_payload(data, lay, expected=expected, max_bytes=len(data))
        assert decoded.dtype == dtype
        assert torch.equal(decoded.flat_fp32(), grad.to(getattr(torch, dtype)).float())
    with pytest.raises(PayloadLayoutMismatch):
        decode_payload(payloads[0], layouts[1], max_bytes=10**7)


def test_payload_dtypes_map_spec_dtypes() -> None:
    assert PAYLOAD_DTYPES == {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def test_invalid_make_payloads_lengths(init: dict) -> None:
    layouts = compute_fragment_layouts(init, F)
    with pytest.raises(TrainerError):
        make_payloads("t", 0, layouts, [torch.zeros(lay.numel) for lay in layouts[:-1]])


def test_apply_global_fragments_round_trip(init: dict) -> None:
    layouts = compute_fragment_layouts(init, F)
    target = create_init_checkpoint(MODEL, 9)
    state = {k: v.clone() for k, v in init.items()}
    apply_global_fragments(state, layouts, [gather_fragment(target, lay) for lay in layouts])
    assert compute_model_hash(state) == compute_model_hash(target)


def test_invalid_apply_global_fragments(init: dict) -> None:
    layouts = compute_fragment_layouts(init, F)
    frags = [gather_fragment(init, lay) for lay in layouts]
    state = {k: v.clone() for k, v in init.items()}
    with pytest.raises(TrainerError):
        apply_global_fragments(state, layouts, frags[:-1])
    with pytest.raises(TrainerError):
        apply_global_fragments(state, layouts, frags[:-1] + [torch.zeros(3)])
    with pytest.raises(TrainerError):
        apply_global_fragments(state, layouts[:1] * F, frags)
    assert compute_model_hash(state) == compute_model_hash(init)  # nothing written on failure


# --- learning -------------------------------------------------------------------------------


def test_diloco_rounds_reduce_validation_loss(init: dict, shards: list[Shard]) -> None:
    """Three rounds of: H inner steps on each of 3 shards, plain mean of the outer gradients,
    applied with outer lr 1 (global <- global - mean). Validation MSE must fall by >= 30%."""
    val = validation_batch(load_corpus(), MODEL.context_len, MODEL.horizon)
    cfg = InnerConfig(inner_steps=16, lr=1e-3, batch_size=32, seed=0)
    layouts = compute_fragment_layouts(init, F)
    state = {k: v.clone() for k, v in init.items()}
    before = evaluate(state, MODEL, val)
    for rnd in range(3):
        grads = [compute_outer_gradients(state, run_inner_loop(state, cfg, MODEL, s, rnd, s.index).state, layouts)
                 for s in shards]
        mean = [torch.stack([g[i] for g in grads]).mean(0) for i in range(F)]
        new = [gather_fragment(state, lay) - m for lay, m in zip(layouts, mean)]
        apply_global_fragments(state, layouts, new)
    after = evaluate(state, MODEL, val)
    assert np.isfinite(before) and before > 2.0  # an untrained model forecasts ~0 in normalised units
    assert after < 0.7 * before, (before, after)
