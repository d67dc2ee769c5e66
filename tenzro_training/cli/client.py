"""The JSON-RPC 2.0 client of every command that talks to a node (stdlib HTTP only), and the
bounds it reads a node's answers under: whatever listens at ``--rpc`` is not trusted to be a node."""

from __future__ import annotations

import base64
import json
import time
from typing import Any, Callable

from tenzro_training.cli.exits import EXIT_RPC_ERROR, EXIT_UNREACHABLE, CliError
from tenzro_training.terminal import printable


DEFAULT_RPC = "http://127.0.0.1:8545"


MAX_REPLY_BYTES = 64 << 20
"""Largest answer read from a node. The largest legitimate ones, getRun and getReceipt of a run
whose receipt fits one claim, are a few MB (the ABI receipt is at most 4 MiB, 8 MiB as hex)."""

MAX_REPLY_VALUES = 2_000_000
"""Most JSON values (bounded by the separators and openers counted before parsing) an answer may
hold. Python objects cost 50-100x the bytes of ``{}`` or ``0,``: a 20 MiB answer of tiny objects
took 1.4 GB to parse and print (CLI probe, 2026-11-26). A default node's largest getRun holds
~10^5 values."""


MAX_ERROR_BODY_BYTES = 64 << 10
"""Most bytes read of an error status's body from an artifact route (a JSON-RPC-shaped error
object of a few hundred bytes)."""


def _describe_error_body(raw: bytes) -> str:
    """`` error <code> <Type>: <message>`` of a JSON-RPC-shaped error body (the node's artifact
    routes answer one with every error status), or ``""`` for anything else."""
    from tenzro_training.jsontext import loads_bounded

    try:
        doc = loads_bounded(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return ""
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict) or type(err.get("code")) is not int or not isinstance(err.get("message"), str):
        return ""
    data = err.get("data")
    kind = data.get("type") if isinstance(data, dict) else None
    label = f" {printable(kind, 64)}" if isinstance(kind, str) and kind else ""
    return f", error {err['code']}{label}: {printable(err['message'], 300)}"


def _deadline_response_class(deadline: float) -> type:
    """An ``http.client.HTTPResponse`` whose every read of the socket gives up at ``deadline``
    (``time.monotonic()``), raising TimeoutError.

    Why: a socket timeout bounds each read, not the exchange. A node can send its status line
    and headers a byte a second (100 header lines of 64 KiB are allowed), ``100 Continue``
    interim answers, or chunked trailer lines, forever; http.client reads those in loops of its
    own that never return to the caller (CLI probe, 2026-11-26). Every one of its reads goes
    through the response's buffered file, whose raw reader here sets the socket's timeout to
    the time left before each refill."""
    import http.client
    import io

    class _Raw(io.RawIOBase):
        def __init__(self, sock: Any, held: Any) -> None:
            self._sock = sock
            self._held = held  # the makefile() HTTPResponse opened: it keeps the socket's fd open

        def readable(self) -> bool:
            return True

        def close(self) -> None:
            super().close()
            self._held.close()

        def readinto(self, buffer: Any) -> int:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the answer's deadline passed")
            self._sock.settimeout(left)
            return int(self._sock.recv_into(buffer))

    class _Response(http.client.HTTPResponse):
        def __init__(self, sock: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(sock, *args, **kwargs)
            self.fp = io.BufferedReader(_Raw(sock, self.fp))

    return _Response


def _bound_connection(connection: Any, deadline: float, response_class: type) -> Any:
    """``connection`` (an http.client connection) with its connect and every send given the time
    left before ``deadline``, not a fresh timeout each (connect, the headers' send and the
    body's send each took up to the whole timeout), and its answer read by ``response_class``.
    TimeoutError once the deadline has passed. A host with several addresses gets the time left
    per address tried, as socket.create_connection does."""

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the call's deadline passed")
        return remaining

    connect, send = connection.connect, connection.send

    def connect_in_time() -> None:
        connection.timeout = left()
        connect()

    def send_in_time(data: Any) -> None:
        if connection.sock is not None:
            connection.sock.settimeout(left())
        send(data)

    connection.connect, connection.send = connect_in_time, send_in_time
    connection.response_class = response_class
    return connection


def _opener(deadline: float) -> Any:
    """urllib, except that a 3xx is an HTTPError (urllib would replay the call as a GET without
    its body, and send the Authorization header to whatever host the redirect names), and every
    answer is read against ``deadline``. urllib's proxy settings still apply."""
    import http.client
    import urllib.request

    response_class = _deadline_response_class(deadline)

    def bounded(connection: Any) -> Any:
        return _bound_connection(connection, deadline, response_class)

    class _Refuse(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    class _Http(urllib.request.HTTPHandler):
        def http_open(self, req: Any) -> Any:
            return self.do_open(lambda *a, **kw: bounded(http.client.HTTPConnection(*a, **kw)), req)

    class _Https(urllib.request.HTTPSHandler):
        def https_open(self, req: Any) -> Any:
            return self.do_open(lambda *a, **kw: bounded(http.client.HTTPSConnection(*a, **kw)), req,
                                context=getattr(self, "_context", None))

    return urllib.request.build_opener(_Refuse(), _Http(), _Https())


def _finite_float(text: str) -> float:
    """``json.loads(..., parse_float=)``: ``1e400`` is valid JSON that Python reads as infinity,
    which ``parse_constant`` never sees; refused like NaN."""
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:20]} does not fit a float")
    return value


def parse_rpc_url(url: str) -> tuple[str, str | None]:
    """(endpoint without credentials, Authorization header or None) for an ``--rpc`` value.

    Only http(s) with a host and a valid port: urllib would also open ``file:``, ``data:`` and
    ``ftp:`` URLs, took ``user:pw@host`` for a host name (and printed the password in its "name
    not known"), and reported port 99999 as "connection refused". Credentials in the URL are sent
    as HTTP Basic authorization, as RPC providers expect, and never appear in a message.
    """
    import urllib.parse

    def bad(reason: str, shown: str) -> CliError:
        return CliError(f"bad --rpc URL {shown!r}: {reason}", EXIT_UNREACHABLE)

    def redacted(text: str) -> str:  # everything up to the last "@" cut out, scheme kept
        if "@" not in text:
            return text
        scheme, sep, _ = text.partition("://")
        return f"{scheme}://...@{text.rpartition('@')[2]}" if sep else f"...@{text.rpartition('@')[2]}"

    raw_shown = redacted(url)
    if any(c.isspace() or not c.isprintable() for c in url):
        raise bad("it contains whitespace or control characters", raw_shown)
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:  # "http://[::1"
        raise bad(str(exc), raw_shown) from None
    netloc = parts.netloc.rpartition("@")[2]
    # An "@" left outside the host part ("user:pw@host" without a scheme, "http:/user:pw@host")
    # may still carry a password: such a URL is shown redacted.
    shown = redacted(urllib.parse.urlunsplit(parts._replace(netloc=netloc)))
    if parts.scheme.lower() not in ("http", "https"):
        raise bad("expected an http:// or https:// URL", shown)
    if not parts.hostname:
        raise bad("no host", shown)
    try:
        port = parts.port  # ValueError for "abc" or 99999
    except ValueError:
        raise bad("the port must be a number in 1..65535", shown) from None
    if port == 0:
        raise bad("the port must be a number in 1..65535", shown)
    authorization = None
    if "@" in parts.netloc:
        user = urllib.parse.unquote(parts.username or "")
        password = urllib.parse.unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        authorization = f"Basic {token}"
    return shown, authorization


_RECOVERED_SIGNER_FIELD = {"WrongSigner": "actual", "NotSponsor": "address", "NotSyncer": "address",
                           "NotEnrolled": "address"}
"""Error data field holding the address the node recovered from a call's signature (docs/rpc.md)."""


class RpcClient:
    """Minimal synchronous JSON-RPC 2.0 client over HTTP (stdlib only).

    The node at ``--rpc`` is not trusted to be one: every answer is bounded in size and nesting
    (py_ecc raises the recursion limit, so a deep document would crash the process), parsed as
    strict JSON (no NaN/Infinity) and must be a JSON-RPC response whose result is an object, as
    every tenzro_training_* result is. ``answers`` counts the answers read, so that ``main`` can
    tell a field missing from a node's answer from a bug of this program."""

    answers: int = 0

    def __init__(self, url: str, timeout: float = 120.0, *, signer: tuple[str, int] | None = None) -> None:
        self.url, self._authorization = parse_rpc_url(url)
        """The endpoint, without any credentials: what requests go to and messages show."""
        self.timeout = timeout
        self.signer = signer
        """(address, chain id) of the key this client's calls are signed with, for the hint below."""
        self._next_id = 1

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The result of one call. Every way the exchange can fail, an error status's body
        included, is a CliError: EXIT_UNREACHABLE when no complete answer arrived within
        ``timeout`` seconds of the call (the whole exchange, not each read), EXIT_RPC_ERROR for
        an answer that is not this call's JSON-RPC response or is a JSON-RPC error."""
        import urllib.request

        request_id = self._next_id
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode()
        self._next_id += 1
        headers = {"Content-Type": "application/json"}
        if self._authorization is not None:
            headers["Authorization"] = self._authorization
        try:
            req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        except ValueError as exc:  # whatever parse_rpc_url let through and urllib cannot open
            raise CliError(f"bad --rpc URL {self.url!r}: {exc}", EXIT_UNREACHABLE) from None
        status, raw = self._exchange(req, lambda status: MAX_REPLY_BYTES)
        return self._read_reply(raw, request_id, status)

    def fetch_artifact(self, path: str, max_bytes: int) -> bytes:
        """The body of ``GET path`` (relative to ``--rpc``: ``artifacts/v1/...`` is at the
        server's root for ``http://host:8545``, under ``/node1/`` for ``http://proxy/node1/``),
        read as it arrives and never more than ``max_bytes`` + 1 bytes. An error status (404,
        410, ...) or a longer body is ArtifactUnavailable, with the node's JSON-RPC-shaped error
        when it sent one: a failed check, not a transport failure. A redirect, a timeout or a
        broken exchange is a CliError with EXIT_UNREACHABLE, as for :meth:`call`."""
        import urllib.request

        from tenzro_training.errors import ArtifactUnavailable

        headers = {"Accept": "application/octet-stream"}
        if self._authorization is not None:
            headers["Authorization"] = self._authorization
        try:
            req = urllib.request.Request(compute_artifact_url(self.url, path), headers=headers, method="GET")
        except ValueError as exc:
            raise CliError(f"bad --rpc URL {self.url!r}: {exc}", EXIT_UNREACHABLE) from None
        # An error's body is a small JSON object; a 200's is the artifact, up to its bound.
        status, raw = self._exchange(req, lambda status: max_bytes if status == 200 else MAX_ERROR_BODY_BYTES)
        if status != 200:
            raise ArtifactUnavailable(f"HTTP {status}{_describe_error_body(raw)}", status)
        if len(raw) > max_bytes:
            raise ArtifactUnavailable(f"the node sent more than {max_bytes} bytes, the most it can be", status)
        return raw

    def _exchange(self, req: Any, limit_of: Callable[[int], int]) -> tuple[int, bytes]:
        """(HTTP status, body) of one request, the body read up to ``limit_of(status)`` + 1
        bytes, the whole exchange within ``timeout``. A redirect, a timeout and every transport
        failure, an error status's body included, is a CliError with EXIT_UNREACHABLE."""
        import http.client
        import urllib.error

        deadline = time.monotonic() + self.timeout
        status = 200
        try:
            try:
                resp = _opener(deadline).open(req, timeout=self.timeout)
            except urllib.error.HTTPError as exc:  # JSON-RPC errors may come with 4xx statuses
                if 300 <= exc.code < 400:
                    raise CliError(f"node at {self.url} answered HTTP {exc.code} (a redirect, which is not "
                                   "followed: pass the URL it names as --rpc)", EXIT_UNREACHABLE) from None
                resp, status = exc, exc.code
            try:  # the body of an error status is read under the same handlers as any other
                raw = self._read_body(resp, deadline, limit_of(status))
            finally:
                try:
                    resp.close()
                except Exception:  # noqa: BLE001 -- an HTTPError without a body has nothing to close
                    pass
        except CliError:
            raise
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            if time.monotonic() >= deadline:
                raise self._too_slow() from None
            if isinstance(exc, http.client.HTTPException) and not isinstance(exc, urllib.error.URLError):
                # a bad port in the URL, a server that is not HTTP, a reply cut off or malformed
                raise CliError(f"cannot talk to a node at {self.url}: {type(exc).__name__}",
                               EXIT_UNREACHABLE) from None
            reason = getattr(exc, "reason", exc)
            raise CliError(f"cannot reach node at {self.url}: {printable(str(reason), 200)}",
                           EXIT_UNREACHABLE) from None
        except ValueError as exc:  # whatever parse_rpc_url let through and urllib cannot open
            raise CliError(f"bad --rpc URL {self.url!r}: {exc}", EXIT_UNREACHABLE) from None
        return status, raw

    def _too_slow(self) -> CliError:
        return CliError(f"node at {self.url} did not finish its answer within {self.timeout:g} s", EXIT_UNREACHABLE)

    def _read_body(self, resp: Any, deadline: float, limit: int = MAX_REPLY_BYTES) -> bytes:
        """The answer's body, read as it arrives, at most ``limit`` + 1 bytes (one more tells an
        answer at the limit from a longer one)."""
        if getattr(resp, "fp", True) is None:  # an HTTPError that came without a body
            return b""
        read = getattr(resp, "read1", None) or resp.read
        data = bytearray()
        while len(data) <= limit:
            if time.monotonic() > deadline:
                raise self._too_slow()
            chunk = read(min(1 << 16, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
        return bytes(data)

    def _domain_hint(self, data: dict[str, Any]) -> str:
        """A signature checked under another EIP-712 domain (chain id) does not fail: it recovers
        to an unrelated address, so the node answers "not the syncer/sponsor/enrolled" and the
        user looks at the wrong thing. When the address the node recovered is not this key's,
        say that the chain id is the likely cause."""
        field = _RECOVERED_SIGNER_FIELD.get(str(data.get("type")))
        recovered = data.get(field) if field else None
        if self.signer is None or not isinstance(recovered, str):
            return ""
        address, chain_id = self.signer
        if recovered.lower() == address.lower():
            return ""
        return (f" (the node recovered {printable(recovered, 42)} from the signature, not this key's {address}: "
                f"it checks signatures for another chain id; this one was signed for --chain-id {chain_id})")

    def _read_reply(self, raw: bytes, request_id: int, status: int = 200) -> dict[str, Any]:
        from tenzro_training.jsontext import (
            MAX_JSON_NESTING,
            compute_json_values_bound,
            is_json_depth_ok,
            refuse_json_constant,
        )

        if len(raw) > MAX_REPLY_BYTES:
            raise CliError(f"node at {self.url} answered more than {MAX_REPLY_BYTES} bytes", EXIT_RPC_ERROR)
        if compute_json_values_bound(raw) > MAX_REPLY_VALUES:  # first: counting is the cheaper scan
            raise CliError(f"node at {self.url} answered more than {MAX_REPLY_VALUES} JSON values", EXIT_RPC_ERROR)
        if not is_json_depth_ok(raw):
            raise CliError(f"node at {self.url} answered JSON nested deeper than {MAX_JSON_NESTING}", EXIT_RPC_ERROR)
        try:
            reply = json.loads(raw, parse_constant=refuse_json_constant, parse_float=_finite_float)
        except (ValueError, RecursionError):
            status_note = f" (HTTP {status})" if status != 200 else ""
            raise CliError(f"node at {self.url} did not answer JSON-RPC{status_note}", EXIT_UNREACHABLE) from None
        if (not isinstance(reply, dict) or ("error" in reply) == ("result" in reply)
                or reply.get("jsonrpc") != "2.0"):
            raise CliError(f"node at {self.url} sent a reply that is not a JSON-RPC response (2.0)", EXIT_RPC_ERROR)
        if "error" in reply:
            err = reply["error"]
            code = err.get("code") if isinstance(err, dict) else None
            message = err.get("message") if isinstance(err, dict) else None
            if type(code) is not int or not isinstance(message, str):
                raise CliError(f"node at {self.url} sent a malformed JSON-RPC error object", EXIT_RPC_ERROR)
            if reply.get("id") not in (request_id, None):  # null: the node could not read our id
                raise CliError(f"node at {self.url} answered another request (id {printable(repr(reply.get('id')), 40)})",
                               EXIT_RPC_ERROR)
            data = err.get("data")
            kind = data.get("type") if isinstance(data, dict) else None
            label = f" {printable(kind, 64)}" if isinstance(kind, str) and kind else ""
            hint = self._domain_hint(data) if isinstance(data, dict) else ""
            raise CliError(f"error {code}{label}: {printable(message, 1000)}{hint}", EXIT_RPC_ERROR, rpc_code=code)
        if type(reply.get("id")) is not int or reply["id"] != request_id:
            raise CliError(f"node at {self.url} answered another request (id {printable(repr(reply.get('id')), 40)})",
                           EXIT_RPC_ERROR)
        result = reply["result"]
        if not isinstance(result, dict):
            got = "null" if result is None else type(result).__name__
            raise CliError(f"node at {self.url} answered a {got} where a JSON object was expected", EXIT_RPC_ERROR)
        RpcClient.answers += 1
        return result


def compute_artifact_url(rpc_url: str, path: str) -> str:
    """``path`` (``artifacts/v1/...``) under the ``--rpc`` URL, as if that URL ended with "/":
    ``http://proxy/node1`` gives ``http://proxy/node1/artifacts/v1/...``, where its JSON-RPC
    calls go, not the proxy's root as ``urljoin`` would (another node, or none). Its query (an
    RPC provider's key) is kept; its fragment is not sent."""
    import urllib.parse

    parts = urllib.parse.urlsplit(rpc_url)
    prefix = parts.path if parts.path.endswith("/") else parts.path + "/"
    return urllib.parse.urlunsplit(parts._replace(path=prefix + path, fragment=""))
