"""Loading a task's init checkpoint: the initial global model named by its spec.

What this module is: :func:`load_init_checkpoint`, which resolves
``architecture.metadata.init_checkpoint = {"uri": "file:///...", "sha256": "0x..."}``, confines
it to the configured directories, reads it with a size cap, refuses it unless the SHA-256 of
the exact bytes read matches, parses it as safetensors (a format that holds only tensors:
nothing in it is executed, no pickle, no ``torch.load``) and returns it as float32 tensors.

What it is NOT: fragmenting or hashing the model (:mod:`.model_state`), or any other URI scheme.
Only ``file://`` is supported; anything else is a CheckpointError until a fetcher exists.

Order of checks (each failure is a :class:`~tenzro_training.errors.CheckpointError` carrying the
uri and a reason; the JSON-RPC table keeps its text private because it names local paths):
scheme and form of the URI; absolute path; after resolving symlinks, inside one of
``allowed_dirs`` when any are configured; a regular file; at most ``max_bytes``; SHA-256 equal to
the spec's, streamed (16 MiB at a time, remembered per unchanged file) before the file is read
whole and hashed again as parsed; a safetensors header of at most 16 MiB naming at most
MAX_CHECKPOINT_TENSORS tensors; a valid safetensors file; every tensor float32/float16/bfloat16
with a valid name.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

import torch

from storage.files import FILE_DIGESTS, NotReadable, open_regular_file, read_regular_file
from tenzro_training.errors import CheckpointError, FragmentError, SpecError
from tenzro_training.fragments import get_dtype_name, validate_tensor_name
from tenzro_training.spec import TrainingTaskSpec
from tenzro_training.tensorfile import TensorFileError, load_tensors

__all__ = ["MAX_CHECKPOINT_TENSORS", "load_init_checkpoint", "resolve_checkpoint_path", "parse_checkpoint_bytes"]

_INIT_PATH = "architecture.metadata.init_checkpoint"

MAX_CHECKPOINT_TENSORS = 65_536
"""Most tensors a checkpoint may hold (large transformer checkpoints hold a few thousand). The
per-tensor work of a post (~35 us each) ran on the node's one service thread: a 48 MB file of
800,000 zero-element tensors held it for 29 s (malicious-participant probe, 2026-11-26)."""

MAX_TENSOR_DIMS = 64
"""Most dimensions of one checkpoint tensor: torch's kernels (``isfinite`` among them) refuse
more, and safetensors accepts them (fuzzing probe: a [1] * 65 tensor escaped as a bare
RuntimeError, an internal error to postTask)."""

_MAX_HEADER_BYTES = 16 << 20
"""Largest safetensors header read (JSON: ~40 bytes per tensor at least)."""


def resolve_checkpoint_path(uri: str, allowed_dirs: Sequence[Path]) -> Path:
    """The real (symlink-free) path a ``file://`` URI names, checked against ``allowed_dirs``."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        # "file://[x/..." (an unbalanced IPv6 bracket, which the spec's URI grammar admits):
        # urlsplit's ValueError would reach the RPC as an internal error.
        raise CheckpointError(uri, "not a valid URI (unbalanced brackets in the host part)") from None
    if parts.scheme.lower() != "file":
        raise CheckpointError(uri, f"unsupported URI scheme {parts.scheme!r}: only file:// is supported")
    if parts.netloc not in ("", "localhost"):
        raise CheckpointError(uri, "a file:// URI must name a local path (no host)")
    if parts.query or parts.fragment:
        raise CheckpointError(uri, "a file:// URI must not have a query or fragment")
    path = unquote(parts.path)
    if "\x00" in path or not os.path.isabs(path):
        raise CheckpointError(uri, "the path must be absolute")
    real = Path(os.path.realpath(path))
    if allowed_dirs:
        roots = [Path(os.path.realpath(d)) for d in allowed_dirs]
        if not any(real == root or root in real.parents for root in roots):
            raise CheckpointError(uri, "the file is outside the node's allowed checkpoint directories")
    return real


def _stream_sha256(path: Path, uri: str, max_bytes: int) -> bytes:
    """SHA-256 of the regular file at ``path`` (at most ``max_bytes``), read in chunks, or
    remembered from an earlier pass over the unchanged file (``storage.files.FILE_DIGESTS``):
    any sponsor may name any readable file with a wrong hash, and each refused post used to
    read the whole file again."""
    try:
        fd, info = open_regular_file(path, follow_symlinks=False)
    except NotReadable as exc:
        raise CheckpointError(uri, exc.reason) from None
    try:
        return FILE_DIGESTS.digest(fd, info, max_bytes)
    except NotReadable as exc:
        raise CheckpointError(uri, exc.reason) from None
    finally:
        os.close(fd)


def _read_bounded(path: Path, uri: str, max_bytes: int) -> bytes:
    # Non-blocking open and a regular-file check (storage.files): a FIFO would otherwise block
    # the node's one service thread until a writer came. No symlink: the path is resolved above.
    try:
        return read_regular_file(path, max_bytes, follow_symlinks=False)
    except NotReadable as exc:
        raise CheckpointError(uri, exc.reason) from None


def _check_header(data: bytes, uri: str) -> None:
    """The safetensors header's size and a bound on its tensor count, before the library parses
    it. Counted, not parsed: every tensor entry holds the key ``"data_offsets"``, and a quoted
    token cannot occur inside a JSON string (its quotes would be escaped), so the count only
    over-counts a metadata value that is exactly that word. (A Python parse of a hostile 16 MiB
    header took ~3 s, longer than the library's own refusal; review.)"""
    if len(data) < 8:
        raise CheckpointError(uri, "not a valid safetensors file: shorter than its header length")
    size = int.from_bytes(data[:8], "little")
    if size > min(_MAX_HEADER_BYTES, len(data) - 8):
        raise CheckpointError(uri, f"not a valid safetensors file (or a header over {_MAX_HEADER_BYTES} bytes)")
    if data.count(b'"data_offsets"', 8, 8 + size) > MAX_CHECKPOINT_TENSORS:
        raise CheckpointError(uri, f"the checkpoint holds more than {MAX_CHECKPOINT_TENSORS} tensors")


def parse_checkpoint_bytes(data: bytes, uri: str) -> dict[str, torch.Tensor]:
    """Parse safetensors bytes into float32 tensors (names checked, 16-bit dtypes widened exactly)."""
    _check_header(data, uri)
    try:
        raw = load_tensors(data)
    except TensorFileError as exc:
        raise CheckpointError(uri, f"not a valid safetensors file: {exc}") from None
    state: dict[str, torch.Tensor] = {}
    for name, tensor in raw.items():
        try:
            validate_tensor_name(name)
            get_dtype_name(name, tensor.dtype)
        except FragmentError as exc:
            raise CheckpointError(uri, str(exc)) from None
        if tensor.dim() > MAX_TENSOR_DIMS:  # torch.isfinite refuses them with a bare RuntimeError
            raise CheckpointError(uri, f"tensor {name!r} has {tensor.dim()} dimensions, at most {MAX_TENSOR_DIMS} are supported")
        widened = tensor.to(torch.float32).contiguous()
        if not bool(torch.isfinite(widened).all()):
            # Every trainer's first loss would be NaN and the run would fail at its deadlines,
            # its trainers' time spent (fuzz probe: such a checkpoint was accepted).
            raise CheckpointError(uri, f"tensor {name!r} holds NaN or infinite values: no run can train from it")
        state[name] = widened
    if not state:
        raise CheckpointError(uri, "the checkpoint holds no tensors")
    return state


def load_init_checkpoint(
    spec: TrainingTaskSpec, *, allowed_dirs: Sequence[Path] = (), max_bytes: int
) -> dict[str, torch.Tensor]:
    """The spec's initial global model as float32 tensors, verified against its SHA-256.

    SpecError when the spec names no init checkpoint (the node needs one to hold the global
    model); CheckpointError for everything listed in the module docstring.
    """
    ref = spec.init_checkpoint()
    if ref is None:
        raise SpecError(_INIT_PATH, 'required: {"uri": "file:///...", "sha256": "0x..."} naming the initial model')
    path = resolve_checkpoint_path(ref.uri, allowed_dirs)
    # A streamed hash first (16 MiB at a time): a wrong hash is refused without the whole file
    # in memory (a post naming any large readable file held twice its size; probe, 2026-11-26).
    # The bytes parsed are hashed again below: the file may change between the two reads.
    streamed = _stream_sha256(path, ref.uri, max_bytes)
    if streamed != ref.sha256_bytes:
        raise CheckpointError(ref.uri, f"sha256 is 0x{streamed.hex()}, the spec says {ref.sha256} (streamed)")
    data = _read_bounded(path, ref.uri, max_bytes)
    actual = hashlib.sha256(data).digest()
    if actual != ref.sha256_bytes:
        raise CheckpointError(ref.uri, f"sha256 is 0x{actual.hex()}, the spec says {ref.sha256}")
    return parse_checkpoint_bytes(data, ref.uri)
