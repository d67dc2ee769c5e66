"""node/main.py's clock loop: a tick that keeps failing the same way is logged once, not ten
times a second (a store refusing writes on a full disk did that; storage fault probe)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from rpc.metrics import Registry
from storage.interface import StorageError
from tenzro_training.node.main import _tick_forever
from tenzro_training.node.metrics import NodeMetrics


class FailingService:
    def __init__(self, failures: int) -> None:
        self.calls = 0
        self.failures = failures

    def tick(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise StorageError("write to '/d/db' failed: IO error: No space left on device")

    def next_deadline_ms(self) -> None:
        return None


def test_a_tick_failing_the_same_way_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    service = FailingService(failures=5)
    metrics = NodeMetrics(Registry(), chain_id=1337)

    async def run() -> None:
        executor = ThreadPoolExecutor(max_workers=1)
        task = asyncio.create_task(_tick_forever(service, executor, metrics))
        while service.calls < 8:  # five failures, then ticks that work
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        executor.shutdown(wait=True)

    with caplog.at_level(logging.INFO, logger="tenzro.node"):
        asyncio.run(run())
    messages = [r.getMessage() for r in caplog.records if r.name == "tenzro.node"]
    assert messages.count("tick failed") == 1 and "tick works again" in messages
    assert metrics.tick_failures.get() == 5


def test_event_loop_errors_are_logged_at_a_bounded_rate(caplog: pytest.LogCaptureFixture) -> None:
    """Out of file descriptors, asyncio reported every failed accept with a traceback:
    30-44 MB of log in 25 s (RPC concurrency probe)."""
    import asyncio
    import logging

    from tenzro_training.node.main import _LoopErrorLog

    handler = _LoopErrorLog()
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            for _ in range(1000):
                handler.handle(loop, {"message": "socket.accept() out of system resource", "exception": OSError(24, "x")})
            handler.handle(loop, {"message": "another"})
            assert [r.getMessage() for r in caplog.records] == ["socket.accept() out of system resource", "another"]
            handler._last["socket.accept() out of system resource"] = (-1e18, 999)  # the interval has passed
            handler.handle(loop, {"message": "socket.accept() out of system resource"})
            assert "(999 more like it" in caplog.records[-1].getMessage()
    finally:
        loop.close()


def test_the_open_file_limit_is_raised_to_the_hard_one() -> None:
    import resource

    from tenzro_training.node.main import _raise_open_file_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        _raise_open_file_limit(512)
        want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == want
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_sighup_stops_the_node_unless_it_was_started_ignoring_it() -> None:
    """A closed terminal's SIGHUP shuts the node down cleanly (it died at once, exit 129: ops
    probe); under nohup (SIGHUP ignored at start) the node must outlive the session (review)."""
    import signal

    from tenzro_training.node.main import _stop_signals

    before = signal.getsignal(signal.SIGHUP)
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        assert _stop_signals() == (signal.SIGINT, signal.SIGTERM)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        assert _stop_signals() == (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_taken_rpc_port_is_refused_before_the_store_is_created(tmp_path: Path) -> None:
    """A first start that failed on its port had created the store and bound it to that
    start's genesis and chain id (ops probe): the address is checked first."""
    import asyncio
    import socket

    from tenzro_training.node.config import NodeConfig
    from tenzro_training.node.main import NodeStartupError, run_node

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = NodeConfig(data_dir=tmp_path / "d", rpc_port=port)
        with pytest.raises(NodeStartupError, match=f"cannot listen on 127.0.0.1:{port}"):
            asyncio.run(run_node(config, tmp_path / "d", announce=lambda line: None))
    with pytest.raises(NodeStartupError, match="cannot listen on no-such-host.invalid"):
        asyncio.run(run_node(NodeConfig(data_dir=tmp_path / "e", rpc_host="no-such-host.invalid"), tmp_path / "e",
                             announce=lambda line: None))
    assert not (tmp_path / "d").exists() and not (tmp_path / "e").exists()


def test_the_rpc_preflight_binds_as_the_server_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """An address family the kernel lacks is skipped (localhost -> ::1 on a kernel without IPv6
    had been refused although asyncio binds 127.0.0.1), IPv6 sockets are V6ONLY (``::`` beside
    a listener on 0.0.0.0), and a family that binds nothing at all is refused (review)."""
    import socket

    from tenzro_training.node.main import NodeStartupError, _check_rpc_address

    real_socket = socket.socket
    made: list[tuple[int, int]] = []

    class Recording(real_socket):  # type: ignore[misc, valid-type]
        def __init__(self, family: int = -1, *args: object, **kwargs: object) -> None:
            if family == socket.AF_INET6:
                raise OSError(97, "Address family not supported by protocol")
            super().__init__(family, *args, **kwargs)  # type: ignore[arg-type]
            made.append((family, 0))

    both = [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: both)
    monkeypatch.setattr(socket, "socket", Recording)
    _check_rpc_address("localhost", 0)
    assert made == [(socket.AF_INET, 0)]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: both[:1])
    with pytest.raises(NodeStartupError, match=r"cannot listen on localhost:0: no address .* can be bound"):
        _check_rpc_address("localhost", 0)
    monkeypatch.setattr(socket, "socket", real_socket)
    options: list[tuple[int, int, int]] = []

    class Options(real_socket):  # type: ignore[misc, valid-type]
        def setsockopt(self, level: int, name: int, value: int) -> None:  # type: ignore[override]
            options.append((level, name, value))
            super().setsockopt(level, name, value)

    if socket.has_ipv6:
        monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: both[:1])
        monkeypatch.setattr(socket, "socket", Options)
        try:
            _check_rpc_address("::1", 0)
        except NodeStartupError:
            pass  # IPv6 present in Python but not in this kernel: the option was still set first
        assert (socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1) in options


def test_an_invalid_p2p_listen_address_is_refused_before_the_store_is_created(tmp_path: Path) -> None:
    """A typo in --p2p-listen had been found after the store was created and bound to this
    start's genesis and chain id (review of the operator fixes)."""
    from tenzro_training.node.config import NodeConfig
    from tenzro_training.node.main import NodeStartupError, run_node

    config = NodeConfig(data_dir=tmp_path / "d", rpc_port=0)
    with pytest.raises(NodeStartupError, match="not-a-multiaddr"):
        asyncio.run(run_node(config, tmp_path / "d", announce=lambda line: None, p2p={"listen": ["not-a-multiaddr"]}))
    assert not (tmp_path / "d").exists()


def test_a_taken_p2p_port_is_refused_before_the_store_is_created(tmp_path: Path) -> None:
    """A taken --p2p-listen port had been found only when libp2p started, after the store was
    created and bound to this start's genesis and chain id (ops probe); so was the RPC port
    given again as the p2p port, since each pre-flight bind was closed before the next."""
    import socket

    from tenzro_training.node.config import NodeConfig
    from tenzro_training.node.main import NodeStartupError, run_node

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = NodeConfig(data_dir=tmp_path / "d", rpc_port=0)
        listen = [f"/ip4/127.0.0.1/tcp/{port}"]
        with pytest.raises(NodeStartupError, match=f"cannot start libp2p on /ip4/127.0.0.1/tcp/{port}: Address already in use"):
            asyncio.run(run_node(config, tmp_path / "d", announce=lambda line: None, p2p={"listen": listen}))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    config = NodeConfig(data_dir=tmp_path / "e", rpc_port=port)
    for listen in ([f"/ip4/127.0.0.1/tcp/{port}"], [f"/ip4/0.0.0.0/tcp/{port}"]):
        with pytest.raises(NodeStartupError, match=f"cannot start libp2p on {listen[0]}: Address already in use"):
            asyncio.run(run_node(config, tmp_path / "e", announce=lambda line: None, p2p={"listen": listen}))
    assert not (tmp_path / "d").exists() and not (tmp_path / "e").exists()


def test_run_events_of_the_start_are_counted_in_the_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The events ``start_clock`` commits (DeadlinesExtended: the node was down, every open
    run's deadlines moved) were logged but never reached ``tenzro_run_events_total``, which was
    created after them: an alert on restarts that moved deadlines never fired (observability
    probe)."""
    import os
    import signal
    import urllib.request

    from tenzro_training.node.config import NodeConfig
    from tenzro_training.node.main import run_node
    from tenzro_training.node.service import NodeService
    from tenzro_training.run_events import DeadlinesExtended

    event = DeadlinesExtended("t", 2, 1, 1)
    monkeypatch.setattr(NodeService, "start_clock", lambda self: (event,))
    scraped: list[str] = []

    def announce(line: str) -> None:
        if "listening on" in line:
            url = line.split(" on ", 1)[1].split(" ", 1)[0]
            loop = asyncio.get_running_loop()

            def scrape() -> None:
                scraped.append(urllib.request.urlopen(url + "/metrics", timeout=10).read().decode())
                os.kill(os.getpid(), signal.SIGTERM)

            loop.run_in_executor(None, scrape)

    asyncio.run(run_node(NodeConfig(data_dir=tmp_path / "d", rpc_port=0), tmp_path / "d", announce=announce))
    assert 'tenzro_run_events_total{event="DeadlinesExtended"} 1' in scraped[0].splitlines()


@pytest.mark.parametrize("serve_artifacts", [True, False])
def test_the_node_serves_artifacts_as_its_config_says(tmp_path: Path, serve_artifacts: bool) -> None:
    """``serve_artifacts`` reaches the server: on, an artifact path of an unknown task is the
    node's UnknownTask (1301); off, it is no route at all (-32600, as any unknown path)."""
    import json
    import os
    import signal
    import urllib.error
    import urllib.request

    from tenzro_training.node.config import NodeConfig
    from tenzro_training.node.main import run_node

    answers: list[tuple[int, dict[str, object]]] = []

    def announce(line: str) -> None:
        if "listening on" in line:
            url = line.split(" on ", 1)[1].split(" ", 1)[0]

            def fetch() -> None:
                try:
                    urllib.request.urlopen(url + "/artifacts/v1/runs/nope/model", timeout=10)
                except urllib.error.HTTPError as exc:
                    answers.append((exc.code, json.loads(exc.read())))
                finally:
                    os.kill(os.getpid(), signal.SIGTERM)

            asyncio.get_running_loop().run_in_executor(None, fetch)

    config = NodeConfig(data_dir=tmp_path / "d", rpc_port=0, serve_artifacts=serve_artifacts)
    asyncio.run(run_node(config, tmp_path / "d", announce=announce))
    status, body = answers[0]
    assert status == 404
    assert body["error"]["code"] == (1301 if serve_artifacts else -32600)  # type: ignore[index]


def test_the_health_check_names_a_stalled_service_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """``GET /`` answered 200 whatever the service thread did (observability probe): a call stuck
    on it stopped every tick and every other call. A tick that finishes, even failing, is life."""
    import threading

    import tenzro_training.node.main as main_module
    from tenzro_training.node.main import ServiceLiveness, _health

    class Service:
        storage_failure: str | None = None

        def __init__(self) -> None:
            self.release = threading.Event()
            self.calls = 0

        def tick(self) -> None:
            self.calls += 1
            if self.calls == 3:
                self.release.wait(10)  # a call stuck on the thread
            if self.calls == 5:
                raise StorageError("a failing tick is still a thread that answers")

        def next_deadline_ms(self) -> None:
            return None

    monkeypatch.setattr(main_module, "SERVICE_STALL_S", 0.3)
    service, liveness = Service(), ServiceLiveness()
    metrics = NodeMetrics(Registry(), chain_id=1337)
    seen: list[str | None] = []

    async def run() -> None:
        executor = ThreadPoolExecutor(max_workers=1)
        task = asyncio.create_task(_tick_forever(service, executor, metrics, liveness))
        while service.calls < 3:
            await asyncio.sleep(0.01)
        seen.append(_health(service, liveness))  # just stuck: not yet a stall
        await asyncio.sleep(0.5)
        seen.append(_health(service, liveness))
        service.release.set()
        while service.calls < 6:
            await asyncio.sleep(0.01)
        seen.append(_health(service, liveness))
        service.storage_failure = "write failed"
        seen.append(_health(service, liveness))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        executor.shutdown(wait=True)

    asyncio.run(run())
    assert seen == [None, "service_stalled", None, "storage_write_failed"]


def test_sigusr1_is_refused_not_fatal_from_the_node_commands_first_step(monkeypatch: pytest.MonkeyPatch,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """SIGUSR1's default action ends the process, and the node took the signal over only once
    its store was open (backup probe): a backup job firing while a node restarted killed it. The
    command handles it before it reads its config, and ignores it once it returns."""
    import argparse
    import os
    import signal

    from tenzro_training.cli import CliError
    from tenzro_training.node import main as node_main

    seen: list[object] = []

    def loader(*args: object, **kwargs: object) -> None:
        seen.append(signal.getsignal(signal.SIGUSR1))
        if seen[0] is node_main._refuse_backup_while_starting:  # else the signal would end pytest
            os.kill(os.getpid(), signal.SIGUSR1)
        raise node_main.NodeStartupError("stop here")

    monkeypatch.setattr(node_main, "load_node_config", loader)
    before = signal.getsignal(signal.SIGUSR1)
    try:
        args = argparse.Namespace(data_dir="d", config=None, dev=False, rpc_host=None, rpc_port=None)
        with caplog.at_level(logging.WARNING, logger="tenzro.node"), pytest.raises(CliError, match="stop here"):
            node_main.run_node_from_args(args)
        assert seen == [node_main._refuse_backup_while_starting]
        assert "backup refused: the node is still starting" in caplog.text
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN  # a late one at exit is no kill
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_the_store_opens_with_sigusr1_held_by_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """The loop's handler (a backup once the node listens) is in place before the store opens,
    so no SIGUSR1 ends the process with the store open; one sent then is refused."""
    import os
    import signal

    import storage
    from tenzro_training.node.config import NodeConfig
    from tenzro_training.node.main import run_node

    seen: list[object] = []
    open_store = storage.open_store

    def opener(*args: Any, **kwargs: Any) -> Any:
        seen.append(signal.getsignal(signal.SIGUSR1))
        if callable(seen[0]):  # the loop's (SIG_DFL would end pytest)
            os.kill(os.getpid(), signal.SIGUSR1)
        return open_store(*args, **kwargs)

    def announce(line: str) -> None:
        if "listening on" in line:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(storage, "open_store", opener)
    before = signal.getsignal(signal.SIGUSR1)
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        with caplog.at_level(logging.WARNING, logger="tenzro.node"):
            asyncio.run(run_node(NodeConfig(data_dir=tmp_path / "d", rpc_port=0), tmp_path / "d", announce=announce))
        assert len(seen) == 1 and callable(seen[0])
        assert "backup refused: the node is still starting" in caplog.text
        assert not list((tmp_path / "d").glob("backups/*"))
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_sigusr1_never_gets_its_default_action_back_while_the_node_stops(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The node's SIGUSR1 handling goes from the backup to the refusal in one step: the loop's
    remove_signal_handler put the default action (the end of the process) back first, and a
    SIGUSR1 in between (another thread holding the GIL, a backup job firing at the stop) killed
    the node with signal 10 during its shutdown, before the store closed (review: 8 of 10 nodes
    sent SIGUSR1 every 0.1 ms after SIGTERM died so, one leaving a .partial backup)."""
    import os
    import signal

    from tenzro_training.node.config import NodeConfig
    from tenzro_training.node.main import run_node

    real_signal = signal.signal
    usr1: list[object] = []

    def recording(sig: int, handler: Any) -> Any:
        if sig == signal.SIGUSR1:
            usr1.append(handler)
        return real_signal(sig, handler)

    def announce(line: str) -> None:
        if "listening on" in line:
            os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGUSR1)
    try:
        real_signal(signal.SIGUSR1, signal.SIG_IGN)
        monkeypatch.setattr(signal, "signal", recording)
        asyncio.run(run_node(NodeConfig(data_dir=tmp_path / "d", rpc_port=0), tmp_path / "d", announce=announce))
    finally:
        monkeypatch.undo()
        signal.signal(signal.SIGUSR1, before)
    assert usr1, "the node never handled SIGUSR1"
    assert signal.SIG_DFL not in usr1, usr1


def test_a_sigusr1_caught_during_the_last_swap_is_no_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPython sets SIG_IGN, then finds a SIGUSR1 its C handler caught just before and raises
    "Signal 10 ignored due to race condition" out of signal.signal (review: a traceback at the
    exit of ~1 in 10 stops under a SIGUSR1 flood). The command ends as it would have."""
    import argparse
    import signal

    from tenzro_training.cli import CliError
    from tenzro_training.node import main as node_main

    real = signal.signal

    def racing(signum: int, handler: object) -> object:
        previous = real(signum, handler)
        if handler is signal.SIG_IGN:
            raise OSError(f"Signal {signum} ignored due to race condition")
        return previous

    def loader(*args: object, **kwargs: object) -> None:
        raise node_main.NodeStartupError("stop here")

    monkeypatch.setattr(node_main, "load_node_config", loader)
    before = signal.getsignal(signal.SIGUSR1)
    try:
        monkeypatch.setattr(node_main.signal, "signal", racing)
        args = argparse.Namespace(data_dir="d", config=None, dev=False, rpc_host=None, rpc_port=None)
        with pytest.raises(CliError, match="stop here"):
            node_main.run_node_from_args(args)
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
    finally:
        monkeypatch.undo()
        signal.signal(signal.SIGUSR1, before)


def test_a_backup_asked_for_once_the_node_began_stopping_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A SIGUSR1 whose backup handler runs after the stop signal's (sent with the SIGTERM) was
    taken as a backup while the node stopped (docs check); it is refused like a later one."""
    import os
    import signal

    from tenzro_training.node import main as node_main
    from tenzro_training.node.config import NodeConfig

    class StopThenBackup(asyncio.Event):
        def set(self) -> None:
            super().set()
            handler = signal.getsignal(signal.SIGUSR1)
            assert callable(handler)
            handler(signal.SIGUSR1, None)  # a SIGUSR1 right behind the stop signal

    def announce(line: str) -> None:
        if "listening on" in line:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(node_main.asyncio, "Event", StopThenBackup)
    before = signal.getsignal(signal.SIGUSR1)
    try:
        with caplog.at_level(logging.INFO, logger="tenzro.node"):
            asyncio.run(node_main.run_node(NodeConfig(data_dir=tmp_path / "d", rpc_port=0), tmp_path / "d",
                                           announce=announce))
        assert "backup refused: the node is shutting down" in caplog.text
        assert "backup written" not in caplog.text and not list((tmp_path / "d").glob("backups/*"))
    finally:
        signal.signal(signal.SIGUSR1, before)
