"""Unit tests of the ``tenzro`` CLI: argument parsing, key loading, exit codes, offline helpers,
the syncer daemon's decision rule and the dev genesis accounts.

The node side is faked by a tiny stdlib HTTP server answering canned JSON-RPC replies, so these
tests need no node process (tests/e2e covers the real one).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tenzro_training import auth, cli
from tenzro_training.cli import EXIT_OK, EXIT_RPC_ERROR, EXIT_UNREACHABLE, EXIT_USAGE, CliError
from tenzro_training.cli import client as cli_client, files as cli_files, keys as cli_keys, layouts as cli_layouts
from tenzro_training.cli import model_commands, operator_commands, run_commands, spec_commands
from tenzro_training.cli import parser as cli_parser

KEY = bytes.fromhex("4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318")
KEY_ADDRESS = "0x2c7536E3605D9C16a7a3D7b1898e529396a65c23"


# --- a canned JSON-RPC endpoint ----------------------------------------------------------------


class FakeNode:
    """Answers each method from ``replies`` (a result, or ``{"error": {...}}``) or, verbatim, from
    ``raw`` (bytes: a node that is not one); records calls."""

    def __init__(self) -> None:
        self.replies: dict[str, Any] = {}
        self.raw: dict[str, bytes] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.headers: list[dict[str, str]] = []
        node = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                node.calls.append((body["method"], body["params"]))
                node.headers.append(dict(self.headers))
                reply = node.replies.get(body["method"], {"error": {"code": -32601, "message": "method not found"}})
                if isinstance(reply, dict) and set(reply) == {"error"}:
                    out = {"jsonrpc": "2.0", "id": body["id"], "error": reply["error"]}
                else:
                    out = {"jsonrpc": "2.0", "id": body["id"], "result": reply}
                data = node.raw.get(body["method"]) or json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_node() -> Iterator[FakeNode]:
    node = FakeNode()
    yield node
    node.close()


@pytest.fixture
def closed_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "key.hex"
    path.write_text("0x" + KEY.hex() + "\n")
    path.chmod(0o600)  # as `tenzro keys new` writes it: no "readable by others" warning on stderr
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- parsing -----------------------------------------------------------------------------------


def test_parser_keeps_the_seed_commands_and_flags() -> None:
    parser = cli.build_parser()
    a = parser.parse_args(["train", "post-task", "--spec", "s.json"])
    assert a.func is run_commands.cmd_post_task and a.spec == "s.json" and a.rpc == cli.DEFAULT_RPC
    a = parser.parse_args(["train", "list-runs"])
    assert a.func is run_commands.cmd_list_runs and (a.offset, a.limit, a.status) == (0, 50, None)
    a = parser.parse_args(["train", "get-run", "--task-id", "t1"])
    assert a.func is run_commands.cmd_get_run and a.task_id == "t1"
    a = parser.parse_args(["train", "get-receipt", "--task-id", "t1"])
    assert a.func is run_commands.cmd_get_receipt and a.out is None
    a = parser.parse_args(["train", "enroll-trainer", "--task-id", "t", "--did", "did:tenzro:trainer:x", "--stake", "5"])
    assert a.func is run_commands.cmd_enroll and a.stake == "5"
    a = parser.parse_args(
        ["train", "submit-gradient", "--task-id", "t", "--round", "3", "--fragment", "1", "--payload", "p"]
    )
    assert a.func is run_commands.cmd_submit_gradient and (a.round, a.fragment) == (3, 1)
    a = parser.parse_args(["train", "finalize-round", "--task-id", "t"])
    assert a.func is run_commands.cmd_finalize and a.round is None
    a = parser.parse_args(["train", "cancel-task", "--task-id", "t", "--json"])
    assert a.func is run_commands.cmd_cancel and a.json
    a = parser.parse_args(["train", "address", "--key-file", "k", "--account", "trainer:2"])
    assert a.func is run_commands.cmd_address and a.account == "trainer:2"


def test_parser_node_syncer_and_helpers() -> None:
    parser = cli.build_parser()
    a = parser.parse_args(["node", "--data-dir", "d", "--dev", "--rpc-port", "0"])
    assert a.func is operator_commands.cmd_node and a.dev and a.rpc_port == 0 and a.rpc_host is None and a.config is None
    a = parser.parse_args(["syncer", "run", "--key-file", "k", "--once", "--poll-interval", "0.2"])
    assert a.func is operator_commands.cmd_syncer_run and a.once and a.poll_interval == 0.2
    a = parser.parse_args(["train", "make-gradient", "--round", "0", "--fragment", "1", "--spec", "s", "--out", "o"])
    assert a.func is spec_commands.cmd_make_gradient and a.random_seed == 0 and a.dtype == "float32"
    a = parser.parse_args(["train", "export-model", "--task-id", "t", "--data-dir", "d", "--out", "o"])
    assert a.func is model_commands.cmd_export_model and not a.check_receipt


def test_rpc_env_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENZRO_RPC", "http://10.0.0.1:9000")
    assert cli.build_parser().parse_args(["train", "list-runs"]).rpc == "http://10.0.0.1:9000"


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "get-run"],  # --task-id missing
        ["train", "submit-gradient", "--task-id", "t", "--round", "x", "--fragment", "0", "--payload", "p"],
        ["train", "frobnicate"],
        ["node"],  # --data-dir missing
        ["train", "export-model", "--task-id", "t"],  # --out missing: there is nowhere to write the model
        ["train", "evaluate-model", "--model", "m.safetensors"],  # --spec missing: no held-out windows to score on
        ["train"], ["keys"], ["trainer"], ["syncer"],  # a command group without its verb
        ["train", "get-run", "--task-id", "t", "--key-file", "k"],  # a read-only call signs nothing
        ["train", "finalize-round"],  # --task-id missing: nothing to sign a finalize for
        [],
    ],
)
def test_invalid_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == EXIT_USAGE
    assert "usage:" in capsys.readouterr().err


# --- keys --------------------------------------------------------------------------------------


def test_key_from_hex_file_json_and_env(tmp_path: Path, key_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli_keys.load_private_key(str(key_file)) == KEY
    bare = tmp_path / "bare"
    bare.write_text(KEY.hex())
    assert cli_keys.load_private_key(str(bare)) == KEY
    js = tmp_path / "k.json"
    js.write_text(json.dumps({"private_key": "0x" + KEY.hex()}))
    assert cli_keys.load_private_key(str(js)) == KEY
    monkeypatch.setenv("TENZRO_PRIVATE_KEY", "0x" + KEY.hex())
    assert cli_keys.load_private_key(None) == KEY
    monkeypatch.setenv("TENZRO_PRIVATE_KEY", "  0x" + KEY.hex() + "\n")  # surrounding space, as in a file
    assert cli_keys.load_private_key(None) == KEY
    assert cli_keys.key_address(KEY) == KEY_ADDRESS


def test_a_key_file_others_can_read_works_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k"
    path.write_text(KEY.hex())
    path.chmod(0o644)
    assert cli_keys.load_private_key(str(path)) == KEY
    assert "mode 644 allows group/other access (chmod 600 it)" in capsys.readouterr().err
    path.chmod(0o600)
    assert cli_keys.load_private_key(str(path)) == KEY
    assert capsys.readouterr().err == ""


def test_key_from_dev_accounts_file(tmp_path: Path) -> None:
    keys = {("sponsor", 0): "11" * 32, ("trainer", 0): "22" * 32, ("trainer", 1): "33" * 32}
    doc = {
        "chain_id": 1337,
        "accounts": [
            {"role": r, "index": i, "address": cli_keys.key_address(bytes.fromhex(k)), "private_key": "0x" + k}
            for (r, i), k in keys.items()
        ],
    }
    path = tmp_path / "dev-accounts.json"
    path.write_text(json.dumps(doc))
    assert cli_keys.load_private_key(str(path), "sponsor") == bytes.fromhex("11" * 32)
    assert cli_keys.load_private_key(str(path), "trainer:1") == bytes.fromhex("33" * 32)
    assert cli_keys.load_private_key(str(path), "TRAINER:0") == bytes.fromhex("22" * 32)
    address = doc["accounts"][2]["address"]
    assert cli_keys.load_private_key(str(path), address.lower()) == bytes.fromhex("33" * 32)


def test_invalid_dev_accounts_selection(tmp_path: Path, key_file: Path) -> None:
    path = tmp_path / "dev-accounts.json"
    one = {"role": "trainer", "index": 0, "private_key": "0x" + "22" * 32}
    path.write_text(json.dumps({"accounts": [one]}))
    assert cli_keys.load_private_key(str(path)) == bytes.fromhex("22" * 32)  # one entry: nothing to pick
    with pytest.raises(CliError, match="no account 'trainer:7'"):
        cli_keys.load_private_key(str(path), "trainer:7")
    path.write_text(json.dumps({"accounts": [one, {**one, "index": 1, "private_key": "0x" + "33" * 32}]}))
    with pytest.raises(CliError) as info:
        cli_keys.load_private_key(str(path))
    assert str(info.value).endswith("holds 2 accounts: pick one with --account (trainer:0, trainer:1)")
    path.write_text(json.dumps({"accounts": []}))
    with pytest.raises(CliError, match="accounts list has no entries"):
        cli_keys.load_private_key(str(path))
    # A single-key JSON file with --account: refused (the flag used to be ignored silently).
    path.write_text(json.dumps({"private_key": "0x" + "22" * 32}))
    with pytest.raises(CliError, match="--account needs a dev-accounts.json key file"):
        cli_keys.load_private_key(str(path), "trainer:1")
    path.write_text(json.dumps({"private_key": "0x" + "22" * 32, "accounts": [one]}))
    with pytest.raises(CliError, match="both a private_key and an accounts list"):
        cli_keys.load_private_key(str(path), "trainer:0")
    with pytest.raises(CliError, match="dev-accounts.json"):
        cli_keys.load_private_key(str(key_file), "trainer:0")
    with pytest.raises(CliError, match="--key-file"):
        cli_keys.load_private_key(None, "trainer:0")


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("0x1234", "32 bytes"),
        ("zz" * 32, "32 bytes"),
        ("{\"private_key\": \"0x12\"}", "32 bytes"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "32 bytes"),
        ("{\"nothing\": 1}", "accounts"),
        ("00" * 32, "not a valid secp256k1 private key"),  # 32 bytes of hex, but not in 1..n-1
        ("ff" * 32, "not a valid secp256k1 private key"),
        # CLI probe (stop 20): the second of two keys was used silently.
        ('{"private_key": "0x' + "11" * 32 + '", "private_key": "0x' + "22" * 32 + '"}', "duplicate key 'private_key'"),
    ],
)
def test_invalid_key_file(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "bad"
    path.write_text(content)
    with pytest.raises(CliError, match=match) as info:
        cli_keys.load_private_key(str(path))
    assert info.value.exit_code == EXIT_USAGE


@pytest.mark.parametrize("key", ["0x" + "00" * 32, "0x" + "ff" * 32])
def test_invalid_out_of_range_key_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    monkeypatch.setenv("TENZRO_PRIVATE_KEY", key)
    code, out, err = run(capsys, "train", "address")
    assert code == EXIT_USAGE and out == ""
    assert err == "tenzro: TENZRO_PRIVATE_KEY: not a valid secp256k1 private key (must be in 1..n-1)\n"


def test_invalid_missing_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENZRO_PRIVATE_KEY", raising=False)
    with pytest.raises(CliError, match="no signing key"):
        cli_keys.load_private_key(None)
    with pytest.raises(CliError, match="cannot read key file"):
        cli_keys.load_private_key(str(tmp_path / "absent"))


def test_address_command(capsys: pytest.CaptureFixture[str], key_file: Path) -> None:
    code, out, _ = run(capsys, "train", "address", "--key-file", str(key_file))
    assert code == EXIT_OK and out.strip() == KEY_ADDRESS
    code, out, _ = run(capsys, "train", "address", "--key-file", str(key_file), "--json")
    assert json.loads(out) == {"address": KEY_ADDRESS}


# --- exit codes over the wire ----------------------------------------------------------------------


def test_unreachable_node_exits_3(capsys: pytest.CaptureFixture[str], closed_url: str) -> None:
    code, out, err = run(capsys, "train", "list-runs", "--rpc", closed_url)
    assert code == EXIT_UNREACHABLE and out == ""
    assert err.startswith("tenzro: cannot reach node") and err.count("\n") == 1


def test_node_error_exits_1(capsys: pytest.CaptureFixture[str], fake_node: FakeNode) -> None:
    fake_node.replies["tenzro_training_getRun"] = {
        "error": {"code": 1301, "message": "unknown task nope", "data": {"type": "UnknownTask", "task_id": "nope"}}
    }
    code, out, err = run(capsys, "train", "get-run", "--task-id", "nope", "--rpc", fake_node.url)
    assert code == EXIT_RPC_ERROR and out == ""
    assert err.strip() == "tenzro: error 1301 UnknownTask: unknown task nope"


def test_a_node_error_type_that_is_not_a_name_is_left_out(capsys: pytest.CaptureFixture[str], fake_node: FakeNode) -> None:
    """The error's data type is shown as the error's name only when it is one (a non-empty
    string): a number or an object there is not a name, and printing it would misname the
    node's error."""
    for kind in (1301, {"name": "UnknownTask"}, ""):
        fake_node.replies["tenzro_training_getRun"] = {"error": {"code": 1301, "message": "unknown task",
                                                                 "data": {"type": kind}}}
        code, out, err = run(capsys, "train", "get-run", "--task-id", "t", "--rpc", fake_node.url)
        assert (code, out, err) == (EXIT_RPC_ERROR, "", "tenzro: error 1301: unknown task\n"), kind


def _list_runs_answered(capsys: pytest.CaptureFixture[str], status: bytes, body: bytes) -> tuple[int, str, str, str]:
    """``tenzro train list-runs`` against a node that answers ``status`` with the JSON ``body``:
    the exit status, stdout, stderr and the node's URL."""
    node = _RawNode(lambda conn: conn.sendall(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\n"
                                              b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                                              % (status, len(body), body)))
    try:
        code, out, err = run(capsys, "train", "list-runs", "--rpc", node.url)
    finally:
        node.close()
    return code, out, err, node.url


def test_a_json_rpc_error_sent_with_http_400_is_the_nodes_error(capsys: pytest.CaptureFixture[str]) -> None:
    """JSON-RPC servers answer a refused call with a 4xx status and the error in the body: a 400
    is the node's answer (exit 1, its code and message), not a redirect or an unreachable node."""
    body = b'{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"invalid params"}}'
    code, out, err, _url = _list_runs_answered(capsys, b"400 Bad Request", body)
    assert (code, out, err) == (EXIT_RPC_ERROR, "", "tenzro: error -32602: invalid params\n")


def test_invalid_http_300_is_a_redirect_even_with_an_answer_in_its_body(capsys: pytest.CaptureFixture[str]) -> None:
    """Every 3xx names another place to ask, 300 (Multiple Choices) included: its body is not
    read as the node's answer, however much it looks like one."""
    body = b'{"jsonrpc":"2.0","id":1,"result":{"runs":[]}}'
    code, out, err, url = _list_runs_answered(capsys, b"300 Multiple Choices", body)
    assert code == EXIT_UNREACHABLE and out == ""
    assert err == f"tenzro: node at {url} answered HTTP 300 (a redirect, which is not followed: pass the URL it names as --rpc)\n"


def test_a_node_error_carries_its_code(fake_node: FakeNode, closed_url: str) -> None:
    fake_node.replies["tenzro_training_getRun"] = {"error": {"code": 1305, "message": "late", "data": {"type": "LateSubmission"}}}
    with pytest.raises(CliError) as info:
        cli.RpcClient(fake_node.url).call("tenzro_training_getRun", {"task_id": "t"})
    assert info.value.rpc_code == 1305 and info.value.exit_code == EXIT_RPC_ERROR
    with pytest.raises(CliError) as info:  # not a node answer: no code
        cli.RpcClient(closed_url).call("tenzro_training_getRun", {"task_id": "t"})
    assert info.value.rpc_code is None


def test_non_json_rpc_answer_exits_3(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    class Plain(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<html>not json</html>")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code, _, err = run(capsys, "train", "list-runs", "--rpc", f"http://127.0.0.1:{server.server_address[1]}/")
    finally:
        server.shutdown()
        server.server_close()
    assert code == EXIT_UNREACHABLE and "did not answer JSON-RPC" in err


@pytest.mark.parametrize(("status", "note"), [(200, ""), (502, " (HTTP 502)")])
def test_invalid_non_json_answer_names_an_error_status(status: int, note: str) -> None:
    """A proxy's error page in place of the node's answer: the status it came with says where
    to look (the proxy, not the node), and a 200 has nothing to add."""
    reason = b"OK" if status == 200 else b"Bad Gateway"
    node = _RawNode(lambda c: c.sendall(b"HTTP/1.1 %d %s\r\nContent-Length: 6\r\nConnection: close\r\n\r\n<html>"
                                        % (status, reason)))
    try:
        with pytest.raises(CliError) as info:
            cli.RpcClient(node.url).call("tenzro_training_listRuns", {})
    finally:
        node.close()
    assert str(info.value) == f"node at {node.url} did not answer JSON-RPC{note}"
    assert info.value.exit_code == EXIT_UNREACHABLE


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:abc/", "ftp2://127.0.0.1/", "127.0.0.1:8545", "foo", "", "http://[::1",
            "file:///etc/hostname", "data:,{}", "ftp://127.0.0.1/",  # urllib opens these three
            "http://127.0.0.1:99999/", "http://127.0.0.1:0/", "http:///x", "http://a b/", "http://h/\x00",
            "http://u:secret@[::1", "http://u:secret@h/ x",
            # without "://" the credentials are not in a host part (review repro rpcurl.py)
            "u:secret@localhost:8545", "http:/u:secret@host:8545", "u:secret@host 8545"]
)
def test_invalid_rpc_url_exits_3_with_one_line(capsys: pytest.CaptureFixture[str], url: str) -> None:
    code, out, err = run(capsys, "train", "list-runs", "--rpc", url)
    assert code == EXIT_UNREACHABLE and out == ""
    assert err.startswith("tenzro: bad --rpc URL ") and err.count("\n") == 1 and "Traceback" not in err
    assert "secret" not in err


def test_list_runs_sends_the_status_filter_and_prints_one_line_per_run(
    capsys: pytest.CaptureFixture[str], fake_node: FakeNode
) -> None:
    fake_node.replies["tenzro_training_listRuns"] = {
        "runs": [{"task_id": "a", "status": "Training", "round": 3}, {"task_id": "b", "status": "Training", "round": 0}],
        "total": 2, "offset": 0, "limit": 50,
    }
    code, out, err = run(capsys, "train", "list-runs", "--status", "Training", "--rpc", fake_node.url)
    assert code == EXIT_OK, err
    assert fake_node.calls[-1] == ("tenzro_training_listRuns", {"offset": 0, "limit": 50, "status": "Training"})
    assert out.splitlines() == ["a  Training  round 3", "b  Training  round 0"]
    fake_node.replies["tenzro_training_listRuns"] = {"runs": [], "total": 0, "offset": 0, "limit": 50}
    code, out, _ = run(capsys, "train", "list-runs", "--rpc", fake_node.url)
    assert (code, out) == (EXIT_OK, "no runs\n") and "status" not in fake_node.calls[-1][1]


def test_credentials_in_the_rpc_url_are_sent_as_basic_auth_and_never_shown(
    capsys: pytest.CaptureFixture[str], fake_node: FakeNode, closed_url: str
) -> None:
    fake_node.replies["tenzro_training_listRuns"] = {"runs": [], "total": 0, "offset": 0, "limit": 50}
    url = fake_node.url.replace("http://", "http://ops%40x:s%3Acret@")
    code, _, err = run(capsys, "train", "list-runs", "--rpc", url, "--json")
    assert code == EXIT_OK, err
    assert fake_node.headers[-1]["Authorization"] == "Basic " + base64.b64encode(b"ops@x:s:cret").decode()
    run(capsys, "train", "list-runs", "--rpc", fake_node.url)
    assert "Authorization" not in fake_node.headers[-1]
    # Unreachable: the message names the endpoint without the credentials (urllib took
    # "user:pw@host" for a host name and printed the password).
    code, _, err = run(capsys, "train", "list-runs", "--rpc", closed_url.replace("http://", "http://u:secret@"))
    assert code == EXIT_UNREACHABLE and "secret" not in err and f"cannot reach node at {closed_url}" in err


def test_an_https_rpc_url_is_spoken_to_in_tls(capsys: pytest.CaptureFixture[str], fake_node: FakeNode) -> None:
    """An https:// --rpc (an RPC provider's URL) goes through TLS: here a plain-HTTP server
    cannot complete the handshake, which is said as a TLS failure (exit 3), not as a URL
    scheme this program does not know."""
    code, out, err = run(capsys, "train", "list-runs", "--rpc", fake_node.url.replace("http://", "https://"))
    assert code == EXIT_UNREACHABLE and out == "" and err.count("\n") == 1
    assert err.startswith(f"tenzro: cannot reach node at {fake_node.url.replace('http://', 'https://')}: ")
    assert "SSL" in err and "unknown url type" not in err


def test_a_server_that_is_not_http_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_garbage() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"SSH-2.0-not-http\r\n\r\n")

    threading.Thread(target=answer_garbage, daemon=True).start()
    try:
        code, _, err = run(capsys, "train", "list-runs", "--rpc", f"http://127.0.0.1:{listener.getsockname()[1]}/")
    finally:
        listener.close()
    assert code == EXIT_UNREACHABLE and err.startswith("tenzro: cannot talk to a node") and err.count("\n") == 1


def test_invalid_non_utf8_files_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, key_file: Path, closed_url: str
) -> None:
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    cases = [
        ("spec", ["train", "post-task", "--spec", str(binary), "--key-file", str(key_file), "--rpc", closed_url]),
        ("key file", ["train", "address", "--key-file", str(binary)]),
        ("receipt file", ["train", "verify-receipt", "--file", str(binary)]),
    ]
    for what, argv in cases:
        code, out, err = run(capsys, *argv)
        assert code == EXIT_USAGE and out == "", argv
        assert err == f"tenzro: {what} {binary} is not UTF-8 text\n"


def test_invalid_out_path_exits_2_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fake_node: FakeNode
) -> None:
    fake_node.replies["tenzro_training_getReceipt"] = {"receipt": {"task_id": "t1"}}
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, out, err = run(capsys, "train", "get-receipt", "--task-id", "t1", "--rpc", fake_node.url,
                         "--out", str(blocker / "r.json"))
    assert code == EXIT_USAGE and err.startswith(f"tenzro: cannot write {blocker / 'r.json'}") and err.count("\n") == 1
    assert blocker.read_text() == "x"
    code, _, _ = run(capsys, "train", "get-receipt", "--task-id", "t1", "--rpc", fake_node.url,
                     "--out", str(tmp_path / "new" / "r.json"))
    assert code == EXIT_OK and json.loads((tmp_path / "new" / "r.json").read_text()) == {"receipt": {"task_id": "t1"}}
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["r.json"]  # no temporary left behind


def test_get_receipt_out_is_the_same_file_whatever_order_the_node_sent_its_keys(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fake_node: FakeNode
) -> None:
    """A receipt file is compared and archived byte for byte (diff, sha256sum): the same
    receipt must give the same file, whichever order a node's JSON happened to list its keys."""
    receipt = {"task_id": "t1", "run_root": "0x" + "11" * 32, "final_model_hash": "0x" + "22" * 32, "transcript": []}
    files = []
    for name, answer in (("a.json", {"receipt": receipt, "abi": "0x00"}),
                         ("b.json", {"abi": "0x00", "receipt": dict(reversed(list(receipt.items())))})):
        fake_node.replies["tenzro_training_getReceipt"] = answer
        code, out, err = run(capsys, "train", "get-receipt", "--task-id", "t1", "--rpc", fake_node.url,
                             "--out", str(tmp_path / name))
        assert code == EXIT_OK, err
        assert out.splitlines()[0] == "task              t1" and out.splitlines()[3] == "rounds            0"
        files.append((tmp_path / name).read_bytes())
    assert files[0] == files[1] and json.loads(files[0]) == {"receipt": receipt, "abi": "0x00"}


def test_out_goes_through_symlinks_and_into_devices_and_fifos_as_the_shell_does(tmp_path: Path) -> None:
    """The atomic rename replaced whatever was at --out: a symlink became a regular file (its
    target unchanged), a FIFO a regular file, and as root /dev/full a 909-byte regular file
    (CLI probe). A regular file is still written whole or not at all."""
    target = tmp_path / "target.json"
    target.write_text("old")
    (tmp_path / "link.json").symlink_to(target)
    cli_files.write_out(str(tmp_path / "link.json"), b"new")
    assert (tmp_path / "link.json").is_symlink() and target.read_bytes() == b"new"
    (tmp_path / "dangling.json").symlink_to(tmp_path / "made.json")
    cli_files.write_out(str(tmp_path / "dangling.json"), b"made")
    assert (tmp_path / "dangling.json").is_symlink() and (tmp_path / "made.json").read_bytes() == b"made"

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    cli_files.write_out(str(fifo), b"x" * 200_000)  # larger than a pipe's buffer
    reader.join(timeout=30)
    assert got == [b"x" * 200_000] and stat.S_ISFIFO(os.stat(fifo).st_mode)  # a device goes the same way

    for bad, why in ((str(tmp_path) + "/", "a directory path"), (str(tmp_path), "Is a directory")):
        with pytest.raises(CliError, match=why):
            cli_files.write_out(bad, b"x")


def test_invalid_amount_of_thousands_of_digits_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """int() of more than 4300 digits raises ValueError: a traceback, exit 1 (CLI probe)."""
    code, out, err = run(capsys, "keys", "new-vrf", "--address", "0x" + "11" * 20, "--stake", "1" * 5000,
                         "--out", str(tmp_path / "v"))
    assert code == EXIT_USAGE and out == "" and err == "tenzro: --stake exceeds uint256\n"
    assert run(capsys, "keys", "new-vrf", "--address", "0x" + "11" * 20, "--stake", str(2**256),
               "--out", str(tmp_path / "v"))[0] == EXIT_USAGE


def test_invalid_empty_key_file_is_not_the_environment_key(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """--key-file '' fell back to TENZRO_PRIVATE_KEY and signed with it (CLI probe)."""
    monkeypatch.setenv("TENZRO_PRIVATE_KEY", "0x" + "11" * 32)
    with pytest.raises(SystemExit) as exited:
        run(capsys, "train", "address", "--key-file", "")
    assert exited.value.code == EXIT_USAGE and "expected a file path" in capsys.readouterr().err


def test_invalid_receipt_answer_replaces_no_out_file(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                     fake_node: FakeNode) -> None:
    """A receipt of the right task whose fields this cannot read was written to --out before the
    failure, over a good file (CLI probe)."""
    out = tmp_path / "r.json"
    out.write_text("good")
    fake_node.replies["tenzro_training_getReceipt"] = {"receipt": {"task_id": "t1", "transcript": 5}}
    code, _, err = run(capsys, "train", "get-receipt", "--task-id", "t1", "--rpc", fake_node.url, "--out", str(out))
    assert code == EXIT_RPC_ERROR and "cannot read the node's answer" in err and out.read_text() == "good"


def test_get_run_human_and_json(capsys: pytest.CaptureFixture[str], fake_node: FakeNode) -> None:
    view = {
        "task_id": "t1", "status": "Training", "round": 1, "syncer": KEY_ADDRESS, "syncer_rank": 1,
        "trainers": [{"address": KEY_ADDRESS, "stake": "5", "shard": 0, "slashed": True}],
        "submission_counts": [1, 0], "round_records": [{}],
    }
    fake_node.replies["tenzro_training_getRun"] = view
    code, out, _ = run(capsys, "train", "get-run", "--task-id", "t1", "--rpc", fake_node.url)
    assert code == EXIT_OK
    assert "status    Training   round 1" in out and "SLASHED" in out and "finalized rounds  1" in out
    code, out, _ = run(capsys, "train", "get-run", "--task-id", "t1", "--rpc", fake_node.url, "--json")
    assert json.loads(out) == view
    assert fake_node.calls[-1] == ("tenzro_training_getRun", {"task_id": "t1"})


def test_enroll_signs_for_the_key(capsys: pytest.CaptureFixture[str], fake_node: FakeNode, key_file: Path) -> None:
    fake_node.replies["tenzro_training_enrollTrainer"] = {"task_id": "t", "address": KEY_ADDRESS, "shard": 0}
    code, out, _ = run(
        capsys, "train", "enroll-trainer", "--task-id", "t", "--did", "did:tenzro:trainer:a", "--stake", "1000",
        "--key-file", str(key_file), "--rpc", fake_node.url,
    )
    assert code == EXIT_OK
    assert out.splitlines() == ["task_id  t", f"address  {KEY_ADDRESS}", "shard    0"]  # the shard the trainer trains
    method, params = fake_node.calls[-1]
    assert method == "tenzro_training_enrollTrainer" and params["stake"] == "1000" and params["address"] == KEY_ADDRESS
    msg = auth.EnrollTrainer(task_id="t", did="did:tenzro:trainer:a", trainer=bytes.fromhex(KEY_ADDRESS[2:]), stake=1000)
    assert auth.recover_signer(msg, bytes.fromhex(params["signature"][2:])) == KEY_ADDRESS


def test_cancel_signs_for_the_key_and_prints_the_status(
    capsys: pytest.CaptureFixture[str], fake_node: FakeNode, key_file: Path
) -> None:
    """A sponsor's script reads the cancel's outcome from stdout (the task, now Cancelled), and
    the node checks the cancel was signed by the sponsor's key."""
    fake_node.replies["tenzro_training_cancelTask"] = {"task_id": "t", "status": "Cancelled"}
    code, out, err = run(capsys, "train", "cancel-task", "--task-id", "t", "--key-file", str(key_file), "--rpc", fake_node.url)
    assert code == EXIT_OK, err
    assert out.splitlines() == ["task_id  t", "status   Cancelled"]
    method, params = fake_node.calls[-1]
    assert method == "tenzro_training_cancelTask" and params["task_id"] == "t"
    assert auth.recover_signer(auth.CancelTask(task_id="t"), bytes.fromhex(params["signature"][2:])) == KEY_ADDRESS


@pytest.mark.parametrize("stake", ["-1", "01", "1.5", "abc", str(2**256), "\u00b2", "\u0661\u0662"])
def test_invalid_stake_exits_2(capsys: pytest.CaptureFixture[str], key_file: Path, closed_url: str, stake: str) -> None:
    code, _, err = run(
        capsys, "train", "enroll-trainer", "--task-id", "t", "--did", "did:tenzro:trainer:a", "--stake", stake,
        "--key-file", str(key_file), "--rpc", closed_url,
    )
    assert code == EXIT_USAGE and "--stake" in err


def test_invalid_spec_exits_2_before_any_call(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, key_file: Path, fake_node: FakeNode
) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"task_id": "t"}))
    code, _, err = run(capsys, "train", "post-task", "--spec", str(spec), "--key-file", str(key_file), "--rpc", fake_node.url)
    assert code == EXIT_USAGE and err.startswith("tenzro: ") and fake_node.calls == []
    code, _, err = run(capsys, "train", "post-task", "--spec", str(tmp_path / "none.json"), "--rpc", fake_node.url)
    assert code == EXIT_USAGE and "cannot read spec" in err


def post_dev_spec(capsys: pytest.CaptureFixture[str], tmp_path: Path, fake_node: FakeNode, key_file: Path, *,
                  aggregation: Any, quorum: int, metadata: dict[str, Any] | None = None) -> str:
    """Post the shipped dev spec with these changes (M = 5) to the fake node; it must succeed.
    Returns stderr."""
    from tenzro_training.spec import TrainingTaskSpec

    doc = json.loads((Path(cli.__file__).parents[1] / "data" / "dev-task.json").read_text())
    doc.update(sponsor_address=KEY_ADDRESS, aggregation=aggregation, trainer_count=5, quorum=quorum)
    doc["architecture"]["metadata"]["init_checkpoint"] = {"uri": "file:///nonexistent", "sha256": "0x" + "00" * 32}
    doc["architecture"]["metadata"].update(metadata or {})
    spec = TrainingTaskSpec.from_dict(doc)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    fake_node.replies["tenzro_training_postTask"] = {"task_id": spec.task_id, "spec_hash": "0x" + spec.spec_hash().hex(),
                                                     "status": "Posted"}
    code, _, err = run(capsys, "train", "post-task", "--spec", str(path), "--key-file", str(key_file),
                       "--rpc", fake_node.url)
    assert code == EXIT_OK and [m for m, _ in fake_node.calls] == ["tenzro_training_postTask"]
    return err


@pytest.mark.parametrize("aggregation, quorum, said", [
    ({"TrimmedMean": {"alpha_bps": 2000}}, 4, "aggregation TrimmedMean alpha_bps=2000 trims nothing from a round that "
                                              "closes at the quorum, 4 accepted payloads"),
    ("Mean", 4, "aggregation Mean tolerates no Byzantine trainer"),
    ("CoordinateMedian", 2, "aggregation CoordinateMedian over 2 accepted payload(s)"),
    ({"TrimmedMean": {"alpha_bps": 2500}}, 4, None),
    ("CoordinateMedian", 3, None),
])
def test_post_task_notes_a_rule_that_tolerates_no_byzantine_trainer_at_the_quorum(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fake_node: FakeNode, key_file: Path, aggregation: Any,
    quorum: int, said: str | None,
) -> None:
    """Byzantine probe (2026-11-27): a TrimmedMean spec whose rounds at the quorum trim nothing was
    posted without a word, and one attacker took the model's loss from 0.58 to 200. The post goes
    ahead (the rule is valid, and the sponsor's choice); the sponsor is told."""
    err = post_dev_spec(capsys, tmp_path, fake_node, key_file, aggregation=aggregation, quorum=quorum)
    if said is None:
        assert err == ""
    else:
        assert err.startswith(f"tenzro: note: {said}") and err.count("\n") == 1, err
        assert 'docs/aggregation.md "What each rule tolerates"' in err


@pytest.mark.parametrize("aggregation, said", [
    ("CoordinateMedian", "CoordinateMedian leaves every coordinate that fewer than about half"),
    ({"TrimmedMean": {"alpha_bps": 2500}}, "TrimmedMean trims away every coordinate"),
    ({"Krum": {"f": 1}}, "Krum applies one trainer's top-k per round"),
    ("Mean", None),
])
def test_post_task_notes_what_topk_payloads_cost_a_robust_rule(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fake_node: FakeNode, key_file: Path, aggregation: Any,
    said: str | None,
) -> None:
    """Measured (docs/aggregation.md "Sparse inputs"): the robust rules train slower on topk
    payloads. The post goes ahead; the sponsor is told, after any tolerance note."""
    err = post_dev_spec(capsys, tmp_path, fake_node, key_file, aggregation=aggregation, quorum=5,
                        metadata={"outer_gradient_encoding": {"topk": {"density_bps": 1000}}})
    lines = [line for line in err.splitlines() if "Sparse inputs" in line]
    if said is None:
        assert lines == [], err
    else:
        assert len(lines) == 1 and lines[0].startswith("tenzro: note: outer gradients travel as topk 10% of each "
                                                       "fragment, and " + said), err


def test_post_task_refuses_a_bad_encoding_before_signing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fake_node: FakeNode, key_file: Path
) -> None:
    doc = json.loads((Path(cli.__file__).parents[1] / "data" / "dev-task.json").read_text())
    doc["architecture"]["metadata"]["outer_gradient_encoding"] = {"topk": {"density_bps": 0}}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    code, _, err = run(capsys, "train", "post-task", "--spec", str(path), "--key-file", str(key_file),
                       "--rpc", fake_node.url)
    assert code == EXIT_USAGE and fake_node.calls == []
    assert "architecture.metadata.outer_gradient_encoding.topk.density_bps" in err, err


def test_submit_gradient_missing_payload_exits_2(capsys: pytest.CaptureFixture[str], key_file: Path, closed_url: str) -> None:
    code, _, err = run(
        capsys, "train", "submit-gradient", "--task-id", "t", "--round", "0", "--fragment", "0",
        "--payload", "/nonexistent/p.safetensors", "--key-file", str(key_file), "--rpc", closed_url,
    )
    assert code == EXIT_USAGE and "cannot read payload" in err


def test_finalize_reads_the_round_from_the_node(
    capsys: pytest.CaptureFixture[str], fake_node: FakeNode, key_file: Path
) -> None:
    fake_node.replies["tenzro_training_getRun"] = {"task_id": "t", "round": 4}
    fake_node.replies["tenzro_training_finalizeRound"] = {"task_id": "t", "round": 4, "status": "Training"}
    code, _, _ = run(capsys, "train", "finalize-round", "--task-id", "t", "--key-file", str(key_file), "--rpc", fake_node.url)
    assert code == EXIT_OK
    method, params = fake_node.calls[-1]
    assert method == "tenzro_training_finalizeRound" and params["round"] == 4
    sig = bytes.fromhex(params["signature"][2:])
    assert auth.recover_signer(auth.FinalizeRound(task_id="t", round=4), sig) == KEY_ADDRESS
    # Round 0 is a run's first round, not a missing one.
    fake_node.replies["tenzro_training_getRun"] = {"task_id": "t", "round": 0}
    fake_node.replies["tenzro_training_finalizeRound"] = {"task_id": "t", "round": 0, "status": "Training"}
    code, _, err = run(capsys, "train", "finalize-round", "--task-id", "t", "--key-file", str(key_file), "--rpc", fake_node.url)
    assert code == EXIT_OK, err
    assert fake_node.calls[-1][0] == "tenzro_training_finalizeRound" and fake_node.calls[-1][1]["round"] == 0


# --- a node that is not one: every answer is checked before it is used ------------------------------

_RESULT_COMMANDS = [
    ("tenzro_training_listRuns", ["train", "list-runs"]),
    ("tenzro_training_getRun", ["train", "get-run", "--task-id", "t"]),
    ("tenzro_training_getReceipt", ["train", "get-receipt", "--task-id", "t"]),
    ("tenzro_training_getRun", ["train", "finalize-round", "--task-id", "t"]),
]


@pytest.mark.parametrize(("result", "shown"), [(None, "null"), ([1], "list"), ("x", "str"), (7, "int")])
@pytest.mark.parametrize(("method", "argv"), _RESULT_COMMANDS)
def test_invalid_result_that_is_not_an_object_exits_1(
    capsys: pytest.CaptureFixture[str], fake_node: FakeNode, key_file: Path, method: str, argv: list[str],
    result: object, shown: str,
) -> None:
    fake_node.replies[method] = result
    signing = ["--key-file", str(key_file)] if "finalize-round" in argv else []
    code, out, err = run(capsys, *argv, *signing, "--rpc", fake_node.url)
    assert code == EXIT_RPC_ERROR and out == ""
    assert err == f"tenzro: node at {fake_node.url} answered a {shown} where a JSON object was expected\n"


@pytest.mark.parametrize(("raw", "says", "exit_code"), [
    (b'{"jsonrpc":"2.0","id":1,"result":{"runs":[],"total":NaN}}', "did not answer JSON-RPC", EXIT_UNREACHABLE),
    (b'{"jsonrpc":"2.0","id":1,"result":{"x":Infinity}}', "did not answer JSON-RPC", EXIT_UNREACHABLE),
    (b'{"jsonrpc":"2.0","id":1,"error":"boom"}', "malformed JSON-RPC error object", EXIT_RPC_ERROR),
    (b'{"jsonrpc":"2.0","id":1,"error":{"code":"1","message":"m"}}', "malformed JSON-RPC error object", EXIT_RPC_ERROR),
    (b'{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m"},"result":{}}', "not a JSON-RPC response",
     EXIT_RPC_ERROR),
    (b'{"jsonrpc":"2.0","id":1}', "not a JSON-RPC response", EXIT_RPC_ERROR),
    (b"[]", "not a JSON-RPC response", EXIT_RPC_ERROR),
])
def test_invalid_answers_get_one_line(
    capsys: pytest.CaptureFixture[str], fake_node: FakeNode, raw: bytes, says: str, exit_code: int
) -> None:
    fake_node.raw["tenzro_training_listRuns"] = raw
    code, out, err = run(capsys, "train", "list-runs", "--rpc", fake_node.url)
    assert code == exit_code and out == "" and says in err and err.count("\n") == 1


def test_invalid_deeply_nested_answer_does_not_crash_the_process(fake_node: FakeNode) -> None:
    """py_ecc raises the recursion limit to 100000, so json.loads on this overflowed the C stack
    (the process died by SIGSEGV, exit -11). A child process, so that a regression cannot take
    the test runner with it."""
    import subprocess
    import sys

    depth = 100_000
    fake_node.raw["tenzro_training_listRuns"] = b'{"jsonrpc":"2.0","id":1,"result":' + b"[" * depth + b"]" * depth + b"}"
    done = subprocess.run([sys.executable, "-m", "tenzro_training.cli", "train", "list-runs", "--rpc", fake_node.url],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == EXIT_RPC_ERROR, done.stderr[-2000:]
    assert done.stderr == f"tenzro: node at {fake_node.url} answered JSON nested deeper than 128\n"


@pytest.mark.parametrize(("argv", "usage"), [
    (["node", "--data-dir", "d", "--confg", "x"], "usage: tenzro node "),
    (["train", "get-run", "--task-id", "t", "--bogus"], "usage: tenzro train get-run "),
    (["keys", "new-account", "--out", "k", "--x"], "usage: tenzro keys new-account "),
])
def test_invalid_unknown_flag_names_its_command(capsys: pytest.CaptureFixture[str], argv: list[str], usage: str) -> None:
    """argparse reported leftovers from the top parser: `tenzro node --confg x` printed the
    top-level usage, which does not list --config (README walkthrough probe)."""
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == EXIT_USAGE and err.startswith(usage) and "unrecognized arguments" in err


def test_output_to_a_closed_pipe_exits_141_without_a_traceback(tmp_path: Path) -> None:
    """`tenzro ... --json | head` whose reader has gone: Python's BrokenPipeError was a
    traceback and exit 1 (which means a JSON-RPC error). A child process with a pipe whose
    read end is closed before it starts, so every write fails."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "tenzro_training.cli", "keys", "new-account", "--out",
                               str(tmp_path / "k.json"), "--json"], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=120, check=False)
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == "", done.stderr[-2000:]
    assert (tmp_path / "k.json").exists()  # the work was done; only its report had no reader


def test_python_m_cli_gives_the_documented_exit_status_for_errors_of_other_modules(tmp_path: Path) -> None:
    """`python -m tenzro_training.cli` ran the module as __main__, a second copy whose CliError
    is not the trainer's: an unreachable node exited 2 there and 3 with `tenzro` (trainer
    restart probe). Both now run the one imported module."""
    import subprocess
    import sys

    key = tmp_path / "k.json"
    assert cli.main(["keys", "new-account", "--out", str(key)]) == 0
    argv = ["trainer", "run", "--task-id", "t", "--rpc", "http://127.0.0.1:9", "--key-file", str(key), "--p2p-key",
            str(tmp_path / "p2p.key"), "--bootstrap", "/ip4/127.0.0.1/tcp/9/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"]
    done = subprocess.run([sys.executable, "-m", "tenzro_training.cli", *argv], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == EXIT_UNREACHABLE, done.stderr[-2000:]
    assert done.stderr.startswith("tenzro: cannot reach node at http://127.0.0.1:9") and done.stderr.count("\n") == 1


def test_invalid_trickled_answer_is_cut_at_the_timeout() -> None:
    """The socket timeout applies to each read: a byte every 0.1 s kept the command waiting for
    the whole Content-Length (100,000 s here); the client's timeout now bounds the answer."""
    import time

    class Trickle(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                pass

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        with pytest.raises(CliError, match=r"did not finish its answer within 1 s") as info:
            cli.RpcClient(url, timeout=1.0).call("tenzro_training_listRuns", {})
    finally:
        server.shutdown()
        server.server_close()
    assert info.value.exit_code == EXIT_UNREACHABLE


class _RawNode:
    """A TCP server that reads one HTTP request per connection and then runs ``behave(conn)``:
    a node that speaks broken or endless HTTP (CLI probe, stop 20)."""

    def __init__(self, behave: Callable[[socket.socket], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        self.behave = behave
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += conn.recv(65536)
            try:
                self.behave(conn)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


def _forever(conn: socket.socket, first: bytes, each: bytes, pause: float) -> None:
    conn.sendall(first)
    for _ in range(100_000):
        conn.sendall(each)
        time.sleep(pause)


def _reset(conn: socket.socket, head: bytes) -> None:
    conn.sendall(head)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST


_REPLY = b'{"jsonrpc":"2.0","id":1,"result":{"runs":[]}}'

_ENDLESS_HTTP = {
    "headers a byte at a time": lambda c: _forever(c, b"HTTP/1.1 200 OK\r\nX-Slow: ", b"a", 0.05),
    "100 Continue forever": lambda c: _forever(c, b"", b"HTTP/1.1 100 Continue\r\n\r\n", 0.001),
    "trailer lines forever": lambda c: _forever(
        c, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n" % (len(_REPLY), _REPLY),
        b"X-Trailer: y\r\n", 0.001),
}


@pytest.mark.parametrize("behaviour", sorted(_ENDLESS_HTTP))
def test_invalid_endless_http_is_cut_at_the_timeout(behaviour: str) -> None:
    """The timeout bounds the whole exchange: the status line, the headers, interim answers and
    trailers were read by http.client's own loops, with only a per-read socket timeout, and a
    node sending them forever held the command (and the syncer daemon) forever."""
    node = _RawNode(_ENDLESS_HTTP[behaviour])
    started = time.monotonic()
    try:
        with pytest.raises(CliError, match=r"did not finish its answer within 1 s") as info:
            cli.RpcClient(node.url, timeout=1.0).call("tenzro_training_listRuns", {})
    finally:
        node.close()
    assert info.value.exit_code == EXIT_UNREACHABLE and time.monotonic() - started < 5


def test_connect_and_every_send_get_the_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review (stop 20): connect, the headers' send and the body's send each had the whole
    timeout, on top of the answer's deadline."""
    now = [100.0]
    monkeypatch.setattr(cli_client.time, "monotonic", lambda: now[0])
    events: list[tuple[str, float]] = []

    class Sock:
        def settimeout(self, value: float) -> None:
            events.append(("settimeout", value))

    class Connection:
        timeout = 120.0
        sock: Sock | None = None

        def connect(self) -> None:
            events.append(("connect", self.timeout))
            self.sock = Sock()

        def send(self, data: bytes) -> None:
            events.append(("send", len(data)))

    conn = cli_client._bound_connection(Connection(), deadline=110.0, response_class=object)
    conn.connect()
    now[0] = 104.0
    conn.send(b"headers")
    now[0] = 109.5
    conn.send(b"body")
    assert events == [("connect", 10.0), ("settimeout", 6.0), ("send", 7), ("settimeout", 0.5), ("send", 4)]
    now[0] = 110.0
    with pytest.raises(TimeoutError):
        conn.send(b"late")
    assert conn.response_class is object


_BROKEN_ERROR_BODIES = {
    "reset mid-body": lambda c: _reset(c, b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 1000\r\n\r\n{\"jsonrpc\""),
    "bad chunk framing": lambda c: c.sendall(
        b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n"),
    "stalled body": lambda c: (c.sendall(b"HTTP/1.1 500 Oops\r\nContent-Length: 100\r\n\r\n{"), time.sleep(3)),
}


def test_invalid_answer_cut_by_a_reset_names_the_reset() -> None:
    """A connection reset while the answer is read is the network's failure, said as such
    ("cannot reach node ...: Connection reset"): it is not a server that does not speak HTTP,
    which is what "cannot talk to a node" tells the user to look for."""
    node = _RawNode(lambda c: _reset(c, b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{\"jsonrpc\""))
    try:
        with pytest.raises(CliError, match=rf"^cannot reach node at {node.url}: .*[Rr]eset") as info:
            cli.RpcClient(node.url, timeout=5.0).call("tenzro_training_listRuns", {})
    finally:
        node.close()
    assert info.value.exit_code == EXIT_UNREACHABLE


@pytest.mark.parametrize("behaviour", sorted(_BROKEN_ERROR_BODIES))
def test_invalid_error_status_with_a_broken_body_exits_3(
    behaviour: str, capsys: pytest.CaptureFixture[str], key_file: Path
) -> None:
    """The body of a 4xx/5xx answer was read inside the HTTPError handler, outside every other
    one: a reset, a bad chunk or a stall there was a traceback, and it ended the syncer daemon
    and the trainer, which retry an unreachable node."""
    node = _RawNode(_BROKEN_ERROR_BODIES[behaviour])
    try:
        with pytest.raises(CliError) as info:
            cli.RpcClient(node.url, timeout=1.0).call("tenzro_training_listRuns", {})
        assert info.value.exit_code == EXIT_UNREACHABLE
        code, out, err = run(capsys, "train", "list-runs", "--rpc", node.url)
    finally:
        node.close()
    assert code == EXIT_UNREACHABLE and out == "" and err.startswith("tenzro: ") and err.count("\n") == 1


@pytest.mark.parametrize(("raw", "match", "exit_code"), [
    (b'{"jsonrpc":"2.0","id":1,"result":{"x":1e400}}', "did not answer JSON-RPC", EXIT_UNREACHABLE),  # infinity
    (b'{"jsonrpc":"1.0","id":1,"result":{}}', "not a JSON-RPC response", EXIT_RPC_ERROR),
    (b'{"id":1,"result":{}}', "not a JSON-RPC response", EXIT_RPC_ERROR),
    (b'{"jsonrpc":"2.0","id":2,"result":{}}', "answered another request", EXIT_RPC_ERROR),
    (b'{"jsonrpc":"2.0","id":"1","result":{}}', "answered another request", EXIT_RPC_ERROR),
    (b'{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"m"}}', "answered another request", EXIT_RPC_ERROR),
    (b'[' + b'{},' * 2_000_000 + b'{}]', "more than 2000000 JSON values", EXIT_RPC_ERROR),
])
def test_invalid_replies_that_are_not_this_calls_answer(raw: bytes, match: str, exit_code: int, fake_node: FakeNode) -> None:
    """Something that answered, but not this call's JSON-RPC response, is a bad node (exit 1);
    only text that is not JSON-RPC at all reads as no node there (exit 3): a script retries
    the one and not the other."""
    fake_node.raw["tenzro_training_listRuns"] = raw
    with pytest.raises(CliError, match=match) as info:
        cli.RpcClient(fake_node.url).call("tenzro_training_listRuns", {})
    assert info.value.exit_code == exit_code


@pytest.mark.parametrize("bound", ["MAX_REPLY_BYTES", "MAX_REPLY_VALUES"])
def test_an_answer_at_its_bounds_is_read_and_one_past_them_is_refused(
    bound: str, fake_node: FakeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bounds on a node's answer (bytes, JSON values) are the most it may hold: an answer
    exactly at one is a node's answer, as a default node's largest are close to them; one past
    it is a bad node (exit 1), refused before it is parsed."""
    from tenzro_training.jsontext import compute_json_values_bound

    raw = b'{"jsonrpc":"2.0","id":1,"result":{"runs":[]}}'
    size = len(raw) if bound == "MAX_REPLY_BYTES" else compute_json_values_bound(raw)
    fake_node.raw["tenzro_training_listRuns"] = raw
    monkeypatch.setattr(cli_client, bound, size)
    assert cli.RpcClient(fake_node.url).call("tenzro_training_listRuns", {}) == {"runs": []}
    monkeypatch.setattr(cli_client, bound, size - 1)
    with pytest.raises(CliError, match=f"node at {fake_node.url} answered more than {size - 1} ") as info:
        cli.RpcClient(fake_node.url).call("tenzro_training_listRuns", {})
    assert info.value.exit_code == EXIT_RPC_ERROR


def test_finite_floats_in_an_answer_are_read_as_the_numbers_they_say(fake_node: FakeNode) -> None:
    """Only a float too large for a double (1e400, read as infinity) is refused: every finite one
    (a loss, a tiny learning rate) is the number it says."""
    fake_node.raw["tenzro_training_listRuns"] = b'{"jsonrpc":"2.0","id":1,"result":{"loss":1.5,"lr":1e-300,"big":-1e300}}'
    assert cli.RpcClient(fake_node.url).call("tenzro_training_listRuns", {}) == {"loss": 1.5, "lr": 1e-300, "big": -1e300}


def test_an_error_answered_with_a_null_id_is_still_the_nodes_error(fake_node: FakeNode) -> None:
    fake_node.raw["tenzro_training_listRuns"] = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse"}}'
    with pytest.raises(CliError, match=r"error -32700: parse") as info:
        cli.RpcClient(fake_node.url).call("tenzro_training_listRuns", {})
    assert info.value.rpc_code == -32700


def test_node_text_reaches_the_terminal_escaped_and_bounded(
    capsys: pytest.CaptureFixture[str], fake_node: FakeNode
) -> None:
    """Escape sequences, bidi overrides and lone surrogates from a node were printed raw (a
    node could retitle the terminal or clear it), and a 50 MB error message was one line."""
    hostile = "\x1b]0;PWNED\x07\x1b[2J\u202eevil\ud800"
    fake_node.replies["tenzro_training_getRun"] = {"error": {"code": 1, "message": hostile + "m" * 100_000,
                                                             "data": {"type": hostile}}}
    code, out, err = run(capsys, "train", "get-run", "--task-id", "t", "--rpc", fake_node.url)
    assert code == EXIT_RPC_ERROR and err.count("\n") == 1 and len(err) < 3000
    assert "\x1b" not in err and "\u202e" not in err and "\\x1b]0;PWNED" in err and "more characters" in err
    fake_node.replies["tenzro_training_getRun"] = {"task_id": hostile, "status": "Training\x1b[31m", "trainers": []}
    code, out, err = run(capsys, "train", "get-run", "--task-id", "t", "--rpc", fake_node.url)
    assert code == EXIT_OK and "\x1b" not in out and "\\x1b[31m" in out and "\\ud800" in out


def test_the_syncer_daemon_survives_a_lone_surrogate(fake_node: FakeNode) -> None:
    from tenzro_training.node.syncer import SyncerDaemon

    printed: list[str] = []

    def emit(line: str) -> None:  # what print() does with a line it cannot encode
        line.encode("utf-8")
        printed.append(line)

    daemon = SyncerDaemon(cli.RpcClient(fake_node.url), KEY, emit=emit)
    daemon.emit("finalized \ud800 round 1 status \x1b[2J")
    assert printed == ["finalized \\ud800 round 1 status \\x1b[2J"]


def test_printable_cuts_a_long_line_at_the_limit_and_counts_the_rest() -> None:
    """A node's 50 MB "line" must reach the terminal as at most MAX_LINE_CHARS characters plus
    an exact count of what was dropped (the reader must know the text was cut, and by how
    much); a line of exactly the limit is whole and carries no note."""
    from tenzro_training.terminal import MAX_LINE_CHARS, printable

    assert printable("a" * MAX_LINE_CHARS) == "a" * MAX_LINE_CHARS
    assert printable("a" * (MAX_LINE_CHARS + 3)) == "a" * MAX_LINE_CHARS + "... (3 more characters)"
    assert printable("ab\x1bcd", limit=3) == "ab\\x1b... (2 more characters)"


def test_printable_takes_what_a_command_prints_that_is_not_a_string() -> None:
    """Commands print exceptions and numbers from a node's answer through printable(); an
    exception whose text holds an escape sequence must come out escaped, not raise."""
    from tenzro_training.terminal import printable, printable_lines

    assert printable(ValueError("bad \x1b[2J")) == "bad \\x1b[2J"
    assert printable(7) == "7" and printable_lines(7) == "7"


def test_printable_lines_keeps_the_line_breaks_and_bounds_each_line() -> None:
    """A multi-line human format (a verify report) keeps its line breaks, while each of its
    lines is escaped and bounded on its own, as printable() does for one line."""
    from tenzro_training.terminal import printable_lines

    assert printable_lines("ok\nbad \x1b]0;t\x07") == "ok\nbad \\x1b]0;t\\x07"
    assert printable_lines("abc\ndefg", limit=2) == "ab... (1 more characters)\nde... (2 more characters)"


@pytest.mark.parametrize(("argv", "method", "answer", "field"), [
    (["cancel-task", "--task-id", "t"], "tenzro_training_cancelTask", {"task_id": "t", "status": "Failed"}, "status"),
    (["cancel-task", "--task-id", "t"], "tenzro_training_cancelTask", {"task_id": "u", "status": "Cancelled"}, "task_id"),
    (["cancel-task", "--task-id", "0xAb"], "tenzro_training_cancelTask", {"task_id": "0xab", "status": "Cancelled"},
     "task_id"),  # task ids are case-sensitive, even when they look like hex
    (["enroll-trainer", "--task-id", "t", "--did", "did:tenzro:gpu:a", "--stake", "1"], "tenzro_training_enrollTrainer",
     {"task_id": "t", "address": "0x" + "00" * 20, "shard": 9}, "address"),
    (["finalize-round", "--task-id", "t", "--round", "3"], "tenzro_training_finalizeRound",
     {"task_id": "t", "round": 99}, "round"),
    (["finalize-round", "--task-id", "t", "--round", "3"], "tenzro_training_finalizeRound",
     {"task_id": "t", "round": 3.0}, "round"),
])
def test_invalid_signed_call_answered_about_something_else_exits_1(
    argv: list[str], method: str, answer: dict[str, Any], field: str,
    capsys: pytest.CaptureFixture[str], fake_node: FakeNode, key_file: Path,
) -> None:
    """A script trusts exit 0: an answer about another task, round, signer or status made the
    command report success for something that did not happen (CLI probe, stop 20)."""
    fake_node.replies[method] = answer
    code, out, err = run(capsys, "train", *argv, "--key-file", str(key_file), "--rpc", fake_node.url)
    assert code == EXIT_RPC_ERROR and out == ""
    assert err.startswith(f"tenzro: the node's {method.removeprefix('tenzro_training_')} answer says {field} ")


def test_invalid_submit_answered_with_another_payload_hash_exits_1(
    capsys: pytest.CaptureFixture[str], fake_node: FakeNode, key_file: Path, tmp_path: Path
) -> None:
    payload = tmp_path / "p.bin"
    payload.write_bytes(b"payload bytes")
    fake_node.replies["tenzro_training_submitOuterGradient"] = {
        "task_id": "t", "round": 0, "fragment": 0, "payload_hash": "0x" + "11" * 32}
    code, _, err = run(capsys, "train", "submit-gradient", "--task-id", "t", "--round", "0", "--fragment", "0",
                       "--payload", str(payload), "--key-file", str(key_file), "--rpc", fake_node.url)
    assert code == EXIT_RPC_ERROR and "answer says payload_hash" in err


def test_invalid_finalize_round_from_a_non_integer_round_signs_nothing(
    capsys: pytest.CaptureFixture[str], fake_node: FakeNode, key_file: Path
) -> None:
    for bad in (2.9, "7", True, -1, 2**64):
        fake_node.raw["tenzro_training_getRun"] = json.dumps(
            {"jsonrpc": "2.0", "id": 1, "result": {"task_id": "t", "round": bad}}).encode()
        code, _, err = run(capsys, "train", "finalize-round", "--task-id", "t", "--key-file", str(key_file),
                           "--rpc", fake_node.url)
        assert code == EXIT_RPC_ERROR and "no round to finalize" in err, bad
    assert not any(m == "tenzro_training_finalizeRound" for m, _ in fake_node.calls)


def test_invalid_get_receipt_answer_does_not_replace_the_out_file(
    capsys: pytest.CaptureFixture[str], fake_node: FakeNode, tmp_path: Path
) -> None:
    out_file = tmp_path / "receipt.json"
    out_file.write_text("a good receipt")
    for answer in ({"receipt": "garbage"}, {"receipt": {"task_id": "another"}}):
        fake_node.replies["tenzro_training_getReceipt"] = answer
        code, _, _ = run(capsys, "train", "get-receipt", "--task-id", "t", "--out", str(out_file),
                         "--rpc", fake_node.url)
        assert code == EXIT_RPC_ERROR
    assert out_file.read_text() == "a good receipt"


def test_invalid_make_gradient_for_a_huge_layout_allocates_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, fake_node: FakeNode, tmp_path: Path
) -> None:
    from tenzro_training.fragments import TensorSpec, compute_fragment_layouts

    layouts = compute_fragment_layouts([TensorSpec("w", (1 << 42,), "float32")], 1)
    fake_node.replies["tenzro_training_getRun"] = {"task_id": "t"}
    monkeypatch.setattr(spec_commands, "compute_layouts_from_view", lambda view: layouts)
    code, _, err = run(capsys, "train", "make-gradient", "--task-id", "t", "--round", "0", "--fragment", "0",
                       "--out", str(tmp_path / "g.bin"), "--rpc", fake_node.url)
    assert code == EXIT_RPC_ERROR and "the most submit-gradient reads" in err
    assert not (tmp_path / "g.bin").exists()


def test_invalid_field_in_a_well_formed_answer_exits_1(
    capsys: pytest.CaptureFixture[str], fake_node: FakeNode, key_file: Path
) -> None:
    fake_node.replies["tenzro_training_getRun"] = {"task_id": "t", "round": "four"}
    code, out, err = run(capsys, "train", "finalize-round", "--task-id", "t", "--key-file", str(key_file),
                         "--rpc", fake_node.url)
    assert code == EXIT_RPC_ERROR and out == ""
    assert err == "tenzro: the node's getRun answer has no round to finalize ('four')\n"
    assert not any(m == "tenzro_training_finalizeRound" for m, _ in fake_node.calls)


def test_a_fresh_process_has_read_no_node_answer() -> None:
    """main tells a bug of this program (kept with its traceback) from a node's bad answer by
    whether any node answer was read yet: a process starts having read none."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "from tenzro_training.cli.client import RpcClient; print(RpcClient.answers)"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout) == (0, "0\n"), done.stderr[-2000:]


def test_invalid_program_error_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before any node answer, a KeyError is this program's bug: it is not dressed as the node's."""
    monkeypatch.setattr(cli.RpcClient, "answers", 0)

    def broken(args: Any) -> None:
        raise KeyError("bug")

    monkeypatch.setattr(cli_parser, "cmd_list_runs", broken)
    with pytest.raises(KeyError):
        cli.main(["train", "list-runs"])


def test_syncer_skips_malformed_answers_and_keeps_polling(fake_node: FakeNode) -> None:
    from tenzro_training.node.syncer import SyncerDaemon

    fake_node.replies["tenzro_training_listRuns"] = {"runs": [{"task_id": "a"}, {"task_id": "b"}], "total": 2}
    fake_node.replies["tenzro_training_getRun"] = {"status": "Training", "syncer": KEY_ADDRESS, "round": "x"}
    lines: list[str] = []
    daemon = SyncerDaemon(cli.RpcClient(fake_node.url), KEY, emit=lines.append)
    assert daemon.poll_once() == 0
    assert lines == [f"getRun {t}: the node's answer has no valid round; skipped" for t in ("a", "b")]
    fake_node.replies["tenzro_training_getRun"] = {
        "status": "Training", "syncer": KEY_ADDRESS, "round": 0, "quorum_at_ms": 1, "straggler_deadline_ms": "soon",
        "now_ms": 5,
    }
    lines.clear()
    assert daemon.poll_once() == 0 and len(lines) == 2 and "cannot read the node's answer" in lines[0]
    fake_node.replies["tenzro_training_listRuns"] = {"runs": [1, 2], "total": 2}
    with pytest.raises(cli.CliError, match="listRuns answer is malformed"):
        daemon.poll_once()


# --- make-gradient -----------------------------------------------------------------------------------


def _tiny_spec(tmp_path: Path) -> Path:
    from tenzro_training.trainer.model import PatchTransformerConfig, create_init_checkpoint, save_checkpoint

    cfg = PatchTransformerConfig(context_len=16, horizon=4, patch_len=8, d_model=8, n_layers=1, n_heads=2, d_ff=8)
    ckpt = tmp_path / "init.safetensors"
    sha = save_checkpoint(create_init_checkpoint(cfg, 0), ckpt)
    doc = json.loads((Path(cli.__file__).parents[1] / "data" / "timesfm-200m-task.json").read_text())
    doc["task_id"] = "unit-task"
    doc["architecture"]["fragment_count"] = 3
    doc["architecture"]["metadata"] = {
        "context_len": 16, "horizon": 4, "patch_len": 8, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 8,
        "init_checkpoint": {"uri": ckpt.as_uri(), "sha256": sha},
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    return path


def test_make_gradient_writes_a_valid_deterministic_payload(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from tenzro_training.payload import PayloadHeader, decode_payload

    spec = _tiny_spec(tmp_path)
    outs = []
    for seed, name in ((1, "a"), (1, "b"), (2, "c")):
        out = tmp_path / f"{name}.safetensors"
        code, text, _ = run(
            capsys, "train", "make-gradient", "--spec", str(spec), "--round", "2", "--fragment", "1",
            "--random-seed", str(seed), "--out", str(out), "--json",
        )
        assert code == EXIT_OK
        outs.append(out.read_bytes())
        assert json.loads(text)["fragment"] == 1
    assert outs[0] == outs[1] and outs[0] != outs[2]
    layouts = cli_layouts.compute_task_layouts(cli_files.read_spec_file(str(spec)))
    assert len(layouts) == 3
    expected = PayloadHeader("unit-task", 2, 1, "raw", layouts[1].layout_hash())
    decoded = decode_payload(outs[0], layouts[1], expected=expected, max_bytes=1 << 20)
    flat = decoded.flat_fp32()
    assert flat.numel() == layouts[1].numel and 0 < float(flat.abs().max()) < 0.01


def test_make_gradient_draws_a_fragment_whose_fp32_gradient_is_exactly_the_input_bound(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The size cap is the most submit-gradient reads: a fragment whose fp32 gradient is exactly
    that size is drawn (submit-gradient reads it); one element more is refused before any
    allocation, exit 2 when the layout is the user's own spec."""
    spec = _tiny_spec(tmp_path)
    size = 4 * cli_layouts.compute_task_layouts(cli_files.read_spec_file(str(spec)))[0].numel
    argv = ["train", "make-gradient", "--spec", str(spec), "--round", "0", "--fragment", "0", "--out", str(tmp_path / "g")]
    monkeypatch.setattr(spec_commands, "MAX_INPUT_FILE_BYTES", size)
    code, _, err = run(capsys, *argv)
    assert code == EXIT_OK, err
    monkeypatch.setattr(spec_commands, "MAX_INPUT_FILE_BYTES", size - 1)
    code, _, err = run(capsys, *argv)
    assert code == EXIT_USAGE and err.endswith(f"exceed {size - 1} bytes, the most submit-gradient reads\n")


def test_invalid_make_gradient_inputs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec = _tiny_spec(tmp_path)
    out = str(tmp_path / "x")
    base = ["train", "make-gradient", "--spec", str(spec), "--round", "0", "--out", out]
    code, _, err = run(capsys, *base, "--fragment", "3")
    assert code == EXIT_USAGE and "--fragment must be in 0..2" in err
    code, _, err = run(capsys, "train", "make-gradient", "--round", "0", "--fragment", "0", "--out", out)
    assert code == EXIT_USAGE and err.startswith("tenzro: pass --task-id (layouts from the node's getRun) or --spec")
    for scale in ("-1", "0", "nan"):  # a zero or NaN deviation draws no gradient at all
        code, _, err = run(capsys, *base, "--fragment", "0", "--scale", scale)
        assert (code, err) == (EXIT_USAGE, "tenzro: --scale must be a positive number\n"), scale
    (tmp_path / "init.safetensors").write_bytes(b"tampered")
    code, _, err = run(capsys, *base, "--fragment", "0")
    assert code == EXIT_USAGE and not os.path.exists(out)
    # A URI the spec's grammar allows but urllib cannot split gave a traceback (fuzz probe).
    doc = json.loads(spec.read_text())
    doc["architecture"]["metadata"]["init_checkpoint"]["uri"] = "file://[x/init.safetensors"
    spec.write_text(json.dumps(doc))
    code, _, err = run(capsys, *base, "--fragment", "0")
    assert code == EXIT_USAGE and err.startswith("tenzro: init checkpoint 'file://[x/init.safetensors': not a valid URI")
    assert err.count("\n") == 1 and not os.path.exists(out)


def _two_fragment_model() -> Any:
    from tenzro_training.fragments import TensorSpec
    from tenzro_training.global_model import ModelLayout

    return ModelLayout.from_specs([TensorSpec("a", (2, 3), "bfloat16"), TensorSpec("b", (4,), "float32")], 2)


def test_layouts_from_the_nodes_get_run_are_the_layouts_it_committed() -> None:
    """A trainer and make-gradient --task-id build their payloads on the layouts read back from
    getRun: each must be exactly the node's (index, dtypes, slices), or every payload they
    build is refused for its layout hash."""
    model = _two_fragment_model()
    assert cli_layouts.compute_layouts_from_view({"task_id": "t", "fragments": model.to_view()}) == model.layouts


@pytest.mark.parametrize(("damage", "message"), [
    (lambda v: [], "the node's getRun has no fragment layouts: pass --spec or --checkpoint"),
    (lambda v: [v[1], v[0]], "the node's fragment layouts are malformed: fragment 0: layout hash mismatch"),
    (lambda v: [{**v[0], "index": "0"}, v[1]], "the node's fragment layouts are malformed: "),
    (lambda v: [{**v[0], "layout_hash": v[1]["layout_hash"]}, v[1]],
     "the node's fragment layouts are malformed: fragment 0: layout hash mismatch"),
    (lambda v: [{**v[0], "entries": [{k: x for k, x in v[0]["entries"][0].items() if k != "dtype"}]}, v[1]],
     "the node's fragment layouts are malformed: 'dtype'"),
    (lambda v: [{**v[0], "entries": [{**v[0]["entries"][0], "shape": 6}]}, v[1]], "the node's fragment layouts are malformed: "),
    (lambda v: [{**v[0], "entries": [{**v[0]["entries"][0], "dtype": "float99"}]}, v[1]],
     "the node's fragment layouts are malformed: "),
])
def test_invalid_layouts_from_the_nodes_get_run_exit_1(damage: Any, message: str) -> None:
    """Layouts a node answers that are missing, out of order, of another hash or not layouts at
    all are the node's fault: one line, exit 1 (never a traceback, never layouts a payload
    would then be built on)."""
    view = {"task_id": "t", "fragments": damage(_two_fragment_model().to_view())}
    with pytest.raises(CliError) as info:
        cli_layouts.compute_layouts_from_view(view)
    assert str(info.value).startswith(message) and info.value.exit_code == EXIT_RPC_ERROR
    with pytest.raises(CliError, match="has no fragment layouts"):
        cli_layouts.compute_layouts_from_view([view])  # type: ignore[arg-type]


def test_task_layouts_from_a_checkpoint_file_are_its_fp32_layouts(tmp_path: Path) -> None:
    """make-gradient --checkpoint must compute the layouts the node computes, and the node
    holds the model in fp32 whatever the file holds: layout hashes name dtypes, so a bf16 file
    must give the layouts of its fp32 original, or every payload is refused."""
    import torch

    from tenzro_training.trainer.model import load_checkpoint, save_checkpoint

    spec = cli_files.read_spec_file(str(_tiny_spec(tmp_path)))
    ref = spec.init_checkpoint()
    assert ref is not None
    state = load_checkpoint(tmp_path / "init.safetensors", ref.sha256)
    save_checkpoint({name: t.to(torch.bfloat16) for name, t in state.items()}, tmp_path / "bf16.safetensors")
    assert cli_layouts.compute_task_layouts(spec, str(tmp_path / "bf16.safetensors")) == \
        cli_layouts.compute_task_layouts(spec)


def test_invalid_task_layouts_checkpoints_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The spec's init checkpoint is hash-pinned: a file replaced by another valid checkpoint is
    refused, not used; a missing --checkpoint and a spec naming none are the user's to fix
    (exit 2, one line), and nothing is written."""
    from tenzro_training.trainer.model import load_checkpoint, save_checkpoint

    spec = _tiny_spec(tmp_path)
    out = tmp_path / "g"
    base = ["train", "make-gradient", "--spec", str(spec), "--round", "0", "--fragment", "0", "--out", str(out)]
    code, _, err = run(capsys, *base, "--checkpoint", str(tmp_path / "missing.safetensors"))
    assert code == EXIT_USAGE and err.startswith("tenzro: cannot read checkpoint ") and err.count("\n") == 1
    doc = json.loads(spec.read_text())
    ckpt = tmp_path / "init.safetensors"
    state = load_checkpoint(ckpt, doc["architecture"]["metadata"]["init_checkpoint"]["sha256"])
    save_checkpoint({name: t + 1 for name, t in state.items()}, ckpt)
    code, _, err = run(capsys, *base)
    assert code == EXIT_USAGE and err.startswith("tenzro: ") and err.count("\n") == 1
    del doc["architecture"]["metadata"]["init_checkpoint"]
    spec.write_text(json.dumps(doc))
    code, _, err = run(capsys, *base)
    assert (code, err) == (EXIT_USAGE, "tenzro: the spec names no architecture.metadata.init_checkpoint: pass --checkpoint\n")
    assert not out.exists()


def test_random_gradients_differ_per_fragment_round_task_and_seed() -> None:
    """make-gradient's gradients stand in for distinct trainers' work in tests and demos: two
    fragments of one size, two rounds, two tasks or two seeds must not draw the same values
    (an aggregation test would see identical submissions), and the same inputs must draw the
    same values (a rerun reproduces a payload)."""
    import torch

    first, second = _two_fragment_model().layouts  # 5 elements each
    draw = cli_layouts.compute_random_gradient
    base = draw(first, 1, "t", 0, 1.0)
    assert torch.equal(base, draw(first, 1, "t", 0, 1.0))
    for other in (draw(second, 1, "t", 0, 1.0), draw(first, 1, "t", 1, 1.0), draw(first, 1, "u", 0, 1.0),
                  draw(first, 2, "t", 0, 1.0)):
        assert not torch.equal(base, other)
    assert torch.equal(draw(first, 1, "t", 0, 2.0), base * 2)


def test_export_model_from_model_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import torch

    from tenzro_training.fragments import compute_model_hash
    from tenzro_training.trainer.model import save_checkpoint

    state = {"a.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    (tmp_path / "node" / "models").mkdir(parents=True)
    save_checkpoint(state, tmp_path / "node" / "models" / "t1.safetensors")
    out = tmp_path / "final.safetensors"
    code, text, _ = run(
        capsys, "train", "export-model", "--task-id", "t1", "--data-dir", str(tmp_path / "node"), "--out", str(out), "--json"
    )
    assert code == EXIT_OK and out.read_bytes() == (tmp_path / "node" / "models" / "t1.safetensors").read_bytes()
    assert json.loads(text)["model_hash"] == "0x" + compute_model_hash(state).hex()


def test_init_checkpoint_writes_what_the_node_verifies_at_post_task(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The sponsor's first step from the CLI alone: the shipped example spec (no checkpoint) ->
    a checkpoint file and a spec naming it, which the node's loader accepts; same seed, same
    bytes; another seed, other weights."""
    from tenzro_training.node.checkpoint import load_init_checkpoint
    from tenzro_training.spec import TrainingTaskSpec
    from tenzro_training.trainer.model import config_from_spec, count_params

    example = Path(cli.__file__).parents[1] / "data" / "timesfm-200m-task.json"
    code, out, err = run(capsys, "train", "init-checkpoint", "--spec", str(example), "--out",
                         str(tmp_path / "a.safetensors"), "--spec-out", str(tmp_path / "spec.json"), "--json")
    assert code == 0, err
    result = json.loads(out)
    assert "param_count is 200000000" in err  # the example declares more than its metadata describes
    data = (tmp_path / "a.safetensors").read_bytes()
    assert result["sha256"] == "0x" + hashlib.sha256(data).hexdigest()
    assert result["uri"] == (tmp_path / "a.safetensors").resolve().as_uri()
    spec = TrainingTaskSpec.from_json((tmp_path / "spec.json").read_text())
    ref = spec.init_checkpoint()
    assert ref is not None and (ref.uri, ref.sha256) == (result["uri"], result["sha256"])
    state = load_init_checkpoint(spec, allowed_dirs=(tmp_path,), max_bytes=1 << 30)
    assert sum(t.numel() for t in state.values()) == result["param_count"] == count_params(config_from_spec(spec))
    assert run(capsys, "train", "init-checkpoint", "--spec", str(example), "--out", str(tmp_path / "b.safetensors"))[0] == 0
    assert (tmp_path / "b.safetensors").read_bytes() == data
    assert run(capsys, "train", "init-checkpoint", "--spec", str(example), "--out", str(tmp_path / "c.safetensors"),
               "--seed", "7")[0] == 0
    assert (tmp_path / "c.safetensors").read_bytes() != data


def test_invalid_init_checkpoint_spec(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "spec.json").write_text(json.dumps({"task_id": "t"}))
    code, out, err = run(capsys, "train", "init-checkpoint", "--spec", str(tmp_path / "spec.json"), "--out",
                         str(tmp_path / "x"))
    assert code == EXIT_USAGE and out == "" and err.startswith("tenzro: ") and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_invalid_export_model_not_a_data_dir(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "train", "export-model", "--task-id", "t1", "--data-dir", str(tmp_path), "--out", "o")
    assert code == EXIT_USAGE and "not a node data directory" in err


def test_invalid_export_model_of_a_db_that_is_not_a_store_creates_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """export-model only reads a node's store: a db/ that holds none (empty, or another
    program's) is refused in one line, exit 2, and no store is created in it."""
    (tmp_path / "db").mkdir()
    code, out, err = run(capsys, "train", "export-model", "--task-id", "t1", "--data-dir", str(tmp_path),
                         "--out", str(tmp_path / "o"))
    assert code == EXIT_USAGE and out == "" and err.startswith("tenzro: ") and err.count("\n") == 1
    assert list((tmp_path / "db").iterdir()) == [] and not (tmp_path / "o").exists()


def test_out_files_follow_the_umask(tmp_path: Path) -> None:
    import os
    import stat

    old = os.umask(0o077)
    try:
        cli_files.write_out(str(tmp_path / "private"), b"x")
        os.umask(0o022)
        cli_files.write_out(str(tmp_path / "shared"), b"y")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "private").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "shared").st_mode) == 0o644


def test_invalid_export_model_beside_a_running_node_says_the_run_is_unknown(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The store is read read-only, beside the running node that holds its lock: a run it does
    not hold is one line, not the lock's text."""
    from storage import open_store

    store = open_store(tmp_path / "node" / "db")  # the running node's lock
    try:
        code, out, err = run(capsys, "train", "export-model", "--task-id", "t1", "--data-dir",
                             str(tmp_path / "node"), "--out", str(tmp_path / "o"))
    finally:
        store.close()
    assert code == EXIT_RPC_ERROR and out == "" and err == "tenzro: cannot export t1: t1: unknown task\n"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("task_id", ["../../evil", "a/b", ""])
def test_invalid_export_model_task_id_cannot_leave_the_models_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, task_id: str
) -> None:
    (tmp_path / "node" / "models").mkdir(parents=True)
    (tmp_path / "evil.safetensors").write_bytes(b"planted")  # node/models/../../evil.safetensors
    code, _, err = run(capsys, "train", "export-model", "--task-id", task_id, "--data-dir", str(tmp_path / "node"),
                       "--out", str(tmp_path / "out"))
    assert code == EXIT_USAGE and "task_id must be" in err and not (tmp_path / "out").exists()


def test_invalid_export_model_file_that_is_not_regular(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import os

    models = tmp_path / "node" / "models"
    models.mkdir(parents=True)
    os.mkfifo(models / "t1.safetensors")
    code, _, err = run(capsys, "train", "export-model", "--task-id", "t1", "--data-dir", str(tmp_path / "node"),
                       "--out", str(tmp_path / "out"))
    assert code == EXIT_USAGE and "not a regular file" in err


def test_invalid_export_model_file_that_is_not_safetensors_writes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A damaged model file in D/models is named with what is wrong with it (exit 2), rather than
    exported or reported as a node's fault."""
    models = tmp_path / "node" / "models"
    models.mkdir(parents=True)
    (models / "t1.safetensors").write_bytes(b"not safetensors")
    code, out, err = run(capsys, "train", "export-model", "--task-id", "t1", "--data-dir", str(tmp_path / "node"),
                         "--out", str(tmp_path / "out"))
    assert code == EXIT_USAGE and out == "" and err.count("\n") == 1
    assert err.startswith(f"tenzro: {models / 't1.safetensors'}: not a readable safetensors model: ")
    assert not (tmp_path / "out").exists()


# --- syncer daemon ----------------------------------------------------------------------------------


def _view(**changes: Any) -> dict[str, Any]:
    view = {
        "status": "Training", "round": 0, "syncer": KEY_ADDRESS, "now_ms": 1000, "quorum_at_ms": 500,
        "straggler_deadline_ms": 2000, "submission_counts": [2, 2],
        "trainers": [{"slashed": False}, {"slashed": False}, {"slashed": False}],
    }
    view.update(changes)
    return view


def test_is_round_closed() -> None:
    from tenzro_training.node.syncer import is_round_closed

    assert not is_round_closed(_view())  # straggler window open, one trainer missing
    assert is_round_closed(_view(now_ms=2001))  # window over
    assert is_round_closed(_view(submission_counts=[3, 3]))  # everyone submitted
    slashed = [{"slashed": False}, {"slashed": False}, {"slashed": True}]
    assert is_round_closed(_view(trainers=slashed))  # the slashed trainer is not waited for
    assert not is_round_closed(_view(quorum_at_ms=None, straggler_deadline_ms=None, now_ms=9999))
    assert not is_round_closed(_view(status="Enrolling", now_ms=9999))
    assert is_round_closed(_view(accepted_set_closed=True)) and not is_round_closed(_view(now_ms=9999, accepted_set_closed=False))


@pytest.mark.parametrize("changes", [
    {"accepted_set_closed": 1},  # only true itself is closed: a node's 1 or "true" is not
    {"accepted_set_closed": "true"},
    {"accepted_set_closed": "false", "now_ms": 9999},
    {"now_ms": 2000},  # the window closes after its deadline, not at it
    {"quorum_at_ms": None, "now_ms": 9999},  # no quorum yet: the deadline alone does not close it
    {"straggler_deadline_ms": None, "now_ms": 9999},
    {"now_ms": None},  # no clock: only every trainer having submitted closes it
    {"now_ms": "9999"},
    {"submission_counts": []},
    {"submission_counts": [3.0, 3.0]},
    {"submission_counts": [3, "3"]},
])
def test_invalid_views_do_not_close_the_round(changes: dict[str, Any]) -> None:
    from tenzro_training.node.syncer import is_round_closed

    assert is_round_closed(_view(**changes)) is False


class FakeClient:
    url = "fake://node"

    def __init__(self, views: dict[str, dict[str, Any]], refuse: bool = False) -> None:
        self.views = views
        self.refuse = refuse
        self.finalized: list[tuple[str, int, str]] = []

    def call(self, method: str, params: dict[str, Any]) -> Any:
        if method == "tenzro_training_listRuns":
            assert params["status"] == "Training"
            return {"runs": [{"task_id": t} for t in self.views]}
        if method == "tenzro_training_getRun":
            return self.views[params["task_id"]]
        assert method == "tenzro_training_finalizeRound"
        if self.refuse:
            raise CliError("error 1300 StragglerWindowOpen: window open", EXIT_RPC_ERROR)
        self.finalized.append((params["task_id"], params["round"], params["signature"]))
        return {"status": "Training", "model_hash": "0x00"}


def test_syncer_daemon_finalizes_only_its_closed_rounds() -> None:
    from tenzro_training.node.syncer import SyncerDaemon

    views = {
        "mine-closed": _view(round=3, now_ms=5000),
        "mine-open": _view(),
        "other": _view(syncer="0x" + "11" * 20, now_ms=5000),
    }
    client = FakeClient(views)
    lines: list[str] = []
    daemon = SyncerDaemon(client, KEY, emit=lines.append)
    assert daemon.poll_once() == 1
    (task, round_, sig), = client.finalized
    assert (task, round_) == ("mine-closed", 3)
    assert auth.recover_signer(auth.FinalizeRound(task_id=task, round=3), bytes.fromhex(sig[2:])) == KEY_ADDRESS
    assert lines == ["finalized mine-closed round 3 status Training model 0x00"]


def test_syncer_daemon_logs_a_refusal_once() -> None:
    from tenzro_training.node.syncer import SyncerDaemon

    client = FakeClient({"t": _view(now_ms=5000)}, refuse=True)
    lines: list[str] = []
    daemon = SyncerDaemon(client, KEY, emit=lines.append)
    assert daemon.poll_once() == 0 and daemon.poll_once() == 0
    assert len(lines) == 1 and "refused" in lines[0]


# --- the syncer daemon against a node it cannot trust (syncer probe, 2026-11-26) ----------------------


class ScriptedClient:
    """Answers listRuns/getRun from callables; records every call."""

    url = "fake://node"

    def __init__(self, list_runs: Any, get_run: Any = None) -> None:
        self.list_runs, self.get_run = list_runs, get_run
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def call(self, method: str, params: dict[str, Any]) -> Any:
        self.calls.append((method, params))
        if method == "tenzro_training_listRuns":
            return self.list_runs(params)
        if method == "tenzro_training_getRun":
            return self.get_run(params)
        raise CliError("error 1315 NotSyncer: not the current syncer", EXIT_RPC_ERROR)


def test_syncer_paging_that_never_ends_stops() -> None:
    """A node (or proxy) answering every listRuns with a full page kept the first pass paging
    forever: 10 GB and deaf to SIGTERM."""
    from tenzro_training.node.syncer import SyncerDaemon

    full = {"runs": [{"task_id": f"r{i}", "syncer": "0x" + "11" * 20} for i in range(500)]}
    client = ScriptedClient(lambda params: full, lambda params: _view(syncer="0x" + "11" * 20))
    lines: list[str] = []
    daemon = SyncerDaemon(client, KEY, emit=lines.append)
    assert daemon.poll_once() == 0
    listed = [m for m, _ in client.calls if m == "tenzro_training_listRuns"]
    assert len(listed) == 2  # no progress on page 2: stop
    assert lines == ["listRuns paging stopped making progress at offset 1000 (500 runs read); using those"]
    daemon.poll_once()
    assert len(lines) == 1  # said once
    fresh = ScriptedClient(lambda params: {"runs": [{"task_id": f"p{params['offset'] + i}"} for i in range(500)]})
    stop = threading.Event()
    stop.set()
    assert SyncerDaemon(fresh, KEY, emit=lines.append).poll_once(stop) == 0 and fresh.calls == []  # stop is heard


def test_listruns_paging_stops_at_its_bound_of_runs() -> None:
    """A node naming ever new runs on every page is read up to 100000 runs, not forever."""
    from tenzro_training.node.syncer import SyncerDaemon

    def list_runs(params: dict[str, Any]) -> Any:
        assert params["offset"] < 100_000  # the pass stopped at the bound
        return {"runs": [{"task_id": f"p{params['offset'] + i}", "syncer": "0x" + "11" * 20} for i in range(500)]}

    client = ScriptedClient(list_runs, lambda params: {})
    lines: list[str] = []
    runs = SyncerDaemon(client, KEY, emit=lines.append)._training_runs()
    assert len(runs) == 100_000 and len(client.calls) == 200
    assert lines == ["listRuns paging stopped making progress at offset 100000 (100000 runs read); using those"]


def test_syncer_skips_what_it_cannot_use_with_one_line_each() -> None:
    from tenzro_training.node.syncer import SyncerDaemon

    runs = {"runs": [{"task_id": "a\ud800b"}, {"task_id": "big"}, {"task_id": "list"}, {"task_id": "other",
                                                                                        "syncer": "0x" + "11" * 20}]}
    views = {"big": _view(round=2**64, accepted_set_closed=True), "list": [1, 2],
             "other": _view(syncer="0x" + "11" * 20)}
    client = ScriptedClient(lambda params: runs, lambda params: views[params["task_id"]])
    lines: list[str] = []
    daemon = SyncerDaemon(client, KEY, emit=lines.append)
    for _ in range(3):
        assert daemon.poll_once() == 0
    assert lines == [
        "listRuns named a malformed task id 'a\\ud800b'; skipped",
        "getRun big: the node's answer has no valid round; skipped",
        "getRun list: the node's answer is not an object; skipped",
    ]
    # listRuns named another syncer: one getRun (its ranking), not one per poll
    assert client.calls.count(("tenzro_training_getRun", {"task_id": "other"})) == 1


def test_syncer_says_once_when_its_key_is_not_ranked() -> None:
    from tenzro_training.node.syncer import SyncerDaemon

    view = _view(syncer="0x" + "11" * 20)
    view["election"] = {"ranking": [{"address": "0x" + "11" * 20}, {"address": "0x" + "22" * 20}]}
    # As a real node answers: listRuns names the run's syncer (another key).
    client = ScriptedClient(lambda params: {"runs": [{"task_id": "t", "syncer": "0x" + "11" * 20}]},
                            lambda params: view)
    lines: list[str] = []
    daemon = SyncerDaemon(client, KEY, emit=lines.append)
    daemon.poll_once()
    daemon.poll_once()
    assert lines == [f"{KEY_ADDRESS} is not a ranked syncer candidate of t; this daemon will never finalize it"]
    assert [m for m, _ in client.calls].count("tenzro_training_getRun") == 1  # the ranking is read once


def test_syncer_poll_failures_are_logged_once_until_they_change() -> None:
    from tenzro_training.node.syncer import SyncerDaemon

    answers = [CliError("error -32603 InternalError: internal", EXIT_RPC_ERROR)] * 3 + [{"runs": []}]

    def list_runs(params: dict[str, Any]) -> Any:
        answer = answers.pop(0) if answers else {"runs": []}
        if isinstance(answer, Exception):
            raise answer
        return answer

    lines: list[str] = []
    stop = threading.Event()
    daemon = SyncerDaemon(ScriptedClient(list_runs), KEY, emit=lambda line: (lines.append(line),
                                                                              len(lines) >= 3 and stop.set()))
    daemon.run(0.001, False, stop)
    assert lines[1:] == ["poll failed: error -32603 InternalError: internal; retrying every 0.001s",
                         "polls succeed again"]


def test_syncer_says_once_that_the_node_is_unreachable_and_once_that_it_is_back() -> None:
    """A node that is down for several polls is one line, not one per poll, and the first poll
    that reaches it again says so; the pass after it finalizes as usual."""
    from tenzro_training.node.syncer import SyncerDaemon

    down = CliError("cannot reach node at fake://node: connection refused", EXIT_UNREACHABLE)
    answers: list[Any] = [down, down, down]

    polls: list[int] = []
    stop = threading.Event()

    def list_runs(params: dict[str, Any]) -> Any:
        polls.append(1)
        if len(polls) > 500:
            stop.set()  # bounded: a regression fails the assertions below instead of hanging
        if answers:
            raise answers.pop(0)
        return {"runs": [{"task_id": "t"}]}

    client = ScriptedClient(list_runs, lambda params: _view(round=1, now_ms=5000))
    finalized: list[dict[str, Any]] = []
    real_call = client.call

    def call(method: str, params: dict[str, Any]) -> Any:
        if method == "tenzro_training_finalizeRound":
            finalized.append(params)
            return {"status": "Training", "model_hash": "0x00"}
        return real_call(method, params)

    client.call = call  # type: ignore[method-assign]
    lines: list[str] = []
    daemon = SyncerDaemon(client, KEY, emit=lambda line: (lines.append(line), line.startswith("finalized") and stop.set()))
    daemon.run(0.001, False, stop)
    assert lines[0].startswith("syncer ") and lines[1:] == [
        "cannot reach node at fake://node: connection refused; retrying every 0.001s",
        "node fake://node reachable again",
        "finalized t round 1 status Training model 0x00",
    ]
    assert [p["round"] for p in finalized] == [1]


def test_syncer_skips_a_run_whose_getrun_is_refused_but_stops_the_pass_when_the_node_goes_away() -> None:
    """A run that vanished between listRuns and getRun (or that the node refuses) is skipped with
    one line and the other runs are still served; a node that stops answering in the middle of
    a pass ends the pass (the loop retries), it is not taken for a refusal."""
    from tenzro_training.node.syncer import SyncerDaemon

    runs = {"runs": [{"task_id": "gone"}, {"task_id": "mine"}]}
    refused = CliError("error 1302 RunNotFound: no run gone", EXIT_RPC_ERROR)

    def get_run(params: dict[str, Any]) -> Any:
        if params["task_id"] == "gone":
            raise refused
        return _view(round=0, now_ms=5000)

    client = FakeClient({})
    scripted = ScriptedClient(lambda params: runs, get_run)

    def call(method: str, params: dict[str, Any]) -> Any:
        if method == "tenzro_training_finalizeRound":
            return client.call(method, params)
        return scripted.call(method, params)

    scripted_call = type("C", (), {"url": "fake://node", "call": staticmethod(call)})()
    lines: list[str] = []
    daemon = SyncerDaemon(scripted_call, KEY, emit=lines.append)
    assert daemon.poll_once() == 1 and daemon.poll_once() == 1
    assert [(t, r) for t, r, _ in client.finalized] == [("mine", 0), ("mine", 0)]
    assert lines.count("getRun gone refused: error 1302 RunNotFound: no run gone; skipped") == 1

    refused.exit_code = EXIT_UNREACHABLE
    with pytest.raises(CliError) as info:
        daemon.poll_once()
    assert info.value.exit_code == EXIT_UNREACHABLE and len(client.finalized) == 2


def test_syncer_once_exits_1_when_a_finalize_was_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """--once is for cron jobs: a refused finalize exited 0, so nobody noticed."""
    from tenzro_training.node.syncer import SyncerDaemon

    client = FakeClient({"t": _view(now_ms=5000)}, refuse=True)
    lines: list[str] = []
    with pytest.raises(CliError, match="1 finalize call\\(s\\) refused") as info:
        SyncerDaemon(client, KEY, emit=lines.append).run(0.5, True, threading.Event())
    assert info.value.exit_code == EXIT_RPC_ERROR
    assert lines[0] == f"syncer {KEY_ADDRESS}: one pass over fake://node" and "refused" in lines[1]


def test_syncer_finalizes_a_run_listed_with_its_own_address_on_a_later_poll() -> None:
    """listRuns naming this key as the syncer: the run is read every poll (only another key's
    runs are skipped once their ranking was seen), so a round that closes later is finalized."""
    from tenzro_training.node.syncer import SyncerDaemon

    views = {"t": _view(round=4)}
    client = FakeClient(views)
    client_call = client.call

    def call(method: str, params: dict[str, Any]) -> Any:
        if method == "tenzro_training_listRuns":
            return {"runs": [{"task_id": "t", "syncer": KEY_ADDRESS.lower()}]}
        return client_call(method, params)

    client.call = call  # type: ignore[method-assign]
    daemon = SyncerDaemon(client, KEY, emit=[].append)
    assert daemon.poll_once() == 0  # the straggler window is still open
    views["t"] = _view(round=4, now_ms=5000)
    assert daemon.poll_once() == 1 and [(t, r) for t, r, _ in client.finalized] == [("t", 4)]


def test_syncer_reads_a_run_whose_listed_syncer_is_not_a_string() -> None:
    from tenzro_training.node.syncer import SyncerDaemon

    client = ScriptedClient(lambda params: {"runs": [{"task_id": "t", "syncer": 5}]},
                            lambda params: _view(syncer="0x" + "11" * 20))
    daemon = SyncerDaemon(client, KEY, emit=[].append)
    assert daemon.poll_once() == 0 and daemon.poll_once() == 0
    assert [m for m, _ in client.calls].count("tenzro_training_getRun") == 2  # not listed: read each poll


def test_syncer_stops_a_pass_between_runs_once_asked() -> None:
    from tenzro_training.node.syncer import SyncerDaemon

    stop = threading.Event()

    def get_run(params: dict[str, Any]) -> Any:
        stop.set()  # SIGTERM while the first run is read
        return _view(syncer="0x" + "11" * 20)

    client = ScriptedClient(lambda params: {"runs": [{"task_id": "a"}, {"task_id": "b"}]}, get_run)
    assert SyncerDaemon(client, KEY, emit=[].append).poll_once(stop) == 0
    assert client.calls[1:] == [("tenzro_training_getRun", {"task_id": "a"})]


def test_syncer_skips_a_negative_round_as_invalid() -> None:
    from tenzro_training.node.syncer import SyncerDaemon

    client = FakeClient({"t": _view(round=-1, accepted_set_closed=True)})
    lines: list[str] = []
    assert SyncerDaemon(client, KEY, emit=lines.append).poll_once() == 0
    assert lines == ["getRun t: the node's answer has no valid round; skipped"] and client.finalized == []


def test_syncer_says_reachable_again_once() -> None:
    from tenzro_training.node.syncer import SyncerDaemon

    answers: list[Any] = [CliError("cannot reach node at fake://node: connection refused", EXIT_UNREACHABLE)]
    polls: list[int] = []
    stop = threading.Event()

    def list_runs(params: dict[str, Any]) -> Any:
        polls.append(1)
        if len(polls) >= 4:
            stop.set()
        if answers:
            raise answers.pop(0)
        return {"runs": []}

    lines: list[str] = []
    SyncerDaemon(ScriptedClient(list_runs), KEY, emit=lines.append).run(0.001, False, stop)
    assert len(polls) == 4 and lines[1:] == [
        "cannot reach node at fake://node: connection refused; retrying every 0.001s",
        "node fake://node reachable again",
    ]


def test_syncer_once_makes_one_pass_and_returns() -> None:
    from tenzro_training.node.syncer import SyncerDaemon

    stop = threading.Event()
    listed: list[int] = []

    def list_runs(params: dict[str, Any]) -> Any:
        listed.append(1)
        if len(listed) > 1:
            stop.set()  # bounded: a second pass ends the loop instead of hanging
        return {"runs": []}

    lines: list[str] = []
    SyncerDaemon(ScriptedClient(list_runs), KEY, emit=lines.append).run(0.001, True, stop)
    assert listed == [1] and lines == [f"syncer {KEY_ADDRESS}: one pass over fake://node"]


def test_syncer_poll_failure_is_logged_again_after_a_success() -> None:
    from tenzro_training.node.syncer import SyncerDaemon

    failure = CliError("error -32603 InternalError: internal", EXIT_RPC_ERROR)
    answers: list[Any] = [failure, {"runs": []}, {"runs": []}, failure, {"runs": []}]
    stop = threading.Event()

    def list_runs(params: dict[str, Any]) -> Any:
        answer = answers.pop(0)
        if not answers:
            stop.set()
        if isinstance(answer, Exception):
            raise answer
        return answer

    lines: list[str] = []
    SyncerDaemon(ScriptedClient(list_runs), KEY, emit=lines.append).run(0.001, False, stop)
    failed = "poll failed: error -32603 InternalError: internal; retrying every 0.001s"
    assert lines[1:] == [failed, "polls succeed again", failed, "polls succeed again"]


def test_syncer_waits_its_poll_interval_between_polls() -> None:
    from tenzro_training.node.syncer import SyncerDaemon

    class Stop(threading.Event):
        waits: list[float | None] = []

        def wait(self, timeout: float | None = None) -> bool:
            self.waits.append(timeout)
            if len(self.waits) == 2:
                self.set()
            return self.is_set()

    stop = Stop()
    SyncerDaemon(ScriptedClient(lambda params: {"runs": []}), KEY, emit=[].append).run(7.5, False, stop)
    assert stop.waits == [7.5, 7.5]


def test_syncer_once_with_nothing_to_do_exits_0_quietly(capsys: pytest.CaptureFixture[str], fake_node: FakeNode,
                                                         key_file: Path) -> None:
    fake_node.replies["tenzro_training_listRuns"] = {"runs": []}
    code, out, err = run(capsys, "syncer", "run", "--once", "--key-file", str(key_file), "--rpc", fake_node.url)
    assert code == 0 and err == "" and out.endswith(f"syncer {KEY_ADDRESS}: one pass over {fake_node.url}\n")


def test_syncer_sigterm_ends_a_hung_call_at_once(tmp_path: Path, key_file: Path) -> None:
    """SIGTERM during a finalizeRound the node never answered took the client's 60 s timeout
    to act; a supervisor's 10 s grace period would SIGKILL the daemon first."""
    import signal
    import subprocess
    import sys

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts (the kernel does), never answers
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        proc = subprocess.Popen([sys.executable, "-m", "tenzro_training.cli", "syncer", "run", "--key-file",
                                 str(key_file), "--rpc", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        assert "polling" in proc.stdout.readline()  # now inside its first, hung, listRuns
        time.sleep(0.5)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and time.monotonic() - started < 10
        assert "Traceback" not in err and "syncer stopped" in err
    finally:
        listener.close()


@pytest.mark.parametrize("argv", [
    ["syncer", "run", "--once", "--key-file", "k", "--chain-id", "0"],
    ["train", "finalize-round", "--task-id", "t", "--chain-id", "-1"],
    ["train", "verify-receipt", "--file", "r.json", "--chain-id", str(2**256)],
    ["train", "address", "--key-file", "k", "--chain-id", "x"],
    ["node", "--data-dir", ""],
    ["audit", "--data-dir", " "],
    ["train", "export-model", "--task-id", "t", "--data-dir", "", "--out", "m"],
])
def test_invalid_chain_id_or_empty_data_dir_is_a_usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """A chain id of 0 started a syncer that died at its first finalize, hours later; an empty
    --data-dir silently meant the current directory."""
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == EXIT_USAGE and ("--chain-id" in err or "--data-dir" in err)


@pytest.mark.parametrize("argv", [
    ["keys", "new-account", "--out", ""],
    ["train", "get-receipt", "--task-id", "t", "--out", " "],
])
def test_invalid_empty_out_is_a_usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """keys new-account --out "" said ".: already exists; refusing to overwrite a key"."""
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == EXIT_USAGE and "--out" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["receipt", "key"])
def test_invalid_deeply_nested_file_does_not_crash_the_process(tmp_path: Path, kind: str) -> None:
    """py_ecc's recursion limit made json.loads of these overflow the C stack (exit -11)."""
    import subprocess
    import sys

    path = tmp_path / "deep.json"
    if kind == "receipt":
        path.write_text("[" * 200_000)
        argv, expected = ["train", "verify-receipt", "--file", str(path)], EXIT_RPC_ERROR  # a failed decode check
    else:
        path.write_text('{"private_key":' + "[" * 200_000)
        argv, expected = ["train", "address", "--key-file", str(path)], EXIT_USAGE
    done = subprocess.run([sys.executable, "-m", "tenzro_training.cli", *argv], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == expected, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("interval", ["nan", "inf", "0", "-1", "1e10"])
def test_invalid_syncer_poll_interval_exits_2(
    capsys: pytest.CaptureFixture[str], key_file: Path, fake_node: FakeNode, interval: str
) -> None:
    # --once: without the check a NaN interval would poll with no pause, forever.
    code, out, err = run(capsys, "syncer", "run", "--once", "--poll-interval", interval, "--key-file", str(key_file),
                         "--rpc", fake_node.url)
    assert code == EXIT_USAGE and out == "" and fake_node.calls == []
    assert err == "tenzro: --poll-interval must be a positive number of seconds\n"


@pytest.mark.parametrize("argv", [
    ["syncer", "run", "--key-file", "k"],
    ["trainer", "run", "--task-id", "t", "--p2p-key", "p", "--bootstrap", "/ip4/127.0.0.1/tcp/1"],
])
def test_invalid_json_flag_on_long_running_processes(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    # They print log lines, never a JSON result: offering --json and ignoring it would mislead scripts.
    with pytest.raises(SystemExit) as info:
        cli.main([*argv, "--json"])
    assert info.value.code == EXIT_USAGE and "--json" in capsys.readouterr().err


def test_syncer_once_unreachable_exits_3(capsys: pytest.CaptureFixture[str], key_file: Path, closed_url: str) -> None:
    code, out, err = run(capsys, "syncer", "run", "--once", "--key-file", str(key_file), "--rpc", closed_url)
    assert code == EXIT_UNREACHABLE and "cannot reach node" in err
    assert "retrying" not in out + err  # --once makes one pass: it does not retry, so it must not say so


# --- dev genesis ---------------------------------------------------------------------------------------


def test_dev_genesis_is_deterministic_and_private(tmp_path: Path) -> None:
    from tenzro_training import vrf
    from tenzro_training.node.dev import DEV_BALANCE, DEV_TIMINGS, compute_dev_private_key, dev_genesis

    kwargs, doc = dev_genesis(tmp_path / "a")
    kwargs2, doc2 = dev_genesis(tmp_path / "b")
    assert doc == doc2 and kwargs == kwargs2
    path = tmp_path / "a" / "dev-accounts.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == doc
    roles = [(a["role"], a["index"]) for a in doc["accounts"]]
    assert roles == [("sponsor", 0)] + [("trainer", i) for i in range(8)] + [("syncer", i) for i in range(3)]
    assert len({a["address"] for a in doc["accounts"]}) == 12
    for a in doc["accounts"]:
        assert cli_keys.key_address(bytes.fromhex(a["private_key"][2:])) == a["address"]
    assert doc["accounts"][1]["private_key"] == "0x" + compute_dev_private_key("trainer", 0).hex()
    assert kwargs["genesis"] == tuple((bytes.fromhex(a["address"][2:]), DEV_BALANCE) for a in doc["accounts"])
    assert kwargs["timings"] == DEV_TIMINGS
    syncers = [a for a in doc["accounts"] if a["role"] == "syncer"]
    assert [c.address.hex() for c in kwargs["candidates"]] == [a["address"][2:].lower() for a in syncers]
    for ident, cand in zip(kwargs["syncer_identities"], kwargs["candidates"]):
        assert ident.address == cand.address and vrf.public_key(ident.vrf_secret) == cand.vrf_public_key


def test_dev_genesis_file_is_usable_as_key_file(tmp_path: Path) -> None:
    from tenzro_training.node.dev import compute_dev_private_key, dev_genesis

    dev_genesis(tmp_path, trainers=2, syncers=1)
    path = str(tmp_path / "dev-accounts.json")
    assert cli_keys.load_private_key(path, "syncer:0") == compute_dev_private_key("syncer", 0)
    assert cli_keys.load_private_key(path, "sponsor") == compute_dev_private_key("sponsor", 0)


def test_dev_accounts_are_the_documented_ones(tmp_path: Path) -> None:
    """node/dev.py documents the dev chain so that demos and other implementations reproduce it:
    1,000,000 TNZO in every account (in the file clients read as in the node's genesis), a DID
    for the sponsor and each trainer only, every syncer candidate staked 10**21 (equal stakes,
    equally likely to win), the timings 1 s / 60 s / 10 min / 10 s with no minimum stake, and a
    file that names its chain and warns that its keys are public."""
    from tenzro_training.node.dev import dev_genesis
    from tenzro_training.run_state import RunTimings

    kwargs, doc = dev_genesis(tmp_path)
    assert json.loads((tmp_path / "dev-accounts.json").read_text()) == doc
    assert doc["chain_id"] == 1337 and "dev keys are public" in doc["warning"]
    accounts = doc["accounts"]
    assert [a["balance"] for a in accounts] == [str(10**24)] * 12
    assert [balance for _, balance in kwargs["genesis"]] == [10**24] * 12
    assert [a.get("did") for a in accounts] == (
        ["did:tenzro:human:dev-sponsor"] + [f"did:tenzro:trainer:dev-{i}" for i in range(8)] + [None] * 3)
    assert [c.stake for c in kwargs["candidates"]] == [10**21] * 3
    assert [a["stake"] for a in accounts if a["role"] == "syncer"] == [str(10**21)] * 3
    assert kwargs["timings"] == RunTimings(election_window_ms=1_000, enrollment_window_ms=60_000,
                                           round_timeout_ms=600_000, finalize_window_ms=10_000, min_stake=0)


def test_dev_account_counts() -> None:
    """dev_accounts() alone gives the accounts a --dev node funds (8 trainers, 3 syncers); zero
    trainers or syncers is a valid (sponsor-only) set, a negative count is not."""
    from tenzro_training.node.dev import dev_accounts, dev_genesis

    assert dev_accounts() == dev_genesis(Path("unused"), write=False)[1]["accounts"]
    assert [a["role"] for a in dev_accounts(trainers=0, syncers=0)] == ["sponsor"]
    for counts in ({"trainers": -1}, {"syncers": -1}):
        with pytest.raises(ValueError, match=r"^trainers and syncers must be >= 0$"):
            dev_accounts(**counts)


def test_dev_accounts_file_is_written_the_same_way_by_both_paths(tmp_path: Path) -> None:
    """``tenzro node --dev`` stages then publishes the file, ``dev_genesis`` writes it at once:
    the same document must give the same bytes, mode 0600 even over a stale temporary a crash
    left with a wider mode, into a data dir created with its parents."""
    from tenzro_training.node.dev import StagedDevAccounts, dev_genesis

    _, doc = dev_genesis(tmp_path / "new" / "nested")
    written = (tmp_path / "new" / "nested" / "dev-accounts.json").read_bytes()
    assert written == (json.dumps(doc, indent=2) + "\n").encode()
    (tmp_path / "staged").mkdir()
    stale = tmp_path / "staged" / ".dev-accounts.json.tmp"
    stale.write_text("old")
    stale.chmod(0o644)
    StagedDevAccounts(tmp_path / "staged", doc).publish()
    published = tmp_path / "staged" / "dev-accounts.json"
    assert published.read_bytes() == written
    assert stat.S_IMODE(published.stat().st_mode) == 0o600
    assert sorted(p.name for p in (tmp_path / "staged").iterdir()) == ["dev-accounts.json"]


@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_an_interrupted_dev_accounts_write_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """A Ctrl-C while the file is written (or renamed into place) must not leave a copy of the
    keys under another name in the data dir."""
    from tenzro_training.node.dev import write_dev_accounts

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, step, interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_dev_accounts(tmp_path, {"chain_id": 1337})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("role", "index"), [("miner", 0), ("trainer", -1), ("trainer", True), ("trainer", "0")])
def test_invalid_dev_account_role(role: object, index: object) -> None:
    """A bool is an int to Python but ``trainer/True`` is no documented account; a text index
    must be refused as a bad account, not crash on the comparison."""
    from tenzro_training.node.dev import compute_dev_private_key

    with pytest.raises(ValueError, match=r"^dev account must be one of \('sponsor', 'trainer', 'syncer'\) with an index >= 0"):
        compute_dev_private_key(role, index)  # type: ignore[arg-type]


# --- node process configuration ---------------------------------------------------------------------


def test_node_config_precedence(tmp_path: Path) -> None:
    from tenzro_training.node.dev import DEV_TIMINGS
    from tenzro_training.node.main import load_node_config

    cfg_file = tmp_path / "node.json"
    cfg_file.write_text(json.dumps({"timings": {"election_window_ms": 250}, "rpc_port": 9000, "max_body_bytes": 4096}))
    cfg = load_node_config(tmp_path / "d", config_file=str(cfg_file), dev=True, rpc_host="0.0.0.0")
    # A partial timings object keeps the dev values it does not name.
    assert cfg.timings.election_window_ms == 250
    assert cfg.timings.finalize_window_ms == DEV_TIMINGS.finalize_window_ms
    assert (cfg.rpc_host, cfg.rpc_port, cfg.max_body_bytes) == ("0.0.0.0", 9000, 4096)
    assert len(cfg.candidates) == 3 and len(cfg.syncer_identities) == 3 and len(cfg.genesis) == 12
    assert cfg.data_dir == tmp_path / "d"
    plain = load_node_config(tmp_path / "e", rpc_port=0)
    assert plain.candidates == () and plain.genesis == () and plain.rpc_port == 0
    assert not (tmp_path / "e" / "dev-accounts.json").exists()


@pytest.mark.parametrize(
    ("content", "flags", "match"),
    [
        ('{"rpc_port": "8545"}', {"rpc_port": 9000}, "rpc_port"),
        ('{"rpc_port": 70000}', {"rpc_port": 9000}, "rpc_port"),
        ('{"rpc_host": ""}', {"rpc_host": "127.0.0.1"}, "rpc_host"),
    ],
)
def test_a_flag_does_not_hide_a_malformed_value_in_the_config_file(
    tmp_path: Path, content: str, flags: dict[str, object], match: str
) -> None:
    """--rpc-port replaced the file's rpc_port before anything read it, so a malformed one went
    unnoticed until the first start without the flag."""
    from tenzro_training.node.main import NodeStartupError, load_node_config

    path = tmp_path / "node.json"
    path.write_text(content)
    with pytest.raises(NodeStartupError, match=match):
        load_node_config(tmp_path / "d", config_file=str(path), **flags)  # type: ignore[arg-type]
    # A valid file value is replaced by the flag as before.
    path.write_text('{"rpc_port": 8546, "rpc_host": "localhost"}')
    cfg = load_node_config(tmp_path / "d", config_file=str(path), **flags)  # type: ignore[arg-type]
    assert {k: getattr(cfg, k) for k in flags} == flags


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{bad", "not valid JSON"),
        ("[]", "expected a JSON object"),
        ('{"timings": {"election_window_ms": 0}}', "election_window_ms"),
        ('{"no_such_key": 1}', "no_such_key"),
        ('{"rpc_port": 0, "rpc_port": 1}', "duplicate key 'rpc_port'"),  # json.loads kept the last, silently
        ('{"max_gradient_abs": NaN}', "NaN is not JSON"),
        ('{"timings": null}', "timings"),  # was dropped silently
        ('{"a": ' + "[" * 200 + "]" * 200 + "}", "JSON nested too deeply"),
    ],
)
def test_invalid_node_config(tmp_path: Path, content: str, match: str) -> None:
    from tenzro_training.node.main import NodeStartupError, load_node_config

    path = tmp_path / "node.json"
    path.write_text(content)
    with pytest.raises(NodeStartupError, match=match) as info:
        load_node_config(tmp_path / "d", config_file=str(path))
    assert str(info.value).startswith(f"config {path}")  # the operator is told which file
    with pytest.raises(NodeStartupError, match="cannot read config"):
        load_node_config(tmp_path / "d", config_file=str(tmp_path / "absent.json"))


def test_a_node_config_over_its_size_limit_is_refused_unread(tmp_path: Path) -> None:
    """A config file is read whole into memory: one past 16 MiB (a log written to the wrong
    path) is refused by its size, before a byte of it is read."""
    from tenzro_training.node.main import NodeStartupError, load_node_config

    path = tmp_path / "node.json"
    with open(path, "wb") as sparse:
        sparse.truncate((16 << 20) + 1)
    with pytest.raises(NodeStartupError) as info:
        load_node_config(tmp_path / "d", config_file=str(path))
    assert str(info.value) == f"cannot read config {path}: file is {(16 << 20) + 1} bytes, the limit is {16 << 20}"


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_invalid_input_that_is_not_a_regular_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """A FIFO blocked `tenzro node --config` (and every CLI file read) until a writer came, and
    /dev/zero filled memory until the kernel killed the process."""
    import os

    from tenzro_training.node.main import NodeStartupError, load_node_config

    if kind == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    elif kind == "device":
        path = "/dev/zero"
    else:
        path = str(tmp_path)
    with pytest.raises(NodeStartupError, match=r"cannot read config .*: (not a regular file|cannot open)"):
        load_node_config(tmp_path / "d", config_file=path)
    for read in (lambda: cli_keys.load_private_key(path), lambda: cli_files.read_text(path, "spec")):
        with pytest.raises(CliError, match=r"cannot read .*: (not a regular file|cannot open)") as info:
            read()
        assert info.value.exit_code == EXIT_USAGE


@pytest.mark.parametrize("dev", [False, True])
def test_node_startup_error_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path, dev: bool) -> None:
    path = tmp_path / "node.json"
    path.write_text('{"rpc_port": 70000}')
    argv = ["node", "--data-dir", str(tmp_path / "d"), "--config", str(path), *(["--dev"] if dev else [])]
    code, out, err = run(capsys, *argv)
    assert code == EXIT_USAGE and out == "" and "rpc_port" in err and err.count("\n") == 1
    assert not (tmp_path / "d").exists()  # a refused config writes nothing (ops probe)


def test_dev_accounts_name_the_chain_id_the_node_runs(tmp_path: Path) -> None:
    """A config file may set another chain id than the dev default: dev-accounts.json, which
    clients read it from, says the one the node signs under (it said 1337: ops probe)."""
    from tenzro_training.node.main import dev_accounts_document, load_node_config

    path = tmp_path / "node.json"
    path.write_text('{"chain_id": 5}')
    config = load_node_config(tmp_path / "d", config_file=str(path), dev=True)
    assert config.chain_id == 5 and dev_accounts_document(config)["chain_id"] == 5
    assert not (tmp_path / "d").exists()  # run_node writes it, once the store has taken chain 5


def test_a_dev_start_the_store_refuses_leaves_dev_accounts_as_they_were(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--dev on a store made for chain 1337, with a config saying chain 5: refused (exit 2), and
    dev-accounts.json, which clients sign from, still names 1337, the chain the store holds. It had
    been rewritten to 5 before the store's check refused the start (ops probe)."""
    from storage import open_store
    from tenzro_training.node.dev import write_dev_accounts
    from tenzro_training.node.main import dev_accounts_document, load_node_config
    from tenzro_training.node.service import NodeService

    data_dir = tmp_path / "d"
    config = load_node_config(data_dir, dev=True)
    write_dev_accounts(data_dir, dev_accounts_document(config))
    store = open_store(data_dir / "db")
    NodeService(config, store).close()
    store.close()
    before = (data_dir / "dev-accounts.json").read_bytes()
    path = tmp_path / "node.json"
    path.write_text('{"chain_id": 5}')
    code, out, err = run(capsys, "node", "--data-dir", str(data_dir), "--rpc-port", "0", "--dev", "--config", str(path))
    assert code == EXIT_USAGE and out == "" and err.count("\n") == 1
    assert "created for chain id 1337" in err and "the config says 5" in err
    assert (data_dir / "dev-accounts.json").read_bytes() == before and json.loads(before)["chain_id"] == 1337
    assert sorted(p.name for p in data_dir.iterdir()) == ["db", "dev-accounts.json"]  # no temporary left


def test_invalid_node_config_not_utf8(tmp_path: Path) -> None:
    from tenzro_training.node.main import NodeStartupError, load_node_config

    path = tmp_path / "node.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(NodeStartupError, match="is not UTF-8 text"):
        load_node_config(tmp_path / "d", config_file=str(path))


@pytest.mark.parametrize("dev", [False, True])
def test_invalid_node_data_dir_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, dev: bool
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for data_dir in (blocker, blocker / "sub"):
        argv = ["node", "--data-dir", str(data_dir), "--rpc-port", "0", *(["--dev"] if dev else [])]
        code, out, err = run(capsys, *argv)
        assert code == EXIT_USAGE and out == "" and err.count("\n") == 1
        if data_dir == blocker:  # said as it is, not as "File exists" (ops probe)
            assert err == f"tenzro: data dir {data_dir} exists and is not a directory\n"
        else:
            assert err == f"tenzro: cannot create data dir {data_dir}: Not a directory\n"  # the reason, not a repr
    assert blocker.read_text() == "x"


def test_invalid_dev_accounts_path_exits_2_and_leaves_no_temporary(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "dev-accounts.json").mkdir()  # the file cannot replace a directory
    code, out, err = run(capsys, "node", "--data-dir", str(tmp_path), "--rpc-port", "0", "--dev")
    assert code == EXIT_USAGE and out == ""
    assert err.startswith(f"tenzro: cannot write {tmp_path / 'dev-accounts.json'}: ") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dev-accounts.json"]


def test_format_event() -> None:
    from tenzro_training.node.main import format_event
    from tenzro_training.run_events import RoundFinalized

    line = format_event(RoundFinalized("t", 5, 0, b"\x01" * 20, 1, b"\x02" * 32))
    assert line == (
        "RoundFinalized task_id=t at_ms=5 round=0 syncer=0x0101010101010101010101010101010101010101 "
        "syncer_rank=1 model_hash=0x" + "02" * 32
    )


def test_format_event_shows_nested_values_as_an_operator_reads_them() -> None:
    """A sealed run's payouts are (trainer, amount) pairs: the log line shows them as pairs, each
    trainer in its EIP-55 form (what wallets and explorers show, so it can be searched for), and
    what is not a run event is logged as it is."""
    from tenzro_training.addresses import format_address
    from tenzro_training.node.main import format_event
    from tenzro_training.run_events import RunSealed

    first, second = bytes.fromhex("ab" * 20), bytes.fromhex("cd" * 20)
    assert format_address(first) != "0x" + first.hex()  # mixed case: the checksum shows
    line = format_event(RunSealed("t", 9, b"\x03" * 32, b"\x04" * 32, ((first, 5), (second, 7)), 1))
    assert line == (
        f"RunSealed task_id=t at_ms=9 run_root=0x{'03' * 32} final_model_hash=0x{'04' * 32} "
        f"payouts=(({format_address(first)}, 5), ({format_address(second)}, 7)) remainder=1"
    )
    assert format_event("node stopping") == "node stopping"


# --- tenzro keys ---------------------------------------------------------------------------------


def test_keys_new_account_then_sign_with_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "operator" / "account.json"
    assert cli.main(["keys", "new-account", "--out", str(out), "--json"]) == EXIT_OK
    made = json.loads(capsys.readouterr().out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert cli.main(["train", "address", "--key-file", str(out), "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["address"] == made["address"]
    # A second run must not replace the key (that would lose the account).
    before = out.read_bytes()
    assert cli.main(["keys", "new-account", "--out", str(out)]) == EXIT_USAGE
    assert "refusing to overwrite" in capsys.readouterr().err and out.read_bytes() == before


def test_keys_new_vrf_gives_config_entries_a_node_accepts(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from tenzro_training.node.config import NodeConfig

    out = tmp_path / "syncer0.vrf"
    assert cli.main(["keys", "new-vrf", "--address", KEY_ADDRESS, "--stake", "5000", "--out", str(out), "--json"]) == EXIT_OK
    entries = json.loads(capsys.readouterr().out)
    assert entries["candidate"]["stake"] == "5000" and "vrf_secret" not in json.dumps(entries["candidate"])
    assert entries["syncer_identity"] == {"address": KEY_ADDRESS, "vrf_secret_file": str(out)}
    config = NodeConfig.from_dict(
        {"candidates": [entries["candidate"]], "syncer_identities": [entries["syncer_identity"]]}, data_dir=None
    )
    assert config.syncer_identities[0].vrf_public_key == config.candidates[0].vrf_public_key
    # The human form names the file and both entries.
    other = tmp_path / "syncer1.vrf"
    assert cli.main(["keys", "new-vrf", "--address", KEY_ADDRESS, "--stake", "1", "--out", str(other)]) == EXIT_OK
    text = capsys.readouterr().out
    assert str(other) in text and '"candidates"' in text and '"syncer_identities"' in text


@pytest.mark.parametrize("argv, match", [
    (["--address", "0x12", "--stake", "1"], "invalid address"),
    (["--address", KEY_ADDRESS, "--stake", "-1"], "--stake"),
])
def test_invalid_keys_new_vrf_writes_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str],
                                             match: str) -> None:
    out = tmp_path / "v.vrf"
    assert cli.main(["keys", "new-vrf", *argv, "--out", str(out)]) == EXIT_USAGE
    assert match in capsys.readouterr().err and not out.exists()


def test_parser_trainer_run_round_wait_and_state_dir() -> None:
    parser = cli.build_parser()
    base = ["trainer", "run", "--task-id", "t", "--p2p-key", "k", "--bootstrap", "/ip4/127.0.0.1/tcp/9"]
    a = parser.parse_args(base)
    assert a.func is operator_commands.cmd_trainer_run and a.max_round_wait == 6 * 3600.0 and a.state_dir is None
    a = parser.parse_args(base + ["--max-round-wait", "90", "--state-dir", "st"])
    assert (a.max_round_wait, a.state_dir) == (90.0, "st")


def test_trainer_run_batch_size(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A GPU trainer's batch is its own choice (docs/trainer.md "GPU check"); a bad one stops the
    trainer before it reaches the node, in one line."""
    base = ["trainer", "run", "--task-id", "t", "--p2p-key", str(tmp_path / "p2p.key"), "--rpc", "http://127.0.0.1:9",
            "--bootstrap", "/ip4/127.0.0.1/tcp/9/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"]
    assert cli.build_parser().parse_args(base).batch_size == 16
    assert cli.build_parser().parse_args(base + ["--batch-size", "256"]).batch_size == 256
    key = tmp_path / "k.json"
    assert cli.main(["keys", "new-account", "--out", str(key)]) == 0
    capsys.readouterr()
    code, out, err = run(capsys, *base, "--key-file", str(key), "--batch-size", "0")
    assert code == EXIT_USAGE and out == ""
    assert err == "tenzro: batch_size must be an integer >= 1, got 0\n"
    assert not (tmp_path / "p2p.key").exists()


@pytest.fixture
def trainer_configs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The TrainerProcessConfig of each `tenzro trainer run` (the trainer itself replaced)."""
    from tenzro_training.trainer import process

    seen: list[Any] = []

    async def run_trainer(cfg: process.TrainerProcessConfig, announce: object) -> int:
        seen.append(cfg)
        return 0

    monkeypatch.setattr(process, "run_trainer", run_trainer)
    return seen


@pytest.mark.parametrize(("flags", "carry"), [([], False), (["--carry-optimizer-state"], True)])
def test_trainer_run_carries_the_inner_optimizer_state_when_told_to(
    tmp_path: Path, trainer_configs: list[Any], flags: list[str], carry: bool
) -> None:
    key = tmp_path / "k.json"
    assert cli.main(["keys", "new-account", "--out", str(key)]) == 0
    assert cli.main(["trainer", "run", "--task-id", "t", "--p2p-key", str(tmp_path / "p2p.key"), "--key-file", str(key),
                     "--rpc", "http://127.0.0.1:9", "--bootstrap",
                     "/ip4/127.0.0.1/tcp/9/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", *flags]) == 0
    assert [cfg.carry_optimizer_state for cfg in trainer_configs] == [carry]


def test_trainer_run_flags_reach_the_trainer(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                             trainer_configs: list[Any]) -> None:
    """Each `tenzro trainer run` flag is the trainer setting of that name (docs/trainer-process.md):
    one dropped on the way runs the trainer with a default nobody asked for (another node's
    spec, the wrong chain's signatures, a state directory without the record of signatures)."""
    key = tmp_path / "k.json"
    assert cli.main(["keys", "new-account", "--out", str(key)]) == 0
    peer = "/ip4/127.0.0.1/tcp/9/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
    base = ["trainer", "run", "--task-id", "t", "--p2p-key", str(tmp_path / "p2p.key"), "--key-file", str(key),
            "--rpc", "http://127.0.0.1:9/x", "--bootstrap", peer]
    assert cli.main([*base, "--spec", str(tmp_path / "spec.json"), "--rounds", "3", "--did", "did:tenzro:trainer:lab",
                     "--stake", "7", "--device", "cpu", "--p2p-listen", "/ip4/127.0.0.1/tcp/4100", "--chain-id", "5",
                     "--batch-size", "4", "--max-round-wait", "90", "--state-dir", str(tmp_path / "st")]) == 0
    assert cli.main(base) == 0
    given, plain = trainer_configs
    assert (given.task_id, given.rpc_url, given.spec_path, given.p2p_key, given.bootstrap, given.listen) == (
        "t", "http://127.0.0.1:9/x", tmp_path / "spec.json", tmp_path / "p2p.key", (peer,), ("/ip4/127.0.0.1/tcp/4100",))
    assert (given.rounds, given.did, given.stake, given.device, given.chain_id, given.batch_size) == (
        3, "did:tenzro:trainer:lab", 7, "cpu", 5, 4)
    assert (given.max_round_wait_s, given.state_dir) == (90.0, tmp_path / "st")
    assert given.private_key == plain.private_key and len(given.private_key) == 32
    assert (plain.spec_path, plain.listen, plain.rounds, plain.did, plain.stake, plain.state_dir) == (
        None, ("/ip4/127.0.0.1/tcp/0",), None, None, 10**18, None)
    assert "trainer stopped" in capsys.readouterr().err


@pytest.mark.parametrize(("listen", "bootstrap", "message"), [
    ("garbage", None, "tenzro: listen address 'garbage' is not a multiaddr"),
    ("/ip4/127.0.0.1/tcp/0", "garbage", "tenzro: bootstrap address 'garbage' is not a multiaddr"),
    ("/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/tcp/4001", "tenzro: bootstrap address '/ip4/127.0.0.1/tcp/4001' is not a multiaddr ending in /p2p/"),
])
def test_invalid_node_p2p_address_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, listen: str, bootstrap: str | None, message: str
) -> None:
    argv = ["node", "--data-dir", str(tmp_path / "d"), "--rpc-port", "0", "--p2p-listen", listen,
            *(["--bootstrap", bootstrap] if bootstrap else [])]
    code, out, err = run(capsys, *argv)
    assert code == EXIT_USAGE and out == ""
    assert err.startswith(message) and err.count("\n") == 1, err


@pytest.fixture
def node_serve_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, Any, Any]]:
    """``tenzro node`` up to where it would open the store (node/main.py's ``_serve``, replaced):
    the data dir, the p2p config and the announce function of each start."""
    from tenzro_training.node import main as node_main

    calls: list[tuple[Path, Any, Any]] = []

    async def serve(config: object, data_dir: Path, announce: object, p2p_config: object, staged: object) -> None:
        calls.append((data_dir, p2p_config, announce))

    monkeypatch.setattr(node_main, "_serve", serve)
    return calls


def test_node_p2p_options_reach_the_libp2p_host(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                node_serve_calls: list[tuple[Path, Any, Any]]) -> None:
    """--p2p-key is the node's peer identity, the one its trainers bootstrap from: ignored, the
    node would come up under another peer id. Without it the key lives in the data dir."""
    peer = "/ip4/127.0.0.1/tcp/9/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
    listen = "/ip4/127.0.0.1/tcp/0"
    base = ["node", "--data-dir", str(tmp_path / "d"), "--rpc-port", "0", "--p2p-listen", listen]
    assert run(capsys, *base, "--p2p-key", str(tmp_path / "p2p.key"), "--bootstrap", peer) == (EXIT_OK, "", "")
    assert run(capsys, *base) == (EXIT_OK, "", "")
    assert [(c.key_path, c.listen, c.bootstrap) for _, c, _ in node_serve_calls] == [
        (tmp_path / "p2p.key", (listen,), (peer,)), ((tmp_path / "d").resolve() / "p2p-key", (listen,), ())]


def test_node_creates_its_data_dir_and_the_dirs_above_it(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                          node_serve_calls: list[tuple[Path, Any, Any]]) -> None:
    """A first start on a new machine names a data dir none of which exists yet
    (/var/lib/tenzro/node): it is created whole, not refused."""
    data_dir = tmp_path / "var" / "lib" / "node"
    assert run(capsys, "node", "--data-dir", str(data_dir), "--rpc-port", "0") == (EXIT_OK, "", "")
    assert data_dir.is_dir() and [d for d, _, _ in node_serve_calls] == [data_dir.resolve()]


def test_node_announces_its_lines_through_a_pipe_at_once(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         node_serve_calls: list[tuple[Path, Any, Any]]) -> None:
    """Scripts and supervisors read the node's "listening on" line from a pipe, where stdout is
    block-buffered: the line must reach the pipe when it is said, not when a buffer fills."""
    import io
    import sys

    assert run(capsys, "node", "--data-dir", str(tmp_path / "d"), "--rpc-port", "0") == (EXIT_OK, "", "")
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    try:
        with io.TextIOWrapper(io.BufferedWriter(io.FileIO(write_end, "w"))) as pipe:
            with monkeypatch.context() as patched:
                patched.setattr(sys, "stdout", pipe)
                node_serve_calls[0][2]("tenzro node listening on http://127.0.0.1:8545 (data dir d)")
            try:
                said = os.read(read_end, 4096)
            except BlockingIOError:
                said = b""  # still in the buffer
        assert said == b"tenzro node listening on http://127.0.0.1:8545 (data dir d)\n"
    finally:
        os.close(read_end)


def test_node_stopped_with_a_storage_error_exits_1_saying_what_is_safe(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that refused a write (a full disk) raises again when the node closes it: not a
    startup failure (exit 2) nor a traceback, but exit 1 and a line saying that what was
    acknowledged is in the write-ahead log."""
    from storage.interface import StorageError
    from tenzro_training.node import main as node_main

    async def serve(*args: object) -> None:
        raise StorageError("write to 'd/db' failed: IO error: No space left on device")

    monkeypatch.setattr(node_main, "_serve", serve)
    code, out, err = run(capsys, "node", "--data-dir", str(tmp_path / "d"), "--rpc-port", "0")
    assert (code, out) == (1, "")
    assert err == ("tenzro: the node stopped with a storage error: write to 'd/db' failed: IO error: No space left on "
                   "device; acknowledged writes are in the write-ahead log and are recovered at the next start\n")


def test_invalid_node_p2p_port_in_use_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """py-libp2p logs a listener it cannot start and carries on with no address: the node must
    refuse to start instead (it used to crash on the missing address with a traceback)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"/ip4/127.0.0.1/tcp/{taken.getsockname()[1]}"
        code, out, err = run(capsys, "node", "--data-dir", str(tmp_path / "d"), "--rpc-port", "0", "--p2p-listen", listen)
    assert code == EXIT_USAGE and out == ""
    assert err.startswith(f"tenzro: cannot start libp2p on {listen}: ") and "Address already in use" in err
    assert err.count("\n") == 1, err


# --- Ctrl-C while the command is still importing -------------------------------------------------

_INTERRUPT_DURING_CLI_IMPORT = """
import importlib.abc, os, signal, sys

class InterruptCliImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "tenzro_training.cli":
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, while the CLI is being imported
        return None

sys.meta_path.insert(0, InterruptCliImport())
from tenzro_training.console import main
sys.exit(main(["--help"]))
"""


def test_ctrl_c_while_the_cli_imports_exits_130_without_a_traceback() -> None:
    """Before tenzro_training.console, the entry point imported cli (eth-account, pydantic:
    ~0.3 s) before any handler was in place, and Ctrl-C then printed a KeyboardInterrupt
    traceback."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _INTERRUPT_DURING_CLI_IMPORT], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 130, done.stderr
    assert done.stderr == "" and done.stdout == ""


def test_console_entry_point_runs_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from tenzro_training.console import main

    assert main(["keys", "new-account", "--out", "/proc/nope/key.json"]) == EXIT_USAGE
    assert capsys.readouterr().err.startswith("tenzro: ")


@pytest.mark.parametrize(("error_type", "field"), [
    ("NotSyncer", "address"), ("NotSponsor", "address"), ("NotEnrolled", "address"), ("WrongSigner", "actual"),
])
def test_a_refusal_naming_another_recovered_signer_hints_at_the_chain_id(
    fake_node: FakeNode, error_type: str, field: str
) -> None:
    other = "0x" + "ab" * 20
    fake_node.replies["tenzro_training_finalizeRound"] = {
        "error": {"code": 1315, "message": "refused", "data": {"type": error_type, field: other}}
    }
    signed = cli.RpcClient(fake_node.url, signer=(KEY_ADDRESS, 5))
    with pytest.raises(CliError) as info:
        signed.call("tenzro_training_finalizeRound", {})
    assert f"the node recovered {other} from the signature, not this key's {KEY_ADDRESS}" in str(info.value)
    assert "--chain-id 5)" in str(info.value)
    # The node recovered this key's own address (really not the syncer), or an unsigned call: no hint.
    fake_node.replies["tenzro_training_finalizeRound"]["error"]["data"][field] = KEY_ADDRESS.lower()
    for client in (signed, cli.RpcClient(fake_node.url)):
        with pytest.raises(CliError) as info:
            client.call("tenzro_training_finalizeRound", {})
        assert str(info.value) == f"error 1315 {error_type}: refused"


def test_invalid_redirect_is_not_followed(capsys: pytest.CaptureFixture[str], fake_node: FakeNode) -> None:
    """A 3xx is refused: urllib would have replayed the call as a bodiless GET to the named host,
    with the Authorization header."""
    seen: list[str] = []

    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            seen.append(self.headers.get("Authorization", ""))
            self.send_response(307)
            self.send_header("Location", fake_node.url)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://u:secret@127.0.0.1:{server.server_address[1]}/"
        code, out, err = run(capsys, "train", "list-runs", "--rpc", url)
    finally:
        server.shutdown()
        server.server_close()
    assert code == EXIT_UNREACHABLE and out == "" and "answered HTTP 307 (a redirect" in err
    assert seen and fake_node.calls == []  # the target was never called


# --- a pip user's first steps: shipped examples, the dataset hash, the installation --------------


def test_example_spec_writes_the_shipped_examples(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The examples live in site-packages for a pip user, which the docs cannot point at: the CLI
    writes them out (packaging probe). The dev one names the dev sponsor; --task-id and
    --sponsor-address replace those fields, checked as the spec parser checks them."""
    from tenzro_training.node.dev import dev_accounts
    from tenzro_training.spec import TrainingTaskSpec

    out = tmp_path / "spec.json"
    code, stdout, err = run(capsys, "train", "example-spec", "--out", str(out), "--json")
    assert code == 0, err
    spec = TrainingTaskSpec.from_json(out.read_text())
    [sponsor] = [a for a in dev_accounts() if a["role"] == "sponsor"]
    assert spec.task_id == "dev-timesfm-1" and spec.sponsor_address == sponsor["address"]
    assert json.loads(stdout)["spec_hash"] == "0x" + spec.spec_hash().hex()
    other = "0x" + "ab" * 20
    assert run(capsys, "train", "example-spec", "--name", "timesfm-200m", "--task-id", "mine-2",
               "--sponsor-address", other, "--out", str(out))[0] == 0
    spec = TrainingTaskSpec.from_json(out.read_text())
    assert (spec.task_id, spec.sponsor_address.lower(), spec.max_rounds) == ("mine-2", other, 1024)
    before = out.read_bytes()
    for flag, value, said in [("--task-id", "bad id!", "task_id:"), ("--sponsor-address", "0x12", "sponsor_address:")]:
        code, stdout, err = run(capsys, "train", "example-spec", flag, value, "--out", str(out))
        assert code == EXIT_USAGE and stdout == "" and err.startswith(f"tenzro: {said}") and err.count("\n") == 1
    assert out.read_bytes() == before  # a refused call writes nothing


def test_dataset_hash_is_what_a_trainer_checks(capsys: pytest.CaptureFixture[str]) -> None:
    from tenzro_training.trainer.data import DEFAULT_DATASET_REF, compute_dataset_hash, load_corpus

    assert spec_commands.DEFAULT_DATASET_REF == DEFAULT_DATASET_REF  # repeated in the CLI to keep torch out of the parser
    code, out, _ = run(capsys, "train", "dataset-hash", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["dataset_hash"] == "0x" + compute_dataset_hash(load_corpus(DEFAULT_DATASET_REF)).hex()
    assert result["dataset_ref"] == DEFAULT_DATASET_REF and result["series"] == 17
    code, out, _ = run(capsys, "train", "dataset-hash", "--dataset-ref", "statsmodels:nile", "--json")
    assert code == 0 and json.loads(out)["series"] == 1 and json.loads(out)["dataset_hash"] != result["dataset_hash"]
    for ref in ("ipfs://Qm", "statsmodels:nope", "statsmodels:nile,nile"):
        code, out, err = run(capsys, "train", "dataset-hash", "--dataset-ref", ref)
        assert code == EXIT_USAGE and out == "" and err.startswith("tenzro: ") and err.count("\n") == 1


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from tenzro_training import __version__

    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out == f"tenzro {__version__}\n"


_FOREIGN_STORAGE = """
import sys
sys.path.insert(0, sys.argv[1])  # a directory with another distribution's top-level `storage`
from tenzro_training.console import main
sys.exit(main(["--help"]))
"""


def test_a_foreign_package_in_place_of_ours_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """PyPI's `storage` distribution installs a top-level storage/ that overwrites ours without a
    word from pip; the node then died with an ImportError traceback (packaging probe)."""
    import subprocess
    import sys

    from tenzro_training.console import check_installation

    assert check_installation() is None
    (tmp_path / "storage").mkdir()
    (tmp_path / "storage" / "__init__.py").write_text("raise SystemExit('foreign code ran')\n")
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", _FOREIGN_STORAGE, str(tmp_path)], capture_output=True, text=True,
                          timeout=60, cwd=repo)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"tenzro: the installed 'storage' package is not tenzro-training's (resolves to {tmp_path / 'storage' / '__init__.py'}; "
        f"expected {repo / 'storage'}): another distribution with a package of that name overwrote or shadows it; "
        "reinstall tenzro-training in a virtualenv of its own\n"
    )


def _long_options(parser: Any, path: str = "tenzro") -> dict[str, set[str]]:
    """Every ``--flag`` of every (sub)command: flag -> the commands that take it."""
    import argparse

    out: dict[str, set[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                for flag, where in _long_options(sub, f"{path} {name}").items():
                    out.setdefault(flag, set()).update(where)
        else:
            for option in action.option_strings:
                if option.startswith("--") and option not in ("--help", "--version"):
                    out.setdefault(option, set()).add(path)
    return out


def test_docs_name_every_cli_flag_and_only_real_ones() -> None:
    """docs/cli.md (and docs/trainer-process.md for `tenzro trainer run`) against the parser, both
    ways: a flag the parser takes that no page names, or a page naming a flag no command takes
    (docs probe: this had been checked by hand only)."""
    import re

    docs = Path(cli.__file__).resolve().parents[2] / "docs"
    text = (docs / "cli.md").read_text() + (docs / "trainer-process.md").read_text()
    flags = _long_options(cli.build_parser())
    assert len(flags) > 40
    undocumented = {flag: sorted(where) for flag, where in flags.items() if not re.search(re.escape(flag) + r"(?![\w-])", text)}
    assert undocumented == {}
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", (docs / "cli.md").read_text()))
    assert named - set(flags) - {"--help", "--version"} == set()


def test_a_sourceless_install_of_ours_passes_the_installation_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A .pyc-only install (compileall -b, sources removed) has origin __init__.pyc: ours all the
    same (review)."""
    import importlib.machinery
    import importlib.util

    from tenzro_training import console

    home = Path(console.__file__).resolve().parent.parent
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        if name in ("rpc", "storage", "precompile"):
            return importlib.machinery.ModuleSpec(name, None, origin=str(home / name / "__init__.pyc"))
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert console.check_installation() is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: importlib.machinery.ModuleSpec(name, None))
    assert "resolves to a namespace package" in str(console.check_installation())
