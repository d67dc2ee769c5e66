"""Stored byte encodings of a run's global model (a SHELL helper of the node service).

What this module is: the stored form of a :class:`~tenzro_training.global_model.ModelLayout`
(its tensor list, as JSON), of fp32 fragment vectors (raw little-endian float32) and of a run's
round counts (the model snapshot and pruning records), the one reader of the
stored vectors (:func:`load_model_fragments`), and the batch operations that write a snapshot,
delete one, or prune a run's stored payloads (``compute_*_ops``: the node service puts them in
the batch of the transition that calls for them).
What it is NOT: the model or the round update themselves, which are pure core
(:mod:`tenzro_training.global_model`), shared with trainers and third-party verifiers.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence

import numpy as np
import torch

from storage import schema
from storage.interface import BatchOp, KVStore, Operation, StorageError
from tenzro_training.errors import TenzroError
from tenzro_training.fragments import TensorSpec, compute_raw_le_bytes
from tenzro_training.global_model import ModelLayout
from tenzro_training.node.persistence import decode_json, encode_json

__all__ = [
    "compute_drop_snapshot_ops",
    "compute_fragment_ops",
    "compute_prune_ops",
    "compute_snapshot_ops",
    "decode_fragment",
    "decode_model_layout",
    "decode_round_count",
    "encode_fragment",
    "encode_model_layout",
    "encode_round_count",
    "load_model_fragments",
    "load_snapshot_momentum",
]

_SPECS_VERSION = 1


def encode_model_layout(model: ModelLayout) -> bytes:
    """Stored form: JSON ``{"version": 1, "tensors": [[name, [dims...], dtype], ...]}``."""
    tensors = [[s.name, list(s.shape), s.dtype] for s in model.specs]
    return encode_json({"version": _SPECS_VERSION, "tensors": tensors})


def decode_model_layout(raw: bytes, fragment_count: int) -> ModelLayout:
    """Inverse of :func:`encode_model_layout` (StorageError on a damaged store)."""
    doc = decode_json(raw, "tensor specs")
    try:
        if not isinstance(doc, dict) or doc.get("version") != _SPECS_VERSION:
            raise ValueError("unexpected document")
        if not isinstance(doc.get("tensors"), list):
            raise ValueError("unexpected document")
        specs = [TensorSpec(name, tuple(shape), dtype) for name, shape, dtype in doc["tensors"]]
        return ModelLayout.from_specs(specs, fragment_count)
    except (TenzroError, ValueError, TypeError) as exc:
        raise StorageError(f"stored tensor specs are malformed: {exc}") from None


def encode_fragment(flat: torch.Tensor) -> bytes:
    """A flat fp32 fragment (weights or momentum) as raw little-endian float32 bytes."""
    if flat.dtype != torch.float32 or flat.dim() != 1:
        raise ValueError("a stored fragment is a 1-D float32 tensor")  # a bug, not input
    return bytes(compute_raw_le_bytes(flat))


def decode_fragment(raw: bytes, numel: int, what: str = "fragment") -> torch.Tensor:
    """Inverse of :func:`encode_fragment` for a fragment of ``numel`` elements."""
    if not isinstance(raw, bytes) or len(raw) != 4 * numel:
        size = len(raw) if isinstance(raw, bytes) else 0
        raise StorageError(f"stored {what} has {size} bytes, expected {4 * numel}")
    arr = np.frombuffer(raw, dtype="<f4").astype(np.float32, copy=True)
    if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
        arr = arr.byteswap().view(arr.dtype.newbyteorder())
    return torch.from_numpy(arr)


_ROUND_COUNT = struct.Struct(">Q")


def encode_round_count(rounds: int) -> bytes:
    """Stored form of a round count, an unsigned 64-bit big-endian integer: the model snapshot
    record (``schema.model_snapshot_key``: how many committed rounds the stored weights and
    momentum include) and the pruning record (``schema.payloads_pruned_key``)."""
    return _ROUND_COUNT.pack(rounds)


def decode_round_count(raw: bytes) -> int:
    """Inverse of :func:`encode_round_count` (StorageError on a damaged store)."""
    if not isinstance(raw, bytes) or len(raw) != _ROUND_COUNT.size:
        raise StorageError(f"stored round count is malformed: {raw!r} (expected 8 bytes)")
    return int(_ROUND_COUNT.unpack(raw)[0])


def load_snapshot_momentum(store: KVStore, task_id: str, model: ModelLayout, rounds: int) -> list[torch.Tensor]:
    """The outer momentum of ``task_id``'s model snapshot after ``rounds`` committed rounds.

    Zero before any round, and not stored then (schema 5): a post wrote 4 bytes of zeros per
    parameter through the WAL on the service thread. A version-4 store's stored round-0 zeros
    are not read. StorageError if a later snapshot's momentum is missing or damaged in size.
    """
    if rounds == 0:
        return [torch.zeros(layout.numel, dtype=torch.float32) for layout in model.layouts]
    return load_model_fragments(store, task_id, schema.MODEL_MOMENTUM, model)


def load_model_fragments(store: KVStore, task_id: str, kind: bytes, model: ModelLayout) -> list[torch.Tensor]:
    """Every fragment of one kind of stored model state (``schema.MODEL_WEIGHTS``,
    ``MODEL_MOMENTUM`` or ``MODEL_FINAL``) of ``task_id``, decoded; StorageError if one is
    missing or has the wrong size."""
    out = []
    for layout in model.layouts:
        raw = store.get(schema.CF_MODEL_STATE, schema.model_key(task_id, kind, layout.index))
        if raw is None:
            raise StorageError(f"model state {kind!r} of {task_id} fragment {layout.index} is missing")
        out.append(decode_fragment(raw, layout.numel, f"model state {kind!r} of {task_id}"))
    return out


def compute_fragment_ops(task_id: str, kind: bytes, fragments: Sequence[torch.Tensor]) -> list[Operation]:
    """Puts of one kind of model state (weights, momentum, final), one value per fragment."""
    return [
        (BatchOp.PUT, schema.CF_MODEL_STATE, schema.model_key(task_id, kind, index), encode_fragment(flat))
        for index, flat in enumerate(fragments)
    ]


def compute_snapshot_ops(
    task_id: str, rounds: int, weights: Sequence[torch.Tensor], momentum: Sequence[torch.Tensor]
) -> list[Operation]:
    """Write the model snapshot of ``task_id`` after ``rounds`` committed rounds: its weights,
    its momentum and its round count (``schema.model_snapshot_key``)."""
    ops = compute_fragment_ops(task_id, schema.MODEL_WEIGHTS, weights)
    if rounds > 0:  # zero before any round: not stored (load_snapshot_momentum)
        ops += compute_fragment_ops(task_id, schema.MODEL_MOMENTUM, momentum)
    ops.append((BatchOp.PUT, schema.CF_META, schema.model_snapshot_key(task_id), encode_round_count(rounds)))
    return ops


def compute_drop_snapshot_ops(task_id: str, fragments: int) -> list[Operation]:
    """Delete the stored snapshot (weights, momentum, its round count) of ``task_id``."""
    ops: list[Operation] = [
        (BatchOp.DELETE, schema.CF_MODEL_STATE, schema.model_key(task_id, kind, index), None)
        for kind in (schema.MODEL_WEIGHTS, schema.MODEL_MOMENTUM) for index in range(fragments)
    ]
    ops.append((BatchOp.DELETE, schema.CF_META, schema.model_snapshot_key(task_id), None))
    return ops


def compute_prune_ops(store: KVStore, task_id: str, through: int) -> list[Operation]:
    """Delete every stored payload of ``task_id`` and record up to which round they are gone
    (``schema.payloads_pruned_key``). Keys only: the values are never read."""
    ops: list[Operation] = [
        (BatchOp.DELETE, schema.CF_SUBMISSIONS, key, None)
        for key in store.keys(schema.CF_SUBMISSIONS, schema.payload_prefix(task_id))
    ]
    ops.append((BatchOp.PUT, schema.CF_META, schema.payloads_pruned_key(task_id), encode_round_count(through)))
    return ops
