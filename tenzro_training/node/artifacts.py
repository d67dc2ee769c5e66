"""What the node reads to publish a run's artifacts (a SHELL helper: it reads the store): the
stored payload of a committed round's accepted submission, and where the init checkpoint is.

What this module is: :func:`load_payload_artifact` and :func:`locate_checkpoint`, called by
``NodeService.get_payload_artifact`` / ``get_checkpoint_artifact`` on the service thread.

What it is NOT: the rule of which payloads are public (``tenzro_training.artifacts``, pure), or
HTTP, hashing and streaming (``rpc/artifacts.py``, on the server's own threads: a payload's or a
checkpoint's SHA-256 must not hold the one service thread).

A committed round's accepted payload is found as a replay finds it (``node/replay.py``): the
submission record of (round, fragment, trainer) names the payload hash, and the payload is
stored once per (task, hash). A missing one is either pruned on purpose (the pruning record
says so: ``PayloadPruned``) or a damaged store (``StorageError``).
"""

from __future__ import annotations

from rpc.service import CheckpointArtifact, PayloadArtifact
from storage import schema
from storage.interface import KVStore, StorageError
from tenzro_training.addresses import format_address
from tenzro_training.artifacts import is_payload_pruned, validate_payload_request
from tenzro_training.errors import CheckpointError, PayloadPruned
from tenzro_training.node import persistence
from tenzro_training.node.checkpoint import resolve_checkpoint_path
from tenzro_training.node.config import NodeConfig
from tenzro_training.node.model_state import decode_round_count
from tenzro_training.run_state import RunState

__all__ = ["load_payload_artifact", "locate_checkpoint"]


def load_payload_artifact(store: KVStore, run: RunState, round: int, fragment: int, trainer: bytes) -> PayloadArtifact:
    """The stored payload ``trainer`` submitted for ``(round, fragment)`` of a committed round
    that accepted it (PayloadNotPublic otherwise), with the hash its submission record names.
    The bytes are not hashed here (the server hashes what it sends, off this thread, and
    refuses bytes that differ from ``payload_hash``)."""
    validate_payload_request(run, round, fragment, trainer)
    task_id = run.task_id
    raw = store.get(schema.CF_SUBMISSIONS, schema.submission_key(task_id, round, fragment, trainer))
    if raw is None:  # the record accepted it: its batch wrote the submission record
        raise StorageError(f"the submission of {format_address(trainer)} to {task_id} round {round} fragment "
                           f"{fragment} is missing from the store")
    payload_hash = persistence.decode_submission_record(raw).payload_hash
    data = store.get(schema.CF_SUBMISSIONS, schema.payload_key(task_id, payload_hash))
    if data is None:
        pruned = store.get(schema.CF_META, schema.payloads_pruned_key(task_id))
        if is_payload_pruned(None if pruned is None else decode_round_count(pruned), round):
            raise PayloadPruned(task_id, "0x" + payload_hash.hex(), round)
        raise StorageError(f"the payload of {format_address(trainer)} to {task_id} round {round} fragment "
                           f"{fragment} is missing from the store")
    return PayloadArtifact(payload_hash=payload_hash, data=data)


def locate_checkpoint(run: RunState, config: NodeConfig) -> CheckpointArtifact:
    """Where the run's init checkpoint is: the real path its spec's URI names, confined to the
    node's ``allowed_checkpoint_dirs`` as a post's read is (CheckpointError otherwise; the
    server checks the file's SHA-256 against the spec's before it sends a byte)."""
    ref = run.spec.init_checkpoint()
    if ref is None:  # a posted run always names one (postTask refuses a spec without)
        raise CheckpointError("", "the spec names no init checkpoint")
    path = resolve_checkpoint_path(ref.uri, config.allowed_checkpoint_dirs)
    return CheckpointArtifact(path=path, sha256=ref.sha256_bytes, max_bytes=config.max_checkpoint_bytes)
