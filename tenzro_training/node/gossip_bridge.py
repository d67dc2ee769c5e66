"""The node's gossip bridge: libp2p gossipsub <-> :class:`NodeService`.

What this module is: a SHELL that connects one :class:`~tenzro_training.p2p.host.P2PHost` to the
node service. It

- installs the topic validators: each inbound message is decoded and checked by the pure
  ``validate_*_gossip`` functions of :mod:`tenzro_training.gossip` against the service's current
  run state (``NodeService.get_run_state``) before libp2p relays it;
- drains both topics continuously (a libp2p subscription buffers only 32 messages);
- reassembles ``PayloadChunk`` streams and hands each complete, hash-checked payload to
  ``NodeService.store_payload``: a trainer's later hash-only ``submitOuterGradient`` then finds it
  (until then the node answers ``PayloadUnavailable`` and the trainer retries); a second,
  differently signed payload of one trainer for one fragment slashes it (``equivocations``);
- forwards remote ``ElectionTicketMsg`` to ``NodeService.submit_ticket`` (the service verifies
  the VRF proof and the candidate before the ticket counts);
- answers signed ``ModelRequest`` (version 2) with ``ModelChunk`` messages carrying the current
  global model, from a task of its own (never inline in the training-topic drain), at most one
  answer per requester per ``MODEL_REQUEST_INTERVAL_S``; requests that arrived before a
  broadcast of their model began share it, and broadcasts of one model start at most one per
  ``MODEL_ANSWER_INTERVAL_S``;
- sizes its payload reassembly buffer from the runs it serves (trainer_count x the largest
  payload a fragment admits, summed over runs in training, at most ``max_assembly_bytes``), and
  gives the validators each run's exact stream sizes (``gossip.StreamSizes``);
- forgets the dedup entries of a payload stream that failed reassembly or was dropped for room
  (``SeenCache.forget_stream``, applied on the libp2p thread), so a trainer's republish is
  accepted; counts and logs (warning) evictions and hash mismatches;
- after the service's events, publishes ``RoundFinalizedMsg`` (the new fragment weights, chunked,
  with the syncer's FinalizeRound signature) and ``RunSealedMsg``;
- learns which open runs each peer serves (from the valid ``PayloadChunk`` and ``ModelRequest``
  it originated) and sends one run's weights (``RoundFinalizedMsg``, ``ModelChunk``) to no peer
  known to serve only other open runs (``P2PHost.publish(skip_peers=...)``).

Every service call runs through ``call_service`` (the node's single executor thread: the service
is not thread-safe). Events arrive on that thread and are handed to the asyncio loop.

What it is NOT: the protocol rules (message schemas, validation, reassembly are the pure
``tenzro_training.gossip``), the libp2p host (``p2p/host.py``) or the run lifecycle (the service).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import torch

from tenzro_training import gossip as g
from tenzro_training.errors import Equivocation, GossipIgnore, GossipReject, TenzroError
from tenzro_training.fragments import compute_raw_le_bytes
from tenzro_training.run_state import TERMINAL_STATUSES, RunStatus, is_terminal
from tenzro_training.run_events import (
    RoundFinalized,
    RunCancelled,
    RunEvent,
    RunFailed,
    RunSealed,
    SyncerElected,
    TrainingStarted,
)

__all__ = ["GossipBridge", "compute_weights_bytes"]

_STATUS_EVENTS = (SyncerElected, TrainingStarted, RunSealed, RunCancelled, RunFailed)
"""The events that move a run into or out of Enrolling/Training: the only ones that change the
reassembly budget (a resize on every event had walked every run ever seen: soak probe)."""

PEERS_RUNS_KEPT: Final = 4096
"""Peers whose runs the bridge remembers (the one heard from longest ago forgotten first): see
GossipBridge._skip_peers."""

RUNS_PER_PEER_KEPT: Final = 64
"""A peer that originated messages for more open runs than this is taken to serve every run."""

MODEL_ASKER_KEPT_S: Final = 120.0
"""How long a peer that asked for a run's model is never skipped by that run's weights."""

HELD_WEIGHTS = 64
"""Models whose published weights' digests the bridge keeps (gossip.WeightsDigests)."""

REFUSAL_LOG_INTERVAL_S = 10.0
"""At most one warning line per this many seconds for payloads refused at reassembly."""

log = logging.getLogger("tenzro.node.gossip")

MODEL_ANSWER_INTERVAL_S: Final = 1.0
"""At most one ModelChunk broadcast of one (task, model) starts per interval; a request waits
for the next slot rather than being dropped (it may have arrived just after a broadcast began,
whose first chunks its sender never saw)."""
MODEL_REQUEST_INTERVAL_S: Final = 5.0
"""At most one answered ModelRequest per (task, requester) per interval (a trainer re-asks every
2 s while it waits: the broadcast it triggered is still under way)."""
MAX_QUEUED_REQUESTS: Final = 64
"""ModelRequests waiting for the answering task; more are dropped (counted)."""
MAX_ASSEMBLY_BYTES: Final = 1 << 30
"""Default cap of the payload reassembly buffer (the bridge's ``max_assembly_bytes``)."""
PAYLOAD_STREAMS_PER_PEER: Final = 4
"""Incomplete payload streams one publishing peer may hold in the buffer (a trainer publishes
its fragments one after the other, so it holds one or two); a fifth takes its own oldest's place."""
PAYLOAD_STREAM_IDLE_S: Final = 30.0
"""A payload stream with no new chunk for this long gives its room to a new one (a trainer's
chunks follow each other within milliseconds to a few seconds)."""


def compute_weights_bytes(fragments: Sequence[torch.Tensor]) -> bytes:
    """The wire form of global weights in RoundFinalizedMsg/ModelChunk: every fragment's flat
    fp32 vector, little-endian, concatenated in fragment order."""
    return b"".join(bytes(compute_raw_le_bytes(flat.to(torch.float32).contiguous())) for flat in fragments)


def _hex(value: bytes) -> str:
    return "0x" + value.hex()


class GossipBridge:
    """Connects ``host`` to ``service`` (see the module docstring). ``start`` after the host
    started; ``stop`` before the host stops."""

    def __init__(
        self,
        service: Any,
        host: Any,
        call_service: Callable[[Callable[[], Any]], Awaitable[Any]],
        *,
        chain_id: int,
        get_candidate: Callable[[bytes], Any],
        max_payload_bytes: int,
        clock_ms: Callable[[], int] | None = None,
        max_assembly_bytes: int = MAX_ASSEMBLY_BYTES,
    ) -> None:
        self._service = service
        self._host = host
        self._call = call_service
        self._chain_id = chain_id
        self._get_candidate = get_candidate
        self._max_payload_bytes = max_payload_bytes
        self._clock = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._seen = g.SeenCache()
        # Base58 peer id -> the open runs it originated a valid PayloadChunk or ModelRequest for
        # (libp2p-signed originator: no peer can speak for another), None: too many to keep, it
        # serves every run. One run's weights are not sent to peers known to serve only other
        # open runs (_skip_peers). Written on the libp2p thread, an ended run dropped and the
        # map read on the asyncio thread: a lock.
        self._peer_runs: dict[str, frozenset[str] | None] = {}
        self._peer_runs_lock = threading.Lock()
        # (task, peer) -> when the peer last sent a ModelRequest for it (asyncio thread): never
        # skipped by the task's answers, whatever else it serves (a key still noted for another
        # open run, asking for a sealed run's final model, which is never noted).
        self._asking: dict[tuple[str, str], float] = {}
        self._max_assembly_bytes = max_assembly_bytes
        # Until runs are known: room for 4 of the largest payloads (resized by _resize_payloads).
        self._payloads = g.ChunkAssembler(max_total_bytes=min(max_assembly_bytes, 4 * max_payload_bytes),
                                          max_pending=64, max_per_source=PAYLOAD_STREAMS_PER_PEER,
                                          idle_s=PAYLOAD_STREAM_IDLE_S, clock=time.monotonic,
                                          on_drop=self._seen.forget_stream)
        # task_id -> (stream sizes, trainer_count): written on the asyncio thread, read (one dict
        # lookup) by the validators on the libp2p thread.
        self._sizes: dict[str, tuple[g.StreamSizes, int]] = {}
        # The runs of _sizes that have not ended: what a resize walks. An ended run keeps its sizes
        # (a sealed run's RoundFinalized and ModelChunk messages are checked against them) while
        # the service holds it (get_run_state; see _forget_ended_sizes).
        self._budgeted: set[str] = set()
        self._loading: set[str] = set()
        self._events: asyncio.Queue[RunEvent] | None = None
        self._requests: asyncio.Queue[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._loaders: set[asyncio.Task[None]] = set()  # _load_sizes_soon's, each gone when done
        # (task, model hash) -> when its last ModelChunk broadcast began (monotonic seconds).
        self._broadcast_at: dict[tuple[str, bytes], float] = {}
        self._asked: dict[tuple[str, bytes], float] = {}
        # (task, model hash) -> digests of the weights this node published for it: the only
        # weights its validators let through (gossip.WeightsDigests). Replaced whole (the
        # libp2p thread reads it), the newest HELD_WEIGHTS kept.
        self._held_weights: dict[tuple[str, bytes], g.WeightsDigests] = {}
        self._refusals_logged_at = -1e9
        self._refusals_unlogged = 0
        self.counters = {"payloads_stored": 0, "payloads_refused": 0, "equivocations": 0, "tickets": 0,
                         "model_answers": 0, "finalized_published": 0, "model_requests_limited": 0}

    async def _hold_weights(self, task_id: str, model_hash: bytes, data: bytes, data_hash: bytes) -> None:
        """Remember the digests of weights about to be published (chunk digests: 32 bytes per
        MiB), so that copies from other peers are relayed only when they are these bytes. The
        hashing (one pass over the model) runs off the event loop."""
        key = (task_id, model_hash)
        if key in self._held_weights:
            return
        digests = await asyncio.to_thread(g.WeightsDigests.of, data, data_hash)
        held = dict(self._held_weights)
        held[key] = digests
        while len(held) > HELD_WEIGHTS:
            del held[next(iter(held))]
        self._held_weights = held

    def _get_held_weights(self, task_id: str, model_hash: bytes) -> g.WeightsDigests | None:
        return self._held_weights.get((task_id, model_hash))

    def _is_covered(self, task_id: str, model_hash: bytes, received: float) -> bool:
        started = self._broadcast_at.get((task_id, model_hash))
        return started is not None and started >= received

    def stream_stats(self) -> dict[str, int]:
        """The payload assembler's fates (metrics): completed, evicted (stale), refused (no room),
        hash_mismatch; and its current bound in bytes."""
        a = self._payloads
        return {"completed": a.completed, "evicted": a.evicted, "refused": a.refused,
                "hash_mismatch": a.hash_mismatches, "buffer_bytes": a.max_total_bytes}

    # --- run sizes ---

    def _get_sizes(self, task_id: str) -> g.StreamSizes | None:
        """The validators' ``GossipContext.get_sizes`` (libp2p thread): a dict read; an unknown run
        is loaded in the background (its chunks are ignored until then)."""
        got = self._sizes.get(task_id)
        if got is not None:
            return got[0]
        if self._loop is not None and task_id not in self._loading:
            self._loop.call_soon_threadsafe(self._load_sizes_soon, task_id)
        return None

    def _read_sizes(self, task_id: str) -> tuple[g.StreamSizes, int] | None:
        """Runs on the service thread: the run's stream sizes from its fragment layouts."""
        from tenzro_training.cli.exits import CliError
        from tenzro_training.cli.layouts import compute_layouts_from_view

        try:
            view = self._service.get_run(task_id)
            return g.compute_stream_sizes(compute_layouts_from_view(view)), int(view["trainer_count"])
        except (TenzroError, CliError, KeyError, TypeError, ValueError) as exc:
            log.debug("no stream sizes for %s: %s", task_id, exc)
            return None

    def _load_sizes_soon(self, task_id: str) -> None:
        if task_id in self._loading or task_id in self._sizes:
            return
        self._loading.add(task_id)

        async def load() -> None:
            try:
                got = await self._call(lambda: self._read_sizes(task_id))
                if got is not None:
                    self._set_sizes(task_id, got)
            finally:
                self._loading.discard(task_id)

        task = asyncio.create_task(load(), name=f"gossip-sizes-{task_id}")
        self._loaders.add(task)  # held until done (a task only weakly referenced may vanish), then dropped
        task.add_done_callback(self._loaders.discard)

    def _set_sizes(self, task_id: str, got: tuple[g.StreamSizes, int]) -> None:
        self._sizes[task_id] = got
        self._budgeted.add(task_id)
        self._resize_payloads()

    def _resize_payloads(self) -> None:
        """Room for every trainer of every run in training to stream its largest payload at once:
        sum of trainer_count x the largest payload a fragment admits, at least 4 payloads of
        ``max_payload_bytes``, at most ``max_assembly_bytes``."""
        needed, trainers = 0, 0
        for task_id in list(self._budgeted):
            sizes, count = self._sizes[task_id]
            run = self._service.get_run_state(task_id)
            if run is None or is_terminal(run):
                self._budgeted.discard(task_id)  # for good: an ended run never starts again
                continue
            if run.status not in (RunStatus.ENROLLING, RunStatus.TRAINING):
                continue
            needed += count * max(sizes.payload_bytes, default=0)
            trainers += count
        budget = min(self._max_assembly_bytes, max(needed, 4 * self._max_payload_bytes))
        self._payloads.resize(budget, max(64, 2 * trainers))
        self._forget_ended_sizes()

    def _forget_ended_sizes(self) -> None:
        """Drop the sizes of ended runs the service no longer holds (out of its cache of ended
        runs). Every rule reads the run state before the sizes, so gossip about such a run is
        ignored before they would be read; kept, they grew the table with every run the node
        ever served (coverage probe). A getRun that brings the run back into the service's cache
        makes them load again on first use, as for a run never seen."""
        for task_id in [t for t in self._sizes if t not in self._budgeted]:
            if self._service.get_run_state(task_id) is None:
                del self._sizes[task_id]  # the libp2p thread's lookups are single dict reads

    # --- validation (called by the host on its libp2p thread, before relay) ---

    def _validator(self, topic: str) -> Callable[[bytes, str], None]:
        def validate(data: bytes, from_peer: str) -> None:
            # The run view is the service's current (immutable) RunState: a dict read, safe from
            # the libp2p thread. The rules themselves are gossip.validate_gossip's.
            ctx = g.GossipContext(
                get_run=self._service.get_run_state, get_candidate=self._get_candidate, chain_id=self._chain_id,
                now_ms=self._clock(), max_payload_bytes=self._max_payload_bytes, get_sizes=self._get_sizes,
                source=from_peer, get_weights=self._get_held_weights,
            )
            msg = g.validate_gossip(topic, data, ctx, self._seen)
            if isinstance(msg, (g.PayloadChunk, g.ModelRequest)):
                self._note_peer_run(from_peer, msg.task_id)

        return validate

    # --- which peers serve which runs (flood publishing) ---

    def _note_peer_run(self, peer: str, task_id: str) -> None:
        """Runs on the libp2p thread, for a valid message ``peer`` originated about ``task_id``.
        Only open runs are noted: a ModelRequest for a sealed run (a trainer fetching its final
        model) would otherwise leave the peer known for a run that serves nobody."""
        run = self._service.get_run_state(task_id)
        if run is None or is_terminal(run):
            return
        with self._peer_runs_lock:
            runs = self._peer_runs.pop(peer, frozenset())  # re-inserted last: least recently heard goes first
            if runs is not None and task_id not in runs:
                runs = None if len(runs) >= RUNS_PER_PEER_KEPT else runs | {task_id}
            self._peer_runs[peer] = runs
            while len(self._peer_runs) > PEERS_RUNS_KEPT:
                del self._peer_runs[next(iter(self._peer_runs))]

    def _forget_run_peers(self, task_id: str) -> None:
        """A run that ended serves no peer: one whose runs are all over is unknown again (so a
        trainer that reuses its key for another run gets that run's weights from the start).
        Called on the asyncio thread: for a sealed run after its RunSealed was published, so its
        sealing RoundFinalized (queued before it) still reaches every trainer of the run."""
        with self._peer_runs_lock:
            for peer, runs in list(self._peer_runs.items()):
                if runs is not None and task_id in runs:
                    rest = runs - {task_id}
                    if rest:
                        self._peer_runs[peer] = rest
                    else:
                        del self._peer_runs[peer]

    def _skip_peers(self, task_id: str) -> frozenset[str]:
        """Peers known to serve open runs, none of them ``task_id``: they get no copy of its
        weights (RoundFinalized, ModelChunk), mesh members included. They could neither use nor
        pass them on (a trainer takes weights only from the nodes it dialled). Every trainer of
        every run had been sent every run's weights: with one run of a 4.7M-parameter model beside
        four small ones, the small runs' RoundFinalized arrived 12-14 s late and 2,577 outbound
        messages were dropped (multi-run probe; docs/gossip.md "Flood publishing" has the
        figures). Peers not known (relays, other nodes, trainers that have not published yet)
        still get everything."""
        with self._peer_runs_lock:
            known = [(peer, runs) for peer, runs in self._peer_runs.items() if runs is not None and task_id not in runs]
        return frozenset(peer for peer, runs in known
                         if any((run := self._service.get_run_state(r)) is not None and not is_terminal(run)
                                for r in runs))

    # --- lifecycle ---

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._events = asyncio.Queue()
        self._requests = asyncio.Queue(MAX_QUEUED_REQUESTS)

        def read_all() -> dict[str, tuple[g.StreamSizes, int]]:
            ids = self._service.list_runs(None, 0, 1 << 30)["runs"]
            return {r["task_id"]: got for r in ids
                    if RunStatus(r["status"]) not in TERMINAL_STATUSES
                    and (got := self._read_sizes(r["task_id"])) is not None}

        for task_id, got in (await self._call(read_all)).items():
            self._set_sizes(task_id, got)
        for topic in (g.TOPIC_TRAINING, g.TOPIC_SYNCER):
            self._host.set_validator(topic, self._validator(topic))
        training = await self._host.subscribe(g.TOPIC_TRAINING)
        syncer = await self._host.subscribe(g.TOPIC_SYNCER)
        self._tasks = [
            asyncio.create_task(self._drain(training), name="gossip-training"),
            asyncio.create_task(self._drain(syncer), name="gossip-syncer"),
            asyncio.create_task(self._publish_events(), name="gossip-events"),
            asyncio.create_task(self._answer_requests(), name="gossip-model-answers"),
        ]

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._loaders]
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks = []
        self._loaders.clear()

    def on_event(self, event: RunEvent) -> None:
        """``NodeService.on_event`` listener (runs on the service thread): queue for publishing;
        learn a new run's stream sizes before its first chunk arrives."""
        if self._loop is None or self._events is None:
            return
        task_id = getattr(event, "task_id", None)
        if isinstance(task_id, str):
            if task_id not in self._sizes:
                got = self._read_sizes(task_id)  # on the service thread: safe to read the service
                if got is not None:
                    self._loop.call_soon_threadsafe(self._set_sizes, task_id, got)
            elif isinstance(event, _STATUS_EVENTS):  # a status change may start or end a run's share
                self._loop.call_soon_threadsafe(self._resize_payloads)
        if isinstance(event, (RunCancelled, RunFailed)):
            self._loop.call_soon_threadsafe(self._forget_run_peers, event.task_id)
        if isinstance(event, (RoundFinalized, RunSealed)):
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)

    # --- inbound ---

    async def _drain(self, queue: asyncio.Queue[Any]) -> None:
        while True:
            item = await queue.get()
            try:
                await self._handle(g.decode_message(item.data), item.from_peer)
            except asyncio.CancelledError:
                raise
            except (GossipReject, GossipIgnore) as exc:
                log.debug("gossip from %s dropped: %s", item.from_peer, exc)
            except Exception:  # one bad message must not stop the drain
                log.exception("gossip message handling failed")

    async def _handle(self, msg: Any, source: str) -> None:
        if isinstance(msg, g.PayloadChunk):
            await self._on_payload_chunk(msg, source)
        elif isinstance(msg, g.ElectionTicketMsg):
            await self._on_ticket(msg)
        elif isinstance(msg, g.ModelRequest):
            await self._on_model_request(msg, source)

    async def _on_payload_chunk(self, chunk: Any, source: str) -> None:
        a = self._payloads
        evicted, refused = a.evicted, a.refused
        try:
            payload = a.add(chunk, source)
        except GossipReject as exc:
            self.counters["payloads_refused"] += 1
            # One warning per REFUSAL_LOG_INTERVAL_S: any peer can forge streams that fail the
            # hash check (no key needed), one warning line each (gossip probe); the counter
            # and the metric count them all.
            now = time.monotonic()
            if now - self._refusals_logged_at >= REFUSAL_LOG_INTERVAL_S:
                more = f"; {self._refusals_unlogged} more since the last such line" if self._refusals_unlogged else ""
                log.warning("payload %s of %s round %d fragment %d dropped at reassembly: %s (a republish is "
                            "accepted%s)", _hex(chunk.payload_hash), chunk.task_id, chunk.round, chunk.fragment,
                            exc, more)
                self._refusals_logged_at, self._refusals_unlogged = now, 0
            else:
                self._refusals_unlogged += 1
            return
        if a.evicted != evicted or a.refused != refused:
            log.warning("payload reassembly buffer full (%d of %d bytes, %d streams): %d stale streams evicted, "
                        "%d new refused so far", a.pending_bytes, a.max_total_bytes, len(a), a.evicted, a.refused)
        if payload is None:
            return
        try:
            digest = await self._call(lambda: self._service.store_payload(
                chunk.task_id, payload, signer=(chunk.trainer, chunk.fragment, chunk.signature)))
        except Equivocation as exc:
            self.counters["equivocations"] += 1
            log.warning("payload %s of %s refused and its signer slashed: %s", _hex(chunk.payload_hash),
                        chunk.task_id, exc)
            return
        except TenzroError as exc:
            self.counters["payloads_refused"] += 1
            log.warning("payload %s of %s round %d refused: %s", _hex(chunk.payload_hash), chunk.task_id, chunk.round, exc)
            return
        self.counters["payloads_stored"] += 1
        log.info("payload %s of %s round %d fragment %d held, %d bytes (from gossip)",
                 _hex(digest), chunk.task_id, chunk.round, chunk.fragment, len(payload))

    async def _on_ticket(self, msg: Any) -> None:
        try:
            await self._call(lambda: self._service.submit_ticket(msg.task_id, msg.ticket))
        except TenzroError as exc:
            log.info("remote ticket for %s refused: %s", msg.task_id, exc)
            return
        self.counters["tickets"] += 1

    async def _on_model_request(self, msg: Any, source: str) -> None:
        """Queue a (signed, validated) request for the answering task; never answer inline: the
        drain must keep reading the training topic while a model is being sent."""
        assert self._requests is not None
        key = (msg.task_id, msg.requester)
        now = time.monotonic()
        # Whatever else it serves, the answer must not skip the peer that asked.
        self._asking[(msg.task_id, source)] = now
        if len(self._asking) > 4096:
            self._asking = {k: t for k, t in self._asking.items() if now - t <= MODEL_ASKER_KEPT_S}
        if now - self._asked.get(key, -1e9) < MODEL_REQUEST_INTERVAL_S:
            self.counters["model_requests_limited"] += 1
            return
        try:
            self._requests.put_nowait((msg, now))
        except asyncio.QueueFull:
            self.counters["model_requests_limited"] += 1
            return
        self._asked[key] = now
        if len(self._asked) > 4096:  # forget requesters not heard from for a while
            self._asked = {k: t for k, t in self._asked.items() if now - t < MODEL_REQUEST_INTERVAL_S}

    async def _answer_requests(self) -> None:
        assert self._requests is not None
        while True:
            msg, received = await self._requests.get()
            try:
                await self._answer_model_request(msg, received)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("answering a ModelRequest failed")

    async def _answer_model_request(self, msg: Any, received: float) -> None:
        """Broadcast the model ``msg`` asks for, unless a broadcast of it began after ``msg``
        arrived: its sender was listening from the moment it asked and receives that copy
        whole. A request that arrived after a broadcast began may have missed its first chunks
        and gets its own (no sooner than MODEL_ANSWER_INTERVAL_S after the previous one).
        Decided before the service call, on the run's committed model hash (a lock-free read):
        the service thread (a full-model copy, or a rebuild when the model is not cached) is
        not spent on requests a broadcast already covers."""
        run = self._service.get_run_state(msg.task_id)
        if run is None or self._is_covered(msg.task_id, run.model_hash, received):
            self.counters["model_requests_limited"] += 1
            return
        wait = self._broadcast_at.get((msg.task_id, run.model_hash), -1e9) + MODEL_ANSWER_INTERVAL_S - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        try:
            round_, model_hash, weights = await self._call(lambda: self._service.get_global_weights(msg.task_id))
        except TenzroError as exc:
            log.info("ModelRequest for %s not answered: %s", msg.task_id, exc)
            return
        if self._is_covered(msg.task_id, model_hash, received):
            return  # (the model changed meanwhile and its broadcast began after this request)
        now = time.monotonic()
        self._broadcast_at[(msg.task_id, model_hash)] = now
        if len(self._broadcast_at) > 1024:
            self._broadcast_at = {k: t for k, t in self._broadcast_at.items() if now - t < 60.0}
        data = compute_weights_bytes(weights)
        chunks = g.compute_model_chunks(task_id=msg.task_id, round=round_, model_hash=model_hash, weights=data)
        await self._hold_weights(msg.task_id, model_hash, data, chunks[0].data_hash)
        now = time.monotonic()
        asked = {peer for (task, peer), at in self._asking.items()
                 if task == msg.task_id and now - at <= MODEL_ASKER_KEPT_S}
        skip = self._skip_peers(msg.task_id) - asked
        for chunk in chunks:
            await self._host.publish(g.get_topic(chunk), g.encode_message(chunk), skip_peers=skip)
        self.counters["model_answers"] += 1
        log.info("ModelRequest for %s round %d answered (%d bytes)", msg.task_id, round_, len(data))

    # --- outbound ---

    async def _publish_events(self) -> None:
        assert self._events is not None
        while True:
            event = await self._events.get()
            try:
                if isinstance(event, RoundFinalized):
                    await self._publish_round_finalized(event)
                elif isinstance(event, RunSealed):
                    msg = g.RunSealedMsg(task_id=event.task_id, run_root=event.run_root,
                                         final_model_hash=event.final_model_hash)
                    try:
                        await self._host.publish(g.get_topic(msg), g.encode_message(msg))
                    finally:
                        self._forget_run_peers(event.task_id)  # after its sealing RoundFinalized
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("publishing %s failed", type(event).__name__)

    async def _publish_round_finalized(self, event: RoundFinalized) -> None:
        service = self._service

        def read() -> tuple[Any, ...]:
            # Weights first: on the service thread they read an ended run that has left the cache
            # of ended runs back into it, where get_run_state (a plain dict read) then finds it;
            # read the other way round, the sealing round's weights went unpublished (review).
            _, model_hash, weights = service.get_global_weights(event.task_id)
            run = service.get_run_state(event.task_id)
            return run, model_hash, weights, service.get_finalize_signature(event.task_id, event.round)

        run, model_hash, weights, signature = await self._call(read)
        if model_hash != event.model_hash or run is None or len(run.records) <= event.round:
            # Another round was finalized in between: its own event publishes the newer weights.
            log.warning("RoundFinalized %s round %d: the weights moved on; not published", event.task_id, event.round)
            return
        if signature is None:
            log.warning("RoundFinalized %s round %d: no syncer signature held; not published", event.task_id, event.round)
            return
        record = run.records[event.round]
        data = compute_weights_bytes(weights)
        chunks = g.compute_round_finalized_chunks(
            task_id=event.task_id, round=event.round, syncer=event.syncer, syncer_signature=signature,
            aggregate_hashes=tuple(o.aggregate_hash for o in record.fragments), model_hash=model_hash, weights=data,
        )
        await self._hold_weights(event.task_id, model_hash, data, chunks[0].data_hash)
        skip = self._skip_peers(event.task_id)
        for chunk in chunks:
            await self._host.publish(g.get_topic(chunk), g.encode_message(chunk), skip_peers=skip)
        self.counters["finalized_published"] += 1
        log.info("RoundFinalized %s round %d published (%d bytes of weights)", event.task_id, event.round, len(data))
