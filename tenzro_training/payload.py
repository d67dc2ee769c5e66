"""The OuterGradient payload codec: one trainer's outer gradient for one (task, round, fragment),
as the bytes of a safetensors file.

What this module is: :func:`encode_payload` (what a trainer sends), :func:`decode_payload` (what
the node accepts: every byte validated against the fragment layout before any tensor is built),
and :func:`compute_payload_hash` (what a trainer signs and gossip references). The format, the
tensor naming rule and every rejection are specified in docs/payload.md.

What it is NOT: no I/O, no signatures (the submission envelope signs the payload hash), no
aggregation. The safetensors header is parsed here by hand rather than by the safetensors
library, because the checks it must pass (duplicate keys, exact coverage, size caps, layout
equality) come before anything in the payload is trusted; nothing in a payload is ever executed
(no pickle, no torch.load). The output is an ordinary safetensors file that the safetensors
library loads.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import warnings
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import torch

from tenzro_training.jsontext import MAX_JSON_NESTING, is_json_depth_ok, unique_keys_object
from tenzro_training.errors import FragmentError, PayloadError
from tenzro_training.fragments import (
    is_all_finite,
    DTYPES,
    FragmentEntry,
    FragmentLayout,
    compute_raw_le_bytes,
    gather_fragment,
    is_sparse_index,
)

__all__ = [
    "ENCODING_RAW",
    "ENCODING_TOPK",
    "ENCODING_Q8",
    "ENCODINGS",
    "Q8_MAX",
    "PAYLOAD_VERSION",
    "SAFETENSORS_DTYPES",
    "PayloadHeader",
    "DecodedPayload",
    "PayloadFormatError",
    "PayloadTruncated",
    "PayloadTrailingBytes",
    "PayloadTooLarge",
    "PayloadLayoutMismatch",
    "PayloadMetadataMismatch",
    "PayloadDtypeError",
    "PayloadNonFinite",
    "PayloadUnknownEncoding",
    "PayloadValueOutOfRange",
    "compute_payload_tensor_name",
    "compute_max_header_bytes",
    "compute_max_payload_bytes",
    "compute_payload_hash",
    "encode_payload",
    "encode_topk_payload",
    "encode_q8_payload",
    "compute_q8_blocks",
    "decode_payload",
]

PAYLOAD_VERSION = "1"
ENCODING_RAW = "raw"
ENCODING_TOPK = "topk"
ENCODING_Q8 = "q8"
# Encodings this implementation decodes: raw (always accepted), and sparse top-k or blockwise
# 8-bit quantisation, which a task selects (compression.PayloadEncoding). Another (a pinned DCT)
# can be added per task without a new format version.
ENCODINGS: frozenset[str] = frozenset({ENCODING_RAW, ENCODING_TOPK, ENCODING_Q8})
# The two tensors of a topk payload, in this order in the data section.
_TOPK_INDICES, _TOPK_VALUES = "indices", "values"
# The two tensors of a q8 payload, in this order in the data section.
_Q8_SCALES, _Q8_VALUES = "scales", "values"
Q8_MAX = 127
"""A q8 value is an int8 in -127..127: symmetric, so that -128 (which has no positive twin) never
decodes to a magnitude the block's scale does not describe."""
# Project dtype name -> safetensors dtype string.
SAFETENSORS_DTYPES: dict[str, str] = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_FROM_SAFETENSORS = {v: k for k, v in SAFETENSORS_DTYPES.items()}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}

_META = "__metadata__"
_KEY_VERSION = "tenzro.version"
_KEY_TASK = "tenzro.task_id"
_KEY_ROUND = "tenzro.round"
_KEY_FRAGMENT = "tenzro.fragment"
_KEY_ENCODING = "tenzro.encoding"
_KEY_DTYPE = "tenzro.dtype"
_KEY_LAYOUT = "tenzro.layout_hash"
_META_KEYS = frozenset(
    {_KEY_VERSION, _KEY_TASK, _KEY_ROUND, _KEY_FRAGMENT, _KEY_ENCODING, _KEY_DTYPE, _KEY_LAYOUT}
)
_TENSOR_KEYS = frozenset({"dtype", "shape", "data_offsets"})

_U64_MAX = 2**64 - 1
# Mirrors the TrainingTaskSpec rule for task_id (SPEC.md): 1-128 chars of [A-Za-z0-9._-].
_TASK_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
_DECIMAL_RE = re.compile(r"0|[1-9][0-9]{0,19}")
_HASH_HEX_RE = re.compile(r"0x[0-9a-f]{64}")


# --- errors ---------------------------------------------------------------------------------


class PayloadFormatError(PayloadError):
    """The bytes are not a well-formed payload: bad header JSON, duplicate keys, wrong field
    types, offsets that overlap, leave holes or disagree with the dtype and shape."""


class PayloadTruncated(PayloadFormatError):
    """The payload ends before its length prefix, header or tensor data does."""


class PayloadTrailingBytes(PayloadFormatError):
    """Bytes follow the last tensor's data."""


class PayloadTooLarge(PayloadError):
    """The payload (``what="payload"``) or its declared header (``what="header"``) exceeds a cap."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        self.what, self.size, self.limit = what, size, limit
        super().__init__(f"{what} is {size} bytes, the limit is {limit}")


class PayloadLayoutMismatch(PayloadError):
    """The payload does not match the fragment layout: tensor names, shapes, fragment index or
    layout hash differ."""


class PayloadMetadataMismatch(PayloadError):
    """A header field differs from what the caller expected (``field``, ``got``, ``expected``)."""

    def __init__(self, field_name: str, got: object, expected: object) -> None:
        self.field, self.got, self.expected = field_name, got, expected
        super().__init__(f"payload {field_name} is {got!r}, expected {expected!r}")


class PayloadDtypeError(PayloadError):
    """A tensor dtype is unsupported, differs from the declared ``tenzro.dtype``, or is not allowed."""


class PayloadNonFinite(PayloadError):
    """The payload holds NaN or +/-Inf (``count`` of them; ``name`` is the first tensor hit)."""

    def __init__(self, name: str, count: int) -> None:
        self.name, self.count = name, count
        super().__init__(f"payload holds {count} non-finite value(s), first in tensor {name!r}")


class PayloadValueOutOfRange(PayloadError):
    """A value's magnitude exceeds the caller's bound ``limit`` (``count`` of them; ``name`` is
    the first tensor hit). Why a bound at all: finite but huge values (float32 max) pass every
    finiteness check, then overflow a Mean's sum or the outer step, and a round nobody can
    finalize fails the whole run."""

    def __init__(self, name: str, count: int, limit: float) -> None:
        self.name, self.count, self.limit = name, count, limit
        super().__init__(f"payload holds {count} value(s) of magnitude above {limit:g}, first in tensor {name!r}")


class PayloadUnknownEncoding(PayloadError):
    """The encoding is not one this implementation decodes (``encoding``)."""

    def __init__(self, encoding: object) -> None:
        self.encoding = encoding
        super().__init__(f"unknown payload encoding {encoding!r}; known: {sorted(ENCODINGS)}")


# --- values ---------------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class PayloadHeader:
    """What a payload claims to be; carried in its safetensors ``__metadata__``."""

    task_id: str
    """The run's task_id (1-128 chars of ``[A-Za-z0-9._-]``, as in the TrainingTaskSpec)."""
    round: int
    """Round index, 0 <= round < 2**64."""
    fragment: int
    """Fragment index, equal to the layout's index."""
    encoding: str
    """``"raw"`` (uncompressed), ``"topk"`` (sparse: ascending u32 indices and their values) or
    ``"q8"`` (one scale per block of values, and an int8 per value)."""
    layout_hash: bytes
    """``FragmentLayout.layout_hash()`` of the fragment (32 bytes)."""

    def __post_init__(self) -> None:
        if not isinstance(self.task_id, str) or not _TASK_ID_RE.fullmatch(self.task_id):
            raise PayloadFormatError(f"task_id must be 1-128 chars of [A-Za-z0-9._-], got {self.task_id!r}")
        for name in ("round", "fragment"):
            value = getattr(self, name)
            if not _is_int(value) or not 0 <= value <= _U64_MAX:
                raise PayloadFormatError(f"{name} must be an integer in [0, 2**64), got {value!r}")
        if not isinstance(self.encoding, str) or not self.encoding:
            raise PayloadFormatError(f"encoding must be a non-empty str, got {self.encoding!r}")
        if not isinstance(self.layout_hash, bytes) or len(self.layout_hash) != 32:
            raise PayloadFormatError("layout_hash must be 32 bytes")


@dataclass(frozen=True, slots=True)
class DecodedPayload:
    """A payload that passed every check; its values are already widened to fp32."""

    header: PayloadHeader
    """The header read from the payload's metadata."""
    dtype: str
    """The dtype the values travelled in (``"float32"``, ``"float16"`` or ``"bfloat16"``)."""
    _flat: torch.Tensor = field(repr=False)

    def flat_fp32(self) -> torch.Tensor:
        """The fragment as a 1-D fp32 vector in layout order (the same tensor on every call)."""
        return self._flat


# --- naming and limits ----------------------------------------------------------------------


def compute_payload_tensor_name(entry: FragmentEntry) -> str:
    """``name`` when the entry is the whole tensor, else ``"{name}#{start}:{stop}"``.

    Unambiguous because tensor names never contain ``"#"`` (fragments.validate_tensor_name).
    """
    return entry.name if entry.is_whole else f"{entry.name}#{entry.start}:{entry.stop}"


def _payload_tensor_shape(entry: FragmentEntry) -> list[int]:
    # Whole tensors keep their shape (the payload reads like a partial checkpoint); slices are 1-D.
    return list(entry.shape) if entry.is_whole else [entry.numel]


def compute_max_header_bytes(layout: FragmentLayout) -> int:
    """Largest safetensors header accepted for ``layout``, so parsing work is bounded by the
    layout, not by the sender: 4096 + per entry (256 + 6 * (UTF-8 name length + 42) + 32 * ndim).

    The factor 6 covers JSON escapes (``\\u00XX``), 42 the longest ``#start:stop`` suffix.
    """
    per_entry = sum(
        256 + 6 * (len(e.name.encode("utf-8")) + 42) + 32 * len(e.shape) for e in layout.entries
    )
    return 4096 + per_entry


def compute_max_payload_bytes(layout: FragmentLayout) -> int:
    """Largest payload :func:`decode_payload` can accept for ``layout``: the 8-byte length
    prefix, the header cap and the data in the widest dtype (float32). A receiver sizes its
    buffers by it before any byte arrives (a trainer's gossip limits)."""
    return 8 + compute_max_header_bytes(layout) + 4 * layout.numel


def compute_payload_hash(data: bytes | bytearray | memoryview) -> bytes:
    """SHA-256 of the payload bytes: what the trainer signs and gossip references."""
    return hashlib.sha256(data).digest()


# --- encode ---------------------------------------------------------------------------------


def _check_header_against_layout(header: PayloadHeader, layout: FragmentLayout) -> None:
    if header.encoding not in ENCODINGS:
        raise PayloadUnknownEncoding(header.encoding)
    if header.fragment != layout.index:
        raise PayloadLayoutMismatch(f"payload is for fragment {header.fragment}, layout is fragment {layout.index}")
    if header.layout_hash != layout.layout_hash():
        raise PayloadLayoutMismatch(
            f"payload layout hash 0x{header.layout_hash.hex()} differs from the layout's "
            f"0x{layout.layout_hash().hex()}"
        )


def encode_payload(
    header: PayloadHeader,
    layout: FragmentLayout,
    tensors: Mapping[str, torch.Tensor] | torch.Tensor,
    dtype: str = "float32",
) -> bytes:
    """Encode one outer gradient as safetensors bytes (docs/payload.md, "Format").

    ``tensors`` is either a state dict of full tensors (the fragment is gathered from it) or the
    fragment's flat 1-D vector in layout order. Values are cast to ``dtype`` (round to nearest
    even); a NaN/Inf, including an fp16 overflow created by the cast, is a PayloadNonFinite.
    """
    if not isinstance(header, PayloadHeader) or not isinstance(layout, FragmentLayout):
        raise PayloadError("encode_payload needs a PayloadHeader and a FragmentLayout")
    _check_header_against_layout(header, layout)
    if header.encoding != ENCODING_RAW:
        raise PayloadFormatError(f"encode_payload writes encoding {ENCODING_RAW!r}, the header says "
                                 f"{header.encoding!r} (encode_topk_payload and encode_q8_payload write the others)")
    if dtype not in DTYPES:
        raise PayloadDtypeError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    if isinstance(tensors, torch.Tensor):
        if tensors.dim() != 1 or not tensors.is_floating_point() or tensors.numel() != layout.numel:
            raise PayloadLayoutMismatch(
                f"flat vector must be 1-D floating point with {layout.numel} elements, "
                f"got shape {tuple(tensors.shape)} {tensors.dtype}"
            )
        flat = tensors
    elif isinstance(tensors, Mapping):
        try:
            flat = gather_fragment(tensors, layout)
        except FragmentError as exc:
            raise PayloadLayoutMismatch(str(exc)) from exc
    else:
        raise PayloadError(f"tensors must be a state dict or a flat tensor, got {type(tensors).__name__}")
    cast = flat.detach().to(device="cpu", dtype=DTYPES[dtype]).contiguous()
    if not is_all_finite(cast):
        finite = torch.isfinite(cast)
        first = int((~finite).nonzero()[0, 0])
        raise PayloadNonFinite(_entry_at(layout, first).name, int((~finite).sum()))

    doc: dict[str, object] = {}
    itemsize, offset = _ITEMSIZE[dtype], 0
    for entry in layout.entries:
        size = entry.numel * itemsize
        doc[compute_payload_tensor_name(entry)] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": _payload_tensor_shape(entry),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    return b"".join([_header_bytes(header, dtype, doc), compute_raw_le_bytes(cast)])


def _header_bytes(header: PayloadHeader, dtype: str, tensors: dict[str, object]) -> bytes:
    """The length prefix and the padded header JSON (metadata first, then ``tensors``)."""
    metadata = {
        _KEY_VERSION: PAYLOAD_VERSION,
        _KEY_TASK: header.task_id,
        _KEY_ROUND: str(header.round),
        _KEY_FRAGMENT: str(header.fragment),
        _KEY_ENCODING: header.encoding,
        _KEY_DTYPE: dtype,
        _KEY_LAYOUT: "0x" + header.layout_hash.hex(),
    }
    text = json.dumps({_META: metadata, **tensors}, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    text += b" " * (-len(text) % 8)  # safetensors convention: data starts 8-byte aligned
    return len(text).to_bytes(8, "little") + text


def encode_topk_payload(
    header: PayloadHeader,
    layout: FragmentLayout,
    indices: torch.Tensor,
    values: torch.Tensor,
    dtype: str = "float32",
) -> bytes:
    """Encode a sparse outer gradient (``header.encoding == "topk"``; docs/payload.md "topk").

    ``indices``: 1-D integer tensor, strictly ascending, each < ``layout.numel`` (positions in
    the fragment's flat layout order); ``values``: 1-D floating tensor of the same length, cast
    to ``dtype`` (round to nearest even). Every other position decodes as 0. The decoder
    demands exactly the task's k values (``compression.PayloadEncoding.kept``); this encoder
    does not know the task and takes any length up to ``layout.numel``.
    """
    if not isinstance(header, PayloadHeader) or not isinstance(layout, FragmentLayout):
        raise PayloadError("encode_topk_payload needs a PayloadHeader and a FragmentLayout")
    _check_header_against_layout(header, layout)  # an unknown encoding: PayloadUnknownEncoding
    if header.encoding != ENCODING_TOPK:
        raise PayloadFormatError(f"encode_topk_payload writes encoding {ENCODING_TOPK!r}, the header says {header.encoding!r}")
    if dtype not in DTYPES:
        raise PayloadDtypeError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    if not isinstance(indices, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise PayloadError("indices and values must be tensors")
    if indices.dim() != 1 or indices.dtype.is_floating_point or indices.dtype.is_complex or indices.dtype == torch.bool:
        raise PayloadFormatError(f"indices must be a 1-D integer tensor, got {tuple(indices.shape)} {indices.dtype}")
    if values.dim() != 1 or not values.is_floating_point() or values.numel() != indices.numel():
        raise PayloadFormatError(
            f"values must be a 1-D floating tensor of {indices.numel()} values, got {tuple(values.shape)} {values.dtype}"
        )
    k = indices.numel()
    idx = indices.detach().to(device="cpu", dtype=torch.int64)
    if k > layout.numel or layout.numel > 2**32:
        raise PayloadLayoutMismatch(f"{k} indices into a fragment of {layout.numel} values (u32 indices)")
    if not is_sparse_index(idx, layout.numel):
        raise PayloadFormatError(f"indices must be strictly ascending within 0..{layout.numel - 1}")
    cast = values.detach().to(device="cpu", dtype=DTYPES[dtype]).contiguous()
    if not is_all_finite(cast):
        first = int((~torch.isfinite(cast)).nonzero()[0, 0])
        raise PayloadNonFinite(_entry_at(layout, int(idx[first])).name, int((~torch.isfinite(cast)).sum()))
    tensors = _topk_tensor_entries(k, dtype)
    index_bytes = idx.numpy().astype("<u4").tobytes()
    return b"".join([_header_bytes(header, dtype, tensors), index_bytes, compute_raw_le_bytes(cast)])


def _topk_tensor_entries(k: int, dtype: str) -> dict[str, object]:
    """The header entries of a k-value topk payload: indices then values, back to back."""
    end = 4 * k + k * _ITEMSIZE[dtype]
    return {
        _TOPK_INDICES: {"dtype": "U32", "shape": [k], "data_offsets": [0, 4 * k]},
        _TOPK_VALUES: {"dtype": SAFETENSORS_DTYPES[dtype], "shape": [k], "data_offsets": [4 * k, end]},
    }


def compute_q8_blocks(numel: int, block: int) -> int:
    """How many scales a q8 payload of a ``numel``-value fragment carries: ``ceil(numel / block)``."""
    return -(-numel // block)


def _check_q8_block(block: object) -> int:
    if not _is_int(block) or block < 1:
        raise PayloadError(f"the q8 block size must be a positive integer, got {block!r}")
    return block  # type: ignore[return-value]


def encode_q8_payload(
    header: PayloadHeader,
    layout: FragmentLayout,
    scales: torch.Tensor,
    values: torch.Tensor,
    block: int,
    dtype: str = "float32",
) -> bytes:
    """Encode a quantised outer gradient (``header.encoding == "q8"``; docs/payload.md "q8").

    The fragment's flat values (layout order) fall in blocks of ``block`` (the last one may be
    shorter); value ``i`` decodes as ``float32(values[i]) * float32(scales[i // block])``, one
    IEEE fp32 product, so every decoder gets the same bits. ``scales``: 1-D floating tensor of
    ``ceil(numel / block)`` values, cast to ``dtype`` (round to nearest even), finite and not
    negative; ``values``: 1-D int8 tensor of ``numel`` values in -127..127. Which scales and
    values to send is the trainer's (``compression.quantize_q8``).
    """
    if not isinstance(header, PayloadHeader) or not isinstance(layout, FragmentLayout):
        raise PayloadError("encode_q8_payload needs a PayloadHeader and a FragmentLayout")
    _check_header_against_layout(header, layout)
    if header.encoding != ENCODING_Q8:
        raise PayloadFormatError(f"encode_q8_payload writes encoding {ENCODING_Q8!r}, the header says {header.encoding!r}")
    if dtype not in DTYPES:
        raise PayloadDtypeError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    n = layout.numel
    blocks = compute_q8_blocks(n, _check_q8_block(block))
    if not isinstance(scales, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise PayloadError("scales and values must be tensors")
    if values.dim() != 1 or values.dtype != torch.int8 or values.numel() != n:
        raise PayloadLayoutMismatch(f"values must be a 1-D int8 tensor of {n} values, got {tuple(values.shape)} {values.dtype}")
    if scales.dim() != 1 or not scales.is_floating_point() or scales.numel() != blocks:
        raise PayloadLayoutMismatch(
            f"scales must be a 1-D floating tensor of {blocks} values (blocks of {block}), "
            f"got {tuple(scales.shape)} {scales.dtype}"
        )
    q = values.detach().to("cpu").contiguous()
    if n and int(q.min()) < -Q8_MAX:
        raise PayloadFormatError(f"q8 values must lie in -{Q8_MAX}..{Q8_MAX}")
    cast = scales.detach().to(device="cpu", dtype=DTYPES[dtype]).contiguous()
    if not is_all_finite(cast):
        first = int((~torch.isfinite(cast)).nonzero()[0, 0])
        raise PayloadNonFinite(_entry_at(layout, first * block).name, int((~torch.isfinite(cast)).sum()))
    if bool((cast < 0).any()):
        raise PayloadFormatError("q8 scales must not be negative")
    tensors = _q8_tensor_entries(n, blocks, dtype)
    return b"".join([_header_bytes(header, dtype, tensors), compute_raw_le_bytes(cast), q.numpy().tobytes()])


def _q8_tensor_entries(numel: int, blocks: int, dtype: str) -> dict[str, object]:
    """The header entries of a q8 payload: the scales then the int8 values, back to back."""
    end = blocks * _ITEMSIZE[dtype]
    return {
        _Q8_SCALES: {"dtype": SAFETENSORS_DTYPES[dtype], "shape": [blocks], "data_offsets": [0, end]},
        _Q8_VALUES: {"dtype": "I8", "shape": [numel], "data_offsets": [end, end + numel]},
    }


def _entry_at(layout: FragmentLayout, flat_index: int) -> FragmentEntry:
    pos = 0
    for entry in layout.entries:
        pos += entry.numel
        if flat_index < pos:
            return entry
    return layout.entries[-1]


# --- decode ---------------------------------------------------------------------------------


def _as_byte_view(data: object) -> memoryview:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise PayloadError(f"payload must be bytes, bytearray or memoryview, got {type(data).__name__}")
    view = memoryview(data)
    if not view.c_contiguous:
        raise PayloadError("payload memoryview must be C-contiguous")
    if view.ndim != 1 or view.format != "B":
        try:
            view = view.cast("B")
        except (TypeError, ValueError) as exc:
            raise PayloadError("payload memoryview cannot be read as bytes") from exc
    return view


def _reject_constant(name: str) -> None:
    raise PayloadFormatError(f"the safetensors header holds the non-JSON constant {name}")


def _parse_header_json(raw: memoryview) -> dict[str, object]:
    if len(raw) == 0 or raw[0] != ord("{"):
        raise PayloadFormatError("the safetensors header must start with '{'")
    try:
        text = bytes(raw).decode("utf-8")
        if not is_json_depth_ok(text):
            raise PayloadFormatError(f"the safetensors header nests deeper than {MAX_JSON_NESTING} levels")
        # A key given twice is a ValueError ("duplicate key ..."): not valid JSON here.
        doc = json.loads(text, object_pairs_hook=unique_keys_object, parse_constant=_reject_constant)
    except PayloadError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PayloadFormatError(f"the safetensors header is not valid JSON: {str(exc)[:200]}") from exc
    if not isinstance(doc, dict):
        raise PayloadFormatError("the safetensors header must be a JSON object")
    return doc


def _parse_metadata(doc: dict[str, object], layout: FragmentLayout) -> tuple[PayloadHeader, str]:
    meta = doc.get(_META)
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise PayloadFormatError("the header needs a __metadata__ object of string values")
    missing, extra = _META_KEYS - meta.keys(), meta.keys() - _META_KEYS
    if missing or extra:
        raise PayloadFormatError(
            f"metadata keys: missing {sorted(missing)}, unknown {sorted(k[:80] for k in extra)[:5]}"
        )
    if meta[_KEY_VERSION] != PAYLOAD_VERSION:
        raise PayloadFormatError(f"unsupported payload version {meta[_KEY_VERSION][:40]!r}")
    if meta[_KEY_ENCODING] not in ENCODINGS:
        raise PayloadUnknownEncoding(meta[_KEY_ENCODING][:80])
    dtype = meta[_KEY_DTYPE]
    if dtype not in DTYPES:
        raise PayloadDtypeError(f"declared dtype {dtype[:40]!r} is not one of {sorted(DTYPES)}")
    numbers = {}
    for key in (_KEY_ROUND, _KEY_FRAGMENT):
        if not _DECIMAL_RE.fullmatch(meta[key]):
            raise PayloadFormatError(f"{key} must be a canonical decimal integer, got {meta[key][:40]!r}")
        numbers[key] = int(meta[key])
    if not _HASH_HEX_RE.fullmatch(meta[_KEY_LAYOUT]):
        raise PayloadFormatError(f"{_KEY_LAYOUT} must be 0x + 64 lowercase hex digits")
    header = PayloadHeader(
        task_id=meta[_KEY_TASK],
        round=numbers[_KEY_ROUND],
        fragment=numbers[_KEY_FRAGMENT],
        encoding=meta[_KEY_ENCODING],
        layout_hash=bytes.fromhex(meta[_KEY_LAYOUT][2:]),
    )
    _check_header_against_layout(header, layout)
    return header, dtype


def _check_expected(header: PayloadHeader, expected: PayloadHeader) -> None:
    # Not the encoding: which encodings are accepted is decode_payload's topk_k (raw always).
    for name in ("task_id", "round", "fragment", "layout_hash"):
        got, want = getattr(header, name), getattr(expected, name)
        if got != want:
            raise PayloadMetadataMismatch(name, got, want)


def _is_uint_list(value: object, length: int | None = None) -> bool:
    return (
        isinstance(value, list)
        and (length is None or len(value) == length)
        and all(_is_int(v) and 0 <= v <= _U64_MAX for v in value)
    )


def _short(names: Collection[str]) -> list[str]:
    return sorted(n[:80] for n in names)[:5]


def _check_tensors(
    doc: Mapping[str, object], layout: FragmentLayout, dtype: str, data_len: int
) -> list[int]:
    """Validate every tensor entry; return each layout entry's data start offset, in layout order."""
    wanted = {compute_payload_tensor_name(e): e for e in layout.entries}
    present = doc.keys() - {_META}
    missing, extra = wanted.keys() - present, present - wanted.keys()
    if missing or extra:
        raise PayloadLayoutMismatch(
            f"payload tensors differ from fragment {layout.index}: missing {_short(missing)}, "
            f"unexpected {_short(extra)}"
        )
    st_dtype, itemsize = SAFETENSORS_DTYPES[dtype], _ITEMSIZE[dtype]
    spans: list[tuple[int, int, str]] = []
    for name, entry in wanted.items():
        info = doc[name]
        if not isinstance(info, dict) or info.keys() != _TENSOR_KEYS:
            raise PayloadFormatError(f"tensor {name!r} needs exactly the keys {sorted(_TENSOR_KEYS)}")
        if not isinstance(info["dtype"], str) or info["dtype"] not in _FROM_SAFETENSORS:
            raise PayloadDtypeError(f"tensor {name!r} has unsupported dtype {str(info['dtype'])[:40]!r}")
        if info["dtype"] != st_dtype:
            raise PayloadDtypeError(f"tensor {name!r} is {info['dtype']}, the payload declares {st_dtype}")
        shape, offsets = info["shape"], info["data_offsets"]
        if not _is_uint_list(shape):
            raise PayloadFormatError(f"tensor {name!r}: shape must be a list of non-negative integers")
        if shape != _payload_tensor_shape(entry):
            raise PayloadLayoutMismatch(
                f"tensor {name!r} has shape {shape[:8]}, the layout needs {_payload_tensor_shape(entry)}"
            )
        if not _is_uint_list(offsets, 2) or offsets[0] > offsets[1]:
            raise PayloadFormatError(f"tensor {name!r}: data_offsets must be [begin, end] with begin <= end")
        if offsets[1] - offsets[0] != entry.numel * itemsize:
            raise PayloadFormatError(
                f"tensor {name!r}: data_offsets span {offsets[1] - offsets[0]} bytes, "
                f"{entry.numel} x {st_dtype} needs {entry.numel * itemsize}"
            )
        spans.append((offsets[0], offsets[1], name))
    # The data buffer must be covered exactly once: no overlap, no hole, nothing after the end.
    cursor = 0
    for begin, end, name in sorted(spans):
        if begin < cursor:
            raise PayloadFormatError(f"tensor {name!r} overlaps the previous tensor's data")
        if begin > cursor:
            raise PayloadFormatError(f"a hole of {begin - cursor} bytes precedes tensor {name!r}")
        cursor = end
    if cursor > data_len:
        raise PayloadTruncated(f"tensor data needs {cursor} bytes, only {data_len} are present")
    if cursor < data_len:
        raise PayloadTrailingBytes(f"{data_len - cursor} bytes follow the last tensor")
    return [doc[compute_payload_tensor_name(e)]["data_offsets"][0] for e in layout.entries]  # type: ignore[index]


# The header checks are pure functions of (header bytes, layout[, dtype, data length]); their
# results are memoized because every trainer's payload for one (task, round, fragment) carries
# the same header bytes, and checking one (~35 tensor entries) cost ~0.27 ms: 26 ms of a
# 96-payload finalize that re-decodes payloads already checked at submission. A failure is
# never cached (lru_cache does not store exceptions): a bad header is checked, and refused,
# every time.
_HEADER_CACHE_SIZE = 256


@functools.lru_cache(maxsize=_HEADER_CACHE_SIZE)
def _parse_checked_header(raw: bytes, layout: FragmentLayout) -> tuple[PayloadHeader, str, Mapping[str, object]]:
    doc = _parse_header_json(memoryview(raw))
    header, dtype = _parse_metadata(doc, layout)
    return header, dtype, MappingProxyType(doc)  # shared by every hit: read-only


@functools.lru_cache(maxsize=_HEADER_CACHE_SIZE)
def _checked_tensor_starts(raw: bytes, layout: FragmentLayout, dtype: str, data_len: int) -> tuple[int, ...]:
    doc = _parse_checked_header(raw, layout)[2]
    return tuple(_check_tensors(doc, layout, dtype, data_len))


def _view_flat(data: bytes, base: int, starts: Sequence[int], layout: FragmentLayout, dtype: str) -> torch.Tensor | None:
    """A read-only float32 view of the data section when it is exactly the flat fragment (float32,
    entries back to back in layout order, 4-byte aligned); None otherwise (the caller copies)."""
    if dtype != "float32" or not starts or (base + starts[0]) % 4:
        return None
    pos = starts[0]
    for entry, start in zip(layout.entries, starts):
        if start != pos:
            return None
        pos += 4 * entry.numel
    array = np.frombuffer(data, dtype="<f4", count=layout.numel, offset=base + starts[0])
    with warnings.catch_warnings():  # the buffer is immutable bytes: torch warns it is read-only
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def _read_flat(view: memoryview, base: int, starts: Sequence[int], layout: FragmentLayout, dtype: str) -> torch.Tensor:
    # One copy: straight from the validated byte ranges into the fp32 output. Sources are
    # read-only numpy views ('<' = little-endian, as safetensors stores); fp16 -> fp32 and
    # bf16 -> fp32 are exact widenings (bf16 is the top half of an fp32 bit pattern).
    out = torch.empty(layout.numel, dtype=torch.float32)
    out_np = out.numpy()
    pos = 0
    for entry, start in zip(layout.entries, starts):
        _widen_into(out_np[pos : pos + entry.numel], view, base + start, dtype)
        pos += entry.numel
    return out


def _widen_into(dst: np.ndarray, view: memoryview, offset: int, dtype: str) -> None:
    """Fill the fp32 array ``dst`` with ``len(dst)`` values of ``dtype`` read at ``offset``."""
    n = len(dst)
    if dtype == "float32":
        dst[:] = np.frombuffer(view, dtype="<f4", count=n, offset=offset)
    elif dtype == "float16":
        dst[:] = np.frombuffer(view, dtype="<f2", count=n, offset=offset)
    else:
        bits = dst.view(np.uint32)
        bits[:] = np.frombuffer(view, dtype="<u2", count=n, offset=offset)
        bits <<= 16


def decode_payload(
    data: bytes | bytearray | memoryview,
    layout: FragmentLayout,
    *,
    expected: PayloadHeader | None = None,
    max_bytes: int,
    allowed_dtypes: Collection[str] | None = None,
    zero_copy: bool = False,
    check_finite: bool = True,
    max_abs: float | None = None,
    topk_k: int | None = None,
    q8_block: int | None = None,
) -> DecodedPayload:
    """Validate and decode one payload for ``layout`` (docs/payload.md, "Decoding").

    ``topk_k``: a ``topk`` payload is accepted only when given, and must then carry exactly
    this many values (the task's ``compression.PayloadEncoding.kept(layout.numel)``); it decodes
    to the dense fp32 vector (zeros elsewhere). ``q8_block``: likewise a ``q8`` payload, whose
    blocks must be of this size (the task's ``block_size``). A ``raw`` payload is always
    accepted. Any other case: ``PayloadMetadataMismatch("encoding", ...)``.
    ``expected.encoding`` is not compared. The task's
    ``compression.PayloadEncoding.decode_options(layout)`` gives both.

    ``zero_copy=True`` (only for immutable ``bytes`` input, float32 payloads whose tensors lie
    back to back in layout order, as :func:`encode_payload` writes them): ``flat_fp32()`` is then
    a read-only VIEW of ``data`` instead of a copy. The caller must never write to it. The
    node's finalize uses it (12 x 8 payloads of 4 MB each were a third of its time); in every
    other case the decoder copies.

    ``check_finite=False`` skips the NaN/Inf scan, for a caller that scans the values itself
    anyway (the round update: ``aggregation.aggregate`` rejects non-finite inputs, and every
    stored payload passed this decoder with the scan when it was accepted).

    ``max_abs``: every value's magnitude must be at most this (``PayloadValueOutOfRange``); the
    node's admission bound (``NodeConfig.max_gradient_abs``). Checked in the same pass as the
    finiteness scan.

    Checks, in order: size <= ``max_bytes``; length prefix; header size <= the layout's cap;
    header JSON (UTF-8, no duplicate keys, no NaN constants); metadata (version, encoding,
    dtype, canonical numbers, fragment index and layout hash equal to the layout's; equal to
    ``expected`` if given); dtype in ``allowed_dtypes`` if given; tensor names equal to the
    layout's; per tensor dtype, shape and data size; data offsets covering the data exactly.
    Only then are values read, widened to fp32 and checked finite. Any failure raises a
    PayloadError subclass.
    """
    if not isinstance(layout, FragmentLayout):
        raise PayloadError("decode_payload needs a FragmentLayout")
    if not _is_int(max_bytes) or max_bytes < 0:
        raise PayloadError(f"max_bytes must be a non-negative integer, got {max_bytes!r}")
    if expected is not None and not isinstance(expected, PayloadHeader):
        raise PayloadError("expected must be a PayloadHeader or None")
    view = _as_byte_view(data)
    size = view.nbytes
    if size > max_bytes:
        raise PayloadTooLarge("payload", size, max_bytes)
    if size < 8:
        raise PayloadTruncated(f"payload is {size} bytes, shorter than the 8-byte length prefix")
    header_len = int.from_bytes(view[:8], "little")
    # Length against the bytes present first: a file that is not safetensors at all (its first
    # 8 bytes read as a huge length) is a format error, not a header "too large".
    if 8 + header_len > size:
        raise PayloadTruncated(f"header declares {header_len} bytes, only {size - 8} follow")
    header_cap = compute_max_header_bytes(layout)
    if header_len > header_cap:
        raise PayloadTooLarge("header", header_len, header_cap)
    raw = bytes(view[8 : 8 + header_len])
    header, dtype, _ = _parse_checked_header(raw, layout)
    if expected is not None:
        _check_expected(header, expected)
    if allowed_dtypes is not None and dtype not in allowed_dtypes:
        raise PayloadDtypeError(f"dtype {dtype} is not allowed here (allowed: {sorted(allowed_dtypes)})")
    if topk_k is not None and (not _is_int(topk_k) or not 0 <= topk_k <= layout.numel):
        raise PayloadError(f"topk_k must be an integer in 0..{layout.numel}, got {topk_k!r}")
    if q8_block is not None:
        _check_q8_block(q8_block)
    if header.encoding == ENCODING_TOPK:
        if topk_k is None:
            raise PayloadMetadataMismatch("encoding", header.encoding, _accepted(topk_k, q8_block))
        _checked_compressed_header(raw, layout, dtype, size - 8 - header_len, ENCODING_TOPK, topk_k)
        flat = _read_topk(view, 8 + header_len, layout, dtype, topk_k, check_finite, max_abs)
        return DecodedPayload(header, dtype, flat)
    if header.encoding == ENCODING_Q8:
        if q8_block is None:
            raise PayloadMetadataMismatch("encoding", header.encoding, _accepted(topk_k, q8_block))
        _checked_compressed_header(raw, layout, dtype, size - 8 - header_len, ENCODING_Q8, q8_block)
        flat = _read_q8(view, 8 + header_len, layout, dtype, q8_block)
        if check_finite or max_abs is not None:
            _check_values(flat, layout, check_finite, max_abs)
        return DecodedPayload(header, dtype, flat)
    starts = _checked_tensor_starts(raw, layout, dtype, size - 8 - header_len)
    flat = None
    if zero_copy and isinstance(data, bytes):
        flat = _view_flat(data, 8 + header_len, starts, layout, dtype)
    if flat is None:
        flat = _read_flat(view, 8 + header_len, starts, layout, dtype)
    if check_finite or max_abs is not None:
        _check_values(flat, layout, check_finite, max_abs)
    return DecodedPayload(header, dtype, flat)


def _accepted(topk_k: int | None, q8_block: int | None) -> str:
    """The encodings a decode call accepts, for its mismatch error ("raw" alone by default)."""
    return ", ".join([ENCODING_RAW] + [name for name, given in ((ENCODING_TOPK, topk_k), (ENCODING_Q8, q8_block))
                                       if given is not None])


def _compressed_entries(encoding: str, param: int, numel: int, dtype: str) -> dict[str, object]:
    if encoding == ENCODING_TOPK:
        return _topk_tensor_entries(param, dtype)
    return _q8_tensor_entries(numel, compute_q8_blocks(numel, param), dtype)


@functools.lru_cache(maxsize=_HEADER_CACHE_SIZE)
def _checked_compressed_header(raw: bytes, layout: FragmentLayout, dtype: str, data_len: int,
                               encoding: str, param: int) -> None:
    """A topk (``param`` = k) or q8 (``param`` = the block size) header names exactly its two
    tensors, in the one layout its encoder writes (the first at 0, the second right after,
    nothing else)."""
    doc = _parse_checked_header(raw, layout)[2]
    wanted = _compressed_entries(encoding, param, layout.numel, dtype)
    present = doc.keys() - {_META}
    if present != wanted.keys():
        raise PayloadLayoutMismatch(
            f"a {encoding} payload holds exactly the tensors {list(wanted)}, got {_short(present)}"
        )
    for name, info in wanted.items():
        got = doc[name]
        # Compared as JSON text, not with ==, under which 0.0 and true equal 0 and 1: shapes and
        # offsets must be JSON integers, as for raw payloads (docs/payload.md, step 11).
        if json.dumps(got, sort_keys=True) != json.dumps(info, sort_keys=True):
            if isinstance(got, dict) and isinstance(got.get("shape"), list) and got["shape"] != info["shape"]:  # type: ignore[index]
                what = (f"this task sends {param} values per payload" if encoding == ENCODING_TOPK
                        else f"this task quantises in blocks of {param}, {layout.numel} values")
                raise PayloadLayoutMismatch(
                    f"{encoding} tensor {name!r} has shape {got['shape'][:4]}, {what} of fragment {layout.index}"
                )
            raise PayloadFormatError(f"{encoding} tensor {name!r} must be {json.dumps(info)}")
    end = max(info["data_offsets"][1] for info in wanted.values())  # type: ignore[index]
    if end > data_len:
        raise PayloadTruncated(f"tensor data needs {end} bytes, only {data_len} are present")
    if end < data_len:
        raise PayloadTrailingBytes(f"{data_len - end} bytes follow the last tensor")


def _read_q8(view: memoryview, base: int, layout: FragmentLayout, dtype: str, block: int) -> torch.Tensor:
    """The dense fp32 vector: each int8 times its block's scale widened to fp32, one IEEE fp32
    product per value (numpy's elementwise multiply: no summation, no fused multiply-add), so
    every decoder on every machine gets the same bits."""
    n = layout.numel
    blocks = compute_q8_blocks(n, block)
    scales = np.empty(blocks, dtype=np.float32)
    _widen_into(scales, view, base, dtype)
    if blocks:
        low, high = float(scales.min()), float(scales.max())
        if not (math.isfinite(low) and math.isfinite(high)):
            first = int(np.flatnonzero(~np.isfinite(scales))[0])
            raise PayloadNonFinite(_entry_at(layout, first * block).name, int((~np.isfinite(scales)).sum()))
        if low < 0:
            raise PayloadFormatError("q8 scales must not be negative")
    q = np.frombuffer(view, dtype=np.int8, count=n, offset=base + blocks * _ITEMSIZE[dtype])
    if n and int(q.min()) < -Q8_MAX:
        raise PayloadFormatError(f"q8 values must lie in -{Q8_MAX}..{Q8_MAX}")
    flat = np.empty(n, dtype=np.float32)
    full = n // block
    with np.errstate(over="ignore"):  # an overflow to Inf is the caller's finiteness check's to refuse
        if full:
            np.multiply(q[: full * block].reshape(full, block), scales[:full, None],
                        out=flat[: full * block].reshape(full, block), dtype=np.float32)
        if full * block < n:
            np.multiply(q[full * block :], scales[full], out=flat[full * block :], dtype=np.float32)
    return torch.from_numpy(flat)


def _read_topk(
    view: memoryview, base: int, layout: FragmentLayout, dtype: str, k: int, check_finite: bool, max_abs: float | None
) -> torch.Tensor:
    indices = np.frombuffer(view, dtype="<u4", count=k, offset=base)
    if k and (int(indices[-1]) >= layout.numel or (k > 1 and not bool((indices[1:] > indices[:-1]).all()))):
        raise PayloadFormatError(f"topk indices must be strictly ascending within 0..{layout.numel - 1}")
    values = torch.empty(k, dtype=torch.float32)
    _widen_into(values.numpy(), view, base + 4 * k, dtype)
    if check_finite or max_abs is not None:
        # The k values only: the zeros in between are finite and in range.
        _check_values(values, layout, check_finite, max_abs, positions=indices)
    # numpy's fancy assignment: torch's index_put took ~9 ms for 10% of 2^20 values, this ~0.4 ms.
    flat = np.zeros(layout.numel, dtype=np.float32)
    flat[indices] = values.numpy()
    return torch.from_numpy(flat)


def _check_values(
    flat: torch.Tensor, layout: FragmentLayout, check_finite: bool, max_abs: float | None,
    positions: np.ndarray | None = None,
) -> None:
    """``positions``: each value's index in the fragment's flat layout (a topk payload's values),
    so that an error names the tensor holding the first culprit; None: ``flat`` is the fragment."""
    if flat.numel() == 0:
        return
    # One read-only pass each (min and max propagate NaN; any +-Inf is the min or the max); the
    # slow paths below only name the culprit. numpy's, single-threaded: torch's aminmax splits a
    # fragment over its intra-op threads, and on a busy node (the event loop parsing the next
    # request on the other core) waiting for them took 0.9 ms instead of 0.07 ms per 269k values.
    values = flat.numpy()
    low, high = float(values.min()), float(values.max())
    if check_finite and not (math.isfinite(low) and math.isfinite(high)):
        bad = ~torch.isfinite(flat)
        raise PayloadNonFinite(_culprit(layout, bad, positions), int(bad.sum()))
    if max_abs is not None and (-low > max_abs or high > max_abs):
        bad = flat.abs() > max_abs
        raise PayloadValueOutOfRange(_culprit(layout, bad, positions), int(bad.sum()), max_abs)


def _culprit(layout: FragmentLayout, bad: torch.Tensor, positions: np.ndarray | None) -> str:
    first = int(bad.nonzero()[0, 0])
    return _entry_at(layout, first if positions is None else int(positions[first])).name
