"""Fragments: how a checkpoint's named tensors are split into F balanced pieces, and the hashes
over model weights that round records and receipts commit to.

What this module is: the one deterministic split shared by the node and every trainer
(:func:`compute_fragment_layouts`), the gather/scatter helpers that move a fragment between a
state dict and a flat fp32 vector, and three hash definitions: the global model hash
(:func:`compute_model_hash`), a single tensor's hash (:func:`compute_tensor_hash`) and a
fragment aggregate's hash (:func:`compute_aggregate_hash`). The exact byte encodings are in
docs/fragments.md; a third-party verifier needs nothing else.

What it is NOT: no I/O (checkpoints are loaded and saved by the shells), no payload wire format
(see :mod:`tenzro_training.payload`), no aggregation rule (see ``aggregation``).

The split rule, in one paragraph: sort the tensors by name (UTF-8 bytes), flatten each in
row-major order and concatenate them into one virtual vector of N elements; with
``q, r = divmod(N, F)`` fragment ``i`` is the contiguous range of ``q + 1`` elements for
``i < r`` and ``q`` elements otherwise. A fragment is therefore a list of slices
``(name, start, stop)`` of one or more tensors; a tensor may straddle fragment boundaries.
Tensors with zero elements belong to no fragment (they still count in the model hash).
"""

from __future__ import annotations

import hashlib
import struct
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from tenzro_training.errors import FragmentError

__all__ = [
    "DTYPES",
    "DTYPE_TAGS",
    "AGGREGATE_HASH_DOMAIN",
    "LAYOUT_HASH_DOMAIN",
    "MODEL_HASH_DOMAIN",
    "TENSOR_HASH_DOMAIN",
    "TensorSpec",
    "FragmentEntry",
    "FragmentLayout",
    "compute_tensor_specs",
    "compute_fragment_layouts",
    "gather_fragment",
    "scatter_fragment",
    "compute_tensor_hash",
    "compute_model_hash",
    "ModelHashStream",
    "compute_aggregate_hash",
    "compute_raw_le_bytes",
    "get_dtype_name",
    "validate_tensor_name",
    "is_sparse_index",
]

# The dtype vocabulary of the project (TrainingTaskSpec.architecture.dtype spelled as torch does).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
# One-byte tags used in every canonical encoding below. Never renumber: hashes depend on them.
DTYPE_TAGS: dict[str, int] = {"float32": 1, "float16": 2, "bfloat16": 3}
# Same-width integer dtypes: reinterpreting through them gives the raw bit patterns (bf16 has no
# numpy dtype, so this is how its 16-bit patterns reach hashlib).
_BITS_VIEW: dict[str, tuple[torch.dtype, str]] = {
    "float32": (torch.int32, "<i4"),
    "float16": (torch.int16, "<i2"),
    "bfloat16": (torch.int16, "<i2"),
}

LAYOUT_HASH_DOMAIN = b"tenzro/train/fragment-layout/v1"
MODEL_HASH_DOMAIN = b"tenzro/train/model/v1"
TENSOR_HASH_DOMAIN = b"tenzro/train/tensor/v1"
AGGREGATE_HASH_DOMAIN = b"tenzro/train/aggregate/v1"

_U64_MAX = 2**64 - 1
# Tensor names are embedded in payload tensor names as "{name}#{start}:{stop}" and safetensors
# reserves "__metadata__"; forbidding these keeps the payload naming rule injective.
_RESERVED_NAME = "__metadata__"
_SLICE_MARK = "#"


def _u64(value: int) -> bytes:
    return struct.pack(">Q", value)


# --- values ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A named tensor's metadata: enough to compute layouts without holding any weights."""

    name: str
    """The state-dict key, e.g. ``"encoder.layers.0.weight"``."""
    shape: tuple[int, ...]
    """The full tensor shape; ``()`` for a scalar."""
    dtype: str
    """One of :data:`DTYPES`: ``"float32"``, ``"float16"`` or ``"bfloat16"``."""

    def __post_init__(self) -> None:
        validate_tensor_name(self.name)
        _validate_shape(self.name, self.shape)
        _validate_dtype(self.name, self.dtype)

    @property
    def numel(self) -> int:
        return _prod(self.shape)


@dataclass(frozen=True, slots=True)
class FragmentEntry:
    """One slice of one tensor inside a fragment: flat (row-major) elements ``[start, stop)``."""

    name: str
    """The tensor's state-dict key."""
    shape: tuple[int, ...]
    """The FULL tensor shape (not the slice's)."""
    dtype: str
    """The tensor's dtype in the checkpoint the layout was computed from."""
    start: int
    """First flat element of the tensor in this fragment (inclusive)."""
    stop: int
    """One past the last flat element of the tensor in this fragment (exclusive)."""

    def __post_init__(self) -> None:
        validate_tensor_name(self.name)
        _validate_shape(self.name, self.shape)
        _validate_dtype(self.name, self.dtype)
        total = _prod(self.shape)
        if not (_is_int(self.start) and _is_int(self.stop) and 0 <= self.start < self.stop <= total):
            raise FragmentError(
                f"entry {self.name!r}: range [{self.start!r}, {self.stop!r}) is not a non-empty "
                f"range inside the tensor's {total} elements"
            )

    @property
    def numel(self) -> int:
        return self.stop - self.start

    @property
    def is_whole(self) -> bool:
        """True when the entry covers every element of its tensor."""
        return self.start == 0 and self.stop == _prod(self.shape)


@dataclass(frozen=True, slots=True)
class FragmentLayout:
    """Fragment ``index``: its slices, in the order their elements appear in the flat vector."""

    index: int
    """Fragment index, 0 <= index < F."""
    entries: tuple[FragmentEntry, ...]
    """Slices in canonical order (tensor names ascending by UTF-8 bytes)."""
    # Derived once: both are read per payload on the submit and finalize paths.
    _numel: int = field(init=False, repr=False, compare=False)
    _layout_hash: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _is_int(self.index) or not 0 <= self.index <= _U64_MAX:
            raise FragmentError(f"fragment index must be a non-negative integer, got {self.index!r}")
        if not isinstance(self.entries, tuple) or not self.entries:
            raise FragmentError("a fragment layout needs a non-empty tuple of entries")
        for entry in self.entries:
            if not isinstance(entry, FragmentEntry):
                raise FragmentError(f"layout entries must be FragmentEntry, got {type(entry).__name__}")
        names = [entry.name for entry in self.entries]
        if len(set(names)) != len(names):
            # The split never produces two slices of one tensor in one fragment.
            raise FragmentError(f"fragment {self.index}: a tensor appears twice in one layout")
        h = hashlib.sha256(LAYOUT_HASH_DOMAIN)
        h.update(_u64(self.index))
        h.update(_u64(len(self.entries)))
        for entry in self.entries:
            h.update(_encode_tensor_header(entry.name, entry.dtype, entry.shape))
            h.update(_u64(entry.start))
            h.update(_u64(entry.stop))
        object.__setattr__(self, "_layout_hash", h.digest())
        object.__setattr__(self, "_numel", sum(entry.stop - entry.start for entry in self.entries))

    @property
    def numel(self) -> int:
        """Number of elements in the fragment (length of its flat vector)."""
        return self._numel

    def layout_hash(self) -> bytes:
        """SHA-256 of the canonical layout encoding (docs/fragments.md, "Layout hash")."""
        return self._layout_hash


# --- validation helpers ---------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def validate_tensor_name(name: object) -> None:
    """Raise FragmentError unless ``name`` can be a tensor name in this protocol.

    A name is a non-empty str that encodes to UTF-8 (no lone surrogates), contains no ``"#"``
    and is not ``"__metadata__"`` (both would make payload tensor names ambiguous).
    """
    if not isinstance(name, str) or not name:
        raise FragmentError(f"tensor name must be a non-empty str, got {name!r}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FragmentError(f"tensor name {name!r} is not valid UTF-8 text") from exc
    if _SLICE_MARK in name:
        raise FragmentError(f"tensor name {name!r} contains the reserved character '#'")
    if name == _RESERVED_NAME:
        raise FragmentError("tensor name '__metadata__' is reserved by safetensors")


def _validate_shape(name: str, shape: object) -> None:
    if not isinstance(shape, tuple) or not all(_is_int(d) and 0 <= d <= _U64_MAX for d in shape):
        raise FragmentError(f"tensor {name!r}: shape must be a tuple of non-negative ints, got {shape!r}")
    if _prod(shape) > _U64_MAX:
        raise FragmentError(f"tensor {name!r}: {_prod(shape)} elements do not fit in u64")


def _validate_dtype(name: str, dtype: object) -> None:
    if dtype not in DTYPES:
        raise FragmentError(f"tensor {name!r}: dtype {dtype!r} is not one of {sorted(DTYPES)}")


def get_dtype_name(name: str, dtype: torch.dtype) -> str:
    """The project's name for a torch dtype; FragmentError for anything but fp32/fp16/bf16."""
    for key, value in DTYPES.items():
        if value == dtype:
            return key
    raise FragmentError(f"tensor {name!r}: dtype {dtype} is not one of {sorted(DTYPES)}")


def _check_state_tensor(name: str, tensor: object) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise FragmentError(f"state[{name!r}] is a {type(tensor).__name__}, not a torch.Tensor")
    return tensor


def _name_key(spec: TensorSpec) -> bytes:
    return spec.name.encode("utf-8")


# --- the split ------------------------------------------------------------------------------


def compute_tensor_specs(
    tensors: Sequence[TensorSpec] | Mapping[str, torch.Tensor],
) -> tuple[TensorSpec, ...]:
    """Validate a model description and return its specs sorted by name (UTF-8 bytes).

    Accepts either TensorSpecs or a state dict. Duplicate names are a FragmentError.
    """
    if isinstance(tensors, Mapping):
        specs = []
        for name, tensor in tensors.items():
            validate_tensor_name(name)
            tensor = _check_state_tensor(name, tensor)
            specs.append(TensorSpec(name, tuple(int(d) for d in tensor.shape), get_dtype_name(name, tensor.dtype)))
    elif isinstance(tensors, Sequence) and not isinstance(tensors, (str, bytes)):
        specs = list(tensors)
        for spec in specs:
            if not isinstance(spec, TensorSpec):
                raise FragmentError(f"expected TensorSpec, got {type(spec).__name__}")
    else:
        raise FragmentError(f"expected a sequence of TensorSpec or a state dict, got {type(tensors).__name__}")
    specs.sort(key=_name_key)
    for a, b in zip(specs, specs[1:]):
        if a.name == b.name:
            raise FragmentError(f"duplicate tensor name {a.name!r}")
    return tuple(specs)


def compute_fragment_layouts(
    tensors: Sequence[TensorSpec] | Mapping[str, torch.Tensor],
    fragment_count: int,
) -> tuple[FragmentLayout, ...]:
    """Split a model into ``fragment_count`` layouts balanced by element count.

    Rule (docs/fragments.md): names sorted by UTF-8 bytes, tensors flattened row-major into one
    virtual vector of N elements; fragment i holds ``q + 1`` elements if ``i < r`` else ``q``,
    where ``q, r = divmod(N, F)``. Raises FragmentError if F < 1, F > N, the model has no
    elements, a name repeats, or a dtype/shape/name is invalid.
    """
    if not _is_int(fragment_count) or fragment_count < 1:
        raise FragmentError(f"fragment_count must be an integer >= 1, got {fragment_count!r}")
    specs = [s for s in compute_tensor_specs(tensors) if s.numel > 0]
    total = sum(s.numel for s in specs)
    if total == 0:
        raise FragmentError("the model has no elements to split")
    if fragment_count > total:
        raise FragmentError(f"fragment_count {fragment_count} exceeds the model's {total} elements")
    q, r = divmod(total, fragment_count)

    layouts: list[FragmentLayout] = []
    tensor_i, offset = 0, 0  # current tensor and the next unassigned element inside it
    for index in range(fragment_count):
        need = q + 1 if index < r else q
        entries: list[FragmentEntry] = []
        while need > 0:
            spec = specs[tensor_i]
            take = min(need, spec.numel - offset)
            entries.append(FragmentEntry(spec.name, spec.shape, spec.dtype, offset, offset + take))
            need -= take
            offset += take
            if offset == spec.numel:
                tensor_i, offset = tensor_i + 1, 0
        layouts.append(FragmentLayout(index, tuple(entries)))
    return tuple(layouts)


# --- moving a fragment in and out of a state dict -------------------------------------------


def _state_tensor(state: Mapping[str, torch.Tensor], entry: FragmentEntry) -> torch.Tensor:
    if entry.name not in state:
        raise FragmentError(f"state has no tensor {entry.name!r}")
    tensor = _check_state_tensor(entry.name, state[entry.name])
    if tuple(tensor.shape) != entry.shape:
        raise FragmentError(
            f"state[{entry.name!r}] has shape {tuple(tensor.shape)}, the layout says {entry.shape}"
        )
    get_dtype_name(entry.name, tensor.dtype)
    return tensor


def gather_fragment(state: Mapping[str, torch.Tensor], layout: FragmentLayout) -> torch.Tensor:
    """The fragment as a new flat 1-D fp32 CPU vector: its slices concatenated in entry order.

    Shapes must match the layout; dtypes may differ from it (any of fp32/fp16/bf16 is widened
    exactly to fp32), so a trainer can gather an fp32 outer gradient of a bf16 checkpoint.
    """
    out = torch.empty(layout.numel, dtype=torch.float32)
    pos = 0
    with torch.no_grad():
        for entry in layout.entries:
            tensor = _state_tensor(state, entry)
            out[pos : pos + entry.numel].copy_(tensor.detach().reshape(-1)[entry.start : entry.stop])
            pos += entry.numel
    return out


def scatter_fragment(
    state: MutableMapping[str, torch.Tensor], layout: FragmentLayout, flat: torch.Tensor
) -> None:
    """Write a flat fragment vector back into ``state`` in place, cast to each tensor's dtype.

    The inverse of :func:`gather_fragment`; the casts round to nearest-even (torch's rule).
    Tensors are updated in place (parameters keep their identity), non-contiguous ones included.
    """
    if not isinstance(flat, torch.Tensor) or flat.dim() != 1 or not flat.is_floating_point():
        raise FragmentError("flat must be a 1-D floating-point tensor")
    if flat.numel() != layout.numel:
        raise FragmentError(f"flat has {flat.numel()} elements, fragment {layout.index} has {layout.numel}")
    tensors = [_state_tensor(state, entry) for entry in layout.entries]  # validate before writing
    pos = 0
    with torch.no_grad():
        for entry, tensor in zip(layout.entries, tensors):
            src = flat[pos : pos + entry.numel]
            if tensor.is_contiguous():
                tensor.view(-1)[entry.start : entry.stop].copy_(src)
            else:
                staged = tensor.contiguous().view(-1)
                staged[entry.start : entry.stop].copy_(src)
                tensor.copy_(staged.view(tensor.shape))
            pos += entry.numel


# --- hashes ---------------------------------------------------------------------------------


def _encode_tensor_header(name: str, dtype: str, shape: tuple[int, ...]) -> bytes:
    raw = name.encode("utf-8")
    return b"".join(
        [_u64(len(raw)), raw, bytes([DTYPE_TAGS[dtype]]), _u64(len(shape)), *(_u64(d) for d in shape)]
    )


def compute_raw_le_bytes(tensor: torch.Tensor) -> memoryview:
    """A fp32/fp16/bf16 tensor's elements as little-endian raw bytes, row-major.

    bf16 and fp16 give their 16-bit patterns, fp32 its 32-bit patterns; no rounding, no
    canonicalisation of NaN payloads or signed zeros. This is the element encoding used by the
    model, tensor and aggregate hashes and by the payload codec.
    """
    tensor = _check_state_tensor("<tensor>", tensor)
    bits_dtype, le = _BITS_VIEW[get_dtype_name("<tensor>", tensor.dtype)]
    arr = tensor.detach().to("cpu").contiguous().reshape(-1).view(bits_dtype).numpy()
    if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
        arr = arr.astype(le)
    return memoryview(np.ascontiguousarray(arr)).cast("B")


def _update_tensor_record(h: "hashlib._Hash", name: str, tensor: torch.Tensor) -> None:
    validate_tensor_name(name)
    tensor = _check_state_tensor(name, tensor)
    dtype = get_dtype_name(name, tensor.dtype)
    h.update(_encode_tensor_header(name, dtype, tuple(int(d) for d in tensor.shape)))
    if tensor.numel():
        h.update(compute_raw_le_bytes(tensor))


def compute_tensor_hash(name: str, tensor: torch.Tensor) -> bytes:
    """SHA-256(b"tenzro/train/tensor/v1" || tensor record); the record is defined in docs/fragments.md."""
    h = hashlib.sha256(TENSOR_HASH_DOMAIN)
    _update_tensor_record(h, name, tensor)
    return h.digest()


def is_sparse_index(indices: torch.Tensor, numel: int) -> bool:
    """True when 1-D integer ``indices`` ascend strictly within ``0..numel - 1``: the positions
    of a sparse (topk) vector in a fragment's flat layout, each once, in canonical order."""
    if indices.numel() == 0:
        return True
    return (int(indices[0]) >= 0 and int(indices[-1]) < numel
            and (indices.numel() == 1 or bool((indices[1:] > indices[:-1]).all())))


def is_all_finite(tensor: torch.Tensor) -> bool:
    """True when every element of a float tensor is finite (no NaN, no +-Inf).

    For float32, ``torch.aminmax`` reads the tensor once without a temporary and propagates NaN,
    so a NaN or an infinity shows up in its min or max: about 10x faster than
    ``torch.isfinite(t).all()``, which materialises a bool tensor (this is on the node's
    finalize path, once per payload). 16-bit tensors: a float32 sum is non-finite iff an
    element is, or finite values overflow it; the exact test settles that rare second case.
    """
    if tensor.numel() == 0:
        return True
    if tensor.dtype == torch.float32:
        low, high = torch.aminmax(tensor)
        return bool(torch.isfinite(low)) and bool(torch.isfinite(high))
    if bool(torch.isfinite(tensor.sum(dtype=torch.float32))):
        return True
    return bool(torch.isfinite(tensor).all())


def compute_model_hash(state: Mapping[str, torch.Tensor]) -> bytes:
    """The global model hash: SHA-256(b"tenzro/train/model/v1" || u64 count || records...).

    Records are in name order (UTF-8 bytes); each is u64 name length, name, u8 dtype tag,
    u64 ndim, u64 dims, raw little-endian element bytes (all integers big-endian). Used in
    round records and as the receipt's final_model_hash.
    """
    if not isinstance(state, Mapping):
        raise FragmentError(f"state must be a mapping of name -> tensor, got {type(state).__name__}")
    for name in state:
        validate_tensor_name(name)
    names = sorted(state, key=lambda n: n.encode("utf-8"))
    h = hashlib.sha256(MODEL_HASH_DOMAIN)
    h.update(_u64(len(names)))
    for name in names:
        _update_tensor_record(h, name, state[name])
    return h.digest()


class ModelHashStream:
    """The global model hash fed one fragment vector at a time, in fragment order.

    Equal, byte for byte, to ``compute_model_hash`` of the fp32 state the fragments scatter into:
    fragments are consecutive ranges of the name-ordered flat model, so the hash input is the
    same stream of tensor records, and a record's header goes in when its first element (or,
    for an empty tensor, its position) is reached. Why it exists: the node hashes a new model
    after every round, and trainers every model they receive, without first building the full
    state dict (a 48 MB zero-fill and copy for a 12M-param model).

    Not thread-safe: one caller feeds it, in order.
    """

    __slots__ = ("_hash", "_specs", "_next", "_left", "_fed", "_total")

    def __init__(self, specs: Sequence[TensorSpec]) -> None:
        """``specs``: every tensor of the model ascending by UTF-8 name (``compute_tensor_specs``),
        empty ones included; their records are hashed as float32."""
        self._specs = tuple(specs)
        keys = [_name_key(s) for s in self._specs]
        if keys != sorted(keys) or len(set(keys)) != len(keys):
            raise FragmentError("model hash stream: specs must be unique and ascending by UTF-8 name")
        self._hash = hashlib.sha256(MODEL_HASH_DOMAIN)
        self._hash.update(_u64(len(self._specs)))
        self._next = 0  # index of the next spec whose record header is not yet hashed
        self._left = 0  # elements of the current tensor not yet hashed
        self._fed = 0
        self._total = sum(s.numel for s in self._specs)

    def update(self, flat_fp32: torch.Tensor) -> None:
        """Hash the next fragment's flat float32 vector (FragmentError past the model's end)."""
        if not isinstance(flat_fp32, torch.Tensor) or flat_fp32.dtype != torch.float32 or flat_fp32.dim() != 1:
            raise FragmentError("a model hash stream is fed 1-D float32 fragment vectors")
        n = flat_fp32.numel()
        if self._fed + n > self._total:
            raise FragmentError(f"fragments hold more than the model's {self._total} elements")
        data = compute_raw_le_bytes(flat_fp32) if n else memoryview(b"")
        pos = 0
        while pos < n:
            while self._left == 0:
                self._start_next_record()
            take = min(self._left, n - pos)
            self._hash.update(data[4 * pos : 4 * (pos + take)])
            pos += take
            self._left -= take
        self._fed += n

    def digest(self) -> bytes:
        """The model hash; FragmentError unless every element of the model was fed."""
        if self._fed != self._total:
            raise FragmentError(f"fragments held {self._fed} of the model's {self._total} elements")
        h = self._hash.copy()
        for spec in self._specs[self._next :]:  # only empty tensors are left
            h.update(_encode_tensor_header(spec.name, "float32", spec.shape))
        return h.digest()

    def _start_next_record(self) -> None:
        spec = self._specs[self._next]  # in range: update() checked the element count
        self._hash.update(_encode_tensor_header(spec.name, "float32", spec.shape))
        self._next += 1
        self._left = spec.numel


def compute_aggregate_hash(layout: FragmentLayout, flat_fp32: torch.Tensor) -> bytes:
    """SHA-256(b"tenzro/train/aggregate/v1" || layout_hash || raw little-endian fp32 bytes)."""
    if (
        not isinstance(flat_fp32, torch.Tensor)
        or flat_fp32.dtype != torch.float32
        or flat_fp32.dim() != 1
    ):
        raise FragmentError("the aggregate must be a 1-D float32 tensor")
    if flat_fp32.numel() != layout.numel:
        raise FragmentError(
            f"aggregate has {flat_fp32.numel()} elements, fragment {layout.index} has {layout.numel}"
        )
    h = hashlib.sha256(AGGREGATE_HASH_DOMAIN)
    h.update(layout.layout_hash())
    h.update(compute_raw_le_bytes(flat_fp32))
    return h.digest()
