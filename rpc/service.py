"""The interface the JSON-RPC transport calls: :class:`TrainingService`.

What this module is: the Protocol the node service implements, one method per
``tenzro_training_*`` JSON-RPC method, with the contract each side relies on. The transport
(``rpc/dispatcher.py``) has already checked every argument's shape (see ``rpc/params.py``) before
it calls, so implementations receive Python types: ``bytes`` for signatures, hashes and payloads,
``int`` for stakes, rounds and fragments.

What it is NOT: an implementation (the node service is), or a place for protocol rules.

Contract for implementations:
- Methods are synchronous. The aiohttp server calls them from ONE worker thread, one call at a
  time, so an implementation may assume calls never overlap *through this transport*. (If the
  node also calls the service from elsewhere, e.g. gossip, pass the same single-thread executor
  to :func:`rpc.server.create_app`.)
- Return a JSON-able ``dict`` (str keys; str/int/float/bool/None/list/dict values; no bytes,
  no NaN). By project convention byte strings are ``0x`` hex and attoTNZO amounts are decimal
  strings. A result that cannot be serialized is answered as an internal error.
- Fail by raising a ``TenzroError`` subclass; ``rpc/errors.py`` maps it to a stable code and sends
  its text and safe attributes. Any other exception becomes -32603 "internal error" with nothing
  of its text sent (it is logged with the traceback).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["ArtifactSource", "CheckpointArtifact", "ModelArtifact", "PayloadArtifact", "Preloading", "TrainingService"]


@runtime_checkable
class TrainingService(Protocol):
    """What ``tenzro_training_*`` calls. See the module docstring for the threading contract."""

    def post_task(self, spec: dict[str, Any], signature: bytes) -> dict[str, Any]:
        """``tenzro_training_postTask``: validate ``spec``, check the sponsor's signature, escrow
        the reward pool and register the run."""
        ...

    def list_runs(self, status: str | None, offset: int, limit: int) -> dict[str, Any]:
        """``tenzro_training_listRuns``: runs in canonical order, optionally in one ``status``
        (a wire name from ``rpc.params.RUN_STATUSES``); ``0 <= offset``, ``1 <= limit <= 500``."""
        ...

    def get_run(self, task_id: str) -> dict[str, Any]:
        """``tenzro_training_getRun``: the run's public view; UnknownTask if absent."""
        ...

    def get_run_json(self, task_id: str) -> bytes:
        """What the transport answers ``tenzro_training_getRun`` with: :meth:`get_run`'s view as
        compact ASCII JSON text (``tenzro_training.jsontext.serialize_json``; member order may
        differ). Separate so an implementation can render a run state once for its many polls."""
        ...

    def get_receipt(self, task_id: str) -> dict[str, Any]:
        """``tenzro_training_getReceipt``: the sealed TrainingReceipt of a finished run."""
        ...

    def get_receipt_json(self, task_id: str) -> bytes:
        """What the transport answers ``tenzro_training_getReceipt`` with: :meth:`get_receipt`'s
        answer as compact ASCII JSON text, as :meth:`get_run_json` is getRun's. A sealed run's
        receipt never changes, so an implementation can render it once."""
        ...

    def enroll_trainer(
        self, task_id: str, did: str, address: str, stake: int, signature: bytes
    ) -> dict[str, Any]:
        """``tenzro_training_enrollTrainer``: admit a trainer (``address`` is ``0x`` + 40 hex,
        checksum not yet checked; ``stake`` a uint256 in attoTNZO)."""
        ...

    def submit_outer_gradient(
        self,
        task_id: str,
        round: int,
        fragment: int,
        payload: bytes | None,
        payload_hash: bytes | None,
        signature: bytes,
    ) -> dict[str, Any]:
        """``tenzro_training_submitOuterGradient``: exactly one of ``payload`` (the safetensors
        bytes) and ``payload_hash`` (32 bytes, payload already held) is not ``None``."""
        ...

    def finalize_round(self, task_id: str, round: int, signature: bytes) -> dict[str, Any]:
        """``tenzro_training_finalizeRound``: aggregate, step and commit round ``round``."""
        ...

    def cancel_task(self, task_id: str, signature: bytes) -> dict[str, Any]:
        """``tenzro_training_cancelTask`` (extension): the sponsor cancels before training."""
        ...


@runtime_checkable
class Preloading(Protocol):
    """Optional: a service that can prepare a postTask off its one thread. The server calls
    ``preload_post_task`` on a preloading thread of its own, before the call itself reaches the
    service thread, with the params the dispatcher parsed (a postTask's checkpoint is read and
    hashed there: seconds for a large model, during which every other call would wait).

    Contract: thread-safe against the service's own calls; never raises; changes nothing a
    caller can observe except how soon the post answers (the post answers exactly as it would
    without it, and must not rely on it having run)."""

    def preload_post_task(self, spec: dict[str, Any], signature: bytes) -> object | None:
        """A token for what was read (None: nothing kept), which the server hands to
        ``discard_preloaded`` once the request has ended."""
        ...

    def discard_preloaded(self, token: object) -> None:
        """Drop what was read for ``token`` if its post did not take it. Any thread; quick."""
        ...


# --- run artifacts over HTTP (rpc/artifacts.py; docs/rpc.md "Run artifacts over HTTP") -------


@dataclass(frozen=True, slots=True, kw_only=True)
class PayloadArtifact:
    """A committed round's accepted payload, as stored."""

    payload_hash: bytes
    """The 32-byte hash the trainer signed (its submission record's), which ``data`` hashes to."""
    data: bytes
    """The payload bytes the node stored."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelArtifact:
    """Where a Sealed run's final model file is."""

    final_model_hash: bytes
    """The receipt's ``final_model_hash`` (of the tensors, not of the file's bytes)."""
    path: Path | None
    """``data_dir/models/<task_id>.safetensors``; None on a node without a data directory (the
    in-memory store), whose file the server asks ``export_final_model`` for instead. The file
    may still be missing (a write the node retries): the server falls back the same way."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointArtifact:
    """Where a run's init checkpoint is, and what it must hash to before it is served."""

    path: Path
    """The real path the spec's ``file://`` URI names, already confined to the node's
    ``allowed_checkpoint_dirs``."""
    sha256: bytes
    """The spec's SHA-256 (32 bytes) of the file."""
    max_bytes: int
    """The node's ``max_checkpoint_bytes``: a larger file is not served."""


@runtime_checkable
class ArtifactSource(Protocol):
    """Optional: a service whose run artifacts the server publishes under ``/artifacts/v1``.
    Called on the service's one thread like every other call (they read its state and store);
    the server reads, hashes and streams files on threads of its own. Fail by raising a
    ``TenzroError`` (``UnknownTask``, ``InvalidRunArgument``, ``InvalidState``,
    ``PayloadUnavailable`` and its leaves, ``CheckpointError``, ``StorageError``)."""

    def get_payload_artifact(self, task_id: str, round: int, fragment: int, trainer: bytes) -> PayloadArtifact:
        """The payload ``trainer`` (20 bytes) submitted for a committed round's fragment, if
        that round's record accepted it (``tenzro_training.artifacts``)."""
        ...

    def get_model_artifact(self, task_id: str) -> ModelArtifact:
        """Where a Sealed run's final model file is (InvalidState for any other run)."""
        ...

    def export_final_model(self, task_id: str) -> bytes:
        """A Sealed run's final model file bytes, built from the store (the fallback when the
        file is not on disk)."""
        ...

    def get_checkpoint_artifact(self, task_id: str) -> CheckpointArtifact:
        """Where the run's init checkpoint is (CheckpointError when its URI cannot be served)."""
        ...
