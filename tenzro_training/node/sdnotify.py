"""systemd's service notifications (sd_notify(3)) for ``tenzro node`` under a unit with
``Type=notify``: the node says when it is ready, what it is doing, when it stops, and, with
``WatchdogSec=``, that its service thread still works.

Why: a node can take seconds to start (a large store, its runs read back, the final model files
rebuilt), and its RPC port has no listener until it is ready, so a supervisor could only poll
the port. With ``READY=1`` sent once the server listens, ``systemctl start`` returns when the
node serves, units ordered after it start then, and ``systemctl status`` shows its ``STATUS=``
line. ``WATCHDOG=1`` is sent only while the health check would answer 200 (``node/main.py``
``_health``), so systemd restarts a node whose service thread stalled or whose store refuses
writes until reopened, as an operator reading the 503 would.

The protocol is one datagram of ``KEY=VALUE`` lines to the unix socket ``$NOTIFY_SOCKET`` names
(an ``@`` first names an abstract socket); it needs no libsystemd. Outside systemd (no
``NOTIFY_SOCKET``) every call does nothing. A notification that cannot be sent is logged (once
per kind of failure) and never stops the node: systemd's timeouts decide what that means.
``READY=1`` and ``STOPPING=1`` wait up to ``ESSENTIAL_SEND_S`` for room on a full socket, since
systemd kills a node whose READY it never got; ``WATCHDOG=1`` and ``STATUS=`` do not wait (the
event loop sends them, and the next one follows).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from typing import Final

log = logging.getLogger("tenzro.node")

MAX_STATUS_CHARS: Final = 200
"""A STATUS= line is one line of ``systemctl status``: longer text is cut."""
ESSENTIAL_SEND_S: Final = 1.0
"""How long READY=1 and STOPPING=1 wait for room on a full notification socket."""


class SystemdNotifier:
    """Notifications to ``$NOTIFY_SOCKET`` (none when it is unset); ``watchdog_s`` is the
    interval systemd expects ``WATCHDOG=1`` within (``$WATCHDOG_USEC``), or None."""

    def __init__(self, environ: Mapping[str, str] | None = None, pid: int | None = None) -> None:
        env = os.environ if environ is None else environ
        self.address: str | None = _socket_address(env.get("NOTIFY_SOCKET", ""))
        self.watchdog_s: float | None = None
        if self.address is not None:
            self.watchdog_s = _watchdog_interval(env, os.getpid() if pid is None else pid)
        self._sock: socket.socket | None = None
        self._failure = ""  # the last failure logged; cleared by a send that works

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *assignments: str, wait_s: float = 0.0) -> bool:
        """Send ``KEY=VALUE`` lines in one datagram; False when disabled or the send failed.
        ``wait_s``: how long to wait for room when the socket's queue is full (0: not at all)."""
        if self.address is None:
            return False
        data = "\n".join(assignments).encode("utf-8")
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                # MSG_DONTWAIT: a full receive queue must not block the event loop.
                self._sock.sendto(data, socket.MSG_DONTWAIT, self.address)
            except BlockingIOError:
                if wait_s <= 0:
                    raise
                self._sock.settimeout(wait_s)
                try:
                    self._sock.sendto(data, self.address)
                finally:
                    self._sock.settimeout(None)
        except OSError as exc:
            failure = str(exc.strerror or exc)
            if failure != self._failure:  # once per kind: the watchdog repeats every few seconds
                log.warning("systemd notification to %s failed: %s", _printable_address(self.address), failure)
                self._failure = failure
            return False
        self._failure = ""
        return True

    def status(self, text: str) -> bool:
        return self.notify(_status(text))

    def ready(self, text: str) -> bool:
        return self.notify("READY=1", _status(text), wait_s=ESSENTIAL_SEND_S)

    def stopping(self) -> bool:
        return self.notify("STOPPING=1", _status("stopping"), wait_s=ESSENTIAL_SEND_S)

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _socket_address(raw: str) -> str | None:
    if not raw:
        return None
    if raw.startswith("@"):  # abstract namespace: a NUL byte first
        return "\0" + raw[1:]
    if raw.startswith("/"):
        return raw
    # sd_notify accepts only these two forms (vsock needs a systemd this node does not target).
    log.warning("NOTIFY_SOCKET %r is neither an absolute path nor an abstract socket: no systemd notifications",
                raw[:100])
    return None


def _watchdog_interval(env: Mapping[str, str], pid: int) -> float | None:
    """``WATCHDOG_USEC`` in seconds when it is meant for this process (``WATCHDOG_PID`` unset or
    this pid, as sd_watchdog_enabled(3) checks); None otherwise."""
    usec = env.get("WATCHDOG_USEC", "")
    if not usec:
        return None
    owner = env.get("WATCHDOG_PID", "")
    if owner and owner != str(pid):
        return None
    if not usec.isascii() or not usec.isdigit() or int(usec) == 0:
        log.warning("WATCHDOG_USEC %r is not a positive integer: no watchdog notifications", usec[:40])
        return None
    return int(usec) / 1e6


def _status(text: str) -> str:
    return "STATUS=" + " ".join(text.split())[:MAX_STATUS_CHARS]


def _printable_address(address: str) -> str:
    return "@" + address[1:] if address.startswith("\0") else address
