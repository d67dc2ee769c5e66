"""The node's in-memory copies of what a finalize reads (a SHELL helper of the node service).

What this module is: the two caches that keep the replay of a run's global model off the common
path, and that replay itself, which fills the first on a miss.

- :class:`ModelCache`: the committed fp32 weights and momentum of the runs finalized (or served)
  last, which the next finalize steps in place; on a miss, :meth:`ModelCache.rebuild` builds
  them from the store: the last snapshot, hash-checked, then every committed round after it
  replayed (``node.replay``) and checked against its record.
- :class:`PayloadCache`: the accepted payloads of open rounds that are already in the store, so a
  finalize does not read back what it was just sent.

Why it is apart from the service: both are budgets over memory with their own eviction rules,
and the rebuild is the one place the node proves a model from stored inputs before it serves or
steps it; none of it decides anything about a run (the service passes the run states in, and
writes what its transitions call for: ``model_state.compute_*_ops``).

What it is NOT: the store's model state or payloads (``model_state``, ``storage.schema``), the
round update (the core's ``global_model``), or thread-safe: the node service drives it from its
one thread; other threads only read the int sizes and counters (``NodeService.cache_stats``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Iterator

import torch

from storage import schema
from storage.interface import KVStore, StorageError
from tenzro_training.global_model import ModelLayout, RoundBuffers, Worker, compute_state_model_hash
from tenzro_training.node.config import NodeConfig
from tenzro_training.node.model_state import decode_round_count, load_model_fragments, load_snapshot_momentum
from tenzro_training.node.replay import load_round_inputs, replay_round
from tenzro_training.run_state import RunState, is_terminal

__all__ = ["CommittedState", "ModelCache", "PayloadCache"]

log = logging.getLogger("tenzro.node")

CommittedState = tuple[list[torch.Tensor], list[torch.Tensor]]
"""A run's committed fp32 (weights, momentum), one flat vector per fragment each."""


def _state_nbytes(state: CommittedState) -> int:
    """Bytes of a cached (weights, momentum) pair."""
    return sum(t.nbytes for t in (*state[0], *state[1]))


class PayloadCache:
    """Payloads of open rounds that are already in the store, by task then payload hash, so a
    finalize does not read back (copying ~4 bytes per parameter each) what it was just sent.
    At most ``config.payload_cache_bytes``; a run's entries go when its round moves on
    (:meth:`drop`)."""

    def __init__(self, store: KVStore, config: NodeConfig) -> None:
        self._store = store
        self._config = config
        self._entries: dict[str, dict[bytes, bytes]] = {}
        self.nbytes = 0
        """Bytes held (``cache_stats``: an int, read from other threads)."""

    def __len__(self) -> int:
        """Runs with payloads held."""
        return len(self._entries)

    def get(self, task_id: str, digest: bytes) -> bytes | None:
        entries = self._entries.get(task_id)
        return None if entries is None else entries.get(digest)

    def put(self, task_id: str, digest: bytes, data: bytes) -> None:
        """Keep a payload that is in the store for this round's finalize, within the budget."""
        entries = self._entries.get(task_id, {})
        if digest in entries or self.nbytes + len(data) > self._config.payload_cache_bytes:
            return
        entries[digest] = data
        self._entries[task_id] = entries
        self.nbytes += len(data)

    def drop(self, task_id: str) -> None:
        entries = self._entries.pop(task_id, None)
        if entries:
            self.nbytes -= sum(len(data) for data in entries.values())

    def discard(self, task_id: str, digests: Iterable[bytes]) -> None:
        """Forget these payloads of an open round that no finalize will read: a slashed
        trainer's, dropped from the accepted set, held until the round moved on before
        (their bytes counted against the budget other trainers' payloads need)."""
        entries = self._entries.get(task_id)
        if not entries:
            return
        for digest in digests:
            data = entries.pop(digest, None)
            if data is not None:
                self.nbytes -= len(data)
        if not entries:
            del self._entries[task_id]

    def load(self, task_id: str, digest: bytes) -> bytes:
        """An accepted payload: held here, else read from the store (StorageError if missing)."""
        data = self.get(task_id, digest)
        if data is None:
            data = self._store.get(schema.CF_SUBMISSIONS, schema.payload_key(task_id, digest))
        if data is None:
            raise StorageError(f"accepted payload 0x{digest.hex()} of {task_id} is missing from the store")
        return data


class ModelCache:
    """The fp32 weights and momentum each run's last finalize committed, so the next one steps
    them in place instead of rebuilding them from the store (see :meth:`take`). At most
    ``config.model_cache_runs`` runs and ``model_cache_bytes`` (never fewer than 2 runs for the
    bytes), least recently finalized or served out; only :meth:`remember` and :meth:`forget`
    change it (they keep the byte count that ``cache_stats`` reads from other threads).

    ``worker`` and ``buffers`` are the service's finalize worker and round scratch, which a
    rebuild's replay shares with its finalizes."""

    def __init__(self, store: KVStore, config: NodeConfig, payloads: PayloadCache, worker: Worker,
                 buffers: RoundBuffers) -> None:
        self._store = store
        self._config = config
        self._payloads = payloads
        self._worker = worker
        self._buffers = buffers
        self._states: OrderedDict[str, CommittedState] = OrderedDict()
        self.nbytes = 0
        """Bytes of the states held (``cache_stats``: an int, read from other threads)."""
        self.rebuilds = 0
        """Models rebuilt from a snapshot (``cache_stats``)."""
        self.replayed_rounds = 0
        """Rounds those rebuilds replayed (``cache_stats``)."""

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self) -> Iterator[str]:
        """The task ids held, least recently finalized or served first."""
        return iter(self._states)

    def get(self, task_id: str) -> CommittedState | None:
        """The state held for ``task_id``, left in the cache (and in its place in the order)."""
        return self._states.get(task_id)

    def take(self, run: RunState, model: ModelLayout) -> CommittedState:
        """The committed weights and momentum of ``run`` as buffers this finalize owns and
        steps in place: the cached ones (taken OUT of the cache, so a finalize that fails after
        stepping them leaves no half-stepped state behind; the next one rebuilds them), or ones
        rebuilt from the store."""
        cached = self.forget(run.task_id)
        if cached is not None:
            return cached
        return self.rebuild(run, model)

    def remember(self, run: RunState, state: CommittedState) -> None:
        """Cache a run's committed state (most recent last): at most config.model_cache_runs
        runs, and config.model_cache_bytes unless that would leave fewer than 2 runs cached.
        ``run`` is its committed run state: an ended run's is not kept (no finalize steps it).

        Why the floor: until the byte budget existed the cache held 2 runs whatever their size;
        with the budget alone two runs each above half of it evicted each other, and every
        finalize of either replayed its rounds since the last snapshot (review)."""
        if self._config.model_cache_runs == 0 or is_terminal(run):
            return
        task_id = run.task_id
        self.forget(task_id)
        self._states[task_id] = state
        self.nbytes += _state_nbytes(state)
        floor = min(2, self._config.model_cache_runs)
        while len(self._states) > self._config.model_cache_runs or (
            len(self._states) > floor and self.nbytes > self._config.model_cache_bytes
        ):
            self.forget(next(iter(self._states)))

    def forget(self, task_id: str) -> CommittedState | None:
        """Take ``task_id``'s state out of the cache; returns it (None if it was not held)."""
        state = self._states.pop(task_id, None)
        if state is not None:
            self.nbytes -= _state_nbytes(state)
        return state

    def rebuild(self, run: RunState, model: ModelLayout) -> CommittedState:
        """The committed weights and momentum of ``run``, after its ``len(run.records)``
        committed rounds: the stored snapshot, checked against the model hash committed for it,
        then every committed round after it replayed from its stored payloads by the same pure
        update a finalize runs, each checked against its round record. Any difference is a
        damaged store (StorageError): the node never serves or steps a model it cannot prove."""
        task_id = run.task_id
        raw = self._store.get(schema.CF_META, schema.model_snapshot_key(task_id))
        if raw is None:
            raise StorageError(f"the model snapshot record of {task_id} is missing")
        start = decode_round_count(raw)
        if start > len(run.records):
            raise StorageError(f"the model snapshot of {task_id} is of round {start}, after its last committed round")
        pruned = self._store.get(schema.CF_META, schema.payloads_pruned_key(task_id))
        if pruned is not None and decode_round_count(pruned) > start and start < len(run.records):
            raise StorageError(
                f"the payloads of {task_id} were pruned (prune_payloads): its model after round {start} cannot be rebuilt"
            )
        weights = load_model_fragments(self._store, task_id, schema.MODEL_WEIGHTS, model)
        momentum = load_snapshot_momentum(self._store, task_id, model, start)
        expected = run.records[start - 1].model_hash if start > 0 else run.initial_model_hash
        if compute_state_model_hash(model, weights) != expected:
            raise StorageError(f"the stored model snapshot of {task_id} (round {start}) does not hash to its committed hash")
        self.rebuilds += 1
        for record in run.records[start:]:
            inputs = load_round_inputs(self._store, task_id, record,
                                       lambda digest: self._payloads.load(task_id, digest))
            replay_round(run.spec, model, record, inputs, weights, momentum,
                         max_payload_bytes=self._config.max_payload_bytes, worker=self._worker,
                         buffers=self._buffers)
            self.replayed_rounds += 1
        if start < len(run.records):
            log.info("rebuilt the model of %s: snapshot of round %d, %d round(s) replayed",
                     task_id, start, len(run.records) - start)
        return weights, momentum
