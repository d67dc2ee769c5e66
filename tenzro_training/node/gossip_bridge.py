"""The node's gossip bridge: libp2p gossipsub <-> :class:`NodeService`.

What this module is: a SHELL that connects one :class:`~tenzro_training.p2p.host.P2PHost` to the
node service. It

- installs the topic validators: each inbound message is decoded and checked by the pure
  ``validate_*_gossip`` functions of :mod:`tenzro_training.gossip` against the service's current
  run state (``NodeService.get_run_state``) before libp2p relays it;
- drains both topics continuously (a libp2p subscription buffers only 32 messages);
- reassembles ``PayloadChunk`` streams and hands each complete, hash-checked payload to
  ``NodeService.store_payload``: a trainer's later hash-only ``submitOuterGradient`` then finds it
  (until then the node answers ``PayloadUnavailable`` and the trainer retries);
- forwards remote ``ElectionTicketMsg`` to ``NodeService.submit_ticket`` (the service verifies
  the VRF proof and the candidate before the ticket counts);
- answers ``ModelRequest`` with ``ModelChunk`` messages carrying the current global model;
- after the service's events, publishes ``RoundFinalizedMsg`` (the new fragment weights, chunked,
  with the syncer's FinalizeRound signature) and ``RunSealedMsg``.

Every service call runs through ``call_service`` (the node's single executor thread: the service
is not thread-safe). Events arrive on that thread and are handed to the asyncio loop.

What it is NOT: the protocol rules (message schemas, validation, reassembly are the pure
``tenzro_training.gossip``), the libp2p host (``p2p/host.py``) or the run lifecycle (the service).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import torch

from tenzro_training import gossip as g
from tenzro_training.errors import GossipIgnore, GossipReject, TenzroError
from tenzro_training.fragments import compute_raw_le_bytes
from tenzro_training.run_events import RoundFinalized, RunEvent, RunSealed

__all__ = ["GossipBridge", "compute_weights_bytes"]

log = logging.getLogger("tenzro.node.gossip")

MODEL_ANSWER_INTERVAL_S: Final = 1.0
"""One ModelChunk answer per (task, model) per interval: many late trainers asking at once get
the same broadcast, not one copy each."""


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
    ) -> None:
        self._service = service
        self._host = host
        self._call = call_service
        self._chain_id = chain_id
        self._get_candidate = get_candidate
        self._max_payload_bytes = max_payload_bytes
        self._clock = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._seen = g.SeenCache()
        # Room for every trainer's payloads of a round in flight at once (64 streams).
        self._payloads = g.ChunkAssembler(max_total_bytes=4 * max_payload_bytes, max_pending=64)
        self._events: asyncio.Queue[RunEvent] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._answered: dict[tuple[str, bytes], float] = {}
        self.counters = {"payloads_stored": 0, "payloads_refused": 0, "tickets": 0, "model_answers": 0,
                         "finalized_published": 0}

    # --- validation (called by the host on its libp2p thread, before relay) ---

    def _validator(self, topic: str) -> Callable[[bytes, str], None]:
        def validate(data: bytes, from_peer: str) -> None:
            # The run view is the service's current (immutable) RunState: a dict read, safe from
            # the libp2p thread. The rules themselves are gossip.validate_gossip's.
            ctx = g.GossipContext(
                get_run=self._service.get_run_state, get_candidate=self._get_candidate, chain_id=self._chain_id,
                now_ms=self._clock(), max_payload_bytes=self._max_payload_bytes,
            )
            g.validate_gossip(topic, data, ctx, self._seen)

        return validate

    # --- lifecycle ---

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._events = asyncio.Queue()
        for topic in (g.TOPIC_TRAINING, g.TOPIC_SYNCER):
            self._host.set_validator(topic, self._validator(topic))
        training = await self._host.subscribe(g.TOPIC_TRAINING)
        syncer = await self._host.subscribe(g.TOPIC_SYNCER)
        self._tasks = [
            asyncio.create_task(self._drain(training), name="gossip-training"),
            asyncio.create_task(self._drain(syncer), name="gossip-syncer"),
            asyncio.create_task(self._publish_events(), name="gossip-events"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks = []

    def on_event(self, event: RunEvent) -> None:
        """``NodeService.on_event`` listener (runs on the service thread): queue for publishing."""
        if self._loop is None or self._events is None or not isinstance(event, (RoundFinalized, RunSealed)):
            return
        self._loop.call_soon_threadsafe(self._events.put_nowait, event)

    # --- inbound ---

    async def _drain(self, queue: asyncio.Queue[Any]) -> None:
        while True:
            item = await queue.get()
            try:
                await self._handle(g.decode_message(item.data))
            except asyncio.CancelledError:
                raise
            except (GossipReject, GossipIgnore) as exc:
                log.debug("gossip from %s dropped: %s", item.from_peer, exc)
            except Exception:  # one bad message must not stop the drain
                log.exception("gossip message handling failed")

    async def _handle(self, msg: Any) -> None:
        if isinstance(msg, g.PayloadChunk):
            await self._on_payload_chunk(msg)
        elif isinstance(msg, g.ElectionTicketMsg):
            await self._on_ticket(msg)
        elif isinstance(msg, g.ModelRequest):
            await self._on_model_request(msg)

    async def _on_payload_chunk(self, chunk: Any) -> None:
        payload = self._payloads.add(chunk)
        if payload is None:
            return
        try:
            digest = await self._call(lambda: self._service.store_payload(chunk.task_id, payload))
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

    async def _on_model_request(self, msg: Any) -> None:
        try:
            round_, model_hash, weights = await self._call(lambda: self._service.get_global_weights(msg.task_id))
        except TenzroError as exc:
            log.info("ModelRequest for %s not answered: %s", msg.task_id, exc)
            return
        key = (msg.task_id, model_hash)
        now = time.monotonic()
        if now - self._answered.get(key, -1e9) < MODEL_ANSWER_INTERVAL_S:
            return  # just broadcast: the requester receives that copy
        self._answered[key] = now
        data = compute_weights_bytes(weights)
        for chunk in g.compute_model_chunks(task_id=msg.task_id, round=round_, model_hash=model_hash, weights=data):
            await self._host.publish(g.get_topic(chunk), g.encode_message(chunk))
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
                    await self._host.publish(g.get_topic(msg), g.encode_message(msg))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("publishing %s failed", type(event).__name__)

    async def _publish_round_finalized(self, event: RoundFinalized) -> None:
        service = self._service

        def read() -> tuple[Any, ...]:
            run = service.get_run_state(event.task_id)
            _, model_hash, weights = service.get_global_weights(event.task_id)
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
        for chunk in g.compute_round_finalized_chunks(
            task_id=event.task_id, round=event.round, syncer=event.syncer, syncer_signature=signature,
            aggregate_hashes=tuple(o.aggregate_hash for o in record.fragments), model_hash=model_hash, weights=data,
        ):
            await self._host.publish(g.get_topic(chunk), g.encode_message(chunk))
        self.counters["finalized_published"] += 1
        log.info("RoundFinalized %s round %d published (%d bytes of weights)", event.task_id, event.round, len(data))
