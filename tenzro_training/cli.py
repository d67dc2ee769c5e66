"""The ``tenzro`` command line: a SHELL over the JSON-RPC API and the node service.

``tenzro node`` runs the node (``node/main.py``); ``tenzro train <verb>`` wraps the seven
``tenzro_training_*`` methods plus ``cancel-task``, ``verify-receipt`` (re-checks a receipt, its
election and its signatures: ``receipt_check.py``), ``verify-run`` (recomputes a sealed run from
the payloads, checkpoint and model the node serves under ``artifacts/v1/``: ``run_replay.py``),
and helpers (``make-gradient`` writes a random OuterGradient payload, ``export-model`` copies a
sealed run's final model out of a node's data dir or downloads it, checked against the verified
receipt, ``evaluate-model`` scores model files on the spec's held-out windows, ``address``);
``tenzro syncer run`` is the syncer daemon (``node/syncer.py``).
Every signing command takes ``--key-file`` (hex, ``{"private_key"}`` JSON, or a dev-accounts.json
with ``--account``) or ``TENZRO_PRIVATE_KEY``. Output is human-readable by default and JSON with
``--json``; any failure prints one line to stderr and exits non-zero: 1 for an error the node
answered, 2 for bad usage or local input, 3 when the node is unreachable. docs/cli.md has an
example of every command.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from tenzro_training import auth
from tenzro_training.addresses import parse_address
from tenzro_training.console import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED
from tenzro_training.errors import TenzroError
from tenzro_training.logformat import format_stderr_line
from tenzro_training.terminal import printable, printable_lines

DEFAULT_RPC = "http://127.0.0.1:8545"

EXIT_OK = 0
EXIT_RPC_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


class CliError(TenzroError):
    """A failure the CLI reports as one line and an exit status."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE, *, rpc_code: int | None = None) -> None:
        self.exit_code = exit_code
        self.rpc_code = rpc_code
        """The JSON-RPC error code of the node's answer this reports (None: not a node answer)."""
        super().__init__(message)


# --- JSON-RPC client --------------------------------------------------------------------------


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


# --- keys ---------------------------------------------------------------------------------------


def _parse_key_hex(text: str, where: str) -> bytes:
    hex_text = text[2:] if text.startswith(("0x", "0X")) else text
    try:
        key = bytes.fromhex(hex_text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise CliError(f"{where}: signing key must be 32 bytes of hex")
    if not 0 < int.from_bytes(key, "big") < auth.SECP256K1_N:
        raise CliError(f"{where}: not a valid secp256k1 private key (must be in 1..n-1)")
    return key


def _select_account(doc: dict[str, Any], account: str | None, key_file: str) -> str:
    """The private key of one entry of a dev-accounts.json document (``--account``)."""
    accounts = doc.get("accounts")
    if not isinstance(accounts, list):
        raise CliError(f"key file {key_file}: expected a private_key or an accounts list")
    names = []
    for entry in accounts:
        if not isinstance(entry, dict):
            continue
        role, index = entry.get("role"), entry.get("index", 0)
        names.append(f"{role}:{index}")
        if account is None:
            continue
        wanted = account.lower()
        if wanted in (f"{role}:{index}".lower(), str(entry.get("address", "")).lower()) or (
            wanted == str(role).lower() and index == 0
        ):
            return str(entry.get("private_key", ""))
    if account is None:
        if len(names) == 1:  # nothing to pick from
            return _select_account(doc, names[0], key_file)
        if not names:
            raise CliError(f"key file {key_file}: its accounts list has no entries")
        shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        raise CliError(f"key file {key_file} holds {len(names)} accounts: pick one with --account ({shown})")
    raise CliError(f"no account {account!r} in {key_file} (have {', '.join(names) or 'none'})")


MAX_INPUT_FILE_BYTES = 256 << 20
"""Largest spec, key, receipt or payload file read (above the node's 64 MiB payload default)."""
MAX_CHECKPOINT_FILE_BYTES = 16 << 30
"""Largest --checkpoint hashed, the node's max_checkpoint_bytes default."""


def _read_text(path: str, what: str) -> str:
    """A UTF-8 text file the user named, or a CliError that says which and why (a FIFO or a
    device is refused at once instead of blocking or filling memory)."""
    from storage.files import NotReadable, read_regular_file

    try:
        return read_regular_file(path, MAX_INPUT_FILE_BYTES).decode("utf-8")
    except NotReadable as exc:
        raise CliError(f"cannot read {what} {path}: {exc.reason}") from None
    except UnicodeDecodeError:
        raise CliError(f"{what} {path} is not UTF-8 text") from None


def _write_out(path: str, data: bytes) -> None:
    """Write an ``--out`` file whole or not at all (a reader never sees half of it), replacing
    what is there, with the mode a plain create would give (0666 less the umask: a user with
    umask 077 gets 0600, as from shell redirection)."""
    from storage.files import write_file_atomically

    mask = os.umask(0)
    os.umask(mask)
    try:
        write_file_atomically(path, data, mode=0o666 & ~mask)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None


def load_private_key(key_file: str | None, account: str | None = None) -> bytes:
    """A 32-byte secp256k1 key from ``--key-file`` or the ``TENZRO_PRIVATE_KEY`` environment variable.

    The file holds the key as hex text, or JSON ``{"private_key": ...}``, or a dev-accounts.json
    document (``tenzro node --dev`` writes one) from which ``account`` (``trainer:3``, ``sponsor``,
    ``syncer:0`` or an address) picks the entry.
    """
    text: str | None
    if key_file:
        text = _read_text(key_file, "key file").strip()
        try:
            mode = Path(key_file).stat().st_mode
        except OSError as exc:
            raise CliError(f"cannot read key file {key_file}: {exc.strerror}") from None
        from tenzro_training.keyfiles import shared_mode_problem

        problem = shared_mode_problem(mode)
        if problem is not None:  # warn, not refuse: the key works, but the operator should know
            print(format_stderr_line(f"tenzro: warning: key file {key_file}: {problem}", logging.WARNING),
                  file=sys.stderr)
        if text.startswith("{"):
            from tenzro_training.jsontext import loads_bounded

            try:
                doc = loads_bounded(text, unique_keys=True)  # two private_keys: which one was meant?
            except ValueError as exc:
                raise CliError(f"key file {key_file}: not valid JSON ({exc})") from None
            if not isinstance(doc, dict):
                raise CliError(f"key file {key_file}: expected a JSON object")
            if "private_key" in doc and "accounts" in doc:
                raise CliError(f"key file {key_file}: holds both a private_key and an accounts list; keep one")
            if "private_key" in doc:
                if account is not None:  # it used to be ignored, signing with the one key silently
                    raise CliError(f"--account needs a dev-accounts.json key file; {key_file} holds one private_key")
                text = str(doc["private_key"])
            else:
                text = _select_account(doc, account, key_file)
        elif account is not None:
            raise CliError("--account needs a dev-accounts.json key file")
    else:
        if account is not None:
            raise CliError("--account needs --key-file (a dev-accounts.json file)")
        text = os.environ.get("TENZRO_PRIVATE_KEY", "").strip()  # as a key file's text is
        if not text:
            raise CliError("no signing key: pass --key-file or set TENZRO_PRIVATE_KEY")
    return _parse_key_hex(text, key_file or "TENZRO_PRIVATE_KEY")


def load_signing_key(args: argparse.Namespace) -> bytes:
    """The key named by a command's ``--key-file``/``--account`` (or the environment)."""
    return load_private_key(getattr(args, "key_file", None), getattr(args, "account", None))


def key_address(key: bytes) -> str:
    from eth_account import Account

    return str(Account.from_key(key).address)


def _sign(msg: auth.SignedMessageType, key: bytes, chain_id: int) -> str:
    return "0x" + auth.sign_message(msg, key, chain_id).hex()


# --- output -------------------------------------------------------------------------------------


def _emit(args: argparse.Namespace, result: Any, human: Callable[[Any], str]) -> None:
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(printable_lines(human(result)))


def _kv(result: Any, keys: Sequence[str]) -> str:
    if not isinstance(result, dict):
        return str(result)
    width = max(len(k) for k in keys)
    return "\n".join(f"{k:<{width}}  {result[k]}" for k in keys if k in result)


_HEX_ANSWER_FIELDS = frozenset({"address", "spec_hash", "payload_hash"})
"""Answer fields compared case-insensitively (EIP-55 addresses, hex hashes). Task ids are not:
``0xAb`` and ``0xab`` are two tasks."""


def _check_answer(result: dict[str, Any], method: str, **asked: Any) -> None:
    """A signed call's answer must be about what was asked: this task, this round, these bytes.

    Why: a script trusts exit 0. A node (or anything at ``--rpc``) answering a cancel with
    another task's status, or a submission with another payload hash, made the command report
    success for something that did not happen (CLI probe, 2026-11-26). _HEX_ANSWER_FIELDS compare
    case-insensitively; everything else by type and value (a round of 2.9 or "2" is not round 2)."""
    for key, want in asked.items():
        got = result.get(key)
        if key in _HEX_ANSWER_FIELDS:
            same = isinstance(got, str) and got.lower() == want.lower()
        else:
            same = type(got) is type(want) and got == want
        if not same:
            raise CliError(f"the node's {method} answer says {key} {printable(repr(got), 100)}, not {want!r}: "
                           "it did not do what was asked", EXIT_RPC_ERROR)


def _human_run(run: dict[str, Any]) -> str:
    lines = [
        f"task      {run.get('task_id')}",
        f"status    {run.get('status')}   round {run.get('round')}",
        f"syncer    {run.get('syncer')} (rank {run.get('syncer_rank')})",
    ]
    trainers = run.get("trainers") or []
    lines.append(f"trainers  {len(trainers)}")
    for t in trainers:
        mark = "  SLASHED" if t.get("slashed") else ""
        lines.append(f"  shard {t.get('shard')}: {t.get('address')} stake {t.get('stake')}{mark}")
    counts = run.get("submission_counts")
    if counts is not None:
        lines.append(f"submissions per fragment  {counts}")
    records = run.get("round_records") or []
    lines.append(f"finalized rounds  {len(records)}")
    if run.get("run_root"):
        lines.append(f"run root  {run['run_root']}")
    return "\n".join(lines)


# --- commands -----------------------------------------------------------------------------------


def signing_client(args: argparse.Namespace, key: bytes, timeout: float = 120.0) -> RpcClient:
    """A client for calls signed with ``key``: its refusals can say when the node recovered
    another signer (a wrong --chain-id)."""
    return RpcClient(args.rpc, timeout, signer=(key_address(key), args.chain_id))


_DEFAULT_DATASET_REF = "statsmodels:co2,sunspots,nile,elnino,elec_equip,macrodata"
"""trainer.data.DEFAULT_DATASET_REF, repeated so that building the parser imports no torch
(a test checks they agree)."""

EXAMPLE_SPECS: dict[str, str] = {
    "dev": "dev-task.json",
    "timesfm-200m": "timesfm-200m-task.json",
}
"""The example specs shipped in the package (``tenzro_training/data``), by ``example-spec --name``:
``dev`` posts as-is on a ``tenzro node --dev`` once ``init-checkpoint`` has named its weights (a
small model, 3 trainers, the statsmodels corpus); ``timesfm-200m`` is SPEC.md's example (another
sponsor, 1,024 rounds, an ipfs:// dataset): a template, not postable as it is."""


def cmd_example_spec(args: argparse.Namespace) -> None:
    """Write a shipped example spec where a pip user can edit it: the package's data directory is
    inside site-packages, which the docs cannot point at (packaging probe)."""
    from importlib.resources import files

    from tenzro_training.jsontext import loads_bounded
    from tenzro_training.spec import TrainingTaskSpec

    doc = loads_bounded((files("tenzro_training") / "data" / EXAMPLE_SPECS[args.name]).read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    if args.task_id is not None:
        doc["task_id"] = args.task_id
    if args.sponsor_address is not None:
        doc["sponsor_address"] = args.sponsor_address
    spec = TrainingTaskSpec.from_dict(doc)  # SpecError (exit 2, with the field) for a bad --task-id/--sponsor-address
    _write_out(args.out, (json.dumps(doc, indent=2) + "\n").encode())
    result = {"out": str(args.out), "name": args.name, "task_id": spec.task_id, "sponsor_address": spec.sponsor_address,
              "spec_hash": "0x" + spec.spec_hash().hex()}
    _emit(args, result, lambda r: _kv(r, ["out", "name", "task_id", "sponsor_address", "spec_hash"]))


def cmd_dataset_hash(args: argparse.Namespace) -> None:
    """The ``dataset_hash`` a spec must carry for ``--dataset-ref``: what a trainer recomputes from
    the corpus it loads, and refuses to train on when it differs."""
    from tenzro_training.trainer.data import DatasetError, compute_dataset_hash, load_corpus

    try:
        corpus = load_corpus(args.dataset_ref)
    except DatasetError as exc:
        raise CliError(str(exc)) from None
    result = {"dataset_ref": args.dataset_ref, "dataset_hash": "0x" + compute_dataset_hash(corpus).hex(),
              "series": len(corpus), "points": sum(int(s.values.size) for s in corpus)}
    _emit(args, result, lambda r: _kv(r, ["dataset_ref", "dataset_hash", "series", "points"]))


def cmd_init_checkpoint(args: argparse.Namespace) -> None:
    """A sponsor's first step: the spec names its initial weights (URI + SHA-256) and the node
    verifies them at postTask, so they must exist before the task does."""
    from tenzro_training.jsontext import loads_bounded
    from tenzro_training.spec import TrainingTaskSpec
    from tenzro_training.trainer.model import config_from_spec, count_params, create_init_checkpoint, save_checkpoint

    text = _read_text(args.spec, "spec")
    spec = TrainingTaskSpec.from_json(text)  # SpecError -> exit 2 with the field path
    cfg = config_from_spec(spec)  # UnknownFamily / ModelConfigError -> exit 2
    out = Path(args.out)
    try:
        sha256 = save_checkpoint(create_init_checkpoint(cfg, args.seed), out)
    except OSError as exc:
        raise CliError(f"cannot write {out}: {exc.strerror or exc}") from None
    result = {"out": str(out), "uri": out.resolve().as_uri(), "sha256": sha256, "seed": args.seed,
              "param_count": count_params(cfg)}
    if args.spec_out:
        doc = loads_bounded(text)
        assert isinstance(doc, dict)  # from_json accepted it
        doc["architecture"]["metadata"]["init_checkpoint"] = {"uri": result["uri"], "sha256": sha256}
        TrainingTaskSpec.from_dict(doc)  # still a valid spec
        _write_out(args.spec_out, (json.dumps(doc, indent=2) + "\n").encode())
        result["spec_out"] = str(args.spec_out)
    if spec.architecture.param_count != result["param_count"]:
        print(f"tenzro: note: the spec's architecture.param_count is {spec.architecture.param_count}; "
              f"the model its metadata describes has {result['param_count']}", file=sys.stderr)
    _emit(args, result, lambda r: _kv(r, ["out", "uri", "sha256", "param_count", "spec_out"]))


def cmd_post_task(args: argparse.Namespace) -> None:
    from tenzro_training.spec import TrainingTaskSpec

    spec = TrainingTaskSpec.from_json(_read_text(args.spec, "spec"))  # SpecError -> exit 2 with the field path
    key = load_signing_key(args)
    sig = _sign(auth.PostTask(task_id=spec.task_id, spec_hash=spec.spec_hash()), key, args.chain_id)
    result = signing_client(args, key).call(
        "tenzro_training_postTask", {"spec": spec.to_dict(), "signature": sig}
    )
    _check_answer(result, "postTask", task_id=spec.task_id, spec_hash="0x" + spec.spec_hash().hex())
    _emit(args, result, lambda r: _kv(r, ["task_id", "spec_hash", "status"]))


def cmd_list_runs(args: argparse.Namespace) -> None:
    params: dict[str, Any] = {"offset": args.offset, "limit": args.limit}
    if args.status:
        params["status"] = args.status
    result = RpcClient(args.rpc).call("tenzro_training_listRuns", params)

    def human(r: dict[str, Any]) -> str:
        runs = r.get("runs", [])
        if not runs:
            return "no runs"
        return "\n".join(f"{x.get('task_id')}  {x.get('status')}  round {x.get('round')}" for x in runs)

    _emit(args, result, human)


def cmd_get_run(args: argparse.Namespace) -> None:
    result = RpcClient(args.rpc).call("tenzro_training_getRun", {"task_id": args.task_id})
    _emit(args, result, _human_run)


def cmd_get_receipt(args: argparse.Namespace) -> None:
    result = RpcClient(args.rpc).call("tenzro_training_getReceipt", {"task_id": args.task_id})
    # Checked before --out is written: a bad answer must not replace a good receipt file.
    receipt_obj = result.get("receipt")
    if not isinstance(receipt_obj, dict):
        raise CliError("the node's getReceipt answer has no receipt object", EXIT_RPC_ERROR)
    _check_answer(receipt_obj, "getReceipt", task_id=args.task_id)
    if args.out:
        _write_out(args.out, json.dumps(result, indent=2, sort_keys=True).encode())

    def human(r: dict[str, Any]) -> str:
        receipt = r["receipt"]
        lines = [
            f"task              {receipt.get('task_id')}",
            f"run root          {receipt.get('run_root')}",
            f"final model hash  {receipt.get('final_model_hash')}",
            f"rounds            {len(receipt.get('transcript', []))}",
        ]
        for t in receipt.get("trainers", []):
            lines.append(f"  {t.get('address')}  accepted {t.get('accepted_submissions')}")
        return "\n".join(lines)

    _emit(args, result, human)


def cmd_verify_receipt(args: argparse.Namespace) -> None:
    """Offline verification (receipt_check.py): one line per check; exit 1 if any fails."""
    from tenzro_training.receipt_check import check_receipt_document

    if args.file is not None:
        from tenzro_training.jsontext import loads_bounded

        text = _read_text(args.file, "receipt file")
        try:
            document = loads_bounded(text)
        except ValueError:
            document = None  # not JSON: reported as a failed "decode" check
    else:
        document = RpcClient(args.rpc).call("tenzro_training_getReceipt", {"task_id": args.task_id})
    # From the node: the receipt must be of the run asked for (a valid receipt of another run
    # passes every other check). From a file: the task_id line says which run it is.
    result = check_receipt_document(document, args.chain_id, task_id=args.task_id)
    skipped = ["abi"] if result.get("decode") is None and isinstance(document, dict) and document.get("abi") is None else []
    if args.json:
        checks = [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in result.checks]
        print(json.dumps({"ok": result.ok, "checks": checks, "skipped": skipped}, indent=2, sort_keys=True))
    else:
        width = max(len(c.name) for c in result.checks)
        if args.task_id is None and result.get("decode") is None and isinstance(document, dict):
            named = document["receipt"].get("task_id")  # decoded: a receipt object with a task id
            print(f"task  {printable(str(named))} (named by the file)")
        for c in result.checks:
            print(f"{'ok  ' if c.ok else 'FAIL'}  {c.name:<{width}}  {printable(c.detail)}")
        for name in skipped:
            print(f"skip  {name:<{width}}  the document has no abi bytes (not compared with the receipt)")
    if not result.ok:
        failed = ", ".join(result.failed)
        raise CliError(f"receipt verification failed: {failed}", EXIT_RPC_ERROR)


def compute_artifact_url(rpc_url: str, path: str) -> str:
    """``path`` (``artifacts/v1/...``) under the ``--rpc`` URL, as if that URL ended with "/":
    ``http://proxy/node1`` gives ``http://proxy/node1/artifacts/v1/...``, where its JSON-RPC
    calls go, not the proxy's root as ``urljoin`` would (another node, or none). Its query (an
    RPC provider's key) is kept; its fragment is not sent."""
    import urllib.parse

    parts = urllib.parse.urlsplit(rpc_url)
    prefix = parts.path if parts.path.endswith("/") else parts.path + "/"
    return urllib.parse.urlunsplit(parts._replace(path=prefix + path, fragment=""))


def _artifact_path(task_id: str, *parts: object) -> str:
    """The path of a run artifact relative to ``--rpc`` (docs/cli.md "verify-run"). The task id
    is one percent-encoded segment; ``.`` and ``..`` are encoded as ``%2E`` so that no URL
    resolution (urljoin's, a proxy's) takes them for dot segments."""
    import urllib.parse

    segment = urllib.parse.quote(task_id, safe="")
    if segment in (".", ".."):
        segment = segment.replace(".", "%2E")
    return "/".join(["artifacts/v1/runs", segment, *(str(p) for p in parts)])


def _why_unavailable(exc: Any, what: str) -> Any:
    """ArtifactUnavailable ``exc`` restated for the artifact ``what``: a 410 is a pruned payload
    (``prune_payloads``), which makes the run unverifiable from this node; a 404 one the node
    does not serve (not committed, not accepted, or an older node without the routes)."""
    from tenzro_training.errors import ArtifactUnavailable

    if exc.status == 410:
        return ArtifactUnavailable(f"the node pruned {what} ({exc.reason}): the run cannot be verified from "
                                   "this node", exc.status)
    if exc.status == 404:
        return ArtifactUnavailable(f"the node does not serve {what} ({exc.reason})", exc.status)
    return ArtifactUnavailable(f"{what}: {exc.reason}", exc.status)


BUSY_RETRIES = 10
"""How many times an artifact the node answered 503 (its in-flight byte budget full: docs/rpc.md
"Run artifacts over HTTP") is asked for again, BUSY_RETRY_S apart, before it is a failed check."""
BUSY_RETRY_S = 1.0
"""The wait before asking again (the node's ``Retry-After: 1``)."""


def _fetch_when_room(client: RpcClient, path: str, max_bytes: int) -> bytes:
    """``client.fetch_artifact``, asked again after a 503: a node busy serving other clients
    (or this one's parallel downloads of large payloads) says "retry later", which is not a
    verdict on the run."""
    from tenzro_training.errors import ArtifactUnavailable

    retries = 0
    while True:
        try:
            return client.fetch_artifact(path, max_bytes)
        except ArtifactUnavailable as exc:
            if exc.status != 503 or retries == BUSY_RETRIES:
                raise
        retries += 1
        time.sleep(BUSY_RETRY_S)


def _read_checkpoint_file(path: str, max_bytes: int) -> bytes:
    from storage.files import NotReadable, read_regular_file

    try:
        return read_regular_file(path, max_bytes)
    except NotReadable as exc:
        raise CliError(f"cannot read checkpoint {path}: {exc.reason}") from None


def cmd_verify_run(args: argparse.Namespace) -> None:
    """Recompute a sealed run from the node's URL alone (run_replay.py): the receipt's checks,
    then the spec, checkpoint, every accepted payload, every round and the final model. One
    line per check; exit 1 if any fails or could not run."""
    from tenzro_training.addresses import Address
    from tenzro_training.errors import ArtifactUnavailable
    from tenzro_training.node.checkpoint import parse_checkpoint_bytes
    from concurrent.futures import ThreadPoolExecutor

    from tenzro_training.run_replay import RunSources, verify_run

    client = RpcClient(args.rpc, args.timeout)
    task_id = args.task_id
    max_checkpoint = args.max_checkpoint_bytes or MAX_CHECKPOINT_FILE_BYTES
    document = client.call("tenzro_training_getReceipt", {"task_id": task_id})

    def run_view() -> object:
        try:
            return client.call("tenzro_training_getRun", {"task_id": task_id})
        except CliError as exc:
            if exc.exit_code == EXIT_UNREACHABLE:
                raise
            raise ArtifactUnavailable(str(exc)) from None

    def checkpoint(max_bytes: int) -> bytes:
        if args.checkpoint is not None:
            return _read_checkpoint_file(args.checkpoint, max_bytes)
        try:
            return _fetch_when_room(client, _artifact_path(task_id, "checkpoint"), max_bytes)
        except ArtifactUnavailable as exc:
            raise _why_unavailable(exc, "the init checkpoint") from None

    def payload(round_: int, fragment: int, trainer: Address, max_bytes: int) -> bytes:
        try:
            return _fetch_when_room(client, _artifact_path(task_id, "payloads", round_, fragment, "0x" + trainer.hex()),
                                    max_bytes)
        except ArtifactUnavailable as exc:
            raise _why_unavailable(exc, "the payload") from None

    def model_file(size: int) -> bytes:
        try:
            return _fetch_when_room(client, _artifact_path(task_id, "model"), size)
        except ArtifactUnavailable as exc:
            raise _why_unavailable(exc, "the final model file") from None

    def progress(done: int, total: int) -> None:
        print(f"tenzro: verify-run: {done}/{total} rounds replayed", file=sys.stderr, flush=True)

    where = args.checkpoint or "the node's checkpoint"
    with ThreadPoolExecutor(max_workers=args.downloads, thread_name_prefix="tenzro-verify-run") as downloads:
        sources = RunSources(run_view, checkpoint, lambda data: parse_checkpoint_bytes(data, where), payload,
                             model_file, max_checkpoint, fetch_map=downloads.map)
        result = verify_run(document, sources, chain_id=args.chain_id, task_id=task_id,
                            on_round=progress if sys.stderr.isatty() else None)
    if args.json:
        checks = [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in result.checks]
        print(json.dumps({"ok": result.ok, "checks": checks, "skipped": [c.name for c in result.skipped]},
                         indent=2, sort_keys=True))
    else:
        width = max(len(c.name) for c in (*result.checks, *result.skipped))
        for c in result.checks:
            print(f"{'ok  ' if c.ok else 'FAIL'}  {c.name:<{width}}  {printable(c.detail)}")
        for c in result.skipped:
            print(f"skip  {c.name:<{width}}  {printable(c.detail)}")
    if not result.ok:
        failed = ", ".join(result.failed)
        raise CliError(f"run verification failed: {failed}", EXIT_RPC_ERROR)


def cmd_enroll(args: argparse.Namespace) -> None:
    key = load_signing_key(args)
    address = key_address(key)
    stake = _parse_amount(args.stake, "--stake")
    msg = auth.EnrollTrainer(
        task_id=args.task_id, did=args.did, trainer=parse_address(address), stake=stake
    )
    result = signing_client(args, key).call(
        "tenzro_training_enrollTrainer",
        {
            "task_id": args.task_id,
            "did": args.did,
            "address": address,
            "stake": str(stake),
            "signature": _sign(msg, key, args.chain_id),
        },
    )
    _check_answer(result, "enrollTrainer", task_id=args.task_id, address=address)
    _emit(args, result, lambda r: _kv(r, ["task_id", "address", "shard", "status"]))


def cmd_submit_gradient(args: argparse.Namespace) -> None:
    from tenzro_training.payload import compute_payload_hash

    from storage.files import NotReadable, read_regular_file

    try:
        payload = read_regular_file(args.payload, MAX_INPUT_FILE_BYTES)
    except NotReadable as exc:
        raise CliError(f"cannot read payload {args.payload}: {exc.reason}") from None
    key = load_signing_key(args)
    payload_hash = compute_payload_hash(payload)
    msg = auth.SubmitOuterGradient(
        task_id=args.task_id, round=args.round, fragment=args.fragment, payload_hash=payload_hash
    )
    result = signing_client(args, key).call(
        "tenzro_training_submitOuterGradient",
        {
            "task_id": args.task_id,
            "round": args.round,
            "fragment": args.fragment,
            "payload": base64.b64encode(payload).decode(),
            "signature": _sign(msg, key, args.chain_id),
        },
    )
    _check_answer(result, "submitOuterGradient", task_id=args.task_id, round=args.round, fragment=args.fragment,
                  payload_hash="0x" + payload_hash.hex())
    _emit(args, result, lambda r: _kv(r, ["task_id", "round", "fragment", "payload_hash", "accepted_count", "quorum_reached", "status"]))


def cmd_finalize(args: argparse.Namespace) -> None:
    key = load_signing_key(args)
    client = signing_client(args, key)
    round_ = args.round
    if round_ is None:
        view = client.call("tenzro_training_getRun", {"task_id": args.task_id})
        _check_answer(view, "getRun", task_id=args.task_id)
        round_ = view.get("round")
        if type(round_) is not int or not 0 <= round_ < 2**64:  # int() signed 2.9 as round 2
            raise CliError(f"the node's getRun answer has no round to finalize ({printable(repr(round_), 40)})",
                           EXIT_RPC_ERROR)
    msg = auth.FinalizeRound(task_id=args.task_id, round=round_)
    result = client.call(
        "tenzro_training_finalizeRound",
        {"task_id": args.task_id, "round": round_, "signature": _sign(msg, key, args.chain_id)},
    )
    _check_answer(result, "finalizeRound", task_id=args.task_id, round=round_)
    _emit(args, result, lambda r: _kv(r, ["task_id", "round", "model_hash", "syncer", "syncer_rank", "status", "run_root"]))


def cmd_cancel(args: argparse.Namespace) -> None:
    key = load_signing_key(args)
    msg = auth.CancelTask(task_id=args.task_id)
    result = signing_client(args, key).call(
        "tenzro_training_cancelTask",
        {"task_id": args.task_id, "signature": _sign(msg, key, args.chain_id)},
    )
    _check_answer(result, "cancelTask", task_id=args.task_id, status="Cancelled")
    _emit(args, result, lambda r: _kv(r, ["task_id", "status"]))


def cmd_address(args: argparse.Namespace) -> None:
    address = key_address(load_signing_key(args))
    _emit(args, {"address": address}, lambda r: r["address"])


def _read_spec_file(path: str) -> Any:
    from tenzro_training.spec import TrainingTaskSpec

    return TrainingTaskSpec.from_json(_read_text(path, "spec"), supported_only=False)


def compute_layouts_from_view(view: dict[str, Any]) -> tuple[Any, ...]:
    """The fragment layouts a node serves in getRun (``fragments``), each checked against the
    layout hash the node states for it."""
    from tenzro_training.fragments import FragmentEntry, FragmentLayout

    fragments = view.get("fragments") if isinstance(view, dict) else None
    if not isinstance(fragments, list) or not fragments:
        raise CliError("the node's getRun has no fragment layouts: pass --spec or --checkpoint", EXIT_RPC_ERROR)
    layouts = []
    try:
        for i, frag in enumerate(fragments):
            entries = tuple(
                FragmentEntry(e["name"], tuple(e["shape"]), e["dtype"], e["start"], e["stop"]) for e in frag["entries"]
            )
            layout = FragmentLayout(frag["index"], entries)
            if layout.index != i or "0x" + layout.layout_hash().hex() != frag["layout_hash"]:
                raise ValueError(f"fragment {i}: layout hash mismatch")
            layouts.append(layout)
    except (TenzroError, ValueError, TypeError, KeyError) as exc:
        raise CliError(f"the node's fragment layouts are malformed: {exc}", EXIT_RPC_ERROR) from None
    return tuple(layouts)


def _checkpoint_path(uri: str) -> Path:
    # The node's own parse (one unquote; query, fragment and host refused): the CLI had unquoted
    # twice (url2pathname unquotes again), so a name holding "%" named another file than the node's.
    from tenzro_training.errors import CheckpointError
    from tenzro_training.node.checkpoint import resolve_checkpoint_path

    try:
        return resolve_checkpoint_path(uri, ())
    except CheckpointError as exc:
        raise CliError(f"init checkpoint {uri!r}: {exc.reason}") from None


def compute_task_layouts(spec: Any, checkpoint: str | None = None) -> tuple[Any, ...]:
    """The task's fragment layouts: its init checkpoint (``--checkpoint`` or the spec's
    ``architecture.metadata.init_checkpoint``, hash-checked), widened to fp32, split into F
    fragments."""
    from tenzro_training.fragments import compute_fragment_layouts
    from tenzro_training.trainer.model import load_checkpoint

    ref = spec.init_checkpoint()
    if checkpoint is not None:
        path, sha = Path(checkpoint), None
    elif ref is not None:
        path, sha = _checkpoint_path(ref.uri), ref.sha256
    else:
        raise CliError("the spec names no architecture.metadata.init_checkpoint: pass --checkpoint")
    if sha is None:
        import hashlib

        from storage.files import NotReadable, read_regular_file

        try:
            sha = "0x" + hashlib.sha256(read_regular_file(path, MAX_CHECKPOINT_FILE_BYTES)).hexdigest()
        except NotReadable as exc:
            raise CliError(f"cannot read checkpoint {path}: {exc.reason}") from None
    state = load_checkpoint(path, sha)  # CheckpointError (a TenzroError) -> exit 2
    # The node holds the global model in fp32 whatever architecture.dtype says, and layouts
    # (their hashes name dtypes) are computed from that fp32 state (docs/node.md).
    state = {name: t.float() for name, t in state.items()}
    return compute_fragment_layouts(state, spec.architecture.fragment_count)


def compute_random_gradient(layout: Any, seed: int, task_id: str, round_: int, scale: float) -> Any:
    """A deterministic random outer gradient for one fragment: N(0, scale^2) fp32 values drawn
    from a generator seeded by (seed, task_id, round, fragment). For tests and demos."""
    import hashlib

    import torch

    material = f"tenzro-make-gradient/{seed}/{task_id}/{round_}/{layout.index}".encode()
    gen = torch.Generator(device="cpu").manual_seed(int.from_bytes(hashlib.sha256(material).digest()[:8], "little") >> 1)
    return torch.randn(layout.numel, generator=gen, dtype=torch.float32) * scale


def cmd_make_gradient(args: argparse.Namespace) -> None:
    from tenzro_training.payload import ENCODING_RAW, PayloadHeader, compute_payload_hash, encode_payload

    if args.round < 0:
        raise CliError("--round must be >= 0")
    if not args.scale > 0 or args.scale != args.scale:
        raise CliError("--scale must be a positive number")
    if args.spec or args.checkpoint:
        if not args.spec:
            raise CliError("--checkpoint needs --spec (for the fragment count and task id)")
        spec = _read_spec_file(args.spec)
        task_id = args.task_id or spec.task_id
        layouts = compute_task_layouts(spec, args.checkpoint)
    elif args.task_id:
        task_id = args.task_id
        view = RpcClient(args.rpc).call("tenzro_training_getRun", {"task_id": task_id})
        layouts = compute_layouts_from_view(view)
    else:
        raise CliError("pass --task-id (layouts from the node's getRun) or --spec (layouts from its init checkpoint)")
    if not 0 <= args.fragment < len(layouts):
        raise CliError(f"--fragment must be in 0..{len(layouts) - 1}")
    layout = layouts[args.fragment]
    if 4 * layout.numel > MAX_INPUT_FILE_BYTES:
        # Before allocating: a node's getRun could name any size (1.3 GB for 2^27 elements, a
        # traceback from torch for 2^42). The cap is on the fp32 gradient drawn whatever --dtype:
        # an fp32 payload of it would be more than submit-gradient reads.
        raise CliError(f"fragment {layout.index} has {layout.numel} elements: its fp32 gradient would exceed "
                       f"{MAX_INPUT_FILE_BYTES} bytes, the most submit-gradient reads",
                       EXIT_USAGE if args.spec else EXIT_RPC_ERROR)
    flat = compute_random_gradient(layout, args.random_seed, task_id, args.round, args.scale)
    header = PayloadHeader(task_id, args.round, layout.index, ENCODING_RAW, layout.layout_hash())
    payload = encode_payload(header, layout, flat, args.dtype)
    _write_out(args.out, payload)
    result = {
        "task_id": task_id,
        "round": args.round,
        "fragment": layout.index,
        "elements": layout.numel,
        "bytes": len(payload),
        "payload_hash": "0x" + compute_payload_hash(payload).hex(),
        "out": str(args.out),
    }
    _emit(args, result, lambda r: _kv(r, ["out", "task_id", "round", "fragment", "elements", "bytes", "payload_hash"]))


def _export_from_store(data_dir: Path, task_id: str) -> bytes:
    """The sealed model of ``task_id`` read from the store, opened read-only: it works beside a
    running node, and writes nothing (through a node service it had marked an older store for
    this version, which the old version then refused: upgrade probe)."""
    from storage import open_store
    from storage.interface import StorageError
    from tenzro_training.node.run_store import read_final_model_file

    try:
        store = open_store(data_dir / "db", create=False, read_only=True)
    except StorageError as exc:
        raise CliError(str(exc)) from None
    try:
        return read_final_model_file(store, task_id)
    except TenzroError as exc:
        raise CliError(f"cannot export {task_id}: {exc}", EXIT_RPC_ERROR) from None
    finally:
        store.close()


def cmd_export_model(args: argparse.Namespace) -> None:
    import safetensors.torch

    from tenzro_training.fragments import compute_model_hash

    from storage import schema
    from storage.files import NotReadable, read_regular_file

    try:
        schema.run_key(args.task_id)  # a valid task id is a file name: no "/" to leave models/
    except schema.KeyFormatError as exc:
        raise CliError(str(exc)) from None
    if args.data_dir is None:
        _export_from_node(args)
        return
    data_dir = Path(args.data_dir)
    model_file = data_dir / "models" / f"{args.task_id}.safetensors"
    if model_file.exists():
        try:
            data = read_regular_file(model_file, MAX_CHECKPOINT_FILE_BYTES)
        except NotReadable as exc:
            raise CliError(f"cannot read {model_file}: {exc.reason}") from None
    elif (data_dir / "db").is_dir():
        data = _export_from_store(data_dir, args.task_id)
    else:
        raise CliError(f"{data_dir} is not a node data directory (no db/)")
    try:
        model_hash = compute_model_hash(safetensors.torch.load(data))
    except Exception as exc:  # a damaged file: safetensors raises several exception types
        raise CliError(f"{model_file}: not a readable safetensors model: {exc}") from None
    result = {"task_id": args.task_id, "out": str(args.out), "bytes": len(data), "model_hash": "0x" + model_hash.hex()}
    if args.check_receipt:
        expected = "0x" + _check_receipt_of(RpcClient(args.rpc), args.task_id).final_model_hash.hex()
        if expected != result["model_hash"]:
            raise CliError(f"model hash {result['model_hash']} differs from the receipt's {expected}", EXIT_RPC_ERROR)
        result["receipt_checked"] = True
    _write_out(args.out, data)
    _emit(args, result, lambda r: _kv(r, ["out", "task_id", "bytes", "model_hash", "receipt_checked"]))


def _check_receipt_of(client: RpcClient, task_id: str) -> Any:
    """``task_id``'s receipt (a TrainingReceipt) from ``client``'s node, after the whole offline
    check of it (signatures, election, run root), for this run: any object naming the right
    hash passed before (CLI probe, 2026-11-26)."""
    from tenzro_training.receipt import TrainingReceipt
    from tenzro_training.receipt_check import check_receipt_document

    reply = client.call("tenzro_training_getReceipt", {"task_id": task_id})
    verdict = check_receipt_document(reply, None, task_id=task_id)
    if not verdict.ok:
        raise CliError(f"the node's receipt of {task_id} fails verification "
                       f"({', '.join(verdict.failed)}: see verify-receipt)", EXIT_RPC_ERROR)
    return TrainingReceipt.from_dict(reply["receipt"])  # decoded by the check above


def _export_from_node(args: argparse.Namespace) -> None:
    """export-model without --data-dir: the model file downloaded from the node's
    ``artifacts/v1/runs/T/model``, written only once its receipt verifies and its weights hash to
    the receipt's final model hash. Nothing the node says is trusted but what the receipt's
    checks establish; the file is read whole (at most 16 GiB, as from a data dir) to be hashed."""
    from tenzro_training.errors import ArtifactUnavailable, CheckpointError
    from tenzro_training.fragments import compute_model_hash
    from tenzro_training.global_model import compute_final_model_file_bytes, compute_initial_model
    from tenzro_training.node.checkpoint import parse_checkpoint_bytes

    client = RpcClient(args.rpc)
    receipt = _check_receipt_of(client, args.task_id)
    expected = receipt.final_model_hash
    try:
        data = _fetch_when_room(client, _artifact_path(args.task_id, "model"), MAX_CHECKPOINT_FILE_BYTES)
    except ArtifactUnavailable as exc:
        raise CliError(f"cannot export {args.task_id}: {_why_unavailable(exc, 'the final model file').reason}",
                       EXIT_RPC_ERROR) from None
    try:
        state = parse_checkpoint_bytes(data, "the node's model file")
    except CheckpointError as exc:
        raise CliError(f"the node's model file of {args.task_id} is not a readable model: {exc.reason}",
                       EXIT_RPC_ERROR) from None
    model_hash = compute_model_hash(state)
    if model_hash != expected:
        raise CliError(f"the node's model file of {args.task_id} hashes to 0x{model_hash.hex()}, its receipt's "
                       f"final model hash is 0x{expected.hex()}: not written", EXIT_RPC_ERROR)
    # The right weights are not yet the run's file: its header (dtypes, the metadata naming the
    # run that evaluate-model reads back) is the node's word. The sealed file is a function of
    # the weights and the receipt alone (global_model.compute_final_model_file_bytes), so rebuild
    # it and take the node's bytes only if they are exactly that.
    try:
        split = compute_initial_model(state, receipt.spec.architecture.fragment_count)
        canonical = compute_final_model_file_bytes(args.task_id, receipt.final_model_hash, receipt.run_root,
                                                   split.model, split.weights)
    except TenzroError as exc:
        raise CliError(f"the node's model file of {args.task_id} does not split into the spec's fragments: {exc}",
                       EXIT_RPC_ERROR) from None
    del state, split
    if canonical != data:
        raise CliError(f"the node's model file of {args.task_id} has the receipt's weights but is not the sealed "
                       "model's file (its header or metadata differ): not written", EXIT_RPC_ERROR)
    del canonical
    result = {"task_id": args.task_id, "out": str(args.out), "bytes": len(data), "model_hash": "0x" + model_hash.hex(),
              "receipt_checked": True}
    _write_out(args.out, data)
    _emit(args, result, lambda r: _kv(r, ["out", "task_id", "bytes", "model_hash", "receipt_checked"]))


def _read_model_file(path: str) -> tuple[Any, str, dict[str, str]]:
    """A model file as fp32 tensors, the SHA-256 of its bytes and its safetensors metadata,
    parsed as the node parses an init checkpoint: safetensors only (nothing executed),
    fp32/fp16/bf16 tensors, finite values."""
    import hashlib

    from storage.files import NotReadable, read_regular_file
    from tenzro_training.errors import CheckpointError
    from tenzro_training.node.checkpoint import parse_checkpoint_bytes

    try:
        data = read_regular_file(path, MAX_CHECKPOINT_FILE_BYTES)
    except NotReadable as exc:
        raise CliError(f"cannot read model {path}: {exc.reason}") from None
    try:
        state = parse_checkpoint_bytes(data, path)
    except CheckpointError as exc:
        raise CliError(f"model {path}: {exc.reason}") from None
    # The library parsed the header already: its metadata (export-model's task id and model hash).
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return state, "0x" + hashlib.sha256(data).hexdigest(), metadata if isinstance(metadata, dict) else {}


def cmd_evaluate_model(args: argparse.Namespace) -> None:
    """What the sponsor's sealed model is worth: its validation loss on the spec's held-out
    windows next to the initial model's and simple forecasts' (trainer/evaluation.py)."""
    from tenzro_training.fragments import compute_model_hash
    from tenzro_training.node.checkpoint import load_init_checkpoint
    from tenzro_training.trainer.evaluation import evaluate_models, load_validation_set
    from tenzro_training.trainer.inner import resolve_device

    if not args.model and not args.with_init:
        raise CliError("nothing to evaluate: pass --model FILE (repeatable) and/or --with-init")
    spec = _read_spec_file(args.spec)  # SpecError -> exit 2 with the field path
    device = resolve_device(args.device)
    validation = load_validation_set(spec)  # UnknownFamily, ModelConfigError, DatasetError -> exit 2
    models = []  # (name, file, fp32 state, sha256 of the file)
    if args.with_init:
        ref = spec.init_checkpoint()
        if ref is None:
            raise CliError("--with-init: the spec names no architecture.metadata.init_checkpoint")
        state = load_init_checkpoint(spec, max_bytes=MAX_CHECKPOINT_FILE_BYTES)  # CheckpointError -> exit 2
        models.append(("init_checkpoint", str(_checkpoint_path(ref.uri)), state, ref.sha256))
    notes = []
    for path in args.model or ():
        state, sha256, metadata = _read_model_file(path)
        models.append((path, path, state, sha256))
        # export-model names the run and its final model hash: a model of another run fits the
        # spec's shapes too (one architecture, one corpus for every dev run), so say so.
        exported_from, claimed = metadata.get("tenzro.task_id"), metadata.get("tenzro.model_hash")
        if isinstance(exported_from, str) and exported_from != spec.task_id:
            notes.append(f"model {path} was exported from task {exported_from}, not the spec's {spec.task_id}")
        model_hash = "0x" + compute_model_hash(state).hex()
        if isinstance(claimed, str) and claimed.lower() != model_hash:
            notes.append(f"model {path} says its model hash is {claimed}; its weights hash to {model_hash}")
    evaluation = evaluate_models(validation, [(name, state) for name, _, state, _ in models], device=device)
    result = {"task_id": spec.task_id, "spec_hash": "0x" + spec.spec_hash().hex(), "dataset_ref": spec.dataset_ref,
              "dataset_hash": spec.dataset_hash, "device": str(device), "metric": "mean normalised MSE",
              **evaluation.to_dict()}
    for entry, (_, file, state, sha256) in zip(result["models"], models):
        entry.update(file=file, sha256=sha256, model_hash="0x" + compute_model_hash(state).hex())
    for note in notes:
        print(format_stderr_line(f"tenzro: note: {printable(note)}", logging.WARNING), file=sys.stderr)
    _emit(args, result, _human_evaluation)


def _human_evaluation(r: dict[str, Any]) -> str:
    def loss(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    rows = [(m["name"], loss(m["loss"]), f"model_hash {m['model_hash']}") for m in r["models"]]
    rows += [(f"baseline {b['name']}", loss(b["loss"]), f"({b['note']})" if b["note"] else "") for b in r["baselines"]]
    width = max(len(name) for name, _, _ in rows)
    return "\n".join([
        f"task_id   {r['task_id']}",
        f"dataset   {r['dataset_ref']} (hash checked)",
        f"windows   {r['windows']} held out, context {r['context_len']}, horizon {r['horizon']}",
        f"device    {r['device']}",
        "validation loss (mean normalised MSE; lower is better)",
        *(f"  {name:<{width}}  {value:>7}  {extra}".rstrip() for name, value, extra in rows),
    ])


def _parse_amount(text: str, flag: str) -> int:
    # ASCII digits only: str.isdigit() also accepts "²" (int() then raises) and other scripts' digits.
    if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0"):
        raise CliError(f"{flag} must be a decimal integer (attoTNZO)")
    value = int(text)
    if value >= 2**256:
        raise CliError(f"{flag} exceeds uint256")
    return value


def cmd_keys_new_account(args: argparse.Namespace) -> None:
    from tenzro_training.keyfiles import create_private_file, new_account_document

    doc = new_account_document()
    create_private_file(args.out, json.dumps(doc, indent=2) + "\n")
    _emit(args, {"address": doc["address"], "key_file": str(args.out)},
          lambda r: f"{r['address']}\nkey written to {r['key_file']} (mode 600); use it with --key-file")


def cmd_keys_new_vrf(args: argparse.Namespace) -> None:
    from tenzro_training.keyfiles import create_private_file, new_vrf_document

    stake = _parse_amount(args.stake, "--stake")
    doc = new_vrf_document(args.address)
    out = Path(args.out).absolute()
    create_private_file(out, json.dumps(doc, indent=2) + "\n")
    result = {
        "candidate": {"address": doc["address"], "vrf_public_key": doc["vrf_public_key"], "stake": str(stake)},
        "syncer_identity": {"address": doc["address"], "vrf_secret_file": str(out)},
    }

    def human(r: dict[str, Any]) -> str:
        return (f"VRF secret for {doc['address']} written to {out} (mode 600)\n"
                "every node's config registers the candidate under \"candidates\":\n"
                f"  {json.dumps(r['candidate'])}\n"
                "the node that tickets for it lists it under \"syncer_identities\":\n"
                f"  {json.dumps(r['syncer_identity'])}")

    _emit(args, result, human)


def cmd_audit(args: argparse.Namespace) -> None:
    from storage import open_store
    from storage.interface import StorageError
    from tenzro_training.node.audit import audit_store

    db = Path(args.data_dir) / "db"
    if not db.is_dir():
        raise CliError(f"{args.data_dir} is not a node data directory (no db/)")
    try:
        store = open_store(db, create=False, read_only=True)
    except StorageError as exc:
        raise CliError(str(exc)) from None
    try:
        audits = audit_store(store, args.task_id or None,
                             allowed_dirs=tuple(Path(d).resolve() for d in args.allow_checkpoint_dir or ()),
                             **({} if args.max_checkpoint_bytes is None else {"max_checkpoint_bytes": args.max_checkpoint_bytes}))
    finally:
        store.close()
    result = {"ok": all(a.ok for a in audits), "runs": [a.to_dict() for a in audits]}

    def human(r: dict[str, Any]) -> str:
        lines = []
        for a in r["runs"]:
            head = f"{a['task_id']}: {a['status']}, {a['rounds_replayed']}/{a['rounds_committed']} rounds reproduced"
            if a["ok"]:
                lines.append(f"{head}; equal: {', '.join(a['checks'])}")
            else:
                lines.append(f"{head}; PROBLEM: {a['problem']}")
        return "\n".join(lines) if lines else "no runs in the store"

    _emit(args, result, human)
    if not result["ok"]:
        failed = [a["task_id"] for a in result["runs"] if not a["ok"]]
        raise CliError(f"audit found problems in {len(failed)} run(s): {', '.join(failed)}", EXIT_RPC_ERROR)


def cmd_node(args: argparse.Namespace) -> None:
    from tenzro_training.node.main import run_node_from_args

    run_node_from_args(args)


def cmd_trainer_run(args: argparse.Namespace) -> None:
    from tenzro_training.trainer.process import run_trainer_from_args

    run_trainer_from_args(args)


def cmd_syncer_run(args: argparse.Namespace) -> None:
    from tenzro_training.node.syncer import run_syncer_from_args

    run_syncer_from_args(args)


# --- parser ---------------------------------------------------------------------------------


def _chain_id(text: str) -> int:
    """argparse type: an EIP-712 chain id (1..2^256-1), refused at parse time (exit 2) rather
    than when the first signature is made or checked, perhaps hours later."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a decimal chain id, got {text!r}") from None
    if not 0 < value < 2**256:
        raise argparse.ArgumentTypeError(f"a chain id is 1..2^256-1, got {text}")
    return value


def _checkpoint_bytes(text: str) -> int:
    """argparse type: a size in bytes within the node config's max_checkpoint_bytes bounds."""
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 2**50:
        raise argparse.ArgumentTypeError(f"expected a decimal byte count in 1..2^50, got {text!r}")
    return int(text)


def _downloads(text: str) -> int:
    """argparse type: how many downloads verify-run keeps in flight (1..32: a node counts each
    connection against its per-IP cap, docs/rpc.md "Resource limits")."""
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 32:
        raise argparse.ArgumentTypeError(f"expected a whole number in 1..32, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    """argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _file_path(text: str) -> str:
    """argparse type: a non-empty file path (``""`` would name the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a file path, got an empty string")
    return text


def _seed(text: str) -> int:
    """argparse type: a weights seed, a decimal integer in [0, 2**63)."""
    if not (text.isascii() and text.isdigit()) or int(text) >= 2**63:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**63), got {text!r}")
    return int(text)


def _dir_path(text: str) -> str:
    """argparse type: a non-empty directory path (``""`` would silently mean the current one)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a directory path, got an empty string")
    return text


def _client_flags(p: argparse.ArgumentParser, signing: bool, json_output: bool = True) -> None:
    """``--rpc``, ``--json`` (only for commands that print a result: not the long-running
    trainer and syncer processes, whose output is log lines) and the signing flags."""
    p.add_argument("--rpc", default=os.environ.get("TENZRO_RPC", DEFAULT_RPC),
                   help=f"node JSON-RPC URL (default: $TENZRO_RPC, else {DEFAULT_RPC})")
    if json_output:
        p.add_argument("--json", action="store_true", help="print the raw JSON result")
    if signing:
        p.add_argument("--key-file", help="file holding the signer's private key (else TENZRO_PRIVATE_KEY)")
        p.add_argument("--account", help="with a dev-accounts.json key file: sponsor, trainer:N, syncer:N or an address")
        p.add_argument("--chain-id", type=_chain_id, default=auth.DEFAULT_CHAIN_ID,
                       help=f"EIP-712 chain id (default {auth.DEFAULT_CHAIN_ID}, the dev chain's)")


def build_parser() -> argparse.ArgumentParser:
    from tenzro_training import __version__

    parser = argparse.ArgumentParser(prog="tenzro", description="Tenzro Train node and client")
    parser.add_argument("--version", action="version", version=f"tenzro {__version__}")
    top = parser.add_subparsers(dest="command", required=True)

    node = top.add_parser("node", help="run the node (JSON-RPC service)")
    node.add_argument("--data-dir", required=True, type=_dir_path, help="directory for RocksDB, models and keys")
    node.add_argument("--rpc-host", help="JSON-RPC bind address (default: config rpc_host, 127.0.0.1)")
    node.add_argument("--rpc-port", type=int, help="JSON-RPC port, 0 = any free port (default: config rpc_port, 8545)")
    node.add_argument("--config", help="node config JSON file (docs/node.md)")
    node.add_argument("--dev", action="store_true", help="dev genesis: funded accounts in <data-dir>/dev-accounts.json")
    node.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    node.add_argument("--log-format", default="text", choices=["text", "json"],
                      help="stderr log lines: text, or one JSON object per line for a log collector (docs/cli.md)")
    node.add_argument("--p2p-listen", action="append", metavar="MULTIADDR",
                      help="turn on gossip: libp2p listen address, e.g. /ip4/127.0.0.1/tcp/0 (repeatable)")
    node.add_argument("--p2p-key", help="libp2p identity key file (default <data-dir>/p2p-key, created 0600)")
    node.add_argument("--bootstrap", action="append", metavar="MULTIADDR", help="peer to dial at start (repeatable)")
    node.set_defaults(func=cmd_node)

    audit = top.add_parser(
        "audit", help="recompute a node's runs from their checkpoints and stored payloads; compare with its records",
        description="Replays every committed round of each run from its initial checkpoint and the stored "
                    "payloads and checks the round records, reports, snapshots, final weights, run root and "
                    "receipt. Opens the store read-only: it can run beside the node. Exit status 1 when a "
                    "difference is found (docs/node.md \"Auditing a store\").",
    )
    audit.add_argument("--data-dir", required=True, type=_dir_path, help="the node's data directory")
    audit.add_argument("--task-id", action="append", help="audit only this run (repeatable; default: every run)")
    audit.add_argument("--allow-checkpoint-dir", action="append", metavar="DIR",
                       help="read init checkpoints only under DIR (repeatable; default: wherever the spec points)")
    audit.add_argument("--max-checkpoint-bytes", type=_checkpoint_bytes, metavar="N", help="largest init checkpoint read (default 16 GiB, the node's default; "
                                         "set it to the node's max_checkpoint_bytes when that is larger)")
    audit.add_argument("--json", action="store_true", help="print the result as JSON")
    audit.set_defaults(func=cmd_audit)

    train = top.add_parser("train", help="sponsor, trainer and syncer calls").add_subparsers(
        dest="verb", required=True
    )
    p = train.add_parser("example-spec", help="write a shipped example TrainingTaskSpec to edit or post")
    p.add_argument("--name", choices=sorted(EXAMPLE_SPECS), default="dev",
                   help="dev (default): posts as-is on a --dev node after init-checkpoint; "
                        "timesfm-200m: SPEC.md's example, a template")
    p.add_argument("--task-id", help="replace the example's task_id (a node takes each task_id once)")
    p.add_argument("--sponsor-address", help="replace the example's sponsor_address (the signing key's address)")
    p.add_argument("--out", required=True, type=_file_path, help="the spec file to write")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_example_spec)

    p = train.add_parser("dataset-hash", help="the dataset_hash a spec needs for a statsmodels: dataset_ref")
    p.add_argument("--dataset-ref", default=_DEFAULT_DATASET_REF,
                   help=f"statsmodels:NAME[,NAME...] (default {_DEFAULT_DATASET_REF})")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_dataset_hash)

    p = train.add_parser("init-checkpoint",
                         help="write the initial model a spec's metadata describes, and its URI and SHA-256")
    p.add_argument("--spec", required=True, help="the TrainingTaskSpec (its init_checkpoint, if any, is ignored)")
    p.add_argument("--out", required=True, type=_file_path, help="the safetensors file to write")
    p.add_argument("--seed", type=_seed, default=0, help="weights seed: the same spec and seed give the same file (default 0)")
    p.add_argument("--spec-out", type=_file_path, help="also write the spec with architecture.metadata.init_checkpoint set")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_init_checkpoint)

    p = train.add_parser("post-task", help="post a TrainingTaskSpec (signed by its sponsor)")
    p.add_argument("--spec", required=True)
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_post_task)

    p = train.add_parser("list-runs", help="list the node's runs (optionally of one status), a page at a time")
    p.add_argument("--status")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--limit", type=int, default=50)
    _client_flags(p, signing=False)
    p.set_defaults(func=cmd_list_runs)

    for verb, func, text in (
        ("get-run", cmd_get_run, "show a run: status, round, trainers, syncer, deadlines, committed rounds"),
        ("get-receipt", cmd_get_receipt, "show a sealed run's TrainingReceipt"),
    ):
        p = train.add_parser(verb, help=text)
        p.add_argument("--task-id", required=True)
        if verb == "get-receipt":
            p.add_argument("--out", type=_file_path,
                           help="also write the whole result (receipt, abi, attestations) to this file")
        _client_flags(p, signing=False)
        p.set_defaults(func=func)

    p = train.add_parser("verify-receipt", help="re-check a receipt, its election and its signatures offline")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--task-id", help="fetch the receipt with getReceipt from --rpc")
    source.add_argument("--file", help="a file written by get-receipt --out")
    p.add_argument("--chain-id", type=_chain_id, help="EIP-712 chain id to verify under (default: the attestations')")
    _client_flags(p, signing=False)
    p.set_defaults(func=cmd_verify_receipt)

    p = train.add_parser("verify-run", help="recompute a sealed run from the node's URL: receipt, checkpoint, "
                                            "every accepted payload, every round, the final model")
    p.add_argument("--task-id", required=True)
    p.add_argument("--checkpoint", type=_file_path, metavar="FILE",
                   help="the init checkpoint, from a source of your own (default: downloaded from the node); "
                        "checked against the spec's SHA-256 either way")
    p.add_argument("--chain-id", type=_chain_id, help="EIP-712 chain id to verify under (default: the attestations')")
    p.add_argument("--max-checkpoint-bytes", type=_checkpoint_bytes, metavar="N",
                   help="largest init checkpoint read (default 16 GiB, the node's default)")
    p.add_argument("--timeout", type=_seconds, default=120.0, metavar="SECONDS",
                   help="limit on each request to the node, a download included (default 120)")
    p.add_argument("--downloads", type=_downloads, default=4, metavar="N",
                   help="payload downloads in flight at once, 1..32 (default 4)")
    _client_flags(p, signing=False)
    p.set_defaults(func=cmd_verify_run)

    p = train.add_parser("enroll-trainer", help="enroll the signer as a trainer, bonding --stake")
    p.add_argument("--task-id", required=True)
    p.add_argument("--did", required=True)
    p.add_argument("--stake", required=True, help="attoTNZO")
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_enroll)

    p = train.add_parser("submit-gradient", help="submit an outer-gradient payload file inline (signed by the trainer)")
    p.add_argument("--task-id", required=True)
    p.add_argument("--round", type=int, required=True)
    p.add_argument("--fragment", type=int, required=True)
    p.add_argument("--payload", required=True, help="safetensors OuterGradient payload file")
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_submit_gradient)

    p = train.add_parser("finalize-round", help="finalize the run's current round (signed by its syncer)")
    p.add_argument("--task-id", required=True)
    p.add_argument("--round", type=int, help="defaults to the run's current round")
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_finalize)

    p = train.add_parser("cancel-task", help="sponsor cancels before training starts")
    p.add_argument("--task-id", required=True)
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_cancel)

    p = train.add_parser("make-gradient", help="write a random OuterGradient payload file (tests, demos)")
    p.add_argument("--task-id", help="the run (default: the spec's task_id); alone, layouts come from the node")
    p.add_argument("--round", type=int, required=True)
    p.add_argument("--fragment", type=int, required=True)
    p.add_argument("--spec", help="the task's spec file (else read from the node)")
    p.add_argument("--checkpoint", help="model checkpoint giving the layout (default: the spec's init_checkpoint)")
    p.add_argument("--random-seed", type=int, default=0, help="same seed, task, round, fragment -> same payload")
    p.add_argument("--scale", type=float, default=1e-3, help="standard deviation of the values")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--out", required=True, type=_file_path, help="payload file to write")
    _client_flags(p, signing=False)
    p.set_defaults(func=cmd_make_gradient)

    p = train.add_parser("export-model", help="write the sealed final model of a run (safetensors)")
    p.add_argument("--task-id", required=True)
    p.add_argument("--data-dir", type=_dir_path,
                   help="the node's data directory (default: download the model from --rpc, checked against "
                        "the verified receipt)")
    p.add_argument("--out", required=True, type=_file_path)
    p.add_argument("--check-receipt", action="store_true",
                   help="compare its hash with the node's verified receipt (always done without --data-dir)")
    _client_flags(p, signing=False)
    p.set_defaults(func=cmd_export_model)

    p = train.add_parser("evaluate-model",
                         help="score model files on the spec's held-out windows, beside simple forecasts")
    p.add_argument("--spec", required=True, help="the run's TrainingTaskSpec (its dataset and architecture)")
    p.add_argument("--model", action="append", type=_file_path, metavar="FILE",
                   help="a safetensors model: export-model's or init-checkpoint's output (repeatable)")
    p.add_argument("--with-init", action="store_true",
                   help="also score the init checkpoint the spec names (checked against its SHA-256)")
    p.add_argument("--device", default="cpu", help="cpu (the default), auto, cuda, cuda:N or mps")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_evaluate_model)

    p = train.add_parser("address", help="print the address of the signing key")
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_address)

    trainer = top.add_parser("trainer", help="trainer process").add_subparsers(dest="verb", required=True)
    p = trainer.add_parser("run", help="enroll, then train and submit every round over gossip until Sealed")
    p.add_argument("--task-id", required=True)
    p.add_argument("--spec", help="the task's spec JSON (default: the one the node serves); checked against the "
                                  "run's spec hash either way")
    p.add_argument("--p2p-key", required=True, help="libp2p identity key file (created 0600 if missing)")
    p.add_argument("--bootstrap", action="append", required=True, metavar="MULTIADDR", help="the node's p2p address (repeatable; weights are taken only from the peers these name)")
    p.add_argument("--p2p-listen", action="append", metavar="MULTIADDR", help="default /ip4/127.0.0.1/tcp/0")
    p.add_argument("--rounds", type=int, help="stop after training this many rounds")
    p.add_argument("--did", help="default did:tenzro:trainer:<address>")
    p.add_argument("--stake", default=str(10**18), help="attoTNZO (default 1e18)")
    p.add_argument("--device", default="auto",
                   help="inner-loop device: auto (CUDA, else MPS, else CPU; the default), cpu, cuda, cuda:N, mps")
    p.add_argument("--batch-size", type=int, default=16, metavar="N",
                   help="windows per inner step (default 16; the trainer's own choice, not the protocol's: a GPU "
                        "trains more windows per second at a larger batch)")
    p.add_argument("--carry-optimizer-state", action="store_true",
                   help="keep the inner AdamW moments from round to round, as DiLoCo's workers do (default: a "
                        "fresh AdamW state every round)")
    p.add_argument("--max-round-wait", type=float, default=6 * 3600.0, metavar="SECONDS",
                   help="safety net: give up on a round not finalized, or on a run not training after enrolling, "
                        "after this long (default 21600); the wait normally ends with the round or at the "
                        "deadline the node reports")
    p.add_argument("--state-dir", help="where payloads are kept until their round is finalized (a restart "
                                       "resubmits the same bytes) and the record of every payload signed "
                                       "(slashing protection: never delete it) (default <dir of "
                                       "--p2p-key>/tenzro-trainer-state)")
    _client_flags(p, signing=True, json_output=False)
    p.set_defaults(func=cmd_trainer_run)

    keys = top.add_parser("keys", help="create account keys and syncer VRF secrets").add_subparsers(
        dest="verb", required=True
    )
    p = keys.add_parser("new-account", help="a new secp256k1 account key file (mode 600, never overwritten)")
    p.add_argument("--out", required=True, type=_file_path, help="the key file to create")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_keys_new_account)
    p = keys.add_parser("new-vrf", help="a new ECVRF secret for a syncer candidate, and its config entries")
    p.add_argument("--address", required=True, help="the candidate's account address")
    p.add_argument("--stake", required=True, help="the candidate's registered stake (attoTNZO)")
    p.add_argument("--out", required=True, type=_file_path, help="the secret file to create (mode 600, never overwritten)")
    p.add_argument("--json", action="store_true", help="print the config entries as JSON")
    p.set_defaults(func=cmd_keys_new_vrf)

    syncer = top.add_parser("syncer", help="syncer daemon").add_subparsers(dest="verb", required=True)
    p = syncer.add_parser("run", help="finalize rounds as soon as quorum and the grace window allow")
    p.add_argument("--poll-interval", type=float, default=0.5, metavar="SECONDS",
                   help="seconds between passes (default 0.5)")
    p.add_argument("--once", action="store_true", help="make one pass and exit (for scripts)")
    _client_flags(p, signing=True, json_output=False)
    p.set_defaults(func=cmd_syncer_run)
    _mark_command_parsers(parser)
    return parser


def _mark_command_parsers(parser: argparse.ArgumentParser) -> None:
    """Give every (sub)command's namespace the parser that owns it (``command_parser``), so an
    unknown flag is reported with that command's usage line: argparse reports leftovers from
    the top parser, and `tenzro node --confg x` showed `tenzro [-h] {node,...}`."""
    for action in parser._actions:  # argparse has no public walk over its subcommands
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(command_parser=sub)
                _mark_command_parsers(sub)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
        args.func(args)
    except CliError as exc:
        print(format_stderr_line(f"tenzro: {printable(str(exc))}"), file=sys.stderr)
        return exc.exit_code
    except TenzroError as exc:  # local validation (spec, address, signing inputs)
        print(format_stderr_line(f"tenzro: {printable(str(exc))}"), file=sys.stderr)
        return EXIT_USAGE
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
        if not RpcClient.answers:  # no node answer was read: a bug of this program, with its traceback
            raise
        # A well-formed JSON-RPC answer whose fields are not what this command reads.
        print(format_stderr_line(f"tenzro: cannot read the node's answer ({type(exc).__name__}: "
                                 f"{printable(str(exc), 300)})"), file=sys.stderr)
        return EXIT_RPC_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of our output went away (`tenzro ... --json | head`): no traceback, and
        # stdout pointed at /dev/null so the interpreter's flush at exit does not fail again.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE
    return EXIT_OK


if __name__ == "__main__":
    # `python -m tenzro_training.cli` runs this file as __main__, a second copy of the module:
    # its CliError is not the one the trainer and node modules raise (they import
    # tenzro_training.cli), so their failures fell through to the generic exit 2 (an unreachable
    # node: 2 instead of 3; trainer restart probe). Run the one imported module instead.
    from tenzro_training.console import main as _console_main

    sys.exit(_console_main())
