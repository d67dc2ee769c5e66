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

from typing import Any, Protocol, runtime_checkable

__all__ = ["Preloading", "TrainingService"]


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
