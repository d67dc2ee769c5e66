"""The trainer's compute side: a model-family adapter, real timeseries shards and the DiLoCo
inner loop (docs/trainer.md).

What this package is: the pieces a trainer process calls each round. :mod:`.model` holds the
``"timesfm"`` family adapter (config, module, deterministic init checkpoint, checkpoint files
checked against their SHA-256); :mod:`.data` loads the real timeseries shipped inside
statsmodels, splits them by time and deals training windows to shards; :mod:`.inner` runs H
inner AdamW steps from the global weights and turns the result into per-fragment outer
gradients and payloads; :mod:`.evaluation` scores a task's models on its held-out windows beside
the last-value and seasonal-naive forecasts (``tenzro train evaluate-model``).

The trainer process (:mod:`.process`, ``tenzro trainer run``) wraps these pieces as a
participant of a run: it alone does networking, signing and submission, with :mod:`.inbox` (what
it keeps of its gossip), :mod:`.payload_store` (signed payloads kept until their round is
finalized) and :mod:`.signing_guard` (the record of every payload signed). No module here
aggregates or steps the global model (the node's pure core does). It is a shell package (it
reads checkpoint and dataset files), so the core import lint exempts it; the model and
inner-loop modules still know nothing of sharding transport or networking.

Every error raised on purpose here is a :class:`TrainerError`.
"""

from __future__ import annotations

from tenzro_training.errors import TenzroError

__all__ = ["TrainerError", "TrainerProcessError"]


class TrainerError(TenzroError):
    """Root of the trainer package's errors (bad model config, checkpoint, dataset, shard, ...)."""


class TrainerProcessError(TrainerError):
    """The trainer process cannot go on (run refused, a model hash mismatch, a timeout)."""
