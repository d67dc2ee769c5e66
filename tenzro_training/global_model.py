"""The global model of one run and the round update that turns accepted outer gradients into
the next global model: shared by the node, the trainers and any third-party verifier.

What this module is: :class:`ModelLayout` (the run's tensor list and its F fragment layouts),
:func:`compute_initial_model` (init checkpoint -> layouts, fragment weights, initial model
hash), and :func:`compute_round_update`: per fragment, decode the accepted payloads in canonical
order, aggregate them with the task's rule, hash the aggregate, build the FragmentOutcome, apply
the outer Nesterov step; then hash the whole new model. Everything here is a deterministic
function of its inputs (payloads, weights, momentum), so a restarted node, a trainer or a third
party recomputes the same aggregates and model hashes bit for bit.

What it is NOT: storage or I/O (``node.model_state`` holds the stored byte encodings), nor a new
rule: aggregation, hashing and the outer step are ``aggregation``, ``fragments`` and ``outer``;
this module only strings them together in the one order the protocol fixes.

The node holds the model in float32 whatever ``architecture.dtype`` says: the init checkpoint is
widened to fp32 before its layouts and hash are computed, so trainers compute layouts from the
same fp32 state (docs/node.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch

from tenzro_training.aggregation import AggregationReport, aggregate
from tenzro_training.compression import PayloadEncoding
from tenzro_training.errors import FragmentError, TenzroError
from tenzro_training.fragments import (
    FragmentLayout,
    ModelHashStream,
    TensorSpec,
    compute_aggregate_hash,
    compute_fragment_layouts,
    compute_model_hash,
    compute_raw_le_bytes,
    compute_tensor_specs,
    gather_fragment,
    scatter_fragment,
)
from tenzro_training.outer import OuterConfig, apply_outer_step, apply_outer_step_
from tenzro_training.payload import ENCODING_RAW, PayloadHeader, decode_payload
from tenzro_training.records import FragmentOutcome, RoundRecord
from tenzro_training.spec import TrainingTaskSpec

_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)

__all__ = [
    "INLINE",
    "InitialModel",
    "ModelLayout",
    "Pending",
    "RecordMismatch",
    "RoundBuffers",
    "RoundUpdate",
    "Worker",
    "check_round_update",
    "compute_final_model_file_bytes",
    "compute_full_state",
    "compute_initial_model",
    "compute_model_file_bytes",
    "compute_round_update",
    "compute_state_model_hash",
]

@dataclass(frozen=True, slots=True)
class ModelLayout:
    """A run's global model shape: every tensor (zero-element ones included: they count in the
    model hash) and the fragment layouts computed from them."""

    specs: tuple[TensorSpec, ...]
    """Every tensor, ascending by name (UTF-8 bytes), dtype ``float32``."""
    layouts: tuple[FragmentLayout, ...]
    """``fragments.compute_fragment_layouts(specs, F)``."""

    @classmethod
    def from_specs(cls, specs: Sequence[TensorSpec], fragment_count: int) -> ModelLayout:
        ordered = compute_tensor_specs(list(specs))
        return cls(ordered, compute_fragment_layouts(ordered, fragment_count))

    def to_view(self) -> list[dict[str, Any]]:
        """The getRun JSON of the layouts: per fragment its index, element count, layout hash
        and slices (tensor name, full shape, dtype, flat start/stop)."""
        return [
            {
                "index": lay.index,
                "numel": lay.numel,
                "layout_hash": "0x" + lay.layout_hash().hex(),
                "entries": [
                    {"name": e.name, "shape": list(e.shape), "dtype": e.dtype, "start": e.start, "stop": e.stop}
                    for e in lay.entries
                ],
            }
            for lay in self.layouts
        ]

    def to_empty_tensors_view(self) -> list[dict[str, Any]]:
        """The getRun JSON of the zero-element tensors (``{name, shape}``): no fragment names
        them, yet each has a record in the model hash, so a trainer needs them to check it."""
        return [{"name": s.name, "shape": list(s.shape)} for s in self.specs if s.numel == 0]

    @classmethod
    def from_views(cls, layouts: Sequence[FragmentLayout], empty_tensors: Sequence[TensorSpec] = ()) -> ModelLayout:
        """The model a node serves in getRun: every tensor some fragment slices, plus the empty
        ones it lists apart, in name order (fp32). FragmentError on a duplicate or a non-empty
        "empty" tensor."""
        specs: dict[str, TensorSpec] = {}
        for lay in layouts:
            for e in lay.entries:
                specs.setdefault(e.name, TensorSpec(e.name, tuple(e.shape), "float32"))
        for spec in empty_tensors:
            if spec.numel != 0 or spec.name in specs:
                raise FragmentError(f"{spec.name!r} is listed as an empty tensor but is not one")
            specs[spec.name] = TensorSpec(spec.name, tuple(spec.shape), "float32")
        return cls(tuple(sorted(specs.values(), key=lambda s: s.name.encode("utf-8"))), tuple(layouts))


@dataclass(frozen=True, slots=True, eq=False)
class InitialModel:
    model: ModelLayout
    weights: tuple[torch.Tensor, ...]
    """Per fragment, the flat fp32 weights."""
    model_hash: bytes
    """``fragments.compute_model_hash`` of the fp32 state."""


def compute_initial_model(state_fp32: Mapping[str, torch.Tensor], fragment_count: int) -> InitialModel:
    """Layouts, fragment weights and model hash of an fp32 init state (FragmentError if it
    cannot be split into ``fragment_count`` fragments)."""
    model = ModelLayout(compute_tensor_specs(state_fp32), compute_fragment_layouts(state_fp32, fragment_count))
    weights = tuple(gather_fragment(state_fp32, lay) for lay in model.layouts)
    return InitialModel(model, weights, compute_model_hash(state_fp32))


def compute_full_state(model: ModelLayout, fragments: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The whole fp32 state dict with each fragment scattered into place."""
    if len(fragments) != len(model.layouts):
        raise ValueError(f"{len(fragments)} fragments for {len(model.layouts)} layouts")
    state = {s.name: torch.zeros(s.shape, dtype=torch.float32) for s in model.specs}
    for lay, flat in zip(model.layouts, fragments):
        scatter_fragment(state, lay, flat)
    return state


def compute_state_model_hash(model: ModelLayout, fragments: Sequence[torch.Tensor]) -> bytes:
    """The global model hash of these fragment weights: ``compute_model_hash`` of the fp32 state
    they scatter into, streamed fragment by fragment without building that state."""
    if len(fragments) != len(model.layouts):
        raise ValueError(f"{len(fragments)} fragments for {len(model.layouts)} layouts")
    stream = ModelHashStream(model.specs)
    for lay, flat in zip(model.layouts, fragments):
        _check_fragment_length(lay, flat)
        stream.update(flat)
    return stream.digest()


def _check_fragment_length(layout: FragmentLayout, flat: torch.Tensor) -> None:
    # The stream only counts elements; a wrong split must not hash like the right one.
    if not isinstance(flat, torch.Tensor) or flat.numel() != layout.numel:
        got = flat.numel() if isinstance(flat, torch.Tensor) else type(flat).__name__
        raise FragmentError(f"fragment {layout.index} has {got} elements, its layout {layout.numel}")


def compute_final_model_file_bytes(
    task_id: str, final_model_hash: bytes, run_root: bytes, model: ModelLayout, fragments: Sequence[torch.Tensor]
) -> bytes:
    """A sealed run's final model file: :func:`compute_model_file_bytes` of the final weights
    with the run, its final model hash and run root as ``__metadata__`` (what ``evaluate-model``
    reads back to say which run a file is of).

    Why here and not in the node: the file's bytes are a function of the receipt and the final
    weights alone, so a third party that replayed the run rebuilds them exactly and compares
    them byte for byte with the file a node serves (``tenzro train verify-run``,
    ``export-model`` without a data dir)."""
    metadata = {
        "format": "pt",
        "tenzro.task_id": task_id,
        "tenzro.model_hash": "0x" + final_model_hash.hex(),
        "tenzro.run_root": "0x" + run_root.hex(),
    }
    return compute_model_file_bytes(model, fragments, metadata)


def compute_model_file_bytes(
    model: ModelLayout, fragments: Sequence[torch.Tensor], metadata: Mapping[str, str]
) -> bytes:
    """The safetensors bytes of the full fp32 model, byte-for-byte deterministic.

    Written here rather than by ``safetensors.torch.save``, whose header lists ``__metadata__``
    entries in hash-map order (two calls gave different bytes): the header is JSON with sorted
    keys, tensors are laid out in name order (UTF-8 bytes), the data starts 8-byte aligned.
    Any safetensors reader loads it.
    """
    state = compute_full_state(model, fragments)
    header: dict[str, Any] = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}}
    chunks: list[bytes] = []
    offset = 0
    for spec in model.specs:  # already in name order
        data = bytes(compute_raw_le_bytes(state[spec.name])) if spec.numel else b""
        header[spec.name] = {"dtype": "F32", "shape": list(spec.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    text += b" " * (-len(text) % 8)
    return b"".join([len(text).to_bytes(8, "little"), text, *chunks])


# --- the round update ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class RoundUpdate:
    """What finalizing one round computes from the stored inputs."""

    outcomes: tuple[FragmentOutcome, ...]
    """Per fragment: aggregate hash, accepted trainers, Krum selection, trimmed count, report hash."""
    reports: tuple[AggregationReport, ...]
    """Per fragment, the full aggregation report (Krum scores included)."""
    weights: tuple[torch.Tensor, ...]
    """New global weights per fragment (fp32)."""
    momentum: tuple[torch.Tensor, ...]
    """New outer momentum per fragment (fp32)."""
    model_hash: bytes
    """Hash of the new global model."""


class Pending(Protocol[_T_co]):
    """A job's eventual result (``concurrent.futures.Future`` is one)."""

    def result(self) -> _T_co: ...


class Worker(Protocol):
    """Where :func:`compute_round_update` runs the round's aggregate hashes while the caller
    hashes the new model. ``concurrent.futures.ThreadPoolExecutor`` is one; :data:`INLINE`
    runs the job at once. The bits are the same whichever runs it: only the overlap differs."""

    def submit(self, fn: Callable[[], _T], /) -> Pending[_T]: ...


class _Done(Generic[_T]):
    __slots__ = ("_value",)

    def __init__(self, value: _T) -> None:
        self._value = value

    def result(self) -> _T:
        return self._value


class _InlineWorker:
    """Runs a job when it is submitted, on the caller's thread (a job's error raises there)."""

    def submit(self, fn: Callable[[], _T], /) -> Pending[_T]:
        return _Done(fn())


INLINE: Worker = _InlineWorker()
"""The default worker: no concurrency at all."""


class RoundBuffers:
    """Scratch memory that :func:`compute_round_update` reuses from one call to the next: one
    aggregate buffer per fragment and the outer step's scratch (the model's size plus its
    largest fragment, in fp32).

    Why it exists: fresh memory costs a page fault per 4 KiB on first touch, measured at ~6 us
    each on a 2-core VM, so a fresh 4 MB aggregate costs ~6 ms, more than the Mean of 8 inputs
    that fills it: ~75 ms of a ~200 ms finalize of a 12.6M-parameter model. A node keeps one
    and passes it to every round it computes, one call at a time (not thread-safe). It never
    shrinks: it holds what the largest model computed so far needs.
    """

    __slots__ = ("_flat",)

    def __init__(self) -> None:
        self._flat = torch.empty(0, dtype=torch.float32)

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._flat.numel() * 4

    def take(self, sizes: Sequence[int]) -> list[torch.Tensor]:
        """Disjoint float32 vectors of these element counts over the held memory (grown when too
        small; vectors handed out before a growth stay valid, over the old memory)."""
        total = sum(sizes)
        if self._flat.numel() < total:
            self._flat = torch.empty(total, dtype=torch.float32)
        return list(self._flat[:total].split(list(sizes)))


def compute_round_update(
    spec: TrainingTaskSpec,
    model: ModelLayout,
    round: int,
    inputs: Sequence[Sequence[tuple[bytes, bytes]]],
    weights: Sequence[torch.Tensor],
    momentum: Sequence[torch.Tensor],
    *,
    max_payload_bytes: int,
    worker: Worker = INLINE,
    in_place: bool = False,
    buffers: RoundBuffers | None = None,
    inputs_checked: bool = False,
) -> RoundUpdate:
    """Aggregate and step every fragment of ``round``.

    ``inputs[f]`` is the accepted (trainer, payload bytes) of fragment f in canonical order
    (``run_state.get_accepted_submissions``). Payloads are decoded against the fragment's
    layout and the expected header (task, round, f, raw, layout hash). Raises PayloadError,
    AggregationError or OuterStepError (the round cannot be finalized from these inputs).

    ``worker`` runs the aggregate hashes while the caller streams the new model's hash: the
    two SHA-256 passes over the model are a large share of a finalize, and hashlib releases
    the GIL, so a one-thread executor halves their wall time on two cores. They run after
    every torch kernel, not alongside: on a small machine torch's intra-op threads already
    fill every core (measured twice: hashing fragment f while fragment f + 1 aggregates made a
    finalize ~20% slower, not faster).

    ``in_place``: the new weights and momentum are written over ``weights`` and ``momentum``
    (:func:`~tenzro_training.outer.apply_outer_step_`, same bits) and returned as the update's
    vectors; for a caller that owns those buffers, as the node's finalize does with its copy of
    the committed state. They are garbage if this raises. Default: the inputs are not modified.

    ``buffers``: where the aggregates and the step's scratch go (:class:`RoundBuffers`, reused
    across calls); without it this call allocates its own. Same bits either way.

    ``inputs_checked``: every payload's values were checked finite (and bounded) when it was
    accepted, as the node's finalize knows of its own submissions; the aggregation then skips
    its NaN/Inf scan of the inputs (``aggregate(..., inputs_checked=True)``). A replay of
    stored payloads, an audit or a third party leaves it off. Same bits for finite inputs.
    """
    rule = spec.aggregation
    cfg = OuterConfig.from_spec(spec)
    encoding = PayloadEncoding.of_run(spec)
    if not len(inputs) == len(weights) == len(momentum) == len(model.layouts):
        raise ValueError("one input list, weight and momentum vector per fragment expected")
    sizes = [lay.numel for lay in model.layouts]
    *outs, scratch = (buffers if buffers is not None else RoundBuffers()).take([*sizes, max(sizes, default=0)])
    reports: list[AggregationReport] = []
    aggregates: list[torch.Tensor] = []
    new_weights: list[torch.Tensor] = []
    new_momentum: list[torch.Tensor] = []
    for lay, subs, w, m, out in zip(model.layouts, inputs, weights, momentum, outs):
        header = PayloadHeader(spec.task_id, round, lay.index, ENCODING_RAW, lay.layout_hash())
        grads = [
            # No NaN/Inf scan here: aggregate() scans its inputs and raises on any, unless the
            # caller checked them when it accepted them.
            decode_payload(
                data, lay, expected=header, max_bytes=max_payload_bytes, zero_copy=True, check_finite=False,
                **encoding.decode_options(lay),
            ).flat_fp32()
            for _, data in subs
        ]
        result = aggregate(rule, grads, out=out, inputs_checked=inputs_checked)
        reports.append(result.report)
        aggregates.append(result.tensor)
        if in_place:
            apply_outer_step_(w, m, result.tensor, cfg, scratch=scratch)
            w2, m2 = w, m
        else:
            w2, m2 = apply_outer_step(w, m, result.tensor, cfg)
        new_weights.append(w2)
        new_momentum.append(m2)
    aggregate_hashes = worker.submit(
        lambda: [compute_aggregate_hash(lay, agg) for lay, agg in zip(model.layouts, aggregates)]
    )
    try:
        model_hash = compute_state_model_hash(model, new_weights)
    finally:
        hashes = aggregate_hashes.result()  # the job has returned before anything leaves
    outcomes = tuple(
        FragmentOutcome(
            aggregate_hash=aggregate_hash,
            accepted=tuple(trainer for trainer, _ in subs),
            selected=report.selected if report.selected is not None else 0,
            trimmed=report.trimmed_per_side,
            report_hash=report.report_hash(),
        )
        for aggregate_hash, subs, report in zip(hashes, inputs, reports)
    )
    return RoundUpdate(outcomes, tuple(reports), tuple(new_weights), tuple(new_momentum), model_hash)


class RecordMismatch(TenzroError):
    """A round recomputed from its inputs does not reproduce its committed record; ``what``
    names the first part that differs (``fragment outcomes`` or ``model hash``)."""

    def __init__(self, task_id: str, round: int, what: str) -> None:
        self.task_id = task_id
        self.round = round
        self.what = what
        super().__init__(f"round {round} of {task_id} recomputed from its inputs does not reproduce its committed {what}")


def check_round_update(task_id: str, record: RoundRecord, update: RoundUpdate) -> None:
    """The verifier's rule for a recomputed round: every fragment outcome (aggregate hash,
    accepted trainers, Krum's selection, TrimmedMean's trim, report hash) and the model hash
    equal the record's. Raises RecordMismatch otherwise. The node's rebuild and ``tenzro audit``
    apply it; a third party replaying a run from its payloads applies the same."""
    if update.outcomes != record.fragments:
        raise RecordMismatch(task_id, record.round, "fragment outcomes")
    if update.model_hash != record.model_hash:
        raise RecordMismatch(task_id, record.round, "model hash")
