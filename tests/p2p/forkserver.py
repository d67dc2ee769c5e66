"""Starts tests/p2p/peer.py processes by fork from one process that imported it once.

A peer process spends ~3.5 s of CPU importing torch, py-libp2p and eth_account before its host
listens; the transport tests start ~50 of them one after the other, so most of their time went
to imports. This server imports ``peer`` once, then forks a child per request, which runs
``peer.main()`` with the argv and the stdin/stdout/stderr it is sent: each peer is still its own
OS process with its own host, event loop and sockets, as with ``python tests/p2p/peer.py``.

    python tests/p2p/forkserver.py SOCKET_PATH

It prints one line, ``ready``, once it accepts requests on the Unix socket. A request is one
connection: a JSON line ``{"argv": [...]}`` sent with three file descriptors (SCM_RIGHTS) for the
child's fds 0, 1 and 2. The server answers ``{"pid": N}``, later ``{"returncode": R}`` (as
``subprocess.Popen.returncode``: -N for a signal) once the child is reaped, then closes the
connection. The client may send ``{"signal": N}`` lines meanwhile: the server signals the child
only while it has not reaped it, so a signal never reaches a reused pid. The server starts no
thread (a fork copies no other thread, nor the locks one held; the one `import torch` leaves
idle is the case of every DataLoader worker forked after it) and stops at EOF on its stdin.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from types import ModuleType
from typing import IO

HERE = Path(__file__).resolve().parent


class ForkedProcess:
    """The subset of ``subprocess.Popen`` the transport tests use, for a child of the server:
    text pipes, ``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``."""

    def __init__(self, server: str, argv: list[str]) -> None:
        self.args = argv
        self.returncode: int | None = None
        child_in, self_in = os.pipe()
        self_out, child_out = os.pipe()
        self_err, child_err = os.pipe()
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.connect(server)
            socket.send_fds(self._conn, [json.dumps({"argv": argv}).encode() + b"\n"], [child_in, child_out, child_err])
        finally:
            for fd in (child_in, child_out, child_err):
                os.close(fd)
        self.stdin: IO[str] = open(self_in, "w")
        self.stdout: IO[str] = open(self_out)
        self.stderr: IO[str] = open(self_err)
        self._replies = self._conn.makefile("rb")
        self.pid: int = json.loads(self._replies.readline())["pid"]
        self._exited = threading.Event()
        threading.Thread(target=self._await_exit, daemon=True).start()

    def _await_exit(self) -> None:
        line = self._replies.readline()
        if line:  # else the server died: wait() raises
            self.returncode = json.loads(line)["returncode"]
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        if self.returncode is None:
            raise RuntimeError(f"the fork server died before reporting pid {self.pid}'s exit")
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Through the server: it signals only a child it has not reaped (never a reused pid)."""
        if self.returncode is None:
            try:
                self._conn.sendall(json.dumps({"signal": int(sig)}).encode() + b"\n")
            except OSError:
                pass  # reaped and reported meanwhile

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The server process, started on first use and stopped at exit."""

    _running: ForkServer | None = None
    _starting = threading.Lock()  # tests also start peers from worker threads

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="tenzro-forkserver-")
        self.path = os.path.join(self._dir, "socket")
        self._proc = subprocess.Popen([sys.executable, __file__, self.path], cwd=HERE.parents[1],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        if self._proc.stdout.readline() != "ready\n":
            raise RuntimeError(f"the fork server did not start (exit status {self._proc.wait()})")

    @classmethod
    def spawn(cls, argv: list[str]) -> ForkedProcess:
        """``python tests/p2p/peer.py *argv`` (its cwd: the repository root), forked."""
        with cls._starting:
            if cls._running is None or cls._running._proc.poll() is not None:
                cls._running = cls()
                atexit.register(cls._running.close)
            path = cls._running.path
        return ForkedProcess(path, argv)

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()  # EOF: the server returns
        self._proc.wait(timeout=30)
        shutil.rmtree(self._dir, ignore_errors=True)


def run_child(peer: ModuleType, argv: list[str], fds: list[int], inherited: list[int]) -> None:
    """In the forked child: become ``python peer.py *argv`` on the given fds; never returns."""
    code = 1
    try:
        for fd in inherited:
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.argv = [peer.__file__, *argv]
        code = asyncio.run(peer.main())
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(path: str) -> None:
    sys.path.insert(0, str(HERE))
    import peer  # the whole import cost, paid once

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    children: dict[int, socket.socket] = {}  # pid -> its request's connection
    listening: set[socket.socket] = set()  # of those, the ones whose client has not hung up
    print("ready", flush=True)
    while True:
        for key, _ in selector.select(timeout=0.05):
            if key.data == "stdin":
                if not sys.stdin.readline():
                    return
            elif key.data == "accept":
                conn, _ = listener.accept()
                line, fds, _, _ = socket.recv_fds(conn, 65536, 3)
                request = json.loads(line)
                inherited = [selector.fileno(), listener.fileno(), conn.fileno(),
                             *(c.fileno() for c in children.values())]
                pid = os.fork()
                if pid == 0:
                    run_child(peer, request["argv"], fds, inherited)
                for fd in fds:
                    os.close(fd)
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                children[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
                listening.add(conn)
            else:  # a client's line: a signal for its child, or EOF
                pid, conn = key.data, key.fileobj
                data = conn.recv(4096)
                if data and pid in children:
                    for line in data.splitlines():
                        os.kill(pid, json.loads(line)["signal"])
                elif not data:
                    selector.unregister(conn)
                    listening.discard(conn)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid)
            try:
                conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            except OSError:
                pass  # the client went away
            if conn in listening:
                selector.unregister(conn)
                listening.discard(conn)
            conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
