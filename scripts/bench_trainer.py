"""Benchmark a trainer's round: the inner loop on every device this machine has, against the CPU
measured in the same run, plus the round's CPU-side work (outer gradients and payload encoding).

For each model size, on the real corpus (`load_corpus()`, a shard of 3) and from the same
deterministic init checkpoint, ``run_inner_loop`` is timed for ``--rounds`` rounds of H inner
steps after one warm-up round (CUDA kernels, allocator); the wall time per round, inner steps per
second and the ratio to the CPU (the baseline, same sizes, same run) are printed. The CPU may run
fewer steps per round (``--cpu-steps``, its rate per step is what is compared): a 12.6M-parameter
model takes seconds per step on a small machine. ``post`` is the time of
``compute_outer_gradients`` + ``make_payloads`` for the round, which a GPU trainer spends on its
CPU before it can publish; ``post/round`` is its share of the round.

Sizes: ``dev`` is the shipped dev example's model (18k parameters); ``node`` is the 12.6M-parameter
model of ``bench_rpc.py``'s finalize benchmark (16 layers, d_model 256). With no CUDA device the
CPU rows are printed and the GPU ratio is reported as not measured (exit 0): nothing here has a
target, the figures tell a trainer operator what a GPU buys.

Usage::

    .venv/bin/python scripts/bench_trainer.py                       # dev and node sizes
    .venv/bin/python scripts/bench_trainer.py --models dev --steps 8 --rounds 2 --cpu-steps 8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from tenzro_training.fragments import compute_fragment_layouts  # noqa: E402
from tenzro_training.trainer.data import load_corpus, shard_windows  # noqa: E402
from tenzro_training.trainer.inner import (  # noqa: E402
    InnerConfig,
    compute_outer_gradients,
    make_payloads,
    run_inner_loop,
)
from tenzro_training.trainer.model import PatchTransformerConfig, create_init_checkpoint  # noqa: E402

SIZES = {
    "dev": PatchTransformerConfig(context_len=64, horizon=16, patch_len=16, d_model=32, n_layers=2, n_heads=4, d_ff=64),
    "node": PatchTransformerConfig(context_len=64, horizon=16, patch_len=16, d_model=256, n_layers=16, n_heads=4,
                                   d_ff=1024),
}
FRAGMENTS = 12


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_rounds(init: dict, model: PatchTransformerConfig, shard, cfg: InnerConfig, device: torch.device,
                rounds: int) -> tuple[float, object]:
    """Best wall time of one round over ``rounds`` rounds (after a warm-up round), and the last
    round's result."""
    run_inner_loop(init, InnerConfig(inner_steps=2, batch_size=cfg.batch_size), model, shard, 0, 0, device=device)
    best, result = float("inf"), None
    for r in range(rounds):
        _sync(device)
        t0 = time.perf_counter()
        result = run_inner_loop(init, cfg, model, shard, r + 1, 0, device=device)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="dev,node", help=f"comma-separated, of {','.join(SIZES)}")
    parser.add_argument("--steps", type=int, default=24, help="H, inner steps per round on a GPU (spec default 24)")
    parser.add_argument("--cpu-steps", type=int, default=4, help="inner steps per round on the CPU baseline")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in SIZES]
    if unknown or args.steps < 1 or args.cpu_steps < 1 or args.rounds < 1 or args.batch_size < 1:
        parser.error(f"unknown model size(s) {unknown}" if unknown else "counts must be >= 1")

    gpus = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, "
          f"CUDA devices: {[torch.cuda.get_device_name(d) for d in gpus] or 'none'}")
    corpus = load_corpus()
    results = []
    for name in names:
        model = SIZES[name]
        init = create_init_checkpoint(model, 0)
        params = sum(t.numel() for t in init.values())
        shard = shard_windows(corpus, 0, 3, model.context_len, model.horizon)
        layouts = compute_fragment_layouts(init, FRAGMENTS)
        cpu_cfg = InnerConfig(inner_steps=args.cpu_steps, batch_size=args.batch_size)
        cpu_s, _ = time_rounds(init, model, shard, cpu_cfg, torch.device("cpu"), args.rounds)
        cpu_rate = args.cpu_steps / cpu_s
        print(f"{name}: {params:,} parameters, batch {args.batch_size}, {len(shard)} windows in the shard")
        print(f"  cpu      {cpu_s:8.3f} s per {args.cpu_steps}-step round  {cpu_rate:9.1f} steps/s   1.00x (baseline)")
        row = {"model": name, "params": params, "cpu_steps_per_s": round(cpu_rate, 2)}
        for dev in gpus:
            cfg = InnerConfig(inner_steps=args.steps, batch_size=args.batch_size)
            torch.cuda.reset_peak_memory_stats(dev)
            gpu_s, res = time_rounds(init, model, shard, cfg, dev, args.rounds)
            peak = torch.cuda.max_memory_allocated(dev)
            t0 = time.perf_counter()
            grads = compute_outer_gradients(init, res.state, layouts)
            make_payloads("bench", 1, layouts, grads)
            post = time.perf_counter() - t0
            rate = args.steps / gpu_s
            print(f"  {str(dev):8} {gpu_s:8.3f} s per {args.steps}-step round  {rate:9.1f} steps/s "
                  f"{rate / cpu_rate:7.2f}x   peak {peak / 2**20:,.0f} MiB; post {post * 1000:.1f} ms "
                  f"({post / (gpu_s + post):.1%} of the round)")
            row[str(dev)] = {"steps_per_s": round(rate, 2), "ratio_to_cpu": round(rate / cpu_rate, 2),
                             "peak_mib": round(peak / 2**20), "post_ms": round(post * 1000, 1)}
        if not gpus:
            print("  no CUDA device: the GPU ratio is not measured on this machine")
        results.append(row)
    print(json.dumps({"trainer_round": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
