"""The DiLoCo inner loop: H AdamW steps on a trainer's shard from the round's global weights, and
what a trainer sends back (per-fragment outer gradients, encoded as payloads).

What this module is: :class:`InnerConfig`, :func:`run_inner_loop` (deterministic: same weights,
config, shard, round and shard index -> bit-identical result on one machine and thread count),
:func:`compute_outer_gradients` (SPEC.md "Fragments": start-of-round global weights minus the
trainer's weights after H steps, per fragment, fp32), :func:`make_payloads`,
:func:`evaluate` (validation MSE) and :func:`apply_global_fragments` (load the next round's
global weights from per-fragment flat vectors).

What it is NOT: no networking or signing (the trainer process submits the payloads), no
aggregation and no outer optimizer (the node does those: ``aggregation``, ``outer``). The model
is reached only through its family adapter (:mod:`.model`).

Randomness: batch indices come from a local ``torch.Generator`` seeded with
:func:`compute_inner_seed` ``(seed, round, shard_index)``; dropout (off by default) draws from
the global CPU RNG inside ``torch.random.fork_rng``, seeded with the same value, so the caller's
RNG state is restored afterwards. The torch thread count is left as the caller set it.

Devices: ``run_inner_loop(..., device=)`` trains on any torch device (:func:`resolve_device`
turns ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"`` into one and refuses a device this
machine lacks). The batch indices are still drawn on the CPU generator, so every device sees the
same batches; the returned weights are CPU fp32 whatever the device. Bit-for-bit reproducibility
holds on the CPU only: GPU kernels (cuBLAS, atomics in backward) may differ run to run. Nothing
the node verifies depends on that: the node aggregates the outer gradients it is given and
recomputes everything after that on its own CPU.
"""

from __future__ import annotations

import copy
import hashlib
import math
import struct
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from tenzro_training.compression import ErrorFeedback
from tenzro_training.fragments import FragmentLayout, gather_fragment, scatter_fragment
from tenzro_training.payload import (
    ENCODING_Q8,
    ENCODING_RAW,
    ENCODING_TOPK,
    PayloadHeader,
    encode_payload,
    encode_q8_payload,
    encode_topk_payload,
)
from tenzro_training.trainer import TrainerError
from tenzro_training.trainer.data import Shard
from tenzro_training.trainer.model import get_adapter, load_state

if TYPE_CHECKING:
    from tenzro_training.spec import TrainingTaskSpec

__all__ = [
    "DEFAULT_INNER_LR",
    "INNER_SEED_DOMAIN",
    "PAYLOAD_DTYPES",
    "InnerConfig",
    "InnerLoopDiverged",
    "InnerLoopStopped",
    "InnerResult",
    "apply_global_fragments",
    "compute_inner_seed",
    "compute_outer_gradients",
    "evaluate",
    "make_payloads",
    "resolve_device",
    "run_inner_loop",
]

DEFAULT_INNER_LR = 3e-4
"""SPEC.md phase-1 inner AdamW learning rate."""
INNER_SEED_DOMAIN = b"tenzro/train/inner-seed/v1"
PAYLOAD_DTYPES: Mapping[str, str] = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
"""``architecture.dtype`` -> the payload/fragments dtype name."""
_LR_KEY = "inner_lr"


class InnerLoopStopped(TrainerError):
    """``should_stop`` said so between two inner steps: the round's work is abandoned (nothing
    of it was saved or published)."""


class InnerLoopDiverged(TrainerError, ValueError):
    """A training loss became NaN/Inf: the round's weights must not be submitted."""

    def __init__(self, step: int, loss: float) -> None:
        self.step = step
        self.loss = loss
        super().__init__(f"inner step {step}: loss is {loss}")


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class InnerConfig:
    """Inner optimizer settings of one trainer (validated on construction)."""

    inner_steps: int = 24
    """H: AdamW steps per round (the spec's ``inner_steps``)."""
    lr: float = DEFAULT_INNER_LR
    """AdamW learning rate (constant: no warmup or decay inside a round)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    batch_size: int = 32
    """Windows per step, drawn uniformly with replacement from the shard."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW moment decay rates."""
    seed: int = 0
    """Base seed; each (round, shard) derives its own (:func:`compute_inner_seed`)."""
    grad_clip: float | None = 1.0
    """Max global gradient L2 norm per step, or None for no clipping."""

    def __post_init__(self) -> None:
        for name in ("inner_steps", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TrainerError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**64:
            raise TrainerError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        if not _is_number(self.lr) or self.lr <= 0:
            raise TrainerError(f"lr must be a finite number > 0, got {self.lr!r}")
        if not _is_number(self.weight_decay) or self.weight_decay < 0:
            raise TrainerError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        betas = tuple(self.betas) if isinstance(self.betas, (tuple, list)) else ()
        if len(betas) != 2 or not all(_is_number(b) and 0 <= b < 1 for b in betas):
            raise TrainerError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        if self.grad_clip is not None and (not _is_number(self.grad_clip) or self.grad_clip <= 0):
            raise TrainerError(f"grad_clip must be a finite number > 0 or None, got {self.grad_clip!r}")

    @classmethod
    def from_spec(cls, spec: TrainingTaskSpec, **overrides: Any) -> InnerConfig:
        """H from ``spec.inner_steps``, lr from ``architecture.metadata.inner_lr`` if present."""
        kwargs: dict[str, Any] = {"inner_steps": spec.inner_steps}
        if _LR_KEY in spec.architecture.metadata:
            kwargs["lr"] = spec.architecture.metadata[_LR_KEY]
        return cls(**(kwargs | overrides))


@dataclass(frozen=True, slots=True, eq=False)
class InnerResult:
    """What one round of inner training produced."""

    state: dict[str, Tensor]
    """The trainer's fp32 weights after H steps (fresh tensors)."""
    losses: tuple[float, ...]
    """Training loss (normalised MSE) of each step's batch, before that step's update."""
    optimizer_state: dict[str, Any] = field(repr=False)
    """AdamW state after H steps; pass it to the next round to keep the moments (optional)."""

    @property
    def train_loss(self) -> float:
        """Mean training loss over the H steps."""
        return sum(self.losses) / len(self.losses)


def compute_inner_seed(seed: int, round: int, shard_index: int) -> int:
    """First 8 bytes (big-endian, top bit cleared) of SHA-256(domain || u64 seed || u64 round ||
    u64 shard_index): independent streams per round and shard."""
    digest = hashlib.sha256(INNER_SEED_DOMAIN + struct.pack(">QQQ", seed, round, shard_index)).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def resolve_device(name: str | torch.device = "cpu") -> torch.device:
    """The torch device for a ``--device`` value. ``"auto"``: the first CUDA device if there is
    one, else Apple's MPS if available, else the CPU. A device this machine lacks (no CUDA, an
    index past the device count) or a malformed name is a :class:`TrainerError`, checked here so
    a trainer fails before it enrolls rather than in its first round."""
    if isinstance(name, str) and name.strip().lower() == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        mps = getattr(torch.backends, "mps", None)
        return torch.device("mps") if mps is not None and mps.is_available() else torch.device("cpu")
    try:
        device = name if isinstance(name, torch.device) else torch.device(name.strip().lower())
    except (RuntimeError, TypeError, AttributeError):
        raise TrainerError(f"unknown device {name!r} (expected auto, cpu, cuda, cuda:N or mps)") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise TrainerError(f"device {name!r}: this machine (or this torch build) has no CUDA device")
        index = torch.cuda.current_device() if device.index is None else device.index
        if not 0 <= index < torch.cuda.device_count():
            raise TrainerError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s)")
        return torch.device("cuda", index)
    if device.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise TrainerError(f"device {name!r}: MPS is not available on this machine")
        return device
    raise TrainerError(f"unsupported device {name!r} (expected auto, cpu, cuda, cuda:N or mps)")


def _check_round(round: int, shard: Shard, shard_index: int) -> None:
    if isinstance(round, bool) or not isinstance(round, int) or not 0 <= round < 2**64:
        raise TrainerError(f"round must be an integer in [0, 2**64), got {round!r}")
    if shard_index != shard.index:
        # The seed depends on the index: training shard A under index B would not be reproducible.
        raise TrainerError(f"shard_index {shard_index!r} differs from the shard's index {shard.index}")
    if len(shard) == 0:
        raise TrainerError("the shard has no windows")


def run_inner_loop(
    model_state: Mapping[str, Tensor],
    cfg: InnerConfig,
    model_cfg: Any,
    shard: Shard,
    round: int,
    shard_index: int,
    *,
    optimizer_state: Mapping[str, Any] | None = None,
    take_optimizer_state: bool = False,
    device: str | torch.device = "cpu",
    should_stop: Callable[[], bool] | None = None,
) -> InnerResult:
    """Load the round's global weights into a fresh model and run ``cfg.inner_steps`` AdamW steps.

    ``model_state`` (any float dtype) and ``optimizer_state`` are not modified, unless
    ``take_optimizer_state``: then the state's tensors become the optimizer's own, without a
    copy, and are updated in place (the caller must not use them again). That is for a caller
    that hands each round's state to the next, like the trainer process: the copy would hold a
    second set of moments, twice the model's size, on the device for the whole round.

    ``model_cfg`` is the family config (its ``family`` selects the adapter). ``device``: where the
    model, the batches and the optimizer live (see :func:`resolve_device`); the result's ``state``
    is on the CPU, its ``optimizer_state`` on ``device``. Raises :class:`InnerLoopDiverged` on a non-finite
    loss, and :class:`InnerLoopStopped` when ``should_stop()`` (asked before each step) is true:
    a trainer told to stop (SIGTERM) used to finish the whole loop first, minutes on a real
    model, and a supervisor would kill it (trainer restart probe).
    """
    _check_round(round, shard, shard_index)
    dev = resolve_device(device)
    model = get_adapter(model_cfg.family).build_model(model_cfg)
    load_state(model, model_state)
    model.to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    if optimizer_state is not None:
        # AdamW.load_state_dict keeps the given tensors and then updates them in place: copy, so
        # the caller's state (e.g. a previous InnerResult) stays valid and reusable.
        opt.load_state_dict(dict(optimizer_state) if take_optimizer_state else copy.deepcopy(dict(optimizer_state)))
    seed = compute_inner_seed(cfg.seed, round, shard_index)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    windows = shard.windows.to(dev)  # once per round, not once per step
    losses: list[float] = []
    # fork_rng restores the CPU RNG and, on CUDA, this device's RNG (dropout draws from it).
    with torch.random.fork_rng(devices=[dev.index] if dev.type == "cuda" else []):
        torch.manual_seed(seed)  # dropout only; batches use `gen`
        for step in range(cfg.inner_steps):
            if should_stop is not None and should_stop():
                raise InnerLoopStopped(f"stopped before inner step {step} of {cfg.inner_steps}")
            index = torch.randint(len(shard), (cfg.batch_size,), generator=gen)
            losses.append(_step(model, opt, windows[index.to(dev)], cfg.grad_clip, step))
    # .to(copy=True): fresh CPU tensors on every device (a clone on the CPU).
    state = {name: t.detach().to("cpu", copy=True) for name, t in model.state_dict().items()}
    return InnerResult(state, tuple(losses), opt.state_dict())


def _step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, batch: Tensor, grad_clip: float | None, step: int
) -> float:
    opt.zero_grad(set_to_none=True)
    loss = model.loss(batch)
    value = float(loss.detach())
    if not math.isfinite(value):
        raise InnerLoopDiverged(step, value)
    loss.backward()
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return value


def compute_outer_gradients(
    start_state: Mapping[str, Tensor], end_state: Mapping[str, Tensor], layouts: Sequence[FragmentLayout]
) -> list[Tensor]:
    """Per fragment, the flat fp32 vector ``start - end`` (one IEEE fp32 subtraction per element;
    a bf16/fp16 start is widened exactly first)."""
    return [torch.sub(gather_fragment(start_state, lay), gather_fragment(end_state, lay)) for lay in layouts]


def make_payloads(
    task_id: str,
    round: int,
    layouts: Sequence[FragmentLayout],
    outer_grads: Sequence[Tensor],
    dtype: str = "float32",
    feedback: ErrorFeedback | None = None,
) -> list[bytes]:
    """One payload per fragment (``dtype`` is the fragments name, see :data:`PAYLOAD_DTYPES`):
    raw, or with ``feedback`` (the task's topk or q8 encoding) each fragment's top-k, or its
    8-bit quantisation, of the outer gradient plus what earlier rounds left unsent, which
    ``feedback`` then keeps. Errors are the payload codec's PayloadError subclasses (and
    CompressionError)."""
    if len(layouts) != len(outer_grads):
        raise TrainerError(f"{len(layouts)} layouts but {len(outer_grads)} outer gradients")
    if feedback is None:
        return [
            encode_payload(PayloadHeader(task_id, round, lay.index, ENCODING_RAW, lay.layout_hash()), lay, grad, dtype)
            for lay, grad in zip(layouts, outer_grads)
        ]
    parts = feedback.compress(outer_grads, dtype)
    block = feedback.encoding.block_size
    if block is not None:  # q8: (scales, values) per fragment
        return [
            encode_q8_payload(PayloadHeader(task_id, round, lay.index, ENCODING_Q8, lay.layout_hash()), lay, s, v,
                              block, dtype)
            for lay, (s, v) in zip(layouts, parts)
        ]
    return [
        encode_topk_payload(PayloadHeader(task_id, round, lay.index, ENCODING_TOPK, lay.layout_hash()), lay, i, v, dtype)
        for lay, (i, v) in zip(layouts, parts)
    ]


def evaluate(
    state: Mapping[str, Tensor], model_cfg: Any, batch: Tensor, *, device: str | torch.device = "cpu"
) -> float:
    """Mean normalised MSE of the model with weights ``state`` on ``batch`` (eval mode, no grad)."""
    dev = resolve_device(device)
    model = get_adapter(model_cfg.family).build_model(model_cfg)
    load_state(model, state)
    model.to(dev)
    model.eval()
    with torch.no_grad():
        return float(model.loss(batch.to(dev)))


def apply_global_fragments(
    state: MutableMapping[str, Tensor], layouts: Sequence[FragmentLayout], fragments: Sequence[Tensor]
) -> None:
    """Write the new global weights, one flat fp32 vector per fragment, into ``state`` in place
    (cast to each tensor's dtype). Every fragment must be given exactly once; lengths are checked
    before anything is written."""
    if len(layouts) != len(fragments):
        raise TrainerError(f"{len(layouts)} layouts but {len(fragments)} fragments")
    if sorted(lay.index for lay in layouts) != list(range(len(layouts))):
        raise TrainerError("layouts must be every fragment exactly once")
    for lay, flat in zip(layouts, fragments):
        if not isinstance(flat, Tensor) or flat.dim() != 1 or flat.numel() != lay.numel:
            raise TrainerError(f"fragment {lay.index} needs a 1-D tensor of {lay.numel} values")
    for lay, flat in zip(layouts, fragments):
        scatter_fragment(state, lay, flat)
