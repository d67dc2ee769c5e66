"""The ``"timesfm"`` model family: a small TimesFM-class decoder-only patch transformer, its
config, a deterministic initial checkpoint and checkpoint files bound to their SHA-256.

What this module is: :class:`PatchTransformerConfig` (read from a spec's
``architecture.metadata`` by :func:`config_from_spec`), :class:`PatchTransformer` (the
``torch.nn.Module``), :func:`create_init_checkpoint` (same config and seed -> bit-identical
tensors), :func:`save_checkpoint` / :func:`load_checkpoint` (a safetensors file and the SHA-256
of its bytes, the ``architecture.metadata.init_checkpoint`` a node verifies) and the
:data:`ADAPTERS` registry through which other model families are added.

What it is NOT: no sharding, networking or data loading (the model only sees tensors of
windows), no optimizer (see :mod:`.inner`). It is torch only: the real TimesFM package is not a
dependency, the architecture is re-derived at a size that trains on a CPU in seconds.

The model, per window of ``context_len + horizon`` values (docs/trainer.md, "Model"):

1. instance normalisation: ``loc`` and ``scale`` are the mean and the population standard
   deviation of the *context*; a near-constant context (scale < 1e-5) uses scale 1;
2. the normalised context is cut into ``context_len / patch_len`` patches, each embedded by one
   linear layer plus a learned position embedding;
3. ``n_layers`` pre-norm causal transformer blocks (multi-head self-attention, GELU MLP);
4. a final LayerNorm and a linear head map the LAST patch's output to ``horizon`` values, in
   normalised units (``forward`` de-normalises them).

The training loss is the MSE between the predicted and the true targets, both in the context's
normalised units, so every series weighs the same whatever its scale (co2 in ppm, GDP in
billions).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

import safetensors.torch
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from storage.files import NotReadable, read_regular_file, write_file_atomically
from tenzro_training.errors import CheckpointError, SpecError
from tenzro_training.tensorfile import TensorFileError, load_tensors
from tenzro_training.trainer import TrainerError

if TYPE_CHECKING:
    from tenzro_training.spec import TrainingTaskSpec

__all__ = [
    "ADAPTERS",
    "FAMILY",
    "CheckpointFileError",
    "CheckpointHashMismatch",
    "ModelAdapter",
    "ModelConfigError",
    "PatchTransformer",
    "PatchTransformerConfig",
    "StateMismatch",
    "UnknownFamily",
    "build_model",
    "compute_shape_mismatch",
    "config_from_spec",
    "count_params",
    "tensor_shapes",
    "create_init_checkpoint",
    "compute_checkpoint_bytes",
    "get_adapter",
    "load_checkpoint",
    "load_state",
    "save_checkpoint",
]

FAMILY = "timesfm"
MAX_CHECKPOINT_BYTES = 16 << 30
"""The largest checkpoint file read (whole, to be hashed and parsed): the CLI's limit for
checkpoints and models (docs/cli.md)."""
_METADATA_PATH = "architecture.metadata"
# Upper bounds on metadata values: a spec is untrusted input and the node may build the model
# (to count parameters or create a checkpoint); these stop a spec from asking for terabytes.
_MAX_LEN = 65_536
_MAX_WIDTH = 16_384
_MAX_LAYERS = 256
_MIN_SCALE = 1e-5
_INIT_STD = 0.02


# --- errors ---------------------------------------------------------------------------------


class ModelConfigError(TrainerError, SpecError):
    """A model config value is invalid; ``path`` names the metadata field."""


class UnknownFamily(TrainerError, SpecError):
    """``architecture.family`` names no registered adapter."""

    def __init__(self, family: str) -> None:
        self.family = family
        known = sorted(ADAPTERS)
        super().__init__("architecture.family", f"no model adapter for family {family!r} (known: {known})")


class CheckpointFileError(TrainerError, CheckpointError):
    """A checkpoint file cannot be read or parsed (``uri`` is the path, ``reason`` says why)."""


class CheckpointHashMismatch(CheckpointFileError):
    """The checkpoint file's SHA-256 differs from the expected one: never load it."""

    def __init__(self, uri: str, expected: str, actual: str) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(uri, f"sha256 is {actual}, expected {expected}")


class StateMismatch(TrainerError, ValueError):
    """A state dict's tensor names or shapes do not match the model it is loaded into."""


# --- config ---------------------------------------------------------------------------------


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    # bool is an int subclass; `true` is not a layer count.
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ModelConfigError(f"{_METADATA_PATH}.{name}", f"must be an integer in [{lo}, {hi}], got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PatchTransformerConfig:
    """Shape of a ``"timesfm"`` patch transformer (validated on construction)."""

    family: ClassVar[str] = FAMILY

    context_len: int
    """Input values per window; a multiple of ``patch_len``."""
    horizon: int
    """Values predicted after the context."""
    patch_len: int = 16
    """Values per input patch (one token)."""
    d_model: int = 32
    """Width of the residual stream; a multiple of ``n_heads``."""
    n_layers: int = 2
    """Number of transformer blocks."""
    n_heads: int = 4
    """Attention heads per block."""
    d_ff: int = 64
    """Hidden width of each block's MLP."""
    dropout: float = 0.0
    """Dropout probability in attention and MLP outputs while training, in [0, 1)."""

    def __post_init__(self) -> None:
        _check_int("context_len", self.context_len, 1, _MAX_LEN)
        _check_int("horizon", self.horizon, 1, _MAX_LEN)
        _check_int("patch_len", self.patch_len, 1, self.context_len)
        _check_int("d_model", self.d_model, 1, _MAX_WIDTH)
        _check_int("n_layers", self.n_layers, 1, _MAX_LAYERS)
        _check_int("n_heads", self.n_heads, 1, self.d_model)
        _check_int("d_ff", self.d_ff, 1, 4 * _MAX_WIDTH)
        if self.context_len % self.patch_len:
            raise ModelConfigError(
                f"{_METADATA_PATH}.patch_len", f"{self.patch_len} does not divide context_len {self.context_len}"
            )
        if self.d_model % self.n_heads:
            raise ModelConfigError(
                f"{_METADATA_PATH}.n_heads", f"{self.n_heads} does not divide d_model {self.d_model}"
            )
        dropout = self.dropout
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ModelConfigError(f"{_METADATA_PATH}.dropout", f"must be a number in [0, 1), got {dropout!r}")
        object.__setattr__(self, "dropout", float(dropout))

    @property
    def n_patches(self) -> int:
        return self.context_len // self.patch_len

    @property
    def window_len(self) -> int:
        """Values per training window: context then targets."""
        return self.context_len + self.horizon


_REQUIRED_KEYS = ("context_len", "horizon")
_OPTIONAL_KEYS = ("patch_len", "d_model", "n_layers", "n_heads", "d_ff", "dropout")


def config_from_spec(spec: TrainingTaskSpec) -> PatchTransformerConfig:
    """The model a ``"timesfm"`` task trains, from ``architecture.metadata``.

    ``context_len`` and ``horizon`` are required; the other fields default to the tiny sizes of
    :class:`PatchTransformerConfig`. Other metadata keys (``init_checkpoint``, ``outer_lr``, ...)
    are ignored here. Raises :class:`UnknownFamily` or :class:`ModelConfigError`.
    """
    if spec.architecture.family != FAMILY:
        raise UnknownFamily(spec.architecture.family)
    return config_from_metadata(spec.architecture.metadata)


def config_from_metadata(metadata: Mapping[str, Any]) -> PatchTransformerConfig:
    """:func:`config_from_spec` on the metadata object alone."""
    for key in _REQUIRED_KEYS:
        if key not in metadata:
            raise ModelConfigError(f"{_METADATA_PATH}.{key}", "missing (required by the timesfm family)")
    keys = _REQUIRED_KEYS + _OPTIONAL_KEYS
    return PatchTransformerConfig(**{k: metadata[k] for k in keys if k in metadata})


# --- the module -----------------------------------------------------------------------------


class _Block(nn.Module):
    """Pre-norm transformer block: causal multi-head self-attention, then a GELU MLP."""

    def __init__(self, cfg: PatchTransformerConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.dropout = cfg.dropout
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        p = self.dropout if self.training else 0.0
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + F.dropout(self.proj(attn.transpose(1, 2).reshape(b, t, d)), p, self.training)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.norm2(x)))), p, self.training)


class PatchTransformer(nn.Module):
    """Decoder-only patch transformer: context ``(B, context_len)`` -> forecast ``(B, horizon)``."""

    def __init__(self, cfg: PatchTransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Linear(cfg.patch_len, cfg.d_model)
        self.pos_embed = nn.Parameter(torch.zeros(cfg.n_patches, cfg.d_model))
        self.layers = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.horizon)

    @staticmethod
    def normalise(context: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(normalised context, loc, scale)``; loc/scale are ``(B, 1)`` context mean and std."""
        loc = context.mean(dim=-1, keepdim=True)
        std = context.var(dim=-1, keepdim=True, unbiased=False).sqrt()
        # A flat context has no scale to learn from; dividing by ~0 would blow the loss up.
        scale = torch.where(std < _MIN_SCALE, torch.ones_like(std), std)
        return (context - loc) / scale, loc, scale

    def forward_normalised(self, x: Tensor) -> Tensor:
        """Normalised context ``(B, context_len)`` -> normalised forecast ``(B, horizon)``."""
        b = x.shape[0]
        h = self.patch_embed(x.view(b, self.cfg.n_patches, self.cfg.patch_len)) + self.pos_embed
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h[:, -1]))

    def forward(self, context: Tensor) -> Tensor:
        """Forecast in the context's own units."""
        x, loc, scale = self.normalise(context)
        return self.forward_normalised(x) * scale + loc

    def loss(self, windows: Tensor) -> Tensor:
        """MSE on normalised targets for windows ``(B, context_len + horizon)``."""
        context, target = windows[:, : self.cfg.context_len], windows[:, self.cfg.context_len :]
        x, loc, scale = self.normalise(context)
        return F.mse_loss(self.forward_normalised(x), (target - loc) / scale)


# --- parameters and the initial checkpoint --------------------------------------------------


def tensor_shapes(cfg: PatchTransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every state-dict tensor's name and shape (the meta device allocates nothing and draws no
    random numbers)."""
    with torch.device("meta"):
        model = PatchTransformer(cfg)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def count_params(cfg: PatchTransformerConfig) -> int:
    """Number of parameters (every tensor of the state dict is a trainable parameter)."""
    return sum(math.prod(shape) for shape in tensor_shapes(cfg).values())


def _init_tensor(name: str, shape: tuple[int, ...], cfg: PatchTransformerConfig, gen: torch.Generator) -> Tensor:
    if name.endswith(".bias"):
        return torch.zeros(shape)
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2].startswith("norm"):  # LayerNorm gains
        return torch.ones(shape)
    # GPT-2 style: residual-branch outputs scaled down with depth so the stream starts near identity.
    std = _INIT_STD / math.sqrt(2 * cfg.n_layers) if name.endswith(("proj.weight", "fc2.weight")) else _INIT_STD
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std


def create_init_checkpoint(cfg: PatchTransformerConfig, seed: int) -> dict[str, Tensor]:
    """Fresh fp32 weights: same ``cfg`` and ``seed`` -> bit-identical tensors.

    Draws come from a local ``torch.Generator`` seeded with ``seed``, in tensor-name order; the
    global torch RNG is neither used nor disturbed. Biases are 0, LayerNorm gains 1, everything
    else N(0, 0.02), residual output projections N(0, 0.02 / sqrt(2 * n_layers)).
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise TrainerError(f"seed must be an integer in [0, 2**63), got {seed!r}")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shapes = tensor_shapes(cfg)
    return {name: _init_tensor(name, shapes[name], cfg, gen) for name in sorted(shapes)}


def build_model(cfg: PatchTransformerConfig) -> PatchTransformer:
    """The module for ``cfg`` on the CPU with UNINITIALISED weights: load a state next.

    Built on the meta device and then given empty storage, so no random numbers are drawn
    (the global torch RNG is untouched) and no time is spent on an init that is overwritten.
    """
    with torch.device("meta"):
        model = PatchTransformer(cfg)
    return model.to_empty(device="cpu")


def compute_shape_mismatch(
    got: Mapping[str, tuple[int, ...]], want: Mapping[str, tuple[int, ...]]
) -> str | None:
    """How the tensors ``got`` (name -> shape) differ from the model's ``want``: the names
    missing, the names unexpected and the tensors of another shape (five of each at most), or
    None when they are the same. Whatever meets the spec's model from outside (a state loaded
    into it, a node's fragment layouts, a sponsor's model file) is described in these words, so
    every refusal says which tensors differ."""

    def few(items: list[str]) -> str:
        return ", ".join(items[:5]) + (f" and {len(items) - 5} more" if len(items) > 5 else "")

    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    shapes = [f"{name} {tuple(got[name])} where the model has {tuple(want[name])}"
              for name in sorted(set(want) & set(got)) if tuple(got[name]) != tuple(want[name])]
    parts = [f"{label}: {few(items)}" for label, items in
             (("missing", missing), ("unexpected", extra), ("other shapes", shapes)) if items]
    return "; ".join(parts) or None


def load_state(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Copy ``state`` (any float dtype, widened to the model's fp32) into ``model``, strictly.

    Raises :class:`StateMismatch` when names or shapes differ.
    """
    own = model.state_dict()
    for name, tensor in state.items():
        if not isinstance(tensor, Tensor):
            raise StateMismatch(f"state[{name!r}] is a {type(tensor).__name__}, not a tensor")
    problem = compute_shape_mismatch({n: tuple(t.shape) for n, t in state.items()},
                                     {n: tuple(t.shape) for n, t in own.items()})
    if problem is not None:
        raise StateMismatch(f"state does not match the model: {problem}")
    with torch.no_grad():
        for name, tensor in own.items():
            tensor.copy_(state[name])


# --- checkpoint files -----------------------------------------------------------------------


def _sha256_hex(data: bytes) -> str:
    return "0x" + hashlib.sha256(data).hexdigest()


def _normalise_digest(path: str, value: object) -> str:
    """Accept ``0x`` + 64 hex (any case), 64 hex, or 32 raw bytes; return ``0x`` + lowercase hex."""
    if isinstance(value, bytes) and len(value) == 32:
        return "0x" + value.hex()
    if isinstance(value, str):
        digits = value[2:] if value[:2] in ("0x", "0X") else value
        if len(digits) == 64 and all(c in "0123456789abcdefABCDEF" for c in digits):
            return "0x" + digits.lower()
    raise CheckpointFileError(path, f"expected sha256 must be 0x + 64 hex digits or 32 bytes, got {value!r:.80}")


def save_checkpoint(
    state: Mapping[str, Tensor], path: str | os.PathLike[str], *, metadata: Mapping[str, str] | None = None
) -> str:
    """Write ``state`` as a safetensors file; return the SHA-256 of its bytes (``0x`` + hex).

    The bytes depend only on the tensors and metadata (same state -> same file and hash). The
    file is written to a temporary name and renamed, so a reader never sees half a checkpoint.
    """
    data = compute_checkpoint_bytes(state, metadata=metadata)
    write_file_atomically(path, data)
    return _sha256_hex(data)


def compute_checkpoint_bytes(state: Mapping[str, Tensor], *, metadata: Mapping[str, str] | None = None) -> bytes:
    """The bytes :func:`save_checkpoint` writes (for a caller that writes them its own way)."""
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in state.items()}
    return _sort_metadata(safetensors.torch.save(tensors, metadata=dict(metadata) if metadata else None))


def _sort_metadata(data: bytes) -> bytes:
    """The safetensors bytes with the ``__metadata__`` entries in sorted key order.

    The library writes tensors in a fixed order but metadata in hash-map order, which differs
    between processes once there are two keys (five processes gave five file hashes). Only
    that object is reordered: the header is re-emitted in the library's own format (compact
    JSON, UTF-8, space-padded to 8 bytes) and the data section is untouched, so a file with at
    most one metadata key keeps its bytes, and every checkpoint hash published so far.
    """
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n], object_pairs_hook=dict)
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or len(meta) < 2:
        return data
    header["__metadata__"] = dict(sorted(meta.items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + n :]


def load_checkpoint(path: str | os.PathLike[str], expected_sha256: str | bytes) -> dict[str, Tensor]:
    """Read a safetensors checkpoint, refusing it unless its bytes hash to ``expected_sha256``.

    The bytes are read once, hashed, and the same bytes parsed (no window for the file to change
    in between). Raises :class:`CheckpointHashMismatch` or :class:`CheckpointFileError`.
    """
    where = str(path)
    expected = _normalise_digest(where, expected_sha256)
    try:  # a regular file only: a FIFO or a device named as the checkpoint blocks or fills memory
        data = read_regular_file(path, MAX_CHECKPOINT_BYTES)
    except NotReadable as exc:
        raise CheckpointFileError(where, exc.reason) from None
    actual = _sha256_hex(data)
    if actual != expected:
        raise CheckpointHashMismatch(where, expected, actual)
    try:
        return load_tensors(data)
    except TensorFileError as exc:
        raise CheckpointFileError(where, f"not a safetensors file: {exc}") from exc


# --- the family registry --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelAdapter:
    """What the trainer and node need from one model family."""

    family: str
    """``architecture.family`` value this adapter serves."""
    config_from_spec: Callable[[TrainingTaskSpec], Any]
    """Spec -> the family's config (raises a SpecError subclass)."""
    build_model: Callable[[Any], nn.Module]
    """Config -> module with a ``loss(windows)`` method."""
    create_init_checkpoint: Callable[[Any, int], dict[str, Tensor]]
    """(config, seed) -> deterministic initial state dict."""
    count_params: Callable[[Any], int]
    """Config -> parameter count (compare with ``architecture.param_count``)."""
    tensor_shapes: Callable[[Any], dict[str, tuple[int, ...]]]
    """Config -> every state-dict tensor's name and shape, allocating nothing (a trainer checks
    the node's fragment layouts against it before it enrolls)."""


ADAPTERS: Mapping[str, ModelAdapter] = MappingProxyType(
    {FAMILY: ModelAdapter(FAMILY, config_from_spec, build_model, create_init_checkpoint, count_params, tensor_shapes)}
)
"""Registered model families, by ``architecture.family``."""


def get_adapter(family: str) -> ModelAdapter:
    """The adapter for ``family``; :class:`UnknownFamily` if none is registered."""
    if family not in ADAPTERS:
        raise UnknownFamily(family)
    return ADAPTERS[family]
