"""py-libp2p 0.8.1's Pubsub and GossipSub, tuned: per-peer outbound queues sized by count and
bytes, a bounded intake of each inbound RPC, one write at a time per stream, a digest instead of
the whole message in the equivocation table. Each fix says what it fixes (found by the gossip,
flood and fuzzing probes); :class:`~tenzro_training.p2p.host.P2PHost` runs them in its trio thread."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from typing import Any, Final

import trio
from libp2p.exceptions import ValidationError
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.rpc_queue import PriorityQueue
from libp2p.pubsub.utils import safe_bytes_from_hex

from tenzro_training.p2p.signing import sign_message, signature_verifies

__all__ = ["MAX_PUBLISH_PER_RPC", "OUTBOUND_QUEUE_BYTES", "OUTBOUND_QUEUE_RPCS", "TunedGossipSub", "TunedPubsub",
           "queue_level"]

log = logging.getLogger("tenzro.p2p")


OUTBOUND_QUEUE_RPCS = 1024
"""Per-peer outbound RPC queue length (libp2p's default is 32). Relays need room beyond what
publish backpressure keeps free: a publisher waits above a quarter of it."""
OUTBOUND_QUEUE_BYTES = 128 << 20
"""Per-peer outbound queue bytes. The count alone let a peer that stops reading pin 1,024 RPCs
of up to ``max_rpc_bytes`` each (over 1 GiB per such peer of relayed 1 MiB chunks, found by the
gossip probe); past this, RPCs to it are dropped (counted as dropped_outbound)."""
_HIGH_WATER = OUTBOUND_QUEUE_RPCS // 4
_HIGH_WATER_BYTES = OUTBOUND_QUEUE_BYTES // 4


class _ByteBoundedQueue(PriorityQueue):
    """libp2p's per-peer PriorityQueue, also bounded by the bytes it holds (``OUTBOUND_QUEUE_BYTES``)."""

    def __init__(self, max_size: int, max_bytes: int) -> None:
        super().__init__(max_size)
        self.max_bytes = max_bytes
        self.bytes = 0

    def push(self, rpc: Any, priority: bool = False) -> bool:
        size = rpc.ByteSize()
        if len(self) >= self.max_size or self.bytes + size > self.max_bytes:
            return False
        # Each entry keeps the size it was counted with, so the total cannot drift whatever
        # happens to the message object later.
        (self._priority if priority else self._non_priority).append((rpc, size))
        self.bytes += size
        return True

    def pop(self) -> Any:
        for side in (self._priority, self._non_priority):
            if side:
                rpc, size = side.popleft()
                self.bytes -= size
                return rpc
        return None


def queue_level(queue: Any) -> float:
    """How full a peer queue is against the publish high-water mark (1.0 = at it), by count or bytes."""
    held = getattr(queue._queue, "bytes", 0)
    return max(len(queue) / _HIGH_WATER, held / _HIGH_WATER_BYTES)


class _QueueSizer(dict):  # type: ignore[type-arg]
    """Pubsub's ``peer_queues`` map: sizes each per-peer RpcQueue the moment Pubsub registers it,
    before anything can be pushed into it (libp2p has no constructor option for these limits)."""

    def __init__(self, max_rpc_bytes: int) -> None:
        super().__init__()
        self._max_rpc_bytes = max_rpc_bytes

    def __setitem__(self, peer_id: ID, queue: Any) -> None:
        queue.max_message_size = self._max_rpc_bytes
        queue._queue = _ByteBoundedQueue(OUTBOUND_QUEUE_RPCS, OUTBOUND_QUEUE_BYTES)
        super().__setitem__(peer_id, queue)


MAX_PUBLISH_PER_RPC: Final = 1024
"""Messages taken from one inbound RPC; the rest are dropped (counted as rejected). Why 1024:
py-libp2p sends one message per RPC when it publishes, relays, flushes the queue of a peer it
had not identified, or replays its cache to a peer that subscribes, so the only RPC of an
honest peer with several is an IWANT answer, which holds every message the asker lacked among
those the answerer cached for the topic in its last gossip window (3 heartbeats, 3 s here):
1024 is over 3 s of the ~250 messages/s that one py-libp2p connection carries at all
(dependencies.md), and an 8 MiB RPC holds at most 7 of our 1 MiB chunks. A hostile RPC of
8 MiB holds ~335,000 25-byte entries."""
PEER_WARNING_INTERVAL_S: Final = 10.0
"""At most one warning per peer and kind per this many seconds about the messages it had
dropped (past the cap of an RPC, or not handleable), with the count held back since: a peer
sending 2,000 signed messages whose key did not decode, in one 68 KB RPC, wrote 1,025 lines
to the node's log (p2p flood probe, 2026-11-26)."""


class _Intake:
    """One inbound pubsub stream's reader (see TunedPubsub._is_subscribed_to_msg)."""

    __slots__ = ("peer_id", "nursery", "left")

    def __init__(self, peer_id: ID, nursery: trio.Nursery) -> None:
        self.peer_id = peer_id
        self.nursery = nursery
        self.left = MAX_PUBLISH_PER_RPC


class _IntakeStream:
    """The stream py-libp2p's reader loop reads from: each read starts the next RPC's budget (no
    read happens between parsing an RPC and handling its messages). Everything else is the
    stream's own."""

    def __init__(self, stream: Any, intake: _Intake) -> None:
        self._stream = stream
        self._intake = intake

    async def read(self, n: int | None = None) -> bytes:
        self._intake.left = MAX_PUBLISH_PER_RPC
        return await self._stream.read(n)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class TunedPubsub(Pubsub):
    """Pubsub with sized outbound queues, a count of writes in flight (for a clean stop), and
    three fixes to py-libp2p 0.8.1's message intake (found by the gossip probe):

    - No validation cache. It remembered each result by message id (originator + seqno) for
      300 s, longer than the 120 s seen-cache, so a message re-sent under an old accepted id
      after 120 s was delivered without running the validator. Our validators are cheap and
      dedup themselves; every message now runs them.
    - No message in the error. Its ValidationError formatted the whole protobuf
      (``f"msg={msg}"``, ~60 ms for a 1 MiB chunk), for every message refused or ignored, so a
      flood of invalid chunks slowed the node to ~19 messages/s.
    - Exactly one topic, one this host validates or subscribes to. The scorer keeps a counter
      per (peer, topic) for every topic an invalid message lists: 50,000 names per message grew
      the node's memory by ~20 MB a message. Our messages carry one topic.

    And the seqno counter starts at the clock in nanoseconds (py-libp2p: seconds). A peer that
    restarts with its persisted key, having sent more messages than seconds had passed, reused
    message ids the network still remembered, and its messages vanished without a trace.

    And one peer's bytes can no longer stop the host. py-libp2p's stream handler let any error
    but a stream error out of its read loop (a frame that is not a protobuf RPC: DecodeError),
    up through the swarm's nursery, and the whole host stopped: 15 bytes of garbage on a pubsub
    stream took a node off the network (found by a CI run, then reproduced on purpose). Now
    any error reading or handling a peer's RPCs, and any error handling one of its messages,
    drops that stream or message (counted as rejected, logged) and nothing else.

    And one RPC cannot hold the trio thread (fuzzing probe): see ``_is_subscribed_to_msg``.

    And a message whose libp2p signature fails is counted. py-libp2p's ``push_msg`` dropped it
    with nothing but a debug line, so a peer forging or garbling signatures was invisible in
    ``stats()``. Signing is always on (strict): ``publish`` signs every message as py-libp2p
    does, and ``push_msg`` verifies every message a peer sent that was not seen before,
    counting a failure as rejected; py-libp2p's own check is turned off so that no message is
    verified twice, and this host's own publishes are not verified at all (py-libp2p verified
    them too: ~0.6 ms per 1 MiB chunk, a SHA-256 pass). Both sign and verify a digest fed piece
    by piece, not a serialized copy of the message (``p2p/signing.py``).
    """

    def __init__(self, *args: Any, max_rpc_bytes: int, on_reject: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, max_inbound_rpc_size=max_rpc_bytes, strict_signing=False, **kwargs)
        self.sign_key = self.host.get_private_key()
        self._signing_key_bytes = self.host.get_public_key().serialize()
        self.peer_queues = _QueueSizer(max_rpc_bytes)
        self.writes_in_flight = 0
        self.counter = time.time_ns()
        self._on_reject = on_reject
        self._my_id = self.host.get_id()
        self._write_locks: weakref.WeakKeyDictionary[Any, trio.Lock] = weakref.WeakKeyDictionary()
        self._intakes: dict[Any, _Intake] = {}
        """The trio task reading each inbound pubsub stream -> that stream's _Intake."""
        self._warned: dict[tuple[ID, str], tuple[float, int]] = {}
        """(peer, kind) -> (when its last warning was logged, warnings held back since)."""

    def _is_subscribed_to_msg(self, msg: Any) -> bool:
        """py-libp2p's reader loop asks this of every message of an RPC it parsed, and starts
        ``push_msg`` as a pubsub task for each one it answers yes, all without yielding. Its
        task manager walks every task it holds on each start, so an RPC of N messages cost
        O(N^2): a 250 KB RPC of 10,000 unsigned 25-byte messages held the trio thread 27 s (no
        gossip, no publish, no stop), and one of 100,000 over 60 s, estimated hours for the
        ~335,000 an 8 MiB RPC holds, while 7 MiB as 7 signed 1 MiB messages cost 0.15 s of CPU
        (fuzzing probe, 2026-11-26, real processes). Any peer may connect and send it.

        Called from a stream this host reads, it answers no and does the work itself: it takes
        the first MAX_PUBLISH_PER_RPC messages of the RPC, starting ``push_msg`` for each in a
        nursery of that stream's reader (O(1) a start, the same concurrency), and drops the rest,
        each counted as rejected, with one warning per peer per PEER_WARNING_INTERVAL_S.
        Elsewhere it is py-libp2p's. Then: 300,000 entries (7.5 MB) cost ~1.2 s of CPU, the
        thread never held over 0.9 s; 20 such RPCs back to back 0.11 s per MB (1 MiB messages:
        0.01 s per MB)."""
        if not super()._is_subscribed_to_msg(msg):
            return False
        intake = self._intakes.get(trio.lowlevel.current_task())
        if intake is None:
            return True
        if intake.left > 0:
            intake.left -= 1
            intake.nursery.start_soon(self.push_msg, intake.peer_id, msg)
            return False
        self._on_reject()
        self._warn_limited(intake.peer_id, f"dropping the messages of an RPC from {intake.peer_id} past the first "
                                           f"{MAX_PUBLISH_PER_RPC}")
        return False

    def _warn_limited(self, peer_id: ID, line: str) -> None:
        """``log.warning(line)``, unless a line of the same text about ``peer_id`` was logged in
        the last PEER_WARNING_INTERVAL_S; the next one logged says how many were held back."""
        now = time.monotonic()
        key = (peer_id, line)
        last, held = self._warned.get(key, (-1e9, 0))
        if now - last < PEER_WARNING_INTERVAL_S:
            self._warned[key] = (last, held + 1)
            return
        if len(self._warned) >= 4096:  # forget the lines not logged lately
            self._warned = {k: v for k, v in self._warned.items() if now - v[0] < PEER_WARNING_INTERVAL_S}
        self._warned[key] = (now, 0)
        log.warning("%s%s", line, f" ({held} more since the last such line)" if held else "")

    async def push_msg(self, msg_forwarder: ID, msg: Any) -> None:
        topics = msg.topicIDs
        if msg_forwarder == self._my_id:  # our own publish (it may be to a topic we only fan out to)
            await super().push_msg(msg_forwarder, msg)
            return
        ours = len(topics) == 1 and (topics[0] in self.topic_validators or topics[0] in self.subscribed_topics_receive)
        if not ours:
            self._on_reject()
            log.info("rejected a message from %s listing %d topic(s): one topic of ours expected",
                     msg_forwarder, len(topics))
            return
        # The libp2p signature, where py-libp2p checked it (after the seen check: a duplicate is
        # not verified again) but counted; a refused message is not marked seen, so a forged
        # copy cannot shadow the genuine one. Refused here, before py-libp2p's push_msg, it
        # does not reach py-libp2p's scorer or its debug line for refused messages, which
        # hex-dumps the data even with debug logging off (~0.7 ms per MiB; review).
        if not self._is_msg_seen(msg) and not signature_verifies(msg):
            self._on_reject()
            self._warn_limited(msg_forwarder, f"rejected a message relayed by {msg_forwarder}: its libp2p signature "
                                              f"is missing or does not verify")
            return
        try:
            await super().push_msg(msg_forwarder, msg)
        except Exception as exc:  # noqa: BLE001 - it runs as a pubsub task: an error would stop the host
            self._on_reject()
            self._warn_limited(msg_forwarder, f"dropped a message from {msg_forwarder} that could not be handled: "
                                              f"{type(exc).__name__}")

    async def stream_handler(self, stream: Any) -> None:
        task = trio.lowlevel.current_task()
        peer_id = stream.muxed_conn.peer_id
        # The nursery holds the push_msg tasks of this stream's messages (_is_subscribed_to_msg),
        # which never raise (push_msg drops what it cannot handle).
        async with trio.open_nursery() as nursery:
            self._intakes[task] = _Intake(peer_id, nursery)
            try:
                await super().stream_handler(_IntakeStream(stream, self._intakes[task]))
            except Exception as exc:  # noqa: BLE001 - see the class docstring: one peer, not the host
                self._on_reject()
                log.warning("closed the pubsub stream of %s: its RPCs could not be handled (%s)", peer_id,
                            type(exc).__name__)
                try:
                    await stream.reset()
                except Exception:  # noqa: BLE001 - already gone
                    pass
                self._handle_dead_peer(peer_id)
            finally:
                del self._intakes[task]

    async def publish(self, topic_id: str | list[str], data: bytes) -> None:
        """py-libp2p's publish with strict signing: the same message, the same signature
        (``p2p/signing.py``: computed without serializing the message)."""
        topics = [topic_id] if isinstance(topic_id, str) else list(topic_id)
        from_id, seqno = self.my_id.to_bytes(), self._next_seqno()
        signature = sign_message(self.sign_key, from_id, data, seqno, topics)
        msg = rpc_pb2.Message(data=data, topicIDs=topics, from_id=from_id, seqno=seqno,
                              key=self._signing_key_bytes, signature=signature)
        await self.push_msg(self.my_id, msg)

    async def validate_msg(self, msg_forwarder: ID, msg: Any) -> None:
        for topic_validator in self.get_msg_validators(msg):
            if topic_validator.is_async:  # none of ours are; kept for completeness
                ok = await topic_validator.validator(msg_forwarder, msg)
            else:
                ok = topic_validator.validator(msg_forwarder, msg)
            if not ok:
                raise ValidationError("refused by the topic validator")

    async def write_msg(self, stream: Any, rpc_msg: Any) -> bool:
        """One RPC at a time per stream. py-libp2p writes to a peer's stream from its queue's
        sender task and, directly, from gossipsub (pending and IWANT-requested messages); yamux
        sends a write as several frames when it exceeds the send window (256 KiB; our chunks
        are 1 MiB) and takes its lock per frame, so two RPCs written at once interleaved their
        frames: the receiver read a corrupt protobuf and dropped the stream with what was on it
        (seen in a CI run of bench_gossip_finalize; before the stream_handler fix, it stopped
        the receiving host)."""
        lock = self._write_locks.get(stream)
        if lock is None:
            lock = self._write_locks[stream] = trio.Lock()
        self.writes_in_flight += 1
        try:
            async with lock:
                return await super().write_msg(stream, rpc_msg)
        finally:
            self.writes_in_flight -= 1


SKIPPED_KEPT: Final = 4096
"""Own publishes whose skipped peers TunedGossipSub remembers for IWANT (py-libp2p's message
cache holds the last 5 heartbeats' messages: at 1 MiB chunks, far fewer)."""


class TunedGossipSub(GossipSub):
    """GossipSub that counts dropped outbound publishes and keeps a digest, not the whole message,
    in its equivocation table (which otherwise pins up to 1000 full messages: ~1 GiB of chunks)."""

    def __init__(self, *args: Any, on_drop: Callable[[int], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_drop = on_drop
        self.publish_skip: frozenset[str] = frozenset()
        """Base58 ids of peers that get no copy of the own publish in progress, mesh members
        included: set by P2PHost._publish for the length of one publish."""
        self._skipped: dict[bytes, frozenset[str]] = {}
        """Message id -> the peers an own publish skipped, so that they cannot pull it with
        IWANT either (the newest SKIPPED_KEPT publishes: more than the message cache holds)."""

    def _handle_dropped_rpc(self, peer_id: ID, rpc: Any, reason: str) -> None:
        if len(rpc.publish):
            self._on_drop(len(rpc.publish))
            log.warning("dropped %d outbound message(s) to %s: %s", len(rpc.publish), peer_id, reason)
        super()._handle_dropped_rpc(peer_id, rpc, reason)

    def _get_peers_to_send(self, topic_ids: Any, msg_forwarder: ID, origin: ID, msg_id: bytes | None = None) -> Any:
        """Flood publishing (gossipsub v1.1, go-libp2p's default): a message this host publishes
        itself goes to every identified peer subscribed to its topic, not only to its mesh;
        relayed messages still go to the mesh alone.

        Why: a node is the hub of a star (trainers dial only it). Past D_high subscribed peers
        (12, up to 16 with py-libp2p's adaptive degree) the node's heartbeat prunes its mesh to
        D = 6, and a pruned trainer, whose only peer is the node and is now in backoff for 60 s,
        has an empty mesh: py-libp2p sent its publishes to nobody, and the node's own
        RoundFinalized and ModelChunk reached only the trainers left in its mesh (no IHAVE goes
        to a peer in backoff either). Multi-run probe, 15 trainers of 5 runs on one node:
        payloads reached the node only over the JSON-RPC fallback after 60 s, RoundFinalized
        was missed, and three runs stalled ~80 s in one round. Peers not identified yet are
        left to py-libp2p's pending queue (``publish`` queues for them), so none gets a copy
        twice. ``publish_skip`` names peers that get no copy of the own publish in progress, mesh
        members included (``P2PHost.publish(skip_peers=...)``: the node's weights of one run are
        not sent to the trainers of its other runs, which could not use or pass them on: a
        trainer takes weights only from the nodes it dialled)."""
        peers = set(super()._get_peers_to_send(topic_ids, msg_forwarder, origin, msg_id))
        pubsub = self.pubsub
        if pubsub is not None and origin == pubsub.my_id:
            for topic in topic_ids:
                peers.update(p for p in pubsub.peer_topics.get(topic, ()) if p in self.peer_protocol)
            peers.discard(origin)
            skip = self.publish_skip
            if skip:
                peers = {p for p in peers if p.to_base58() not in skip}
                if msg_id is not None:
                    self._skipped[msg_id] = skip
                    while len(self._skipped) > SKIPPED_KEPT:
                        del self._skipped[next(iter(self._skipped))]
        yield from peers

    async def handle_iwant(self, iwant_msg: Any, sender_peer_id: ID) -> None:
        """py-libp2p's, minus the ids of own publishes that skipped the asking peer: IHAVE gossip
        goes to random peers outside the mesh each heartbeat, and a skipped trainer would pull
        another run's weights that way (review)."""
        if self._skipped:
            sender = sender_peer_id.to_base58()
            wanted = [mid for mid in iwant_msg.messageIDs
                      if sender not in self._skipped.get(safe_bytes_from_hex(mid) or b"", frozenset())]
            if len(wanted) != len(iwant_msg.messageIDs):
                iwant_msg = rpc_pb2.ControlIWant(messageIDs=wanted)
        await super().handle_iwant(iwant_msg, sender_peer_id)

    def _check_equivocation(self, msg: Any) -> bool:
        """py-libp2p's check (two contents under one originator and seqno: the second is not
        forwarded) on a fingerprint of the content instead of the whole message: its libp2p
        signature. Every message that gets here is signed, an own publish by this host and any
        other verified in ``TunedPubsub.push_msg``, and a signature covers data, topics,
        originator and seqno: two contents carry two different valid signatures. A SHA-256 of
        the data told them apart until 2026-11-27, a pass over each 1 MiB chunk on every host
        that handled it (5-7% of the CPU of a 16 MiB payload on either side, py-spy). An
        originator that signs one content twice, differently, is taken for equivocating: it did
        sign twice under one seqno, and its first copy went on."""
        key = msg.from_id + msg.seqno
        digest = bytes(msg.signature)
        seen = self.equivocation_detection.get(key)
        if seen is None:
            self.equivocation_detection[key] = digest  # type: ignore[assignment]
            return True
        if seen != digest:
            log.warning("equivocation detected from peer %s", ID(msg.from_id))
            return False
        return True
