"""The inner loop on a CUDA device: what a GPU trainer computes is what the node can take.

These run only where torch sees a CUDA device (CI's machines have none; `docs/trainer.md`
"GPU check" says how to run them on a GPU machine). Bits are not compared with the CPU: cuBLAS
and the backward pass's atomics order float sums differently, which the protocol allows (the node
aggregates what it is given). What must hold is that a GPU trainer trains the same problem as a
CPU one (same batches, close losses and outer gradients), hands back CPU fp32 state, leaves the
caller's RNG and weights alone, keeps its AdamW moments on the device across rounds (handed over
without a second copy when asked), and produces payloads the node decodes to the same bits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tenzro_training.fragments import compute_fragment_layouts
from tenzro_training.compression import ErrorFeedback, PayloadEncoding
from tenzro_training.payload import ENCODING_RAW, ENCODING_TOPK, PayloadHeader, decode_payload
from tenzro_training.trainer import TrainerError
from tenzro_training.trainer.data import Shard, load_corpus, validation_batch
from tenzro_training.trainer.inner import (
    InnerConfig,
    InnerLoopDiverged,
    compute_outer_gradients,
    evaluate,
    make_payloads,
    resolve_device,
    run_inner_loop,
)
from tests.trainer.conftest import TINY_MODEL

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (docs/trainer.md, GPU check)"),
]

MODEL = TINY_MODEL
CFG = InnerConfig(inner_steps=8, lr=1e-3, batch_size=16, seed=5)
F = 3


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0))


def test_auto_picks_the_cuda_device_and_bad_indices_are_refused() -> None:
    assert resolve_device("auto").type == "cuda"
    assert resolve_device("CUDA") == torch.device("cuda", torch.cuda.current_device())
    with pytest.raises(TrainerError, match="CUDA device"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


def test_a_cuda_round_trains_what_a_cpu_round_trains(init: dict, shards: list[Shard]) -> None:
    """Same batches (drawn on the CPU generator) and the same start: the losses and outer
    gradients of a GPU trainer are the CPU trainer's up to float summation order."""
    layouts = compute_fragment_layouts(init, F)
    cpu = run_inner_loop(init, CFG, MODEL, shards[1], 2, 1, device="cpu")
    gpu = run_inner_loop(init, CFG, MODEL, shards[1], 2, 1, device="cuda")
    assert len(gpu.losses) == CFG.inner_steps
    np.testing.assert_allclose(gpu.losses, cpu.losses, rtol=1e-3)
    for g_cpu, g_gpu in zip(compute_outer_gradients(init, cpu.state, layouts),
                            compute_outer_gradients(init, gpu.state, layouts)):
        assert g_gpu.device.type == "cpu" and g_gpu.dtype == torch.float32
        assert _cosine(g_cpu, g_gpu) > 0.999
        assert float((g_cpu - g_gpu).norm() / g_cpu.norm()) < 0.05
    # Another shard is another problem: the comparison above can fail.
    other = run_inner_loop(init, CFG, MODEL, shards[2], 2, 2, device="cuda")
    assert not np.allclose(other.losses, cpu.losses, rtol=1e-3)


def test_cuda_results_are_cpu_fp32_and_the_callers_state_is_untouched(init: dict, shards: list[Shard]) -> None:
    snapshot = {k: v.clone() for k, v in init.items()}
    cpu_rng, cuda_rng = torch.get_rng_state(), torch.cuda.get_rng_state()
    res = run_inner_loop(init, CFG, MODEL, shards[0], 0, 0, device="cuda")
    assert set(res.state) == set(init)
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in res.state.values())
    assert all(torch.equal(init[k], snapshot[k]) for k in init)
    assert torch.equal(torch.get_rng_state(), cpu_rng) and torch.equal(torch.cuda.get_rng_state(), cuda_rng)
    # The moments stay on the device, ready for the next round there.
    moments = [v for s in res.optimizer_state["state"].values() for k, v in s.items() if k != "step"]
    assert moments and all(t.device.type == "cuda" for t in moments)


def test_cuda_moments_carry_into_the_next_round_and_stay_the_callers(init: dict, shards: list[Shard]) -> None:
    first = run_inner_loop(init, CFG, MODEL, shards[0], 0, 0, device="cuda")
    kept = {i: {k: v.clone() for k, v in s.items()} for i, s in first.optimizer_state["state"].items()}
    fresh = run_inner_loop(first.state, CFG, MODEL, shards[0], 1, 0, device="cuda")
    carried = run_inner_loop(first.state, CFG, MODEL, shards[0], 1, 0, device="cuda",
                             optimizer_state=first.optimizer_state)
    # The first step of `carried` is taken with warm moments, so its weights move differently.
    assert fresh.losses[0] == pytest.approx(carried.losses[0], rel=1e-5)
    assert any(not torch.allclose(fresh.state[k], carried.state[k]) for k in fresh.state)
    for i, s in first.optimizer_state["state"].items():  # the caller's state was copied, not updated
        assert all(torch.equal(v, kept[i][k]) for k, v in s.items())
    # The same warm start on the CPU trains the same problem.
    cpu_state = {i: {k: v.cpu() for k, v in s.items()} for i, s in first.optimizer_state["state"].items()}
    on_cpu = run_inner_loop(first.state, CFG, MODEL, shards[0], 1, 0, device="cpu",
                            optimizer_state={**first.optimizer_state, "state": cpu_state})
    np.testing.assert_allclose(carried.losses, on_cpu.losses, rtol=1e-3)


def test_taken_cuda_moments_are_updated_in_place_and_hold_one_copy_on_the_device(init: dict,
                                                                                  shards: list[Shard]) -> None:
    """``take_optimizer_state`` (the trainer's ``--carry-optimizer-state``) hands the moments
    over: the next round updates those very tensors on the device and never holds a second set,
    while training exactly what the copying call trains."""
    first = run_inner_loop(init, CFG, MODEL, shards[0], 0, 0, device="cuda")
    moments = [v for s in first.optimizer_state["state"].values() for k, v in s.items() if k != "step"]
    moment_bytes = sum(t.untyped_storage().nbytes() for t in moments)
    ptrs = sorted(t.data_ptr() for t in moments)

    def peak_of(**kwargs: object) -> tuple[int, object]:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        res = run_inner_loop(first.state, CFG, MODEL, shards[0], 1, 0, device="cuda", **kwargs)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, res

    copied_peak, copied = peak_of(optimizer_state=first.optimizer_state)
    taken_peak, taken = peak_of(optimizer_state=first.optimizer_state, take_optimizer_state=True)
    after = [v for s in taken.optimizer_state["state"].values() for k, v in s.items() if k != "step"]
    assert sorted(t.data_ptr() for t in after) == ptrs  # the same storage, updated in place
    assert all(float(s["step"]) == 2 * CFG.inner_steps for s in taken.optimizer_state["state"].values())
    assert copied_peak - taken_peak >= 0.9 * moment_bytes, (copied_peak, taken_peak, moment_bytes)
    np.testing.assert_allclose(taken.losses, copied.losses, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_payloads_of_a_cuda_round_decode_on_the_node_to_the_same_bits(init: dict, shards: list[Shard],
                                                                      dtype: str) -> None:
    layouts = compute_fragment_layouts(init, F)
    res = run_inner_loop(init, CFG, MODEL, shards[2], 4, 2, device="cuda")
    grads = compute_outer_gradients(init, res.state, layouts)
    payloads = make_payloads("gpu-task", 4, layouts, grads, dtype)
    for lay, grad, data in zip(layouts, grads, payloads):
        header = PayloadHeader("gpu-task", 4, lay.index, ENCODING_RAW, lay.layout_hash())
        decoded = decode_payload(data, lay, expected=header, max_bytes=len(data)).flat_fp32()
        want = grad.to(getattr(torch, dtype)).float()  # what the wire dtype keeps
        assert torch.equal(decoded, want)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_topk_payloads_of_a_cuda_round_decode_to_what_error_feedback_sent(init: dict, shards: list[Shard],
                                                                        dtype: str) -> None:
    """A topk task on a GPU trainer: the outer gradients come back to the CPU, where error
    feedback selects and keeps the rest; the node decodes exactly k values per fragment, and
    what it decodes plus what the trainer keeps is the outer gradient, bit for bit."""
    encoding = PayloadEncoding("topk", 1000)
    layouts = compute_fragment_layouts(init, F)
    res = run_inner_loop(init, CFG, MODEL, shards[2], 4, 2, device="cuda")
    grads = compute_outer_gradients(init, res.state, layouts)
    feedback = ErrorFeedback(layouts, encoding)
    payloads = make_payloads("gpu-task", 4, layouts, grads, dtype, feedback)
    for lay, grad, data, residual in zip(layouts, grads, payloads, feedback._residual):
        header = PayloadHeader("gpu-task", 4, lay.index, ENCODING_TOPK, lay.layout_hash())
        k = encoding.kept(lay.numel)
        assert k is not None
        decoded = decode_payload(data, lay, expected=header, max_bytes=len(data), topk_k=k).flat_fp32()
        assert 0 < int(decoded.count_nonzero()) <= k
        assert residual is not None and torch.equal(decoded + residual, grad)


def test_evaluate_on_cuda_matches_the_cpu(init: dict) -> None:
    val = validation_batch(load_corpus(), MODEL.context_len, MODEL.horizon)
    assert evaluate(init, MODEL, val, device="cuda") == pytest.approx(evaluate(init, MODEL, val), rel=1e-4)


def test_a_sponsors_evaluation_on_cuda_matches_the_cpu(init: dict) -> None:
    """``tenzro train evaluate-model --device cuda``: the same scores as on the CPU (float
    summation order aside), the baselines untouched (computed on the CPU either way)."""
    from tenzro_training.trainer.evaluation import evaluate_models, load_validation_set
    from tests.trainer.test_evaluation import make_spec

    validation = load_validation_set(make_spec())
    on_cpu = evaluate_models(validation, [("init", init)])
    on_gpu = evaluate_models(validation, [("init", init)], device="cuda")
    assert on_gpu.models[0].loss == pytest.approx(on_cpu.models[0].loss, rel=1e-4)
    assert on_gpu.baselines == on_cpu.baselines


def test_a_diverged_cuda_round_names_its_first_bad_step(init: dict, shards: list[Shard]) -> None:
    """A NaN loss on the device stops the round at its first step, as on the CPU."""
    poisoned = dict(init) | {"head.bias": torch.full_like(init["head.bias"], float("nan"))}
    with pytest.raises(InnerLoopDiverged) as info:
        run_inner_loop(poisoned, CFG, MODEL, shards[0], 0, 0, device="cuda")
    assert info.value.step == 0
    assert run_inner_loop(init, CFG, MODEL, shards[0], 0, 0, device="cuda").losses  # the same call, unpoisoned
