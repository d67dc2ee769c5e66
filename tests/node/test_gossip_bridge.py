"""The node's gossip bridge against the real NodeService (memory and RocksDB stores) and a fake
host that records what it is given: validators, subscriptions, publishes. The libp2p host itself
is tested in tests/p2p, the whole path with real processes in tests/e2e/test_gossip_run.py."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from storage import schema
from tenzro_training import auth
from tenzro_training import gossip as g
from tenzro_training.errors import GossipIgnore, GossipReject, PayloadUnavailable
from tenzro_training.global_model import compute_state_model_hash
from tenzro_training.node import gossip_bridge as node_gossip_bridge
from tenzro_training.node.gossip_bridge import GossipBridge, compute_weights_bytes
from tenzro_training.payload import compute_payload_hash
from tenzro_training.trainer.process import decode_fragment_weights
from tests.node.conftest import TRAINERS, Net, Party
from tests.node.test_service import start


@dataclass
class Item:
    data: bytes
    from_peer: str = "peer"


class FakeHost:
    def __init__(self) -> None:
        self.validators: dict[str, Callable[[bytes, str], None]] = {}
        self.queues: dict[str, asyncio.Queue[Item]] = {}
        self.published: list[tuple[str, g.GossipMessage]] = []
        self.skipped: list[frozenset[str]] = []  # each publish's skip_peers
        self.changed = asyncio.Event()

    def set_validator(self, topic: str, fn: Callable[[bytes, str], None]) -> None:
        self.validators[topic] = fn

    async def subscribe(self, topic: str) -> asyncio.Queue[Item]:
        self.queues[topic] = asyncio.Queue()
        return self.queues[topic]

    async def publish(self, topic: str, data: bytes, *, skip_peers: frozenset[str] = frozenset()) -> None:
        self.published.append((topic, g.decode_message(data)))
        self.skipped.append(skip_peers)
        self.changed.set()

    def deliver(self, msg: g.GossipMessage, peer: str = "peer") -> None:
        """What the real host does with an inbound message: validate, then queue it."""
        data = g.encode_message(msg)
        topic = g.get_topic(msg)
        self.validators[topic](data, peer)
        self.queues[topic].put_nowait(Item(data, peer))

    async def wait_for(self, kind: type, count: int = 1) -> list[Any]:
        async def until() -> list[Any]:
            while True:
                got = [m for _, m in self.published if isinstance(m, kind)]
                if len(got) >= count:
                    return got
                self.changed.clear()
                await self.changed.wait()

        return await asyncio.wait_for(until(), 10)


async def _inline(fn: Callable[[], Any]) -> Any:
    return fn()


@pytest.fixture
def bridged(net: Net, checkpoint: tuple[str, str]) -> Iterator[tuple[Net, FakeHost, GossipBridge, asyncio.AbstractEventLoop]]:
    start(net, checkpoint)
    loop = asyncio.new_event_loop()
    host = FakeHost()
    config = net.service._config
    bridge = GossipBridge(net.service, host, _inline, chain_id=config.chain_id, get_candidate=config.get_candidate,
                          max_payload_bytes=config.max_payload_bytes, clock_ms=net.clock)
    net.service.on_event = bridge.on_event
    loop.run_until_complete(bridge.start())
    yield net, host, bridge, loop
    loop.run_until_complete(bridge.stop())
    loop.close()


def chunks_of(net: Net, i: int, round_: int, fragment: int, *, signer: Party | None = None,
              variant: int = 0) -> tuple[bytes, list[g.PayloadChunk]]:
    data = net.payload(i, round_, fragment, variant)
    digest = compute_payload_hash(data)
    sig = (signer or TRAINERS[i]).sign(auth.SubmitOuterGradient(task_id=net.task_id, round=round_, fragment=fragment,
                                                                payload_hash=digest))
    return data, g.compute_payload_chunks(task_id=net.task_id, round=round_, fragment=fragment,
                                          trainer=TRAINERS[i].address, signature=sig, payload=data)


def model_request(net: Net, i: int, *, nonce: int, round_: int = 0) -> g.ModelRequest:
    party = TRAINERS[i]
    sig = party.sign(auth.RequestModel(task_id=net.task_id, requester=party.address, round=round_, nonce=nonce))
    return g.ModelRequest(task_id=net.task_id, requester=party.address, round=round_, nonce=nonce, signature=sig)


async def settle() -> None:
    for _ in range(20):  # let the drain tasks run
        await asyncio.sleep(0)


def test_a_gossiped_payload_makes_the_hash_only_submission_succeed(bridged) -> None:  # type: ignore[no-untyped-def]
    net, host, bridge, loop = bridged
    with pytest.raises(PayloadUnavailable):
        net.submit(0, 0, 0, hash_only=True)  # nothing gossiped yet
    _, chunks = chunks_of(net, 0, 0, 0)
    for c in chunks:
        host.deliver(c)
    loop.run_until_complete(settle())
    assert bridge.counters["payloads_stored"] == 1
    assert net.submit(0, 0, 0, hash_only=True)["accepted_count"] == 1


def test_invalid_gossip_is_refused_by_the_validator_before_anything_is_stored(bridged) -> None:  # type: ignore[no-untyped-def]
    net, host, bridge, loop = bridged
    _, forged = chunks_of(net, 0, 0, 0, signer=TRAINERS[1])  # names trainer 0, signed by trainer 1
    with pytest.raises(GossipReject, match="bad signature"):
        host.deliver(forged[0])
    _, wrong_round = chunks_of(net, 0, 5, 0)
    with pytest.raises(GossipIgnore):
        host.deliver(wrong_round[0])
    with pytest.raises(GossipReject):
        host.validators[g.TOPIC_TRAINING](b"\x01garbage", "peer")
    loop.run_until_complete(settle())
    assert bridge.counters["payloads_stored"] == 0


def test_model_request_is_answered_once_per_interval_with_the_committed_model(bridged) -> None:  # type: ignore[no-untyped-def]
    net, host, bridge, loop = bridged
    host.deliver(model_request(net, 0, nonce=1))
    chunks = loop.run_until_complete(host.wait_for(g.ModelChunk))
    view = net.service.get_run(net.task_id)
    assert "0x" + chunks[0].model_hash.hex() == view["model_hash"]
    whole = g.ChunkAssembler(max_total_bytes=1 << 20, max_pending=1)
    data = next(d for d in (whole.add(c) for c in chunks) if d is not None)
    weights = decode_fragment_weights(data, net.layouts)
    model = net.service._model(net.task_id)
    assert compute_state_model_hash(model, weights) == chunks[0].model_hash
    host.deliver(model_request(net, 1, nonce=2))
    loop.run_until_complete(settle())
    assert bridge.counters["model_answers"] == 1  # the broadcast just sent answers both


def test_finalize_publishes_round_finalized_then_sealed(bridged) -> None:  # type: ignore[no-untyped-def]
    net, host, bridge, loop = bridged
    for round_ in range(2):
        for i in range(3):
            for f in range(2):
                net.submit(i, round_, f)
        result = net.finalize(round_)
        notices = loop.run_until_complete(host.wait_for(g.RoundFinalizedMsg, round_ + 1))
        notice = notices[-1]
        assert notice.round == round_ and "0x" + notice.model_hash.hex() == result["model_hash"]
        auth.validate_signer(auth.FinalizeRound(task_id=net.task_id, round=round_), notice.syncer_signature,
                             notice.syncer, net.service._config.chain_id)
        assert ["0x" + a.hex() for a in notice.aggregate_hashes] == [f["aggregate_hash"] for f in result["fragments"]]
    sealed = loop.run_until_complete(host.wait_for(g.RunSealedMsg))[0]
    view = net.service.get_run(net.task_id)
    assert view["status"] == "Sealed" and "0x" + sealed.run_root.hex() == view["run_root"]
    assert bridge.counters["finalized_published"] == 2


def test_weights_bytes_are_the_fragments_little_endian_in_order() -> None:
    import torch

    a, b = torch.tensor([1.0, -2.0]), torch.tensor([0.5])
    assert compute_weights_bytes([a, b]) == a.numpy().astype("<f4").tobytes() + b.numpy().astype("<f4").tobytes()


# --- hardening: forged streams, buffer sizing, signed and rate-limited model requests --------------


def test_invalid_weights_of_another_size_than_the_model_are_rejected(bridged) -> None:  # type: ignore[no-untyped-def]
    # Reviewer repro node_relays.py: an unsigned ModelChunk naming the committed hash with 8 bytes
    # of weights was relayed. The bridge knows the run's layouts: the size must be the model's.
    net, host, bridge, loop = bridged
    view = net.service.get_run(net.task_id)
    committed = bytes.fromhex(view["model_hash"][2:])
    with pytest.raises(GossipReject, match="the model has"):
        host.deliver(g.compute_model_chunks(task_id=net.task_id, round=0, model_hash=committed, weights=b"\x42" * 8)[0])
    model_bytes = 4 * sum(lay.numel for lay in net.layouts)
    with pytest.raises(GossipIgnore, match="not held here"):  # right-sized: the bytes are not the node's
        host.deliver(g.compute_model_chunks(task_id=net.task_id, round=0, model_hash=committed,
                                            weights=b"\x42" * model_bytes)[0])


def test_the_node_relays_only_the_weights_it_published(bridged) -> None:  # type: ignore[no-untyped-def]
    """Gossip probe (stop 20): right-sized weights naming the public committed hash, or a genuine
    RoundFinalized header on other bytes, were relayed by the node to its whole mesh (no key
    needed). Once the node has published a model, copies of exactly its bytes pass (another
    honest node's); anything else is rejected; a model it has not published is not relayed."""
    import dataclasses

    net, host, bridge, loop = bridged
    host.deliver(model_request(net, 0, nonce=1))
    genuine = loop.run_until_complete(host.wait_for(g.ModelChunk))
    for c in genuine:
        host.deliver(c)  # the same bytes, from another peer
    with pytest.raises(GossipReject, match="differ from the ones held here"):
        host.deliver(dataclasses.replace(genuine[0], data=bytes(len(genuine[0].data))))
    for i in range(3):
        for f in range(2):
            net.submit(i, 0, f)
    net.finalize(0)
    (notice,) = loop.run_until_complete(host.wait_for(g.RoundFinalizedMsg))
    with pytest.raises(GossipReject, match="differ from the ones held here"):
        host.deliver(dataclasses.replace(notice, data=bytes(len(notice.data))))
    host.deliver(notice)


def test_a_forged_chunk_body_does_not_shadow_the_genuine_payload(bridged) -> None:  # type: ignore[no-untyped-def]
    # Reviewer repro shadow_payload.py: a relay copies the signed header onto garbage. The genuine
    # chunk was then ignored as a duplicate forever; now it is stored.
    import dataclasses

    net, host, bridge, loop = bridged
    _, chunks = chunks_of(net, 0, 0, 0)
    forged = [dataclasses.replace(c, data=bytes(len(c.data))) for c in chunks]
    for c in forged:
        host.deliver(c)
    loop.run_until_complete(settle())
    assert bridge.counters["payloads_refused"] == 1 and bridge.stream_stats()["hash_mismatch"] == 1
    for c in chunks:
        host.deliver(c)  # the genuine chunks are not duplicates of the forged ones
    loop.run_until_complete(settle())
    assert bridge.counters["payloads_stored"] == 1
    assert net.submit(0, 0, 0, hash_only=True)["accepted_count"] == 1


def test_forged_payload_streams_log_one_warning_per_interval(bridged, caplog) -> None:  # type: ignore[no-untyped-def]
    """Gossip probe (stop 20): every forged stream that failed the hash check logged its own
    warning, and forging one needs no key. The counter still counts each."""
    import dataclasses
    import logging

    net, host, bridge, loop = bridged
    caplog.set_level(logging.WARNING, logger="tenzro.node.gossip")
    _, chunks = chunks_of(net, 0, 0, 0)
    for n in range(5):
        for c in chunks:
            host.deliver(dataclasses.replace(c, data=bytes([n + 1]) * len(c.data)))
        loop.run_until_complete(settle())
    assert bridge.counters["payloads_refused"] == 5
    lines = [r.getMessage() for r in caplog.records if "dropped at reassembly" in r.getMessage()]
    assert len(lines) == 1
    bridge._refusals_logged_at -= node_gossip_bridge.REFUSAL_LOG_INTERVAL_S  # the interval has passed
    for c in chunks:
        host.deliver(dataclasses.replace(c, data=b"\xee" * len(c.data)))
    loop.run_until_complete(settle())
    lines = [r.getMessage() for r in caplog.records if "dropped at reassembly" in r.getMessage()]
    assert len(lines) == 2 and "4 more since the last such line" in lines[1]


def test_two_signed_payloads_of_one_trainer_over_gossip_slash_it(bridged) -> None:  # type: ignore[no-untyped-def]
    # SPEC "Authentication": two different payloads signed by one trainer for one (task, round,
    # fragment) are equivocation. Over gossip the second was only refused and the stake kept.
    net, host, bridge, loop = bridged
    for variant in (0, 1):
        for c in chunks_of(net, 1, 0, 1, variant=variant)[1]:
            host.deliver(c)
        loop.run_until_complete(settle())
    assert bridge.counters["payloads_stored"] == 1 and bridge.counters["equivocations"] == 1
    assert bridge.counters["payloads_refused"] == 0
    view = net.service.get_run(net.task_id)
    assert [t["slashed"] for t in view["trainers"]] == [False, True, False]
    assert net.store.get(schema.CF_EVIDENCE, schema.evidence_key(net.task_id, 0, 1, TRAINERS[1].address)) is not None


def test_the_reassembly_buffer_is_sized_from_the_runs_trainers(net: Net, checkpoint: tuple[str, str]) -> None:
    # Reviewer repro post_validation_loss.py: 4 x max_payload_bytes, whatever the runs' trainers.
    from tenzro_training.payload import compute_max_payload_bytes

    start(net, checkpoint)
    loop = asyncio.new_event_loop()
    config = net.service._config
    needed = 3 * max(compute_max_payload_bytes(lay) for lay in net.layouts)  # trainer_count 3
    for cap, small_max_payload, want in ((1 << 30, 16, needed), (needed // 2, 16, needed // 2)):
        bridge = GossipBridge(net.service, FakeHost(), _inline, chain_id=config.chain_id,
                              get_candidate=config.get_candidate, max_payload_bytes=small_max_payload,
                              clock_ms=net.clock, max_assembly_bytes=cap)
        loop.run_until_complete(bridge.start())
        assert bridge.stream_stats()["buffer_bytes"] == want
        loop.run_until_complete(bridge.stop())
    loop.close()


def test_model_requests_are_signed_rate_limited_and_answered_off_the_drain(bridged) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    net, host, bridge, loop = bridged
    # Reviewer repro spoof_request.py: a request naming trainer 0, signed by trainer 1.
    spoofed = dataclasses.replace(model_request(net, 1, nonce=5), requester=TRAINERS[0].address)
    with pytest.raises(GossipReject, match="bad signature"):
        host.deliver(spoofed)
    release = asyncio.Event()
    real_publish = host.publish

    async def slow_publish(topic: str, data: bytes, **kwargs: Any) -> None:  # a model answer that takes a while
        if isinstance(g.decode_message(data), g.ModelChunk):
            await release.wait()
        await real_publish(topic, data, **kwargs)

    host.publish = slow_publish  # type: ignore[method-assign]
    host.deliver(model_request(net, 0, nonce=1))
    host.deliver(model_request(net, 0, nonce=2))  # the same requester again at once: limited
    _, chunks = chunks_of(net, 1, 0, 0)
    for c in chunks:
        host.deliver(c)
    loop.run_until_complete(settle())
    # The training-topic drain went on while the answer waits to be sent.
    assert bridge.counters["payloads_stored"] == 1 and bridge.counters["model_requests_limited"] == 1
    release.set()
    loop.run_until_complete(host.wait_for(g.ModelChunk))
    assert bridge.counters["model_answers"] == 1


def test_requests_share_a_broadcast_that_began_after_them_and_none_is_dropped(bridged, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Requests queued before a broadcast of their model began share it (one service call, one
    broadcast); a request that arrives after a broadcast began may have missed its first
    chunks, so it gets a broadcast of its own (limiting it by a plain interval once starved a
    restarted trainer in the e2e run)."""
    import tenzro_training.node.gossip_bridge as bridge_mod

    net, host, bridge, loop = bridged
    monkeypatch.setattr(bridge_mod, "MODEL_ANSWER_INTERVAL_S", 0.0)
    monkeypatch.setattr(bridge_mod, "MODEL_REQUEST_INTERVAL_S", 0.0)
    calls = []
    real = net.service.get_global_weights

    def counting(task_id: str):  # type: ignore[no-untyped-def]
        calls.append(task_id)
        return real(task_id)

    monkeypatch.setattr(net.service, "get_global_weights", counting)
    for i in (0, 1, 2):  # all queued before the answering task runs
        host.deliver(model_request(net, i, nonce=1))
    loop.run_until_complete(host.wait_for(g.ModelChunk))
    loop.run_until_complete(settle())
    assert calls == [net.task_id] and bridge.counters["model_answers"] == 1
    assert bridge.counters["model_requests_limited"] == 2
    host.published.clear()
    host.deliver(model_request(net, 1, nonce=2))  # after the broadcast began: answered again
    loop.run_until_complete(host.wait_for(g.ModelChunk))
    assert len(calls) == 2 and bridge.counters["model_answers"] == 2


@pytest.mark.parametrize("failing", [None, "host", "bridge"])
def test_start_p2p_stops_the_host_when_the_bridge_fails_to_start(tmp_path, monkeypatch, failing) -> None:  # type: ignore[no-untyped-def]
    """P7: node/main.py's _start_p2p left the started host running when bridge.start() raised.
    A host that cannot listen is the node's one-line startup error naming the address (the
    pre-flight bind does not see every such failure); a start that works hands both back to be
    stopped at the end."""
    from types import SimpleNamespace

    import tenzro_training.node.gossip_bridge as bridge_mod
    import tenzro_training.p2p.host as p2p_host
    from tenzro_training.node.main import NodeStartupError, _p2p_config, _start_p2p

    calls: list[str] = []

    class RecordingHost:
        def __init__(self, config: object) -> None:
            pass

        async def start(self) -> None:
            calls.append("start")
            if failing == "host":
                raise OSError(98, "Address already in use")

        async def stop(self) -> None:
            calls.append("stop")

    async def bridge_start(self: object) -> None:
        if failing == "bridge":
            raise RuntimeError("bridge start failed")

    monkeypatch.setattr(p2p_host, "P2PHost", RecordingHost)
    monkeypatch.setattr(bridge_mod.GossipBridge, "start", bridge_start)
    config = SimpleNamespace(chain_id=1337, get_candidate=lambda a: None, max_payload_bytes=1 << 20)
    started = _start_p2p(_p2p_config({"listen": ["/ip4/127.0.0.1/tcp/0"]}, tmp_path), object(), config, None)
    if failing is None:
        host, bridge = asyncio.run(started)
        assert isinstance(host, RecordingHost) and isinstance(bridge, GossipBridge) and calls == ["start"]
        return
    refusal = "cannot start libp2p on /ip4/127.0.0.1/tcp/0: [Errno 98] Address already in use"
    failure = (NodeStartupError, re.escape(refusal)) if failing == "host" else (RuntimeError, "bridge start failed")
    with pytest.raises(failure[0], match=f"^{failure[1]}$"):
        asyncio.run(started)
    assert calls == ["start", "stop"]


def test_a_runs_held_gossip_goes_when_its_round_moves_on_and_a_sealed_run_keeps_its_sizes(bridged) -> None:  # type: ignore[no-untyped-def]
    """The held gossip signatures of a round that is over had stayed for good (soak probe). A
    sealed run keeps its stream sizes: its RoundFinalized and ModelChunk messages are checked
    against them (dropped, each was ignored and made the service render the run: review)."""
    from tests.node.test_service import play_round

    net, host, bridge, loop = bridged
    for c in chunks_of(net, 0, 0, 0)[1]:
        host.deliver(c)
    loop.run_until_complete(settle())
    assert bridge.counters["payloads_stored"] == 1
    assert list(net.service._gossip_held[net.task_id]) == [(0, 0, TRAINERS[0].address)]
    assert net.task_id in bridge._sizes
    rounds = net.service.get_run(net.task_id)["spec"]["max_rounds"]
    for r in range(rounds):
        play_round(net, r)
        loop.run_until_complete(settle())
        assert net.task_id not in net.service._gossip_held  # round r is over
    assert net.service.get_run(net.task_id)["status"] == "Sealed"
    assert net.task_id in bridge._sizes and not bridge._loaders
    # ...but no resize walks it again, and only a status change resizes (each event had walked
    # every run ever seen: soak probe and review).
    assert net.task_id not in bridge._budgeted
    from tenzro_training.run_events import SubmissionAccepted

    walked: list[str] = []
    real = net.service.get_run_state
    net.service.get_run_state = lambda task_id: walked.append(task_id) or real(task_id)  # type: ignore[method-assign]
    bridge.on_event(SubmissionAccepted(net.task_id, 0, 0, 0, TRAINERS[0].address, b"\x00" * 32))
    loop.run_until_complete(settle())
    assert walked == []


def test_the_sealing_rounds_weights_are_published_after_the_run_left_the_cache(
    bridged: tuple[Net, FakeHost, GossipBridge, asyncio.AbstractEventLoop], checkpoint: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bridge read the run state (a dict read: the cache of ended runs only) before the
    weights (which read an ended run back): a run gone from that cache by the time the publish
    job ran had its sealing round's weights dropped (review). ENDED_RUNS_CACHED = 1 stands for
    64 ended runs used in between."""
    import tenzro_training.node.service as service_module
    from tests.node.conftest import spec_dict

    monkeypatch.setattr(service_module, "ENDED_RUNS_CACHED", 1)
    net, host, bridge, loop = bridged
    for round_ in range(2):
        for i in range(3):
            for f in range(2):
                net.submit(i, round_, f)
        net.finalize(round_)
        if round_ == 0:
            loop.run_until_complete(host.wait_for(g.RoundFinalizedMsg, 1))
    net.task_id = "run-2"
    net.post(spec_dict(*checkpoint, task_id="run-2"))
    net.cancel()  # run-1 leaves the cache before the publish job runs
    assert net.service.get_run_state("run-1") is None
    notices = loop.run_until_complete(host.wait_for(g.RoundFinalizedMsg, 2))
    assert [n.round for n in notices] == [0, 1] and bridge.counters["finalized_published"] == 2


def test_the_sizes_of_ended_runs_the_service_let_go_are_forgotten(
    bridged: tuple[Net, FakeHost, GossipBridge, asyncio.AbstractEventLoop], checkpoint: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bridge's table of stream sizes kept every run the node ever served (coverage probe).
    An ended run's sizes now go once the service's cache of ended runs lets the run go (gossip
    about it is ignored before sizes are read), and load again if a getRun brings it back.
    ENDED_RUNS_CACHED = 1 stands for 64 ended runs used in between."""
    import tenzro_training.node.service as service_module
    from tests.node.conftest import spec_dict

    from tests.node.test_service import play_round

    monkeypatch.setattr(service_module, "ENDED_RUNS_CACHED", 1)
    net, host, bridge, loop = bridged
    for r in range(net.service.get_run(net.task_id)["spec"]["max_rounds"]):
        play_round(net, r)
    loop.run_until_complete(settle())
    assert net.service.get_run_state("run-1").status.value == "Sealed"
    assert "run-1" in bridge._sizes  # ended, still held by the service
    net.task_id = "run-2"
    net.post(spec_dict(*checkpoint, task_id="run-2"))
    net.cancel()  # run-1 leaves the service's cache of ended runs
    loop.run_until_complete(settle())
    assert net.service.get_run_state("run-1") is None
    assert "run-1" not in bridge._sizes and "run-2" in bridge._sizes
    net.service.get_run("run-1")  # read back into the cache: its sizes load on first use
    assert bridge._get_sizes("run-1") is None
    loop.run_until_complete(settle())
    assert "run-1" in bridge._sizes and not bridge._loaders


def test_one_runs_weights_skip_peers_known_to_serve_only_other_open_runs(
    bridged: tuple[Net, FakeHost, GossipBridge, asyncio.AbstractEventLoop], checkpoint: tuple[str, str],
) -> None:
    """Every trainer of every run had been sent every run's weights: one run of a large model
    delayed the other runs' RoundFinalized by 12-14 s (multi-run probe). A peer that originated
    a valid PayloadChunk or ModelRequest of an open run serves that run; the node's weights of
    another run skip it. Peers it knows nothing of, peers that also serve the run, and peers
    whose runs all ended get everything; a run's sealing RoundFinalized still reaches all its
    trainers (the run is forgotten after its RunSealed), and a request about a sealed run is not
    noted (review)."""
    from tests.node.test_service import play_round

    net, host, bridge, loop = bridged
    net.task_id = "run-2"
    start(net, checkpoint, task_id="run-2")
    loop.run_until_complete(settle())
    host.deliver(chunks_of(net, 0, 0, 0)[1][0], peer="trainer-of-run-2")
    net.task_id = "run-1"
    host.deliver(chunks_of(net, 1, 0, 0)[1][0], peer="trainer-of-run-1")
    host.deliver(model_request(net, 2, nonce=1), peer="both")
    net.task_id = "run-2"
    host.deliver(model_request(net, 2, nonce=2), peer="both")

    def skips(task_id: str, round_: int) -> set[frozenset[str]]:
        return {s for (_, m), s in zip(host.published, host.skipped)
                if isinstance(m, g.RoundFinalizedMsg) and m.task_id == task_id and m.round == round_}

    def published(task_id: str, round_: int) -> set[frozenset[str]]:
        async def wait() -> None:
            while not skips(task_id, round_):
                host.changed.clear()
                await asyncio.wait_for(host.changed.wait(), 10)

        loop.run_until_complete(wait())
        return skips(task_id, round_)

    net.task_id = "run-1"
    play_round(net, 0)
    assert published("run-1", 0) == {frozenset({"trainer-of-run-2"})}
    net.task_id = "run-2"
    last = net.service.get_run("run-2")["spec"]["max_rounds"] - 1
    for r in range(last + 1):
        play_round(net, r)
    assert net.service.get_run("run-2")["status"] == "Sealed"
    assert published("run-2", last) == {frozenset({"trainer-of-run-1"})}  # "both" gets it
    loop.run_until_complete(host.wait_for(g.RunSealedMsg))
    loop.run_until_complete(settle())

    def run_2_answers() -> list[frozenset[str]]:
        return [s for (_, m), s in zip(host.published, host.skipped) if isinstance(m, g.ModelChunk) and m.task_id == "run-2"]

    async def answered(count: int) -> None:
        while len(run_2_answers()) < count:
            host.changed.clear()
            await asyncio.wait_for(host.changed.wait(), 10)

    before = len(run_2_answers())  # ("both" asked for run-2's model while it was open)
    host.deliver(model_request(net, 0, nonce=3, round_=last + 1), peer="late")  # fetching the final model
    assert bridge._peer_runs == {"trainer-of-run-1": {"run-1"}, "both": {"run-1"}}  # "late": not noted
    # A key that serves run-1 asks for sealed run-2's final model: its answer does not skip it
    # (the answer to "late" did: it serves only run-1, which is open).
    loop.run_until_complete(answered(before + 1))
    assert run_2_answers()[-1] == frozenset({"trainer-of-run-1"})
    host.deliver(model_request(net, 1, nonce=4, round_=last + 1), peer="trainer-of-run-1")
    loop.run_until_complete(answered(before + 2))
    assert run_2_answers()[-1] == frozenset()
    net.task_id = "run-1"
    play_round(net, 1)  # run-2 is over: its trainer's peer is unknown again
    assert published("run-1", 1) == {frozenset()}


def _note_a_busy_peer_and_one_of_run_0(net: Net, bridge: GossipBridge) -> None:
    """Peer "busy" heard on one run more than a peer's kept runs (so taken to serve every run),
    peer "one" on run r0 alone; every run id reads as the open run."""
    from tenzro_training.node.gossip_bridge import RUNS_PER_PEER_KEPT

    open_run = net.service.get_run_state(net.task_id)
    net.service.get_run_state = lambda task_id: open_run  # type: ignore[method-assign]
    for i in range(RUNS_PER_PEER_KEPT + 1):
        bridge._note_peer_run("busy", f"r{i}")
    bridge._note_peer_run("one", "r0")


def test_a_peer_serving_more_runs_than_are_kept_is_never_skipped(
    bridged: tuple[Net, FakeHost, GossipBridge, asyncio.AbstractEventLoop],
) -> None:
    net, host, bridge, loop = bridged
    _note_a_busy_peer_and_one_of_run_0(net, bridge)
    assert bridge._skip_peers("r5") == frozenset({"one"})
    assert bridge._skip_peers("elsewhere") == frozenset({"one"})  # "busy" serves every run


# --- mutation campaign 5: buffer bounds, tables, lifecycle, tickets, rate limits -----------------


def _fake_time(monkeypatch: pytest.MonkeyPatch, start: float = 1000.0) -> list[float]:
    """The bridge's monotonic clock, set by hand (the bridge module's ``time`` only: asyncio keeps
    its own clock)."""
    from types import SimpleNamespace

    now = [start]
    monkeypatch.setattr(node_gossip_bridge, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return now


def test_the_reassembly_buffer_holds_at_least_four_of_the_largest_payloads(net: Net, checkpoint: tuple[str, str]) -> None:
    """Before any run is known, and while the runs' trainers need less, the buffer has room for
    four payloads of max_payload_bytes (at most max_assembly_bytes)."""
    from tenzro_training.payload import compute_max_payload_bytes

    loop = asyncio.new_event_loop()
    config = net.service._config

    def buffer_bytes(max_payload: int, cap: int = 1 << 30) -> int:
        bridge = GossipBridge(net.service, FakeHost(), _inline, chain_id=config.chain_id,
                              get_candidate=config.get_candidate, max_payload_bytes=max_payload,
                              clock_ms=net.clock, max_assembly_bytes=cap)
        loop.run_until_complete(bridge.start())
        try:
            return bridge.stream_stats()["buffer_bytes"]
        finally:
            loop.run_until_complete(bridge.stop())

    assert buffer_bytes(1000) == 4000  # no run yet
    start(net, checkpoint)
    needed = 3 * max(compute_max_payload_bytes(lay) for lay in net.layouts)
    assert buffer_bytes(needed) == 4 * needed
    assert buffer_bytes(needed, cap=2 * needed) == 2 * needed
    loop.close()


def test_runs_not_yet_enrolling_take_no_room_in_the_reassembly_buffer(net: Net, checkpoint: tuple[str, str]) -> None:
    """Only runs in Enrolling or Training have trainers streaming payloads: a posted run whose
    election is still open is sized (its gossip is checked) but reserves nothing."""
    from tenzro_training.payload import compute_max_payload_bytes
    from tests.node.conftest import spec_dict

    start(net, checkpoint)
    net.task_id = "run-2"
    net.post(spec_dict(*checkpoint, task_id="run-2"))
    assert net.service.get_run("run-2")["status"] not in ("Enrolling", "Training")
    loop = asyncio.new_event_loop()
    config = net.service._config
    bridge = GossipBridge(net.service, FakeHost(), _inline, chain_id=config.chain_id,
                          get_candidate=config.get_candidate, max_payload_bytes=16, clock_ms=net.clock)
    loop.run_until_complete(bridge.start())
    assert "run-2" in bridge._sizes
    assert bridge.stream_stats()["buffer_bytes"] == 3 * max(compute_max_payload_bytes(lay) for lay in net.layouts)
    loop.run_until_complete(bridge.stop())
    loop.close()


def test_the_reassembly_buffer_admits_two_streams_per_trainer_in_training(bridged) -> None:  # type: ignore[no-untyped-def]
    """A trainer streams its fragments one after the other (one or two streams at a time): the
    buffer takes 2 x the trainers of the runs in training, at least 64."""
    net, host, bridge, loop = bridged
    sizes, count = bridge._sizes[net.task_id]
    assert count == 3 and bridge._payloads.max_pending == 64
    bridge._set_sizes(net.task_id, (sizes, 40))  # as for a run of 40 trainers
    assert bridge._payloads.max_pending == 80


def test_the_weights_of_the_newest_models_only_are_held(bridged) -> None:  # type: ignore[no-untyped-def]
    """The digests of every model the node published (one per round per run) are kept to check
    copies from other peers: the newest HELD_WEIGHTS models, the oldest forgotten first."""
    from tenzro_training.node.gossip_bridge import HELD_WEIGHTS

    net, host, bridge, loop = bridged

    def model(i: int) -> bytes:
        return i.to_bytes(32, "big")

    for i in range(HELD_WEIGHTS + 1):
        loop.run_until_complete(bridge._hold_weights(net.task_id, model(i), b"weights %d" % i, None))
    assert bridge._get_held_weights(net.task_id, model(0)) is None
    assert all(bridge._get_held_weights(net.task_id, model(i)) is not None for i in range(1, HELD_WEIGHTS + 1))


def test_the_sizes_of_a_run_first_heard_of_are_read_once_however_many_messages_ask(bridged) -> None:  # type: ignore[no-untyped-def]
    """Every chunk of a run the bridge has not sized yet asks for its sizes before the
    background load has run: one service read, not one per chunk."""
    net, host, bridge, loop = bridged
    del bridge._sizes[net.task_id]  # as for a run this node has not sized yet
    reads: list[str] = []
    real = net.service.get_run
    net.service.get_run = lambda task_id: reads.append(task_id) or real(task_id)  # type: ignore[method-assign]
    for _ in range(3):
        assert bridge._get_sizes(net.task_id) is None  # the validators' lookups (libp2p thread)
    loop.run_until_complete(settle())
    assert reads == [net.task_id] and not bridge._loading and not bridge._loaders
    assert bridge._get_sizes(net.task_id) is not None


def test_an_ended_runs_sizes_load_again_each_time_the_service_reads_it_back(
    bridged: tuple[Net, FakeHost, GossipBridge, asyncio.AbstractEventLoop], checkpoint: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run whose sizes were loaded in the background, forgotten (the service let the ended
    run go) and read back again loads them again: a load that is over does not count as one
    in progress. ENDED_RUNS_CACHED = 1 stands for 64 ended runs used in between."""
    import tenzro_training.node.service as service_module
    from tests.node.conftest import spec_dict
    from tests.node.test_service import play_round

    monkeypatch.setattr(service_module, "ENDED_RUNS_CACHED", 1)
    net, host, bridge, loop = bridged
    for r in range(net.service.get_run(net.task_id)["spec"]["max_rounds"]):
        play_round(net, r)
    loop.run_until_complete(settle())
    for other in ("run-2", "run-3"):
        net.task_id = other
        net.post(spec_dict(*checkpoint, task_id=other))
        net.cancel()  # run-1 leaves the service's cache of ended runs
        loop.run_until_complete(settle())
        assert net.service.get_run_state("run-1") is None and "run-1" not in bridge._sizes
        net.service.get_run("run-1")  # read back into the cache
        assert bridge._get_sizes("run-1") is None
        loop.run_until_complete(settle())
        assert "run-1" in bridge._sizes


def test_stop_cancels_the_work_in_flight_and_returns(net: Net, checkpoint: tuple[str, str]) -> None:
    """stop() runs before the host stops: a drain waiting for the service (a payload being
    stored) and a background sizes load are cancelled, and stop returns once they are."""
    start(net, checkpoint)
    loop = asyncio.new_event_loop()
    host = FakeHost()
    service_busy = [False]

    async def call(fn: Callable[[], Any]) -> Any:
        if service_busy[0]:
            await asyncio.Event().wait()  # the service thread never gets to it
        return fn()

    config = net.service._config
    bridge = GossipBridge(net.service, host, call, chain_id=config.chain_id, get_candidate=config.get_candidate,
                          max_payload_bytes=config.max_payload_bytes, clock_ms=net.clock)
    loop.run_until_complete(bridge.start())
    service_busy[0] = True
    for c in chunks_of(net, 0, 0, 0)[1]:
        host.deliver(c)
    bridge._get_sizes("run-unknown")
    loop.run_until_complete(settle())
    assert len(bridge._loaders) == 1 and bridge._loading == {"run-unknown"}
    in_flight = [*bridge._tasks, *bridge._loaders]

    async def stop_then_look() -> list[bool]:
        await bridge.stop()
        return [t.done() for t in in_flight]  # at once: the host is stopped right after

    stopping = loop.create_task(stop_then_look())
    done, _ = loop.run_until_complete(asyncio.wait({stopping}, timeout=10))  # (a guard against a hang)
    if not done:
        stopping.cancel()
        loop.run_until_complete(asyncio.wait({stopping}))
    assert done, "stop() did not return: a task in flight did not end when cancelled"
    assert stopping.result() == [True] * len(in_flight)
    assert not bridge._loading and bridge.counters["payloads_stored"] == 0
    loop.close()


def test_weights_relayed_by_another_node_neither_note_it_nor_fail_the_drain(bridged, caplog) -> None:  # type: ignore[no-untyped-def]
    """Only a PayloadChunk or a ModelRequest tells which run a peer serves: another node
    relaying (or publishing) a run's RoundFinalized serves every run and must not be skipped
    by the others' weights; and such a message is simply not handled further here."""
    import logging

    from tests.node.test_service import play_round

    net, host, bridge, loop = bridged
    play_round(net, 0)
    (notice,) = loop.run_until_complete(host.wait_for(g.RoundFinalizedMsg))
    with caplog.at_level(logging.DEBUG, logger="tenzro.node.gossip"):
        host.deliver(notice, peer="another-node")
        loop.run_until_complete(settle())
    assert "another-node" not in bridge._peer_runs
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert bridge.counters["model_requests_limited"] == 0 and bridge.counters["model_answers"] == 0


def test_a_peer_taken_to_serve_every_run_stays_so_when_heard_again_or_a_run_ends(
    bridged: tuple[Net, FakeHost, GossipBridge, asyncio.AbstractEventLoop],
) -> None:
    net, host, bridge, loop = bridged
    _note_a_busy_peer_and_one_of_run_0(net, bridge)
    bridge._note_peer_run("busy", "r0")  # heard from again
    bridge._forget_run_peers("r0")  # r0 ended
    assert bridge._peer_runs == {"busy": None}
    assert bridge._skip_peers("r1") == frozenset()


def test_the_peers_heard_from_longest_ago_are_forgotten_first(
    bridged: tuple[Net, FakeHost, GossipBridge, asyncio.AbstractEventLoop],
) -> None:
    """The table of which runs each peer serves keeps PEERS_RUNS_KEPT peers: one heard from
    again moves to the back, and a new one past the bound takes the place of the least recent."""
    from tenzro_training.node.gossip_bridge import PEERS_RUNS_KEPT

    net, host, bridge, loop = bridged
    for i in range(PEERS_RUNS_KEPT):
        bridge._note_peer_run(f"p{i}", net.task_id)
    bridge._note_peer_run("p0", net.task_id)
    bridge._note_peer_run("new", net.task_id)
    assert len(bridge._peer_runs) == PEERS_RUNS_KEPT
    assert "p0" in bridge._peer_runs and "new" in bridge._peer_runs and "p1" not in bridge._peer_runs


def test_a_peer_known_only_for_runs_that_ended_is_sent_every_runs_weights(
    bridged: tuple[Net, FakeHost, GossipBridge, asyncio.AbstractEventLoop], checkpoint: tuple[str, str],
) -> None:
    """A trainer whose run ended may serve a run the node has not heard it speak for yet: from
    the moment its run ends (before its peers are forgotten) it is skipped by no run's weights."""
    from tests.node.conftest import spec_dict

    net, host, bridge, loop = bridged
    net.task_id = "run-2"
    net.post(spec_dict(*checkpoint, task_id="run-2"))
    bridge._note_peer_run("of-run-2", "run-2")
    assert bridge._skip_peers("run-1") == frozenset({"of-run-2"})
    net.cancel()  # (the bridge forgets run-2's peers on its loop, later)
    assert bridge._peer_runs == {"of-run-2": frozenset({"run-2"})}
    assert bridge._skip_peers("run-1") == frozenset()


def test_the_peers_of_a_cancelled_run_are_forgotten(
    bridged: tuple[Net, FakeHost, GossipBridge, asyncio.AbstractEventLoop], checkpoint: tuple[str, str],
) -> None:
    """As for a sealed run: a peer whose runs all ended is unknown again (and takes no room)."""
    from tests.node.conftest import spec_dict

    net, host, bridge, loop = bridged
    net.task_id = "run-2"
    net.post(spec_dict(*checkpoint, task_id="run-2"))
    bridge._note_peer_run("trainer-a", "run-2")
    bridge._note_peer_run("trainer-b", "run-2")
    bridge._note_peer_run("trainer-b", "run-1")
    net.cancel()
    loop.run_until_complete(settle())
    assert bridge._peer_runs == {"trainer-b": frozenset({"run-1"})}


def test_refusal_warnings_come_once_per_interval_with_the_exact_count_held_back(bridged, caplog, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The first warning holds nothing back; the next one, REFUSAL_LOG_INTERVAL_S later (not
    more), says how many streams were refused meanwhile; a refused stream is handled without
    an error of its own."""
    import dataclasses
    import logging

    net, host, bridge, loop = bridged
    now = _fake_time(monkeypatch)
    _, chunks = chunks_of(net, 0, 0, 0)

    def forge(n: int) -> None:
        for c in chunks:
            host.deliver(dataclasses.replace(c, data=bytes([n]) * len(c.data)))
        loop.run_until_complete(settle())

    with caplog.at_level(logging.WARNING, logger="tenzro.node.gossip"):
        for n in (1, 2, 3):
            forge(n)
        now[0] += node_gossip_bridge.REFUSAL_LOG_INTERVAL_S
        forge(4)
    lines = [r.getMessage() for r in caplog.records if "dropped at reassembly" in r.getMessage()]
    assert len(lines) == 2 and "more since" not in lines[0]
    assert lines[1].endswith("(a republish is accepted; 2 more since the last such line)")
    assert bridge.counters["payloads_refused"] == 4
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_peer_holds_four_incomplete_payload_streams_and_a_fifth_takes_its_oldests_place(bridged, caplog) -> None:  # type: ignore[no-untyped-def]
    """A trainer publishes its fragments one after the other: one peer may hold
    PAYLOAD_STREAMS_PER_PEER incomplete streams; its next one takes the place of its own
    least recently active (counted, one warning). An incomplete stream is not handed on."""
    import logging

    net, host, bridge, loop = bridged

    def first_chunk(i: int) -> g.PayloadChunk:
        data = bytes([i]) * (g.MAX_CHUNK_BYTES + 1)  # two chunks
        sig = TRAINERS[0].sign(auth.SubmitOuterGradient(task_id=net.task_id, round=0, fragment=0,
                                                        payload_hash=compute_payload_hash(data)))
        return g.compute_payload_chunks(task_id=net.task_id, round=0, fragment=0, trainer=TRAINERS[0].address,
                                        signature=sig, payload=data)[0]

    with caplog.at_level(logging.WARNING, logger="tenzro.node.gossip"):
        for i in range(4):
            loop.run_until_complete(bridge._on_payload_chunk(first_chunk(i), "trainer"))
        assert len(bridge._payloads) == 4 and bridge.stream_stats()["evicted"] == 0
        assert [r for r in caplog.records if "buffer full" in r.getMessage()] == []
        loop.run_until_complete(bridge._on_payload_chunk(first_chunk(4), "trainer"))
    assert len(bridge._payloads) == 4 and bridge.stream_stats()["evicted"] == 1
    assert len([r for r in caplog.records if "buffer full" in r.getMessage()]) == 1
    assert bridge.counters["payloads_refused"] == 0 and bridge.counters["payloads_stored"] == 0


def test_a_reassembled_payload_the_service_refuses_is_counted_refused_not_stored(bridged) -> None:  # type: ignore[no-untyped-def]
    net, host, bridge, loop = bridged
    junk = b"not a payload"
    sig = TRAINERS[0].sign(auth.SubmitOuterGradient(task_id=net.task_id, round=0, fragment=0,
                                                    payload_hash=compute_payload_hash(junk)))
    for c in g.compute_payload_chunks(task_id=net.task_id, round=0, fragment=0, trainer=TRAINERS[0].address,
                                      signature=sig, payload=junk):
        loop.run_until_complete(bridge._on_payload_chunk(c, "trainer"))
    assert bridge.counters["payloads_refused"] == 1 and bridge.counters["payloads_stored"] == 0


def test_a_gossiped_election_ticket_reaches_the_service_and_a_refused_one_is_not_counted(
    bridged: tuple[Net, FakeHost, GossipBridge, asyncio.AbstractEventLoop], checkpoint: tuple[str, str],
) -> None:
    from tenzro_training.election import make_ticket
    from tests.node.conftest import SYNCERS, VRF_SECRETS, spec_dict

    net, host, bridge, loop = bridged
    net.task_id = "run-2"
    net.post(spec_dict(*checkpoint, task_id="run-2"))
    seed = net.service._runs["run-2"].election.seed
    msg = g.ElectionTicketMsg(task_id="run-2", ticket=make_ticket(VRF_SECRETS[0], SYNCERS[0].address, seed))
    host.deliver(msg, peer="candidate")
    loop.run_until_complete(settle())
    assert bridge.counters["tickets"] == 1
    net.elect()  # the election closes before the next copy is handled
    host.queues[g.TOPIC_SYNCER].put_nowait(Item(g.encode_message(msg), "candidate"))
    loop.run_until_complete(settle())
    assert bridge.counters["tickets"] == 1


def test_model_requests_are_limited_to_one_per_interval_exactly_and_a_limited_one_is_not_queued(bridged, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Requests queued the instant a broadcast of their model began share it; a requester is
    answered again MODEL_REQUEST_INTERVAL_S after its last answered request (not later), and
    a request limited on arrival is counted once and never queued."""
    net, host, bridge, loop = bridged
    now = _fake_time(monkeypatch)
    host.deliver(model_request(net, 0, nonce=1))
    host.deliver(model_request(net, 1, nonce=1))
    loop.run_until_complete(host.wait_for(g.ModelChunk))
    loop.run_until_complete(settle())
    assert bridge.counters["model_answers"] == 1 and bridge.counters["model_requests_limited"] == 1
    now[0] += node_gossip_bridge.MODEL_REQUEST_INTERVAL_S
    host.deliver(model_request(net, 0, nonce=2))
    host.deliver(model_request(net, 0, nonce=3))  # at once again: limited
    loop.run_until_complete(settle())
    assert bridge.counters["model_answers"] == 2 and bridge.counters["model_requests_limited"] == 2


def test_the_tables_of_askers_and_requesters_are_pruned_past_4096_entries(bridged, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Both tables grow by one entry per (run, peer) and per (run, requester): past 4096 the
    askers not heard from for MODEL_ASKER_KEPT_S and the requesters not limited any more are
    dropped (at 4096 exactly, nothing is)."""
    from tenzro_training.node.gossip_bridge import MODEL_ASKER_KEPT_S, MODEL_REQUEST_INTERVAL_S

    net, host, bridge, loop = bridged
    now = _fake_time(monkeypatch)
    bridge._asking = {(f"t{i}", "p"): now[0] - MODEL_ASKER_KEPT_S - 1 for i in range(4095)}
    bridge._asked = {(f"t{i}", "r"): now[0] - MODEL_REQUEST_INTERVAL_S for i in range(4095)}
    host.deliver(model_request(net, 0, nonce=1), peer="a0")
    loop.run_until_complete(settle())
    assert len(bridge._asking) == 4096 and len(bridge._asked) == 4096
    bridge._asking[("edge", "p")] = now[0] - MODEL_ASKER_KEPT_S  # still kept
    bridge._asked[("recent", "r")] = now[0] - 1
    host.deliver(model_request(net, 1, nonce=1), peer="a1")
    loop.run_until_complete(settle())
    assert set(bridge._asking) == {("edge", "p"), (net.task_id, "a0"), (net.task_id, "a1")}
    assert set(bridge._asked) == {("recent", "r"), (net.task_id, TRAINERS[0].address), (net.task_id, TRAINERS[1].address)}


def test_requests_past_the_queue_are_dropped_counted_and_may_ask_again_at_once(bridged, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """MAX_QUEUED_REQUESTS wait for the answering task; one more is dropped and counted, and
    since it was not answered its requester is not rate-limited for it."""
    from types import SimpleNamespace

    net, host, bridge, loop = bridged
    release = asyncio.Event()
    real_publish = host.publish

    async def slow_publish(topic: str, data: bytes, **kwargs: Any) -> None:
        await release.wait()
        await real_publish(topic, data, **kwargs)

    host.publish = slow_publish  # type: ignore[method-assign]

    async def ask(requester: str) -> None:
        await bridge._on_model_request(SimpleNamespace(task_id=net.task_id, requester=requester), "peer")

    loop.run_until_complete(ask("first"))
    loop.run_until_complete(settle())  # the answering task took it and waits on the publish
    for i in range(node_gossip_bridge.MAX_QUEUED_REQUESTS):
        loop.run_until_complete(ask(f"r{i}"))
    assert bridge.counters["model_requests_limited"] == 0
    loop.run_until_complete(ask("one-too-many"))
    assert bridge.counters["model_requests_limited"] == 1
    assert (net.task_id, "one-too-many") not in bridge._asked
    release.set()
    loop.run_until_complete(settle())


def test_a_model_request_the_service_cannot_answer_is_skipped_quietly(bridged, caplog, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The weights may be unavailable (a model file gone, a run being rebuilt): the request goes
    unanswered with an info line, not an error, and the next one is answered."""
    import logging

    from tenzro_training.errors import TenzroError

    net, host, bridge, loop = bridged
    monkeypatch.setattr(node_gossip_bridge, "MODEL_ANSWER_INTERVAL_S", 0.0)
    real = net.service.get_global_weights
    failures = [TenzroError("the model is not available")]

    def weights(task_id: str):  # type: ignore[no-untyped-def]
        if failures:
            raise failures.pop()
        return real(task_id)

    monkeypatch.setattr(net.service, "get_global_weights", weights)
    with caplog.at_level(logging.INFO, logger="tenzro.node.gossip"):
        host.deliver(model_request(net, 0, nonce=1))
        loop.run_until_complete(settle())
        assert bridge.counters["model_answers"] == 0
        host.deliver(model_request(net, 1, nonce=1))
        loop.run_until_complete(host.wait_for(g.ModelChunk))
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert any("not answered" in r.getMessage() for r in caplog.records)


def test_the_table_of_broadcasts_is_pruned_past_1024_models(bridged, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """One entry per (run, model) answered: past 1024 the broadcasts begun 60 s ago or more are
    forgotten (at 1024 exactly, none is)."""
    net, host, bridge, loop = bridged
    now = _fake_time(monkeypatch)
    bridge._broadcast_at = {(f"t{i}", b"m"): now[0] - 61 for i in range(1023)}
    host.deliver(model_request(net, 0, nonce=1))
    first = len(loop.run_until_complete(host.wait_for(g.ModelChunk)))
    assert len(bridge._broadcast_at) == 1024
    now[0] += 10.0  # the same requester may ask again, and is answered again
    bridge._broadcast_at[("edge", b"m")] = now[0] - 60.0
    bridge._broadcast_at[("recent", b"m")] = now[0] - 59.0
    host.deliver(model_request(net, 0, nonce=2))
    loop.run_until_complete(host.wait_for(g.ModelChunk, 2 * first))
    model = bytes.fromhex(net.service.get_run(net.task_id)["model_hash"][2:])
    assert set(bridge._broadcast_at) == {("recent", b"m"), (net.task_id, model)}


def test_a_peer_that_asked_for_a_runs_model_is_not_skipped_by_its_answer_for_a_while(
    bridged: tuple[Net, FakeHost, GossipBridge, asyncio.AbstractEventLoop], checkpoint: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A peer known to serve another open run is skipped by this run's weights, unless it asked
    for this run's model within MODEL_ASKER_KEPT_S of the answer's publishing (after the
    weights were read and hashed, which takes time); asking for another run's model does not
    count."""
    from tenzro_training.node.gossip_bridge import MODEL_ASKER_KEPT_S
    from tests.node.conftest import spec_dict

    net, host, bridge, loop = bridged
    now = _fake_time(monkeypatch)
    net.task_id = "run-2"
    net.post(spec_dict(*checkpoint, task_id="run-2"))
    net.task_id = "run-1"
    for peer in ("asked-run-1", "asked-run-1-at-the-edge", "asked-run-1-long-ago", "asked-run-2"):
        bridge._note_peer_run(peer, "run-2")
    bridge._asking[("run-1", "asked-run-1-long-ago")] = now[0] - MODEL_ASKER_KEPT_S + 0.5  # expires meanwhile
    bridge._asking[("run-1", "asked-run-1-at-the-edge")] = now[0] + 1.0 - MODEL_ASKER_KEPT_S
    bridge._asking[("run-1", "asked-run-1")] = now[0] - 1.0
    bridge._asking[("run-2", "asked-run-2")] = now[0]
    real_hold = bridge._hold_weights

    async def slow_hold(*args: Any) -> None:
        now[0] += 1.0  # hashing the weights takes a second
        await real_hold(*args)

    monkeypatch.setattr(bridge, "_hold_weights", slow_hold)
    host.deliver(model_request(net, 0, nonce=1), peer="trainer-of-run-1")
    loop.run_until_complete(host.wait_for(g.ModelChunk))
    assert host.skipped[-1] == frozenset({"asked-run-1-long-ago", "asked-run-2"})


def test_a_round_finalized_whose_weights_moved_on_is_not_published_with_the_newer_ones(bridged, caplog) -> None:  # type: ignore[no-untyped-def]
    """Two rounds finalized before the publisher ran: the first round's notice would carry the
    second round's model (the node holds only the current weights), so only the second is
    published."""
    import logging

    from tests.node.test_service import play_round

    net, host, bridge, loop = bridged
    play_round(net, 0)
    play_round(net, 1)  # before the loop ran the publisher
    with caplog.at_level(logging.WARNING, logger="tenzro.node.gossip"):
        notices = loop.run_until_complete(host.wait_for(g.RoundFinalizedMsg))
        loop.run_until_complete(settle())
    assert [n.round for n in notices] == [1]
    assert [m.round for _, m in host.published if isinstance(m, g.RoundFinalizedMsg)] == [1]
    assert bridge.counters["finalized_published"] == 1
    assert any("the weights moved on" in r.getMessage() for r in caplog.records)


def test_a_round_finalized_without_the_syncers_signature_held_is_not_published(bridged, caplog, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Receivers check the syncer's FinalizeRound signature on the notice: without it held (a
    node that did not see the finalization's signed request) nothing is published, with a
    warning, and the next round's notice still goes out."""
    import logging

    from tests.node.test_service import play_round

    net, host, bridge, loop = bridged
    real = net.service.get_finalize_signature
    monkeypatch.setattr(net.service, "get_finalize_signature",
                        lambda task_id, round_: None if round_ == 0 else real(task_id, round_))
    with caplog.at_level(logging.WARNING, logger="tenzro.node.gossip"):
        play_round(net, 0)
        loop.run_until_complete(settle())
        play_round(net, 1)
        notices = loop.run_until_complete(host.wait_for(g.RoundFinalizedMsg))
    assert [n.round for n in notices] == [1] and bridge.counters["finalized_published"] == 1
    assert any("no syncer signature held" in r.getMessage() for r in caplog.records)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_run_the_service_let_go_leaves_the_budget_without_breaking_the_resize(bridged) -> None:  # type: ignore[no-untyped-def]
    """Sizes read while the service held a run may arrive on the loop after it let the (ended)
    run go: the run takes no room and its sizes go, and the other runs' budget stands."""
    net, host, bridge, loop = bridged
    before = bridge.stream_stats()["buffer_bytes"]
    sizes, _ = bridge._sizes[net.task_id]
    bridge._set_sizes("gone", (sizes, 50))
    assert "gone" not in bridge._budgeted and "gone" not in bridge._sizes
    assert bridge.stream_stats()["buffer_bytes"] == before
