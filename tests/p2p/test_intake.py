"""The host's message intake fixes over py-libp2p 0.8.1's Pubsub (p2p/pubsub.py ``TunedPubsub``),
each on a Pubsub whose state is set by hand (no network): no validation cache, no message text
in validation errors, exactly one topic of ours per message. The network behaviour (a restarted
peer's sequence numbers) is in test_transport.py."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing
from libp2p.exceptions import ValidationError
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.crypto import secp256k1
from libp2p.pubsub.pubsub import Pubsub, TopicValidator
from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX, signature_validator

from tenzro_training.p2p.pubsub import TunedPubsub

ME = ID(b"\x00\x01me")
PEER = ID(b"\x00\x01peer")
"""The peer that forwards a message to this host; ORIGIN (a real key) wrote and signed it."""
ORIGIN_KEYS = secp256k1.create_new_key_pair(bytes(range(1, 33)))
ORIGIN = ID.from_pubkey(ORIGIN_KEYS.public_key)


def bare_pubsub(validators: dict[str, Any], subscribed: tuple[str, ...] = ()) -> tuple[TunedPubsub, list[str]]:
    pubsub = object.__new__(TunedPubsub)
    events: list[str] = []
    pubsub.topic_validators = {t: TopicValidator(fn, False) for t, fn in validators.items()}
    pubsub.subscribed_topics_receive = dict.fromkeys(subscribed)  # type: ignore[assignment]
    pubsub._my_id = ME
    pubsub._on_reject = lambda: events.append("rejected")
    pubsub._write_locks = weakref.WeakKeyDictionary()
    pubsub._warned = {}
    pubsub.writes_in_flight = 0
    pubsub._msg_id_constructor = lambda m: m.from_id + m.seqno
    pubsub.seen_messages = _Seen()
    return pubsub, events


class _Seen(set):  # type: ignore[type-arg]
    """py-libp2p's LastSeenCache, as far as push_msg uses it."""

    def has(self, msg_id: bytes) -> bool:
        return msg_id in self


def message(*topics: str, data: bytes = b"x") -> rpc_pb2.Message:
    """A message from ORIGIN, signed as py-libp2p signs."""
    msg = rpc_pb2.Message(from_id=ORIGIN.to_bytes(), data=data, seqno=(1).to_bytes(8, "big"), topicIDs=list(topics))
    signature = ORIGIN_KEYS.private_key.sign(PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())
    msg.key, msg.signature = ORIGIN_KEYS.public_key.serialize(), signature
    return msg


def test_every_message_runs_the_validator_again() -> None:
    """py-libp2p cached each result by message id for 300 s, longer than its 120 s seen-cache:
    a message re-sent under an old accepted id skipped the validator (probe: scen_vcache.sh)."""
    answers = iter([True, False])
    calls: list[bytes] = []

    def validator(forwarder: ID, msg: Any) -> bool:
        calls.append(msg.data)
        return next(answers)

    pubsub, _ = bare_pubsub({"t": validator})
    msg = message("t")
    trio.run(pubsub.validate_msg, PEER, msg)
    with pytest.raises(ValidationError) as info:
        trio.run(pubsub.validate_msg, PEER, msg)  # the same id: validated again, and refused
    assert calls == [b"x", b"x"]
    # The error does not format the message (~60 ms for a 1 MiB chunk in py-libp2p's text).
    assert str(info.value) == "refused by the topic validator"


def _unsigned(msg: rpc_pb2.Message) -> None:
    msg.ClearField("signature")


def _data_changed_after_signing(msg: rpc_pb2.Message) -> None:
    msg.data = b"y"


def _key_of_another_peer(msg: rpc_pb2.Message) -> None:
    other = secp256k1.create_new_key_pair(bytes(range(2, 34)))
    msg.key = other.public_key.serialize()
    msg.signature = other.private_key.sign(PUBSUB_SIGNING_PREFIX.encode() + rpc_pb2.Message(
        data=msg.data, topicIDs=msg.topicIDs, from_id=msg.from_id, seqno=msg.seqno).SerializeToString())


def _key_that_does_not_decode(msg: rpc_pb2.Message) -> None:
    msg.from_id = b"\x00\x01someone"  # an id that embeds no key: the message's key is used
    msg.key = b"\x08\x02\x12\x03abc"


@pytest.mark.parametrize("spoil", [_unsigned, _data_changed_after_signing, _key_of_another_peer, _key_that_does_not_decode])
def test_a_message_whose_libp2p_signature_fails_is_rejected_and_counted(
    spoil: Callable[[rpc_pb2.Message], None], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """py-libp2p's push_msg dropped such a message with a debug line and no counter moved. The
    host checks the signature first: counted as rejected, one warning, never handed on (no
    validator, no relay, not marked seen). A copy of a message already seen is not verified
    again: py-libp2p drops it as a duplicate."""
    from tenzro_training.p2p import pubsub as p2p_pubsub

    passed: list[bytes] = []

    async def base_push(self: Pubsub, forwarder: ID, msg: rpc_pb2.Message) -> None:
        passed.append(msg.data)

    monkeypatch.setattr(Pubsub, "push_msg", base_push)
    pubsub, events = bare_pubsub({"t": lambda f, m: True})
    trio.run(pubsub.push_msg, PEER, message("t"))
    assert passed == [b"x"] and events == []
    bad = message("t")
    spoil(bad)
    with caplog.at_level(logging.WARNING, logger=p2p_pubsub.log.name):
        trio.run(pubsub.push_msg, PEER, bad)
    assert passed == [b"x"] and events == ["rejected"]
    assert [r.getMessage() for r in caplog.records] == [
        f"rejected a message relayed by {PEER}: its libp2p signature is missing or does not verify"]
    pubsub.seen_messages.add(bad.from_id + bad.seqno)  # its id was seen (the genuine copy came first)
    trio.run(pubsub.push_msg, PEER, bad)
    assert len(passed) == 2 and events == ["rejected"]  # not verified: py-libp2p's seen check drops it


async def _done(_: object) -> None:
    return None


def test_own_publishes_are_signed_as_py_libp2p_signs_and_not_verified_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """py-libp2p's strict signing is off (it verified in push_msg, uncounted); the host signs
    its publishes itself, and a receiver's check (py-libp2p's own function) accepts them."""
    from libp2p import new_host

    pushed: list[tuple[ID, rpc_pb2.Message]] = []
    pubsub, events = bare_pubsub({"t": lambda f, m: True})
    pubsub.host = new_host(key_pair=ORIGIN_KEYS)
    pubsub.sign_key = ORIGIN_KEYS.private_key
    pubsub._signing_key_bytes = ORIGIN_KEYS.public_key.serialize()
    pubsub._my_id = ORIGIN
    pubsub.counter = 7

    async def push_msg(forwarder: ID, msg: rpc_pb2.Message) -> None:
        pushed.append((forwarder, msg))

    pubsub.push_msg = push_msg  # type: ignore[method-assign]
    trio.run(pubsub.publish, "t", b"payload")
    (forwarder, msg), = pushed
    assert forwarder == ORIGIN and msg.from_id == ORIGIN.to_bytes() and list(msg.topicIDs) == ["t"]
    assert msg.data == b"payload" and msg.seqno == (8).to_bytes(8, "big")
    assert signature_validator(msg)
    msg.ClearField("signature")
    handed_on: list[object] = []
    pubsub.push_msg = TunedPubsub.push_msg.__get__(pubsub)  # type: ignore[method-assign]
    monkeypatch.setattr(Pubsub, "push_msg", lambda self, f, m: _done(handed_on.append(m)))
    trio.run(pubsub.push_msg, ORIGIN, msg)  # the own publish: not verified (an unsigned one passes)
    assert handed_on == [msg] and events == []


@pytest.mark.parametrize("topics", [(), ("t", "u"), ("t",) + tuple(f"junk{i}" for i in range(1000)), ("other",)])
def test_invalid_topic_lists_are_rejected_before_validation(monkeypatch: pytest.MonkeyPatch, topics: tuple[str, ...]) -> None:
    """py-libp2p's scorer kept a counter per (peer, topic) for every topic an invalid message
    listed (probe: 50,000 names per message). A message must carry one topic of ours."""
    passed: list[rpc_pb2.Message] = []

    async def base_push(self: Pubsub, forwarder: ID, msg: rpc_pb2.Message) -> None:
        passed.append(msg)

    monkeypatch.setattr(Pubsub, "push_msg", base_push)
    pubsub, events = bare_pubsub({"t": lambda f, m: True}, subscribed=("u",))
    trio.run(pubsub.push_msg, PEER, message(*topics))
    assert passed == [] and events == ["rejected"]
    for ok in (("t",), ("u",)):  # a validated topic, a subscribed one
        trio.run(pubsub.push_msg, PEER, message(*ok))
    trio.run(pubsub.push_msg, ME, message("fanout-only"))  # our own publish is never refused here
    assert [list(m.topicIDs) for m in passed] == [["t"], ["u"], ["fanout-only"]] and events == ["rejected"]


def test_a_message_that_cannot_be_handled_is_dropped_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer's message is handled in a pubsub task, where an error would stop the whole host:
    it is counted as rejected instead. Our own publish still raises to the publisher."""

    async def base_push(self: Pubsub, forwarder: ID, msg: rpc_pb2.Message) -> None:
        raise ValueError("a malformed field")

    monkeypatch.setattr(Pubsub, "push_msg", base_push)
    pubsub, events = bare_pubsub({"t": lambda f, m: True})
    trio.run(pubsub.push_msg, PEER, message("t"))
    assert events == ["rejected"]
    with pytest.raises(ValueError):
        trio.run(pubsub.push_msg, ME, message("t"))


def test_a_peer_whose_messages_cannot_be_handled_gets_one_warning_per_interval(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """2,000 signed messages with an undecodable key in one 68 KB RPC wrote 1,025 warnings (p2p
    flood probe); each is still counted as rejected, and the next line says how many were held."""
    from tenzro_training.p2p import pubsub as p2p_pubsub

    async def base_push(self: Pubsub, forwarder: ID, msg: rpc_pb2.Message) -> None:
        raise ValueError("the key does not decode")

    now = [1000.0]
    monkeypatch.setattr(Pubsub, "push_msg", base_push)
    monkeypatch.setattr(p2p_pubsub.time, "monotonic", lambda: now[0])
    pubsub, events = bare_pubsub({"t": lambda f, m: True})

    async def flood(n: int) -> None:
        for _ in range(n):
            await pubsub.push_msg(PEER, message("t"))

    with caplog.at_level(logging.WARNING, logger=p2p_pubsub.log.name):
        trio.run(flood, 2000)
        now[0] += p2p_pubsub.PEER_WARNING_INTERVAL_S
        trio.run(flood, 1)
    assert events == ["rejected"] * 2001
    lines = [r.getMessage() for r in caplog.records if "could not be handled" in r.getMessage()]
    assert len(lines) == 2 and "ValueError" in lines[0]
    assert lines[1].endswith("(1999 more since the last such line)")


class SplitStream:
    """Writes like yamux past its send window: in two frames with a checkpoint between them."""

    def __init__(self) -> None:
        self.out = bytearray()

    async def write(self, data: bytes) -> None:
        half = len(data) // 2
        self.out += data[:half]
        await trio.sleep(0)
        self.out += data[half:]


def read_rpcs(raw: bytes) -> list[rpc_pb2.RPC]:
    rpcs, pos = [], 0
    while pos < len(raw):
        size, shift = 0, 0
        while True:
            byte = raw[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        rpc = rpc_pb2.RPC()
        rpc.ParseFromString(raw[pos : pos + size])
        rpcs.append(rpc)
        pos += size
    return rpcs


def test_rpcs_written_at_once_to_one_stream_do_not_interleave() -> None:
    """py-libp2p writes to a peer's stream from two tasks, and yamux sends a large write as
    several frames: two RPCs written at once interleaved, and the receiver read a corrupt
    protobuf (seen in CI). Writes to one stream now go one RPC at a time."""
    pubsub, _ = bare_pubsub({})
    stream = SplitStream()
    rpcs = [rpc_pb2.RPC(publish=[message("t", data=bytes([c]) * 5000)]) for c in b"ab"]

    async def both() -> None:
        async with trio.open_nursery() as nursery:
            for rpc in rpcs:
                nursery.start_soon(pubsub.write_msg, stream, rpc)

    trio.run(both)
    got = read_rpcs(bytes(stream.out))
    assert sorted(r.publish[0].data for r in got) == [b"a" * 5000, b"b" * 5000]
    assert pubsub.writes_in_flight == 0


def test_outbound_queues_are_bounded_by_bytes() -> None:
    """A peer that stops reading pinned 1,024 RPCs of up to 8 MiB each (over 1 GiB per such peer
    of relayed 1 MiB chunks); now at most OUTBOUND_QUEUE_BYTES, and the publish high-water mark
    counts bytes too."""
    from libp2p.pubsub.rpc_queue import RpcQueue

    from tenzro_training.p2p.pubsub import OUTBOUND_QUEUE_BYTES, OUTBOUND_QUEUE_RPCS, _QueueSizer, queue_level

    queues = _QueueSizer(8 << 20)
    queues[PEER] = RpcQueue()
    q = queues[PEER]
    chunk = rpc_pb2.RPC(publish=[message("t", data=b"\1" * (1 << 20))])
    pushed = 0
    while q.push(chunk):
        pushed += 1
    assert pushed == OUTBOUND_QUEUE_BYTES // chunk.ByteSize() < OUTBOUND_QUEUE_RPCS
    assert queue_level(q) == pytest.approx(4.0, rel=0.01)  # 4x the high-water mark, by bytes
    held = q._queue.bytes
    assert held == pushed * chunk.ByteSize()
    assert q._queue.pop() is chunk and q._queue.bytes == held - chunk.ByteSize()
    assert q.push(chunk) and not q.push(chunk)
    small = rpc_pb2.RPC(publish=[message("t")])
    while q._queue.pop() is not None:
        pass
    assert q._queue.bytes == 0 and queue_level(q) == 0
    for _ in range(OUTBOUND_QUEUE_RPCS):
        assert q.push(small)
    assert not q.push(small)  # the count bound still holds


def test_pyp2p_pending_queue_warnings_are_rate_limited(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gossip probe (stop 20): py-libp2p logs one WARNING per message per connected peer that
    subscribed to nothing once 100 are queued for it; idle peers made hundreds of lines a minute."""
    import logging

    import tenzro_training.p2p.host as host_module

    now = [1000.0]
    monkeypatch.setattr(host_module.time, "monotonic", lambda: now[0])
    f = host_module._FewPendingQueueWarnings()

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("libp2p.pubsub.gossipsub", logging.WARNING, __file__, 1, msg, ("p", 101, 100), None)

    pending = "pending message queue for peer %s exceeded limit (%d > %d), dropping oldest messages"
    assert f.filter(record(pending))
    assert [f.filter(record(pending)) for _ in range(50)] == [False] * 50
    assert f.filter(record("something else %s %d %d"))  # other lines pass untouched
    now[0] += host_module.PENDING_WARNING_INTERVAL_S
    later = record(pending)
    assert f.filter(later) and "50 such lines held back" in later.getMessage()
    assert any(isinstance(x, host_module._FewPendingQueueWarnings)
               for x in logging.getLogger("libp2p.pubsub.gossipsub").filters)


def test_own_publishes_flood_every_subscribed_peer_except_those_skipped() -> None:
    """Flood publishing (p2p/pubsub.py ``TunedGossipSub._get_peers_to_send``): a host's own message
    goes to every identified peer subscribed to the topic, not only its mesh (a node's trainers
    dial only it; past D_high its mesh drops some of them); ``publish_skip`` (one run's weights,
    not for the trainers of the node's other runs) removes those peers, mesh members included;
    relayed messages go to the mesh alone, whatever the skip."""
    from types import SimpleNamespace

    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11

    from tenzro_training.p2p.pubsub import TunedGossipSub

    topic = "t"
    mesh, other, skipped, unidentified = (ID(b"\x00\x01" + bytes([i])) for i in range(4))
    router = TunedGossipSub(protocols=[PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12,
                             heartbeat_interval=1, spam_protection_enabled=False, on_drop=lambda n: None)
    router.pubsub = SimpleNamespace(  # type: ignore[assignment]
        my_id=ME, peer_topics={topic: {mesh, other, skipped, unidentified, ME}}, peers={}, topic_ids={topic},
    )
    router.peer_protocol = {p: PROTOCOL_ID_V11 for p in (mesh, other, skipped)}
    router.mesh = {topic: {mesh}}

    def send(origin: ID) -> set[ID]:
        return set(router._get_peers_to_send([topic], msg_forwarder=ME, origin=origin, msg_id=b"m"))

    assert send(ME) == {mesh, other, skipped}  # the unidentified one is py-libp2p's pending queue's
    router.publish_skip = frozenset({skipped.to_base58()})
    assert send(ME) == {mesh, other}
    router.publish_skip = frozenset({skipped.to_base58(), mesh.to_base58()})
    assert send(ME) == {other}  # a mesh member too
    assert send(PEER) == {mesh}  # a relay: the mesh alone, the skip is the own publish's


def test_equivocation_is_told_by_the_signature() -> None:
    """py-libp2p forwards only the first content under one (originator, seqno). The router
    tells contents apart by their libp2p signature (verified before it gets there: push_msg
    refuses unsigned messages, publish signs every one), not by hashing each 1 MiB chunk again."""
    from tenzro_training.p2p.pubsub import TunedGossipSub

    router = object.__new__(TunedGossipSub)
    router.equivocation_detection = {}
    first = message("t", data=b"one")
    assert router._check_equivocation(first) and router._check_equivocation(message("t", data=b"one"))
    assert not router._check_equivocation(message("t", data=b"two"))  # same seqno, other content
    assert not router._check_equivocation(message("u", data=b"one"))  # other topic
    assert list(router.equivocation_detection.values()) == [first.signature]  # no hash of the data


def test_a_peer_an_own_publish_skipped_cannot_pull_it_with_iwant() -> None:
    """IHAVE gossip goes to random peers outside the mesh each heartbeat: a trainer the node's
    publish of another run's weights skipped would IWANT them (review). Only the ids of own
    publishes that skipped the asking peer are left out of its answer."""
    from types import SimpleNamespace

    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
    from libp2p.pubsub.pb import rpc_pb2

    from tenzro_training.p2p.pubsub import TunedGossipSub

    skipped, other = ID(b"\x00\x01s"), ID(b"\x00\x01o")
    router = TunedGossipSub(protocols=[PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12,
                             heartbeat_interval=1, spam_protection_enabled=False, on_drop=lambda n: None)
    router.pubsub = SimpleNamespace(my_id=ME, peer_topics={"t": {skipped, other}})  # type: ignore[assignment]
    router.peer_protocol = {skipped: PROTOCOL_ID_V11, other: PROTOCOL_ID_V11}
    router.mesh = {"t": set()}
    router.publish_skip = frozenset({skipped.to_base58()})
    assert set(router._get_peers_to_send(["t"], msg_forwarder=ME, origin=ME, msg_id=b"weights")) == {other}
    router.publish_skip = frozenset()
    assert set(router._get_peers_to_send(["t"], msg_forwarder=ME, origin=ME, msg_id=b"notice")) == {skipped, other}
    sent: list[tuple[ID, list[bytes]]] = []
    router.mcache.get = lambda mid: rpc_pb2.Message(data=mid)  # type: ignore[method-assign]
    router.send_rpc = lambda peer, rpc: sent.append((peer, [m.data for m in rpc.publish]))  # type: ignore[method-assign]
    # (router.pubsub is not a Pubsub: no sender record is attached to the answer)

    async def ask(peer: ID) -> None:
        await router.handle_iwant(rpc_pb2.ControlIWant(messageIDs=[b"weights".hex().encode(), b"notice"]), peer)

    trio.run(ask, skipped)
    trio.run(ask, other)
    assert sent == [(skipped, [b"notice"]), (other, [b"weights", b"notice"])]


class FrameStream:
    """An inbound pubsub stream that holds some varint-framed RPCs and then waits for ever."""

    def __init__(self, frames: list[bytes]) -> None:
        from libp2p.utils import encode_varint_prefixed

        self.data = b"".join(encode_varint_prefixed(f) for f in frames)
        self.pos = 0
        self.muxed_conn = type("Conn", (), {"peer_id": PEER})()
        self.metric_send_channel = None

    async def read(self, n: int | None = None) -> bytes:
        await trio.sleep(0)
        if self.pos >= len(self.data):
            await trio.sleep_forever()
        out = self.data[self.pos : self.pos + (n or len(self.data))]
        self.pos += len(out)
        return out

    async def reset(self) -> None:
        pass


def test_one_rpc_of_many_messages_is_cut_at_the_cap_and_costs_no_quadratic_starts() -> None:
    """py-libp2p's reader started a pubsub task per message of an RPC, and its task manager walks
    every task it holds on each start: O(N^2), so 10,000 unsigned 25-byte messages in one RPC
    held a node's trio thread 27 s (fuzzing probe). The host takes the first
    MAX_PUBLISH_PER_RPC of each RPC without the manager, counts the rest as rejected, and the
    next RPC of the stream gets the whole allowance again."""
    from libp2p import new_host
    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
    from libp2p.tools.anyio_service import background_trio_service

    from tenzro_training.p2p.pubsub import MAX_PUBLISH_PER_RPC, TunedGossipSub

    extra = 100
    rejects: list[None] = []
    pushed: list[bytes] = []
    manager_starts: list[Any] = []

    async def scenario() -> None:
        router = TunedGossipSub(protocols=[PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12,
                                 heartbeat_interval=1, spam_protection_enabled=False, on_drop=lambda n: None)
        pubsub = TunedPubsub(new_host(), router, max_rpc_bytes=8 << 20,
                              on_reject=lambda: rejects.append(None))

        async def push_msg(forwarder: ID, msg: rpc_pb2.Message) -> None:
            assert forwarder == PEER
            pushed.append(msg.data)

        pubsub.push_msg = push_msg  # type: ignore[method-assign]
        async with background_trio_service(pubsub), background_trio_service(router):
            await pubsub.wait_until_ready()
            await pubsub.subscribe("t")
            run_task = pubsub.manager.run_task
            pubsub.manager.run_task = lambda fn, *a, **k: (manager_starts.append(fn), run_task(fn, *a, **k))[1]  # type: ignore[method-assign]
            flood = rpc_pb2.RPC(publish=[rpc_pb2.Message(topicIDs=["t"], data=b"a%d" % i)
                                         for i in range(MAX_PUBLISH_PER_RPC + extra)])
            honest = rpc_pb2.RPC(publish=[rpc_pb2.Message(topicIDs=["t"], data=b"b%d" % i)
                                          for i in range(MAX_PUBLISH_PER_RPC)])
            other_topic = rpc_pb2.RPC(publish=[rpc_pb2.Message(topicIDs=["u"], data=b"c")] * 5)
            stream = FrameStream([flood.SerializeToString(), honest.SerializeToString(),
                                  other_topic.SerializeToString()])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pubsub.stream_handler, stream)
                while stream.pos < len(stream.data):
                    await trio.sleep(0)
                await trio.testing.wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()

    trio.run(scenario)
    # (trio runs the tasks of one batch in either order)
    assert len(pushed) == 2 * MAX_PUBLISH_PER_RPC
    assert set(pushed) == {b"a%d" % i for i in range(MAX_PUBLISH_PER_RPC)} | {b"b%d" % i for i in range(MAX_PUBLISH_PER_RPC)}
    assert len(rejects) == extra  # the flood's rest; a topic we do not take is skipped, as before
    assert [fn for fn in manager_starts if getattr(fn, "__name__", "") == "push_msg"] == []  # no O(N) walk each


def test_peer_queues_fill_to_their_byte_bound_exactly_and_the_count_high_water_mark_is_a_quarter() -> None:
    """A peer queue takes RPCs until their bytes reach OUTBOUND_QUEUE_BYTES exactly (not one
    short), and the publish backpressure level reaches 1.0 at a quarter of OUTBOUND_QUEUE_RPCS
    queued, whatever their size."""
    from libp2p.pubsub.rpc_queue import RpcQueue

    from tenzro_training.p2p.pubsub import OUTBOUND_QUEUE_RPCS, _ByteBoundedQueue, _QueueSizer, queue_level

    rpc = rpc_pb2.RPC(publish=[message("t", data=b"\1" * 1000)])
    exact = _ByteBoundedQueue(10, 2 * rpc.ByteSize())
    assert exact.push(rpc) and exact.push(rpc) and not exact.push(rpc)
    assert exact.bytes == 2 * rpc.ByteSize()
    queues = _QueueSizer(8 << 20)
    queues[PEER] = RpcQueue()
    q = queues[PEER]
    small = rpc_pb2.RPC(publish=[message("t")])
    for _ in range(OUTBOUND_QUEUE_RPCS // 4):
        assert q.push(small)
    assert queue_level(q) == pytest.approx(1.0)
    assert q.push(small) and queue_level(q) > 1.0


def test_a_peer_queue_takes_rpcs_up_to_the_hosts_rpc_size() -> None:
    """py-libp2p's peer queue drops an RPC over its max_message_size as oversized, 1 MiB by
    default: every 1 MiB payload chunk (plus its header) would be dropped on the way out. The
    host's queues take RPCs up to its max_rpc_bytes."""
    from libp2p.pubsub.rpc_queue import RpcQueue

    from tenzro_training.p2p.pubsub import _QueueSizer

    queues = _QueueSizer(8 << 20)
    queues[PEER] = RpcQueue()
    chunk = rpc_pb2.RPC(publish=[message("t", data=b"\1" * (1 << 20))])
    parts = queues[PEER].split_rpc(chunk)
    assert [len(p.publish) for p in parts] == [1]
    assert all(p.ByteSize() <= queues[PEER].max_message_size for p in parts)


def test_async_topic_validators_are_awaited_and_their_refusals_count() -> None:
    pubsub, _ = bare_pubsub({})
    answers = iter([True, False])

    async def validator(forwarder: ID, msg: Any) -> bool:
        await trio.sleep(0)
        return next(answers)

    pubsub.topic_validators = {"t": TopicValidator(validator, True)}
    trio.run(pubsub.validate_msg, PEER, message("t"))
    with pytest.raises(ValidationError, match="refused by the topic validator"):
        trio.run(pubsub.validate_msg, PEER, message("t"))


def test_the_table_of_rate_limited_warnings_forgets_lines_not_logged_lately(monkeypatch: pytest.MonkeyPatch) -> None:
    """One entry per (peer, line): a node that hears from many peers would keep them all. At
    4096 entries those not logged within PEER_WARNING_INTERVAL_S are dropped."""
    from tenzro_training.p2p import pubsub as p2p_pubsub

    now = 1000.0
    monkeypatch.setattr(p2p_pubsub.time, "monotonic", lambda: now)
    pubsub, _ = bare_pubsub({})
    interval = p2p_pubsub.PEER_WARNING_INTERVAL_S
    pubsub._warned = {(PEER, f"old {i}"): (now - interval - 1, 0) for i in range(4093)}
    pubsub._warned[(PEER, "just expired")] = (now - interval, 0)
    pubsub._warned[(PEER, "recent")] = (now - 1, 3)
    pubsub._warned[(PEER, "recent too")] = (now - interval + 1, 0)
    assert len(pubsub._warned) == 4096
    pubsub._warn_limited(PEER, "new")
    assert set(pubsub._warned) == {(PEER, "recent"), (PEER, "recent too"), (PEER, "new")}
    assert pubsub._warned[(PEER, "recent")] == (now - 1, 3)


def test_a_pubsub_stream_that_sends_garbage_is_reset_and_its_peer_dropped_not_the_host() -> None:
    """15 bytes of garbage on a pubsub stream stopped a whole py-libp2p host. The stream is now
    reset, its peer handled as dead, the stream counted as rejected, and no reader is left
    registered for it."""
    from libp2p import new_host
    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
    from libp2p.tools.anyio_service import background_trio_service

    from tenzro_training.p2p.pubsub import TunedGossipSub

    rejects: list[None] = []
    dead: list[ID] = []
    resets: list[bool] = []

    class GarbageStream(FrameStream):
        async def reset(self) -> None:
            resets.append(True)

    async def scenario() -> TunedPubsub:
        router = TunedGossipSub(protocols=[PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12,
                                 heartbeat_interval=1, spam_protection_enabled=False, on_drop=lambda n: None)
        pubsub = TunedPubsub(new_host(), router, max_rpc_bytes=8 << 20, on_reject=lambda: rejects.append(None))
        pubsub._handle_dead_peer = dead.append  # type: ignore[method-assign]
        async with background_trio_service(pubsub), background_trio_service(router):
            await pubsub.wait_until_ready()
            with trio.fail_after(10):
                await pubsub.stream_handler(GarbageStream([b"\xff" * 15]))
        return pubsub

    pubsub = trio.run(scenario)
    assert rejects == [None] and resets == [True] and dead == [PEER]
    assert pubsub._intakes == {}


def test_a_real_pubsub_signs_its_publishes_with_nanosecond_seqnos_and_verifies_them_nowhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TunedPubsub as the host builds it: its own publish is signed with the host key (the key
    carried with it), its seqno starts at the clock in nanoseconds (a restarted peer must not
    reuse message ids), py-libp2p's own signature check is off (no message verified twice) and
    the publish is delivered to the local subscriber; no write is counted in flight; and the
    queues of peers it registers are the host's (sized for its RPCs)."""
    import time

    import libp2p.pubsub.pubsub as pyp2p_pubsub
    from libp2p import new_host
    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
    from libp2p.tools.anyio_service import background_trio_service

    from tenzro_training.p2p import pubsub as p2p_pubsub
    from tenzro_training.p2p.pubsub import TunedGossipSub

    checked: list[object] = []
    real_validator = pyp2p_pubsub.signature_validator
    monkeypatch.setattr(pyp2p_pubsub, "signature_validator", lambda m: checked.append(m) or real_validator(m))
    real_verifies = p2p_pubsub.signature_verifies
    monkeypatch.setattr(p2p_pubsub, "signature_verifies", lambda m: checked.append(m) or real_verifies(m))
    before = time.time_ns()

    async def scenario() -> tuple[TunedPubsub, rpc_pb2.Message]:
        router = TunedGossipSub(protocols=[PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12,
                                 heartbeat_interval=1, spam_protection_enabled=False, on_drop=lambda n: None)
        pubsub = TunedPubsub(new_host(key_pair=ORIGIN_KEYS), router, max_rpc_bytes=8 << 20, on_reject=lambda: None)
        async with background_trio_service(pubsub), background_trio_service(router):
            await pubsub.wait_until_ready()
            subscription = await pubsub.subscribe("t")
            with trio.fail_after(10):
                await pubsub.publish("t", b"payload")
                got = await subscription.get()
        return pubsub, got

    pubsub, got = trio.run(scenario)
    assert got.data == b"payload" and got.from_id == ORIGIN.to_bytes()
    assert got.key == ORIGIN_KEYS.public_key.serialize() and real_validator(got)
    assert int.from_bytes(got.seqno, "big") > before
    assert checked == []
    assert pubsub.writes_in_flight == 0
    from libp2p.pubsub.rpc_queue import RpcQueue

    pubsub.peer_queues[PEER] = RpcQueue()  # as py-libp2p registers a new peer's queue
    assert pubsub.peer_queues[PEER].max_message_size == 8 << 20  # sized for the host's RPCs


def test_dropped_outbound_publishes_are_counted_and_dropped_control_is_retried() -> None:
    """A publish dropped on the way to a peer (its queue full) is counted (dropped_outbound);
    a dropped RPC of control only counts nothing, and its GRAFT is still retried by py-libp2p."""
    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11

    from tenzro_training.p2p.pubsub import TunedGossipSub

    drops: list[int] = []
    router = TunedGossipSub(protocols=[PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12,
                             heartbeat_interval=1, spam_protection_enabled=False, on_drop=drops.append)
    router._handle_dropped_rpc(PEER, rpc_pb2.RPC(publish=[message("t"), message("t", data=b"y")]), "queue_full")
    assert drops == [2]
    graft = rpc_pb2.ControlMessage(graft=[rpc_pb2.ControlGraft(topicID="t")])
    router._handle_dropped_rpc(PEER, rpc_pb2.RPC(control=graft), "queue_full")
    assert drops == [2]
    assert [g.topicID for g in router._pending_control[PEER].graft] == ["t"]


def test_the_skips_of_own_publishes_are_kept_for_the_newest_only_and_not_spent_on_publishes_that_skip_none() -> None:
    """The message id -> skipped peers table keeps the newest SKIPPED_KEPT own publishes that
    skipped someone; publishes that skip no peer take no room in it (they would push a
    skipping publish out, and its skipped peers could then pull it with IWANT)."""
    from types import SimpleNamespace

    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11

    from tenzro_training.p2p.pubsub import SKIPPED_KEPT, TunedGossipSub

    skipped = ID(b"\x00\x01s")
    router = TunedGossipSub(protocols=[PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12,
                             heartbeat_interval=1, spam_protection_enabled=False, on_drop=lambda n: None)
    router.pubsub = SimpleNamespace(my_id=ME, peer_topics={"t": {skipped}})  # type: ignore[assignment]
    router.peer_protocol = {skipped: PROTOCOL_ID_V11}
    router.mesh = {"t": set()}

    def publish(msg_id: bytes, skip: frozenset[str]) -> None:
        router.publish_skip = skip
        list(router._get_peers_to_send(["t"], msg_forwarder=ME, origin=ME, msg_id=msg_id))

    publish(b"first", frozenset({skipped.to_base58()}))
    for i in range(SKIPPED_KEPT):
        publish(b"open %d" % i, frozenset())
    assert list(router._skipped) == [b"first"]
    for i in range(SKIPPED_KEPT):
        publish(b"skip %d" % i, frozenset({skipped.to_base58()}))
    assert len(router._skipped) == SKIPPED_KEPT
    assert b"first" not in router._skipped and b"skip %d" % (SKIPPED_KEPT - 1) in router._skipped
