"""Byzantine-robust aggregation of one fragment's K outer gradients (SPEC.md "Aggregation rules").

What this module is: ``aggregate(rule, tensors)``, which applies a task's rule (Mean,
TrimmedMean, CoordinateMedian, Krum, and Multi-Krum as a Krum option) to K same-shaped tensors
given in canonical order, and returns the float32 aggregate with an ``AggregationReport``: what
the rule decided (Krum's selected input and scores, how many values TrimmedMean dropped per
side). The report's canonical bytes and hash go into the round record.

The arithmetic is pinned, not "whatever torch does": every result is bit-identical across runs,
processes, thread counts and CPUs, and a third party can reproduce it with numpy
(docs/aggregation.md states each rule's exact float semantics). The fast kernels live in
``_selection``; this module validates inputs, dispatches and builds the report.

What it is NOT: the rule value (``rules.AggregationRule``, re-exported here), payload decoding
(``payload``), the outer optimizer (``outer``), or any I/O.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import rfc8785
import torch

from tenzro_training import _selection
from tenzro_training.errors import AggregationError
from tenzro_training.rules import AggregationRule, RuleKind

__all__ = [
    "AggregationRule",
    "RuleKind",
    "AggregationReport",
    "AggregationResult",
    "NonFiniteInputError",
    "AggregationOverflowError",
    "REPORT_DOMAIN",
    "ACCEPTED_DTYPES",
    "aggregate",
    "compute_krum_distances",
    "compute_krum_scores",
    "compute_krum_selection",
]

REPORT_DOMAIN = "tenzro/train/aggregation-report/v1"
"""The ``domain`` member of every report's canonical JSON (versions the encoding)."""

ACCEPTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
"""Input dtypes; each converts exactly to float32, in which every rule accumulates."""


class NonFiniteInputError(AggregationError):
    """An input holds NaN or +-Inf; ``index`` is its canonical position."""

    def __init__(self, index: int) -> None:
        self.index = index
        super().__init__(f"input {index} holds a non-finite value (NaN or Inf)")


class AggregationOverflowError(AggregationError):
    """Finite inputs whose float32 sum overflows: the pinned arithmetic has no finite result."""

    def __init__(self, rule: AggregationRule) -> None:
        self.rule = rule
        super().__init__(f"{rule.kind.spec_name}: the float32 sum overflows (inputs too large)")


@dataclass(frozen=True, slots=True)
class AggregationReport:
    """What a rule decided for one fragment; its canonical bytes are hashed into the round record."""

    rule: AggregationRule
    """The rule that was applied."""
    k: int
    """How many inputs (K) were aggregated."""
    trimmed_per_side: int
    """TrimmedMean: values dropped from EACH end, floor(K * alpha_bps / 10000); 0 otherwise."""
    selected: int | None
    """Krum: canonical index of the input with the lowest score (ties: lowest index); else None."""
    selected_set: tuple[int, ...] | None
    """Multi-Krum: the m canonical indices with the lowest scores, ascending; else None."""
    scores: tuple[float, ...] | None
    """Krum: score(i) per input in canonical order (float64, see docs/aggregation.md); else None."""

    def canonical_bytes(self) -> bytes:
        """RFC 8785 JSON of the report; scores as the 16 hex digits of their IEEE-754 bits.

        Example: ``{"domain":"tenzro/train/aggregation-report/v1","k":8,"rule":{"Krum":{"f":2}},
        "scores":["0x4010000000000000",...],"selected":3,"selected_set":null,"trimmed_per_side":0}``
        """
        scores = None
        if self.scores is not None:
            scores = ["0x" + struct.pack(">d", s).hex() for s in self.scores]
        document = {
            "domain": REPORT_DOMAIN,
            "k": self.k,
            "rule": self.rule.to_spec(),
            "scores": scores,
            "selected": self.selected,
            "selected_set": None if self.selected_set is None else list(self.selected_set),
            "trimmed_per_side": self.trimmed_per_side,
        }
        return rfc8785.dumps(document)

    def report_hash(self) -> bytes:
        """SHA-256 of ``canonical_bytes()`` (32 bytes): FragmentOutcome.report_hash."""
        return hashlib.sha256(self.canonical_bytes()).digest()


@dataclass(frozen=True, slots=True, eq=False)
class AggregationResult:
    """The aggregate of one fragment and the report of how it was obtained."""

    tensor: torch.Tensor
    """float32, shaped like one input; a fresh tensor, or a view of the caller's ``out``
    (never a view of an input)."""
    report: AggregationReport
    """The rule's decisions (for the round record)."""


# --- validation --------------------------------------------------------------------------------


def _as_rows(tensors: Sequence[torch.Tensor] | torch.Tensor) -> tuple[list[torch.Tensor], torch.Size]:
    """The K inputs as flat contiguous rows, and the shape of one input."""
    if isinstance(tensors, torch.Tensor):
        if tensors.dim() < 1:
            raise AggregationError("a stacked input must have a leading K dimension")
        items: list[object] = list(tensors.unbind(0))
    elif isinstance(tensors, (str, bytes)) or not isinstance(tensors, Sequence):
        raise AggregationError(f"inputs must be a sequence of tensors, got {type(tensors).__name__}")
    else:
        items = list(tensors)
    if not items:
        raise AggregationError("need at least one input (K >= 1)")
    rows: list[torch.Tensor] = []
    shape: torch.Size | None = None
    for index, item in enumerate(items):
        if not isinstance(item, torch.Tensor):
            raise AggregationError(f"input {index} is a {type(item).__name__}, not a tensor")
        if item.dtype not in ACCEPTED_DTYPES:
            raise AggregationError(f"input {index} has dtype {item.dtype}; accepted: float32, float16, bfloat16")
        if item.device.type != "cpu":
            raise AggregationError(f"input {index} is on {item.device}; aggregation runs on CPU tensors")
        if item.is_sparse or item.is_quantized:
            raise AggregationError(f"input {index} must be a dense tensor")
        if shape is None:
            shape = item.shape
        elif item.shape != shape:
            raise AggregationError(f"input {index} has shape {tuple(item.shape)}, input 0 has {tuple(shape)}")
        rows.append(item.detach().reshape(-1).contiguous())
    assert shape is not None  # items is non-empty: internal invariant, not input validation
    return rows, shape


def _is_all_finite(row: torch.Tensor) -> bool:
    if row.numel() == 0:
        return True
    # One read-only pass with no temporary (~memory speed for all three dtypes); min and max
    # propagate NaN, and any +-Inf is the min or the max.
    low, high = torch.aminmax(row)
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


def _validate_finite(rows: Sequence[torch.Tensor]) -> None:
    for index, row in enumerate(rows):
        if not _is_all_finite(row):
            raise NonFiniteInputError(index)


def _validate_out(out: torch.Tensor, n: int, rows: Sequence[torch.Tensor]) -> None:
    if not isinstance(out, torch.Tensor) or out.dtype != torch.float32 or out.device.type != "cpu":
        raise AggregationError("out must be a float32 CPU tensor")
    if out.numel() != n or not out.is_contiguous():
        raise AggregationError(f"out must be contiguous with {n} elements, got {out.numel()}")
    begin, end = out.data_ptr(), out.data_ptr() + 4 * n
    for index, row in enumerate(rows):
        # The kernels read inputs after writing parts of the output: an alias would corrupt them.
        row_begin = row.data_ptr()
        if n and row_begin < end and begin < row_begin + row.numel() * row.element_size():
            raise AggregationError(f"out overlaps input {index}")


def _validate_multi_krum(rule: AggregationRule, k: int, m: int | None) -> None:
    if m is None:
        return
    if rule.kind is not RuleKind.KRUM:
        raise AggregationError(f"multi_krum_m applies to Krum only, not {rule.kind.spec_name}")
    if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= k - rule.param:
        raise AggregationError(f"multi_krum_m must be an integer in 1..K-f = {k - rule.param}, got {m!r}")


# --- Krum ------------------------------------------------------------------------------------


def compute_krum_distances(rows: Sequence[torch.Tensor]) -> tuple[tuple[float, ...], ...]:
    """Squared L2 distances D[i][j] between the K rows, as pinned in docs/aggregation.md.

    G = pairwise tree sum over 512-coordinate blocks of each block's exact Gram matrix of the
    rounded rows; D[i][j] = (G[i][i] + G[j][j]) - 2 G[i][j] in float64, clamped below at +0.0.
    ``rows``: finite 1-D tensors of one length (float32/float16/bfloat16).
    """
    k = len(rows)
    n = rows[0].numel()
    nblocks = max(1, -(-n // _selection.GRAM_BLOCK))
    size = 1
    while size < nblocks:
        size *= 2
    blocks = torch.zeros(size, k, k, dtype=torch.float64)
    if n:
        _selection.block_grams_into(rows, blocks)
    gram = _selection.compute_tree_sum(blocks).tolist()
    distances = []
    for i in range(k):
        row = []
        for j in range(k):
            d = (gram[i][i] + gram[j][j]) - 2.0 * gram[i][j]
            row.append(d if d > 0.0 else 0.0)
        distances.append(tuple(row))
    return tuple(distances)


def compute_krum_scores(distances: Sequence[Sequence[float]], neighbours: int) -> tuple[float, ...]:
    """score(i) = sum of the ``neighbours`` smallest D[i][j], j != i, added in ascending order."""
    k = len(distances)
    scores = []
    for i in range(k):
        nearest = sorted(distances[i][j] for j in range(k) if j != i)[:neighbours]
        total = 0.0
        for d in nearest:
            total += d
        scores.append(total)
    return tuple(scores)


def compute_krum_selection(scores: Sequence[float], m: int = 1) -> tuple[int, ...]:
    """The m indices with the lowest scores (ties: lowest index first), in ascending index order."""
    ranked = sorted(range(len(scores)), key=lambda i: (scores[i], i))
    return tuple(sorted(ranked[:m]))


# --- the rule --------------------------------------------------------------------------------


@torch.no_grad()
def aggregate(
    rule: AggregationRule,
    tensors: Sequence[torch.Tensor] | torch.Tensor,
    *,
    multi_krum_m: int | None = None,
    out: torch.Tensor | None = None,
    inputs_checked: bool = False,
) -> AggregationResult:
    """Aggregate K same-shaped tensors (canonical order) with ``rule``; see docs/aggregation.md.

    ``tensors`` is a sequence of K tensors or one stacked tensor [K, ...]; float32, float16 or
    bfloat16 on CPU. ``multi_krum_m`` (Krum only): average the m lowest-score inputs instead of
    returning the single best. Raises AggregationError (K < 1, shape/dtype mismatch, rule does not
    fit K, bad ``out``), NonFiniteInputError, or AggregationOverflowError.

    ``out``: a contiguous float32 CPU tensor of one input's element count, overlapping no input,
    that receives the aggregate (the result's tensor is then a view of it); same bits as without.
    For a caller that aggregates round after round: on a small VM a fresh 4 MB output costs
    ~1000 page faults, measured at ~6 ms, more than the Mean itself. Its contents are garbage
    if this raises.

    ``inputs_checked``: the caller has already checked every input holds no NaN or Inf (the
    node checks each payload's values when it accepts it), so the scan of every input is
    skipped: one full read of K inputs, ~48 ms of a ~0.17 s finalize of a 12.6M-parameter
    model with K = 8 (docs/node.md "Finalize cost"). With an unchecked non-finite input the
    result is undefined (a TrimmedMean can trim an Inf away); anything else must leave it off.
    The sum rules' overflow check on the result runs either way.
    """
    if not isinstance(rule, AggregationRule):
        raise AggregationError(f"rule must be an AggregationRule, got {type(rule).__name__}")
    rows, shape = _as_rows(tensors)
    k = len(rows)
    rule.validate_for_quorum(k)
    _validate_multi_krum(rule, k, multi_krum_m)
    if not inputs_checked:
        _validate_finite(rows)
    n = rows[0].numel()
    if out is not None:
        _validate_out(out, n, rows)
    trimmed = rule.trimmed_per_side(k)
    selected: int | None = None
    selected_set: tuple[int, ...] | None = None
    scores: tuple[float, ...] | None = None
    if rule.kind is RuleKind.KRUM:
        scores = compute_krum_scores(compute_krum_distances(rows), rule.neighbours(k))
        selected = compute_krum_selection(scores)[0]
        if multi_krum_m is None:
            if out is None:
                out = rows[selected].to(torch.float32, copy=True)
            else:
                out.copy_(rows[selected])  # an exact widening for float16/bfloat16
        else:
            selected_set = compute_krum_selection(scores, multi_krum_m)
            out = torch.empty(n, dtype=torch.float32) if out is None else out
            _selection.mean_into([rows[i] for i in selected_set], out)
    else:
        out = torch.empty(n, dtype=torch.float32) if out is None else out
        if rule.kind is RuleKind.MEAN:
            _selection.mean_into(rows, out)
        elif rule.kind is RuleKind.COORDINATE_MEDIAN:
            _selection.median_into(rows, out)
        else:
            _selection.trimmed_mean_into(rows, out, trimmed)
    # Sums of finite float32 values can overflow; a median or Krum's single pick cannot.
    sums = rule.kind in (RuleKind.MEAN, RuleKind.TRIMMED_MEAN) or multi_krum_m is not None
    if n and sums and not _is_all_finite(out):
        raise AggregationOverflowError(rule)
    report = AggregationReport(rule, k, trimmed, selected, selected_set, scores)
    return AggregationResult(out.reshape(shape), report)
