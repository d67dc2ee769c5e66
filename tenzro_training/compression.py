"""Compressed outer gradients: which payload encoding a task asks for, and the trainer's top-k
selection and 8-bit quantisation with error feedback (SPEC.md "Payloads": compressed encodings
are an extension selected per task; the uncompressed encoding is always accepted).

What this module is: :class:`PayloadEncoding` (the value of the spec's
``architecture.metadata.outer_gradient_encoding``, validated at postTask, with the number of
values a ``topk`` payload of a fragment carries, or the block size of a ``q8`` one), and
:class:`ErrorFeedback` with :func:`select_topk` and :func:`quantize_q8`, the trainer side: each
round the trainer adds what it did not send before to its new outer gradient, sends the k
largest magnitudes (topk) or every value rounded to one of 255 levels of its block (q8), and
keeps the rest (DeMo, SparseLoCo; EF-SGD for quantisation). Without the feedback the
coordinates that are never among the largest would never move, and a quantiser's rounding
would bias every round the same way; with it what was not sent goes out later.

Why top-k and q8 and not DCT + top-k (DeMo): the node, every auditor and the clean-room verifier
must reproduce each aggregate bit for bit from the stored payloads. Decoding top-k is a scatter
of exact values into zeros, with no arithmetic; decoding q8 is one IEEE fp32 product per value,
exactly rounded everywhere. An inverse DCT is a sum of products whose bits depend on the order
of the summation, which differs between BLAS builds and thread counts, so it would need a pinned
transform first. The payload's ``tenzro.encoding`` leaves room for one.

What it is NOT: the byte format (``payload``: ``encode_topk_payload``, ``encode_q8_payload`` and
``decode_payload``), aggregation (every payload decodes to a dense fp32 vector, so every rule
sees the same kind of input as for ``raw``), or any I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tenzro_training.errors import SpecError, TenzroError
from tenzro_training.fragments import DTYPES, FragmentLayout, is_sparse_index
from tenzro_training.payload import Q8_MAX, compute_q8_blocks
from tenzro_training.rules import AggregationRule, RuleKind

if TYPE_CHECKING:
    from tenzro_training.spec import TrainingTaskSpec

__all__ = [
    "DEFAULT_FEEDBACK_DECAY",
    "ENCODING_METADATA_KEY",
    "FEEDBACK_FORMAT",
    "MAX_DENSITY_BPS",
    "MAX_Q8_BLOCK",
    "MAX_TOPK_NUMEL",
    "MIN_Q8_BLOCK",
    "CompressionError",
    "ErrorFeedback",
    "PayloadEncoding",
    "dequantize_q8",
    "describe_sparse_cost",
    "quantize_q8",
    "select_topk",
]

ENCODING_METADATA_KEY = "outer_gradient_encoding"
"""``architecture.metadata`` key that selects the task's payload encoding."""
MAX_DENSITY_BPS = 5000
"""Top-k keeps at most half of a fragment. With a u32 index per value, a topk payload at 50%
is already as large as the raw fp32 one (and 1.5x a raw bf16 one: it saves bytes only below
~33% there), and no denser one fits the caps sized for raw payloads (``compute_max_payload_bytes``)."""
MAX_TOPK_NUMEL = 2**32
"""Indices travel as u32, so a top-k fragment holds at most 2^32 values."""
MIN_Q8_BLOCK, MAX_Q8_BLOCK = 16, 65536
"""The q8 block sizes a task may choose. Below 16 the scales cost more than the int8 values
save (a block of 16 at fp32 scales is 1.25 bytes per value); above 65536 one outlier flattens
too many values to zero."""

DEFAULT_FEEDBACK_DECAY = 0.95
"""``feedback_decay`` when a topk encoding does not give one. Measured on the dev example (30
rounds, M = K = 5, Mean; docs/trainer.md "Compressed outer gradients"): at 1% density 0.95
trained to a held-out loss of 0.570 against 0.783 undecayed (1), 0.768 at 0.99, 0.616 at 0.9; at
10%, 0.507 against 0.553 undecayed. SparseLoCo decays its error feedback too."""
FEEDBACK_FORMAT = "tenzro-error-feedback/1"
"""The ``format`` a saved :class:`ErrorFeedback` state names in its safetensors header."""

_PATH = f"architecture.metadata.{ENCODING_METADATA_KEY}"
_RAW, _TOPK, _Q8 = "raw", "topk", "q8"


class CompressionError(TenzroError, ValueError):
    """Top-k selection or quantisation was given inconsistent inputs (shapes, k, block, dtype)."""


@dataclass(frozen=True, slots=True)
class PayloadEncoding:
    """The payload encoding a task's trainers send: ``raw``, ``topk`` at ``density_bps`` or
    ``q8`` in blocks of ``block_size``.

    JSON (in ``architecture.metadata.outer_gradient_encoding``; absent means raw):
    ``"raw"``, ``{"topk": {"density_bps": N}}`` with 1 <= N <= 5000, the share of each
    fragment's values sent, in basis points, or ``{"q8": {"block_size": B}}`` with
    16 <= B <= 65536, the values that share one scale; each optionally with
    ``"feedback_decay": D`` (0 <= D <= 1). A ``topk`` payload of a fragment of n values carries
    exactly ``ceil(n * N / 10000)`` of them (:meth:`kept`); a ``q8`` one all n, as int8, and
    ``ceil(n / B)`` scales. D is the trainers' alone (the node never sees it): each round the
    residual is multiplied by D before the new outer gradient is added (absent:
    :data:`DEFAULT_FEEDBACK_DECAY`; 1 keeps plain error feedback, 0 none).
    """

    name: str = _RAW
    """``"raw"``, ``"topk"`` or ``"q8"`` (the payload's ``tenzro.encoding``)."""
    density_bps: int | None = None
    """For ``topk``: 1..5000; None otherwise."""
    feedback_decay: float | None = None
    """For ``topk``: what the error-feedback residual is multiplied by each round, 0..1 (None:
    absent from the JSON; :attr:`decay` is then :data:`DEFAULT_FEEDBACK_DECAY`). Why a decay:
    with the node's outer momentum as well, an undecayed residual is a second momentum on the
    same updates, and stale mass from old models keeps coming back (SparseLoCo decays it and
    drops the outer momentum; DeMo decays its momentum by 0.999)."""
    block_size: int | None = None
    """For ``q8``: 16..65536 values per scale; None otherwise."""

    def __post_init__(self) -> None:
        if self.name == _RAW:
            if self.density_bps is not None or self.feedback_decay is not None or self.block_size is not None:
                raise SpecError(_PATH, "raw takes no density_bps, block_size or feedback_decay")
            return
        if self.name == _TOPK:
            d = self.density_bps
            if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= MAX_DENSITY_BPS:
                raise SpecError(f"{_PATH}.topk.density_bps", f"must be an integer in 1..{MAX_DENSITY_BPS}, got {d!r}")
            if self.block_size is not None:
                raise SpecError(_PATH, "topk takes no block_size")
        elif self.name == _Q8:
            b = self.block_size
            if isinstance(b, bool) or not isinstance(b, int) or not MIN_Q8_BLOCK <= b <= MAX_Q8_BLOCK:
                raise SpecError(f"{_PATH}.q8.block_size",
                                f"must be an integer in {MIN_Q8_BLOCK}..{MAX_Q8_BLOCK}, got {_short(b)}")
            if self.density_bps is not None:
                raise SpecError(_PATH, "q8 takes no density_bps")
        else:
            raise SpecError(_PATH, f"unknown encoding {str(self.name)[:40]!r} (known: raw, topk, q8)")
        decay = self.feedback_decay
        if decay is not None and (isinstance(decay, bool) or not isinstance(decay, (int, float))
                                  or not 0 <= decay <= 1):  # NaN fails the comparison
            raise SpecError(f"{_PATH}.{self.name}.feedback_decay", f"must be a number in 0..1, got {_short(decay)}")

    @property
    def is_sparse(self) -> bool:
        """topk: most of each payload's positions decode as zero."""
        return self.name == _TOPK

    @property
    def has_feedback(self) -> bool:
        """topk and q8: the trainer keeps what it did not send (:class:`ErrorFeedback`)."""
        return self.name != _RAW

    @property
    def decay(self) -> float:
        """The residual's factor per round (topk and q8; 1.0 for raw, which keeps none)."""
        if not self.has_feedback:
            return 1.0
        return DEFAULT_FEEDBACK_DECAY if self.feedback_decay is None else float(self.feedback_decay)

    def kept(self, numel: int) -> int | None:
        """How many values a ``topk`` payload of a ``numel``-value fragment carries (None for raw)."""
        if self.density_bps is None:
            return None
        return -(-numel * self.density_bps // 10000)  # exact ceil in integers

    def kept_per_fragment(self, layouts: Sequence[FragmentLayout]) -> tuple[int | None, ...]:
        """:meth:`kept` of each fragment, in fragment order (what ``decode_payload(topk_k=)`` takes)."""
        return tuple(self.kept(lay.numel) for lay in layouts)

    def decode_options(self, layout: FragmentLayout) -> dict[str, int]:
        """What ``payload.decode_payload`` takes to accept this encoding's payloads of
        ``layout`` besides raw ones: ``topk_k`` or ``q8_block``; nothing for raw."""
        if self.name == _TOPK:
            return {"topk_k": self.kept(layout.numel)}  # type: ignore[dict-item]
        if self.name == _Q8:
            return {"q8_block": self.block_size}  # type: ignore[dict-item]
        return {}

    def check_layouts(self, layouts: Sequence[FragmentLayout]) -> None:
        """SpecError when a fragment is too large for u32 indices."""
        if self.is_sparse:
            for lay in layouts:
                if lay.numel > MAX_TOPK_NUMEL:
                    raise SpecError(_PATH, f"fragment {lay.index} has {lay.numel} values; topk indexes at most 2^32")

    def to_json(self) -> str | dict[str, dict[str, int | float]]:
        if self.name == _RAW:
            return _RAW
        inner: dict[str, int | float] = (
            {"density_bps": self.density_bps} if self.name == _TOPK else {"block_size": self.block_size}  # type: ignore[dict-item]
        )
        if self.feedback_decay is not None:
            inner["feedback_decay"] = self.feedback_decay
        return {self.name: inner}

    def describe(self) -> str:
        """``raw``, ``topk 1%``, ``q8 (blocks of 256)``; the wire format only (the decay is in
        :meth:`describe_feedback`)."""
        if self.name == _TOPK:
            return f"topk {self.density_bps / 100:g}%"  # type: ignore[operator]
        if self.name == _Q8:
            return f"q8 (blocks of {self.block_size})"
        return "raw"

    def describe_feedback(self) -> str:
        """How the trainers keep what they did not send (for their stdout)."""
        if self.decay == 1:
            return "error feedback"
        if self.decay == 0:
            return "no error feedback (feedback_decay 0)"
        return f"error feedback decayed by {self.decay:g} each round"

    @classmethod
    def from_json(cls, value: object) -> PayloadEncoding:
        """Parse the metadata value (SpecError with the field's path on anything else)."""
        if value == _RAW:
            return cls()
        if isinstance(value, Mapping) and len(value) == 1 and next(iter(value)) in _PARAMETER:
            name = next(iter(value))
            inner, param = value[name], _PARAMETER[name]
            if not isinstance(inner, Mapping) or param not in inner or not set(inner) <= {param, "feedback_decay"}:
                raise SpecError(f"{_PATH}.{name}",
                                f'must be {{"{param}": N}} or {{"{param}": N, "feedback_decay": D}}')
            if "feedback_decay" in inner and inner["feedback_decay"] is None:  # absent: the default; null: no number
                raise SpecError(f"{_PATH}.{name}.feedback_decay", "must be a number in 0..1, got null")
            if name == _TOPK:
                return cls(_TOPK, density_bps=inner[param], feedback_decay=inner.get("feedback_decay"))
            return cls(_Q8, block_size=inner[param], feedback_decay=inner.get("feedback_decay"))
        raise SpecError(_PATH, 'must be "raw", {"topk": {"density_bps": N[, "feedback_decay": D]}} or '
                        '{"q8": {"block_size": B[, "feedback_decay": D]}}, got ' + _short(value))

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> PayloadEncoding:
        return cls.from_json(metadata[ENCODING_METADATA_KEY]) if ENCODING_METADATA_KEY in metadata else cls()

    @classmethod
    def from_spec(cls, spec: TrainingTaskSpec) -> PayloadEncoding:
        """The task's encoding: raw unless ``architecture.metadata`` selects topk or q8. Strict: for
        posting (postTask, ``tenzro train post-task``); a stored run is read with :meth:`of_run`."""
        return cls.from_metadata(spec.architecture.metadata)

    @classmethod
    def of_run(cls, spec: TrainingTaskSpec) -> PayloadEncoding:
        """The encoding a stored run's payloads are decoded by: :meth:`from_spec`, except that a
        value that does not parse means raw. Until 2026-11-27 the key was free-form metadata, so
        a run posted before then may carry anything there, and its node decoded raw payloads
        only: reading such a run strictly would make its rounds impossible to finalize, replay
        or verify after an upgrade."""
        try:
            return cls.from_spec(spec)
        except SpecError:
            return cls()


def describe_sparse_cost(encoding: PayloadEncoding, rule: AggregationRule) -> str | None:
    """What sparse payloads cost under ``rule``, for the sponsor before posting; None for raw
    and for Mean. The robust rules discard or select whole inputs per coordinate, and sparse
    inputs are mostly zeros: on the dev example at topk 10% they trained to a held-out loss of
    0.79-1.14 against 0.55-0.60 with raw payloads (docs/aggregation.md "Sparse inputs")."""
    if not encoding.is_sparse or rule.kind is RuleKind.MEAN:
        return None
    what = {
        RuleKind.COORDINATE_MEDIAN: "CoordinateMedian leaves every coordinate that fewer than about half of the "
                                    "accepted trainers sent at zero",
        RuleKind.TRIMMED_MEAN: "TrimmedMean trims away every coordinate that only the trimmed few trainers sent",
        RuleKind.KRUM: "Krum applies one trainer's top-k per round",
    }[rule.kind]
    return (f"outer gradients travel as {encoding.describe()} of each fragment, and {what}: expect slower training "
            "than with raw payloads or with Mean")


_PARAMETER = {_TOPK: "density_bps", _Q8: "block_size"}  # each encoding's one required parameter


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _checked_input(compensated: torch.Tensor, dtype: str, what: str, value: object, low: int,
                   high: int | None) -> torch.Tensor:
    """The vector to compress, on the CPU, once the checks both compressors share passed;
    ``what`` names the compressor's own integer parameter (k, the block size), ``value``, which
    must lie in ``low..high`` (no upper bound: None)."""
    if compensated.dim() != 1 or compensated.dtype != torch.float32:
        raise CompressionError(f"need a 1-D float32 vector, got {tuple(compensated.shape)} {compensated.dtype}")
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bounds = f"in {low}..{high}" if high is not None else f">= {low}"
        raise CompressionError(f"{what} must be an integer {bounds}, got {value!r}")
    if dtype not in DTYPES:
        raise CompressionError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    flat = compensated.detach().to("cpu")
    if not bool(torch.isfinite(flat).all()):
        raise CompressionError("the vector to compress holds NaN or Inf")
    return flat


def select_topk(compensated: torch.Tensor, k: int, dtype: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``k`` largest magnitudes of ``compensated`` (1-D fp32), as sent: ``(indices, values,
    residual)``.

    ``indices`` are int64, strictly ascending (the payload's canonical order); ``values`` are
    those entries cast to ``dtype`` (round to nearest even); ``residual`` is ``compensated``
    minus what the receiver decodes (the unsent values, plus the cast's rounding error at the
    sent ones), which the next round adds back. Ties among equal magnitudes go to the lower
    index, so the choice is a function of the values alone.
    """
    flat = _checked_input(compensated, dtype, "k", k, 0, compensated.numel())
    indices = _largest_magnitudes(flat, k)
    values = flat[indices].to(DTYPES[dtype])
    if not bool(torch.isfinite(values).all()):  # before the caller's residual could take an Inf
        raise CompressionError(f"a value to send overflows {dtype}")
    residual = flat.clone()
    residual[indices] -= values.to(torch.float32)
    return indices, values, residual


def _largest_magnitudes(flat: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest |values|, ascending, ties at the k-th magnitude to the lowest
    indices: the order a stable sort on -|x| gives, at topk's cost (a full sort of 1M values took
    ~130 ms against ~25 ms; a trainer compresses every fragment every round)."""
    if k == 0:
        return torch.empty(0, dtype=torch.int64)
    magnitude = flat.abs()
    threshold = torch.topk(magnitude, k, sorted=False).values.min()
    above = (magnitude > threshold).nonzero().flatten()  # fewer than k, ascending
    ties = (magnitude == threshold).nonzero().flatten()[: k - above.numel()]
    return torch.sort(torch.cat([above, ties])).values


def quantize_q8(compensated: torch.Tensor, block: int, dtype: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``compensated`` (1-D fp32) as a q8 payload sends it: ``(scales, values, residual)``.

    Each block of ``block`` values (the last may be shorter) gets the scale ``max|x| / 127``,
    cast to ``dtype`` (round to nearest even); each value becomes ``round(x / scale)`` (half to
    even) clamped to -127..127, or 0 where the scale is 0. ``residual`` is ``compensated`` minus
    what the receiver decodes (:func:`dequantize_q8`, the decoder's own arithmetic), which the
    next round adds back: the rounding, and whatever a scale that rounded down clamped away.
    """
    flat = _checked_input(compensated, dtype, "the block size", block, 1, None)
    n = flat.numel()
    blocks = compute_q8_blocks(n, block)
    padded = torch.zeros(blocks * block, dtype=torch.float32)
    padded[:n] = flat
    rows = padded.view(blocks, block)
    scales = (rows.abs().amax(dim=1) / Q8_MAX).to(DTYPES[dtype])
    if not bool(torch.isfinite(scales).all()):  # fp16's 65504 * 127 and beyond
        raise CompressionError(f"a scale to send overflows {dtype}")
    wide = scales.to(torch.float32)
    # A zero scale divides by 1 instead, which rounds its block to zeros: the scale is 0 only
    # where every magnitude is below 127 times half the smallest subnormal of ``dtype``.
    divisor = torch.where(wide > 0, wide, torch.ones_like(wide))
    q = torch.round(rows / divisor[:, None]).clamp_(-Q8_MAX, Q8_MAX)
    values = q.to(torch.int8).reshape(-1)[:n].contiguous()
    residual = flat - dequantize_q8(wide, values, block)
    return scales, values, residual


def dequantize_q8(scales: torch.Tensor, values: torch.Tensor, block: int) -> torch.Tensor:
    """What a q8 payload decodes to: ``float32(values[i]) * float32(scales[i // block])``, one
    IEEE fp32 product per value (the decoder's arithmetic, ``payload._read_q8``)."""
    n = values.numel()
    blocks = compute_q8_blocks(n, block)
    if scales.numel() != blocks:
        raise CompressionError(f"{n} values in blocks of {block} need {blocks} scales, got {scales.numel()}")
    per_value = scales.to(torch.float32).repeat_interleave(block)[:n]
    return values.to(torch.float32) * per_value


class ErrorFeedback:
    """A trainer's unsent outer-gradient mass, one fp32 vector per fragment, carried across
    rounds. The trainer process saves it every round (:meth:`to_bytes`) and a restarted one
    continues from it (:meth:`from_bytes`): on the k-th of n values per round, the residual
    holds most of what the trainer computed and has not yet sent."""

    def __init__(self, layouts: Sequence[FragmentLayout], encoding: PayloadEncoding) -> None:
        if not encoding.has_feedback:
            raise CompressionError("error feedback is for a compressed encoding (topk, q8)")
        self._layouts = tuple(layouts)
        self._encoding = encoding
        self._k = encoding.kept_per_fragment(self._layouts)
        self._residual: list[torch.Tensor | None] = [None] * len(self._layouts)
        self._sent: list[tuple[torch.Tensor | None, torch.Tensor] | None] = [None] * len(self._layouts)
        """Per fragment, the last :meth:`compress`'s indices (topk; None for q8, whose values
        are the whole fragment) and values as the node decodes them, until
        :meth:`restore_unsent` puts them back (once)."""

    @property
    def encoding(self) -> PayloadEncoding:
        return self._encoding

    def residual_norm(self) -> float:
        """L2 norm of everything not yet sent (0.0 before the first round)."""
        return math.sqrt(sum(float(r.double().square().sum()) for r in self._residual if r is not None))

    def compress(self, grads: Sequence[torch.Tensor], dtype: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This round's (indices, values) per fragment (topk), or (scales, values) (q8); the
        residuals advance. All inputs are checked before any residual changes."""
        if len(grads) != len(self._layouts):
            raise CompressionError(f"{len(self._layouts)} fragments but {len(grads)} outer gradients")
        for lay, g in zip(self._layouts, grads):
            if g.dim() != 1 or g.numel() != lay.numel or g.dtype != torch.float32:
                raise CompressionError(f"fragment {lay.index} needs a 1-D float32 vector of {lay.numel} values")
        out: list[tuple[torch.Tensor, torch.Tensor]] = []
        sent: list[tuple[torch.Tensor | None, torch.Tensor] | None] = []
        residuals: list[torch.Tensor | None] = []
        decay = self._encoding.decay
        for g, k, r in zip(grads, self._k, self._residual):
            if r is None or decay == 0:
                compensated = g.detach().to("cpu")
            elif decay == 1:
                compensated = g.detach().to("cpu") + r
            else:
                compensated = g.detach().to("cpu") + r * decay
            if self._encoding.is_sparse:
                assert k is not None
                idx, vals, rest = select_topk(compensated, k, dtype)
                out.append((idx, vals))
                sent.append((idx, vals.to(torch.float32)))
            else:
                assert self._encoding.block_size is not None
                scales, vals, rest = quantize_q8(compensated, self._encoding.block_size, dtype)
                out.append((scales, vals))
                sent.append((None, dequantize_q8(scales, vals, self._encoding.block_size)))
            residuals.append(rest)
        self._residual = residuals
        self._sent = sent
        return out

    def to_bytes(self, metadata: Mapping[str, str]) -> bytes:
        """This state (each fragment's residual and the last round's sent values not yet
        restored) as safetensors bytes, ``metadata`` in the header, for :meth:`from_bytes` in
        a restarted trainer. Lossless: the restarted trainer continues bit for bit."""
        from safetensors.torch import save

        tensors: dict[str, torch.Tensor] = {}
        for f, (residual, sent) in enumerate(zip(self._residual, self._sent)):
            if residual is not None:
                tensors[f"residual.{f}"] = residual
            if sent is not None:
                if sent[0] is not None:
                    tensors[f"sent_indices.{f}"] = sent[0]
                tensors[f"sent_values.{f}"] = sent[1]
        header = dict(metadata) | {
            "format": FEEDBACK_FORMAT,
            "encoding": json.dumps(self._encoding.to_json(), sort_keys=True),
            "numels": json.dumps([lay.numel for lay in self._layouts]),
        }
        return save(tensors, metadata=header)

    @classmethod
    def from_bytes(cls, layouts: Sequence[FragmentLayout], encoding: PayloadEncoding,
                   data: bytes) -> tuple[ErrorFeedback, dict[str, str]]:
        """The state :meth:`to_bytes` wrote, for these layouts and this encoding, and the
        header's metadata. CompressionError for anything else: another encoding or model,
        unknown or missing tensors, non-finite values, sent indices out of order or range."""
        from tenzro_training.tensorfile import load_tensors

        try:
            n = int.from_bytes(data[:8], "little")
            metadata = json.loads(data[8 : 8 + n]).get("__metadata__") or {}
            tensors = load_tensors(data)
            if not isinstance(metadata, dict):
                raise ValueError("its header metadata is not an object")
        except Exception as exc:  # noqa: BLE001 -- a file on disk, maybe damaged: any failure to parse is this
            raise CompressionError(f"not a saved error-feedback state: {type(exc).__name__}: {exc}") from None
        fb = cls(layouts, encoding)
        if metadata.get("format") != FEEDBACK_FORMAT:
            raise CompressionError(f"format is {str(metadata.get('format'))[:40]!r}, not {FEEDBACK_FORMAT!r}")
        if metadata.get("encoding") != json.dumps(encoding.to_json(), sort_keys=True):
            raise CompressionError(f"saved for encoding {str(metadata.get('encoding'))[:60]}, the task has "
                                   f"{encoding.describe()}")
        if metadata.get("numels") != json.dumps([lay.numel for lay in fb._layouts]):
            raise CompressionError("saved for fragments of other sizes")
        names = set(tensors)
        for f, (lay, k) in enumerate(zip(fb._layouts, fb._k)):
            residual = tensors.pop(f"residual.{f}", None)
            indices, values = tensors.pop(f"sent_indices.{f}", None), tensors.pop(f"sent_values.{f}", None)
            if residual is not None:
                if residual.dtype != torch.float32 or tuple(residual.shape) != (lay.numel,):
                    raise CompressionError(f"residual.{f} must be float32 [{lay.numel}]")
                if not bool(torch.isfinite(residual).all()):
                    raise CompressionError(f"residual.{f} holds NaN or Inf")
                fb._residual[f] = residual
            if indices is None and values is None:
                continue
            sparse = encoding.is_sparse
            if values is None or residual is None or (indices is None) == sparse:
                raise CompressionError(f"fragment {f}: sent {'indices, sent ' if sparse else ''}values and residual "
                                       "go together" + ("" if sparse else " (q8 sends no indices)"))
            count = k if sparse else lay.numel
            if values.dtype != torch.float32 or tuple(values.shape) != (count,) or not bool(torch.isfinite(values).all()):
                raise CompressionError(f"sent_values.{f} must be finite float32 [{count}]")
            if indices is not None:
                if indices.dtype != torch.int64 or tuple(indices.shape) != (k,):
                    raise CompressionError(f"sent_indices.{f} must be int64 [{k}]")
                if not is_sparse_index(indices, lay.numel):
                    raise CompressionError(f"sent_indices.{f} must ascend strictly within 0..{lay.numel - 1}")
            fb._sent[f] = (indices, values)
        if tensors:
            raise CompressionError(f"unknown tensors {sorted(tensors)[:4]} (of {len(names)})")
        return fb, {str(key): str(value) for key, value in metadata.items()}

    def restore_unsent(self, fragments: Sequence[int]) -> int:
        """The last round's values of ``fragments`` did not reach the model (the round closed
        to this trainer, or nothing was signed): add them back to the residual, so that they
        are sent later instead of lost. Each fragment's values come back at most once; returns
        how many fragments did."""
        restored = 0
        for f in fragments:
            sent, residual = self._sent[f], self._residual[f]
            if sent is None or residual is None:
                continue
            if sent[0] is None:
                residual += sent[1]
            else:
                residual[sent[0]] += sent[1]
            self._sent[f] = None
            restored += 1
        return restored
