"""The node service: applies the pure run lifecycle to stored state, one atomic batch per call.

What this module is: :class:`NodeService`, the ``rpc.service.TrainingService`` the JSON-RPC
transport calls, plus the node-side entry points the process needs (``tick`` for deadlines,
``submit_ticket`` and ``store_payload`` for gossip, final model export). Every mutation follows
the same steps: check the arguments' shape, rebuild the EIP-712 message and recover its signer,
take the run and the ledger, call the pure transition (``tenzro_training.run``) at
``now = clock()``, then write the run state, the ledger entries that changed and everything the
call produced (payload, submission record, evidence, model fragments, aggregation reports,
receipt) in ONE ``atomic_batch``, and answer only after it committed. A refused call raises and
writes nothing; the one exception is equivocation, which the protocol applies (slash, evidence)
and still answers with an error.

What it is NOT: the protocol rules (they are the core's: this module decides nothing a third
party could not recompute from the stored inputs), the transport (``rpc/``), the process, clock
loop or CLI (``node/main.py``), or thread-safe: the process runs every call on one thread.

State kept in memory, all rebuilt from the store at construction: the ledger (only
``compute_changes`` diffs are ever written), every run, and each run's fragment layouts.
A node killed at any instant restarts from exactly the last acknowledged call.

The global model is not written every round. The store holds each run's weights and momentum
as of its last snapshot (every ``model_snapshot_rounds`` rounds) and, as a chain keeps blocks
rather than states, every round's accepted payloads (those after the snapshot at least, with
``prune_payloads``) and committed record. The current model is
the snapshot plus the rounds after it, replayed with the same pure round update and checked
against each committed record (aggregate, report and model hashes), so a damaged store is found,
never trusted. Two caches keep that replay off the common path: the committed fp32 state of the
runs finalized last, and the accepted payloads of open rounds (both in ``node/model_cache.py``,
with the replay).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from hashlib import sha256
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from rpc.service import CheckpointArtifact, ModelArtifact, PayloadArtifact
from storage import schema
from storage.interface import BatchOp, KVStore, Operation, StorageError
from tenzro_training.addresses import Address, format_address, parse_address, validate_address_bytes
from tenzro_training.artifacts import validate_model_request
from tenzro_training.auth import (
    CancelTask,
    EnrollTrainer,
    FinalizeRound,
    PostTask,
    SignedMessageType,
    SubmitOuterGradient,
    recover_signer_address,
    validate_signer,
)
from tenzro_training.compression import PayloadEncoding
from tenzro_training.election import ExclusionReason, TicketRejected, make_ticket
from tenzro_training.errors import (
    FragmentError,
    InvalidState,
    NotEnrolled,
    PayloadError,
    PayloadUnavailable,
    SpecError,
    TenzroError,
    UnknownTask,
)
from tenzro_training.fragments import FragmentLayout
from tenzro_training.jsontext import serialize_json
from tenzro_training.node import persistence, startup
from tenzro_training.node.artifacts import load_payload_artifact, locate_checkpoint
from tenzro_training.node.checkpoint import load_init_checkpoint
from tenzro_training.node.config import NodeConfig
from tenzro_training.node.model_cache import ModelCache, PayloadCache
from tenzro_training.node.model_files import MODEL_FILE_RETRY_MS, ModelFiles
from tenzro_training.global_model import (
    InitialModel,
    ModelLayout,
    RoundBuffers,
    RoundUpdate,
    compute_initial_model,
    compute_round_update,
)
from tenzro_training.node.model_state import (
    compute_drop_snapshot_ops,
    compute_fragment_ops,
    compute_prune_ops,
    compute_snapshot_ops,
    decode_model_layout,
    encode_model_layout,
    load_model_fragments,
)
from tenzro_training.node.run_store import compute_final_model_file, read_round_records
from tenzro_training.payload import (
    ENCODING_RAW,
    PayloadHeader,
    PayloadLayoutMismatch,
    PayloadMetadataMismatch,
    PayloadTooLarge,
    compute_payload_hash,
    decode_payload,
)
from tenzro_training.records import Ticket
from tenzro_training.run import (
    InvalidRunArgument,
    NotSponsor,
    RunEvent,
    SubmissionAccepted,
    Transition,
    has_passed_uncommitted_deadline,
    is_accepted_set_closed,
    process_cancel,
    process_enroll,
    process_equivocation,
    process_finalize,
    process_pause,
    process_post_task,
    process_submission,
    process_tick,
    process_ticket,
    validate_open_runs,
)
from tenzro_training.run_events import EquivocationDetected
from tenzro_training.run_state import (
    RunState,
    RunStatus,
    compute_run_list_entry,
    compute_run_view_clock,
    compute_run_view_static,
    get_accepted_payload_hashes,
    get_accepted_submissions,
    get_current_syncer,
    get_next_deadline_ms,
    get_submission_counts,
    get_trainer,
    is_terminal,
    round_record_to_dict,
)
from tenzro_training.receipt import compute_receipt
from tenzro_training.receipt_abi import encode_receipt as encode_receipt_abi
from tenzro_training.receipt_check import (
    Attestations,
    AttestedTicket,
    ElectionAttestation,
    RoundAttestation,
    SubmissionAttestation,
)
from tenzro_training.spec import TrainingTaskSpec

__all__ = ["ALIVE_WRITE_MS", "MODEL_FILE_RETRY_MS", "PAUSE_MIN_MS", "RUN_JSON_CACHE_RUNS", "NodeService", "wall_clock_ms"]

log = logging.getLogger("tenzro.node")

_NO_HASH = bytes(32)

PAUSE_MIN_MS = 3_000
"""Once the clock is started (``start_clock``), a gap this long since the node last served (a
call or a tick; the node's tick runs every 100 ms) in which the process used almost no CPU
(under ``PAUSE_MAX_CPU_SHARE`` of it) is a pause: the node was stopped (SIGSTOP, a VM freeze)
or blocked, and pending deadlines move later by it (``run.process_pause``)."""

PAUSE_MAX_CPU_SHARE = 0.1
"""A gap in which the process ran for more than this share of the wall time is the node being
busy, not paused: a client that keeps the one service thread busy (a huge body to parse, an
expensive batch) must not be able to push every run's deadlines back (review of the pause
change)."""

ALIVE_WRITE_MS = 1_000
"""How often the last instant the node served is written (``schema.NODE_ALIVE_KEY``), so a
restart knows how long the node was down."""

RUN_JSON_CACHE_RUNS = 64
"""Runs whose serialized getRun state part the service keeps (a few KB to a few hundred KB
each, by trainer and round count); the runs being trained are the ones polled."""

ENDED_RUNS_CACHED = 64
"""Ended runs (Sealed, Cancelled, Failed) whose decoded state the service keeps, most recently
used; the others are read back from the store when asked for. Every run ever held had stayed in
memory for good, ~1.3 KB per committed round with its finalize signature, so a long-lived node
grew without bound (soak probe); listRuns and the run metrics read a one-line summary of each
ended run instead."""

PRELOADED_POSTS = 2
"""Init checkpoints read ahead of their postTask (``preload_post_task``) held at once; an older
one is dropped (its post, if it comes, reads the file itself)."""

RECEIPT_JSON_CACHE_BYTES = 64 << 20
"""Serialized getReceipt answers the service keeps, least recently asked for out first. Each
was rebuilt on every call (ABI, attestations with every signature): 0.6-1.1 s and 3.1 MB for a
600-round run, on the one service thread, for an unauthenticated call (soak probe)."""


def wall_clock_ms() -> int:
    """Unix time in milliseconds (the default clock)."""
    return time.time_ns() // 1_000_000


def elapsed_clock_ms() -> int:
    """Milliseconds on a clock that keeps counting while the process is stopped or the machine
    suspended but never steps when the wall clock is set: Linux CLOCK_BOOTTIME; macOS
    CLOCK_MONOTONIC, which counts sleep there; elsewhere the monotonic clock, which may not count
    a suspend. With the wall clock it tells the correction of a set-back clock from a pause
    (``NodeService._resume_if_paused``): such a correction had been taken for a pause of its
    whole size (ops probe: a day)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is not None:
        return time.clock_gettime_ns(boottime) // 1_000_000
    if sys.platform == "darwin":  # its CLOCK_MONOTONIC counts sleep; time.monotonic() does not
        return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1_000_000
    return time.monotonic_ns() // 1_000_000


def _hex(value: bytes) -> str:
    return "0x" + value.hex()


class NodeService:
    """The node's state and the calls that change it (see the module docstring).

    ``store`` is opened and closed by the caller; ``clock`` returns unix milliseconds (tests pass
    a fake). ``elapsed_clock`` (ms) measures pauses; by default :func:`elapsed_clock_ms` with
    the wall clock, and ``clock`` itself with a fake one. ``on_event`` (an attribute) is called
    with each event after its batch committed. Offline tools do not open a store through it: they
    read it read-only with ``node.run_store`` (``tenzro audit``, ``tenzro train export-model``).
    """

    on_event: Callable[[RunEvent], None] | None

    def __init__(self, config: NodeConfig, store: KVStore, *, clock: Callable[[], int] | None = None,
                 cpu_clock: Callable[[], float] = time.process_time,
                 elapsed_clock: Callable[[], int] | None = None) -> None:
        if not isinstance(config, NodeConfig):
            raise TypeError(f"config must be a NodeConfig, got {type(config).__name__}")
        self._config = config
        self._store = store
        self._clock = clock if clock is not None else wall_clock_ms
        self.on_event = None
        self._closed = False
        self._alive_ms: int | None = None
        """The last instant the node served, once ``start_clock`` ran (None: no pause detection)."""
        self._alive_written_ms: int | None = None
        self._cpu_clock = cpu_clock
        self._alive_cpu_s = 0.0
        """The process's CPU seconds at ``_alive_ms``."""
        if elapsed_clock is None:
            elapsed_clock = elapsed_clock_ms if clock is None else self._clock
        self._elapsed_clock = elapsed_clock
        self._alive_elapsed_ms = 0
        """``elapsed_clock`` at ``_alive_ms``."""
        self._clock_offset_ms: int | None = None
        """The highest wall-minus-elapsed offset seen since ``start_clock``: the offset while the
        wall clock was right, as far as the node can tell. A later offset below it is a clock
        set back; a rise back towards it is that clock's correction, not a pause."""
        # Every run that has not ended (and, until startup is over, every run without a stored
        # summary, schema.ended_summary_key), with what the store holds of it
        # (compute_transition_ops writes only what changed).
        self._runs: dict[str, RunState] = {}
        self._stored_runs: dict[str, persistence.StoredRun] = {}
        # Ended runs: each one's listRuns entry (its status among them), and the decoded state of
        # the ENDED_RUNS_CACHED most recently used (_lookup reads the others back).
        self._ended: dict[str, dict[str, Any]] = {}
        self._ended_cache: OrderedDict[str, tuple[RunState, persistence.StoredRun]] = OrderedDict()
        self._models: dict[str, ModelLayout] = {}
        self._layout_views: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
        # getRun's serialized state part per run: (the run state and has_receipt it was
        # rendered from, the JSON text without its closing brace); see get_run_json.
        self._run_json: OrderedDict[str, tuple[RunState, bool, bytes]] = OrderedDict()
        # task -> (records rendered, their JSON objects joined by ","): see _round_records_json.
        # Kept with _run_json: dropped when a run leaves that cache.
        self._records_json: dict[str, tuple[int, bytes]] = {}
        # getReceipt's answers, rendered once per sealed run (get_receipt_json).
        self._receipt_json: OrderedDict[str, bytes] = OrderedDict()
        self._receipt_json_bytes = 0
        self._ticket_failures: set[tuple[str, bytes]] = set()
        # (task id, spec hash) -> the post's initial model, or the error reading it gave, read
        # by preload_post_task on another thread; taken (and so dropped) by post_task.
        # Each entry carries a mark of its own read, which the request that made it drops when it
        # ends (discard_preloaded): nothing outlives the request it was read for.
        self._preloaded: OrderedDict[tuple[str, bytes], tuple[object, InitialModel | TenzroError]] = OrderedDict()
        self._preload_lock = threading.Lock()
        # The syncer's FinalizeRound signature per task and round: written with the round's batch
        # (schema.finalize_signature_key, for getReceipt's attestations) and kept here for the
        # p2p bridge's RoundFinalized gossip while the run is open; reloaded from the store at
        # startup for open runs, read from it for ended ones (get_finalize_signature).
        self._finalize_signatures: dict[str, dict[int, bytes]] = {}
        # task -> (round, fragment, trainer) -> (payload hash, the trainer's signature of it) that
        # gossip brought and store_payload holds: one per trainer and fragment of a run's current
        # round; a differently signed second one is equivocation (evidence: both signatures). A
        # run's entries go when its round moves on or it ends (_commit): kept per task, an ended
        # run's had stayed for good and every gossip payload scanned all of them (soak probe).
        self._gossip_held: dict[str, dict[tuple[int, int, bytes], tuple[bytes, bytes]]] = {}
        # Finalize hashes the round's aggregates here while the caller hashes the new model
        # (global_model.compute_round_update); its one thread starts at the first finalize.
        self._finalize_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tenzro-finalize")
        # Scratch every round computation reuses (finalize, rebuild): fresh memory page-faults.
        self._round_buffers = RoundBuffers()
        # The accepted payloads of open rounds, and the fp32 weights and momentum each run's last
        # finalize committed, which the next one steps in place (node/model_cache.py).
        self._payload_cache = PayloadCache(store, config)
        self._model_cache = ModelCache(store, config, self._payload_cache, self._finalize_worker, self._round_buffers)
        self._storage_failure: str | None = None  # see storage_failure
        self._model_files = ModelFiles(config.data_dir)
        self._payloads_pruned = 0  # for cache_stats (GET /metrics)
        self._accepted_by_encoding: dict[str, list[int]] = {}
        """Submissions accepted since start, and their payload bytes, by payload encoding (GET /metrics)."""
        # Startup (node/startup.py): the store bound to the config, its runs read and checked.
        self._ledger = startup.open_ledger(store, config, self._write)
        self._runs, self._stored_runs, self._ended = startup.load_runs(store)
        self._finalize_signatures = startup.load_finalize_signatures(store, self._runs)
        legacy = [*startup.compute_legacy_snapshot_ops(store, self._runs),  # read and checked
                  *startup.compute_legacy_sealed_record_ops(store, self._runs)]
        # Accepted (genesis, chain id, every run and record read and checked): an older store is
        # marked for this version now, before the writes that only this version reads. At its
        # open it had been marked before the checks (upgrade probe); marked after those writes,
        # the old version could take a store half written in the new form, and marked before the
        # reads above, a damaged store they refuse stayed marked (reviews).
        startup.mark_schema_upgraded(store)
        self._write(legacy)
        sealed = [t for t, run in self._runs.items() if run.status is RunStatus.SEALED]
        sealed += [t for t, entry in self._ended.items() if entry["status"] == RunStatus.SEALED.value]
        self._model_files.restore(sealed, self.export_final_model)
        self._payloads_pruned += startup.prune_ended_runs(store, config, self._runs, self._ended, self._write)
        retired = [t for t, run in self._runs.items() if is_terminal(run)]  # startup is over
        for task_id in retired:
            self._retire(task_id, self._runs.pop(task_id), self._stored_runs.pop(task_id))
        # Ended under a version that wrote no summary: written now, so the next start reads the
        # summary alone instead of decoding the run.
        self._write([self._summary_op(t) for t in retired])

    # --- small helpers -----------------------------------------------------------------------

    def _check_open(self) -> None:
        """First step of every call (before it reads any state): refuse calls once closed, and
        apply a pause the node has just come out of before the call sees its deadlines."""
        if self._closed:
            raise StorageError("the node service is closed")
        if self._alive_ms is not None:
            self._resume_if_paused()

    # --- pauses: time the node could not serve does not count against anyone ------------------

    def start_clock(self) -> tuple[RunEvent, ...]:
        """Turn on pause detection (``tenzro node`` does, first thing; services driven by a
        hand-set clock in tests do not). The time since the node last served before it stopped
        (``schema.NODE_ALIVE_KEY``) is a pause: every run's pending deadlines move later by it,
        so a restart, an upgrade or a crash does not fail over healthy syncers or fail runs
        whose trainers could not submit (syncer probe: a 6 s restart inside a finalize window
        demoted the syncer, a 15 s one failed the run). Returns the events."""
        self._check_open()
        now = self._now()
        raw = self._store.get(schema.CF_META, schema.NODE_ALIVE_KEY)
        last = int.from_bytes(raw, "big") if raw is not None and len(raw) == 8 else None
        updates = [run.updated_at_ms for run in self._runs.values()]
        updates += [entry["updated_at_ms"] for entry in self._ended.values()]
        if last is None and updates:
            # A store from before the node recorded when it last served: its newest run update is
            # a lower bound of that instant (the downtime of the upgrade had counted against the
            # runs: a run posted before it failed its enrollment at once; upgrade probe). A
            # pending deadline may then move later by more than the downtime, never by less.
            last = max(updates)
        self._alive_ms = now if last is None else min(last, now)  # a clock set back: no pause
        events: tuple[RunEvent, ...] = ()
        if now - self._alive_ms > PAUSE_MIN_MS:  # the process was not running at all
            log.warning("the node was down for %.1f s since it last served: pending deadlines move that much later",
                        (now - self._alive_ms) / 1000)
            events = self._apply_pause(self._alive_ms, now)
        self._alive_ms, self._alive_elapsed_ms, self._alive_cpu_s = now, self._elapsed_clock(), self._cpu_clock()
        # The last instant served is a lower bound on the right wall time: a node started on a
        # clock still behind (before time sync) must take NTP's later step up to it for a
        # correction, not a pause of its whole size (review: a dead RTC would be decades).
        self._clock_offset_ms = (now if last is None else max(last, now)) - self._alive_elapsed_ms
        return events + self._resume_if_paused()

    def _resume_if_paused(self) -> tuple[RunEvent, ...]:
        assert self._alive_ms is not None
        now, elapsed, cpu = self._now(), self._elapsed_clock(), self._cpu_clock()  # wall and elapsed together
        last = self._alive_ms
        events: tuple[RunEvent, ...] = ()
        # The gap is the time the elapsed clock saw pass, plus any rise of the wall clock's
        # offset to it past the highest offset seen. A rise up to that offset is the correction
        # of an earlier set-back: no pause (deadlines, wall-clock instants, simply come sooner;
        # ops probe: a day). A rise past it stays a pause whatever its cause: a VM frozen with
        # its clocks (kvmclock), then stepped forward by NTP, looks exactly like it, and taking
        # it for a clock step would fire every deadline the freeze covered (review). A wall
        # clock set back during a stop does not shorten the stop (review).
        old_offset, new_offset = last - self._alive_elapsed_ms, now - elapsed
        reference = self._clock_offset_ms if self._clock_offset_ms is not None else old_offset
        correction = max(0, min(new_offset, reference) - old_offset)
        gap_ms = (elapsed - self._alive_elapsed_ms) + max(0, new_offset - reference)
        self._clock_offset_ms = max(reference, new_offset)
        if correction > PAUSE_MIN_MS:
            log.warning("the wall clock stepped forward by %.1f s, back from an earlier set-back: not a pause, "
                        "deadlines stay as they are", correction / 1000)
        if gap_ms > PAUSE_MIN_MS and (cpu - self._alive_cpu_s) * 1000 < PAUSE_MAX_CPU_SHARE * gap_ms:
            log.warning("the node served nothing for %.1f s and barely ran (stopped, frozen or blocked): pending "
                        "deadlines move that much later", gap_ms / 1000)
            events = self._apply_pause(max(0, now - gap_ms), now)
        # ``now`` even when the clock was set back: the next gap is measured from it (kept at
        # the later instant, a set-back clock hid every pause for as long as it was set back).
        self._alive_ms, self._alive_cpu_s, self._alive_elapsed_ms = now, cpu, elapsed
        if self._alive_written_ms is None or abs(now - self._alive_written_ms) >= ALIVE_WRITE_MS:
            try:
                self._write([(BatchOp.PUT, schema.CF_META, schema.NODE_ALIVE_KEY, now.to_bytes(8, "big"))])
            except StorageError:
                pass  # reported by the health check (storage_failure); serving goes on
            self._alive_written_ms = now
        return events

    @contextlib.contextmanager
    def _refusal_kept(self, run: RunState, now: int) -> Iterator[None]:
        """Around the core's judgement of a state-changing call on ``run`` at ``now``: when it
        refuses the call (a TenzroError), record ``now`` as an instant the node served
        (``NODE_ALIVE_KEY``) at once if the refusal may rest on a deadline that passed since the
        last write and that no tick committed (``run.has_passed_uncommitted_deadline``): that
        refusal must hold after a restart (election probe, 2026-11-26). Every other refusal
        writes nothing: refusals are free to sign, and each write is a store batch (an fsync with
        ``sync_writes``; review, 2026-11-26). A write failure is left to the health check, as for
        the periodic write; the refusal propagates either way."""
        try:
            yield
        except TenzroError:
            self._write_alive(run, now)
            raise

    def _write_alive(self, run: RunState, now: int) -> None:
        written = self._alive_written_ms
        if self._alive_ms is None or (written is not None and now <= written):
            return
        if not has_passed_uncommitted_deadline(run, now, written):
            return
        try:
            self._write([(BatchOp.PUT, schema.CF_META, schema.NODE_ALIVE_KEY, now.to_bytes(8, "big"))])
        except StorageError:
            return
        self._alive_written_ms = now

    def _apply_pause(self, paused_at: int, now: int) -> tuple[RunEvent, ...]:
        events: list[RunEvent] = []
        for task_id in sorted(self._runs):
            run = self._runs[task_id]
            if is_terminal(run):
                continue
            t = process_pause(run, self._ledger, paused_at, now)
            if not t.events:
                continue
            try:
                self._commit(t)
            except StorageError:
                log.exception("cannot record the pause of %s; its deadlines stay", task_id)
                continue
            events.extend(t.events)
        return tuple(events)

    def _now(self) -> int:
        now = self._clock()
        if isinstance(now, bool) or not isinstance(now, int) or now < 0:
            raise TypeError(f"clock must return non-negative integer milliseconds, got {now!r}")
        return now

    def _run(self, task_id: str) -> RunState:
        run = self._lookup(task_id)
        if run is None:
            raise UnknownTask(task_id)
        return run

    def _lookup(self, task_id: str) -> RunState | None:
        """The run's current state, read back from the store for an ended run out of the cache;
        None for a task the node does not hold."""
        run = self._runs.get(task_id)
        if run is not None:
            return run
        held = self._ended_cache.get(task_id)
        if held is None:
            if task_id not in self._ended:
                return None
            raw = self._store.get(schema.CF_TRAINING_RUNS, schema.run_key(task_id))
            if raw is None:
                raise StorageError(f"the ended run {task_id} is missing from the store")
            held = (persistence.decode_run(raw, read_round_records(self._store, task_id)), persistence.stored_run(raw))
            self._cache_ended(task_id, *held)
        else:
            self._ended_cache.move_to_end(task_id)
        return held[0]

    def _stored(self, task_id: str) -> persistence.StoredRun | None:
        stored = self._stored_runs.get(task_id)
        if stored is None and task_id in self._ended_cache:
            stored = self._ended_cache[task_id][1]
        return stored

    def _retire(self, task_id: str, run: RunState, stored: persistence.StoredRun) -> None:
        """An ended run (already out of ``_runs``) leaves the per-run state an open run needs,
        keeps its listRuns entry and goes to the cache of ended runs."""
        self._ended[task_id] = compute_run_list_entry(run)
        self._finalize_signatures.pop(task_id, None)  # in the store (get_finalize_signature)
        self._ticket_failures = {f for f in self._ticket_failures if f[0] != task_id}
        self._cache_ended(task_id, run, stored)

    def _summary_op(self, task_id: str, run: RunState | None = None) -> Operation:
        """The write of an ended run's summary (``schema.ended_summary_key``): its listRuns
        entry, from ``run`` or, without it, the one held."""
        entry = compute_run_list_entry(run) if run is not None else self._ended[task_id]
        return BatchOp.PUT, schema.CF_META, schema.ended_summary_key(task_id), persistence.encode_ended_summary(entry)

    def _cache_ended(self, task_id: str, run: RunState, stored: persistence.StoredRun) -> None:
        self._ended_cache[task_id] = (run, stored)
        self._ended_cache.move_to_end(task_id)
        while len(self._ended_cache) > ENDED_RUNS_CACHED:
            old = self._ended_cache.popitem(last=False)[0]
            # What is kept per run for the views: read back when the run is asked for again.
            self._models.pop(old, None)
            self._layout_views.pop(old, None)
            self._run_json.pop(old, None)
            self._records_json.pop(old, None)

    def _recover(self, msg: SignedMessageType, signature: bytes) -> Address:
        return recover_signer_address(msg, signature, self._config.chain_id)

    def _model(self, task_id: str) -> ModelLayout:
        model = self._models.get(task_id)
        if model is None:
            raw = self._store.get(schema.CF_META, schema.tensor_specs_key(task_id))
            if raw is None:
                raise StorageError(f"the tensor list of run {task_id!r} is missing")
            model = decode_model_layout(raw, self._run(task_id).spec.architecture.fragment_count)
            self._models[task_id] = model
        return model

    def _write(self, ops: Sequence[Operation]) -> None:
        if not ops:
            return
        try:
            with self._store.atomic_batch() as batch:
                for op, cf, key, value in ops:
                    if op is BatchOp.PUT:
                        assert value is not None  # PUT operations always carry a value
                        batch.put(cf, key, value)
                    else:
                        batch.delete(cf, key)
        except StorageError as exc:
            if self._storage_failure is None:
                self._storage_failure = str(exc)
                log.error("a store write failed (%s): the store refuses writes until the node restarts, and the "
                          "health check answers 503 storage_write_failed; restart once the cause is fixed", exc)
            raise

    @property
    def storage_failure(self) -> str | None:
        """The first store write that failed, or None. RocksDB refuses every write after a
        failed one (a full disk) until the store is reopened, so the node's health check
        reports it: the node must be restarted once the cause is fixed (storage fault probe:
        it answered ``{"ok": true}`` while refusing every write). Safe from any thread."""
        return self._storage_failure

    def _commit(self, t: Transition, extra: Sequence[Operation] = ()) -> None:
        """Write one applied transition (run, ledger diff, ``extra``) in one batch; only once it
        committed, update the in-memory state and publish the events."""
        task_id = t.run.task_id
        before = self._lookup(task_id)
        ends_now = is_terminal(t.run) and not (before is not None and is_terminal(before))
        if self._config.prune_payloads and ends_now:
            # No round will need them.
            extra = [*extra, *compute_prune_ops(self._store, task_id, schema.PAYLOADS_PRUNED_ALL)]
        if is_terminal(t.run) and self._ended.get(task_id) != compute_run_list_entry(t.run):
            extra = [*extra, self._summary_op(task_id, t.run)]  # what the next start reads of it
        if ends_now and not t.run.records:
            # Ended before any round was committed (cancelled, or failed in its election,
            # enrollment or first round): its round-0 snapshot (4 bytes per parameter) is the
            # checkpoint's, which the committed initial model hash pins (tenzro audit recomputes
            # it). Kept, it let a funded sponsor fill the disk by posting and cancelling (review).
            # (Its momentum keys are deleted too: a version-4 store wrote round 0's zeros.)
            extra = [*extra, *compute_drop_snapshot_ops(task_id, t.run.spec.architecture.fragment_count)]
        ops, encoded = persistence.compute_transition_ops(
            self._stored(task_id), t.run, self._ledger, t.ledger, extra
        )
        self._write(ops)
        self._payloads_pruned += sum(
            1 for op, cf, key, _ in extra
            if op is BatchOp.DELETE and cf == schema.CF_SUBMISSIONS and key[:1] == schema.PAYLOAD_KEY_MARK
        )
        self._ledger = t.ledger
        if is_terminal(t.run):
            self._retire(task_id, t.run, encoded)  # cached first: get_run_state (other threads) never misses it
            self._runs.pop(task_id, None)
            self._stored_runs.pop(task_id, None)
            self._model_cache.forget(task_id)  # no finalize will step it again
            if not t.run.records:
                self._models.pop(task_id, None)  # read back from the store if ever asked for
        else:
            self._runs[task_id] = t.run
            self._stored_runs[task_id] = encoded
        if is_terminal(t.run) or (before is not None and len(before.records) != len(t.run.records)):
            self._payload_cache.drop(task_id)  # no finalize will read them again
            self._gossip_held.pop(task_id, None)  # signed for a round that is over
        elif before is not None and any(isinstance(e, EquivocationDetected) for e in t.events):
            # A slashed trainer's payloads of the open round left the accepted set: none is read
            # again (unless another trainer's names the same bytes), so they free the budget.
            self._payload_cache.discard(task_id, get_accepted_payload_hashes(before) - get_accepted_payload_hashes(t.run))
        self._emit(t.events)

    def _emit(self, events: Sequence[RunEvent]) -> None:
        callback = self.on_event
        if callback is None:
            return
        for event in events:
            try:
                callback(event)
            except Exception:  # a listener's bug must not turn a committed call into an error
                log.exception("on_event listener failed for %s", type(event).__name__)

    # --- election tickets of the node's own identities ----------------------------------------

    def _missing_identities(self, run: RunState) -> list[Any]:
        if run.status not in (RunStatus.POSTED, RunStatus.ELECTING):
            return []
        ticketed = {e.candidate.address for e in run.election.entries}
        missing = []
        for ident in self._config.syncer_identities:
            candidate = self._config.get_candidate(ident.address)
            if ident.address in ticketed or candidate is None or candidate.stake == 0:
                continue
            if (run.task_id, ident.address) in self._ticket_failures:
                continue
            missing.append((ident, candidate))
        return missing

    def _ticket_own(self, t: Transition, now: int) -> Transition:
        """Ticket every configured identity not yet ticketed while the election is open."""
        run, ledger, events = t.run, t.ledger, list(t.events)
        for ident, candidate in self._missing_identities(run):
            ticket = make_ticket(ident.vrf_secret, ident.address, run.election.seed)
            try:
                step = process_ticket(run, ledger, candidate, ticket, now)
            except InvalidState:
                break  # the election closed (its deadline passed): nothing more to ticket
            except TenzroError as exc:
                log.warning("cannot ticket %s in %s: %s", format_address(ident.address), run.task_id, exc)
                self._ticket_failures.add((run.task_id, ident.address))
                continue
            run, ledger = step.run, step.ledger
            events.extend(step.events)
        return Transition(run, ledger, tuple(events), t.error)

    # --- TrainingService: postTask ------------------------------------------------------------

    def post_task(self, spec: dict[str, Any], signature: bytes) -> dict[str, Any]:
        self._check_open()
        task = TrainingTaskSpec.from_dict(spec)
        signer = self._recover(PostTask(task_id=task.task_id, spec_hash=task.spec_hash()), signature)
        # Checked before any file is touched: only the sponsor can make the node read a checkpoint.
        if signer != task.sponsor_address_bytes:
            raise NotSponsor(task.task_id, format_address(signer), task.sponsor_address)
        # Taken whatever the outcome: a refused post must not leave a model waiting in memory.
        with self._preload_lock:
            entry = self._preloaded.pop((task.task_id, task.spec_hash()), None)
        preloaded = None if entry is None else entry[1]
        del entry
        now = self._now()
        timings = self._config.timings
        existing = self._lookup(task.task_id)
        if existing is not None:
            # The same spec again answers as the first call did; another spec is TaskExists.
            process_post_task(task, signer, self._ledger, now, timings, existing.initial_model_hash, existing=existing)
            return self._post_result(existing)
        self._check_admission(task, signer, now)
        if isinstance(preloaded, TenzroError):
            raise preloaded  # what reading it here would raise, at the same point of the checks
        initial = self._load_initial_model(task) if preloaded is None else preloaded
        del preloaded
        t = process_post_task(task, signer, self._ledger, now, timings, initial.model_hash, **self._post_caps())
        t = self._ticket_own(t, now)
        extra: list[Operation] = [
            (BatchOp.PUT, schema.CF_META, schema.tensor_specs_key(task.task_id), encode_model_layout(initial.model))
        ]
        momentum = [torch.zeros_like(w) for w in initial.weights]
        extra += compute_snapshot_ops(task.task_id, 0, initial.weights, momentum)
        self._commit(t, extra)
        self._models[task.task_id] = initial.model
        self._model_cache.remember(t.run, (list(initial.weights), momentum))  # round 0's finalize steps them
        return self._post_result(t.run)

    def _post_caps(self) -> dict[str, Any]:
        config = self._config
        return {"max_grace_window_ms": config.max_grace_window_ms, "max_receipt_bytes": config.max_receipt_bytes,
                "max_trainer_count": config.max_trainer_count, "min_reward_pool": config.min_reward_pool}

    def _check_admission(self, task: TrainingTaskSpec, signer: Address, now: int) -> None:
        """Every refusal of a new post that comes before its checkpoint is read. Reads only
        immutable values and one copy of the open-run table: preload_post_task calls it from
        another thread."""
        # Node policy before anything is read or written: a post costs a snapshot on disk and a
        # layout in memory, so the open runs are bounded and the pool has a minimum
        # (malicious-participant probe, 2026-11-26: free posts filled the disk for good).
        config = self._config
        open_runs = list(self._runs.values())
        validate_open_runs(task.task_id, signer, [r.spec.sponsor_address_bytes for r in open_runs if not is_terminal(r)],
                           config.max_open_runs, config.max_open_runs_per_sponsor)
        # Every refusal the core can make (unsupported spec, pool minimum, outer config, balance):
        # a dry run with a placeholder model hash.
        process_post_task(task, signer, self._ledger, now, config.timings, _NO_HASH, **self._post_caps())

    def _load_initial_model(self, task: TrainingTaskSpec) -> InitialModel:
        """Read, verify and split the post's init checkpoint. Touches no service state: it runs on
        the service thread or, ahead of the post, on the preloading one."""
        state = load_init_checkpoint(
            task, allowed_dirs=self._config.allowed_checkpoint_dirs, max_bytes=self._config.max_checkpoint_bytes
        )
        try:
            initial = compute_initial_model(state, task.architecture.fragment_count)
        except FragmentError as exc:
            # A property of the spec against the sponsor's own model (more fragments than
            # elements): a public SpecError naming the field, not a private CheckpointError.
            raise SpecError("architecture.fragment_count", f"cannot split the checkpoint's model: {exc}") from None
        PayloadEncoding.from_spec(task).check_layouts(initial.model.layouts)
        return initial

    def preload_post_task(self, spec: object, signature: bytes) -> object | None:
        """Read a postTask's init checkpoint ahead of the call, on the caller's thread (the RPC
        server's preloading thread), so that reading and hashing up to ``max_checkpoint_bytes``
        does not hold the one service thread, and every other call and deadline with it.

        Only for a post the spec's sponsor signed, of a task the node does not hold, that passes
        the checks made before the read (node policy, the dry run: ``_check_admission``): as on
        the service thread, nobody else can make the node read a file, and no read is made for a
        post that would be refused first. The model, or the error reading it gave, waits for
        :meth:`post_task`, which takes it instead of reading the file (same bits: the file is
        pinned by the spec's SHA-256) after its own checks; at most :data:`PRELOADED_POSTS` wait.
        Never raises: whatever is wrong is the post's to answer. Safe from any thread: it reads
        the config, immutable values and copies of the run tables."""
        try:
            if self._closed or not isinstance(spec, dict):
                return None
            task = TrainingTaskSpec.from_dict(spec)
            signer = self._recover(PostTask(task_id=task.task_id, spec_hash=task.spec_hash()), signature)
            if signer != task.sponsor_address_bytes or task.task_id in self._runs or task.task_id in self._ended:
                return None
            self._check_admission(task, signer, self._now())
        except TenzroError:
            return None
        try:
            initial: InitialModel | TenzroError = self._load_initial_model(task)
        except TenzroError as exc:
            # Without its traceback or the exception it replaced (``from None`` keeps it as the
            # context): their frames hold the file's bytes and every tensor parsed so far.
            initial = exc.with_traceback(None)
            initial.__cause__ = initial.__context__ = None
        except Exception:  # a bug: the post reads the file itself and reports it
            log.exception("reading the init checkpoint of %s ahead of its post failed", task.task_id)
            return None
        key, mark = (task.task_id, task.spec_hash()), object()
        with self._preload_lock:
            self._preloaded[key] = (mark, initial)
            while len(self._preloaded) > PRELOADED_POSTS:
                self._preloaded.popitem(last=False)
        return key, mark

    def discard_preloaded(self, token: object) -> None:
        """Drop what ``preload_post_task`` read for a request that has ended, if its post did not
        take it (the client hung up, the request was refused, the post never ran). Any thread."""
        key, mark = token  # type: ignore[misc]
        with self._preload_lock:
            entry = self._preloaded.get(key)
            if entry is not None and entry[0] is mark:
                del self._preloaded[key]

    def _post_result(self, run: RunState) -> dict[str, Any]:
        return {
            "task_id": run.task_id,
            "spec_hash": _hex(run.spec_hash),
            "status": run.status.value,
            "sponsor": run.spec.sponsor_address,
            "reward_pool": str(run.spec.reward_pool),
            "initial_model_hash": _hex(run.initial_model_hash),
            "fragment_count": run.spec.architecture.fragment_count,
            "posted_at_ms": run.posted_at_ms,
            "election_deadline_ms": run.election.deadline_ms,
        }

    # --- enrollTrainer ------------------------------------------------------------------------

    def enroll_trainer(self, task_id: str, did: str, address: str, stake: int, signature: bytes) -> dict[str, Any]:
        self._check_open()
        run = self._run(task_id)
        trainer = parse_address(address)
        msg = EnrollTrainer(task_id=task_id, did=did, trainer=trainer, stake=stake)
        validate_signer(msg, signature, trainer, self._config.chain_id)
        now = self._now()
        with self._refusal_kept(run, now):  # an enrollment window this call found over stays over
            t = process_enroll(run, self._ledger, trainer, did, stake, now)
        self._commit(t)
        enrolled = get_trainer(t.run, trainer)
        return {
            "task_id": task_id,
            "address": format_address(trainer),
            "did": did,
            "stake": str(stake),
            "shard": None if enrolled is None else enrolled.shard_index,
            "status": t.run.status.value,
        }

    # --- submitOuterGradient ------------------------------------------------------------------

    def submit_outer_gradient(
        self,
        task_id: str,
        round: int,
        fragment: int,
        payload: bytes | None,
        payload_hash: bytes | None,
        signature: bytes,
    ) -> dict[str, Any]:
        self._check_open()
        run = self._run(task_id)
        if (payload is None) == (payload_hash is None):
            raise InvalidRunArgument(task_id, "payload", "give exactly one of payload and payload_hash")
        if payload is not None:
            if not isinstance(payload, bytes):
                raise InvalidRunArgument(task_id, "payload", "expected bytes")
            if len(payload) > self._config.max_payload_bytes:
                raise PayloadTooLarge("payload", len(payload), self._config.max_payload_bytes)
            payload_hash = compute_payload_hash(payload)
        assert payload_hash is not None  # one of the two was given
        msg = SubmitOuterGradient(task_id=task_id, round=round, fragment=fragment, payload_hash=payload_hash)
        trainer = self._recover(msg, signature)
        current = run.current_round
        held = self._gossip_held.get(task_id, {}).get((round, fragment, trainer))
        if held is not None and held[0] != payload_hash and current is not None and current.round == round:
            # It gossiped another payload, signed, for this fragment: equivocation.
            first = SubmitOuterGradient(task_id=task_id, round=round, fragment=fragment, payload_hash=held[0])
            self._apply_equivocation(run, trainer, (first, held[1]), (msg, signature))
        if run.status is RunStatus.TRAINING and current is not None and round < current.round:
            # A finalized round: the submission is late, but a payload other than the one the
            # round accepted from this trainer (its record is kept) is equivocation all the same.
            in_range = 0 <= fragment < len(self._model(task_id).layouts)  # else process_submission says so
            late_first = self._stored_submission(task_id, round, fragment, trainer) if in_range else None
            if late_first is not None and late_first[0].payload_hash != payload_hash:
                self._apply_equivocation(run, trainer, late_first, (msg, signature))
        now = self._now()
        with self._refusal_kept(run, now):  # LateSubmission: the straggler window stays closed
            t = process_submission(run, self._ledger, trainer, round, fragment, payload_hash, now)
        if t.error is not None:
            # Equivocation: the protocol applies it (slash, evidence) AND refuses the submission.
            self._commit(t, self._evidence_ops(t, trainer, msg, signature))
            raise t.error
        extra: list[Operation] = []
        if any(
            isinstance(e, SubmissionAccepted) and e.trainer == trainer and e.round == round and e.fragment == fragment
            for e in t.events
        ):
            key = schema.payload_key(task_id, payload_hash)
            held = self._payload_cache.get(task_id, payload_hash)
            if held is None and payload is None:
                held = self._store.get(schema.CF_SUBMISSIONS, key)
            # An inline payload out of the cache is written again even if the same bytes are
            # stored (the key is their hash): reading to find out was a RocksDB miss for almost
            # every submission, ~0.5-0.9 ms with ~1 MiB values (a data block each).
            data = payload if payload is not None else held
            if data is None:
                raise PayloadUnavailable(task_id, _hex(payload_hash))
            encoding = self._validate_payload(task_id, round, fragment, data)
            if held is None:
                extra.append((BatchOp.PUT, schema.CF_SUBMISSIONS, key, data))
            record = persistence.SubmissionRecord(payload_hash, signature)
            sub_key = schema.submission_key(task_id, round, fragment, trainer)
            extra.append((BatchOp.PUT, schema.CF_SUBMISSIONS, sub_key, persistence.encode_submission_record(record)))
        self._commit(t, extra)
        if extra:  # accepted: the payload is in the store and this round's finalize will read it
            assert data is not None
            self._payload_cache.put(task_id, payload_hash, data)
            counts = self._accepted_by_encoding.setdefault(encoding, [0, 0])
            counts[0] += 1
            counts[1] += len(data)
        after = t.run
        current = after.current_round
        return {
            "task_id": task_id,
            "round": round,
            "fragment": fragment,
            "trainer": format_address(trainer),
            "payload_hash": _hex(payload_hash),
            "status": after.status.value,
            "accepted_count": get_submission_counts(after)[fragment],
            "quorum_reached": current is not None and current.round == round and current.quorum_at_ms is not None,
        }

    def _validate_payload(self, task_id: str, round: int, fragment: int, data: bytes) -> str:
        """Check ``data`` as the payload of (task, round, fragment); returns its encoding."""
        layout = self._model(task_id).layouts[fragment]
        header = PayloadHeader(task_id, round, fragment, ENCODING_RAW, layout.layout_hash())
        # Validation only: a view where the layout allows one (the values are scanned, not
        # kept), which spares a submission a fresh 4-bytes-per-value copy and its page faults.
        return decode_payload(data, layout, expected=header, max_bytes=self._config.max_payload_bytes,
                              zero_copy=True, max_abs=self._config.max_gradient_abs,
                              **self._decode_options(task_id, layout)).header.encoding

    def _decode_options(self, task_id: str, layout: FragmentLayout) -> dict[str, int]:
        """The run's compressed encoding for ``decode_payload`` (``topk_k`` or ``q8_block``;
        nothing: raw only)."""
        return PayloadEncoding.of_run(self._run(task_id).spec).decode_options(layout)

    def _evidence_ops(
        self, t: Transition, trainer: Address, second: SubmitOuterGradient, signature: bytes
    ) -> list[Operation]:
        detected = [e for e in t.events if isinstance(e, EquivocationDetected) and e.trainer == trainer]
        if not detected:
            return []
        event = detected[-1]
        task_id = t.run.task_id
        first = SubmitOuterGradient(
            task_id=task_id, round=event.round, fragment=event.fragment, payload_hash=event.first_payload_hash
        )
        key = schema.submission_key(task_id, event.round, event.fragment, trainer)
        raw = self._store.get(schema.CF_SUBMISSIONS, key)
        first_signature = None if raw is None else persistence.decode_submission_record(raw).signature
        if first_signature is None:
            log.error("equivocation in %s: the first submission's record is missing", task_id)
        value = persistence.encode_evidence(
            first, first_signature, second, signature, trainer, self._config.chain_id, event.slashed_in_round
        )
        evidence_key = schema.evidence_key(task_id, event.round, event.fragment, trainer)
        return [(BatchOp.PUT, schema.CF_EVIDENCE, evidence_key, value)]

    def store_payload(
        self, task_id: str, payload: bytes, *, signer: tuple[Address, int, bytes] | None = None
    ) -> bytes:
        """Hold a payload that arrived over gossip, so a later hash-only submission can name it.

        The run must be Training; the payload must decode as one fragment of the current round
        (PayloadError otherwise). Returns its hash; storing the same bytes again is a no-op.

        ``signer`` = (trainer, fragment, signature): the trainer's SubmitOuterGradient signature
        the gossip chunks carried, checked again here (SignatureInvalid, WrongSigner), because
        it may become slashing evidence. Each trainer gets ONE held payload per (round,
        fragment): a different second one, or one different from the payload the trainer
        already submitted for that fragment, is equivocation (SPEC.md "Authentication": two
        different payloads signed by one trainer for the same task, round and fragment). The
        stake is slashed with both signed messages stored as evidence, exactly as when both are
        submitted, the payload is not stored, and Equivocation is raised. Without the bound an
        enrolled trainer could also gossip any number of distinct signed payloads and an
        archive node would keep every one. The held hashes are kept in memory, for the current
        round of each run (a restart forgets them; the evidence already applied is stored).
        """
        self._check_open()
        run = self._run(task_id)
        current = run.current_round
        if run.status is not RunStatus.TRAINING or current is None:
            raise InvalidState(task_id, run.status.value, "hold a payload")
        if not isinstance(payload, bytes):
            raise InvalidRunArgument(task_id, "payload", "expected bytes")
        if len(payload) > self._config.max_payload_bytes:
            raise PayloadTooLarge("payload", len(payload), self._config.max_payload_bytes)
        digest = compute_payload_hash(payload)
        layouts = self._model(task_id).layouts
        held_key = None
        if signer is not None:
            trainer, fragment, signature = validate_address_bytes(signer[0]), signer[1], bytes(signer[2])
            if type(fragment) is not int or not 0 <= fragment < len(layouts):
                raise InvalidRunArgument(task_id, "fragment", f"expected 0..{len(layouts) - 1}")
            known = get_trainer(run, trainer)
            if known is None or known.slashed:
                raise NotEnrolled(task_id, format_address(trainer))
            msg = SubmitOuterGradient(task_id=task_id, round=current.round, fragment=fragment, payload_hash=digest)
            validate_signer(msg, signature, trainer, self._config.chain_id)
            held_key = (task_id, current.round, fragment, trainer)
            first = self._first_signed_payload(run, held_key)
            if first is not None and first[0].payload_hash != digest:
                self._apply_equivocation(run, trainer, first, (msg, signature))
            layouts = (layouts[fragment],)  # the signature names the fragment
        key = schema.payload_key(task_id, digest)
        # holds_value, not contains: a payload whose file was lost (a power loss without
        # sync_writes) is written again when it arrives again.
        if not self._store.holds_value(schema.CF_SUBMISSIONS, key):
            for layout in layouts:
                header = PayloadHeader(task_id, current.round, layout.index, ENCODING_RAW, layout.layout_hash())
                try:
                    decode_payload(payload, layout, expected=header, max_bytes=self._config.max_payload_bytes,
                                   zero_copy=True, max_abs=self._config.max_gradient_abs,
                                   **self._decode_options(task_id, layout))
                    break
                except (PayloadLayoutMismatch, PayloadMetadataMismatch):
                    if len(layouts) == 1:
                        raise
            else:
                raise PayloadLayoutMismatch(f"the payload is not a fragment of round {current.round} of {task_id}")
            self._write([(BatchOp.PUT, schema.CF_SUBMISSIONS, key, payload)])
            self._payload_cache.put(task_id, digest, payload)
        if held_key is not None:
            self._gossip_held.setdefault(task_id, {}).setdefault(held_key[1:], (digest, signature))
        return digest

    def _first_signed_payload(
        self, run: RunState, key: tuple[str, int, int, bytes]
    ) -> tuple[SubmitOuterGradient, bytes] | None:
        """The payload (message and signature) the trainer of ``key`` already signed for that
        round and fragment: the one gossip brought and is held, else its accepted submission."""
        task_id, round_, fragment, trainer = key
        held = self._gossip_held.get(task_id, {}).get(key[1:])
        if held is not None:
            return SubmitOuterGradient(task_id=task_id, round=round_, fragment=fragment, payload_hash=held[0]), held[1]
        current = run.current_round
        if current is None or current.round != round_:
            return None
        for sub in current.submissions[fragment]:
            if sub.trainer == trainer:
                stored = self._stored_submission(task_id, round_, fragment, trainer)
                if stored is None or stored[0].payload_hash != sub.payload_hash:
                    who = format_address(trainer)
                    raise StorageError(f"the submission record of {who} in {task_id} is missing or differs")
                return stored
        return None

    def _stored_submission(
        self, task_id: str, round: int, fragment: int, trainer: Address
    ) -> tuple[SubmitOuterGradient, bytes] | None:
        """The payload (message and signature) ``trainer`` submitted and the node accepted for
        (``round``, ``fragment``), from its stored submission record (kept for every round,
        finalized ones included); None if there is none."""
        raw = self._store.get(schema.CF_SUBMISSIONS, schema.submission_key(task_id, round, fragment, trainer))
        if raw is None:
            return None
        record = persistence.decode_submission_record(raw)
        msg = SubmitOuterGradient(task_id=task_id, round=round, fragment=fragment, payload_hash=record.payload_hash)
        return msg, record.signature

    def _apply_equivocation(
        self,
        run: RunState,
        trainer: Address,
        first: tuple[SubmitOuterGradient, bytes],
        second: tuple[SubmitOuterGradient, bytes],
    ) -> None:
        """Slash ``trainer`` for two signed payload hashes of one (round, fragment), both
        signatures already checked: commit the transition and the evidence in one batch, then
        raise the Equivocation. Returns (nothing applied) when the trainer is already slashed."""
        (m1, s1), (m2, s2) = first, second
        t = process_equivocation(run, self._ledger, trainer, m2.round, m2.fragment, m1.payload_hash,
                                 m2.payload_hash, self._now())
        if t.error is None:
            return
        (event,) = [e for e in t.events if isinstance(e, EquivocationDetected)]
        value = persistence.encode_evidence(m1, s1, m2, s2, trainer, self._config.chain_id, event.slashed_in_round)
        key = schema.evidence_key(run.task_id, m2.round, m2.fragment, trainer)
        self._commit(t, [(BatchOp.PUT, schema.CF_EVIDENCE, key, value)])
        raise t.error

    # --- finalizeRound ------------------------------------------------------------------------

    def finalize_round(self, task_id: str, round: int, signature: bytes) -> dict[str, Any]:
        self._check_open()
        run = self._run(task_id)
        signer = self._recover(FinalizeRound(task_id=task_id, round=round), signature)
        now = self._now()
        ledger = self._ledger
        if round < len(run.records):
            # A committed round: an identical replay is a no-op, anything else RoundMismatch.
            committed = run.records[round]
            t = process_finalize(run, ledger, signer, round, committed.fragments, committed.model_hash, now)
            self._commit(t)
            return self._finalize_result(t.run, round)
        ticked = process_tick(run, ledger, now).run
        current = ticked.current_round
        ready = (
            ticked.status is RunStatus.TRAINING
            and current is not None
            and current.round == round
            and get_current_syncer(ticked) == signer
            and is_accepted_set_closed(ticked, max(now, run.updated_at_ms))
        )
        if not ready:
            # The core names the refusal (state, syncer, round, quorum, straggler window): every
            # one of those checks comes before it looks at the (here empty) outcomes. A failover
            # or end this call applied holds after a restart.
            with self._refusal_kept(run, now):
                process_finalize(run, ledger, signer, round, (), _NO_HASH, now)
            raise RuntimeError("finalize preconditions disagree with the lifecycle")  # a bug
        assert current is not None
        model = self._model(task_id)
        inputs = []
        for index in range(len(model.layouts)):
            accepted = get_accepted_submissions(ticked, index)
            inputs.append([(addr, self._payload_cache.load(task_id, digest)) for addr, digest in accepted])
        weights, momentum = self._model_cache.take(run, model)
        largest = max((len(data) for subs in inputs for _, data in subs), default=0)
        try:
            update = compute_round_update(
                ticked.spec, model, round, inputs, weights, momentum,
                max_payload_bytes=max(largest, self._config.max_payload_bytes),
                worker=self._finalize_worker,
                in_place=True,  # weights/momentum are this call's own decoded copies
                buffers=self._round_buffers,
                # Every accepted payload passed _validate_payload (finite, within
                # max_gradient_abs) before its submission was committed, inline or gossiped.
                inputs_checked=True,
            )
        except PayloadError as exc:  # every stored payload was decoded when it was accepted
            raise StorageError(f"a stored payload of {task_id} round {round} no longer decodes: {exc}") from None
        t = process_finalize(run, ledger, signer, round, update.outcomes, update.model_hash, now)
        # Cached before the events fire (_commit), dropped again if the call fails before or at
        # the write: a signature of a round the store does not hold is never served.
        signatures = self._finalize_signatures.setdefault(task_id, {})
        signatures[round] = bytes(signature)
        try:
            sealed = self._commit_finalize(task_id, round, t, update, signer, signature)
        except BaseException:
            signatures.pop(round, None)
            raise
        if not sealed:  # committed: now the run's current model
            self._model_cache.remember(t.run, (list(update.weights), list(update.momentum)))
        if sealed and self._config.data_dir is not None:  # committed already: a failure is retried by tick
            self._model_files.try_write(task_id, self.export_final_model)
        return self._finalize_result(t.run, round)

    def _commit_finalize(self, task_id: str, round: int, t: Transition, update: RoundUpdate, signer: bytes,
                         signature: bytes) -> bool:
        """Write the finalize transition ``t`` with its reports, signature, snapshot or receipt
        in one batch; True when it sealed the run."""
        reports = persistence.encode_round_reports([r.canonical_bytes() for r in update.reports])
        extra = [(BatchOp.PUT, schema.CF_META, schema.round_reports_key(task_id, round), reports)]
        finalize_record = persistence.encode_finalize_record(persistence.FinalizeRecord(signer, bytes(signature)))
        extra.append((BatchOp.PUT, schema.CF_META, schema.finalize_signature_key(task_id, round), finalize_record))
        sealed = t.run.status is RunStatus.SEALED
        if sealed:
            extra += compute_fragment_ops(task_id, schema.MODEL_FINAL, update.weights)
            receipt = compute_receipt(t.run)
            extra.append((BatchOp.PUT, schema.CF_TRAINING_RECEIPTS, schema.receipt_key(task_id),
                          persistence.encode_receipt(receipt)))
            extra.append((BatchOp.PUT, schema.CF_META, schema.sealed_record_key(task_id),
                          persistence.encode_sealed_record(receipt)))
        elif (round + 1) % self._config.model_snapshot_rounds == 0:
            extra += compute_snapshot_ops(task_id, round + 1, update.weights, update.momentum)
            if self._config.prune_payloads:  # every stored payload is of a round up to this one
                extra += compute_prune_ops(self._store, task_id, round + 1)
        self._commit(t, extra)
        return sealed

    def _finalize_result(self, run: RunState, round: int) -> dict[str, Any]:
        record = round_record_to_dict(run.records[round])  # the committed record's JSON form
        return {
            "task_id": run.task_id,
            "round": round,
            "model_hash": record["model_hash"],
            "status": run.status.value,
            "syncer": record["syncer"],
            "syncer_rank": record["syncer_rank"],
            "fragments": record["fragments"],
            "sealed": run.status is RunStatus.SEALED,
            "run_root": None if run.run_root is None else _hex(run.run_root),
            "next_round": run.current_round.round if run.current_round is not None else None,
        }

    # --- cancelTask ---------------------------------------------------------------------------

    def cancel_task(self, task_id: str, signature: bytes) -> dict[str, Any]:
        self._check_open()
        run = self._run(task_id)
        signer = self._recover(CancelTask(task_id=task_id), signature)
        now = self._now()
        with self._refusal_kept(run, now):  # a run this call found training is not cancelled after a restart
            t = process_cancel(run, self._ledger, signer, now)
        self._commit(t)
        return {"task_id": task_id, "status": t.run.status.value, "ended_at_ms": t.run.ended_at_ms}

    # --- reads ----------------------------------------------------------------------------------

    def get_run(self, task_id: str) -> dict[str, Any]:
        self._check_open()
        run = self._run(task_id)
        return {**self._static_view(run, self._has_receipt(task_id)), **self._clock_view(run, self._now())}

    def get_run_json(self, task_id: str) -> bytes:
        """:meth:`get_run` as JSON text. The state part is serialized once per run state (run
        states are immutable: a new one is committed for every change) and kept for the last
        :data:`RUN_JSON_CACHE_RUNS` runs asked for; each call adds only the clock fields. It was
        ~75% of a getRun's time in the node (~0.1 ms of a ~0.13 ms dispatch for a 14 KB view)."""
        self._check_open()
        run = self._run(task_id)
        has_receipt = self._has_receipt(task_id)
        cached = self._run_json.get(task_id)
        if cached is None or cached[0] is not run or cached[1] is not has_receipt:
            # Without its "}": the round records and the clock fields follow.
            cached = (run, has_receipt, serialize_json(self._static_view(run, has_receipt, round_records=False))[:-1])
            self._run_json[task_id] = cached
        records = self._round_records_json(run)
        self._run_json.move_to_end(task_id)
        while len(self._run_json) > RUN_JSON_CACHE_RUNS:
            self._records_json.pop(self._run_json.popitem(last=False)[0], None)
        clock = serialize_json(self._clock_view(run, self._now()))[1:]
        return b"".join((cached[2], b',"round_records":', records, b",", clock))

    def _round_records_json(self, run: RunState) -> bytes:
        """The view's ``round_records`` as JSON text, each record rendered once: records are
        only ever appended, and rendering them all again for every new run state (each
        submission makes one) had made a getRun's cost grow with the run's rounds (review)."""
        count, text = self._records_json.get(run.task_id, (0, b""))
        if count > len(run.records):  # cannot happen: records are never removed
            count, text = 0, b""
        if count < len(run.records):
            parts = [serialize_json(round_record_to_dict(r)) for r in run.records[count:]]
            text = b",".join([text, *parts]) if text else b",".join(parts)
            count = len(run.records)
            self._records_json[run.task_id] = (count, text)
        return b"".join((b"[", text, b"]"))

    def _has_receipt(self, task_id: str) -> bool:
        return self._store.contains(schema.CF_TRAINING_RECEIPTS, schema.receipt_key(task_id))

    def _static_view(self, run: RunState, has_receipt: bool, *, round_records: bool = True) -> dict[str, Any]:
        """The view's fields that depend on the committed run state alone."""
        view = compute_run_view_static(run, round_records=round_records)
        task_id = run.task_id
        if task_id not in self._layout_views:  # layout hashes never change within a run
            model = self._model(task_id)
            self._layout_views[task_id] = (model.to_view(), model.to_empty_tensors_view())
        view["fragments"], view["empty_tensors"] = self._layout_views[task_id]  # shared, read-only
        view["has_receipt"] = has_receipt
        return view

    @staticmethod
    def _clock_view(run: RunState, now: int) -> dict[str, Any]:
        """The view's fields that depend on the clock."""
        view = compute_run_view_clock(run, now)
        # The syncer daemon's trigger, computed by the same core rule finalize enforces.
        view["accepted_set_closed"] = is_accepted_set_closed(run, max(now, run.updated_at_ms))
        return view

    def count_runs_by_status(self) -> dict[str, int]:
        """Status name -> number of runs. Safe from any thread (it is what ``GET /metrics`` reads
        from the event loop): one copy of each run table's values, which are immutable."""
        counts: dict[str, int] = {}
        # Open runs first, ended ones second: _commit puts an ending run in _ended before it takes
        # it out of _runs, so a run ending between the two copies is in the second, counted once
        # (review: a scrape in that window counted it under both statuses).
        open_runs = list(self._runs.items())
        ended = dict(self._ended)
        statuses = [run.status.value for task_id, run in open_runs if task_id not in ended]
        statuses += [entry["status"] for entry in ended.values()]
        for status in statuses:
            counts[status] = counts.get(status, 0) + 1
        return counts

    def cache_stats(self) -> dict[str, int]:
        """The model and payload caches' sizes, how often the model was rebuilt from a snapshot
        (and how many rounds that replayed), how many payloads were pruned, and the round
        buffers' size. Safe from any thread: int reads."""
        return {
            "model_cache_runs": len(self._model_cache),
            "model_cache_bytes": self._model_cache.nbytes,
            "payload_cache_bytes": self._payload_cache.nbytes,
            "model_rebuilds": self._model_cache.rebuilds,
            "replayed_rounds": self._model_cache.replayed_rounds,
            "payloads_pruned": self._payloads_pruned,
            "round_buffer_bytes": self._round_buffers.nbytes,
        }

    def accepted_payload_stats(self) -> dict[str, tuple[int, int]]:
        """Since start, by payload encoding: (submissions accepted, their payload bytes). What a
        task's topk or q8 encoding saves an operator in upload and storage. Safe from any thread."""
        return {encoding: (n, size) for encoding, (n, size) in list(self._accepted_by_encoding.items())}

    def list_runs(self, status: str | None, offset: int, limit: int) -> dict[str, Any]:
        self._check_open()
        if status is not None and status not in {s.value for s in RunStatus}:
            raise InvalidRunArgument("*", "status", f"unknown run status {status!r}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidRunArgument("*", "offset", "expected an integer >= 0")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidRunArgument("*", "limit", "expected an integer >= 1")
        open_runs, ended = self._runs, self._ended
        ids = sorted(
            [t for t, run in open_runs.items() if status is None or run.status.value == status]
            + [t for t, entry in ended.items() if status is None or entry["status"] == status]
        )
        runs = [
            compute_run_list_entry(open_runs[t]) if t in open_runs else dict(ended[t]) for t in ids[offset : offset + limit]
        ]
        return {"runs": runs, "total": len(ids), "offset": offset, "limit": limit}

    def get_receipt(self, task_id: str) -> dict[str, Any]:
        self._check_open()
        run = self._run(task_id)
        raw = self._store.get(schema.CF_TRAINING_RECEIPTS, schema.receipt_key(task_id))
        if raw is None:
            raise InvalidState(task_id, run.status.value, "issue a receipt")
        receipt = persistence.decode_receipt(raw)
        # "abi": abi.encode(ReceiptV1) (docs/receipt.md), what TRAINING_VERIFY and the escrow read.
        # "attestations": the election and every signature behind the transcript, what
        # `tenzro train verify-receipt` checks (receipt_check.py).
        return {
            "receipt": receipt.to_dict(),
            "run_root": _hex(receipt.run_root),
            "abi": "0x" + encode_receipt_abi(receipt).hex(),
            "attestations": self._attestations(run).to_dict(),
        }

    def get_receipt_json(self, task_id: str) -> bytes:
        """:meth:`get_receipt` as JSON text, rendered once per sealed run (a receipt, its ABI and
        its attestations never change once written) and kept up to :data:`RECEIPT_JSON_CACHE_BYTES`."""
        self._check_open()
        cached = self._receipt_json.get(task_id)
        if cached is None:
            cached = serialize_json(self.get_receipt(task_id))
            self._receipt_json[task_id] = cached
            self._receipt_json_bytes += len(cached)
            while self._receipt_json_bytes > RECEIPT_JSON_CACHE_BYTES and len(self._receipt_json) > 1:
                self._receipt_json_bytes -= len(self._receipt_json.popitem(last=False)[1])
        self._receipt_json.move_to_end(task_id)
        return cached

    def _attestations(self, run: RunState) -> Attestations:
        """The stored election and signatures of a sealed run (receipt_check.Attestations)."""
        task_id = run.task_id
        election = ElectionAttestation(
            seed=run.election.seed,
            tickets=tuple(AttestedTicket(e.candidate, e.ticket.proof) for e in run.election.entries),
            ranking=run.election.ranking or (),
        )
        rounds = []
        for record in run.records:
            submissions = []
            for key, value in self._store.iterate(schema.CF_SUBMISSIONS, schema.submission_prefix(task_id, record.round)):
                parsed = schema.parse_submission_key(key)
                sub = persistence.decode_submission_record(value)
                submissions.append(SubmissionAttestation(parsed.trainer, parsed.fragment, sub.payload_hash, sub.signature))
            rounds.append(
                RoundAttestation(
                    round=record.round,
                    syncer=record.syncer,
                    finalize_signature=self.get_finalize_signature(task_id, record.round),
                    submissions=tuple(submissions),
                )
            )
        slashings = tuple(
            persistence.decode_evidence(value)
            for _, value in self._store.iterate(schema.CF_EVIDENCE, schema.task_prefix(task_id))
        )
        return Attestations(chain_id=self._config.chain_id, election=election, rounds=tuple(rounds), slashings=slashings)

    def get_round_reports(self, task_id: str, round: int) -> dict[str, Any]:
        """The full aggregation reports (Krum scores included) of a finalized round, with each
        report's hash (equal to its FragmentOutcome.report_hash)."""
        self._check_open()
        run = self._run(task_id)
        if isinstance(round, bool) or not isinstance(round, int) or not 0 <= round < len(run.records):
            raise InvalidRunArgument(task_id, "round", f"round {round!r} is not a finalized round")
        raw = self._store.get(schema.CF_META, schema.round_reports_key(task_id, round))
        if raw is None:
            raise StorageError(f"the aggregation reports of {task_id} round {round} are missing")
        documents = persistence.decode_round_reports(raw)
        return {
            "task_id": task_id,
            "round": round,
            "fragments": [
                {"report": doc, "report_hash": _hex(sha256(persistence.compute_report_canonical(doc)).digest())}
                for doc in documents  # the stored bytes are canonical, so re-canonicalizing is exact
            ],
        }

    # --- time ---------------------------------------------------------------------------------

    def tick(self) -> tuple[RunEvent, ...]:
        """Apply every due deadline of every non-terminal run (each run one batch) and ticket
        the node's own identities where an election is open; returns the events, in order."""
        self._check_open()
        now = self._now()
        self._model_files.retry(now, self.export_final_model)
        events: list[RunEvent] = []
        for task_id in sorted(self._runs):
            run = self._runs[task_id]
            if is_terminal(run):
                continue
            deadline = get_next_deadline_ms(run)
            due = deadline is not None and (run.status is RunStatus.POSTED or now > deadline)
            if not due and not self._missing_identities(run):
                continue
            try:
                t = self._ticket_own(process_tick(run, self._ledger, now), now)
            except StorageError:
                raise
            except TenzroError:  # one broken run must not stop the clock of the others
                log.exception("tick of %s failed", task_id)
                continue
            self._commit(t)
            events.extend(t.events)
        return tuple(events)

    def next_deadline_ms(self) -> int | None:
        """The earliest instant at which a tick has something to do (None: nothing pending)."""
        deadlines = [
            d for run in self._runs.values() if not is_terminal(run) and (d := get_next_deadline_ms(run)) is not None
        ]
        return min(deadlines) if deadlines else None

    # --- gossip -------------------------------------------------------------------------------

    def submit_ticket(self, task_id: str, ticket: Ticket) -> None:
        """A remote candidate's election ticket (from the syncer gossip topic)."""
        self._check_open()
        run = self._run(task_id)
        if not isinstance(ticket, Ticket):
            raise InvalidRunArgument(task_id, "ticket", "expected a Ticket")
        candidate = self._config.get_candidate(ticket.address)
        if candidate is None:
            raise TicketRejected(ticket.address, ExclusionReason.UNREGISTERED)
        now = self._now()
        with self._refusal_kept(run, now):  # an election this call found closed stays closed
            t = process_ticket(run, self._ledger, candidate, ticket, now)
        self._commit(t)

    def get_run_state(self, task_id: str) -> RunState | None:
        """The run's current state (an immutable value), or None. Plain dict reads, no store
        read: the p2p bridge's gossip validators call it from the libp2p thread. An ended run
        out of the cache of ended runs (ENDED_RUNS_CACHED) reads as None here: gossip about
        it is ignored, as for a task the node does not hold."""
        run = self._runs.get(task_id)
        if run is None:
            held = self._ended_cache.get(task_id)
            run = None if held is None else held[0]
        return run

    def get_global_weights(self, task_id: str) -> tuple[int, bytes, list[torch.Tensor]]:
        """``(round, model_hash, fragments)``: the current global model as fp32 fragment vectors
        in fragment order, the hash the run committed for it (``run.model_hash``) and the round
        a trainer would train next (``run.round``)."""
        self._check_open()
        run = self._run(task_id)
        model = self._model(task_id)
        if run.status is RunStatus.SEALED:
            return run.round, run.model_hash, load_model_fragments(self._store, task_id, schema.MODEL_FINAL, model)
        state = self._model_cache.get(task_id)
        if state is None:
            state = self._model_cache.rebuild(run, model)
            self._model_cache.remember(run, state)
        # Copies: the cached vectors are stepped in place by the next finalize, which may run
        # while the caller (the gossip bridge, on another thread) still encodes these.
        return run.round, run.model_hash, [w.clone() for w in state[0]]

    def get_finalize_signature(self, task_id: str, round: int) -> bytes | None:
        """The syncer's FinalizeRound signature of a finalized round (else None; also None for
        rounds finalized by a node version that did not store them). Kept in memory for open
        runs, read from the store otherwise: safe from any thread, as the store's writes come
        before the memory's changes."""
        signature = self._finalize_signatures.get(task_id, {}).get(round)
        if signature is None:
            raw = self._store.get(schema.CF_META, schema.finalize_signature_key(task_id, round))
            signature = None if raw is None else persistence.decode_finalize_record(raw).signature
        return signature

    # --- the final model ------------------------------------------------------------------------

    def backup(self, root: Path) -> Path:
        """A consistent copy of the store, taken now, between two service calls, in a new
        directory under ``root`` (``node/backup.py``); returns that directory. StorageError when
        it cannot be written (the in-memory store, a full disk); the node goes on either way."""
        from tenzro_training.node.backup import write_backup

        self._check_open()
        return write_backup(self._store, root, self._now())

    def final_model_path(self, task_id: str) -> Path:
        """``data_dir/models/<task_id>.safetensors`` (written once the run is Sealed; rewritten
        here if it went missing, when it can be: it may still be missing on a full disk)."""
        self._check_open()
        path = self._model_files.path(task_id)
        run = self._lookup(task_id)
        if run is not None and run.status is RunStatus.SEALED and not path.exists():
            self._model_files.try_write(task_id, self.export_final_model)
        return path

    def export_final_model(self, task_id: str) -> bytes:
        """The safetensors bytes of a sealed run's final global model (fp32); their tensors hash
        (``fragments.compute_model_hash``) to the receipt's final_model_hash."""
        self._check_open()
        run = self._run(task_id)
        if run.status is not RunStatus.SEALED:
            raise InvalidState(task_id, run.status.value, "export the final model")
        model = self._model(task_id)
        final = load_model_fragments(self._store, task_id, schema.MODEL_FINAL, model)
        return compute_final_model_file(run, model, final)

    # --- run artifacts (rpc.service.ArtifactSource: GET /artifacts/v1, docs/rpc.md) --------------

    def get_payload_artifact(self, task_id: str, round: int, fragment: int, trainer: bytes) -> PayloadArtifact:
        """The stored payload of a committed round's accepted submission (``node/artifacts.py``);
        an open round's are never given out (``tenzro_training.artifacts``)."""
        self._check_open()
        return load_payload_artifact(self._store, self._run(task_id), round, fragment, trainer)

    def get_model_artifact(self, task_id: str) -> ModelArtifact:
        """Where a Sealed run's final model file is. Unlike :meth:`final_model_path` it writes
        nothing: a GET must not write a model-sized file on this thread; the server serves
        :meth:`export_final_model`'s bytes while the file is missing (``ModelFiles`` retries it)."""
        self._check_open()
        run = self._run(task_id)
        validate_model_request(run)
        if run.final_record is None:
            raise StorageError(f"the sealed run {task_id} has no final record")
        path = None if self._config.data_dir is None else self._model_files.path(task_id)
        return ModelArtifact(final_model_hash=run.final_record.final_model_hash, path=path)

    def get_checkpoint_artifact(self, task_id: str) -> CheckpointArtifact:
        """Where the run's init checkpoint is, confined as a post's read is (``node/artifacts.py``)."""
        self._check_open()
        return locate_checkpoint(self._run(task_id), self._config)

    # --- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Refuse further calls. The store belongs to the caller and is not closed here."""
        self._closed = True
        self._finalize_worker.shutdown(wait=True)
