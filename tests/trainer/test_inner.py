"""Tests for tenzro_training.trainer.inner: determinism, outer gradients, payloads and a real
learning check (a few DiLoCo rounds on three shards of the real corpus lower validation loss)."""

from __future__ import annotations

import dataclasses
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
from tenzro_training.trainer.model import PatchTransformerConfig, build_model, create_init_checkpoint, load_state
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
     {"betas": (0.9,)}, {"betas": (0.9, 1.0)}, {"betas": (-0.1, 0.9)}, {"seed": -1}, {"seed": 2**64},
     {"grad_clip": 0.0}, {"grad_clip": float("inf")}],
)
def test_invalid_inner_config(changes: dict) -> None:
    with pytest.raises(TrainerError):
        InnerConfig(**changes)


def test_inner_config_accepts_the_edges_of_each_range() -> None:
    """The edges are valid settings (no decay, zero momentum, the largest u64 seed, which
    compute_inner_seed packs): refusing them would turn a legal trainer config into an error.
    betas given as a list (from JSON) are stored as a tuple of floats, which AdamW and the
    config's equality and hash need."""
    cfg = InnerConfig(weight_decay=0.0, betas=[0, 0], seed=2**64 - 1)
    assert cfg.weight_decay == 0.0 and cfg.seed == 2**64 - 1
    assert cfg.betas == (0.0, 0.0) and type(cfg.betas) is tuple and all(type(b) is float for b in cfg.betas)
    assert InnerConfig(betas=[0.5, 0.75]) == InnerConfig(betas=(0.5, 0.75))


def test_inner_config_from_spec_overrides_win() -> None:
    """A trainer's command-line settings override what the spec says (e.g. a smaller H to
    test a task); the spec's values are only defaults."""
    doc = json.loads((Path(tenzro_training.__file__).parent / "data" / "timesfm-200m-task.json").read_text())
    doc["architecture"]["metadata"]["inner_lr"] = 0.001
    cfg = InnerConfig.from_spec(TrainingTaskSpec.from_dict(doc), inner_steps=3, lr=0.01)
    assert (cfg.inner_steps, cfg.lr) == (3, 0.01)


def test_inner_seed_is_pinned() -> None:
    """Every trainer (any implementation, any version) must derive the same batch stream for a
    (seed, round, shard) or rounds are not reproducible: the derivation is part of the protocol
    (SHA-256 of domain || big-endian u64s, first 8 bytes, top bit cleared)."""
    assert compute_inner_seed(0, 0, 0) == 842345640046904565
    assert compute_inner_seed(3, 2, 1) == 3663124990962503072
    assert compute_inner_seed(2**64 - 1, 2**64 - 1, 2**64 - 1) == 8080654301495012771


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


def _reference_inner_loop(init: dict, cfg: InnerConfig, shard: Shard, round: int) -> tuple[list[float], dict]:
    """The inner loop as documented, written out: batches drawn with replacement by a CPU
    generator seeded with compute_inner_seed, then zero_grad, loss, backward, optional clip and
    one AdamW step, H times."""
    model = build_model(MODEL)
    load_state(model, init)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(compute_inner_seed(cfg.seed, round, shard.index))
    losses = []
    for _ in range(cfg.inner_steps):
        batch = shard.windows[torch.randint(len(shard), (cfg.batch_size,), generator=gen)]
        opt.zero_grad(set_to_none=True)
        loss = model.loss(batch)
        losses.append(float(loss.detach()))
        loss.backward()
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("grad_clip", [0.05, None])
def test_inner_loop_is_plain_clipped_adamw_on_the_seeded_batches(
    init: dict, shards: list[Shard], grad_clip: float | None
) -> None:
    """Every trainer must compute the same round from the same inputs, and determinism alone
    does not say it is the right computation: the result must be, bit for bit, the documented
    loop (a missing zero_grad, clip or seed would still be deterministic)."""
    cfg = dataclasses.replace(FAST, grad_clip=grad_clip)
    losses, state = _reference_inner_loop(init, cfg, shards[1], 4)
    res = run_inner_loop(init, cfg, MODEL, shards[1], 4, 1)
    assert list(res.losses) == losses
    assert compute_model_hash(res.state) == compute_model_hash(state)


def test_inner_loop_seed_depends_on_the_shard_index(init: dict, shards: list[Shard]) -> None:
    """The batch stream is per (round, shard index): two trainers dealt identical windows under
    different indices must still draw different batches."""
    a = run_inner_loop(init, FAST, MODEL, shards[0], 0, 0)
    relabelled = dataclasses.replace(shards[0], index=1)
    b = run_inner_loop(init, FAST, MODEL, relabelled, 0, 1)
    assert a.losses != b.losses


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


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="checks the error on a machine without MPS")
def test_invalid_mps_device_without_mps() -> None:
    """A trainer started with --device mps on a machine without it must fail before it
    enrolls, not in its first round."""
    with pytest.raises(TrainerError, match="MPS is not available"):
        resolve_device("mps")


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
    # Dropout masks come from the round's seed, not from whatever the caller's RNG holds.
    with torch.random.fork_rng():
        torch.manual_seed(1)
        a = run_inner_loop(init, FAST, cfg, shards[0], 0, 0)
        torch.manual_seed(2)
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


def test_inner_loop_round_and_shard_size_edges(init: dict, shards: list[Shard]) -> None:
    """Rounds are u64 (the seed packs them): the largest trains, 2**64 and a bool are refused.
    A shard of one window is small but trainable; an empty one can draw no batch."""
    one = dataclasses.replace(shards[0], refs=shards[0].refs[:1], windows=shards[0].windows[:1])
    assert len(run_inner_loop(init, FAST, MODEL, one, 2**64 - 1, 0).losses) == FAST.inner_steps
    for bad in (2**64, True):
        with pytest.raises(TrainerError, match="round must be"):
            run_inner_loop(init, FAST, MODEL, one, bad, 0)  # type: ignore[arg-type]
    empty = dataclasses.replace(shards[0], refs=(), windows=shards[0].windows[:0])
    with pytest.raises(TrainerError, match="no windows"):
        run_inner_loop(init, FAST, MODEL, empty, 0, 0)


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
    if dtype == "float32":  # the default: full precision unless the task says otherwise
        assert make_payloads("task-1", 5, layouts, grads) == payloads


def test_payloads_with_feedback_are_topk(init: dict, shards: list[Shard]) -> None:
    """A task with the topk encoding: each payload must say "topk" and carry only the largest
    values of the outer gradient, or the node refuses it or aggregates the wrong thing."""
    from tenzro_training.compression import ErrorFeedback, PayloadEncoding

    layouts = compute_fragment_layouts(init, F)
    grads = compute_outer_gradients(init, run_inner_loop(init, FAST, MODEL, shards[0], 5, 0).state, layouts)
    encoding = PayloadEncoding("topk", 1000)
    payloads = make_payloads("task-1", 5, layouts, grads, feedback=ErrorFeedback(layouts, encoding))
    for lay, grad, data in zip(layouts, grads, payloads):
        expected = PayloadHeader("task-1", 5, lay.index, "topk", lay.layout_hash())
        decoded = decode_payload(data, lay, expected=expected, max_bytes=len(data), topk_k=encoding.kept(lay.numel))
        assert decoded.header.encoding == "topk"
        dense = decoded.flat_fp32()
        sent = dense != 0
        assert 0 < int(sent.sum()) < lay.numel and torch.equal(dense[sent], grad[sent])
        assert float(grad[~sent].abs().max()) <= float(grad[sent].abs().min())


def test_payloads_with_q8_feedback_are_q8(init: dict, shards: list[Shard]) -> None:
    """A task with the q8 encoding: each payload must say "q8", in the task's block size, and
    decode to the outer gradient within half a level of each block (the first round, so no
    residual yet), or the node refuses it or aggregates the wrong thing."""
    from tenzro_training.compression import ErrorFeedback, PayloadEncoding

    layouts = compute_fragment_layouts(init, F)
    grads = compute_outer_gradients(init, run_inner_loop(init, FAST, MODEL, shards[0], 5, 0).state, layouts)
    encoding = PayloadEncoding("q8", block_size=64)
    feedback = ErrorFeedback(layouts, encoding)
    payloads = make_payloads("task-1", 5, layouts, grads, feedback=feedback)
    for lay, grad, data in zip(layouts, grads, payloads):
        expected = PayloadHeader("task-1", 5, lay.index, "q8", lay.layout_hash())
        decoded = decode_payload(data, lay, expected=expected, max_bytes=len(data), **encoding.decode_options(lay))
        assert decoded.header.encoding == "q8"
        dense = decoded.flat_fp32()
        blocks = -(-lay.numel // 64)
        assert len(data) < 8 + 4096 + lay.numel + 4 * blocks  # a byte per value, plus the scales and header
        step = torch.nn.functional.pad(grad, (0, blocks * 64 - lay.numel)).view(blocks, 64).abs().amax(dim=1) / 127
        assert bool(((dense - grad).abs() <= step.repeat_interleave(64)[: lay.numel] * 0.5001).all())
        assert torch.equal(feedback._residual[lay.index], grad - dense)  # type: ignore[arg-type]


def test_evaluate_is_in_eval_mode(init: dict) -> None:
    """Validation loss must not depend on dropout (a training-only regulariser): with dropout
    configured it equals the loss of the same weights without it."""
    val = validation_batch(load_corpus(), MODEL.context_len, MODEL.horizon)[:8]
    cfg = PatchTransformerConfig(**{**{f: getattr(MODEL, f) for f in MODEL.__slots__}, "dropout": 0.5})
    assert evaluate(init, cfg, val) == evaluate(init, MODEL, val)


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
