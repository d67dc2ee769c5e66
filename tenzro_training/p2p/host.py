"""The libp2p gossipsub host, run in its own trio thread, seen from asyncio through a small API.

What it is: :class:`P2PHost` owns one py-libp2p host + Pubsub + GossipSub router inside
``trio.run`` on a dedicated thread. The asyncio side calls ``start``, ``subscribe`` (an
``asyncio.Queue`` per topic), ``publish``, ``connect``, ``stats`` and ``stop``. Topic validators
(``set_validator``) run on the trio thread BEFORE a message is delivered or relayed.

What it is NOT: no protocol rules (``tenzro_training.gossip`` decides what is valid; a validator
here just calls it), no reassembly, no node or trainer logic.

py-libp2p 0.8.1 loses messages silently with its defaults (see dependencies.md). Each fix:

1. spam protection (10 msg/s per topic, own publishes included): turned off;
2. RPC size: inbound ``max_inbound_rpc_size`` raised; the outbound per-peer ``RpcQueue`` has no
   option, so ``p2p/pubsub.py``'s :class:`TunedPubsub` sizes every queue as it is registered (``max_rpc_bytes``,
   ``OUTBOUND_QUEUE_RPCS``);
3. per-peer outbound queue overflow: ``publish`` waits while any peer queue is at its high-water
   mark (bounded by ``publish_timeout_s``, so a dead peer cannot stall a publisher forever);
4. the 32-message subscription buffer: every subscription is drained continuously by its own trio
   task into an asyncio queue bounded by bytes (``max_inbox_bytes``; overflow counted as dropped);
5. shutdown: ``stop`` waits (bounded) until every outbound queue is empty and no write is in flight.

Bootstrap peers that are lost or unreachable are redialed every ``redial_interval_s`` (past
py-libp2p's negative dial cache), so trainers find their node again after it restarts.

Counters (``stats()``): published, delivered, rejected, ignored, dropped (outbound drops reported
by the router + inbox overflows). Own messages are never delivered back to the publisher and never
pass through the validators (validate before publishing if in doubt: the rules are pure).

Signals: trio runs in a non-main thread, so it installs no signal handlers. The process's asyncio
main installs SIGINT/SIGTERM handlers that end its main coroutine, which then awaits ``stop()``
(see ``tests/p2p/peer.py``); no trio traceback is printed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import multiaddr
import trio
from libp2p import new_host
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11
from libp2p.tools.anyio_service import background_trio_service
from libp2p.transport.tcp import tcp as _libp2p_tcp

from tenzro_training.errors import GossipIgnore, GossipReject, TenzroError
from tenzro_training.p2p.keys import load_or_create_peer_key, lock_peer_key
from tenzro_training.p2p.pubsub import OUTBOUND_QUEUE_RPCS, TunedGossipSub, TunedPubsub, queue_level

__all__ = ["P2PConfig", "P2PError", "P2PHost", "GossipMessage", "OUTBOUND_QUEUE_RPCS", "check_multiaddrs",
           "get_peer_ids"]

log = logging.getLogger("tenzro.p2p")
# `import libp2p` detaches its logger; let its records reach the application's handlers.
logging.getLogger("libp2p").propagate = True


_starting = threading.local()
"""Per host thread, while its listeners start: ``failures`` collects py-libp2p's listener errors."""


def _set_reuse_addr(sock: Any) -> None:
    """py-libp2p 0.8.1 puts SO_REUSEPORT on its listening sockets (for TCP hole punching, which
    we do not use), so a second node told to listen on a port another node already listens on
    bound it too, silently, and the kernel dealt each incoming connection to one or the other
    (found by a README walkthrough probe: two dev nodes on one p2p port, each with its own peer
    id). SO_REUSEADDR alone still lets a restarted node bind past TIME_WAIT connections, and a
    port in use is an error at start (P2PError, exit 2 from ``tenzro node``). Its hole-punch
    dial falls back to an ephemeral source port when it cannot share the listen port."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    except OSError:
        pass


_libp2p_tcp._set_reuse_flags = _set_reuse_addr


class _QuietFailedDials(logging.Filter):
    """py-libp2p logs every refused TCP dial at ERROR, and raises it too. A node that is down
    would cost each of its trainers an ERROR line per redial; the redial loop reports the outage
    once instead (warning when lost, info when back), and ``connect`` raises to its caller.

    It also logs a listener that cannot start (port taken) at ERROR and then carries on with no
    address at all. While a host starts, such a record is kept instead, and ``start`` raises it
    as a P2PError: one startup error, not a log line followed by a node that cannot be reached."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        failures = getattr(_starting, "failures", None)
        if failures is not None and msg.startswith("Failed to start TCP listener"):
            failures.append(record.getMessage())
            return False
        return not msg.startswith("Failed to open TCP stream")


logging.getLogger("libp2p.transport.tcp.tcp").addFilter(_QuietFailedDials())
# The connection manager's auto-connector logs two INFO lines every 10 s ("below target (200
# ...); initiating 200 new dials", with nothing to dial): ~17,000 lines a day in a node's log.
logging.getLogger("libp2p.network.auto_connector").setLevel(logging.WARNING)


class _FewPendingQueueWarnings(logging.Filter):
    """py-libp2p queues each message for every connected peer whose subscription it has not
    seen, and past 100 per peer logs one WARNING per message per such peer: a few idle peers
    (any peer may connect and subscribe to nothing) made a node log hundreds of lines a minute
    (gossip probe, 2026-11-26). One such line per PENDING_WARNING_INTERVAL_S gets through, with
    the count of those held back."""

    def __init__(self) -> None:
        super().__init__()
        self._last = -1e9
        self._held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("pending message queue for peer"):
            return True
        now = time.monotonic()
        if now - self._last < PENDING_WARNING_INTERVAL_S:
            self._held += 1
            return False
        if self._held:
            record.msg = f"{record.msg} ({self._held} such lines held back in the last {PENDING_WARNING_INTERVAL_S:g} s)"
        self._last, self._held = now, 0
        return True


PENDING_WARNING_INTERVAL_S = 60.0
"""At most one py-libp2p "pending message queue ... exceeded" warning per this many seconds."""
logging.getLogger("libp2p.pubsub.gossipsub").addFilter(_FewPendingQueueWarnings())

_POLL_S = 0.002

T = TypeVar("T")


class P2PError(TenzroError):
    """The p2p host is not running (not started, stopped, or failed), or a p2p call failed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class P2PConfig:
    """How a node or trainer joins the gossip network."""

    key_path: Path
    """File holding the persisted peer identity key (secp256k1; created on first start, mode 0600)."""
    listen: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/0",)
    """Multiaddrs to listen on (tcp/0 picks a free port; ``addrs`` reports the real ones)."""
    bootstrap: tuple[str, ...] = ()
    """Full multiaddrs (with ``/p2p/<peer id>``; a malformed one is refused here) dialed at start;
    a failed dial is logged and retried, not fatal."""
    max_rpc_bytes: int = 8 << 20
    """Largest pubsub RPC frame, inbound and outbound (a 1 MiB chunk plus headers fits easily)."""
    max_inbox_bytes: int = 512 << 20
    """Bytes of delivered-but-unread messages held per topic before new ones are dropped (counted)."""
    publish_timeout_s: float = 30.0
    """Longest a publish waits for a full peer queue to drain before sending anyway."""
    stop_timeout_s: float = 10.0
    """Longest ``stop`` waits for queued messages to be written."""
    connect_timeout_s: float = 10.0
    """Longest one dial (bootstrap or ``connect``) may take."""
    redial_interval_s: float = 5.0
    """How often a bootstrap peer without a pubsub stream is dialed again: a node that restarts
    (or a dropped connection) must not strand the trainers that bootstrapped from it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_path", Path(self.key_path))
        for name in ("listen", "bootstrap"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(a, str) for a in value):
                raise ValueError(f"{name} must be a sequence of multiaddr strings")
            object.__setattr__(self, name, tuple(value))
        if not self.listen:
            raise ValueError("listen must name at least one multiaddr")
        check_multiaddrs(self.listen, self.bootstrap)
        if type(self.max_rpc_bytes) is not int or not (1 << 20) < self.max_rpc_bytes <= (64 << 20):
            raise ValueError("max_rpc_bytes must be an int in (1 MiB, 64 MiB]")
        if type(self.max_inbox_bytes) is not int or self.max_inbox_bytes < self.max_rpc_bytes:
            raise ValueError("max_inbox_bytes must be an int >= max_rpc_bytes")
        for name in ("publish_timeout_s", "stop_timeout_s", "connect_timeout_s", "redial_interval_s"):
            if not isinstance(getattr(self, name), (int, float)) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive number")


def check_multiaddrs(listen: tuple[str, ...], bootstrap: tuple[str, ...]) -> None:
    """Refuse an address that cannot work before anything starts: a listen address must parse,
    a bootstrap one must also end in ``/p2p/<peer id>`` (a peer is dialed by its identity). A
    typo is then one startup error, not a dial retried every few seconds for ever.

    A listen address must also start with an IP: given ``/dns4/localhost/tcp/4001``, py-libp2p
    0.8.1 listens on every interface (``0.0.0.0`` and ``::``), so a node meant for loopback only
    would have been reachable from anywhere."""
    for addr in listen:
        try:
            first = multiaddr.Multiaddr(addr).protocols()[0].name
        except Exception as exc:  # noqa: BLE001 - py-multiaddr raises several unrelated types
            raise P2PError(f"listen address {addr!r} is not a multiaddr: {exc}") from None
        if first not in ("ip4", "ip6"):
            raise P2PError(f"listen address {addr!r} must start with /ip4/ or /ip6/: py-libp2p listens on every "
                           f"interface for /{first}/ (for loopback only: /ip4/127.0.0.1/...)")
    for addr in bootstrap:
        try:
            info_from_p2p_addr(multiaddr.Multiaddr(addr))
        except Exception as exc:  # noqa: BLE001 - as above
            raise P2PError(f"bootstrap address {addr!r} is not a multiaddr ending in /p2p/<peer id>: {exc}") from None


def get_peer_ids(addrs: tuple[str, ...]) -> frozenset[str]:
    """The base58 peer ids that ``/p2p/<peer id>`` multiaddrs name (P2PError for one that does
    not): who a trainer's ``--bootstrap`` says its node is."""
    check_multiaddrs((), addrs)
    return frozenset(info_from_p2p_addr(multiaddr.Multiaddr(a)).peer_id.to_base58() for a in addrs)


@dataclass(frozen=True, slots=True)
class GossipMessage:
    """One validated message as delivered to a subscriber."""

    topic: str
    data: bytes
    from_peer: str
    """Base58 peer id of the originator (libp2p-signed; not the forwarder)."""
    msg_id: str
    """Hex of libp2p's message id (originator peer id + seqno)."""


@dataclass
class _Counters:
    # Each counter has exactly one writing thread (noted), so no lock is needed under the GIL.
    published: int = 0  # asyncio
    delivered: int = 0  # asyncio
    rejected: int = 0  # trio
    ignored: int = 0  # trio
    dropped_outbound: int = 0  # trio
    dropped_inbox: int = 0  # asyncio
    reconnects: int = 0  # trio: bootstrap peers connected again after being lost or unreachable
    stalled_peers: int = 0  # trio: peers whose queue stayed full past publish_timeout_s


class _Inbox(asyncio.Queue):  # type: ignore[type-arg]
    """An unbounded-by-count asyncio queue that tracks the bytes it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.nbytes = 0

    def _put(self, item: GossipMessage) -> None:  # type: ignore[override]
        self.nbytes += len(item.data)
        super()._put(item)  # type: ignore[misc]

    def _get(self) -> GossipMessage:  # type: ignore[override]
        item = super()._get()  # type: ignore[misc]
        self.nbytes -= len(item.data)
        return item


class P2PHost:
    """One libp2p gossipsub host in its own trio thread, driven from asyncio.

    Use: ``await start()``; ``set_validator`` per topic (before or after start); ``await
    subscribe(topic)`` returns an asyncio queue that receives every validated message;
    ``await publish(topic, data)``; ``await stop()`` on every exit path.
    """

    def __init__(self, config: P2PConfig) -> None:
        if not isinstance(config, P2PConfig):
            raise TypeError("config must be a P2PConfig")
        self.config = config
        self.peer_id: str = ""
        self.addrs: tuple[str, ...] = ()
        self._counters = _Counters()
        self._validators: dict[str, Callable[[bytes, str], None]] = {}
        self._inboxes: dict[str, _Inbox] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop_event: trio.Event | None = None
        self._stopped = asyncio.Event()
        self._running = False
        self._started = False
        """Set once ``start`` has been told the host is up: a later thread failure is logged."""
        self._host: Any = None
        self._pubsub: TunedPubsub | None = None
        self._router: TunedGossipSub | None = None
        self._publish_lock: trio.Lock | None = None
        self._my_id: bytes = b""
        self._unreachable: set[str] = set()  # bootstrap addrs without a stream (trio thread writes)
        # Backpressure bookkeeping (trio thread only): when each peer's queue was first seen full,
        # and the peers that stayed full past publish_timeout_s and are no longer waited for.
        self._full_since: dict[Any, float] = {}
        self._stalled: set[Any] = set()

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the trio thread: listening, pubsub running, bootstrap peers dialed."""
        if self._thread is not None:
            raise P2PError("already started")
        self._loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = self._loop.create_future()
        key_pair = load_or_create_peer_key(self.config.key_path)
        key_lock = lock_peer_key(self.config.key_path)  # held until the host is gone

        def thread_main() -> None:
            try:
                trio.run(self._trio_main, key_pair, ready)
            except BaseException as exc:  # noqa: BLE001 - reported to the asyncio side, never lost
                if self._started:  # after start only the log can say so; a failed start raises in start()
                    log.error("p2p thread failed: %r", exc)
                self._loop.call_soon_threadsafe(self._fail_ready, ready, exc)  # type: ignore[union-attr]
            finally:
                self._running = False
                os.close(key_lock)
                self._loop.call_soon_threadsafe(self._stopped.set)  # type: ignore[union-attr]

        try:
            self._thread = threading.Thread(target=thread_main, name="tenzro-p2p", daemon=True)
            self._thread.start()
        except BaseException:
            self._thread = None
            os.close(key_lock)  # else the key stays locked for this process's life
            raise
        await ready

    @staticmethod
    def _fail_ready(ready: asyncio.Future[None], exc: BaseException) -> None:
        if not ready.done():
            ready.set_exception(exc if isinstance(exc, P2PError) else P2PError(f"p2p host failed to start: {exc!r}"))

    async def _trio_main(self, key_pair: Any, ready: asyncio.Future[None]) -> None:
        cfg = self.config
        self._token = trio.lowlevel.current_trio_token()
        self._stop_event = trio.Event()
        self._publish_lock = trio.Lock()
        host = new_host(key_pair=key_pair)
        router = TunedGossipSub(
            protocols=[PROTOCOL_ID_V11, PROTOCOL_ID],
            degree=6, degree_low=4, degree_high=12,
            heartbeat_interval=1,
            spam_protection_enabled=False,
            on_drop=self._count_outbound_drop,
        )
        pubsub = TunedPubsub(host, router, max_rpc_bytes=cfg.max_rpc_bytes,
                              on_reject=self._count_reject)
        self._host, self._pubsub, self._router = host, pubsub, router
        self._my_id = host.get_id().to_bytes()
        for topic in self._validators:
            self._install_validator(topic)
        listen = [multiaddr.Multiaddr(a) for a in cfg.listen]
        _starting.failures = []
        cannot_listen = None
        try:
            async with host.run(listen_addrs=listen):
                failures, _starting.failures = _starting.failures, None
                if len(host.get_addrs()) < len(listen):  # py-libp2p logs a failed listener, then goes on
                    cannot_listen = "; ".join(failures) or f"cannot listen on {', '.join(cfg.listen)}"
                else:
                    await self._serve(host, pubsub, router, ready)
        finally:
            _starting.failures = None
        if cannot_listen is not None:  # raised out here: inside, trio's nurseries would wrap it in groups
            raise P2PError(cannot_listen)
        log.info("p2p host %s stopped", self.peer_id)

    async def _serve(self, host: Any, pubsub: Any, router: Any, ready: asyncio.Future[None]) -> None:
        """Run pubsub on the listening host until ``stop``; ``ready`` resolves once it is up."""
        cfg = self.config
        async with background_trio_service(pubsub), background_trio_service(router):
            await pubsub.wait_until_ready()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self.peer_id = host.get_id().to_base58()
                self.addrs = tuple(self._full_addrs())
                unreachable = self._unreachable
                for addr in cfg.bootstrap:
                    try:
                        await self._connect(addr)
                    except Exception as exc:  # noqa: BLE001 - a dead bootstrap peer is not fatal
                        log.warning("bootstrap %s failed (retrying every %.1f s): %r", addr, cfg.redial_interval_s, exc)
                        unreachable.add(addr)
                if cfg.bootstrap:
                    nursery.start_soon(self._keep_bootstrap_connected)
                nursery.start_soon(self._watch_stalled_peers)
                self._running = self._started = True
                self._loop.call_soon_threadsafe(  # type: ignore[union-attr]
                    lambda: ready.done() or ready.set_result(None)
                )
                await self._stop_event.wait()
                self._running = False
                await self._drain_outbound()
                nursery.cancel_scope.cancel()

    def _full_addrs(self) -> list[str]:
        out = []
        for addr in self._host.get_addrs():
            text = str(addr)
            out.append(text if "/p2p/" in text else f"{text}/p2p/{self.peer_id}")
        return out

    async def _drain_outbound(self) -> None:
        """Wait until every queued RPC is written (bounded by stop_timeout_s)."""
        pubsub = self._pubsub
        assert pubsub is not None  # internal invariant: set before the loop that calls this
        with trio.move_on_after(self.config.stop_timeout_s) as scope:
            while any(len(q) for q in pubsub.peer_queues.values()) or pubsub.writes_in_flight:
                await trio.sleep(_POLL_S)
        if scope.cancelled_caught:
            log.warning("p2p stop: gave up waiting for queued messages after %.1f s", self.config.stop_timeout_s)

    async def stop(self) -> None:
        """Flush queued messages (bounded), close the host and join the thread. Idempotent."""
        if self._thread is None:
            return
        if self._token is not None and self._stop_event is not None:
            try:
                self._token.run_sync_soon(self._stop_event.set)
            except trio.RunFinishedError:
                pass
        await self._stopped.wait()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    @property
    def running(self) -> bool:
        return self._running

    # --- calls into trio -------------------------------------------------------------------------

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` in the trio thread; return its result to the asyncio caller."""
        if not self._running or self._token is None or self._nursery is None:
            raise P2PError("p2p host is not running")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if fut.done():
                return
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

        async def runner() -> None:
            try:
                result = await fn(*args)
            except trio.Cancelled:
                loop.call_soon_threadsafe(settle, False, P2PError("p2p host stopped"))
                raise
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                loop.call_soon_threadsafe(settle, False, exc)
            else:
                loop.call_soon_threadsafe(settle, True, result)

        try:
            self._token.run_sync_soon(self._nursery.start_soon, runner)
        except trio.RunFinishedError:
            raise P2PError("p2p host is not running") from None
        return await fut

    # --- validators ------------------------------------------------------------------------------

    def set_validator(self, topic: str, fn: Callable[[bytes, str], None]) -> None:
        """``fn(data, from_peer)`` raises GossipReject/GossipIgnore to stop a message before it is
        delivered or relayed; any other exception counts as a reject. Runs on the trio thread."""
        self._validators[topic] = fn
        if self._token is not None:
            try:
                self._token.run_sync_soon(self._install_validator, topic)
            except trio.RunFinishedError:
                pass

    def _install_validator(self, topic: str) -> None:
        fn = self._validators[topic]
        counters = self._counters

        def validator(forwarder: ID, msg: Any) -> bool:
            if msg.from_id == self._my_id:
                return True  # our own publish: the publisher is responsible for it
            try:
                fn(msg.data, ID(msg.from_id).to_base58())
            except GossipIgnore as exc:
                counters.ignored += 1
                log.debug("ignored on %s from %s: %s", topic, forwarder, exc)
                return False
            except GossipReject as exc:
                counters.rejected += 1
                log.info("rejected on %s from %s: %s", topic, forwarder, exc)
                return False
            except Exception as exc:  # noqa: BLE001 - a validator bug must not pass a message
                counters.rejected += 1
                log.warning("validator for %s raised %r: message rejected", topic, exc)
                return False
            return True

        assert self._pubsub is not None  # internal invariant: only called once pubsub exists
        self._pubsub.set_topic_validator(topic, validator, is_async_validator=False)

    # --- subscribe -------------------------------------------------------------------------------

    async def subscribe(self, topic: str) -> asyncio.Queue[GossipMessage]:
        """Join ``topic``; every validated message from others arrives on the returned queue.

        Subscribing twice returns the same queue. The trio side drains libp2p's 32-slot buffer
        continuously, so a slow reader never makes libp2p drop messages; the queue itself is bounded
        by ``max_inbox_bytes`` (overflow counted as dropped).
        """
        if topic in self._inboxes:
            return self._inboxes[topic]
        inbox = _Inbox()
        self._inboxes[topic] = inbox
        try:
            await self._call(self._subscribe, topic)
        except BaseException:
            del self._inboxes[topic]
            raise
        return inbox

    async def _subscribe(self, topic: str) -> None:
        assert self._pubsub is not None and self._nursery is not None  # set before _running
        sub = await self._pubsub.subscribe(topic)
        self._nursery.start_soon(self._drain_subscription, topic, sub)

    async def _drain_subscription(self, topic: str, sub: Any) -> None:
        pubsub = self._pubsub
        assert pubsub is not None
        loop = self._loop
        assert loop is not None
        while True:
            msg = await sub.get()
            if msg.from_id == self._my_id:
                continue  # libp2p hands a publisher its own messages; nobody here wants them
            item = GossipMessage(topic, bytes(msg.data), ID(msg.from_id).to_base58(), pubsub.get_message_id(msg).hex())
            loop.call_soon_threadsafe(self._deliver, item)

    def _deliver(self, item: GossipMessage) -> None:
        inbox = self._inboxes[item.topic]
        if inbox.nbytes + len(item.data) > self.config.max_inbox_bytes:
            self._counters.dropped_inbox += 1
            log.warning("inbox of %s full (%d bytes unread): message dropped", item.topic, inbox.nbytes)
            return
        inbox.put_nowait(item)
        self._counters.delivered += 1

    # --- publish / connect -----------------------------------------------------------------------

    async def publish(self, topic: str, data: bytes, *, skip_peers: frozenset[str] = frozenset()) -> None:
        """Publish ``data`` on ``topic``. Waits while a peer's outbound queue is near full.

        ``skip_peers``: base58 ids of peers that get no copy, mesh members included, and whose
        full queues are not waited for: the node names the trainers of its other runs when it
        publishes one run's weights (docs/gossip.md "Flood publishing")."""
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError("data must be bytes")
        if len(data) + 4096 > self.config.max_rpc_bytes:
            raise P2PError(f"message of {len(data)} bytes does not fit max_rpc_bytes {self.config.max_rpc_bytes}")
        await self._call(self._publish, topic, bytes(data), frozenset(skip_peers))
        self._counters.published += 1

    async def _publish(self, topic: str, data: bytes, skip_peers: frozenset[str] = frozenset()) -> None:
        pubsub, router = self._pubsub, self._router
        assert pubsub is not None and router is not None and self._publish_lock is not None
        # One publish at a time keeps publish order and makes the backpressure check meaningful.
        # router.publish_skip belongs to that one publish: it stays set until pubsub.publish
        # returns (py-libp2p runs _get_peers_to_send after awaits of its own), and relays, which
        # may run meanwhile on this thread, do not read it (their origin is another peer).
        async with self._publish_lock:
            deadline = trio.current_time() + self.config.publish_timeout_s
            while self._full_peers(pubsub, skip_peers) and trio.current_time() < deadline:
                await trio.sleep(_POLL_S)
            router.publish_skip = skip_peers
            try:
                await pubsub.publish(topic, data)
            finally:
                router.publish_skip = frozenset()

    def _full_peers(self, pubsub: Any, skip: frozenset[str] = frozenset()) -> list[Any]:
        """Peers whose outbound queue is at the high-water mark and that are still waited for.

        A peer that stays full for ``publish_timeout_s`` (it stopped reading: SIGSTOP, a dead link
        with the socket open, a malicious peer) is marked stalled and no longer waited for, so it
        delays publishing once instead of every later publish; its queue overflows (counted as
        dropped_outbound) until it reads again. It is waited for again once its queue is below
        half the mark (or it is gone)."""
        now = trio.current_time()
        queues = pubsub.peer_queues
        for peer in list(self._full_since):
            q = queues.get(peer)
            if q is None or queue_level(q) < 0.5:
                self._full_since.pop(peer, None)
                if peer in self._stalled:
                    self._stalled.discard(peer)
                    log.info("peer %s reads again; publishes wait for it again", peer)
        full = []
        for peer, q in queues.items():
            if queue_level(q) < 1.0 or peer in self._stalled or (skip and peer.to_base58() in skip):
                continue  # (a peer this publish skips: its queue is not this publish's to wait for)
            since = self._full_since.setdefault(peer, now)
            if now - since >= self.config.publish_timeout_s:
                self._stalled.add(peer)
                self._counters.stalled_peers += 1
                log.warning("peer %s stopped reading (outbound queue full for %.1f s): not waited for until it "
                            "drains", peer, now - since)
                continue
            full.append(peer)
        return full

    async def connect(self, addr: str) -> None:
        """Dial a full multiaddr (``.../p2p/<peer id>``) and wait for the pubsub stream."""
        await self._call(self._connect, addr)

    async def _connect(self, addr: str) -> None:
        assert self._host is not None and self._pubsub is not None
        info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        with trio.fail_after(self.config.connect_timeout_s):
            await self._host.connect(info)
            await self._pubsub.wait_for_peer(info.peer_id, timeout=self.config.connect_timeout_s)

    async def _watch_stalled_peers(self) -> None:
        """Run the stall check (``_full_peers``) even while this host publishes nothing, so a
        peer that stopped reading what this host only RELAYS to it is found and counted too
        (``stalled_peers`` missed it: the check ran only inside ``publish``)."""
        pubsub, lock = self._pubsub, self._publish_lock
        assert pubsub is not None and lock is not None  # both set before the nursery starts this
        interval = max(0.05, min(1.0, self.config.publish_timeout_s / 4))
        while True:
            await trio.sleep(interval)
            async with lock:  # publish runs the same check: one at a time
                self._full_peers(pubsub)

    async def _keep_bootstrap_connected(self) -> None:
        """Every ``redial_interval_s``, dial each bootstrap peer that has no pubsub stream.
        One warning when a peer is lost, one info line when it is back (no log flood)."""
        unreachable = self._unreachable
        pubsub = self._pubsub
        assert pubsub is not None
        # Every address parses: P2PConfig checked them (check_multiaddrs).
        targets = [(addr, info_from_p2p_addr(multiaddr.Multiaddr(addr)).peer_id) for addr in self.config.bootstrap]
        while True:
            await trio.sleep(self.config.redial_interval_s)
            for addr, peer_id in targets:
                if peer_id in pubsub.peers:
                    if addr in unreachable:  # back, dialed by libp2p's own auto-connector or by it
                        self._bootstrap_back(addr)
                    continue
                if addr not in unreachable:
                    log.warning("lost bootstrap peer %s; redialing every %.1f s", addr, self.config.redial_interval_s)
                    unreachable.add(addr)
                # py-libp2p's swarm refuses to dial a peer whose addresses all failed recently
                # (a "negative cache"); a configured bootstrap peer is retried on our schedule.
                self._host.get_network().unblock_peer(peer_id)
                try:
                    await self._connect(addr)
                except Exception as exc:  # noqa: BLE001 - still down; try again next time
                    log.debug("redial %s failed: %r", addr, exc)
                    continue
                self._bootstrap_back(addr)

    def _bootstrap_back(self, addr: str) -> None:
        self._unreachable.discard(addr)
        self._counters.reconnects += 1
        log.info("reconnected to bootstrap peer %s", addr)

    async def wait_for_peers(self, topic: str, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until ``count`` peers would receive our publishes on ``topic``: identified peers
        subscribed to it (own publishes flood to all of them, ``TunedGossipSub``). It waited for
        mesh members, which the heartbeat prunes to D = 6 past D_high: a wait for more peers
        than that could not return. Raises P2PError on timeout."""
        await self._call(self._wait_for_peers, topic, count, timeout)

    async def _wait_for_peers(self, topic: str, count: int, timeout: float) -> None:
        pubsub, router = self._pubsub, self._router
        assert pubsub is not None and router is not None
        with trio.move_on_after(timeout):
            while True:
                peers = [p for p in pubsub.peer_topics.get(topic, ()) if p in router.peer_protocol]
                if len(peers) >= count:
                    return
                await trio.sleep(0.01)
        raise P2PError(f"fewer than {count} peers on {topic} after {timeout} s")

    def connected_peers(self) -> tuple[str, ...]:
        """Base58 ids of peers with an open pubsub stream (a snapshot; safe from any thread)."""
        pubsub = self._pubsub
        return () if pubsub is None else tuple(p.to_base58() for p in list(pubsub.peers))

    # --- counters --------------------------------------------------------------------------------

    def _count_outbound_drop(self, n: int) -> None:
        self._counters.dropped_outbound += n

    def _count_reject(self) -> None:
        self._counters.rejected += 1

    def stats(self) -> dict[str, int]:
        """published, delivered, rejected, ignored, dropped (outbound + inbox), plus their parts,
        reconnects (bootstrap peers connected again after being lost or unreachable),
        bootstrap_unreachable (bootstrap peers without a stream at the last check) and
        stalled_peers (times a peer's queue stayed full past publish_timeout_s)."""
        c = self._counters
        return {
            "published": c.published,
            "delivered": c.delivered,
            "rejected": c.rejected,
            "ignored": c.ignored,
            "dropped": c.dropped_outbound + c.dropped_inbox,
            "dropped_outbound": c.dropped_outbound,
            "dropped_inbox": c.dropped_inbox,
            "reconnects": c.reconnects,
            "bootstrap_unreachable": len(self._unreachable),
            "stalled_peers": c.stalled_peers,
        }
