"""node/sdnotify.py: systemd's notification protocol (sd_notify(3)) as a unit with Type=notify and
WatchdogSec= sees it, against real unix datagram sockets."""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tenzro_training.node.main import _watchdog_forever
from tenzro_training.node.sdnotify import SystemdNotifier


@pytest.fixture
def abstract() -> Iterator[tuple[str, socket.socket]]:
    """A listening abstract socket and the NOTIFY_SOCKET value that names it."""
    name = f"tenzro-test-{secrets.token_hex(8)}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    yield "@" + name, sock
    sock.close()


def test_outside_systemd_every_call_does_nothing() -> None:
    notifier = SystemdNotifier({})
    assert not notifier.enabled and notifier.watchdog_s is None
    assert not notifier.ready("x") and not notifier.watchdog() and not notifier.stopping()


def test_ready_and_status_reach_an_abstract_socket_as_one_datagram(abstract: tuple[str, socket.socket]) -> None:
    name, sock = abstract
    notifier = SystemdNotifier({"NOTIFY_SOCKET": name})
    assert notifier.enabled is True
    assert notifier.ready("listening on http://127.0.0.1:8545,\n 2 runs")
    assert sock.recv(4096) == b"READY=1\nSTATUS=listening on http://127.0.0.1:8545, 2 runs"
    assert notifier.status("x" * 1000)
    assert sock.recv(4096) == b"STATUS=" + b"x" * 200  # one line of systemctl status: 200 characters
    assert notifier.stopping() and sock.recv(4096) == b"STOPPING=1\nSTATUS=stopping"
    notifier.close()


def test_a_path_socket_is_reached_too() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as d:  # AF_UNIX paths are limited to 107 bytes
        path = str(Path(d) / "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(path)
            sock.settimeout(5)
            notifier = SystemdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"})
            assert notifier.watchdog_s == 2.0
            assert notifier.watchdog() and sock.recv(4096) == b"WATCHDOG=1"
            notifier.close()


@pytest.mark.parametrize(("env", "expected"), [
    ({"WATCHDOG_USEC": "500000"}, 0.5),
    ({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": "4242"}, 0.5),  # this process's pid
    ({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": "4243"}, None),  # meant for another process
    ({"WATCHDOG_USEC": ""}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "-5"}, None),
    ({"WATCHDOG_USEC": "1e6"}, None),
    ({"WATCHDOG_USEC": "١٢"}, None),  # Unicode digits are not a systemd number
])
def test_the_watchdog_interval_is_taken_only_when_meant_for_this_process(
    abstract: tuple[str, socket.socket], env: dict[str, str], expected: float | None
) -> None:
    assert SystemdNotifier({"NOTIFY_SOCKET": abstract[0], **env}, pid=4242).watchdog_s == expected


def test_the_watchdog_pid_is_this_process_unless_told_otherwise(abstract: tuple[str, socket.socket]) -> None:
    """The node builds its notifier with no pid: systemd's WATCHDOG_PID names the node's own
    process, and the watchdog must then be taken, or systemd kills a healthy node."""
    import os

    env = {"NOTIFY_SOCKET": abstract[0], "WATCHDOG_USEC": "500000", "WATCHDOG_PID": str(os.getpid())}
    assert SystemdNotifier(env).watchdog_s == 0.5


def test_a_watchdog_without_a_notify_socket_is_ignored() -> None:
    assert SystemdNotifier({"WATCHDOG_USEC": "500000"}).watchdog_s is None


def test_a_relative_notify_socket_is_refused_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tenzro.node"):
        notifier = SystemdNotifier({"NOTIFY_SOCKET": "notify.sock"})
    assert not notifier.enabled
    assert "neither an absolute path nor an abstract socket" in caplog.text
    # Under the node's logger, so an operator's log config for "tenzro.node" covers it.
    assert [r.name for r in caplog.records] == ["tenzro.node"]


def test_a_socket_nobody_listens_on_is_logged_once_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    notifier = SystemdNotifier({"NOTIFY_SOCKET": f"@tenzro-test-nobody-{secrets.token_hex(8)}"})
    with caplog.at_level(logging.WARNING, logger="tenzro.node"):
        assert [notifier.watchdog() for _ in range(5)] == [False] * 5
    assert [r.getMessage() for r in caplog.records].count(
        f"systemd notification to {notifier.address.replace(chr(0), '@')} failed: Connection refused") == 1
    notifier.close()


def test_the_watchdog_is_fed_only_while_the_node_is_healthy() -> None:
    """Twice per interval while healthy; nothing while the health check would answer 503; and
    never more often than WATCHDOG_MIN_PERIOD_S, whatever WatchdogSec= says (review: a tiny
    WATCHDOG_USEC made the loop spin)."""
    from tenzro_training.node.main import WATCHDOG_MIN_PERIOD_S

    class Fake:
        sent = 0

        def __init__(self, watchdog_s: float) -> None:
            self.watchdog_s = watchdog_s

        def watchdog(self) -> None:
            self.sent += 1

    async def run(fake: Fake, states: tuple[bool, ...], window_s: float) -> list[int]:
        healthy = [True]
        task = asyncio.create_task(_watchdog_forever(fake, lambda: healthy[0]))
        counts = []
        for state in states:
            healthy[0] = state
            before = fake.sent
            await asyncio.sleep(window_s)
            counts.append(fake.sent - before)
        task.cancel()
        return counts

    fed, starved, fed_again = asyncio.run(run(Fake(0.2), (True, False, True), 0.5))
    assert fed >= 3 and starved <= 1 and fed_again >= 3  # 0.5 s / 0.1 s = 5 when the loop is idle
    (tiny,) = asyncio.run(run(Fake(1e-6), (True,), 0.5))
    assert 3 <= tiny <= 0.5 / WATCHDOG_MIN_PERIOD_S + 1


def read_datagrams(sock: socket.socket, quiet_s: float) -> list[bytes]:
    """Every datagram ``sock`` receives until none came for ``quiet_s``."""
    got = []
    sock.settimeout(quiet_s)
    try:
        while True:
            got.append(sock.recv(4096))
    except TimeoutError:
        return got


def _fill(address: str) -> None:
    """Fill the receive queue of the socket at ``address`` (until a send would block)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as filler:
        for _ in range(100_000):
            try:
                filler.sendto(b"STATUS=filler", socket.MSG_DONTWAIT, address)
            except BlockingIOError:
                return
    raise AssertionError("the queue never filled")


def test_ready_waits_for_room_on_a_full_socket_and_the_watchdog_does_not(abstract: tuple[str, socket.socket],
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A lost READY=1 gets the node killed at TimeoutStartSec (review), a lost WATCHDOG=1 is
    followed by the next one; the event loop never waits for the latter."""
    import threading

    name, sock = abstract
    notifier = SystemdNotifier({"NOTIFY_SOCKET": name})
    _fill(notifier.address)
    with caplog.at_level(logging.WARNING, logger="tenzro.node"):
        assert not notifier.watchdog() and not notifier.watchdog()
    assert [r.getMessage() for r in caplog.records] == [
        f"systemd notification to {name} failed: Resource temporarily unavailable"]
    drained: list[bytes] = []
    reader = threading.Timer(0.2, lambda: drained.extend(sock.recv(4096) for _ in range(5)))
    reader.start()
    assert notifier.ready("listening")  # waited for the reader to make room
    reader.join()
    assert read_datagrams(sock, 0.2)[-1] == b"READY=1\nSTATUS=listening"
    # A send that worked clears the failure: the next one is logged again, as is another kind.
    caplog.clear()
    _fill(notifier.address)
    with caplog.at_level(logging.WARNING, logger="tenzro.node"):
        assert not notifier.watchdog()
        sock.close()
        assert not notifier.watchdog() and not notifier.watchdog()
    assert [r.getMessage().rsplit(": ", 1)[1] for r in caplog.records] == [
        "Resource temporarily unavailable", "Connection refused"]
    notifier.close()


def test_the_node_tells_systemd_each_step_of_its_start_and_its_stop(abstract: tuple[str, socket.socket], tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``systemctl status`` shows where a slow start is (a large store's runs take a while to
    read), ``systemctl start`` returns once the node listens, and the stop is said before the
    store closes, in that order."""
    import os
    import signal

    from tenzro_training.node.config import NodeConfig
    from tenzro_training.node.main import run_node

    name, sock = abstract
    monkeypatch.setenv("NOTIFY_SOCKET", name)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    urls: list[str] = []

    def announce(line: str) -> None:
        if "listening on" in line:
            urls.append(line.split(" on ", 1)[1].split(" ", 1)[0])
            os.kill(os.getpid(), signal.SIGTERM)

    asyncio.run(run_node(NodeConfig(data_dir=tmp_path / "d", rpc_port=0), tmp_path / "d", announce=announce))
    assert read_datagrams(sock, 0.2) == [
        b"STATUS=opening the store", b"STATUS=reading the store's runs",
        f"READY=1\nSTATUS=listening on {urls[0]}, 0 runs".encode(), b"STOPPING=1\nSTATUS=stopping",
    ]


def test_close_releases_the_socket_and_leaves_the_notifier_usable(abstract: tuple[str, socket.socket]) -> None:
    """close() is the node's last step: it must close the socket (not leave it to the garbage
    collector), may be called on a notifier that never sent anything or twice, and a notification
    after it opens a new socket instead of failing on a closed one."""
    import gc
    import warnings

    name, sock = abstract
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SystemdNotifier({"NOTIFY_SOCKET": name}).close()  # nothing sent: no socket yet
        notifier = SystemdNotifier({"NOTIFY_SOCKET": name})
        assert notifier.watchdog() and sock.recv(4096) == b"WATCHDOG=1"
        notifier.close()
        notifier.close()
        assert notifier.watchdog() and sock.recv(4096) == b"WATCHDOG=1"
        notifier.close()
        del notifier
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
