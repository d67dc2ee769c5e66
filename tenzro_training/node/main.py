"""The node process: ``tenzro node --data-dir D [--rpc-host H] [--rpc-port P] [--config F] [--dev]``.

What this module is: the entry point that loads the :class:`NodeConfig`, opens the RocksDB store,
builds the :class:`NodeService`, serves JSON-RPC and drives the service's clock (``tick``) until
SIGINT/SIGTERM/SIGHUP, then closes everything in order. Every service call (RPC and tick) runs on ONE
single-thread executor, because the service is synchronous and not thread-safe.

What it is NOT: protocol logic (the service and the pure core), JSON-RPC handling (``rpc/``) or a
supervisor (it does not restart itself; the store makes a restart on the same data dir lossless).

Process contract (tests and scripts rely on it):
- with ``--p2p-listen``, once the libp2p host listens (before the line below), one line on
  stdout: ``tenzro node p2p <multiaddr>`` (with ``/p2p/<peer id>``, what trainers bootstrap from);
- when the server is bound, one line on stdout: ``tenzro node listening on http://HOST:PORT
  (data dir D)``;
- SIGINT, SIGTERM or SIGHUP (unless started ignoring SIGHUP, as under ``nohup``): stop accepting,
  finish in-flight calls, close the service and the store, exit 0 (no traceback);
- SIGUSR1: a hot backup of the store under ``data_dir/backups`` (``node/backup.py``), one log
  line ``backup written to DIR in S s`` (or ``backup failed: ...``); the node goes on serving;
- under systemd (``$NOTIFY_SOCKET``): ``READY=1`` once the server listens, ``WATCHDOG=1`` while
  healthy when ``$WATCHDOG_USEC`` asks for it, ``STOPPING=1`` when it stops (``node/sdnotify.py``);
- a startup failure (unreadable or invalid config, a data dir that cannot be created or written,
  store locked by another node, a store written by a newer version, port in use) is one line on
  stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from tenzro_training import __version__, run_events
from tenzro_training.errors import TenzroError
from tenzro_training.logformat import RUN_EVENT_ATTR, configure_logging

__all__ = ["NodeStartupError", "TICK_INTERVAL_S", "format_event", "load_node_config", "run_node", "run_node_from_args"]

log = logging.getLogger("tenzro.node")

TICK_INTERVAL_S: Final = 0.1
"""Longest sleep between two ticks; the loop wakes earlier for a deadline due sooner."""
EXIT_STARTUP: Final = 2
EXIT_STORAGE: Final = 1
"""``tenzro node`` stopped (SIGINT/SIGTERM) but its store reported an error while closing."""
TICK_FAILURE_LOG_S: Final = 60.0
"""A tick failing the same way again is logged at most this often (it is retried every tick)."""
WATCHDOG_MIN_PERIOD_S: Final = 0.05
"""The shortest time between two WATCHDOG=1: a tiny WatchdogSec= must not make the loop spin."""
SERVICE_STALL_S: Final = 120.0
"""No tick finished on the service thread for this long: the health check says
``service_stalled``. A tick waits behind every call on that one thread; the slowest calls the
node makes (a finalize or a checkpoint hash of a 200M-parameter model) take seconds, so this
means a call is stuck, not slow (observability probe: ``GET /`` did not look at that thread)."""


class ServiceLiveness:
    """When the service thread last finished a tick (monotonic seconds), for the health check."""

    __slots__ = ("done_at",)

    def __init__(self) -> None:
        self.done_at = time.monotonic()

    def is_stalled(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) - self.done_at > SERVICE_STALL_S


class NodeStartupError(TenzroError):
    """The node cannot start (bad config, store unavailable, port taken); one line for stderr."""


MAX_CONFIG_BYTES = 16 << 20


def _read_config_file(path: str) -> dict[str, Any]:
    from storage.files import NotReadable, read_regular_file
    from tenzro_training.jsontext import is_json_depth_ok, refuse_json_constant, unique_keys_object

    try:
        raw = read_regular_file(path, MAX_CONFIG_BYTES)
    except NotReadable as exc:
        raise NodeStartupError(f"cannot read config {path}: {exc.reason}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise NodeStartupError(f"config {path} is not UTF-8 text") from None
    if not is_json_depth_ok(text):
        raise NodeStartupError(f"config {path}: JSON nested too deeply")
    try:
        obj = json.loads(text, object_pairs_hook=unique_keys_object, parse_constant=refuse_json_constant)
    except ValueError as exc:
        raise NodeStartupError(f"config {path} is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise NodeStartupError(f"config {path}: expected a JSON object")
    return obj


def load_node_config(
    data_dir: Path,
    *,
    config_file: str | None = None,
    dev: bool = False,
    rpc_host: str | None = None,
    rpc_port: int | None = None,
) -> Any:
    """The NodeConfig for these command-line options.

    Precedence, lowest first: NodeConfig defaults, the dev genesis (``--dev``), the config file,
    then ``--rpc-host``/``--rpc-port``. A config file replaces a dev value key by key (top-level
    keys; inside ``timings`` window by window), so a test config can set tiny timings and keep
    the dev accounts.
    """
    from tenzro_training.node.config import NodeConfig

    obj: dict[str, Any] = {}
    if dev:
        from tenzro_training.node.dev import dev_genesis

        kwargs, _ = dev_genesis(data_dir, write=False)
        obj = NodeConfig(data_dir=data_dir, **kwargs).to_dict()
    if config_file is not None:
        overrides = _read_config_file(config_file)
        has_timings = "timings" in overrides
        timings = overrides.pop("timings", None)
        obj.update(overrides)
        if isinstance(timings, dict) and isinstance(obj.get("timings"), dict):
            obj["timings"] = {**obj["timings"], **timings}  # a partial timings object keeps the rest
        elif has_timings:  # null, a list...: NodeConfig refuses it with the field's path
            obj["timings"] = timings
    where = f"config {config_file}" if config_file else "config"

    def build(values: dict[str, Any]) -> Any:
        try:
            return NodeConfig.from_dict(values, data_dir=data_dir)
        except (TenzroError, ValueError, TypeError, KeyError) as exc:
            raise NodeStartupError(f"{where}: {exc}") from None

    flags = {k: v for k, v in (("rpc_host", rpc_host), ("rpc_port", rpc_port)) if v is not None}
    if config_file is not None and flags.keys() & overrides.keys():
        # The file is checked as written, even where a flag replaces a value: a malformed
        # rpc_port would otherwise pass unnoticed until the first start without the flag.
        build(obj)
    return build({**obj, **flags})


def dev_accounts_document(config: Any) -> dict[str, Any]:
    """What ``tenzro node --dev`` writes to ``<data-dir>/dev-accounts.json``: the dev accounts,
    with the chain id the node signs under (a config file may set another than the dev one;
    clients read it from there). :func:`run_node` writes it once the store has accepted that
    chain id."""
    from tenzro_training.node.dev import dev_genesis

    _, document = dev_genesis(config.data_dir, write=False)
    return {**document, "chain_id": config.chain_id}


def _tick(service: Any) -> int | None:
    """One clock step on the executor thread: apply due deadlines, return the next one."""
    service.tick()
    return service.next_deadline_ms()


async def _tick_forever(
    service: Any, executor: ThreadPoolExecutor, metrics: Any, liveness: ServiceLiveness | None = None
) -> None:
    loop = asyncio.get_running_loop()
    last_failure, last_logged, repeats = "", 0.0, 0
    while True:
        try:
            deadline = await loop.run_in_executor(executor, _tick, service)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failing tick must not kill the node; it is retried
            if liveness is not None:
                liveness.done_at = time.monotonic()  # failing, but the thread answers
            metrics.tick_failures.inc()
            deadline = None
            # Logged with its traceback when new, then at most every TICK_FAILURE_LOG_S: a store
            # that refuses writes (a full disk) failed every tick, 10 tracebacks a second into
            # a log on that same disk (storage fault probe).
            failure, now = f"{type(exc).__name__}: {exc}", time.monotonic()
            if failure != last_failure:
                log.exception("tick failed")
                last_failure, last_logged, repeats = failure, now, 0
            elif now - last_logged >= TICK_FAILURE_LOG_S:
                log.error("tick failed %d more times in %.0f s: %s", repeats + 1, now - last_logged, failure)
                last_logged, repeats = now, 0
            else:
                repeats += 1
        else:
            if liveness is not None:
                liveness.done_at = time.monotonic()
            if last_failure:
                log.info("tick works again")
                last_failure = ""
        delay = TICK_INTERVAL_S
        if deadline is not None:
            # A deadline fires once time is PAST it: wake 1 ms after it.
            delay = min(delay, max(0.0, (deadline + 1 - time.time() * 1000) / 1000))
        await asyncio.sleep(delay)


def _format_value(value: Any) -> str:
    from tenzro_training.addresses import format_address

    if isinstance(value, bytes):
        return format_address(value) if len(value) == 20 else "0x" + value.hex()
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_format_value(v) for v in value) + ")"
    return str(value)


def format_event(event: Any) -> str:
    """One log line for a run event: its class and fields, byte strings as hex/EIP-55."""
    import dataclasses

    if not dataclasses.is_dataclass(event):
        return str(event)
    fields = " ".join(f"{f.name}={_format_value(getattr(event, f.name))}" for f in dataclasses.fields(event))
    return f"{type(event).__name__} {fields}"


_WARNING_EVENTS: Final = (
    run_events.EquivocationDetected, run_events.TrainerSlashed, run_events.SyncerFailover,
    run_events.QuorumLost, run_events.RunFailed,
)
"""Run events an operator must look at (a stake burned, a syncer silent, a run lost): WARNING, so a
node run or alerted at WARNING still shows them (observability probe); every other event is INFO."""


def _log_event(event: Any) -> None:
    level = logging.WARNING if isinstance(event, _WARNING_EVENTS) else logging.INFO
    log.log(level, "%s", format_event(event), extra={RUN_EVENT_ATTR: event})


def _p2p_config(p2p: dict[str, Any], data_dir: Path) -> Any:
    """The libp2p host's config from the command line's p2p options, checked (the multiaddrs
    parse) before the store is opened: a typo must not leave a store created and bound."""
    from tenzro_training.p2p.host import P2PConfig

    key_path = Path(p2p.get("key") or data_dir / "p2p-key")
    try:
        return P2PConfig(key_path=key_path, listen=tuple(p2p["listen"]), bootstrap=tuple(p2p.get("bootstrap") or ()))
    except (TenzroError, ValueError) as exc:
        raise NodeStartupError(str(exc)) from None


async def _start_p2p(p2p_config: Any, service: Any, config: Any, executor: Any) -> tuple[Any, Any]:
    """Start the libp2p host and the gossip bridge (``node/gossip_bridge.py``)."""
    from tenzro_training.node.gossip_bridge import GossipBridge
    from tenzro_training.p2p.host import P2PHost

    host = P2PHost(p2p_config)
    try:
        try:
            await host.start()
        except (TenzroError, OSError) as exc:
            raise NodeStartupError(f"cannot start libp2p on {', '.join(p2p_config.listen)}: {exc}") from None
        loop = asyncio.get_running_loop()
        bridge = GossipBridge(
            service, host, lambda fn: loop.run_in_executor(executor, fn), chain_id=config.chain_id,
            get_candidate=config.get_candidate, max_payload_bytes=config.max_payload_bytes,
        )
        try:
            await bridge.start()
        except BaseException:
            await bridge.stop()
            raise
    except BaseException:
        # run_node only stops what _start_p2p returned: a failed (or cancelled) start closes the
        # host here, else its trio thread and listening socket outlive the node's startup error.
        await host.stop()
        raise
    return host, bridge


def _stop_signals() -> tuple[signal.Signals, ...]:
    """The signals that shut the node down cleanly (exit 0): SIGINT, SIGTERM and SIGHUP (a node
    started from a terminal that closed died at once, exit 129, without closing the store: ops
    probe), but not SIGHUP when the process was started ignoring it (``nohup``): that operator
    asked for the node to outlive the session, and a handler would override it (review)."""
    hangup = () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)
    return (signal.SIGINT, signal.SIGTERM, *hangup)


def _bind_probes(host: str, port: int, held: list[Any] | None) -> None:
    """Bind ``host``:``port`` as asyncio's ``create_server`` (aiohttp) and trio's
    ``open_tcp_listeners`` (libp2p) do, so the pre-flight refuses nothing that would have
    started: SO_REUSEADDR, IPV6_V6ONLY on IPv6 sockets (``::`` beside a listener on
    ``0.0.0.0``), an address family the kernel lacks skipped (review). With ``held`` the sockets
    also listen and are kept open there, so that the node's own listeners are checked against
    each other too (a p2p port equal to the RPC port); the caller closes them. Raises OSError."""
    import socket

    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    bound = 0
    for family, kind, proto, _name, address in infos:
        try:
            probe = socket.socket(family, kind, proto)
        except OSError:
            continue
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == getattr(socket, "AF_INET6", None) and hasattr(socket, "IPPROTO_IPV6"):
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            probe.bind(address)
            if held is not None:
                probe.listen(1)  # two bound sockets with SO_REUSEADDR clash only once one listens
        except BaseException:
            probe.close()
            raise
        if held is None:
            probe.close()
        else:
            held.append(probe)
        bound += 1
    if not bound:
        raise OSError("no address it resolves to can be bound")


def _check_rpc_address(host: str, port: int, held: list[Any] | None = None) -> None:
    """Fail with one line when the JSON-RPC address cannot be bound, BEFORE the store is opened:
    a first start that failed on its port had already created the store and bound it to that
    start's genesis and chain id (ops probe). A pre-flight bind (:func:`_bind_probes`): racy
    against another process taking the port in between, which the real bind still reports."""
    shown = f"[{host}]" if ":" in host else host
    try:
        _bind_probes(host, port, held)
    except OSError as exc:
        raise NodeStartupError(f"cannot listen on {shown}:{port}: {exc.strerror or exc}") from None


def _check_p2p_listen(listen: tuple[str, ...], held: list[Any]) -> None:
    """The same pre-flight for each ``--p2p-listen`` address with an IP and a fixed TCP port, made
    while the RPC probes are ``held``: a taken p2p port (or the RPC port given again) had been
    found only when libp2p started, after the store was created and bound (ops probe). An address
    with port 0 is left to libp2p. Each address starts with /ip4/ or /ip6/: P2PConfig refused any
    other (``check_multiaddrs``)."""
    import multiaddr

    for addr in listen:
        parsed = multiaddr.Multiaddr(addr)
        names = [p.name for p in parsed.protocols()]
        ip = names[0]
        if "tcp" not in names or int(parsed.value_for_protocol("tcp")) == 0:
            continue
        try:
            _bind_probes(parsed.value_for_protocol(ip), int(parsed.value_for_protocol("tcp")), held)
        except OSError as exc:
            raise NodeStartupError(f"cannot start libp2p on {addr}: {exc.strerror or exc}") from None


def _make_data_dir(data_dir: Path) -> None:
    """Create the data directory (and its parents) or fail with one line."""
    if data_dir.exists() and not data_dir.is_dir():
        raise NodeStartupError(f"data dir {data_dir} exists and is not a directory")
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise NodeStartupError(f"cannot create data dir {data_dir}: {exc.strerror or exc}") from None


def _raise_open_file_limit(connections: int) -> None:
    """Raise the soft open-file limit to the hard one (at most 65536): the store's SST files,
    the p2p host and ``connections`` JSON-RPC connections share it, and the usual soft default
    of 1024 is what a client holding connections exhausted first (RPC concurrency probe).
    A limit still below ``connections`` + 256 is logged: raise the hard one (``ulimit -Hn``,
    systemd ``LimitNOFILE``)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, want, exc)
    if soft != resource.RLIM_INFINITY and soft < connections + 256:
        log.warning("open-file limit %d leaves little room beside rpc_max_connections=%d: raise it, or lower "
                    "rpc_max_connections", soft, connections)


class _LoopErrorLog:
    """The event loop's exception handler: the same message is logged at most once per
    ``INTERVAL_S`` (with how many were held back). Why: a failing accept is reported by asyncio
    once per attempt, with a traceback; out of file descriptors, that was megabytes a second
    into the log (RPC concurrency probe), as a failing disk was before (docs/node.md)."""

    INTERVAL_S = 10.0

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}

    def handle(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", "unhandled exception in the event loop"))
        now = time.monotonic()
        last, held = self._last.get(message, (-1e18, 0))
        if now - last < self.INTERVAL_S:
            self._last[message] = (last, held + 1)
            return
        if len(self._last) > 256:
            self._last.clear()
        self._last[message] = (now, 0)
        if held:
            context = {**context, "message": f"{message} ({held} more like it in the last {now - last:.0f} s)"}
        loop.default_exception_handler(context)


async def run_node(
    config: Any, data_dir: Path, *, announce: Any = print, p2p: dict[str, Any] | None = None,
    dev_accounts: dict[str, Any] | None = None,
) -> None:
    """Open the store, serve until SIGINT/SIGTERM, then close everything. Startup failures raise
    NodeStartupError before anything is served. ``p2p`` (``listen``, ``key``, ``bootstrap``)
    turns on gossip. ``dev_accounts`` (:func:`dev_accounts_document`) is written to
    ``<data_dir>/dev-accounts.json``: checked writable before the store is opened, put in place
    only once the store has accepted the config's chain id and genesis (a refused start had
    left the file naming a chain id the store was not created for: ops probe)."""
    p2p_config = _p2p_config(p2p, data_dir) if p2p else None
    probes: list[Any] = []
    try:
        _check_rpc_address(config.rpc_host, config.rpc_port, probes)
        if p2p_config is not None:
            _check_p2p_listen(p2p_config.listen, probes)
    finally:
        for probe in probes:
            probe.close()
    for line in config.advice():  # valid settings that work against each other (docs/node.md)
        log.warning("config: %s", line)
    _make_data_dir(data_dir)
    staged = None if dev_accounts is None else _stage_dev_accounts(data_dir, dev_accounts)
    try:
        await _serve(config, data_dir, announce, p2p_config, staged)
    finally:
        if staged is not None:
            staged.discard()


def _stage_dev_accounts(data_dir: Path, document: dict[str, Any]) -> Any:
    from tenzro_training.node.dev import DEV_ACCOUNTS_FILE, StagedDevAccounts

    try:
        return StagedDevAccounts(data_dir, document)
    except OSError as exc:
        raise NodeStartupError(f"cannot write {data_dir / DEV_ACCOUNTS_FILE}: {exc.strerror or exc}") from None


async def _serve(config: Any, data_dir: Path, announce: Any, p2p_config: Any, staged: Any) -> None:
    """run_node once the pre-flight checks passed: the store, the service, the listeners."""
    from rpc.metrics import Registry
    from rpc.server import start_server
    from storage import open_store
    from storage.interface import StorageError
    from tenzro_training.node.metrics import NodeMetrics, register_gossip_metrics
    from tenzro_training.node.sdnotify import SystemdNotifier
    from tenzro_training.node.service import NodeService

    began = time.monotonic()
    _raise_open_file_limit(config.rpc_max_connections)
    asyncio.get_running_loop().set_exception_handler(_LoopErrorLog().handle)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tenzro-node")
    store: Any = None
    service: Any = None
    server: Any = None
    tick_task: asyncio.Task[None] | None = None
    watchdog_task: asyncio.Task[None] | None = None
    systemd = SystemdNotifier()
    host: Any = None
    bridge: Any = None
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    stop_signals: tuple[signal.Signals, ...] = ()
    backups: set[asyncio.Task[None]] = set()  # SIGUSR1's, held until done (the loop keeps weak references)
    liveness = ServiceLiveness()

    def start_backup() -> None:
        if stop.is_set():  # asked for with the stop signal, run after it: the node is stopping
            log.warning(_BACKUP_WHILE_STOPPING)
            return
        if service is None or server is None:
            log.warning(_BACKUP_WHILE_STARTING)
            return
        task = asyncio.create_task(_backup(service, executor, data_dir / "backups"), name="tenzro-backup")
        backups.add(task)
        task.add_done_callback(backups.discard)

    if hasattr(signal, "SIGUSR1"):  # before the store opens: no signal of ours ends the process with it open
        # A Python-level handler, not the loop's: the loop's remove_signal_handler puts the
        # default action (the end of the process) back before the refusal below could replace
        # it, and a SIGUSR1 in that gap killed a stopping node (review). signal.signal swaps
        # one handler for the other in one step.
        signal.signal(signal.SIGUSR1, lambda signum, frame: loop.call_soon_threadsafe(start_backup))
    try:
        systemd.status("opening the store")
        try:
            # An older store is marked for this version by the service, once it accepted the store.
            store = open_store(data_dir / "db", sync=bool(config.sync_writes), wal_recovery=config.wal_recovery,
                               upgrade_schema=False, external_value_bytes=config.external_value_bytes)
        except StorageError as exc:
            raise NodeStartupError(str(exc)) from None
        systemd.status("reading the store's runs")
        try:
            # Built on the executor thread: the service may bind state to the thread that made it.
            service = await loop.run_in_executor(executor, lambda: NodeService(config, store))
            # Before anything can call it: the time the node was down is a pause, not a deadline
            # missed (NodeService.start_clock).
            start_events = await loop.run_in_executor(executor, service.start_clock)
            for event in start_events:
                _log_event(event)
        except TenzroError as exc:
            raise NodeStartupError(f"cannot start the node service: {exc}") from None
        if staged is not None:  # the store took this config's chain id and genesis
            try:
                staged.publish()
            except OSError as exc:
                raise NodeStartupError(f"cannot write {staged.path}: {exc.strerror or exc}") from None
        registry = Registry()
        metrics = NodeMetrics(registry, chain_id=config.chain_id)
        metrics.attach(service)
        for event in start_events:  # committed before the registry existed: counted here (observability probe)
            metrics.on_event(event)
        listeners = [_log_event, metrics.on_event]
        if p2p_config is not None:
            host, bridge = await _start_p2p(p2p_config, service, config, executor)
            register_gossip_metrics(registry, host, bridge)
            listeners.append(bridge.on_event)
            announce(f"tenzro node p2p {host.addrs[0]}")

        def _on_event(event: Any) -> None:
            for listener in listeners:
                try:
                    listener(event)
                except Exception:  # one listener's bug must not starve the others
                    log.exception("event listener %r failed for %s", listener, type(event).__name__)

        service.on_event = _on_event
        try:
            server = await start_server(
                service, config.rpc_host, config.rpc_port, max_body_bytes=config.max_body_bytes,
                max_batch=config.rpc_max_batch, executor=executor, metrics=registry,
                health_check=lambda: _health(service, liveness),
                limits=config.server_limits(), serve_artifacts=config.serve_artifacts,
            )
        except OSError as exc:
            raise NodeStartupError(
                f"cannot listen on {config.rpc_host}:{config.rpc_port}: {exc.strerror or exc}"
            ) from None
        for sig in _stop_signals():
            loop.add_signal_handler(sig, stop.set)
            stop_signals += (sig,)
        liveness.done_at = time.monotonic()  # the start, however long, is no stall
        tick_task = asyncio.create_task(_tick_forever(service, executor, metrics, liveness), name="tenzro-tick")
        runs = service.count_runs_by_status()
        # One line an operator can check a deployment against (ops probe: nothing said which
        # chain, store or settings a node came up with).
        log.info("tenzro node %s up: chain_id=%d data_dir=%s runs=%d (%s) sync_writes=%s prune_payloads=%s "
                 "allowed_checkpoint_dirs=%d p2p=%s start=%.2fs", __version__, config.chain_id, data_dir, sum(runs.values()),
                 ", ".join(f"{n} {status}" for status, n in sorted(runs.items())) or "none", config.sync_writes,
                 config.prune_payloads, len(config.allowed_checkpoint_dirs), "on" if p2p_config is not None else "off",
                 time.monotonic() - began)
        host_text = f"[{server.host}]" if ":" in server.host else server.host  # IPv6: RFC 3986 brackets
        announce(f"tenzro node listening on http://{host_text}:{server.port} (data dir {data_dir})")
        systemd.ready(f"listening on http://{host_text}:{server.port}, {sum(runs.values())} runs")
        if systemd.watchdog_s is not None:
            watchdog_task = asyncio.create_task(
                _watchdog_forever(systemd, lambda: _health(service, liveness) is None), name="tenzro-watchdog")
        await stop.wait()
        log.info("shutting down")
    finally:
        if hasattr(signal, "SIGUSR1"):
            # A backup asked for while the node stops: refused, not a kill (never SIG_DFL between).
            signal.signal(signal.SIGUSR1, _refuse_backup_while_stopping)
        systemd.stopping()
        for sig in stop_signals:
            loop.remove_signal_handler(sig)
        for task in (tick_task, watchdog_task):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        if backups:  # a backup under way finishes (on the executor) before the store closes
            await asyncio.gather(*backups, return_exceptions=True)
        if server is not None:
            await server.close()  # stops accepting, lets in-flight calls finish
        if bridge is not None:
            await bridge.stop()
        if host is not None:
            await host.stop()
        # Whatever still runs on the executor (a tick) finishes before the service closes.
        await asyncio.to_thread(executor.shutdown, True)
        if service is not None:
            service.close()
        if store is not None:
            store.close()
        systemd.close()


_BACKUP_WHILE_STARTING: Final = "backup refused: the node is still starting (send SIGUSR1 once it listens)"
_BACKUP_WHILE_STOPPING: Final = "backup refused: the node is shutting down"


def _refuse_backup_while_starting(signum: int, frame: Any) -> None:
    """SIGUSR1 from the node's first step until the backup handler takes the signal over, just
    before the store opens: its default action ended the process (backup probe), harmless before
    the store opens but a surprise to a backup job that fires while a node restarts."""
    log.warning(_BACKUP_WHILE_STARTING)


def _refuse_backup_while_stopping(signum: int, frame: Any) -> None:
    """SIGUSR1 once the node is stopping: it replaces the backup handler in one step, so the
    signal's default action (the end of the process with signal 10) is never in place between."""
    log.warning(_BACKUP_WHILE_STOPPING)


def _health(service: Any, liveness: ServiceLiveness) -> str | None:
    """``GET /``'s reason for a 503, or None: a store that refused a write (it refuses every write
    until reopened), or a service thread that finished no tick for ``SERVICE_STALL_S``."""
    if service.storage_failure is not None:
        return "storage_write_failed"
    return "service_stalled" if liveness.is_stalled() else None


async def _watchdog_forever(systemd: Any, healthy: Callable[[], bool]) -> None:
    """WATCHDOG=1 twice per ``WatchdogSec=`` while the health check would answer 200: a node
    whose service thread stalled, or whose store refuses writes until reopened, stops sending
    it, and systemd restarts it (``node/sdnotify.py``)."""
    while True:
        if healthy():
            systemd.watchdog()
        await asyncio.sleep(max(systemd.watchdog_s / 2, WATCHDOG_MIN_PERIOD_S))


async def _backup(service: Any, executor: ThreadPoolExecutor, root: Path) -> None:
    """SIGUSR1: a hot backup of the store under ``root`` (``node/backup.py``), run on the service
    executor like every call, so it falls between two of them. One line says where, or why not;
    a failed backup changes nothing else (the node goes on serving)."""
    started = time.monotonic()
    try:
        path = await asyncio.get_running_loop().run_in_executor(executor, service.backup, root)
    except TenzroError as exc:
        log.error("backup failed: %s", exc)
        return
    except Exception:  # a bug: said, and the node goes on
        log.exception("backup failed")
        return
    log.info("backup written to %s in %.2f s", path, time.monotonic() - started)


def run_node_from_args(args: argparse.Namespace) -> None:
    """``tenzro node``: returns after a clean shutdown; raises CliError(exit 2) at startup."""
    from storage.interface import StorageError
    from tenzro_training.cli.exits import CliError

    configure_logging(getattr(args, "log_level", None) or "INFO", getattr(args, "log_format", None) or "text")
    if hasattr(signal, "SIGUSR1"):
        signal.signal(signal.SIGUSR1, _refuse_backup_while_starting)
    data_dir = Path(args.data_dir).resolve()
    try:
        config = load_node_config(
            data_dir,
            config_file=args.config,
            dev=bool(args.dev),
            rpc_host=args.rpc_host,
            rpc_port=args.rpc_port,
        )
        p2p = None
        if getattr(args, "p2p_listen", None):
            p2p = {"listen": args.p2p_listen, "key": args.p2p_key, "bootstrap": args.bootstrap or []}
        asyncio.run(run_node(config, data_dir, announce=lambda line: print(line, flush=True), p2p=p2p,
                             dev_accounts=dev_accounts_document(config) if args.dev else None))
    except NodeStartupError as exc:
        raise CliError(str(exc), EXIT_STARTUP) from None
    except StorageError as exc:
        # Raised by the store's close after a write failed (a full disk): RocksDB keeps the
        # error until reopened. Acknowledged batches are in its write-ahead log.
        raise CliError(f"the node stopped with a storage error: {exc}; acknowledged writes are in the "
                       f"write-ahead log and are recovered at the next start", EXIT_STORAGE) from None
    finally:
        # The process ends next, and Python's teardown puts SIGUSR1's default action (the end of
        # the process) back in place of a handler: ignored instead, so a late one is no kill.
        if hasattr(signal, "SIGUSR1") and signal.getsignal(signal.SIGUSR1) in (_refuse_backup_while_starting,
                                                                               _refuse_backup_while_stopping):
            try:
                signal.signal(signal.SIGUSR1, signal.SIG_IGN)
            except OSError:
                # "Signal 10 ignored due to race condition": one arrived just before the swap and
                # CPython, having set SIG_IGN already, reports it dropped, which is what we want
                # (review: a traceback at exit in ~1 of 10 stops under a SIGUSR1 flood).
                pass
