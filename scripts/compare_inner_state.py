"""Fresh vs carried inner AdamW state over DiLoCo rounds, in one process: the evidence behind
``tenzro trainer run``'s default (a fresh state every round; ``--carry-optimizer-state`` keeps
the moments, as DiLoCo's workers do).

Each seed simulates a run of the shipped dev spec (``tenzro_training/data/dev-task.json``): its
model, M = 3 shards of the shipped corpus, H inner steps per round (``--inner-steps``, default the
spec's), the Mean of the outer gradients and the node's outer Nesterov step (lr 0.7, momentum
0.9). It prints each run's validation loss (normalised MSE on the corpus's held-out windows) and,
per mode, the mean over seeds of the final loss and of the last five rounds' losses. One torch
thread, so the figures repeat on any machine.

Usage::

    .venv/bin/python scripts/compare_inner_state.py [--rounds 20] [--inner-steps 8] [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tenzro_training.global_model import compute_full_state, compute_initial_model  # noqa: E402
from tenzro_training.outer import OuterConfig, apply_outer_step, compute_initial_momentum  # noqa: E402
from tenzro_training.spec import TrainingTaskSpec  # noqa: E402
from tenzro_training.trainer.data import load_corpus, shard_windows, validation_batch  # noqa: E402
from tenzro_training.trainer.inner import InnerConfig, compute_outer_gradients, evaluate, run_inner_loop  # noqa: E402
from tenzro_training.trainer.model import create_init_checkpoint, get_adapter  # noqa: E402

TRAINERS = 3
MODES = ("fresh", "carried")


def simulate(spec: TrainingTaskSpec, rounds: int, inner_steps: int, seed: int, carry: bool) -> list[float]:
    """Validation loss after each of ``rounds`` rounds of one simulated run."""
    model_cfg = get_adapter(spec.architecture.family).config_from_spec(spec)
    corpus = load_corpus()
    shards = [shard_windows(corpus, i, TRAINERS, model_cfg.context_len, model_cfg.horizon) for i in range(TRAINERS)]
    val = validation_batch(corpus, model_cfg.context_len, model_cfg.horizon)
    initial = compute_initial_model(create_init_checkpoint(model_cfg, seed), spec.architecture.fragment_count)
    weights = [t.clone() for t in initial.weights]
    momentum = [compute_initial_momentum(t.numel()) for t in weights]
    cfg = InnerConfig.from_spec(spec, inner_steps=inner_steps, batch_size=16, seed=seed)
    outer = OuterConfig.from_spec(spec)
    moments: list[dict | None] = [None] * TRAINERS
    curve = []
    for r in range(rounds):
        state = compute_full_state(initial.model, weights)
        grads = []
        for i, shard in enumerate(shards):
            out = run_inner_loop(state, cfg, model_cfg, shard, r, i, optimizer_state=moments[i] if carry else None)
            moments[i] = out.optimizer_state
            grads.append(compute_outer_gradients(state, out.state, initial.model.layouts))
        for f in range(len(weights)):
            mean = torch.stack([g[f] for g in grads]).mean(0)
            weights[f], momentum[f] = apply_outer_step(weights[f], momentum[f], mean, outer)
        curve.append(evaluate(compute_full_state(initial.model, weights), model_cfg, val))
    return curve


def main(argv: list[str] | None = None) -> int:
    spec = TrainingTaskSpec.from_dict(json.loads((ROOT / "tenzro_training/data/dev-task.json").read_text()))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--inner-steps", type=int, default=spec.inner_steps)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.rounds < 5 or args.inner_steps < 1 or args.seeds < 1:
        parser.error("--rounds must be >= 5, --inner-steps and --seeds >= 1")
    torch.set_num_threads(1)
    print(f"dev model ({spec.architecture.param_count} params), M={TRAINERS}, H={args.inner_steps}, "
          f"{args.rounds} rounds, {args.seeds} seeds; validation loss (normalised MSE)")
    curves: dict[str, list[list[float]]] = {mode: [] for mode in MODES}
    for mode in MODES:
        for seed in range(args.seeds):
            curve = simulate(spec, args.rounds, args.inner_steps, seed, carry=mode == "carried")
            curves[mode].append(curve)
            print(f"  {mode:8} seed {seed}: round 5 {curve[4]:.4f}  final {curve[-1]:.4f}", flush=True)
    for mode in MODES:
        final = statistics.mean(c[-1] for c in curves[mode])
        last5 = statistics.mean(statistics.mean(c[-5:]) for c in curves[mode])
        print(f"{mode:8} mean final {final:.4f}  mean of the last 5 rounds {last5:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
